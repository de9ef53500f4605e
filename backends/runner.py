"""Execute a plan on seeded random data (or the user's tensors) and compare with the numpy
reference of its graph."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from backends.sim import SimResult, simulate
from common.errors import SlotplanError
from common.registry import Registry
from planner.frontend.graph import Graph, parse_graph
from planner.frontend.params import Params
from planner.frontend.ranges import check_input_ranges, check_values
from planner.frontend.reference import random_values, reference
from planner.pipeline import PlanOptions, PlanOptionsLiteral, plan_graph

# The simulator is exact up to float64 round-off; the acceptance bound for it.
SIM_RTOL = 1e-9
# CKKS is approximate: agreement "to CKKS precision" at the presets' 2^40+ scales.
LATTIGO_RTOL = 1e-4
# the noisy simulator's draws (backends/noise.py)
NOISY_SEED = 20261126


@dataclass
class RunReport:
    backend: str
    ok: bool
    max_abs_error: float
    max_rel_error: float
    tolerance: float
    counts: dict[str, int]
    rotations: int
    key_loads: int
    peak_resident_key_bytes: int
    seconds: float
    stats: dict[str, Any]
    bootstraps: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    # the decrypted outputs, named and shaped as the graph's outputs (not in to_json)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    # Chebyshev polys whose argument left their domain (see poly_domain_exits): a failure
    domain_exits: list[dict[str, Any]] = field(default_factory=list)

    def failure(self) -> str | None:
        """One line saying why the run failed (None when it is OK)."""
        if self.domain_exits:
            e = self.domain_exits[0]
            others = len({x["node"] for x in self.domain_exits} - {e["node"]})
            more = f" (and {others} more poly node(s); --json lists them)" if others else ""
            return (
                f"poly {e['node']!r}: its argument left the Chebyshev domain [{e['domain'][0]:.6g}, "
                f"{e['domain'][1]:.6g}] in the {e['where']}: values in [{e['min']:.6g}, {e['max']:.6g}], "
                f"{e['count']} of {e['size']} outside, up to {e['beyond']:.4g} beyond an end "
                f"({e['beyond_halfwidths']:.3g} half-widths): the polynomial is not the function there"
                f"{more}"
            )
        if not self.ok:
            return f"mismatch: max relative error {self.max_rel_error:.3e} > {self.tolerance:g}"
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "ok": self.ok,
            "max_abs_error": self.max_abs_error,
            "max_rel_error": self.max_rel_error,
            "tolerance": self.tolerance,
            "counts": self.counts,
            "rotations": self.rotations,
            "key_loads": self.key_loads,
            "peak_resident_key_bytes": self.peak_resident_key_bytes,
            "seconds": round(self.seconds, 6),
            "bootstraps": self.bootstraps,
            "memory": self.memory,
            "poly_domain_exits": self.domain_exits,
            "stats": self.stats,
        }


def regenerate_tables(plan: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
    """Re-plan from the graph, parameters and options embedded in the plan (planning is
    deterministic) and check the program is identical before using its lazy tables."""
    graph = parse_graph(plan["graph"]["spec"])
    params = Params.from_json(plan["params"])
    opts = PlanOptions.from_literal(PlanOptionsLiteral(**plan.get("options", {})))
    res = plan_graph(graph, params, opts)
    source = plan.get("summary", {}).get("key_schedule", {}).get("source_program_sha256")
    if source is not None:
        # a key-scheduled (possibly rotation-rewritten) plan: its tables are those of the
        # program it was derived from
        from planner.keys.schedule import program_sha256

        if program_sha256(res.plan["program"]) != source and res.plan["program"] != plan["program"]:
            raise SlotplanError(
                "the plan's program differs from what this slotplan produces for its graph; pass --tables"
            )
        return res.tables
    if res.plan["program"] != plan["program"]:
        raise SlotplanError(
            "the plan's program differs from what this slotplan produces for its graph; pass --tables"
        )
    return res.tables


@dataclass
class Execution:
    """What an execution back end reports of one run of a plan."""

    outputs: Mapping[str, Any]
    counts: dict[str, int]
    rotations: int
    key_loads: int
    peak_key_bytes: int
    tolerance: float
    stats: dict[str, Any] = field(default_factory=dict)
    # the simulator's check of Chebyshev arguments on the registers (backends.sim.domain_exit)
    domain_exits: list[dict[str, Any]] = field(default_factory=list)


# Execution back ends by name: each runs a plan on the given values (inputs and weights).
EXECUTION_BACKENDS: Registry[Execution] = Registry("backend", "known backends", SlotplanError)


@EXECUTION_BACKENDS.register("sim")
def _run_sim(
    plan: Mapping[str, Any], tables: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray], graph: Graph,
    params: Params,
) -> Execution:
    key_levels = {int(k): int(v["level"]) for k, v in plan.get("keys", {}).items()} or None
    return _run_sim_result(plan, simulate(plan, tables, values, key_levels=key_levels), params)


def _run_sim_result(plan: Mapping[str, Any], res: SimResult, params: Params) -> Execution:
    if plan.get("keys") or params.boot is not None:
        # keys at their own levels; a bootstrapping plan's block 'boot' (its own size)
        peak_keys = int(plan["summary"]["peak_bytes"]["keys"])
    else:
        peak_keys = res.peak_resident_keys * params.rotation_key_bytes()
    # what the client would see beyond the answer: non-zero slots of the output ciphertexts
    # that hold no output element (0 for clean outputs)
    stats = {"leaked_slots": dict(sorted(res.leaked_slots.items()))}
    return Execution(res.outputs, res.counts, res.rotations, res.key_loads, peak_keys, SIM_RTOL, stats,
                     res.domain_exits)


@EXECUTION_BACKENDS.register("noisy")
def _run_noisy(
    plan: Mapping[str, Any], tables: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray], graph: Graph,
    params: Params,
) -> Execution:
    """The simulator plus the CKKS error model of the plan's preset (backends/noise.py); the
    run is judged with Lattigo's tolerance, and ``stats.noise`` holds the predicted error."""
    from backends.noise import load_model, noise_report, simulate_noisy

    model = load_model(plan["params"])
    key_levels = {int(k): int(v["level"]) for k, v in plan.get("keys", {}).items()} or None
    nr = simulate_noisy(plan, tables, values, model, np.random.default_rng(NOISY_SEED), key_levels=key_levels)
    ex = _run_sim_result(plan, nr.result, params)
    ex.tolerance = LATTIGO_RTOL
    ex.stats.pop("leaked_slots", None)  # every slot carries noise: see the sim backend
    ex.stats["noise"] = noise_report(nr, model)
    return ex


