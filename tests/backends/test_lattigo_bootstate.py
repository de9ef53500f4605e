"""The bootstrapping evaluation state kept across evaluations (issue 36 item 4,
backends/lattigo/bootstate.go): a bootstrapping plan of 2 samples per ciphertext set at
``n14boot`` (insecure test ring) run on 4 samples is two evaluations in this process; the
first encodes the DFT matrices (full-slot and the plan's sparse variant) and keeps them, the
second encodes none. Both sets' outputs equal numpy to CKKS precision, and each set's tracked
peak stays within the plan's memory model. Skipped without the extension or 4 GiB free."""

from __future__ import annotations

import numpy as np
import pytest

from backends.lattigo_backend import available
from backends.runner import run_plan
from planner.frontend.graph import parse_graph
from planner.frontend.params import preset
from planner.pipeline import PlanOptions, plan_graph
from tests.helpers import mem_available

pytestmark = [
    pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)"),
    pytest.mark.skipif(mem_available() < 4 << 30, reason="a bootstrap at log N 14 needs ~3 GB of memory"),
]


def _graph() -> dict:
    nodes = []
    cur = "x"
    for i in range(12):  # 12 squares, one level each: a bootstrap at n14boot (9 levels)
        nodes.append({"id": f"p{i}", "op": "poly", "inputs": [cur], "coeffs": [0.0, 0.5, 0.4]})
        cur = f"p{i}"
    return {"schema": "slotplan.graph/1", "name": "deep-batch",
            "tensors": {"x": {"shape": [24], "role": "input", "range": [-1, 1]}}, "nodes": nodes, "outputs": [cur]}


def test_second_evaluation_reuses_the_matrices() -> None:
    # a cap that streams the block: load_key block at instruction 0, drop_key at the end
    res = plan_graph(parse_graph(_graph()), preset("n14boot"),
                     PlanOptions(batch=2, allow_insecure=True, memory_cap_bytes=3_000_000_000))
    prog = res.plan["program"]
    assert prog[0]["op"] == "load_key" and prog[0].get("block") == "boot" and prog[-1]["op"] == "drop_key"
    assert res.plan["summary"]["bootstraps"] >= 1
    x = np.random.default_rng(3).uniform(-1, 1, (4, 24))
    rep = run_plan(res.plan, res.tables, "lattigo", values={"x": x})
    want = x
    for _ in range(12):
        want = 0.5 * want + 0.4 * want * want
    assert rep.ok, rep.failure()
    np.testing.assert_allclose(rep.outputs["p11"], want, atol=1e-4)
    ev = rep.stats["evaluations"]
    assert len(ev) == 2 and rep.stats["ciphertext_sets"] == 2
    first, second = ev
    assert first["matrices_built"] and not first["matrices_reused"] and first["matrices_kept"]
    assert first["boot_matrix_seconds"] > 0
    assert not second["matrices_built"] and second["matrices_reused"] and second["boot_matrix_seconds"] == 0
    assert second["eval_seconds_without_matrices"] == second["eval_seconds"]
    # the last set lets go of them (run_plan without keep_boot_state)
    assert not second["matrices_kept"]
    pm = rep.stats["process_model"]
    for e in ev:
        # tracked: live ciphertexts, resident keys, matrices (the kept ones included from the
        # second evaluation's start to its block load): within the process model's growth
        assert 0 < e["peak_tracked_bytes"] <= pm["growth"], (e, pm)
    assert second["peak_tracked_bytes"] == first["peak_tracked_bytes"]
    print("evaluations:", ev, "process model:", pm)
