"""The numpy reference: float64 evaluation of a graph, the definition of every op's meaning
(SPEC section 2) and the oracle plans are checked against.

* ``matvec`` ``W @ x``; ``matmul`` ``np.matmul(A, B)`` (batched over leading dimensions);
* ``conv2d``: cross-correlation exactly as ``torch.nn.functional.conv2d`` for one image
  (zero padding, stride, groups): ``y[o, i, j] = sum_{c, a, b} w[o, c, a, b] *
  xpad[g*C/groups + c, i*s1 + a, j*s2 + b]`` with ``g = o // (Co/groups)``;
* ``add`` / ``sub`` / ``mul`` element-wise with numpy broadcasting; ``poly``
  ``c0 + c1 x + ...`` (Horner), or in the Chebyshev basis over ``domain`` [a, b]
  ``sum_i c_i T_i((2x - a - b) / (b - a))`` (``numpy.polynomial.chebyshev.chebval``);
* ``sum`` over ``axis`` (a rank-1 input gives shape ``(1,)``; ``keepdims`` as ``np.sum``);
  ``transpose`` with ``perm``; ``reshape`` row-major; ``slice`` ``x[..., start:stop, ...]``;
  ``concat`` ``np.concatenate``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from common.errors import ValuesError
from planner.frontend.graph import Graph, Node

__all__ = [
    "Array", "chebyshev", "conv2d", "evaluate_node", "poly", "poly_node", "poly_node_range", "random_values",
    "reference",
]

Array = npt.NDArray[np.float64]


def reference(graph: Graph, values: Mapping[str, npt.ArrayLike]) -> dict[str, Array]:
    """Evaluate every node of ``graph`` in float64.

    ``values`` must hold every declared input and weight with its declared shape (extra
    keys are ignored). Returns the declared tensors (as float64 arrays) and every node
    result, keyed by name. Raises :class:`ValuesError` for missing or mis-shaped values.
    """
    out: dict[str, Array] = {}
    for name in (*graph.inputs, *graph.weights):
        if name not in values:
            raise ValuesError("no value given for this declared tensor", tensor=name)
        raw = np.asarray(values[name])
        if raw.dtype.kind not in "biuf":
            raise ValuesError(f"values must be real numbers, got dtype {raw.dtype}", tensor=name)
        arr = raw.astype(np.float64)
        shape = graph.shape(name)
        if arr.shape != shape:
            raise ValuesError(f"value has shape {arr.shape}, the graph declares {shape}", tensor=name)
        out[name] = arr
    for node in graph.nodes:
        result = evaluate_node(node, [out[i] for i in node.inputs])
        out[node.id] = np.ascontiguousarray(result.reshape(graph.shape(node.id)), dtype=np.float64)
    return out


def evaluate_node(node: Node, args: Sequence[Array]) -> Array:
    """Evaluate one validated node on float64 operands (in ``node.inputs`` order)."""
    op = node.op
    if op == "matvec":
        return np.asarray(args[0] @ args[1], dtype=np.float64)
    if op == "matmul":
        return np.asarray(np.matmul(args[0], args[1]), dtype=np.float64)
    if op == "conv2d":
        assert node.stride is not None and node.padding is not None and node.groups is not None
        return conv2d(args[0], args[1], stride=node.stride, padding=node.padding, groups=node.groups)
    if op == "add":
        return args[0] + args[1]
    if op == "sub":
        return args[0] - args[1]
    if op == "mul":
        return args[0] * args[1]
    if op == "poly":
        return poly_node(node, args[0])
    if op == "sum":
        assert node.axis is not None
        return np.asarray(np.sum(args[0], axis=node.axis, keepdims=bool(node.keepdims)), dtype=np.float64)
    if op == "slice":
        assert node.axis is not None and node.start is not None and node.stop is not None
        index = [slice(None)] * args[0].ndim
        index[node.axis] = slice(node.start, node.stop)
        return np.ascontiguousarray(args[0][tuple(index)])
    if op == "concat":
        assert node.axis is not None
        return np.concatenate(list(args), axis=node.axis)
    if op == "transpose":
        assert node.perm is not None
        return np.ascontiguousarray(np.transpose(args[0], node.perm))
    if op == "reshape":
        assert node.shape is not None
        return np.reshape(args[0], node.shape).copy()
    raise AssertionError(f"unhandled op {op!r}")  # unreachable: ops are validated


def poly_node(node: Node, x: Array) -> Array:
    """A ``poly`` node's polynomial on ``x`` (its basis and domain)."""
    assert node.coeffs is not None
    if node.basis == "chebyshev":
        assert node.domain is not None
        return chebyshev(x, node.coeffs, node.domain)
    return poly(x, node.coeffs)


def poly_node_range(node: Node, lo: float, hi: float) -> tuple[float, float]:
    """The exact range of a ``poly`` node (either basis) over ``[lo, hi]``: its values at the
    ends and at the real critical points inside (found in the node's own basis, so a
    high-degree Chebyshev series keeps its precision), widened by a relative 1e-9."""
    assert node.coeffs is not None
    series: np.polynomial.Chebyshev | np.polynomial.Polynomial
    if node.basis == "chebyshev":
        assert node.domain is not None
        series = np.polynomial.Chebyshev(np.asarray(node.coeffs, dtype=np.float64), domain=list(node.domain))
    else:
        series = np.polynomial.Polynomial(np.asarray(node.coeffs, dtype=np.float64))
    pts = [float(lo), float(hi)]
    if len(node.coeffs) > 2 and hi > lo:
        for r in np.asarray(series.deriv().roots(), dtype=np.complex128).tolist():
            re, im = float(r.real), float(r.imag)
            if abs(im) <= 1e-9 * max(1.0, abs(re)) and lo <= re <= hi:
                pts.append(re)
    vals = [float(series(x)) for x in pts]
    span = max(abs(v) for v in vals)
    return (min(vals) - 1e-9 * span, max(vals) + 1e-9 * span)


