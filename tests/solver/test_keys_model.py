"""solver.keys_model on tiny random problems (keys of different sizes): CP-SAT's loads and,
at those loads, its peak equal brute force over every merge decision; z3 agrees on the
loads; the time-axis compression keeps each segment's largest fixed demand; caps below the
fixed demand are infeasible."""

from __future__ import annotations

import itertools
import random

import pytest

from solver.keys_model import KeyLivenessProblem, _compress, evaluate, solve_cpsat, solve_z3


def random_problem(seed: int) -> KeyLivenessProblem:
    rng = random.Random(seed)
    n_points = rng.randint(6, 12)
    n_keys = rng.randint(2, 4)
    sizes = tuple(rng.choice([2, 3, 5, 8]) for _ in range(n_keys))
    uses = tuple(tuple(sorted(rng.sample(range(n_points), rng.randint(1, 4)))) for _ in range(n_keys))
    fixed = [rng.randint(0, 6) for _ in range(n_points)]
    for k, us in enumerate(uses):  # a key is resident at its own uses
        for t in us:
            fixed[t] += sizes[k]
    return KeyLivenessProblem(sizes, uses, tuple(fixed), max(fixed) + rng.randint(0, 12))


def loads_at(p: KeyLivenessProblem, merged: list[list[bool]]) -> list[int]:
    """Resident bytes at every point from the definition: the fixed demand plus every key
    kept across a gap that contains the point."""
    load = list(p.fixed)
    for k, us in enumerate(p.uses):
        for j in range(len(us) - 1):
            if merged[k][j]:
                for t in range(us[j] + 1, us[j + 1]):
                    load[t] += p.sizes[k]
    return load


def brute_force(p: KeyLivenessProblem) -> tuple[int, int] | None:
    """(fewest loads, smallest peak at those loads over the points from the first point inside
    a gap to the last: the compressed time axis the model constrains)."""
    n_gaps = [max(0, len(us) - 1) for us in p.uses]
    inside = {t for us in p.uses for a, z in itertools.pairwise(us) for t in range(a + 1, z)}
    inside = set(range(min(inside), max(inside) + 1)) if inside else set()
    best: tuple[int, int] | None = None
    for bits in itertools.product([False, True], repeat=sum(n_gaps)):
        merged, i = [], 0
        for n in n_gaps:
            merged.append(list(bits[i:i + n]))
            i += n
        load = loads_at(p, merged)
        if max(load) > p.capacity:
            continue
        loads = sum(len(us) for us in p.uses) - sum(bits)
        assert evaluate(p, merged) == (loads, max(load))
        peak = max((load[t] for t in inside), default=0)
        if best is None or (loads, peak) < best:
            best = (loads, peak)
    return best


@pytest.mark.parametrize("seed", range(30))
def test_cpsat_and_z3_equal_brute_force(seed: int) -> None:
    p = random_problem(seed)
    want = brute_force(p)
    a, b = solve_cpsat(p, 10.0), solve_z3(p, 10.0)
    if want is None:
        assert a.status == "infeasible" and b.status == "infeasible"
        return
    assert a.status == "optimal" and b.status == "optimal"
    assert a.loads == want[0] == b.loads and a.bound == a.loads
    loads, peak = evaluate(p, a.merged)
    assert loads == a.loads and peak <= p.capacity
    assert evaluate(p, b.merged)[1] <= p.capacity
    if a.stats["gaps"]:
        assert a.peak_bytes == want[1]  # phase 2: the smallest peak at the fewest loads


def test_compression_keeps_the_largest_fixed_demand_per_segment() -> None:
    for seed in range(20):
        p = random_problem(seed)
        c = _compress(p)
        assert len(c.seg_fixed) == len(c.seg_bounds) - 1
        for s, f in enumerate(c.seg_fixed):
            assert f == max(p.fixed[c.seg_bounds[s]:c.seg_bounds[s + 1]])
        for g, (a, z) in zip(c.gaps, c.gap_span, strict=True):
            assert c.seg_bounds[a] == g.first and c.seg_bounds[z] == g.last + 1


def test_adjacent_uses_need_no_decision_and_a_full_point_is_infeasible() -> None:
    # uses 0, 1, 2 of one key: no gap has an interior, one load, nothing to decide
    p = KeyLivenessProblem((4,), ((0, 1, 2),), (4, 4, 4), 4)
    for sol in (solve_cpsat(p), solve_z3(p)):
        assert sol.status == "optimal" and sol.loads == 1 and sol.merged == [[True, True]]
    # a point inside a gap whose fixed demand alone exceeds the cap
    q = KeyLivenessProblem((4,), ((0, 3),), (4, 9, 1, 4), 8)
    assert solve_cpsat(q).status == "infeasible" and solve_z3(q).status == "infeasible"
