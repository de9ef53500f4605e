"""Rotation-key memory management: a post-pass that inserts ``load_key``/``drop_key``.

Input: a planned straight-line program (shared/SPEC.md section 4).  Output: the same
program (same SSA registers; a rotation rewrite adds registers) with a key schedule, so
that every ``rot`` (and every offset of a ``rot_hoisted``, all at once) runs while its key
is resident and the modelled memory (resident keys + live ciphertexts + resident
plaintexts, the :func:`planner.summary.memory_profile` model with each key at its own
size) never exceeds the cap.

Residency strategies:

* ``keep-all`` - ANT-ACE / Orion: every key loaded up front and kept.
* ``keymemrt`` - KeyMemRT (Unay et al.): a key per rotation (load before, drop after), then
  live ranges of one key are merged when the next use is within ``merge_window`` (10)
  operations (its "Merge Rotation Keys" pass); optional prefetch moves loads earlier
  (its Balanced mode).  Under a cap, merges that would exceed it are undone.
* ``belady`` - furthest-next-use eviction under the cap (lazy loads, dead keys dropped
  at their last use).  Optimal in loads when all keys have one size.
* ``exact`` - CP-SAT over key-liveness intervals with a cumulative capacity constraint
  (:mod:`solver.keys_model`): minimum loads, then minimum peak; z3 cross-checks small cases.
* ``pow2`` - Fhelipe: every offset decomposed into power-of-two rotations (at most
  log2(slots) keys), all keys kept.  Changes the rotation count.

``max_keys`` rewrites offsets as chains over a basis of at most N keys (power-of-two,
NAF or a BSGS-style baby/giant basis, completed with the most used direct offsets) and
works with every residency strategy.

Keys by level: a key only ever used on ciphertexts at level <= l is generated at level
l (``Params.rotation_key_bytes(l)``), l = the highest level it rotates
(level = max_level - depth, :func:`planner.summary.register_depths`).
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner import ir
from planner.errors import SlotplanError
from planner.params import Params
from planner.summary import (
    default_key_level,
    memory_series,
    reg_writes,
    register_depths,
    remap_spans,
    rotation_key_levels,
    span_counts,
    summarize,
)
from solver import progress
from solver.keys_model import KeyLivenessProblem, solve_cpsat, solve_z3
from solver.registry import Registry

__all__ = [
    "BASES",
    "MERGE_WINDOW",
    "KEY_STRATEGIES",
    "STRATEGIES",
    "KeyCapError",
    "KeyInfo",
    "KeySchedule",
    "KeyScheduleError",
    "base_profile",
    "choose_basis",
    "key_memory_profile",
    "rewrite_rotations",
    "schedule_keys",
    "schedule_plan",
]

BASES = ("auto", "pow2", "naf", "bsgs")
# KeyMemRT's Merge Rotation Keys pass: merge when the next use is within 10 operations
# (shared/notes/peers.md, KeyMemRT section; paper section 4.2.4).
MERGE_WINDOW = 10
# A chain longer than this is not a sensible rewrite (pow2 needs at most log2(slots) = 15
# steps at LogN 16); bases that need longer chains are rejected.
MAX_CHAIN = 64
# Candidates tried per step when shrinking a basis to --max-keys (least used keys first).
SHRINK_TRIALS = 8
# The z3 cross-check of the exact model runs on problems with at most this many decisions.
Z3_CROSS_CHECK_MAX_GAPS = 400



class KeyScheduleError(SlotplanError):
    """A key schedule cannot be built (bad option, unusable basis, solver failure)."""


class KeyCapError(KeyScheduleError):
    """The memory cap is below what one step of the program needs under this strategy."""

    def __init__(self, cap: int, min_cap: int, strategy: str, where: str):
        self.cap = cap
        self.min_cap = min_cap
        self.strategy = strategy
        self.where = where
        super().__init__(
            f"modelled peak of at least {min_cap} bytes exceeds memory_cap_bytes {cap} ({_mib(cap)}) "
            f"under key strategy {strategy!r}: {where}; the smallest feasible cap is {min_cap} bytes "
            f"({_mib(min_cap)})"
        )

    def __reduce__(self) -> tuple[type[KeyCapError], tuple[int, int, str, str]]:
        return (type(self), (self.cap, self.min_cap, self.strategy, self.where))


def _mib(b: int) -> str:
    return f"{b / 2**20:.2f} MiB"


@dataclass(frozen=True)
class KeyInfo:
    k: int
    level: int
    bytes: int
    uses: int  # instructions that need the key
    loads: int

    def to_json(self) -> dict[str, int]:
        return {"level": self.level, "bytes": self.bytes, "uses": self.uses, "loads": self.loads}


@dataclass
class KeySchedule:
    program: list[dict[str, Any]]
    strategy: str
    cap_bytes: int | None
    keys: dict[int, KeyInfo]
    loads: int
    rotations: int
    rotations_before: int
    rotation_keys_before: int
    peak_bytes: dict[str, int]
    min_cap_bytes: int  # smallest cap this strategy (with this rewrite) can meet
    basis: list[int] | None = None  # the key basis when offsets were rewritten
    chains: dict[int, list[int]] = field(default_factory=dict)  # offset -> steps (rewritten only)
    solver: dict[str, Any] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    # joint strategy: hoisted sub-groups split off, and the modelled time (planner.keyplan)
    splits: int | None = None
    time_ms: dict[str, float] | None = None

    @property
    def rotation_keys(self) -> int:
        return len(self.keys)

    def key_levels(self) -> dict[int, int]:
        return {k: i.level for k, i in self.keys.items()}

    def key_bytes(self) -> dict[int, int]:
        return {k: i.bytes for k, i in self.keys.items()}

    def keys_json(self) -> dict[str, dict[str, int]]:
        return {str(k): self.keys[k].to_json() for k in sorted(self.keys)}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "strategy": self.strategy,
            "memory_cap_bytes": self.cap_bytes,
            "min_feasible_cap_bytes": self.min_cap_bytes,
            "key_loads": self.loads,
            "rotations": self.rotations,
            "rotations_before": self.rotations_before,
            "rotation_keys": self.rotation_keys,
            "rotation_keys_before": self.rotation_keys_before,
            "key_bytes_total": sum(i.bytes for i in self.keys.values()),
            "options": self.options,
        }
        if self.basis is not None:
            out["basis"] = self.basis
            out["chains"] = {str(k): v for k, v in sorted(self.chains.items())}
        if self.solver is not None:
            out["solver"] = self.solver
        if self.splits is not None:
            out["hoisted_splits"] = self.splits
        if self.time_ms is not None:
            out["modelled_time_ms"] = self.time_ms
        return out


# --------------------------------------------------------------------------------------
# Memory model (planner.summary.memory_profile semantics, keys at their own sizes)
# --------------------------------------------------------------------------------------


def _rot_keys(ins: Mapping[str, Any]) -> list[int]:
    return list(ir.decode(ins).rot_keys())


def _is_key_op(ins: Mapping[str, Any]) -> bool:
    return isinstance(ir.decode(ins), ir.KeyOp)


def _walk(
    program: Sequence[Mapping[str, Any]],
    params: Params,
    key_bytes: Mapping[int, int] | None,
    depth: Mapping[str, int] | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """Per program point: (resident key bytes, live plaintext bytes, live ciphertext bytes),
    from :func:`planner.summary.memory_series` (the walk behind every reported peak)."""
    ser = memory_series(program, params, depth, key_bytes)
    return ser["keys"].tolist(), ser["plaintexts"].tolist(), ser["ciphertexts"].tolist()


def key_memory_profile(
    program: Sequence[Mapping[str, Any]],
    params: Params,
    key_bytes: Mapping[int, int] | None = None,
    depth: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Peak modelled bytes (keys, plaintexts, ciphertexts, total) like
    :func:`planner.summary.memory_profile`, with every key at its own size."""
    ks, ps, cs = _walk(program, params, key_bytes, depth)
    if not ks:
        return {"keys": 0, "plaintexts": 0, "ciphertexts": 0, "total": 0}
    return {
        "keys": max(ks),
        "plaintexts": max(ps),
        "ciphertexts": max(cs),
        "total": max(k + p + c for k, p, c in zip(ks, ps, cs, strict=True)),
    }


