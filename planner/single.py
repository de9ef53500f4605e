"""Planning one sample: graph -> candidates -> choice model -> solver -> plan (-> key
schedule under a memory cap).  :mod:`planner.batch` plans B samples on top of it and
:mod:`planner.pipeline` is the entry point that chooses between them."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from common import progress
from planner.assign.candidates import (
    PlanError,
)
from planner.assign.options import (
    PlanOptions,
)
from planner.assign.problem import PlanProblem, build_problem
from planner.assign.solve import PlanTimeout, PlanWallTimeout, solve_problem
from planner.frontend.graph import Graph
from planner.frontend.params import Params
from planner.ir.builder import LazyTables
from planner.ir.fused_plan import annotate
from planner.lower.lowering import LayoutClaim, lower_solution
from solver.model import Solution, Status

if TYPE_CHECKING:
    from planner.keys.profile import KeyCapError


@dataclass
class PlanResult:
    plan: dict[str, Any]
    tables: LazyTables
    solution: Solution
    problem: PlanProblem
    seconds: float
    claims: list[LayoutClaim] = field(default_factory=list)
    # a plan of several samples (planner/batch.py): its geometry; claims then speak of
    # tensors with a leading sample dimension (padding blocks included)
    batch: Any = None


def plan_single(
    graph: Graph, params: Params, options: PlanOptions | None = None, record_timings: bool = False,
    wall_limit_s: float | None = None, wall_started: float | None = None,
) -> PlanResult:
    """Plan one sample of a graph: candidates, choice model, solve, lowering, and the key
    schedule under a memory cap.  Timings go to PlanResult.seconds and solution.seconds; the plan
    document records them only with ``record_timings`` (plans are byte-for-byte
    deterministic by default).  ``wall_limit_s`` bounds the whole planning (candidates,
    pricing, solve, lowering, key schedule) in wall time, counted from ``wall_started`` (a
    ``time.monotonic()`` reading; default: the call) so that callers can include reading the
    graph: past it, :class:`PlanWallTimeout` names the step where planning stopped (the
    solver's limit is capped by what is left)."""
    options = options or PlanOptions()
    assert options.batch is None, "a batched request goes through planner.batch"
    t0 = time.perf_counter()
    from planner.frontend.params import check_security

    insecure = check_security(params, options.allow_insecure)
    claims: list[LayoutClaim] = []
    try:
        with progress.deadline(wall_limit_s, wall_started):
            problem, sol, plan, tables = _solved(graph, params, options, claims)
            if options.memory_cap_bytes is not None:
                # rotation-key schedule under the cap (planner.keys.joint: key set, hoisted-group
                # splits and residency chosen together for the smallest modelled time; raises
                # KeyCapError naming the smallest feasible cap); every table stays valid
                from planner.keys.profile import KeyCapError

                try:
                    plan = _scheduled(plan, options)
                except KeyCapError as e:
                    err: KeyCapError | None = e
                    # (a plan with bootstrap variants falls back to the full-slot plan below,
                    # which does this itself)
                    least = None if sol.variants else build_problem(graph, params, options, least_memory=True)
                    if least is not None and _counts(least) != _counts(problem):
                        # the candidates the cap let through need more than it (the cut counts
                        # a candidate's own working set, not the executor's state around it):
                        # the plan of the candidates that need the least, whose smallest
                        # feasible cap the refusal names whatever cap was asked
                        lclaims: list[LayoutClaim] = []
                        problem, sol, plan, tables = _solved(graph, params, options, lclaims, least)
                        claims = lclaims
                        try:
                            plan = _scheduled(plan, options)
                            err = None
                        except KeyCapError as e2:
                            err = e2
                    if err is not None:
                        if not sol.variants:
                            raise err from None
                        # issue 36: the bootstrap variants' keys and DFT matrices do not fit
                        # the cap: the plan without the variants worth the least per byte
                        # (their slot counts left out of the options' boot_variant_slots),
                        # and without any (the full-slot plan, its options say boot_variants
                        # false) when none is left; with why
                        slim, why = fewer_variants(plan, params, options, err)
                        return with_warning(plan_single(graph, params, slim, record_timings, wall_limit_s,
                                                        wall_started), why)
                progress.check("key schedule")
    except progress.DeadlineExceeded as e:
        raise PlanWallTimeout(str(e)) from None
    # the fused blocks the Lattigo executor runs, decided once here (planner.ir.fused_plan)
    annotate(plan)
    seconds = time.perf_counter() - t0
    if insecure:
        plan["summary"]["insecure"] = True
    if record_timings:
        plan["summary"]["solver"]["seconds"] = round(sol.seconds, 6)
        plan["summary"]["plan_seconds"] = round(seconds, 6)
    return PlanResult(plan, tables, sol, problem, seconds, claims)


def fewer_variants(plan: Mapping[str, Any], params: Params, options: PlanOptions,
                   err: KeyCapError) -> tuple[PlanOptions, str]:
    """One step of the ladder (:func:`_variants_within`): the options of the plan to try
    next, whose key schedule failed with ``err``, and the warning that says why. ``params``:
    the ring the plan's variants are counted on (a batch's block ring: the warning names
    the real ring's slot counts)."""
    kept, dropped = _variants_within(plan, params, err.min_cap, err.cap, options.boot_variant_slots)
    tail = (f"with them the plan needs at least {err.min_cap} bytes, above the memory cap (their keys and DFT "
            "matrices join the key block 'boot')")
    if not kept:
        return replace(options, boot_variants=False, boot_variant_slots=None), f"bootstrap variants not used: {tail}"
    slots = ", ".join(f"2^{k + params.variant_shift}" for k in dropped)
    return replace(options, boot_variant_slots=kept), f"bootstrap variants at {slots} slots not used: {tail}"


def with_warning(res: PlanResult, why: str) -> PlanResult:
    """``res`` with ``why`` first among its bootstrapping warnings."""
    bt = res.plan["summary"].get("bootstrapping")
    if bt is not None:
        bt.setdefault("warnings", []).insert(0, why)
    return res


def _variants_within(plan: Mapping[str, Any], params: Params, need: int, cap: int,
                     allowed: tuple[int, ...] | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The variant slot counts a capped plan may still use (and those it drops) when with
    its variants it needs ``need`` bytes, more than ``cap``. Each variant adds its keys and
    DFT matrices to the block (``boot_block.added_bytes``). Dropped: every variant that adds
    more than the room the plan leaves for variants (the cap less what the plan needs
    without the variants it uses), which fits no plan; then, of the variants the plan uses,
    those with the least modelled saving against the full-slot bootstrap per byte, until
    the bytes dropped cover the excess. Every other slot count ``allowed`` (None: all the
    params offer) stays a choice. The plan without the dropped ones is planned again, and
    drops more the same way if it still does not fit: each step leaves out one slot count
    or more, so the ladder ends, at worst in the full-slot plan."""
    from planner.assign.boot_variants import Variant
    from planner.ir import boot_block

    offered = {v.log_slots: v for v in params.boot.variants} if params.boot is not None else {}
    choice = set(offered) if allowed is None else set(allowed) & set(offered)
    used = {v.log_slots for v in boot_block.variants_used(plan["program"], params)}
    if not used:  # no variant in the plan: nothing of theirs to leave out but all
        return (), ()
    size = {k: max(1, boot_block.added_bytes(params, [offered[k]])) for k in choice | used}
    saving: dict[int, float] = dict.fromkeys(used, 0.0)
    for r in ((plan.get("summary") or {}).get("bootstrapping") or {}).get("per_bootstrap") or []:
        v = Variant.parse(str(r.get("variant")))
        if v is not None and v.log_slots in saving:
            saving[v.log_slots] += float(r.get("saving_seconds") or 0.0)
    room = cap - (need - boot_block.added_bytes(params, [offered[k] for k in sorted(used)]))
    dropped = {k for k in choice | used if size[k] > room}
    freed = sum(size[k] for k in dropped & used)
    for k in sorted(used - dropped, key=lambda k: (saving[k] / size[k], k)):
        if freed >= need - cap:
            break
        dropped.add(k)
        freed += size[k]
    if not dropped & used:  # (the bytes are estimates: leave one out whatever they say)
        dropped.add(min(used, key=lambda k: (saving[k] / size[k], k)))
    return tuple(sorted(choice - dropped)), tuple(sorted(dropped & (choice | used)))


def _solved(graph: Graph, params: Params, options: PlanOptions, claims: list[LayoutClaim],
            least: PlanProblem | None = None) -> tuple[PlanProblem, Solution, dict[str, Any], LazyTables]:
    """Choice model (``least``: the one built with only the least-memory candidates), solve
    and lowering."""
    problem = least if least is not None else build_problem(graph, params, options)
    try:
        sol = solve_problem(problem)
    except PlanError as e:
        # under a cap, the candidates were cut to those that fit it: when that leaves no
        # assignment within the levels, plan without the cut and let the key schedule
        # name the smallest feasible cap (or fit the cap after all)
        if options.memory_cap_bytes is None or problem.model.max_depth is None:
            raise
        problem = build_problem(graph, params, replace(options, memory_cap_bytes=None))
        try:
            sol = solve_problem(problem)
        except PlanError:
            raise e from None
    if sol.status is Status.UNKNOWN:
        raise PlanTimeout(f"the solver found no plan within {options.time_limit_s} s; raise --time-limit")
    plan, tables = lower_solution(problem, sol, claims)
    return problem, sol, plan, tables


def _scheduled(plan: dict[str, Any], options: PlanOptions) -> dict[str, Any]:
    """``plan`` with its key schedule under ``options.memory_cap_bytes`` on the process model."""
    from planner.keys.schedule import schedule_plan

    assert options.memory_cap_bytes is not None
    left = progress.remaining()
    new, _ = schedule_plan(
        plan, options.memory_cap_bytes, "joint", process=True,
        time_limit_s=options.time_limit_s if left is None else max(0.05, min(options.time_limit_s, left)),
    )
    return new


def _counts(problem: PlanProblem) -> dict[str, int]:
    """Candidates per node after the cut, before dominated ones are pruned (a cut keeps a
    superset of the least-memory cut's)."""
    return {n: len(cs) for n, cs in problem.all_candidates.items()}
