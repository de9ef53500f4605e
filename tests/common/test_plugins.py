"""The plug-in roles through their registries, with fakes (tests/conftest.py): a solver
back end and execution back ends registered for one test drive the real pipeline and
runner; every preset plans and simulates; the CLI in-process."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from backends.runner import EXECUTION_BACKENDS, run_plan
from common.errors import SlotplanError
from planner.frontend.params import Params, load_params
from planner.pipeline import PlanOptions, plan_graph
from solver import SOLVER_BACKENDS
from tests.helpers import REPO_ROOT, check_plan, matvec_graph


def test_a_registered_solver_drives_the_pipeline(fake_solver: str) -> None:
    assert fake_solver in SOLVER_BACKENDS.names()
    g = matvec_graph(40, 24)
    res = plan_graph(g, load_params("n13"), PlanOptions(solver=fake_solver))
    s = res.plan["summary"]["solver"]
    assert (s["name"], s["status"]) == (fake_solver, "feasible")
    check_plan(res, g)
    # the greedy answer is never better than the exact one
    exact = plan_graph(g, load_params("n13"), PlanOptions())
    assert exact.plan["summary"]["solver"]["objective"] <= s["objective"]


def test_fakes_leave_the_registries_as_they_were() -> None:
    assert "fake-greedy" not in SOLVER_BACKENDS.names()
    assert EXECUTION_BACKENDS.names() == ("sim", "noisy", "lattigo")
    with pytest.raises(SlotplanError, match="unknown backend 'fake-exact'; known backends: sim, noisy, lattigo"):
        EXECUTION_BACKENDS.create("fake-exact")


def test_registered_backends_drive_the_runner(fake_backends: tuple[str, str]) -> None:
    exact, off = fake_backends
    g = matvec_graph(30, 20)
    res = plan_graph(g, load_params("n13"), PlanOptions())
    ok = run_plan(res.plan, res.tables, exact, seed=2)
    assert ok.ok and ok.backend == exact and ok.stats == {"backend": "fake"}
    bad = run_plan(res.plan, res.tables, off, seed=2)
    assert not bad.ok and bad.max_abs_error == pytest.approx(1e-3)


def test_every_preset_plans_and_simulates(preset: Params) -> None:
    """A matvec spanning a ciphertext's worth of slots on each preset ring."""
    n = min(preset.slots, 2048)
    g = matvec_graph(64, n)
    res = plan_graph(g, preset, PlanOptions())
    check_plan(res, g)
    assert res.plan["params"]["log_n"] == preset.log_n


def test_cli_in_process(cli: Callable[..., tuple[int, str, str]], tmp_path: Path) -> None:
    root = REPO_ROOT
    code, out, err = cli("plan", root / "data/workloads/conv1.json", "--params", "n13", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["summary"]["clean_outputs"] is True and doc["nodes"][0]["id"] == "y"
    code, _, err = cli("plan", root / "data/workloads/conv1.json", "--solver", "nope")
    assert code == 2 and "unknown solver 'nope'" in err


def test_every_help_text_renders(cli: Callable[..., tuple[int, str, str]]) -> None:
    """`slotplan --help` and every command's help (rich markup in a docstring once broke
    the top-level help with a MarkupError)."""
    from api.cli import app

    code, out, err = cli("--help")
    assert code == 0 and "Usage" in out, err
    names = [c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands]
    assert len(names) >= 10
    for name in names:
        code, out, err = cli(name.replace("_", "-"), "--help")
        assert code == 0 and "Usage" in out, (name, err)
