"""Layout conversions between a producer's layout and the layout a consumer needs.

* none: same geometry, and the consumer does not need zeros the producer does not give;
* mask: same geometry, but the consumer needs clean (zero) unused slots: one pmul by a
  0/1 plaintext per ciphertext;
* permute: general mask-and-rotate.  Every element moves from (src ct, slot s) to
  (dst ct, slot t); elements are grouped by source ciphertext and offset ``s - t``; each
  group costs one rotation (hoisted per source ciphertext) and one masking pmul.

Each conversion is priced by lowering it (the same exactness rule as kernels).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from planner.kernels.base import CostVector, count_program
from planner.layout import ChannelLayout
from planner.program import ProgramBuilder


def same_geometry(a: ChannelLayout, b: ChannelLayout) -> bool:
    return replace(a, clean=True) == replace(b, clean=True)


@dataclass(frozen=True)
class Conversion:
    src: ChannelLayout
    dst: ChannelLayout
    kind: str  # "none" | "mask" | "permute"

    def lower(self, b: ProgramBuilder, regs: list[str], tag: str) -> list[str]:
        if self.kind == "none":
            return regs
        if self.kind == "mask":
            out = []
            for q, r in enumerate(regs):
                pt = _mask_plaintext(b, self.dst, q)
                out.append(b.rescale(b.pmul(r, pt)))
            return out
        return _lower_permute(b, self.src, self.dst, regs, tag)

    def cost(self) -> CostVector:
        return _conversion_cost(self)


def _mask_plaintext(b: ProgramBuilder, lay: ChannelLayout, q: int) -> str:
    def coef() -> np.ndarray:
        return (lay.index_map(q) >= 0).astype(np.float64)

    return b.const_plaintext(("mask", lay, q), f"pt/mask/{len(b.tables)}", coef)


def plan_conversion(src: ChannelLayout, dst: ChannelLayout) -> Conversion:
    if src.shape != dst.shape and int(np.prod(src.shape)) != int(np.prod(dst.shape)):
        raise ValueError(f"cannot convert a {src.shape} layout into a {dst.shape} layout")
    if same_geometry(src, dst):
        if dst.clean and not src.clean:
            return Conversion(src, dst, "mask")
        return Conversion(src, dst, "none")
    return Conversion(src, dst, "permute")


def _moves(src: ChannelLayout, dst: ChannelLayout) -> dict[int, dict[int, dict[int, np.ndarray]]]:
    """dst ct -> src ct -> offset -> dst slots receiving elements with that offset."""
    S = src.slots
    pos_ct = np.full(src.size, -1, dtype=np.int64)
    pos_slot = np.full(src.size, -1, dtype=np.int64)
    for q in range(src.n_ct):
        m = src.index_map(q)
        s = np.nonzero(m >= 0)[0]
        pos_ct[m[s]] = q
        pos_slot[m[s]] = s
    out: dict[int, dict[int, dict[int, np.ndarray]]] = {}
    for qd in range(dst.n_ct):
        m = dst.index_map(qd)
        t = np.nonzero(m >= 0)[0]
        e = m[t]
        qs, ss = pos_ct[e], pos_slot[e]
        off = (ss - t) % S
        per: dict[int, dict[int, np.ndarray]] = {}
        key = qs * S + off
        order = np.argsort(key, kind="stable")
        key, t_sorted = key[order], t[order]
        uniq, starts = np.unique(key, return_index=True)
        ends = list(starts[1:]) + [len(key)]
        for u, a, z in zip(uniq.tolist(), starts.tolist(), ends, strict=True):
            per.setdefault(u // S, {})[u % S] = t_sorted[a:z]
        out[qd] = per
    return out


def _lower_permute(
    b: ProgramBuilder, src: ChannelLayout, dst: ChannelLayout, regs: list[str], tag: str
) -> list[str]:
    moves = _moves(src, dst)
    S = src.slots
    rotated: dict[int, dict[int, str]] = {}
    for qs in range(src.n_ct):
        offs = sorted({off for per in moves.values() for off in per.get(qs, {})})
        if offs:
            rotated[qs] = b.rot_many(regs[qs], offs)
    outs = []
    for qd in range(dst.n_ct):
        prods = []
        for qs, groups in sorted(moves[qd].items()):
            for off, slots_t in sorted(groups.items()):
                sl = slots_t.copy()

                def coef(sl: np.ndarray = sl) -> np.ndarray:
                    v = np.zeros(S)
                    v[sl] = 1.0
                    return v

                pt = b.const_plaintext(("perm", src, dst, qd, qs, off), f"pt/{tag}/q{qd}s{qs}o{off}", coef)
                prods.append(b.pmul(rotated[qs][off], pt))
        if not prods:
            raise ValueError("conversion target ciphertext receives nothing")
        outs.append(b.rescale(b.add_many(prods)))
    return outs


@lru_cache(maxsize=4096)
def _conversion_cost(conv: Conversion) -> CostVector:
    b = ProgramBuilder(conv.src.slots)
    regs = [b._reg(0) for _ in range(conv.src.n_ct)]
    outs = conv.lower(b, regs, "cost")
    d = max((b.depth[r] for r in outs), default=0)
    return count_program(b.instrs, 0, d, len(b.plaintexts), len(outs), 0.0)
