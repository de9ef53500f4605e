"""A generator of random small networks: the shapes ordinary encrypted inference graphs
have (matvec, conv2d with strides, padding and groups, squares, polynomials, residual
add/sub, reshapes between images and vectors, element-wise products and sums with weights),
and the ops of whole models (biases and per-channel values broadcast onto images, sums with
keepdims broadcast back (mean-centring, normalising), slices, concatenations with branches
and weights, matmuls over a batch with weights and between ciphertexts (attention-shaped),
Chebyshev polynomials over random domains), in chains of up to ``MAX_LEVELS``
multiplicative levels.

Deterministic: ``random_network(seed)`` always returns the same graph.  The property test
(tests/planner/assign/test_random_networks.py) plans every graph and checks it against numpy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# Nominal multiplicative depth of a generated chain (kernels, squares, polynomials,
# products with weights); masks and conversions the planner adds come on top.
MAX_LEVELS = 6
# The ring the graphs are planned on (512 slots, the smallest the presets' validation
# accepts): the larger tensors span several ciphertexts, the smaller ones leave most
# slots free (where garbage hides).
LOG_N = 10


class _Builder:
    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.tensors: dict[str, Any] = {}
        self.nodes: list[dict[str, Any]] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.depth: dict[str, int] = {}
        self.n = 0

    def fresh(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def weight(self, shape: tuple[int, ...]) -> str:
        name = self.fresh("w")
        self.tensors[name] = {"shape": list(shape), "role": "weight"}
        return name

    def node(self, op: str, inputs: list[str], out_shape: tuple[int, ...], depth: int, **attrs: Any) -> str:
        nid = self.fresh(op[:4])
        self.nodes.append({"id": nid, "op": op, "inputs": inputs, **attrs})
        self.shapes[nid] = out_shape
        self.depth[nid] = depth
        return nid

    def pick(self, options: list[str]) -> str:
        return options[int(self.rng.integers(len(options)))]

    def poly_coeffs(self) -> tuple[list[float], int]:
        deg = int(self.rng.integers(1, 4))
        coeffs = [round(float(c), 3) for c in self.rng.uniform(-1, 1, deg + 1)]
        if self.rng.random() < 0.5:
            coeffs[0] = 0.0  # p(0) = 0 keeps a clean layout clean; p(0) != 0 does not
        coeffs[-1] = coeffs[-1] or 0.5
        return coeffs, math.ceil(math.log2(deg + 1))

    def chebyshev(self, cur: str, shape: tuple[int, ...], d: int, budget: int) -> str | None:
        """A Chebyshev series over a random domain (one level more than its degree's for
        the change of variable, none over [-1, 1])."""
        deg = int(self.rng.integers(1, 6))
        unit = self.rng.random() < 0.25
        lo = -1.0 if unit else round(float(self.rng.uniform(-3, 0.5)), 2)
        hi = 1.0 if unit else round(lo + float(self.rng.uniform(0.5, 5)), 2)
        pd = math.ceil(math.log2(deg + 1)) + (0 if unit else 1)
        if pd > budget:
            return None
        coeffs = [round(float(c), 3) for c in self.rng.uniform(-1, 1, deg + 1)]
        coeffs[-1] = coeffs[-1] or 0.5
        return self.node("poly", [cur], shape, d + pd, coeffs=coeffs, basis="chebyshev", domain=[lo, hi])

    def slice(self, cur: str, shape: tuple[int, ...], d: int) -> str | None:
        axes = [a for a, n in enumerate(shape) if n >= 2]
        if not axes:
            return None
        axis = axes[int(self.rng.integers(len(axes)))]
        start = int(self.rng.integers(shape[axis] - 1))
        stop = int(self.rng.integers(start + 1, shape[axis] + 1))
        out = shape[:axis] + (stop - start,) + shape[axis + 1:]
        return self.node("slice", [cur], out, d, axis=axis, start=start, stop=stop)

    def mean_centre(self, cur: str, shape: tuple[int, ...], d: int, budget: int) -> str | None:
        """s = sum(cur, axis, keepdims); cur - s (add/sub) or cur * s (a ct-ct broadcast)."""
        axis = int(self.rng.integers(len(shape)))
        kept = shape[:axis] + (1,) + shape[axis + 1:]
        s = self.node("sum", [cur], kept, d, axis=axis, keepdims=True)
        if budget >= 1 and self.rng.random() < 0.4:
            return self.node("mul", [cur, s], shape, d + 1)
        return self.node(self.pick(["sub", "add"]), [cur, s] if self.rng.random() < 0.7 else [s, cur], shape, d)


def _vector_step(b: _Builder, cur: str, budget: int) -> str | None:
    (k,) = b.shapes[cur]
    d = b.depth[cur]
    ops = ["matvec", "square", "poly", "mul_w", "add_w", "residual", "to_image", "mul_ct",
           "cheb", "slice", "concat", "mean", "scalar_w"]
    op = b.pick(ops)
    if op == "cheb":
        return b.chebyshev(cur, (k,), d, budget)
    if op == "slice":
        return b.slice(cur, (k,), d)
    if op == "mean":
        return b.mean_centre(cur, (k,), d, budget)
    if op == "scalar_w":  # a weight of shape (1,) broadcast
        return b.node(b.pick(["add", "mul"]) if budget >= 1 else "add", [cur, b.weight((1,))], (k,), d + 1)
    if op == "concat":
        kind = b.pick(["weight", "poly", "matvec"])
        if kind == "matvec" and budget >= 1:
            n = int(b.rng.integers(2, 20))
            other, od = b.node("matvec", [b.weight((n, k)), cur], (n,), d + 1), d + 1
        elif kind == "poly":
            coeffs, pd = b.poly_coeffs()
            if pd > budget:
                return None
            n, other, od = k, b.node("poly", [cur], (k,), d + pd, coeffs=coeffs), d + pd
        else:
            n = int(b.rng.integers(1, 8))
            other, od = b.weight((n,)), d
        ins = [cur, other] if b.rng.random() < 0.5 else [other, cur]
        return b.node("concat", ins, (k + n,), max(d, od), axis=0)
    if op == "matvec" and budget >= 1:
        n = int(b.rng.integers(520, 600)) if b.rng.random() < 0.1 else int(b.rng.integers(2, 48))
        return b.node("matvec", [b.weight((n, k)), cur], (n,), d + 1)
    if op == "square" and budget >= 1:
        return b.node("mul", [cur, cur], (k,), d + 1)
    if op == "poly":
        coeffs, pd = b.poly_coeffs()
        if pd <= budget:
            return b.node("poly", [cur], (k,), d + pd, coeffs=coeffs)
    if op == "mul_w" and budget >= 1:
        return b.node("mul", [cur, b.weight((k,))], (k,), d + 1)
    if op == "add_w":
        w = b.weight((k,))
        return b.node("add" if b.rng.random() < 0.5 else "sub", [w, cur] if b.rng.random() < 0.3 else [cur, w], (k,), d)
    if op == "residual" and budget >= 1:
        branch = b.node("matvec", [b.weight((k, k)), cur], (k,), d + 1)
        return b.node(b.pick(["add", "sub"]), [cur, branch], (k,), d + 1)
    if op == "mul_ct" and budget >= 2:
        branch = b.node("matvec", [b.weight((k, k)), cur], (k,), d + 1)
        return b.node("mul", [branch, cur], (k,), d + 2)
    if op == "to_image":
        for c in (4, 3, 2):
            hw = k // c
            s = int(math.isqrt(hw))
            if k % c == 0 and s * s == hw and s >= 2:
                return b.node("reshape", [cur], (c, s, s), d, shape=[c, s, s])
    return None


def _image_step(b: _Builder, cur: str, budget: int) -> str | None:
    c, h, w = b.shapes[cur]
    d = b.depth[cur]
    op = b.pick(["conv", "conv", "depthwise", "square", "poly", "residual", "mul_w", "flatten",
                 "chan_w", "row_w", "cheb", "slice", "concat", "mean", "heads", "attention"])
    if op == "chan_w":  # a per-channel bias or scale
        if budget >= 1 and b.rng.random() < 0.5:
            return b.node("mul", [b.weight((c, 1, 1)), cur], (c, h, w), d + 1)
        return b.node("add", [cur, b.weight((c, 1, 1))], (c, h, w), d)
    if op == "row_w":  # a bias along the last axis
        return b.node(b.pick(["add", "sub"]), [cur, b.weight((w,))], (c, h, w), d)
    if op == "cheb":
        return b.chebyshev(cur, (c, h, w), d, budget)
    if op == "slice":
        return b.slice(cur, (c, h, w), d)
    if op == "mean":
        return b.mean_centre(cur, (c, h, w), d, budget)
    if op == "concat" and budget >= 1:  # channels of a conv branch next to the input's
        co = int(b.rng.integers(1, 4))
        branch = b.node("conv2d", [cur, b.weight((co, c, 3, 3))], (co, h, w), d + 1, stride=[1, 1], padding=[1, 1])
        ins = [cur, branch] if b.rng.random() < 0.5 else [branch, cur]
        return b.node("concat", ins, (c + co, h, w), d + 1, axis=0)
    if op == "heads" and budget >= 1:  # per-channel matrices: (c, h, w) x (c, w, n)
        n = int(b.rng.integers(2, 7))
        wt = b.weight((c, w, n) if b.rng.random() < 0.7 else (w, n))
        return b.node("matmul", [cur, wt], (c, h, n), d + 1)
    if op == "attention" and budget >= 1:  # x @ x^T per channel, between ciphertexts
        t = b.node("transpose", [cur], (c, w, h), d, perm=[0, 2, 1])
        return b.node("matmul", [cur, t], (c, h, h), d + 1)
    if op in ("conv", "depthwise") and budget >= 1:
        k1 = int(b.rng.integers(1, 4))
        k2 = int(b.rng.integers(1, 4))
        s = int(b.rng.integers(1, 3))
        p1 = int(b.rng.integers(0, k1 // 2 + 1))
        p2 = int(b.rng.integers(0, k2 // 2 + 1))
        ho = (h + 2 * p1 - k1) // s + 1
        wo = (w + 2 * p2 - k2) // s + 1
        if ho < 1 or wo < 1:
            return None
        if op == "depthwise":
            wt = b.weight((c, 1, k1, k2))
            return b.node("conv2d", [cur, wt], (c, ho, wo), d + 1, stride=[s, s], padding=[p1, p2], groups=c)
        co = int(b.rng.integers(1, 5))
        wt = b.weight((co, c, k1, k2))
        return b.node("conv2d", [cur, wt], (co, ho, wo), d + 1, stride=[s, s], padding=[p1, p2])
    if op == "square" and budget >= 1:
        return b.node("mul", [cur, cur], (c, h, w), d + 1)
    if op == "poly":
        coeffs, pd = b.poly_coeffs()
        if pd <= budget:
            return b.node("poly", [cur], (c, h, w), d + pd, coeffs=coeffs)
    if op == "residual" and budget >= 1:
        wt = b.weight((c, c, 3, 3))
        branch = b.node("conv2d", [cur, wt], (c, h, w), d + 1, stride=[1, 1], padding=[1, 1])
        return b.node(b.pick(["add", "sub"]), [branch, cur], (c, h, w), d + 1)
    if op == "mul_w" and budget >= 1:
        return b.node("mul", [cur, b.weight((c, h, w))], (c, h, w), d + 1)
    if op == "flatten":
        return b.node("reshape", [cur], (c * h * w,), d, shape=[c * h * w])
    return None


def random_network(seed: int) -> tuple[dict[str, Any], int]:
    """(graph JSON, log_n) of network number ``seed``."""
    rng = np.random.default_rng(seed)
    b = _Builder(rng)
    big = rng.random() < 0.15  # a tensor larger than one ciphertext
    if rng.random() < 0.5:
        shape: tuple[int, ...] = (int(rng.integers(520, 700)) if big else int(rng.integers(3, 40)),)
    else:
        c = int(rng.integers(9, 13)) if big else int(rng.integers(1, 4))
        shape = (c, int(rng.integers(7, 9)) if big else int(rng.integers(3, 9)), int(rng.integers(3, 9)))
    b.tensors["x"] = {"shape": list(shape), "role": "input"}
    b.shapes["x"] = shape
    b.depth["x"] = 0
    cur = "x"
    outputs: list[str] = []
    steps = int(rng.integers(1, 7))
    for _ in range(steps * 3):  # a step that does not apply is redrawn
        if len(b.nodes) >= steps + 2:
            break
        budget = MAX_LEVELS - b.depth[cur]
        step = _vector_step if len(b.shapes[cur]) == 1 else _image_step
        nxt = step(b, cur, budget)
        if nxt is None:
            continue
        if rng.random() < 0.15 and cur != "x":
            outputs.append(cur)  # an intermediate result is an output too
        cur = nxt
    if not b.nodes:
        cur = b.node("poly", ["x"], shape, 1, coeffs=[0.0, 1.0, 0.5])
    outputs.append(cur)
    graph = {
        "schema": "slotplan.graph/1", "name": f"random{seed}", "tensors": b.tensors,
        "nodes": b.nodes, "outputs": list(dict.fromkeys(outputs)),
    }
    return graph, LOG_N


def describe(graph: dict[str, Any]) -> str:
    ops = []
    for n in graph["nodes"]:
        op = n["op"]
        if op == "mul" and n["inputs"][0] == n["inputs"][1]:
            op = "square"
        elif op == "poly" and n.get("basis") == "chebyshev":
            op = "chebyshev"
        elif op == "conv2d":
            op = f"conv{'-dw' if n.get('groups', 1) > 1 else ''}/s{n['stride'][0]}p{n['padding'][0]}{n['padding'][1]}"
        ops.append(op)
    return " -> ".join(ops)


def random_batch(seed: int) -> int:
    """Samples per ciphertext set of batched network ``seed`` (SPEC section 8): 1..8, so
    that powers of two and padded batches (3, 5, 6, 7) both occur."""
    return 1 + (seed * 5 + seed // 8) % 8