@EXECUTION_BACKENDS.register("lattigo")
def _run_lattigo(
    plan: Mapping[str, Any], tables: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray], graph: Graph,
    params: Params, keep_boot_state: bool = False, plaintext_store: str | None = None,
) -> Execution:
    from backends.lattigo_backend import PLAINTEXT_INLINE_BYTES, check_executable
    from backends.lattigo_backend import run_plan as lattigo_run
    from backends.lattigo_memory import GC_LIMIT_HEADROOM, boot_memory, executor_memory, process_model

    check_executable(plan)  # a malformed plan is bad input (exit 2), before the memory model asks Go

    # the process's modelled memory (backends/lattigo_memory.py): the plan's series plus the
    # executor's own buffers; its growth is Go's soft memory limit for the run
    mem = executor_memory(plan)
    inline = len(plan.get("plaintexts") or {}) * int(params.slots) * 8 <= PLAINTEXT_INLINE_BYTES
    pm = process_model(plan, mem, inline_plaintexts=inline, boot=boot_memory(params))
    lr = lattigo_run(
        dict(plan), {k: values[k] for k in graph.inputs}, {k: values[k] for k in graph.weights}, tables,
        output_shapes={t: tuple(plan["outputs"][t]) for t in graph.outputs},
        memory_limit_extra_bytes=int(pm["growth"] * GC_LIMIT_HEADROOM), keep_boot_state=keep_boot_state,
        plaintext_store=plaintext_store,
    )
    stats = dict(lr.stats)
    if stats.get("rss_start_bytes"):  # the baseline measured by the run itself
        growth = int(pm["growth"])
        if stats.get("boot_state_reused"):
            # the DFT matrices an earlier evaluation kept are in rss_start: not a second time
            # in the growth (the model counts them in the boot block, resident at the peak)
            growth -= min(int(stats.get("boot_matrix_bytes") or 0), int(pm["keys"]))
        pm = pm | {"baseline": int(stats["rss_start_bytes"]), "growth": growth,
                   "total": growth + int(stats["rss_start_bytes"])}
    stats["process_model"] = pm
    counts = {k: int(v) for k, v in stats.get("op_counts", {}).items()}
    return Execution(
        lr.outputs, counts, int(stats.get("rotations", counts.get("rot", 0))), int(stats.get("key_loads", 0)),
        int(stats.get("peak_key_bytes", 0)), LATTIGO_RTOL, stats,
    )


