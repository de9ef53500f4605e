"""The solver-neutral choice model: depth constraints, dominance pruning and greedy on
random models, with CP-SAT and z3 cross-checked against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from planner.kernels.convert import Moves, _bsgs_counts, _rotations_per_n1, _steps
from tests.helpers import choice_brute_force as brute_force
from tests.helpers import optimal_solutions
from tests.helpers import random_choice_model as random_model


@pytest.mark.parametrize("seed", range(40))
def test_solvers_match_brute_force_with_depth_and_pruning(seed: int) -> None:
    m = random_model(seed, depth=seed % 4 != 0)
    want = brute_force(m)
    pruned, keep = m.prune_dominated()
    assert brute_force(pruned) == want
    for model, sol in optimal_solutions((m, pruned), want is not None):
        assert sol.objective == want
        assert model.evaluate(dict(sol.choice)) == want
    g = m.greedy()
    got = m.evaluate(g)
    assert got is None or want is not None and got >= want
    assert all(set(keep[gr.name]) <= set(range(len(gr.costs))) for gr in m.groups)


def test_fast_bsgs_counts_equal_direct_counts() -> None:
    """The one-sort counts used to choose the baby range equal np.unique counts."""
    rng = np.random.default_rng(0)
    for trial in range(150):
        S = 1 << int(rng.integers(3, 12))
        bits = S.bit_length() - 1
        G = int(rng.integers(1, 200))
        nsrc, ndst = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        qd, qs = rng.integers(0, ndst, G), rng.integers(0, nsrc, G)
        mode = trial % 3
        if mode == 0:
            off = rng.integers(0, S, G)
        elif mode == 1:  # a transposition's multiples of (rows - 1)
            off = (rng.integers(-20, 20, G) * (S // 8 - 1)) % S
        else:  # a roll's multiples of a row
            off = (rng.integers(0, 8, G) * (S // 8)) % S
        key, idx = np.unique((qd * nsrc + qs) * S + off, return_index=True)
        qd, qs, off = qd[idx], qs[idx], off[idx]
        n = off.size
        mv = Moves((), qd, qs, off, np.zeros(n, dtype=np.int64), np.arange(n), np.arange(n) + 1, ndst, nsrc, S)
        for c in _steps(mv):
            k = off % S if c == 1 else (off * pow(c, -1, S)) % S
            nb, ng = _rotations_per_n1(np.stack([qs, qd]), k, bits)
            for e in range(bits + 1):
                b, g, _, _ = _bsgs_counts(mv, (c, 1 << e))
                assert (b, g) == (nb[e], ng[e])