def base_profile(
    program: Sequence[Mapping[str, Any]], params: Params, depth: Mapping[str, int] | None = None
) -> list[int]:
    """Live ciphertext + plaintext bytes at every point of a program without key ops."""
    _, ps, cs = _walk([i for i in program if not _is_key_op(i)], params, {}, depth)
    return [p + c for p, c in zip(ps, cs, strict=True)]


# --------------------------------------------------------------------------------------
# Rotation rewriting over a key basis (pow2 / NAF / BSGS, max-keys)
# --------------------------------------------------------------------------------------


@dataclass
class _Paths:
    """Shortest chains over a basis: a BFS tree over Z_slots rooted at 0."""

    slots: int
    basis: tuple[int, ...]
    dist: np.ndarray  # -1: unreachable (within the explored part)
    step: np.ndarray  # last step of the chain reaching each residue

    def chain(self, k: int) -> list[int]:
        out: list[int] = []
        r = k % self.slots
        while r != 0:
            s = int(self.step[r])
            out.append(s)
            r = (r - s) % self.slots
        out.reverse()
        return out

    def nodes(self, k: int) -> list[int]:
        acc, out = 0, []
        for s in self.chain(k):
            acc = (acc + s) % self.slots
            out.append(acc)
        return out


def _bfs(slots: int, basis: Iterable[int], targets: Iterable[int], max_depth: int = MAX_CHAIN) -> _Paths:
    gens = np.array(sorted({int(b) % slots for b in basis} - {0}), dtype=np.int64)
    dist = np.full(slots, -1, dtype=np.int32)
    step = np.zeros(slots, dtype=np.int64)
    dist[0] = 0
    want = np.array(sorted({int(t) % slots for t in targets} - {0}), dtype=np.int64)
    frontier = np.array([0], dtype=np.int64)
    d = 0
    while frontier.size and gens.size and d < max_depth:
        if want.size and bool(np.all(dist[want] >= 0)):
            break
        d += 1
        reached: list[np.ndarray] = []
        for g in gens.tolist():  # ascending: the smallest step wins (deterministic tree)
            cand = (frontier + g) % slots
            cand = cand[dist[cand] < 0]
            if cand.size:
                dist[cand] = d
                step[cand] = g
                reached.append(cand)
        if not reached:
            break
        frontier = np.sort(np.concatenate(reached))
    return _Paths(slots, tuple(int(g) for g in gens), dist, step)


