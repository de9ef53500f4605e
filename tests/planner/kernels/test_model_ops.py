"""Planning the ops whole models need (broadcast add/sub/mul, slice, concat, matmul over a
batch, sum keepdims, Chebyshev poly): every plan equals the numpy reference in the
simulator and keeps every layout claim (tests/helpers.check_plan), on hand-picked and on
seeded random shapes; and a few plans run on Lattigo to CKKS precision."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from planner.frontend.graph import Graph, parse_graph
from planner.frontend.params import Params
from planner.pipeline import PlanOptions, plan_graph
from tests.helpers import check_plan, plan_and_check, small_params


def G(tensors: dict[str, tuple[list[int], str]], nodes: list[dict[str, Any]], outputs: list[str]) -> Graph:
    return parse_graph({
        "schema": "slotplan.graph/1", "name": "ops",
        "tensors": {k: {"shape": s, "role": r} for k, (s, r) in tensors.items()},
        "nodes": nodes, "outputs": outputs,
    })


CASES: dict[str, Graph] = {
    "bias": G({"x": ([6, 5], "input"), "b": ([5], "weight")}, [{"id": "y", "op": "add", "inputs": ["x", "b"]}], ["y"]),
    "per-channel": G({"x": ([3, 4, 5], "input"), "b": ([3, 1, 1], "weight")},
                     [{"id": "y", "op": "mul", "inputs": ["b", "x"]}], ["y"]),
    "w-minus-ct": G({"x": ([3, 4, 5], "input"), "b": ([3, 1, 1], "weight")},
                    [{"id": "y", "op": "sub", "inputs": ["b", "x"]}], ["y"]),
    "ct-ct-bcast": G({"x": ([6, 5], "input"), "v": ([5], "input")},
                     [{"id": "y", "op": "mul", "inputs": ["x", "v"]}], ["y"]),
    "both-stretch": G({"x": ([6, 1], "input"), "v": ([5], "input")},
                      [{"id": "y", "op": "add", "inputs": ["x", "v"]}], ["y"]),
    "mean-centre": G({"x": ([3, 4, 5], "input")},
                     [{"id": "s", "op": "sum", "inputs": ["x"], "axis": 2, "keepdims": True},
                      {"id": "y", "op": "sub", "inputs": ["x", "s"]}], ["y"]),
    "slice": G({"x": ([4, 6], "input")},
               [{"id": "y", "op": "slice", "inputs": ["x"], "axis": 1, "start": 1, "stop": 4}], ["y"]),
    "slice-matvec": G({"x": ([40], "input"), "w": ([10, 30], "weight")},
                      [{"id": "s", "op": "slice", "inputs": ["x"], "axis": 0, "start": 5, "stop": 35},
                       {"id": "y", "op": "matvec", "inputs": ["w", "s"]}], ["y"]),
    "concat-weight": G({"x": ([4, 6], "input"), "z": ([4, 2], "input"), "w": ([4, 3], "weight")},
                       [{"id": "y", "op": "concat", "inputs": ["x", "w", "z"], "axis": 1}], ["y"]),
    "concat-repeat": G({"x": ([4, 6], "input"), "z": ([2, 6], "input")},
                       [{"id": "p", "op": "poly", "inputs": ["x"], "coeffs": [0, 1, 1]},
                        {"id": "y", "op": "concat", "inputs": ["p", "z", "p"], "axis": 0}], ["y"]),
    "matmul-3d-pt": G({"a": ([2, 3, 4], "input"), "b": ([2, 4, 5], "weight")},
                      [{"id": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"]),
    "matmul-3d-2d": G({"a": ([2, 3, 4], "input"), "b": ([4, 5], "weight")},
                      [{"id": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"]),
    "matmul-2d-3d": G({"a": ([3, 4], "weight"), "b": ([2, 4, 5], "input")},
                      [{"id": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"]),
    "matmul-3d-ctct": G({"a": ([2, 3, 4], "input"), "b": ([2, 4, 5], "input")},
                        [{"id": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"]),
    "matmul-2d-3d-ctct": G({"a": ([3, 4], "input"), "b": ([2, 4, 5], "input")},
                           [{"id": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"]),
    "matmul-4d": G({"a": ([2, 1, 3, 4], "input"), "b": ([1, 3, 4, 2], "weight")},
                   [{"id": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"]),
    "chebyshev": G({"x": ([30], "input")},
                   [{"id": "y", "op": "poly", "inputs": ["x"], "coeffs": [0.1, 0.5, 0.2, -0.1],
                     "basis": "chebyshev", "domain": [-2.0, 3.0]}], ["y"]),
    "chebyshev-unit": G({"x": ([30], "input")},
                        [{"id": "y", "op": "poly", "inputs": ["x"], "coeffs": [0.0, 0.5, 0.0, -0.1],
                          "basis": "chebyshev", "domain": [-1.0, 1.0]}], ["y"]),
    "sum-keepdims": G({"x": ([3, 4, 5], "input")},
                      [{"id": "y", "op": "sum", "inputs": ["x"], "axis": 1, "keepdims": True}], ["y"]),
    # attention-shaped: scores per head, softmax-like normalisation by a broadcast sum
    "heads": G({"q": ([2, 3, 4], "input"), "k": ([2, 4, 3], "input")},
               [{"id": "s", "op": "matmul", "inputs": ["q", "k"]},
                {"id": "e", "op": "poly", "inputs": ["s"], "coeffs": [1.0, 1.0, 0.5]},
                {"id": "z", "op": "sum", "inputs": ["e"], "axis": -1, "keepdims": True},
                {"id": "y", "op": "mul", "inputs": ["e", "z"]}], ["y"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("layout", ["free", "row-major"])
def test_case_matches_numpy(name: str, layout: str) -> None:
    plan_and_check(CASES[name], small_params(10, 8), input_layout=layout, time_limit_s=120.0)


def test_chebyshev_depth_and_lowering() -> None:
    """A Chebyshev series over [a, b] costs ceil(log2(d + 1)) levels for the series and
    one for the change of variable (pmul by 2/(b - a)), unless its monomial form in x is
    well conditioned (low degree, small domain): then it is a monomial poly, no extra level;
    over [-1, 1] there is no change of variable."""
    wide = G({"x": ([30], "input")},
             [{"id": "y", "op": "poly", "inputs": ["x"], "basis": "chebyshev", "domain": [-6.0, 6.0],
               "coeffs": [0.0, 0.6, 0.0, -0.25, 0.0, 0.1, 0.0, 0.05, 0.0, 0.02]}], ["y"])
    res = plan_and_check(wide, small_params(10, 8))
    polys = [i for i in res.plan["program"] if i["op"] == "poly"]
    assert polys and all(p["basis"] == "chebyshev" and p["domain"] == [-1.0, 1.0] for p in polys)
    # degree 9: 4 levels, +1 for the variable; odd over a symmetric domain: p(0) = 0, clean
    assert res.plan["summary"]["depth"] == 5
    small = plan_and_check(CASES["chebyshev"], small_params(10, 8))  # degree 3 over [-2, 3]
    polys = [i for i in small.plan["program"] if i["op"] == "poly"]
    assert polys and all("basis" not in p for p in polys)
    assert small.plan["nodes"][0]["params"]["evaluated"] == "monomial"
    assert small.plan["summary"]["depth"] == 3  # 2 for the series, 1 for the mask (p(0) != 0)
    unit = plan_and_check(CASES["chebyshev-unit"], small_params(10, 8))
    assert unit.plan["summary"]["depth"] == 2  # odd series over [-1, 1]: p(0) = 0, clean


def test_weight_broadcast_is_a_plaintext_op() -> None:
    """A bias onto rows and a per-channel scale: one padd / pmul per ciphertext, no rotation."""
    for name in ("bias", "per-channel"):
        res = plan_and_check(CASES[name], small_params(10, 8))
        s = res.plan["summary"]
        assert s["rotations"] == 0, (name, s)


def test_ct_ct_broadcast_priced_exactly() -> None:
    """A ct-ct broadcast from a row-major input converts by rotations (replicate); the
    plan's rotation count is the simulator's."""
    res = plan_and_check(CASES["ct-ct-bcast"], small_params(10, 8), input_layout="row-major")
    assert res.plan["summary"]["rotations"] > 0
    free = plan_and_check(CASES["ct-ct-bcast"], small_params(10, 8), input_layout="free")
    assert free.plan["summary"]["rotations"] == 0  # the client packs the copies


def test_batched_matmul_analytic_cost_is_the_lowered_count() -> None:
    """The batched matmul's cost (the entry's times the entries, weight plaintexts per block)
    equals the counts of its own lowered program, for every candidate."""
    from planner.pipeline import build_problem

    S = small_params(10, 8)
    for name in ("matmul-3d-pt", "matmul-3d-2d", "matmul-2d-3d", "matmul-3d-ctct", "matmul-2d-3d-ctct",
                 "matmul-4d"):
        prob = build_problem(CASES[name], S, PlanOptions(allow_insecure=True))
        cands = prob.all_candidates["y"]
        assert cands
        for c in cands:
            assert c.analytic is not None or c.params.get("output_mask")
            assert c.cost(S.slots) == c.lowered_cost(S.slots), (name, c.label)


def _random_graph(rng: np.random.Generator, i: int) -> Graph:
    kind = i % 6
    if kind == 0:  # broadcast, either side, weight or ct
        rank = int(rng.integers(1, 4))
        shape = [int(v) for v in rng.integers(1, 7, rank)]
        other = [d if rng.random() < 0.5 else 1 for d in shape][int(rng.integers(0, rank)):]
        role = "weight" if rng.random() < 0.5 else "input"
        op = ["add", "sub", "mul"][int(rng.integers(3))]
        ins = ["x", "b"] if rng.random() < 0.5 else ["b", "x"]
        return G({"x": (shape, "input"), "b": (other or [1], role)}, [{"id": "y", "op": op, "inputs": ins}], ["y"])
    if kind == 1:  # slice then a square
        rank = int(rng.integers(1, 4))
        shape = [int(v) for v in rng.integers(2, 9, rank)]
        axis = int(rng.integers(rank))
        start = int(rng.integers(shape[axis] - 1))
        stop = int(rng.integers(start + 1, shape[axis] + 1))
        return G({"x": (shape, "input")},
                 [{"id": "s", "op": "slice", "inputs": ["x"], "axis": axis, "start": start, "stop": stop},
                  {"id": "y", "op": "mul", "inputs": ["s", "s"]}], ["y", "s"])
    if kind == 2:  # concat of encrypted pieces and a weight
        rank = int(rng.integers(1, 4))
        shape = [int(v) for v in rng.integers(1, 6, rank)]
        axis = int(rng.integers(rank))
        parts: dict[str, tuple[list[int], str]] = {}
        for j in range(int(rng.integers(1, 4))):
            s = list(shape)
            s[axis] = int(rng.integers(1, 5))
            parts[f"p{j}"] = (s, "input" if j == 0 or rng.random() < 0.7 else "weight")
        return G(parts, [{"id": "y", "op": "concat", "inputs": list(parts), "axis": axis}], ["y"])
    if kind == 3:  # matmul over a batch
        b, m, k, n = (int(v) for v in rng.integers(1, 5, 4))
        a_shape = [b, m, k] if rng.random() < 0.7 else [m, k]
        b_shape = [b, k, n] if a_shape[0:1] == [m] or rng.random() < 0.6 else [k, n]
        if len(a_shape) == 2 and len(b_shape) == 2:
            b_shape = [b, k, n]
        roles = ("input", "weight") if rng.random() < 0.5 else ("input", "input")
        if rng.random() < 0.3:
            roles = ("weight", "input")
        return G({"a": (a_shape, roles[0]), "b": (b_shape, roles[1])},
                 [{"id": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"])
    if kind == 4:  # sum keepdims then a broadcast subtraction (mean-centring)
        shape = [int(v) for v in rng.integers(1, 7, 3)]
        axis = int(rng.integers(3))
        return G({"x": (shape, "input")},
                 [{"id": "s", "op": "sum", "inputs": ["x"], "axis": axis, "keepdims": True},
                  {"id": "y", "op": "sub", "inputs": ["x", "s"]}], ["y"])
    # Chebyshev series on a random domain
    deg = int(rng.integers(1, 8))
    lo = float(rng.uniform(-4, 0))
    hi = lo + float(rng.uniform(0.5, 6))
    coeffs = [round(float(c), 3) for c in rng.uniform(-1, 1, deg + 1)]
    coeffs[-1] = coeffs[-1] or 0.5
    return G({"x": ([int(rng.integers(1, 40))], "input")},
             [{"id": "y", "op": "poly", "inputs": ["x"], "coeffs": coeffs, "basis": "chebyshev",
               "domain": [round(lo, 3), round(hi, 3)]}], ["y"])


@pytest.mark.parametrize("i", range(48))
def test_random_shapes(i: int) -> None:
    rng = np.random.default_rng(1000 + i)
    g = _random_graph(rng, i)
    # a generous solver limit: these models solve in milliseconds, but the suite may share
    # a loaded machine (CP-SAT's limit is wall time)
    plan_and_check(g, small_params(10, 10), input_layout="free" if i % 2 else "row-major",
                   clean_outputs=i % 5 != 0, time_limit_s=120.0)


# ----------------------------------------------------------------------------- Lattigo


def _lattigo_available() -> bool:
    from backends.lattigo_backend import available

    return available()


LATTIGO_CASES = {
    "bias+per-channel": G({"x": ([3, 8, 8], "input"), "b": ([3, 1, 1], "weight"), "r": ([8], "weight")},
                          [{"id": "m", "op": "mul", "inputs": ["x", "b"]},
                           {"id": "y", "op": "add", "inputs": ["m", "r"]}], ["y"]),
    "ct-ct-bcast": G({"x": ([6, 5], "input"), "v": ([5], "input")},
                     [{"id": "y", "op": "mul", "inputs": ["x", "v"]}], ["y"]),
    "ct-ct-bcast-row-major": G({"x": ([3, 6, 5], "input"), "v": ([3, 1, 5], "input")},
                               [{"id": "y", "op": "sub", "inputs": ["x", "v"]}], ["y"]),
    "slice+concat": G({"x": ([4, 6], "input"), "z": ([4, 2], "input"), "w": ([4, 3], "weight")},
                      [{"id": "s", "op": "slice", "inputs": ["x"], "axis": 1, "start": 2, "stop": 5},
                       {"id": "y", "op": "concat", "inputs": ["s", "w", "z"], "axis": 1}], ["y"]),
    "matmul-3d": G({"a": ([2, 3, 4], "input"), "b": ([2, 4, 5], "weight")},
                   [{"id": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"]),
    "matmul-3d-ctct": G({"a": ([2, 3, 4], "input"), "b": ([2, 4, 5], "input")},
                        [{"id": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"]),
    "chebyshev": G({"x": ([64], "input")},
                   [{"id": "y", "op": "poly", "inputs": ["x"], "basis": "chebyshev", "domain": [-1.5, 2.5],
                     "coeffs": [0.2, 0.6, -0.25, 0.1, 0.05, -0.02, 0.01, 0.005]}], ["y"]),
}


@pytest.mark.skipif(not _lattigo_available(), reason="Lattigo extension not built (make lattigo)")
@pytest.mark.parametrize("name", sorted(LATTIGO_CASES))
def test_lattigo(name: str) -> None:
    from backends.runner import run_plan

    params = Params(log_n=12, log_q=(50,) + (40,) * 6, log_p=(50,), log_scale=40, name="test12")
    # row-major inputs: the ct-ct broadcast then converts by rotations (free when packed)
    layout = "row-major" if name.endswith("row-major") else "free"
    res = plan_graph(LATTIGO_CASES[name], params, PlanOptions(allow_insecure=True, input_layout=layout))
    if layout == "row-major":
        assert res.plan["summary"]["rotations"] > 0
    check_plan(res, LATTIGO_CASES[name])
    rep = run_plan(res.plan, res.tables, "lattigo", seed=3)
    assert rep.ok, (name, rep.max_rel_error)
    assert rep.max_rel_error < 1e-4


def test_ir_chebyshev_poly_rules() -> None:
    """The instruction: basis and domain checked; depth ceil(log2(d + 1)), one more for a
    domain other than [-1, 1]; the simulator's value is the Chebyshev series."""
    from common.errors import PlanFileError
    from planner import ir

    base = {"op": "poly", "dst": "b", "src": "a", "coeffs": [0.5, 1.0, 0.0, 0.25]}
    unit = ir.Instr.from_json({**base, "basis": "chebyshev", "domain": [-1.0, 1.0]})
    wide = ir.Instr.from_json({**base, "basis": "chebyshev", "domain": [-4.0, 2.0]})
    mono = ir.Instr.from_json(base)
    assert unit.depth({"a": 1}) == 3 and wide.depth({"a": 1}) == 4 and mono.depth({"a": 1}) == 3
    assert "basis" not in mono.to_json() and wide.to_json()["domain"] == [-4.0, 2.0]
    x = np.linspace(-4, 2, 7)
    assert isinstance(wide, ir.Poly)
    np.testing.assert_allclose(wide.evaluate(x), np.polynomial.chebyshev.chebval((2 * x + 2) / 6, base["coeffs"]))
    for bad, field in (({"basis": "chebyshev"}, "domain"), ({"basis": "chebyshev", "domain": [1.0, 1.0]}, "domain"),
                       ({"basis": "legendre"}, "basis"), ({"domain": [0.0, 1.0]}, "domain")):
        with pytest.raises(PlanFileError, match=field):
            ir.Instr.from_json({**base, **bad})


