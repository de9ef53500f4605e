"""OR-Tools CP-SAT back end of the choice model."""

from __future__ import annotations

import time

from ortools.sat.python import cp_model

from common import progress
from solver.limits import set_time_limit
from solver.model import FULL, BootOption, ChoiceModel, Group, Solution, Status

# One search worker with a fixed seed: CP-SAT is then deterministic, and the same request
# gives the same plan byte for byte (the brief's rule).  The machine has 2 cores anyway.
CPSAT_WORKERS = 1
CPSAT_SEED = 0
# Stop at a proven relative gap of zero: these models are small enough to prove optimal.
CPSAT_RELATIVE_GAP = 0.0
# Full linearisation of the pair-linking constraints: with the default level one worker
# could not close the LP gap of BERT attention at n16 (108 groups, 2230 pairs; bound
# 13.58M vs 16.32M after 45 s), with level 2 it proves the same assignment optimal in 0.2 s.
CPSAT_LINEARIZATION_LEVEL = 2


class CpSatSolver:
    name = "cpsat"

    def solve(self, model: ChoiceModel, time_limit_s: float) -> Solution:
        t0 = time.perf_counter()
        m = cp_model.CpModel()
        # step 1: variables (one Boolean per option)
        x = {g.name: [m.new_bool_var(f"x[{g.name}][{o}]") for o in range(len(g.costs))] for g in model.groups}
        # step 2: one option per group, with the greedy choice as a hint
        for g in model.groups:
            m.add_exactly_one(x[g.name])
            for o, v in enumerate(x[g.name]):
                m.add_hint(v, 1 if o == g.hint else 0)
        # a model with bootstrap variants gets its hint complete (pairs, depths): planner.assign.solve
        # hints the full-slot optimum with its variants, which CP-SAT then starts from (plans
        # without variants keep the search they had, byte for byte)
        full_hint = model.has_variants and model.max_depth is not None
        # step 3: layout edges (pair variables, tight linking; forbidden pairs excluded)
        obj: list[tuple[int, cp_model.IntVar]] = []
        edge_pairs: list[dict[tuple[int, int], cp_model.IntVar]] = []
        for ei, e in enumerate(model.edges):
            xs, xd = x[e.src], x[e.dst]
            pairs: dict[tuple[int, int], cp_model.IntVar] = {}
            for a in range(len(xs)):
                for b in range(len(xd)):
                    c = e.costs[a][b]
                    if c is None:
                        m.add_bool_or([xs[a].Not(), xd[b].Not()])
                        continue
                    y = m.new_bool_var(f"y[{ei}][{a}][{b}]")
                    pairs[(a, b)] = y
                    if full_hint:
                        m.add_hint(y, 1 if a == model.group(e.src).hint and b == model.group(e.dst).hint else 0)
                    if c:
                        obj.append((c, y))
            for a in range(len(xs)):
                m.add(sum(y for (aa, _), y in pairs.items() if aa == a) == xs[a])
            for b in range(len(xd)):
                m.add(sum(y for (_, bb), y in pairs.items() if bb == b) == xd[b])
            edge_pairs.append(pairs)
        vvar: dict[str, list[tuple[str, cp_model.IntVar]]] = {}
        bvar = _depth(m, model, x, edge_pairs, obj, vvar, full_hint) if model.max_depth is not None else {}
        # step 5: objective
        for g in model.groups:
            obj.extend((c, v) for c, v in zip(g.costs, x[g.name], strict=True) if c)
        m.minimize(sum(c * v for c, v in obj))
        s = cp_model.CpSolver()
        set_time_limit(s.parameters, time_limit_s, 0.01)
        s.parameters.num_workers = CPSAT_WORKERS
        s.parameters.random_seed = CPSAT_SEED
        s.parameters.relative_gap_limit = CPSAT_RELATIVE_GAP
        s.parameters.linearization_level = CPSAT_LINEARIZATION_LEVEL
        st = s.solve(m, progress_callback(s, "solve", model.groups))
        status = {
            cp_model.OPTIMAL: Status.OPTIMAL,
            cp_model.FEASIBLE: Status.FEASIBLE,
            cp_model.INFEASIBLE: Status.INFEASIBLE,
        }.get(st, Status.UNKNOWN)
        if status in (Status.OPTIMAL, Status.FEASIBLE):
            choice = tuple(
                (g.name, next(o for o, v in enumerate(x[g.name]) if s.value(v))) for g in model.groups
            )
            objective: int | None = int(round(s.objective_value))
            bound: int | None = int(round(s.best_objective_bound))
            boots = tuple(name for name, v in bvar.items() if s.value(v))
            variants = tuple((name, label) for name in boots for label, v in vvar.get(name, ())
                             if label != FULL and s.value(v))
        else:
            choice, objective, bound, boots, variants = (), None, None, (), ()
        return Solution(choice, status, objective, bound, time.perf_counter() - t0, self.name, boots, variants)



