"""CinS registers, layouts, kernels and flows (docs/cins.md) against numpy."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.sim import SimulationError, simulate
from planner import ir
from planner.assign.cins_flow import conv_layer, plan_cins_conversion
from planner.frontend.reference import conv2d
from planner.ir.builder import LazyTables, ProgramBuilder
from planner.kernels.cins import cins_conv
from planner.layout import cins
from planner.layout.channels import natural_layout


def _plan(b: ProgramBuilder, outputs: dict[str, list[int]]) -> dict[str, Any]:
    return {
        # a boot object (bootstrap_cins needs one); the flows here do not scale their
        # bootstraps, so the range bound is wide (the pipeline's layers do: test_cins_plans)
        "params": {"slots": b.slots, "log_q": [60] * 30, "boot": {"key_offsets": [], "max_abs": 1e6}},
        "plaintexts": {n: p.to_json() for n, p in b.plaintexts.items()},
        "program": b.instrs,
        "outputs": outputs,
    }


def _gen(lay: Any, q: int):  # noqa: ANN202
    return lambda: (lay.index_map(q).copy(), None)


def run_conv(x_shape, w_shape, slots, stride=1, padding=(1, 1), groups=1, decomposed=False, kind="bsgs", seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, x_shape)
    w = rng.uniform(-1, 1, w_shape)
    k = cins_conv("x", "w", x_shape, w_shape, slots, stride, padding, groups, decomposed, kind)
    b = ProgramBuilder(slots)
    lin, lout = k.in_layout, k.out_layout
    regs = [b.input("x", f"in/{q}", _gen(lin, q), l=lin.l) for q in range(lin.n_ct)]
    outs = k.lower(b, {"x": regs}, "y")
    for q, r in enumerate(outs):
        b.output(r, "y", f"out/{q}", _gen(lout, q))
    res = simulate(_plan(b, {"y": list(lout.shape)}), LazyTables(b.tables), {"x": x, "w": w})
    ref = conv2d(x, w, stride=(stride, stride), padding=padding, groups=groups)
    counts: Counter[str | None] = Counter()
    for raw in b.instrs:
        ins = ir.decode(raw)
        counts[ins.counter] += ins.count()
    return res, ref, counts, k


# ---------------------------------------------------------------------- the encoding


def _T(n: int, slots: int) -> np.ndarray:
    """Lattigo's bit-reversed-input SlotsToCoeffs matrix T_n (NeuJeans 2.3): zeta_{4n}^(5^i rev(j))."""
    rev = cins.bitrev(n)
    e = np.array([pow(5, i, 4 * n) for i in range(n)])
    return np.exp(2j * np.pi * ((e[:, None] * rev[None, :]) % (4 * n)) / (4 * n))


@pytest.mark.parametrize(("slots", "l"), [(16, 4), (32, 8), (32, 2), (64, 16)])
def test_encoding_matches_the_ring(slots: int, l: int) -> None:  # noqa: E741
    """The pair order, Thm 3's coefficient map, the CinS slot vector and T_N/2 = S' blockdiag(T_l)
    (S' l-granular) agree: what Lattigo's C2S returns for the ring polynomial of a cins value."""
    rng = np.random.default_rng(1)
    N = 2 * slots
    m = rng.standard_normal(N)
    a = cins.ring_coefficients(m, l)
    re, im = cins.bootstrap_cins(m, l)
    rev = cins.bitrev(slots)
    # Lattigo's CoeffsToSlots (dft_test.go): slot t holds coefficient rev(t) (+ N/2 in Im)
    np.testing.assert_array_equal(re, a[rev])
    np.testing.assert_array_equal(im, a[rev + slots])
    np.testing.assert_array_equal(cins.to_cins(re, im, l), m)
    # slots of the ring polynomial = T_{N/2} (re + i im)
    zeta = np.exp(1j * np.pi / N)
    e = np.array([pow(5, j, 2 * N) for j in range(slots)])
    w_slots = np.array([np.sum(a * zeta ** ((ej * np.arange(N)) % (2 * N))) for ej in e])
    z = re + 1j * im
    np.testing.assert_allclose(_T(slots, slots) @ z, w_slots, atol=1e-9)
    # CinS slots = blockdiag(T_l) z, and T_{N/2} blockdiag(T_l)^-1 is l-granular
    C = slots // l
    blk = np.kron(np.eye(C), _T(l, slots))
    c = cins.cins_slot_vector(m, l)
    np.testing.assert_allclose(blk @ z, c, atol=1e-9)
    S2 = _T(slots, slots) @ np.linalg.inv(blk)
    for i in range(C):
        for k in range(C):
            B = S2[i * l:(i + 1) * l, k * l:(k + 1) * l]
            np.testing.assert_allclose(B - np.diag(np.diag(B)), 0, atol=1e-8)


