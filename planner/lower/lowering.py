"""Lowering: the frozen solution of the choice model rewritten into the plan's program
(conversions, kernels, bootstraps, output masks), with the claims a layout check verifies.
The rewrite never re-decides what the solve chose, as HEIR separates its ILP analysis from
the rewrite."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from common import progress
from planner import ir
from planner.assign.boot_variants import Variant, chosen
from planner.assign.candidates import (
    PlanError,
)
from planner.assign.fold import prescaled_candidate, result_absorbs, scale_operand
from planner.assign.problem import BOOT_BOUND_WARN_BITS, BOOT_PRECISION_BITS, PlanProblem
from planner.ir import PLAN_SCHEMA
from planner.ir.analysis import span_counts, summarize
from planner.ir.builder import LazyTables, ProgramBuilder
from planner.ir.instructions import MAX_BOOT_IN_SCALE, MAX_BOOT_SCALE
from planner.kernels.convert import plan_conversion
from planner.layout.channels import ChannelLayout
from planner.lower.boot_report import node_variants, variant_report
from solver.model import Solution


@dataclass(frozen=True)
class LayoutClaim:
    """What lowering claims about registers: they hold ``tensor`` in ``layout`` (and, when
    the layout is clean, zeros in every other slot).  ``backends.layout_check`` verifies
    every claim of a plan on the simulator's registers instead of trusting the kernels."""

    what: str  # "input x", "node fc1", "conversion x -> fc1"
    tensor: str
    layout: Any
    regs: tuple[str, ...]
    # the registers hold this factor times the tensor (a producer that absorbed a
    # Chebyshev poly's change of variable, planner.assign.fold)
    scale: float = 1.0


