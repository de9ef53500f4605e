"""solver.cpsat's own promises (its optimum against brute force is tests/solver/
test_choice_model.py): the same model gives the same solution every time, with or without
a progress listener (which hears every improving solution), whatever the hint; client
inputs that adapt to their reader; a depth budget that only deeper options break."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from common import progress
from solver.cpsat import CpSatSolver
from solver.model import ChoiceModel, Edge, Group, Status
from tests.helpers import choice_brute_force as brute_force
from tests.helpers import random_choice_model as random_model


class Listener:
    def __init__(self) -> None:
        self.notes: list[str] = []

    def start(self, stage: str, total: int | None) -> None: ...

    def advance(self, stage: str, detail: str) -> None: ...

    def note(self, stage: str, text: str) -> None:
        self.notes.append(f"{stage}: {text}")

    def finish(self, stage: str) -> None: ...


def _hinted(m: ChoiceModel, hint: int) -> ChoiceModel:
    groups = tuple(Group(g.name, g.costs, g.labels, hint % len(g.costs), g.depths) for g in m.groups)
    return ChoiceModel(groups, m.edges, m.max_depth, m.boot_weight)


@pytest.mark.parametrize("seed", range(8))
def test_same_solution_every_time_with_or_without_a_listener(seed: int) -> None:
    m = random_model(seed, depth=True)
    first = CpSatSolver().solve(m, 30.0)
    again = CpSatSolver().solve(m, 30.0)
    listener = Listener()
    with progress.reporting(listener):
        heard = CpSatSolver().solve(m, 30.0)
    for s in (again, heard):
        assert (s.choice, s.status, s.objective, s.bound) == (first.choice, first.status, first.objective, first.bound)
    if first.status is Status.OPTIMAL:
        assert any(n.startswith("solve: solution 1: objective") for n in listener.notes)
        # another hint may lead to another optimal choice, never to another objective
        for h in (1, 2):
            assert CpSatSolver().solve(_hinted(m, h), 30.0).objective == first.objective == brute_force(m)


def test_an_adapting_input_takes_the_layout_its_reader_wants() -> None:
    """A client input read by one edge (``adapts``): each reader option has its own input
    option at cost 0, the others are forbidden; the solver picks the reader's cheapest."""
    inp = Group("input:x", (0, 0, 0), ("a", "b", "c"))
    node = Group("n", (7, 3, 5), ("A", "B", "C"))
    costs = tuple(tuple(0 if a == b else None for b in range(3)) for a in range(3))
    m = ChoiceModel((inp, node), (Edge("input:x", "n", "x", costs, adapts=True),))
    s = CpSatSolver().solve(m, 10.0)
    assert s.status is Status.OPTIMAL and s.objective == 3 and s.option("n") == 1 and s.option("input:x") == 1
    pruned, keep = m.prune_dominated()
    # the input adapts to any reader option: the dearer reader options are dominated
    assert CpSatSolver().solve(pruned, 10.0).objective == 3 and keep["n"] == [1]


def test_depth_budget_forbids_only_the_deep_combinations() -> None:
    """A chain of three nodes whose cheap options cost two levels and dear ones one: with
    L levels the solver buys exactly the depth it lacks at the cheapest price."""
    names = ["input:x", "a", "b", "c"]
    groups = [Group("input:x", (0,), ("x",))] + [
        Group(n, (1, 10 + i), (f"{n}/cheap", f"{n}/shallow"), depths=(2, 1)) for i, n in enumerate(names[1:])]
    edges = tuple(Edge(s, d, s, ((0,) * len(groups[i + 1].costs),) if s == "input:x" else ((0, 0), (0, 0)))
                  for i, (s, d) in enumerate(itertools.pairwise(names)))
    for L, want in ((6, 3), (5, 10 + 1 + 1), (4, 10 + 11 + 1), (3, 10 + 11 + 12), (2, None)):
        m = ChoiceModel(tuple(groups), edges, L)
        s = CpSatSolver().solve(m, 10.0)
        if want is None:
            assert s.status is Status.INFEASIBLE
            continue
        assert s.status is Status.OPTIMAL and s.objective == want == brute_force(m), L
        d: dict[str, Any] = m.depths_of(dict(s.choice))
        assert max(d.values()) <= L
