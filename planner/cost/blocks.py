"""The fused blocks of a program priced at their level (:meth:`planner.cost.timing.TimeModel.program_costs`
calls it; docs/time-model.md): one decomposition per rotated register, the lazy babies once
per (register, offset), each giant step and product, the block's own finish (QP) or output
reduction (Q mode), a rescale when the plan rescales it, and, when the run encodes its
plaintexts in the clock, one plaintext per product at the block's level (QP, or Q in Q
mode). A block's cost is charged at its root."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from planner.ir.fusion import FusedBlock

if TYPE_CHECKING:
    from planner.cost.timing import TimeModel


def price_blocks(tm: TimeModel, blocks: Sequence[FusedBlock], level: Callable[[str], int], cost: list[float],
                 encode: bool = False) -> None:
    """Add each block's cost (table units) to ``cost`` at its root; ``level``: a register's
    level as the run has it."""
    babies: dict[str, set[tuple[str, int]]] = {}
    q_babies: dict[str, set[tuple[str, int]]] = {}
    decomposed: set[str] = set()
    split = tm.weights.block_base is not None  # decomposition once per base
    for blk in blocks:
        lv = level(blk.base)
        fixed = 0.0
        c = 0.0
        if blk.qmode:  # Q mode (planner.ir.fusion): no ModDown per block, babies brought down once
            new_q = blk.babies - q_babies.setdefault(blk.base, set())
            c += (tm.at("block_q", lv) + tm.at("block_product_q", lv) * blk.products
                  + tm.at("block_baby_q", lv) * len(new_q))
            q_babies[blk.base] |= new_q
        else:
            fixed = tm.at("block_finish", lv) if split else tm.at("block_fixed", lv)
            c += tm.at("block_giant", lv) * blk.giants + tm.at("block_product", lv) * blk.products
        if encode:
            c += tm.encode(lv, qp=not blk.qmode) * blk.products
        regs = {r for r, _ in blk.babies} - decomposed  # one decomposition per rotated register
        if split and regs:
            fixed += tm.at("block_base", lv) * len(regs)
        decomposed |= regs
        c += fixed
        if blk.rescaled:
            c += tm.at("rescale", lv)
        new = blk.babies - babies.setdefault(blk.base, set())
        c += tm.at("block_baby", lv) * len(new)
        babies[blk.base] |= new
        cost[blk.root if 0 <= blk.root < len(cost) else len(cost) - 1] += c
