"""Bootstrap variants in the solver-neutral model (issue 36): CP-SAT and z3 against brute
force where depths go below 0 (options that bootstrap inside themselves give levels back)
and groups offer variants; the model's own bookkeeping (Group.keep, dominance, evaluation)."""

from __future__ import annotations

import itertools

import pytest

from solver import SOLVERS, create
from solver.model import FULL, BootOption, ChoiceModel, Edge, Group, Status
from tests.helpers import optimal_solutions
from tests.planner.assign.test_bootstrap_model import brute_force_variants, random_variant_model
from tests.planner.assign.test_cins_plans import with_resets


@pytest.mark.parametrize("seed", range(16))
def test_solvers_match_brute_force_with_variants_and_resets(seed: int) -> None:
    m = with_resets(random_variant_model(seed), seed)
    want = brute_force_variants(m)
    for _, sol in optimal_solutions((m,), want is not None):
        assert want is not None
        assert sol.objective == want[0], (sol, want)
        assert m.evaluate_boots(dict(sol.choice), sol.boots, dict(sol.variants)) == want[0]


def test_the_models_reach_below_depth_0() -> None:
    assert sum(with_resets(random_variant_model(seed), seed).depth_floor < 0 for seed in range(16)) >= 8


def two_option_group() -> Group:
    return Group("a", (3, 1), ("a/0", "a/1"), depths=(1, 1), n_cts=(2, 4), bootable=True,
                 boot_pres=(0, 1), boot_post=1,
                 boot_variants=((BootOption("s4", 7, 0, 1),), (BootOption("p4", 9, 1, 1), BootOption("h3", 8, 1, 1))))


def test_group_bookkeeping() -> None:
    g = two_option_group()
    assert g.has_variants and g.variants(1)[1].label == "h3"
    assert g.boot_choice(0, FULL, 10) == BootOption(FULL, 20, 0, 1)
    assert g.boot_choice(1, "p4", 10) == BootOption("p4", 9, 1, 1)
    assert g.boot_choice(0, "p4", 10) is None  # not offered by that option
    k = g.keep([1])
    assert k.variants(0) == g.variants(1) and k.n_ct(0) == 4


def test_evaluation_refuses_what_the_model_forbids() -> None:
    groups = (Group("input:x", (0,), ("x",)), two_option_group(), Group("b", (0,), ("b",), depths=(2,)))
    edges = (Edge("input:x", "a", "x", ((0, 0),)), Edge("a", "b", "a", ((0,), (0,))))
    m = ChoiceModel(groups, edges, 3, 10)
    ch = {"input:x": 0, "a": 1, "b": 0}
    assert m.evaluate_boots(ch, ["a"], {"a": "h3"}) == 1 + 8
    assert m.evaluate_boots(ch, ["a"], {"a": "s4"}) is None  # option 1 offers no s4
    assert m.evaluate_boots(ch, [], {"a": "h3"}) is None  # a variant of a value not bootstrapped
    assert m.best_variants(ch, ["a"]) == {"a": "h3"}
    # every assignment's optimum is what both solvers find
    best = min(v for o in (0, 1) for vs in (FULL, *(x.label for x in m.group("a").variants(o)))
               for boots in ([], ["a"]) for v in [m.evaluate_boots({**ch, "a": o}, boots, {"a": vs} if boots and vs != FULL else {})]
               if v is not None)
    for name in SOLVERS:
        sol = create(name).solve(m, 10.0)
        assert sol.status is Status.OPTIMAL and sol.objective == best


def test_dominance_keeps_options_with_different_variants() -> None:
    """Two options alike but for their variants are both kept (the cheaper kernel does not
    dominate one whose bootstrap is cheaper)."""
    a = Group("a", (1, 2), ("a/0", "a/1"), depths=(2, 2), n_cts=(1, 1), bootable=True,
              boot_variants=((), (BootOption("s3", 1, 0, 1),)))
    groups = (Group("input:x", (0,), ("x",)), a, Group("b", (0,), ("b",), depths=(2,)))
    edges = (Edge("input:x", "a", "x", ((0, 0),)), Edge("a", "b", "a", ((0,), (0,))))
    m = ChoiceModel(groups, edges, 3, 50)  # a (2) + b (2) > 3: a is bootstrapped
    pruned, keep = m.prune_dominated()
    assert keep["a"] == [0, 1]
    for model in (m, pruned):
        for name in SOLVERS:
            sol = create(name).solve(model, 10.0)
            assert dict(sol.variants) == {"a": "s3"} and sol.objective == 2 + 1, (name, sol)


def test_best_variants_per_placement_reach_the_brute_force_optimum() -> None:
    """The optimum over placements with each placement's best variants (best_variants) is
    the brute-force optimum over options, placements and variants."""
    for seed in range(4):
        m = random_variant_model(seed)
        want = brute_force_variants(m)
        if want is None:
            continue
        names = [g.name for g in m.bootable()]
        vals = []
        for combo in itertools.product(*[range(len(g.costs)) for g in m.groups]):
            ch = {g.name: o for g, o in zip(m.groups, combo, strict=True)}
            for r in range(len(names) + 1):
                for boots in itertools.combinations(names, r):
                    v = m.evaluate_boots(ch, boots, m.best_variants(ch, boots))
                    if v is not None:
                        vals.append(v)
        assert min(vals) == want[0]


@pytest.mark.parametrize("seed", range(10))
def test_improve_variants_never_raises_the_objective(seed: int) -> None:
    """A solution of the model without variants, given improve_variants' variants, stays
    feasible and no dearer (what planner.assign.solve hints the whole model with)."""
    m = random_variant_model(seed)
    sol = create("cpsat").solve(m.without_variants(), 10.0)
    if sol.status is not Status.OPTIMAL:
        return
    ch = dict(sol.choice)
    vs = m.improve_variants(ch, sol.boots)
    got = m.evaluate_boots(ch, sol.boots, vs)
    assert got is not None and sol.objective is not None and got <= sol.objective
    assert set(vs) <= set(sol.boots)
