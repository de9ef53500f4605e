"""A Chebyshev poly over [a, b] costs ceil(log2(d + 1)) levels (SPEC section 2) where its
change of variable's scale folds into the producers (planner/assign/fold.py); elsewhere it keeps
the pmul + rescale.  Every plan is simulated against numpy (float64, 1e-9) with its layout
claims checked (a folded producer's registers hold s times the node's value)."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest

from planner import ir
from planner.assign.candidates import chebyshev_map
from planner.assign.fold import plan_cone
from planner.frontend.graph import Graph
from planner.pipeline import PlanResult
from tests.helpers import graph_of, plan_node, plan_small

COEFFS = [0.1, 0.5, 0.3, -0.2, 0.05]  # degree 4: ceil(log2 5) = 3 levels
DOMAIN = [-3.0, 5.0]
CHEB: dict[str, Any] = {"op": "poly", "coeffs": COEFFS, "basis": "chebyshev", "domain": DOMAIN}


def _graph(tensors: dict[str, Any], nodes: list[dict[str, Any]], outputs: list[str]) -> Graph:
    return graph_of("fold", tensors, nodes, outputs)


_plan, _node = plan_small, plan_node


def _pmuls_by_scale(res: PlanResult) -> int:
    """pmul instructions of the plan whose plaintext is the constant scale of the change of variable."""
    pts = res.plan["plaintexts"]
    return sum(1 for raw in res.plan["program"] if isinstance(ins := ir.decode(raw), ir.PMul)
               and pts[ins.pt]["table"].startswith("pt/const/scale"))


POLY_DEPTH = math.ceil(math.log2(len(COEFFS)))
S = chebyshev_map((DOMAIN[0], DOMAIN[1]))[0]


def test_matvec_bias_poly_folds_to_the_spec_depth() -> None:
    g = _graph(
        {"W": {"shape": [16, 32], "role": "weight"}, "x": {"shape": [32], "role": "input"},
         "bias": {"shape": [16], "role": "weight"}},
        [{"id": "y", "op": "matvec", "inputs": ["W", "x"]}, {"id": "z", "op": "add", "inputs": ["y", "bias"]},
         {"id": "p", "inputs": ["z"], **CHEB}],
        ["p"])
    for kernels in (None, ["bsgs", "elementwise"], ["imra", "elementwise"], ["hs-diagonal", "elementwise"]):
        res = _plan(g, **({"kernels": kernels} if kernels else {}))
        assert res.plan["summary"]["depth"] == 1 + POLY_DEPTH  # matvec + the SPEC's poly depth
        assert _node(res, "y")["params"]["scaled_by"] == S
        assert _node(res, "z")["params"]["scaled_by"] == S
        assert _node(res, "p")["params"]["input_scaled_by"] == S
        assert _node(res, "p")["cost"]["depth"] == POLY_DEPTH
        assert _pmuls_by_scale(res) == 0


def test_fold_across_several_ciphertexts() -> None:
    """Values that span several ciphertexts (700 inputs, 600 outputs at 512 slots; sizes no
    power of two): every ciphertext's products take the factor, and the plan (checked
    against numpy with its layout claims) keeps the SPEC depth."""
    g = _graph(
        {"W": {"shape": [600, 700], "role": "weight"}, "x": {"shape": [700], "role": "input"},
         "bias": {"shape": [600], "role": "weight"}},
        [{"id": "y", "op": "matvec", "inputs": ["W", "x"]}, {"id": "z", "op": "add", "inputs": ["y", "bias"]},
         {"id": "p", "inputs": ["z"], **CHEB}],
        ["p"])
    res = _plan(g)  # raw outputs: a clean-output mask after the poly would add its own level
    assert res.plan["summary"]["depth"] == 1 + POLY_DEPTH
    assert _node(res, "p")["params"]["input_scaled_by"] == S
    assert _pmuls_by_scale(res) == 0
    assert sum(1 for raw in res.plan["program"] if raw["op"] == "input") > 1


def test_conv_poly_folds() -> None:
    g = _graph(
        {"x": {"shape": [2, 6, 6], "role": "input"}, "w": {"shape": [3, 2, 3, 3], "role": "weight"}},
        [{"id": "y", "op": "conv2d", "inputs": ["x", "w"], "padding": [1, 1]}, {"id": "p", "inputs": ["y"], **CHEB}],
        ["p"])
    res = _plan(g)
    assert res.plan["summary"]["depth"] == 1 + POLY_DEPTH
    assert _node(res, "y")["params"]["scaled_by"] == S


def test_poly_poly_folds_into_the_first_poly() -> None:
    # the first poly reads the input (cannot fold its own change of variable), the second
    # folds its scale into the first one's coefficients
    # (degree 8: not evaluated in the monomial basis, chebyshev_as_monomial)
    c2 = [0.2, -0.4, 0.3, 0.1, -0.05, 0.02, 0.01, -0.01, 0.005]
    g = _graph(
        {"x": {"shape": [40], "role": "input", "range": [-1, 1]}},
        [{"id": "p1", "inputs": ["x"], **CHEB},
         {"id": "p2", "op": "poly", "inputs": ["p1"], "coeffs": c2, "basis": "chebyshev", "domain": [-2.0, 1.5]}],
        ["p2"])
    res = _plan(g)
    assert _node(res, "p1")["params"]["scaled_by"] == chebyshev_map((-2.0, 1.5))[0]
    assert "input_scaled_by" not in _node(res, "p1")["params"]
    assert res.plan["summary"]["depth"] == (1 + POLY_DEPTH) + 4
    assert _pmuls_by_scale(res) == 1


def test_square_of_an_input_does_not_fold() -> None:
    g = _graph({"x": {"shape": [40], "role": "input"}},
               [{"id": "sq", "op": "mul", "inputs": ["x", "x"]}, {"id": "p", "inputs": ["sq"], **CHEB}], ["p"])
    res = _plan(g)
    assert "scaled_by" not in _node(res, "sq")["params"]
    assert res.plan["summary"]["depth"] == 1 + 1 + POLY_DEPTH
    assert _pmuls_by_scale(res) == 1


def test_product_of_two_ciphertexts_folds_into_one_operand() -> None:
    g = _graph(
        {"W": {"shape": [16, 32], "role": "weight"}, "V": {"shape": [16, 32], "role": "weight"},
         "x": {"shape": [32], "role": "input"}},
        [{"id": "a", "op": "matvec", "inputs": ["W", "x"]}, {"id": "b", "op": "matvec", "inputs": ["V", "x"]},
         {"id": "m", "op": "mul", "inputs": ["a", "b"]}, {"id": "p", "inputs": ["m"], **CHEB}],
        ["p"])
    res = _plan(g)
    assert res.plan["summary"]["depth"] == 2 + POLY_DEPTH
    scaled = [n for n in ("a", "b") if "scaled_by" in _node(res, n)["params"]]
    assert len(scaled) == 1 and _node(res, "m")["params"]["scaled_by"] == S


def test_two_consumers_do_not_fold() -> None:
    g = _graph(
        {"W": {"shape": [16, 32], "role": "weight"}, "x": {"shape": [32], "role": "input"}},
        [{"id": "y", "op": "matvec", "inputs": ["W", "x"]}, {"id": "p", "inputs": ["y"], **CHEB},
         {"id": "q", "op": "add", "inputs": ["p", "y"]}],
        ["q"])
    res = _plan(g)
    assert "scaled_by" not in _node(res, "y")["params"]
    assert res.plan["summary"]["depth"] == 1 + 1 + POLY_DEPTH


def test_graph_output_producer_does_not_fold() -> None:
    g = _graph(
        {"W": {"shape": [16, 32], "role": "weight"}, "x": {"shape": [32], "role": "input"}},
        [{"id": "y", "op": "matvec", "inputs": ["W", "x"]}, {"id": "p", "inputs": ["y"], **CHEB}],
        ["p", "y"])
    res = _plan(g)
    assert "scaled_by" not in _node(res, "y")["params"]
    assert res.plan["summary"]["depth"] == 1 + 1 + POLY_DEPTH


def test_input_poly_does_not_fold() -> None:
    g = _graph({"x": {"shape": [40], "role": "input"}}, [{"id": "p", "inputs": ["x"], **CHEB}], ["p"])
    res = _plan(g)
    assert res.plan["summary"]["depth"] == 1 + POLY_DEPTH
    assert _pmuls_by_scale(res) == 1


def test_clean_outputs_and_a_chain_of_views() -> None:
    """Through a reshape (a view: the factor reaches the conv) and with the output mask."""
    g = _graph(
        {"x": {"shape": [2, 4, 4], "role": "input"}, "w": {"shape": [2, 2, 3, 3], "role": "weight"},
         "b": {"shape": [32], "role": "weight"}},
        [{"id": "y", "op": "conv2d", "inputs": ["x", "w"], "padding": [1, 1]},
         {"id": "f", "op": "reshape", "inputs": ["y"], "shape": [32]},
         {"id": "z", "op": "sub", "inputs": ["f", "b"]}, {"id": "p", "inputs": ["z"], **CHEB}],
        ["p"])
    res = _plan(g, clean_outputs=True)
    assert _node(res, "p")["params"].get("input_scaled_by") == S
    assert _node(res, "y")["params"]["scaled_by"] == S


@pytest.mark.parametrize("seed", range(6))
def test_random_weights_and_domains(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lo = float(rng.uniform(-6, -0.5))
    hi = float(rng.uniform(0.5, 6))
    deg = int(rng.integers(2, 9))
    coeffs = [float(c) for c in rng.normal(size=deg + 1) / (1 + np.arange(deg + 1))]
    g = _graph(
        {"W": {"shape": [12, 20], "role": "weight"}, "x": {"shape": [20], "role": "input"},
         "bias": {"shape": [12], "role": "weight"}},
        [{"id": "y", "op": "matvec", "inputs": ["W", "x"]}, {"id": "z", "op": "add", "inputs": ["y", "bias"]},
         {"id": "p", "op": "poly", "inputs": ["z"], "coeffs": coeffs, "basis": "chebyshev", "domain": [lo, hi]}],
        ["p"])
    res = _plan(g, clean_outputs=bool(seed % 2))
    params = _node(res, "p")["params"]
    if params.get("evaluated") != "monomial":
        assert params["input_scaled_by"] == chebyshev_map((lo, hi))[0]
        assert _node(res, "p")["cost"]["depth"] - (1 if params.get("output_mask") else 0) == \
            math.ceil(math.log2(deg + 1))


def test_cone_refuses_a_bootstrap_and_mixed_sums() -> None:
    boot = [ir.Bootstrap("c1", "c0").to_json()]
    assert plan_cone(boot, ["c1"], {"c0": "x"}) is None
    # c2 = x * w + x: x would have to be scaled and not scaled at once
    mixed = [ir.PMul("c1", "c0", "p0").to_json(), ir.Add("c2", "c1", "c0").to_json()]
    assert plan_cone(mixed, ["c2"], {"c0": "x"}) is None
    # c2 = x * w + rot(x * w): one plaintext scaled
    ok = [ir.PMul("c1", "c0", "p0").to_json(), ir.Rot("c2", "c1", 1).to_json(), ir.Add("c3", "c1", "c2").to_json()]
    cone = plan_cone(ok, ["c3"], {"c0": "x"})
    assert cone is not None and cone.scale_pt == frozenset({0}) and not cone.operands
    # a padd of a bias on the operand: the operand must arrive scaled
    bias = [ir.PAdd("c1", "c0", "p0").to_json()]
    cone = plan_cone(bias, ["c1"], {"c0": "x"})
    assert cone is not None and cone.operands == frozenset({"x"})


def test_cone_through_passes_the_factor_to_the_operands() -> None:
    """``through``: no plaintext product or poly takes the factor, every path passes it to
    an operand (a densified candidate's mask then reads its operand scaled, as its
    siblings do, so the chain folds: planner.assign.fold._uniform)."""
    masked = [ir.PMul("c1", "c0", "p0").to_json(), ir.Rescale("c2", "c1").to_json(),
              ir.Rot("c3", "c2", 4).to_json(), ir.Add("c4", "c2", "c3").to_json()]
    absorbed = plan_cone(masked, ["c4"], {"c0": "x"})
    assert absorbed is not None and absorbed.scale_pt == frozenset({0}) and not absorbed.operands
    passed = plan_cone(masked, ["c4"], {"c0": "x"}, through=True)
    assert passed is not None and not passed.scale_pt and passed.operands == frozenset({"x"})
    # a bias on the way keeps its plaintext scaled either way
    bias = [*masked, ir.PAdd("c5", "c4", "p1").to_json()]
    cone = plan_cone(bias, ["c5"], {"c0": "x"}, through=True)
    assert cone is not None and cone.scale_pt == frozenset({4}) and cone.operands == frozenset({"x"})
    # a poly cannot pass a factor on its input through to its output
    poly = [ir.Poly("c1", "c0", (0.1, 0.2, 0.3)).to_json()]
    assert plan_cone(poly, ["c1"], {"c0": "x"}) is not None
    assert plan_cone(poly, ["c1"], {"c0": "x"}, through=True) is None


def _random_chain(seed: int) -> tuple[Graph, bool]:
    """A random chain a fold applies to: a matvec or a conv, then some of a bias add, a
    weight product, a subtraction, a reshape, then a Chebyshev poly of degree 8-12 over a
    random domain, sometimes followed by a second one; returns the graph and whether the
    first poly's producer is read twice (no fold)."""
    rng = np.random.default_rng(1000 + seed)
    tensors: dict[str, Any] = {}
    nodes: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        n, k = int(rng.integers(4, 40)), int(rng.integers(4, 40))
        tensors |= {"x": {"shape": [k], "role": "input"}, "W": {"shape": [n, k], "role": "weight"}}
        nodes.append({"id": "y", "op": "matvec", "inputs": ["W", "x"]})
        shape = [n]
    else:
        c, h = int(rng.integers(1, 4)), int(rng.integers(3, 7))
        co = int(rng.integers(1, 4))
        tensors |= {"x": {"shape": [c, h, h], "role": "input"}, "w": {"shape": [co, c, 3, 3], "role": "weight"}}
        nodes.append({"id": "y", "op": "conv2d", "inputs": ["x", "w"], "padding": [1, 1]})
        shape = [co, h, h]
    cur = "y"
    for i, op in enumerate(rng.permutation(["add", "mul", "sub", "reshape"])[: int(rng.integers(0, 4))]):
        nid = f"n{i}"
        if op == "reshape":
            shape = [int(np.prod(shape))]
            nodes.append({"id": nid, "op": "reshape", "inputs": [cur], "shape": shape})
        else:
            tensors[f"v{i}"] = {"shape": list(shape), "role": "weight"}
            ins = [cur, f"v{i}"] if rng.random() < 0.7 else [f"v{i}", cur]
            nodes.append({"id": nid, "op": str(op), "inputs": ins})
        cur = nid
    lo = float(rng.uniform(-6, 0.5))
    hi = lo + float(rng.uniform(0.5, 8))
    deg = int(rng.integers(8, 13))
    coeffs = [float(c) for c in rng.normal(size=deg + 1) / (1 + np.arange(deg + 1))]
    nodes.append({"id": "p", "op": "poly", "inputs": [cur], "coeffs": coeffs, "basis": "chebyshev",
                  "domain": [lo, hi]})
    outputs = ["p"]
    shared = rng.random() < 0.2
    if shared:
        nodes.append({"id": "q", "op": "add", "inputs": ["p", cur]})
        outputs = ["q"]
    elif rng.random() < 0.4:
        nodes.append({"id": "p2", "op": "poly", "inputs": ["p"], "coeffs": coeffs[::-1], "basis": "chebyshev",
                      "domain": [-2.0, 3.0]})
        outputs = ["p2"]
    return _graph(tensors, nodes, outputs), shared