def test_slot_product_is_negacyclic_per_slice() -> None:
    rng = np.random.default_rng(2)
    l, slots = 8, 32  # noqa: E741
    x, y = rng.standard_normal(2 * slots), rng.standard_normal(2 * slots)
    prod = cins.cins_slot_vector(x, l) * cins.cins_slot_vector(y, l)
    np.testing.assert_allclose(prod, cins.cins_slot_vector(cins.negacyclic(x, y, l), l), atol=1e-9)
    # schoolbook negacyclic product of slice 0
    L = 2 * l
    ref = np.zeros(L)
    for i in range(L):
        for j in range(L):
            k = i + j
            ref[k % L] += x[i] * y[j] * (-1 if k >= L else 1)
    np.testing.assert_allclose(cins.negacyclic(x, y, l)[:L], ref, atol=1e-9)
    # a slot rotation by k*l rotates the slice sequence
    c = cins.cins_slot_vector(x, l)
    np.testing.assert_allclose(np.roll(c, -3 * l), cins.cins_slot_vector(cins.rotate_slices(x, 3 * l, l), l))


# ---------------------------------------------------------------------- Table 1


@pytest.mark.parametrize("C", [4, 16, 64])
def test_table1_conv_counts(C: int) -> None:
    """C = C_in = C_out channels in one ciphertext: C pmul, 2 sqrt(C) - 2 rotations."""
    slots = C * 32  # 8x8 images padded to 8x8 slices of 2l = 64 (l = 32)
    res, ref, counts, k = run_conv((C, 7, 7), (C, C, 3, 3), slots)
    assert k.in_layout.slices == C and k.in_layout.n_ct == 1
    assert counts["pmul"] == C
    assert counts["rotations"] == 2 * int(round(C**0.5)) - 2 == res.rotations
    np.testing.assert_allclose(res.outputs["y"], ref, atol=1e-9)


def test_table1_depthwise_counts() -> None:
    res, ref, counts, _ = run_conv((16, 7, 7), (16, 1, 3, 3), 16 * 32, groups=16)
    assert counts["pmul"] == 1 and counts["rotations"] == 0
    np.testing.assert_allclose(res.outputs["y"], ref, atol=1e-9)


def test_hs_counts() -> None:
    res, ref, counts, _ = run_conv((16, 7, 7), (16, 16, 3, 3), 16 * 32, kind="hs")
    assert counts["pmul"] == 16 and counts["rotations"] == 15
    np.testing.assert_allclose(res.outputs["y"], ref, atol=1e-9)


# ---------------------------------------------------------------------- random shapes


