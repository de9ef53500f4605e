"""Batched plans pack a strided conv's gapped output densely when that saves ciphertexts
(planner.assign.densify.densified_variants), and padded batches (B < P) zero the padding samples'
output slots: per sample equal to numpy, every layout claim checked, nothing leaked."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from backends.layout_check import check_claims, claimed_registers
from backends.sim import simulate
from planner.batch import batched_reference
from planner.frontend.graph import parse_graph
from planner.frontend.reference import random_values
from planner.pipeline import PlanOptions, plan_graph
from tests.helpers import small_params

SQ = [0.0, 0.5, 0.125]


def downsampling_block(c: int = 4, hw: int = 16) -> dict[str, Any]:
    """A ResNet-style downsampling block: stride-2 3x3 conv and stride-2 1x1 shortcut,
    a stride-1 conv on the half-size grid, the residual add, pooling and a classifier."""
    n = 2 * c
    t = {
        "x": {"shape": [c, hw, hw], "role": "input", "range": [-1.0, 1.0]},
        "wa": {"shape": [n, c, 3, 3], "role": "weight"},
        "wb": {"shape": [n, n, 3, 3], "role": "weight"},
        "wc": {"shape": [n, n, 3, 3], "role": "weight"},
        "ws": {"shape": [n, c, 1, 1], "role": "weight"},
        "fc": {"shape": [3, n], "role": "weight"},
    }
    nodes = [
        {"id": "a", "op": "conv2d", "inputs": ["x", "wa"], "stride": [2, 2], "padding": [1, 1]},
        {"id": "aa", "op": "poly", "inputs": ["a"], "coeffs": SQ},
        {"id": "b", "op": "conv2d", "inputs": ["aa", "wb"], "stride": [1, 1], "padding": [1, 1]},
        {"id": "s", "op": "conv2d", "inputs": ["x", "ws"], "stride": [2, 2], "padding": [0, 0]},
        {"id": "r", "op": "add", "inputs": ["b", "s"]},
        {"id": "c", "op": "conv2d", "inputs": ["r", "wc"], "stride": [1, 1], "padding": [1, 1]},
        {"id": "flat", "op": "reshape", "inputs": ["c"], "shape": [n, (hw // 2) ** 2]},
        {"id": "pool", "op": "sum", "inputs": ["flat"], "axis": 1},
        {"id": "y", "op": "matvec", "inputs": ["fc", "pool"]},
    ]
    return {"schema": "slotplan.graph/1", "name": "down", "tensors": t, "nodes": nodes, "outputs": ["y"]}


def check(spec: dict[str, Any], log_n: int, B: int, levels: int = 10) -> tuple[Any, list[str]]:
    g = parse_graph(spec)
    res = plan_graph(g, small_params(log_n, levels=levels), PlanOptions(allow_insecure=True, batch=B))
    vals = random_values(g, 7)
    rng = np.random.default_rng(B)
    for x in g.inputs:
        vals[x] = rng.uniform(-1.0, 1.0, (B, *g.shape(x)))
    ref = batched_reference(g, vals, B)
    sim = simulate(res.plan, res.tables, vals, keep=claimed_registers(res))
    problems = list(check_claims(res, vals, sim))
    for t in g.outputs:
        for b in range(B):
            err = float(np.max(np.abs(sim.outputs[t][b] - ref[t][b]))) / max(1.0, float(np.max(np.abs(ref[t][b]))))
            if not err < 1e-9:
                problems.append(f"output {t} sample {b}: relative error {err:.2e}")
    if not res.plan["summary"]["clean_outputs"]:
        problems.append("outputs not clean")
    leaks = {t: n for t, n in sim.leaked_slots.items() if n}
    if leaks:
        problems.append(f"leaked slots {leaks}")
    return res, problems


@pytest.mark.parametrize("B", [8, 6])
def test_strided_output_packed_densely(B: int) -> None:
    # n12 (2048 slots), P = 8: a block of 256 slots holds the input (4x8x8) in one
    # ciphertext; the stride-2 conv leaves 8 channels in blocks of 64 slots (two
    # ciphertexts), dense they are 8x4x4 = 128 slots (one)
    res, problems = check(downsampling_block(4, 8), 12, B)
    assert not problems, "\n".join(problems)
    dense = [n["id"] for n in res.plan["nodes"] if n["params"].get("densify")]
    assert dense, [(n["id"], n["out_layout"]) for n in res.plan["nodes"]]


@pytest.mark.parametrize("B", [3, 5, 6, 7])
def test_padded_batch_outputs_exact(B: int) -> None:
    """B < P: the outputs hold the B samples' values and zeros everywhere else."""
    res, problems = check(downsampling_block(2, 8), 12, B)
    assert not problems, "\n".join(problems)
    prog = res.plan["program"]
    masks = [p for p, v in res.plan["plaintexts"].items() if v["table"].startswith("pt/batch/pad/")]
    assert masks and any(d["op"] == "pmul" and d["pt"] in masks for d in prog)
    assert res.plan["outputs"]["y"] == [B, 3]


