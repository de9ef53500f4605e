"""Bootstrapping on Lattigo: a small plan built through the IR at ``n14boot`` (the
N16QP1546H192H32 chain at log N 14, insecure, ~3 GB and ~1 min here) and on the same chain
at log N 12 (``P12``, seconds), run encrypted and compared with numpy and with the simulator.

The plan spends all 9 levels, bootstraps with the key block ``boot`` resident (loaded by the
key schedule), rotates by an offset the block holds (its key, no plan key), drops the block,
rotates by an offset it does not hold (a plan key, loaded on its own) and multiplies two
ciphertexts (the plan's relinearisation key). A second input spends 2 levels before its own
bootstrap: the executor drops the 7 it does not use (planner.ir.analysis.level_drops), so
that bootstrap too starts at level 0. Skipped when the extension is not built or
less than 4 GiB of memory is available.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.lattigo_backend import available, go_plan_json, run_plan
from backends.sim import simulate
from common.errors import PlanFileError
from planner import ir
from planner.frontend.params import Params, _boot_preset, preset
from tests.helpers import mem_available

pytestmark = [
    pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)"),
    pytest.mark.skipif(mem_available() < 4 << 30, reason="a bootstrap at log N 14 needs ~3 GB of memory"),
]

P = preset("n14boot")
S = P.slots
# The same chain and bootstrapping literal at log N 12 (insecure, like n14boot; a bootstrap
# ~1 s, the block ~0.37 GB): the Go tests' ring (backends/lattigo/boot_test.go bootParamsAt).
# Its key offsets, key bytes and matrix bytes measured from Lattigo v6.1.1 (the executor
# refuses offsets other than the literal's rotations at the ring; the test compares the bytes
# with the run's).
P12 = _boot_preset(
    12, "test12boot", "test size: N16QP1546H192H32's chain at log N 12; insecure",
    (1, 2, 3, 4, 8, 12, 16, 24, 32, 64, 96, 128, 256, 384, 512, 1024, 1536, 1792, 1920, 1952, 1984, 2016, 2032,
     2040, 2044, 2046),
    285_290_453, 80_827_328,
)


def _plan(program: list[ir.Instr], params: Params = P) -> dict[str, Any]:
    return {
        "schema": ir.PLAN_SCHEMA,
        "graph": {"name": "boot-small", "sha256": "0" * 64},
        "params": params.to_json(),
        "plaintexts": {"w": {"source": "w", "table": "pt/w"}},
        "program": ir.to_json_program(program),
    }


def _check_bootstrap_plan(P: Params, tmp_path: Path) -> None:
    S = P.slots
    assert P.boot is not None
    in_block = P.boot.key_offsets[4]  # 8: held by the block
    not_in_block = next(k for k in range(1, S) if k not in P.boot.key_offsets)
    prog: list[ir.Instr] = [ir.Input(dst="c0", tensor="x", table="in/x")]
    prev = "c0"
    for i in range(1, P.max_level + 1):  # 9 levels: the input reaches level 0
        prog += [ir.PMul(dst=f"m{i}", src=prev, pt="w"), ir.Rescale(dst=f"r{i}", src=f"m{i}")]
        prev = f"r{i}"
    prog += [
        ir.Input(dst="z0", tensor="z", table="in/z"),
        ir.PMul(dst="zm1", src="z0", pt="w"), ir.Rescale(dst="z1", src="zm1"),
        ir.PMul(dst="zm2", src="z1", pt="w"), ir.Rescale(dst="z2", src="zm2"),
        ir.LoadKey(block="boot"),
        ir.Bootstrap(dst="b", src=prev),
        ir.Bootstrap(dst="e", src="z2"),
        ir.Rot(dst="u", src="b", k=in_block),
        ir.DropKey(block="boot"),
        ir.LoadKey(k=not_in_block),
        ir.Rot(dst="v", src="b", k=not_in_block),
        ir.DropKey(k=not_in_block),
        ir.CMul(dst="p", a="u", b="v"),
        ir.Add(dst="y", a="p", b="b"),
        ir.Output(src="y", tensor="y", table="out/y"),
        ir.Output(src="e", tensor="e", table="out/e"),
    ]
    plan = _plan(prog, P)
    rng = np.random.default_rng(11)
    assert P.boot is not None
    x = rng.uniform(-1, 1, S) * P.boot.max_abs
    z = rng.uniform(-1, 1, S) * P.boot.max_abs
    w = rng.uniform(0.7, 1.0, S)  # 9 factors keep |values| <= boot.max_abs and away from 0
    ident = np.arange(S, dtype=np.int64)
    tables = {"in/x.idx": ident, "in/z.idx": ident, "pt/w.idx": ident, "out/y.idx": ident, "out/e.idx": ident}
    assert json.loads(go_plan_json(plan))["level_drops"] == {str(1 + 2 * P.max_level): 2}

    b = x * w**9
    want = np.roll(b, -in_block) * np.roll(b, -not_in_block) + b
    sim = simulate(plan, tables, {"x": x, "z": z, "w": w})
    np.testing.assert_allclose(sim.outputs["y"].ravel(), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sim.outputs["e"].ravel(), z * w**2, rtol=1e-12, atol=1e-12)

    key_dir = tmp_path / "keys"
    res = run_plan(plan, {"x": x, "z": z}, {"w": w}, tables, key_dir=str(key_dir))
    for t, ref in (("y", want), ("e", z * w**2)):
        err = float(np.max(np.abs(res.outputs[t].ravel() - ref)))
        assert err <= 1e-5 * max(1.0, float(np.max(np.abs(ref)))), (t, err)

    st = res.stats
    assert st["bootstraps"] == 2 and len(st["bootstrap_seconds"]) == 2
    # the second input's 7 unused levels dropped: both bootstraps start at level 0
    assert st["level_drops"] == P.max_level - 2
    assert st["bootstrap_input_levels"] == [0, 0]
    assert st["boot"] == "N16QP1546H192H32" and st["key_mode"] == "scheduled"
    assert st["boot_block_loads"] == 1
    assert st["boot_key_bytes"] > 0.99 * P.boot.key_bytes
    assert st["boot_matrix_bytes"] == P.boot.matrix_bytes
    # Resident keys: the block alone, then the plan's one key at level 9 (never together).
    assert st["peak_key_bytes"] == st["boot_key_bytes"]
    assert st["rotation_keys"] == 1
    assert st["galois_key_bytes"] == pytest.approx(P.rotation_key_bytes(P.max_level), rel=1e-4)
    assert st["peak_tracked_bytes"] >= st["boot_key_bytes"] + st["boot_matrix_bytes"]

    # The key directory: the plan's key and relinearisation key, the block one file per key
    # (Galois keys of the preset's offsets + conjugation, relinearisation, encapsulation);
    # no secret key.
    names = sorted(os.listdir(key_dir))
    manifest = json.loads((key_dir / "manifest.json").read_text())
    boot = manifest["boot"]
    assert boot["literal"] == "N16QP1546H192H32"
    assert sorted(g["k"] for g in boot["galois"] if not g.get("conjugation")) == list(P.boot.key_offsets)
    assert sum(1 for g in boot["galois"] if g.get("conjugation")) == int(P.boot.conjugation)
    assert boot["evaluation_keys_binary_size"] == P.boot.key_bytes
    block_files = {g["file"] for g in boot["galois"]} | {boot["relin"], boot["dense_to_sparse"], boot["sparse_to_dense"]}
    assert set(names) == {"manifest.json", f"rot_{not_in_block}.key", "relin.key"} | block_files
    assert not any("secret" in n or n.startswith("sk") for n in names)


def test_bootstrap_plan_n12boot(tmp_path: Path) -> None:
    """The checks below at log N 12 (6 s; the default tier's bootstrapping run)."""
    _check_bootstrap_plan(P12, tmp_path)


def test_bootstrap_plan_n14boot(tmp_path: Path) -> None:
    """The same at n14boot (~40 s: its keys are 1.4 GB; the full tier)."""
    _check_bootstrap_plan(P, tmp_path)


def test_bootstrap_refused_on_plain_params() -> None:
    plan = _plan([ir.Input(dst="c0", tensor="x", table="in/x"), ir.Bootstrap(dst="b", src="c0"),
                  ir.Output(src="b", tensor="y", table="out/y")])
    plan["params"] = preset("n12").to_json()
    plan["plaintexts"] = {}
    ident = np.arange(preset("n12").slots, dtype=np.int64)
    tables = {"in/x.idx": ident, "out/y.idx": ident}
    # refused before Go is called (a malformed plan is bad input, exit 2: issue 38)
    with pytest.raises(PlanFileError, match=r"instruction 1 \(bootstrap\): the plan's params carry no 'boot' object"):
        run_plan(plan, {"x": np.zeros(ident.size)}, {}, tables)


def test_bench_plan_bootstraps_keep_all_and_scheduled() -> None:
    """BenchPlan (keymeasure, lattigo-bench) runs bootstrapping plans: keep-all (the block
    and every key resident before the clock) and under the plan's key schedule (the block
    read where the plan loads it, its DFT matrices timed apart); both against numpy."""
    from backends.lattigo_backend import _call, _ext, _json_default, pack_vectors

    not_in_block = next(k for k in range(1, S) if k not in P.boot.key_offsets)
    in_block = P.boot.key_offsets[4]
    prog: list[ir.Instr] = [ir.Input(dst="c0", tensor="x", table="in/x")]
    prev = "c0"
    for i in range(1, P.max_level + 1):
        prog += [ir.PMul(dst=f"m{i}", src=prev, pt="w"), ir.Rescale(dst=f"r{i}", src=f"m{i}")]
        prev = f"r{i}"
    prog += [
        # a plan key for an offset the block also holds, made at level 0 and resident while
        # the block bootstraps: the bootstrapper must rotate with the block's key
        ir.LoadKey(k=in_block),
        ir.Rot(dst="u", src=prev, k=in_block),
        ir.Input(dst="z0", tensor="z", table="in/z"),
        ir.PMul(dst="zm1", src="z0", pt="w"), ir.Rescale(dst="z1", src="zm1"),
        ir.PMul(dst="zm2", src="z1", pt="w"), ir.Rescale(dst="z2", src="zm2"),
        ir.LoadKey(block="boot"),
        ir.Bootstrap(dst="b", src=prev),
        ir.Bootstrap(dst="e", src="z2"),
        ir.DropKey(block="boot"),
        ir.DropKey(k=in_block),
        ir.LoadKey(k=not_in_block),
        ir.Rot(dst="v", src="b", k=not_in_block),
        ir.DropKey(k=not_in_block),
        ir.Add(dst="y0", a="v", b="b"),
        ir.Add(dst="y", a="y0", b="u"),
        ir.Output(src="y", tensor="y", table="out/y"),
        ir.Output(src="e", tensor="e", table="out/e"),
    ]
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, S)
    z = rng.uniform(-1, 1, S)
    w = rng.uniform(0.7, 1.0, S)
    ident = np.arange(S, dtype=np.int64)
    tables = {"in/x.idx": ident, "in/z.idx": ident, "pt/w.idx": ident, "out/y.idx": ident, "out/e.idx": ident}
    b = x * w**9
    want = np.roll(b, -not_in_block) + b + np.roll(b, -in_block)
    mod, go = _ext()
    keep_all = [i for i in prog if not isinstance(i, ir.LoadKey | ir.DropKey)]
    for program, mode in ((keep_all, "keep_all"), (prog, "scheduled")):
        plan = _plan(program)
        if mode == "scheduled":
            plan["keys"] = {str(in_block): {"level": 0}, str(not_in_block): {"level": P.max_level}}
        pin, ppt = pack_vectors(plan, {"x": x, "z": z}, {"w": w}, tables)
        raw = json.loads(_call(mod.BenchPlan, json.dumps(plan, default=_json_default), go.Slice_byte.from_bytes(pin),
                               go.Slice_byte.from_bytes(ppt), json.dumps({"repeat": 1, "no_prepare": True})))
        st = raw["stats"]
        got = np.frombuffer(base64.b64decode(raw["outputs"][0]["data"]), dtype="<f8")
        got_e = np.frombuffer(base64.b64decode(raw["outputs"][1]["data"]), dtype="<f8")
        assert float(np.max(np.abs(got_e[:S] - z * w**2))) <= 1e-5, mode
        assert st["key_mode"] == mode and st["bootstraps"] == 2, st
        assert st["boot_matrix_seconds"] > 0 and st["eval_seconds"] > 0
        err = float(np.max(np.abs(got[:S] - want)))
        assert err <= 1e-5 * max(1.0, float(np.max(np.abs(want)))), (mode, err)