KERNEL_CHOICES = (None, ["bsgs", "elementwise", "view"], ["imra", "elementwise", "view"],
                  ["hs-diagonal", "elementwise", "view"])


@pytest.mark.parametrize("seed", range(24))
def test_random_chains(seed: int) -> None:
    """Simulated against numpy with every layout claim checked; a chain folds exactly when
    its producer is read once (the chains' ops all absorb), and the poly then costs the
    SPEC's depth."""
    g, shared = _random_chain(seed)
    kernels = KERNEL_CHOICES[seed % len(KERNEL_CHOICES)]
    res = _plan(g, levels=16, clean_outputs=seed % 3 != 0, input_layout="row-major" if seed % 2 else "free",
                **({"kernels": kernels} if kernels else {}))
    p = _node(res, "p")
    if shared:
        assert "input_scaled_by" not in p["params"]
        return
    deg = len(g.node("p").coeffs or ()) - 1
    assert "input_scaled_by" in p["params"]
    assert p["cost"]["depth"] - (1 if p["params"].get("output_mask") else 0) == math.ceil(math.log2(deg + 1))
    # the poly's producer holds the scaled value (a weight product up the chain absorbs
    # the factor in its plaintext, so nodes above it stay unscaled)
    producer = g.node("p").inputs[0]
    assert _node(res, producer)["params"]["scaled_by"] == p["params"]["input_scaled_by"]


