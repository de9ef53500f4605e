"""CLI contract: exit statuses, one-line errors, nothing half-written, determinism, and
plan + npz executable by a numpy-only third party."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from planner.frontend.graph import load_graph
from planner.frontend.reference import random_values, reference
from solver import SOLVERS
from tests.helpers import REPO_ROOT, cli_in_process
from tests.third_party_exec import execute

ROOT = REPO_ROOT
SLOTPLAN = [sys.executable, "-m", "api.cli"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """``slotplan ARGS`` in this process (api.cli.main, its exit status and output)."""
    return cli_in_process(args, cwd=ROOT)


def run_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``slotplan ARGS`` as its own process: for what only a process shows (the same plan
    bytes from two interpreters, usage errors without a traceback)."""
    return subprocess.run([*SLOTPLAN, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_plan_tables_run_by_third_party(tmp_path: Path) -> None:
    plan_p, tab_p = tmp_path / "p.json", tmp_path / "t.npz"
    r = run("plan", "data/workloads/conv1.json", "--params", "n13", "-o", str(plan_p), "--tables", str(tab_p))
    assert r.returncode == 0, r.stderr
    plan = json.loads(plan_p.read_text())
    assert plan["schema"] == "slotplan.plan/1"
    g = load_graph(ROOT / "data/workloads/conv1.json")
    vals = random_values(g, 3)
    got = execute(plan, dict(np.load(tab_p)), vals)
    want = reference(g, vals)["y"]
    np.testing.assert_allclose(got["y"].reshape(want.shape), want, rtol=1e-9, atol=1e-9)
    r = run("run", str(plan_p), "--tables", str(tab_p), "--seed", "5", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ok"] is True


def test_plans_are_byte_for_byte_deterministic(tmp_path: Path) -> None:
    outs = []
    for i in range(2):
        p = tmp_path / f"p{i}.json"
        r = run_process("plan", "data/workloads/conv3.json", "--params", "n16", "-o", str(p))
        assert r.returncode == 0, r.stderr
        outs.append(p.read_bytes())
    assert outs[0] == outs[1]


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda g: g["nodes"][0].update(op="conv3d"), "unknown op"),
        (lambda g: g["nodes"][0].update(inputs=["x"]), "node 'y'"),
        (lambda g: g["tensors"]["w"].update(shape=[16, 5, 3, 3]), "node 'y'"),
        (lambda g: g["tensors"]["x"].update(shape=[3, 0, 32]), "positive"),
    ],
)
def test_bad_graph_exit_2_one_line_nothing_written(tmp_path: Path, mutate, needle: str) -> None:  # noqa: ANN001
    g = json.loads((ROOT / "data/workloads/conv1.json").read_text())
    mutate(g)
    gp = tmp_path / "g.json"
    gp.write_text(json.dumps(g))
    plan_p, tab_p = tmp_path / "p.json", tmp_path / "t.npz"
    r = run("plan", str(gp), "-o", str(plan_p), "--tables", str(tab_p))
    assert r.returncode == 2
    assert needle in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert not plan_p.exists() and not tab_p.exists()
    assert list(tmp_path.iterdir()) == [gp]


def test_bad_options_exit_2(tmp_path: Path) -> None:
    for args, needle in (
        (("--solver", "gurobi"), "known solvers: cpsat, z3"),
        (("--params", "n99"), "n12"),
        (("--kernels", "imra,magic"), "known kernels"),
        (("--memory-cap", "12 parsecs"), "KiB/MiB/GiB"),
    ):
        r = run("plan", "data/workloads/conv1.json", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert needle in r.stderr, (args, r.stderr)


def test_table_size_limit_refuses_cleanly(tmp_path: Path) -> None:
    plan_p, tab_p = tmp_path / "p.json", tmp_path / "t.npz"
    r = run("plan", "data/workloads/conv2.json", "-o", str(plan_p), "--tables", str(tab_p), "--max-table-bytes", "1MiB")
    assert r.returncode == 2 and "--max-table-bytes" in r.stderr
    assert not plan_p.exists() and not tab_p.exists()


def test_run_detects_tampered_plan(tmp_path: Path) -> None:
    plan_p, tab_p = tmp_path / "p.json", tmp_path / "t.npz"
    assert run("plan", "data/workloads/conv1.json", "--params", "n13", "-o", str(plan_p), "--tables", str(tab_p)).returncode == 0
    plan = json.loads(plan_p.read_text())
    for ins in plan["program"]:
        if ins["op"] == "rot":
            ins["k"] = ins["k"] + 1  # a wrong rotation must be caught as a mismatch
            break
        if ins["op"] == "rot_hoisted":
            ins["ks"] = [ins["ks"][0] + 1, *ins["ks"][1:]]
            break
    plan_p.write_text(json.dumps(plan))
    r = run("run", str(plan_p), "--tables", str(tab_p))
    assert r.returncode == 1 and "MISMATCH" in r.stdout


def test_solvers_agree_via_cli() -> None:
    objs = []
    for solver in SOLVERS:
        r = run("plan", "data/workloads/conv2.json", "--solver", solver, "--json")
        assert r.returncode == 0, r.stderr
        objs.append(json.loads(r.stdout)["summary"]["solver"]["objective"])
    assert objs[0] == objs[1]


def test_usage_errors_exit_2_without_traceback() -> None:
    for args in (("plan", "--bogus"), ("nosuchcommand",), ("plan",)):
        r = run_process(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr and r.stderr.startswith("slotplan:")
