"""A quadratic activation a x^2 + b x + c (a > 0) costs one level where its producer takes
the factor s = sqrt(a) on its result (planner/assign/candidates.py quadratic_scale,
planner/assign/fold.py): the poly is then the monic y (y + b / s) + c of y = s x, a padd, a
cmul and a rescale, where a degree-2 ``poly`` instruction takes ceil(log2 3) = 2.  Every
plan is simulated against numpy (float64, 1e-9) with its layout claims checked
(tests.helpers.check_plan)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from planner.assign.candidates import (
    QUADRATIC_MAX_SCALE,
    QUADRATIC_MIN_SCALE,
    fold_scale,
    quadratic_coeffs,
    quadratic_scale,
)
from planner.frontend.graph import Graph
from planner.pipeline import PlanResult
from tests.helpers import graph_of, plan_node, plan_small

ACT = [0.0, 0.5, 0.125]  # ResNet-20's activation in data/workloads: 0.5 x + 0.125 x^2
S = math.sqrt(0.125)


def _graph(tensors: dict[str, Any], nodes: list[dict[str, Any]], outputs: list[str]) -> Graph:
    return graph_of("quad", tensors, nodes, outputs)


_plan, _node = plan_small, plan_node


def _ops(res: PlanResult) -> list[str]:
    return [raw["op"] for raw in res.plan["program"]]


def _conv_act(coeffs: list[float], **poly: Any) -> Graph:
    return _graph(
        {"x": {"shape": [2, 6, 6], "role": "input"}, "w": {"shape": [3, 2, 3, 3], "role": "weight"},
         "b": {"shape": [3, 1, 1], "role": "weight"}},
        [{"id": "y", "op": "conv2d", "inputs": ["x", "w"], "padding": [1, 1]},
         {"id": "z", "op": "add", "inputs": ["y", "b"]},
         {"id": "p", "op": "poly", "inputs": ["z"], "coeffs": coeffs, **poly}],
        ["p"])


def test_conv_bias_quadratic_takes_one_level() -> None:
    res = _plan(_conv_act(ACT))
    assert res.plan["summary"]["depth"] == 2  # the conv's products and the square
    assert _node(res, "y")["params"]["scaled_by"] == S
    assert _node(res, "z")["params"]["scaled_by"] == S
    assert _node(res, "p")["params"]["input_scaled_by"] == S
    assert _node(res, "p")["cost"]["depth"] == 1
    assert "poly" not in _ops(res) and _ops(res).count("cmul") == 1


def test_without_the_fold_the_quadratic_takes_two_levels() -> None:
    """The same activation on an encrypted input (nothing to absorb s): a degree-2 poly."""
    g = _graph({"x": {"shape": [40], "role": "input"}},
               [{"id": "p", "op": "poly", "inputs": ["x"], "coeffs": ACT}], ["p"])
    res = _plan(g)
    assert res.plan["summary"]["depth"] == 2
    assert "input_scaled_by" not in _node(res, "p")["params"]


def test_monic_quadratic_with_a_linear_term_needs_no_fold() -> None:
    """x^2 + c1 x + c0 on an input: x (x + c1) + c0, one level."""
    g = _graph({"x": {"shape": [40], "role": "input"}},
               [{"id": "p", "op": "poly", "inputs": ["x"], "coeffs": [0.25, -0.75, 1.0]}], ["p"])
    res = _plan(g)
    assert res.plan["summary"]["depth"] == 1
    assert [op for op in _ops(res) if op not in ("input", "output")] == ["padd", "cmul", "rescale", "padd"]


@pytest.mark.parametrize("coeffs", [[0.1, 0.3, -0.2], [0.0, 1.0, 1e-4], [0.0, 0.0, 400.0]])
def test_what_does_not_fold(coeffs: list[float]) -> None:
    """A concave quadratic (no real s with s^2 = a) and factors outside the bounds keep the
    degree-2 poly (two levels)."""
    node = _conv_act(coeffs).node("p")
    assert quadratic_scale(node) is None and fold_scale(node) is None
    res = _plan(_conv_act(coeffs))
    assert res.plan["summary"]["depth"] == 3
    assert "scaled_by" not in _node(res, "y")["params"]


@pytest.mark.parametrize("a", [0.5, 0.125])
def test_residual_add_with_a_shared_operand_scales_it_by_a_product(a: float) -> None:
    """act(conv(h) + h) with h also read by the conv: the add's second operand cannot take
    the factor in its producer, so a product on the add's edge from h applies it (one level
    on that edge alone, where h arrives a level below conv(h)); the conv takes it in its
    weights and both activations fold (until session 35 the second kept its two levels).
    Not for a factor below MIN_PRODUCT_SCALE (1/2): sqrt(0.125) = 0.354 would shrink the sum
    by 1.5 bits against CKKS noise (ResNet-20's activation; measured at n16boot), so that
    activation keeps its two levels."""
    from planner.assign.fold import MIN_PRODUCT_SCALE

    act = [0.0, 0.5, a]
    s = math.sqrt(a)
    g = _graph(
        {"x": {"shape": [2, 6, 6], "role": "input"}, "w0": {"shape": [2, 2, 3, 3], "role": "weight"},
         "w1": {"shape": [2, 2, 3, 3], "role": "weight"}},
        [{"id": "c0", "op": "conv2d", "inputs": ["x", "w0"], "padding": [1, 1]},
         {"id": "h", "op": "poly", "inputs": ["c0"], "coeffs": act},
         {"id": "c1", "op": "conv2d", "inputs": ["h", "w1"], "padding": [1, 1]},
         {"id": "s", "op": "add", "inputs": ["c1", "h"]},
         {"id": "p", "op": "poly", "inputs": ["s"], "coeffs": act}],
        ["p"])
    res = _plan(g)
    assert _node(res, "h")["params"]["input_scaled_by"] == pytest.approx(s)
    if s < MIN_PRODUCT_SCALE:
        assert "input_scaled_by" not in _node(res, "p")["params"]
        assert res.plan["summary"]["depth"] == 1 + 1 + 1 + 2
        return
    assert _node(res, "p")["params"]["input_scaled_by"] == pytest.approx(s)
    assert _node(res, "s")["params"]["scaled_operands_by_product"] == ["h"]
    assert _node(res, "c1")["params"]["scaled_by"] == pytest.approx(s)
    assert res.plan["summary"]["depth"] == 1 + 1 + 1 + 1


def test_chebyshev_quadratic_evaluated_in_the_monomial_basis_folds() -> None:
    """A degree-2 Chebyshev series over [-2, 2] with a positive x^2 coefficient (as the
    monomial evaluation has it) folds too."""
    coeffs = [0.3, 0.5, 0.4]  # 0.4 T2(x / 2) = 0.4 (x^2 / 2 - 1): a = 0.2
    g = _conv_act(coeffs, basis="chebyshev", domain=[-2.0, 2.0])
    q = quadratic_coeffs(g.node("p"))
    assert q is not None and q[2] == pytest.approx(0.2)
    res = _plan(g)
    assert _node(res, "p")["params"]["input_scaled_by"] == pytest.approx(math.sqrt(0.2))
    assert res.plan["summary"]["depth"] == 2


def test_fold_across_several_ciphertexts() -> None:
    """700 inputs, 600 outputs at 512 slots (sizes no power of two, values spanning several
    ciphertexts): every ciphertext's products take sqrt(a), each output ciphertext gets its
    own monic square, and the plan (checked against numpy with its layout claims) keeps
    two levels."""
    g = _graph(
        {"W": {"shape": [600, 700], "role": "weight"}, "x": {"shape": [700], "role": "input"},
         "bias": {"shape": [600], "role": "weight"}},
        [{"id": "y", "op": "matvec", "inputs": ["W", "x"]}, {"id": "z", "op": "add", "inputs": ["y", "bias"]},
         {"id": "p", "op": "poly", "inputs": ["z"], "coeffs": [0.1, -0.3, 0.25]}],
        ["p"])
    res = _plan(g)
    assert res.plan["summary"]["depth"] == 2
    assert _node(res, "p")["params"]["input_scaled_by"] == 0.5
    assert sum(1 for raw in res.plan["program"] if raw["op"] == "input") > 1
    n_out = sum(1 for raw in res.plan["program"] if raw["op"] == "output")
    assert n_out > 1 and _ops(res).count("cmul") == n_out and "poly" not in _ops(res)


@pytest.mark.parametrize("seed", range(8))
def test_random_quadratics_equal_numpy(seed: int) -> None:
    """Random convex quadratics after a matvec + bias, folded or not (the factor's bounds),
    each plan simulated against numpy."""
    rng = np.random.default_rng(seed)
    a = float(np.exp(rng.uniform(np.log(QUADRATIC_MIN_SCALE**2) - 1, np.log(QUADRATIC_MAX_SCALE**2) + 1)))
    coeffs = [float(rng.normal()), float(rng.normal()), a]
    g = _graph(
        {"W": {"shape": [12, 20], "role": "weight"}, "x": {"shape": [20], "role": "input"},
         "bias": {"shape": [12], "role": "weight"}},
        [{"id": "y", "op": "matvec", "inputs": ["W", "x"]}, {"id": "z", "op": "add", "inputs": ["y", "bias"]},
         {"id": "p", "op": "poly", "inputs": ["z"], "coeffs": coeffs}],
        ["p"])
    res = _plan(g, clean_outputs=bool(seed % 2))
    folds = QUADRATIC_MIN_SCALE <= math.sqrt(a) <= QUADRATIC_MAX_SCALE
    assert (_node(res, "p")["params"].get("input_scaled_by") is not None) == folds
    mask = 1 if _node(res, "p")["params"].get("output_mask") else 0
    assert _node(res, "p")["cost"]["depth"] - mask == (1 if folds else 2)
