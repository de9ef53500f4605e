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
