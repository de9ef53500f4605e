"""Shared pieces of the CLI commands: consoles and the exit-status convention.

Exit status: 0 success; 1 a run mismatched / a regression was found; 2 bad input (one
line on stderr, nothing written); 3 solver time-out without a plan.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from typing import Any

from rich.console import Console

out = Console(width=None if sys.stdout.isatty() else 200, emoji=False, highlight=False)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200, emoji=False, highlight=False)


class ExitError(Exception):
    """Raise from a command to exit with ``code`` after printing the message on stderr."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def fail(e: Exception, code: int = 2) -> ExitError:
    """One-line error (whitespace folded) with the given exit status."""
    return ExitError(" ".join(str(e).split()), code)


API_VERSION = "1"


def request_id(graph_json: Mapping[str, Any], params_json: Mapping[str, Any], options_json: Mapping[str, Any]) -> str:
    """Content hash of a planning request: the REST plan id and the batch resume key (the
    canonical JSON of the validated graph, the full parameter set and the effective options)."""
    from planner.frontend.graph import canonical_json

    canonical = {"api": API_VERSION, "graph": dict(graph_json), "params": dict(params_json),
                 "options": dict(options_json)}
    return hashlib.sha256(canonical_json(canonical)).hexdigest()


# A solver that stopped at its time limit this far above its proven lower bound is worth
# a longer --time-limit: the ONNX ResNet-20 at n16boot stopped 42% above it at 10 s; at 120 s
# CP-SAT proved its optimum, 5% lower by the model and 13% faster measured (docs/model-bench.md)
SOLVER_GAP_NOTE = 0.10


def solver_gap_note(solver: Mapping[str, Any]) -> str | None:
    """One line when the solver returned a feasible, unproven plan whose objective is more
    than SOLVER_GAP_NOTE above its lower bound, None otherwise."""
    obj, bound = solver.get("objective"), solver.get("bound")
    if solver.get("status") != "feasible" or not obj or not bound or bound <= 0:
        return None
    gap = float(obj) / float(bound) - 1.0
    if gap <= SOLVER_GAP_NOTE:
        return None
    return (f"the solver stopped at its time limit with a plan {gap:.0%} above its lower bound; "
            "a longer --time-limit may find a better one")

