"""Plug-in registries (common.registry.Registry): one table per kind of plug-in, read by the
planner, the CLI's help and checks and the REST schema."""

from __future__ import annotations

import pytest

from backends.runner import EXECUTION_BACKENDS
from common.errors import SlotplanError
from common.registry import Registry, UnknownNameError
from planner.assign.candidates import ELEMENTWISE_KERNELS, KERNEL_FAMILIES, KERNELS, LINEAR_KERNELS
from planner.cost.tables import COST_TABLES, CostTableError, load_costs
from planner.keys.profile import KeyScheduleError
from planner.keys.residency import KEY_STRATEGIES, STRATEGIES
from planner.pipeline import PlanOptionsLiteral
from solver import SOLVER_BACKENDS, SOLVERS, UnknownSolverError, create


def test_registry_basics() -> None:
    reg: Registry[str] = Registry("widget", "known widgets")
    reg.register("a", lambda: "A")

    @reg.register("b")
    def _b(x: str = "") -> str:
        return "B" + x

    assert reg.names() == ("a", "b") and list(reg) == ["a", "b"]
    assert "a" in reg and "c" not in reg and 3 not in reg
    assert reg.create("b", "!") == "B!"
    assert reg.check("a") == "a"
    assert reg.help() == "a | b" and reg.help(",") == "a,b"
    with pytest.raises(UnknownNameError, match=r"^unknown widget 'c'; known widgets: a, b$"):
        reg.create("c")
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("a", lambda: "again")


def test_registry_discovers_at_lookup() -> None:
    found = {"x": lambda: 1}
    reg: Registry[int] = Registry("thing", discover=lambda: dict(found))
    reg.register("fixed", lambda: 0)
    assert reg.names() == ("fixed", "x")
    found["y"] = lambda: 2
    assert reg.create("y") == 2


def test_every_registry_names_its_plug_ins() -> None:
    assert SOLVERS == SOLVER_BACKENDS.names() == ("cpsat", "z3")
    assert EXECUTION_BACKENDS.names() == ("sim", "noisy", "lattigo")
    assert STRATEGIES == KEY_STRATEGIES.names() == ("keep-all", "keymemrt", "belady", "exact", "pow2", "joint")
    # CinS families are registered but not offered by default (docs/cins.md)
    # complex-packing families are offered with options.packing "complex" only (docs/formats.md)
    assert tuple(k for k in KERNEL_FAMILIES.names() if KERNEL_FAMILIES.create(k).kind not in ("cins", "complex")) \
        == KERNELS
    assert all(KERNEL_FAMILIES.create(k).linear is not None for k in KERNEL_FAMILIES.names()
               if KERNEL_FAMILIES.create(k).kind == "complex")
    assert all(KERNEL_FAMILIES.create(k).cins is not None for k in KERNEL_FAMILIES.names()
               if KERNEL_FAMILIES.create(k).kind == "cins")
    assert set(LINEAR_KERNELS) | set(ELEMENTWISE_KERNELS) == set(KERNELS)
    assert all(KERNEL_FAMILIES.create(k).linear is not None for k in LINEAR_KERNELS)
    assert "default" in COST_TABLES and COST_TABLES.names() == tuple(sorted(COST_TABLES.names()))


def test_unknown_names_keep_their_messages() -> None:
    with pytest.raises(UnknownSolverError, match=r"^unknown solver 'gurobi'; known solvers: cpsat, z3$"):
        create("gurobi")
    with pytest.raises(SlotplanError, match=r"^unknown backend 'gpu'; known backends: sim, noisy, lattigo$"):
        EXECUTION_BACKENDS.check("gpu")
    with pytest.raises(KeyScheduleError, match=r"^unknown key strategy 'lru'; known: keep-all, keymemrt, "):
        KEY_STRATEGIES.create("lru")
    with pytest.raises(CostTableError, match=r"^cost table 'nope' not found; known: default, "):
        load_costs("nope")


def test_rest_schema_enum_reads_the_solver_registry() -> None:
    schema = PlanOptionsLiteral.model_json_schema()
    assert schema["properties"]["solver"]["enum"] == list(SOLVER_BACKENDS.names())


def test_cli_help_reads_the_registries() -> None:
    from typer.testing import CliRunner

    from api.cli import app

    runner = CliRunner()
    plan_help = " ".join(runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "400"}).output.split())
    assert SOLVER_BACKENDS.help() in plan_help and KERNEL_FAMILIES.help(",") in plan_help
    run_help = " ".join(runner.invoke(app, ["run", "--help"], env={"COLUMNS": "400"}).output.split())
    assert EXECUTION_BACKENDS.help() in run_help
    keys_help = " ".join(runner.invoke(app, ["keys", "--help"], env={"COLUMNS": "400"}).output.split())
    assert KEY_STRATEGIES.help() in keys_help