@pytest.mark.skipif(not _lattigo_available(), reason="Lattigo extension not built (make lattigo)")
def test_lattigo_secure_n13() -> None:
    """The preset n13 (128-bit secure, 3 levels): graphs mixing the model ops."""
    g1 = G({"x": ([2, 4, 8], "input"), "b": ([2, 1, 1], "weight"), "z": ([2, 4, 2], "input")},
           [{"id": "s", "op": "slice", "inputs": ["x"], "axis": 2, "start": 1, "stop": 7},
            {"id": "a", "op": "mul", "inputs": ["s", "b"]},
            {"id": "p", "op": "poly", "inputs": ["a"], "coeffs": [0.0, 0.8, 0.0, -0.1], "basis": "chebyshev",
             "domain": [-1.0, 1.0]},
            {"id": "y", "op": "concat", "inputs": ["p", "z"], "axis": 2}], ["y"])
    g2 = G({"x": ([3, 4, 6], "input"), "w": ([3, 6, 5], "weight"), "b": ([5], "weight")},
           [{"id": "m", "op": "matmul", "inputs": ["x", "w"]},
            {"id": "y", "op": "add", "inputs": ["m", "b"]}], ["y"])
    for g in (g1, g2):
        _run_n13(g)


def _run_n13(g: Graph) -> None:
    from backends.runner import run_plan
    from planner.frontend.params import load_params

    res = plan_graph(g, load_params("n13"), PlanOptions())
    check_plan(res, g)
    rep = run_plan(res.plan, res.tables, "lattigo", seed=5)
    assert rep.ok and rep.max_rel_error < 1e-4, rep.max_rel_error
