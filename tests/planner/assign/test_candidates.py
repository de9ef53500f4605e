"""planner.assign.candidates on its own: every element-wise candidate (plaintext and
ciphertext operands, broadcasting, both operand orders, dirty and clean layouts) lowered
alone and simulated equals numpy; polynomials (monomial, x^2 + c, Chebyshev over [-1, 1]
and over another domain, in the monomial basis where harmless) equal numpy and leave
``poly_const_term`` in an empty slot; the output mask; broadcasting indices; the refusals
name the node."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from backends.sim import simulate
from planner.assign.candidates import (
    KERNEL_FAMILIES,
    KERNELS,
    LINEAR_KERNELS,
    PlanError,
    broadcast_index,
    broadcast_layout,
    chebyshev_as_monomial,
    chebyshev_map,
    elementwise_candidates,
    fold_scale,
    input_layout,
    linear_candidates,
    poly_const_term,
    problem_candidates,
    with_clean_output,
)
from planner.frontend.graph import Graph, parse_graph
from planner.frontend.reference import random_values, reference
from planner.ir.builder import LazyTables, ProgramBuilder
from planner.kernels.base import Candidate
from planner.layout.channels import MappedLayout, all_maps

S = 64


def _graph(tensors: dict[str, Any], nodes: list[dict[str, Any]]) -> Graph:
    return parse_graph({"schema": "slotplan.graph/1", "name": "cands", "tensors": tensors, "nodes": nodes,
                        "outputs": [nodes[-1]["id"]]})


def run_candidate(graph: Graph, cand: Candidate, seed: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """Pack every encrypted operand as the candidate reads it (garbage in the free slots of a
    dirty layout), lower the candidate alone, read its result through its out layout:
    (result, numpy reference of the node, slots leaked beyond a clean result)."""
    vals = random_values(graph, seed)
    rng = np.random.default_rng(seed)
    b = ProgramBuilder(S)
    regs: dict[str, list[str]] = {}
    for t, lay in cand.in_layouts.items():
        regs[t] = []
        for q in range(lay.n_ct):
            idx = lay.index_map(q).copy()
            if not lay.clean:
                free = idx < 0
                idx[free] = rng.integers(0, lay.size, int(free.sum()))
            regs[t].append(b.input(t, f"in/{t}/{q}", lambda idx=idx: (idx, None)))
    outs = cand.lower(b, regs)
    out = cand.out_layout
    for q, r in enumerate(outs):
        b.output(r, "y", f"out/{q}", lambda q=q: (out.index_map(q).copy(), None))
    shape = graph.shape(cand.node)
    plan = {"params": {"slots": S, "log_q": [50] + [40] * 8}, "program": b.instrs,
            "plaintexts": {n: p.to_json() for n, p in b.plaintexts.items()}, "outputs": {"y": list(shape)}}
    res = simulate(plan, LazyTables(b.tables), vals)
    return res.outputs["y"], reference(graph, vals)[cand.node], res.leaked_slots["y"]


def _bases(graph: Graph, dirty: bool) -> dict[str, list[Any]]:
    out = {}
    for t in graph.inputs:
        lay = input_layout(graph, t, S)
        out[t] = [lay.with_clean(False)] if dirty else [lay]
    return out


@pytest.mark.parametrize("op", ["add", "sub", "mul"])
@pytest.mark.parametrize("w_shape", [[6, 20], [1, 20], [20], [6, 1]])
@pytest.mark.parametrize("w_first", [False, True])
@pytest.mark.parametrize("dirty", [False, True])
def test_plaintext_operand_elementwise_equals_numpy(op: str, w_shape: list[int], w_first: bool, dirty: bool) -> None:
    """x (6 x 20, two ciphertexts of 64 slots) op w, w op x, with w broadcasting."""
    g = _graph({"x": {"shape": [6, 20], "role": "input"}, "w": {"shape": w_shape, "role": "weight"}},
               [{"id": "y", "op": op, "inputs": ["w", "x"] if w_first else ["x", "w"]}])
    cands = elementwise_candidates(g, g.node("y"), _bases(g, dirty))
    assert cands
    for c in cands:
        got, want, leaked = run_candidate(g, c)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        assert (c.params.get("broadcast") == ["w"]) == (w_shape != [6, 20])
        if c.out_layout.clean:
            assert leaked == 0
        # a product with a weight is clean whatever the operand holds; an add with a dirty operand is not
        assert c.out_layout.clean == (op == "mul" or not dirty)


@pytest.mark.parametrize("op", ["add", "sub", "mul"])
@pytest.mark.parametrize("b_shape", [[4, 24], [1, 24], [4, 1]])
def test_ciphertext_operands_elementwise_equals_numpy(op: str, b_shape: list[int]) -> None:
    """Two encrypted operands; a broadcasting one is read through a replicated layout."""
    g = _graph({"a": {"shape": [4, 24], "role": "input"}, "b": {"shape": b_shape, "role": "input"}},
               [{"id": "y", "op": op, "inputs": ["a", "b"]}])
    for c in elementwise_candidates(g, g.node("y"), _bases(g, False)):
        got, want, leaked = run_candidate(g, c, seed=3)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        assert leaked == 0
        assert c.in_layouts["b"].shape == tuple(b_shape)


POLYS: list[dict[str, Any]] = [
    {"coeffs": [0.3, -0.5, 0.25, 0.125]},  # monomial
    {"coeffs": [0.7, 0.0, 1.0]},  # x^2 + c: one cmul
    {"coeffs": [0.25, -0.75, 1.0]},  # x (x + c1) + c0: a padd, one cmul
    {"coeffs": [0.1, 0.5, 0.3, -0.2], "basis": "chebyshev", "domain": [-1.0, 1.0]},
    {"coeffs": [0.1, 0.5, 0.3, -0.2, 0.05], "basis": "chebyshev", "domain": [-3.0, 5.0]},  # change of variable
    {"coeffs": [0.2, 0.4, -0.1], "basis": "chebyshev", "domain": [-2.0, 2.0]},  # harmless: monomial basis
]


@pytest.mark.parametrize("spec", POLYS, ids=lambda s: f"{s.get('basis', 'mono')}{s.get('domain', '')}{len(s['coeffs'])}")
def test_poly_candidates_equal_numpy_and_leave_the_constant_term(spec: dict[str, Any]) -> None:
    dom = spec.get("domain", [-1.0, 1.0])
    g = _graph({"x": {"shape": [40], "role": "input", "range": dom}}, [{"id": "y", "op": "poly", "inputs": ["x"], **spec}])
    (c,) = elementwise_candidates(g, g.node("y"), _bases(g, False))
    got, want, leaked = run_candidate(g, c, seed=5)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    # the 24 empty slots of the ciphertext hold what the polynomial makes of 0
    const = poly_const_term(g.node("y"))
    assert const == pytest.approx(float(reference(g, {"x": np.zeros(40)})["y"][0]), abs=1e-12)
    assert c.out_layout.clean == (const == 0.0)
    assert leaked == (0 if const == 0.0 else S - 40)
    node = g.node("y")
    mono = chebyshev_as_monomial(node)
    if spec.get("basis") == "chebyshev" and dom != [-1.0, 1.0]:
        assert (mono is None) == (fold_scale(node) is not None)
        assert (c.params.get("evaluated") == "monomial") == (mono is not None)
        if mono is None:
            assert fold_scale(node) == chebyshev_map((dom[0], dom[1]))[0]
    else:
        assert mono is None and fold_scale(node) is None
    if spec["coeffs"] == [0.7, 0.0, 1.0]:
        b, _ = c.dry_program(S)
        assert [i["op"] for i in b.instrs] == ["cmul", "rescale", "padd"]
    if spec["coeffs"] == [0.25, -0.75, 1.0]:
        b, _ = c.dry_program(S)
        assert [i["op"] for i in b.instrs] == ["padd", "cmul", "rescale", "padd"]


@pytest.mark.parametrize(("a", "b"), [(-3.0, 5.0), (0.0, 1.0), (-1.0, 1.0), (2.0, 10.0)])
def test_chebyshev_map_sends_the_domain_to_the_unit_interval(a: float, b: float) -> None:
    s, c = chebyshev_map((a, b))
    assert s * a + c == pytest.approx(-1.0) and s * b + c == pytest.approx(1.0)


def test_chebyshev_as_monomial_refuses_what_would_lose_precision() -> None:
    def node(coeffs: list[float], dom: list[float]) -> Any:
        return _graph({"x": {"shape": [4], "role": "input", "range": dom}},
                      [{"id": "y", "op": "poly", "inputs": ["x"], "coeffs": coeffs, "basis": "chebyshev",
                        "domain": dom}]).node("y")

    assert chebyshev_as_monomial(node([0.0] * 8 + [1.0], [-2.0, 2.0])) is None  # degree 8 > 7
    assert chebyshev_as_monomial(node([0.1, 0.5, 0.3, -0.2, 0.05], [-3.0, 5.0])) is None  # 5^4 > 2^8
    mono = chebyshev_as_monomial(node([0.2, 0.4, -0.1], [-2.0, 2.0]))
    assert mono is not None
    x = np.linspace(-2, 2, 17)
    np.testing.assert_allclose(np.polynomial.polynomial.polyval(x, mono),
                               np.polynomial.Chebyshev([0.2, 0.4, -0.1], domain=[-2, 2])(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("src", "dst"), [((3, 1), (3, 4)), ((1, 4), (3, 4)), ((4,), (3, 4)), ((1,), (2, 3)),
                                          ((2, 1, 3), (2, 5, 3))])
def test_broadcast_index_is_numpy_broadcasting(src: tuple[int, ...], dst: tuple[int, ...]) -> None:
    a = np.random.default_rng(0).uniform(size=src)
    assert np.array_equal(a.ravel()[broadcast_index(src, dst)], np.broadcast_to(a, dst).ravel())


def test_broadcast_layout_reads_the_stretched_element_in_each_slot() -> None:
    g = _graph({"x": {"shape": [3, 30], "role": "input"}}, [{"id": "y", "op": "poly", "inputs": ["x"], "coeffs": [0.0, 1.0]}])
    lay = input_layout(g, "x", S)
    assert broadcast_layout(lay, (3, 30)) is lay
    b = broadcast_layout(lay, (1, 30))
    assert isinstance(b, MappedLayout) and b.shape == (1, 30) and b.n_ct == lay.n_ct
    m, bm = all_maps(lay), all_maps(b)
    assert np.array_equal(bm >= 0, m >= 0) and np.array_equal(bm[m >= 0], m[m >= 0] % 30)


def test_with_clean_output_masks_a_dirty_result() -> None:
    g = _graph({"x": {"shape": [40], "role": "input"}},
               [{"id": "y", "op": "poly", "inputs": ["x"], "coeffs": [0.5, 1.0]}])  # p(0) = 0.5: dirty
    (c,) = elementwise_candidates(g, g.node("y"), _bases(g, False))
    assert not c.out_layout.clean
    m = with_clean_output(c, S)
    assert m.out_layout.clean and m.params["output_mask"] and m.node == c.node
    got, want, leaked = run_candidate(g, m, seed=2)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert leaked == 0
    assert m.cost(S).pmul == c.cost(S).pmul + 1 and m.cost(S) == m.lowered_cost(S)
    assert with_clean_output(m, S) is m  # already clean: unchanged


def test_refusals_name_the_node() -> None:
    g = _graph({"W": {"shape": [8, 16], "role": "input"}, "x": {"shape": [16], "role": "input"}},
               [{"id": "mv", "op": "matvec", "inputs": ["W", "x"]}])
    with pytest.raises(PlanError, match="node 'mv': matvec with an encrypted matrix"):
        linear_candidates(g, g.node("mv"), input_layout(g, "x", S), LINEAR_KERNELS, False)
    g2 = _graph({"W": {"shape": [8, 16], "role": "weight"}, "x": {"shape": [16], "role": "input"}},
                [{"id": "mv", "op": "matvec", "inputs": ["W", "x"]}])
    with pytest.raises(PlanError, match="node 'mv': no allowed kernel"):
        linear_candidates(g2, g2.node("mv"), input_layout(g2, "x", S), ("elementwise",), False)
    cands = linear_candidates(g2, g2.node("mv"), input_layout(g2, "x", S), LINEAR_KERNELS, True)
    assert {c.kernel for c in cands} >= {"bsgs", "hs-diagonal", "imra"}
    with pytest.raises(PlanError, match="node 'mv'"):
        problem_candidates(cands[0].source or _problem(g2), g2.node("mv"), ("view",), False)
    g3 = _graph({"w": {"shape": [4], "role": "weight"}, "x": {"shape": [4], "role": "input"}},
                [{"id": "y", "op": "add", "inputs": ["w", "w"]}, {"id": "z", "op": "add", "inputs": ["y", "x"]}])
    with pytest.raises(PlanError, match="node 'y': add has no encrypted operand"):
        elementwise_candidates(g3, g3.node("y"), _bases(g3, False))


def _problem(g: Graph) -> Any:
    from planner.assign.candidates import _linear_problem

    return _linear_problem(g, g.node("mv"), input_layout(g, "x", S))


def test_input_layout_natural_segmented_or_refused() -> None:
    g = _graph({"x": {"shape": [2, 10, 10], "role": "input"}, "big": {"shape": [2, 12, 12], "role": "input"},
                "huge": {"shape": [2, 3, 100], "role": "input"}},
               [{"id": "y", "op": "poly", "inputs": ["x"], "coeffs": [0.0, 1.0]}])
    assert input_layout(g, "x", 128).n_ct == 2  # one 100-slot channel per 128-slot ciphertext
    seg = input_layout(g, "big", 128)  # a 144-slot channel: row segments
    assert seg.n_ct == 4 and seg.label.startswith("segrows")
    m = all_maps(seg)
    assert np.array_equal(np.sort(m[m >= 0]), np.arange(2 * 12 * 12))  # every element once
    with pytest.raises(PlanError, match="tensor .huge.: one channel of 300 elements"):  # a 100-slot row
        input_layout(g, "huge", 64)


def test_kernel_families_partition() -> None:
    names = KERNEL_FAMILIES.names()
    assert set(LINEAR_KERNELS) <= set(KERNELS) <= set(names)
    assert {KERNEL_FAMILIES.create(n).kind for n in names} == {"linear", "ct-ct", "elementwise", "complex", "cins"}
    assert all(KERNEL_FAMILIES.create(n).linear is not None for n in LINEAR_KERNELS)


def test_a_cap_below_a_candidates_own_minimum_drops_it() -> None:
    """Under a memory cap the choice model keeps only the candidates that can run by
    themselves within it (planner.assign.problem.candidate_min_cap: their working set plus one
    key, hoisted groups split): a cap one byte below IMRA's minimum leaves the other kernel
    families, each within the cap, and the planner's choice is one of them (the whole plan
    under such a cap, scheduled and simulated, is tests/planner/keys/test_keys.py::
    test_tight_cap_changes_the_kernel_choice, in the slow tier)."""
    from planner.assign.problem import build_problem, candidate_min_cap
    from planner.frontend.params import load_params
    from planner.pipeline import PlanOptions
    from tests.helpers import matvec_graph

    g = matvec_graph(1024, 1024)
    params = load_params("n13")
    kernels = ("imra", "bsgs", "hs-diagonal", "fhelipe")
    free = build_problem(g, params, PlanOptions(kernels=kernels))
    (node,) = free.candidates
    assert {c.kernel for c in free.candidates[node]} >= {"imra"}  # uncapped: IMRA among the kept
    assert all(c.min_cap_bytes is None for c in free.candidates[node])  # no cap: nothing walked
    # every candidate before pruning, with what it needs by itself
    need = {c.label: candidate_min_cap(c, params) for c in free.all_candidates[node]}
    cap = min(need[c.label] for c in free.all_candidates[node] if c.kernel == "imra") - 1
    fit = {c.label for c in free.all_candidates[node] if need[c.label] <= cap}
    assert fit and not any(c.kernel == "imra" for c in free.all_candidates[node] if c.label in fit)
    capped = build_problem(g, params, PlanOptions(kernels=kernels, memory_cap_bytes=cap))
    left = capped.candidates[node]
    assert left and {c.label for c in left} <= fit
    assert all(c.kernel != "imra" and c.min_cap_bytes == need[c.label] for c in left)
