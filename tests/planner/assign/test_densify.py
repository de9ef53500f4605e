"""One-sample plans pack a strided conv's gapped output densely where that saves ciphertexts
(planner.assign.densify, offered to every plan since ResNet-20 at n16boot halved its products
with it): the simulator equals numpy, every layout claim holds, the choice model's objective
is never above the gapped plan's."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from backends.layout_check import check_claims, claimed_registers
from backends.sim import simulate
from planner.frontend.graph import parse_graph
from planner.frontend.reference import random_values, reference
from planner.pipeline import PlanOptions, plan_graph
from tests.helpers import small_params
from tests.planner.batch.test_batch_densify import downsampling_block


def _simulated_against_numpy(res: Any, g: Any, seed: int) -> Any:
    """Simulate the plan on random values: every layout claim holds and the outputs equal
    numpy (1e-9); the simulation."""
    vals = random_values(g, seed)
    sim = simulate(res.plan, res.tables, vals, keep=claimed_registers(res))
    problems = list(check_claims(res, vals, sim))
    assert not problems, "\n".join(problems)
    ref = reference(g, vals)
    for t in g.outputs:
        err = float(np.max(np.abs(sim.outputs[t] - ref[t]))) / max(1.0, float(np.max(np.abs(ref[t]))))
        assert err < 1e-9, (t, err)
    return sim


@pytest.mark.parametrize(("c", "hw", "log_n", "chosen"),
                         [(8, 8, 10, True), (2, 16, 10, None), (4, 16, 11, None), (3, 12, 10, None)])
def test_one_sample_strided_output_packed_densely(c: int, hw: int, log_n: int, chosen: bool | None) -> None:
    # the input (c x hw x hw) fills the ring; the stride-2 convs leave 2c channels in blocks
    # of the input's grid (two ciphertexts), dense they fit one. Whether packing pays is the
    # solver's call (chosen None: either way); the plan is checked whichever it takes
    g = parse_graph(downsampling_block(c, hw))
    params = small_params(log_n, levels=10)
    opts = PlanOptions(allow_insecure=True)
    assert opts.densify
    res = plan_graph(g, params, opts)
    dense = [n["id"] for n in res.plan["nodes"] if n["params"].get("densify")]
    if chosen:
        assert dense, [(n["id"], n["out_layout"]) for n in res.plan["nodes"]]
    sim = _simulated_against_numpy(res, g, 3)
    assert res.plan["summary"]["clean_outputs"] and not any(sim.leaked_slots.values())
    # the gapped plan (densify off) is a feasible point of the same model: never cheaper
    gapped = plan_graph(g, params, replace(opts, densify=False))
    assert not any(n["params"].get("densify") for n in gapped.plan["nodes"])
    assert res.solution.objective is not None and gapped.solution.objective is not None
    assert res.solution.objective <= gapped.solution.objective


@pytest.mark.parametrize("how", [True, "one-level"])
@pytest.mark.parametrize(("c", "hw", "log_n"), [(8, 8, 10), (3, 12, 10), (2, 16, 10)])
def test_each_packing_route_alone(how: bool | str, c: int, hw: int, log_n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # the two routes of planner.assign.densify, each forced where it applies (the node's
    # other candidates withdrawn): two permutes (grid, then channels: two levels) or one
    # permute (one level, more rotations and products). Either plan equals numpy with every
    # layout claim holding, and the one-level route spends one level less at the packed node
    import planner.assign.problem as problem
    from planner.assign.densify import densified_variants

    def forced(want: bool | str) -> Any:
        def variants(cands: list[Any], *a: Any) -> list[Any]:
            vs = [v for v in densified_variants(cands, *a) if v.params["densify"] == want]
            if vs:
                cands[:] = []  # (problem.py adds the variants to this list)
            return vs
        return variants

    # (odd and power-of-two grids; the gapped output spans two ciphertexts, dense one)
    g = parse_graph(downsampling_block(c, hw))
    params = small_params(log_n, levels=10)
    monkeypatch.setattr(problem, "densified_variants", forced(how))
    res = plan_graph(g, params, PlanOptions(allow_insecure=True))
    packed = [n for n in res.plan["nodes"] if n["params"].get("densify")]
    assert packed and all(n["params"]["densify"] == how for n in packed), [n["params"] for n in res.plan["nodes"]]
    _simulated_against_numpy(res, g, 5)
    if how == "one-level":  # the same packing in the other route costs one level more
        monkeypatch.setattr(problem, "densified_variants", forced(True))
        two = plan_graph(g, params, PlanOptions(allow_insecure=True))
        depth = {n["id"]: n["cost"]["depth"] for n in two.plan["nodes"]}
        for n in packed:
            assert n["cost"]["depth"] == depth[n["id"]] - 1, (n["id"], n["cost"], depth)
