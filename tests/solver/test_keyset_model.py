"""solver.keyset_model on tiny random problems with keys of different sizes and extra
candidate bases the program does not rotate by: CP-SAT and z3 reach the brute-force
optimum, and their answers are valid (budget kept, every required offset owned or composed
of two owned keys that sum to it)."""

from __future__ import annotations

import itertools
import random

import pytest

from solver.keyset_model import KeySetProblem, KeySetSolution, Site, evaluate, solve_cpsat, solve_z3

SLOTS = 16


def random_problem(seed: int) -> tuple[KeySetProblem, list[int]]:
    rng = random.Random(seed)
    offsets = sorted(rng.sample(range(1, SLOTS), rng.randint(5, 7)))
    required = tuple(rng.random() < 0.75 for _ in offsets)
    idx = {k: i for i, k in enumerate(offsets)}
    pairs = tuple(
        tuple((idx[a], idx[(k - a) % SLOTS]) for a in offsets
              if a != k and (k - a) % SLOTS in idx and (k - a) % SLOTS != k)
        for k in offsets
    )
    sizes = tuple(rng.choice([4, 6, 10]) for _ in offsets)
    load = tuple(rng.randint(1, 25) for _ in offsets)
    need = [i for i, r in enumerate(required) if r]
    sites = tuple(Site(tuple(sorted(rng.sample(need, rng.randint(1, min(3, len(need)))))), rng.randint(1, 3),
                       rng.randint(1, 30), rng.randint(0, 12)) for _ in range(rng.randint(1, 4)) if need)
    budget = rng.randint(sum(sizes) // 2, sum(sizes))
    return KeySetProblem(sizes, load, required, pairs, sites, budget), offsets


def brute_force(p: KeySetProblem) -> int | None:
    best = None
    n = len(p.sizes)
    for own in itertools.product([False, True], repeat=n):
        if sum(s for s, o in zip(p.sizes, own, strict=True) if o) > p.budget:
            continue
        options: list[list[tuple[int, int] | None]] = []
        for k in range(n):
            if not p.required[k] or own[k]:
                options.append([None])
            else:
                options.append([ab for ab in p.pairs[k] if own[ab[0]] and own[ab[1]]])
        for choice in itertools.product(*options):
            chains = {k: c for k, c in enumerate(choice) if c is not None}
            cost = evaluate(p, list(own), chains)
            best = cost if best is None else min(best, cost)
    return best


def _valid(p: KeySetProblem, s: KeySetSolution, offsets: list[int]) -> None:
    assert sum(sz for sz, o in zip(p.sizes, s.own, strict=True) if o) <= p.budget
    for k, req in enumerate(p.required):
        if not req:
            assert k not in s.chains
            continue
        assert s.own[k] != (k in s.chains)  # its own key, or a composition
        if k in s.chains:
            a, b = s.chains[k]
            assert s.own[a] and s.own[b] and (offsets[a] + offsets[b]) % SLOTS == offsets[k]
    assert s.cost == evaluate(p, s.own, s.chains)


@pytest.mark.parametrize("seed", range(24))
def test_cpsat_and_z3_equal_brute_force(seed: int) -> None:
    p, offsets = random_problem(seed)
    want = brute_force(p)
    a, b = solve_cpsat(p, 10.0), solve_z3(p, 10.0)
    if want is None:
        assert a.status == "infeasible" and b.status == "infeasible"
        return
    assert a.status == "optimal" and b.status == "optimal"
    assert a.cost == want == b.cost
    _valid(p, a, offsets)
    _valid(p, b, offsets)


def test_a_composition_saves_a_key_when_the_budget_is_tight() -> None:
    """Offsets 1, 2, 3 with room for two keys: 3 = 1 + 2 (or 2 = 1 + 1 is not offered)."""
    pairs = ((), (), ((0, 1), (1, 0)))
    site = Site((0, 1, 2), 1, 5, 3)
    p = KeySetProblem((10, 10, 10), (1, 1, 1), (True, True, True), pairs, (site,), 20)
    for s in (solve_cpsat(p), solve_z3(p)):
        assert s.status == "optimal" and s.own == [True, True, False]
        assert set(s.chains) == {2} and s.chains[2] in pairs[2]
        assert s.cost == 2 + 5  # two loads, one second hop; the first hop is already rotated by
    roomy = KeySetProblem(p.sizes, p.load_cost, p.required, p.pairs, p.sites, 30)
    assert solve_cpsat(roomy).cost == 3 and solve_cpsat(roomy).chains == {}
    tight = KeySetProblem(p.sizes, p.load_cost, p.required, p.pairs, p.sites, 10)
    assert solve_cpsat(tight).status == "infeasible" and solve_z3(tight).status == "infeasible"
