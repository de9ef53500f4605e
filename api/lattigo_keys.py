"""``slotplan keymeasure``: rotation-key memory measured on Lattigo, keep-all against caps.

For each workload of a key suite (or one graph) at its preset:

* **keep-all** (ANT-ACE): the plan without key schedule; every key generated at the top
  level, written to a key directory and read back before the clock starts (Go
  ``BenchPlan`` with ``keep_all_disk``);
* **cap f** for each fraction ``f``: the cap that leaves the plan's own terms (keys,
  ciphertexts, plaintexts) ``f`` of their keep-all modelled peak beside the executor's
  state, i.e. the keep-all plan's process model (planner.cost.process, what
  ``--memory-cap`` bounds) less ``1 - f`` of its own peak (a cap below what one
  step needs, e.g. a bootstrap's key block, is measured at the smallest feasible cap, the
  row naming the requested one and why): the graph planned with
  ``memory_cap_bytes`` (the joint key schedule, :mod:`planner.keys.joint`: hoisted splits, key
  set, residency and prefetch), keys at the plan's levels, read during the evaluation by
  the prefetching key store; the keys it loads before its first computing instruction are
  read before the clock starts (``preload_prologue``), as keep-all's are.

Measured per run (Go side): evaluation seconds (the scheduled runs include their key
traffic: waits for keys not read in time), key-read seconds, peak resident key bytes (the
key store counts a key from its ``load_key``), and the process's resident set: its peak
over the evaluation minus the resident set just before (after garbage collection, the
kernel's high-water mark reset).  Modelled: the plan's ``peak_bytes`` (keys, and keys +
ciphertexts + plaintexts; plus the relinearisation key the process also holds) and its
modelled time.  With ``repeat`` > 1 each plan runs that many times (median evaluation
time; the keep-all and capped runs of a workload alternate in no way, so load on the
machine shows as noise).  Outputs are compared with numpy.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from backends.lattigo_backend import (
    PLAINTEXT_INLINE_BYTES,
    _call,
    _ext,
    go_plan_json,
    pack_vectors,
    write_plaintexts,
)
from backends.lattigo_bench import _scatter
from backends.lattigo_memory import GC_LIMIT_HEADROOM, boot_memory, executor_memory, process_model
from backends.runner import check_assumed_ranges
from planner.cost.process import plan_process_model
from planner.cost.timing import Run, TimeModel, modelled_time, time_model
from planner.frontend.graph import Graph, load_graph
from planner.frontend.params import Params, load_params
from planner.frontend.ranges import calibrated_graph
from planner.frontend.reference import random_values, reference
from planner.ir.analysis import plan_key_bytes
from planner.keys.profile import KeyCapError
from planner.keys.schedule import schedule_plan
from planner.pipeline import PlanOptions, plan_graph

__all__ = ["DEFAULT_FRACTIONS", "measure_graph", "measure_suite"]

DEFAULT_FRACTIONS = (0.5, 0.25)
# Input samples a bootstrapping workload's node ranges are measured on (other seeds than
# the measured run's data; planner.frontend.ranges.calibrated_graph widens them by its margin).
CALIBRATION_SAMPLES = 8


def _bench(plan: Mapping[str, Any], graph: Graph, values: Mapping[str, np.ndarray], tables: Mapping[str, np.ndarray],
           keep_all: bool, repeat: int = 1, plaintext_cache: bool = True, workers: int | None = None) -> dict[str, Any]:
    inputs = {t: values[t] for t in graph.inputs}
    weights = {t: values[t] for t in graph.weights}
    mod, go = _ext()
    # as Run: many plaintexts (LoLa at n14: 15425 vectors, 1 GB as float64) go through a
    # file the Go side reads one vector at a time (the read timed with the encoding), so
    # neither side holds them all
    slots = int(plan["params"]["slots"])
    inline = len(plan.get("plaintexts") or {}) * slots * 8 <= PLAINTEXT_INLINE_BYTES
    # the process model of this benchmark (backends/lattigo_memory.py; BenchPlan keeps every
    # encoded plaintext): its growth (plus GC_LIMIT_HEADROOM) is Go's soft memory limit
    mem = executor_memory(plan, workers)
    pm = process_model(plan, mem, inline_plaintexts=inline, cached_plaintexts=plaintext_cache,
                       boot=boot_memory(Params.from_json(plan["params"])))
    # Run's GOGC (10): at Go's default 100 the heap grew until the soft limit stopped it and
    # the peak RSS sat at 1.19-1.25x the model, garbage rather than live bytes
    opts: dict[str, Any] = {
        "repeat": int(repeat), "measure_rss": True, "keep_all_disk": keep_all, "prefetch": True,
        "gc_percent": int(mem["run_gc_percent"]),
        "preload_prologue": True, "memory_limit_extra_bytes": int(pm["growth"] * GC_LIMIT_HEADROOM),
        "no_plaintext_cache": not plaintext_cache, "no_prepare": not plaintext_cache}
    if workers:
        opts["workers"] = int(workers)
    with tempfile.TemporaryDirectory(prefix="slotplan-km-") as tmp:
        if inline:
            packed_in, packed_pt = pack_vectors(plan, inputs, weights, tables)
        else:
            packed_in, _ = pack_vectors({**plan, "plaintexts": {}}, inputs, weights, tables)
            packed_pt = b""
            opts["plaintext_file"] = str(Path(tmp) / "plaintexts.f64")
            write_plaintexts(plan, weights, tables, opts["plaintext_file"])
        t0 = time.perf_counter()
        raw = json.loads(_call(mod.BenchPlan, go_plan_json(plan),
                               go.Slice_byte.from_bytes(packed_in), go.Slice_byte.from_bytes(packed_pt), json.dumps(opts)))
        wall = time.perf_counter() - t0
    st = raw["stats"]
    outs = _scatter(raw["outputs"], tables, {t: graph.shape(t) for t in graph.outputs})
    ref = reference(graph, values)
    check_assumed_ranges(plan, ref)
    rel = max(float(np.max(np.abs(outs[t] - ref[t]))) / max(1e-300, float(np.max(np.abs(ref[t])))) for t in graph.outputs)
    return {
        "eval_seconds": round(st["eval_seconds"], 4),
        "eval_seconds_runs": [round(x, 4) for x in st.get("eval_seconds_runs", [])],
        # the process's CPU seconds over the evaluation (all goroutines: the key reader's too)
        "cpu_seconds": round(float(st.get("cpu_seconds", 0.0)), 4),
        "relin_key_bytes": st.get("relin_key_bytes", 0),
        "key_load_seconds": round(st["key_load_seconds"], 4),
        # bytes of key files the store read in those seconds: its measured read rate
        "key_load_bytes": int(st.get("key_load_bytes", 0)),
        "key_load_ms_per_mb": round(1e3 * st["key_load_seconds"] / (st["key_load_bytes"] / 1e6), 4)
        if st.get("key_load_bytes") else None,
        "key_wait_seconds": round(st.get("key_wait_seconds", 0.0), 4),
        "prologue_key_loads": st.get("prologue_key_loads", 0),
        "key_loads": st["key_loads"],
        "peak_key_bytes": st["peak_key_bytes"],
        # a bootstrapping plan's model counts the boot block as its keys and DFT matrices
        "peak_key_block_bytes": max(st["peak_key_bytes"], st.get("peak_key_block_bytes", 0)),
        "peak_resident_keys": st["peak_resident_keys"],
        "peak_ciphertext_bytes": st["peak_ciphertext_bytes"],
        "rss_start_bytes": st.get("rss_start_bytes", 0),
        "rss_peak_bytes": st.get("rss_peak_bytes", 0),
        "rss_growth_bytes": st.get("rss_peak_bytes", 0) - st.get("rss_start_bytes", 0),
        "rss_measured": bool(st.get("rss_measured")),
        "model_process_growth_bytes": pm["growth"],
        "plaintexts_inline": inline,
        "model_process_terms": {k: v for k, v in pm.items() if k not in ("growth", "total", "baseline", "peak_step")},
        "cached_plaintext_bytes": st.get("cached_plaintext_bytes", 0),
        "rotations": st["rotations"],
        # where the (median) run spent its time: seconds per operation, and per bootstrap
        "op_seconds": {k: round(float(v), 4) for k, v in sorted((st.get("op_seconds") or {}).items())},
        "bootstrap_seconds": [round(float(x), 4) for x in st.get("bootstrap_seconds") or []],
        "bootstrap_input_levels": list(st.get("bootstrap_input_levels") or []),
        # a bootstrapping plan's block loads, the streamed block's key reads, the levels dropped
        "boot_block_loads": st.get("boot_block_loads", 0), "boot_stream_reads": st.get("boot_stream_reads", 0),
        "boot_stream": {k: st.get(f"boot_stream_{k}", 0) for k in ("predicted", "learned", "misses", "requests")},
        "level_drops": st.get("level_drops", 0),
        "workers": st.get("workers"),
        "fused_blocks": st.get("fused_blocks", 0),
        "max_rel_error": rel,
        "wall_seconds": round(wall, 2),
    }


def _by_op(tm: TimeModel, program: Sequence[Mapping[str, Any]], params: Params, run: Run | None = None) -> dict[str, float]:
    """The modelled compute by op (planner.cost.timing), next to the executor's op_seconds."""
    return {k: round(v, 2) for k, v in sorted(tm.breakdown_ms(program, params.max_level, params.slots, run).items())}


