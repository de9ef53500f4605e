"""The planning pipeline: graph -> candidates -> choice model -> solver -> plan.

One way only: candidates and conversions are priced here (planner), the solver layer
picks one option per node/input (solver), and the plan is built from that frozen
solution in a separate step (lower_solution), as HEIR separates its ILP analysis from
the rewrite.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from common import progress
from common.errors import SlotplanError
from planner.assign.candidates import (
    PlanError,
)
from planner.assign.options import (
    DEFAULT_CINS_KERNELS,
    DEFAULT_TIME_LIMIT_S,
    PlanOptions,
    PlanOptionsLiteral,
    resolve_objective,
)
from planner.assign.problem import PlanProblem, build_problem, kernel_names, min_depth
from planner.assign.solve import PlanTimeout, PlanWallTimeout, solve_problem
from planner.batch import plan_auto_batch, plan_batched
from planner.frontend.graph import Graph
from planner.frontend.params import Params
from planner.lower.lowering import LayoutClaim, lower_solution
from planner.single import PlanResult, plan_single

# The planner's face: what callers (api/, backends/, slotplan/) import from one place.
__all__ = [
    "DEFAULT_CINS_KERNELS", "DEFAULT_TIME_LIMIT_S", "LayoutClaim", "PlanError", "PlanOptions", "PlanOptionsLiteral",
    "PlanProblem", "PlanResult", "PlanTimeout", "PlanWallTimeout", "auto_params", "build_problem", "kernel_names",
    "lower_solution", "min_depth", "plan_auto_batch", "plan_batched", "plan_graph", "plan_single", "plan_table_names", "resolve_objective", "solve_problem",
]

def plan_graph(
    graph: Graph, params: Params, options: PlanOptions | None = None, record_timings: bool = False,
    wall_limit_s: float | None = None, wall_started: float | None = None,
) -> PlanResult:
    """Plan a graph: one sample (:func:`planner.single.plan_single`) or, with
    ``options.batch``, B samples per ciphertext (:func:`planner.batch.plan_batched`).
    Timings go to PlanResult.seconds and solution.seconds; the plan document records them
    only with ``record_timings`` (plans are byte-for-byte deterministic by default).
    ``wall_limit_s`` bounds the whole planning in wall time, counted from ``wall_started``
    (a ``time.monotonic()`` reading; default: the call): past it, :class:`PlanWallTimeout`
    names the step where planning stopped."""
    options = options or PlanOptions()
    if options.batch is not None:
        return plan_batched(graph, params, options, record_timings, wall_limit_s, wall_started)
    return plan_single(graph, params, options, record_timings, wall_limit_s, wall_started)


def auto_params(graph: Graph, options: PlanOptions | None = None) -> Params:
    """``--params auto``: the smallest secure preset whose levels fit the graph without
    bootstrapping (n13, n14, n15, n16 in this order), else ``n16boot``.  A preset is skipped
    at once when even the shallowest option of some node is too deep (a lower bound from
    the choice model), else the solver decides whether an assignment fits."""
    from planner.frontend.params import PRESETS, SECURE_PRESETS_BY_SIZE

    options = options or PlanOptions()
    for name in SECURE_PRESETS_BY_SIZE:
        params = PRESETS[name]
        try:
            with progress.stage(f"auto: {name}"):
                problem = build_problem(graph, params, replace(options, memory_cap_bytes=None))
                if min_depth(problem.model) > params.max_level:
                    continue
                solve_problem(problem)
        except PlanTimeout:
            raise
        except SlotplanError:
            continue  # does not fit this preset (depth, slots): try the next one
        return params
    return PRESETS["n16boot"]


def plan_table_names(plan: Mapping[str, Any]) -> list[str]:
    names: list[str] = []
    for ins in plan["program"]:
        if "table" in ins:
            names.append(ins["table"])
    for p in plan["plaintexts"].values():
        names.append(p["table"])
        if "imag_table" in p:  # a complex plaintext (complex packing)
            names.append(p["imag_table"])
    return list(dict.fromkeys(names))
