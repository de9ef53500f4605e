"""Key residency: when each rotation key is loaded and dropped under a memory cap.  The
strategies (keep-all, KeyMemRT's merge window, Belady, the exact CP-SAT/z3 model, and the
joint strategy's slot in the registry) and the emission of load_key/drop_key with the
verification of the modelled peak."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.registry import Registry
from planner import ir
from planner.frontend.params import Params
from planner.ir import boot_block
from planner.keys.profile import KeyScheduleError, key_memory_profile
from solver.keys_model import KeyLivenessProblem, solve_cpsat, solve_z3

# KeyMemRT's Merge Rotation Keys pass: merge when the next use is within 10 operations
# (shared/notes/peers.md, KeyMemRT section; paper section 4.2.4).
MERGE_WINDOW = 10
# The z3 cross-check of the exact model runs on problems with at most this many decisions.
Z3_CROSS_CHECK_MAX_GAPS = 400


# --------------------------------------------------------------------------------------
# Residency strategies: intervals (key, first point, last point) over program points
# --------------------------------------------------------------------------------------

Interval = tuple[int, int, int]


@dataclass
class _Ctx:
    n: int
    uses: dict[int, list[int]]  # key -> sorted points that need it
    need: list[list[int]]  # point -> keys needed there
    size: dict[int, int]
    base: list[int]
    cap: int | None

    def avail(self, i: int) -> float:
        return float("inf") if self.cap is None else self.cap - self.base[i]


def keep_giant_keys(
    program: Sequence[Mapping[str, Any]], intervals: Iterable[Interval], size: Mapping[int, int], base: Sequence[int],
    cap: int | None, slots: int,
) -> tuple[list[Interval], int, int]:
    """Keep each fused block's giant keys resident up to the block's root where the cap
    allows, so that the executor runs the block whole.

    The Lattigo executor fuses a baby-step giant-step block only when every giant rotation's
    key stays resident from the rotation to the block's root, where it rotates lazily
    (planner.ir.fusion, giant_spans); otherwise the block runs giant step by giant step, each
    with its own ModDowns, and the giant rotations and additions as written. The residency
    strategies schedule a key around its rotations only: LeNet-5 at n14boot under half its
    keep-all peak had its 9 keep-all blocks cut into 78 (1.45x keep-all measured). Keeping
    a giant key to its root adds memory only, no load. A block is kept whole or not at all
    (one giant key dropped early splits it), the shortest blocks first. ``base``: the bytes
    at each point besides the rotation keys (ciphertexts, plaintexts, a resident boot
    block). Returns the intervals, the blocks with giant steps kept whole and those the cap
    still splits."""
    from planner.ir.fusion import giant_spans

    ivl = list(intervals)
    spans = giant_spans(program, slots)
    if not spans:
        return ivl, 0, 0
    load = np.asarray(base, dtype=np.int64).copy()
    by_key: dict[int, list[list[int]]] = {}
    for k, a, b in ivl:
        load[a : b + 1] += size[k]
        by_key.setdefault(k, []).append([a, b])
    for ivs in by_key.values():
        ivs.sort()
    blocks: dict[int, list[tuple[int, int]]] = {}
    for i, root, k in spans:
        blocks.setdefault(root, []).append((i, k))
    kept = split = 0
    for root, giants in sorted(blocks.items(), key=lambda b: (b[0] - min(i for i, _ in b[1]), b[0])):
        undo: list[tuple[int, list[list[int]], np.ndarray]] = []
        fits = True
        for i, k in giants:
            ivs = by_key.get(k, [])
            own = next((iv for iv in ivs if iv[0] <= i <= iv[1]), None)
            if own is None:
                fits = False
                break
            if own[1] >= root:
                continue
            later = [iv for iv in ivs if own[1] < iv[0] <= root]
            gaps = np.ones(root - own[1], dtype=bool)  # points own[1]+1 .. root without k
            for iv in later:
                gaps[iv[0] - own[1] - 1 : min(iv[1], root) - own[1]] = False
            pts = own[1] + 1 + np.flatnonzero(gaps)
            if cap is not None and len(pts) and int((load[pts] + size[k]).max()) > cap:
                fits = False
                break
            undo.append((k, [list(iv) for iv in ivs], pts))
            load[pts] += size[k]
            own[1] = max([root] + [iv[1] for iv in later])
            by_key[k] = [iv for iv in ivs if not any(iv is x for x in later)]
        if fits:
            kept += 1
            continue
        split += 1
        for k, old, pts in reversed(undo):
            load[pts] -= size[k]
            by_key[k] = old
    out = [(k, a, b) for k, ivs in by_key.items() for a, b in ivs]
    return sorted(out, key=lambda t: (t[1], t[0], t[2])), kept, split


def _intervals_from_merges(ctx: _Ctx, merged: Mapping[int, Sequence[bool]]) -> list[Interval]:
    out: list[Interval] = []
    for k, us in ctx.uses.items():
        start = us[0]
        for j in range(len(us) - 1):
            if not merged[k][j]:
                out.append((k, start, us[j]))
                start = us[j + 1]
        out.append((k, start, us[-1]))
    return out


def _merges_from_intervals(ctx: _Ctx, intervals: Iterable[Interval]) -> dict[int, list[bool]]:
    merged = {k: [False] * (len(us) - 1) for k, us in ctx.uses.items()}
    for k, a, b in intervals:
        us = ctx.uses[k]
        lo = bisect.bisect_left(us, a)
        hi = bisect.bisect_right(us, b) - 1
        for j in range(lo, hi):
            merged[k][j] = True
    return merged


def _keymemrt(ctx: _Ctx, window: int, prefetch: int) -> list[Interval]:
    # every rotation its own live range, merged when the next use is within the window
    merged = {k: [us[j + 1] - us[j] <= window for j in range(len(us) - 1)] for k, us in ctx.uses.items()}
    load = np.asarray(ctx.base, dtype=np.int64).copy()
    for i, ks in enumerate(ctx.need):
        for k in ks:
            load[i] += ctx.size[k]
    for k, us in ctx.uses.items():
        for j, m in enumerate(merged[k]):
            if m:
                load[us[j] + 1 : us[j + 1]] += ctx.size[k]
    if ctx.cap is not None:
        # undo merges (largest keys first) wherever the merged ranges exceed the cap
        for i in np.nonzero(load > ctx.cap)[0].tolist():
            if load[i] <= ctx.cap:
                continue
            covering: list[tuple[int, int, int]] = []
            for k, us in ctx.uses.items():
                j = bisect.bisect_left(us, i) - 1
                if 0 <= j < len(us) - 1 and us[j] < i < us[j + 1] and merged[k][j]:
                    covering.append((-ctx.size[k], k, j))
            for negsize, k, j in sorted(covering):
                if load[i] <= ctx.cap:
                    break
                merged[k][j] = False
                us = ctx.uses[k]
                load[us[j] + 1 : us[j + 1]] += negsize
    intervals = _intervals_from_merges(ctx, merged)
    if prefetch <= 0:
        return intervals
    # Balanced mode: issue each load up to `prefetch` points early where the cap allows
    by_key: dict[int, list[Interval]] = {}
    for iv in intervals:
        by_key.setdefault(iv[0], []).append(iv)
    out: list[Interval] = []
    for k in sorted(by_key):
        prev_end = -1
        for _, a, b in sorted(by_key[k], key=lambda t: t[1]):
            start = a
            while start > max(prev_end + 2, a - prefetch):
                t = start - 1
                if ctx.cap is not None and load[t] + ctx.size[k] > ctx.cap:
                    break
                load[t] += ctx.size[k]
                start = t
            out.append((k, start, b))
            prev_end = b
    return out


def _belady(ctx: _Ctx) -> list[Interval]:
    resident: dict[int, int] = {}  # key -> start point
    nxt = dict.fromkeys(ctx.uses, 0)  # index into uses[k] of the next use
    held = 0
    out: list[Interval] = []
    last_use = {k: us[-1] for k, us in ctx.uses.items()}

    def next_use(k: int) -> int:
        us = ctx.uses[k]
        j = nxt[k]
        return us[j] if j < len(us) else ctx.n

    for i in range(ctx.n):
        needed = ctx.need[i]
        for k in needed:
            if k not in resident:
                resident[k] = i
                held += ctx.size[k]
        avail = ctx.avail(i)
        if held > avail:
            victims = sorted(
                (k for k in resident if k not in needed),
                key=lambda k: (-next_use(k), -ctx.size[k], k),
            )
            for k in victims:
                if held <= avail:
                    break
                start = resident.pop(k)
                j = nxt[k]
                out.append((k, start, ctx.uses[k][j - 1]))  # shrink to its last use
                held -= ctx.size[k]
        for k in needed:
            nxt[k] += 1
            if last_use[k] == i:  # dead key: drop right after its last use
                out.append((k, resident.pop(k), i))
                held -= ctx.size[k]
    return out


def _problem(ctx: _Ctx) -> KeyLivenessProblem:
    keys = sorted(ctx.uses)
    fixed = list(ctx.base)
    for i, ks in enumerate(ctx.need):
        fixed[i] += sum(ctx.size[k] for k in ks)
    total = max(fixed, default=0) + sum(ctx.size.values())
    return KeyLivenessProblem(
        sizes=tuple(ctx.size[k] for k in keys),
        uses=tuple(tuple(ctx.uses[k]) for k in keys),
        fixed=tuple(fixed),
        # a cap above everything the program can hold at once is no constraint; clamping
        # keeps the solver's int64 arithmetic safe for caps like 2**63
        capacity=min(ctx.cap, total) if ctx.cap is not None else total,
    )


def _exact(ctx: _Ctx, time_limit_s: float, cross_check: bool) -> tuple[list[Interval], dict[str, Any]]:
    keys = sorted(ctx.uses)
    prob = _problem(ctx)
    hint_m = _merges_from_intervals(ctx, _belady(ctx))
    hint = [hint_m[k] for k in keys]
    sol = solve_cpsat(prob, time_limit_s, hint=hint)
    if sol.status == "infeasible":
        raise KeyScheduleError("internal: the exact key model is infeasible although the cap passed the check")
    if sol.status != "optimal" and sol.status != "feasible":
        # no solution within the time limit: Belady's schedule is always feasible
        info0: dict[str, Any] = {"name": "cpsat", "status": "feasible", "fallback": "belady",
                                 "seconds": round(sol.seconds, 3), **sol.stats}
        return _intervals_from_merges(ctx, hint_m), info0
    info: dict[str, Any] = {
        "name": "cpsat",
        "status": sol.status,
        "objective": sol.loads,
        "bound": sol.bound,
        "seconds": round(sol.seconds, 3),
        **sol.stats,
    }
    if cross_check and sol.stats.get("gaps", 0) <= Z3_CROSS_CHECK_MAX_GAPS:
        zs = solve_z3(prob, time_limit_s)
        info["z3"] = {"status": zs.status, "loads": zs.loads if zs.status == "optimal" else None}
        if zs.status == "optimal" and sol.status == "optimal" and zs.loads != sol.loads:
            raise KeyScheduleError(f"internal: CP-SAT ({sol.loads} loads) and z3 ({zs.loads}) disagree")
    merged = {k: sol.merged[i] for i, k in enumerate(keys)}
    return _intervals_from_merges(ctx, merged), info


# --------------------------------------------------------------------------------------
# The strategies by name
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StrategyKnobs:
    """The options of one scheduling run a strategy may read (and records in the plan)."""

    merge_window: int
    prefetch: int
    time_limit_s: float
    cross_check: bool
    max_keys: int | None
    basis: str | None  # the basis the rotations were rewritten over (None: not rewritten)
    rewritten: bool  # a basis was chosen (max_keys given, or the strategy rewrites)


@dataclass(frozen=True)
class KeyStrategy:
    """A residency strategy: ``intervals`` (resident intervals, solver report) over the
    program points; ``options`` what it records in ``key_schedule.options`` (in order);
    ``keeps_all``: every key resident from the start to the end (its smallest cap is the
    peak with all keys); ``pow2_basis``: rotations are first rewritten over powers of two."""

    name: str
    intervals: Callable[[_Ctx, StrategyKnobs], tuple[list[Interval], dict[str, Any] | None]]
    options: Callable[[StrategyKnobs], dict[str, Any]]
    keeps_all: bool = False
    pow2_basis: bool = False
    plans_program: bool = False  # decides the program too (planner.keys.joint: splits, key set)
    # keeps the executor's fused blocks whole where the cap allows (keep_giant_keys): the
    # strategies of this planner, not the published ones it is compared with
    keeps_blocks: bool = False


def _basis_options(k: StrategyKnobs) -> dict[str, Any]:
    return {"max_keys": k.max_keys, "basis": k.basis} if k.rewritten else {}


def _all_resident(ctx: _Ctx, k: StrategyKnobs) -> tuple[list[Interval], dict[str, Any] | None]:
    return [(key, 0, ctx.n - 1) for key in sorted(ctx.uses)], None


# Key strategies by name (the order of `slotplan keybench`'s rows).
KEY_STRATEGIES: Registry[KeyStrategy] = Registry("key strategy", "known", KeyScheduleError)


def _strategy(strategy: KeyStrategy) -> None:
    KEY_STRATEGIES.register(strategy.name, lambda: strategy)


_strategy(KeyStrategy("keep-all", _all_resident, _basis_options, keeps_all=True))
_strategy(KeyStrategy(
    "keymemrt", lambda ctx, k: (_keymemrt(ctx, k.merge_window, k.prefetch), None),
    lambda k: {"merge_window": k.merge_window, "prefetch": k.prefetch, **_basis_options(k)},
))
_strategy(KeyStrategy("belady", lambda ctx, k: (_belady(ctx), None), _basis_options))
_strategy(KeyStrategy(
    "exact", lambda ctx, k: _exact(ctx, k.time_limit_s, k.cross_check),
    lambda k: {**_basis_options(k), "time_limit_s": k.time_limit_s},
    keeps_blocks=True,
))
_strategy(KeyStrategy("pow2", _all_resident, _basis_options, keeps_all=True, pow2_basis=True))


def _joint_only(ctx: _Ctx, k: StrategyKnobs) -> tuple[list[Interval], dict[str, Any] | None]:
    raise KeyScheduleError("internal: the joint strategy schedules through planner.keys.joint")


_strategy(KeyStrategy(
    "joint", _joint_only,
    lambda k: {**_basis_options(k), "prefetch": k.prefetch, "time_limit_s": k.time_limit_s},
    plans_program=True, keeps_blocks=True,
))
STRATEGIES = KEY_STRATEGIES.names()


# --------------------------------------------------------------------------------------
# The pass
# --------------------------------------------------------------------------------------


# A streamed block reads this many of its Galois keys ahead of the bootstrap's requests
# (load_key {"block": "boot", "stream": D}; D + 1 resident). One key read (39 MB at log N
# 14, ~15-25 ms from the page cache) is about one of the bootstrap's rotations, and a DFT
# stage rotates 6-10 times: two ahead keep the reader a step in front without holding
# a stage's keys.
BOOT_STREAM_DEPTH = 2


@dataclass(frozen=True)
class BlockSpan:
    """Where the key block ``boot`` is resident (first and last instruction) and whether
    its Galois keys are streamed (``stream``: keys read ahead) or all resident (None)."""

    first: int
    last: int
    stream: int | None = None

    def covers(self, i: int) -> bool:
        return self.first <= i <= self.last


def _boot_spans(
    prog: Sequence[Mapping[str, Any]], params: Params, keeps_all: bool
) -> list[BlockSpan | None]:
    """Where the key block ``boot`` may be resident, in order of preference: whole over the
    whole program, then from the first to the last bootstrap, then the same two streamed
    (not for a keep-all strategy); [None] when the program does not bootstrap."""
    if params.boot is None:
        return [None]
    at = [i for i, ins in enumerate(prog) if ir.is_bootstrap(ir.decode(ins))]
    if not at:
        return [None]
    spans = [(0, len(prog) - 1)] if keeps_all or (0, len(prog) - 1) == (at[0], at[-1]) else [
        (0, len(prog) - 1), (at[0], at[-1])]
    out: list[BlockSpan | None] = [BlockSpan(a, b) for a, b in spans]
    if not keeps_all:
        out += [BlockSpan(a, b, BOOT_STREAM_DEPTH) for a, b in spans]
    return out


def _emit(
    program: Sequence[Mapping[str, Any]], intervals: Iterable[Interval], drop_at_end: bool,
    block: BlockSpan | None = None,
) -> list[dict[str, Any]]:
    n = len(program)
    loads: dict[int, list[int]] = {}
    drops: dict[int, list[int]] = {}
    for k, a, b in intervals:
        loads.setdefault(a, []).append(k)
        if b < n - 1 or drop_at_end:
            drops.setdefault(b, []).append(k)
    out: list[dict[str, Any]] = []
    for i, ins in enumerate(program):
        out.extend(ir.DropKey(k).to_json() for k in sorted(drops.get(i - 1, [])))
        if block is not None and block.last == i - 1 and (block.last < n - 1 or drop_at_end):
            out.append(ir.DropKey(block="boot").to_json())
        if block is not None and block.first == i:
            out.append(ir.LoadKey(block="boot", stream=block.stream).to_json())
        out.extend(ir.LoadKey(k).to_json() for k in sorted(loads.get(i, [])))
        out.append(dict(ins))
    out.extend(ir.DropKey(k).to_json() for k in sorted(drops.get(n - 1, [])))
    if block is not None and block.last == n - 1 and drop_at_end:
        out.append(ir.DropKey(block="boot").to_json())
    return out


def _verify(program: Sequence[Mapping[str, Any]], params: Params, sizes: Mapping[int, int], cap: int | None) -> dict[str, int]:
    resident: set[int] = set()
    block = streamed = False
    offsets = boot_block.block_offsets(params, boot_block.variants_used(program, params))
    for i, raw in enumerate(program):
        ins = ir.decode(raw)
        if isinstance(ins, ir.LoadKey | ir.DropKey) and ins.k is None:
            block = isinstance(ins, ir.LoadKey)
            streamed = isinstance(ins, ir.LoadKey) and ins.stream is not None
        elif isinstance(ins, ir.LoadKey) and ins.k is not None:
            if ins.k in resident:
                raise KeyScheduleError(f"internal: key {ins.k} loaded twice (instruction {i})")
            resident.add(ins.k)
        elif isinstance(ins, ir.DropKey) and ins.k is not None:
            resident.discard(ins.k)
        else:
            if ir.is_bootstrap(ins) and not block:
                raise KeyScheduleError(f"internal: instruction {i} bootstraps with the key block 'boot' not resident")
            missing = [k for k in ins.rot_keys() if k not in resident and not (block and not streamed and k in offsets)]
            if missing:
                raise KeyScheduleError(f"internal: instruction {i} rotates by {missing} with no key resident")
    peak = key_memory_profile(program, params, sizes)
    if cap is not None and peak["total"] > cap:
        raise KeyScheduleError(f"internal: the schedule peaks at {peak['total']} bytes over the cap {cap}")
    return peak
