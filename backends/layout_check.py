"""Check what lowering claims about slots against the registers the program computes.

Every kernel and conversion states a layout for the registers it produces: which tensor
element sits in which slot and, when the layout is clean, that every other slot is zero.
Those claims are what consumers rely on (a matvec reads free slots as zeros), so they are
not trusted: this module runs the plan in the simulator on given values, keeps every
claimed register, and compares each with the numpy reference of its tensor.  The slot
hygiene rule (``planner.layout.channels.clean_result``) is thereby derived from the lowered
program, not from the kernels' word.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from backends.sim import SimResult, simulate
from planner.frontend.reference import reference
from planner.pipeline import PlanResult

# Relative tolerance of a claimed element against the float64 reference (the simulator
# is exact up to round-off).
ELEMENT_RTOL = 1e-9


@dataclass(frozen=True)
class ClaimViolation:
    what: str  # the claim ("node fc1", "conversion x -> fc1", ...)
    ciphertext: int
    rule: str  # "element" (a slot holds the wrong value) | "clean" (a free slot is not 0)
    slots: int  # how many slots break it
    detail: str

    def __str__(self) -> str:
        return f"{self.what} ct {self.ciphertext}: {self.rule}: {self.slots} slots ({self.detail})"


def claimed_registers(res: PlanResult) -> set[str]:
    """The registers the claims speak of (``simulate(..., keep=...)`` keeps them)."""
    return {r for c in res.claims for r in c.regs}


def check_claims(res: PlanResult, values: Mapping[str, np.ndarray], sim: SimResult | None = None) -> list[ClaimViolation]:
    """Violations of the plan's layout claims on ``values`` (empty when all hold).  ``sim``:
    a simulation of the plan on ``values`` that kept :func:`claimed_registers` (one run can
    serve the caller's own output checks); simulated here when absent."""
    if res.batch is not None:
        # a batched plan (planner/batch.py): claims speak of every block, the padding
        # blocks' zero samples included
        from planner.batch import batched_reference

        ref = batched_reference(res.problem.graph, values, res.batch.blocks)
    else:
        ref = reference(res.problem.graph, values)
    if sim is None:
        sim = simulate(res.plan, res.tables, values, keep=claimed_registers(res))
    out: list[ClaimViolation] = []
    for c in res.claims:
        flat = ref[c.tensor].ravel() * c.scale
        scale = max(1.0, float(np.max(np.abs(flat)))) if flat.size else 1.0
        for q, r in enumerate(c.regs):
            v = sim.registers[r]
            idx = np.asarray(c.layout.index_map(q))
            m = idx >= 0
            err = np.abs(v[m] - flat[idx[m]]) / scale
            bad = int(np.count_nonzero(err > ELEMENT_RTOL))
            if bad:
                out.append(ClaimViolation(c.what, q, "element", bad, f"max relative error {float(err.max()):.2e}"))
            if c.layout.clean:
                nz = int(np.count_nonzero(v[~m]))
                if nz:
                    out.append(ClaimViolation(
                        c.what, q, "clean", nz,
                        f"layout {c.layout.notation()} claims zeros outside the tensor; max |v| "
                        f"{float(np.max(np.abs(v[~m]))):.2e}",
                    ))
    return out