@st.composite
def conv_cases(draw: Any) -> tuple[Any, ...]:
    groups_kind = draw(st.sampled_from(["dense", "depthwise", "grouped"]))
    C = draw(st.integers(1, 8))
    if groups_kind == "depthwise":
        groups, Co, Cg = C, C * draw(st.integers(1, 2)), 1
    elif groups_kind == "grouped" and C % 2 == 0:
        groups, Co, Cg = 2, 2 * draw(st.integers(1, 3)), C // 2
    else:
        groups, Co, Cg = 1, draw(st.integers(1, 9)), C
    K1, K2 = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    H, W = draw(st.integers(max(K1, 2), 12)), draw(st.integers(max(K2, 2), 12))
    p1, p2 = draw(st.integers(0, K1 // 2 + 1)), draw(st.integers(0, K2 // 2 + 1))
    stride = draw(st.sampled_from([1, 2]))
    decomposed = stride == 2 and draw(st.booleans())
    slots = draw(st.sampled_from([256, 512, 2048]))
    kind = draw(st.sampled_from(["bsgs", "hs"]))
    return (C, H, W), (Co, Cg, K1, K2), slots, stride, (p1, p2), groups, decomposed, kind


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_cases(), st.integers(0, 2**16))
def test_cins_conv_matches_numpy(case: tuple[Any, ...], seed: int) -> None:
    x_shape, w_shape, slots, stride, padding, groups, decomposed, kind = case
    try:
        res, ref, _, _ = run_conv(x_shape, w_shape, slots, stride, padding, groups, decomposed, kind, seed)
    except Exception as e:  # a slice too large for the ring is refused, nothing else
        assert "slots" in str(e) or "cannot hold" in str(e), e
        return
    np.testing.assert_allclose(res.outputs["y"], ref, atol=1e-9, rtol=0)


# ---------------------------------------------------------------------- flows


def _flow(x_shape, w_shape, slots, stride, decomposed, seed=0):  # noqa: ANN202
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, x_shape)
    w = rng.uniform(-1, 1, w_shape)
    b = ProgramBuilder(slots)
    entry = natural_layout(x_shape, slots)
    regs = [b.input("x", f"in/{q}", _gen(entry, q)) for q in range(entry.n_ct)]
    y, k, exit_layout = conv_layer(b, regs, entry, x_shape, w_shape, stride, (1, 1), 1, decomposed)
    for q, r in enumerate(y):
        b.output(r, "y", f"out/{q}", _gen(exit_layout, q))
    res = simulate(_plan(b, {"y": list(k.out_layout.shape)}), LazyTables(b.tables), {"x": x, "w": w})
    ref = conv2d(x, w, stride=(stride, stride), padding=(1, 1))
    return res, ref, k


@pytest.mark.parametrize("decomposed", [False, True])
def test_stride2_layer_flow(decomposed: bool) -> None:
    """Slot input -> to_cins -> conv -> bootstrap_cins -> masked/densified slot output."""
    res, ref, k = _flow((8, 16, 16), (16, 8, 3, 3), 1024, 2, decomposed)
    np.testing.assert_allclose(res.outputs["y"], ref, atol=1e-9)
    assert res.leaked_slots["y"] == 0


def test_decomposed_downsampling_quarters_the_bootstraps() -> None:
    """NeuJeans Alg. 2: a stride-2 layer bootstraps a quarter of the ciphertexts of the
    densify-first flow (both computed and checked against numpy)."""
    shape, wsh, slots = (32, 32, 32), (64, 32, 3, 3), 4096
    dense, ref, kd = _flow(shape, wsh, slots, 2, False)
    dec, _, kc = _flow(shape, wsh, slots, 2, True)
    np.testing.assert_allclose(dense.outputs["y"], ref, atol=1e-9)
    np.testing.assert_allclose(dec.outputs["y"], ref, atol=1e-9)
    assert dense.counts["bootstrap_cins"] == 4 * dec.counts["bootstrap_cins"], (dense.counts, dec.counts)


def test_conversion_kinds_and_costs() -> None:
    k = cins_conv("x", "w", (8, 8, 8), (8, 8, 3, 3), 512, 1, (1, 1))
    lay = natural_layout((8, 8, 8), 512)
    to = plan_cins_conversion(lay, k.in_layout)
    back = plan_cins_conversion(k.out_layout.with_clean(False), lay)
    assert to.kind == "to-cins" and back.kind == "from-cins"
    assert back.cost().rotations >= 0 and to.cost().depth >= 1
    assert plan_cins_conversion(k.in_layout, k.in_layout).kind == "none"


def test_simulator_refuses_mixed_domains() -> None:
    b = ProgramBuilder(16)
    lay = cins.CinSLayout((1, 2, 2), 1, 2, 2, 4, 2, 16, 1)
    a = b.input("x", "in/a", _gen(lay, 0), l=4)
    s = b.input("x", "in/s", lambda: (np.full(16, -1), None))
    b.add(a, s)
    with pytest.raises(SimulationError, match="different domains"):
        simulate(_plan(b, {}), LazyTables(b.tables), {"x": np.ones((1, 2, 2))})
    b2 = ProgramBuilder(16)
    a2 = b2.input("x", "in/a", _gen(lay, 0), l=4)
    b2.rot(a2, 3)
    with pytest.raises(SimulationError, match="not a multiple of l"):
        simulate(_plan(b2, {}), LazyTables(b2.tables), {"x": np.ones((1, 2, 2))})