def test_planned_bootstrap_keeps_precision_at_its_worst_case() -> None:
    """A planned chain of 12 products at n14boot (one bootstrap) with every value at its
    declared bound: a constant vector puts all of its energy in one coefficient, where
    EvalMod's error grows like its cube. With boot.max_abs = 4 the plan bootstrapped the
    unscaled value (bound 1 <= 4) and lost all but ~13 bits (relative error 1e-4); LeNet-5's
    activations, as structured, were wrong the same way."""
    from backends.runner import run_plan as run_planned
    from planner.frontend.graph import parse_graph
    from planner.pipeline import PlanOptions, plan_graph

    tensors: dict[str, Any] = {"x": {"shape": [S], "role": "input", "range": [-1.0, 1.0]}}
    nodes, prev = [], "x"
    for i in range(12):
        tensors[f"w{i}"] = {"shape": [S], "role": "weight", "range": [-1.0, 1.0]}
        nodes.append({"id": f"m{i}", "op": "mul", "inputs": [prev, f"w{i}"]})
        prev = f"m{i}"
    g = parse_graph({"schema": "slotplan.graph/1", "name": "chain12", "tensors": tensors, "nodes": nodes,
                     "outputs": [prev]})
    res = plan_graph(g, P, PlanOptions(allow_insecure=True))
    assert res.plan["summary"]["bootstraps"] == 1
    values = {t: np.ones(S) for t in tensors}
    values["x"] = -np.ones(S)
    rep = run_planned(res.plan, res.tables, "lattigo", values=values)
    assert rep.max_rel_error <= 1e-5, rep.max_rel_error


