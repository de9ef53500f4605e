"""planner.kernels.convert on arbitrary layouts (random index maps over several ciphertexts):
every conversion, simulated, moves each element exactly where the target's maps say (the
numpy gather of the same maps), a clean target holds zeros elsewhere even when the source
is dirty, the analytic cost equals the lowered program's, and the BSGS split is the best
of every baby range for its stride."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from backends.sim import simulate
from planner.ir.builder import LazyTables, ProgramBuilder
from planner.kernels.convert import (
    _bsgs_counts,
    _choose_n1,
    _moves,
    _replication,
    _split_replication,
    _steps,
    lowered_conversion_cost,
    plan_conversion,
    same_placement,
)
from planner.layout.channels import MappedLayout, all_maps


def random_layout(rng: np.random.Generator, size: int, slots: int, n_ct: int, clean: bool) -> MappedLayout:
    """Elements 0..size-1 each at one random (ciphertext, slot)."""
    cells = rng.choice(n_ct * slots, size, replace=False)
    maps = np.full(n_ct * slots, -1, dtype=np.int64)
    maps[cells] = np.arange(size)
    return MappedLayout.of((size,), maps.reshape(n_ct, slots), clean, "random")


def convert(src: Any, dst: Any, seed: int) -> tuple[np.ndarray, Any, Any]:
    """Pack a random vector in ``src`` (a dirty source gets garbage in its free slots),
    convert to ``dst``, read the result through ``dst``'s maps: (x, simulation, conversion)."""
    S = src.slots
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, src.size)
    garbage = {}
    if not src.clean:  # the free slots hold other elements (what a dirty kernel leaves)
        for q in range(src.n_ct):
            m = src.index_map(q).copy()
            free = m < 0
            m[free] = rng.integers(0, src.size, int(free.sum()))
            garbage[q] = m
    b = ProgramBuilder(S)
    regs = [b.input("x", f"in/{q}", lambda q=q: (garbage.get(q, src.index_map(q)).copy(), None))
            for q in range(src.n_ct)]
    conv = plan_conversion(src, dst)
    outs = conv.lower(b, regs, "t")
    for q, r in enumerate(outs):
        b.output(r, "y", f"out/{q}", lambda q=q: (dst.index_map(q).copy(), None))
    plan = {"params": {"slots": S, "log_q": [50, 40, 40]}, "program": b.instrs,
            "plaintexts": {n: p.to_json() for n, p in b.plaintexts.items()}, "outputs": {"y": [src.size]}}
    return x, simulate(plan, LazyTables(b.tables), {"x": x}), conv


def _check(src: Any, dst: Any, seed: int) -> Any:
    x, res, conv = convert(src, dst, seed)
    np.testing.assert_array_equal(res.outputs["y"], x)
    if dst.clean:
        assert res.leaked_slots["y"] == 0
    assert conv.cost() == lowered_conversion_cost(conv)
    assert conv.cost().rotations == res.rotations
    return conv


@pytest.mark.parametrize("seed", range(24))
def test_random_permutations_move_every_element(seed: int) -> None:
    rng = np.random.default_rng(seed)
    S = int(rng.choice([16, 32, 64]))
    n_src, n_dst = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    size = int(rng.integers(1, min(n_src, n_dst) * S + 1))
    src = random_layout(rng, size, S, n_src, clean=bool(rng.integers(0, 2)))
    dst = random_layout(rng, size, S, n_dst, clean=bool(rng.integers(0, 2)))
    conv = _check(src, dst, seed)
    assert conv.kind in ("permute", "permute+replicate", "none", "mask")


@pytest.mark.parametrize("seed", range(8))
def test_same_placement_is_free_or_one_mask(seed: int) -> None:
    rng = np.random.default_rng(seed)
    src = random_layout(rng, 20, 16, 2, clean=False)
    assert same_placement(src, src.with_clean(True))
    assert plan_conversion(src, src.with_clean(True)).kind == "mask"
    conv = _check(src, src.with_clean(True), seed)
    assert conv.cost().pmul == 2 and conv.cost().rotations == 0
    assert plan_conversion(src.with_clean(True), src).kind == "none"  # clean where dirty is allowed
    assert plan_conversion(src, src).kind == "none"


