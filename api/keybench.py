"""Key-memory benchmark: peak memory vs modelled time per key strategy and memory cap.

For every workload of a key suite (``slotplan.keysuite/1``, e.g. data/suites/keymemrt.json,
modelled on KeyMemRT's Table 3) the graph is planned once, then each key strategy is run at
caps from the keep-all peak down to the smallest feasible cap.  Reported per point:
rotations, key loads, peak bytes and modelled time; per strategy: the largest peak
reduction against the ANT-ACE baseline (keep-all, every key at the top level) whose
modelled time is at most 5% above the baseline's, and the geomean over workloads.

Modelled time: :func:`planner.cost.timing.modelled_time` under the preset's time model
(:func:`planner.cost.timing.time_model`: the objective's, with the executor's fused blocks, the
bootstraps and the prefetching key loads), as the joint strategy and ``keymeasure`` model
it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from common import progress
from common.errors import SlotplanError
from planner.cost.timing import TimeModel, modelled_time, time_model
from planner.frontend.graph import load_graph
from planner.frontend.params import Params, load_params
from planner.ir.io import load_model_file
from planner.keys.profile import KeyCapError
from planner.keys.residency import STRATEGIES
from planner.keys.schedule import KeySchedule, schedule_keys
from planner.pipeline import PlanOptions, plan_graph

# The time budget for the peak-reduction figure: at most 5% above the baseline.
TIME_SLACK = 1.05
DEFAULT_CAPS = 6


class KeySuiteWorkload(BaseModel):
    model_config = ConfigDict(extra="forbid")
    graph: str
    params: str
    note: str = ""
    paper: dict[str, Any] = Field(default_factory=dict)
    # the kernels the workload is planned with (default: the planner's); e.g. only CinS
    # layers, so that keymeasure covers a CinS plan's keys (issue 37)
    kernels: list[str] | None = None


class KeySuite(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_: str = Field(alias="schema", pattern=r"^slotplan\.keysuite/1$")
    name: str
    source: str = ""
    input_layout: str = "free"
    workloads: list[KeySuiteWorkload]


def load_key_suite(path: str | Path) -> tuple[KeySuite, Path]:
    return load_model_file(path, KeySuite, "key suite")


def modelled_time_ms(sched: KeySchedule, params: Params, tm: TimeModel) -> float:
    """A schedule's modelled evaluation time (:func:`planner.cost.timing.modelled_time`)."""
    return modelled_time(sched.program, params, sched.key_bytes(), tm).total_ms


def cap_points(high: int, low: int, n: int) -> list[int]:
    """``n`` caps from ``high`` down to ``low`` (both included), evenly spaced."""
    if n <= 1 or high <= low:
        return [max(high, low)]
    return [int(round(high - (high - low) * i / (n - 1))) for i in range(n)]


def _row(strategy: str, cap: int | None, sched: KeySchedule | None, params: Params, tm: TimeModel, seconds: float,
         error: str | None = None) -> dict[str, Any]:
    if sched is None:
        return {"strategy": strategy, "cap": cap, "feasible": False, "error": error}
    row: dict[str, Any] = {
        "strategy": strategy,
        "cap": cap,
        "feasible": True,
        "rotations": sched.rotations,
        "rotation_keys": sched.rotation_keys,
        "key_loads": sched.loads,
        "peak_bytes": sched.peak_bytes["total"],
        "peak_key_bytes": sched.peak_bytes["keys"],
        "time_ms": round(modelled_time_ms(sched, params, tm), 3),
        "seconds": round(seconds, 3),
    }
    if sched.solver is not None:
        row["solver"] = sched.solver.get("status")
    return row