def _dense_net(layers: int = 6, n: int = 64) -> Any:
    from planner.frontend.graph import parse_graph

    tensors: dict[str, Any] = {"x": {"shape": [n], "role": "input", "range": [-1.0, 1.0]}}
    nodes: list[dict[str, Any]] = []
    prev = "x"
    for i in range(layers):
        tensors[f"W{i}"] = {"shape": [n, n], "role": "weight"}
        nodes += [{"id": f"fc{i}", "op": "matvec", "inputs": [f"W{i}", prev]},
                  {"id": f"act{i}", "op": "poly", "inputs": [f"fc{i}"], "coeffs": [0.0, 0.5, 0.25]}]
        prev = f"act{i}"
    return parse_graph({"schema": "slotplan.graph/1", "name": "dense6", "tensors": tensors, "nodes": nodes,
                        "outputs": [prev]})


def test_streamed_boot_block_under_a_cap_on_lattigo() -> None:
    """A cap below the whole bootstrapping block (keys 1.36 GiB + DFT matrices 0.43 GiB at
    n14boot): the schedule streams the block's Galois keys (load_key {"block": "boot",
    "stream": 2}) and gives the plan's rotations of the block's offsets keys of their own.
    Simulated with strict residency and run on Lattigo: numpy's result, the measured peak of
    keys + matrices under the cap and within 5% of the model."""
    from backends.runner import run_plan as run_planned
    from planner.frontend.ranges import calibrated_graph
    from planner.frontend.reference import random_values
    from planner.keys.residency import BOOT_STREAM_DEPTH
    from planner.pipeline import PlanOptions, plan_graph

    assert P.boot is not None
    g = _dense_net()
    vals = random_values(g, 0, "fan-in")
    weights = {t: vals[t] for t in g.weights}
    cg = calibrated_graph(g, weights, [random_values(g, s, "fan-in") for s in range(1, 9)])
    cap = int(0.8 * P.boot.block_bytes)
    res = plan_graph(cg, P, PlanOptions(memory_cap_bytes=cap, allow_insecure=True))
    s = res.plan["summary"]
    assert s["bootstraps"] >= 1 and s["peak_bytes"]["total"] <= cap
    blocks = [i for i in res.plan["program"] if i["op"] == "load_key" and "block" in i]
    assert blocks == [{"op": "load_key", "block": "boot", "stream": BOOT_STREAM_DEPTH}]
    assert run_planned(res.plan, res.tables, "sim", values=vals).ok
    rep = run_planned(res.plan, res.tables, "lattigo", values=vals)
    assert rep.max_rel_error <= 1e-4, rep.max_rel_error
    st = rep.stats
    measured = st["peak_key_bytes"] + st["boot_matrix_bytes"]
    model = s["peak_bytes"]["keys"]
    assert st["boot_stream_reads"] > 0
    assert measured <= cap and abs(measured - model) <= 0.05 * model, (measured, model, cap)