def test_batched_plan_at_an_insecure_preset_needs_no_flag() -> None:
    """n14boot (a built-in test preset) plans a batch as it plans one sample: labelled
    insecure, no --allow-insecure needed; custom insecure parameters are still refused."""
    from planner.frontend.params import PRESETS, Params, ParamsError

    g = parse_graph(downsampling_block(2, 8))
    res = plan_graph(g, PRESETS["n14boot"], PlanOptions(batch=2))
    assert res.plan["summary"]["insecure"] is True
    custom = Params(log_n=12, log_q=(60,) * 12, log_p=(60,), log_scale=40, name="custom")
    with pytest.raises(ParamsError, match="not 128-bit secure"):
        plan_graph(g, custom, PlanOptions(batch=2))


def test_dense_route_for_room_at_equal_ciphertexts() -> None:
    """ResNet-20's stage 3 at B = 2 (a block ring of 16384 slots): the stride-2 output
    ``[c:64:256][h:8:32][w:8:2]`` fills the block in one ciphertext, and so does the dense
    ``[c:64:64][h:8:8][w:8:1]``, which leaves room for four copies: the route is offered (it
    was not while only ciphertexts counted); a layout whose dense form gains no room is not."""
    from planner.assign.densify import _dense_route, _room
    from planner.kernels.problem import conv_output_layout
    from planner.layout.channels import ChannelLayout, natural_layout

    gapped, _ = conv_output_layout(natural_layout((32, 16, 16), 16384), 64, (3, 3), (2, 2), (1, 1))
    assert gapped.notation() == "[c:64:256][h:8:32][w:8:2]" and gapped.n_ct == 1
    route = _dense_route(gapped)
    assert route is not None
    mid, dense = route
    assert mid.notation() == "[c:64:256][h:8:8][w:8:1]" and dense.notation() == "[c:64:64][h:8:8][w:8:1]"
    assert dense.n_ct == 1 and (_room(gapped), _room(dense)) == (1, 4)
    # one channel per 256-slot ciphertext: dense, the four share one (fewer ciphertexts, as before)
    fewer, _ = conv_output_layout(natural_layout((4, 16, 16), 256), 4, (3, 3), (2, 2), (1, 1))
    assert fewer.n_ct == 4 and _dense_route(fewer) is not None
    # 5 x 5 with rows 6 slots apart in 32 slots (extent 29): dense (25 slots) has no more room
    same = ChannelLayout(shape=(1, 5, 5), channels=1, height=5, width=5, slots=32, cpc=1, lc=32, lh=6, lw=1)
    assert _room(same) == _room(natural_layout((1, 5, 5), 32)) == 1 and _dense_route(same) is None
    assert _dense_route(natural_layout((4, 8, 8), 256)) is None  # natural: nothing to pack
    # a row-major grid with channel blocks apart: clean, one permute (one level); dirty, a mask first
    from planner.kernels.convert import plan_conversion

    apart = ChannelLayout(shape=(8, 8, 8), channels=8, height=8, width=8, slots=4096, cpc=8, lc=512, lh=8, lw=1)
    for clean, first in ((True, "none"), (False, "mask")):
        lay = apart.with_clean(clean)
        r = _dense_route(lay)
        assert r is not None and plan_conversion(lay, r[0]).kind == first
        assert plan_conversion(r[0], r[1]).kind == "permute" and plan_conversion(r[0], r[1]).cost().depth == 1
    # a 43-vector viewed as 32 x 2 x 1 with rows 32 apart: row-major rows would collide (no route)
    vec = ChannelLayout(shape=(43,), channels=32, height=2, width=1, slots=256, cpc=32, lc=1, lh=32, lw=1)
    vec.validate()
    assert _dense_route(vec) is None