def _sites(program: Sequence[Mapping[str, Any]]) -> list[tuple[int, ...]]:
    decoded = (ir.decode(ins) for ins in program)
    return [ins.rot_keys() for ins in decoded if isinstance(ins, ir.Rot | ir.RotHoisted)]


def _site_cost(site: tuple[int, ...], paths: _Paths) -> int:
    """Rotations of one rewritten site: the edges of the union of its chains (a hoisted
    group shares chain prefixes)."""
    if len(site) == 1:
        return int(paths.dist[site[0] % paths.slots])
    nodes: set[int] = set()
    for k in site:
        nodes.update(paths.nodes(k))
    return len(nodes)


def _cost(sites: Mapping[tuple[int, ...], int], paths: _Paths) -> int | None:
    """Total rotations after rewriting (None when some offset is unreachable)."""
    offsets = {k for s in sites for k in s}
    if any(paths.dist[k % paths.slots] < 0 for k in offsets):
        return None
    return sum(n * _site_cost(s, paths) for s, n in sites.items())


def _naf(k: int) -> list[int]:
    """Non-adjacent form digits of k as signed powers of two."""
    out: list[int] = []
    bit = 1
    while k:
        if k & 1:
            d = 2 - (k & 3)  # +1 or -1
            out.append(d * bit)
            k -= d
        k >>= 1
        bit <<= 1
    return out


