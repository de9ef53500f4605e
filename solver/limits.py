"""Time limits of CP-SAT solves that keep plans deterministic.

A wall-clock limit (``max_time_in_seconds``) stops the search wherever the machine's load
left it, so the same request could give another plan on a busy machine: a plan made under
a memory cap by ``slotplan plan`` was re-planned differently (and refused) by ``slotplan run``
beside another job.  CP-SAT's *deterministic time* counts work, not seconds, so a search
stopped by it ends in the same state on any machine and load.  A request's time limit is
therefore a deterministic limit (its unit is calibrated to roughly a second of one core),
and the wall clock is only a backstop, far enough above it that it binds only when the
machine is several times slower than usual (then the plan may differ; the solve status
says so in the summary).
"""

from __future__ import annotations

from typing import Any

# How many times the deterministic limit the wall clock may run before it stops the search.
WALL_BACKSTOP_FACTOR = 6.0


def set_time_limit(parameters: Any, limit_s: float, floor_s: float = 0.01) -> None:
    """Give a CP-SAT solver's ``parameters`` the request's limit ``limit_s`` as deterministic
    time, with the wall-clock backstop ``WALL_BACKSTOP_FACTOR`` times it."""
    limit = max(floor_s, float(limit_s))
    parameters.max_deterministic_time = limit
    parameters.max_time_in_seconds = limit * WALL_BACKSTOP_FACTOR