def _depth(
    m: cp_model.CpModel, model: ChoiceModel, x: dict[str, list[cp_model.IntVar]],
    edge_pairs: list[dict[tuple[int, int], cp_model.IntVar]], obj: list[tuple[int, cp_model.IntVar]],
    vvar: dict[str, list[tuple[str, cp_model.IntVar]]], full_hint: bool = False,
) -> dict[str, cp_model.IntVar]:
    """Step 4 of the model: depth constraints, bootstrap decisions and their costs (added
    to ``obj``); returns b[g] (and fills ``vvar``: each group's (variant label, variable)
    pairs where it offers bootstrap variants)."""
    assert model.max_depth is not None
    bvar: dict[str, cp_model.IntVar] = {}
    # step 4: multiplicative depth (exactly one pair per edge is chosen, so the
    # conversion and kernel depths of the chosen options are linear sums); readers see
    # R[g] = D[g], or boot_post when g is bootstrapped (b[g]); a bootstrapped value also
    # needs its scaling level before the bootstrap: D[g] + boot_pre * b[g] <= max_depth
    L = model.max_depth
    # depths may go below 0 (lo) where a CinS layer's bootstrap gives levels back; big-M
    # terms then span L - lo
    lo = model.depth_floor
    M = L - lo
    D = {g.name: m.new_int_var(lo, L, f"D[{g.name}]") for g in model.groups}
    R: dict[str, cp_model.IntVar] = dict(D)
    for g in model.bootable():
        bvar[g.name] = m.new_bool_var(f"b[{g.name}]")
        m.add_hint(bvar[g.name], 1 if g.boot_hint else 0)
        R[g.name] = m.new_int_var(lo, L, f"R[{g.name}]")
        m.add(R[g.name] >= D[g.name] - M * bvar[g.name])
        if g.has_variants:
            vvar[g.name] = _variants(m, model, g, x[g.name], bvar[g.name], D[g.name], R[g.name], lo, obj)
            continue
        if g.boot_post or lo:  # a bootstrapped value is read at boot_post (not below 0)
            m.add(R[g.name] >= lo + (g.boot_post - lo) * bvar[g.name])
        # z[g][o] >= x[g][o] AND b[g]: bootstrap cost w * n_ct(option), and the
        # levels of the scaling or mask before the bootstrap
        zs = []
        for o, v in enumerate(x[g.name]):
            z = m.new_bool_var(f"z[{g.name}][{o}]")
            if full_hint:
                m.add_hint(z, 1 if g.boot_hint and o == g.hint else 0)
            m.add_bool_or([v.Not(), bvar[g.name].Not(), z])
            obj.append(((model.boot_weight or 0) * g.n_ct(o), z))
            zs.append(z)
        if any(g.boot_pre(o) for o in range(len(zs))):
            m.add(D[g.name] + sum(g.boot_pre(o) * z for o, z in enumerate(zs)) <= L)
    # options that bootstrap inside themselves: their levels before the reset
    # (P[g], within max_depth) and the fixed depth of their result
    P: dict[str, cp_model.IntVar] = dict(D)
    inc = model.incoming()
    for g in model.groups:
        pre = D[g.name]
        if g.has_resets:
            pre = P[g.name] = m.new_int_var(lo, L, f"P[{g.name}]")
            resets = [(g.reset(o), v) for o, v in enumerate(x[g.name])]
            m.add(D[g.name] >= pre - M * sum(v for r, v in resets if r is not None))
            if lo:  # the chosen option's result depth (D >= lo holds by its domain)
                m.add(D[g.name] >= sum((r - lo) * v for r, v in resets if r is not None and r != lo) + lo)
            else:
                m.add(D[g.name] >= sum(r * v for r, v in resets if r))
        if g.depths and (not lo or g.name not in inc):
            # (below-0 depths: a group read by edges starts from its operands', which may be
            # below 0; one without operands starts from 0)
            m.add(pre >= sum(d * v for d, v in zip(g.depths, x[g.name], strict=True)))
        elif lo and g.name not in inc:
            m.add(pre >= 0)
    if full_hint:  # the depths of the hinted assignment
        choice = {g.name: g.hint for g in model.groups}
        boots = [g.name for g in model.bootable() if g.boot_hint]
        variants = {g.name: g.variant_hint for g in model.groups if g.name in boots and g.variant_hint != FULL}
        d, pre_d = model.walk_depths(choice, boots, variants)
        for g in model.groups:
            m.add_hint(D[g.name], min(L, max(lo, d[g.name])))
            if P[g.name] is not D[g.name]:
                m.add_hint(P[g.name], min(L, max(lo, pre_d[g.name])))
            if R[g.name] is not D[g.name]:
                bc = g.boot_choice(g.hint, variants.get(g.name, FULL), model.boot_weight or 0) if g.name in boots else None
                m.add_hint(R[g.name], min(L, max(lo, bc.post if bc is not None else d[g.name])))
    for ei, e in enumerate(model.edges):
        kd = sum(model.group(e.dst).depth(bb) * v for bb, v in enumerate(x[e.dst]))
        cd = sum(e.depth(a, bb) * y for (a, bb), y in edge_pairs[ei].items())
        m.add(P[e.dst] >= R[e.src] + cd + kd)
    return bvar


