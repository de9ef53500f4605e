"""solver.keyplan_model (key residency and hoisted-group splitting together) on tiny random
problems: ``evaluate`` equals a recount from the definitions (the keys resident at each
point); CP-SAT's cost and, at that cost, its peak equal brute force over every merge and
join decision; z3 agrees on the cost; a fully split program is what a cap at the fixed
demand leaves."""

from __future__ import annotations

import itertools
import random

import pytest

from solver.keyplan_model import JointKeyProblem, evaluate, solve_cpsat, solve_z3


def random_problem(seed: int) -> JointKeyProblem:
    rng = random.Random(1000 + seed)
    n_keys = rng.randint(2, 4)
    sizes = tuple(rng.choice([2, 3, 5]) for _ in range(n_keys))
    points: list[int] = []
    groups: list[tuple[int, ...]] = []
    while len(points) < 9:
        if rng.random() < 0.35 and len(points) < 7:
            ks = rng.sample(range(n_keys), min(n_keys, rng.randint(2, 3)))  # distinct offsets
            groups.append(tuple(range(len(points), len(points) + len(ks))))
            points.extend(ks)
        else:
            points.append(rng.choice([-1, *range(n_keys)]))
    uses = tuple(tuple(t for t, k in enumerate(points) if k == key) for key in range(n_keys))
    fixed = tuple(rng.randint(0, 4) + (sizes[k] if k >= 0 else 0) for k in points)
    return JointKeyProblem(sizes, uses, fixed, tuple(points), tuple(groups),
                           tuple(rng.randint(1, 9) for _ in sizes), tuple(rng.randint(1, 9) for _ in groups),
                           max(fixed) + rng.randint(0, 9))


def recount(p: JointKeyProblem, merged: list[list[bool]], joined: list[list[bool]]) -> tuple[int, list[int]]:
    """(cost, bytes at every point): the keys resident at a point are its own (in ``fixed``),
    those kept across a gap that contains it, and the keys of the other points of its run."""
    cost = sum(p.load_cost[k] for k, us in enumerate(p.uses) for j in range(len(us) - 1) if not merged[k][j])
    resident: list[set[int]] = [set() for _ in p.fixed]
    for k, us in enumerate(p.uses):
        for j in range(len(us) - 1):
            if merged[k][j]:
                for t in range(us[j] + 1, us[j + 1]):
                    resident[t].add(k)
    for g, pts in enumerate(p.groups):
        runs: list[list[int]] = [[pts[0]]]
        for b, q in enumerate(pts[1:]):
            if joined[g][b]:
                runs[-1].append(q)
            else:
                runs.append([q])
                cost += p.split_cost[g]
        for run in runs:
            for t in run:
                resident[t] |= {p.point_key[q] for q in run if q != t}
    load = [f + sum(p.sizes[k] for k in resident[t] if k != p.point_key[t]) for t, f in enumerate(p.fixed)]
    return cost, load


def _splits(bits: tuple[bool, ...], counts: list[int]) -> list[list[bool]]:
    out, i = [], 0
    for n in counts:
        out.append(list(bits[i:i + n]))
        i += n
    return out


def brute_force(p: JointKeyProblem) -> tuple[int, int] | None:
    """(smallest cost, smallest peak at that cost over the model's compressed time axis)."""
    gaps = [max(0, len(us) - 1) for us in p.uses]
    bounds = [len(g) - 1 for g in p.groups]
    cuts = {t for us in p.uses for a, z in itertools.pairwise(us) if z > a + 1 for t in (a + 1, z)}
    cuts |= {t for pts in p.groups for q in pts for t in (q, q + 1)}
    axis = range(min(cuts), max(cuts)) if cuts else range(0)
    best: tuple[int, int] | None = None
    for gv in itertools.product([False, True], repeat=sum(gaps)):
        merged = _splits(gv, gaps)
        for jv in itertools.product([False, True], repeat=sum(bounds)):
            joined = _splits(jv, bounds)
            cost, load = recount(p, merged, joined)
            assert evaluate(p, merged, joined) == (cost, max(load))
            if max(load) > p.capacity:
                continue
            peak = max((load[t] for t in axis), default=0)
            if best is None or (cost, peak) < best:
                best = (cost, peak)
    return best


@pytest.mark.parametrize("seed", range(24))
def test_cpsat_and_z3_equal_brute_force(seed: int) -> None:
    p = random_problem(seed)
    want = brute_force(p)
    a, b = solve_cpsat(p, 10.0), solve_z3(p, 10.0)
    if want is None:
        assert a.status == "infeasible" and b.status == "infeasible"
        return
    assert a.status == "optimal" and b.status == "optimal"
    assert a.cost == want[0] == b.cost and a.bound == a.cost
    assert max(recount(p, a.merged, a.joined)[1]) <= p.capacity
    assert max(recount(p, b.merged, b.joined)[1]) <= p.capacity
    assert a.peak_bytes == want[1]  # phase 2: the smallest peak at the smallest cost


def test_a_cap_at_the_fixed_demand_splits_every_group() -> None:
    """Two hoisted groups of two keys each, nothing else resident: at the fixed demand no
    run can carry a second key, so every boundary is split and every gap reloaded."""
    points = (0, 1, -1, 0, 1)
    p = JointKeyProblem((5, 5), ((0, 3), (1, 4)), (6, 6, 1, 6, 6), points, ((0, 1), (3, 4)), (4, 4), (3, 7), 6)
    for s in (solve_cpsat(p), solve_z3(p)):
        assert s.status == "optimal" and s.joined == [[False], [False]] and s.merged == [[False], [False]]
        assert s.cost == 4 + 4 + 3 + 7
    roomy = JointKeyProblem(p.sizes, p.uses, p.fixed, points, p.groups, p.load_cost, p.split_cost, 16)
    s = solve_cpsat(roomy)
    assert s.joined == [[True], [True]] and s.merged == [[True], [True]] and s.cost == 0
