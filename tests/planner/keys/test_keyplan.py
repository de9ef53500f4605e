"""Memory caps that bind (planner.keys.joint, solver.keyplan_model, solver.keyset_model).

Every joint schedule is run by the simulator with strict key residency and key levels
against numpy; the modelled peak must stay under the cap; hoisted groups must split when
the cap is below a group's keys; the CP-SAT models agree with z3 and with brute force on
small problems.  No timing asserts.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import numpy as np
import pytest

from backends.sim import simulate
from planner import ir
from planner.cost.timing import modelled_time, time_model
from planner.frontend.graph import parse_graph
from planner.frontend.params import load_params
from planner.frontend.reference import random_values, reference
from planner.ir.hoisting import collapse, fully_split
from planner.keys.joint import plan_joint
from planner.keys.profile import KeyCapError
from planner.keys.schedule import schedule_keys, schedule_plan
from planner.pipeline import PlanOptions, plan_graph
from solver import keyplan_model, keyset_model
from tests.helpers import REPO_ROOT, check_plan, small_params
from tests.random_networks import random_network


def convnet(n_conv: int = 2, c: int = 3, h: int = 16, co: int = 8) -> dict[str, Any]:
    """Convolutions (3x3, pad 1) with squares between."""
    tensors: dict[str, Any] = {"x": {"shape": [c, h, h], "role": "input"}}
    nodes: list[dict[str, Any]] = []
    cur, cin = "x", c
    for i in range(n_conv):
        tensors[f"w{i}"] = {"shape": [co, cin, 3, 3], "role": "weight"}
        nodes.append({"id": f"conv{i}", "op": "conv2d", "inputs": [cur, f"w{i}"], "stride": [1, 1], "padding": [1, 1]})
        cur = f"conv{i}"
        if i < n_conv - 1:
            nodes.append({"id": f"sq{i}", "op": "poly", "inputs": [cur], "coeffs": [0, 0, 1]})
            cur = f"sq{i}"
        cin = co
    return {"schema": "slotplan.graph/1", "name": f"convnet{n_conv}", "tensors": tensors, "nodes": nodes,
            "outputs": [cur]}


def _sim_check(plan: dict[str, Any], tables: Any, graph: Any, seed: int = 0) -> None:
    vals = random_values(graph, seed)
    ref = reference(graph, vals)
    levels = {int(k): int(v["level"]) for k, v in plan.get("keys", {}).items()}
    out = simulate(plan, tables, vals, key_levels=levels)  # strict residency: the plan has a schedule
    for t in graph.outputs:
        err = float(np.max(np.abs(out.outputs[t] - ref[t]))) / max(1.0, float(np.max(np.abs(ref[t]))))
        assert err < 1e-9, (t, err)
    assert out.rotations == plan["summary"]["rotations"]


def _largest_group_bytes(plan: dict[str, Any], params: Any) -> int:
    return max((len(set(i["ks"])) for i in plan["program"] if i["op"] == "rot_hoisted"), default=1) * params.rotation_key_bytes()


# ---------------------------------------------------------------------------- splitting


def test_split_and_collapse_round_trip() -> None:
    prog = [
        ir.Input("a", "x", "t").to_json(),
        ir.RotHoisted(("b", "c", "d", "e"), "a", (1, 2, 1, 4)).to_json(),
        ir.Add("f", "b", "c").to_json(),
    ]
    sp = fully_split(prog)
    assert len(sp.groups) == 1 and len(sp.groups[0]) == 3  # offsets 1 (twice), 2, 4
    whole, at = collapse(sp, [[True, True]])
    assert ir.decode(whole[1]) == ir.RotHoisted(("b", "d", "c", "e"), "a", (1, 1, 2, 4))
    assert at[1] == at[2] == at[3] == 1
    parts, _ = collapse(sp, [[False, True]])
    assert [ir.op_name(i) for i in parts] == ["input", "rot_hoisted", "rot_hoisted", "add"]


def test_cap_below_the_largest_group_is_feasible() -> None:
    """A conv net whose hoisted group needs 8 keys at once plans under a cap that holds
    fewer keys than that: the group is split, every point fits, the simulator agrees."""
    g = parse_graph(convnet(2, 3, 16, 8))
    params = small_params(12, levels=6)
    free = plan_graph(g, params, PlanOptions(allow_insecure=True))
    group = _largest_group_bytes(free.plan, params)
    old = schedule_keys(free.plan["program"], params, None, "exact").min_cap_bytes
    joint = schedule_keys(free.plan["program"], params, None, "joint").min_cap_bytes
    assert joint < old
    cap = (joint + old) // 2
    assert cap < old
    res = plan_graph(g, params, PlanOptions(allow_insecure=True, memory_cap_bytes=cap))
    s = res.plan["summary"]
    assert s["peak_bytes"]["total"] <= cap
    assert s["key_schedule"]["strategy"] == "joint" and s["key_schedule"]["hoisted_splits"] > 0
    assert cap - s["peak_bytes"]["ciphertexts"] < group or s["key_schedule"]["hoisted_splits"] > 0
    check_plan(res, g)
    _sim_check(res.plan, res.tables, g)
    with pytest.raises(KeyCapError) as e:
        schedule_plan(free.plan, joint - 1, "joint")
    assert e.value.min_cap == joint


@pytest.mark.parametrize("seed", range(12))
def test_random_graphs_under_random_caps(seed: int) -> None:
    """Random networks, random caps between the smallest feasible and the keep-all peak:
    the joint schedule fits, and the plan equals numpy under strict residency."""
    spec, log_n = random_network(seed)
    g = parse_graph(spec)
    params = small_params(log_n, levels=16)
    res = plan_graph(g, params, PlanOptions(allow_insecure=True))
    prog = res.plan["program"]
    if not any(ir.decode(i).rot_keys() for i in prog):
        pytest.skip("no rotations")
    rng = random.Random(seed)
    lo = schedule_keys(prog, params, None, "joint").min_cap_bytes
    hi = schedule_keys(prog, params, None, "keep-all").peak_bytes["total"]
    for _ in range(2):
        cap = rng.randint(lo, max(lo, hi))
        plan, s = schedule_plan(res.plan, cap, "joint", time_limit_s=2.0)
        assert s.peak_bytes["total"] <= cap
        _sim_check(plan, res.tables, g, seed)


@pytest.mark.parametrize("n_conv", [2, 3])
def test_conv_nets_at_a_quarter_of_keep_all(n_conv: int) -> None:
    """The acceptance shape at a test ring: conv nets at a quarter of their keep-all peak."""
    g = parse_graph(convnet(n_conv, 3, 16, 8))
    params = small_params(12, levels=8)
    res = plan_graph(g, params, PlanOptions(allow_insecure=True))
    top = schedule_keys(res.plan["program"], params, None, "keep-all", key_levels=False).peak_bytes["total"]
    cap = top // 4
    lo = schedule_keys(res.plan["program"], params, None, "joint").min_cap_bytes
    if cap < lo:
        pytest.skip(f"a quarter of keep-all ({cap}) is below the working set plus one key ({lo})")
    capped = plan_graph(g, params, PlanOptions(allow_insecure=True, memory_cap_bytes=cap))
    assert capped.plan["summary"]["peak_bytes"]["total"] <= cap
    _sim_check(capped.plan, capped.tables, g)


# ---------------------------------------------------------------------------- key set


def test_key_set_composition_runs_and_is_exact() -> None:
    """With a budget of fewer keys than offsets, the key-set model composes offsets from
    owned keys (two hops); the rewritten plan equals numpy under strict residency."""
    g = parse_graph(convnet(2, 3, 16, 8))
    params = small_params(12, levels=6)
    res = plan_graph(g, params, PlanOptions(allow_insecure=True))
    from planner.keys.joint import _rewrite

    n_keys = len(ir.rot_keys_of(ir.decode_program(res.plan["program"])))
    rw = _rewrite(res.plan["program"], params, time_model(params), (n_keys // 2) * params.rotation_key_bytes(),
                  5.0, cross_check=True)
    assert rw is not None
    prog, chains, owned, info = rw
    assert chains and len(owned) <= n_keys // 2
    assert all(len(c) == 2 for c in chains.values())
    assert info["z3"]["status"] == "optimal" and info["z3"]["cost"] == info["objective"]
    plan = dict(res.plan, program=prog)
    new, s = schedule_plan(plan, None, "exact")
    assert s.rotation_keys <= n_keys // 2
    _sim_check(new, res.tables, g)


def _brute_keyset(p: keyset_model.KeySetProblem) -> int | None:
    best = None
    n = len(p.sizes)
    for own in itertools.product([False, True], repeat=n):
        if sum(s for s, o in zip(p.sizes, own, strict=True) if o) > p.budget:
            continue
        opts = []
        for k in range(n):
            if not p.required[k] or own[k]:
                opts.append([None])
            else:
                opts.append([pr for pr in p.pairs[k] if own[pr[0]] and own[pr[1]]])
        for choice in itertools.product(*opts):
            chains = {k: c for k, c in enumerate(choice) if c is not None}
            cost = keyset_model.evaluate(p, list(own), chains)
            best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_keyset_model_cpsat_z3_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    slots = 16
    offs = sorted(rng.sample(range(1, slots), 5))
    cands = offs
    idx = {k: i for i, k in enumerate(cands)}
    pairs = tuple(tuple((idx[a], idx[(k - a) % slots]) for a in cands
                        if a != k and (k - a) % slots in idx and (k - a) % slots not in (0, k)) for k in cands)
    sites = tuple(keyset_model.Site(tuple(sorted(rng.sample(range(len(cands)), rng.randint(1, 3)))), rng.randint(1, 3),
                                    rng.randint(5, 30), rng.randint(0, 10)) for _ in range(4))
    p = keyset_model.KeySetProblem((10,) * 5, (rng.randint(1, 20),) * 5, (True,) * 5, pairs, sites, 10 * rng.randint(2, 5))
    want = _brute_keyset(p)
    a, b = keyset_model.solve_cpsat(p, 5.0), keyset_model.solve_z3(p, 5.0)
    if want is None:
        assert a.status == "infeasible" and b.status == "infeasible"
    else:
        assert a.status == "optimal" and a.cost == want and b.cost == want


# ---------------------------------------------------------------------------- joint model


def _random_joint(seed: int) -> keyplan_model.JointKeyProblem:
    rng = random.Random(seed)
    n_keys = rng.randint(2, 4)
    sizes = tuple(rng.choice([3, 4, 5]) for _ in range(n_keys))
    points: list[int] = []
    groups: list[tuple[int, ...]] = []
    while len(points) < 9:
        if rng.random() < 0.4 and len(points) < 7:
            g = rng.sample(range(n_keys), min(n_keys, rng.randint(2, 3)))
            groups.append(tuple(range(len(points), len(points) + len(g))))
            points.extend(g)
        else:
            points.append(rng.choice([-1, *range(n_keys)]))
    uses = tuple(tuple(t for t, k in enumerate(points) if k == key) for key in range(n_keys))
    base = [rng.randint(0, 4) for _ in points]
    fixed = tuple(base[t] + (sizes[k] if k >= 0 else 0) for t, k in enumerate(points))
    return keyplan_model.JointKeyProblem(
        sizes, uses, fixed, tuple(points), tuple(groups), tuple(rng.randint(1, 9) for _ in sizes),
        tuple(rng.randint(1, 9) for _ in groups), max(fixed) + rng.randint(0, 8),
    )


def _brute_joint(p: keyplan_model.JointKeyProblem) -> int | None:
    n_gaps = [max(0, len(us) - 1) for us in p.uses]
    n_b = [len(g) - 1 for g in p.groups]
    best = None
    for gv in itertools.product([False, True], repeat=sum(n_gaps)):
        merged, i = [], 0
        for n in n_gaps:
            merged.append(list(gv[i : i + n]))
            i += n
        for jv in itertools.product([False, True], repeat=sum(n_b)):
            joined, j = [], 0
            for n in n_b:
                joined.append(list(jv[j : j + n]))
                j += n
            cost, peak = keyplan_model.evaluate(p, merged, joined)
            if peak <= p.capacity:
                best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(20))
def test_joint_model_cpsat_z3_brute_force(seed: int) -> None:
    p = _random_joint(seed)
    want = _brute_joint(p)
    a = keyplan_model.solve_cpsat(p, 5.0)
    b = keyplan_model.solve_z3(p, 5.0)
    if want is None:
        assert a.status == "infeasible" and b.status == "infeasible"
        return
    assert a.status == "optimal" and b.status == "optimal"
    assert a.cost == want == b.cost
    _, peak = keyplan_model.evaluate(p, a.merged, a.joined)
    assert peak <= p.capacity


# ---------------------------------------------------------------------------- prefetch


def test_prefetched_loads_are_counted_from_their_issue_point() -> None:
    """Joint schedules issue loads early (KeyMemRT's balanced mode); the memory model counts
    the key from its load_key, so the verified peak includes the prefetched keys; without
    prefetch the loads sit right before the use and the modelled time has more stalls."""
    g = parse_graph(convnet(2, 3, 16, 8))
    params = load_params("n14")
    res = plan_graph(g, params, PlanOptions())
    prog = res.plan["program"]
    top = schedule_keys(prog, params, None, "keep-all", key_levels=False).peak_bytes["total"]
    cap = top // 2
    a = schedule_keys(prog, params, cap, "joint", prefetch=0, time_limit_s=30.0)
    b = schedule_keys(prog, params, cap, "joint", time_limit_s=30.0)
    assert a.peak_bytes["total"] <= cap and b.peak_bytes["total"] <= cap
    tm = time_model(params)
    ta = modelled_time(a.program, params, a.key_bytes(), tm)
    tb = modelled_time(b.program, params, b.key_bytes(), tm)
    assert tb.stall_ms <= ta.stall_ms
    first_use = {k: next(i for i, ins in enumerate(b.program) if k in ir.decode(ins).rot_keys()) for k in b.keys}
    first_load = {k: next(i for i, ins in enumerate(b.program) if ins["op"] == "load_key" and ins["k"] == k)
                  for k in b.keys}
    assert any(first_use[k] - first_load[k] > 1 for k in b.keys)
    g_vals = random_values(g, 0)
    out = simulate(b.program and dict(res.plan, program=b.program, keys=b.keys_json()), res.tables, g_vals,
                   key_levels=b.key_levels())
    ref = reference(g, g_vals)
    for t in g.outputs:
        assert np.max(np.abs(out.outputs[t] - ref[t])) < 1e-9 * max(1.0, float(np.max(np.abs(ref[t]))))


def test_plan_joint_reports_min_cap() -> None:
    g = parse_graph(convnet(2, 3, 16, 8))
    params = small_params(12, levels=6)
    res = plan_graph(g, params, PlanOptions(allow_insecure=True))
    out = plan_joint(res.plan["program"], params, 1)
    assert isinstance(out, tuple) and out[0] > 1 and "split down to one key" in out[1]


def test_key_load_price_from_the_calibrated_read() -> None:
    """A table that read through the block's key files (key_read_keys) prices a load at
    key_read_file (ReadFrom parses as it reads); an older one-file table adds unmarshal."""
    import json

    from planner.cost.timing import time_model
    from planner.frontend.params import load_params

    for preset in ("n14boot", "n14"):
        meas = json.loads((REPO_ROOT / f"data/costs/{preset}-lattigo.json").read_text())[
            "measurements"]
        load = meas["key_load_ms"]
        want = load["read_file"] if meas.get("key_read_keys") else load["read_file"] + load["unmarshal"]
        assert time_model(load_params(preset)).load_ms_per_byte == pytest.approx(want / meas["galois_key_bytes"])
    assert json.loads((REPO_ROOT / "data/costs/n14boot-lattigo.json").read_text())[
        "measurements"]["key_read_keys"] > 1
