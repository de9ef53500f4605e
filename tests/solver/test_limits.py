"""CP-SAT solves stop on deterministic time (solver.limits), so plans do not depend on load."""

from ortools.sat.python import cp_model

from solver.limits import WALL_BACKSTOP_FACTOR, set_time_limit


def test_time_limit_is_deterministic_with_wall_backstop() -> None:
    s = cp_model.CpSolver()
    set_time_limit(s.parameters, 2.5)
    assert s.parameters.max_deterministic_time == 2.5
    assert s.parameters.max_time_in_seconds == 2.5 * WALL_BACKSTOP_FACTOR > 2.5
    set_time_limit(s.parameters, 0.0, 0.05)
    assert s.parameters.max_deterministic_time == 0.05


def test_stopped_search_is_reproducible() -> None:
    """A search cut by the deterministic limit ends in the same state twice (a knapsack
    big enough not to be proven optimal within the limit)."""
    import random

    rng = random.Random(7)
    w = [rng.randint(50, 500) for _ in range(400)]
    v = [rng.randint(50, 500) for _ in range(400)]

    def once() -> tuple[int, list[bool]]:
        m = cp_model.CpModel()
        x = [m.new_bool_var(f"x{i}") for i in range(len(w))]
        m.add(sum(a * b for a, b in zip(w, x, strict=True)) <= sum(w) // 3)
        m.maximize(sum(a * b for a, b in zip(v, x, strict=True)))
        s = cp_model.CpSolver()
        set_time_limit(s.parameters, 0.02)
        s.parameters.num_workers = 1
        s.parameters.random_seed = 0
        s.solve(m)
        return int(s.objective_value), [bool(s.value(b)) for b in x]

    assert once() == once()