def bootstrap_report(counts: Mapping[str, int], stats: Mapping[str, Any]) -> dict[str, Any]:
    """Bootstraps of a run: how many, and (measured by the back end) seconds each."""
    secs = [float(x) for x in stats.get("bootstrap_seconds") or []]
    n = counts.get("bootstrap", 0) + counts.get("bootstrap2", 0)
    out: dict[str, Any] = {"count": int(n if "bootstrap" in counts or "bootstrap2" in counts else len(secs))}
    if secs:
        out |= {
            "seconds": [round(x, 3) for x in secs],
            "mean_seconds": round(sum(secs) / len(secs), 3),
            "input_levels": list(stats.get("bootstrap_input_levels") or []),
        }
        kinds = list(stats.get("bootstrap_kinds") or [])
        if len(kinds) == len(secs) and any(k != "full" for k in kinds):
            # sparse bootstrap variants (issue 36): the kind of each, and seconds by kind
            by: dict[str, list[float]] = {}
            for k, x in zip(kinds, secs, strict=True):
                by.setdefault(k, []).append(x)
            out["kinds"] = kinds
            out["seconds_by_kind"] = {k: round(sum(v) / len(v), 3) for k, v in sorted(by.items())}
    return out


def memory_report(plan: Mapping[str, Any], stats: Mapping[str, Any], peak_key_bytes: int) -> dict[str, Any]:
    """Modelled peak (the plan's summary) beside what the back end measured: resident key
    bytes, the tracked peak (live ciphertexts + keys + DFT matrices, Lattigo only), and the
    process's peak RSS with its value at the start of the run (Lattigo only)."""
    peak = plan.get("summary", {}).get("peak_bytes", {})
    out: dict[str, Any] = {
        "modelled_peak_bytes": peak.get("total"),
        "modelled_key_bytes": peak.get("keys"),
        "peak_resident_key_bytes": int(peak_key_bytes),
    }
    for key in ("peak_tracked_bytes", "peak_rss_bytes", "rss_start_bytes", "boot_key_bytes", "boot_matrix_bytes"):
        if stats.get(key):
            out[key] = int(stats[key])
    at_run = _model_at_run_key_levels(plan, stats)
    if at_run is not None:
        # the same memory model with the rotation keys at the level the back end generated
        # them (a bootstrapping plan's own keys at the top residual level, not at the top
        # of the bootstrapping chain)
        out["modelled_peak_bytes_summary"] = out["modelled_peak_bytes"]
        out["modelled_peak_bytes"] = at_run
    model = out.get("modelled_peak_bytes")
    if model and out.get("peak_rss_bytes"):
        out["rss_over_model"] = round(out["peak_rss_bytes"] / model, 4)
        out["rss_growth_over_model"] = round((out["peak_rss_bytes"] - out.get("rss_start_bytes", 0)) / model, 4)
    if model and out.get("peak_tracked_bytes"):
        out["tracked_over_model"] = round(out["peak_tracked_bytes"] / model, 4)
    pm = stats.get("process_model")
    if pm:
        # the process: the plan's model plus the executor's buffers, relinearisation key,
        # plaintext vectors and the process at the start (backends/lattigo_memory.py)
        out["modelled_process_bytes"] = dict(pm)
        if out.get("peak_rss_bytes"):
            out["rss_over_process_model"] = round(out["peak_rss_bytes"] / pm["total"], 4)
            out["rss_growth_over_process_model"] = round(
                (out["peak_rss_bytes"] - out.get("rss_start_bytes", 0)) / max(1, pm["growth"]), 4)
    return out