def _seed(name: str, offsets: Sequence[int], slots: int) -> set[int]:
    if name == "pow2":
        return {1 << j for j in range(slots.bit_length()) if (1 << j) < slots and any(k >> j & 1 for k in offsets)}
    if name == "naf":
        out: set[int] = set()
        for k in offsets:
            out.update(d % slots for d in _naf(k))
        return out - {0}
    if name == "bsgs":
        best: set[int] | None = None
        g = 2
        while g < slots:
            basis = {k % g for k in offsets} | {k - k % g for k in offsets}
            basis.discard(0)
            if best is None or len(basis) < len(best):
                best = basis
            g *= 2
        return best or set()
    raise KeyScheduleError(f"unknown key basis {name!r}; known: {', '.join(BASES)}")


@dataclass
class _Basis:
    name: str
    basis: set[int]
    paths: _Paths
    rotations: int


def _fit(
    name: str, seed: set[int], sites: Mapping[tuple[int, ...], int], slots: int, max_keys: int, augment: bool
) -> _Basis | None:
    """Shrink the seed to ``max_keys`` (drop the key whose loss costs fewest rotations),
    then (``augment``) add the most used direct offsets while keys remain."""
    offsets = sorted({k for s in sites for k in s})
    basis = set(seed)
    paths = _bfs(slots, basis, offsets)
    cost = _cost(sites, paths)
    if cost is None:
        return None
    while len(basis) > max_keys:
        best: tuple[int, int, _Paths] | None = None
        # try the least used keys first (weighted chain steps that use them)
        usage = dict.fromkeys(basis, 0)
        for s, n in sites.items():
            for k in s:
                for st in paths.chain(k):
                    usage[st] += n
        for b in sorted(basis, key=lambda b: (usage[b], b))[:SHRINK_TRIALS]:
            trial = _bfs(slots, basis - {b}, offsets)
            c = _cost(sites, trial)
            if c is not None and (best is None or c < best[0]):
                best = (c, b, trial)
        if best is None:
            return None
        cost, removed, paths = best
        basis.discard(removed)
    if augment:
        weight: dict[int, int] = {}
        for s, n in sites.items():
            for k in s:
                weight[k] = weight.get(k, 0) + n
        while len(basis) < max_keys:
            gains = sorted(
                ((weight[k] * (int(paths.dist[k]) - 1), -k) for k in offsets if k not in basis and paths.dist[k] > 1),
                reverse=True,
            )
            if not gains or gains[0][0] <= 0:
                break
            k = -gains[0][1]
            trial = _bfs(slots, basis | {k}, offsets)
            c = _cost(sites, trial)
            if c is None or c >= cost:
                break
            basis.add(k)
            cost, paths = c, trial
    return _Basis(name, basis, paths, cost)


def choose_basis(
    program: Sequence[Mapping[str, Any]], slots: int, max_keys: int | None, basis: str = "auto"
) -> tuple[set[int], _Paths, str]:
    """The key basis for a rewrite: at most ``max_keys`` keys (None: the seed itself),
    fewest rotations; ``basis`` picks the seed family (auto: best of pow2, naf, bsgs)."""
    if max_keys is not None and max_keys < 1:
        raise KeyScheduleError(f"--max-keys must be at least 1, got {max_keys}")
    sites: dict[tuple[int, ...], int] = {}
    for s in _sites(program):
        sites[s] = sites.get(s, 0) + 1
    offsets = sorted({k for s in sites for k in s})
    if not offsets:
        return set(), _bfs(slots, [], []), "none"
    names = ("pow2", "naf", "bsgs") if basis == "auto" else (basis,)
    if basis not in BASES:
        raise KeyScheduleError(f"unknown key basis {basis!r}; known: {', '.join(BASES)}")
    if max_keys is not None and len(offsets) <= max_keys and basis == "auto":
        paths = _bfs(slots, offsets, offsets)
        return set(offsets), paths, "direct"
    cands: list[_Basis] = []
    for name in names:
        seed = _seed(name, offsets, slots)
        fitted = _fit(name, seed, sites, slots, max_keys if max_keys is not None else len(seed), max_keys is not None)
        if fitted is not None:
            cands.append(fitted)
    if not cands:
        raise KeyScheduleError(
            f"no {basis} key basis of at most {max_keys} keys reaches every offset of the program "
            f"with chains of at most {MAX_CHAIN} rotations; allow more keys"
        )
    best = min(cands, key=lambda b: (b.rotations, len(b.basis), names.index(b.name)))
    return best.basis, best.paths, best.name


