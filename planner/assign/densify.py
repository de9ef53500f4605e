"""Dense packing of gapped outputs, offered to every plan (``PlanOptions.densify``, on by
default; batched plans plan their block ring with it too): a candidate whose strided output
leaves gaps that cost ciphertexts, or room for periodic copies a later kernel could use,
gets a variant followed by the two permutes that pack it densely."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from planner.ir.builder import ProgramBuilder
from planner.kernels.base import Candidate, sequential
from planner.kernels.convert import plan_conversion
from planner.layout.channels import ChannelLayout, LayoutError, natural_layout


def _room(lay: ChannelLayout) -> int:
    """Copies of one ciphertext's content its ring holds (1: no room to replicate)."""
    return lay.slots // max(1, lay.extent)


def _dense_route(lay: Any, room: bool = True) -> tuple[Any, Any] | None:
    """For a gapped channel layout (a strided conv computed in place leaves ``lh = s W``,
    ``lw = s``, channel blocks of the input's size), the two steps that pack it densely:
    the grid of every channel block made row-major at the block's start, then the channel
    blocks packed to the natural layout.  None when the natural layout needs as many
    ciphertexts (nothing to gain: the bootstraps and kernels count ciphertexts)."""
    if not isinstance(lay, ChannelLayout) or lay.reps != 1 or lay.axes or lay.is_natural:
        return None
    try:
        dense = natural_layout(lay.shape, lay.slots)
    except LayoutError:
        return None
    if not isinstance(dense, ChannelLayout) or dense.axes:
        return None
    if dense.n_ct > lay.n_ct or dense.n_ct == lay.n_ct and (not room or _room(dense) <= _room(lay)):
        return None
    mid = replace(lay, lh=lay.width, lw=1, base=0, clean=True)
    try:
        mid.validate()
    except LayoutError:
        return None
    # (validate catches collisions between copies only: every element must keep its own slot)
    if sum(int(np.count_nonzero(mid.index_map(q) >= 0)) for q in range(mid.n_ct)) != mid.size:
        return None
    return mid, dense.with_clean(True)


def densified_variants(cands: list[Any], slots: int, room: bool = True) -> list[Any]:
    """Every plan (``PlanOptions.densify``): next to each candidate whose output layout
    has gaps that cost ciphertexts or room (``_dense_route``), the candidate followed by the
    two permutes that pack its output densely (two levels, priced by lowering like every
    conversion). ``room`` (``PlanOptions.densify_room``, batched plans): also where the dense
    layout takes as many ciphertexts but leaves room for more copies; one-sample plans pack
    only where it saves ciphertexts (with room too, the dense variants beat the Chebyshev
    fold of a matvec's output: tests/planner/assign/test_chebyshev_fold.py).

    A one-sample plan at a large ring may keep a strided conv's gapped output (ResNet-20 at
    n16boot: 32 channels of 16 x 16 in blocks of 1024 slots still fit one ciphertext; its
    stage 3, 64 channels of 8 x 8, takes two gapped and one dense); in the block ring of a
    batch the same layout needs twice the ciphertexts, so every later
    kernel, product and bootstrap would be paid per sample again.  At stage 3 the gapped
    layout fills the block ring in one ciphertext, as does the dense one, which leaves room
    for four copies; without the route the pair converted it in one permute (222 rotations,
    4096 masked products) instead of two (40 rotations, 128 products).  The solver weighs
    the packing's rotations and levels against what it saves downstream."""
    out: list[Any] = []
    for c in cands:
        route = _dense_route(c.out_layout, room)
        if route is None or c.resets:
            continue
        mid, dense = route
        first = plan_conversion(c.out_layout, mid)
        second = plan_conversion(mid, dense)
        out.append(_packed(c, dense, (first, second), True, slots, room))
        # the same packing in one permute: one level instead of two, for more rotations and
        # masked products (the solver weighs a level, which can cost a bootstrap, against them)
        direct = plan_conversion(c.out_layout, dense)
        if direct.cost().depth < first.cost().depth + second.cost().depth:
            out.append(_packed(c, dense, (direct,), "one-level", slots, room))
    return out


def _packed(c: Any, dense: Any, steps: tuple[Any, ...], how: Any, slots: int, room: bool) -> Candidate:
    """``c`` followed by the conversions ``steps`` to the dense layout (the route a
    function of ``c``'s output layout and ``room``: its cost shared where ``c``'s is)."""
    tags = ("grid", "channels") if len(steps) == 2 else ("dense",)

    def lower(b: ProgramBuilder, regs: dict[str, list[str]]) -> list[str]:
        r = c.lower(b, regs)
        for conv, tag in zip(steps, tags, strict=True):
            r = conv.lower(b, r, f"dense/{c.node}/{tag}")
        return r

    def analytic() -> Any:
        cost = c.cost(slots)
        for conv in steps:
            cost = sequential(cost, conv.cost())
        return cost

    v = Candidate(
        node=c.node, kernel=c.kernel, params={**c.params, "densify": how}, in_layouts=c.in_layouts,
        out_layout=dense, lower=lower, slot_utilization=c.slot_utilization, note=c.note,
        analytic=analytic, out_scale=c.out_scale, operand_scales=c.operand_scales,
    )
    key = c.derived_share("densify", how, room, type(dense).__name__, dense, getattr(dense, "label", None), lower.__code__)
    if key is not None:
        v.set_share(key)
    return v
