"""Rotation-key memory management: a post-pass that inserts ``load_key``/``drop_key``.

Input: a planned straight-line program (shared/SPEC.md section 4).  Output: the same
program (same SSA registers; a rotation rewrite adds registers) with a key schedule, so
that every ``rot`` (and every offset of a ``rot_hoisted``, all at once) runs while its key
is resident and the modelled memory (resident keys + live ciphertexts + resident
plaintexts, the :func:`planner.ir.analysis.memory_profile` model with each key at its own
size) never exceeds the cap.

Residency strategies:

* ``keep-all`` - ANT-ACE / Orion: every key loaded up front and kept.
* ``keymemrt`` - KeyMemRT (Unay et al.): a key per rotation (load before, drop after), then
  live ranges of one key are merged when the next use is within ``merge_window`` (10)
  operations (its "Merge Rotation Keys" pass); optional prefetch moves loads earlier
  (its Balanced mode).  Under a cap, merges that would exceed it are undone.
* ``belady`` - furthest-next-use eviction under the cap (lazy loads, dead keys dropped
  at their last use).  Optimal in loads when all keys have one size.
* ``exact`` - CP-SAT over key-liveness intervals with a cumulative capacity constraint
  (:mod:`solver.keys_model`): minimum loads, then minimum peak; z3 cross-checks small cases.
* ``pow2`` - Fhelipe: every offset decomposed into power-of-two rotations (at most
  log2(slots) keys), all keys kept.  Changes the rotation count.

``max_keys`` rewrites offsets as chains over a basis of at most N keys (power-of-two,
NAF or a BSGS-style baby/giant basis, completed with the most used direct offsets) and
works with every residency strategy.

Keys by level: a key only ever used on ciphertexts at level <= l is generated at level
l (``Params.rotation_key_bytes(l)``), l = the highest level it rotates
(level = max_level - depth, :func:`planner.ir.analysis.register_depths`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from common import progress
from planner import ir
from planner.cost.process import Reserve, executor_reserve, executor_series, plan_process_model, summary_field
from planner.frontend.params import Params
from planner.ir import boot_block
from planner.ir.analysis import (
    default_key_level,
    register_depths,
    remap_spans,
    rotation_key_levels,
    span_counts,
    summarize,
)
from planner.ir.fused_plan import annotate
from planner.keys.basis import BASES, _sites, choose_basis, rewrite_rotations
from planner.keys.profile import (
    EXECUTOR_SERIES,
    KeyCapError,
    KeyScheduleError,
    _is_key_op,
    _rot_keys,
    base_profile,
    key_memory_profile,
)
from planner.keys.residency import (
    KEY_STRATEGIES,
    MERGE_WINDOW,
    STRATEGIES,
    BlockSpan,
    KeyStrategy,
    StrategyKnobs,
    _boot_spans,
    _Ctx,
    _emit,
    _verify,
    keep_giant_keys,
)

__all__ = [
    "BASES",
    "MERGE_WINDOW",
    "KEY_STRATEGIES",
    "STRATEGIES",
    "KeyCapError",
    "KeyInfo",
    "KeySchedule",
    "KeyScheduleError",
    "base_profile",
    "choose_basis",
    "key_memory_profile",
    "rewrite_rotations",
    "schedule_keys",
    "schedule_plan",
]


@dataclass(frozen=True)
class KeyInfo:
    k: int
    level: int
    bytes: int
    uses: int  # instructions that need the key
    loads: int

    def to_json(self) -> dict[str, int]:
        return {"level": self.level, "bytes": self.bytes, "uses": self.uses, "loads": self.loads}


@dataclass
class KeySchedule:
    program: list[dict[str, Any]]
    strategy: str
    cap_bytes: int | None
    keys: dict[int, KeyInfo]
    loads: int
    rotations: int
    rotations_before: int
    rotation_keys_before: int
    peak_bytes: dict[str, int]
    min_cap_bytes: int  # smallest cap this strategy (with this rewrite) can meet
    basis: list[int] | None = None  # the key basis when offsets were rewritten
    chains: dict[int, list[int]] = field(default_factory=dict)  # offset -> steps (rewritten only)
    solver: dict[str, Any] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    # joint strategy: hoisted sub-groups split off, and the modelled time (planner.keys.joint)
    splits: int | None = None
    time_ms: dict[str, float] | None = None

    @property
    def rotation_keys(self) -> int:
        return len(self.keys)

    def key_levels(self) -> dict[int, int]:
        return {k: i.level for k, i in self.keys.items()}

    def key_bytes(self) -> dict[int, int]:
        return {k: i.bytes for k, i in self.keys.items()}

    def keys_json(self) -> dict[str, dict[str, int]]:
        return {str(k): self.keys[k].to_json() for k in sorted(self.keys)}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "strategy": self.strategy,
            "memory_cap_bytes": self.cap_bytes,
            "min_feasible_cap_bytes": self.min_cap_bytes,
            "key_loads": self.loads,
            "rotations": self.rotations,
            "rotations_before": self.rotations_before,
            "rotation_keys": self.rotation_keys,
            "rotation_keys_before": self.rotation_keys_before,
            "key_bytes_total": sum(i.bytes for i in self.keys.values()),
            "options": self.options,
        }
        if self.basis is not None:
            out["basis"] = self.basis
            out["chains"] = {str(k): v for k, v in sorted(self.chains.items())}
        if self.solver is not None:
            out["solver"] = self.solver
        if self.splits is not None:
            out["hoisted_splits"] = self.splits
        if self.time_ms is not None:
            out["modelled_time_ms"] = self.time_ms
        return out


def schedule_keys(
    program: Sequence[Mapping[str, Any]],
    params: Params,
    cap_bytes: int | None,
    strategy: str,
    max_keys: int | None = None,
    *,
    basis: str = "auto",
    key_levels: bool = True,
    merge_window: int = MERGE_WINDOW,
    prefetch: int | None = None,
    time_limit_s: float = 10.0,
    cross_check: bool = False,
) -> KeySchedule:
    """Insert a key schedule into ``program`` (any existing ``load_key``/``drop_key`` are
    replaced).  Raises :class:`KeyCapError` (naming the smallest feasible cap) when
    ``cap_bytes`` is below what the strategy needs at some step."""
    strat = KEY_STRATEGIES.create(strategy)
    if ir.uses_conjugation(ir.decode_program(program)):
        raise KeyScheduleError("the program conjugates (complex packing): key schedules do not place the "
                               "conjugation key; run it keep-all (no memory cap)")
    if cap_bytes is not None and cap_bytes <= 0:
        raise KeyScheduleError(f"memory cap must be positive, got {cap_bytes}")
    if prefetch is None:  # the joint strategy prefetches by default (KeyMemRT's balanced mode)
        from planner.keys.joint import MAX_PREFETCH

        prefetch = MAX_PREFETCH if strat.plans_program else 0
    if merge_window < 0 or prefetch < 0:
        raise KeyScheduleError("merge window and prefetch distance must be non-negative")
    prog = [dict(i) for i in program if not _is_key_op(i)]
    sites = _sites(prog)
    rotations_before = sum(len(s) for s in sites)
    keys_before = len({k for s in sites for k in s})
    chosen: list[int] | None = None
    chains: dict[int, list[int]] = {}
    basis_name = None
    if strat.pow2_basis or max_keys is not None:
        family = "pow2" if strat.pow2_basis and basis == "auto" else basis
        bset, paths, basis_name = choose_basis(prog, params.slots, max_keys, family)
        if basis_name != "direct":
            prog, chains = rewrite_rotations(prog, paths)
            chosen = sorted(bset)
    if strat.plans_program and _boot_spans(prog, params, False) != [None]:
        # a bootstrapping program: the joint model does not place the key block 'boot' yet;
        # its residency is scheduled exactly (hoisted groups stay whole)
        strat = KEY_STRATEGIES.create("exact")
    if strat.plans_program:
        knobs = StrategyKnobs(
            merge_window, prefetch, time_limit_s, cross_check, max_keys, basis_name, rewritten=max_keys is not None,
        )
        return _schedule_joint(prog, params, cap_bytes, strategy, knobs, key_levels, rotations_before, keys_before,
                               chosen, chains)
    depth = register_depths(prog)
    # a bootstrapping program: the block 'boot' resident for the whole program (its keys
    # then serve every rotation of their offsets) when the cap allows, else from the first
    # to the last bootstrap
    spans = _boot_spans(prog, params, strat.keeps_all)
    errors: list[KeyCapError] = []
    for block in spans:
        try:
            return _schedule_with_block(
                prog, params, cap_bytes, strategy, strat, depth, block, chosen, chains, basis_name,
                rotations_before, keys_before, max_keys, key_levels, merge_window, prefetch, time_limit_s,
                cross_check,
            )
        except KeyCapError as e:
            errors.append(e)
    raise min(errors, key=lambda e: e.min_cap)


def _schedule_with_block(
    prog: list[dict[str, Any]], params: Params, cap_bytes: int | None, strategy: str, strat: KeyStrategy,
    depth: Mapping[str, int], block: BlockSpan | None, chosen: list[int] | None,
    chains: dict[int, list[int]], basis_name: str | None, rotations_before: int, keys_before: int,
    max_keys: int | None, key_levels: bool, merge_window: int, prefetch: int, time_limit_s: float,
    cross_check: bool,
) -> KeySchedule:
    L = params.max_level
    uses: dict[int, list[int]] = {}
    need: list[list[int]] = []
    level: dict[int, int] = {}
    use_level = rotation_key_levels(prog, L)
    # the block of this plan: the full bootstrap's and its variants' keys and matrices
    used = boot_block.variants_used(prog, params)
    offsets = boot_block.block_offsets(params, used)
    for i, ins in enumerate(prog):
        ks = sorted(set(_rot_keys(ins)))
        if block is not None and block.stream is None and block.covers(i) and params.boot is not None:
            # the block's own Galois keys serve these offsets while it is resident (a
            # streamed block's serve only its bootstraps)
            ks = [k for k in ks if k not in offsets]
        need.append(ks)
        for k in ks:
            uses.setdefault(k, []).append(i)
            use = use_level[i]
            lv = use if key_levels and use is not None else default_key_level(prog, params)
            level[k] = max(level.get(k, 0), lv)
    size = {k: params.rotation_key_bytes(level[k]) for k in uses}
    base = base_profile(prog, params, depth)
    block_bytes = boot_block.block_bytes(params, used, block.stream) if block is not None else 0
    if block is not None:
        for i in range(block.first, block.last + 1):
            base[i] += block_bytes
    ctx = _Ctx(len(prog), uses, need, size, base, cap_bytes)
    # smallest cap each strategy can meet, and where it binds
    if strat.keeps_all:
        all_keys = sum(size.values())
        i_max = max(range(len(prog)), key=lambda i: base[i]) if prog else 0
        min_cap = (base[i_max] if prog else 0) + all_keys
        where = (
            f"keeping all {len(size)} keys ({all_keys} bytes) resident, instruction {i_max} "
            f"({ir.op_name(prog[i_max]) if prog else '-'}) peaks at {min_cap} bytes"
        )
        if block_bytes:
            where += f" (with the bootstrapping key block and DFT matrices, {block_bytes} bytes)"
    else:
        needs = [base[i] + sum(size[k] for k in need[i]) for i in range(len(prog))]
        i_max = max(range(len(prog)), key=lambda i: needs[i]) if prog else 0
        min_cap = needs[i_max] if prog else 0
        in_block = block is not None and block.covers(i_max)
        held = (base[i_max] if prog else 0) - (block_bytes if in_block else 0)
        where = (
            f"instruction {i_max} ({ir.op_name(prog[i_max]) if prog else '-'}) alone needs {min_cap} bytes "
            f"(ciphertexts and plaintexts {held}, "
            + (f"the bootstrapping key block and DFT matrices {block_bytes}"
               + (f" (its Galois keys streamed, {block.stream} read ahead)" if block is not None and block.stream is not None
                  else "") + ", " if in_block else "")
            + f"its keys {min_cap - (base[i_max] if prog else 0)})"
        )
    if cap_bytes is not None and cap_bytes < min_cap:
        raise KeyCapError(cap_bytes, min_cap, strategy, where)
    knobs = StrategyKnobs(
        merge_window, prefetch, time_limit_s, cross_check, max_keys, basis_name,
        rewritten=strat.pow2_basis or max_keys is not None,
    )
    intervals, solver_info = strat.intervals(ctx, knobs)
    if strat.keeps_blocks:
        intervals, kept, cut = keep_giant_keys(prog, intervals, size, base, cap_bytes, params.slots)
        solver_info = {**(solver_info or {}), "blocks_kept_whole": kept, "blocks_split": cut}
    new = _emit(prog, intervals, drop_at_end=not strat.keeps_all, block=block)
    peak = _verify(new, params, size, cap_bytes)
    loads_per: dict[int, int] = {}
    for k, _, _ in intervals:
        loads_per[k] = loads_per.get(k, 0) + 1
    keys = {k: KeyInfo(k, level[k], size[k], len(uses[k]), loads_per.get(k, 0)) for k in sorted(uses)}
    options: dict[str, Any] = {"key_levels": key_levels, **strat.options(knobs)}
    return KeySchedule(
        program=new,
        strategy=strategy,
        cap_bytes=cap_bytes,
        keys=keys,
        loads=sum(loads_per.values()),
        rotations=sum(len(s) for s in _sites(prog)),
        rotations_before=rotations_before,
        rotation_keys_before=keys_before,
        peak_bytes=peak,
        min_cap_bytes=min_cap,
        basis=chosen,
        chains=chains,
        solver=solver_info,
        options=options,
    )


def _schedule_joint(
    prog: list[dict[str, Any]], params: Params, cap_bytes: int | None, strategy: str, knobs: StrategyKnobs,
    key_levels: bool, rotations_before: int, keys_before: int, basis: list[int] | None, chains: dict[int, list[int]],
) -> KeySchedule:
    from planner.keys.joint import JointChoice, plan_joint

    ch = plan_joint(prog, params, cap_bytes, key_levels=key_levels, time_limit_s=knobs.time_limit_s,
                    cross_check=knobs.cross_check, prefetch=knobs.prefetch)
    if not isinstance(ch, JointChoice):
        min_cap, where = ch
        raise KeyCapError(int(cap_bytes or 0), int(min_cap), strategy, str(where))
    new = _emit(ch.program, ch.intervals, drop_at_end=True)
    peak = _verify(new, params, ch.size, cap_bytes)
    loads_per: dict[int, int] = {}
    for k, _, _ in ch.intervals:
        loads_per[k] = loads_per.get(k, 0) + 1
    keys = {k: KeyInfo(k, ch.level[k], ch.size[k], len(ch.uses[k]), loads_per.get(k, 0)) for k in sorted(ch.uses)}
    return KeySchedule(
        program=new,
        strategy=strategy,
        cap_bytes=cap_bytes,
        keys=keys,
        loads=sum(loads_per.values()),
        rotations=sum(len(s) for s in _sites(ch.program)),
        rotations_before=rotations_before,
        rotation_keys_before=keys_before,
        peak_bytes=peak,
        min_cap_bytes=ch.min_cap,
        basis=ch.basis if ch.basis is not None else basis,
        chains={**chains, **ch.chains},
        solver=ch.solver,
        options={"key_levels": key_levels, **KEY_STRATEGIES.create(strategy).options(knobs)},
        splits=ch.splits,
        time_ms=ch.time.to_json() if ch.time is not None else None,
    )


def program_sha256(program: Sequence[Mapping[str, Any]]) -> str:
    """Digest of a program without its key schedule (identifies the planned program a
    schedule was derived from)."""
    core = [i for i in program if not _is_key_op(i)]
    return hashlib.sha256(json.dumps(core, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def schedule_plan(
    plan: Mapping[str, Any],
    cap_bytes: int | None,
    strategy: str,
    max_keys: int | None = None,
    process: bool = False,
    **kwargs: Any,
) -> tuple[dict[str, Any], KeySchedule]:
    """A copy of ``plan`` with a key schedule: new program, ``keys`` (level and bytes per
    key) and an updated summary (rotations, rotation_keys, key_loads, peak_bytes,
    memory_cap_bytes, instructions, key_schedule). ``process``: the cap bounds the process
    model (planner.cost.process; ``slotplan plan --memory-cap``), and the summary gets
    ``process_peak_bytes``; otherwise the plan's own memory model (``slotplan keys``)."""
    params = Params.from_json(plan["params"])
    source = plan.get("summary", {}).get("key_schedule", {}).get("source_program_sha256")
    if cap_bytes is None or not process:
        with progress.stage("key schedule"):
            sched = schedule_keys(plan["program"], params, cap_bytes, strategy, max_keys, **kwargs)
        return _with_schedule(plan, sched, cap_bytes, source, params), sched
    # the cap bounds the process model (planner.cost.process): the plan's own terms keep to
    # what the executor's state (its largest, at every step) and the bootstraps' garbage leave
    # of it; the process model of the scheduled plan is then evaluated step by step, and the
    # plan's cap moved by the difference (down when over the cap, up while the held-back
    # executor state left more than PROCESS_SLACK of it unused), PROCESS_RETRIES schedules at most
    reserve = executor_reserve(plan, stepwise=True)
    token = EXECUTOR_SERIES.set(executor_series(plan))
    try:
        return _schedule_under_process_cap(plan, cap_bytes, strategy, max_keys, reserve, source, params, **kwargs)
    finally:
        EXECUTOR_SERIES.reset(token)


