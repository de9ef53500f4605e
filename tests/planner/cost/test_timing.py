"""planner.cost.timing: a plan's modelled time with every instruction and fused block priced at
the level it runs at (per-level calibrated weights, linear between calibrated levels)."""

from __future__ import annotations

import pytest

from backends.lattigo_bench import modelled_seconds, mvm_graph
from planner.cost.tables import load_costs
from planner.cost.timing import TimeModel, program_seconds
from planner.frontend.params import load_params
from planner.ir.fusion import fused_blocks, fused_counts
from planner.kernels.base import count_program
from planner.pipeline import PlanOptions, plan_graph
from tests.helpers import q_mode_forms, qp_block_program


def test_level_weights_interpolate_between_calibrated_levels() -> None:
    table = load_costs("n14-lattigo")
    lw = TimeModel(table)
    per = table.measurements["per_level_ms"]  # type: ignore[index]
    levels = sorted(int(lv) for lv in per)
    lo, hi = levels[0], levels[-1]
    for key in ("rotate", "block_giant", "block_product"):
        assert lw.at(key, lo) == pytest.approx(per[str(lo)][key])
        assert lw.at(key, hi) == pytest.approx(per[str(hi)][key])
        mid = levels[1]
        half = (lo + mid) / 2
        if float(half).is_integer():
            want = (per[str(lo)][key] + per[str(mid)][key]) / 2
            assert lw.at(key, int(half)) == pytest.approx(want)
        assert lw.at(key, hi + 5) == pytest.approx(per[str(hi)][key])  # above the top: the top


@pytest.mark.parametrize(("n", "k"), [(256, 256), (128, 1024), (1024, 128)])
def test_one_block_at_the_top_level_prices_as_the_objective(n: int, k: int) -> None:
    params = load_params("n13")
    res = plan_graph(mvm_graph(n, k), params, PlanOptions(input_layout="free"))
    prog = res.plan["program"]
    blocks, skip = fused_blocks(prog, params.slots)
    fc = fused_counts(prog, params.slots)
    assert len(blocks) == fc.blocks >= 1
    assert sum(b.products for b in blocks) == fc.products
    assert sum(b.giants for b in blocks) == fc.giants
    table = load_costs("n13-lattigo")
    lw = TimeModel(table)
    # the block alone (at the top level) is priced exactly with the top-level weights
    b = blocks[0]
    w = table.weights
    fixed = lw.at("block_finish", params.max_level) + lw.at("block_base", params.max_level)
    block_ms = (fixed + lw.at("block_giant", params.max_level) * b.giants
                + lw.at("block_product", params.max_level) * b.products
                + lw.at("block_baby", params.max_level) * len(b.babies))
    assert block_ms == pytest.approx(w.block + (w.block_base or 0) + w.block_giant * b.giants + w.block_product * b.products
                                     + w.block_baby * len(b.babies))
    # the whole plan: never more than the objective's top-level pricing (later
    # instructions run lower), and equal to it when nothing runs below the top
    cv = count_program(list(prog), 0, 0, 0, 0, 0.0, params.slots)
    top = TimeModel(table).vector(cv) * 1e-3
    got = program_seconds(prog, table, params.max_level, params.slots)
    assert 0 < got <= top * (1 + 1e-9)
    assert modelled_seconds(res.plan, params) == pytest.approx(got, abs=1e-6)
    assert modelled_seconds(res.plan, params, level_aware=False) == pytest.approx(top, abs=1e-6)


def test_deeper_plans_cost_less_per_layer() -> None:
    """The same matvec after an x*x activation runs one level down: cheaper than at the top."""
    from planner.frontend.graph import parse_graph

    g = parse_graph({
        "schema": "slotplan.graph/1", "name": "sq_mvm",
        "tensors": {"x": {"shape": [64], "role": "input"}, "W": {"shape": [64, 64], "role": "weight"},
                    "V": {"shape": [64, 64], "role": "weight"}},
        "nodes": [{"id": "h", "op": "matvec", "inputs": ["W", "x"]},
                  {"id": "y", "op": "matvec", "inputs": ["V", "h"]}],
        "outputs": ["y"],
    })
    params = load_params("n14")
    res = plan_graph(g, params, PlanOptions(input_layout="free"))
    table = load_costs("n14-lattigo")
    prog = res.plan["program"]
    blocks, _ = fused_blocks(prog, params.slots)
    assert len(blocks) == 2
    level_aware = program_seconds(prog, table, params.max_level, params.slots)
    cv = count_program(list(prog), 0, 0, 0, 0, 0.0, params.slots)
    assert level_aware < TimeModel(table).vector(cv) * 1e-3


def _q_mode_program() -> list[dict]:
    """Two giantless forms on the input x over one baby offset (tests.helpers.q_mode_forms)."""
    return [{"op": "input", "dst": "x", "tensor": "x", "table": "x"}, *q_mode_forms("x")]


def test_q_mode_blocks_counted_and_priced_by_hand() -> None:
    params = load_params("n13")
    table = load_costs("n13-lattigo")
    prog = _q_mode_program()
    blocks, skip = fused_blocks(prog, params.slots)
    assert sorted((b.products, b.qmode) for b in blocks) == [(1, True), (2, True)]
    assert skip == {1, 2, 3, 4, 5}  # the rotation, the pmuls and the add run inside the blocks
    fc = fused_counts(prog, params.slots)
    assert (fc.blocks, fc.q_blocks, fc.q_products, fc.q_babies, fc.babies, fc.bases) == (0, 2, 3, 1, 1, 1)
    # level-aware price at the top level (x is fresh), by hand from the calibrated table
    per = table.measurements["per_level_ms"][str(params.max_level)]  # type: ignore[index]
    want_ms = (per["block_base"] + per["block_baby"] + per["block_baby_q"]
               + 2 * per["block_q"] + 3 * per["block_product_q"])
    assert program_seconds(prog, table, params.max_level, params.slots) == pytest.approx(want_ms * 1e-3)
    # the objective (top-level weights) prices the same
    w = table.weights
    cv = count_program(prog, 0, 1, 3, 2, 0.0, params.slots)
    assert TimeModel(table).vector(cv) == pytest.approx(
        w.block_base + w.block_baby + w.block_baby_q + 2 * w.block_q + 3 * w.block_product_q)


