"""The ops added for whole models (SPEC section 2): broadcasting add/sub/mul, slice, concat,
batched matmul, sum with keepdims, Chebyshev poly.  Validation (one error naming the node
and the rule) and the numpy reference (against numpy written out independently)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from common.errors import GraphError
from planner.frontend.graph import parse_graph
from planner.frontend.reference import random_values, reference


def graph(tensors: dict[str, tuple[list[int], str]], nodes: list[dict[str, Any]], outputs: list[str]) -> dict[str, Any]:
    return {
        "schema": "slotplan.graph/1",
        "name": "g",
        "tensors": {k: {"shape": s, "role": r} for k, (s, r) in tensors.items()},
        "nodes": nodes,
        "outputs": outputs,
    }


def one(op: str, tensors: dict[str, list[int]], inputs: list[str], **attrs: Any) -> dict[str, Any]:
    return graph({k: (v, "input") for k, v in tensors.items()}, [{"id": "n1", "op": op, "inputs": inputs, **attrs}],
                 ["n1"])


def run(d: dict[str, Any], seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    g = parse_graph(d)
    vals = random_values(g, seed)
    return vals, reference(g, vals)


# ------------------------------------------------------------------ shapes and validation


@pytest.mark.parametrize(
    ("a", "b", "out"),
    [
        ([4, 5], [5], (4, 5)),  # a bias onto rows
        ([3, 6, 7], [3, 1, 1], (3, 6, 7)),  # a per-channel value
        ([1, 5], [4, 1], (4, 5)),  # both stretch
        ([5], [2, 3, 5], (2, 3, 5)),
        ([1], [7], (7,)),
    ],
)
def test_broadcast_shapes(a: list[int], b: list[int], out: tuple[int, ...]) -> None:
    for op in ("add", "sub", "mul"):
        g = parse_graph(one(op, {"a": a, "b": b}, ["a", "b"]))
        assert g.shape("n1") == out
        vals, ref = run(one(op, {"a": a, "b": b}, ["a", "b"]))
        want = {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op](vals["a"], vals["b"])
        np.testing.assert_array_equal(ref["n1"], want)


@pytest.mark.parametrize(
    ("a", "b", "out"),
    [
        ([2, 3, 4], [2, 4, 5], (2, 3, 5)),
        ([3, 4], [2, 4, 5], (2, 3, 5)),  # a 2-D operand broadcast against a 3-D one
        ([2, 3, 4], [4, 5], (2, 3, 5)),
        ([1, 3, 4], [2, 4, 5], (2, 3, 5)),
        ([2, 2, 3, 4], [2, 1, 4, 5], (2, 2, 3, 5)),
        ([3, 4], [4, 5], (3, 5)),
    ],
)
def test_batched_matmul(a: list[int], b: list[int], out: tuple[int, ...]) -> None:
    d = one("matmul", {"a": a, "b": b}, ["a", "b"])
    assert parse_graph(d).shape("n1") == out
    vals, ref = run(d)
    A, B = vals["a"], vals["b"]
    # independent: per batch entry, with numpy's batch broadcasting written out
    batch = out[:-2]
    want = np.zeros(out)
    for idx in np.ndindex(*batch):
        ia = tuple(i if d_ > 1 else 0 for i, d_ in zip(idx[len(idx) - (A.ndim - 2):], A.shape[:-2], strict=True))
        ib = tuple(i if d_ > 1 else 0 for i, d_ in zip(idx[len(idx) - (B.ndim - 2):], B.shape[:-2], strict=True))
        want[idx] = A[ia] @ B[ib]
    np.testing.assert_allclose(ref["n1"], want, rtol=1e-12, atol=1e-12)


def test_slice_concat_sum_keepdims() -> None:
    d = graph(
        {"x": ([3, 5, 4], "input"), "y": ([3, 2, 4], "input")},
        [
            {"id": "s", "op": "slice", "inputs": ["x"], "axis": 1, "start": -4, "stop": 100},
            {"id": "c", "op": "concat", "inputs": ["y", "s", "y"], "axis": 1},
            {"id": "k", "op": "sum", "inputs": ["c"], "axis": 2, "keepdims": True},
            {"id": "n", "op": "sum", "inputs": ["c"], "axis": 2, "keepdims": False},
        ],
        ["c", "k", "n"],
    )
    g = parse_graph(d)
    assert g.shape("s") == (3, 4, 4) and (g.node("s").start, g.node("s").stop) == (1, 5)
    assert g.shape("c") == (3, 8, 4) and g.shape("k") == (3, 8, 1) and g.shape("n") == (3, 8)
    vals, ref = run(d)
    x, y = vals["x"], vals["y"]
    np.testing.assert_array_equal(ref["s"], x[:, 1:5, :])
    np.testing.assert_array_equal(ref["c"], np.concatenate([y, x[:, 1:, :], y], axis=1))
    np.testing.assert_array_equal(ref["k"], ref["c"].sum(axis=2, keepdims=True))
    np.testing.assert_array_equal(ref["n"], ref["c"].sum(axis=2))
    # keepdims false is the default: omitted from the canonical form (old graphs keep their hash)
    assert "keepdims" not in g.node("n").to_json() and g.node("k").to_json()["keepdims"] is True


def test_chebyshev_poly_reference() -> None:
    coeffs = [0.3, -1.2, 0.5, 0.25, -0.125]
    d = one("poly", {"x": [50]}, ["x"], coeffs=coeffs, basis="chebyshev", domain=[-3.0, 5.0])
    g = parse_graph(d)
    assert g.node("n1").basis == "chebyshev" and g.node("n1").domain == (-3.0, 5.0)
    vals, ref = run(d)
    t = (2 * vals["x"] - 2.0) / 8.0
    # T_0..T_4 by the three-term recurrence
    T = [np.ones_like(t), t]
    for _ in range(3):
        T.append(2 * t * T[-1] - T[-2])
    want = sum(c * Ti for c, Ti in zip(coeffs, T, strict=True))
    np.testing.assert_allclose(ref["n1"], want, rtol=1e-13, atol=1e-13)
    # "monomial" spelled out is the default and canonicalises away
    mono = parse_graph(one("poly", {"x": [5]}, ["x"], coeffs=[1.0, 2.0], basis="monomial"))
    assert mono == parse_graph(one("poly", {"x": [5]}, ["x"], coeffs=[1.0, 2.0]))


@pytest.mark.parametrize(
    ("name", "doc", "field", "text"),
    [
        ("bcast mismatch", one("add", {"a": [4, 3], "b": [4]}, ["a", "b"]), "inputs", "broadcasts as numpy"),
        ("slice empty", one("slice", {"x": [4, 3]}, ["x"], axis=0, start=3, stop=2), "stop", "empty slice"),
        ("slice past", one("slice", {"x": [4, 3]}, ["x"], axis=0, start=7, stop=9), "stop", "empty slice"),
        ("slice axis", one("slice", {"x": [4, 3]}, ["x"], axis=2, start=0, stop=1), "axis", "out of range"),
        ("slice no stop", one("slice", {"x": [4]}, ["x"], axis=0, start=0), "stop", "requires attribute 'stop'"),
        ("slice keepdims", one("slice", {"x": [4]}, ["x"], axis=0, start=0, stop=1, keepdims=True), "keepdims",
         "not allowed for op slice"),
        ("concat dims", one("concat", {"a": [2, 3], "b": [3, 3]}, ["a", "b"], axis=1), "inputs[1]",
         "equal dims off the axis"),
        ("concat rank", one("concat", {"a": [2, 3], "b": [3]}, ["a", "b"], axis=0), "inputs[1]", "equal ranks"),
        ("concat none", one("concat", {}, [], axis=0), "inputs", "concat expects 1..1024 inputs"),
        ("concat axis", one("concat", {"a": [2]}, ["a"]), "axis", "requires attribute 'axis'"),
        ("matmul batch", one("matmul", {"a": [2, 3, 4], "b": [3, 4, 5]}, ["a", "b"]), "inputs", "do not broadcast"),
        ("matmul k", one("matmul", {"a": [2, 3, 4], "b": [2, 3, 5]}, ["a", "b"]), "inputs", "shape mismatch"),
        ("matmul rank5", one("matmul", {"a": [1, 1, 1, 3, 4], "b": [4, 5]}, ["a", "b"]), "inputs[0]", "rank 2..4"),
        ("cheb no domain", one("poly", {"x": [4]}, ["x"], coeffs=[1.0], basis="chebyshev"), "domain",
         "requires domain"),
        ("cheb bad domain", one("poly", {"x": [4]}, ["x"], coeffs=[1.0], basis="chebyshev", domain=[1.0, 1.0]),
         "domain", "finite a < b"),
        ("cheb domain len", one("poly", {"x": [4]}, ["x"], coeffs=[1.0], basis="chebyshev", domain=[1.0]),
         "domain", "must be [a, b]"),
        ("mono domain", one("poly", {"x": [4]}, ["x"], coeffs=[1.0], domain=[0.0, 1.0]), "domain",
         "only meaningful with basis 'chebyshev'"),
        ("basis name", one("poly", {"x": [4]}, ["x"], coeffs=[1.0], basis="legendre"), "basis", "must be"),
        ("keepdims type", one("sum", {"x": [4]}, ["x"], axis=0, keepdims=1), "keepdims", "bool"),
    ],
)
def test_invalid(name: str, doc: dict[str, Any], field: str, text: str) -> None:
    with pytest.raises(GraphError) as e:
        parse_graph(doc)
    assert e.value.node == "n1", name
    assert e.value.field == field, (name, str(e.value))
    assert text in str(e.value), (name, str(e.value))
    assert "\n" not in str(e.value)


def test_random_shapes_against_numpy() -> None:
    """Seeded random shapes for every new op: the reference agrees with numpy."""
    rng = np.random.default_rng(7)
    for _ in range(60):
        rank = int(rng.integers(1, 4))
        shape = [int(v) for v in rng.integers(1, 6, rank)]
        bshape = [d if rng.random() < 0.5 else 1 for d in shape][int(rng.integers(0, rank)):] or [1]
        axis = int(rng.integers(-rank, rank))
        dim = shape[axis]
        start = int(rng.integers(0, dim))
        stop = int(rng.integers(start + 1, dim + 1))
        d = graph(
            {"x": (shape, "input"), "b": (bshape, "weight")},
            [
                {"id": "m", "op": "mul", "inputs": ["b", "x"]},
                {"id": "s", "op": "slice", "inputs": ["m"], "axis": axis, "start": start, "stop": stop},
                {"id": "c", "op": "concat", "inputs": ["s", "m"], "axis": axis},
                {"id": "k", "op": "sum", "inputs": ["c"], "axis": axis, "keepdims": True},
            ],
            ["k"],
        )
        vals, ref = run(d, seed=int(rng.integers(1 << 30)))
        m = vals["b"] * vals["x"]
        sl = [slice(None)] * rank
        sl[axis] = slice(start, stop)
        c = np.concatenate([m[tuple(sl)], m], axis=axis)
        np.testing.assert_allclose(ref["k"], c.sum(axis=axis, keepdims=True), rtol=1e-12, atol=1e-12)
        assert math.prod(ref["k"].shape) == math.prod(parse_graph(d).shape("k"))


def test_poly_node_range_both_bases() -> None:
    """The exact range of a poly node over an interval (what bootstrap scaling needs): the
    Chebyshev series in its own basis, checked against dense sampling."""
    from planner.frontend.reference import poly_node_range

    rng = np.random.default_rng(3)
    for i in range(40):
        deg = int(rng.integers(1, 32 if i % 2 else 8))
        coeffs = [float(c) for c in rng.uniform(-1, 1, deg + 1)]
        a = float(rng.uniform(-10, 0))
        b = a + float(rng.uniform(0.5, 20))
        attrs = {"coeffs": coeffs, "basis": "chebyshev", "domain": [a, b]} if i % 2 else {"coeffs": coeffs}
        node = parse_graph(one("poly", {"x": [3]}, ["x"], **attrs)).node("n1")
        lo = float(rng.uniform(a, b))
        hi = float(rng.uniform(lo, b))
        got = poly_node_range(node, lo, hi)
        x = np.linspace(lo, hi, 200001)
        ys = reference_poly(node, x)
        span = max(1.0, float(np.max(np.abs(ys))))
        assert got[0] <= ys.min() + 1e-9 * span and got[1] >= ys.max() - 1e-9 * span, (i, got, ys.min(), ys.max())
        assert got[0] >= ys.min() - 1e-6 * span and got[1] <= ys.max() + 1e-6 * span, (i, got, ys.min(), ys.max())


def reference_poly(node: Any, x: np.ndarray) -> np.ndarray:
    from planner.frontend.reference import poly_node

    return poly_node(node, x)


def test_ranges_of_the_model_ops_are_sound() -> None:
    """Interval arithmetic (planner/frontend/ranges.py, for bootstrap scaling) over the model ops:
    every reference value on inputs drawn inside the declared ranges lies inside the
    propagated interval, and a Chebyshev series is bounded in its own basis (read as
    monomial coefficients it would be bounded wrongly)."""
    from planner.frontend.ranges import graph_ranges

    cheb = [0.1, 0.9, -0.4, 0.3, 0.05, -0.02]
    d = graph(
        {"x": ([3, 4, 5], "input"), "z": ([3, 2, 5], "input"), "b": ([3, 1, 1], "weight"),
         "w": ([3, 5, 2], "weight")},
        [
            {"id": "m", "op": "mul", "inputs": ["x", "b"]},
            {"id": "s", "op": "slice", "inputs": ["m"], "axis": 1, "start": 1, "stop": 3},
            {"id": "c", "op": "concat", "inputs": ["s", "z"], "axis": 1},
            {"id": "p", "op": "poly", "inputs": ["c"], "coeffs": cheb, "basis": "chebyshev", "domain": [-3.0, 2.0]},
            {"id": "k", "op": "sum", "inputs": ["p"], "axis": 2, "keepdims": True},
            {"id": "e", "op": "sub", "inputs": ["p", "k"]},
            {"id": "y", "op": "matmul", "inputs": ["e", "w"]},
        ],
        ["y"],
    )
    d["tensors"]["x"]["range"] = [-2.0, 1.5]
    d["tensors"]["z"]["range"] = [-3.0, 2.0]
    g = parse_graph(d)
    rep = graph_ranges(g)
    xs = np.linspace(-3.0, 2.0, 100001)
    lo, hi = rep.ranges["p"] or (0.0, 0.0)
    ys = np.polynomial.chebyshev.chebval((2 * xs + 1) / 5, cheb)
    assert lo <= ys.min() and hi >= ys.max() and hi - lo <= (ys.max() - ys.min()) * (1 + 1e-6)
    rng = np.random.default_rng(5)
    for _ in range(20):
        vals = {"x": rng.uniform(-2.0, 1.5, (3, 4, 5)), "z": rng.uniform(-3.0, 2.0, (3, 2, 5)),
                "b": rng.uniform(-1, 1, (3, 1, 1)), "w": rng.uniform(-1, 1, (3, 5, 2))}
        vals["x"].flat[0], vals["z"].flat[0] = -2.0, 2.0  # the ends
        ref = reference(g, vals)
        for t in ("m", "s", "c", "p", "k", "e", "y"):
            iv = rep.ranges[t]
            assert iv is not None, t
            assert iv[0] <= ref[t].min() and ref[t].max() <= iv[1], (t, iv, ref[t].min(), ref[t].max())
