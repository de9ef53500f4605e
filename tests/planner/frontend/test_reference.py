"""The numpy reference against independent implementations."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import ValuesError
from planner.frontend.graph import SCHEMA, Graph, parse_graph
from planner.frontend.reference import random_values, reference

F64 = npt.NDArray[np.float64]


def conv2d_loops(x: F64, w: F64, stride: tuple[int, int], padding: tuple[int, int], groups: int) -> F64:
    """Brute-force torch.nn.functional.conv2d (one image): explicit loops, explicit bounds
    checks for the zero padding."""
    c, h, wd = x.shape
    co, cg, k1, k2 = w.shape
    s1, s2 = stride
    p1, p2 = padding
    ho = (h + 2 * p1 - k1) // s1 + 1
    wo = (wd + 2 * p2 - k2) // s2 + 1
    out = np.zeros((co, ho, wo))
    per_group = co // groups
    for o in range(co):
        g = o // per_group
        for i in range(ho):
            for j in range(wo):
                acc = 0.0
                for ci in range(cg):
                    for a in range(k1):
                        for b in range(k2):
                            r = i * s1 + a - p1
                            q = j * s2 + b - p2
                            if 0 <= r < h and 0 <= q < wd:
                                acc += w[o, ci, a, b] * x[g * cg + ci, r, q]
                out[o, i, j] = acc
    return out


def graph_of(
    tensors: dict[str, tuple[list[int], str]], nodes: list[dict[str, Any]], outputs: list[str]
) -> Graph:
    return parse_graph(
        {
            "schema": SCHEMA,
            "name": "t",
            "tensors": {k: {"shape": s, "role": r} for k, (s, r) in tensors.items()},
            "nodes": nodes,
            "outputs": outputs,
        }
    )


@st.composite
def conv_cases(draw: st.DrawFn) -> tuple[list[int], list[int], list[int], list[int], int]:
    groups = draw(st.integers(1, 3))
    cg = draw(st.integers(1, 3))
    og = draw(st.integers(1, 3))
    k1 = draw(st.integers(1, 5))
    k2 = draw(st.integers(1, 5))
    p1 = draw(st.integers(0, 2))
    p2 = draw(st.integers(0, 2))
    s1 = draw(st.integers(1, 2))
    s2 = draw(st.integers(1, 2))
    h = draw(st.integers(max(1, k1 - 2 * p1), 9))
    w = draw(st.integers(max(1, k2 - 2 * p2), 9))
    return [groups * cg, h, w], [groups * og, cg, k1, k2], [s1, s2], [p1, p2], groups


@settings(max_examples=150, deadline=None)
@given(conv_cases(), st.integers(0, 2**32 - 1))
def test_conv2d_matches_brute_force(
    case: tuple[list[int], list[int], list[int], list[int], int], seed: int
) -> None:
    xs, ws, stride, padding, groups = case
    g = graph_of(
        {"x": (xs, "input"), "w": (ws, "weight")},
        [
            {
                "id": "y",
                "op": "conv2d",
                "inputs": ["x", "w"],
                "stride": stride,
                "padding": padding,
                "groups": groups,
            }
        ],
        ["y"],
    )
    vals = random_values(g, seed)
    got = reference(g, vals)["y"]
    want = conv2d_loops(vals["x"], vals["w"], (stride[0], stride[1]), (padding[0], padding[1]), groups)
    assert got.shape == want.shape == g.shape("y")
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_conv2d_hand_example() -> None:
    # 1 channel 3x3 input 1..9, 2x2 kernel of ones, padding 1, stride 2 (torch gives this)
    g = graph_of(
        {"x": ([1, 3, 3], "input"), "w": ([1, 1, 2, 2], "weight")},
        [{"id": "y", "op": "conv2d", "inputs": ["x", "w"], "stride": [2, 2], "padding": [1, 1]}],
        ["y"],
    )
    x = np.arange(1, 10, dtype=float).reshape(1, 3, 3)
    y = reference(g, {"x": x, "w": np.ones((1, 1, 2, 2))})["y"]
    np.testing.assert_array_equal(y, [[[1, 5], [11, 28]]])


def test_conv2d_depthwise_and_cross_correlation() -> None:
    # not flipped (cross-correlation): kernel [[1, 0], [0, 0]] picks the top-left element
    g = graph_of(
        {"x": ([2, 3, 3], "input"), "w": ([2, 1, 2, 2], "weight")},
        [{"id": "y", "op": "conv2d", "inputs": ["x", "w"], "groups": 2}],
        ["y"],
    )
    x = np.arange(18, dtype=float).reshape(2, 3, 3)
    w = np.zeros((2, 1, 2, 2))
    w[0, 0, 0, 0] = 1.0
    w[1, 0, 1, 1] = 2.0
    y = reference(g, {"x": x, "w": w})["y"]
    np.testing.assert_array_equal(y[0], x[0, :2, :2])
    np.testing.assert_array_equal(y[1], 2 * x[1, 1:, 1:])


ALL_OPS = graph_of(
    {
        "W": ([6, 4], "weight"),
        "v": ([4], "input"),
        "A": ([3, 4], "input"),
        "B": ([4, 5], "weight"),
        "C": ([3, 5], "weight"),
    },
    [
        {"id": "mv", "op": "matvec", "inputs": ["W", "v"]},
        {"id": "mm", "op": "matmul", "inputs": ["A", "B"]},
        {"id": "ad", "op": "add", "inputs": ["mm", "C"]},
        {"id": "sb", "op": "sub", "inputs": ["C", "ad"]},
        {"id": "ml", "op": "mul", "inputs": ["sb", "mm"]},
        {"id": "pl", "op": "poly", "inputs": ["ml"], "coeffs": [0.5, -1.0, 0.25, 2.0]},
        {"id": "s0", "op": "sum", "inputs": ["pl"], "axis": -2},
        {"id": "s1", "op": "sum", "inputs": ["s0"], "axis": 0},
        {"id": "tr", "op": "transpose", "inputs": ["pl"]},
        {"id": "rs", "op": "reshape", "inputs": ["tr"], "shape": [3, -1]},
        {"id": "t3", "op": "reshape", "inputs": ["mm"], "shape": [5, 3, 1]},
        {"id": "tp", "op": "transpose", "inputs": ["t3"], "perm": [2, 0, 1]},
    ],
    ["mv", "s1", "rs", "tp"],
)


def test_other_ops_against_numpy() -> None:
    vals = random_values(ALL_OPS, 3)
    out = reference(ALL_OPS, vals)
    W, v, A, B, C = (vals[k] for k in ("W", "v", "A", "B", "C"))
    np.testing.assert_allclose(out["mv"], W @ v)
    mm = A @ B
    np.testing.assert_allclose(out["mm"], mm)
    np.testing.assert_allclose(out["ad"], mm + C)
    np.testing.assert_allclose(out["sb"], C - (mm + C))
    ml = (C - (mm + C)) * mm
    np.testing.assert_allclose(out["ml"], ml)
    pl = np.polynomial.polynomial.polyval(ml, [0.5, -1.0, 0.25, 2.0])
    np.testing.assert_allclose(out["pl"], pl, rtol=1e-12)
    np.testing.assert_allclose(out["s0"], pl.sum(axis=0))
    np.testing.assert_allclose(out["s1"], [pl.sum()])
    assert out["s1"].shape == (1,)
    np.testing.assert_allclose(out["tr"], pl.T)
    np.testing.assert_allclose(out["rs"], pl.T.reshape(3, 5))  # row-major
    np.testing.assert_allclose(out["tp"], np.transpose(mm.reshape(5, 3, 1), (2, 0, 1)))
    for name, arr in out.items():
        assert arr.dtype == np.float64 and arr.shape == ALL_OPS.shape(name)
    assert set(out) == set(ALL_OPS.tensors)


def test_poly_horner_constant_and_degree() -> None:
    g = graph_of(
        {"x": ([5], "input")},
        [
            {"id": "c", "op": "poly", "inputs": ["x"], "coeffs": [3]},
            {"id": "q", "op": "poly", "inputs": ["x"], "coeffs": [0, 0, 1]},
        ],
        ["c", "q"],
    )
    x = np.linspace(-1, 1, 5)
    out = reference(g, {"x": x})
    np.testing.assert_array_equal(out["c"], np.full(5, 3.0))
    np.testing.assert_allclose(out["q"], x**2)


def test_reference_accepts_integer_arrays_and_lists() -> None:
    g = graph_of(
        {"x": ([2], "input"), "w": ([2], "weight")}, [{"id": "y", "op": "mul", "inputs": ["x", "w"]}], ["y"]
    )
    out = reference(g, {"x": np.array([1, 2]), "w": [3.0, 4.0], "extra": np.zeros(9)})
    np.testing.assert_array_equal(out["y"], [3.0, 8.0])
    assert "extra" not in out


def test_reference_value_errors() -> None:
    g = graph_of(
        {"x": ([2], "input"), "w": ([2], "weight")}, [{"id": "y", "op": "mul", "inputs": ["x", "w"]}], ["y"]
    )
    with pytest.raises(ValuesError) as info:
        reference(g, {"x": np.zeros(2)})
    assert info.value.tensor == "w"
    with pytest.raises(ValuesError, match=r"shape \(3,\)"):
        reference(g, {"x": np.zeros(3), "w": np.zeros(2)})
    with pytest.raises(ValuesError, match="real numbers"):
        reference(g, {"x": np.zeros(2, dtype=complex), "w": np.zeros(2)})


def test_random_values_seeded_and_in_range() -> None:
    a = random_values(ALL_OPS, 11)
    b = random_values(ALL_OPS, 11)
    c = random_values(ALL_OPS, 12)
    assert sorted(a) == ["A", "B", "C", "W", "v"]
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
        assert a[k].shape == ALL_OPS.shape(k) and a[k].dtype == np.float64
        assert (a[k] >= -1).all() and (a[k] < 1).all()
    assert any(not np.array_equal(a[k], c[k]) for k in a)
    # sorted-name order: the first tensor drawn is "A"
    rng = np.random.default_rng(11)
    np.testing.assert_array_equal(a["A"], rng.uniform(-1, 1, size=(3, 4)))


def test_random_values_independent_of_file_order() -> None:
    t1 = {"b": ([3], "input"), "a": ([3], "weight")}
    t2 = {"a": ([3], "weight"), "b": ([3], "input")}
    node = [{"id": "y", "op": "add", "inputs": ["a", "b"]}]
    v1 = random_values(graph_of(t1, node, ["y"]), 5)
    v2 = random_values(graph_of(t2, node, ["y"]), 5)
    for k in v1:
        np.testing.assert_array_equal(v1[k], v2[k])


def test_plaintext_only_graph_evaluates() -> None:
    g = graph_of({"w": ([2, 2], "weight")}, [{"id": "y", "op": "matmul", "inputs": ["w", "w"]}], ["y"])
    vals = random_values(g, 0)
    np.testing.assert_allclose(reference(g, vals)["y"], vals["w"] @ vals["w"])


def test_fan_in_init_scales_weights_by_contracted_size() -> None:
    g = graph_of(
        {"x": ([3, 8, 8], "input"), "w": ([4, 3, 3, 3], "weight"), "b": ([4, 6, 6], "weight"),
         "M": ([5, 144], "weight")},
        [{"id": "y", "op": "conv2d", "inputs": ["x", "w"]},
         {"id": "z", "op": "add", "inputs": ["y", "b"]},
         {"id": "f", "op": "reshape", "inputs": ["z"], "shape": [144]},
         {"id": "o", "op": "matvec", "inputs": ["M", "f"]}],
        ["o"],
    )
    u = random_values(g, 5)
    v = random_values(g, 5, "fan-in")
    np.testing.assert_allclose(v["w"], u["w"] / np.sqrt(27))
    np.testing.assert_allclose(v["M"], u["M"] / 12.0)
    np.testing.assert_array_equal(v["b"], u["b"])  # element-wise operand: unscaled
    np.testing.assert_array_equal(v["x"], u["x"])  # inputs are never scaled
