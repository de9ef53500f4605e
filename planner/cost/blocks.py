"""The fused blocks of a program priced at their level (:meth:`planner.cost.timing.TimeModel.program_costs`
calls it; docs/time-model.md): one decomposition per rotated register, the lazy babies once
per (register, offset), each giant step and product, the block's own finish (QP) or output
reduction (Q mode), a rescale when the plan rescales it, and, when the run encodes its
plaintexts in the clock, one plaintext per product at the block's level (QP, or Q in Q
mode; consecutive products of a giant step two at a time, as the executor encodes them).
A block's cost is charged at its root.

A run that streams its plaintexts (``encode`` given) runs a QP block with its babies in Q
where the planner's rule says it pays (:func:`planner.ir.fusion.q_babies`, written into the
plan's ``fused`` annotation as ``babies_in_q``; backends/lattigo/fused_qbabies.go obeys it).
Such a block's products run in Q (``block_product_q``), its plaintexts are encoded in Q, and
each baby is brought down once (``block_baby_q``, shared with the register's Q-mode
blocks)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from planner.ir.fusion import FusedBlock, q_babies


def price_blocks(at: Callable[[str, int], float], split: bool, blocks: Sequence[FusedBlock],
                 level: Callable[[str], int], cost: list[float],
                 encode: Callable[[int, bool, int, int], float] | None = None, p_primes: int = 0,
                 stats: dict[str, int] | None = None) -> None:
    """Add each block's cost (table units) to ``cost`` at its root.  ``at``: a weight at a
    level (``TimeModel.at``); ``split``: the table prices a base's decomposition apart
    (``block_base``), once per register; ``level``: a register's level as the run has it;
    ``encode``: a block's plaintexts' encoding at a level, in QP or Q, given its products and
    the pairs encoded together (``TimeModel.encode_block``), when the run encodes in the clock; ``p_primes``: the special primes of the key-switching
    basis (the Q-babies rule, module docstring); ``stats`` gets ``q_baby_blocks``, the
    blocks the rule runs with their babies in Q (the executor's ``fused_qbaby_blocks``)."""
    in_q = q_babies(blocks, level, p_primes) if encode is not None and p_primes else set()
    if stats is not None:
        stats["q_baby_blocks"] = len(in_q)
    babies: dict[str, set[tuple[str, int]]] = {}
    q_babies_of: dict[str, set[tuple[str, int]]] = {}
    decomposed: set[str] = set()
    for k, blk in enumerate(blocks):
        lv = level(blk.base)
        fixed = 0.0
        c = 0.0
        if k in in_q:  # a QP block with its babies in Q: products in Q, babies down once
            new_q = blk.babies - q_babies_of.setdefault(blk.base, set())
            fixed = at("block_finish", lv) if split else at("block_fixed", lv)
            c += (at("block_giant", lv) * blk.giants + at("block_product_q", lv) * blk.products
                  + at("block_baby_q", lv) * len(new_q))
            q_babies_of[blk.base] |= new_q
        elif blk.qmode:  # Q mode (planner.ir.fusion): no ModDown per block, babies brought down once
            new_q = blk.babies - q_babies_of.setdefault(blk.base, set())
            c += (at("block_q", lv) + at("block_product_q", lv) * blk.products
                  + at("block_baby_q", lv) * len(new_q))
            q_babies_of[blk.base] |= new_q
        else:
            fixed = at("block_finish", lv) if split else at("block_fixed", lv)
            c += at("block_giant", lv) * blk.giants + at("block_product", lv) * blk.products
        if encode is not None:
            c += encode(lv, not (blk.qmode or k in in_q), blk.products, blk.pairs)
        regs = {r for r, _ in blk.babies} - decomposed  # one decomposition per rotated register
        if split and regs:
            fixed += at("block_base", lv) * len(regs)
        decomposed |= regs
        c += fixed
        if blk.rescaled:
            c += at("rescale", lv)
        new = blk.babies - babies.setdefault(blk.base, set())
        c += at("block_baby", lv) * len(new)
        babies[blk.base] |= new
        cost[blk.root if 0 <= blk.root < len(cost) else len(cost) - 1] += c