def test_ir_round_trip() -> None:
    for d in (
        {"op": "to_cins", "dst": "c3", "re": "c1", "im": "c2", "l": 8, "levels": 2},
        {"op": "bootstrap_cins", "dsts": ["c4", "c5"], "src": "c3", "l": 8, "fused": True},
        {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x", "l": 8},
    ):
        assert ir.Instr.from_json(d, slots=64).to_json() == d
    from common.errors import PlanFileError

    with pytest.raises(PlanFileError, match="l must be a positive power of two"):
        ir.Instr.from_json({"op": "to_cins", "dst": "a", "re": "b", "im": "c", "l": 6, "levels": 1})
    from planner.ir.instructions import to_cins_rotations

    assert ir.ToCins("a", "b", "c", 1024, 2).count() == to_cins_rotations(1024, 2) > 0
    # stoc_levels: the SlotsToCoeffs levels a bootstrap_cins gives back (its outputs' depth)
    d = {"op": "bootstrap_cins", "dsts": ["c4", "c5"], "src": "c3", "l": 8, "fused": True, "stoc_levels": 3}
    got = ir.Instr.from_json(d, slots=64)
    assert got.to_json() == d and got.depth({"c3": 5}) == -3
    for bad in (-1, 1.5, True, 99):
        with pytest.raises(PlanFileError, match="field 'stoc_levels'"):
            ir.Instr.from_json({**d, "stoc_levels": bad}, slots=64)


def test_simulator_refuses_levels_the_bootstrap_does_not_give_back() -> None:
    # one conv layer whose bootstrap_cins claims levels above the top: the plan's params
    # name no bootstrapping literal with SlotsToCoeffs levels, so none may be given back
    b = ProgramBuilder(16)
    lay = cins.CinSLayout((1, 2, 2), 1, 2, 2, 4, 2, 16, 1)
    a = b.input("x", "in/a", _gen(lay, 0), l=4)
    b.bootstrap_cins(a, 4, None, stoc_levels=3)
    assert b.depth[b.instrs[-1]["dsts"][0]] == -3
    with pytest.raises(SimulationError, match="field 'stoc_levels': 3 levels given back"):
        simulate(_plan(b, {}), LazyTables(b.tables), {"x": np.ones((1, 2, 2))})
    plan = _plan(b, {})
    plan["params"]["boot"]["literal"] = "N16QP1546H192H32"  # three SlotsToCoeffs levels
    simulate(plan, LazyTables(b.tables), {"x": np.full((1, 2, 2), 0.5)})


def test_registered_families_give_exact_cost_vectors() -> None:
    from planner.assign.candidates import CINS_KERNELS, KERNEL_FAMILIES, KERNELS
    from planner.frontend.graph import load_graph

    assert set(CINS_KERNELS) == {"cins-bsgs", "cins-hs", "cins-dw"} and not set(CINS_KERNELS) & set(KERNELS)
    g = load_graph({
        "schema": "slotplan.graph/1", "name": "c",
        "tensors": {"x": {"shape": [16, 7, 7], "role": "input"}, "w": {"shape": [16, 16, 3, 3], "role": "weight"},
                    "v": {"shape": [16, 1, 3, 3], "role": "weight"}},
        "nodes": [{"id": "y", "op": "conv2d", "inputs": ["x", "w"], "padding": [1, 1]},
                  {"id": "z", "op": "conv2d", "inputs": ["y", "v"], "padding": [1, 1], "groups": 16}],
        "outputs": ["z"],
    })
    y, z = g.nodes
    bsgs = KERNEL_FAMILIES.create("cins-bsgs").cins(g, y, 16 * 32)
    hs = KERNEL_FAMILIES.create("cins-hs").cins(g, y, 16 * 32)
    dw = KERNEL_FAMILIES.create("cins-dw").cins(g, z, 16 * 32)
    assert KERNEL_FAMILIES.create("cins-dw").cins(g, y, 512) == []
    (cb,), (ch,), (cd,) = bsgs, hs, dw
    assert (cb.cost(512).pmul, cb.cost(512).rotations, cb.cost(512).depth) == (16, 6, 1)
    assert (ch.cost(512).pmul, ch.cost(512).rotations) == (16, 15)
    assert (cd.cost(512).pmul, cd.cost(512).rotations, cd.cost(512).plaintexts) == (1, 0, 1)
