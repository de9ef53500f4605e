"""Memory caps that bind: the ``joint`` key strategy.

Under a cap the other strategies keep every ``rot_hoisted`` whole, so a program can never
run below the bytes of its largest hoisted group's keys.  The joint strategy decides three
things together, all at exact cost:

1. **The key set** (:mod:`solver.keyset_model`): per offset, its own key or a two-hop
   composition ``rot(rot(x, a), b) = rot(x, a + b)`` over owned keys (program offsets or
   powers of two).  Tried with budgets derived from the cap (the keys that fit next to the
   largest working set); the empty rewrite is always a candidate.
2. **Hoisted groups under pressure** and **residency** (:mod:`solver.keyplan_model`): the
   program is taken fully split (one time point per offset of a group); the model joins
   consecutive points into hoisted sub-groups (each sub-group pays one decomposition) and
   merges key live ranges, so that every point fits the cap, minimising load time plus
   decomposition time.  A cap down to the working set plus the largest *single* key is
   feasible.
3. **Prefetch** (KeyMemRT's balanced mode): each load is issued early enough that the
   modelled compute between the load and the key's first use covers the load's time, as far
   as the cap allows; the plan's ``load_key`` sits at the issue point, so the memory model
   (and the cap check) count the prefetched key from there.  The Lattigo executor loads a
   key in a background goroutine from its ``load_key`` on and waits only at the first use.

Of the candidates, the one with the smallest modelled time (:func:`planner.cost.timing.modelled_time`,
the prefetching runtime simulated with one background loader) wins.

Time model: :mod:`planner.cost.timing`, the objective's (per-level operation times, fused blocks
as the executor runs them, bootstraps, key loads), from the calibrated cost table
``<preset>-lattigo`` when there is one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common import progress
from planner import ir
from planner.cost.timing import ModelledTime, TimeModel, modelled_time, time_model
from planner.frontend.params import Params
from planner.ir.analysis import register_depths, rotation_key_levels
from planner.ir.hoisting import Split, collapse, fully_split
from solver import keyplan_model, keyset_model

__all__ = [
    "JointChoice",
    "plan_joint",
]

# Budgets for the key-set model, as multiples of the keys that fit next to the largest
# working set under the cap.
KEYSET_BUDGETS = (1, 2)
# Loads are issued at most this many instructions before the key's first use.
MAX_PREFETCH = 256
# Joint model problems larger than this many points are solved without the z3 check.
Z3_MAX_POINTS = 300
# Hoisted groups of more offsets than this are packed greedily (consecutive offsets while
# they fit) instead of being modelled pairwise (a group of g offsets costs g^2 literals).
MODEL_GROUP_MAX = 24


# --------------------------------------------------------------------------------------
# Splitting and collapsing hoisted groups
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# The key set (two-hop compositions)
# --------------------------------------------------------------------------------------


@dataclass
class _Chains:
    """Duck type of planner.keys.schedule._Paths for rewrite_rotations: chains over owned keys."""

    slots: int
    basis: tuple[int, ...]
    steps: dict[int, list[int]]

    def chain(self, k: int) -> list[int]:
        return list(self.steps.get(k % self.slots, [k % self.slots]))


def _site_levels(program: Sequence[Mapping[str, Any]], max_level: int) -> list[tuple[tuple[int, ...], int]]:
    out = []
    for raw, lv in zip(program, rotation_key_levels(program, max_level), strict=True):
        ins = ir.decode(raw)
        if isinstance(ins, ir.Rot | ir.RotHoisted) and lv is not None:
            out.append((tuple(dict.fromkeys(int(k) for k in ins.rot_keys())), lv))
    return out


def keyset_problem(
    program: Sequence[Mapping[str, Any]], params: Params, tm: TimeModel, budget: int
) -> tuple[keyset_model.KeySetProblem, list[int]]:
    """The key-set model of a program: candidate keys are its offsets and the powers of two
    (both directions); sizes at the top level (an upper bound for every use)."""
    slots = params.slots
    sites = _site_levels(program, params.max_level)
    offsets = sorted({k % slots for s, _ in sites for k in s})
    extra = {(1 << j) % slots for j in range(slots.bit_length())} | {(-(1 << j)) % slots for j in range(slots.bit_length())}
    cands = offsets + sorted(extra - set(offsets) - {0})
    idx = {k: i for i, k in enumerate(cands)}
    kb = params.rotation_key_bytes()
    lc = int(round(tm.load_ms(kb) * 1000))
    pairs: list[tuple[tuple[int, int], ...]] = []
    for k in cands:
        ps = []
        for a in cands:
            b = (k - a) % slots
            if a != k and b != k and b != 0 and b in idx:
                ps.append((idx[a], idx[b]))
        pairs.append(tuple(ps))
    grouped: dict[tuple[tuple[int, ...], int], int] = {}
    for s, lv in sites:
        key = (tuple(idx[k % slots] for k in s), lv)
        grouped[key] = grouped.get(key, 0) + 1
    msites = []
    for (s, lv), n in sorted(grouped.items()):
        if len(s) == 1:
            msites.append(keyset_model.Site(s, n, int(round(tm.rot_ms(lv) * 1000)), 0))
        else:
            msites.append(keyset_model.Site(s, n, int(round(tm.split_ms(lv) * 1000)), int(round(tm.hoist_ms(lv) * 1000))))
    req = tuple(k in set(offsets) for k in cands)
    return keyset_model.KeySetProblem(
        tuple(kb for _ in cands), tuple(lc for _ in cands), req, tuple(pairs), tuple(msites), budget
    ), cands


# --------------------------------------------------------------------------------------
# The joint schedule
# --------------------------------------------------------------------------------------


@dataclass
class JointChoice:
    """One candidate: the rewritten program (key set applied, groups collapsed), its
    resident intervals, sizes and levels, and what it costs."""

    program: list[dict[str, Any]]
    intervals: list[tuple[int, int, int]]
    size: dict[int, int]
    level: dict[int, int]
    uses: dict[int, list[int]]
    chains: dict[int, list[int]]
    basis: list[int] | None
    min_cap: int
    where: str
    time: ModelledTime | None = None
    solver: dict[str, Any] = field(default_factory=dict)
    splits: int = 0


def _levels(prog: Sequence[Mapping[str, Any]], params: Params, key_levels: bool) -> dict[int, int]:
    L = params.max_level
    level: dict[int, int] = {}
    for raw, use in zip(prog, rotation_key_levels(prog, L), strict=True):
        for k in set(ir.decode(raw).rot_keys()):
            lv = use if key_levels and use is not None else L
            level[k] = max(level.get(k, 0), lv)
    return level


def _group_level(split: Split, g: int, params: Params, depth: Mapping[str, int]) -> int:
    ins = ir.decode(split.program[split.groups[g][0]])
    return max(0, params.max_level - depth[ins.reads()[0]])


def _joint_once(
    prog: list[dict[str, Any]], params: Params, cap: int | None, tm: TimeModel, key_levels: bool,
    time_limit_s: float, cross_check: bool, prefetch: int,
) -> JointChoice | tuple[int, str]:
    """Split, solve the joint model, collapse, prefetch.  Returns the smallest feasible cap
    and where it binds when ``cap`` is below it."""
    from planner.keys.profile import base_profile
    from planner.keys.residency import _Ctx, keep_giant_keys

    split = fully_split(prog)
    sp = split.program
    depth = register_depths(sp)
    level = _levels(sp, params, key_levels)
    size = {k: params.rotation_key_bytes(lv) for k, lv in level.items()}
    base = base_profile(sp, params, depth)
    need: list[list[int]] = []
    uses: dict[int, list[int]] = {}
    for i, raw in enumerate(sp):
        ks = sorted(set(ir.decode(raw).rot_keys()))
        need.append(ks)
        for k in ks:
            uses.setdefault(k, []).append(i)
    fixed = [base[i] + sum(size[k] for k in need[i]) for i in range(len(sp))]
    i_max = max(range(len(sp)), key=lambda i: fixed[i]) if sp else 0
    min_cap = fixed[i_max] if sp else 0
    where = (
        f"instruction {split.orig[i_max] if sp else 0} ({ir.op_name(sp[i_max]) if sp else '-'}) needs {min_cap} bytes "
        f"with its hoisted group split down to one key (ciphertexts and plaintexts {base[i_max] if sp else 0}, "
        f"its largest key {min_cap - (base[i_max] if sp else 0)})"
    )
    if cap is not None and cap < min_cap:
        return min_cap, where
    keys = sorted(uses)
    kix = {k: i for i, k in enumerate(keys)}
    point_key = [kix[need[i][0]] if need[i] else -1 for i in range(len(sp))]
    total = max(fixed, default=0) + sum(size.values())
    gl = [_group_level(split, g, params, depth) for g in range(len(split.groups))]
    # every group's greedy packing (consecutive offsets while they fit next to the working
    # set): the hint, and the decision itself for groups too large to model pairwise
    greedy = [_greedy_joins(pts, base, [size[need[q][0]] for q in pts], cap) for pts in split.groups]
    modelled = [g for g, pts in enumerate(split.groups) if len(pts) <= MODEL_GROUP_MAX]
    fixed_m = list(fixed)
    for g, pts in enumerate(split.groups):
        if len(pts) > MODEL_GROUP_MAX:
            for run in _runs(pts, greedy[g]):
                run_bytes = sum(size[need[q][0]] for q in run)
                for q in run:
                    fixed_m[q] += run_bytes - size[need[q][0]]
    prob = keyplan_model.JointKeyProblem(
        sizes=tuple(size[k] for k in keys),
        uses=tuple(tuple(uses[k]) for k in keys),
        fixed=tuple(fixed_m),
        point_key=tuple(point_key),
        groups=tuple(tuple(split.groups[g]) for g in modelled),
        load_cost=tuple(max(1, int(round(tm.load_ms(size[k]) * 1000))) for k in keys),
        split_cost=tuple(max(1, int(round(tm.split_ms(gl[g]) * 1000))) for g in modelled),
        capacity=min(cap, total) if cap is not None else total,
    )
    ctx = _Ctx(len(sp), uses, need, size, base, cap)
    hint = _hint(prob, ctx, keys, [greedy[g] for g in modelled])
    sol = keyplan_model.solve_cpsat(prob, time_limit_s, hint=hint)
    info: dict[str, Any] = {"name": "cpsat", "status": sol.status, "objective": sol.cost, "bound": sol.bound,
                            "seconds": round(sol.seconds, 3), "greedy_groups": len(split.groups) - len(modelled),
                            **sol.stats}
    if sol.status in ("optimal", "feasible"):
        merged, joined_m = sol.merged, sol.joined
    else:  # no solution in time: the hint (at worst Belady, fully split) is feasible
        merged, joined_m = hint
        info.update(status="feasible", fallback="hint")
    joined = [list(js) for js in greedy]
    for g, js in zip(modelled, joined_m, strict=True):
        joined[g] = list(js)
    if cross_check and prob.n_points <= Z3_MAX_POINTS:
        zs = keyplan_model.solve_z3(prob, time_limit_s)
        info["z3"] = {"status": zs.status, "cost": zs.cost if zs.status == "optimal" else None}
        if zs.status == "optimal" and sol.status == "optimal" and zs.cost != sol.cost:
            from planner.keys.profile import KeyScheduleError

            raise KeyScheduleError(f"internal: joint key model: CP-SAT (cost {sol.cost}) and z3 ({zs.cost}) disagree")
    new, at = collapse(split, joined)
    intervals: list[tuple[int, int, int]] = []
    for ki, k in enumerate(keys):
        us = uses[k]
        start = us[0]
        for j in range(len(us) - 1):
            if not merged[ki][j]:
                intervals.append((k, at[start], at[us[j]]))
                start = us[j + 1]
        intervals.append((k, at[start], at[us[-1]]))
    new_uses: dict[int, list[int]] = {k: sorted({at[u] for u in us}) for k, us in uses.items()}
    splits = sum(1 for js in joined for v in js if not v)
    ch = JointChoice(new, intervals, size, level, new_uses, {}, None, min_cap, where, solver=info, splits=splits)
    base_new = base_profile(new, params, register_depths(new))
    ch.intervals, info["blocks_kept_whole"], info["blocks_split"] = keep_giant_keys(
        new, ch.intervals, size, base_new, cap, params.slots)
    if prefetch > 0:
        ch.intervals = _prefetch(ch, params, cap, tm, prefetch)
    return ch


def _greedy_joins(pts: Sequence[int], base: Sequence[int], sizes: Sequence[int], cap: int | None) -> list[bool]:
    """Joins of a group packed greedily: consecutive offsets share a run while the run's
    keys fit next to the largest working set in it (everything joined without a cap)."""
    joins: list[bool] = []
    run_bytes, run_base = sizes[0], base[pts[0]]
    for b in range(1, len(pts)):
        q, sz = pts[b], sizes[b]
        if cap is None or max(run_base, base[q]) + run_bytes + sz <= cap:
            joins.append(True)
            run_bytes, run_base = run_bytes + sz, max(run_base, base[q])
        else:
            joins.append(False)
            run_bytes, run_base = sz, base[q]
    return joins


def _runs(pts: Sequence[int], joins: Sequence[bool]) -> list[list[int]]:
    out: list[list[int]] = [[pts[0]]]
    for b in range(1, len(pts)):
        if joins[b - 1]:
            out[-1].append(pts[b])
        else:
            out.append([pts[b]])
    return out


def _hint(prob: keyplan_model.JointKeyProblem, ctx: Any, keys: Sequence[int],
          greedy: list[list[bool]]) -> tuple[list[list[bool]], list[list[bool]]]:
    """The cheaper feasible of: Belady's merges with the greedy packing (gaps that cover a
    packed run unmerged), and Belady fully split (always feasible)."""
    from planner.keys.residency import _belady, _merges_from_intervals

    bel = _merges_from_intervals(ctx, _belady(ctx))
    split_hint = ([list(bel[k]) for k in keys], [[False] * (len(g) - 1) for g in prob.groups])
    in_run: set[int] = set()
    for pts, js in zip(prob.groups, greedy, strict=True):
        for run in _runs(pts, js):
            if len(run) > 1:
                in_run.update(run)
    merged = []
    for ki, us in enumerate(prob.uses):
        merged.append([bool(bel[keys[ki]][j]) and not any(us[j] < q < us[j + 1] for q in in_run)
                       for j in range(len(us) - 1)])
    cands = [split_hint]
    cost, peak = keyplan_model.evaluate(prob, merged, greedy)
    if peak <= prob.capacity:
        cands.append((merged, greedy))
    return min(cands, key=lambda h: keyplan_model.evaluate(prob, h[0], h[1])[0])


def _prefetch(ch: JointChoice, params: Params, cap: int | None, tm: TimeModel, distance: int) -> list[tuple[int, int, int]]:
    """Issue each load up to ``distance`` instructions early, until the modelled compute
    between the issue point and the use covers the load (or the cap, or the key's previous
    residency, stops it).  The memory model counts the key from the issue point."""
    from planner.keys.profile import base_profile

    prog = ch.program
    depth = register_depths(prog)
    base = np.asarray(base_profile(prog, params, depth), dtype=np.int64)
    load = base.copy()
    for k, a, b in ch.intervals:
        load[a : b + 1] += ch.size[k]
    ms = [u * tm.ms_per_unit for u in tm.program_costs(prog, params.max_level, params.slots)]
    prev_end: dict[int, int] = {}
    out: list[tuple[int, int, int]] = []
    for k, a, b in sorted(ch.intervals, key=lambda t: (t[1], t[0])):
        start = a
        covered = 0.0
        need_ms = tm.load_ms(ch.size[k])
        lo = max(prev_end.get(k, -2) + 2, a - distance, 0)
        while start > lo and covered < need_ms:
            t = start - 1
            if cap is not None and load[t] + ch.size[k] > cap:
                break
            load[t] += ch.size[k]
            covered += ms[t]
            start = t
        out.append((k, start, b))
        prev_end[k] = b
    return out


def _rewrite(prog: list[dict[str, Any]], params: Params, tm: TimeModel, budget: int, time_limit_s: float,
             cross_check: bool) -> tuple[list[dict[str, Any]], dict[int, list[int]], list[int], dict[str, Any]] | None:
    from planner.keys.basis import rewrite_rotations

    prob, cands = keyset_problem(prog, params, tm, budget)
    sol = keyset_model.solve_cpsat(prob, time_limit_s)
    info: dict[str, Any] = {"status": sol.status, "budget_bytes": budget, "objective": sol.cost, **sol.stats}
    if sol.status not in ("optimal", "feasible"):
        return None
    if cross_check and len(cands) <= 64:
        zs = keyset_model.solve_z3(prob, time_limit_s)
        info["z3"] = {"status": zs.status, "cost": zs.cost if zs.status == "optimal" else None}
        if zs.status == "optimal" and sol.status == "optimal" and zs.cost != sol.cost:
            from planner.keys.profile import KeyScheduleError

            raise KeyScheduleError(f"internal: key-set model: CP-SAT (cost {sol.cost}) and z3 ({zs.cost}) disagree")
    if not sol.chains:
        return None
    steps = {cands[k]: [cands[a], cands[b]] for k, (a, b) in sol.chains.items()}
    owned = [cands[k] for k, o in enumerate(sol.own) if o]
    paths = _Chains(params.slots, tuple(owned), steps)
    new, chains = rewrite_rotations(prog, paths)  # type: ignore[arg-type]
    return new, chains, sorted(owned), info


def plan_joint(
    prog: list[dict[str, Any]], params: Params, cap: int | None, *, key_levels: bool = True,
    time_limit_s: float = 10.0, cross_check: bool = False, prefetch: int = MAX_PREFETCH, compose: bool = True,
) -> JointChoice | tuple[int, str]:
    """The joint schedule of a program without key ops: the candidate with the smallest
    modelled time, or (smallest feasible cap, where it binds) when ``cap`` is too small."""
    tm = time_model(params)
    first = _joint_once(prog, params, cap, tm, key_levels, time_limit_s, cross_check, prefetch)
    if not isinstance(first, JointChoice):
        return first
    best = first
    best.time = _time_of(best, params, tm)
    tried: set[int] = set()
    if compose and cap is not None:
        kb = params.rotation_key_bytes()
        split = fully_split(prog)
        from planner.keys.profile import base_profile

        top_base = max(base_profile(split.program, params), default=0)
        fit = (cap - top_base) // kb
        n_keys = len(best.size)
        for mult in KEYSET_BUDGETS:
            m = int(fit * mult)
            if m < 1 or m >= n_keys or m in tried:
                continue
            tried.add(m)
            progress.check("key schedule")
            rw = _rewrite(prog, params, tm, m * kb, time_limit_s, cross_check)
            if rw is None:
                continue
            new_prog, chains, owned, info = rw
            cand = _joint_once(new_prog, params, cap, tm, key_levels, time_limit_s, cross_check, prefetch)
            if not isinstance(cand, JointChoice):
                continue
            cand.chains, cand.basis = chains, owned
            cand.solver["keyset"] = info
            cand.time = _time_of(cand, params, tm)
            assert best.time is not None
            if (cand.time.total_ms, len(cand.program)) < (best.time.total_ms, len(best.program)):
                best = cand
    best.solver["time_model"] = tm.source
    best.solver["candidates"] = 1 + len(tried)
    return best


def _time_of(ch: JointChoice, params: Params, tm: TimeModel) -> ModelledTime:
    from planner.keys.residency import _emit

    return modelled_time(_emit(ch.program, ch.intervals, True), params, ch.size, tm)