def poly_domain_exits(graph: Graph, values: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]
                      ) -> list[dict[str, Any]]:
    """Every Chebyshev ``poly`` node whose argument, in the graph's numpy reference (the same
    on every back end), leaves its ``domain``: one dict per node (``where: "reference"``)."""
    from backends.sim import domain_exit

    out: list[dict[str, Any]] = []
    for node in graph.nodes:
        if node.op != "poly" or node.basis != "chebyshev" or node.domain is None:
            continue
        src = node.inputs[0]
        arg = ref[src] if src in ref else values.get(src)
        if arg is None:
            continue
        e = domain_exit(np.asarray(arg), (float(node.domain[0]), float(node.domain[1])))
        if e is not None:
            out.append({"node": node.id, "where": "reference", **e})
    return out


# The simulator's register check: a slot outside a Chebyshev domain fails the run when the
# polynomial's value there exceeds this factor of the series' bound on its domain (the sum
# of |coefficients|): the series has blown up (T_d(t) ~ (2t)^d / 2), which corrupts a whole
# CKKS ciphertext whatever the slot holds.  Slots outside by less (a clean layout's zero
# padding, partial sums left in free slots) are masked before any output; the tensor's own
# elements are held to the domain exactly by the reference check.
REGISTER_GROWTH = 2.0**10


def _name_register_exits(plan: Mapping[str, Any], graph: Graph, exits: list[dict[str, Any]]
                         ) -> list[dict[str, Any]]:
    """The simulator's register exits where the series blew up (``REGISTER_GROWTH``), named
    after the graph node whose instructions (the plan's ``nodes[].span``, half-open) hold the
    poly, else after the graph's poly node with the same series, else after the instruction.
    The domain reported is the instruction's (the planner may fold an affine map into it,
    e.g. to [-1, 1]); ``tame_slots`` counts the slots outside it that did not blow up."""
    from planner.ir import Poly

    spans = [(str(n["id"]), int(n["span"][0]), int(n["span"][1])) for n in plan.get("nodes", [])
             if isinstance(n.get("span"), list) and len(n["span"]) == 2]
    poly_ids = {n.id for n in graph.nodes if n.op == "poly"}
    by_series: dict[tuple[Any, ...], list[str]] = {}
    for node in graph.nodes:
        if node.op == "poly" and node.basis == "chebyshev" and node.domain is not None:
            key = (tuple(float(c) for c in node.coeffs or ()), tuple(float(d) for d in node.domain))
            by_series.setdefault(key, []).append(node.id)
    named = []
    for e in exits:
        i = int(e["instruction"])
        c, d = (float(v) for v in e["domain"])
        outside = np.asarray(e["_outside"], dtype=np.float64)
        series = Poly(dst="p", src="s", coeffs=tuple(float(x) for x in e["coeffs"]), basis="chebyshev", domain=(c, d))
        bound = float(np.sum(np.abs(e["coeffs"]))) or 1.0
        with np.errstate(all="ignore"):
            grown = ~(np.abs(np.asarray(series.evaluate(outside), dtype=np.float64)) <= REGISTER_GROWTH * bound)
        if not np.any(grown):
            continue
        out = outside[grown]
        owners = [nid for nid, a, z in spans if a <= i < z]
        owners = [o for o in owners if o in poly_ids] or owners
        ids = owners or by_series.get((tuple(float(x) for x in e["coeffs"]), (c, d))) or []
        label = "/".join(ids) if ids else f"instruction {i} ({e['dst']})"
        with np.errstate(all="ignore"):
            beyond = float(np.nanmax(np.maximum(c - out, out - d))) if np.any(~np.isnan(out)) else float("inf")
        named.append({
            "node": label, "where": "simulator's registers", "instruction": i, "dst": e["dst"], "domain": [c, d],
            "min": float(np.nanmin(out)) if np.any(~np.isnan(out)) else float("nan"),
            "max": float(np.nanmax(out)) if np.any(~np.isnan(out)) else float("nan"),
            "count": int(out.size), "size": e["size"], "beyond": beyond, "beyond_halfwidths": beyond / (0.5 * (d - c)),
            "tame_slots": int(outside.size - out.size),
        })
    return named


