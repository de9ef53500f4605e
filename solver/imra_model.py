"""MetaKernel Eq. 11 as a constraint model, solved by CP-SAT or z3.

Variables Pb, Ps, q = nd / Pb, gs = Pb / Ps (integers); constraints (1)-(3) as products,
(4) the composed row fits a ciphertext; objective Eq. 11 with gamma(Ps + 1) from a table
(an element constraint in CP-SAT, an If-chain in z3).  Ties are broken inside the
objective exactly as the exhaustive search does: larger Ps (slot utilisation), then
smaller Pb.  The feasible set is counted by enumerating all solutions (Table 8's
"search space").  The planner uses the exhaustive search; tests check both agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3
from ortools.sat.python import cp_model

from solver.formulas import eq11, gamma


@dataclass(frozen=True)
class Eq11Result:
    Pb: int
    Ps: int
    rotations: int
    search_space: int


def _tie_weights(nd: int) -> tuple[int, int]:
    w_ps = nd + 1  # one step of Ps outweighs any Pb difference
    w_rot = w_ps * (nd + 1)  # one rotation outweighs any Ps/Pb difference
    return w_rot, w_ps


def solve_cpsat(nd: int, kd: int, T: int, lc: int, slots: int) -> Eq11Result | None:
    def build() -> tuple[cp_model.CpModel, cp_model.IntVar, cp_model.IntVar, cp_model.LinearExpr]:
        m = cp_model.CpModel()
        pb = m.new_int_var(1, nd, "Pb")
        ps = m.new_int_var(1, nd, "Ps")
        q = m.new_int_var(1, nd, "q")
        gs = m.new_int_var(1, nd, "gs")
        m.add_multiplication_equality(nd, [pb, q])  # (1)+(2): Pb divides nd
        m.add_multiplication_equality(pb, [ps, gs])  # (3): Ps divides Pb
        m.add(ps * kd * lc + nd * lc <= slots)  # (4)
        g = m.new_int_var(0, 10 * nd + 10, "gamma")
        m.add_element(ps, [0] + [gamma(p + 1) for p in range(1, nd + 1)], g)
        rot = g + q * T - 1 + gs - 1 + ps - 1
        return m, pb, ps, rot

    m, pb, ps, rot = build()
    w_rot, w_ps = _tie_weights(nd)
    m.minimize(w_rot * rot - w_ps * ps + pb)
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    st = s.solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    best_pb, best_ps = s.value(pb), s.value(ps)

    m2, pb2, ps2, _ = build()
    count = 0

    class Counter(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            nonlocal count
            count += 1

    s2 = cp_model.CpSolver()
    s2.parameters.enumerate_all_solutions = True
    s2.parameters.num_workers = 1
    s2.solve(m2, Counter())
    return Eq11Result(best_pb, best_ps, eq11(nd, T, best_pb, best_ps), count)


def solve_z3(nd: int, kd: int, T: int, lc: int, slots: int) -> Eq11Result | None:
    pb, ps, q, gs = z3.Ints("Pb Ps q gs")
    base = [
        pb >= 1, ps >= 1, q >= 1, gs >= 1, pb <= nd, ps <= nd,
        pb * q == nd, ps * gs == pb, ps * kd * lc + nd * lc <= slots,
    ]
    g = z3.IntVal(0)
    for p in range(nd, 0, -1):
        g = z3.If(ps == p, gamma(p + 1), g)
    rot = g + q * T - 1 + gs - 1 + ps - 1
    w_rot, w_ps = _tie_weights(nd)
    opt = z3.Optimize()
    opt.add(*base)
    opt.minimize(w_rot * rot - w_ps * ps + pb)
    if opt.check() != z3.sat:
        return None
    mdl = opt.model()
    best_pb, best_ps = mdl[pb].as_long(), mdl[ps].as_long()
    s = z3.Solver()
    s.add(*base)
    count = 0
    while s.check() == z3.sat:
        mm = s.model()
        count += 1
        s.add(z3.Or(pb != mm[pb], ps != mm[ps]))
    return Eq11Result(best_pb, best_ps, eq11(nd, T, best_pb, best_ps), count)