def rewrite_rotations(
    program: Sequence[Mapping[str, Any]], paths: _Paths
) -> tuple[list[dict[str, Any]], dict[int, list[int]]]:
    """Rewrite every rotation as a chain over ``paths.basis`` (a ``rot_hoisted`` becomes a
    tree of hoisted groups sharing chain prefixes).  Original ``dst`` registers keep their
    names; intermediate registers are fresh ``c<N>`` names."""
    basis = set(paths.basis)
    used = 0
    for ins in program:
        for r in reg_writes(ins):
            if r.startswith("c") and r[1:].isdigit():
                used = max(used, int(r[1:]) + 1)
    counter = [used]

    def fresh() -> str:
        name = f"c{counter[0]}"
        counter[0] += 1
        return name

    chains: dict[int, list[int]] = {}
    out: list[dict[str, Any]] = []
    for raw in program:
        rot = ir.decode(raw)
        if not isinstance(rot, ir.Rot | ir.RotHoisted):
            out.append(dict(raw))
            continue
        ks = list(rot.rot_keys())
        dsts = list(rot.writes())
        if all(k in basis for k in ks):
            out.append(dict(raw))
            continue
        for k in ks:
            if k not in basis:
                chains[k] = paths.chain(k)
        # tree of partial sums: node -> register; children grouped per parent
        reg: dict[int, str] = {0: rot.src}
        want = dict(zip(ks, dsts, strict=True))
        children: dict[int, list[tuple[int, int]]] = {}
        order: list[int] = [0]
        for k in ks:
            prev = 0
            for s in paths.chain(k):
                node = (prev + s) % paths.slots
                if node not in reg:
                    reg[node] = want.get(node) or fresh()
                    children.setdefault(prev, []).append((s, node))
                    order.append(node)
                prev = node
        for node in order:
            kids = sorted(children.get(node, []))
            if len(kids) == 1:
                s, child = kids[0]
                out.append(ir.Rot(reg[child], reg[node], s).to_json())
            elif kids:
                out.append(
                    ir.RotHoisted(tuple(reg[c] for _, c in kids), reg[node], tuple(s for s, _ in kids)).to_json()
                )
    return out, chains


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
    (planner.fusion, giant_spans); otherwise the block runs giant step by giant step, each
    with its own ModDowns, and the giant rotations and additions as written. The residency
    strategies schedule a key around its rotations only: LeNet-5 at n14boot under half its
    keep-all peak had its 9 keep-all blocks cut into 78 (1.45x keep-all measured). Keeping
    a giant key to its root adds memory only, no load. A block is kept whole or not at all
    (one giant key dropped early splits it), the shortest blocks first. ``base``: the bytes
    at each point besides the rotation keys (ciphertexts, plaintexts, a resident boot
    block). Returns the intervals, the blocks with giant steps kept whole and those the cap
    still splits."""
    from planner.fusion import giant_spans

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
    plans_program: bool = False  # decides the program too (planner.keyplan: splits, key set)
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
    raise KeyScheduleError("internal: the joint strategy schedules through planner.keyplan")


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
    offsets = frozenset(params.boot.key_offsets) if params.boot is not None else frozenset()
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


def schedule_keys(
    program: Sequence[Mapping[str, Any]],
    params: Params,
    cap_bytes: int | None,
    strategy: str,
    max_keys: int | None = None,
    *,
    basis: str = "auto",
    key_levels: bool = True,
    merge_window: int = MERGE_WINDOW,
    prefetch: int | None = None,
    time_limit_s: float = 10.0,
    cross_check: bool = False,
) -> KeySchedule:
    """Insert a key schedule into ``program`` (any existing ``load_key``/``drop_key`` are
    replaced).  Raises :class:`KeyCapError` (naming the smallest feasible cap) when
    ``cap_bytes`` is below what the strategy needs at some step."""
    strat = KEY_STRATEGIES.create(strategy)
    if ir.uses_conjugation(ir.decode_program(program)):
        raise KeyScheduleError("the program conjugates (complex packing): key schedules do not place the "
                               "conjugation key; run it keep-all (no memory cap)")
    if cap_bytes is not None and cap_bytes <= 0:
        raise KeyScheduleError(f"memory cap must be positive, got {cap_bytes}")
    if prefetch is None:  # the joint strategy prefetches by default (KeyMemRT's balanced mode)
        from planner.keyplan import MAX_PREFETCH

        prefetch = MAX_PREFETCH if strat.plans_program else 0
    if merge_window < 0 or prefetch < 0:
        raise KeyScheduleError("merge window and prefetch distance must be non-negative")
    prog = [dict(i) for i in program if not _is_key_op(i)]
    sites = _sites(prog)
    rotations_before = sum(len(s) for s in sites)
    keys_before = len({k for s in sites for k in s})
    chosen: list[int] | None = None
    chains: dict[int, list[int]] = {}
    basis_name = None
    if strat.pow2_basis or max_keys is not None:
        family = "pow2" if strat.pow2_basis and basis == "auto" else basis
        bset, paths, basis_name = choose_basis(prog, params.slots, max_keys, family)
        if basis_name != "direct":
            prog, chains = rewrite_rotations(prog, paths)
            chosen = sorted(bset)
    if strat.plans_program and _boot_spans(prog, params, False) != [None]:
        # a bootstrapping program: the joint model does not place the key block 'boot' yet;
        # its residency is scheduled exactly (hoisted groups stay whole)
        strat = KEY_STRATEGIES.create("exact")
    if strat.plans_program:
        knobs = StrategyKnobs(
            merge_window, prefetch, time_limit_s, cross_check, max_keys, basis_name, rewritten=max_keys is not None,
        )
        return _schedule_joint(prog, params, cap_bytes, strategy, knobs, key_levels, rotations_before, keys_before,
                               chosen, chains)
    depth = register_depths(prog)
    # a bootstrapping program: the block 'boot' resident for the whole program (its keys
    # then serve every rotation of their offsets) when the cap allows, else from the first
    # to the last bootstrap
    spans = _boot_spans(prog, params, strat.keeps_all)
    errors: list[KeyCapError] = []
    for block in spans:
        try:
            return _schedule_with_block(
                prog, params, cap_bytes, strategy, strat, depth, block, chosen, chains, basis_name,
                rotations_before, keys_before, max_keys, key_levels, merge_window, prefetch, time_limit_s,
                cross_check,
            )
        except KeyCapError as e:
            errors.append(e)
    raise min(errors, key=lambda e: e.min_cap)


def _schedule_with_block(
    prog: list[dict[str, Any]], params: Params, cap_bytes: int | None, strategy: str, strat: KeyStrategy,
    depth: Mapping[str, int], block: BlockSpan | None, chosen: list[int] | None,
    chains: dict[int, list[int]], basis_name: str | None, rotations_before: int, keys_before: int,
    max_keys: int | None, key_levels: bool, merge_window: int, prefetch: int, time_limit_s: float,
    cross_check: bool,
) -> KeySchedule:
    L = params.max_level
    uses: dict[int, list[int]] = {}
    need: list[list[int]] = []
    level: dict[int, int] = {}
    use_level = rotation_key_levels(prog, L)
    for i, ins in enumerate(prog):
        ks = sorted(set(_rot_keys(ins)))
        if block is not None and block.stream is None and block.covers(i) and params.boot is not None:
            # the block's own Galois keys serve these offsets while it is resident (a
            # streamed block's serve only its bootstraps)
            ks = [k for k in ks if k not in params.boot.key_offsets]
        need.append(ks)
        for k in ks:
            uses.setdefault(k, []).append(i)
            use = use_level[i]
            lv = use if key_levels and use is not None else default_key_level(prog, params)
            level[k] = max(level.get(k, 0), lv)
    size = {k: params.rotation_key_bytes(level[k]) for k in uses}
    base = base_profile(prog, params, depth)
    block_bytes = params.boot_block_bytes(block.stream) if block is not None else 0
    if block is not None:
        for i in range(block.first, block.last + 1):
            base[i] += block_bytes
    ctx = _Ctx(len(prog), uses, need, size, base, cap_bytes)
    # smallest cap each strategy can meet, and where it binds
    if strat.keeps_all:
        all_keys = sum(size.values())
        i_max = max(range(len(prog)), key=lambda i: base[i]) if prog else 0
        min_cap = (base[i_max] if prog else 0) + all_keys
        where = (
            f"keeping all {len(size)} keys ({all_keys} bytes) resident, instruction {i_max} "
            f"({ir.op_name(prog[i_max]) if prog else '-'}) peaks at {min_cap} bytes"
        )
        if block_bytes:
            where += f" (with the bootstrapping key block and DFT matrices, {block_bytes} bytes)"
    else:
        needs = [base[i] + sum(size[k] for k in need[i]) for i in range(len(prog))]
        i_max = max(range(len(prog)), key=lambda i: needs[i]) if prog else 0
        min_cap = needs[i_max] if prog else 0
        in_block = block is not None and block.covers(i_max)
        held = (base[i_max] if prog else 0) - (block_bytes if in_block else 0)
        where = (
            f"instruction {i_max} ({ir.op_name(prog[i_max]) if prog else '-'}) alone needs {min_cap} bytes "
            f"(ciphertexts and plaintexts {held}, "
            + (f"the bootstrapping key block and DFT matrices {block_bytes}"
               + (f" (its Galois keys streamed, {block.stream} read ahead)" if block is not None and block.stream is not None
                  else "") + ", " if in_block else "")
            + f"its keys {min_cap - (base[i_max] if prog else 0)})"
        )
    if cap_bytes is not None and cap_bytes < min_cap:
        raise KeyCapError(cap_bytes, min_cap, strategy, where)
    knobs = StrategyKnobs(
        merge_window, prefetch, time_limit_s, cross_check, max_keys, basis_name,
        rewritten=strat.pow2_basis or max_keys is not None,
    )
    intervals, solver_info = strat.intervals(ctx, knobs)
    if strat.keeps_blocks:
        intervals, kept, cut = keep_giant_keys(prog, intervals, size, base, cap_bytes, params.slots)
        solver_info = {**(solver_info or {}), "blocks_kept_whole": kept, "blocks_split": cut}
    new = _emit(prog, intervals, drop_at_end=not strat.keeps_all, block=block)
    peak = _verify(new, params, size, cap_bytes)
    loads_per: dict[int, int] = {}
    for k, _, _ in intervals:
        loads_per[k] = loads_per.get(k, 0) + 1
    keys = {k: KeyInfo(k, level[k], size[k], len(uses[k]), loads_per.get(k, 0)) for k in sorted(uses)}
    options: dict[str, Any] = {"key_levels": key_levels, **strat.options(knobs)}
    return KeySchedule(
        program=new,
        strategy=strategy,
        cap_bytes=cap_bytes,
        keys=keys,
        loads=sum(loads_per.values()),
        rotations=sum(len(s) for s in _sites(prog)),
        rotations_before=rotations_before,
        rotation_keys_before=keys_before,
        peak_bytes=peak,
        min_cap_bytes=min_cap,
        basis=chosen,
        chains=chains,
        solver=solver_info,
        options=options,
    )


def _schedule_joint(
    prog: list[dict[str, Any]], params: Params, cap_bytes: int | None, strategy: str, knobs: StrategyKnobs,
    key_levels: bool, rotations_before: int, keys_before: int, basis: list[int] | None, chains: dict[int, list[int]],
) -> KeySchedule:
    from planner.keyplan import JointChoice, plan_joint

    ch = plan_joint(prog, params, cap_bytes, key_levels=key_levels, time_limit_s=knobs.time_limit_s,
                    cross_check=knobs.cross_check, prefetch=knobs.prefetch)
    if not isinstance(ch, JointChoice):
        min_cap, where = ch
        raise KeyCapError(int(cap_bytes or 0), int(min_cap), strategy, str(where))
    new = _emit(ch.program, ch.intervals, drop_at_end=True)
    peak = _verify(new, params, ch.size, cap_bytes)
    loads_per: dict[int, int] = {}
    for k, _, _ in ch.intervals:
        loads_per[k] = loads_per.get(k, 0) + 1
    keys = {k: KeyInfo(k, ch.level[k], ch.size[k], len(ch.uses[k]), loads_per.get(k, 0)) for k in sorted(ch.uses)}
    return KeySchedule(
        program=new,
        strategy=strategy,
        cap_bytes=cap_bytes,
        keys=keys,
        loads=sum(loads_per.values()),
        rotations=sum(len(s) for s in _sites(ch.program)),
        rotations_before=rotations_before,
        rotation_keys_before=keys_before,
        peak_bytes=peak,
        min_cap_bytes=ch.min_cap,
        basis=ch.basis if ch.basis is not None else basis,
        chains={**chains, **ch.chains},
        solver=ch.solver,
        options={"key_levels": key_levels, **KEY_STRATEGIES.create(strategy).options(knobs)},
        splits=ch.splits,
        time_ms=ch.time.to_json() if ch.time is not None else None,
    )


def program_sha256(program: Sequence[Mapping[str, Any]]) -> str:
    """Digest of a program without its key schedule (identifies the planned program a
    schedule was derived from)."""
    core = [i for i in program if not _is_key_op(i)]
    return hashlib.sha256(json.dumps(core, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def schedule_plan(
    plan: Mapping[str, Any],
    cap_bytes: int | None,
    strategy: str,
    max_keys: int | None = None,
    **kwargs: Any,
) -> tuple[dict[str, Any], KeySchedule]:
    """A copy of ``plan`` with a key schedule: new program, ``keys`` (level and bytes per
    key) and an updated summary (rotations, rotation_keys, key_loads, peak_bytes,
    memory_cap_bytes, instructions, key_schedule)."""
    params = Params.from_json(plan["params"])
    source = plan.get("summary", {}).get("key_schedule", {}).get("source_program_sha256")
    with progress.stage("key schedule"):
        sched = schedule_keys(plan["program"], params, cap_bytes, strategy, max_keys, **kwargs)
    new = dict(plan)
    new["program"] = sched.program
    summary = dict(plan.get("summary", {}))
    counts = summarize(sched.program, params, len(plan.get("plaintexts", {})))
    for key in ("rotations", "rotation_keys", "key_loads", "instructions"):
        summary[key] = counts[key]
    summary["peak_bytes"] = sched.peak_bytes
    summary["memory_cap_bytes"] = cap_bytes
    ks = sched.to_json()
    if isinstance(ks.get("solver"), dict):  # wall-clock: plans stay byte-for-byte deterministic
        ks["solver"] = {k: v for k, v in ks["solver"].items() if k != "seconds"}
    ks["source_program_sha256"] = source or program_sha256(plan["program"])
    summary["key_schedule"] = ks
    new["summary"] = summary
    new["keys"] = sched.keys_json()
    nodes = plan.get("nodes") or []
    if nodes and all("span" in n for n in nodes):
        # the schedule inserted loads and drops (and may have re-expressed rotations):
        # each node keeps what it owns, so the per-node counts still add up
        spans = remap_spans(plan["program"], [n["span"] for n in nodes], sched.program)
        new["nodes"] = [
            {**n, **span_counts(sched.program[a:z], plan["params"].get("slots")), "span": [a, z]}
            for n, (a, z) in zip(nodes, spans, strict=True)
        ]
    return new, sched
