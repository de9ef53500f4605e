"""The key set as a decision (CP-SAT, z3): per rotation offset, its own key or a two-hop
composition ``rot(rot(x, a), b) = rot(x, a + b)`` over two owned keys.  Built by
:mod:`planner.keys.joint`.

* ``own[k]``: offset ``k`` gets its own key (``sizes[k]`` bytes, loaded at least once:
  ``load_cost[k]``);
* ``use[k, (a, b)]``: ``k`` is rotated as ``a`` then ``b`` (``a + b = k`` modulo the
  slots); both keys must be owned; ``own[k] + sum use[k, .] = 1``.

A rotation site is a ``rot`` (one offset) or a ``rot_hoisted`` (several offsets of one
source).  Rewriting a site over the chosen chains costs, per composed offset, one more
rotation (its second hop: ``second_cost`` of the site) and, per first hop ``a`` that the
site does not already rotate by, one more offset in the site's hoisted group
(``first_cost``); ``weight`` is how often the site occurs.  The owned keys' bytes must
fit ``budget`` (all owned keys resident together: no reloads).  Minimise the extra
rotation cost plus the owned keys' load cost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from solver.limits import set_time_limit


@dataclass(frozen=True)
class Site:
    offsets: tuple[int, ...]  # indices into the problem's offsets (distinct)
    weight: int
    second_cost: int  # cost of a composed offset's second hop at this site
    first_cost: int  # cost of one more first-hop offset at this site


@dataclass(frozen=True)
class KeySetProblem:
    sizes: tuple[int, ...]  # per offset (candidate key)
    load_cost: tuple[int, ...]  # per offset
    required: tuple[bool, ...]  # the program rotates by it (candidates may be extra bases)
    pairs: tuple[tuple[tuple[int, int], ...], ...]  # per offset: (a, b) compositions
    sites: tuple[Site, ...]
    budget: int


@dataclass
class KeySetSolution:
    own: list[bool]
    chains: dict[int, tuple[int, int]]  # composed offset index -> (a, b)
    cost: int
    status: str
    solver: str
    seconds: float
    stats: dict[str, int] = field(default_factory=dict)


def evaluate(p: KeySetProblem, own: list[bool], chains: dict[int, tuple[int, int]]) -> int:
    cost = sum(p.load_cost[k] for k, o in enumerate(own) if o)
    for s in p.sites:
        firsts = {chains[k][0] for k in s.offsets if k in chains} - set(s.offsets)
        cost += s.weight * (s.second_cost * sum(1 for k in s.offsets if k in chains) + s.first_cost * len(firsts))
    return cost


def _first_hops(p: KeySetProblem) -> list[dict[int, list[tuple[int, int]]]]:
    """Per site: first hop a (not an offset of the site) -> the (k, pair index) using it."""
    out = []
    for s in p.sites:
        d: dict[int, list[tuple[int, int]]] = {}
        own = set(s.offsets)
        for k in s.offsets:
            for j, (a, _) in enumerate(p.pairs[k]):
                if a not in own:
                    d.setdefault(a, []).append((k, j))
        out.append(d)
    return out


def solve_cpsat(p: KeySetProblem, time_limit_s: float = 10.0) -> KeySetSolution:
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    n = len(p.sizes)
    m = cp_model.CpModel()
    own = [m.new_bool_var(f"own[{k}]") for k in range(n)]
    use = [[m.new_bool_var(f"use[{k}][{j}]") for j in range(len(p.pairs[k]))] for k in range(n)]
    for k in range(n):
        if p.required[k]:
            m.add(own[k] + sum(use[k]) == 1)
        else:
            m.add(sum(use[k]) == 0)
        for (a, b), u in zip(p.pairs[k], use[k], strict=True):
            m.add_implication(u, own[a])
            m.add_implication(u, own[b])
    m.add(sum(p.sizes[k] * own[k] for k in range(n)) <= p.budget)
    obj: list[Any] = [p.load_cost[k] * own[k] for k in range(n)]
    for s, hops in zip(p.sites, _first_hops(p), strict=True):
        for k in s.offsets:
            obj.append(s.weight * s.second_cost * sum(use[k]))
        for a, users in sorted(hops.items()):
            y = m.new_bool_var(f"first[{a}]")
            for k, j in users:
                m.add_implication(use[k][j], y)
            obj.append(s.weight * s.first_cost * y)
    m.minimize(sum(obj))
    solver = cp_model.CpSolver()
    set_time_limit(solver.parameters, time_limit_s, 0.05)
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    st = solver.solve(m)
    stats = {"offsets": n, "pairs": sum(len(x) for x in p.pairs), "sites": len(p.sites)}
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        status = "infeasible" if st == cp_model.INFEASIBLE else "unknown"
        return KeySetSolution([], {}, 0, status, "cpsat", time.perf_counter() - t0, stats)
    owned = [bool(solver.value(v)) for v in own]
    chains = {k: p.pairs[k][j] for k in range(n) for j, u in enumerate(use[k]) if solver.value(u)}
    status = "optimal" if st == cp_model.OPTIMAL else "feasible"
    return KeySetSolution(owned, chains, evaluate(p, owned, chains), status, "cpsat", time.perf_counter() - t0, stats)


def solve_z3(p: KeySetProblem, time_limit_s: float = 10.0) -> KeySetSolution:
    import z3

    t0 = time.perf_counter()
    n = len(p.sizes)
    opt = z3.Optimize()
    opt.set("timeout", max(10, int(time_limit_s * 1000)))
    own = [z3.Bool(f"own_{k}") for k in range(n)]
    use = [[z3.Bool(f"use_{k}_{j}") for j in range(len(p.pairs[k]))] for k in range(n)]
    for k in range(n):
        lits = [(own[k], 1)] + [(u, 1) for u in use[k]]
        if p.required[k]:
            opt.add(z3.PbEq(lits, 1))
        else:
            for u in use[k]:
                opt.add(z3.Not(u))
        for (a, b), u in zip(p.pairs[k], use[k], strict=True):
            opt.add(z3.Implies(u, z3.And(own[a], own[b])))
    opt.add(z3.PbLe([(own[k], p.sizes[k]) for k in range(n)], p.budget))
    terms = [z3.If(own[k], p.load_cost[k], 0) for k in range(n)]
    for s, hops in zip(p.sites, _first_hops(p), strict=True):
        for k in s.offsets:
            terms += [z3.If(u, s.weight * s.second_cost, 0) for u in use[k]]
        for _a, users in sorted(hops.items()):
            terms.append(z3.If(z3.Or(*[use[k][j] for k, j in users]), s.weight * s.first_cost, 0))
    opt.minimize(z3.Sum(terms) if terms else z3.IntVal(0))
    res = opt.check()
    stats = {"offsets": n, "pairs": sum(len(x) for x in p.pairs), "sites": len(p.sites)}
    if res != z3.sat:
        status = "infeasible" if res == z3.unsat else "unknown"
        return KeySetSolution([], {}, 0, status, "z3", time.perf_counter() - t0, stats)
    mdl = opt.model()
    owned = [z3.is_true(mdl.eval(v, model_completion=True)) for v in own]
    chains = {k: p.pairs[k][j] for k in range(n) for j, u in enumerate(use[k])
              if z3.is_true(mdl.eval(u, model_completion=True))}
    return KeySetSolution(owned, chains, evaluate(p, owned, chains), "optimal", "z3", time.perf_counter() - t0, stats)
