"""Joint model of rotation-key residency and hoisted-group splitting under a memory cap
(CP-SAT, z3 cross-check).  Built by :mod:`planner.keys.joint`.

The program is taken *fully split*: every offset of a ``rot_hoisted`` is its own time
point (a group of ``g`` distinct offsets occupies ``g`` consecutive points), so every point
uses at most one key.  Decisions:

* ``merge`` per *gap* between two consecutive uses of a key whose interior is non-empty
  (as in :mod:`solver.keys_model`): the key stays resident across it (no reload);
* ``join`` per *boundary* between two consecutive points of a group: the two points run
  in one hoisted instruction (one key-switch decomposition).  The joined runs of a group
  are its hoisted sub-groups; each run needs all its keys at once, so the key of point
  ``i`` is also resident at every other point ``j`` of its run (``cov(i, j)``, the AND of
  the joins between them) -- unless a merged gap of that key already covers ``j``.

At every point the resident bytes (``fixed``: live ciphertexts and plaintexts plus the
point's own key; the merged gaps; the run's other keys) stay ``<= capacity``.  The model
minimises the cost of the program's key traffic and splits: ``load_cost[k]`` per load of
key ``k`` (uses - merges, after the first) plus ``split_cost[G]`` per boundary of group
``G`` that is not joined (each extra sub-group pays one more decomposition); then, at that
cost, the smallest peak.

The model is exact for the collapsed program: at a run's last point the live ciphertexts
are those of the hoisted instruction (all the run's outputs written), and that point
carries all the run's keys; earlier points of the run carry fewer live outputs and the
same keys, so they never bind.  A fully split program (no join) is always a solution when
the capacity covers every point's fixed demand.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from solver.limits import set_time_limit

CPSAT_WORKERS = 1
CPSAT_SEED = 0


@dataclass(frozen=True)
class JointKeyProblem:
    sizes: tuple[int, ...]  # per key
    uses: tuple[tuple[int, ...], ...]  # per key: sorted distinct points that need it
    fixed: tuple[int, ...]  # per point: ciphertexts + plaintexts + the point's own key
    point_key: tuple[int, ...]  # per point: the key it uses (-1: none)
    groups: tuple[tuple[int, ...], ...]  # per group: its consecutive points (>= 2)
    load_cost: tuple[int, ...]  # per key: cost of one (re)load
    split_cost: tuple[int, ...]  # per group: cost of one more sub-group
    capacity: int

    @property
    def n_points(self) -> int:
        return len(self.fixed)


@dataclass(frozen=True)
class _Gap:
    key: int
    index: int  # between uses[index] and uses[index + 1]
    first: int
    last: int


@dataclass(frozen=True)
class _Extra:
    """Key of point ``i`` resident at point ``j`` of the same run (not via a merged gap)."""

    group: int
    i: int  # position in the group of the key's point
    j: int  # position in the group of the point that carries it
    gap: int | None  # index into gaps of the key's optional gap covering point j, if any


@dataclass
class JointKeySolution:
    merged: list[list[bool]]  # per key, per gap between consecutive uses
    joined: list[list[bool]]  # per group, per boundary
    cost: int
    status: str  # optimal | feasible | infeasible | unknown
    solver: str
    seconds: float
    bound: int | None = None
    peak_bytes: int | None = None
    stats: dict[str, int] = field(default_factory=dict)


@dataclass
class _Built:
    gaps: list[_Gap]
    extras: list[_Extra]
    cuts: list[int]
    seg_fixed: list[int]
    gap_span: list[tuple[int, int]]
    extra_seg: list[int]


def _gaps(p: JointKeyProblem) -> list[_Gap]:
    out: list[_Gap] = []
    for k, us in enumerate(p.uses):
        for j in range(len(us) - 1):
            if us[j + 1] > us[j] + 1:
                out.append(_Gap(k, j, us[j] + 1, us[j + 1] - 1))
    return out


def _build(p: JointKeyProblem) -> _Built:
    gaps = _gaps(p)
    by_key: dict[tuple[int, int], int] = {(g.key, g.index): n for n, g in enumerate(gaps)}
    extras: list[_Extra] = []
    for gi, pts in enumerate(p.groups):
        for i, pi in enumerate(pts):
            k = p.point_key[pi]
            us = p.uses[k]
            at = bisect.bisect_left(us, pi)
            for j, pj in enumerate(pts):
                if j == i:
                    continue
                # the gap of key k that covers pj has pi as one end (no other use between)
                idx = at - 1 if pj < pi else at
                gap = by_key.get((k, idx)) if 0 <= idx < len(us) - 1 else None
                if gap is not None and not (gaps[gap].first <= pj <= gaps[gap].last):
                    gap = None
                extras.append(_Extra(gi, i, j, gap))
    cut_set = {g.first for g in gaps} | {g.last + 1 for g in gaps}
    for pts in p.groups:
        for q in pts:
            cut_set.update((q, q + 1))
    cuts = sorted(cut_set)
    seg_fixed = [max(p.fixed[cuts[s] : cuts[s + 1]]) for s in range(len(cuts) - 1)]
    pos = {t: s for s, t in enumerate(cuts)}
    spans = [(pos[g.first], pos[g.last + 1]) for g in gaps]
    extra_seg = [pos[p.groups[e.group][e.j]] for e in extras]
    return _Built(gaps, extras, cuts, seg_fixed, spans, extra_seg)


def evaluate(p: JointKeyProblem, merged: Sequence[Sequence[bool]], joined: Sequence[Sequence[bool]]) -> tuple[int, int]:
    """(cost, peak bytes over all points) of a decision, computed point by point."""
    load = list(p.fixed)
    cost = 0
    for k, us in enumerate(p.uses):
        for j in range(len(us) - 1):
            if merged[k][j]:
                for t in range(us[j] + 1, us[j + 1]):
                    load[t] += p.sizes[k]
            else:
                cost += p.load_cost[k]
    resident_via_gap: set[tuple[int, int]] = set()
    for k, us in enumerate(p.uses):
        for j in range(len(us) - 1):
            if merged[k][j]:
                for t in range(us[j] + 1, us[j + 1]):
                    resident_via_gap.add((k, t))
    for gi, pts in enumerate(p.groups):
        run = 0
        runs: list[int] = []
        for b in range(len(pts)):
            runs.append(run)
            if b < len(pts) - 1 and not joined[gi][b]:
                run += 1
                cost += p.split_cost[gi]
        for i, pi in enumerate(pts):
            k = p.point_key[pi]
            for j, pj in enumerate(pts):
                if i != j and runs[i] == runs[j] and (k, pj) not in resident_via_gap:
                    load[pj] += p.sizes[k]
    return cost, max(load, default=0)


def _decode(p: JointKeyProblem, b: _Built, gap_on: Sequence[bool], join_on: Sequence[Sequence[bool]]) -> tuple[list[list[bool]], list[list[bool]]]:
    merged = [[True] * max(0, len(us) - 1) for us in p.uses]
    for g, v in zip(b.gaps, gap_on, strict=True):
        merged[g.key][g.index] = bool(v)
    return merged, [list(map(bool, js)) for js in join_on]


def _cp_build(p: JointKeyProblem, b: _Built, capacity: Any, m: Any) -> tuple[list[Any], list[list[Any]], Any]:
    """The CP-SAT model's variables and constraints (capacity: an int or a variable)."""
    on = [m.new_bool_var(f"merge[k{g.key}][{g.index}]") for g in b.gaps]
    join = [[m.new_bool_var(f"join[g{gi}][{j}]") for j in range(len(pts) - 1)] for gi, pts in enumerate(p.groups)]
    # cov[g][(i, j)], i < j: points i..j of group g in one run
    cov: list[dict[tuple[int, int], Any]] = []
    for gi, pts in enumerate(p.groups):
        c: dict[tuple[int, int], Any] = {}
        for i in range(len(pts)):
            for j in range(i + 1, len(pts)):
                if j == i + 1:
                    c[(i, j)] = join[gi][i]
                    continue
                v = m.new_bool_var(f"cov[g{gi}][{i},{j}]")
                prev, jn = c[(i, j - 1)], join[gi][j - 1]
                m.add_implication(v, prev)
                m.add_implication(v, jn)
                m.add_bool_or([prev.Not(), jn.Not(), v])
                c[(i, j)] = v
        cov.append(c)
    intervals: list[Any] = []
    demands: list[int] = []
    for gi, (g, (a, z)) in enumerate(zip(b.gaps, b.gap_span, strict=True)):
        slack = p.capacity - max(b.seg_fixed[a:z])
        if p.sizes[g.key] > slack:
            m.add(on[gi] == 0)
            continue
        intervals.append(m.new_optional_fixed_size_interval_var(a, z - a, on[gi], f"live[k{g.key}][{g.index}]"))
        demands.append(p.sizes[g.key])
    for e, seg in zip(b.extras, b.extra_seg, strict=True):
        pts = p.groups[e.group]
        k = p.point_key[pts[e.i]]
        cv = cov[e.group][(min(e.i, e.j), max(e.i, e.j))]
        if e.gap is None:
            lit = cv
        else:
            lit = m.new_bool_var(f"extra[g{e.group}][{e.i},{e.j}]")
            g_on = on[e.gap]
            m.add_implication(lit, cv)
            m.add_implication(lit, g_on.Not())
            m.add_bool_or([cv.Not(), g_on, lit])
        if p.sizes[k] > p.capacity - b.seg_fixed[seg]:
            m.add(lit == 0)
            continue
        intervals.append(m.new_optional_fixed_size_interval_var(seg, 1, lit, f"run[g{e.group}][{e.i}@{e.j}]"))
        demands.append(p.sizes[k])
    for s, f in enumerate(b.seg_fixed):
        if f:
            intervals.append(m.new_fixed_size_interval_var(s, 1, f"fixed[{s}]"))
            demands.append(f)
    if intervals:
        m.add_cumulative(intervals, demands, capacity)
    saved = sum(p.load_cost[g.key] * v for g, v in zip(b.gaps, on, strict=True)) + sum(
        p.split_cost[gi] * v for gi, js in enumerate(join) for v in js
    )
    return on, join, saved