def chebyshev(x: npt.ArrayLike, coeffs: Sequence[float], domain: Sequence[float]) -> Array:
    """``sum_i c_i T_i((2x - a - b) / (b - a))`` element-wise (Clenshaw's recurrence)."""
    a, b = float(domain[0]), float(domain[1])
    t = (2.0 * np.asarray(x, dtype=np.float64) - a - b) / (b - a)
    return np.asarray(np.polynomial.chebyshev.chebval(t, np.asarray(coeffs, dtype=np.float64)), dtype=np.float64)


def poly(x: Array, coeffs: Sequence[float]) -> Array:
    """``c0 + c1 x + c2 x^2 + ...`` element-wise, by Horner's rule."""
    acc = np.full(x.shape, float(coeffs[-1]), dtype=np.float64)
    for c in reversed(coeffs[:-1]):
        acc = acc * x + float(c)
    return acc


def conv2d(
    x: Array,
    w: Array,
    *,
    stride: tuple[int, int] = (1, 1),
    padding: tuple[int, int] = (0, 0),
    groups: int = 1,
) -> Array:
    """``torch.nn.functional.conv2d`` for one image: ``x`` (C,H,W), ``w`` (Co,C/groups,K1,K2)
    -> (Co, Ho, Wo) with ``Ho = (H + 2 p1 - K1) // s1 + 1`` (and likewise ``Wo``).

    One matrix product per kernel offset (K1*K2 of them): memory stays O(padded input +
    output), unlike a full im2col."""
    c, h, wd = x.shape
    co, cg, k1, k2 = w.shape
    s1, s2 = stride
    p1, p2 = padding
    g = groups
    if c != cg * g or co % g:
        raise ValueError(f"conv2d: x {x.shape} and w {w.shape} do not fit groups={g}")
    hp, wp = h + 2 * p1, wd + 2 * p2
    ho, wo = (hp - k1) // s1 + 1, (wp - k2) // s2 + 1
    if ho < 1 or wo < 1:
        raise ValueError(f"conv2d: kernel {k1}x{k2} larger than padded input {hp}x{wp}")
    xp = np.zeros((c, hp, wp), dtype=np.float64)
    xp[:, p1 : p1 + h, p2 : p2 + wd] = x
    xg = xp.reshape(g, cg, hp, wp)
    wg = np.asarray(w, dtype=np.float64).reshape(g, co // g, cg, k1, k2)
    out = np.zeros((g, co // g, ho * wo), dtype=np.float64)
    for a in range(k1):
        for b in range(k2):
            patch = xg[:, :, a : a + s1 * (ho - 1) + 1 : s1, b : b + s2 * (wo - 1) + 1 : s2]
            out += np.matmul(wg[:, :, :, a, b], patch.reshape(g, cg, ho * wo))
    return out.reshape(co, ho, wo)


def random_values(graph: Graph, seed: int, init: str = "uniform") -> dict[str, Array]:
    """Seeded uniform [-1, 1) values for every declared input and weight, drawn from
    ``np.random.default_rng(seed)`` in sorted-name order (so the same seed gives the same
    values whatever the file order).

    ``init="fan-in"`` divides each weight by sqrt(fan-in) of the linear op that consumes it
    (the contracted size: k of a matvec/matmul, C/groups*K1*K2 of a conv2d), the way
    networks are initialised: activations then stay O(1) through deep graphs, which CKKS
    needs (a value must stay below q0 / scale at the last level).

    A tensor that declares a ``range`` [lo, hi] gets values uniform in it instead."""
    if init not in ("uniform", "fan-in"):
        raise ValueError(f"init must be 'uniform' or 'fan-in', got {init!r}")
    rng = np.random.default_rng(seed)
    out = {
        name: rng.uniform(-1.0, 1.0, size=graph.shape(name))
        for name in sorted((*graph.inputs, *graph.weights))
    }
    rng_ranged = dict(out)
    if init == "fan-in":
        for name in graph.weights:
            fan = 1
            for node in graph.consumers(name):
                sh = graph.shape(name)
                if node.op in ("matvec",) and node.inputs[0] == name:
                    fan = max(fan, sh[1])
                elif node.op == "matmul":
                    fan = max(fan, sh[-1] if node.inputs[0] == name else sh[-2])
                elif node.op == "conv2d" and node.inputs[1] == name:
                    fan = max(fan, sh[1] * sh[2] * sh[3])
            out[name] = out[name] / np.sqrt(fan)
    for name in (*graph.inputs, *graph.weights):
        rng_ = graph.tensor(name).range
        if rng_ is not None:  # a declared range: uniform within it (the user's promise)
            lo, hi = rng_
            raw = rng_ranged[name]
            out[name] = lo + (hi - lo) * (raw + 1.0) / 2.0
    return out
