"""The Q-babies rule (planner/ir/fusion.py ``q_babies``, written into the plan's ``fused``
annotation as ``babies_in_q`` and obeyed by fused_qbabies.go): which QP blocks a run that
streams its plaintexts evaluates with their babies in Q (products x P + giants x (Q + P) >
fresh babies x 2 (Q + P), per register over all its QP blocks), and what such a block costs
in the time model (planner/cost/blocks.py) against the same block in QP."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.cost.blocks import price_blocks
from planner.ir.fusion import FusedBlock, q_babies


def _blk(base: str, products: int, giants: int, betas: tuple[int, ...], root: int, qmode: bool = False) -> FusedBlock:
    return FusedBlock(base, products, giants, frozenset((base, b) for b in betas), False, qmode, root)


def test_rule_at_its_boundary() -> None:
    # one register, two babies, q = 10 primes (level 9), p = 5: pays when 5 x products + 15 x
    # giants > 2 x 2 x 15 = 60
    level = {"x": 9}.__getitem__
    assert q_babies([_blk("x", 12, 0, (1, 2), 0)], level, 5) == set()  # 60, not more
    assert q_babies([_blk("x", 13, 0, (1, 2), 0)], level, 5) == {0}
    assert q_babies([_blk("x", 9, 1, (1, 2), 0)], level, 5) == set()  # 45 + 15 = 60: no
    assert q_babies([_blk("x", 10, 1, (1, 2), 0)], level, 5) == {0}  # 50 + 15 = 65
    # the work of every QP block on the register counts, at each block
    two = [_blk("x", 7, 0, (1,), 0), _blk("x", 6, 0, (2,), 1)]
    assert q_babies(two, level, 5) == {0, 1}
    # at level 0 (q = 1) a baby's ModDowns are cheaper: 60 + 6 > 2 x 2 x 6
    assert q_babies([_blk("x", 12, 1, (1, 2), 0)], {"x": 0}.__getitem__, 5) == {0}


def test_q_mode_blocks_do_not_count_but_bring_babies_down() -> None:
    level = {"x": 9}.__getitem__
    # a Q-mode block's products are not QP work; its babies come down (pooled): the QP
    # block after it finds no fresh baby and pays
    blocks = [_blk("x", 50, 0, (1, 2), 0, qmode=True), _blk("x", 1, 0, (1, 2), 1)]
    assert q_babies(blocks, level, 5) == {1}
    # alone, the same QP block does not pay
    assert q_babies(blocks[1:], level, 5) == set()


def test_a_register_brought_down_in_place_serves_q_babies_only() -> None:
    # block 0 on x pays and brings x's babies down in place; block 1 reads x and y, and y
    # alone would not pay: the executor runs it with Q babies all the same
    level = {"x": 9, "y": 9}.__getitem__
    b0 = _blk("x", 40, 0, (1, 2), 0)
    b1 = FusedBlock("y", 1, 0, frozenset({("y", 3), ("y", 4), ("x", 1)}), False, False, 1)
    assert q_babies([b0, b1], level, 5) == {0, 1}
    assert q_babies([b1], level, 5) == set()


def test_a_q_babies_block_is_priced_with_q_products_and_q_encoding() -> None:
    weights = {"block_finish": 10.0, "block_fixed": 10.0, "block_giant": 7.0, "block_product": 2.0,
               "block_product_q": 1.0, "block_baby": 3.0, "block_baby_q": 4.0, "block_base": 5.0,
               "block_q": 1.0, "rescale": 1.0}

    def at(k: str, lv: int) -> float:
        return weights[k]

    def encode(lv: int, qp: bool, products: int, pairs: int) -> float:
        # one plaintext 0.5 in QP, 0.25 in Q; a pair of them 0.6 / 0.3
        one, pair = (0.5, 0.6) if qp else (0.25, 0.3)
        return one * (products - 2 * pairs) + pair * pairs

    blk = _blk("x", 20, 2, (1, 2), 0)
    level = {"x": 9}.__getitem__
    streamed, cached, no_p = [0.0], [0.0], [0.0]
    price_blocks(at, True, [blk], level, streamed, encode, p_primes=5)
    price_blocks(at, True, [blk], level, cached, None, p_primes=5)
    price_blocks(at, True, [blk], level, no_p, encode, p_primes=0)
    # QP (no P primes given: the rule is off): finish 10 + giants 14 + products 40 + base 5 +
    # babies 6 + encodings 20 x 0.5
    assert no_p[0] == 10 + 14 + 40 + 5 + 6 + 10
    # not streamed: the plaintexts are cached, the executor keeps QP
    assert cached[0] == 10 + 14 + 40 + 5 + 6
    # Q babies: products 20 x 1, babies brought down 2 x 4, encodings 20 x 0.25
    assert streamed[0] == 10 + 14 + 20 + 8 + 5 + 6 + 5
    # the same block with 9 pairs of consecutive products (giant steps of odd length leave
    # two alone): encodings 9 x 0.3 + 2 x 0.25 in Q
    paired = [0.0]
    price_blocks(at, True, [replace(blk, pairs=9)], level, paired, encode, p_primes=5)
    assert paired[0] == pytest.approx(10 + 14 + 20 + 8 + 5 + 6 + 9 * 0.3 + 2 * 0.25)


@pytest.mark.parametrize(("products", "giants", "babies", "q", "p", "pays"), [
    (567, 15, 16, 6, 5, True),    # ResNet-20's s2b2_ca at level 5 (n16boot)
    (1134, 30, 16, 8, 5, True),   # s3b1_ca at level 7
    (26, 1, 16, 4, 5, False),     # a small block bringing a whole base down
    (26, 1, 0, 4, 5, True),       # ... whose base has no baby to bring down
    (12, 2, 3, 5, 1, False),      # a 3-baby BSGS on a test ring (one P prime)
])
def test_rule_on_measured_shapes(products: int, giants: int, babies: int, q: int, p: int, pays: bool) -> None:
    blk = _blk("x", products, giants, tuple(range(1, babies + 1)), 0)
    assert (q_babies([blk], {"x": q - 1}.__getitem__, p) == {0}) is pays