def solve_cpsat(
    p: JointKeyProblem,
    time_limit_s: float = 10.0,
    hint: tuple[Sequence[Sequence[bool]], Sequence[Sequence[bool]]] | None = None,
    minimize_peak: bool = True,
) -> JointKeySolution:
    """Minimum key-traffic + split cost (then minimum peak) with CP-SAT: optional
    intervals for merged gaps and for the keys a run carries at its other points, one
    cumulative capacity constraint over the compressed time axis."""
    from ortools.sat.python import cp_model

    from solver.cpsat import progress_callback

    t0 = time.perf_counter()
    b = _build(p)
    stats = {"gaps": len(b.gaps), "boundaries": sum(len(g) - 1 for g in p.groups), "extras": len(b.extras),
             "segments": len(b.seg_fixed), "points": p.n_points}
    if any(f > p.capacity for f in b.seg_fixed):
        return JointKeySolution([], [], 0, "infeasible", "cpsat", time.perf_counter() - t0, stats=stats)

    def solver(limit: float) -> cp_model.CpSolver:
        s = cp_model.CpSolver()
        set_time_limit(s.parameters, limit, 0.05)
        s.parameters.num_workers = CPSAT_WORKERS
        s.parameters.random_seed = CPSAT_SEED
        return s

    full = sum(p.load_cost[g.key] for g in b.gaps) + sum(p.split_cost[gi] * (len(pts) - 1) for gi, pts in enumerate(p.groups))
    m1 = cp_model.CpModel()
    on1, join1, saved1 = _cp_build(p, b, p.capacity, m1)
    if hint is not None:
        hm, hj = hint
        for g, v in zip(b.gaps, on1, strict=True):
            m1.add_hint(v, bool(hm[g.key][g.index]))
        for gi, js in enumerate(join1):
            for j, v in enumerate(js):
                m1.add_hint(v, bool(hj[gi][j]))
    m1.maximize(saved1)
    s1 = solver(time_limit_s)
    st = s1.solve(m1, progress_callback(s1, "key schedule", units=1.0))
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        status = "infeasible" if st == cp_model.INFEASIBLE else "unknown"
        return JointKeySolution([], [], 0, status, "cpsat", time.perf_counter() - t0, stats=stats)
    gap_vals = [bool(s1.value(v)) for v in on1]
    join_vals = [[bool(s1.value(v)) for v in js] for js in join1]
    best_saved = int(s1.objective_value)
    status = "optimal" if st == cp_model.OPTIMAL else "feasible"
    bound = full - int(s1.best_objective_bound)
    peak: int | None = None
    # deterministic: phase 2 gets what phase 1's work left of the limit (solver.limits)
    remaining = time_limit_s - s1.deterministic_time
    if minimize_peak and remaining > 0.05 and b.seg_fixed:
        m2 = cp_model.CpModel()
        cap_var = m2.new_int_var(max(b.seg_fixed), p.capacity, "peak")
        on2, join2, saved2 = _cp_build(p, b, cap_var, m2)
        m2.add(saved2 >= best_saved)
        for v, val in zip(on2, gap_vals, strict=True):
            m2.add_hint(v, val)
        for js, vals in zip(join2, join_vals, strict=True):
            for v, val in zip(js, vals, strict=True):
                m2.add_hint(v, val)
        m2.minimize(cap_var)
        s2 = solver(remaining)
        st2 = s2.solve(m2, progress_callback(s2, "key schedule", units=1.0))
        if st2 in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            gap_vals = [bool(s2.value(v)) for v in on2]
            join_vals = [[bool(s2.value(v)) for v in js] for js in join2]
            peak = int(s2.value(cap_var))
    merged, joined = _decode(p, b, gap_vals, join_vals)
    cost, _ = evaluate(p, merged, joined)
    return JointKeySolution(merged, joined, cost, status, "cpsat", time.perf_counter() - t0, bound, peak, stats)


