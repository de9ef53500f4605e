"""Plans of several samples per ciphertext set (SPEC section 8, planner/batch.py): the CLI's
``--batch B|auto``, ``run`` on N samples (ceil(N/B) sets, the last padded), a bootstrapping
plan with a batch, and the client/server split (encrypt/evaluate/decrypt) on N samples."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from planner.frontend.graph import parse_graph
from planner.frontend.params import preset
from planner.pipeline import PlanOptions, plan_graph
from tests.helpers import run_cli

GRAPH: dict[str, Any] = {
    "schema": "slotplan.graph/1", "name": "tiny-batch",
    "tensors": {"W": {"shape": [16, 32], "role": "weight"}, "b": {"shape": [16], "role": "weight"},
                "x": {"shape": [32], "role": "input", "range": [-1, 1]}},
    "nodes": [{"id": "h", "op": "matvec", "inputs": ["W", "x"]},
              {"id": "h2", "op": "add", "inputs": ["h", "b"]},
              {"id": "y", "op": "poly", "inputs": ["h2"], "coeffs": [0.1, 0.5, 0.2]}],
    "outputs": ["y"],
}


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {"W": rng.uniform(-1, 1, (16, 32)) / np.sqrt(32), "b": rng.uniform(-0.5, 0.5, 16)}


def _ref(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    h = x @ w["W"].T + w["b"]
    return 0.1 + 0.5 * h + 0.2 * h * h




def test_plan_batch_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = tmp_path / "g.json"
    g.write_text(json.dumps(GRAPH))
    code, out, _ = run_cli(["plan", str(g), "--params", "n14", "--batch", "4", "--json"], capsys)
    assert code == 0
    s1 = json.loads(out)["summary"]
    code, out, _ = run_cli(["plan", str(g), "--params", "n14", "--json"], capsys)
    s0 = json.loads(out)["summary"]
    assert "batch" not in s0 and "per_sample" not in s0
    assert s1["batch"] == 4 and s1["per_sample"]["rotations"] == pytest.approx(s1["rotations"] / 4)
    assert s1["per_sample"]["seconds"] > 0
    code, out, _ = run_cli(["plan", str(g), "--params", "n14", "--batch", "auto", "--json"], capsys)
    sa = json.loads(out)["summary"]
    cands = sa["batch_auto"]["candidates"]
    assert sa["batch"] == sa["batch_auto"]["chosen"] and [c["batch"] for c in cands][:3] == [1, 2, 4]
    best = min(c["seconds"] for c in cands if "seconds" in c)
    assert sa["per_sample"]["seconds"] == best < s1["per_sample"]["seconds"]
    for bad in ("0", "x", "-3", "9999"):
        code, out, err = run_cli(["plan", str(g), "--params", "n14", "--batch", bad], capsys)
        assert code == 2 and "batch" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("n", [1, 3, 8, 11])
def test_run_n_samples(n: int, tmp_path: Path) -> None:
    """N samples on a plan of batch 4: ceil(N/4) sets, per-sample outputs equal numpy."""
    from backends.runner import run_plan

    res = plan_graph(parse_graph(GRAPH), preset("n14"), PlanOptions(batch=4))
    w = _weights()
    x = np.random.default_rng(n).uniform(-1, 1, (n, 32))
    rep = run_plan(res.plan, res.tables, "sim", values={"x": x, **w})
    assert rep.ok and rep.outputs["y"].shape == (n, 16)
    assert rep.stats["ciphertext_sets"] == -(-n // 4)
    np.testing.assert_allclose(rep.outputs["y"], _ref(x, w), rtol=0, atol=1e-9)


def test_run_cli_batched(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = tmp_path / "g.json"
    g.write_text(json.dumps(GRAPH))
    p = tmp_path / "p.json"
    assert run_cli(["plan", str(g), "--params", "n14", "--batch", "2", "-o", str(p)], capsys)[0] == 0
    x = np.random.default_rng(1).uniform(-1, 1, (5, 32))
    np.savez(tmp_path / "x.npz", x=x)
    np.savez(tmp_path / "w.npz", **_weights())
    code, out, err = run_cli(["run", str(p), "--inputs", str(tmp_path / "x.npz"), "--weights",
                              str(tmp_path / "w.npz"), "--out", str(tmp_path / "y.npz"), "--json"], capsys)
    assert code == 0, err
    rep = json.loads(out)
    assert rep["ok"] and rep["stats"]["ciphertext_sets"] == 3
    np.testing.assert_allclose(np.load(tmp_path / "y.npz")["y"], _ref(x, _weights()), atol=1e-9)


def test_bootstrapping_plan_with_a_batch() -> None:
    """n14boot, 4 samples: the bootstraps refresh all of them; each equals numpy."""
    from backends.runner import run_plan

    nodes = []
    cur = "x"
    for i in range(6):  # 12 levels of squares: more than the 9 left after a bootstrap
        # (concave: each poly keeps its two levels, no fold)
        nodes.append({"id": f"p{i}", "op": "poly", "inputs": [cur], "coeffs": [0.0, 0.5, -0.4]})
        cur = f"p{i}"
    graph = {"schema": "slotplan.graph/1", "name": "deep-batch",
             "tensors": {"x": {"shape": [24], "role": "input", "range": [-1, 1]}},
             "nodes": nodes, "outputs": [cur]}
    res = plan_graph(parse_graph(graph), preset("n14boot"), PlanOptions(batch=4, allow_insecure=True))
    s = res.plan["summary"]
    assert s["bootstraps"] >= 1 and s["batch"] == 4
    x = np.random.default_rng(0).uniform(-1, 1, (4, 24))
    rep = run_plan(res.plan, res.tables, "sim", values={"x": x})
    want = x
    for _ in range(6):
        want = 0.5 * want - 0.4 * want * want
    assert rep.ok and rep.bootstraps["count"] == s["bootstraps"]
    np.testing.assert_allclose(rep.outputs[cur], want, atol=1e-9)


@pytest.mark.parametrize("size,batch", [(600, 4), (900, 2)])
def test_bootstrap_variants_with_a_batch(size: int, batch: int) -> None:
    """n14boot: a value spanning most of a block ring of ``8192 / P`` slots bootstraps with a
    variant; in the real ring it spans ``P`` times as many slots, so the batched program's
    variant is the block's ``log_slots + log2 P`` (the simulator refuses a bootstrap whose
    source holds values past its slots; a variant read in block terms did: ResNet-20 at
    n16boot, B = 2, came out wrong on Lattigo)."""
    from backends.runner import run_plan

    nodes = []
    cur = "x"
    for i in range(6):
        # (concave: each poly keeps its two levels, no fold)
        nodes.append({"id": f"p{i}", "op": "poly", "inputs": [cur], "coeffs": [0.0, 0.5, -0.4]})
        cur = f"p{i}"
    graph = {"schema": "slotplan.graph/1", "name": "deep-batch-variants",
             "tensors": {"x": {"shape": [size], "role": "input", "range": [-1, 1]}},
             "nodes": nodes, "outputs": [cur]}
    res = plan_graph(parse_graph(graph), preset("n14boot"), PlanOptions(batch=batch, allow_insecure=True))
    boots = [d for d in res.plan["program"] if d["op"] in ("bootstrap", "bootstrap2")]
    assert boots and all(d.get("log_slots") is not None for d in boots)  # variants chosen
    P = 1 << (batch - 1).bit_length()
    for d in boots:
        reach = 1 << (int(d["log_slots"]) + (1 if d.get("halves") else 0))
        assert reach >= size * P  # the real ring's slots, not the block's
    for e in res.plan["summary"]["bootstrapping"]["per_bootstrap"]:
        assert (1 << int(e["log_slots"])) * (2 if e["kind"] == "halves" else 1) >= size * P
    x = np.random.default_rng(1).uniform(-1, 1, (batch, size))
    rep = run_plan(res.plan, res.tables, "sim", values={"x": x})
    want = x
    for _ in range(6):
        want = 0.5 * want - 0.4 * want * want
    assert rep.ok
    np.testing.assert_allclose(rep.outputs[cur], want, atol=1e-9)


def test_full_ring_halves_variant_with_a_batch() -> None:
    """A pair of samples filling the real ring (issue 35: ResNet-20's stage 1 at n16boot,
    B = 2): 2 x 3000 values in 8192 slots at n14boot reach past half the ring, so no sparse
    variant fits; the halves variant at half the ring's slots (n14boot's h12, the block
    ring's h11; n16boot's h14) carries them and is cheaper than the full bootstrap. The
    batched program's bootstraps are that variant in the real ring's terms and the simulator
    equals numpy per sample."""
    from backends.runner import run_plan

    size, batch = 3000, 2
    # (concave: each poly keeps its two levels, no fold)
    nodes = [{"id": f"p{i}", "op": "poly", "inputs": ["x" if i == 0 else f"p{i - 1}"], "coeffs": [0.0, 0.5, -0.4]}
             for i in range(6)]
    graph = {"schema": "slotplan.graph/1", "name": "pair-fills-the-ring",
             "tensors": {"x": {"shape": [size], "role": "input", "range": [-1, 1]}},
             "nodes": nodes, "outputs": ["p5"]}
    params = preset("n14boot")
    res = plan_graph(parse_graph(graph), params, PlanOptions(batch=batch, allow_insecure=True))
    boots = [d for d in res.plan["program"] if d["op"] in ("bootstrap", "bootstrap2")]
    assert boots
    half = params.slots.bit_length() - 2  # log2(slots / 2)
    assert all(d["op"] == "bootstrap" and d.get("halves") and d.get("log_slots") == half for d in boots)
    per = res.plan["summary"]["bootstrapping"]["per_bootstrap"]
    assert per and all(e["variant"] == f"h{half}" and e["saving_seconds"] > 0 for e in per)
    x = np.random.default_rng(2).uniform(-1, 1, (batch, size))
    rep = run_plan(res.plan, res.tables, "sim", values={"x": x})
    want = x
    for _ in range(6):
        want = 0.5 * want - 0.4 * want * want
    assert rep.ok
    np.testing.assert_allclose(rep.outputs["p5"], want, atol=1e-9)


def test_refusals() -> None:
    from planner.batch import BatchError

    g = parse_graph(GRAPH)
    with pytest.raises(BatchError, match="complex packing"):
        plan_graph(g, preset("n14"), PlanOptions(batch=2, packing="complex"))
    with pytest.raises(BatchError, match="do not fit"):
        plan_graph(g, preset("n14"), PlanOptions(batch=9000))


def test_split_round_trip_n_samples(tmp_path: Path) -> None:
    """encrypt/evaluate/decrypt of N samples on a plan of batch 4 (Lattigo, n13, raw
    outputs): ceil(N/4) ciphertext sets, outputs per sample, the padding dropped."""
    from backends.lattigo_backend import available

    if not available():
        pytest.skip("Lattigo extension not built (make lattigo)")
    from backends import inference as inf

    res = plan_graph(parse_graph(GRAPH), preset("n13"), PlanOptions(batch=4, clean_outputs=False))
    plan, tables = res.plan, dict(res.tables.items())
    inf.keygen(plan, tmp_path / "K", tables=tables)
    w = _weights()
    rng = np.random.default_rng(0)
    for n in (6, None):
        x = rng.uniform(-1, 1, (n, 32) if n else (32,))
        ct = inf.encrypt(plan, tmp_path / "K", {"x": x}, tables=tables)
        h, _ = inf.ciphertext_header(ct)
        assert h.samples == (2 if n else 1) and h.sample_count == (n or 1)
        out = inf.evaluate(plan, tmp_path / "K" / "eval", w, ct, tables=tables)
        y = inf.decrypt(plan, tmp_path / "K", out, tables=tables)
        want = _ref(x, w)
        assert y["y"].shape == want.shape
        assert float(np.max(np.abs(y["y"] - want))) <= 1e-4 * max(1.0, float(np.max(np.abs(want))))
    from common.errors import SlotplanError

    with pytest.raises(SlotplanError, match="range"):  # ranges per sample
        inf.encrypt(plan, tmp_path / "K", {"x": np.full((3, 32), 0.5) + np.eye(3, 32) * 2}, tables=tables)


def test_batch_under_a_memory_cap() -> None:
    """The key schedule runs on the batched program; the plan stays exact per sample."""
    from backends.runner import run_plan
    from planner.cost.process import plan_process_model

    g = parse_graph(GRAPH)
    free = plan_graph(g, preset("n14"), PlanOptions(batch=8))
    # the cap bounds the process model (the executor's state besides the plan's keys)
    full = plan_process_model(free.plan)["growth"]
    peak = free.plan["summary"]["peak_bytes"]["total"]
    cap = int(full - 0.2 * peak)
    res = plan_graph(g, preset("n14"), PlanOptions(batch=8, memory_cap_bytes=cap))
    s = res.plan["summary"]
    assert s["peak_bytes"]["total"] < peak and s["batch"] == 8 and s["memory_cap_bytes"] == cap
    assert s["process_peak_bytes"]["total"] <= cap
    x = np.random.default_rng(5).uniform(-1, 1, (8, 32))
    rep = run_plan(res.plan, res.tables, "sim", values={"x": x, **_weights()})
    assert rep.ok
    np.testing.assert_allclose(rep.outputs["y"], _ref(x, _weights()), atol=1e-9)


def test_python_facade_batch() -> None:
    import slotplan

    p = slotplan.plan(GRAPH, "n14", batch=4)
    assert p.document["summary"]["batch"] == 4
    x = np.random.default_rng(2).uniform(-1, 1, (6, 32))
    y = p.simulate({"x": x}, _weights())
    np.testing.assert_allclose(y["y"], _ref(x, _weights()), atol=1e-9)
    assert p.simulate()["y"].shape == (4, 16)
