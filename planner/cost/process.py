"""The process model: what a Lattigo run of a plan holds, known to the planner without Lattigo.

The plan's ``summary.peak_bytes`` (planner/ir/analysis.py) counts resident keys, live
ciphertexts and plaintexts.  A Lattigo process holds more: the executor's own state.  Its
sizes are what Go's ``ExecutorMemory`` (backends/lattigo/memmodel.go) reports, the
``BinarySize`` of the objects the executor allocates, stored per preset by ``slotplan
calibrate`` in the cost table's ``measurements.executor`` (:func:`executor_sizes`); a plan's
fused blocks are read from its ``fused`` annotation (:func:`fused_blocks`, the blocks Go lists
for the same plan).  ``backends/lattigo_memory.py`` evaluates the same model with the sizes
Go reports at run time; :func:`process_model` is the one definition both use.  The terms:

* ``fused``: the fused linear blocks' working set (backends/lattigo/fused.go), step by step:
  the lazy baby rotations of a block's base (extended ciphertexts in QP at the base's
  level, held from the first block on that base to its last, then pooled for the next
  block at the same level; a block at another level drops the pool), P*c0 and P*c1 of each
  cached base, the block's plaintexts encoded in QP while it runs (with a plaintext cache,
  and for Q-mode blocks; otherwise each worker encodes one at a time into its buffer), and
  from the first block on the workers' buffers (7 QP polys each) and the decomposition
  buffers;
* ``evaluator``: the buffers of the ckks evaluator and encoder, once per worker of the fused
  blocks (one without fusion);
* ``relin_key``: the relinearisation key, when the run holds one beside the plan's keys
  (plans with ``cmul`` or a polynomial of degree >= 2; a keep-all bootstrapping plan uses the
  boot block's, already in the plan's keys);
* ``client``: the client that encrypts the inputs and decrypts the outputs, alive during
  the evaluation (secret key, key generator, encoder, encryptor and decryptor with their
  buffers): the Go heap its constructor allocates (``runtime.ReadMemStats`` after
  collections, measured by ``ExecutorMemory`` for the plan's parameters);
* ``plaintext_values``: the plaintext vectors Go unpacks (float64, ``slots`` each) when the
  plan hands them inline; one vector when they come through a file
  (:data:`PLAINTEXT_INLINE_BYTES`);
* ``plaintext_cache`` (benchmarks only, ``cached_plaintexts=True``: ``BenchPlan`` encodes
  every plaintext once before its timed runs and keeps it): each plaintext of a fused block
  as a QP poly at its block's level, every other one as a plaintext at the level it is
  encoded at (the plan's memory model's level), once per (name, level).

Bootstrapping plans add two terms, from one bootstrap measured by ``slotplan calibrate``
(``measurements.bootstrap`` of the preset's table, :func:`boot_memory`):

* ``boot_transient``: at a ``bootstrap`` step, the temporaries Lattigo's bootstrapping
  allocates and holds (baby-step rotations of the DFTs in QP, EvalMod's power basis, the
  copy of the input): the heap's peak above its start during one bootstrap at GOGC 0
  (79 MiB at n14boot);
* ``gc_slack``: garbage.  Go collects when the heap reaches (1 + GOGC/100) times the live
  bytes of the last collection (GOGC 10 during a run), and a bootstrap leaves all it
  allocated (297 MiB at n14boot) as garbage, so after the first bootstrap the heap holds up
  to min(GOGC/100 x its live bytes, the bytes the bootstraps so far allocated) of it.  Plans
  without a bootstrap allocate little per instruction (in-place operations, pooled
  buffers): their measured RSS stayed within 2% of the model without this term.

``growth`` is the largest sum over program steps of the plan's series, ``fused``, the
bootstrap's terms and the constant terms: what the run adds to the process's resident set.
``total`` adds ``baseline``: the resident set of the process when the run starts (Python,
numpy, slotplan's modules, the plan and the extension with its Go runtime), measured by the
run itself (``rss_start_bytes``) or, before a run, :data:`BASELINE_BYTES`.

``--memory-cap`` bounds ``growth`` (docs/lattigo.md, "The process model"): the key schedule
holds back the executor's constant terms (:func:`executor_reserve`) and sees the fused
blocks step by step (:func:`executor_series`); a capped plan reports the model as
``summary.process_peak_bytes`` (:func:`summary_field`), the baseline apart. One worker
(:data:`PLANNER_WORKERS`); each further one adds ``evaluator_bytes + fused_worker_bytes``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner import ir
from planner.frontend.params import Params
from planner.ir.analysis import lifetimes, memory_series, plan_key_bytes, register_depths

__all__ = [
    "BASELINE_BYTES", "EXECUTOR_FIELDS", "PLAINTEXT_INLINE_BYTES", "PLANNER_WORKERS", "BootMemory", "boot_memory",
    "executor_reserve", "executor_series", "executor_sizes", "fixed_reserve", "fused_blocks", "fused_series", "plaintext_cache_bytes",
    "plan_executor_memory", "plan_process_model", "process_model", "summary_field",
]

# Resident set of a process that imported slotplan's command line, runner and the gopy
# extension and started the Go runtime, before any plan (scripts/process_baseline.py on this
# machine: 62 MiB, Python 3.11).  A run uses its own rss_start_bytes instead: the plan, its
# tables, the graph's values and the planner (when tables are regenerated) add to it
# (170-450 MB in the runs of docs/lattigo.md).  The memory cap does not bound it.
BASELINE_BYTES = 62 * 2**20
# Above this many bytes of plaintext vectors, a run hands them to Go through a file
# (backends/lattigo_backend.py run_plan): the model counts one vector then.
PLAINTEXT_INLINE_BYTES = 64 << 20
# The workers the planner's model assumes (Go's GOMAXPROCS in a run pinned to one core).
PLANNER_WORKERS = 1
# The sizes ``measurements.executor`` of a cost table keeps (Go ExecutorMemory, one worker,
# for the table's parameters; none of them depends on the plan).
EXECUTOR_FIELDS = (
    "log_n", "top", "evaluator_bytes", "fused_worker_bytes", "fused_decomp_bytes", "qp_element_bytes",
    "qp_poly_bytes", "q_poly_bytes", "relin_key_bytes", "client_bytes", "galois_key_bytes", "run_gc_percent",
)


def _without_variants(params: Params) -> Params:
    """``params`` without the sparse bootstraps it offers (the full-slot bootstrap's set)."""
    return params if params.boot is None else dataclasses.replace(params, boot=dataclasses.replace(params.boot, variants=()))


def _preset_measurement(params: Params, key: str) -> Mapping[str, Any] | None:
    """``measurements[key]`` of the preset's calibrated table (``data/costs/<preset>-lattigo.json``)
    when the table was calibrated on exactly ``params``, but for the sparse bootstraps they
    offer (``boot.variants``: the executor's sizes and the full-slot bootstrap's memory do not
    depend on them; a variant's DFT matrices are its params entry's matrix_bytes); None otherwise."""
    from planner.cost.tables import COST_TABLES

    name = f"{params.name}-lattigo"
    if name not in COST_TABLES:
        return None
    table = COST_TABLES.create(name)
    if table.params is None or _without_variants(Params.from_json(dict(table.params))) != _without_variants(params):
        return None
    m = (table.measurements or {}).get(key)
    return m if isinstance(m, Mapping) else None


def executor_sizes(params: Params) -> dict[str, Any] | None:
    """The executor's sizes on ``params`` (:data:`EXECUTOR_FIELDS`), as ``slotplan calibrate``
    stored them from Go's ``ExecutorMemory``; None when no table of the preset measured them
    (custom parameters, a table calibrated before 2026-11-26): the model then counts the plan's
    terms only, and says so (``summary.process_peak_bytes.executor_measured``)."""
    m = _preset_measurement(params, "executor")
    if m is None or any(f not in m for f in EXECUTOR_FIELDS):
        return None
    return {f: m[f] for f in EXECUTOR_FIELDS}


def fused_blocks(plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The plan's fused blocks as Go's ``ExecutorMemory`` lists them (``blocks``): the plan's
    ``fused`` annotation (computed now when it has none, as the executor gets it)."""
    from planner.ir.fused_plan import read_fused, with_fused

    full = with_fused(plan)
    blocks, _ = read_fused(full)
    slots = int(full["params"]["slots"])
    rotated: dict[str, str] = {}
    for ins in full["program"]:
        if ins.get("op") == "rot":
            rotated[str(ins["dst"])] = str(ins["src"])
        elif ins.get("op") == "rot_hoisted":
            for r in ins.get("dsts") or []:
                rotated[str(r)] = str(ins["src"])
    out = []
    for b in blocks:
        bases: dict[str, list[int]] = {}
        for p in b.products:
            betas = bases.setdefault(p.base, [])
            beta = p.beta % slots
            if beta and beta not in betas:
                betas.append(beta)
        origin = sorted(bases)[0]
        for _ in range(len(full["program"])):  # the origin: rotations (of rotations) of it
            if origin not in rotated:
                break
            origin = rotated[origin]
        out.append({"root": b.root, "first": min(b.instrs), "base": origin,
                    "bases": {r: sorted(v) for r, v in bases.items()}, "terms": len(b.products), "qmode": b.qmode,
                    "plaintexts": sorted({p.pt for p in b.products})})
    return out


def _needs_relin(program: list[Any]) -> bool:
    for ins in program:
        if ins.get("op") == "cmul":
            return True
        if ins.get("op") == "poly":
            c = list(ins.get("coeffs") or [])
            d = len(c) - 1
            while d > 0 and c[d] == 0:
                d -= 1
            if d >= 2:
                return True
    return False


def plan_executor_memory(plan: Mapping[str, Any], sizes: Mapping[str, Any], workers: int = PLANNER_WORKERS
                         ) -> dict[str, Any]:
    """What Go's ``ExecutorMemory`` reports for ``plan``, from the preset's stored ``sizes``:
    the sizes, the workers, whether the relinearisation key is held beside the plan's keys
    (as the executor decides) and the fused blocks."""
    params = Params.from_json(plan["params"])
    program = list(plan["program"])
    ops = {ins.get("op") for ins in program}
    scheduled = "load_key" in ops
    with_block = params.boot is not None and (
        bool(ops & {"bootstrap", "bootstrap2", "bootstrap_cins"})
        or any(ins.get("op") in ("load_key", "drop_key") and ins.get("block") for ins in program))
    blocks = fused_blocks(plan)
    return {**sizes, "workers": int(workers), "relin_resident": _needs_relin(program) and (scheduled or not with_block),
            "fused": bool(blocks), "blocks": blocks}


@dataclass(frozen=True)
class BootMemory:
    """One bootstrap's measured memory (``slotplan calibrate``, ``measurements.bootstrap``):
    the heap's peak above its start (temporaries) and the bytes it allocates."""

    transient_bytes: int
    alloc_bytes: int


def boot_memory(params: Params) -> BootMemory | None:
    """One bootstrap's memory on ``params``, from the calibrated table of its preset
    (``data/costs/<preset>-lattigo.json``) when the table was calibrated on the same
    parameters and measured it; None otherwise (the process model then leaves the
    bootstrap's terms out)."""
    if params.boot is None:
        return None
    b = _preset_measurement(params, "bootstrap")
    if b is None:
        return None
    t, a = b.get("transient_bytes"), b.get("alloc_bytes")
    if not isinstance(t, int) or not isinstance(a, int):
        return None
    return BootMemory(t, a)


def boot_series(program: list[Any], live: np.ndarray, boot: BootMemory | None, gc_percent: int) -> tuple[np.ndarray, np.ndarray]:
    """The bootstrap's terms at each program step (module docstring): the temporaries at
    each ``bootstrap``, and the garbage over ``live`` (the Go heap's live bytes at each step
    without them) once the first bootstrap ran."""
    if boot is None:
        return np.zeros(len(program), dtype=np.int64), np.zeros(len(program), dtype=np.int64)
    at_boot = np.array([ir.is_bootstrap(ins) for ins in ir.decode_program(program)], dtype=np.int64)
    transient = at_boot * boot.transient_bytes
    slack = np.minimum((live + transient) * gc_percent // 100, np.cumsum(at_boot) * boot.alloc_bytes)
    return transient, slack


def fused_series(program: list[Any], params: Params, mem: Mapping[str, Any], streamed: bool = False) -> np.ndarray:
    """Bytes the fused blocks hold at each program step (the module docstring's walk).
    ``streamed``: no plaintext cache (Run; BenchPlan's ``no_plaintext_cache``): a QP-mode
    block's workers encode one plaintext at a time into their buffer (counted in
    ``fused_worker_bytes``) instead of holding the block's."""
    prog = ir.decode_program(program)
    n = len(prog)
    out = np.zeros(n, dtype=np.int64)
    blocks = mem.get("blocks") or []
    if not blocks:
        return out
    depth = register_depths(prog)
    top = int(mem["top"])
    qpel, qppoly, qpoly = mem["qp_element_bytes"], mem["qp_poly_bytes"], mem["q_poly_bytes"]

    def level(reg: str) -> int:
        return max(0, min(top, params.max_level - depth[reg]))

    def bases(b: Mapping[str, Any]) -> dict[str, list[int]]:
        # the registers a block's products read (its origin and rotations of it, all at the
        # origin's level), each with the offsets it is rotated by lazily
        return {str(r): [int(k) for k in ks] for r, ks in (b.get("bases") or {}).items()}

    remaining: dict[str, int] = {}
    for b in blocks:
        for r in bases(b):
            remaining[r] = remaining.get(r, 0) + 1
    held: dict[str, tuple[set[int], int]] = {}  # base -> (baby offsets, level)
    pool_level, pool = -1, 0

    def resident() -> int:
        s = sum(len(bs) * qpel[lv] + 2 * qpoly[lv] for bs, lv in held.values())
        return s + (pool * qpel[pool_level] if pool else 0)

    fixed = int(mem["workers"]) * int(mem["fused_worker_bytes"]) + int(mem["fused_decomp_bytes"])
    first_root = int(blocks[0]["root"])
    prev = first_root
    for b in blocks:
        root = int(b["root"])
        out[prev:root] += resident()
        lv = level(b["base"])
        for r, betas in bases(b).items():
            bs, _ = held.get(r, (set(), lv))
            new = len(set(betas) - bs)
            if new:
                if pool_level != lv:
                    pool_level, pool = lv, 0
                pool -= min(pool, new)
            held[r] = (bs | set(betas), lv)
        held_pts = 0 if streamed and not b.get("qmode") else int(b["terms"]) * qppoly[lv]
        out[root] += resident() + held_pts
        for r in bases(b):
            remaining[r] -= 1
            if remaining[r] == 0:
                bs, blv = held.pop(r)
                if blv == pool_level or pool == 0:
                    pool_level = blv
                    pool += len(bs)
        prev = root + 1
    out[prev:] += resident()
    out[first_root:] += fixed
    return out


def plaintext_cache_bytes(program: list[Any], params: Params, mem: Mapping[str, Any]) -> int:
    """Bytes of a cache holding every plaintext of the program as the executor encodes it."""
    prog = ir.decode_program(program)
    depth = register_depths(prog)
    life = lifetimes(prog, depth, params.max_level)
    top = int(mem["top"])
    seen: set[tuple[str, int]] = set()
    total = 0
    fused_pts: set[str] = set()
    for b in mem.get("blocks") or []:
        lv = max(0, min(top, params.max_level - depth[b["base"]]))
        for p in b.get("plaintexts", []):
            fused_pts.add(p)
            if (p, lv) not in seen:
                seen.add((p, lv))
                total += int(mem["qp_poly_bytes"][lv])
    for p, lv in life.pt_level.items():
        if p not in fused_pts and (p, lv) not in seen:
            seen.add((p, lv))
            total += params.plaintext_bytes(lv)
    return total


def _constant_terms(plan: Mapping[str, Any], params: Params, mem: Mapping[str, Any], inline_plaintexts: bool,
                    cached_plaintexts: bool) -> dict[str, int]:
    """The terms the process holds through the whole evaluation (module docstring)."""
    workers = int(mem["workers"]) if mem.get("fused") else 1
    # (a complex plaintext's values are 2 * slots numbers: complex packing)
    n_pt = sum(2 if "imag_table" in p else 1 for p in (plan.get("plaintexts") or {}).values())
    return {
        "evaluator": workers * int(mem["evaluator_bytes"]),
        "relin_key": int(mem["relin_key_bytes"]) if mem.get("relin_resident") else 0,
        "client": int(mem.get("client_bytes", 0)),
        "plaintext_values": 8 * int(params.slots) * (n_pt if inline_plaintexts else 1),
        "plaintext_cache": plaintext_cache_bytes(plan["program"], params, mem) if cached_plaintexts else 0,
    }


def process_model(
    plan: Mapping[str, Any],
    mem: Mapping[str, Any],
    *,
    inline_plaintexts: bool = True,
    cached_plaintexts: bool = False,
    baseline_bytes: int | None = None,
    key_bytes: Mapping[int, int] | None = None,
    boot: BootMemory | None = None,
) -> dict[str, int]:
    """The modelled memory of a Lattigo run of ``plan`` (module docstring): the terms, their
    ``growth`` over the start of the run and the process ``total``. ``boot``: one
    bootstrap's measured memory (:func:`boot_memory`; without it a bootstrapping plan's
    model leaves out the bootstrap's temporaries and garbage)."""
    params = Params.from_json(plan["params"])
    program = plan["program"]
    kb = key_bytes if key_bytes is not None else plan_key_bytes(plan)
    if kb is None:  # keep-all: every key as the run generates it (the plan's top level)
        kb = dict.fromkeys(ir.rot_keys_of(ir.decode_program(program)), int(mem["galois_key_bytes"]))
    ser = memory_series(program, params, key_bytes=kb)
    base = ser["keys"] + ser["plaintexts"] + ser["ciphertexts"]
    fused = fused_series(program, params, mem, streamed=not cached_plaintexts)
    constant = _constant_terms(plan, params, mem, inline_plaintexts, cached_plaintexts)
    live = base + fused + sum(constant.values())
    gc_percent = int(mem.get("run_gc_percent", 100))
    transient, slack = boot_series(program, live, boot if params.boot is not None else None, gc_percent)
    step = live + transient + slack
    at = int(np.argmax(step)) if len(step) else 0

    def at_peak(series: np.ndarray) -> int:
        return int(series[at]) if len(step) else 0

    terms = {
        "keys": at_peak(ser["keys"]),
        "plaintexts": at_peak(ser["plaintexts"]),
        "ciphertexts": at_peak(ser["ciphertexts"]),
        "fused": at_peak(fused),
        **constant,
        "boot_transient": at_peak(transient),
        "gc_slack": at_peak(slack),
    }
    growth = sum(terms.values())
    baseline = BASELINE_BYTES if baseline_bytes is None else int(baseline_bytes)
    return {**terms, "peak_step": at, "growth": growth, "baseline": baseline, "total": growth + baseline}


def inline_plaintexts(plan: Mapping[str, Any]) -> bool:
    """Whether a run hands the plan's plaintext vectors to Go inline (else through a file)."""
    return len(plan.get("plaintexts") or {}) * int(plan["params"]["slots"]) * 8 <= PLAINTEXT_INLINE_BYTES


def plan_process_model(plan: Mapping[str, Any], workers: int = PLANNER_WORKERS) -> dict[str, Any]:
    """The process model of a ``slotplan run --backend lattigo`` of ``plan``, before any run:
    :func:`process_model` with the preset's stored executor sizes (without them, the plan's
    terms and the bootstrap's only: ``executor_measured`` false)."""
    params = Params.from_json(plan["params"])
    sizes = executor_sizes(params)
    boot = boot_memory(params)
    if sizes is None:
        mem: dict[str, Any] = {"top": params.max_level, "workers": 0, "evaluator_bytes": 0, "fused_worker_bytes": 0,
                               "fused_decomp_bytes": 0, "relin_key_bytes": 0, "relin_resident": False,
                               "client_bytes": 0, "run_gc_percent": 10, "fused": False, "blocks": [],
                               "galois_key_bytes": params.rotation_key_bytes()}
        return {**process_model(plan, mem, inline_plaintexts=False, boot=boot), "executor_measured": False}
    pm = process_model(plan, plan_executor_memory(plan, sizes, workers), inline_plaintexts=inline_plaintexts(plan),
                       boot=boot)
    return {**pm, "executor_measured": True}


def summary_field(pm: Mapping[str, Any]) -> dict[str, Any]:
    """``summary.process_peak_bytes`` of a capped plan: the process model at its peak step in
    four parts (the plan's own terms, the executor's, the bootstrap's temporaries and garbage)
    and their ``total`` (what ``memory_cap_bytes`` bounds), the ``baseline`` apart."""
    plan_part = int(pm["keys"] + pm["plaintexts"] + pm["ciphertexts"])
    boot_part = int(pm["boot_transient"] + pm["gc_slack"])
    return {"plan": plan_part, "executor": int(pm["growth"]) - plan_part - boot_part, "bootstrap": boot_part,
            "total": int(pm["growth"]), "baseline": int(pm["baseline"]),
            "executor_measured": bool(pm.get("executor_measured", True))}


@dataclass(frozen=True)
class Reserve:
    """What the key schedule leaves of the cap for the executor (:func:`executor_reserve`):
    ``bytes`` at every step, and for a bootstrapping plan the garbage ``alloc_bytes`` its
    bootstraps allocate in all and GOGC's share ``gc_percent`` of the live heap."""

    bytes: int
    alloc_bytes: int = 0
    gc_percent: int = 0

    def slack(self, cap: int) -> int:
        """The garbage a heap under ``cap`` can carry: x + min(x g/100, A) <= cap holds exactly
        when x <= cap - min(ceil(cap g / (100 + g)), A)."""
        if not self.alloc_bytes:
            return 0
        return min(self.alloc_bytes, -(-cap * self.gc_percent // (100 + self.gc_percent)))

    def plan_cap(self, cap: int) -> int:
        """The cap the plan's own terms (keys, plaintexts, ciphertexts) must keep to."""
        return cap - self.bytes - self.slack(cap)

    def process_cap(self, plan_min: int) -> int:
        """The smallest process cap whose :meth:`plan_cap` is at least ``plan_min``."""
        m = plan_min + self.bytes
        if not self.alloc_bytes:
            return m
        return min(m + self.alloc_bytes, math.ceil(m * (100 + self.gc_percent) / 100))


def executor_series(plan: Mapping[str, Any], workers: int = PLANNER_WORKERS
                    ) -> Callable[[Sequence[Mapping[str, Any]]], np.ndarray] | None:
    """The fused blocks' bytes at each step of a program derived from ``plan`` (the key
    scheduler's, without key ops), as a run holds them (no plaintext cache); None without
    stored sizes. The blocks are decided as under a key schedule (planner.ir.fusion), and
    since which blocks the schedule splits by dropping their giant keys early is not known
    before it is made, each step counts the larger of "all whole" and "all split"."""
    params = Params.from_json(plan["params"])
    sizes = executor_sizes(params)
    if sizes is None:
        return None
    from planner.ir.fused_plan import fused_annotation

    base = {k: v for k, v in plan.items() if k not in ("fused", "keys")}

    def series(program: Sequence[Mapping[str, Any]]) -> np.ndarray:
        prog = [dict(i) for i in program if i.get("op") not in ("load_key", "drop_key")]
        out = np.zeros(len(prog), dtype=np.int64)
        for split in (False, True):
            ann = fused_annotation(prog, params.slots, scheduled=True, split_giants=split)
            mem = plan_executor_memory({**base, "program": prog, "fused": ann}, sizes, workers)
            out = np.maximum(out, fused_series(prog, params, mem, streamed=True))
        return out

    return series


def executor_reserve(plan: Mapping[str, Any], workers: int = PLANNER_WORKERS, stepwise: bool = False) -> Reserve:
    """The executor's share of a capped plan's memory for the key schedule: the largest sum
    over the program's steps of the executor's terms (fused blocks, buffers, client,
    relinearisation key, plaintext vectors, a bootstrap's temporaries), held back at every
    step, and the bootstraps' garbage (:class:`Reserve`). Zero without stored sizes.
    ``stepwise``: the fused blocks' part is left out (the key scheduler adds it step by step,
    :func:`executor_series`)."""
    params = Params.from_json(plan["params"])
    sizes = executor_sizes(params)
    boot = boot_memory(params)
    prog = [i for i in plan["program"] if i.get("op") not in ("load_key", "drop_key")]
    bare = {**plan, "program": prog}
    bare.pop("fused", None)
    bare.pop("keys", None)
    n_boot = sum(1 for i in ir.decode_program(prog) if ir.is_bootstrap(i)) if params.boot is not None else 0
    transient = boot.transient_bytes if boot is not None and n_boot else 0
    alloc = boot.alloc_bytes * n_boot if boot is not None else 0
    if sizes is None:
        return Reserve(transient, alloc, 10 if alloc else 0)
    mem = plan_executor_memory(bare, sizes, workers)
    fused = fused_series(prog, params, mem, streamed=True)  # as a run: no plaintext cache
    const = _constant_terms(bare, params, mem, inline_plaintexts(bare), False)
    return Reserve((0 if stepwise else int(fused.max(initial=0))) + sum(const.values()) + transient, alloc,
                   int(mem["run_gc_percent"]) if alloc else 0)


def fixed_reserve(params: Params, workers: int = PLANNER_WORKERS) -> Reserve:
    """The part of :func:`executor_reserve` no plan goes below on ``params`` (evaluator,
    client, the fused blocks' worker and decomposition buffers, one bootstrap's temporaries
    and garbage on a bootstrapping preset): what the assignment's candidate cut leaves out of
    the cap before a program exists (planner/assign/problem.py)."""
    sizes = executor_sizes(params)
    boot = boot_memory(params)
    b = boot.transient_bytes if boot is not None else 0
    alloc = boot.alloc_bytes if boot is not None else 0
    if sizes is None:
        return Reserve(b, alloc, 10 if alloc else 0)
    fixed = workers * (int(sizes["evaluator_bytes"]) + int(sizes["fused_worker_bytes"]))
    fixed += int(sizes["fused_decomp_bytes"]) + int(sizes["client_bytes"])
    return Reserve(fixed + b, alloc, int(sizes["run_gc_percent"]) if alloc else 0)
