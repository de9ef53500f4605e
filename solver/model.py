"""Solver-neutral choice model: one option per group, pairwise costs on edges.

Groups are graph nodes (options: kernel candidates) and encrypted graph inputs (options:
the layouts the client may pack).  An edge prices every (producer option, consumer
option) pair with the conversion between the producer's out-layout and the layout the
consumer reads (``None``: not allowed).  Costs are non-negative integers (the pipeline
scales the weighted objective), so CP-SAT and z3 optimise the same numbers.

Multiplicative depth is part of the model: each option has a depth (levels its kernel
consumes), each edge pair the depth of its conversion, and with ``max_depth`` set every
group's output depth ``D[g] >= D[src] + conversion + kernel`` must stay within the levels
of the parameters (a plan that does not fit is infeasible, not an error after solving).

Built in named steps by the back ends: variables, choice constraints, edge (layout)
constraints, depth, objective.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property


@dataclass(frozen=True)
class Group:
    name: str
    costs: tuple[int, ...]  # one per option
    labels: tuple[str, ...]
    hint: int = 0  # index of a good option (greedy), given to the solver as a hint
    depths: tuple[int, ...] = ()  # levels each option consumes (empty: none)

    def depth(self, o: int) -> int:
        return self.depths[o] if self.depths else 0


@dataclass(frozen=True)
class Edge:
    src: str  # group name of the producer
    dst: str  # group name of the consumer
    operand: str
    costs: tuple[tuple[int | None, ...], ...]  # [src option][dst option]
    depths: tuple[tuple[int, ...], ...] = ()  # conversion levels [src option][dst option]
    # the source is a free client input read by this edge alone: every consumer option
    # has a source option packed exactly as it reads (cost 0), the others are forbidden
    adapts: bool = False

    def depth(self, a: int, b: int) -> int:
        return self.depths[a][b] if self.depths else 0


@dataclass(frozen=True)
class ChoiceModel:
    groups: tuple[Group, ...]
    edges: tuple[Edge, ...]
    max_depth: int | None = None

    def incoming(self) -> dict[str, list[Edge]]:
        out: dict[str, list[Edge]] = {}
        for e in self.edges:
            out.setdefault(e.dst, []).append(e)
        return out

    def depths_of(self, choice: dict[str, int]) -> dict[str, int]:
        """Output depth of every group under a full choice (groups are topological)."""
        inc = self.incoming()
        d: dict[str, int] = {}
        for g in self.groups:
            o = choice[g.name]
            d[g.name] = max(
                [d[e.src] + e.depth(choice[e.src], o) for e in inc.get(g.name, []) if e.src in d], default=0
            ) + g.depth(o)
        return d

    @cached_property
    def _by_name(self) -> dict[str, Group]:
        return {g.name: g for g in self.groups}

    def group(self, name: str) -> Group:
        """The group of that name (constant time: the model of a 100,000-node chain asks
        for a group per edge)."""
        return self._by_name[name]

    def evaluate(self, choice: dict[str, int]) -> int | None:
        total = sum(g.costs[choice[g.name]] for g in self.groups)
        for e in self.edges:
            c = e.costs[choice[e.src]][choice[e.dst]]
            if c is None:
                return None
            total += c
        if self.max_depth is not None and max(self.depths_of(choice).values(), default=0) > self.max_depth:
            return None
        return total

    def greedy(self) -> dict[str, int]:
        """Per-group cheapest option in topological (group) order, paying incoming edges:
        the baseline the exact model is compared with, and the solver's hint.  Groups
        without incoming edges (graph inputs) are fixed by their first consumer: each of
        its options takes the input option cheapest for it."""
        choice: dict[str, int] = {}
        depth: dict[str, int] = {}
        incoming = self.incoming()
        deferred = {g.name for g in self.groups if g.name not in incoming}
        for g in self.groups:
            if g.name in deferred:
                continue
            best: tuple[int, int, int, dict[str, int]] | None = None
            for o, c in enumerate(g.costs):
                total = c
                d = 0
                ok = True
                fixed: dict[str, int] = {}
                for e in incoming.get(g.name, []):
                    if e.src in choice:
                        a = choice[e.src]
                    elif e.src in fixed:
                        a = fixed[e.src]
                    else:  # an unfixed input: its cheapest option for this consumer option
                        src = self.group(e.src)
                        opts = [(ec_ + src.costs[a_], a_) for a_ in range(len(src.costs))
                                if (ec_ := e.costs[a_][o]) is not None]
                        if not opts:
                            ok = False
                            break
                        a = min(opts)[1]
                        fixed[e.src] = a
                        total += src.costs[a]
                    ec = e.costs[a][o]
                    if ec is None:
                        ok = False
                        break
                    total += ec
                    d = max(d, depth.get(e.src, 0) + e.depth(a, o))
                d += g.depth(o)
                if self.max_depth is not None and d > self.max_depth:
                    ok = False
                if ok and (best is None or (total, o) < best[:2]):
                    best = (total, o, d, fixed)
            if best is None:
                choice[g.name], depth[g.name] = 0, 0
                continue
            choice[g.name], depth[g.name] = best[1], best[2]
            for name, a in best[3].items():
                choice[name], depth[name] = a, 0
        for name in deferred:
            choice.setdefault(name, 0)
        return {g.name: choice[g.name] for g in self.groups}


    def outgoing(self) -> dict[str, list[Edge]]:
        out: dict[str, list[Edge]] = {}
        for e in self.edges:
            out.setdefault(e.src, []).append(e)
        return out

    def prune_dominated(self) -> tuple[ChoiceModel, dict[str, list[int]]]:
        """Drop options no optimal assignment needs (sound dominance; the optimum and its
        objective are unchanged).  Option c1 dominates c2 of the same group when both
        have the same outgoing rows (same out-layout), and for every incoming edge and
        producer option c1 is feasible wherever c2 is, no deeper, and its kernel cost
        plus the largest per-edge conversion difference is at most c2's kernel cost.
        Returns the pruned model and, per group, the kept option indices."""
        inc, outg = self.incoming(), self.outgoing()
        keep = {g.name: list(range(len(g.costs))) for g in self.groups}
        for g in self.groups:
            if g.name not in inc:
                continue
            sig = {o: tuple((e.costs[o], e.depths[o] if e.depths else ()) for e in outg.get(g.name, []))
                   for o in keep[g.name]}
            kept: list[int] = []
            for c2 in sorted(keep[g.name], key=lambda o: (g.costs[o], o)):
                if not any(sig[c1] == sig[c2] and self._dominates(g, c1, c2, inc[g.name], keep) for c1 in kept):
                    kept.append(c2)
            keep[g.name] = sorted(kept)
        groups = tuple(
            Group(g.name, tuple(g.costs[o] for o in keep[g.name]), tuple(g.labels[o] for o in keep[g.name]),
                  keep[g.name].index(g.hint) if g.hint in keep[g.name] else 0,
                  tuple(g.depths[o] for o in keep[g.name]) if g.depths else ())
            for g in self.groups
        )
        edges = tuple(
            Edge(e.src, e.dst, e.operand,
                 tuple(tuple(e.costs[a][b] for b in keep[e.dst]) for a in keep[e.src]),
                 tuple(tuple(e.depths[a][b] for b in keep[e.dst]) for a in keep[e.src]) if e.depths else (),
                 e.adapts)
            for e in self.edges
        )
        return ChoiceModel(groups, edges, self.max_depth), keep

    @staticmethod
    def _dominates(g: Group, c1: int, c2: int, incoming: list[Edge], keep: dict[str, list[int]]) -> bool:
        total = g.costs[c1]
        for e in incoming:
            if e.adapts:  # both read a layout the client packs for them, at no cost
                continue
            worst: int | None = None
            for a in keep[e.src]:
                k2 = e.costs[a][c2]
                if k2 is None:
                    continue
                k1 = e.costs[a][c1]
                if k1 is None or e.depth(a, c1) + g.depth(c1) > e.depth(a, c2) + g.depth(c2):
                    return False
                worst = k1 - k2 if worst is None else max(worst, k1 - k2)
            total += worst or 0
        if (not incoming or any(e.adapts for e in incoming)) and g.depth(c1) > g.depth(c2):
            return False
        return total <= g.costs[c2]


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
