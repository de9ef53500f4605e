"""``slotplan keymeasure`` (api/lattigo_keys.py) on a small graph: keep-all against a
cap on Lattigo, outputs against numpy, the measured key peak against the model and the cap.
No timing asserts."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from api.lattigo_keys import measure_graph
from backends.lattigo_backend import (
    LattigoError,
    _call,
    _ext,
    _json_default,
    available,
    pack_vectors,
    write_plaintexts,
)
from backends.lattigo_bench import _scatter, mvm_graph
from planner.frontend.params import load_params
from planner.frontend.reference import random_values, reference
from planner.pipeline import PlanOptions, plan_graph

needs_lattigo = pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)")


@needs_lattigo
def test_keymeasure_keep_all_and_a_cap() -> None:
    r = measure_graph(mvm_graph(48, 80), load_params("n13"), fractions=(0.5,), repeat=1, workers=1)
    keep, capped = r["runs"]
    assert keep["strategy"] == "keep-all" and keep["cap"] is None
    # the cap leaves the plan's own terms half their keep-all peak beside the executor's
    # state (the keep-all plan's process model, which the cap bounds)
    assert keep["model_process_planned_bytes"] > keep["model_peak_bytes"]
    assert capped["strategy"] == "joint" and "requested_cap" not in capped
    assert capped["cap"] == int(keep["model_process_planned_bytes"] - 0.5 * keep["model_peak_bytes"])
    for run in (keep, capped):
        assert run["max_rel_error"] < 1e-4, run
        assert run["workers"] == 1
        # the key store's measured peak is the plan's modelled one
        assert run["key_bytes_vs_model"] == pytest.approx(1.0, abs=0.05), run
        assert run["rotations"] == run["rotations_planned"] and run["key_loads"] == run["key_loads_planned"]
        assert run["key_load_ms_per_mb"] > 0
    # the store counts the bytes it reads: keep-all every (top-level) key once, the capped
    # run each of its loads, none larger than a top-level key
    assert keep["key_load_bytes"] == keep["peak_key_bytes"]
    top_key = keep["peak_key_bytes"] // keep["key_loads"]
    assert 0 < capped["key_load_bytes"] <= capped["key_loads"] * top_key, capped
    assert capped["model_peak_bytes"] <= capped["cap"]
    assert capped["peak_key_bytes"] < keep["peak_key_bytes"] and capped["key_peak_reduction"] > 1


def test_keymeasure_refuses_bad_options(cli: Callable[..., tuple[int, str, str]]) -> None:
    for args, field in ((["--workers", "0"], "--workers"), (["--fractions", "0,2"], "--fractions"),
                        (["--repeat", "0"], "--repeat")):
        code, out, err = cli("keymeasure", "data/suites/keymemrt.json", *args)
        assert code == 2, (args, out, err)
        assert field in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@needs_lattigo
def test_bench_plan_reads_plaintexts_from_a_file(tmp_path: Path) -> None:
    """BenchPlan's plaintext_file (keymeasure's large models): the same outputs as inline
    plaintexts, both against numpy; the file and packed plaintexts together are refused."""
    graph = mvm_graph(48, 80)
    params = load_params("n13")
    res = plan_graph(graph, params, PlanOptions(input_layout="free"))
    vals = random_values(graph, 2)
    inputs = {t: vals[t] for t in graph.inputs}
    weights = {t: vals[t] for t in graph.weights}
    mod, go = _ext()
    plan_json = json.dumps(res.plan, default=_json_default)
    pin, ppt = pack_vectors(res.plan, inputs, weights, res.tables)
    pin_only, _ = pack_vectors({**res.plan, "plaintexts": {}}, inputs, weights, res.tables)
    path = tmp_path / "pt.f64"
    write_plaintexts(res.plan, weights, res.tables, path)
    ref = reference(graph, vals)["y"]
    outs = []
    for packed_in, packed_pt, opts in ((pin, ppt, {}), (pin_only, b"", {"plaintext_file": str(path)})):
        raw = json.loads(_call(mod.BenchPlan, plan_json, go.Slice_byte.from_bytes(packed_in),
                               go.Slice_byte.from_bytes(packed_pt), json.dumps({"repeat": 1, **opts})))
        y = _scatter(raw["outputs"], res.tables, {"y": graph.shape("y")})["y"]
        assert float(np.max(np.abs(y - ref))) < 1e-4 * float(np.max(np.abs(ref)))
        outs.append(y)
    np.testing.assert_allclose(outs[0], outs[1], rtol=0, atol=1e-6)
    with pytest.raises(LattigoError, match="not both"):
        _call(mod.BenchPlan, plan_json, go.Slice_byte.from_bytes(pin), go.Slice_byte.from_bytes(ppt),
              json.dumps({"plaintext_file": str(path)}))