def solve_z3(p: JointKeyProblem, time_limit_s: float = 10.0) -> JointKeySolution:
    """The same model in z3 (``Optimize``, a pseudo-Boolean capacity per segment): the
    cross-check of the CP-SAT model on small cases."""
    import z3

    t0 = time.perf_counter()
    b = _build(p)
    stats = {"gaps": len(b.gaps), "boundaries": sum(len(g) - 1 for g in p.groups), "extras": len(b.extras),
             "segments": len(b.seg_fixed), "points": p.n_points}
    if any(f > p.capacity for f in b.seg_fixed):
        return JointKeySolution([], [], 0, "infeasible", "z3", time.perf_counter() - t0, stats=stats)
    opt = z3.Optimize()
    opt.set("timeout", max(10, int(time_limit_s * 1000)))
    on = [z3.Bool(f"merge_k{g.key}_{g.index}") for g in b.gaps]
    join = [[z3.Bool(f"join_g{gi}_{j}") for j in range(len(pts) - 1)] for gi, pts in enumerate(p.groups)]
    covering: list[list[tuple[z3.BoolRef, int]]] = [[] for _ in b.seg_fixed]
    for gi, (a, z) in enumerate(b.gap_span):
        for s in range(a, z):
            covering[s].append((on[gi], p.sizes[b.gaps[gi].key]))
    for e, seg in zip(b.extras, b.extra_seg, strict=True):
        lo, hi = min(e.i, e.j), max(e.i, e.j)
        cv = z3.And(*join[e.group][lo:hi])
        lit = cv if e.gap is None else z3.And(cv, z3.Not(on[e.gap]))
        covering[seg].append((lit, p.sizes[p.point_key[p.groups[e.group][e.i]]]))
    for s, items in enumerate(covering):
        if items:
            opt.add(z3.PbLe(items, p.capacity - b.seg_fixed[s]))
    terms = [z3.If(v, p.load_cost[g.key], 0) for g, v in zip(b.gaps, on, strict=True)]
    terms += [z3.If(v, p.split_cost[gi], 0) for gi, js in enumerate(join) for v in js]
    opt.maximize(z3.Sum(terms) if terms else z3.IntVal(0))
    res = opt.check()
    if res != z3.sat:
        status = "infeasible" if res == z3.unsat else "unknown"
        return JointKeySolution([], [], 0, status, "z3", time.perf_counter() - t0, stats=stats)
    mdl = opt.model()
    gap_vals = [z3.is_true(mdl.eval(v, model_completion=True)) for v in on]
    join_vals = [[z3.is_true(mdl.eval(v, model_completion=True)) for v in js] for js in join]
    merged, joined = _decode(p, b, gap_vals, join_vals)
    cost, _ = evaluate(p, merged, joined)
    return JointKeySolution(merged, joined, cost, "optimal", "z3", time.perf_counter() - t0, cost, None, stats)