def _schedule_under_process_cap(
    plan: Mapping[str, Any], cap_bytes: int, strategy: str, max_keys: int | None, reserve: Reserve,
    source: Any, params: Params, **kwargs: Any,
) -> tuple[dict[str, Any], KeySchedule]:
    """:func:`schedule_plan`'s loop under a process cap, the executor's fused blocks in the
    base profile step by step (:data:`planner.keys.profile.EXECUTOR_SERIES`)."""
    plan_cap = reserve.plan_cap(cap_bytes)
    extra = 0  # taken off the plan's cap by retries
    best: tuple[dict[str, Any], KeySchedule] | None = None
    tried: set[int] = set()
    for _ in range(PROCESS_RETRIES):
        tried.add(plan_cap)
        try:
            if plan_cap <= 0:
                schedule_keys(plan["program"], params, 1, strategy, max_keys, **kwargs)
            with progress.stage("key schedule"):
                sched = schedule_keys(plan["program"], params, plan_cap, strategy, max_keys, **kwargs)
        except KeyCapError as e:
            if best is not None:
                break
            raise KeyCapError(
                cap_bytes, reserve.process_cap(e.min_cap) + extra, e.strategy,
                f"{e.where} (the fused blocks' state counted step by step); beside it the executor holds "
                f"{reserve.bytes} bytes"
                + (f" and the bootstraps' garbage up to {reserve.slack(cap_bytes)}" if reserve.alloc_bytes else "")
                + " (the process model, docs/lattigo.md)") from None
        new = _with_schedule(plan, sched, cap_bytes, source, params)
        pm = plan_process_model(new)
        growth = int(pm["growth"])
        if growth <= cap_bytes:
            new["summary"]["process_peak_bytes"] = summary_field(pm)
            new["summary"]["key_schedule"]["plan_cap_bytes"] = plan_cap
            best = (new, sched)
            if cap_bytes - growth <= PROCESS_SLACK * cap_bytes or sched.loads == 0:
                break
        elif best is not None:
            break
        else:
            extra += growth - cap_bytes
        plan_cap += cap_bytes - growth
        if plan_cap in tried:
            break
    if best is not None:
        return best
    raise KeyCapError(cap_bytes, int(pm["growth"]) + extra, strategy,
                      f"the process model of the scheduled plan stays at {pm['growth']} bytes after "
                      f"{PROCESS_RETRIES} schedules")


