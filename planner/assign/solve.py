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
from solver.model import Solution, Status


def solve_problem(problem: PlanProblem) -> Solution:
    progress.begin("solve")
    # a whole-request wall limit (progress.deadline) caps the solver's own limit
    left = progress.remaining()
    limit = problem.options.time_limit_s if left is None else max(0.05, min(problem.options.time_limit_s, left))
    sol = create(problem.options.solver).solve(problem.model, limit)
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
