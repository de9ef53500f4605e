"""Bootstrapping plans end to end: placement, ranges and scaling, the simulator's checks,
the key block in the key schedule and the memory model, ``--params auto``."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from backends.runner import run_plan
from backends.sim import SimulationError, simulate
from common.errors import ValuesError
from planner.assign.candidates import PlanError
from planner.frontend.graph import Graph, parse_graph
from planner.frontend.params import PRESETS, Boot, Params
from planner.frontend.reference import random_values, reference
from planner.ir.analysis import memory_profile
from planner.keys.profile import KeyCapError
from planner.keys.schedule import schedule_plan
from planner.pipeline import PlanOptions, auto_params, plan_graph
from solver import SOLVERS
from tests.helpers import check_plan

N14BOOT = PRESETS["n14boot"]


def tiny_boot(levels: int = 3) -> Params:
    """A test-size bootstrapping ring: 512 slots, ``levels`` levels after a bootstrap."""
    return Params(
        10, (60, *[40] * levels), (61,), 40, name="tinyboot",
        boot=Boot("N16QP1546H192H32", levels, 1.0, (1, 2, 4, 8, 16, 32, 64, 128, 256), True, 10**8, 10**8,
                  (60, *[40] * levels, 50, 50, 50), (61,)),
    )


def tiny_boot_keys(levels: int = 3) -> Params:
    """``tiny_boot`` with the block's bytes those of its keys at this ring (10 Galois keys,
    relinearisation and encapsulation: 12 of the model's size) and 1 MB of matrices, so
    that streaming the block's Galois keys matters against a small plan's working set."""
    p = tiny_boot(levels)
    assert p.boot is not None
    gk = p.rotation_key_bytes(p.key_max_level)
    return Params(p.log_n, p.log_q, p.log_p, p.log_scale, name="tinyboot-keys",
                  boot=replace(p.boot, key_bytes=(p.boot.galois_keys + 2) * gk, matrix_bytes=10**6))


def mul_chain(n: int, weight_range: float | None = 1.0, x_range: tuple[float, float] | None = (-1.0, 1.0),
              size: int = 64) -> Graph:
    tensors: dict[str, Any] = {"x": {"shape": [size], "role": "input"}}
    if x_range is not None:
        tensors["x"]["range"] = list(x_range)
    nodes = []
    prev = "x"
    for i in range(n):
        tensors[f"w{i}"] = {"shape": [size], "role": "weight"}
        if weight_range is not None:
            tensors[f"w{i}"]["range"] = [-weight_range, weight_range]
        nodes.append({"id": f"m{i}", "op": "mul", "inputs": [prev, f"w{i}"]})
        prev = f"m{i}"
    return parse_graph({"schema": "slotplan.graph/1", "name": f"chain{n}", "tensors": tensors, "nodes": nodes,
                        "outputs": [prev]})


def plan(graph: Graph, params: Params, **opts: Any) -> Any:
    opts.setdefault("allow_insecure", True)
    return plan_graph(graph, params, PlanOptions(**opts))


@pytest.mark.parametrize("solver", SOLVERS)
def test_depth_22_chain_gets_two_bootstraps_and_simulates(solver: str) -> None:
    g = mul_chain(22)
    res = plan(g, N14BOOT, solver=solver)
    s = res.plan["summary"]
    assert s["bootstraps"] == 2 and s["depth"] <= 9
    assert s["bootstrapping"]["first_fit"]["bootstraps"] == 2
    assert res.plan["params"]["boot"]["literal"] == "N16QP1546H192H32"
    assert sum(n["bootstraps"] for n in res.plan["nodes"]) == 2
    check_plan(res, g)


def test_without_bootstrapping_params_a_deep_graph_is_refused() -> None:
    with pytest.raises(PlanError, match="levels"):
        plan(mul_chain(22), PRESETS["n14"])


def test_scaling_keeps_bootstrap_inputs_in_range() -> None:
    """Weights up to 3 in magnitude: values grow 3x per node, the plan scales by powers of
    two before each bootstrap and back after; the simulator's range check passes."""
    g = mul_chain(10, weight_range=3.0)
    res = plan(g, tiny_boot(3))
    bt = res.plan["summary"]["bootstrapping"]
    assert res.plan["summary"]["bootstraps"] >= 3
    assert bt["scales"] and all(v > 1 and v & (v - 1) == 0 for v in bt["scales"].values())
    for v, s in bt["scales"].items():
        assert bt["bounds"][v] / s <= 1.0 < bt["bounds"][v]
    check_plan(res, g)
    # without the scaling the bootstrap input would be out of range: the simulator says so
    prog = [i for i in res.plan["program"]]
    first_boot = next(k for k, i in enumerate(prog) if i["op"] == "bootstrap")
    src = prog[first_boot]["src"]
    scale_in = next(i for i in prog if i.get("dst") == src)  # the rescale after the 1/s pmul
    pm = next(i for i in prog if i.get("dst") == scale_in["src"])
    assert pm["op"] == "pmul"
    bad = dict(res.plan)
    bad["program"] = [dict(i, src=pm["src"]) if k == first_boot else i for k, i in enumerate(prog)]
    vals = random_values(g, 0)
    vals = {k: (np.full_like(v, 3.0) if k.startswith("w") else np.ones_like(v)) for k, v in vals.items()}
    with pytest.raises(SimulationError, match=r"instruction \d+ \(bootstrap .*\): \|value\| .* exceeds boot.max_abs"):
        simulate(bad, res.tables, vals)


