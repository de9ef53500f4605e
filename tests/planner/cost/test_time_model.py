"""planner.cost.timing, the one time model (no Lattigo): level interpolation, a fused block priced
at its level, key loads, and one program priced the same through every consumer (the
objective, the reports, the key strategies' runtime, keybench)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from api.keybench import modelled_time_ms
from backends.lattigo_bench import modelled_seconds
from planner.batch import plan_seconds_model
from planner.cost.tables import OBJECTIVE_SCALE, load_costs
from planner.cost.timing import (
    KEY_LOAD_MS_PER_BYTE,
    TimeModel,
    interpolate,
    modelled_time,
    program_seconds,
    time_model,
)
from planner.frontend.graph import parse_graph
from planner.frontend.params import load_params
from planner.ir.fusion import fused_blocks
from planner.kernels.base import count_program
from planner.keys.schedule import schedule_keys
from planner.pipeline import PlanOptions, plan_graph
from tests.helpers import one_key_load_program, q_mode_forms, qp_block_program


def _per_level(table: Any, key: str) -> tuple[list[int], list[float]]:
    per = table.measurements["per_level_ms"]
    pts = sorted((int(lv), float(m[key])) for lv, m in per.items() if key in m)
    return [p[0] for p in pts], [p[1] for p in pts]


def test_interpolate_is_linear_between_points_and_flat_outside() -> None:
    pts = [(0, 1.0), (4, 3.0), (9, 13.0)]
    for lv in range(-3, 14):
        assert interpolate(pts, lv) == pytest.approx(float(np.interp(lv, [0, 4, 9], [1.0, 3.0, 13.0])))
    assert interpolate([(5, 2.5)], 0) == interpolate([(5, 2.5)], 9) == 2.5


@pytest.mark.parametrize("preset", ["n13", "n14boot"])
def test_weights_by_level_follow_the_calibrated_points(preset: str) -> None:
    params = load_params(preset)
    tm = time_model(params)
    assert tm.source == f"cost table {preset}-lattigo"
    for key in ("rotate", "block_giant", "block_product", "pmul"):
        lvs, ms = _per_level(tm.table, key) if key != "pmul" else _per_level(tm.table, "pmul")
        for lv in range(params.max_level + 1):
            assert tm.at(key, lv) == pytest.approx(float(np.interp(lv, lvs, ms)))
    lvs, ms = _per_level(tm.table, "rotate")
    assert tm.rot_ms(2) == pytest.approx(float(np.interp(2, lvs, ms)))  # a table in milliseconds


def _block_below_top() -> list[dict[str, Any]]:
    """x * x, rescaled (one level down), then two giantless forms on it over one baby
    offset (Q mode, tests.helpers.q_mode_forms)."""
    return [
        {"op": "input", "dst": "x", "tensor": "x", "table": "x"},
        {"op": "cmul", "dst": "t", "a": "x", "b": "x"},
        {"op": "rescale", "dst": "x1", "src": "t"},
        *q_mode_forms("x1"),
    ]


def test_fused_blocks_priced_at_their_level_and_charged_at_their_root() -> None:
    params = load_params("n13")
    tm = time_model(params)
    prog = _block_below_top()
    blocks, skip = fused_blocks(prog, params.slots)
    assert sorted((b.products, b.qmode) for b in blocks) == [(1, True), (2, True)]
    L = params.max_level

    def at(key: str, lv: int) -> float:  # the calibrated points, interpolated by numpy
        lvs, ms = _per_level(tm.table, key)
        return float(np.interp(lv, lvs, ms))

    # the square and its rescale at the top, both blocks one level down: one decomposition
    # and one baby of x1 (QP lazy baby, brought down to Q once), a block_q per block
    want = (at("cmul_relin", L) + at("rescale", L)
            + at("block_base", L - 1) + at("block_baby", L - 1) + at("block_baby_q", L - 1)
            + 2 * at("block_q", L - 1) + 3 * at("block_product_q", L - 1))
    cost = tm.program_costs(prog, L, params.slots)
    assert sum(cost) == pytest.approx(want)
    assert program_seconds(prog, tm.table, L, params.slots) == pytest.approx(want * 1e-3)
    # every absorbed instruction costs nothing; each block is charged at its root
    roots = {b.root for b in blocks}
    assert roots == {6, 7}
    assert all(cost[i] == 0.0 for i in skip - roots)
    assert cost[1] == pytest.approx(at("cmul_relin", L)) and cost[2] == pytest.approx(at("rescale", L))
    # the same blocks at the top level (no square in front) cost more
    top = [prog[0], *q_mode_forms("x")]
    assert sum(tm.program_costs(top, L, params.slots)) > sum(cost) - cost[1] - cost[2]


def test_key_loads_in_line_prefetched_and_in_the_prologue() -> None:
    params = load_params("n13")
    tm = time_model(params)
    kb = params.rotation_key_bytes()
    body = one_key_load_program()
    compute = sum(tm.program_costs(body, params.max_level, params.slots)) * tm.ms_per_unit
    load = tm.load_ms(kb)
    meas = tm.table.measurements or {}
    assert load == pytest.approx(meas["key_load_ms"]["read_file"] * kb / meas["galois_key_bytes"])  # type: ignore[index]
    inline = modelled_time(body, params, {3: kb}, tm, prefetch=False)
    assert inline.compute_ms == pytest.approx(compute) and inline.load_ms == pytest.approx(load)
    assert inline.total_ms == pytest.approx(compute + load) and inline.stall_ms == 0.0
    # prefetched: the load overlaps the pmul before the rotation; the rotation waits for the rest
    pre = modelled_time(body, params, {3: kb}, tm)
    cost = tm.program_costs(body, params.max_level, params.slots)
    before_load = (cost[1] + cost[2]) * tm.ms_per_unit
    overlap = cost[4] * tm.ms_per_unit
    assert pre.stall_ms == pytest.approx(max(0.0, load - overlap))
    assert pre.total_ms == pytest.approx(before_load + max(load, overlap) + cost[5] * tm.ms_per_unit)
    # a key loaded before the first computing instruction is read before the clock
    head = [body[0], body[3], *body[1:3], *body[4:]]
    assert modelled_time(head, params, {3: kb}, tm).total_ms == pytest.approx(compute)
    # a preset without a calibrated table loads at the constants' rate
    assert TimeModel(load_costs("default")).load_ms(kb) == pytest.approx(kb * KEY_LOAD_MS_PER_BYTE)


def test_node_key_load_is_the_objectives_price() -> None:
    """The objective's per-node load estimate (planner.pipeline under a cap) keeps its price:
    the rotation weight times 47.5/150 per 80 MiB."""
    for name in ("default", "n14boot-lattigo"):
        table = load_costs(name)
        kb = 7864928
        assert TimeModel(table).node_key_load(kb) == pytest.approx(table.weights.rotation * 47.5 / 150.0 * kb / (80 * 2**20))


def _mlp() -> Any:
    return parse_graph({
        "schema": "slotplan.graph/1", "name": "mlp2",
        "tensors": {"x": {"shape": [64], "role": "input"}, "W": {"shape": [64, 64], "role": "weight"},
                    "V": {"shape": [32, 64], "role": "weight"}},
        "nodes": [{"id": "h", "op": "matvec", "inputs": ["W", "x"]},
                  {"id": "a", "op": "poly", "inputs": ["h"], "coeffs": [0.0, 0.5, 0.25]},
                  {"id": "y", "op": "matvec", "inputs": ["V", "a"]}],
        "outputs": ["y"],
    })


def test_one_program_priced_the_same_by_every_consumer() -> None:
    params = load_params("n14")
    res = plan_graph(_mlp(), params, PlanOptions(input_layout="free"))
    prog = res.plan["program"]
    tm = time_model(params)
    assert res.plan["options"]["costs"] == "n14-lattigo"  # the objective's table is the model's
    want_s = sum(tm.program_costs(prog, params.max_level, params.slots)) * 1e-3
    assert want_s > 0
    # the reports: lattigo-bench's modelled seconds, a batch's, program_seconds
    assert program_seconds(prog, load_costs("n14-lattigo"), params.max_level, params.slots) == pytest.approx(want_s)
    assert modelled_seconds(res.plan, params) == pytest.approx(want_s, abs=1e-6)
    assert plan_seconds_model(res.plan, params) == pytest.approx(want_s)
    # the key strategies' runtime: keep-all (no load in the program) is compute alone
    mt = modelled_time(prog, params, {}, tm)
    assert mt.total_ms == pytest.approx(want_s * 1e3) and mt.stall_ms == 0.0 and mt.load_ms == 0.0
    # keybench: the keep-all schedule loads its keys before the clock
    ka = schedule_keys(prog, params, None, "keep-all", key_levels=False)
    assert modelled_time_ms(ka, params, tm) == pytest.approx(want_s * 1e3)
    # the objective: the same counts at the top-level weights, what the solver minimised
    # (this plan's later layers run lower, so the level-aware price is below it)
    cv = count_program(list(prog), 0, 0, 0, 0, 0.0, params.slots)
    assert want_s < tm.vector(cv) * 1e-3
    assert tm.units(cv) == int(round(tm.vector(cv) * OBJECTIVE_SCALE))
    assert modelled_seconds(res.plan, params, level_aware=False) == pytest.approx(tm.vector(cv) * 1e-3, abs=1e-6)


def test_objective_and_program_agree_at_the_top_level() -> None:
    """A program whose every instruction runs at the top level: the objective (cost vector,
    top-level weights) and the level-aware program price are one number."""
    params = load_params("n13")
    tm = time_model(params)
    prog = qp_block_program()
    cv = count_program(prog, 0, 2, 2, 1, 0.0, params.slots)
    assert sum(tm.program_costs(prog, params.max_level, params.slots)) == pytest.approx(tm.vector(cv))


def test_bootstrap_priced_by_the_table() -> None:
    params = load_params("n14boot")
    tm = time_model(params)
    prog = [
        {"op": "input", "dst": "x", "tensor": "x", "table": "x"},
        {"op": "bootstrap", "dst": "z", "src": "x"},
        {"op": "output", "src": "z", "tensor": "z", "table": "z"},
    ]
    assert tm.bootstrap == tm.table.weights.bootstrap
    assert modelled_time(prog, params, {}, tm).compute_ms == pytest.approx(tm.bootstrap)
    cv = count_program(prog, 0, 0, 0, 0, 0.0, params.slots)
    assert tm.vector(cv) == pytest.approx(tm.bootstrap) and tm.bootstrap_units() == int(round(tm.bootstrap * OBJECTIVE_SCALE))


def test_poly_scales_with_its_level_as_a_product() -> None:
    """A poly is calibrated once at the top level; below it, it scales as a ct-ct product."""
    params = load_params("n14")
    tm = time_model(params)
    L = params.max_level
    prog = [
        {"op": "input", "dst": "x", "tensor": "x", "table": "x"},
        {"op": "poly", "dst": "p", "src": "x", "coeffs": [0.0, 1.0, 0.5]},
        {"op": "poly", "dst": "q", "src": "p", "coeffs": [0.0, 1.0, 0.5]},
        {"op": "output", "src": "q", "tensor": "q", "table": "q"},
    ]
    cost = tm.program_costs(prog, L, params.slots)
    lvs, ms = _per_level(tm.table, "cmul_relin")
    assert cost[1] == pytest.approx(tm.table.weights.poly)  # at the top: the calibrated poly
    below = L - 2  # a degree-2 polynomial takes 2 levels (ceil(log2(3)))
    assert cost[2] == pytest.approx(tm.table.weights.poly * float(np.interp(below, lvs, ms)) / ms[-1])
    assert cost[2] < cost[1]