def check_assumed_ranges(plan: Mapping[str, Any], ref: Mapping[str, np.ndarray]) -> None:
    """A bootstrapping plan scaled its bootstrap inputs for the ranges it assumed (inputs,
    weights, nodes' promised ranges): refuse values outside them, naming the tensor (the
    bootstrap would return garbage on Lattigo)."""
    assumed = plan.get("summary", {}).get("bootstrapping", {}).get("assumed_ranges")
    if assumed:
        check_values({k: (float(v[0]), float(v[1])) for k, v in assumed.items()}, ref)


def _model_at_run_key_levels(plan: Mapping[str, Any], stats: Mapping[str, Any]) -> int | None:
    """The modelled peak with keep-all rotation keys of the size the back end reports
    (``galois_key_bytes``), when that differs from the summary's (a bootstrapping preset
    models its keys at the bootstrapping chain's top level; Lattigo generates the plan's
    own keys at the top residual level). None when not applicable."""
    params_json = plan.get("params") or {}
    gk = stats.get("galois_key_bytes")
    if not params_json.get("boot") or plan.get("keys") or not gk:
        return None
    from planner import ir
    from planner.ir.analysis import default_key_level, memory_series

    params = Params.from_json(params_json)
    program = ir.decode_program(plan["program"])
    if int(gk) == params.rotation_key_bytes(default_key_level(program, params)):
        return None
    series = memory_series(program, params, key_bytes={k: int(gk) for k in ir.rot_keys_of(program)})
    return int(max(series["keys"] + series["plaintexts"] + series["ciphertexts"], default=0))


def run_plan(
    plan: Mapping[str, Any],
    tables: Mapping[str, np.ndarray] | None,
    backend: str = "sim",
    seed: int = 0,
    init: str = "fan-in",
    values: Mapping[str, np.ndarray] | None = None,
    keep_boot_state: bool = False,
    plaintext_store: str | None = None,
) -> RunReport:
    """Run ``plan`` on ``backend`` with ``values`` (every input and weight, by tensor name)
    or, when None, seeded random ones; compare the outputs with the graph's reference.

    Lattigo, bootstrapping plans: the ciphertext sets of a batched plan are evaluated one
    after the other in this process, the first set's bootstrapping state (DFT matrices) kept
    for the next (backends/lattigo/bootstate.go); ``keep_boot_state`` keeps the last one's too
    (for the next ``run_plan`` call: model-bench's repeats). ``stats.evaluations`` lists, per
    evaluation, its seconds with and without the matrices' encoding and whether it encoded
    them."""
    if "spec" not in plan["graph"]:
        raise SlotplanError("the plan does not embed its graph (graph.spec): cannot compute the reference")
    graph = parse_graph(plan["graph"]["spec"])
    if graph.sha256 != plan["graph"]["sha256"]:
        raise SlotplanError("graph.sha256 does not match the embedded graph")
    params = Params.from_json(plan["params"])
    if tables is None:
        tables = regenerate_tables(plan)
    batch = plan.get("summary", {}).get("batch")
    if batch is not None:
        return _run_batched(plan, tables, backend, seed, init, values, graph, params, int(batch), keep_boot_state,
                            plaintext_store)
    if values is None:
        values = random_values(graph, seed, init)  # declared ranges respected
    # every plan, not only bootstrapping ones (SPEC section 9): an input outside its
    # declared range is refused before anything runs
    check_input_ranges(graph, {k: values[k] for k in graph.inputs if k in values})
    ref = reference(graph, values)
    check_assumed_ranges(plan, ref)
    exits = poly_domain_exits(graph, values, ref)
    execute = EXECUTION_BACKENDS.get(backend)
    t0 = time.perf_counter()
    ex = execute(plan, tables, values, graph, params, **_lattigo_kw(backend, keep_boot_state, plaintext_store))
    outputs, counts, rotations, loads, peak_keys, tol, stats = (
        ex.outputs, ex.counts, ex.rotations, ex.key_loads, ex.peak_key_bytes, ex.tolerance, ex.stats
    )
    if backend == "lattigo":
        stats["evaluations"] = evaluations([stats])
    seconds = time.perf_counter() - t0
    decrypted = {t: np.asarray(outputs[t], dtype=np.float64).reshape(graph.shape(t)) for t in graph.outputs}
    exits += _name_register_exits(plan, graph, ex.domain_exits)
    return _report(backend, graph, ref, decrypted, counts, rotations, loads, peak_keys, tol, seconds, stats, plan,
                   exits)


