"""Every workload's plan (the golden manifest: every graph under data/workloads):

- per-node counts (conversions and output masks included) add up to the summary,
- outputs equal the numpy reference in the simulator (1e-9),
- output ciphertexts hold zeros outside their tensor on the simulator's registers, and
  the summary says the outputs are clean,
- every layout claim of the lowering holds on the simulator's registers (plans up to
  ``CLAIM_CHECK_MAX_INSTRUCTIONS``; the claims check keeps every claimed register).

The plans are those tests/planner/report/test_golden.py makes (planned once per session).
"""

from __future__ import annotations

import numpy as np
import pytest

from backends.layout_check import check_claims, claimed_registers
from backends.runner import SIM_RTOL
from backends.sim import simulate
from planner.frontend.reference import random_values, reference
from planner.ir.analysis import NODE_COUNT_FIELDS
from tests.planner.report.test_golden import WORKLOAD_PARAMS, planned

# Keeping every claimed register of a larger plan costs more memory than the check is
# worth in the default suite; those plans still get the output and per-node checks.
CLAIM_CHECK_MAX_INSTRUCTIONS = 20_000


@pytest.mark.parametrize("case", WORKLOAD_PARAMS)
def test_workload_counts_add_up_and_outputs_are_clean(case) -> None:  # noqa: ANN001
    res = planned(case)
    plan = res.plan
    s = plan["summary"]
    for f in NODE_COUNT_FIELDS:
        assert sum(n[f] for n in plan["nodes"]) == s[f], f"{case.name}: nodes' {f} do not add up to the summary"
    assert s["clean_outputs"] is True
    graph = res.problem.graph
    # a bootstrapping plan scaled its bootstraps for the ranges its graph promises, which
    # hold for weights initialised by fan-in (what `slotplan run` draws)
    vals = random_values(graph, 0, "fan-in" if plan["params"].get("boot") else "uniform")
    small = len(plan["program"]) <= CLAIM_CHECK_MAX_INSTRUCTIONS
    # one simulation serves the output checks and (for plans up to the size limit) the claims
    sim = simulate(plan, res.tables, vals, keep=claimed_registers(res) if small else ())
    ref = reference(graph, vals)
    for t in graph.outputs:
        scale = max(1.0, float(np.max(np.abs(ref[t]))))
        err = float(np.max(np.abs(sim.outputs[t] - ref[t]))) / scale
        assert err < SIM_RTOL, f"{case.name}: output {t} relative error {err:.2e}"
    assert set(sim.leaked_slots) == set(graph.outputs)
    assert all(n == 0 for n in sim.leaked_slots.values()), f"{case.name}: outputs leak {sim.leaked_slots}"
    if small:
        bad = check_claims(res, vals, sim)
        assert not bad, "\n".join(map(str, bad))
