"""The KeyMemRT suite at n16boot (data/suites/keymemrt_n16boot.json): CP-SAT and z3 place
the same number of bootstraps on every graph, and the plans stay within the levels.

z3 does not prove the full ResNet-20 models optimal in test time (300 s: the same
objective and bootstraps as CP-SAT, status feasible); those two graphs are planned with
CP-SAT here (and in the golden tests), the KeyMemRT programs with both."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.keybench import load_key_suite
from planner.frontend.graph import load_graph
from planner.frontend.params import load_params
from planner.pipeline import PlanOptions, plan_graph
from solver import SOLVERS
from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT
SUITE, SUITE_DIR = load_key_suite(ROOT / "data" / "suites" / "keymemrt_n16boot.json")


@pytest.mark.parametrize("w", SUITE.workloads, ids=[Path(w.graph).stem for w in SUITE.workloads])
def test_solvers_place_the_same_bootstraps(w) -> None:  # noqa: ANN001
    g = load_graph((SUITE_DIR / w.graph).resolve())
    params = load_params(w.params or "n16boot")
    got = {}
    z3_fast = len(g.nodes) <= 30
    # the slot model of the large graphs (ResNet-20): with the CinS layers offered too, its
    # model does not prove optimal within the default 10 s on a loaded two-core machine
    # (it does with --time-limit 120); tests/planner/assign/test_cins_plans.py checks the solvers on CinS models
    cins = z3_fast
    for solver in SOLVERS if z3_fast else ("cpsat",):
        res = plan_graph(g, params, PlanOptions(solver=solver, input_layout=SUITE.input_layout, cins=cins))
        s = res.plan["summary"]
        assert s["solver"]["status"] == "optimal"
        got[solver] = (s["bootstraps"], s["solver"]["objective"])
        from planner.ir.analysis import register_depths

        assert max(register_depths(res.plan["program"]).values()) <= params.max_level
    assert len(set(got.values())) == 1, got
