"""CinS conv layers as candidates of the choice model (issue 13, step 4): the solver
trades a NeuJeans layer (its bootstrap inside) against slot kernels and separately placed
bootstraps; every plan simulates against numpy with its layout claims checked."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from planner import ir
from planner.frontend.graph import Graph, parse_graph
from planner.frontend.params import preset
from planner.pipeline import PlanError, PlanOptions, PlanOptionsLiteral, build_problem, plan_graph
from solver.model import ChoiceModel
from tests.helpers import REPO_ROOT, check_plan, optimal_solutions
from tests.planner.assign.test_bootstrap_model import brute_force, random_boot_model

SOLVERS = ("cpsat", "z3")
N14BOOT = preset("n14boot")


def conv_chain(layers: int, c: int, hw: int, degree: int) -> Graph:
    """``layers`` x (3x3 conv, polynomial activation of ``degree``), measured-style node
    ranges so the bootstraps need no large scaling."""
    coeffs = [0.0, 0.5] + [0.01] * (degree - 1)
    tensors: dict[str, Any] = {"x": {"shape": [c, hw, hw], "role": "input", "range": [-1.0, 1.0]}}
    nodes: list[dict[str, Any]] = []
    src = "x"
    for i in range(layers):
        tensors[f"w{i}"] = {"shape": [c, c, 3, 3], "role": "weight", "range": [-0.02, 0.02]}
        nodes.append({"id": f"c{i}", "op": "conv2d", "inputs": [src, f"w{i}"], "padding": [1, 1],
                      "range": [-1.0, 1.0]})
        nodes.append({"id": f"a{i}", "op": "poly", "inputs": [f"c{i}"], "coeffs": coeffs, "range": [-1.0, 1.0]})
        src = f"a{i}"
    return parse_graph({"schema": "slotplan.graph/1", "name": f"chain{layers}x{c}x{hw}", "tensors": tensors,
                        "nodes": nodes, "outputs": [src]})


def _plan(g: Graph, **opts: Any) -> Any:
    return plan_graph(g, N14BOOT, PlanOptions(allow_insecure=True, **opts))


def _check(res: Any, g: Graph) -> None:
    """Simulate against numpy: weights within their declared ranges (the plan's range
    assumptions), every layout claim checked."""
    check_plan(res, g, rtol=1e-7)


def test_solver_picks_cins_where_it_is_cheaper() -> None:
    # 128 channels of 7x7 with degree-31 activations (5 levels): every layer needs a
    # bootstrap anyway; a real CinS slice (8x8 cells, l = 32) holds a channel in the
    # ring's N coefficients, so one bootstrap_cins refreshes what two slot bootstraps
    # would, and the CinS conv needs fewer rotations than the slot kernels
    g = conv_chain(3, 128, 7, 31)
    res = _plan(g)
    kernels = {n["id"]: n["kernel"] for n in res.plan["nodes"]}
    assert all(kernels[f"c{i}"].startswith("cins-") for i in range(3)), kernels
    prog = [ir.decode(i) for i in res.plan["program"]]
    n_cins = sum(isinstance(i, ir.BootstrapCins) for i in prog)
    assert n_cins == res.plan["summary"]["bootstraps"] == 3
    assert all(i.fused for i in prog if isinstance(i, ir.BootstrapCins))
    # the node's cost vector carries its bootstraps
    assert all(n["cost"].get("bootstraps") == 1 for n in res.plan["nodes"] if n["kernel"].startswith("cins-"))
    _check(res, g)
    # against the slot-only plan of the same graph: cheaper by the model's own objective
    slot = _plan(g, cins=False)
    assert not any(n["kernel"].startswith("cins-") for n in slot.plan["nodes"])
    assert slot.plan["options"]["cins"] is False and "cins" not in res.plan["options"]
    assert res.solution.objective is not None and slot.solution.objective is not None
    assert res.solution.objective < slot.solution.objective
    assert res.plan["summary"]["bootstraps"] > slot.plan["summary"]["bootstraps"]  # 3 vs 2, but each refreshes 2x
    _check(slot, g)


def test_solver_keeps_slot_kernels_where_they_are_cheaper() -> None:
    # 64 channels of 8x8: the CinS slice needs 16x16 cells (room for the taps), so a layer
    # bootstraps as many ciphertexts as the slot path but every one of them; the slot
    # path bootstraps only where the levels run out
    g = conv_chain(3, 64, 8, 31)
    prob = build_problem(g, N14BOOT, PlanOptions(allow_insecure=True))
    assert any(lbl.startswith("cins-") for grp in prob.model.groups for lbl in grp.labels)
    res = _plan(g)
    assert not any(n["kernel"].startswith("cins-") for n in res.plan["nodes"])
    assert res.plan["summary"]["bootstraps"] == 2
    _check(res, g)


def test_forced_cins_layer_simulates_with_its_scaling() -> None:
    # only the CinS families for the convs: a strided layer too (direct and decomposed
    # candidates), weights whose interval bound needs a scale > 1 before bootstrap_cins
    g = parse_graph({
        "schema": "slotplan.graph/1", "name": "cins-forced",
        "tensors": {"x": {"shape": [4, 8, 8], "role": "input", "range": [-1.0, 1.0]},
                    "w0": {"shape": [8, 4, 3, 3], "role": "weight"},
                    "w1": {"shape": [8, 8, 3, 3], "role": "weight", "range": [-0.1, 0.1]}},
        "nodes": [{"id": "c0", "op": "conv2d", "inputs": ["x", "w0"], "padding": [1, 1], "stride": [2, 2]},
                  {"id": "a0", "op": "poly", "inputs": ["c0"], "coeffs": [0.0, 0.5, 0.125], "range": [-8.0, 8.0]},
                  {"id": "c1", "op": "conv2d", "inputs": ["a0", "w1"], "padding": [1, 1]}],
        "outputs": ["c1"],
    })
    res = _plan(g, kernels=("cins-bsgs", "elementwise"))
    nodes = {n["id"]: n for n in res.plan["nodes"]}
    assert nodes["c0"]["kernel"] == nodes["c1"]["kernel"] == "cins-bsgs"
    # fan_in 4*9 * max|w| 1 * max|x| 1 = 36 over boot.max_abs, rounded up to a power of two
    assert N14BOOT.boot is not None
    assert nodes["c0"]["params"]["scale"] == 1 << math.ceil(math.log2(36 / N14BOOT.boot.max_abs))
    assert nodes["c0"]["params"].get("decomposed") == 2  # a quarter of the bootstraps of the direct form
    _check(res, g)


def test_cins_options() -> None:
    g = conv_chain(1, 4, 4, 2)
    with pytest.raises(PlanError, match="need a bootstrapping preset"):
        plan_graph(g, preset("n14"), PlanOptions(kernels=("cins-bsgs", "elementwise")))
    lit = PlanOptions.from_literal(PlanOptionsLiteral(kernels=["cins-hs", "bsgs"], cins=False))
    assert lit.cins_kernels(N14BOOT) == ("cins-hs",)
    assert PlanOptions().cins_kernels(N14BOOT) == ("cins-bsgs", "cins-dw")
    assert PlanOptions().cins_kernels(preset("n14")) == ()
    assert PlanOptions(cins=False).cins_kernels(N14BOOT) == ()
    assert PlanOptions(kernels=("bsgs", "elementwise")).cins_kernels(N14BOOT) == ()


def with_resets(m: ChoiceModel, seed: int) -> ChoiceModel:
    """``m`` with some options bootstrapping inside themselves (result depth -3 .. 1: below
    0 when the bootstrap gives levels back, as a CinS layer's does)."""
    rng = np.random.default_rng(1000 + seed)
    groups = []
    for g in m.groups:
        if g.name.startswith("input") or rng.random() < 0.3:
            groups.append(g)
            continue
        resets = tuple(int(rng.integers(-3, 2)) if rng.random() < 0.5 else None for _ in g.costs)
        groups.append(replace(g, resets=resets))
    return ChoiceModel(tuple(groups), m.edges, m.max_depth, m.boot_weight)


@pytest.mark.parametrize("seed", range(20))
def test_solvers_match_brute_force_with_resets(seed: int) -> None:
    m = with_resets(random_boot_model(seed), seed)
    want = brute_force(m)
    pruned, _ = m.prune_dominated()
    assert brute_force(pruned) == want or want is None and brute_force(pruned) is None
    for model, sol in optimal_solutions((m, pruned), want is not None):
        assert want is not None
        assert sol.objective == want[0], (sol, want)
        assert model.evaluate_boots(dict(sol.choice), sol.boots) == want[0]
    choice, lazy = m.greedy_boots()
    if lazy is not None:  # first fit keeps every depth (before and after resets) within the budget
        d, pre = m.walk_depths(choice, lazy)
        assert max([*d.values(), *pre.values()]) <= (m.max_depth or 0)


def test_resnet18_imagenet_workload_shapes() -> None:
    # planning only (minutes at n16boot): data/golden/manifest.json lists it as such

    from planner.frontend.graph import load_graph

    g = load_graph(REPO_ROOT / "data" / "workloads" / "resnet18_imagenet.json")
    assert g.shape("x") == (3, 224, 224)
    convs = [n for n in g.nodes if n.op == "conv2d"]
    assert len(convs) == 21  # stem, average pool (depthwise 1/9), 16 block convs, 3 shortcuts
    assert sum(1 for n in convs if (n.stride or (1, 1)) == (2, 2)) == 8
    assert g.shape("fc") == (1000,) and g.shape("fc_w") == (1000, 512)
    assert all(n.op != "poly" or list(n.coeffs or ()) == [0.0, 0.5, 0.125] for n in g.nodes)
