"""Bootstrap placement in the choice model: CP-SAT and z3 against brute force, minimum
cost (not first fit), and the first-fit baseline."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from solver import SOLVERS, create
from solver.model import FULL, BootOption, ChoiceModel, Edge, Group, Status
from tests.helpers import optimal_solutions


def chain(n: int, L: int, w: int = 100) -> ChoiceModel:
    names = ["input:x", *[f"n{i}" for i in range(n)]]
    groups = tuple(
        Group(nm, (0,), (nm,), depths=(0 if nm.startswith("input") else 1,), n_cts=(1,),
              bootable=not nm.startswith("input") and i < len(names) - 1)
        for i, nm in enumerate(names)
    )
    edges = tuple(Edge(a, b, a, ((0,),), ((0,),)) for a, b in itertools.pairwise(names))
    return ChoiceModel(groups, edges, L, w)


@pytest.mark.parametrize(("n", "want"), [(9, 0), (10, 1), (18, 1), (19, 2), (22, 2), (27, 2), (28, 3)])
def test_chain_gets_the_minimum_number_of_bootstraps(n: int, want: int) -> None:
    m = chain(n, 9)
    for name in SOLVERS:
        sol = create(name).solve(m, 30.0)
        assert sol.status is Status.OPTIMAL, name
        assert len(sol.boots) == want, (name, sol.boots)
        assert sol.objective == 100 * want
        assert m.evaluate_boots(dict(sol.choice), sol.boots) == sol.objective
    lazy = m.lazy_boots(m.greedy())
    assert lazy is not None and len(lazy) == want


def test_without_bootstrapping_a_deep_chain_is_infeasible() -> None:
    m = chain(22, 9)
    m0 = ChoiceModel(m.groups, m.edges, 9, None)
    for name in SOLVERS:
        assert create(name).solve(m0, 10.0).status is Status.INFEASIBLE


def random_boot_model(seed: int) -> ChoiceModel:
    """A small DAG with a value read twice, options of different depths and ciphertext
    counts, some range scaling around bootstraps, and a tight level budget."""
    rng = np.random.default_rng(seed)
    names = ["input:a", "n0", "n1", "n2", "n3", "n4"]
    sizes = {n: int(rng.integers(1, 3)) if not n.startswith("input") else 1 for n in names}
    groups = []
    for n in names:
        inp = n.startswith("input")
        groups.append(Group(
            n, tuple(0 if inp else int(rng.integers(0, 20)) for _ in range(sizes[n])),
            tuple(f"{n}/{o}" for o in range(sizes[n])),
            depths=tuple(0 if inp else int(rng.integers(0, 3)) for _ in range(sizes[n])),
            n_cts=tuple(int(rng.integers(1, 4)) for _ in range(sizes[n])),
            bootable=not inp and n != "n4",
            boot_pres=tuple(int(rng.integers(0, 2)) if not inp else 0 for _ in range(sizes[n])),
            boot_post=int(rng.integers(0, 2)) if not inp else 0,
        ))
    pairs = [("input:a", "n0"), ("n0", "n1"), ("n0", "n2"), ("n1", "n3"), ("n2", "n3"), ("n3", "n4"), ("n1", "n4")]
    edges = []
    for s, d in pairs:
        costs = tuple(tuple(None if rng.random() < 0.1 else int(rng.integers(0, 15)) for _ in range(sizes[d]))
                      for _ in range(sizes[s]))
        depths = tuple(tuple(int(rng.integers(0, 2)) for _ in range(sizes[d])) for _ in range(sizes[s]))
        edges.append(Edge(s, d, s, costs, depths))
    return ChoiceModel(tuple(groups), tuple(edges), int(rng.integers(2, 5)), int(rng.integers(5, 40)))


def brute_force(m: ChoiceModel, variants: bool = False) -> tuple[int, int] | None:
    """(objective, bootstraps) of a cheapest assignment with the fewest bootstraps, over
    options and placements (and, with ``variants``, every bootstrapped option's variant)."""
    best: tuple[int, int] | None = None
    bootable = [g.name for g in m.bootable()]
    for combo in itertools.product(*[range(len(g.costs)) for g in m.groups]):
        choice = {g.name: o for g, o in zip(m.groups, combo, strict=True)}
        for r in range(len(bootable) + 1):
            for boots in itertools.combinations(bootable, r):
                labels = [[FULL, *(v.label for v in m.group(b).variants(choice[b]))] if variants else [FULL]
                          for b in boots]
                for vs in itertools.product(*labels):
                    v = m.evaluate_boots(choice, boots, {b: x for b, x in zip(boots, vs, strict=True) if x != FULL})
                    if v is not None and (best is None or (v, r) < best):
                        best = (v, r)
    return best


@pytest.mark.parametrize("seed", range(30))
def test_solvers_match_brute_force_with_bootstraps(seed: int) -> None:
    m = random_boot_model(seed)
    want = brute_force(m)
    pruned, _ = m.prune_dominated()
    assert brute_force(pruned) == want or want is None and brute_force(pruned) is None
    for model, sol in optimal_solutions((m, pruned), want is not None):
        assert want is not None and sol.objective == want[0], sol
        assert model.evaluate_boots(dict(sol.choice), sol.boots) == want[0]
    choice, lazy = m.greedy_boots()
    if lazy is not None:  # first fit keeps every depth within the budget
        d = m.depths_of(choice, lazy)
        assert max(d.values()) <= (m.max_depth or 0)
        assert all(d[b] + m.group(b).boot_pre(choice[b]) <= (m.max_depth or 0) for b in lazy)
        got = m.evaluate_boots(choice, lazy)
        assert got is None or want is not None and got >= want[0]


def test_minimum_cost_placement_beats_first_fit() -> None:
    """x -> a (1 ct) -> b (4 cts) -> c: first fit bootstraps b (4 ciphertexts) where
    bootstrapping a (1 ciphertext) also fits."""
    groups = (
        Group("input:x", (0,), ("x",), depths=(0,), n_cts=(1,)),
        Group("a", (0,), ("a",), depths=(2,), n_cts=(1,), bootable=True),
        Group("b", (0,), ("b",), depths=(1,), n_cts=(4,), bootable=True),
        Group("c", (0,), ("c",), depths=(1,), n_cts=(1,)),
    )
    edges = (Edge("input:x", "a", "x", ((0,),)), Edge("a", "b", "a", ((0,),)), Edge("b", "c", "b", ((0,),)))
    m = ChoiceModel(groups, edges, 3, 10)
    lazy = m.lazy_boots(m.greedy())
    assert lazy == frozenset({"b"}) and m.evaluate_boots(m.greedy(), lazy) == 40
    for name in SOLVERS:
        sol = create(name).solve(m, 10.0)
        assert sol.boots == ("a",) and sol.objective == 10


# -- bootstrap variants (issue 36) ---------------------------------------------------------


def random_variant_model(seed: int) -> ChoiceModel:
    """:func:`random_boot_model` whose options also offer bootstrap variants (a sparse one,
    halves, pairs) of random cost with one level after them and random levels before."""
    rng = np.random.default_rng(1000 + seed)
    m = random_boot_model(seed)
    groups = []
    for g in m.groups:
        if not g.bootable:
            groups.append(g)
            continue
        per = []
        for _o in range(len(g.costs)):
            vs = []
            for kind in ("s", "h", "p"):
                if rng.random() < 0.6:
                    vs.append(BootOption(f"{kind}{int(rng.integers(3, 6))}", int(rng.integers(1, 60)),
                                         int(rng.integers(0, 2)), 1))
            per.append(tuple(vs))
        groups.append(replace(g, boot_variants=tuple(per)))
    return ChoiceModel(tuple(groups), m.edges, m.max_depth, m.boot_weight)


def brute_force_variants(m: ChoiceModel) -> tuple[int, int] | None:
    return brute_force(m, variants=True)


@pytest.mark.parametrize("seed", range(30))
def test_solvers_match_brute_force_with_bootstrap_variants(seed: int) -> None:
    """CP-SAT and z3 give the brute-force optimum over options, placements and variants,
    and the same variants where the optimum is unique up to its objective."""
    m = random_variant_model(seed)
    want = brute_force_variants(m)
    pruned, _ = m.prune_dominated()
    got_pruned = brute_force_variants(pruned)
    assert got_pruned == want or want is None and got_pruned is None
    for model, sol in optimal_solutions((m, pruned), want is not None):
        assert want is not None and sol.objective == want[0], sol
        vs = dict(sol.variants)
        assert set(vs) <= set(sol.boots)
        assert model.evaluate_boots(dict(sol.choice), sol.boots, vs) == want[0]
        # the solver's variants are the cheapest for its placement
        best = model.best_variants(dict(sol.choice), sol.boots)
        assert model.evaluate_boots(dict(sol.choice), sol.boots, best) == want[0]


def test_variants_lower_the_optimum_on_random_models() -> None:
    """Over the seeds, cheap variants make some optimum cheaper than the full bootstrap's
    and never dearer."""
    lower = 0
    for seed in range(30):
        m = random_variant_model(seed)
        plain = ChoiceModel(tuple(replace(g, boot_variants=()) for g in m.groups), m.edges, m.max_depth, m.boot_weight)
        a, b = brute_force_variants(m), brute_force_variants(plain)
        if b is None:
            continue
        assert a is not None and a[0] <= b[0]
        lower += a[0] < b[0]
    assert lower >= 3


def test_sparse_variant_costs_its_level_after() -> None:
    """x -> a -> b -> c with 3 levels: a cheap sparse variant of a's bootstrap leaves a
    reader at depth 1, so it fits only where that level is free; the solvers pick it
    where it fits and the full bootstrap where it does not."""
    def model(da: int, db: int) -> ChoiceModel:
        groups = (
            Group("input:x", (0,), ("x",), depths=(0,), n_cts=(1,)),
            Group("a", (0,), ("a",), depths=(da,), n_cts=(2,), bootable=True,
                  boot_variants=((BootOption("s4", 5, 0, 1),),)),
            Group("b", (0,), ("b",), depths=(db,), n_cts=(1,)),
        )
        edges = (Edge("input:x", "a", "x", ((0,),)), Edge("a", "b", "a", ((0,),)))
        return ChoiceModel(groups, edges, 3, 10)

    for name in SOLVERS:
        sol = create(name).solve(model(3, 2), 10.0)  # 1 + 2 <= 3: the sparse variant fits
        assert sol.boots == ("a",) and dict(sol.variants) == {"a": "s4"} and sol.objective == 5, (name, sol)
        sol = create(name).solve(model(3, 3), 10.0)  # 1 + 3 > 3: only the full one (2 cts x 10)
        assert sol.boots == ("a",) and sol.variants == () and sol.objective == 20, (name, sol)
