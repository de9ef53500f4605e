"""What a plan's bootstrap variants save (issue 36): per bootstrapped value its variant
(``full``, ``s<k>``, ``h<k>``, ``p<k>``; planner.assign.boot_variants), its ciphertexts and
instructions, the modelled seconds of those instructions and of the full-slot bootstrap of
the same ciphertexts, and the saving.  The seconds are the cost table's per instruction
(``weights.bootstrap`` per ciphertext, ``boot_variants`` per variant instruction) in the
time model of the plan (planner.cost.timing); the levels around a bootstrap (the mask or
1/s before it, the full bootstrap's scaling after it) are not in them."""

from __future__ import annotations

from typing import Any

from planner.assign import boot_variants
from planner.assign.problem import PlanProblem
from planner.cost.timing import TimeModel, time_model
from solver.model import FULL, Solution


def variant_report(problem: PlanProblem, sol: Solution) -> dict[str, Any]:
    """``per_bootstrap`` (model order) and the plan's totals; empty when no variant was on
    offer (the plan's report stays as it was)."""
    if not problem.boot_prices or not sol.boots:
        return {}
    tm = TimeModel(problem.costs) if problem.costs.is_time else time_model(problem.params)
    sec = tm.ms_per_unit / 1000.0
    choice = dict(sol.choice)
    variants = dict(sol.variants)
    rows = []
    for name in sol.boots:
        cand = problem.candidates[name][choice[name]]
        n = cand.out_layout.n_ct
        full = tm.bootstrap * n * sec
        label = variants.get(name, FULL)
        v = boot_variants.Variant.parse(label) if label != FULL else None
        if v is None:
            count, seconds = n, full
        else:
            ins = boot_variants.instructions(v.kind, n)
            count = sum(ins.values())
            seconds = sum(c * problem.boot_prices[f"{k}{v.log_slots}"] for k, c in ins.items() if c) * sec
        rows.append({
            "node": name, "variant": label,
            "kind": "full" if v is None else boot_variants.KINDS[v.kind],
            **({"log_slots": v.log_slots} if v is not None else {}),
            "ciphertexts": n, "instructions": count,
            "seconds": round(seconds, 4), "full_seconds": round(full, 4), "saving_seconds": round(full - seconds, 4),
        })
    return {
        "per_bootstrap": rows,
        "variants_offered": sorted(problem.boot_prices),
        "seconds": round(sum(r["seconds"] for r in rows), 4),
        "full_slot_seconds": round(sum(r["full_seconds"] for r in rows), 4),
        "variant_saving_seconds": round(sum(r["saving_seconds"] for r in rows), 4),
    }


def node_variants(problem: PlanProblem, sol: Solution) -> dict[str, str]:
    """Each bootstrapped node's variant label when variants were on offer (the plan's node
    entries carry it as ``boot_variant``; ``slotplan diff`` explains a change)."""
    if not problem.boot_prices:
        return {}
    variants = dict(sol.variants)
    return {b: variants.get(b, FULL) for b in sol.boots}
