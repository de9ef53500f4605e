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
  The split may be strided: with an odd step ``c`` (invertible mod the power-of-two slot
  count) every offset is ``c*k``, and ``beta = c*(k mod n1)``.  A transposition moves
  elements by multiples of ``rows - 1`` (e.g. 127 for 128-slot rows): with ``c = 127``
  its 2r - 1 diagonals need ~2*sqrt(2r) rotations instead of ~2r.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Protocol

import numpy as np

from planner.ir.builder import ProgramBuilder
from planner.kernels.base import CostVector, count_program


class Layout(Protocol):
    """What conversions need of a layout (ChannelLayout, RotomLayout, MappedLayout)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def slots(self) -> int: ...

    @property
    def clean(self) -> bool: ...

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


@dataclass(frozen=True, eq=False)
class Moves:
    """All element moves of a conversion, grouped.

    ``whole``: (dst ct, src ct, offset) moves of entire source ciphertexts (no mask).
    Masked elements, sorted by (dst ct, src ct, offset): arrays ``qd, qs, off, t`` and the
    group boundaries ``starts`` / ``ends`` (one group = one masked pmul before BSGS).
    """

    whole: tuple[tuple[int, int, int], ...]
    qd: np.ndarray
    qs: np.ndarray
    off: np.ndarray
    t: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    n_dst: int
    n_src: int
    slots: int

    def group_keys(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        i = self.starts
        return self.qd[i], self.qs[i], self.off[i]


@dataclass(frozen=True)
class Conversion:
    src: Any
    dst: Any
    kind: str  # "none" | "mask" | "replicate" | "permute" | "permute+replicate"

    def lower(self, b: ProgramBuilder, regs: list[str], tag: str) -> list[str]:
        if self.kind == "none":
            return regs
        if self.kind == "mask":
            out = []
            for q, r in enumerate(regs):
                pt = _mask_plaintext(b, self.dst, q)
                out.append(b.rescale(b.pmul(r, pt)))
            return out
        from planner.kernels.imra import sum_of_shifts

        if self.kind == "replicate":
            rep = _replication(self.src, self.dst)
            assert rep is not None
            return [sum_of_shifts(b, r, rep[0], -rep[1]) for r in regs]
        if self.kind == "permute+replicate":
            split = _split_replication(self.dst)
            assert split is not None
            single, m, period = split
            mid = _lower_permute(b, self.src, single, regs, tag)
            return [sum_of_shifts(b, r, m, -period) for r in mid]
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
    if _split_replication(dst) is not None:
        return Conversion(src, dst, "permute+replicate")
    return Conversion(src, dst, "permute")


@lru_cache(maxsize=256)
def _split_replication(dst: Layout) -> tuple[Any, int, int] | None:
    """When every element of dst appears m > 1 times per ciphertext at a constant period,
    the layout holding only the first copies (a permute target) and (m, period)."""
    from planner.layout.channels import MappedLayout, all_maps

    maps = all_maps(dst)
    first = np.full_like(maps, -1)
    found: tuple[int, int] | None = None
    for q in range(maps.shape[0]):
        row = maps[q]
        s = np.nonzero(row >= 0)[0]
        if s.size == 0:
            continue
        order = np.argsort(row[s], kind="stable")
        vals, slots_ = row[s][order], s[order]
        uniq, starts, counts = np.unique(vals, return_index=True, return_counts=True)
        if counts.min() != counts.max() or counts[0] < 2:
            return None
        m = int(counts[0])
        grid = slots_.reshape(-1, m)  # each element's slots, ascending
        period = int(grid[0, 1] - grid[0, 0])
        if period < 1 or not np.all(grid - grid[:, :1] == np.arange(m)[None, :] * period):
            return None
        if found is not None and found != (m, period):
            return None
        found = (m, period)
        first[q, grid[:, 0]] = uniq
    if found is None:
        return None
    return MappedLayout.of(dst.shape, first, True, "first-copies"), found[0], found[1]


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


@lru_cache(maxsize=512)
def _moves(src: Layout, dst: Layout) -> Moves:
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
    qd_l, t_l = [], []
    for q in range(dst.n_ct):
        t = np.nonzero(dst.index_map(q) >= 0)[0]
        qd_l.append(np.full(t.size, q, dtype=np.int64))
        t_l.append(t)
    qd = np.concatenate(qd_l) if qd_l else np.zeros(0, dtype=np.int64)
    t = np.concatenate(t_l) if t_l else np.zeros(0, dtype=np.int64)
    elem = np.concatenate([dst.index_map(q)[tt] for q, tt in enumerate(t_l)]) if t_l else t
    qs, ss = pos_ct[elem], pos_slot[elem]
    off = (ss - t) % S
    # whole moves: a (dst, src) pair with one offset that carries all of the source's data
    pair = qd * src.n_ct + qs
    whole: list[tuple[int, int, int]] = []
    is_whole = np.zeros(t.size, dtype=bool)
    order = np.argsort(pair, kind="stable")
    pu, pstart = np.unique(pair[order], return_index=True)
    pend = np.append(pstart[1:], order.size)
    n_pairs_per_dst = np.bincount(pu // src.n_ct, minlength=dst.n_ct)
    for key, a_, z_ in zip(pu.tolist(), pstart.tolist(), pend.tolist(), strict=True):
        idx = order[a_:z_]
        offs = off[idx]
        if offs.min() != offs.max():
            continue
        d_, s_ = divmod(key, src.n_ct)
        if np.unique(ss[idx]).size != src_count[s_]:
            continue
        if not (src.clean or (n_pairs_per_dst[d_] == 1 and not dst.clean)):
            continue
        if not _whole_fits(src, dst, s_, d_, int(offs[0])):
            continue
        whole.append((d_, s_, int(offs[0])))
        is_whole[idx] = True
    keep = ~is_whole
    qd, qs, off, t = qd[keep], qs[keep], off[keep], t[keep]
    key = (qd * src.n_ct + qs) * S + off
    order = np.argsort(key, kind="stable")
    qd, qs, off, t, key = qd[order], qs[order], off[order], t[order], key[order]
    _, starts = np.unique(key, return_index=True)
    ends = np.append(starts[1:], key.size)
    return Moves(tuple(whole), qd, qs, off, t, starts, ends, dst.n_ct, src.n_ct, S)


def _whole_fits(src: Layout, dst: Layout, q: int, qd: int, o: int) -> bool:
    """rot(src_q, o) lands only on target slots that expect exactly those elements."""
    S = src.slots
    sm = src.index_map(q)
    s = np.nonzero(sm >= 0)[0]
    t = (s - o) % S
    return bool(np.array_equal(dst.index_map(qd)[t], sm[s]))


def _betas(off: np.ndarray, split: tuple[int, int], S: int) -> np.ndarray:
    """Baby offsets of ``off`` under the split (step c, baby range n1)."""
    c, n1 = split
    if c == 1:
        return off % n1
    k = (off * pow(c, -1, S)) % S
    return (c * (k % n1)) % S


def _bsgs_counts(mv: Moves, split: tuple[int, int]) -> tuple[int, int, np.ndarray, np.ndarray]:
    """(baby rotations, giant rotations, babies per source, giants per target) for a split."""
    gqd, gqs, goff = mv.group_keys()
    beta = _betas(goff, split, mv.slots)
    gam = (goff - beta) % mv.slots
    bkeys = np.unique(gqs * mv.slots + beta)
    babies_nz = bkeys[(bkeys % mv.slots) != 0]
    gkeys = np.unique(gqd * mv.slots + gam)
    giants_nz = gkeys[(gkeys % mv.slots) != 0]
    per_src = np.bincount(babies_nz // mv.slots, minlength=mv.n_src)
    per_dst = np.bincount(gkeys // mv.slots, minlength=mv.n_dst)
    return int(babies_nz.size), int(giants_nz.size), per_src, per_dst


def _steps(mv: Moves) -> list[int]:
    """Strides worth trying: 1 and the most common odd gaps between distinct offsets."""
    S = mv.slots
    offs = np.sort(mv.group_keys()[2] % S)
    out = [1]
    if offs.size > 2:
        gaps = np.diff(offs)
        gaps = gaps[gaps % 2 == 1]
        if gaps.size:
            counts = np.bincount(gaps)
            order = np.argsort(-counts, kind="stable")[:2]
            out.extend(int(v) for v in order if counts[v] and v != 1)
    return out


def _rotations_per_n1(owner: np.ndarray, k: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Nonzero baby and giant rotation counts for every ``n1 = 2**e`` (e = 0..bits) at once.

    Babies are the distinct (source, k mod n1), giants the distinct (target, k >> e); both
    are counted from one sort each: adjacent keys differ in the low e bits iff the lowest
    set bit of their XOR is below e, in the high bits iff its highest set bit is >= e.
    """
    qs, qd = owner
    es = np.arange(bits + 1)
    # babies: sort by (source, bit-reversed k) so equal low bits are adjacent
    rev = np.zeros_like(k)
    for i in range(bits):
        rev |= ((k >> i) & 1) << (bits - 1 - i)
    o = np.lexsort((rev, qs))
    ks, ss = k[o], qs[o]
    x = ks[1:] ^ ks[:-1]
    low = np.where(x == 0, bits + 1, _ctz(x))
    new_src = ss[1:] != ss[:-1]
    distinct_b = 1 + np.count_nonzero(new_src[None, :] | (low[None, :] < es[:, None]), axis=1)
    # zero babies: a source holding some k with k mod n1 == 0 (ctz(k) >= e)
    tz = np.where(k == 0, bits + 1, _ctz(k))
    best_tz = np.full(int(qs.max()) + 1, -1)
    np.maximum.at(best_tz, qs, tz)
    zero_b = np.count_nonzero(best_tz[None, :] >= es[:, None], axis=1)
    # giants: sort by (target, k); adjacent keys split when their highest differing bit >= e
    o = np.lexsort((k, qd))
    kd, dd = k[o], qd[o]
    x = kd[1:] ^ kd[:-1]
    high = np.where(x == 0, -1, _bitlen(x) - 1)
    new_dst = dd[1:] != dd[:-1]
    distinct_g = 1 + np.count_nonzero(new_dst[None, :] | (high[None, :] >= es[:, None]), axis=1)
    min_k = np.full(int(qd.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(min_k, qd, k)
    zero_g = np.count_nonzero(min_k[None, :] < (1 << es)[:, None], axis=1)
    return distinct_b - zero_b, distinct_g - zero_g


def _ctz(x: np.ndarray) -> np.ndarray:
    return _bitlen(x & -x) - 1


def _bitlen(x: np.ndarray) -> np.ndarray:
    """Bit length of non-negative integers below 2**53 (exact through float64)."""
    return np.frexp(x.astype(np.float64))[1].astype(np.int64)


def _choose_n1(mv: Moves) -> tuple[int, int]:
    """The split (step c, baby range n1) with the fewest rotations; ties prefer c = 1 and
    the larger n1."""
    S = mv.slots
    bits = S.bit_length() - 1
    gqd, gqs, goff = mv.group_keys()
    if goff.size == 0:
        return 1, S
    best: tuple[tuple[int, bool, int, int], tuple[int, int]] | None = None
    for c in _steps(mv):
        k = goff % S if c == 1 else (goff * pow(c, -1, S)) % S
        nb, ng = _rotations_per_n1(np.stack([gqs, gqd]), k, bits)
        for e in range(bits + 1):
            key = (int(nb[e] + ng[e]), c != 1, -(1 << e), c)
            if best is None or key < best[0]:
                best = (key, (c, 1 << e))
    assert best is not None
    return best[1]


def _permute_cost(src: Layout, dst: Layout) -> CostVector:
    """Counts of the program _lower_permute emits (tests check they agree)."""
    mv = _moves(src, dst)
    split = _choose_n1(mv)
    nb, ng, per_src, per_dst_giants = _bsgs_counts(mv, split)
    gqd, gqs, goff = mv.group_keys()
    n_groups = int(mv.starts.size)
    whole_per_dst = np.bincount(np.asarray([w[0] for w in mv.whole], dtype=np.int64), minlength=mv.n_dst)
    whole_rot = sum(1 for w in mv.whole if w[2] % mv.slots)
    adds = 0
    for q in range(mv.n_dst):
        giants = int(per_dst_giants[q])
        terms = int(np.count_nonzero(gqd == q))
        items = int(whole_per_dst[q]) + (1 if giants else 0)
        adds += (terms - giants) + max(0, giants - 1) + max(0, items - 1)
    keys: set[int] = {w[2] % mv.slots for w in mv.whole if w[2] % mv.slots}
    beta = _betas(goff, split, mv.slots)
    keys.update(int(v) for v in np.unique(beta) if v)
    keys.update(int(v) for v in np.unique((goff - beta) % mv.slots) if v)
    return CostVector(
        rotations=nb + ng + whole_rot, rot_keys=frozenset(keys),
        hoisted_groups=int(np.count_nonzero(per_src > 1)), hoisted_rotations=int(per_src[per_src > 1].sum()),
        pmul=n_groups, add=adds,
        rescale=int(per_dst_giants.sum()), depth=1 if n_groups else 0, plaintexts=n_groups,
        ciphertexts_out=mv.n_dst, slot_utilization=0.0,
    )


def _lower_permute(b: ProgramBuilder, src: Layout, dst: Layout, regs: list[str], tag: str) -> list[str]:
    S = src.slots
    mv = _moves(src, dst)
    split = _choose_n1(mv)
    gqd, gqs, goff = mv.group_keys()
    gbeta = _betas(goff, split, S)
    babies: dict[int, dict[int, str]] = {}
    for q in range(src.n_ct):
        used = sorted(set(gbeta[gqs == q].tolist()))
        if used:
            babies[q] = b.rot_many(regs[q], used)
    outs = []
    for qd in range(dst.n_ct):
        acc: str | None = None
        for d_, s_, o in mv.whole:
            if d_ == qd:
                acc = b.accumulate(acc, b.rot(regs[s_], o))
        sel = np.nonzero(gqd == qd)[0]
        by_giant: dict[int, list[int]] = {}
        for g in sel.tolist():
            by_giant.setdefault(int(goff[g] - gbeta[g]) % S, []).append(g)
        masked_sum: str | None = None
        for gam, groups in sorted(by_giant.items()):
            part: str | None = None
            for g in groups:
                q, beta = int(gqs[g]), int(gbeta[g])
                ts = mv.t[mv.starts[g] : mv.ends[g]]
                pt = b.const_plaintext(
                    ("perm", id(mv), g), f"pt/{tag}/q{qd}s{q}b{beta}g{gam}", _mask_coef(ts, gam, S)
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


def _mask_coef(ts: np.ndarray, gam: int, S: int) -> Callable[[], np.ndarray]:
    ts = np.array(ts, dtype=np.int64)

    def coef() -> np.ndarray:
        v = np.zeros(S)
        v[(ts + gam) % S] = 1.0
        return v

    return coef


@lru_cache(maxsize=4096)
def _conversion_cost(conv: Conversion) -> CostVector:
    if conv.kind in ("permute", "permute+replicate"):
        from planner.kernels.problem import doubling_cost

        if conv.kind == "permute":
            return _permute_cost(conv.src, conv.dst)
        split = _split_replication(conv.dst)
        assert split is not None
        single, m, _ = split
        c = _permute_cost(conv.src, single)
        rot = doubling_cost(m)
        return replace(
            c, rotations=c.rotations + rot * single.n_ct, add=c.add + rot * single.n_ct,
            rot_keys=c.rot_keys | _doubling_keys(m, split[2], conv.src.slots),
        )
    return lowered_conversion_cost(conv)


def _doubling_keys(m: int, period: int, S: int) -> frozenset[int]:
    b = ProgramBuilder(S)
    from planner.kernels.imra import sum_of_shifts

    sum_of_shifts(b, b._reg(0), m, -period)
    return count_program(b.objs, 0, 0, 0, 0, 0.0).rot_keys


def lowered_conversion_cost(conv: Conversion) -> CostVector:
    b = ProgramBuilder(conv.src.slots)
    regs = [b._reg(0) for _ in range(conv.src.n_ct)]
    outs = conv.lower(b, regs, "cost")
    d = max((b.depth[r] for r in outs), default=0)
    return count_program(b.objs, 0, d, len(b.plaintexts), len(outs), 0.0)