def test_a_block_with_more_babies_than_blocks_stays_in_qp() -> None:
    """One giantless block over two babies: QP (two ModDowns once, not two per baby)."""
    prog = qp_block_program()
    fc = fused_counts(prog, 4096)
    assert (fc.blocks, fc.products, fc.babies, fc.q_blocks) == (1, 2, 2, 0)


def test_q_mode_weights_missing_from_an_older_table_fall_back() -> None:
    """A table without the Q-mode weights prices them as their QP counterparts."""
    table = load_costs("n13-lattigo")
    old_w = table.weights.model_copy(update={"block_q": None, "block_product_q": None, "block_baby_q": None})
    meas = {"per_level_ms": {lv: {k: v for k, v in m.items() if not k.endswith("_q")}
                             for lv, m in table.measurements["per_level_ms"].items()}}  # type: ignore[union-attr]
    old = table.model_copy(update={"weights": old_w, "measurements": meas})
    lw = TimeModel(old)
    for lv in (0, 3):
        assert lw.at("block_product_q", lv) == lw.at("block_product", lv)
        assert lw.at("block_baby_q", lv) == lw.at("block_finish", lv)
        assert lw.at("block_q", lv) == lw.at("add", lv)
    prog = _q_mode_program()
    cv = count_program(prog, 0, 1, 3, 2, 0.0, 4096)
    w = old_w
    assert TimeModel(old).vector(cv) == pytest.approx(
        w.block_base + w.block_baby + w.block + 2 * w.add + 3 * w.block_product)


@pytest.mark.parametrize("conv", ["conv1", "conv4"])
def test_time_objective_picks_the_family_with_the_least_modelled_time(conv: str) -> None:
    """Kernels with an analytic cost (bsgs, hs-diagonal) are priced fused like lowered ones
    (imra): the time objective's plan models no slower than each family's own plan (conv4
    at n13 chose imra at 272 modelled ms over bsgs at 181 when analytic costs were priced
    instruction by instruction)."""
    from backends.lattigo_bench import conv_workload

    params = load_params("n13")
    graph = conv_workload(conv).graph
    best = modelled_seconds(plan_graph(graph, params, PlanOptions(input_layout="free")).plan, params)
    assert best is not None
    for fam in ("imra", "bsgs", "hs-diagonal"):
        res = plan_graph(graph, params, PlanOptions(input_layout="free", kernels=(fam, "elementwise")))
        t = modelled_seconds(res.plan, params)
        assert t is not None and best <= t * (1 + 1e-9), (fam, best, t)


def test_analytic_candidate_cost_carries_its_fused_counts() -> None:
    from backends.lattigo_bench import conv_workload
    from planner.pipeline import build_problem, resolve_objective

    params = load_params("n13")
    opts = resolve_objective(PlanOptions(input_layout="free", kernels=("bsgs", "elementwise")), params)
    problem = build_problem(conv_workload("conv4").graph, params, opts)
    cand = problem.candidates["y"][0]
    assert cand.analytic is not None
    plain, fused = cand.cost(params.slots), cand.cost(params.slots, fused=True)
    b, _ = cand.dry_program(params.slots)
    assert plain.fused == type(plain.fused)()
    assert fused.fused == fused_counts(b.instrs, params.slots) and fused.fused.blocks >= 1
    assert (fused.rotations, fused.pmul) == (plain.rotations, plain.pmul)


def test_product_sum_counted_and_priced_by_hand() -> None:
    """Two ct-ct products summed: one relinearisation (planner.ir.fusion product sums)."""
    from planner import ir
    from planner.ir.fusion import product_sums

    params = load_params("n13")
    table = load_costs("n13-lattigo")
    prog = [
        *({"op": "input", "dst": r, "tensor": r, "table": r} for r in ("a", "b", "c", "d")),
        {"op": "cmul", "dst": "p", "a": "a", "b": "b"},
        {"op": "cmul", "dst": "q", "a": "c", "b": "d"},
        {"op": "add", "dst": "s", "a": "p", "b": "q"},
        {"op": "cmul", "dst": "u", "a": "s", "b": "a"},  # s is rescaled first; u alone: no sum
        {"op": "output", "src": "u", "tensor": "u", "table": "u"},
    ]
    sums = product_sums([ir.decode(i) for i in prog])
    assert [(s.terms, s.instrs) for s in sums] == [((("a", "b"), ("c", "d")), (4, 5, 6))]
    fc = fused_counts(prog, params.slots)
    assert (fc.sums, fc.cmul, fc.add, fc.blocks) == (1, 2, 1, 0)
    top, mid = params.max_level, params.max_level - 1
    lw = TimeModel(table)
    want = (2 * lw.at("cmul_tensor", top) + lw.at("relin", top)  # the sum at the top level
            + lw.at("rescale", top) + lw.at("cmul_relin", mid))  # s rescaled, then u one level down
    assert program_seconds(prog, table, params.max_level, params.slots) == pytest.approx(want * 1e-3)
    w = table.weights
    cv = count_program(prog, 0, 2, 0, 1, 0.0, params.slots)
    assert TimeModel(table).vector(cv) == pytest.approx(2 * w.cmul_tensor + w.relin + w.cmul)