def _random_residual(seed: int) -> Graph:
    """y = W x, h = V y, r = h + y (y read twice: by V and by the sum), p = a Chebyshev
    poly of r over a random domain; sizes up to 700 (several 512-slot ciphertexts, rarely a
    power of two)."""
    rng = np.random.default_rng(2000 + seed)
    n, k = int(rng.integers(5, 700)), int(rng.integers(5, 300))
    lo = float(rng.uniform(-4, 0.5))
    hi = lo + float(rng.uniform(0.5, 5))  # factor 2 / (hi - lo) from 0.4 to 4
    deg = int(rng.integers(8, 13))
    coeffs = [float(c) for c in rng.normal(size=deg + 1) / (1 + np.arange(deg + 1))]
    return _graph(
        {"x": {"shape": [k], "role": "input"}, "W": {"shape": [n, k], "role": "weight"},
         "V": {"shape": [n, n], "role": "weight"}},
        [{"id": "y", "op": "matvec", "inputs": ["W", "x"]}, {"id": "h", "op": "matvec", "inputs": ["V", "y"]},
         {"id": "r", "op": "add", "inputs": ["h", "y"]},
         {"id": "p", "op": "poly", "inputs": ["r"], "coeffs": coeffs, "basis": "chebyshev", "domain": [lo, hi]}],
        ["p"])


