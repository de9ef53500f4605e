"""Benchmark suites: our plans against the papers' numbers and the baselines."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from planner.errors import SlotplanError
from planner.graph import load_graph
from planner.params import Params, load_params
from planner.pipeline import PlanOptions, plan_graph

TABLE8_KEYS = ("Pb", "Ps", "bs_opt", "search_space")


class SuiteWorkload(BaseModel):
    model_config = ConfigDict(extra="forbid")
    graph: str
    paper: dict[str, Any] = Field(default_factory=dict)


class Suite(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_: str = Field(alias="schema", pattern=r"^slotplan\.suite/1$")
    name: str
    source: str = ""
    params: str = "n16"
    input_layout: str = "row-major"
    workloads: list[SuiteWorkload]


def load_suite(path: str | Path) -> tuple[Suite, Path]:
    p = Path(path)
    try:
        return Suite.model_validate(json.loads(p.read_text())), p.parent
    except FileNotFoundError as e:
        raise SlotplanError(f"suite {p} not found") from e
    except (ValueError, json.JSONDecodeError) as e:
        raise SlotplanError(f"suite {p}: {e}") from e


def bench_workload(
    graph_path: Path, params: Params, input_layout: str, paper: dict[str, Any], simulate: bool = False
) -> dict[str, Any]:
    g = load_graph(graph_path)
    row: dict[str, Any] = {"workload": g.name, "paper": paper}
    # MetaKernel pinned: the IMRA kernel alone (Table 8 parameters, MKR rotations)
    t0 = time.perf_counter()
    imra = plan_graph(g, params, PlanOptions(kernels=("imra", "elementwise"), input_layout=input_layout))
    row["imra_seconds"] = round(time.perf_counter() - t0, 3)
    node = next(n for n in imra.plan["nodes"] if n["kernel"] == "imra")
    row["imra"] = {
        "rotations": imra.plan["summary"]["rotations"],
        "rotation_keys": imra.plan["summary"]["rotation_keys"],
        "params": {k: node["params"][k] for k in (*TABLE8_KEYS, "P_I", "P_O", "fallback")},
        "slot_utilization": node["cost"]["slot_utilization"],
        "depth": imra.plan["summary"]["depth"],
    }
    t8 = paper.get("table8") or {}
    row["table8_match"] = all(node["params"][k] == t8[k] for k in TABLE8_KEYS if k in t8) if t8 else None
    # best over all kernels (what `slotplan plan` picks by default for this input layout)
    t0 = time.perf_counter()
    best = plan_graph(g, params, PlanOptions(input_layout=input_layout))
    row["best_seconds"] = round(time.perf_counter() - t0, 3)
    row["best"] = {
        "kernel": "+".join(n["kernel"] for n in best.plan["nodes"]),
        "rotations": best.plan["summary"]["rotations"],
        "solver": best.plan["summary"]["solver"]["status"],
    }
    baselines: dict[str, dict[str, Any]] = {}
    for cands in best.problem.candidates.values():
        for c in cands:
            cv = c.cost(params.slots)
            cur = baselines.get(c.kernel)
            if cur is None or cv.rotations < cur["rotations"]:
                baselines[c.kernel] = {"rotations": cv.rotations, "slot_utilization": round(cv.slot_utilization, 4)}
    row["baselines"] = baselines
    if simulate:
        from backends.runner import run_plan

        rep = run_plan(imra.plan, imra.tables, "sim", seed=1)
        row["sim"] = {"ok": rep.ok, "max_rel_error": rep.max_rel_error, "seconds": round(rep.seconds, 2)}
    return row


def run_suite(path: str | Path, params_name: str | None = None, simulate: bool = False):  # noqa: ANN201
    suite, base = load_suite(path)
    params = load_params(params_name or suite.params)
    for w in suite.workloads:
        yield bench_workload((base / w.graph).resolve(), params, suite.input_layout, w.paper, simulate)
