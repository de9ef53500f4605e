"""Structurally identical candidates share their cost vectors (planner.kernels.base
``SHARED_COSTS``, planner.assign.fold ``SCALED_COSTS``): the key must hold everything a
candidate's lowering reads, so that a shared vector always equals the one its own scratch
lowering counts, and a plan is byte-identical with sharing off."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from planner.assign import fold
from planner.assign.options import PlanOptions
from planner.assign.problem import build_problem
from planner.frontend.graph import parse_graph
from planner.ir.io import dumps_plan
from planner.kernels import base
from planner.pipeline import plan_graph
from tests.helpers import small_params
from tests.random_networks import random_network


def _conv(i: str, x: str, c: int, pad: int = 1) -> dict[str, Any]:
    return {"id": i, "op": "conv2d", "inputs": [x, f"{i}_w"], "stride": [1, 1], "padding": [pad, pad]}


def cnn(pad_last: int = 1) -> dict[str, Any]:
    """Three convs of one shape (the second and third differ only by names), a residual
    add, a ReLU-like poly, and a last conv whose padding may differ."""
    c, h = 4, 6
    tensors: dict[str, Any] = {"x": {"shape": [c, h, h], "role": "input", "range": [-1, 1]}}
    nodes = []
    cur = "x"
    for i in ("a", "b", "d"):
        tensors[f"{i}_w"] = {"shape": [c, c, 3, 3], "role": "weight"}
        nodes.append(_conv(i, cur, c))
        # (concave: two levels, no fold)
        nodes.append({"id": f"{i}_p", "op": "poly", "inputs": [i], "coeffs": [0.0, 0.5, -0.25]})
        cur = f"{i}_p"
    nodes.append({"id": "res", "op": "add", "inputs": [cur, "a_p"]})
    k = 3 if pad_last else 1
    tensors["e_w"] = {"shape": [c, c, k, k], "role": "weight"}
    nodes.append({**_conv("e", "res", c, pad_last), "padding": [pad_last, pad_last]})
    return {"schema": "slotplan.graph/1", "name": "shared-costs", "tensors": tensors, "nodes": nodes,
            "outputs": ["e"]}


@pytest.fixture
def no_sharing() -> Iterator[None]:
    """Sharing off (limits 0) and emptied, for the test's duration."""
    old = base.SHARED_COSTS.limit, fold.SCALED_COSTS.limit, fold.RESULT_FACTS.limit
    for cache in (base.SHARED_COSTS, fold.SCALED_COSTS, fold.RESULT_FACTS):
        cache.clear()
        cache.limit = 0
    try:
        yield
    finally:
        base.SHARED_COSTS.limit, fold.SCALED_COSTS.limit, fold.RESULT_FACTS.limit = old


def _fresh(c: base.Candidate) -> base.Candidate:
    return replace(c, _cost=None, _fused=None, share=None, _share_of=None)


def test_names_are_not_part_of_the_key_but_attributes_are() -> None:
    params = small_params(10, 16)
    prob = build_problem(parse_graph(cnn()), params, PlanOptions(allow_insecure=True))
    keys = {n: {c.shared_key(params.slots) for c in prob.all_candidates[n]} for n in ("a", "b", "d", "e")}
    assert None not in keys["b"] | keys["d"]
    # b and d read the same layouts of the same shapes: every key of one is a key of the other
    assert keys["b"] == keys["d"]
    # e has other weights' shape (1 x 1, no padding is a different graph): shares nothing with d
    prob1 = build_problem(parse_graph(cnn(pad_last=0)), params, PlanOptions(allow_insecure=True))
    keys_e0 = {c.shared_key(params.slots) for c in prob1.all_candidates["e"]}
    assert not keys_e0 & keys["d"]


def test_a_copy_with_another_lowering_has_no_key() -> None:
    params = small_params(10, 16)
    prob = build_problem(parse_graph(cnn()), params, PlanOptions(allow_insecure=True))
    c = next(c for c in prob.all_candidates["b"] if c.shared_key(params.slots) is not None)
    assert replace(c, lower=lambda b, regs: c.lower(b, regs)).shared_key(params.slots) is None
    assert replace(c, out_layout=replace(c.out_layout, clean=not c.out_layout.clean)).shared_key(params.slots) is None
    assert replace(c, note="x").shared_key(params.slots) == c.shared_key(params.slots)


def _cases() -> list[tuple[str, dict[str, Any], Any, PlanOptions]]:
    out = [("cnn", cnn(), small_params(10, 16), PlanOptions(allow_insecure=True)),
           ("cnn-densify", cnn(), small_params(11, 16), PlanOptions(allow_insecure=True, densify=True))]
    for seed in (1, 4, 7, 12):
        spec, log_n = random_network(seed)
        out.append((f"random{seed}", spec, small_params(log_n, 16),
                    PlanOptions(allow_insecure=True, input_layout="free" if seed % 2 else "row-major")))
    return out


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_shared_vectors_equal_each_candidates_own(case: tuple[str, dict[str, Any], Any, PlanOptions]) -> None:
    _, spec, params, options = case
    S = params.slots
    prob = build_problem(parse_graph(spec), params, options)
    shared = 0
    for cs in prob.all_candidates.values():
        for c in cs:
            if c.shared_key(S) is None:
                continue
            shared += 1
            mine = c.cost(S, fused=True)
            own = _fresh(c).cost(S, fused=True)
            assert mine == own, (c.node, c.label)
    assert shared > 0


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_plans_byte_identical_without_sharing(case: tuple[str, dict[str, Any], Any, PlanOptions],
                                              no_sharing: None) -> None:
    _, spec, params, options = case
    g = parse_graph(spec)
    off = dumps_plan(plan_graph(g, params, options).plan)
    base.SHARED_COSTS.limit, fold.SCALED_COSTS.limit, fold.RESULT_FACTS.limit = 2048, 1024, 2048
    on_first = dumps_plan(plan_graph(g, params, options).plan)  # fills the caches
    on_again = dumps_plan(plan_graph(g, params, options).plan)  # reads them
    assert off == on_first == on_again


def test_each_structure_is_lowered_once(no_sharing: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With sharing on, conv d (b's structure under other names) lowers nothing of its own."""
    base.SHARED_COSTS.limit, fold.SCALED_COSTS.limit, fold.RESULT_FACTS.limit = 2048, 1024, 2048
    lowered: dict[str, int] = {}
    real = base.Candidate.dry_lowering

    def counting(self: base.Candidate, slots: int) -> Any:
        lowered[self.node] = lowered.get(self.node, 0) + 1
        return real(self, slots)

    monkeypatch.setattr(base.Candidate, "dry_lowering", counting)
    build_problem(parse_graph(cnn()), small_params(10, 16), PlanOptions(allow_insecure=True))
    assert lowered.get("b", 0) > 0 and lowered.get("d", 0) == 0, lowered