def test_bootstrap_scaling_costs_no_level(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scaled bootstrap costs no level of its own within the bounds of its fields: the
    node's plaintext products take the 1/s (``boot_prescaled``) or the bootstrap relabels its
    source's scale (``in_scale``, up to 2^12), and the full bootstrap multiplies its result by
    the integer ``s`` exactly (``scale``, up to 2^20); beyond them a product takes it (the
    chain's bounds reach 3^12). Without the prescaled candidates the plan needs no fewer
    bootstraps; both plans equal numpy with every bootstrap input within max_abs, and the
    validator accepts them (check_plan)."""
    from planner.assign import problem
    from planner.lower import lowering

    g = mul_chain(12, weight_range=3.0)
    res = plan(g, tiny_boot(3))
    check_plan(res, g)

    from planner.ir.instructions import MAX_BOOT_IN_SCALE, MAX_BOOT_SCALE

    def check(r: Any) -> set[str]:
        prog = r.plan["program"]
        made = {i["dst"]: i for i in prog if "dst" in i}
        pre = {n["id"] for n in r.plan["nodes"] if n.get("boot_prescaled")}
        scales = r.plan["summary"]["bootstrapping"]["scales"]
        assert set(scales) and max(scales.values()) > MAX_BOOT_IN_SCALE  # the bounds below are exercised
        boot_pt = {p for p, v in r.plan["plaintexts"].items() if v["table"].startswith("pt/boot/")}
        for n in r.plan["nodes"]:
            a, b = n["span"]
            s = scales.get(n["id"], 1)
            products = [i for i in prog[a:b] if i["op"] == "pmul" and i["pt"] in boot_pt]
            boots = [i for i in prog[a:b] if i["op"] == "bootstrap"]
            # a product of its own only beyond the bounds: 1/s before where in_scale cannot
            # take it (and the node's products do not), s after where the integer scale cannot
            assert len(products) == len(boots) * (int(s > MAX_BOOT_IN_SCALE and n["id"] not in pre)
                                                  + int(s > MAX_BOOT_SCALE))
            for bt in boots:
                assert bt.get("scale", 1) == (s if s <= MAX_BOOT_SCALE else 1)
                assert bt.get("in_scale", 1) == (1 if n["id"] in pre or s > MAX_BOOT_IN_SCALE else s)
                src = made[bt["src"]]
                if n["id"] in pre:  # the node's weight product, scaled
                    assert src["op"] == "rescale" and made[src["src"]]["op"] == "pmul"
        return pre

    check(res)
    for mod in (problem, lowering):
        monkeypatch.setattr(mod, "result_absorbs", lambda c, slots: False)
    res0 = plan(g, tiny_boot(3))
    check_plan(res0, g)
    assert not check(res0)
    # (beyond in_scale's bound the unprescaled plan pays products: never fewer bootstraps)
    assert res0.plan["summary"]["bootstraps"] >= res.plan["summary"]["bootstraps"]


def test_a_residual_sum_takes_its_scaling_as_in_scale() -> None:
    """An ``add`` of two encrypted values cannot take the 1/s in its own products (it would
    have to reach both operands, one of them read elsewhere): its bootstrap relabels the
    source's scale (``in_scale``), no product and no level before it."""
    g = parse_graph({"schema": "slotplan.graph/1", "name": "residual", "tensors": {
        "x": {"shape": [64], "role": "input", "range": [-1, 1]},
        **{f"w{i}": {"shape": [64], "role": "weight", "range": [-3, 3]} for i in range(4)}},
        "nodes": [{"id": "m0", "op": "mul", "inputs": ["x", "w0"]},
                  {"id": "m1", "op": "mul", "inputs": ["m0", "w1"]},
                  {"id": "r", "op": "add", "inputs": ["m1", "m0"]},
                  {"id": "m2", "op": "mul", "inputs": ["r", "w2"]},
                  {"id": "m3", "op": "mul", "inputs": ["m2", "w3"]},
                  {"id": "y", "op": "mul", "inputs": ["m3", "r"]}],
        "outputs": ["y"]})
    from planner.assign.problem import build_problem

    params = tiny_boot(2)
    prob = build_problem(g, params, PlanOptions(allow_insecure=True))
    assert prob.boot_scales["r"] > 1 and prob.boot_scales["m1"] > 1
    assert set(prob.model.group("r").boot_pres) == {0}
    assert set(prob.model.group("m1").boot_pres) == {0}
    assert prob.model.group("r").boot_post == 0
    res = plan(g, params)
    check_plan(res, g)
    prog = res.plan["program"]
    for n in res.plan["nodes"]:
        a, b = n["span"]
        assert not any(i["op"] == "pmul" and i["pt"].startswith("pt/boot/") for i in prog[a:b])
        if n["id"] == "r" and n["bootstraps"]:
            (bt,) = [i for i in prog[a:b] if i["op"] == "bootstrap"]
            assert bt["in_scale"] == prob.boot_scales["r"] == bt["scale"]


def test_unknown_range_is_refused_naming_the_tensor() -> None:
    with pytest.raises(PlanError) as ei:
        plan(mul_chain(22, x_range=None), N14BOOT)
    msg = str(ei.value)
    assert "input 'x' has no `range`" in msg and "must be bootstrapped" in msg
    # shallow enough: no bootstrap needed, no range needed
    assert plan(mul_chain(5, x_range=None), N14BOOT).plan["summary"]["bootstraps"] == 0


def test_run_checks_the_assumed_ranges() -> None:
    g = mul_chain(12, weight_range=None)  # weights assumed in [-1, 1]
    res = plan(g, tiny_boot(4))
    assert res.plan["summary"]["bootstrapping"]["assumed_ranges"]["w0"] == [-1.0, 1.0]
    rep = run_plan(res.plan, res.tables, "sim", seed=1)
    assert rep.ok
    from backends.runner import check_assumed_ranges

    vals = random_values(g, 0)
    vals["w3"] = vals["w3"] * 5.0
    with pytest.raises(ValuesError, match="tensor 'w3': values in .* outside the range"):
        check_assumed_ranges(res.plan, reference(g, vals))


def test_node_range_promise_replaces_an_unbounded_interval() -> None:
    raw = json.loads(json.dumps(mul_chain(12, weight_range=None, x_range=None).to_json()))
    for n in raw["nodes"]:
        n["range"] = [-1.0, 1.0]
    g = parse_graph(raw)
    res = plan(g, tiny_boot(4))
    assert res.plan["summary"]["bootstraps"] >= 2
    assert res.plan["summary"]["bootstrapping"]["assumed_ranges"]["m0"] == [-1.0, 1.0]
    check_plan(res, g)


def conv_stack(depth: int, c: int = 2, hw: int = 4) -> Graph:
    tensors: dict[str, Any] = {"x": {"shape": [c, hw, hw], "role": "input", "range": [-1.0, 1.0]}}
    nodes: list[dict[str, Any]] = []
    prev = "x"
    for i in range(depth):
        tensors[f"k{i}"] = {"shape": [c, c, 3, 3], "role": "weight", "range": [-0.05, 0.05]}
        nodes.append({"id": f"c{i}", "op": "conv2d", "inputs": [prev, f"k{i}"], "padding": [1, 1]})
        # (concave: two levels, no fold)
        nodes.append({"id": f"a{i}", "op": "poly", "inputs": [f"c{i}"], "coeffs": [0.0, 0.5, -0.25]})
        prev = f"a{i}"
    return parse_graph({"schema": "slotplan.graph/1", "name": f"convs{depth}", "tensors": tensors,
                        "nodes": nodes, "outputs": [prev]})


def test_solvers_agree_on_bootstraps_of_conv_graphs() -> None:
    g = conv_stack(4)
    counts = {}
    for solver in SOLVERS:
        res = plan(g, tiny_boot(4), solver=solver)
        counts[solver] = (res.plan["summary"]["bootstraps"], res.plan["summary"]["solver"]["objective"])
        check_plan(res, g)
    assert len(set(counts.values())) == 1, counts
    assert next(iter(counts.values()))[0] >= 2


def test_keep_all_memory_holds_the_block_and_its_offsets() -> None:
    res = plan(conv_stack(4), tiny_boot(4))
    p = res.plan
    params = Params.from_json(p["params"])
    assert params.boot is not None
    peak = memory_profile(p["program"], params)
    assert peak["keys"] >= params.boot.block_bytes
    from planner import ir

    offs = ir.rot_keys_of([ir.decode(i) for i in p["program"]])
    own = [k for k in offs if k not in params.boot.key_offsets]
    assert peak["keys"] == params.boot.block_bytes + len(own) * params.rotation_key_bytes()


def test_key_schedule_with_the_block_and_cap_refusal() -> None:
    g = conv_stack(4)
    res = plan(g, tiny_boot(4))
    params = Params.from_json(res.plan["params"])
    assert params.boot is not None
    from planner.keys.residency import BOOT_STREAM_DEPTH

    block = params.boot.block_bytes
    streamed = params.boot_block_bytes(BOOT_STREAM_DEPTH)
    assert streamed == block - (params.boot.galois_keys - BOOT_STREAM_DEPTH - 1) * params.rotation_key_bytes(
        params.key_max_level)
    with pytest.raises(KeyCapError) as ei:
        schedule_plan(res.plan, block // 2, "exact")
    # below the whole block, the block's Galois keys are streamed (the floor: the streamed
    # block and one step's working set)
    assert block > ei.value.min_cap > streamed and "bootstrapping key block" in str(ei.value)
    assert "streamed" in str(ei.value)
    new, sched = schedule_plan(res.plan, ei.value.min_cap, "exact")
    prog = new["program"]
    assert [i for i in prog if i["op"] == "load_key" and i.get("block") == "boot"] == [
        {"op": "load_key", "block": "boot", "stream": BOOT_STREAM_DEPTH}]
    whole, _ = schedule_plan(res.plan, 2 * block, "exact")
    assert [i for i in whole["program"] if i["op"] == "load_key" and i.get("block") == "boot"] == [
        {"op": "load_key", "block": "boot"}]
    assert new["summary"]["peak_bytes"]["total"] <= ei.value.min_cap
    # the schedule runs in the simulator: rotations find their keys (or the block's),
    # bootstraps find the block
    vals = random_values(g, 0)
    out = simulate(new, res.tables, vals)
    ref = reference(g, vals)
    assert np.allclose(out.outputs[g.outputs[0]], ref[g.outputs[0]], rtol=1e-9, atol=1e-12)
    # a bootstrap without the block resident is refused
    broken = dict(new)
    broken["program"] = [i for i in prog if not (i["op"] == "load_key" and i.get("block") == "boot")
                         and not (i["op"] == "drop_key" and i.get("block") == "boot")]
    loaded = {i["k"] for i in prog if i["op"] == "load_key" and "k" in i}
    broken["program"].insert(0, {"op": "load_key", "k": min(set(range(1, 512)) - loaded)})
    with pytest.raises(SimulationError, match="key block 'boot' is not resident|no key"):
        simulate(broken, res.tables, vals)


def test_sim_block_serves_rotations_of_its_offsets() -> None:
    p = tiny_boot(3)
    plan_doc: dict[str, Any] = {
        "params": p.to_json(), "plaintexts": {}, "outputs": {"y": [4]},
        "program": [
            {"op": "input", "dst": "a", "tensor": "x", "table": "t"},
            {"op": "load_key", "block": "boot"},
            {"op": "rot", "dst": "b", "src": "a", "k": 2},
            {"op": "bootstrap", "dst": "c", "src": "b"},
            {"op": "drop_key", "block": "boot"},
            {"op": "output", "src": "c", "tensor": "y", "table": "t"},
        ],
    }
    idx = np.full(p.slots, -1)
    idx[:4] = [0, 1, 2, 3]
    tables = {"t.idx": idx}
    out = simulate(plan_doc, tables, {"x": np.array([0.1, 0.2, 0.3, 0.4])})
    assert out.counts["bootstrap"] == 1
    plan_doc["program"][2]["k"] = 3  # not a block offset: needs its own key
    with pytest.raises(SimulationError, match="no key for k=3"):
        simulate(plan_doc, tables, {"x": np.array([0.1, 0.2, 0.3, 0.4])})


def test_params_auto() -> None:
    assert auto_params(mul_chain(3), PlanOptions()).name == "n13"  # 3 levels
    assert auto_params(mul_chain(8), PlanOptions()).name == "n14"  # 8
    assert auto_params(mul_chain(9), PlanOptions()).name == "n15"  # 15
    assert auto_params(mul_chain(23), PlanOptions()).name == "n16boot"


def _brute(model: Any, limit: int = 20000) -> int | None | str:
    import itertools

    sizes = [len(g.costs) for g in model.groups]
    bootable = [g.name for g in model.bootable()]
    if math.prod(sizes) * 2 ** len(bootable) > limit:
        return "skip"
    best = None
    for combo in itertools.product(*[range(n) for n in sizes]):
        choice = {g.name: o for g, o in zip(model.groups, combo, strict=True)}
        for r in range(len(bootable) + 1):
            for boots in itertools.combinations(bootable, r):
                v = model.evaluate_boots(choice, boots)
                if v is not None and (best is None or v < best):
                    best = v
    return best


@pytest.mark.parametrize("seed", range(12))
def test_random_networks_with_bootstraps_brute_force_and_solvers(seed: int) -> None:
    from tests.random_networks import random_network

    raw, _ = random_network(seed)
    raw["tensors"]["x"]["range"] = [-1.0, 1.0]
    g = parse_graph(raw)
    params = tiny_boot(3)
    results = {}
    for solver in SOLVERS:
        try:
            res = plan(g, params, solver=solver)
        except PlanError as e:  # a single node deeper than 3 levels cannot be planned at all
            results[solver] = ("refused", str(e)[:40])
            continue
        s = res.plan["summary"]
        results[solver] = (s["bootstraps"], s["solver"]["objective"])
        check_plan(res, g)
        want = _brute(res.problem.model)
        if want != "skip":
            assert s["solver"]["objective"] == want
        if s["bootstraps"] and solver == SOLVERS[0]:
            _check_streamed_schedule(res, g)
    assert len(set(results.values())) == 1, results


def _check_streamed_schedule(res: Any, g: Graph) -> bool:
    """At the smallest feasible cap (on params whose key bytes are the model's:
    ``tiny_boot_keys``) the schedule holds the block ``boot`` once, streamed or whole, stays
    under the cap and simulates to numpy's result with strict residency. Whether it streams
    the block's Galois keys: where the peak lies outside the bootstraps, the whole block fits
    the smallest cap too and is preferred (planner.keys.residency._boot_spans)."""
    from planner.keys.residency import BOOT_STREAM_DEPTH

    boot = Params.from_json(res.plan["params"]).boot
    assert boot is not None
    plan_ = {**res.plan, "params": tiny_boot_keys(boot.levels_after).to_json()}
    with pytest.raises(KeyCapError) as ei:
        schedule_plan(plan_, 1, "exact")
    cap = ei.value.min_cap
    new, sched = schedule_plan(plan_, cap, "exact")
    block = [i for i in new["program"] if i["op"] == "load_key" and "block" in i]
    streamed = block == [{"op": "load_key", "block": "boot", "stream": BOOT_STREAM_DEPTH}]
    assert streamed or block == [{"op": "load_key", "block": "boot"}], block
    assert new["summary"]["peak_bytes"]["total"] <= cap
    vals = random_values(g, 1)
    out = simulate(new, res.tables, vals)
    ref = reference(g, vals)
    for t in g.outputs:
        assert np.allclose(out.outputs[t], ref[t], rtol=1e-9, atol=1e-9)
    return streamed


def test_calibrated_ranges_tighten_bootstrap_scales_and_hold() -> None:
    """planner.frontend.ranges.calibrated_graph: weights get their exact hull, nodes the hull of
    their values on the samples widened by the margin; the bootstrap bounds shrink to
    what the values reach, the plan still simulates exactly, and run refuses data whose
    node values leave a promised range."""
    from planner.frontend.ranges import CALIBRATION_MARGIN, calibrated_graph

    g = conv_stack(6)
    vals = random_values(g, 0, "fan-in")
    weights = {t: vals[t] for t in g.weights}
    samples = [random_values(g, s, "fan-in") for s in range(1, 5)]
    cg = calibrated_graph(g, weights, samples)
    for t in g.weights:
        assert cg.tensor(t).range == (float(weights[t].min()), float(weights[t].max()))
    refs = [reference(g, {**weights, "x": s["x"]}) for s in samples]
    for node in g.nodes:
        lo, hi = cg.tensor(node.id).range  # type: ignore[misc]
        vmin = min(float(r[node.id].min()) for r in refs)
        vmax = max(float(r[node.id].max()) for r in refs)
        pad = (CALIBRATION_MARGIN - 1) * max(abs(vmin), abs(vmax))
        assert (lo, hi) == pytest.approx((vmin - pad, vmax + pad))
    loose = plan(g, tiny_boot(4))
    tight = plan(cg, tiny_boot(4))
    lb, tb = loose.plan["summary"]["bootstrapping"]["bounds"], tight.plan["summary"]["bootstrapping"]["bounds"]
    common = set(lb) & set(tb)
    assert common and all(tb[v] < lb[v] for v in common)
    rep = run_plan(tight.plan, tight.tables, "sim", values={**weights, "x": vals["x"]})
    assert rep.ok, rep.max_rel_error
    # calibrated on one sample without a margin, other data leaves some node's range
    exact = plan(calibrated_graph(g, weights, samples[:1], margin=1.0), tiny_boot(4))
    with pytest.raises(ValuesError, match="outside the range"):
        run_plan(exact.plan, exact.tables, "sim", values={**weights, "x": vals["x"]})


def test_streamed_block_memory_follows_the_executor() -> None:
    """A streamed block holds no Galois key until its first bootstrap and D + 1 from then
    on (the key handed out last, D read ahead along the predicted order); loaded again, it
    reads D ahead at once (bootstream.go, bootorder.go)."""
    from planner.ir.analysis import memory_series

    params = PRESETS["n14boot"]
    d = 2
    prog = [
        {"op": "input", "dst": "x", "tensor": "x", "table": "in/x"},  # 0
        {"op": "load_key", "block": "boot", "stream": d},  # 1
        {"op": "bootstrap", "dst": "b1", "src": "x"},  # 2
        {"op": "add", "dst": "s1", "a": "b1", "b": "b1"},  # 3
        {"op": "bootstrap", "dst": "b2", "src": "s1"},  # 4
        {"op": "add", "dst": "s2", "a": "b2", "b": "b2"},  # 5
        {"op": "drop_key", "block": "boot"},  # 6
        {"op": "load_key", "block": "boot", "stream": d},  # 7
        {"op": "bootstrap", "dst": "b3", "src": "s2"},  # 8
        {"op": "output", "src": "b3", "tensor": "y", "table": "out/y"},  # 9
    ]
    keys = memory_series(prog, params)["keys"]
    held = [params.boot_stream_bytes(n) for n in range(d + 2)]
    assert list(keys) == [0, held[0], held[d + 1], held[d + 1], held[d + 1], held[d + 1], held[d + 1], held[d],
                          held[d + 1], held[d + 1]]
    assert max(keys) == params.boot_block_bytes(d)


def _dense_poly_chain(blocks: int, n: int = 16) -> Graph:
    """``blocks`` times a matvec (a dirty result: partial sums in its free slots) and a
    degree-3 poly of it (p(0) != 0: dirty whatever its input), from x in [-1, 1]."""
    tensors: dict[str, Any] = {"x": {"shape": [n], "role": "input", "range": [-1, 1]}}
    nodes = []
    prev = "x"
    for i in range(blocks):
        tensors[f"w{i}"] = {"shape": [n, n], "role": "weight", "range": [-0.05, 0.05]}
        nodes.append({"id": f"h{i}", "op": "matvec", "inputs": [f"w{i}", prev]})
        nodes.append({"id": f"a{i}", "op": "poly", "inputs": [f"h{i}"], "coeffs": [0.1, 0.5, 0.0, 0.125]})
        prev = f"a{i}"
    return parse_graph({"schema": "slotplan.graph/1", "name": "dense_poly", "tensors": tensors,
                        "nodes": nodes, "outputs": [prev]})


def test_a_dirty_poly_result_takes_its_mask_in_the_poly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A poly whose result is dirty (the free slots of a matvec's layout hold partial sums,
    and p(0) != 0 would not clear them anyway) is masked before a bootstrap; the mask (with
    the bootstrap's 1/s) is the poly's own ``mask`` (Lattigo's PolynomialVector, no level),
    not a product after it. The plan equals numpy; without the masked polys the plan has
    products in their place and no fewer bootstraps."""
    from planner.assign import problem
    from planner.ir.builder import ProgramBuilder

    g = _dense_poly_chain(4)
    params = tiny_boot(3)
    res = plan(g, params)
    check_plan(res, g)
    prog = res.plan["program"]
    made = {i["dst"]: i for i in prog if "dst" in i}
    masked = [i for i in prog if i["op"] == "poly" and "mask" in i]
    assert masked and all(i["mask"] in res.plan["plaintexts"] for i in masked)
    poly_boots = 0
    for n in res.plan["nodes"]:  # a poly node's bootstrap reads its masked poly directly
        a, b = n["span"]
        for bt in (i for i in prog[a:b] if i["op"] == "bootstrap"):
            if n["op"] == "poly":
                poly_boots += 1
                assert made[bt["src"]]["op"] == "poly" and "mask" in made[bt["src"]]
    assert poly_boots >= 1
    # the mask is the used slots times 1/s: the simulator and numpy agree above (check_plan),
    # and a mask that zeroed a used slot would not
    monkeypatch.setattr(problem, "result_masks", lambda c, slots: False)
    monkeypatch.setattr(ProgramBuilder, "maskable_poly", lambda self, reg, since=0: None)
    res0 = plan(g, params)
    check_plan(res0, g)
    assert not any(i["op"] == "poly" and "mask" in i for i in res0.plan["program"])
    s, s0 = res.plan["summary"], res0.plan["summary"]
    assert s0["bootstraps"] >= s["bootstraps"] and s0["pmul"] > s["pmul"]


@pytest.mark.parametrize("n", [700, 1000])
def test_masked_polys_on_a_tensor_of_two_ciphertexts(n: int) -> None:
    """n (not a power of two) elements over two ciphertexts of 512 slots, each with free
    slots: a poly with p(0) != 0 leaves them dirty, and at 2 levels every bootstrap after a
    poly takes the mask in the poly, one per ciphertext (each its own table of used slots).
    The plan equals numpy, and its layout claims hold (check_plan)."""
    t: dict[str, Any] = {"x": {"shape": [n], "role": "input", "range": [-1, 1]}}
    nodes: list[dict[str, Any]] = []
    prev = "x"
    for i in range(4):
        t[f"w{i}"] = {"shape": [n], "role": "weight", "range": [-0.5, 0.5]}
        nodes += [{"id": f"a{i}", "op": "poly", "inputs": [prev], "coeffs": [0.1, 0.5, 0.0, 0.125]},
                  {"id": f"m{i}", "op": "mul", "inputs": [f"a{i}", f"w{i}"]}]
        prev = f"m{i}"
    g = parse_graph({"schema": "slotplan.graph/1", "name": "two_ct_polys", "tensors": t, "nodes": nodes,
                     "outputs": [prev]})
    res = plan(g, tiny_boot(2))
    check_plan(res, g)
    prog = res.plan["program"]
    made = {i["dst"]: i for i in prog if "dst" in i}
    masked = [b for b in prog if b["op"] == "bootstrap" and made[b["src"]]["op"] == "poly" and "mask" in made[b["src"]]]
    assert len(masked) >= 2 and len(masked) % 2 == 0
    assert len({made[b["src"]]["mask"] for b in masked}) == len(masked)  # one mask per ciphertext
    assert all(n["out_layout"].startswith("ct[c/512:2]") for n in res.plan["nodes"] if n["id"].startswith("a"))


# a degree-8 Chebyshev fit of ReLU over [-0.3, 0.95] (4 levels; degree 8 is evaluated as
# a Chebyshev series, not expanded into monomials: planner.assign.candidates)
RELU8 = [0.3891, 0.5099, 0.0823, -0.0428, 0.0106, 0.0067, -0.0095, 0.0041, 0.0012]


def _relu_block(tensors: dict[str, Any], nodes: list[dict[str, Any]], i: str, prev: str, n: int, w: float,
                domain: tuple[float, float], top: float, residual: bool = False) -> str:
    """Append ``a{i} = RELU8((W{i} prev + b{i}) [+ prev])`` (weights within +-w, the bias
    within +-0.05, the poly's promised range [-0.05, top]); returns ``a{i}``."""
    tensors[f"w{i}"] = {"shape": [n, n], "role": "weight", "range": [-w, w]}
    tensors[f"b{i}"] = {"shape": [n], "role": "weight", "range": [-0.05, 0.05]}
    nodes += [{"id": f"h{i}", "op": "matvec", "inputs": [f"w{i}", prev]},
              {"id": f"z{i}", "op": "add", "inputs": [f"h{i}", f"b{i}"]}]
    src = f"z{i}"
    if residual:
        nodes.append({"id": f"s{i}", "op": "add", "inputs": [f"z{i}", prev]})
        src = f"s{i}"
    nodes.append({"id": f"a{i}", "op": "poly", "inputs": [src], "basis": "chebyshev", "domain": list(domain),
                  "coeffs": RELU8, "range": [-0.05, top]})
    return f"a{i}"


def _cheb_chain(blocks: int, n: int = 16, domain: tuple[float, float] = (-0.3, 0.95)) -> Graph:
    """``blocks`` times a matvec, a bias and a Chebyshev poly over ``domain`` (narrower than
    2: its change of variable multiplies by 2 / (b - a) > 1), from x in [-1, 1]; each poly
    promises its range (as the ONNX importer's calibrated fits do). The bias sum's interval
    bound (16 x 0.055 + 0.05 = 0.93, beyond the calibrated-like domain's -0.3) times that
    factor (1.6) leaves the bootstrap's range (max_abs 1): folded, its bootstrap scale is 2
    where the unscaled value's is 1."""
    tensors: dict[str, Any] = {"x": {"shape": [n], "role": "input", "range": [-1, 1]}}
    nodes: list[dict[str, Any]] = []
    prev = "x"
    for i in range(blocks):
        prev = _relu_block(tensors, nodes, str(i), prev, n, 0.055, domain, 1.0)
    return parse_graph({"schema": "slotplan.graph/1", "name": "cheb_chain", "tensors": tensors,
                        "nodes": nodes, "outputs": [prev]})


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_narrow_chebyshev_domain_folds_at_a_bootstrapping_preset(solver: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Chebyshev poly over a domain narrower than 2 multiplies its input by more than 1:
    its producers take the factor (no level; planner.assign.fold) and a bootstrapped
    producer scales its bootstrap for the scaled value's bound (session 35: such factors
    were refused, one level more per poly: the ONNX ResNet-20's second and third stages).
    Each block's poly costs its 4 levels; without the folds the change of variable takes
    a fifth and a block (matvec, change of variable, poly) needs 6 levels: no plan fits 5.
    The plan equals numpy with every bootstrap input within max_abs (check_plan)."""
    from planner.assign import problem
    from planner.frontend.ranges import boot_scale

    g = _cheb_chain(4)
    params = tiny_boot(5)
    prob = problem.build_problem(g, params, PlanOptions(allow_insecure=True, solver=solver))
    res = plan(g, params, solver=solver)
    check_plan(res, g)
    nodes = {n["id"]: n for n in res.plan["nodes"]}
    alpha = 2 / (0.95 + 0.3)
    for i in range(4):
        assert nodes[f"a{i}"]["params"]["input_scaled_by"] == pytest.approx(alpha)
        assert nodes[f"z{i}"]["params"]["scaled_by"] == pytest.approx(alpha)
        assert nodes[f"a{i}"]["cost"]["depth"] - (1 if nodes[f"a{i}"]["params"].get("output_mask") else 0) == 4
    s = res.plan["summary"]
    scales = s["bootstrapping"]["scales"]
    raised = 0
    for v in s["bootstrapping"]["values"]:  # a scaled value's bootstrap scale is its own
        bound, f = prob.ranges.bound(v), nodes[v]["params"].get("scaled_by", 1.0)
        assert bound is not None and scales.get(v, 1) == prob.boot_scales[v] == boot_scale(bound * max(1.0, f), 1.0)
        raised += boot_scale(bound * f, 1.0) > boot_scale(bound, 1.0)
    assert raised >= 1 and s["depth"] <= 5
    monkeypatch.setattr(problem, "add_scaled_variants", lambda *a, **k: None)
    with pytest.raises(PlanError, match="fits the 5 levels"):  # matvec, change of variable, poly: 6
        plan(g, params, solver=solver)


def _residual_cheb(blocks: int = 2, n: int = 16) -> Graph:
    """Residual blocks ``s = (matvec(a) + bias) + a`` (``a`` read by the matvec and the sum:
    its producer cannot take a factor) each followed by a Chebyshev poly over a domain
    narrower than 2, as in ResNet-20's basic blocks."""
    tensors: dict[str, Any] = {"x": {"shape": [n], "role": "input", "range": [-1, 1]}}
    nodes: list[dict[str, Any]] = []
    prev = _relu_block(tensors, nodes, "", "x", n, 0.055, (-0.3, 0.95), 1.0)
    for i in range(blocks):
        prev = _relu_block(tensors, nodes, str(i), prev, n, 0.02, (-0.4, 1.3), 1.4, residual=True)
    return parse_graph({"schema": "slotplan.graph/1", "name": "residual_cheb", "tensors": tensors,
                        "nodes": nodes, "outputs": [prev]})


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_residual_sum_scales_its_skip_by_a_product_and_the_poly_folds(solver: str) -> None:
    """A Chebyshev poly after a residual sum ``z + a`` (``a`` also read by the block's
    matvec): the sum's scaled variant takes the factor up ``z``'s chain (the bias, the
    matvec's weights: no level) and multiplies ``a`` by it on its edge (one product, one
    level on the skip, which arrives levels below ``z``), so the poly costs its own 4 levels
    and no change of variable (session 35: the ONNX ResNet-20's ReLUs after residual sums).
    The plan equals numpy, layout and scale claims included (check_plan)."""
    g = _residual_cheb(2)
    for params in (tiny_boot(6), PRESETS["n16"]):
        res = plan(g, params, solver=solver)
        check_plan(res, g)
        nodes = {n["id"]: n for n in res.plan["nodes"]}
        prog = res.plan["program"]
        scaled_pt = {p for p, v in res.plan["plaintexts"].items() if v["table"].startswith("pt/const/operand-scale")}
        alpha = 2 / (1.3 + 0.4)
        for i, skip in enumerate(("a", "a0")):
            s = nodes[f"s{i}"]
            assert s["params"]["scaled_by"] == pytest.approx(alpha)
            assert s["params"]["scaled_operands_by_product"] == [skip]
            assert {"operand": skip, "kind": "scale", "factor": s["params"]["scaled_by"]} in s["conversions"]
            a, b = s["span"]
            assert sum(1 for ins in prog[a:b] if ins["op"] == "pmul" and ins["pt"] in scaled_pt) == 1
            assert nodes[f"z{i}"]["params"]["scaled_by"] == pytest.approx(alpha)
            assert nodes[f"a{i}"]["params"]["input_scaled_by"] == pytest.approx(alpha)
            assert nodes[f"a{i}"]["cost"]["depth"] - (1 if nodes[f"a{i}"]["params"].get("output_mask") else 0) == 4
