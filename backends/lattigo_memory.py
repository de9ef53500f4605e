"""The modelled memory of a Lattigo run: the plan's memory model plus what the executor holds.

The plan's ``summary.peak_bytes`` (planner/ir/analysis.py) counts resident keys, live
ciphertexts and plaintexts.  A Lattigo process holds more, and each term here is the
``BinarySize`` of objects the executor allocates (Go ``ExecutorMemory``,
backends/lattigo/memmodel.go, built with the executor's own constructors):

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
  plan hands them inline; one vector when they come through a file;
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
bootstrap's terms and the constant terms: what the run adds to the process's resident set.  ``total`` adds
``baseline``: the resident set of the process when the run starts (Python, numpy, slotplan's
modules, the plan and the extension with its Go runtime), measured by the run itself
(``rss_start_bytes``) or, before a run, :data:`BASELINE_BYTES`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner import ir
from planner.frontend.params import Params
from planner.ir.analysis import lifetimes, memory_series, plan_key_bytes, register_depths

__all__ = ["BASELINE_BYTES", "GC_LIMIT_HEADROOM", "BootMemory", "boot_memory", "executor_memory", "fused_series", "plaintext_cache_bytes", "process_model"]

# Resident set of a process that imported slotplan's command line, runner and the gopy
# extension and started the Go runtime, before any plan (scripts/process_baseline.py on this
# machine: 62 MiB, Python 3.11).  A run uses its own rss_start_bytes instead: the plan, its
# tables, the graph's values and the planner (when tables are regenerated) add to it
# (170-450 MB in the runs of docs/lattigo.md).
BASELINE_BYTES = 62 * 2**20
# Go's soft memory limit during a run: the Go runtime's memory at its start plus the
# modelled growth times this (the collector then runs before the heap passes the model;
# Go's GOGC alone, 10 during a run, would let it reach 1.1x the live bytes). At 1.03 a
# run whose real need passed the model by 4% (LeNet-5 keep-all at n14boot once blocks
# stream their plaintexts: RSS 1.044x the model) sat on the limit: the collector ran back
# to back (sweeping 42% of the CPU profile) and the evaluation took 21-23 s instead of
# 9.8 s. At 1.10 LoLa's capped runs at n14 (RSS 1.23x the model: 170 MiB the model does
# not explain yet) sat on it in turn (runs of 4.66, 5.80, 5.83 s against 4.42-4.52 s for
# the same schedule at the quarter cap). GOGC 10 already keeps the heap within 1.1x the
# live bytes; the limit only has to stop a runaway, so it leaves a quarter of room.
GC_LIMIT_HEADROOM = 1.25


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
    bootstrap's terms out, and says so)."""
    from planner.cost.tables import COST_TABLES

    name = f"{params.name}-lattigo"
    if params.boot is None or name not in COST_TABLES:
        return None
    table = COST_TABLES.create(name)
    if table.params is None or Params.from_json(dict(table.params)) != params:
        return None
    b = (table.measurements or {}).get("bootstrap")
    if not isinstance(b, Mapping):
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


def executor_memory(plan: Mapping[str, Any], workers: int | None = None) -> dict[str, Any]:
    """Go's ``ExecutorMemory`` for a plan: sizes of the executor's buffers and fused blocks."""
    from backends.lattigo_backend import _call, _ext, go_plan_json

    mod, _ = _ext()
    opts = {"workers": int(workers)} if workers else {}
    return dict(json.loads(_call(mod.ExecutorMemory, go_plan_json(plan), json.dumps(opts))))


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
    workers = int(mem["workers"]) if mem.get("fused") else 1
    slots = int(params.slots)
    # (a complex plaintext's values are 2 * slots numbers: complex packing)
    n_pt = sum(2 if "imag_table" in p else 1 for p in (plan.get("plaintexts") or {}).values())
    constant = {
        "evaluator": workers * int(mem["evaluator_bytes"]),
        "relin_key": int(mem["relin_key_bytes"]) if mem.get("relin_resident") else 0,
        "client": int(mem.get("client_bytes", 0)),
        "plaintext_values": 8 * slots * (n_pt if inline_plaintexts else 1),
        "plaintext_cache": plaintext_cache_bytes(program, params, mem) if cached_plaintexts else 0,
    }
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