@pytest.mark.parametrize(("m", "period"), [(2, 8), (3, 5), (4, 4), (5, 3)])
def test_replication_is_rotate_and_add(m: int, period: int) -> None:
    """dst = src plus m - 1 copies of every ciphertext at a constant period: a replicate
    conversion, floor(log2 m) + popcount(m) - 1 rotations per ciphertext."""
    S, n = 32, 3
    src_maps = np.full((2, S), -1, dtype=np.int64)
    src_maps[0, :n] = np.arange(n)
    src_maps[1, 1:1 + n] = np.arange(n, 2 * n)
    dst_maps = src_maps.copy()
    for q in range(2):
        s = np.nonzero(src_maps[q] >= 0)[0]
        for r in range(1, m):
            dst_maps[q, s + r * period] = src_maps[q, s]
    src = MappedLayout.of((2 * n,), src_maps, True, "src")
    dst = MappedLayout.of((2 * n,), dst_maps, True, "rep")
    assert _replication(src, dst) == (m, period)
    conv = _check(src, dst, 0)
    assert conv.kind == "replicate"
    want = (m.bit_length() - 1) + bin(m).count("1") - 1
    assert conv.cost().rotations == 2 * want
    # from a dirty source the copies would carry garbage: permute into the first copies, then replicate
    assert plan_conversion(src.with_clean(False), dst).kind == "permute+replicate"
    _check(src.with_clean(False), dst, 1)
    first, mm, pp = _split_replication(dst)  # type: ignore[misc]
    assert (mm, pp) == (m, period) and np.array_equal(all_maps(first), src_maps)


def test_whole_ciphertext_moves_need_no_mask() -> None:
    """A clean source whose every element moves by one offset into the target: one rotation,
    no pmul (Rotom's rot-roll / compaction)."""
    S = 16
    src_maps = np.full((2, S), -1, dtype=np.int64)
    src_maps[0, :4], src_maps[1, :4] = np.arange(4), np.arange(4, 8)
    dst_maps = np.full((1, S), -1, dtype=np.int64)
    dst_maps[0, :4], dst_maps[0, 8:12] = np.arange(4), np.arange(4, 8)
    src = MappedLayout.of((8,), src_maps, True, "two")
    dst = MappedLayout.of((8,), dst_maps, True, "one")
    conv = _check(src, dst, 0)
    assert conv.kind == "permute" and conv.cost().pmul == 0 and conv.cost().rotations == 1
    # a dirty source cannot be added whole into a clean target: masked instead
    dirty = _check(src.with_clean(False), dst, 0)
    assert dirty.cost().pmul == 2


@pytest.mark.parametrize("seed", range(10))
def test_the_chosen_split_is_the_fewest_rotations_for_its_stride(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    S = 64
    src = random_layout(rng, 40, S, 2, clean=True)
    dst = random_layout(rng, 40, S, 2, clean=True)
    mv = _moves(src, dst)
    c, n1 = _choose_n1(mv)
    assert c in _steps(mv)
    chosen = sum(_bsgs_counts(mv, (c, n1))[:2])
    for step in _steps(mv):
        for e in range(S.bit_length()):
            assert chosen <= sum(_bsgs_counts(mv, (step, 1 << e))[:2])


def test_a_transposition_uses_a_strided_split() -> None:
    """Transposing a 16 x 16 matrix in 256 slots moves elements by multiples of 15: the
    chosen step is odd and not 1, and far fewer rotations than the 31 diagonals."""
    S, r = 256, 16
    src = MappedLayout.of((r * r,), np.arange(S, dtype=np.int64)[None, :], True, "rows")
    dst = MappedLayout.of((r * r,), np.arange(S, dtype=np.int64).reshape(r, r).T.reshape(1, S).copy(), True, "cols")
    conv = _check(src, dst, 0)
    c, _ = _choose_n1(_moves(src, dst))
    assert c != 1 and c % 2 == 1
    assert conv.cost().rotations < 2 * r - 1


def test_sizes_must_match() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="cannot convert"):
        plan_conversion(random_layout(rng, 5, 16, 1, True), random_layout(rng, 6, 16, 1, True))
