"""Conversions between slotplan's slot layouts and CinS layouts, and NeuJeans' layer flows.

* slot -> cins: a permutation conversion (``planner.kernels.convert``) into the Re/Im pair layout
  of the CinS layout (:meth:`CinSLayout.pair_layout`), then one ``to_cins`` per pair.
* cins -> slot: one ``bootstrap_cins`` per ciphertext (the only way out of the coefficient
  domain, NeuJeans 6.2), giving the pair layout (dirty when the CinS layout is: padding
  cells hold partial sums), then a mask or permutation conversion to the target.

:func:`conv_layer` builds one NeuJeans conv layer (entry, conv, exit) for a stride-1 or
stride-s conv, densify-first (conv at stride 1, bootstraps of the sparse result, densify
after) or decomposed (NeuJeans Alg. 2: polyphase split before ``to_cins``, dense result).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from planner.ir.builder import ProgramBuilder
from planner.kernels.base import Candidate, CostVector, count_program
from planner.kernels.cins import CinsConv, cins_conv
from planner.kernels.convert import plan_conversion
from planner.layout.channels import MappedLayout, all_maps
from planner.layout.cins import CinSLayout

# to_cins: merged butterfly factors of S_(l<-1) (Lattigo's S2C uses 5 stages per level at N16)
DEFAULT_TO_CINS_LEVELS = 2


@dataclass(frozen=True)
class CinsConversion:
    """A conversion into or out of a CinS layout (same interface as convert.Conversion)."""

    src: Any
    dst: Any
    kind: str  # "to-cins" | "from-cins" | "cins-refresh" | "none"
    levels: int = DEFAULT_TO_CINS_LEVELS

    def lower(self, b: ProgramBuilder, regs: list[str], tag: str) -> list[str]:
        if self.kind == "none":
            return regs
        if self.kind == "to-cins":
            return slot_to_cins(b, self.src, regs, self.dst, self.levels)
        if self.kind == "from-cins":
            return cins_to_slot(b, self.src, regs, self.dst)
        mid = self.src.with_clean(True).pair_layout()
        pairs = cins_to_slot(b, self.src, regs, mid)
        return slot_to_cins(b, mid, pairs, self.dst, self.levels)

    def cost(self) -> CostVector:
        b = ProgramBuilder(self.src.slots)
        regs = [b._reg(0) for _ in range(self.src.n_ct)]
        outs = self.lower(b, regs, "cost")
        d = max((b.depth[r] for r in outs), default=0)
        return count_program(b.objs, 0, d, len(b.plaintexts), len(outs), 0.0)


def plan_cins_conversion(src: Any, dst: Any, levels: int = DEFAULT_TO_CINS_LEVELS) -> CinsConversion:
    s_c, d_c = isinstance(src, CinSLayout), isinstance(dst, CinSLayout)
    if s_c and d_c:
        same = src.with_clean(True) == dst.with_clean(True)
        if same and (src.clean or not dst.clean):
            return CinsConversion(src, dst, "none", levels)
        return CinsConversion(src, dst, "cins-refresh", levels)
    if d_c:
        return CinsConversion(src, dst, "to-cins", levels)
    if s_c:
        return CinsConversion(src, dst, "from-cins", levels)
    raise ValueError("plan_cins_conversion: neither layout is a CinS layout")


def nonempty(lay: Any) -> tuple[Any, list[int | None]]:
    """``lay`` without its empty ciphertexts (a pair layout's Im half is empty when every
    element sits in the first half of its slice), and for each original ciphertext its
    index in the reduced layout (None when empty)."""
    maps = all_maps(lay)
    keep = [q for q in range(maps.shape[0]) if np.any(maps[q] >= 0)]
    where: list[int | None] = [None] * maps.shape[0]
    for j, q in enumerate(keep):
        where[q] = j
    if len(keep) == maps.shape[0]:
        return lay, where
    return MappedLayout.of(lay.shape, maps[keep], lay.clean, getattr(lay, "label", "mapped")), where


def slot_to_cins(b: ProgramBuilder, src: Any, regs: list[str], dst: CinSLayout, levels: int) -> list[str]:
    pair, where = nonempty(dst.with_clean(True).pair_layout())
    moved = plan_conversion(src, pair).lower(b, regs, f"cins-entry/{len(b.objs)}")
    out = []
    for q in range(dst.n_ct):
        jr, ji = where[2 * q], where[2 * q + 1]
        if jr is None:  # no element in the Re half either: the ciphertext is all zero
            raise ValueError(f"cins layout {dst.notation()}: ciphertext {q} holds no element")
        out.append(b.to_cins(moved[jr], moved[ji] if ji is not None else None, dst.l, levels))
    return out


def cins_to_slot(b: ProgramBuilder, src: CinSLayout, regs: list[str], dst: Any, fused: bool | None = None) -> list[str]:
    pairs: list[str] = []
    for r in regs:
        pairs.extend(b.bootstrap_cins(r, src.l, fused))
    return plan_conversion(src.pair_layout(), dst).lower(b, pairs, f"cins-exit/{len(b.objs)}")


@dataclass
class LayerFlow:
    """One conv layer in NeuJeans form: the program pieces and their counts."""

    kernel: CinsConv
    entry: Any  # the slot layout the layer starts from
    exit: Any  # the slot layout the layer ends in
    counts: dict[str, int]


def conv_layer(
    b: ProgramBuilder, x_regs: list[str], entry: Any, x_shape: tuple[int, int, int],
    w_shape: tuple[int, int, int, int], stride: int, padding: tuple[int, int], groups: int,
    decomposed: bool, exit_layout: Any | None = None, x: str = "x", w: str = "w", node: str = "y",
    levels: int = DEFAULT_TO_CINS_LEVELS,
) -> tuple[list[str], CinsConv, Any]:
    """Lower entry conversion (slot ``entry`` -> CinS), the conv, and the exit (bootstrap,
    mask, densify into ``exit_layout``, default: the pair layout of the dense output a
    next CinS layer would take).  Returns (output registers, kernel, exit layout)."""
    k = cins_conv(x, w, x_shape, w_shape, b.slots, stride, padding, groups, decomposed)
    regs = slot_to_cins(b, entry, x_regs, k.in_layout, levels)
    outs = k.lower(b, {x: regs}, node)
    if exit_layout is None:
        Co, Ho, Wo = k.out_layout.shape
        dense = cins_conv(node, "next", (Co, Ho, Wo), (Co, Co, 3, 3), b.slots, 1, (1, 1), 1, False)
        exit_layout = nonempty(dense.in_layout.pair_layout())[0]
    y = cins_to_slot(b, k.out_layout.with_clean(False), outs, exit_layout)
    return y, k, exit_layout


# ---------------------------------------------------------------------- layer candidates


def layer_candidate(raw: Candidate, scale: int = 1, levels: int = DEFAULT_TO_CINS_LEVELS,
                    stoc_levels: int = 0) -> Candidate:
    """A NeuJeans conv layer as one candidate of the choice model (issue 13): it reads its
    operand in the slot domain, in the Re/Im pair layout of the conv's CinS input (any
    other layout converts on the edge, priced like every conversion), then ``to_cins``,
    the CinS conv (``raw``, its plaintexts divided by ``scale``), ``bootstrap_cins`` of
    every result ciphertext (fused: NeuJeans folds the conv into SlotsToCoeffs) and one
    ``pmul`` per result ciphertext by ``scale`` on the valid cells and 0 elsewhere (Alg. 1
    l.3-4: the mask that restores the zeros; it undoes the scaling too).  Its result is a
    clean slot layout (the pair layout of the conv's output, empty halves left out) at a
    depth that does not depend on its operand's: the candidate ``resets``.

    ``scale`` is a power of two with every coefficient of the conv's result (valid cells
    and the partial sums in the padding alike) within the bootstrap's ``max_abs``.

    ``stoc_levels``: the SlotsToCoeffs levels each ``bootstrap_cins`` gives back
    (``Boot.stoc_levels``): the result leaves at depth ``1 - stoc_levels`` (the exit mask's
    level taken from them), so the following layers use them (issue 37)."""
    k: CinsConv = raw.source
    if scale != 1:
        k = replace(k, scale=scale)
    lin, node = k.in_layout, raw.node
    pair_in, where_in = nonempty(lin.with_clean(True).pair_layout())
    full_out = k.out_layout.with_clean(False).pair_layout()
    pair_out, where_out = nonempty(full_out.with_clean(True))

    def mask(j: int) -> Callable[[], np.ndarray]:
        return lambda: np.where(full_out.index_map(j) >= 0, float(scale), 0.0)

    def lower(b: ProgramBuilder, regs: dict[str, list[str]]) -> list[str]:
        xs = regs[k.x]
        cins_regs = []
        for q in range(lin.n_ct):
            jr, ji = where_in[2 * q], where_in[2 * q + 1]
            if jr is None:  # pragma: no cover - a CinS layout never has an empty ciphertext
                raise ValueError(f"cins layout {lin.notation()}: ciphertext {q} holds no element")
            cins_regs.append(b.to_cins(xs[jr], xs[ji] if ji is not None else None, lin.l, levels))
        outs = k.lower(b, {k.x: cins_regs}, node)
        res = []
        for q, r in enumerate(outs):
            pair = b.bootstrap_cins(r, lin.l, True, stoc_levels)
            for j, reg in zip((2 * q, 2 * q + 1), pair, strict=True):
                if where_out[j] is None:
                    continue  # the Im half of a slice holds no cell of the output
                pt = b.const_plaintext(("cins-exit", node, j, scale), f"pt/{node}/cins-exit/{j}", mask(j))
                res.append(b.rescale(b.pmul(reg, pt)))
        return res

    params = {**raw.params, "to_cins_levels": levels}
    if scale != 1:
        params["scale"] = scale
    return Candidate(
        node=node, kernel=raw.kernel, params=params, in_layouts={k.x: pair_in}, out_layout=pair_out,
        lower=lower, slot_utilization=pair_out.size / (pair_out.n_ct * pair_out.slots), source=k, resets=True,
    )