def lower_solution(
    problem: PlanProblem, sol: Solution, claims: list[LayoutClaim] | None = None
) -> tuple[dict[str, Any], LazyTables]:
    """The plan of a solved problem.  Each node's entry records the program span it owns
    (its conversions, its kernel, its output mask) and the counts of that span, so the
    per-node numbers add up to the summary.  ``claims`` (when given) receives what the
    lowering asserts about registers, for ``backends.layout_check``."""
    graph, params = problem.graph, problem.params
    S = params.slots
    b = ProgramBuilder(S)
    choice = dict(sol.choice)
    boots = frozenset(sol.boots)
    variants = dict(sol.variants)
    node_variant = node_variants(problem, sol)
    regs: dict[str, list[str]] = {}
    layout_of: dict[str, ChannelLayout] = {}
    claims = claims if claims is not None else []
    for t, opts in problem.input_options.items():
        lay = opts[choice[f"input:{t}"]]
        layout_of[t] = lay
        regs[t] = [
            b.input(t, f"in/{t}/{q}", _map_gen(lay, q)) for q in range(lay.n_ct)
        ]
        claims.append(LayoutClaim(f"input {t}", t, lay, tuple(regs[t])))
    nodes_json: list[dict[str, Any]] = []
    progress.begin("lowering", len(graph.nodes))
    for node in graph.nodes:
        cand = problem.candidates[node.id][choice[node.id]]
        start = len(b.instrs)
        op_regs: dict[str, list[str]] = {}
        conversions = []
        for t in dict.fromkeys(node.inputs):
            if not graph.encrypted(t):
                continue
            conv = plan_conversion(layout_of[t], cand.in_layouts[t])
            op_regs[t] = conv.lower(b, regs[t], f"conv/{node.id}/{t}")
            if t in cand.scale_products:  # its factor a product on the edge (planner.assign.fold)
                op_regs[t] = scale_operand(b, op_regs[t], cand.operand_scales[t])
                claims.append(LayoutClaim(f"scaled operand {t} -> {node.id}", t, cand.in_layouts[t],
                                          tuple(op_regs[t]), cand.operand_scales[t]))
                conversions.append({"operand": t, "kind": "scale", "factor": cand.operand_scales[t]})
            if conv.kind != "none":
                conversions.append({"operand": t, "kind": conv.kind, "rotations": conv.cost().rotations})
                claims.append(LayoutClaim(f"conversion {t} -> {node.id}", t, cand.in_layouts[t], tuple(op_regs[t]),
                                          cand.operand_scales.get(t, 1.0)))
        out_layout = cand.out_layout
        if node.id not in boots:
            prescaled = False
            outs = cand.lower(b, op_regs)
        else:
            var = chosen(variants, node.id)
            s = problem.boot_scales[node.id] if var is None or not var.packed else problem.boot_half_scales[node.id]
            # the bootstrap's 1/s in the node's own plaintext products (the level the model
            # saved: planner.assign.problem._boot_options)
            prescaled = s > 1 and out_layout.clean and result_absorbs(cand, S)
            outs = (prescaled_candidate(cand, 1.0 / s, S) if prescaled else cand).lower(b, op_regs)
            outs, out_layout = _lower_bootstrap(b, outs, out_layout, s, node.id, var, prescaled, start)
        regs[node.id] = outs
        layout_of[node.id] = out_layout
        claims.append(LayoutClaim(f"node {node.id}", node.id, out_layout, tuple(outs), cand.out_scale))
        end = len(b.instrs)
        cv = cand.cost(S)
        nodes_json.append(
            {
                "id": node.id,
                "op": node.op,
                "kernel": cand.kernel,
                "params": cand.params,
                **({"min_cap_bytes": cand.min_cap_bytes} if cand.min_cap_bytes is not None else {}),
                **span_counts(b.objs[start:end], S),
                "span": [start, end],
                "cost": cv.to_json(),
                "in_layouts": [
                    (cand.in_layouts[t].notation() if t in cand.in_layouts else "plaintext")
                    for t in node.inputs
                ],
                "out_layout": out_layout.notation(),
                "conversions": conversions,
                **({"bootstraps": sum(1 for i in b.objs[start:end] if ir.is_bootstrap(i))}
                   if params.boot is not None else {}),
                **({"boot_variant": node_variant[node.id]} if node.id in node_variant else {}),
                **({"boot_prescaled": True} if prescaled else {}),
            }
        )
        progress.advance("lowering", node.id)
    progress.end("lowering")
    for t in graph.outputs:
        lay = layout_of[t]
        for q in range(lay.n_ct):
            b.output(regs[t][q], t, f"out/{t}/{q}", _map_gen(lay, q))
    program = b.instrs
    summary = summarize(b.objs, params, len(b.plaintexts))
    if summary["depth"] > params.max_level:
        raise PlanError(
            f"the plan needs multiplicative depth {summary['depth']} but params {params.name} have "
            f"{params.max_level} levels; choose a preset with more levels"
        )
    summary["memory_cap_bytes"] = problem.options.memory_cap_bytes
    # whether every output ciphertext holds zeros outside its tensor (checked on the
    # simulator's registers by backends.layout_check)
    summary["clean_outputs"] = all(
        layout_of[t].clean for t in graph.outputs if graph.encrypted(t) and t in layout_of
    )
    summary["solver"] = {
        "name": sol.solver,
        "status": sol.status.value,
        "objective": sol.objective,
        "bound": sol.bound,
        "seconds": 0.0,
    }
    summary["plan_seconds"] = 0.0
    if params.boot is not None:
        summary["bootstrapping"] = _boot_report(problem, sol)
    plan = {
        "schema": PLAN_SCHEMA,
        "graph": {"name": graph.name, "sha256": graph.sha256, "spec": graph.to_json()},
        "params": params.to_json(),
        "options": problem.options.to_json(),
        "summary": summary,
        "outputs": {t: list(graph.shape(t)) for t in graph.outputs},
        "nodes": nodes_json,
        "plaintexts": {
            name: p.to_json() for name, p in b.plaintexts.items()
        },
        "program": program,
    }
    return plan, LazyTables(b.tables)