# Schedules tried under a cap until the process model of the result fits it, and the part
# of the cap it may leave unused before the plan's cap is raised by it.
PROCESS_RETRIES = 3
PROCESS_SLACK = 0.02


def _with_schedule(plan: Mapping[str, Any], sched: KeySchedule, cap_bytes: int | None, source: str | None,
                   params: Params) -> dict[str, Any]:
    new = dict(plan)
    new["program"] = sched.program
    summary = dict(plan.get("summary", {}))
    counts = summarize(sched.program, params, len(plan.get("plaintexts", {})))
    for key in ("rotations", "rotation_keys", "key_loads", "instructions"):
        summary[key] = counts[key]
    summary["peak_bytes"] = sched.peak_bytes
    summary["memory_cap_bytes"] = cap_bytes
    ks = sched.to_json()
    if isinstance(ks.get("solver"), dict):  # wall-clock: plans stay byte-for-byte deterministic
        ks["solver"] = {k: v for k, v in ks["solver"].items() if k != "seconds"}
    ks["source_program_sha256"] = source or program_sha256(plan["program"])
    ks["memory_cap_bytes"] = cap_bytes
    summary["key_schedule"] = ks
    new["summary"] = summary
    new["keys"] = sched.keys_json()
    nodes = plan.get("nodes") or []
    if nodes and all("span" in n for n in nodes):
        # the schedule inserted loads and drops (and may have re-expressed rotations):
        # each node keeps what it owns, so the per-node counts still add up
        spans = remap_spans(plan["program"], [n["span"] for n in nodes], sched.program)
        new["nodes"] = [
            {**n, **span_counts(sched.program[a:z], plan["params"].get("slots")), "span": [a, z]}
            for n, (a, z) in zip(nodes, spans, strict=True)
        ]
    if "fused" in new:  # the annotation names instructions of the old program: decided anew
        annotate(new)
    return new