def _run_batched(
    plan: Mapping[str, Any], tables: Mapping[str, np.ndarray], backend: str, seed: int, init: str,
    values: Mapping[str, np.ndarray] | None, graph: Graph, params: Params, batch: int, keep_boot_state: bool = False,
    plaintext_store: str | None = None,
) -> RunReport:
    """A plan of ``batch`` samples (SPEC section 8) on N samples: inputs with a leading
    dimension N (an input of the tensor's own shape is one sample; random values: N = B,
    sample b seeded ``seed + b``), executed as ceil(N / B) ciphertext sets, the last one
    padded with zero samples; outputs (and the comparison) per sample, leading dimension N."""
    from planner.batch import batched_reference

    if values is None:
        per = [random_values(graph, seed + b, init) for b in range(batch)]
        values = {**per[0], **{t: np.stack([p[t] for p in per]) for t in graph.inputs}}
    vals = dict(values)
    for t in graph.inputs:
        a = np.asarray(vals[t], dtype=np.float64)
        vals[t] = a.reshape((1, *graph.shape(t))) if a.shape == tuple(graph.shape(t)) else a
    ns = {int(vals[t].shape[0]) for t in graph.inputs}
    if len(ns) != 1:
        raise SlotplanError(f"inputs: sample counts differ ({', '.join(f'{t}: {vals[t].shape[0]}' for t in graph.inputs)})")
    n = ns.pop()
    # every sample's inputs within their declared ranges (SPEC section 9), as for one sample
    check_input_ranges(graph, {t: vals[t] for t in graph.inputs})
    ref = batched_reference(graph, vals, n)
    check_assumed_ranges(plan, ref)
    # a Chebyshev poly's argument outside its domain in any sample's reference fails the run
    exits = poly_domain_exits(graph, vals, ref)
    execute = EXECUTION_BACKENDS.get(backend)
    counts: dict[str, int] = {}
    rotations = loads = peak_keys = 0
    tol = 0.0
    sets: list[dict[str, Any]] = []
    set_seconds: list[float] = []
    outs: dict[str, list[np.ndarray]] = {t: [] for t in graph.outputs}
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        chunk = {t: vals[t] for t in graph.weights}
        for t in graph.inputs:
            x = vals[t][start:start + batch]
            pad = np.zeros((batch - x.shape[0], *graph.shape(t)))  # zero samples: never read back
            chunk[t] = np.concatenate([x, pad]) if pad.shape[0] else x
        t1 = time.perf_counter()
        # every set but the last keeps the bootstrapping state for the next (bootstate.go)
        ex = execute(plan, tables, chunk, graph, params,
                     **_lattigo_kw(backend, keep_boot_state or start + batch < n, plaintext_store))
        set_seconds.append(round(time.perf_counter() - t1, 6))
        for k, v in ex.counts.items():
            counts[k] = counts.get(k, 0) + int(v)
        rotations, loads = rotations + ex.rotations, loads + ex.key_loads
        peak_keys, tol = max(peak_keys, ex.peak_key_bytes), ex.tolerance
        sets.append(dict(ex.stats))
        exits += [e for e in _name_register_exits(plan, graph, ex.domain_exits) if e not in exits]
        for t in graph.outputs:
            got = np.asarray(ex.outputs[t], dtype=np.float64).reshape((batch, *graph.shape(t)))
            outs[t].append(got[: min(batch, n - start)])
    seconds = time.perf_counter() - t0
    decrypted = {t: np.concatenate(outs[t]) for t in graph.outputs}
    # the last set's statistics (memory: every set runs the same program), the bootstraps of
    # all of them, and the batch
    stats: dict[str, Any] = {**sets[-1], "samples": n, "batch": batch, "ciphertext_sets": len(sets),
                             "set_seconds": set_seconds}
    if any("bootstrap_seconds" in x for x in sets):
        stats["bootstrap_seconds"] = [b for x in sets for b in x.get("bootstrap_seconds") or []]
    if backend == "lattigo":
        stats["evaluations"] = evaluations(sets)
    return _report(backend, graph, ref, decrypted, counts, rotations, loads, peak_keys, tol, seconds, stats, plan,
                   exits)