def bench_run(params: Params, workers: int | None) -> Run:
    """How ``BenchPlan`` runs a plan here (planner.cost.timing.Run): levels dropped in a
    bootstrapping plan, plaintexts encoded outside the clock (timed apart and subtracted,
    with a cache or without), a core for the key reader only when the process may use more
    cores (affinity, ``GOMAXPROCS``) than the evaluation's workers, and each bootstrap at its
    kind's time as the executor ran it in the calibration."""
    cores = len(os.sched_getaffinity(0))
    env = os.environ.get("GOMAXPROCS", "")
    procs = min(cores, int(env)) if env.isdigit() and int(env) > 0 else cores
    return Run(level_drops=params.boot is not None, encode=False, loader_core=procs > (workers or procs),
               bootstrap_measured=True)


def _save(plans_out: Path | None, name: str, tag: str, plan: Mapping[str, Any]) -> None:
    """``--plans-out``: each measured plan as ``<workload>.<keep-all|cap<f>>.plan.json``."""
    if plans_out is not None:
        plans_out.mkdir(parents=True, exist_ok=True)
        (plans_out / f"{name}.{tag}.plan.json").write_text(json.dumps(plan, sort_keys=True))


def measure_graph(
    graph: Graph, params: Params, fractions: Sequence[float] = DEFAULT_FRACTIONS, seed: int = 0,
    time_limit_s: float = 10.0, repeat: int = 1, plaintext_cache: bool = True, workers: int | None = None,
    kernels: Sequence[str] | None = None, plans_out: Path | None = None,
) -> dict[str, Any]:
    """Keep-all and one run per cap fraction (see the module docstring); ``kernels``: the
    kernels every plan may use (default: the planner's)."""
    kern = tuple(kernels) if kernels else PlanOptions().kernels
    # weights scaled by 1/sqrt(fan-in), as a trained net's: activations stay O(1), which a
    # bootstrapping plan needs (|x| <= params.boot.max_abs; unit weights overflow LeNet's)
    values = random_values(graph, seed, "fan-in")
    if params.boot is not None:
        # a bootstrapping plan scales each bootstrapped value by its bound; interval
        # arithmetic alone leaves LeNet's ~1e12 times its values, and none of the
        # bootstrap's bits: calibrate the node ranges on other inputs, as an importer does
        samples = [random_values(graph, seed + 1 + i, "fan-in") for i in range(CALIBRATION_SAMPLES)]
        graph = calibrated_graph(graph, {t: values[t] for t in graph.weights}, samples)
    tm = time_model(params)
    run = bench_run(params, workers)
    res = plan_graph(graph, params, PlanOptions(time_limit_s=time_limit_s, kernels=kern))
    ka_plan, ka = schedule_plan(res.plan, None, "keep-all", key_levels=False)
    ka_peak = ka.peak_bytes
    ka_time = modelled_time(res.plan["program"], params, {}, tm, run=run)
    ka_plain = modelled_time(res.plan["program"], params, {}, tm)
    # the keep-all plan's process model (the run's executor state as the planner models it):
    # the caps below leave the plan's own terms a fraction of ka_peak beside it
    ka_process = int(plan_process_model(res.plan)["growth"])
    runs: list[dict[str, Any]] = []
    row: dict[str, Any] = {"cap": None, "fraction": 1.0, "strategy": "keep-all", "model_peak_bytes": ka_peak["total"],
           "model_process_planned_bytes": ka_process,
           "model_key_bytes": ka_peak["keys"], "model_time_ms": round(ka_time.total_ms, 2),
           "model_time_planning_ms": round(ka_plain.total_ms, 2), "model_load_ms": round(ka_time.load_ms, 2),
           "model_ms_by_op": _by_op(tm, res.plan["program"], params, run),
           "rotations_planned": ka.rotations, "key_loads_planned": len(ka.keys), "hoisted_splits": 0}
    _save(plans_out, graph.name, "keep-all", res.plan)
    row.update(_bench(res.plan, graph, values, res.tables, keep_all=True, repeat=repeat,
                      plaintext_cache=plaintext_cache, workers=workers))
    runs.append(row)
    for f in fractions:
        cap = int(ka_process - (1 - f) * ka_peak["total"])
        below: dict[str, Any] = {}
        try:
            r = plan_graph(graph, params, PlanOptions(memory_cap_bytes=cap, time_limit_s=time_limit_s, kernels=kern))
        except KeyCapError as e:
            # below what one step needs (e.g. a bootstrap's key block and DFT matrices): the
            # row is measured at the smallest feasible cap and says so
            below = {"requested_cap": cap, "requested_fraction": f, "below_min_feasible_cap": e.where}
            cap = e.min_cap
            f = round(1 - (ka_process - cap) / ka_peak["total"], 4)
            r = plan_graph(graph, params, PlanOptions(memory_cap_bytes=cap, time_limit_s=time_limit_s, kernels=kern))
        s = r.plan["summary"]
        ks = s["key_schedule"]
        mt = modelled_time(r.plan["program"], params, plan_key_bytes(r.plan) or {}, tm, run=run)
        plain = modelled_time(r.plan["program"], params, plan_key_bytes(r.plan) or {}, tm)
        row = {**below, "cap": cap, "fraction": f, "strategy": ks["strategy"], "model_peak_bytes": s["peak_bytes"]["total"],
               "model_key_bytes": s["peak_bytes"]["keys"], "model_time_ms": round(mt.total_ms, 2),
               "model_time_planning_ms": round(plain.total_ms, 2), "model_load_ms": round(mt.load_ms, 2),
               "model_stall_ms": round(mt.stall_ms, 2), "model_ms_by_op": _by_op(tm, r.plan["program"], params, run),
               "rotations_planned": s["rotations"], "key_loads_planned": s["key_loads"],
               "hoisted_splits": ks.get("hoisted_splits", 0)}
        _save(plans_out, graph.name, f"cap{f}", r.plan)
        row.update(_bench(r.plan, graph, values, r.tables, keep_all=False, repeat=repeat,
                          plaintext_cache=plaintext_cache, workers=workers))
        runs.append(row)
    base = runs[0]
    for row in runs:
        row["model_over_eval"] = round(row["model_time_ms"] / 1e3 / max(1e-9, row["eval_seconds"]), 4)
        # the planner's own pricing (every instruction at its plan level, a key reader beside)
        row["planning_model_over_eval"] = round(row["model_time_planning_ms"] / 1e3 / max(1e-9, row["eval_seconds"]), 4)
        row["time_ratio"] = round(row["eval_seconds"] / base["eval_seconds"], 4)
        row["peak_reduction"] = round(base["rss_growth_bytes"] / max(1, row["rss_growth_bytes"]), 3)
        row["key_peak_reduction"] = round(base["peak_key_bytes"] / max(1, row["peak_key_bytes"]), 3)
        row["key_bytes_vs_model"] = round(row["peak_key_block_bytes"] / max(1, row["model_key_bytes"]), 4)
        row["rss_vs_model"] = round(row["rss_growth_bytes"] / max(1, row["model_peak_bytes"]), 4)
        # the plan's memory model holds rotation keys, ciphertexts and plaintexts; the
        # process also holds the relinearisation key (same size as a top-level rotation key)
        row["model_total_with_relin_bytes"] = row["model_peak_bytes"] + row["relin_key_bytes"]
        row["rss_vs_model_with_relin"] = round(row["rss_growth_bytes"] / max(1, row["model_total_with_relin_bytes"]), 4)
        # the process model: plan + executor buffers, fused blocks, plaintext cache
        row["rss_vs_process_model"] = round(row["rss_growth_bytes"] / max(1, row["model_process_growth_bytes"]), 4)
    return {"workload": graph.name, "params": params.name, "time_model": tm.source, "run": vars(run), "runs": runs}


def measure_suite(
    path: str | Path, params_name: str | None = None, fractions: Sequence[float] = DEFAULT_FRACTIONS,
    only: Sequence[str] = (), time_limit_s: float = 10.0, repeat: int = 1, plaintext_cache: bool = True,
    workers: int | None = None, plans_out: Path | None = None,
) -> Iterator[dict[str, Any]]:
    from api.keybench import load_key_suite

    suite, root = load_key_suite(path)
    for w in suite.workloads:
        g = load_graph((root / w.graph).resolve())
        if only and g.name not in only:
            continue
        yield measure_graph(g, load_params(params_name or w.params), fractions, time_limit_s=time_limit_s, repeat=repeat,
                            plaintext_cache=plaintext_cache, workers=workers, kernels=w.kernels,
                            plans_out=plans_out)


def geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None
