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
    """A search cut by the deterministic limit (not proven optimal) ends in the same state
    twice, whatever the machine's load: an assignment problem with side constraints."""
    import random

    rng = random.Random(7)
    n = 60
    d = [[rng.randint(1, 1000) for _ in range(n)] for _ in range(n)]

    def once() -> tuple[str, int, list[int]]:
        m = cp_model.CpModel()
        x = {(i, j): m.new_bool_var(f"x{i}_{j}") for i in range(n) for j in range(n)}
        for i in range(n):
            m.add_exactly_one(x[i, j] for j in range(n))
            m.add_exactly_one(x[j, i] for j in range(n))
        for i in range(0, n - 1, 2):
            for j in range(n - 1):
                m.add_implication(x[i, j], x[i + 1, j + 1].Not())
        m.maximize(sum(d[i][j] * x[i, j] for i in range(n) for j in range(n)))
        s = cp_model.CpSolver()
        set_time_limit(s.parameters, 0.3)
        s.parameters.num_workers = 1
        s.parameters.random_seed = 0
        st = s.solve(m)
        return s.status_name(st), int(s.objective_value), [j for i in range(n) for j in range(n) if s.value(x[i, j])]

    first = once()
    assert first[0] == "FEASIBLE"  # the limit, not optimality, stopped it
    assert once() == first
