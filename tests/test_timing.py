"""planner.timing: a plan's modelled time with every instruction and fused block priced at
the level it runs at (per-level calibrated weights, linear between calibrated levels)."""

from __future__ import annotations

import pytest

from backends.lattigo_bench import modelled_seconds, mvm_graph
from planner.costs import load_costs
from planner.fusion import fused_blocks, fused_counts
from planner.kernels.base import count_program
from planner.params import load_params
from planner.pipeline import PlanOptions, plan_graph
from planner.timing import LevelWeights, program_seconds


def test_level_weights_interpolate_between_calibrated_levels() -> None:
    table = load_costs("n14-lattigo")
    lw = LevelWeights(table)
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
    lw = LevelWeights(table)
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
    top = table.score(cv) * 1e-3
    got = program_seconds(prog, table, params.max_level, params.slots)
    assert 0 < got <= top * (1 + 1e-9)
    assert modelled_seconds(res.plan, params) == pytest.approx(got, abs=1e-6)
    assert modelled_seconds(res.plan, params, level_aware=False) == pytest.approx(top, abs=1e-6)


def test_deeper_plans_cost_less_per_layer() -> None:
    """The same matvec after an x*x activation runs one level down: cheaper than at the top."""
    from planner.graph import parse_graph

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
    assert level_aware < table.score(cv) * 1e-3