def _variants(
    m: cp_model.CpModel, model: ChoiceModel, g: Group, xs: list[cp_model.IntVar], b: cp_model.IntVar,
    D: cp_model.IntVar, R: cp_model.IntVar, lo: int, obj: list[tuple[int, cp_model.IntVar]],
) -> list[tuple[str, cp_model.IntVar]]:
    """A bootstrapped group with variants (solver.model): one (option, variant) pair
    ``v`` when ``b``, of the chosen option; its cost, its levels before (``D + pre <= L``)
    and the depth its readers see (``R >= post``)."""
    assert model.max_depth is not None
    L = model.max_depth
    vs: list[tuple[BootOption, cp_model.IntVar]] = []
    for o, xo in enumerate(xs):
        for j, bc in enumerate((g.boot_choice(o, FULL, model.boot_weight or 0), *g.variants(o))):
            assert bc is not None
            v = m.new_bool_var(f"v[{g.name}][{o}][{j}]")
            m.add_implication(v, xo)
            m.add_hint(v, 1 if g.boot_hint and o == g.hint and bc.label == g.variant_hint else 0)
            if bc.cost:
                obj.append((bc.cost, v))
            vs.append((bc, v))
    m.add(sum(v for _, v in vs) == b)
    if any(bc.pre for bc, _ in vs):
        m.add(D + sum(bc.pre * v for bc, v in vs if bc.pre) <= L)
    if any(bc.post for bc, _ in vs) or lo:  # (not below lo when not bootstrapped)
        m.add(lo + sum((bc.post - lo) * v for bc, v in vs if bc.post != lo) <= R)
    return [(bc.label, v) for bc, v in vs]


class _SolutionProgress(cp_model.CpSolverSolutionCallback):
    """Reports each improving solution (objective, bound) to common.progress."""

    def __init__(self, stage: str, units: float):
        super().__init__()
        self.stage, self.units, self.found = stage, units, 0

    def on_solution_callback(self) -> None:
        self.found += 1
        progress.note(self.stage, f"solution {self.found}: objective {self.objective_value / self.units:,.3f}, "
                                  f"bound {self.best_objective_bound / self.units:,.3f}")


def progress_callback(s: cp_model.CpSolver, stage: str, groups: object = None,
                       units: float = 1000.0) -> _SolutionProgress | None:
    """A solution callback (and a bound callback) only while someone listens: CP-SAT's
    search is the same with or without them (one worker, fixed seed)."""
    if not progress.active():
        return None
    s.best_bound_callback = lambda b: progress.note(stage, f"bound {b / units:,.3f}")
    return _SolutionProgress(stage, units)