def test_masked_polys_before_bootstraps_on_lattigo() -> None:
    """Dense layers, each followed by a poly with p(0) != 0 (its result is dirty), planned at
    the bootstrapping chain at log N 12: the masks before the bootstraps are the polys' own
    (Lattigo's PolynomialVector, no level), and the encrypted run equals numpy."""
    from backends.runner import run_plan as run_planned
    from planner.frontend.graph import parse_graph
    from planner.frontend.reference import random_values
    from planner.pipeline import PlanOptions, plan_graph

    n = 32
    tensors: dict[str, Any] = {"x": {"shape": [n], "role": "input", "range": [-1.0, 1.0]}}
    nodes: list[dict[str, Any]] = []
    prev = "x"
    for i in range(8):
        tensors[f"W{i}"] = {"shape": [n, n], "role": "weight", "range": [-0.02, 0.02]}
        nodes += [{"id": f"fc{i}", "op": "matvec", "inputs": [f"W{i}", prev]},
                  {"id": f"act{i}", "op": "poly", "inputs": [f"fc{i}"], "coeffs": [0.1, 0.5, 0.0, 0.125]}]
        prev = f"act{i}"
    g = parse_graph({"schema": "slotplan.graph/1", "name": "dense_poly8", "tensors": tensors, "nodes": nodes,
                     "outputs": [prev]})
    res = plan_graph(g, P12, PlanOptions(allow_insecure=True))
    prog = res.plan["program"]
    made = {i["dst"]: i for i in prog if "dst" in i}
    masked = [b for b in prog if b["op"] == "bootstrap" and "mask" in made[b["src"]]]
    assert masked, "no bootstrap reads a masked poly"
    vals = random_values(g, 0)
    vals = {t: (np.clip(v, -0.02, 0.02) if t.startswith("W") else v) for t, v in vals.items()}
    assert run_planned(res.plan, res.tables, "sim", values=vals).ok
    rep = run_planned(res.plan, res.tables, "lattigo", values=vals)
    assert rep.ok and rep.max_rel_error <= 1e-4, rep.max_rel_error