def test_dense_route_chosen_for_room() -> None:
    """A hand-picked block where the new route is the solver's choice: n13, B = 2 (block ring
    of 4096 slots), input 4 x 16 x 16 (1024 slots); the stride-2 outputs (8 channels in
    blocks of 256 slots: 2048 slots, one ciphertext) are packed to 8 x 8 x 8 (512 slots,
    one ciphertext with room for eight copies) before the stride-1 conv.  Exact per sample
    and every claim checked; fewer rotations than the plan without the route (133)."""
    res, problems = check(downsampling_block(4, 16), 13, 2)
    assert not problems, "\n".join(problems)
    dense = [n for n in res.plan["nodes"] if n["params"].get("densify")]
    assert dense, [(n["id"], n["out_layout"]) for n in res.plan["nodes"]]
    # the block's natural layout [c:8:64][h:8:8][w:8:1] read in the real ring (strides x 2)
    assert all(n["out_layout"] == "[c:8:128][h:8:16][w:8:2][B:2:1]" for n in dense)
    assert res.plan["summary"]["rotations"] < 133


def strided_network(seed: int) -> tuple[dict[str, Any], int, int]:
    """A random downsampling network (odd channel counts and grids, one or two stride-2
    stages with a 1x1 stride-2 shortcut, stride-1 convs after each), a ring of 2^12 or
    2^13 slots and a batch in 1..4."""
    rng = np.random.default_rng(seed)
    c = int(rng.choice([1, 2, 3, 5]))
    hw = int(rng.choice([7, 9, 11, 12, 16]))
    stages = int(rng.integers(1, 3))
    t: dict[str, Any] = {"x": {"shape": [c, hw, hw], "role": "input", "range": [-1.0, 1.0]}}
    nodes: list[dict[str, Any]] = []
    cur, ch, size = "x", c, hw
    for s in range(stages):
        n = int(rng.choice([ch + 1, 2 * ch, 2 * ch + 1]))
        t[f"wa{s}"] = {"shape": [n, ch, 3, 3], "role": "weight"}
        t[f"ws{s}"] = {"shape": [n, ch, 1, 1], "role": "weight"}
        t[f"wb{s}"] = {"shape": [n, n, 3, 3], "role": "weight"}
        nodes += [
            {"id": f"a{s}", "op": "conv2d", "inputs": [cur, f"wa{s}"], "stride": [2, 2], "padding": [1, 1]},
            {"id": f"aa{s}", "op": "poly", "inputs": [f"a{s}"], "coeffs": SQ},
            {"id": f"b{s}", "op": "conv2d", "inputs": [f"aa{s}", f"wb{s}"], "stride": [1, 1], "padding": [1, 1]},
            {"id": f"s{s}", "op": "conv2d", "inputs": [cur, f"ws{s}"], "stride": [2, 2], "padding": [0, 0]},
            {"id": f"r{s}", "op": "add", "inputs": [f"b{s}", f"s{s}"]},
        ]
        cur, ch, size = f"r{s}", n, (size - 1) // 2 + 1
    t["fc"] = {"shape": [3, ch], "role": "weight"}
    nodes += [
        {"id": "flat", "op": "reshape", "inputs": [cur], "shape": [ch, size * size]},
        {"id": "pool", "op": "sum", "inputs": ["flat"], "axis": 1},
        {"id": "y", "op": "matvec", "inputs": ["fc", "pool"]},
    ]
    spec = {"schema": "slotplan.graph/1", "name": f"strided{seed}", "tensors": t, "nodes": nodes, "outputs": ["y"]}
    return spec, int(rng.choice([12, 13])), int(rng.integers(1, 5))


