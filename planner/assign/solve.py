"""Solving the choice model with the requested back end (CP-SAT or z3) under the request's
time limit, and naming why when no assignment exists."""

from __future__ import annotations

from dataclasses import replace

from common import progress
from planner.assign.candidates import (
    PlanError,
)
from planner.assign.problem import PlanProblem
from solver import create
from solver.model import FULL, Solution, Status


def solve_problem(problem: PlanProblem) -> Solution:
    progress.begin("solve")
    # a whole-request wall limit (progress.deadline) caps the solver's own limit
    left = progress.remaining()
    limit = problem.options.time_limit_s if left is None else max(0.05, min(problem.options.time_limit_s, left))
    sol = _solve(problem, limit)
    progress.end("solve")
    if sol.status is Status.UNKNOWN and limit < problem.options.time_limit_s:
        progress.check("solve")  # the wall limit, not the solver's own, stopped it
        raise progress.DeadlineExceeded("solve", "no plan found in the time left", progress.limit_seconds() or 0.0)
    if sol.status is Status.INFEASIBLE:
        m = problem.model
        if m.bootstraps and problem.boot_unknown:
            _refuse_unknown_ranges(problem, limit)
        if m.max_depth is not None:
            relaxed = create(problem.options.solver).solve(replace(m, max_depth=None), limit)
            if relaxed.status is not Status.INFEASIBLE:
                raise PlanError(
                    f"no assignment of layouts fits the {m.max_depth} levels of params "
                    f"{problem.params.name}; choose a preset with more levels"
                )
        raise PlanError("no consistent assignment of layouts exists for this graph")
    return sol


def _solve(problem: PlanProblem, limit: float) -> Solution:
    """The model solved; with bootstrap variants in two steps: the model without them first
    (a no dearer plan than the full-slot one, its bootstraps then given their cheapest
    fitting variants: planner.assign.boot_variants), then the whole model with that
    assignment as its hint.  The better of the two is returned (the second step alone, on
    ResNet-20 at n16boot, ended its 10 s above the full-slot optimum: the variants' choices
    hide the placement the first step finds at once)."""
    m = problem.model
    backend = create(problem.options.solver)
    if not m.has_variants:
        return backend.solve(m, limit)
    first = backend.solve(m.without_variants(), limit)
    if first.status not in (Status.OPTIMAL, Status.FEASIBLE):
        return backend.solve(m, limit)
    choice = dict(first.choice)
    vs = m.improve_variants(choice, first.boots)
    hinted = replace(m, groups=tuple(
        replace(g, hint=choice[g.name], boot_hint=g.name in first.boots, variant_hint=vs.get(g.name, FULL))
        for g in m.groups))
    left = progress.remaining()  # (a whole-request wall limit bounds the second step too)
    sol = backend.solve(hinted, limit if left is None else max(0.05, min(limit, left)))
    start = m.evaluate_boots(choice, first.boots, vs)
    assert start is not None
    if sol.status in (Status.OPTIMAL, Status.FEASIBLE) and sol.objective is not None and sol.objective <= start:
        return replace(sol, seconds=sol.seconds + first.seconds)
    bound = sol.bound if sol.status is Status.FEASIBLE else None
    return Solution(first.choice, Status.FEASIBLE, start, bound, sol.seconds + first.seconds, sol.solver,
                    first.boots, tuple((b, vs[b]) for b in first.boots if b in vs))


def _refuse_unknown_ranges(problem: PlanProblem, limit: float) -> None:
    """The plan needs a bootstrap of a value whose range is unknown: name the tensor."""
    m = problem.model
    relaxed = replace(m, groups=tuple(replace(g, bootable=True) if g.name in problem.boot_unknown else g
                                      for g in m.groups))
    sol = create(problem.options.solver).solve(relaxed, limit)
    if sol.status in (Status.OPTIMAL, Status.FEASIBLE):
        need = [b for b in sol.boots if b in problem.boot_unknown] or sorted(problem.boot_unknown)
        src = problem.boot_unknown[need[0]]
        why = (f"input {src!r} has no `range` [lo, hi] in the graph" if src in problem.graph.tensors
               and problem.graph.producer(src) is None else f"the interval of {src!r} is unbounded")
        raise PlanError(
            f"the graph is deeper than the {m.max_depth} levels of params {problem.params.name}, so the value of "
            f"{need[0]!r} must be bootstrapped, but its range is unknown ({why}); bootstrapping accepts "
            f"only |values| <= {problem.params.boot.max_abs if problem.params.boot else 0:g}",
            need[0],
        )


class PlanTimeout(PlanError):
    """The solver hit its time limit before finding any plan (CLI exit status 3)."""


class PlanWallTimeout(PlanTimeout):
    """The whole planning request ran past its wall limit (``plan_graph(wall_limit_s=)``)."""
