"""Every kernel and conversion, planned and simulated, equals numpy (float64) on random
shapes: non-powers of two, tall and wide matrices, tensors spanning several ciphertexts,
strides 1-2, kernel sizes 1-5, padding 0-2, groups (incl. depthwise)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.assign.candidates import LINEAR_KERNELS, PlanError
from planner.pipeline import PlanOptions, plan_graph
from tests.helpers import check_plan, conv_graph, matvec_graph, small_params

LINEAR = list(LINEAR_KERNELS)
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _plan_each_kernel(graph, params, layout: str) -> list[str]:  # noqa: ANN001
    planned = []
    for kind in LINEAR:
        try:
            res = plan_graph(graph, params, PlanOptions(kernels=(kind,), input_layout=layout, allow_insecure=True))
        except PlanError:
            continue  # a kernel may not apply (e.g. fhelipe for conv); bsgs always does
        check_plan(res, graph)
        # the chosen candidate's exact cost equals its lowered program
        for cands in res.problem.candidates.values():
            for c in cands:
                assert c.cost(params.slots) == c.lowered_cost(params.slots), c.label
        planned.append(kind)
    assert "bsgs" in planned and "hs-diagonal" in planned
    return planned


@SETTINGS
@given(n=st.integers(1, 700), k=st.integers(1, 700), layout=st.sampled_from(["free", "row-major"]))
def test_matvec_all_kernels_match_numpy(n: int, k: int, layout: str) -> None:
    _plan_each_kernel(matvec_graph(n, k), small_params(10), layout)


@pytest.mark.parametrize(("n", "k"), [(1, 1), (7, 300), (300, 7), (45, 129), (512, 512), (640, 96)])
@pytest.mark.parametrize("layout", ["free", "row-major"])
def test_matvec_all_kernels_fixed_shapes(n: int, k: int, layout: str) -> None:
    """test_matvec_all_kernels_match_numpy's check (25 random shapes; `make test-all`) on fixed
    shapes: one element, tall, wide, non powers of two, one full ciphertext, several."""
    _plan_each_kernel(matvec_graph(n, k), small_params(10), layout)


@st.composite
def conv_cases(draw: st.DrawFn) -> tuple:
    groups = draw(st.sampled_from([1, 1, 1, 2, 3]))
    c = groups * draw(st.integers(1, 4))
    co = groups * draw(st.integers(1, 4))
    if draw(st.booleans()) and groups == 1:  # depthwise
        groups, co = c, c
    h, w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    p1, p2 = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    k1 = draw(st.integers(1, min(5, h + 2 * p1)))
    k2 = draw(st.integers(1, min(5, w + 2 * p2)))
    s1, s2 = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    return c, h, w, co, k1, k2, (s1, s2), (p1, p2), groups


@SETTINGS
@given(case=conv_cases(), layout=st.sampled_from(["free", "row-major"]), log_n=st.sampled_from([10, 11]))
def test_conv2d_all_kernels_match_numpy(case: tuple, layout: str, log_n: int) -> None:
    c, h, w, co, k1, k2, stride, padding, groups = case
    g = conv_graph(c, h, w, co, k1, k2, stride, padding, groups)
    try:
        _plan_each_kernel(g, small_params(log_n), layout)
    except PlanError as e:
        # only acceptable refusal: one (margin-padded) channel does not fit a ciphertext
        assert "does not fit" in str(e), str(e)


@pytest.mark.parametrize(
    "shape",
    [
        (8, 20, 20, 8, 3, 3, (1, 1), (1, 1), 1),  # 8 x 400 > 512 slots: several ciphertexts
        (6, 15, 15, 10, 3, 3, (2, 2), (1, 1), 1),  # stride 2, non power of two
        (12, 9, 9, 12, 3, 3, (1, 1), (1, 1), 12),  # depthwise
        (3, 10, 10, 5, 5, 5, (1, 1), (2, 2), 1),  # 5x5
        (4, 7, 9, 4, 1, 1, (1, 1), (1, 1), 1),  # over-padded 1x1: margin layout
    ],
)
def test_conv_fixed_multi_ciphertext_cases(shape: tuple) -> None:
    c, h, w, co, k1, k2, stride, padding, groups = shape
    g = conv_graph(c, h, w, co, k1, k2, stride, padding, groups)
    planned = _plan_each_kernel(g, small_params(10), "row-major")
    assert "imra" in planned


def test_matvec_spanning_several_ciphertexts() -> None:
    g = matvec_graph(300, 1500)  # k = 1500 > 512 slots: three input ciphertexts
    for layout in ("free", "row-major"):
        planned = _plan_each_kernel(g, small_params(10), layout)
        assert "imra" in planned


@pytest.mark.parametrize(
    "spec",
    [
        # (C, H, W, [(Co, K, stride, padding, groups), ...]) with H*W > 512 slots
        (3, 40, 30, [(4, 3, 1, 1, 1), (2, 3, 1, 1, 1)]),  # chained, second reads segments in place
        (3, 40, 30, [(4, 3, 1, 1, 1), (2, 3, 2, 1, 1)]),  # stride 2 after segments
        (2, 33, 21, [(4, 5, 2, 2, 2)]),  # 5x5, stride 2, groups, non powers of two
        (4, 30, 20, [(4, 3, 1, 0, 4)]),  # depthwise, no padding
    ],
)
def test_segmented_conv_channels_larger_than_a_ciphertext(spec: tuple) -> None:
    """MetaKernel 4.2.4: channels are cut into row segments with halos (half a channel per
    ciphertext for ImageNet sizes); results equal numpy."""
    from planner.frontend.graph import parse_graph

    c, h, w, layers = spec
    tensors = {"x": {"shape": [c, h, w], "role": "input"}}
    nodes = []
    cur, cin = "x", c
    for i, (co, k, s, p, g) in enumerate(layers):
        tensors[f"w{i}"] = {"shape": [co, cin // g, k, k], "role": "weight"}
        nodes.append({"id": f"y{i}", "op": "conv2d", "inputs": [cur, f"w{i}"], "stride": [s, s],
                      "padding": [p, p], "groups": g})
        cur, cin = f"y{i}", co
    graph = parse_graph({"schema": "slotplan.graph/1", "name": "seg", "tensors": tensors, "nodes": nodes,
                         "outputs": [cur]})
    for layout in ("free", "row-major"):
        res = plan_graph(graph, small_params(10, 6), PlanOptions(input_layout=layout, allow_insecure=True))
        check_plan(res, graph)
        assert res.plan["nodes"][0]["kernel"] == "segmented-conv"
        for cands in res.problem.candidates.values():
            for cand in cands:
                assert cand.cost(512) == cand.lowered_cost(512), cand.label
