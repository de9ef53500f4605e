"""z3 back end of the choice model (same variables, constraints and objective as CP-SAT).

The objective is stated as weighted soft constraints (each chosen option and each chosen
pair pays its cost) and solved by z3's ``wmax`` MaxSAT engine.  The arithmetic objective
(``minimize(Sum(If(...)))``) and the default core-guided engine proved a two-ct-ct-matmul
graph of five groups (62 options, 880 pairs) optimal in none of 30 s; ``wmax`` does it in
0.3 s, and both give the same optimum wherever they finish.
"""

from __future__ import annotations

import time

import z3

from solver.model import FULL, BootOption, ChoiceModel, Group, Solution, Status

# Weighted MaxSAT engine for the soft-constraint objective (see the module docstring).
Z3_MAXSAT_ENGINE = "wmax"


class Z3Solver:
    name = "z3"

    def solve(self, model: ChoiceModel, time_limit_s: float) -> Solution:
        t0 = time.perf_counter()
        opt = z3.Optimize()
        opt.set("timeout", max(10, int(time_limit_s * 1000)))
        opt.set("maxsat_engine", Z3_MAXSAT_ENGINE)
        # step 1: variables
        x = {g.name: [z3.Bool(f"x[{g.name}][{o}]") for o in range(len(g.costs))] for g in model.groups}
        terms: list[z3.ArithRef] = []
        # step 2: one option per group
        soft: list[tuple[z3.BoolRef, int]] = []  # (constraint that is satisfied when not paying, cost)
        for g in model.groups:
            opt.add(z3.PbEq([(v, 1) for v in x[g.name]], 1))
            for c, v in zip(g.costs, x[g.name], strict=True):
                if c:
                    terms.append(z3.If(v, c, 0))
                    soft.append((z3.Not(v), c))
        # step 3: layout edges
        for e in model.edges:
            for a, va in enumerate(x[e.src]):
                for b, vb in enumerate(x[e.dst]):
                    ec = e.costs[a][b]
                    if ec is None:
                        opt.add(z3.Not(z3.And(va, vb)))
                    elif ec:
                        terms.append(z3.If(z3.And(va, vb), ec, 0))
                        soft.append((z3.Or(z3.Not(va), z3.Not(vb)), ec))
        # step 4: multiplicative depth (the same linear constraints as CP-SAT), with the
        # bootstrap decisions b[g] and the reading depths R[g]
        vvar: dict[str, list[tuple[str, z3.BoolRef]]] = {}
        bvar = _depth(opt, model, x, terms, soft, vvar) if model.max_depth is not None else {}
        # step 5: objective
        total = z3.Sum(terms) if terms else z3.IntVal(0)
        h = None
        for cons, c in soft:
            h = opt.add_soft(cons, c, id="cost")
        res = opt.check()
        seconds = time.perf_counter() - t0
        if res == z3.unsat:
            return Solution((), Status.INFEASIBLE, None, None, seconds, self.name)
        try:
            mdl = opt.model()
        except z3.Z3Exception:
            mdl = None
        if mdl is None or len(mdl) == 0 and model.groups:
            return Solution((), Status.UNKNOWN, None, None, seconds, self.name)
        choice = tuple(
            (g.name, next((o for o, v in enumerate(x[g.name]) if z3.is_true(mdl.eval(v, True))), 0))
            for g in model.groups
        )
        objective = mdl.eval(total, True).as_long()
        status = Status.OPTIMAL if res == z3.sat else Status.FEASIBLE
        bound = None
        if h is not None:
            lower = h.lower()
            bound = lower.as_long() if z3.is_int_value(lower) else None
        if status is Status.OPTIMAL:
            bound = objective
        boots = tuple(name for name, v in bvar.items() if z3.is_true(mdl.eval(v, True)))
        variants = tuple((name, label) for name in boots for label, v in vvar.get(name, ())
                         if label != FULL and z3.is_true(mdl.eval(v, True)))
        return Solution(choice, status, objective, bound, seconds, self.name, boots, variants)


