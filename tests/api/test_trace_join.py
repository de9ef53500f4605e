"""scripts/trace_join.py: an op trace of a real Lattigo run (SLOTPLAN_OP_TRACE, written by the
Go executor) joined with the time model's price of each instruction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from api.model_bench import run_conditions
from planner.cost.timing import time_model
from planner.frontend.params import Params
from scripts.trace_join import TraceError, join, main, read_trace
from tests.helpers import REPO_ROOT, matvec_graph, plan_small


def _lattigo_available() -> bool:
    from backends.lattigo_backend import available

    return available()


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """A 40x100 matvec at log N 10 (a fused block over baby rotations), run once on Lattigo
    in a process of its own with the trace on."""
    tmp = tmp_path_factory.mktemp("trace")
    res = plan_small(matvec_graph(40, 100), levels=3)
    plan_file, tables, trace = tmp / "p.json", tmp / "t.npz", tmp / "trace.tsv"
    plan_file.write_text(json.dumps(res.plan))
    np.savez(tables, **dict(res.tables.items()))
    env = dict(os.environ, SLOTPLAN_OP_TRACE=str(trace))
    run = subprocess.run(
        [str(Path(sys.executable).parent / "slotplan"), "run", str(plan_file), "--tables", str(tables),
         "--backend", "lattigo", "--seed", "1", "--json"],
        capture_output=True, text=True, timeout=300, env=env, cwd=REPO_ROOT,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["ok"]
    return res.plan, trace


@pytest.mark.skipif(not _lattigo_available(), reason="Lattigo extension not built (make lattigo)")
def test_join_accounts_for_every_step_and_every_price(traced: tuple[dict, Path]) -> None:
    plan, trace = traced
    rows = read_trace(trace)
    assert rows, "the executor wrote no trace"
    classes = join(plan, rows)
    # every traced second lands in one class, and every instruction's price in one class
    assert sum(c["steps"] for c in classes.values()) == len(rows)
    assert abs(sum(c["measured"] for c in classes.values()) - sum(s for _, _, s in rows)) < 1e-9
    params = Params.from_json(plan["params"])
    tm = time_model(params)
    priced = sum(tm.program_costs(plan["program"], params.max_level, params.slots, run_conditions(params)))
    in_program = sum(c["modelled"] for k, c in classes.items() if k not in ("key loads", "block load"))
    assert abs(in_program - priced * tm.ms_per_unit / 1e3) < 1e-9
    # the matvec runs as a fused block, its input and output as their own ops
    assert classes["fused"]["steps"] >= 1 and classes["fused"]["modelled"] > 0
    assert classes["input"]["steps"] == 1


@pytest.mark.skipif(not _lattigo_available(), reason="Lattigo extension not built (make lattigo)")
def test_two_evaluations_in_one_trace_double_the_model(traced: tuple[dict, Path], tmp_path: Path) -> None:
    plan, trace = traced
    twice = tmp_path / "twice.tsv"
    twice.write_text(trace.read_text() * 2)
    one, two = join(plan, read_trace(trace)), join(plan, read_trace(twice))
    for k in one:
        assert two[k]["steps"] == 2 * one[k]["steps"]
        assert two[k]["modelled"] == pytest.approx(2 * one[k]["modelled"])


@pytest.mark.skipif(not _lattigo_available(), reason="Lattigo extension not built (make lattigo)")
def test_plaintext_store_prices_only_the_blocks_differently(traced: tuple[dict, Path]) -> None:
    """--plaintext-store: the fused class is priced with the store's reads; every other
    class as without it."""
    plan, trace = traced
    rows = read_trace(trace)
    enc, store = join(plan, rows), join(plan, rows, plaintext_store=True)
    assert store["fused"]["modelled"] != pytest.approx(enc["fused"]["modelled"])
    assert main([str(Path(trace).with_name("p.json")), str(trace), "--plaintext-store", "--json"]) == 0
    for k in enc:
        if k != "fused":
            assert store[k]["modelled"] == pytest.approx(enc[k]["modelled"]) and store[k]["measured"] == enc[k]["measured"]


def test_a_trace_of_another_plan_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = plan_small(matvec_graph(8, 8), levels=2)
    plan_file, bad = tmp_path / "p.json", tmp_path / "bad.tsv"
    plan_file.write_text(json.dumps(res.plan))
    bad.write_text(f"{len(res.plan['program'])}\trot\t1\t0.5\t0\t0\t0.0\n")
    with pytest.raises(TraceError, match="names instruction"):
        join(res.plan, read_trace(bad))
    assert main([str(plan_file), str(bad)]) == 2
    assert "error:" in capsys.readouterr().err
    bad.write_text("0\tinput\n")
    assert main([str(plan_file), str(bad)]) == 2
    assert "fields" in capsys.readouterr().err