def _lower_bootstrap(
    b: ProgramBuilder, regs: list[str], lay: ChannelLayout, s: int, node_id: str, var: Variant | None = None,
    prescaled: bool = False, start: int = 0,
) -> tuple[list[str], ChannelLayout]:
    """Bootstrap every ciphertext of a node's result, the value brought within the
    bootstrap's range by ``1/s``: by the bootstrap's ``in_scale`` (the source's scale
    relabelled: no product, no level) where the layout is clean; by one pmul by ``1/s`` on
    the layout's slots and 0 on its free slots before it where the layout is dirty (the free
    slots' partial sums have no bound) or for a ``bootstrap2`` (pairs).  After it the value
    is ``s`` times the result: the full bootstrap's ``scale`` (an exact integer product, no
    level) or a variant's unpacking product (its ``scale``).  ``prescaled``: the registers
    already hold the value times ``1/s`` (the node's own plaintext products took it) and the
    layout is clean, so nothing comes before. Where a register was written by a poly of the
    node's own span (from instruction ``start``) that nothing else reads, that product is the
    poly's ``mask`` instead (no level; ``planner.assign.fold.result_masks``)."""
    masked = not lay.clean
    assert not (prescaled and masked)
    # (in_scale has a bound: a larger s takes a product, or the mask of a poly, before it)
    relabel = 1 < s <= MAX_BOOT_IN_SCALE and not prescaled and not masked

    def pre(q: int, r: str) -> str:
        if s > 1 and not prescaled or masked:
            # (a packed variant's 1/s, of the halved budget, gets a table of its own)
            half = var is not None and var.packed
            pt = b.const_plaintext(
                ("boot-in-half" if half else "boot-in", node_id, q),
                f"pt/boot/{node_id}/half/{q}" if half else f"pt/boot/{node_id}/{q}",
                lambda q=q: np.where(lay.index_map(q) >= 0, 1.0 / s, 0.0),  # type: ignore[misc]
            )
            # the node's result a poly's: the mask is the poly's own (no level;
            # planner.assign.problem._boot_options priced it so), else a product
            i = b.maskable_poly(r, start)
            r = b.mask_poly(i, pt) if i is not None else b.rescale(b.pmul(r, pt))
        return r

    scale = float(s) if s > 1 else None
    in_scale = float(s) if relabel else None
    out: list[str] = []
    if var is None:
        # the full bootstrap's integer scale has a bound too: above it, a product by s after
        # (one level; planner.assign.problem._boot_options counts it)
        after = scale is not None and scale > MAX_BOOT_SCALE
        for q, r in enumerate(regs):
            r = b.bootstrap(r if relabel else pre(q, r), scale=None if after else scale, in_scale=in_scale)
            if after:
                pt = b.const_plaintext(("boot-out", node_id, q), f"pt/boot/{node_id}/out/{q}",
                                       lambda q=q: np.where(lay.index_map(q) >= 0, float(s), 0.0))  # type: ignore[misc]
                r = b.rescale(b.pmul(r, pt))
            out.append(r)
        return out, lay.with_clean(True) if masked else lay
    q = 0
    while q < len(regs):
        if var.kind == "p" and q + 1 < len(regs):
            a, c = pre(q, regs[q]), pre(q + 1, regs[q + 1])
            out.extend(b.bootstrap2((a, c), var.log_slots, scale))
            q += 2
            continue
        i = b.maskable_poly(regs[q], start) if var.kind == "h" else None
        if i is not None:
            # halves from a poly of the node's own: the packing (the high half times i) and
            # the 1/s are the poly's complex mask, so nothing comes before the bootstrap
            # (planner.assign.boot_variants.options priced it so: halves_free)
            pack = halves_packing(lay, q, var.log_slots, 1.0 if prescaled or s <= 1 else 1.0 / s)
            pt = b.const_plaintext(("boot-halves", node_id, q, var.log_slots, prescaled),
                                   f"pt/boot/{node_id}/halves{var.log_slots}/{q}", pack[0], pack[1])
            out.append(b.bootstrap(b.mask_poly(i, pt), var.log_slots, True, scale, premasked=True))
            q += 1
            continue
        src = regs[q] if relabel else pre(q, regs[q])
        out.append(b.bootstrap(src, var.log_slots, True if var.kind == "h" else None, scale, in_scale,
                               replicas=var.kind == "r"))
        q += 1
    if var.kind == "r":  # the copies fill the free slots: dirty (its readers ignore them)
        return out, lay.with_clean(False)
    return out, lay.with_clean(True) if masked else lay


