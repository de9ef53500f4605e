"""Solver-neutral choice model: one option per group, pairwise costs on edges.

Groups are graph nodes (options: kernel candidates) and encrypted graph inputs (options:
the layouts the client may pack).  An edge prices every (producer option, consumer
option) pair with the conversion between the producer's out-layout and the layout the
consumer reads (``None``: not allowed).  Costs are non-negative integers (the pipeline
scales the weighted objective), so CP-SAT and z3 optimise the same numbers.

Built in named steps by the back ends: variables, choice constraints, edge (layout)
constraints, objective.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class Group:
    name: str
    costs: tuple[int, ...]  # one per option
    labels: tuple[str, ...]
    hint: int = 0  # index of a good option (greedy), given to the solver as a hint


@dataclass(frozen=True)
class Edge:
    src: str  # group name of the producer
    dst: str  # group name of the consumer
    operand: str
    costs: tuple[tuple[int | None, ...], ...]  # [src option][dst option]


@dataclass(frozen=True)
class ChoiceModel:
    groups: tuple[Group, ...]
    edges: tuple[Edge, ...]

    def group(self, name: str) -> Group:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def evaluate(self, choice: dict[str, int]) -> int | None:
        total = sum(g.costs[choice[g.name]] for g in self.groups)
        for e in self.edges:
            c = e.costs[choice[e.src]][choice[e.dst]]
            if c is None:
                return None
            total += c
        return total

    def greedy(self) -> dict[str, int]:
        """Per-group cheapest option in topological (group) order, paying incoming edges:
        the baseline the exact model is compared with, and the solver's hint."""
        choice: dict[str, int] = {}
        incoming: dict[str, list[Edge]] = {}
        for e in self.edges:
            incoming.setdefault(e.dst, []).append(e)
        for g in self.groups:
            best: tuple[int, int] | None = None
            for o, c in enumerate(g.costs):
                total = c
                ok = True
                for e in incoming.get(g.name, []):
                    if e.src not in choice:
                        continue
                    ec = e.costs[choice[e.src]][o]
                    if ec is None:
                        ok = False
                        break
                    total += ec
                if ok and (best is None or (total, o) < best):
                    best = (total, o)
            choice[g.name] = best[1] if best is not None else 0
        return choice


class Status(StrEnum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"  # time limit reached with a solution
    INFEASIBLE = "infeasible"
    UNKNOWN = "unknown"  # time limit reached without a solution


@dataclass(frozen=True)
class Solution:
    """Typed, frozen result: one option per group plus the solver's report."""

    choice: tuple[tuple[str, int], ...]
    status: Status
    objective: int | None
    bound: int | None
    seconds: float
    solver: str

    def option(self, group: str) -> int:
        return dict(self.choice)[group]
