"""Rotom layout notation and every conversion kind, executed in the simulator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.sim import simulate
from planner.ir.builder import LazyTables, ProgramBuilder
from planner.kernels.convert import lowered_conversion_cost, plan_conversion
from planner.layout.channels import natural_layout, view_layout
from planner.layout.rotom import NotationError, parse_layout


def run_conversion(src, dst, seed: int = 0) -> tuple[np.ndarray, dict]:  # noqa: ANN001
    """Pack a random tensor in src, convert, and read every ciphertext back as dst's maps say."""
    S = src.slots
    b = ProgramBuilder(S)
    regs = [b.input("x", f"in/x/{q}", lambda q=q: (src.index_map(q).copy(), None)) for q in range(src.n_ct)]
    conv = plan_conversion(src, dst)
    outs = conv.lower(b, regs, "t")
    for q, r in enumerate(outs):
        b.output(r, "y", f"out/y/{q}", lambda q=q: (dst.index_map(q).copy(), None))
    plan = {"params": {"slots": S, "log_q": [50, 40, 40]}, "program": b.instrs,
            "plaintexts": {n: {"source": p.source, "table": p.table} for n, p in b.plaintexts.items()},
            "outputs": {"y": list(src.shape)}}
    x = np.random.default_rng(seed).uniform(-1, 1, src.shape)
    res = simulate(plan, LazyTables(b.tables), {"x": x})
    # a clean target also means zeros in every slot without an element
    return x, {"y": res.outputs["y"], "conv": conv, "plan": plan}


def test_notation_round_trip_and_figure4_diagonal() -> None:
    lay = parse_layout("roll(1,0) [1:4][0:4]", (4, 4), 16)
    assert lay.notation() == "roll(1,0) [1:4:1][0:4:1]"
    assert parse_layout(lay.notation(), (4, 4), 16) == lay
    # Figure 4: column i of A holds rows (j + i) % 4
    got = lay.index_map(0).reshape(4, 4)
    want = np.array([[(j + i) % 4 * 4 + i for j in range(4)] for i in range(4)])
    assert np.array_equal(got, want)
    assert parse_layout("[R:64];[1:64][0:64]", (64, 64), 4096).n_ct == 64
    assert parse_layout("[4];[0:4][1:4]", (4, 4), 16).n_ct == 4  # "[4]" is [R:4]


@pytest.mark.parametrize(
    "bad",
    ["[0:4]", "[0:4][1:4][2:4]", "[0:4];[1:4];[R:2]", "roll(0,0) [0:4][1:4]", "[0:4][1:x]", "[1:8][0:8]"],
)
def test_bad_notation_is_rejected(bad: str) -> None:
    with pytest.raises(NotationError):
        parse_layout(bad, (4, 4), 16)


@pytest.mark.parametrize(
    ("src", "dst", "shape", "slots", "kind", "max_rot"),
    [
        ("[R:64];[1:64][0:64]", "roll(1,0) [R:64];[1:64][0:64]", (64, 64), 4096, "permute", 63),  # Table 1 rot-roll
        ("[1:64][0:64]", "roll(1,0) [1:64][0:64]", (64, 64), 4096, "permute", 28),  # Table 2 BSGS-roll
        ("[1:64][0:64]", "[0:64][1:64]", (64, 64), 4096, "permute", None),  # transpose
        ("[0:16]", "[R:4][0:16]", (16,), 64, "replicate", 2),
        ("[0:8][1:8]", "[1:8][R:2][0:8]", (8, 8), 128, "permute+replicate", None),
        ("[0:4];[1:16]", "[0:4][1:16]", (4, 16), 64, "permute", 3),  # compaction: whole moves
        ("[1:8][0:12]", "roll(0,1) [0:12][1:8]", (12, 8), 128, "permute", None),  # non power of two
    ],
)
def test_conversions_execute_exactly(src: str, dst: str, shape, slots: int, kind: str, max_rot) -> None:  # noqa: ANN001
    s, d = parse_layout(src, shape, slots), parse_layout(dst, shape, slots)
    x, r = run_conversion(s, d)
    np.testing.assert_array_equal(r["y"], x)
    conv = r["conv"]
    assert conv.kind == kind
    assert conv.cost() == lowered_conversion_cost(conv)
    if max_rot is not None:
        assert conv.cost().rotations <= max_rot


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 12), n=st.integers(1, 12), log_s=st.integers(6, 8),
    a=st.sampled_from(["row", "col", "roll-row", "roll-col"]), b=st.sampled_from(["row", "col", "roll-row", "roll-col"]),
)
def test_random_layout_pairs_convert_exactly(m: int, n: int, log_s: int, a: str, b: str) -> None:
    S = 1 << log_s
    if m * n > 4 * S:
        return

    def make(kind: str):  # noqa: ANN202
        if kind == "row":
            return natural_layout((m, n), S)
        if kind == "col":
            return view_layout((m, n), S, (1, 0))
        if m * n > S:
            return natural_layout((m, n), S)
        text = f"roll(0,1) [0:{m}][1:{n}]" if kind == "roll-row" else f"roll(0,1) [1:{n}][0:{m}]"
        return parse_layout(text, (m, n), S)

    s, d = make(a), make(b)
    x, r = run_conversion(s, d)
    np.testing.assert_array_equal(r["y"], x)
    assert r["conv"].cost() == lowered_conversion_cost(r["conv"])
