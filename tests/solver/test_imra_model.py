"""Eq. 11: exhaustive search, CP-SAT and z3 agree; gamma and doubling costs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.kernels.imra import feasible_pairs, select_imra
from planner.kernels.problem import doubling_cost, square_dims
from solver.formulas import gamma
from solver.imra_model import solve_cpsat, solve_z3


def test_gamma_example_from_paper() -> None:
    assert gamma(9) == 4  # "gamma(9) = 3(1001) + 2 - 1 = 4"
    assert gamma(1) == 0 and gamma(2) == 1 and gamma(5) == 3


@pytest.mark.parametrize("m", range(1, 70))
def test_doubling_never_worse_than_gamma(m: int) -> None:
    assert doubling_cost(m) <= gamma(m)


def test_square_dims_reproduces_paper_padding() -> None:
    assert square_dims(16, 3) == (16, 4)  # Conv1: C_in 3 -> 4
    assert square_dims(4096, 25088) == (4096, 28672)  # MVM2: k -> 7 * 4096
    assert square_dims(10, 100) == (10, 100)


@settings(max_examples=60, deadline=None)
@given(
    nd=st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 24, 32]),
    mult=st.integers(1, 4),
    T=st.sampled_from([1, 4, 9]),
    lc=st.sampled_from([1, 3, 16, 49]),
    log_s=st.integers(7, 12),
)
def test_eq11_solvers_agree_with_enumeration(nd: int, mult: int, T: int, lc: int, log_s: int) -> None:
    kd = nd * mult
    S = 1 << log_s
    ch = select_imra(nd, kd, T, lc, S)
    n_pairs = len(feasible_pairs(nd, kd, lc, S))
    for solve in (solve_cpsat, solve_z3):
        r = solve(nd, kd, T, lc, S)
        if n_pairs == 0:
            assert r is None and ch.fallback
            continue
        assert r is not None
        assert (r.Pb, r.Ps) == (ch.Pb, ch.Ps)
        assert r.rotations == ch.eq11
        assert r.search_space == ch.search_space == n_pairs