@pytest.mark.parametrize("seed", range(12))
def test_random_residual_sums_scale_their_skip(seed: int) -> None:
    """Simulated against numpy with every layout and scale claim checked (the skip scaled by
    a product on its edge holds the factor times y); the poly folds exactly when its
    factor is at least MIN_PRODUCT_SCALE, and then costs the SPEC's depth, the sum's skip
    taking one product per ciphertext."""
    from planner.assign.fold import MIN_PRODUCT_SCALE

    g = _random_residual(seed)
    res = _plan(g, levels=16, clean_outputs=seed % 2 == 0)
    node = g.node("p")
    assert node.domain is not None
    s = chebyshev_map((node.domain[0], node.domain[1]))[0]
    p, r = _node(res, "p"), _node(res, "r")
    if s < MIN_PRODUCT_SCALE:
        assert "input_scaled_by" not in p["params"] and "scaled_operands_by_product" not in r["params"]
        return
    deg = len(node.coeffs or ()) - 1
    assert p["params"]["input_scaled_by"] == s
    assert p["cost"]["depth"] - (1 if p["params"].get("output_mask") else 0) == math.ceil(math.log2(deg + 1))
    assert r["params"]["scaled_operands_by_product"] == ["y"]
    assert _node(res, "h")["params"]["scaled_by"] == s and "scaled_by" not in _node(res, "y")["params"]
    prog, pts = res.plan["program"], res.plan["plaintexts"]
    a, b = r["span"]
    products = sum(1 for ins in prog[a:b] if ins["op"] == "pmul" and pts[ins["pt"]]["table"].startswith(
        "pt/const/operand-scale"))
    m = re.match(r"ct\[[^:]*:(\d+)\]", r["in_layouts"][1])
    assert products == (int(m.group(1)) if m else 1)
