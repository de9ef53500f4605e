"""Plan summary computed from the program itself (one source of truth).

Counts follow shared/SPEC.md section 4: a ``rot_hoisted`` with ``len(ks)`` offsets counts
``len(ks)`` rotations; ``rotation_keys`` is the number of distinct offsets;
``key_loads`` the number of ``load_key``.  The memory model walks the program: live
ciphertexts (SSA liveness, each at its level), plaintexts (resident from first to last
use, encoded at the level of the ciphertext they meet) and rotation keys (resident
between load and drop; all resident for the whole program when the plan has no key
schedule, the keep-all model of ANT-ACE/Orion; the conjugation key of a plan that
conjugates is resident throughout in both cases).  A bootstrapping plan adds the block
``boot`` (bootstrapping keys and DFT matrices, ``params.boot``): resident throughout
without a schedule, else between its ``load_key``/``drop_key``; plan rotations whose
offset the block holds need no key of their own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner import ir
from planner.frontend.params import Params
from planner.ir import boot_block


def given_back_levels(program: Sequence[Any]) -> int:
    """The most SlotsToCoeffs levels a ``bootstrap_cins`` of the program gives back (its
    ``stoc_levels``; docs/cins.md): registers reach ``max_level`` plus that."""
    return max((int(i.stoc_levels or 0) for ins in program if isinstance(i := ir.decode(ins), ir.BootstrapCins)),
               default=0)


def default_key_level(program: Sequence[Any], params: Params) -> int:
    """The level a plan's rotation keys are generated at when the plan records none
    (``keys``): the top residual level, raised by the levels a ``bootstrap_cins`` gives
    back (a rotation above the top needs a key that high; the Lattigo client does the same,
    backends/lattigo/api.go)."""
    return params.max_level + given_back_levels(program)


def plan_key_bytes(plan: Mapping[str, Any]) -> dict[int, int] | None:
    """Per-key sizes recorded by a key schedule (``plan["keys"]``), or None."""
    keys = plan.get("keys")
    return {int(k): int(v["bytes"]) for k, v in keys.items()} if keys else None


Instruction = Mapping[str, Any] | ir.Instr
Program = Sequence[Instruction]


def reg_reads(ins: Instruction) -> list[str]:
    return list(ir.decode(ins).reads())


def reg_writes(ins: Instruction) -> list[str]:
    return list(ir.decode(ins).writes())


def register_depths(program: Program, drops: Mapping[int, int] | None = None, max_level: int = 0) -> dict[str, int]:
    """Multiplicative depth of every register (each instruction's depth rule, planner.ir);
    with ``drops`` (:func:`level_drops`) the depths the registers run at, a dropped
    register at ``max_level`` minus its drop level."""
    d: dict[str, int] = {}
    for i, raw in enumerate(program):
        ins = ir.decode(raw)
        regs = ins.writes()
        if regs:
            dd = ins.depth(d)
            if drops and i in drops:
                dd = max(dd, max_level - drops[i])
            for r in regs:
                d[r] = dd
    return d


def level_drops(program: Program, max_level: int) -> dict[int, int]:
    """Levels a bootstrapping plan's fresh values keep but never use: for each ``input`` and
    full-slot ``bootstrap`` (index: the level its register is dropped to) whose register
    holds more levels than its consumers until the next bootstrap need, the level they
    need. Lattigo's DropLevel is free and every operation downstream then runs on fewer
    primes (backends/lattigo/executor.go applies them). A value that reaches an ``output`` keeps its levels (a
    plan's output levels stay as written: a plan without bootstrapping drops nothing), and
    so do CinS plans (their ``to_cins`` levels are the plan's). The need of a register is the largest,
    over its readers, of what their result needs plus the levels between the two depths
    (each instruction's depth rule, :func:`register_depths`)."""
    prog = [ir.decode(raw) for raw in program]
    if any(isinstance(ins, ir.ToCins | ir.BootstrapCins) for ins in prog):
        return {}
    depth = register_depths(program)
    need: dict[str, int] = {}
    for ins in reversed(prog):
        writes = list(ins.writes())
        for r in ins.reads():
            if isinstance(ins, ir.Bootstrap | ir.Bootstrap2):
                # a halves bootstrap masks its source with one product first (docs/formats.md),
                # unless the source carries the packing already (premasked)
                n = 1 if isinstance(ins, ir.Bootstrap) and ins.halves and not ins.premasked else 0
            elif isinstance(ins, ir.Output):
                n = max_level - depth.get(r, 0)
            else:
                n = max((need.get(w, 0) + depth[w] - depth.get(r, 0) for w in writes), default=0)
            need[r] = max(need.get(r, 0), n)
    drops: dict[int, int] = {}
    for i, ins in enumerate(prog):
        full = isinstance(ins, ir.Input) and ins.l is None
        # (a bootstrap at depth 0: full-slot, or a sparse one left with its replicas)
        full = full or (isinstance(ins, ir.Bootstrap) and (ins.log_slots is None or bool(ins.replicas)))
        if full:
            (w,) = ins.writes()
            if w in need and need[w] < max_level - depth[w]:
                drops[i] = need[w]
    return drops


def rotation_key_levels(program: Program, max_level: int) -> list[int | None]:
    """The level each instruction's rotation keys must reach (None: it rotates nothing):
    its source's level (``max_level - depth``), one higher for a rotation of a rescaled
    register. A giant step of a baby-step giant-step block (products summed, rescaled,
    rotated) runs fused on Lattigo before the rescale, at the products' base level
    (backends/lattigo/fused.go), so its key is made for that level."""
    depth = register_depths(program)
    top = max_level + given_back_levels(program)  # (a register may lie above max_level)
    rescaled: set[str] = set()
    out: list[int | None] = []
    for raw in program:
        ins = ir.decode(raw)
        if isinstance(ins, ir.Rescale):
            rescaled.add(ins.dst)
        if not ins.rot_keys():
            out.append(None)
            continue
        src = ins.reads()[0]
        lv = max(0, max_level - depth[src])
        # a fused bootstrap_cins rotates its convolution's operands, a level above its source
        up = src in rescaled or (isinstance(ins, ir.BootstrapCins) and bool(ins.fused))
        out.append(min(top, lv + 1) if up else lv)
    return out


# The counts every node entry of a plan carries for its program span; summed over the
# nodes they equal the summary's fields of the same names (instructions outside every
# span -- input, output -- count towards none of them).
NODE_COUNT_FIELDS = ("rotations", "pmul", "cmul", "add", "rescale", "poly", "key_loads")


def span_counts(program: Program, slots: int | None = None) -> dict[str, int]:
    """The summary's counters over a slice of a program (one node's span; ``slots`` given,
    rotations as the executor makes them: ``planner.ir.executed_rotations``)."""
    counts: dict[str, int] = dict.fromkeys(NODE_COUNT_FIELDS, 0)
    prog = ir.decode_program(program)
    for ins in prog:
        if ins.counter in counts:
            counts[ins.counter] += ins.count()
    if slots:
        counts["rotations"] = ir.executed_rotations(prog, slots)
    return counts


def remap_spans(
    old: Program, spans: Sequence[Sequence[int]], new: Program
) -> list[list[int]]:
    """Node spans of ``new``, a rewrite of ``old`` (key schedule: load/drop inserted,
    rotations re-expressed as chains) that keeps the names of the registers ``old``
    writes.  An instruction belongs to the node that wrote one of its destinations in
    ``old``; one that writes only fresh registers (a chain's middle) or nothing (a key
    load) belongs to the node of the next instruction that has one.  Spans stay
    contiguous and in node order."""
    owner_of_reg: dict[str, int] = {}
    for n, (a, z) in enumerate(spans):
        for ins in old[a:z]:
            for r in reg_writes(ins):
                owner_of_reg[r] = n
    owner: list[int | None] = [None] * len(new)
    pending: list[int] = []
    for i, raw in enumerate(new):
        ins = ir.decode(raw)
        if isinstance(ins, ir.Input):
            continue  # inputs belong to no node; keep what waits for the next owner
        hit = next((owner_of_reg[r] for r in ins.writes() if r in owner_of_reg), None)
        if hit is None and not isinstance(ins, ir.Output):
            pending.append(i)
            continue
        for j in pending:
            owner[j] = hit
        pending = []
        owner[i] = hit
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, o in enumerate(owner):
        if o is not None:
            first.setdefault(o, i)
            last[o] = i
    out: list[list[int]] = []
    pos = 0
    for n in range(len(spans)):
        if n not in first:
            out.append([pos, pos])
            continue
        a, z = first[n], last[n] + 1
        if a < pos or any(o != n for o in owner[a:z] if o is not None):
            raise ValueError(f"node {n}: its instructions are not contiguous after the rewrite")
        out.append([a, z])
        pos = z
    return out


def summarize(
    program: Program,
    params: Params,
    n_plaintexts: int,
    key_bytes: Mapping[int, int] | None = None,
) -> dict[str, Any]:
    prog = ir.decode_program(program)
    counts: dict[str, int] = {}
    for ins in prog:
        if ins.counter is not None:
            counts[ins.counter] = counts.get(ins.counter, 0) + ins.count()
    depth = register_depths(prog)
    out_depth = max((depth[ins.src] for ins in prog if isinstance(ins, ir.Output)), default=0)
    mem = memory_profile(prog, params, depth, key_bytes)
    return {
        "rotations": ir.executed_rotations(prog, params.slots),
        "rotation_keys": ir.galois_key_count(prog),
        "pmul": counts.get("pmul", 0),
        "cmul": counts.get("cmul", 0),
        "add": counts.get("add", 0),
        "rescale": counts.get("rescale", 0),
        "poly": counts.get("poly", 0),
        "depth": out_depth,
        "key_loads": counts.get("key_loads", 0),
        "plaintexts": n_plaintexts,
        "instructions": len(program),
        "peak_bytes": mem,
        # bootstrapping presets only (plans of the other presets keep their bytes)
        **({"bootstraps": counts.get("bootstraps", 0)} if params.boot is not None else {}),
    }


@dataclass(frozen=True)
class Lifetimes:
    """When values live in a program: each register's last read, and each plaintext's first
    and last use and the level it is encoded at (that of the first ciphertext it meets)."""

    last_use: dict[str, int]
    pt_first: dict[str, int]
    pt_last: dict[str, int]
    pt_level: dict[str, int]


def lifetimes(program: Sequence[Any], depth: Mapping[str, int], max_level: int) -> Lifetimes:
    """The lifetimes of a decoded program's registers and plaintexts (the memory model's
    liveness; ``slotplan show`` reads the same to explain the peak)."""
    life = Lifetimes({}, {}, {}, {})
    for i, ins in enumerate(program):
        for r in ins.reads():
            life.last_use[r] = i
        for pt in ins.plaintexts():
            life.pt_first.setdefault(pt, i)
            life.pt_last[pt] = i
            life.pt_level.setdefault(pt, max(0, max_level - depth[ins.reads()[0]]))
    return life


def memory_series(
    program: Program,
    params: Params,
    depth: Mapping[str, int] | None = None,
    key_bytes: Mapping[int, int] | None = None,
) -> dict[str, np.ndarray]:
    """Modelled resident bytes at every program step (after the step's allocations, before
    its frees): ``keys``, ``plaintexts``, ``ciphertexts``.  ``key_bytes`` gives each key's
    size (a plan's ``keys[k].bytes``, for keys generated below the top level); default:
    every key at the top level.  Without a key schedule every key is resident throughout."""
    program = ir.decode_program(program)
    depth = depth if depth is not None else register_depths(program)
    L = params.max_level

    def level(reg: str) -> int:
        return max(0, L - depth[reg])

    life = lifetimes(program, depth, L)
    last_use, pt_first, pt_last, pt_level = life.last_use, life.pt_first, life.pt_last, life.pt_level
    has_schedule = ir.has_key_schedule(program)
    top_key = params.rotation_key_bytes(default_key_level(program, params))

    def kb(k: int) -> int:
        return key_bytes.get(k, top_key) if key_bytes is not None else top_key

    all_keys = ir.rot_keys_of(program)
    # bootstrapping: the block "boot" (bootstrapping keys + DFT matrices); its Galois keys
    # serve plan rotations of the same offsets, so keep-all holds the block and only the
    # other offsets' keys
    # (with the keys and matrices of the sparse bootstrap variants it uses, issue 36)
    boot = params.boot
    used = boot_block.variants_used(program, params)
    block = boot_block.block_bytes(params, used)
    boots = boot is not None and any(ir.is_bootstrap(ins) for ins in program)
    if boots and boot is not None:
        offsets = boot_block.block_offsets(params, used)
        all_keys = {k for k in all_keys if k not in offsets}
    block_resident = False
    pt_start: dict[int, list[str]] = {}
    pt_end: dict[int, list[str]] = {}
    for p, i in pt_first.items():
        pt_start.setdefault(i, []).append(p)
    for p, i in pt_last.items():
        pt_end.setdefault(i, []).append(p)

    n = len(program)
    out = {name: np.zeros(n, dtype=np.int64) for name in ("keys", "plaintexts", "ciphertexts")}
    live_ct = 0
    live_pt = 0
    # the conjugation key (complex packing) is resident throughout, with or without a
    # schedule (docs/formats.md)
    # (at a rotation key's size: the largest given, as generated at the top level)
    conj = 0
    if ir.uses_conjugation(program):
        conj = max(key_bytes.values(), default=top_key) if key_bytes else top_key
    keys = conj + (0 if has_schedule else sum(kb(k) for k in all_keys) + (block if boots else 0))
    resident: set[int] = set()
    live: set[str] = set()
    # A streamed block (backends/lattigo/bootstream.go) holds no Galois key until its first
    # bootstrap; from then on D + 1: the key handed out last and D read ahead along the
    # bootstrap's key order (predicted from its evaluator, bootorder.go; a kind the executor
    # cannot predict learns its order in its first bootstrap, holding fewer: 1 key during
    # it, D after). A block loaded again reads D ahead at once (order known).
    stream: int | None = None
    learned = False
    held = 0
    for i, ins in enumerate(program):
        if isinstance(ins, ir.LoadKey):
            if ins.k is not None:
                resident.add(int(ins.k))
            else:
                block_resident = True
                stream = ins.stream
                held = ins.stream if ins.stream is not None and learned else 0
                block = boot_block.block_bytes(params, used) if stream is None else boot_block.stream_bytes(
                    params, used, held)
            keys = conj + sum(kb(k) for k in resident) + (block if block_resident else 0)
        if block_resident and stream is not None and ir.is_bootstrap(ins):
            block = boot_block.stream_bytes(params, used, stream + 1)
            keys = conj + sum(kb(k) for k in resident) + block
        for p in pt_start.get(i, []):
            live_pt += params.plaintext_bytes(pt_level[p])
        for r in ins.writes():
            live.add(r)
            live_ct += params.ciphertext_bytes(level(r))
        out["keys"][i], out["plaintexts"][i], out["ciphertexts"][i] = keys, live_pt, live_ct
        # frees after the instruction: registers with no later read
        for r in set(ins.reads()) | set(ins.writes()):
            if last_use.get(r, -1) <= i and r in live:
                live.discard(r)
                live_ct -= params.ciphertext_bytes(level(r))
        for p in pt_end.get(i, []):
            live_pt -= params.plaintext_bytes(pt_level[p])
        if block_resident and stream is not None and ir.is_bootstrap(ins):
            held = stream + 1
            learned = True
            block = boot_block.stream_bytes(params, used, held)
            keys = conj + sum(kb(k) for k in resident) + block
        if isinstance(ins, ir.DropKey):
            if ins.k is not None:
                resident.discard(int(ins.k))
            else:
                block_resident = False
            keys = conj + sum(kb(k) for k in resident) + (block if block_resident else 0)
    return out


def memory_profile(
    program: Program,
    params: Params,
    depth: Mapping[str, int] | None = None,
    key_bytes: Mapping[int, int] | None = None,
) -> dict[str, int]:
    """Peak modelled bytes of keys, plaintexts and ciphertexts, and of their sum, over
    program points (the maxima of :func:`memory_series`)."""
    ser = memory_series(program, params, depth, key_bytes)
    if not program:
        return {"keys": 0, "plaintexts": 0, "ciphertexts": 0, "total": 0}
    total = ser["keys"] + ser["plaintexts"] + ser["ciphertexts"]
    return {
        "keys": int(ser["keys"].max()),
        "plaintexts": int(ser["plaintexts"].max()),
        "ciphertexts": int(ser["ciphertexts"].max()),
        "total": int(total.max()),
    }