def _depth(
    opt: z3.Optimize, model: ChoiceModel, x: dict[str, list[z3.BoolRef]], terms: list[z3.ArithRef],
    soft: list[tuple[z3.BoolRef, int]], vvar: dict[str, list[tuple[str, z3.BoolRef]]],
) -> dict[str, z3.BoolRef]:
    """Depth constraints, bootstrap decisions and their costs; returns b[g] (and fills
    ``vvar`` for groups with bootstrap variants, as CP-SAT's ``_variants``)."""
    assert model.max_depth is not None
    b: dict[str, z3.BoolRef] = {}
    L = model.max_depth
    # depths may go below 0 (lo) where a CinS layer's bootstrap gives levels back
    lo = model.depth_floor
    inc = model.incoming()
    D = {g.name: z3.Int(f"D[{g.name}]") for g in model.groups}
    R: dict[str, z3.ArithRef] = dict(D)
    P: dict[str, z3.ArithRef] = dict(D)
    for g in model.groups:
        opt.add(D[g.name] >= lo, D[g.name] <= L)
        if g.has_resets:  # bootstraps inside the option (see solver.model)
            P[g.name] = z3.Int(f"P[{g.name}]")
            opt.add(P[g.name] >= lo, P[g.name] <= L)
            for o, v in enumerate(x[g.name]):
                r = g.reset(o)
                opt.add(z3.Implies(v, D[g.name] >= (P[g.name] if r is None else r)))
        if g.depths and (not lo or g.name not in inc):
            # (a group read by edges starts from its operands' depth, which may be below 0)
            opt.add(P[g.name] >= z3.Sum([z3.If(v, d, 0) for d, v in zip(g.depths, x[g.name], strict=True)]))
        elif lo and g.name not in inc:
            opt.add(P[g.name] >= 0)
    for g in model.bootable():
        bg = b[g.name] = z3.Bool(f"b[{g.name}]")
        R[g.name] = z3.Int(f"R[{g.name}]")
        opt.add(R[g.name] >= lo, R[g.name] <= L)
        opt.add(R[g.name] >= D[g.name] - (L - lo) * z3.If(bg, 1, 0))
        if g.has_variants:
            vvar[g.name] = _variants(opt, model, g, x[g.name], bg, D[g.name], R[g.name], lo, terms, soft)
            continue
        if g.boot_post or lo:  # a bootstrapped value is read at boot_post (not below 0)
            opt.add(R[g.name] >= z3.If(bg, g.boot_post, lo))
        pres = [z3.If(z3.And(v, bg), g.boot_pre(o), 0) for o, v in enumerate(x[g.name]) if g.boot_pre(o)]
        if pres:
            opt.add(D[g.name] + z3.Sum(pres) <= L)
        for o, v in enumerate(x[g.name]):
            c = (model.boot_weight or 0) * g.n_ct(o)
            if c:
                terms.append(z3.If(z3.And(v, bg), c, 0))
                soft.append((z3.Or(z3.Not(v), z3.Not(bg)), c))
    for e in model.edges:
        dst = model.group(e.dst)
        kd = [z3.If(v, dst.depth(bb), 0) for bb, v in enumerate(x[e.dst]) if dst.depth(bb)]
        cd = [z3.If(z3.And(va, vb), e.depth(a, bb), 0)
              for a, va in enumerate(x[e.src]) for bb, vb in enumerate(x[e.dst]) if e.depth(a, bb)]
        opt.add(P[e.dst] >= R[e.src] + z3.Sum(kd + cd + [z3.IntVal(0)]))
    return b


def _variants(
    opt: z3.Optimize, model: ChoiceModel, g: Group, xs: list[z3.BoolRef], b: z3.BoolRef, D: z3.ArithRef,
    R: z3.ArithRef, lo: int, terms: list[z3.ArithRef], soft: list[tuple[z3.BoolRef, int]],
) -> list[tuple[str, z3.BoolRef]]:
    """A bootstrapped group with variants: one (option, variant) pair when ``b``, of the
    chosen option, with its cost, levels before and reading depth (as CP-SAT)."""
    assert model.max_depth is not None
    L = model.max_depth
    vs: list[tuple[BootOption, z3.BoolRef]] = []
    for o, xo in enumerate(xs):
        for j, bc in enumerate((g.boot_choice(o, FULL, model.boot_weight or 0), *g.variants(o))):
            assert bc is not None
            v = z3.Bool(f"v[{g.name}][{o}][{j}]")
            opt.add(z3.Implies(v, xo))
            if bc.cost:
                terms.append(z3.If(v, bc.cost, 0))
                soft.append((z3.Not(v), bc.cost))
            vs.append((bc, v))
    opt.add(z3.Sum([z3.If(v, 1, 0) for _, v in vs]) == z3.If(b, 1, 0))
    pres = [z3.If(v, bc.pre, 0) for bc, v in vs if bc.pre]
    if pres:
        opt.add(D + z3.Sum(pres) <= L)
    if any(bc.post for bc, _ in vs) or lo:
        opt.add(lo + z3.Sum([z3.IntVal(0), *(z3.If(v, bc.post - lo, 0) for bc, v in vs if bc.post != lo)]) <= R)
    return [(bc.label, v) for bc, v in vs]
