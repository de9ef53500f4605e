"""Complex packing (docs/formats.md): the hybrid matvec with two real inputs per complex
slot (``hybrid-complex``), its instructions (``mul_i``, ``conj``), complex plaintexts and
the opt-in option. Every plan is simulated against numpy (float64) with its layout claims."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from backends.sim import SimulationError, simulate
from common.errors import PlanFileError
from planner import ir
from planner.assign.candidates import ELEMENTWISE_KERNELS
from planner.frontend.graph import Graph, parse_graph
from planner.frontend.reference import random_values
from planner.kernels.hybrid import HybridMatvec
from planner.pipeline import PlanError, PlanOptions, plan_graph
from tests.helpers import check_plan, matvec_graph, small_params

COMPLEX = PlanOptions(packing="complex", allow_insecure=True, objective="rotations")
HYBRID_ONLY = ("hybrid-complex", *ELEMENTWISE_KERNELS)


def _kernels(res: Any) -> dict[str, str]:
    return {n["id"]: n["kernel"] for n in res.plan["nodes"]}


def mlp_graph(sizes: list[int], square: bool = True) -> Graph:
    """matvec -> x^2 -> matvec -> ... (weights W0, W1, ...)."""
    tensors: dict[str, Any] = {"x": {"shape": [sizes[0]], "role": "input"}}
    nodes: list[dict[str, Any]] = []
    prev = "x"
    for i, (k, n) in enumerate(zip(sizes, sizes[1:], strict=False)):
        tensors[f"W{i}"] = {"shape": [n, k], "role": "weight"}
        nodes.append({"id": f"h{i}", "op": "matvec", "inputs": [f"W{i}", prev]})
        prev = f"h{i}"
        if square and i < len(sizes) - 2:
            nodes.append({"id": f"a{i}", "op": "poly", "inputs": [prev], "coeffs": [0.0, 0.5, 0.25]})
            prev = f"a{i}"
    return parse_graph({"schema": "slotplan.graph/1", "name": "mlp", "tensors": tensors, "nodes": nodes,
                        "outputs": [prev]})


# wide, tall and square shapes, sizes no power of two, at 512 slots (log_n 10)
SHAPES = [(100, 300), (300, 100), (200, 200), (37, 500), (500, 3), (3, 500), (255, 257), (511, 9), (5, 400)]


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_hybrid_complex_matvec_matches_numpy(n: int, k: int) -> None:
    g = matvec_graph(n, k)
    for inp in ("free", "row-major"):
        res = plan_graph(g, small_params(), replace(COMPLEX, kernels=HYBRID_ONLY, input_layout=inp))
        check_plan(res, g, seed=n * 1000 + k)
        node = res.plan["nodes"][0]
        assert node["kernel"] == "hybrid-complex" and node["params"]["packing"] == "complex"
        real = plan_graph(g, small_params(), PlanOptions(kernels=("hybrid",), allow_insecure=True,
                                                         objective="rotations", input_layout=inp))
        # half the plaintext products of the real hybrid (plus the output mask, if any)
        mask = 1 if node["params"].get("output_mask") else 0
        assert node["params"]["diagonals"] * 2 == real.plan["nodes"][0]["params"]["diagonals"]
        assert res.plan["summary"]["pmul"] - mask <= (real.plan["summary"]["pmul"] - mask + 1) // 2
        # one conjugation: one more key than the rotation offsets
        prog = ir.decode_program(res.plan["program"])
        assert sum(isinstance(i, ir.Conj) for i in prog) == 1
        assert res.plan["summary"]["rotation_keys"] == len(ir.rot_keys_of(prog)) + 1
        assert res.plan["options"]["packing"] == "complex"
        assert any("imag_table" in p for p in res.plan["plaintexts"].values())


def test_kernel_tables_follow_the_derivation() -> None:
    """Re(pt_t * z) summed over the diagonals and the fold equals W x / 2 row by row
    (the docstring's identity, checked on the tables directly)."""
    n, kk = 100, 300
    g = matvec_graph(n, kk)
    res = plan_graph(g, small_params(), replace(COMPLEX, kernels=HYBRID_ONLY))
    check_plan(res, g)
    from planner.assign.candidates import _linear_problem, input_layout

    node = g.nodes[0]
    k = HybridMatvec(_linear_problem(g, node, input_layout(g, "x", 512)), True, complex_pack=True)
    assert k.params() == {key: v for key, v in res.plan["nodes"][0]["params"].items() if key != "output_mask"}
    S, kp, q, f = k.prob.slots, k.kp, k.q, k.f
    rng = np.random.default_rng(1)
    W = rng.normal(size=(n, kk))
    x = rng.normal(size=kk)
    xr = np.array([x[s % kp] if s % kp < kk else 0.0 for s in range(S)])
    z = xr + 1j * np.roll(xr, -q)
    Wf = np.concatenate([W.ravel(), [0.0]])
    w = np.zeros(S, dtype=complex)
    for t in range(k.D):
        re, im = k.complex_tables(t, 0)
        pt = 0.5 * Wf[re] - 0.5j * Wf[im]
        w += pt * np.roll(z, -f * t)
    assert k.D * 2 * f == kp
    for rho in range(n):
        assert np.isclose(2 * w[rho * f:(rho + 1) * f].real.sum(), W[rho] @ x)


@pytest.mark.parametrize(
    "sizes", [[300, 200, 100], [70, 257, 33], [500, 40, 500, 7], [129, 129, 129]],
    ids=lambda s: "x".join(map(str, s)),
)
def test_multi_layer_networks(sizes: list[int]) -> None:
    g = mlp_graph(sizes)
    res = plan_graph(g, small_params(levels=12), replace(COMPLEX, kernels=HYBRID_ONLY))
    check_plan(res, g, seed=len(sizes))
    assert set(_kernels(res).values()) >= {"hybrid-complex"}
    # the objective chooses freely among every kernel (real and complex)
    free = plan_graph(g, small_params(levels=12), COMPLEX)
    check_plan(free, g, seed=len(sizes) + 1)


def test_objective_prefers_complex_where_it_saves() -> None:
    g = matvec_graph(256, 512)
    res = plan_graph(g, small_params(), replace(COMPLEX, kernels=("hybrid", *ELEMENTWISE_KERNELS)))
    real = plan_graph(g, small_params(), PlanOptions(kernels=("hybrid", *ELEMENTWISE_KERNELS), allow_insecure=True,
                                                     objective="rotations"))
    assert _kernels(res)["y"] == "hybrid-complex"
    assert res.plan["summary"]["rotations"] < real.plan["summary"]["rotations"]
    check_plan(res, g)


def test_time_objective_at_a_calibrated_preset() -> None:
    from planner.frontend.params import preset

    g = matvec_graph(1024, 4096)
    opts = PlanOptions(packing="complex", kernels=("hybrid", *ELEMENTWISE_KERNELS), time_limit_s=20)
    res = plan_graph(g, preset("n13"), opts)
    assert res.plan["options"]["objective"] == "time"
    assert _kernels(res)["y"] == "hybrid-complex"
    check_plan(res, g)


def test_real_packing_offers_no_complex_kernel_and_stays_spec() -> None:
    g = mlp_graph([300, 200, 100])
    res = plan_graph(g, small_params(levels=12), PlanOptions(allow_insecure=True, objective="rotations"))
    assert "packing" not in res.plan["options"] and "hybrid-complex" not in res.plan["options"]["kernels"]
    assert all(not isinstance(ir.decode(i), ir.MulI | ir.Conj) for i in res.plan["program"])
    assert all("imag_table" not in p for p in res.plan["plaintexts"].values())


def test_option_errors() -> None:
    g = matvec_graph(100, 300)
    with pytest.raises(PlanError, match="cannot be combined with a memory cap"):
        plan_graph(g, small_params(), replace(COMPLEX, memory_cap_bytes=1 << 30))
    with pytest.raises(PlanError, match="need options.packing 'complex'"):
        plan_graph(g, small_params(), PlanOptions(kernels=HYBRID_ONLY, allow_insecure=True))


def test_key_schedule_refuses_a_conjugating_program() -> None:
    from planner.keys.profile import KeyScheduleError
    from planner.keys.schedule import schedule_plan

    g = matvec_graph(100, 300)
    res = plan_graph(g, small_params(), replace(COMPLEX, kernels=HYBRID_ONLY))
    with pytest.raises(KeyScheduleError, match="conjugation key"):
        schedule_plan(res.plan, 1 << 40, "belady")


def test_memory_model_counts_the_conjugation_key() -> None:
    from planner.frontend.params import Params
    from planner.ir.analysis import memory_profile

    g = matvec_graph(100, 300)
    res = plan_graph(g, small_params(), replace(COMPLEX, kernels=HYBRID_ONLY))
    params = Params.from_json(res.plan["params"])
    prog = ir.decode_program(res.plan["program"])
    keys = res.plan["summary"]["peak_bytes"]["keys"]
    assert keys == (len(ir.rot_keys_of(prog)) + 1) * params.rotation_key_bytes()
    assert memory_profile(prog, params)["keys"] == keys
    vals = random_values(g, 0)
    sim = simulate(res.plan, res.tables, vals)
    assert sim.peak_resident_keys == res.plan["summary"]["rotation_keys"]


def _tiny_plan(program: list[dict[str, Any]], plaintexts: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"params": {"slots": 8, "log_q": [40, 40]}, "plaintexts": plaintexts or {}, "program": program}


def test_simulator_semantics_and_real_outputs() -> None:
    x = np.arange(1.0, 9.0)
    w = np.arange(10.0, 18.0)
    tables = {"t.idx": np.arange(8), "re.idx": np.arange(8), "re.coef": np.full(8, 0.5),
              "im.idx": np.arange(8)[::-1].copy(), "im.coef": np.full(8, -2.0)}
    pts = {"p0": {"source": "w", "table": "re", "imag_table": "im"}}
    prog = [
        {"op": "input", "dst": "c0", "tensor": "x", "table": "t"},
        {"op": "mul_i", "dst": "c1", "src": "c0"},
        {"op": "pmul", "dst": "c2", "src": "c1", "pt": "p0"},
        {"op": "conj", "dst": "c3", "src": "c2"},
        {"op": "add", "dst": "c4", "a": "c2", "b": "c3"},
        {"op": "output", "src": "c4", "tensor": "y", "table": "t"},
    ]
    out = simulate(_tiny_plan(prog, pts), tables, {"x": x, "w": w})
    pt = 0.5 * w - 2.0j * w[::-1]
    want = 2 * (1j * x * pt).real
    assert np.allclose(out.outputs["y"], want, rtol=1e-12) and out.outputs["y"].dtype == np.float64
    assert out.rotations == 1  # conj is a key switch
    bad = prog[:3] + [{"op": "output", "src": "c2", "tensor": "y", "table": "t"}]
    with pytest.raises(SimulationError, match="imaginary part .* is not zero"):
        simulate(_tiny_plan(bad, pts), tables, {"x": x, "w": w})


def test_validator_checks_complex_plaintexts() -> None:
    g = matvec_graph(100, 300)
    res = plan_graph(g, small_params(), replace(COMPLEX, kernels=HYBRID_ONLY))
    doc = json.loads(json.dumps(res.plan))
    assert ir.validate_plan(doc) is doc
    name = next(n for n, p in doc["plaintexts"].items() if "imag_table" in p)
    doc["plaintexts"][name]["imag_table"] = 3
    with pytest.raises(PlanFileError, match=f"plaintexts.{name}.imag_table"):
        ir.validate_plan(doc)
    doc["plaintexts"][name]["imag_table"] = "x"
    doc["plaintexts"][name]["l"] = 8
    with pytest.raises(PlanFileError, match="cannot be complex"):
        ir.validate_plan(doc)


def test_tables_round_trip_through_files(tmp_path: Any) -> None:
    """A complex plan written with its tables and read back simulates the same (the imag
    tables are written with the others)."""
    from planner.ir.io import load_plan, load_tables, write_outputs

    g = matvec_graph(200, 200)
    res = plan_graph(g, small_params(), replace(COMPLEX, kernels=HYBRID_ONLY))
    write_outputs(res.plan, tmp_path / "p.json", res.tables, tmp_path / "t.npz", 1 << 30)
    plan = load_plan(tmp_path / "p.json")
    tables = load_tables(tmp_path / "t.npz", plan)
    vals = random_values(g, 3)
    a = simulate(plan, tables, vals).outputs["y"]
    b = simulate(res.plan, res.tables, vals).outputs["y"]
    assert np.array_equal(a, b)


def random_mlp(seed: int) -> tuple[Graph, PlanOptions]:
    """A random chain of matvecs (sizes no power of two, 2..512) with squares, affine
    polys or residual adds between them, and random planning options."""
    rng = np.random.default_rng(seed)
    layers = int(rng.integers(1, 4))
    sizes = [int(v) for v in rng.integers(2, 513, size=layers + 1)]
    tensors: dict[str, Any] = {"x": {"shape": [sizes[0]], "role": "input"}}
    nodes: list[dict[str, Any]] = []
    prev = "x"
    for i in range(layers):
        tensors[f"W{i}"] = {"shape": [sizes[i + 1], sizes[i]], "role": "weight"}
        nodes.append({"id": f"h{i}", "op": "matvec", "inputs": [f"W{i}", prev]})
        prev = f"h{i}"
        kind = int(rng.integers(0, 3))
        if i < layers - 1 and kind == 0:
            nodes.append({"id": f"a{i}", "op": "mul", "inputs": [prev, prev]})
            prev = f"a{i}"
        elif i < layers - 1 and kind == 1:
            nodes.append({"id": f"a{i}", "op": "poly", "inputs": [prev], "coeffs": [0.1, 0.7, 0.2]})
            prev = f"a{i}"
        elif i > 0 and sizes[i + 1] == sizes[i]:
            nodes.append({"id": f"r{i}", "op": "add", "inputs": [prev, f"h{i - 1}"]})
            prev = f"r{i}"
    g = parse_graph({"schema": "slotplan.graph/1", "name": f"rmlp{seed}", "tensors": tensors, "nodes": nodes,
                     "outputs": [prev]})
    kernels = HYBRID_ONLY if seed % 2 else ("hybrid", "bsgs", *ELEMENTWISE_KERNELS)
    opts = replace(COMPLEX, kernels=kernels, input_layout="row-major" if seed % 3 == 0 else "free",
                   clean_outputs=seed % 5 != 0)
    return g, opts


@pytest.mark.parametrize("seed", range(24))
def test_random_mlps(seed: int) -> None:
    g, opts = random_mlp(seed)
    res = plan_graph(g, small_params(levels=16), opts)
    check_plan(res, g, seed=seed)
    if opts.kernels == HYBRID_ONLY:
        assert "hybrid-complex" in _kernels(res).values()


def test_rest_option(tmp_path: Any) -> None:
    """options.packing through the service: a complex plan whose tables (imaginary parts
    included) execute; with a memory cap the request is refused (422, one line)."""
    import io
    import warnings

    from api.rest import RestLimits, create_app
    from backends.runner import run_plan

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    graph = {"schema": "slotplan.graph/1", "name": "mv",
             "tensors": {"W": {"shape": [300, 700], "role": "weight"}, "x": {"shape": [700], "role": "input"}},
             "nodes": [{"id": "y", "op": "matvec", "inputs": ["W", "x"]}], "outputs": ["y"]}
    opts = {"time_limit_s": 5, "packing": "complex", "kernels": ["hybrid", "elementwise"]}
    with TestClient(create_app(tmp_path / "p.sqlite3", RestLimits(executor="thread", workers=2)),
                    raise_server_exceptions=False) as c:
        r = c.post("/v1/plans", json={"graph": graph, "params": "n12", "options": opts})
        assert r.status_code == 200, r.text
        plan = r.json()["plan"]
        assert plan["options"]["packing"] == "complex" and plan["nodes"][0]["kernel"] == "hybrid-complex"
        t = c.get(f"/v1/plans/{r.json()['id']}/tables")
        assert t.status_code == 200
        tables = dict(np.load(io.BytesIO(t.content), allow_pickle=False))
        assert run_plan(plan, tables, "sim", seed=1).ok
        bad = c.post("/v1/plans", json={"graph": graph, "params": "n12", "options": {**opts, "memory_cap_bytes": 1 << 30}})
        assert bad.status_code == 422 and "memory cap" in bad.text, bad.text
