"""Shared fixtures: the preset matrix, the CLI in-process, and fakes for the plug-in roles
(a solver back end and an execution back end registered for one test, as TVM MetaSchedule
ships dummy objects), so that the pipeline and the runner are tested against their
registries, not against cpsat and sim alone."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pytest

from backends.runner import EXECUTION_BACKENDS, SIM_RTOL, Execution
from planner.frontend.graph import Graph
from planner.frontend.params import PRESETS, Params, load_params
from planner.frontend.reference import reference
from solver import SOLVER_BACKENDS
from solver.model import ChoiceModel, Solution, Status

# Every built-in ring preset (n12..n16): tests that must hold on each take ``preset``.
PRESET_NAMES = tuple(sorted(n for n in PRESETS if n[1:].isdigit()))


@pytest.fixture(params=PRESET_NAMES)
def preset(request: pytest.FixtureRequest) -> Params:
    return load_params(request.param)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """``cli("plan", "g.json", ...)`` -> (exit status, stdout, stderr), in this process."""
    from tests.helpers import run_cli

    return lambda *args: run_cli([str(a) for a in args], capsys)


class GreedySolver:
    """A solver back end that answers with the model's greedy choice (status feasible)."""

    name = "fake-greedy"

    def solve(self, model: ChoiceModel, time_limit_s: float) -> Solution:
        choice = model.greedy()
        return Solution(tuple(choice.items()), Status.FEASIBLE, model.evaluate(choice), None, 0.0, self.name)


@pytest.fixture
def fake_solver() -> Iterator[str]:
    with SOLVER_BACKENDS.temporarily(GreedySolver.name, GreedySolver) as name:
        yield name


def _reference_backend(offset: float) -> Callable[..., Execution]:
    def run(plan: Mapping[str, Any], tables: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray],
            graph: Graph, params: Params) -> Execution:
        ref = reference(graph, values)
        outs = {t: ref[t] + offset for t in graph.outputs}
        return Execution(outs, {"fake": 1}, 0, 0, 0, SIM_RTOL, {"backend": "fake"})

    return run


@pytest.fixture
def fake_backends() -> Iterator[tuple[str, str]]:
    """Two execution back ends: one that answers the reference, one that is off by 1e-3."""
    with EXECUTION_BACKENDS.temporarily("fake-exact", _reference_backend(0.0)), \
            EXECUTION_BACKENDS.temporarily("fake-off", _reference_backend(1e-3)):
        yield "fake-exact", "fake-off"
