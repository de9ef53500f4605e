"""Complex packing on Lattigo (docs/formats.md): plans with mul_i, conj and complex
plaintexts run encrypted at n12 and n13 (a 1000x1000 matvec) and agree with numpy to CKKS precision, fused
(double-hoisted blocks on complex plaintexts) and instruction by instruction, through Run
(key directory, keep-all) and BenchPlan (keys in memory)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from backends.lattigo_backend import available, run_plan
from backends.lattigo_bench import mvm_graph
from planner import ir
from planner.assign.candidates import ELEMENTWISE_KERNELS
from planner.frontend.graph import Graph, parse_graph
from planner.frontend.params import load_params
from planner.frontend.reference import random_values, reference
from planner.pipeline import PlanOptions, PlanResult, plan_graph
from tests.helpers import bench_encrypted

pytestmark = pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)")

COMPLEX_ONLY = ("hybrid-complex", *ELEMENTWISE_KERNELS)


def _mlp() -> Graph:
    return parse_graph({
        "schema": "slotplan.graph/1", "name": "cmlp",
        "tensors": {"x": {"shape": [300], "role": "input"}, "W1": {"shape": [1500, 300], "role": "weight"},
                    "W2": {"shape": [45, 1500], "role": "weight"}},
        "nodes": [{"id": "h", "op": "matvec", "inputs": ["W1", "x"]},
                  {"id": "a", "op": "mul", "inputs": ["h", "h"]},
                  {"id": "y", "op": "matvec", "inputs": ["W2", "a"]}],
        "outputs": ["y"],
    })


def _plan(graph: Graph, preset: str, kernels: tuple[str, ...] = COMPLEX_ONLY) -> PlanResult:
    # (raw outputs: the two-layer net's 3 levels leave none for an output mask at n12)
    opts = PlanOptions(packing="complex", kernels=kernels, input_layout="free", allow_insecure=True,
                       objective="rotations", clean_outputs=graph.name != "cmlp")
    res = plan_graph(graph, load_params(preset), opts)
    prog = ir.decode_program(res.plan["program"])
    assert any(isinstance(i, ir.Conj) for i in prog) and any(isinstance(i, ir.MulI) for i in prog)
    return res


def _rel_errors(graph: Graph, outs: dict[str, np.ndarray], vals: dict[str, np.ndarray]) -> dict[str, float]:
    ref = reference(graph, vals)
    return {t: float(np.max(np.abs(np.asarray(outs[t]).reshape(ref[t].shape) - ref[t]))
                     / max(1e-12, float(np.max(np.abs(ref[t]))))) for t in graph.outputs}


def _bench(res: PlanResult, graph: Graph, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    return bench_encrypted(res, graph, options, seed=5)


CASES = [
    ("n12 wide 100x700", "n12", lambda: mvm_graph(100, 700)),
    ("n12 tall 700x100", "n12", lambda: mvm_graph(700, 100)),
    ("n12 mlp", "n12", _mlp),
    ("n13 square 1000x1000", "n13", lambda: mvm_graph(1000, 1000)),
]


@pytest.mark.parametrize(("name", "preset", "make"), CASES, ids=[c[0] for c in CASES])
def test_complex_plans_match_numpy_fused_and_unfused(name: str, preset: str, make: Any) -> None:
    graph = make()
    res = _plan(graph, preset)
    fused, err_f = _bench(res, graph, {"repeat": 1, "workers": 2})
    plain, err_p = _bench(res, graph, {"repeat": 1, "no_fuse": True})
    assert max(err_f.values()) < 1e-4, (name, err_f)
    assert max(err_p.values()) < 1e-4, (name, err_p)
    assert fused["fused_blocks"] >= 1 and plain["fused_blocks"] == 0
    # the conjugation counts as a key switch, as the plan's summary does
    assert fused["rotations"] == plain["rotations"] == res.plan["summary"]["rotations"]


def test_run_with_a_key_directory() -> None:
    """Run: the client writes the conjugation key with the rotation keys; keep-all makes it
    resident; the decrypted outputs match numpy."""
    graph = _mlp()
    res = _plan(graph, "n12")
    vals = random_values(graph, 7)
    out = run_plan(res.plan, {t: vals[t] for t in graph.inputs}, {t: vals[t] for t in graph.weights}, res.tables,
                   output_shapes={t: graph.shape(t) for t in graph.outputs})
    errs = _rel_errors(graph, out.outputs, vals)
    assert max(errs.values()) < 1e-4, errs
    assert out.stats["rotation_keys"] == res.plan["summary"]["rotation_keys"]
    assert out.stats["rotations"] == res.plan["summary"]["rotations"]


def test_runner_backend_lattigo_complex() -> None:
    """slotplan run's path (backends.runner) on a complex plan, on both back ends."""
    from backends.runner import run_plan as run_report

    graph = mvm_graph(100, 700)
    res = _plan(graph, "n12")
    for backend in ("sim", "lattigo"):
        rep = run_report(res.plan, res.tables, backend=backend, seed=2)
        assert rep.ok and rep.max_rel_error < (1e-9 if backend == "sim" else 1e-4), (backend, rep.max_rel_error)
        assert rep.rotations == res.plan["summary"]["rotations"]