def halves_packing(
    lay: ChannelLayout, q: int, log_slots: int, f: float,
) -> tuple[Callable[[], np.ndarray], Callable[[], np.ndarray]]:
    """The real and imaginary parts of the complex mask that packs ciphertext ``q`` of
    ``lay`` for a halves bootstrap at 2^log_slots slots, times ``f``: ``f`` on the used
    slots of ``[0, 2^k)``, ``i f`` on those of ``[2^k, 2^(k+1))``, 0 elsewhere (ir.Bootstrap
    ``premasked``)."""
    n = 1 << log_slots

    def part(lo: int, hi: int) -> Callable[[], np.ndarray]:
        def gen() -> np.ndarray:
            idx = lay.index_map(q)
            s = np.arange(idx.size)
            return np.where((idx >= 0) & (s >= lo) & (s < hi), f, 0.0)

        return gen

    return part(0, n), part(n, 2 * n)


def _boot_report(problem: PlanProblem, sol: Solution) -> dict[str, Any]:
    """What a bootstrapping plan assumes and how its placement compares with first fit."""
    m = problem.model
    choice = dict(sol.choice)
    lazy = m.lazy_boots(choice)
    greedy, greedy_lazy = m.greedy_boots()
    ranges = problem.ranges

    def n_boot(groups: frozenset[str] | None, ch: Mapping[str, int]) -> int | None:
        return None if groups is None else sum(m.group(g).n_ct(ch[g]) for g in groups)

    scales = {v: problem.boot_scales[v] for v in sorted(sol.boots) if problem.boot_scales.get(v, 1) > 1}
    # Lattigo's bootstrap keeps about 21 bits relative to the bound of what it refreshes;
    # a loose bound (interval arithmetic through many layers) leaves values of order 1 fewer
    def warn(v: str, s: int) -> str | None:
        bound = ranges.bound(v) if ranges else None
        if bound is None or bound <= 2.0**BOOT_BOUND_WARN_BITS:
            return None
        left = max(0, BOOT_PRECISION_BITS - math.ceil(math.log2(bound)))
        return (f"the bootstrap of {v!r} scales by 2^{s.bit_length() - 1} (worst-case bound {bound:.3g}): Lattigo keeps "
                f"~{BOOT_PRECISION_BITS} bits relative to that bound, so values of order 1 keep about {left}; "
                "give the graph's nodes measured `range`s for a tighter bound")

    warnings = [w for v, s in scales.items() if (w := warn(v, s)) is not None]
    return {
        "values": sorted(sol.boots),
        "scales": scales,
        **({"warnings": warnings} if warnings else {}),
        "bounds": {v: ranges.bound(v) for v in sorted(sol.boots)} if ranges is not None else {},
        "assumed_ranges": {t: list(iv) for t, iv in sorted(ranges.assumed.items())} if ranges is not None else {},
        "max_abs": problem.params.boot.max_abs if problem.params.boot is not None else None,
        # first fit (bootstrap an operand only when its reader would not fit, as late as
        # possible) on the same layouts, and on the greedy layouts
        "first_fit": {"values": None if lazy is None else len(lazy), "bootstraps": n_boot(lazy, choice)},
        "first_fit_greedy_layouts": {
            "values": None if greedy_lazy is None else len(greedy_lazy),
            "bootstraps": n_boot(greedy_lazy, greedy),
        },
        # issue 36: each bootstrap's variant and its modelled saving (when variants were offered)
        **variant_report(problem, sol),
    }


def _map_gen(lay: ChannelLayout, q: int):  # noqa: ANN202
    def gen() -> tuple[np.ndarray, None]:
        return lay.index_map(q).copy(), None

    return gen