def _lattigo_kw(backend: str, keep: bool, plaintext_store: str | None) -> dict[str, Any]:
    """The keep_boot_state and plaintext_store arguments for the Lattigo back end (the others
    take none)."""
    if backend != "lattigo":
        return {}
    kw: dict[str, Any] = {"keep_boot_state": True} if keep else {}
    if plaintext_store is not None:
        kw["plaintext_store"] = plaintext_store
    return kw


def evaluations(sets: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per evaluation (Lattigo ``Run`` call, one per ciphertext set): its seconds with and
    without the bootstrapping DFT matrices' encoding (setup: public, input-independent,
    encoded once and kept by a process that evaluates again), whether it encoded them
    (``matrices_built``) or used the ones an earlier evaluation left (``matrices_reused``)."""
    out = []
    for st in sets:
        ev = float(st.get("eval_seconds", 0.0))
        mat = float(st.get("boot_matrix_seconds", 0.0))
        out.append({"eval_seconds": round(ev, 6), "boot_matrix_seconds": round(mat, 6),
                    "eval_seconds_without_matrices": round(ev - mat, 6),
                    "matrices_built": int(st.get("boot_matrix_builds", 0)) > 0,
                    "matrices_reused": bool(st.get("boot_state_reused", False)),
                    "matrices_kept": bool(st.get("boot_state_kept", False)),
                    "peak_tracked_bytes": int(st.get("peak_tracked_bytes", 0)),
                    "peak_rss_bytes": int(st.get("peak_rss_bytes", 0)), "rss_start_bytes": int(st.get("rss_start_bytes", 0))})
    return out


def _report(
    backend: str, graph: Graph, ref: Mapping[str, np.ndarray], decrypted: dict[str, np.ndarray],
    counts: dict[str, int], rotations: int, loads: int, peak_keys: int, tol: float, seconds: float,
    stats: dict[str, Any], plan: Mapping[str, Any], exits: list[dict[str, Any]],
) -> RunReport:
    max_abs = 0.0
    max_rel = 0.0
    for t in graph.outputs:
        got = decrypted[t]
        want = ref[t]
        if not (np.all(np.isfinite(got)) and np.all(np.isfinite(want))):
            max_abs = max_rel = float("inf")  # NaN/inf must fail, not vanish in max()
            break
        err = float(np.max(np.abs(got - want))) if want.size else 0.0
        scale = float(np.max(np.abs(want))) if want.size else 1.0
        max_abs = max(max_abs, err)
        max_rel = max(max_rel, err / scale if scale > 0 else err)
    # a poly evaluated outside its domain is a failure even when the back end matches the
    # reference (both are then far from the function the polynomial stands for)
    ok = bool(np.isfinite(max_rel) and max_rel <= tol) and not exits
    return RunReport(
        backend, ok, max_abs, max_rel, tol, counts, rotations, loads, peak_keys, seconds, stats,
        bootstrap_report(counts, stats), memory_report(plan, stats, peak_keys), decrypted, exits,
    )
