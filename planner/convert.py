"""Layout conversions between a producer's layout and the layout a consumer needs.

Every conversion is derived from the two layouts' index maps, so it works for channel
layouts and Rotom layouts alike, and is priced by lowering it (kernels' exactness rule).

* ``none``: same placement; the consumer does not need zeros the producer does not give.
* ``mask``: same placement, unused slots zeroed: one pmul per ciphertext.
* ``replicate``: every ciphertext gains periodic copies of itself (Rotom ApplyReplicate):
  rotate-and-add doubling, ``floor(log2 m) + popcount(m) - 1`` rotations.
* ``permute``: elements move from (src ct, slot s) to (dst ct, slot t).  Moves are grouped
  by (src ct, offset s - t).  A group that carries a whole source ciphertext needs no mask:
  one rotation (Rotom ApplyRotRoll when a roll shifts whole segments; ApplyCompact when
  several ciphertexts are added into one).  The other groups are masked; their offsets are
  split ``delta = beta + gamma`` (baby-step giant-step, Rotom ApplyBSGSRoll): babies rotate
  the source (hoisted), masks are pre-rotated by ``-gamma``, one giant rotation per distinct
  ``gamma`` of each target.  ``n1`` (baby range) is the power of two with the fewest
  rotations; ``n1 = slots`` is the plain mask-and-rotate (ApplyRoll / ApplyPermute).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

import numpy as np

from planner.kernels.base import CostVector, count_program
from planner.program import ProgramBuilder


class Layout(Protocol):
    """What conversions need of a layout (ChannelLayout, RotomLayout, MappedLayout)."""

    shape: tuple[int, ...]
    slots: int
    clean: bool

    @property
    def n_ct(self) -> int: ...

    @property
    def size(self) -> int: ...

    def index_map(self, ct: int) -> np.ndarray: ...

    def notation(self) -> str: ...

    def with_clean(self, clean: bool) -> Any: ...

    def __hash__(self) -> int: ...


def same_placement(a: Layout, b: Layout) -> bool:
    if a.n_ct != b.n_ct or a.slots != b.slots or a.size != b.size:
        return False
    if a.with_clean(True) == b.with_clean(True):
        return True
    return all(np.array_equal(a.index_map(q), b.index_map(q)) for q in range(a.n_ct))


@dataclass(frozen=True)
class Move:
    """Moves into one target ciphertext: whole source ciphertexts by offset, and masked
    groups (source ct, offset) -> target slots."""

    whole: tuple[tuple[int, int], ...]  # (src ct, offset)
    masked: tuple[tuple[int, int, tuple[int, ...]], ...] = field(default=())  # (src ct, offset, target slots)


@dataclass(frozen=True)
class Conversion:
    src: Any
    dst: Any
    kind: str  # "none" | "mask" | "replicate" | "permute"

    def lower(self, b: ProgramBuilder, regs: list[str], tag: str) -> list[str]:
        if self.kind == "none":
            return regs
        if self.kind == "mask":
            out = []
            for q, r in enumerate(regs):
                pt = _mask_plaintext(b, self.dst, q)
                out.append(b.rescale(b.pmul(r, pt)))
            return out
        if self.kind == "replicate":
            from planner.kernels.imra import sum_of_shifts

            m, period = _replication(self.src, self.dst)  # type: ignore[misc]
            return [sum_of_shifts(b, r, m, -period) for r in regs]
        return _lower_permute(b, self.src, self.dst, regs, tag)

    def cost(self) -> CostVector:
        return _conversion_cost(self)


def _mask_plaintext(b: ProgramBuilder, lay: Layout, q: int) -> str:
    def coef() -> np.ndarray:
        return (lay.index_map(q) >= 0).astype(np.float64)

    return b.const_plaintext(("mask", lay, q), f"pt/mask/{len(b.tables)}", coef)


def plan_conversion(src: Layout, dst: Layout) -> Conversion:
    if src.size != dst.size:
        raise ValueError(f"cannot convert a {src.shape} layout into a {dst.shape} layout")
    if same_placement(src, dst):
        if dst.clean and not src.clean:
            return Conversion(src, dst, "mask")
        return Conversion(src, dst, "none")
    if src.clean and _replication(src, dst) is not None:
        return Conversion(src, dst, "replicate")
    return Conversion(src, dst, "permute")


@lru_cache(maxsize=1024)
def _replication(src: Layout, dst: Layout) -> tuple[int, int] | None:
    """(copies, period) when dst is src plus periodic copies in every ciphertext."""
    if src.n_ct != dst.n_ct:
        return None
    S = src.slots
    found: tuple[int, int] | None = None
    for q in range(src.n_ct):
        sm, dm = src.index_map(q), dst.index_map(q)
        s = np.nonzero(sm >= 0)[0]
        if s.size == 0:
            return None
        first = np.nonzero(dm == sm[s[0]])[0]
        if first.size < 2 or first[0] != s[0]:
            return None
        period = int(first[1] - first[0])
        m = int(first.size)
        if found is not None and found != (m, period):
            return None
        expect = np.full(S, -1, dtype=np.int64)
        for r in range(m):
            t = s + r * period
            if t.max() >= S:
                return None
            if np.any(expect[t] >= 0):
                return None
            expect[t] = sm[s]
        if not np.array_equal(expect, dm):
            return None
        found = (m, period)
    return found


def _moves(src: Layout, dst: Layout) -> list[Move]:
    S = src.slots
    pos_ct = np.full(src.size, -1, dtype=np.int64)
    pos_slot = np.full(src.size, -1, dtype=np.int64)
    src_count = np.zeros(src.n_ct, dtype=np.int64)
    for q in range(src.n_ct):
        m = src.index_map(q)
        s = np.nonzero(m >= 0)[0]
        pos_ct[m[s]] = q
        pos_slot[m[s]] = s
        src_count[q] = s.size
    moves = []
    for qd in range(dst.n_ct):
        m = dst.index_map(qd)
        t = np.nonzero(m >= 0)[0]
        e = m[t]
        qs, ss = pos_ct[e], pos_slot[e]
        off = (ss - t) % S
        key = qs * S + off
        order = np.argsort(key, kind="stable")
        key, t_sorted, ss_sorted = key[order], t[order], ss[order]
        uniq, starts = np.unique(key, return_index=True)
        ends = list(starts[1:]) + [len(key)]
        whole: list[tuple[int, int]] = []
        masked: list[tuple[int, int, tuple[int, ...]]] = []
        groups = [(int(u // S), int(u % S), a, z) for u, a, z in zip(uniq.tolist(), starts.tolist(), ends, strict=True)]
        per_src: dict[int, int] = {}
        for q, _, _, _ in groups:
            per_src[q] = per_src.get(q, 0) + 1
        for q, o, a, z in groups:
            n_src_slots = np.unique(ss_sorted[a:z]).size
            # a whole move: the group carries every element of src ct q, and nothing else
            # lands where rot(src_q, o) puts them; garbage of an unclean source is only
            # acceptable when this group alone fills a target that need not be clean
            ok_clean = src.clean or (len(groups) == 1 and not dst.clean)
            if per_src[q] == 1 and n_src_slots == src_count[q] and ok_clean and _whole_fits(src, dst, q, qd, o):
                whole.append((q, o))
            else:
                masked.append((q, o, tuple(t_sorted[a:z].tolist())))
        moves.append(Move(tuple(whole), tuple(masked)))
    return moves


def _whole_fits(src: Layout, dst: Layout, q: int, qd: int, o: int) -> bool:
    """rot(src_q, o) lands only on target slots that expect exactly those elements."""
    S = src.slots
    sm = src.index_map(q)
    s = np.nonzero(sm >= 0)[0]
    t = (s - o) % S
    return bool(np.array_equal(dst.index_map(qd)[t], sm[s]))


def _choose_n1(moves: list[Move], S: int, n_src: int) -> int:
    def rotations(n1: int) -> int:
        babies: list[set[int]] = [set() for _ in range(n_src)]
        total = 0
        for mv in moves:
            gams = set()
            for q, o, _ in mv.masked:
                babies[q].add(o % n1)
                gams.add(o - o % n1)
            total += len(gams - {0})
        return total + sum(len(bs - {0}) for bs in babies)

    cands = [1 << e for e in range(S.bit_length()) if (1 << e) <= S]
    return min(cands, key=lambda n1: (rotations(n1), -n1))


def _lower_permute(b: ProgramBuilder, src: Layout, dst: Layout, regs: list[str], tag: str) -> list[str]:
    S = src.slots
    moves = _moves(src, dst)
    n1 = _choose_n1(moves, S, src.n_ct)
    babies: dict[int, dict[int, str]] = {}
    for q in range(src.n_ct):
        used = sorted({o % n1 for mv in moves for qq, o, _ in mv.masked if qq == q})
        if used:
            babies[q] = b.rot_many(regs[q], used)
    outs = []
    for qd, mv in enumerate(moves):
        acc: str | None = None
        for q, o in mv.whole:
            acc = b.accumulate(acc, b.rot(regs[q], o))
        by_giant: dict[int, list[tuple[int, int, tuple[int, ...]]]] = {}
        for q, o, ts in mv.masked:
            by_giant.setdefault(o - o % n1, []).append((q, o % n1, ts))
        masked_sum: str | None = None
        for gam, terms in sorted(by_giant.items()):
            part: str | None = None
            for q, beta, ts in terms:
                pt = b.const_plaintext(
                    ("perm", src, dst, qd, q, beta, gam), f"pt/{tag}/q{qd}s{q}b{beta}g{gam}", _mask_coef(ts, gam, S)
                )
                part = b.accumulate(part, b.pmul(babies[q][beta], pt))
            assert part is not None
            masked_sum = b.accumulate(masked_sum, b.rot(b.rescale(part), gam))
        if masked_sum is not None:
            acc = masked_sum if acc is None else b.add(acc, masked_sum)
        if acc is None:
            raise ValueError("conversion target ciphertext receives nothing")
        outs.append(acc)
    return outs


def _mask_coef(ts: tuple[int, ...], gam: int, S: int) -> Callable[[], np.ndarray]:
    def coef() -> np.ndarray:
        v = np.zeros(S)
        v[(np.asarray(ts, dtype=np.int64) + gam) % S] = 1.0
        return v

    return coef


@lru_cache(maxsize=4096)
def _conversion_cost(conv: Conversion) -> CostVector:
    b = ProgramBuilder(conv.src.slots)
    regs = [b._reg(0) for _ in range(conv.src.n_ct)]
    outs = conv.lower(b, regs, "cost")
    d = max((b.depth[r] for r in outs), default=0)
    return count_program(b.instrs, 0, d, len(b.plaintexts), len(outs), 0.0)
