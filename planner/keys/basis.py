"""Rotation-key bases: which offsets get keys (pow2, NAF, BSGS, or fitted to the program)
and the rewrite of every rotation into a chain over the basis."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner import ir
from planner.ir.analysis import (
    reg_writes,
)
from planner.keys.profile import KeyScheduleError

BASES = ("auto", "pow2", "naf", "bsgs")
# A chain longer than this is not a sensible rewrite (pow2 needs at most log2(slots) = 15
# steps at LogN 16); bases that need longer chains are rejected.
MAX_CHAIN = 64
# Candidates tried per step when shrinking a basis to --max-keys (least used keys first).
SHRINK_TRIALS = 8


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
