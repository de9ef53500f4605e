"""slotplan solver layer: pluggable back ends of solver-neutral models.

``create(name)`` returns a back end of :data:`SOLVER_BACKENDS` (``cpsat``, ``z3``); unknown
names are refused with the list.
"""

from __future__ import annotations

from typing import Protocol

from common.errors import SlotplanError
from common.registry import Registry
from solver.model import ChoiceModel, Solution, Status


class SolverBackend(Protocol):
    name: str

    def solve(self, model: ChoiceModel, time_limit_s: float) -> Solution: ...


class UnknownSolverError(SlotplanError):
    pass


# Solver back ends by name (imported when first created: ortools and z3 load lazily).
SOLVER_BACKENDS: Registry[SolverBackend] = Registry("solver", "known solvers", UnknownSolverError)


@SOLVER_BACKENDS.register("cpsat")
def _cpsat() -> SolverBackend:
    from solver.cpsat import CpSatSolver

    return CpSatSolver()


@SOLVER_BACKENDS.register("z3")
def _z3() -> SolverBackend:
    from solver.z3backend import Z3Solver

    return Z3Solver()


SOLVERS = SOLVER_BACKENDS.names()


def create(name: str) -> SolverBackend:
    """The back end called ``name``; unknown names are refused with the list."""
    return SOLVER_BACKENDS.create(name)


__all__ = ["SOLVERS", "SOLVER_BACKENDS", "ChoiceModel", "Solution", "SolverBackend", "Status", "create"]
