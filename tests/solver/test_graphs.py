"""Whole-graph planning: random small graphs of matmul (ct-pt and ct-ct) / add / transpose /
poly / sum chains plan, simulate and equal numpy; CP-SAT and z3 reach the same optimum on every
graph of up to 6 nodes; the exact assignment is never worse than greedy."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.frontend.graph import parse_graph
from planner.pipeline import PlanOptions, build_problem, lower_solution, solve_problem
from solver import SOLVERS, create
from solver.model import Solution, Status
from tests.helpers import check_plan, small_params


@st.composite
def graphs(draw: st.DrawFn) -> dict[str, Any]:
    m, k = draw(st.integers(2, 10)), draw(st.integers(2, 10))
    tensors: dict[str, Any] = {"x": {"shape": [m, k], "role": "input"}}
    nodes: list[dict[str, Any]] = []
    cur, shape = "x", [m, k]
    for i in range(draw(st.integers(1, 5))):
        op = draw(st.sampled_from(["matmul", "matmul_left", "add_w", "add_self", "transpose", "poly", "mul_w", "sum", "gram"]))
        nid = f"n{i}"
        if op == "matmul":
            n = draw(st.integers(2, 10))
            tensors[f"w{i}"] = {"shape": [shape[1], n], "role": "weight"}
            nodes.append({"id": nid, "op": "matmul", "inputs": [cur, f"w{i}"]})
            shape = [shape[0], n]
        elif op == "matmul_left":
            n = draw(st.integers(2, 10))
            tensors[f"w{i}"] = {"shape": [n, shape[0]], "role": "weight"}
            nodes.append({"id": nid, "op": "matmul", "inputs": [f"w{i}", cur]})
            shape = [n, shape[1]]
        elif op in ("add_w", "mul_w"):
            tensors[f"w{i}"] = {"shape": list(shape), "role": "weight"}
            nodes.append({"id": nid, "op": "add" if op == "add_w" else "mul", "inputs": [cur, f"w{i}"]})
        elif op == "add_self":
            nodes.append({"id": nid, "op": "add", "inputs": [cur, cur]})
        elif op == "transpose":
            nodes.append({"id": nid, "op": "transpose", "inputs": [cur], "perm": [1, 0]})
            shape = [shape[1], shape[0]]
        elif op == "gram":  # cur @ cur^T: a ciphertext x ciphertext matmul
            nodes.append({"id": nid + "t", "op": "transpose", "inputs": [cur], "perm": [1, 0]})
            nodes.append({"id": nid, "op": "matmul", "inputs": [cur, nid + "t"]})
            shape = [shape[0], shape[0]]
        elif op == "poly":
            nodes.append({"id": nid, "op": "poly", "inputs": [cur], "coeffs": [0.5, 0.25, 0.125]})
        else:
            if shape[0] == 1:
                continue
            nodes.append({"id": nid, "op": "sum", "inputs": [cur], "axis": 0})
            tensors_shape = [1, shape[1]]
            nodes.append({"id": nid + "r", "op": "reshape", "inputs": [nid], "shape": tensors_shape})
            cur, shape = nid + "r", tensors_shape
            continue
        cur = nid
    if not nodes:
        nodes.append({"id": "n0", "op": "poly", "inputs": ["x"], "coeffs": [0.0, 1.0, 0.5]})
        cur = "n0"
    return {"schema": "slotplan.graph/1", "name": "rand", "tensors": tensors, "nodes": nodes, "outputs": [cur]}


SOLVE_LIMIT_S = 30.0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=graphs(), layout=st.sampled_from(["free", "row-major"]))
def test_random_graphs_match_numpy_and_solvers_agree(spec: dict[str, Any], layout: str) -> None:
    g = parse_graph(spec)
    params = small_params(10, levels=12)
    problem = build_problem(g, params, PlanOptions(input_layout=layout))
    sols = {name: create(name).solve(problem.model, SOLVE_LIMIT_S) for name in SOLVERS}
    assert sols["cpsat"].status is Status.OPTIMAL
    if len(g.nodes) <= 6:
        # z3 proves most of these optimal in under a second, but some 3-node graphs keep it
        # searching past 120 s (FEASIBLE): its plan must then be no better than CP-SAT's
        # optimum, and equal to it whenever z3 proves optimality.
        z3, cp = sols["z3"], sols["cpsat"]
        assert z3.status in (Status.OPTIMAL, Status.FEASIBLE) and z3.objective is not None
        assert cp.objective is not None and z3.objective >= cp.objective
        if z3.status is Status.OPTIMAL:
            assert z3.objective == cp.objective
    greedy = problem.model.greedy()
    g_obj = problem.model.evaluate(greedy)
    assert g_obj is None or sols["cpsat"].objective is not None and sols["cpsat"].objective <= g_obj
    for sol in sols.values():
        plan, tables = lower_solution(problem, sol)
        from planner.pipeline import PlanResult

        check_plan(PlanResult(plan, tables, sol, problem, 0.0), g)


def test_exact_beats_greedy_on_a_chain() -> None:
    """A chain where the cheapest kernel per node leaves a layout the next node must convert."""
    spec = {
        "schema": "slotplan.graph/1", "name": "chain",
        "tensors": {"x": {"shape": [8, 8], "role": "input"}, "w1": {"shape": [8, 8], "role": "weight"},
                    "w2": {"shape": [8, 8], "role": "weight"}},
        "nodes": [{"id": "a", "op": "matmul", "inputs": ["x", "w1"]},
                  {"id": "t", "op": "transpose", "inputs": ["a"], "perm": [1, 0]},
                  {"id": "b", "op": "matmul", "inputs": ["t", "w2"]}],
        "outputs": ["b"],
    }
    g = parse_graph(spec)
    problem = build_problem(g, small_params(10, levels=6), PlanOptions())
    sol = solve_problem(problem)
    greedy = problem.model.greedy()
    assert sol.objective is not None
    g_obj = problem.model.evaluate(greedy)
    assert g_obj is not None and sol.objective <= g_obj
    plan, tables = lower_solution(problem, sol)
    from planner.pipeline import PlanResult

    check_plan(PlanResult(plan, tables, sol, problem, 0.0), g)
    gsol = Solution(tuple(greedy.items()), Status.FEASIBLE, g_obj, None, 0.0, "greedy")
    gplan, gtables = lower_solution(problem, gsol)
    check_plan(PlanResult(gplan, gtables, gsol, problem, 0.0), g)


def test_ct_ct_chain_solvers_agree_and_match_numpy() -> None:
    """x -> x x^T -> poly -> (.) W -> (.)(.)^T: two ct-ct matmuls with conversions between."""
    spec = {
        "schema": "slotplan.graph/1", "name": "gram-chain",
        "tensors": {"x": {"shape": [7, 5], "role": "input"}, "w": {"shape": [7, 6], "role": "weight"}},
        "nodes": [{"id": "xt", "op": "transpose", "inputs": ["x"], "perm": [1, 0]},
                  {"id": "g1", "op": "matmul", "inputs": ["x", "xt"]},
                  {"id": "p", "op": "poly", "inputs": ["g1"], "coeffs": [0.5, 0.25, 0.125]},
                  {"id": "h", "op": "matmul", "inputs": ["p", "w"]},
                  {"id": "ht", "op": "transpose", "inputs": ["h"], "perm": [1, 0]},
                  {"id": "g2", "op": "matmul", "inputs": ["ht", "h"]}],
        "outputs": ["g2"],
    }
    g = parse_graph(spec)
    problem = build_problem(g, small_params(10, levels=14), PlanOptions())
    sols = {name: create(name).solve(problem.model, 60.0) for name in SOLVERS}
    assert all(s.status is Status.OPTIMAL for s in sols.values())
    assert sols["cpsat"].objective == sols["z3"].objective
    from planner.pipeline import PlanResult

    for sol in sols.values():
        plan, tables = lower_solution(problem, sol)
        assert sum(n["kernel"].startswith("ct-ct") for n in plan["nodes"]) == 2
        check_plan(PlanResult(plan, tables, sol, problem, 0.0), g)
