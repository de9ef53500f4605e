"""Small graph builders and a plan-and-simulate check shared by the tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from backends.sim import simulate
from planner.graph import Graph, parse_graph
from planner.params import Params
from planner.pipeline import PlanOptions, PlanResult, plan_graph
from planner.reference import random_values, reference


def small_params(log_n: int = 10, levels: int = 4) -> Params:
    """A test-size ring (log_n 10 = 512 slots) so small tensors span several ciphertexts."""
    return Params(log_n=log_n, log_q=(50,) + (40,) * levels, log_p=(50,), log_scale=40, name=f"test{log_n}")


def matvec_graph(n: int, k: int) -> Graph:
    return parse_graph({
        "schema": "slotplan.graph/1", "name": f"mv{n}x{k}",
        "tensors": {"W": {"shape": [n, k], "role": "weight"}, "x": {"shape": [k], "role": "input"}},
        "nodes": [{"id": "y", "op": "matvec", "inputs": ["W", "x"]}], "outputs": ["y"],
    })


def conv_graph(c: int, h: int, w: int, co: int, k1: int, k2: int, stride: tuple[int, int],
               padding: tuple[int, int], groups: int) -> Graph:
    return parse_graph({
        "schema": "slotplan.graph/1", "name": "conv",
        "tensors": {"x": {"shape": [c, h, w], "role": "input"},
                    "w": {"shape": [co, c // groups, k1, k2], "role": "weight"}},
        "nodes": [{"id": "y", "op": "conv2d", "inputs": ["x", "w"], "stride": list(stride),
                   "padding": list(padding), "groups": groups}],
        "outputs": ["y"],
    })


def check_plan(res: PlanResult, graph: Graph, seed: int = 0, rtol: float = 1e-9) -> dict[str, Any]:
    from backends.layout_check import check_claims, claimed_registers

    vals = random_values(graph, seed)
    ref = reference(graph, vals)
    out = simulate(res.plan, res.tables, vals, keep=claimed_registers(res))
    for t in graph.outputs:
        want = ref[t]
        got = out.outputs[t]
        scale = max(1.0, float(np.max(np.abs(want))))
        err = float(np.max(np.abs(got - want))) / scale
        assert err < rtol, f"{t}: relative error {err:.3e}"
    # the summary is the program's own count
    assert out.rotations == res.plan["summary"]["rotations"]
    # every layout the lowering claims (node outputs, conversions) holds on the registers
    if res.claims:
        bad = check_claims(res, vals, out)
        assert not bad, "\n".join(map(str, bad))
    return {"rotations": out.rotations}


def plan_and_check(graph: Graph, params: Params, **opts: Any) -> PlanResult:
    opts.setdefault("allow_insecure", True)  # the test-size rings are below 128 bits
    res = plan_graph(graph, params, PlanOptions(**opts))
    check_plan(res, graph)
    return res


def bench_encrypted(res: PlanResult, graph: Graph, options: dict[str, Any], seed: int = 3
                    ) -> tuple[dict[str, Any], dict[str, float]]:
    """Run a plan with Lattigo's ``BenchPlan`` on seeded random values: (stats, relative
    error per output against numpy)."""
    import json

    from backends.lattigo_backend import _call, _ext, go_plan_json, pack_vectors
    from backends.lattigo_bench import _scatter

    vals = random_values(graph, seed)
    pin, ppt = pack_vectors(res.plan, {t: vals[t] for t in graph.inputs}, {t: vals[t] for t in graph.weights},
                            res.tables)
    mod, go = _ext()
    raw = json.loads(_call(mod.BenchPlan, go_plan_json(res.plan), go.Slice_byte.from_bytes(pin),
                           go.Slice_byte.from_bytes(ppt), json.dumps(options)))
    outs = _scatter(raw["outputs"], res.tables, {t: graph.shape(t) for t in graph.outputs})
    ref = reference(graph, vals)
    errs = {t: float(np.max(np.abs(np.asarray(outs[t]).reshape(ref[t].shape) - ref[t]))
                     / max(1e-12, float(np.max(np.abs(ref[t]))))) for t in graph.outputs}
    return raw["stats"], errs
