"""The Lattigo back end's process model when a run reuses the DFT matrices an earlier run of
the process kept (backends/runner.py _run_lattigo): they are in the run's measured start
(rss_start) and are not counted a second time in its growth."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from backends import lattigo_backend, lattigo_memory, runner
from planner.frontend.graph import parse_graph
from planner.frontend.params import load_params


def _stats(reused: bool) -> dict[str, Any]:
    return {"rss_start_bytes": 5_000_000_000, "boot_state_reused": reused, "boot_matrix_bytes": 3_000_000_000,
            "op_counts": {}, "rotations": 0}


@pytest.mark.parametrize("reused", [False, True])
def test_kept_matrices_are_in_the_start_not_again_in_the_growth(monkeypatch: pytest.MonkeyPatch, reused: bool) -> None:
    model = {"keys": 8_000_000_000, "growth": 12_000_000_000, "baseline": 1, "total": 12_000_000_001}
    monkeypatch.setattr(lattigo_backend, "check_executable", lambda plan: None)
    monkeypatch.setattr(lattigo_memory, "executor_memory", lambda plan: {})
    monkeypatch.setattr(lattigo_memory, "process_model", lambda *a, **k: dict(model))
    monkeypatch.setattr(lattigo_backend, "run_plan", lambda *a, **k: lattigo_backend.LattigoResult(
        {"y": np.zeros(2)}, _stats(reused)))
    graph = parse_graph({"schema": "slotplan.graph/1", "name": "g",
                         "tensors": {"x": {"shape": [2], "role": "input"}},
                         "nodes": [{"id": "y", "op": "add", "inputs": ["x", "x"]}], "outputs": ["y"]})
    plan = {"plaintexts": {}, "outputs": {"y": [2]}, "params": {"slots": 2}}
    ex = runner._run_lattigo(plan, {}, {"x": np.zeros(2)}, graph, load_params("n12"))
    pm = ex.stats["process_model"]
    growth = 12_000_000_000 - (3_000_000_000 if reused else 0)
    assert pm["baseline"] == 5_000_000_000 and pm["growth"] == growth and pm["total"] == growth + 5_000_000_000
