"""slotplan solver layer: pluggable back ends of solver-neutral models.

``create("cpsat" | "z3")`` returns a back end; unknown names are refused with the list.
"""

from __future__ import annotations

from typing import Protocol

from planner.errors import SlotplanError
from solver.model import ChoiceModel, Solution, Status


class SolverBackend(Protocol):
    name: str

    def solve(self, model: ChoiceModel, time_limit_s: float) -> Solution: ...


SOLVERS = ("cpsat", "z3")


class UnknownSolverError(SlotplanError):
    pass


def create(name: str) -> SolverBackend:
    if name == "cpsat":
        from solver.cpsat import CpSatSolver

        return CpSatSolver()
    if name == "z3":
        from solver.z3backend import Z3Solver

        return Z3Solver()
    raise UnknownSolverError(f"unknown solver {name!r}; known solvers: {', '.join(SOLVERS)}")


__all__ = ["SOLVERS", "ChoiceModel", "Solution", "SolverBackend", "Status", "create"]