def bench_keys(
    graph_path: Path,
    params: Params,
    input_layout: str = "free",
    strategies: Sequence[str] = STRATEGIES,
    n_caps: int = DEFAULT_CAPS,
    key_levels: bool = True,
    time_limit_s: float = 10.0,
    max_keys: int | None = None,
    paper: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One workload: plan it, then every strategy at every cap."""
    g = load_graph(graph_path)
    t0 = time.perf_counter()
    res = plan_graph(g, params, PlanOptions(input_layout=input_layout))
    plan_s = time.perf_counter() - t0
    prog = res.plan["program"]
    tm = time_model(params)
    base = schedule_keys(prog, params, None, "keep-all", key_levels=False)
    base_ms = modelled_time_ms(base, params, tm)
    lowest = schedule_keys(prog, params, None, "belady", max_keys, key_levels=key_levels).min_cap_bytes
    caps = cap_points(base.peak_bytes["total"], lowest, n_caps)
    rows: list[dict[str, Any]] = []
    for cap in caps:
        for strat in strategies:
            t1 = time.perf_counter()
            try:
                s = schedule_keys(prog, params, cap, strat, max_keys, key_levels=key_levels, time_limit_s=time_limit_s)
            except KeyCapError as e:
                rows.append(_row(strat, cap, None, params, tm, 0.0, f"needs {e.min_cap} bytes"))
                continue
            rows.append(_row(strat, cap, s, params, tm, time.perf_counter() - t1))
    best: dict[str, dict[str, Any] | None] = {}
    for strat in strategies:
        ok = [r for r in rows if r["strategy"] == strat and r["feasible"] and r["time_ms"] <= TIME_SLACK * base_ms]
        if ok:
            r = min(ok, key=lambda r: (r["peak_bytes"], r["time_ms"]))
            best[strat] = {
                "reduction": base.peak_bytes["total"] / r["peak_bytes"],
                "peak_bytes": r["peak_bytes"],
                "cap": r["cap"],
                "time_ratio": r["time_ms"] / base_ms,
            }
        else:
            best[strat] = None
    return {
        "workload": g.name,
        "params": params.name,
        "paper": paper or {},
        "plan_seconds": round(plan_s, 3),
        "rotations": base.rotations,
        "rotation_keys": base.rotation_keys,
        "depth": res.plan["summary"]["depth"],
        "instructions": len(prog),
        "key_bytes_top_level": params.rotation_key_bytes(),
        "time_model": tm.source,
        "baseline": {"strategy": "keep-all (top-level keys, ANT-ACE)", "peak_bytes": base.peak_bytes["total"],
                     "peak_key_bytes": base.peak_bytes["keys"], "time_ms": round(base_ms, 3)},
        "min_feasible_cap": lowest,
        "caps": caps,
        "rows": rows,
        "best": best,
    }


def geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def run_key_suite(
    path: str | Path,
    params_name: str | None = None,
    strategies: Sequence[str] = STRATEGIES,
    n_caps: int = DEFAULT_CAPS,
    key_levels: bool = True,
    time_limit_s: float = 10.0,
    max_keys: int | None = None,
) -> Iterator[dict[str, Any]]:
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise SlotplanError(f"unknown key strategy {', '.join(unknown)}; known: {', '.join(STRATEGIES)}")
    suite, root = load_key_suite(path)
    progress.begin("keybench", len(suite.workloads))
    for w in suite.workloads:
        progress.advance("keybench", str(w.graph))
        params = load_params(params_name or w.params)
        yield bench_keys(
            (root / w.graph).resolve(), params, suite.input_layout, strategies, n_caps, key_levels,
            time_limit_s, max_keys, w.paper,
        )
    progress.end("keybench")


def summarize_suite(results: Sequence[dict[str, Any]], strategies: Sequence[str]) -> dict[str, Any]:
    """Geomean peak reduction vs the baseline at <= 5% extra modelled time, per strategy
    (over the workloads where the strategy meets the time budget at all)."""
    out: dict[str, Any] = {}
    for s in strategies:
        vals = [r["best"][s]["reduction"] for r in results if r["best"].get(s)]
        out[s] = {"geomean_reduction": geomean(vals), "workloads": len(vals), "of": len(results)}
    return out


# --------------------------------------------------------------------------------------
# The trade-off curve of the joint strategy (planner.keys.joint)
# --------------------------------------------------------------------------------------

CURVE_FRACTIONS = (1.0, 0.75, 0.5, 0.25)


def key_curve(
    graph_path: Path,
    params: Params,
    input_layout: str = "free",
    fractions: Sequence[float] = CURVE_FRACTIONS,
    n_low: int = 2,
    time_limit_s: float = 10.0,
) -> dict[str, Any]:
    """One workload's cap -> (rotations, loads, hoisted splits, composed offsets, peak,
    modelled time) under the joint strategy: caps at ``fractions`` of the keep-all peak
    (ANT-ACE: every key at the top level) and ``n_low`` more down to the smallest feasible
    cap.  Modelled time: :func:`planner.cost.timing.modelled_time` (prefetching runtime)."""
    g = load_graph(graph_path)
    res = plan_graph(g, params, PlanOptions(input_layout=input_layout))
    prog = res.plan["program"]
    tm = time_model(params)
    base = schedule_keys(prog, params, None, "keep-all", key_levels=False)
    base_t = modelled_time(prog, params, {}, tm)
    top = base.peak_bytes["total"]
    lowest = schedule_keys(prog, params, None, "joint", time_limit_s=time_limit_s).min_cap_bytes
    caps = sorted({int(top * f) for f in fractions if int(top * f) >= lowest}
                  | set(cap_points(int(top * min(fractions)), lowest, n_low + 1)[1:]), reverse=True)
    rows: list[dict[str, Any]] = [{
        "cap": None, "fraction": 1.0, "strategy": "keep-all", "rotations": base.rotations, "key_loads": len(base.keys),
        "hoisted_splits": 0, "composed": 0, "peak_bytes": top, "peak_key_bytes": base.peak_bytes["keys"],
        "time_ms": round(base_t.total_ms, 3), "stall_ms": 0.0, "time_ratio": 1.0,
    }]
    for cap in caps:
        try:
            s = schedule_keys(prog, params, cap, "joint", time_limit_s=time_limit_s)
        except KeyCapError as e:
            rows.append({"cap": cap, "fraction": round(cap / top, 4), "strategy": "joint", "feasible": False,
                         "error": f"needs {e.min_cap} bytes"})
            continue
        t = modelled_time(s.program, params, s.key_bytes(), tm)
        rows.append({
            "cap": cap, "fraction": round(cap / top, 4), "strategy": "joint", "rotations": s.rotations,
            "key_loads": s.loads, "hoisted_splits": s.splits or 0, "composed": len(s.chains),
            "peak_bytes": s.peak_bytes["total"], "peak_key_bytes": s.peak_bytes["keys"],
            "time_ms": round(t.total_ms, 3), "stall_ms": round(t.stall_ms, 3),
            "time_ratio": round(t.total_ms / base_t.total_ms, 4), "solver": (s.solver or {}).get("status"),
        })
    return {"workload": g.name, "params": params.name, "time_model": tm.source, "keep_all_peak_bytes": top,
            "min_feasible_cap": lowest, "rows": rows}


def run_key_curve(
    path: str | Path, params_name: str | None = None, fractions: Sequence[float] = CURVE_FRACTIONS,
    n_low: int = 2, time_limit_s: float = 10.0,
) -> Iterator[dict[str, Any]]:
    suite, root = load_key_suite(path)
    progress.begin("keycurve", len(suite.workloads))
    for w in suite.workloads:
        progress.advance("keycurve", str(w.graph))
        yield key_curve((root / w.graph).resolve(), load_params(params_name or w.params), suite.input_layout,
                        fractions, n_low, time_limit_s)
    progress.end("keycurve")
