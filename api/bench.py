"""Benchmark suites: our plans against the papers' numbers and the baselines (``slotplan bench``).

It sits in the API layer because it plans and then runs the plans on an execution back end."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from common import progress
from common.errors import SlotplanError
from planner.frontend.graph import load_graph
from planner.frontend.params import Params, load_params
from planner.ir.io import load_model_file
from planner.pipeline import PlanOptions, plan_graph

TABLE8_KEYS = ("Pb", "Ps", "bs_opt", "search_space")


class SuiteWorkload(BaseModel):
    model_config = ConfigDict(extra="forbid")
    graph: str | None = None
    name: str | None = None
    params: str | None = None
    input_layouts: dict[str, str] | None = None
    kernels: list[str] | None = None  # restrict the kernels (e.g. one ct-ct scheme per row)
    conversion: dict[str, Any] | None = None  # {"src", "dst", "shape", "slots"}
    sim: bool = False
    paper: dict[str, Any] = Field(default_factory=dict)


class Suite(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_: str = Field(alias="schema", pattern=r"^slotplan\.suite/1$")
    name: str
    kind: str = "metakernel"
    source: str = ""
    params: str = "n16"
    input_layout: str = "row-major"
    workloads: list[SuiteWorkload]


def load_suite(path: str | Path) -> tuple[Suite, Path]:
    return load_model_file(path, Suite, "suite")


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


def bench_conversion(w: SuiteWorkload) -> dict[str, Any]:
    from planner.kernels.convert import plan_conversion
    from planner.layout.rotom import parse_layout

    c = w.conversion or {}
    shape = tuple(c["shape"])
    src, dst = parse_layout(c["src"], shape, c["slots"]), parse_layout(c["dst"], shape, c["slots"])
    t0 = time.perf_counter()
    conv = plan_conversion(src, dst)
    cost = conv.cost()
    return {
        "workload": w.name or f"{c['src']} -> {c['dst']}", "kind": "conversion", "conversion": conv.kind,
        "rotations": cost.rotations, "pmul": cost.pmul, "add": cost.add, "paper": w.paper,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def choice_rotations(problem: Any, choice: dict[str, int]) -> int:
    """Rotations of an assignment from the priced candidates and conversions (no lowering;
    both are exact counts of what lowering emits)."""
    from planner.kernels.convert import plan_conversion

    S = problem.params.slots
    total = 0
    layout_of: dict[str, Any] = {t: opts[choice[f"input:{t}"]] for t, opts in problem.input_options.items()}
    for node in problem.graph.nodes:
        cand = problem.candidates[node.id][choice[node.id]]
        total += cand.cost(S).rotations
        for t in dict.fromkeys(node.inputs):
            if t in cand.in_layouts:
                total += plan_conversion(layout_of[t], cand.in_layouts[t]).cost().rotations
        layout_of[node.id] = cand.out_layout
    return total


def bench_graph(path: Path, params: Params, input_layout: str, w: SuiteWorkload, simulate: bool) -> dict[str, Any]:
    """Exact whole-graph assignment vs greedy per-node choice on one graph."""
    from planner.pipeline import build_problem, lower_solution, solve_problem

    g = load_graph(path)
    opts = PlanOptions(input_layout=input_layout, input_layouts=tuple(sorted((w.input_layouts or {}).items())))
    if w.kernels:
        opts = replace(opts, kernels=tuple(w.kernels))
    t0 = time.perf_counter()
    problem = build_problem(g, params, opts)
    sol = solve_problem(problem)
    plan, tables = lower_solution(problem, sol)
    seconds = time.perf_counter() - t0
    exact_rot = choice_rotations(problem, dict(sol.choice))
    if exact_rot != plan["summary"]["rotations"]:
        raise SlotplanError(f"priced rotations {exact_rot} differ from the lowered plan's")
    greedy = problem.model.greedy()
    g_obj = problem.model.evaluate(greedy)
    row: dict[str, Any] = {
        "workload": w.name or g.name, "kind": "graph", "params": params.name, "nodes": len(g.nodes),
        "rotations": plan["summary"]["rotations"], "cmul": plan["summary"]["cmul"],
        "pmul": plan["summary"]["pmul"], "depth": plan["summary"]["depth"],
        "input_cts": {t: problem.input_options[t][sol.option(f"input:{t}")].n_ct for t in problem.input_options},
        "objective": sol.objective, "bound": sol.bound, "status": sol.status.value,
        "seconds": round(seconds, 3), "paper": w.paper,
        "kernels": sorted({n["kernel"] for n in plan["nodes"]}),
    }
    if g_obj is not None:
        row["greedy"] = {"objective": g_obj, "rotations": choice_rotations(problem, greedy)}
    if simulate and w.sim:
        from backends.runner import run_plan

        rep = run_plan(plan, tables, "sim", seed=1)
        row["sim"] = {"ok": rep.ok, "max_rel_error": rep.max_rel_error}
    return row


def run_suite(path: str | Path, params_name: str | None = None, simulate: bool = False):  # noqa: ANN201
    suite, base = load_suite(path)
    progress.begin("bench", len(suite.workloads))
    for w in suite.workloads:
        progress.advance("bench", w.name or str(w.graph))
        params = load_params(params_name or w.params or suite.params)
        if w.conversion is not None:
            yield bench_conversion(w)
        elif suite.kind == "metakernel":
            assert w.graph is not None
            yield bench_workload((base / w.graph).resolve(), params, suite.input_layout, w.paper, simulate)
        else:
            assert w.graph is not None
            yield bench_graph((base / w.graph).resolve(), params, suite.input_layout, w, simulate)
    progress.end("bench")