def test_folded_chebyshev_after_residual_sums_on_lattigo() -> None:
    """Residual blocks with Chebyshev ReLU fits over narrow domains (tests/e2e's
    ``_residual_cheb``) at the bootstrapping chain at log N 12: every poly's change of
    variable folds (the sums' skips scaled by a product on their edge, the bootstrapped
    values' scales raised for the factor), and the encrypted run equals numpy."""
    from backends.runner import run_plan as run_planned
    from planner.frontend.reference import random_values
    from planner.pipeline import PlanOptions, plan_graph
    from tests.e2e.test_bootstrap_plans import _residual_cheb

    g = _residual_cheb(4)
    res = plan_graph(g, P12, PlanOptions(allow_insecure=True))
    nodes = {n["id"]: n for n in res.plan["nodes"]}
    assert all("input_scaled_by" in nodes[f"a{i}"]["params"] for i in range(4))
    assert all(nodes[f"s{i}"]["params"].get("scaled_operands_by_product") for i in range(4))
    assert res.plan["summary"]["bootstraps"] >= 1
    vals = random_values(g, 0)
    assert run_planned(res.plan, res.tables, "sim", values=vals).ok
    rep = run_planned(res.plan, res.tables, "lattigo", values=vals)
    assert rep.ok and rep.max_rel_error <= 1e-4, rep.max_rel_error