@pytest.mark.parametrize("start", range(0, 24, 6))
def test_random_strided_batches(start: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random batched graphs with stride-2 convs: every sample equals numpy in the simulator,
    every layout claim (the densified outputs' included) holds over all P samples.  Each
    group of graphs is offered the route at equal ciphertexts (for room) somewhere."""
    import planner.assign.densify as densify

    offered: list[str] = []
    route = densify._dense_route

    def spy(lay: Any, room: bool = True) -> Any:
        r = route(lay, room)
        if r is not None and r[1].n_ct == lay.n_ct:
            offered.append(lay.notation())
        return r

    monkeypatch.setattr(densify, "_dense_route", spy)
    problems: list[str] = []
    for seed in range(start, start + 6):
        spec, log_n, B = strided_network(seed)
        _, found = check(spec, log_n, B, levels=16)
        problems += [f"seed {seed} (n{log_n}, B = {B}): {p}" for p in found]
    assert not problems, "\n".join(problems)
    assert offered, "no graph of this group was offered the dense route at equal ciphertexts"


def residual_then_convs(c: int = 4, hw: int = 16, convs: int = 2) -> dict[str, Any]:
    """A stride-2 conv and its 1x1 stride-2 shortcut added, then ``convs`` stride-1 convs,
    pooling and a classifier (no activation: it fits the 8 levels of n14)."""
    n = 2 * c
    t: dict[str, Any] = {
        "x": {"shape": [c, hw, hw], "role": "input", "range": [-1.0, 1.0]},
        "wa": {"shape": [n, c, 3, 3], "role": "weight"},
        "ws": {"shape": [n, c, 1, 1], "role": "weight"},
        "fc": {"shape": [3, n], "role": "weight"},
    }
    nodes: list[dict[str, Any]] = [
        {"id": "a", "op": "conv2d", "inputs": ["x", "wa"], "stride": [2, 2], "padding": [1, 1]},
        {"id": "s", "op": "conv2d", "inputs": ["x", "ws"], "stride": [2, 2], "padding": [0, 0]},
        {"id": "r", "op": "add", "inputs": ["a", "s"]},
    ]
    cur = "r"
    for i in range(convs):
        t[f"w{i}"] = {"shape": [n, n, 3, 3], "role": "weight"}
        nodes.append({"id": f"c{i}", "op": "conv2d", "inputs": [cur, f"w{i}"], "stride": [1, 1], "padding": [1, 1]})
        cur = f"c{i}"
    nodes += [
        {"id": "flat", "op": "reshape", "inputs": [cur], "shape": [n, (hw // 2) ** 2]},
        {"id": "pool", "op": "sum", "inputs": ["flat"], "axis": 1},
        {"id": "y", "op": "matvec", "inputs": ["fc", "pool"]},
    ]
    return {"schema": "slotplan.graph/1", "name": "down-convs", "tensors": t, "nodes": nodes, "outputs": ["y"]}


def test_dense_route_for_room_on_lattigo() -> None:
    """n14 (8192 slots), B = 2: a block ring of 4096 slots; the stride-2 output (8 channels
    in blocks of 256 slots, one ciphertext) is packed to 8 x 8 x 8 (room for eight copies)
    by the route at equal ciphertexts.  Encrypted on Lattigo, each sample equals numpy."""
    from backends.lattigo_backend import available
    from backends.runner import run_plan
    from planner.frontend.params import preset

    if not available():
        pytest.skip("Lattigo extension not built (make lattigo)")
    g = parse_graph(residual_then_convs())
    res = plan_graph(g, preset("n14"), PlanOptions(batch=2))
    dense = [n for n in res.plan["nodes"] if n["params"].get("densify")]
    # the gapped input of the densified node is one ciphertext, as is its dense output
    assert dense and all(not n["in_layouts"][0].startswith("ct[") for n in dense)
    assert [n["out_layout"] for n in dense] == ["[c:8:128][h:8:16][w:8:2][B:2:1]"]
    vals = random_values(g, 3)
    vals["x"] = np.random.default_rng(2).uniform(-1.0, 1.0, (2, 4, 16, 16))
    rep = run_plan(res.plan, res.tables, "lattigo", values=vals)
    want = batched_reference(g, vals, 2)["y"]
    assert rep.ok
    err = float(np.max(np.abs(rep.outputs["y"] - want))) / float(np.max(np.abs(want)))
    assert err < 1e-5, err
