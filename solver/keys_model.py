"""Rotation-key liveness under a memory cap: the exact model (CP-SAT, z3 cross-check).

Problem (built by :mod:`planner.keys.schedule` from a straight-line program):

* time points ``0 .. n-1`` are the program's instructions;
* key ``k`` (``sizes[k]`` bytes) must be resident at each of its use points ``uses[k]``
  (a ``rot`` by its offset, or a ``rot_hoisted`` naming it);
* ``fixed[t]`` is the memory that is there at point ``t`` whatever the schedule: live
  ciphertexts and plaintexts plus the keys *used* at ``t``;
* at every point the resident total must stay ``<= capacity``.

Without loss of generality a key is loaded just before a use and dropped just after a
use (any other residency interval only holds memory longer), so a schedule is fixed by
deciding, for every *gap* between two consecutive uses of a key, whether the key stays
resident across it (*merge*: no reload) or is dropped and loaded again (one load).  A
gap ``j`` of key ``k`` is an optional interval covering the points strictly between
the two uses, with demand ``sizes[k]``; the capacity constraint is one cumulative over
those intervals plus fixed intervals carrying ``fixed``.  Loads = uses - merges; the
model maximises merges (minimises loads) and then, with the load count fixed, minimises
the peak (the cumulative's capacity becomes a variable).

The time axis is compressed before solving: only points inside some gap can be
constrained by a decision, and between two consecutive gap boundaries the set of gaps
covering a point is the same, so each such *segment* keeps only its largest fixed
demand.  A program of 30 000 instructions typically gives a few hundred segments.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from solver.limits import set_time_limit

# One worker and a fixed seed keep CP-SAT deterministic (same as solver.cpsat).
CPSAT_WORKERS = 1
CPSAT_SEED = 0


@dataclass(frozen=True)
class KeyLivenessProblem:
    sizes: tuple[int, ...]
    uses: tuple[tuple[int, ...], ...]  # sorted, distinct use points per key
    fixed: tuple[int, ...]  # per time point
    capacity: int

    @property
    def n_points(self) -> int:
        return len(self.fixed)


@dataclass(frozen=True)
class Gap:
    key: int
    index: int  # gap between uses[index] and uses[index + 1]
    first: int  # first time point strictly inside the gap
    last: int  # last time point strictly inside the gap (first <= last)


@dataclass
class KeyLivenessSolution:
    merged: list[list[bool]]  # per key, per gap between consecutive uses
    loads: int
    status: str  # optimal | feasible | infeasible | unknown
    solver: str
    seconds: float
    bound: int | None = None  # proven lower bound on loads
    peak_bytes: int | None = None  # peak over the constrained segments (phase 2)
    stats: dict[str, int] = field(default_factory=dict)


@dataclass
class _Compressed:
    gaps: list[Gap]  # optional gaps only (non-empty interior)
    seg_bounds: list[int]  # segment s covers points [seg_bounds[s], seg_bounds[s+1])
    seg_fixed: list[int]
    gap_span: list[tuple[int, int]]  # per optional gap: [first segment, end segment)


def _compress(p: KeyLivenessProblem) -> _Compressed:
    gaps: list[Gap] = []
    for k, us in enumerate(p.uses):
        for j in range(len(us) - 1):
            if us[j + 1] > us[j] + 1:
                gaps.append(Gap(k, j, us[j] + 1, us[j + 1] - 1))
    cuts = sorted({g.first for g in gaps} | {g.last + 1 for g in gaps})
    seg_fixed = [max(p.fixed[cuts[s] : cuts[s + 1]]) for s in range(len(cuts) - 1)]
    pos = {t: s for s, t in enumerate(cuts)}
    spans = [(pos[g.first], pos[g.last + 1]) for g in gaps]
    return _Compressed(gaps, cuts, seg_fixed, spans)


def evaluate(p: KeyLivenessProblem, merged: Sequence[Sequence[bool]]) -> tuple[int, int]:
    """(loads, peak bytes over all points) of a merge decision."""
    load = list(p.fixed)
    loads = 0
    for k, us in enumerate(p.uses):
        if not us:
            continue
        loads += 1
        for j in range(len(us) - 1):
            if merged[k][j]:
                for t in range(us[j] + 1, us[j + 1]):
                    load[t] += p.sizes[k]
            else:
                loads += 1
    return loads, max(load, default=0)


def _solution_from_gaps(
    p: KeyLivenessProblem, c: _Compressed, on: Sequence[bool], status: str, solver: str, t0: float
) -> KeyLivenessSolution:
    merged = [[True] * max(0, len(us) - 1) for us in p.uses]
    for g, v in zip(c.gaps, on, strict=True):
        merged[g.key][g.index] = bool(v)
    loads, _ = evaluate(p, merged)
    return KeyLivenessSolution(merged, loads, status, solver, time.perf_counter() - t0)


def solve_cpsat(
    p: KeyLivenessProblem,
    time_limit_s: float = 10.0,
    hint: Sequence[Sequence[bool]] | None = None,
    minimize_peak: bool = True,
) -> KeyLivenessSolution:
    """Minimum loads (then minimum peak) with CP-SAT: optional interval variables for the
    merged gaps and one cumulative capacity constraint over the compressed time axis."""
    from ortools.sat.python import cp_model

    from solver.cpsat import progress_callback

    t0 = time.perf_counter()
    c = _compress(p)
    n_uses = sum(len(us) for us in p.uses)
    forced = sum(max(0, len(us) - 1) for us in p.uses) - len(c.gaps)  # adjacent uses: always merged
    stats = {"gaps": len(c.gaps), "segments": len(c.seg_fixed), "points": p.n_points}
    if not c.gaps:
        sol = _solution_from_gaps(p, c, [], "optimal", "cpsat", t0)
        sol.bound, sol.stats = sol.loads, stats
        return sol
    if any(f > p.capacity for f in c.seg_fixed):
        return KeyLivenessSolution([], 0, "infeasible", "cpsat", time.perf_counter() - t0, stats=stats)

    def build(capacity: cp_model.LinearExprT, m: cp_model.CpModel) -> list[cp_model.IntVar]:
        # step 1: one presence literal (merge) per optional gap, its interval over segments
        on = [m.new_bool_var(f"merge[k{g.key}][{g.index}]") for g in c.gaps]
        intervals: list[cp_model.IntervalVar] = []
        demands: list[int] = []
        for gi, (g, (a, b)) in enumerate(zip(c.gaps, c.gap_span, strict=True)):
            slack = p.capacity - max(c.seg_fixed[a:b])
            if p.sizes[g.key] > slack:
                m.add(on[gi] == 0)  # can never stay resident across this gap
                continue
            intervals.append(m.new_optional_fixed_size_interval_var(a, b - a, on[gi], f"live[k{g.key}][{g.index}]"))
            demands.append(p.sizes[g.key])
        # step 2: the memory that is there anyway (ciphertexts, plaintexts, keys in use)
        for s, f in enumerate(c.seg_fixed):
            if f:
                intervals.append(m.new_fixed_size_interval_var(s, 1, f"fixed[{s}]"))
                demands.append(f)
        # step 3: one cumulative capacity constraint
        m.add_cumulative(intervals, demands, capacity)
        return on

    def solver(limit: float) -> cp_model.CpSolver:
        s = cp_model.CpSolver()
        set_time_limit(s.parameters, limit, 0.05)
        s.parameters.num_workers = CPSAT_WORKERS
        s.parameters.random_seed = CPSAT_SEED
        return s

    # phase 1: maximise merges = minimise loads
    m1 = cp_model.CpModel()
    on1 = build(p.capacity, m1)
    if hint is not None:
        for g, v in zip(c.gaps, on1, strict=True):
            m1.add_hint(v, bool(hint[g.key][g.index]))
    m1.maximize(sum(on1))
    s1 = solver(time_limit_s)
    st = s1.solve(m1, progress_callback(s1, "key schedule", units=1.0))
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        status = "infeasible" if st == cp_model.INFEASIBLE else "unknown"
        return KeyLivenessSolution([], 0, status, "cpsat", time.perf_counter() - t0, stats=stats)
    values = [bool(s1.value(v)) for v in on1]
    status = "optimal" if st == cp_model.OPTIMAL else "feasible"
    best_merges = sum(values)
    bound = n_uses - forced - int(s1.best_objective_bound)
    # phase 2: same number of loads, smallest peak over the segments
    peak: int | None = None
    # deterministic: phase 2 gets what phase 1's work left of the limit (solver.limits)
    remaining = time_limit_s - s1.deterministic_time
    if minimize_peak and remaining > 0.05:
        m2 = cp_model.CpModel()
        cap_var = m2.new_int_var(max(c.seg_fixed), p.capacity, "peak")
        on2 = build(cap_var, m2)
        m2.add(sum(on2) >= best_merges)
        for v, val in zip(on2, values, strict=True):
            m2.add_hint(v, val)
        m2.minimize(cap_var)
        s2 = solver(remaining)
        st2 = s2.solve(m2, progress_callback(s2, "key schedule", units=1.0))
        if st2 in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            values = [bool(s2.value(v)) for v in on2]
            peak = int(s2.value(cap_var))
    sol = _solution_from_gaps(p, c, values, status, "cpsat", t0)
    sol.bound, sol.peak_bytes, sol.stats = bound, peak, stats
    return sol


def solve_z3(p: KeyLivenessProblem, time_limit_s: float = 10.0) -> KeyLivenessSolution:
    """The same decision model in z3 (``Optimize``, pseudo-Boolean capacity per segment):
    the cross-check of the CP-SAT model on small cases."""
    import z3

    t0 = time.perf_counter()
    c = _compress(p)
    stats = {"gaps": len(c.gaps), "segments": len(c.seg_fixed), "points": p.n_points}
    if not c.gaps:
        sol = _solution_from_gaps(p, c, [], "optimal", "z3", t0)
        sol.bound, sol.stats = sol.loads, stats
        return sol
    opt = z3.Optimize()
    opt.set("timeout", max(10, int(time_limit_s * 1000)))
    on = [z3.Bool(f"merge_k{g.key}_{g.index}") for g in c.gaps]
    covering: list[list[int]] = [[] for _ in c.seg_fixed]
    for gi, (a, b) in enumerate(c.gap_span):
        for s in range(a, b):
            covering[s].append(gi)
    for s, gis in enumerate(covering):
        slack = p.capacity - c.seg_fixed[s]
        if slack < 0:
            return KeyLivenessSolution([], 0, "infeasible", "z3", time.perf_counter() - t0, stats=stats)
        if gis:
            opt.add(z3.PbLe([(on[gi], p.sizes[c.gaps[gi].key]) for gi in gis], slack))
    opt.maximize(z3.Sum([z3.If(v, 1, 0) for v in on]))
    res = opt.check()
    if res == z3.unsat:
        return KeyLivenessSolution([], 0, "infeasible", "z3", time.perf_counter() - t0, stats=stats)
    if res != z3.sat:
        return KeyLivenessSolution([], 0, "unknown", "z3", time.perf_counter() - t0, stats=stats)
    mdl = opt.model()
    values = [z3.is_true(mdl.eval(v, model_completion=True)) for v in on]
    sol = _solution_from_gaps(p, c, values, "optimal", "z3", t0)
    sol.bound, sol.stats = sol.loads, stats
    return sol
