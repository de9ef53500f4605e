"""Rotation-key schedules (planner.keys.schedule, solver.keys_model, api.commands_keys).

Every scheduled plan is executed by the slot simulator with strict key residency and key
levels, and compared with the numpy reference of its graph; the modelled profile is
checked against the cap; the exact model is checked against Belady (equal key sizes) and
against z3; infeasible caps must name the smallest feasible cap.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.sim import SimulationError, simulate
from planner import ir
from planner.frontend.graph import Graph, load_graph, parse_graph
from planner.frontend.params import Params, load_params
from planner.frontend.reference import random_values, reference
from planner.ir.analysis import memory_profile, register_depths
from planner.keys.basis import _naf
from planner.keys.profile import KeyCapError, KeyScheduleError, key_memory_profile
from planner.keys.residency import KEY_STRATEGIES, STRATEGIES
from planner.keys.schedule import KeySchedule, schedule_keys, schedule_plan
from planner.pipeline import PlanOptions, PlanResult, plan_graph
from solver.keys_model import KeyLivenessProblem, solve_cpsat, solve_z3
from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT
WORKLOADS = ROOT / "data" / "workloads"

MLP_SMALL: dict[str, Any] = {
    "schema": "slotplan.graph/1",
    "name": "mlp_small",
    "tensors": {
        "x": {"shape": [64, 1, 1], "role": "input"},
        "W1": {"shape": [32, 64, 1, 1], "role": "weight"},
        "b1": {"shape": [32, 1, 1], "role": "weight"},
        "W2": {"shape": [10, 32, 1, 1], "role": "weight"},
    },
    "nodes": [
        {"id": "h", "op": "conv2d", "inputs": ["x", "W1"]},
        {"id": "hb", "op": "add", "inputs": ["h", "b1"]},
        {"id": "a", "op": "poly", "inputs": ["hb"], "coeffs": [0.0, 0.5, 0.25]},
        {"id": "y", "op": "conv2d", "inputs": ["a", "W2"]},
    ],
    "outputs": ["y"],
}

Case = tuple[Graph, Params, PlanResult]


def _plan(graph: Graph, preset: str, kernels: tuple[str, ...] | None = None, objective: str | None = None) -> Case:
    params = load_params(preset)
    opts = PlanOptions(kernels=kernels, objective=objective) if kernels else PlanOptions(objective=objective)
    return graph, params, plan_graph(graph, params, opts)


@pytest.fixture(scope="module")
def conv1() -> Case:
    # the minimum-rotation plan: these tests schedule keys, whichever kernel the calibrated
    # n13 time table prefers (it changes with each calibration)
    return _plan(load_graph(WORKLOADS / "conv1.json"), "n13", objective="rotations")


@pytest.fixture(scope="module")
def mlp() -> Case:
    # 784-128-128-10 at n15 (depth 9: two degree-2 activations cost 2 levels each)
    return _plan(load_graph(WORKLOADS / "keymemrt_mlp.json"), "n15")


@pytest.fixture(scope="module")
def mlp_small() -> Case:
    return _plan(parse_graph(MLP_SMALL), "n14")


@pytest.fixture(scope="module", params=["conv1", "mlp", "mlp_small"])
def case(request: pytest.FixtureRequest) -> Case:
    return request.getfixturevalue(request.param)


def _check_run(case: Case, sched: KeySchedule, seed: int = 3) -> None:
    graph, _, res = case
    plan = dict(res.plan)
    plan["program"] = sched.program
    values = random_values(graph, seed)
    ref = reference(graph, values)
    out = simulate(plan, res.tables, values, key_levels=sched.key_levels())
    for t in graph.outputs:
        np.testing.assert_allclose(out.outputs[t], ref[t], rtol=1e-9, atol=1e-9 * float(np.max(np.abs(ref[t]))))
    assert out.key_loads == sched.loads
    assert out.rotations == sched.rotations


def _check_levels(sched: KeySchedule, params: Params) -> None:
    depth = register_depths(sched.program)
    for ins in sched.program:
        ks = [ins["k"]] if ins["op"] == "rot" else ins["ks"] if ins["op"] == "rot_hoisted" else []
        for k in ks:
            assert sched.keys[k].level >= params.max_level - depth[ins["src"]]
    for k, info in sched.keys.items():
        assert info.bytes == params.rotation_key_bytes(info.level), k


def _caps(case: Case, key_levels: bool = True) -> list[int]:
    _, params, res = case
    prog = res.plan["program"]
    hi = schedule_keys(prog, params, None, "keep-all", key_levels=key_levels).peak_bytes["total"]
    lo = schedule_keys(prog, params, None, "belady", key_levels=key_levels).min_cap_bytes
    return sorted({lo, lo + (hi - lo) // 3, lo + 2 * (hi - lo) // 3, hi})


# ----------------------------------------------------------------------------- correctness
# every strategy that schedules the planned rotations as they are (pow2 rewrites them first)
@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if not KEY_STRATEGIES.create(s).pow2_basis])
def test_schedules_run_under_every_cap(case: Case, strategy: str) -> None:
    _, params, res = case
    prog = res.plan["program"]
    for cap in _caps(case):
        try:
            sched = schedule_keys(prog, params, cap, strategy, time_limit_s=5.0)
        except KeyCapError as e:  # only keep-all may need more than the scheduled minimum
            assert strategy == "keep-all" and e.min_cap > cap
            continue
        assert sched.peak_bytes["total"] <= cap
        assert key_memory_profile(sched.program, params, sched.key_bytes())["total"] <= cap
        assert sched.loads == sum(1 for i in sched.program if i["op"] == "load_key")
        _check_levels(sched, params)
        _check_run(case, sched)


def test_uniform_profile_matches_summary_model(case: Case) -> None:
    """With every key at the top level our walk is planner.ir.analysis.memory_profile."""
    _, params, res = case
    prog = res.plan["program"]
    assert key_memory_profile(prog, params) == memory_profile(prog, params)
    for strategy in ("keep-all", "belady", "keymemrt"):
        sched = schedule_keys(prog, params, None, strategy, key_levels=False)
        assert sched.peak_bytes == memory_profile(sched.program, params)


def test_strict_residency_is_enforced(conv1: Case) -> None:
    graph, params, res = conv1
    sched = schedule_keys(res.plan["program"], params, None, "belady")
    plan = dict(res.plan)
    values = random_values(graph, 0)
    # drop the first load: the simulator must refuse the rotation that needs it
    first = next(i for i, ins in enumerate(sched.program) if ins["op"] == "load_key")
    plan["program"] = sched.program[:first] + sched.program[first + 1 :]
    with pytest.raises(SimulationError, match="no key"):
        simulate(plan, res.tables, values)
    # a key one level too low is refused (Lattigo would silently compute garbage)
    levels = sched.key_levels()
    k = max(levels, key=lambda k: levels[k])
    plan["program"] = sched.program
    with pytest.raises(SimulationError, match="below the ciphertext's level"):
        simulate(plan, res.tables, values, key_levels={**levels, k: levels[k] - 1})


def test_key_levels_shrink_keys(mlp: Case) -> None:
    _, params, res = mlp
    lv = schedule_keys(res.plan["program"], params, None, "keep-all")
    top = schedule_keys(res.plan["program"], params, None, "keep-all", key_levels=False)
    assert any(i.level < params.max_level for i in lv.keys.values())
    assert lv.peak_bytes["keys"] < top.peak_bytes["keys"]
    assert all(i.level == params.max_level for i in top.keys.values())


# ----------------------------------------------------------------------------- optimality
@pytest.mark.parametrize("name", ["conv1", "mlp", "mlp_small"])
def test_exact_equals_belady_with_equal_key_sizes(name: str, request: pytest.FixtureRequest) -> None:
    c: Case = request.getfixturevalue(name)
    _, params, res = c
    prog = res.plan["program"]
    for cap in _caps(c, key_levels=False):
        b = schedule_keys(prog, params, cap, "belady", key_levels=False)
        e = schedule_keys(prog, params, cap, "exact", key_levels=False, cross_check=True)
        assert e.solver is not None and e.solver["status"] == "optimal"
        assert e.loads == b.loads, cap
        assert e.peak_bytes["total"] <= cap


def _synthetic(seed: int, n_rot: int = 40, n_keys: int = 6) -> list[dict[str, Any]]:
    """A program rotating inputs at two depths by random offsets (keys of two sizes)."""
    rng = random.Random(seed)
    prog: list[dict[str, Any]] = [
        {"op": "input", "dst": "x", "tensor": "x", "table": "in/x/0"},
        {"op": "pmul", "dst": "y", "src": "x", "pt": "p0"},
    ]
    ks = rng.sample(range(1, 64), n_keys)
    acc = None
    for i in range(n_rot):
        src = "x" if rng.random() < 0.5 else "y"
        prog.append({"op": "rot", "dst": f"r{i}", "src": src, "k": rng.choice(ks)})
        if rng.random() < 0.3:
            prog.append({"op": "rot_hoisted", "dsts": [f"h{i}a", f"h{i}b"], "src": src,
                         "ks": sorted(rng.sample(ks, 2))})
            prog.append({"op": "add", "dst": f"hs{i}", "a": f"h{i}a", "b": f"h{i}b"})
        for _ in range(rng.randint(0, 3)):
            prog.append({"op": "rescale", "dst": f"s{i}_{len(prog)}", "src": src})
        nxt = f"a{i}"
        prog.append({"op": "add", "dst": nxt, "a": acc or "x", "b": f"r{i}"})
        acc = nxt
    prog.append({"op": "output", "src": acc, "tensor": "z", "table": "out/z/0"})
    return prog


@pytest.mark.parametrize("seed", range(6))
def test_exact_belady_z3_on_synthetic_programs(seed: int) -> None:
    params = load_params("n13")
    prog = _synthetic(seed)
    for key_levels in (False, True):
        lo = schedule_keys(prog, params, None, "belady", key_levels=key_levels).min_cap_bytes
        step = params.rotation_key_bytes()
        for cap in (lo, lo + step, lo + 2 * step):
            b = schedule_keys(prog, params, cap, "belady", key_levels=key_levels)
            e = schedule_keys(prog, params, cap, "exact", key_levels=key_levels, cross_check=True)
            assert e.solver is not None and e.solver["status"] == "optimal"
            assert e.solver["z3"]["loads"] == e.loads  # z3 agrees with CP-SAT
            assert e.loads <= b.loads
            if not key_levels:
                assert e.loads == b.loads
            assert e.peak_bytes["total"] <= cap and b.peak_bytes["total"] <= cap


def test_liveness_model_tiny_by_hand() -> None:
    # two keys of 10 whose gaps overlap at point 3, where only one of them fits
    p = KeyLivenessProblem(sizes=(10, 10), uses=((0, 4), (2, 6)), fixed=(10, 5, 10, 5, 10, 5, 10), capacity=20)
    for sol in (solve_cpsat(p), solve_z3(p)):
        assert sol.status == "optimal"
        assert sol.loads == 3  # one of the two gaps must be reloaded
    roomy = KeyLivenessProblem(p.sizes, p.uses, p.fixed, capacity=25)
    assert solve_cpsat(roomy).loads == solve_z3(roomy).loads == 2


# ----------------------------------------------------------------------------- caps
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_infeasible_cap_names_smallest_feasible_cap(conv1: Case, strategy: str) -> None:
    _, params, res = conv1
    prog = res.plan["program"]
    ok = schedule_keys(prog, params, None, strategy)
    need = ok.min_cap_bytes
    with pytest.raises(KeyCapError) as exc:
        schedule_keys(prog, params, need - 1, strategy)
    assert exc.value.min_cap == need
    assert f"smallest feasible cap is {need} bytes" in str(exc.value)
    assert schedule_keys(prog, params, need, strategy).peak_bytes["total"] <= need


def test_keymemrt_merge_window() -> None:
    params = load_params("n13")
    prog: list[dict[str, Any]] = [{"op": "input", "dst": "x", "tensor": "x", "table": "t"}]
    n = 0

    def rot(k: int) -> None:
        nonlocal n
        prog.append({"op": "rot", "dst": f"r{n}", "src": "x", "k": k})
        n += 1

    def filler(m: int) -> None:
        nonlocal n
        for _ in range(m):
            prog.append({"op": "rescale", "dst": f"f{n}", "src": "x"})
            n += 1

    for _ in range(3):  # key 1 every 5 operations: merged
        rot(1)
        filler(4)
    for _ in range(3):  # key 2 every 20 operations: reloaded each time
        rot(2)
        filler(19)
    s = schedule_keys(prog, params, None, "keymemrt", key_levels=False)
    assert s.keys[1].loads == 1 and s.keys[2].loads == 3
    wide = schedule_keys(prog, params, None, "keymemrt", key_levels=False, merge_window=20)
    assert wide.keys[2].loads == 1
    # prefetch issues the loads earlier, same loads, more memory
    pf = schedule_keys(prog, params, None, "keymemrt", key_levels=False, prefetch=3)
    assert pf.loads == s.loads and pf.peak_bytes["keys"] >= s.peak_bytes["keys"]
    # under a cap that only fits one key the merge of key 1 is undone where it collides
    one = schedule_keys(prog, params, None, "belady", key_levels=False).min_cap_bytes
    capped = schedule_keys(prog, params, one, "keymemrt", key_levels=False, merge_window=100)
    assert capped.peak_bytes["total"] <= one


# ----------------------------------------------------------------------------- rewrites
def test_pow2_rewrite(case: Case) -> None:
    _, params, res = case
    s = schedule_keys(res.plan["program"], params, None, "pow2")
    assert all(k & (k - 1) == 0 for k in s.keys)
    assert len(s.keys) <= params.slots.bit_length() - 1
    assert s.rotations >= s.rotations_before
    for k, chain in s.chains.items():
        assert sum(chain) % params.slots == k
    _check_levels(s, params)
    _check_run(case, s)


@pytest.mark.parametrize("max_keys", [3, 8])
@pytest.mark.parametrize("basis", ["auto", "pow2", "naf", "bsgs"])
def test_max_keys_rewrite(conv1: Case, max_keys: int, basis: str) -> None:
    _, params, res = conv1
    prog = res.plan["program"]
    lo = schedule_keys(prog, params, None, "belady", max_keys, basis=basis).min_cap_bytes
    s = schedule_keys(prog, params, lo, "belady", max_keys, basis=basis)
    assert len(s.keys) <= max_keys
    assert s.basis is not None and set(s.keys) <= set(s.basis)
    assert s.peak_bytes["total"] <= lo
    _check_levels(s, params)
    _check_run(conv1, s)


def test_max_keys_too_small_is_refused(conv1: Case) -> None:
    _, params, res = conv1
    # one key cannot reach conv1's offsets (1, 31, ..., 3072 mod 4096) in 64 steps
    with pytest.raises(KeyScheduleError, match="allow more keys"):
        schedule_keys(res.plan["program"], params, None, "belady", 1)
    with pytest.raises(KeyScheduleError, match="at least 1"):
        schedule_keys(res.plan["program"], params, None, "belady", 0)


def test_max_keys_on_mlp_trades_rotations_for_keys(mlp: Case) -> None:
    _, params, res = mlp
    prog = res.plan["program"]
    prev = None
    for n in (4, 16, 40):
        s = schedule_keys(prog, params, None, "exact", n, time_limit_s=5.0)
        assert len(s.keys) <= n
        if prev is not None:
            assert s.rotations <= prev
        prev = s.rotations
        _check_run(mlp, s)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=2**20))
def test_naf_digits(k: int) -> None:
    d = _naf(k)
    assert sum(d) == k
    exps = sorted(abs(x).bit_length() - 1 for x in d)
    assert all(b - a >= 2 for a, b in zip(exps, exps[1:], strict=False))


# ----------------------------------------------------------------------------- plan + CLI
def test_schedule_plan_updates_summary(conv1: Case) -> None:
    _, params, res = conv1
    cap = schedule_keys(res.plan["program"], params, None, "belady").min_cap_bytes
    new, s = schedule_plan(res.plan, cap, "belady", 4)
    summ = new["summary"]
    assert summ["key_loads"] == s.loads == sum(1 for i in new["program"] if i["op"] == "load_key")
    assert summ["memory_cap_bytes"] == cap and summ["peak_bytes"]["total"] <= cap
    assert summ["rotations"] == s.rotations and summ["rotation_keys"] == len(new["keys"]) <= 4
    assert summ["key_schedule"]["rotations_before"] == res.plan["summary"]["rotations"]
    assert set(new["keys"]) == {str(k) for k in s.keys}
    assert all(v["bytes"] == params.rotation_key_bytes(v["level"]) for v in new["keys"].values())
    # rescheduling a scheduled plan starts from its program, keeps the source digest
    again, _ = schedule_plan(new, None, "keep-all")
    assert again["summary"]["key_schedule"]["source_program_sha256"] == summ["key_schedule"]["source_program_sha256"]
    json.dumps(again, allow_nan=False)


def _cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from api.cli import main

    monkeypatch.setattr(sys, "argv", ["slotplan", *args])
    code = 0
    try:
        main()
    except SystemExit as e:
        code = int(e.code or 0)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_cli_keys_and_keybench(
    conv1: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, params, res = conv1
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(res.plan))
    need = schedule_keys(res.plan["program"], params, None, "exact").min_cap_bytes
    code, out, err = _cli(monkeypatch, capsys, "keys", str(plan_path), "--memory-cap", str(need),
                          "--strategy", "exact", "-o", str(tmp_path / "k.json"))
    assert code == 0, err
    written = json.loads((tmp_path / "k.json").read_text())
    assert written["summary"]["peak_bytes"]["total"] <= need and "keys" in written
    code, out, err = _cli(monkeypatch, capsys, "keys", str(plan_path), "--memory-cap", "1MiB", "-o",
                          str(tmp_path / "bad.json"))
    assert code == 2 and f"smallest feasible cap is {need} bytes" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "bad.json").exists()
    code, _, err = _cli(monkeypatch, capsys, "keys", str(plan_path), "--strategy", "lru")
    assert code == 2 and "unknown key strategy" in err
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({
        "schema": "slotplan.keysuite/1", "name": "t",
        "workloads": [{"graph": str(WORKLOADS / "conv1.json"), "params": "n13"}],
    }))
    code, out, err = _cli(monkeypatch, capsys, "keybench", str(suite), "--caps", "2", "--json")
    assert code == 0, err
    lines = [json.loads(x) for x in out.splitlines() if x.strip()]
    row, summary = lines[0], lines[-1]["summary"]
    assert row["workload"] == "conv1" and len(row["caps"]) == 2
    assert {r["strategy"] for r in row["rows"]} == set(STRATEGIES)
    assert summary["exact"]["geomean_reduction"] >= 1.0


def _lattigo_ok() -> bool:
    try:
        from backends.lattigo_backend import available
    except ImportError:
        return False
    return bool(available())


@pytest.mark.skipif(not _lattigo_ok(), reason="Lattigo extension not built (make lattigo)")
def test_scheduled_rewritten_plan_runs_on_lattigo(conv1: Case) -> None:
    from backends.lattigo_backend import run_plan

    graph, params, res = conv1
    cap = schedule_keys(res.plan["program"], params, None, "belady", 4).min_cap_bytes
    new, s = schedule_plan(res.plan, cap, "belady", 4)
    values = random_values(graph, 1)
    ref = reference(graph, values)
    shapes: Mapping[str, Sequence[int]] = {t: graph.shape(t) for t in graph.outputs}
    lr = run_plan(new, {k: values[k] for k in graph.inputs}, {k: values[k] for k in graph.weights},
                  res.tables, output_shapes=shapes)
    for t in graph.outputs:
        assert np.max(np.abs(lr.outputs[t] - ref[t])) <= 1e-4 * np.max(np.abs(ref[t]))
    assert lr.stats["key_loads"] == s.loads


def test_tight_cap_changes_the_kernel_choice() -> None:
    """Joint model: under a cap a candidate must fit by itself (its working set plus one key:
    the joint key schedule splits hoisted groups); a cap below IMRA's largest hoisted group
    keeps IMRA (split), a cap below IMRA's own minimum picks another kernel, and the
    instruction-level schedule keeps the plan under the cap, correct in the simulator."""
    from planner.pipeline import PlanOptions, plan_graph
    from tests.helpers import check_plan, matvec_graph

    g = matvec_graph(1024, 1024)
    params = load_params("n13")
    kernels = ("imra", "bsgs", "hs-diagonal", "fhelipe")  # the families this test is about
    free = plan_graph(g, params, PlanOptions(kernels=kernels))
    assert free.plan["nodes"][0]["kernel"] == "imra"
    group = max(len(i["ks"]) for i in free.plan["program"] if i["op"] == "rot_hoisted")
    # the cap bounds the process (planner/cost/process.py): the candidates keep to what the
    # executor's fixed state leaves of it, the key schedule to what the plan's executor state leaves
    from planner.cost.process import executor_reserve, fixed_reserve

    fixed, held = fixed_reserve(params).bytes, executor_reserve(free.plan).bytes
    cap = 30 * 2**20  # below IMRA's largest hoisted group (31 keys at once): split, still IMRA
    assert cap < group * params.rotation_key_bytes()
    split = plan_graph(g, params, PlanOptions(memory_cap_bytes=cap + held, kernels=kernels))
    node = split.plan["nodes"][0]
    assert node["kernel"] == "imra" and node["min_cap_bytes"] <= cap + held - fixed
    assert split.plan["summary"]["key_schedule"]["hoisted_splits"] > 0
    assert split.plan["summary"]["process_peak_bytes"]["total"] <= cap + held
    check_plan(split, g)
    cap = node["min_cap_bytes"] - 1 + fixed  # below IMRA's own minimum: another kernel, or a refusal
    try:  # (that kernel's executor state may not fit beside it: then the refusal names a larger cap)
        tight = plan_graph(g, params, PlanOptions(memory_cap_bytes=cap, kernels=kernels))
    except KeyCapError as e:
        assert e.min_cap > cap
        return
    node = tight.plan["nodes"][0]
    assert node["kernel"] != "imra" and "min_cap_bytes" not in node["params"]
    assert tight.plan["summary"]["process_peak_bytes"]["total"] <= cap
    check_plan(tight, g)


@pytest.mark.parametrize("strategy,max_keys,cap_mib", [("exact", None, 600), ("keymemrt", 6, 400), ("keep-all", 5, None)])
def test_node_spans_survive_key_schedules(strategy: str, max_keys: int | None, cap_mib: int | None) -> None:
    """Loads, drops and rotations re-expressed as chains (fresh registers) stay with the node
    that owns them: per-node counts still add up to the summary, spans stay contiguous and
    in order, and the scheduled plan still matches numpy."""
    g = load_graph(REPO_ROOT / "data" / "workloads" / "keymemrt_mlp.json")
    res = plan_graph(g, load_params("n15"), PlanOptions())
    cap = cap_mib * 2**20 if cap_mib else None
    new, _ = schedule_plan(res.plan, cap, strategy, max_keys=max_keys)
    s = new["summary"]
    for f in ("rotations", "pmul", "cmul", "add", "rescale", "poly", "key_loads"):
        assert sum(n[f] for n in new["nodes"]) == s[f], f
    spans = [n["span"] for n in new["nodes"]]
    assert all(a <= z for a, z in spans) and all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
    if max_keys:
        assert s["rotations"] > res.plan["summary"]["rotations"]  # chains were really used
    vals = random_values(g, 3)
    ref = reference(g, vals)
    out = simulate(new, res.tables, vals)
    for t in g.outputs:
        assert np.allclose(out.outputs[t], ref[t], rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------ fused blocks under a schedule
@pytest.mark.parametrize("strategy", ["exact", "joint"])
def test_fused_blocks_stay_whole_where_the_cap_allows(mlp: Case, strategy: str) -> None:
    """The executor runs a baby-step giant-step block whole only when its giant keys stay
    resident from each giant rotation to the block's root (planner.ir.fusion). This planner's
    strategies keep them there when the cap allows, a block whole or not at all: at every
    cap the blocks the schedule reports split are the ones the executor's analysis splits,
    none at the keep-all peak, and the schedule still fits its cap and runs exactly."""
    from planner.ir.fusion import _analyse_once, fused_blocks, giant_spans

    _, params, res = mlp
    prog = res.plan["program"]
    roots = {r for _, r, _ in giant_spans(prog, params.slots)}
    assert roots, "the MLP's matvecs have giant steps"
    whole = len(fused_blocks(prog, params.slots)[0])
    for cap in _caps(mlp):
        sched = schedule_keys(prog, params, cap, strategy, time_limit_s=5.0)
        info = sched.solver or {}
        assert info["blocks_kept_whole"] + info["blocks_split"] == len(roots), info
        instrs = [ir.decode(dict(i)) for i in sched.program]
        refused = _analyse_once(instrs, params.slots, True, set())[2]
        assert bool(refused) == (info["blocks_split"] > 0), (cap, info)
        assert sched.peak_bytes["total"] <= cap
        if info["blocks_split"] == 0:
            assert len(fused_blocks(sched.program, params.slots)[0]) >= whole
        _check_run(mlp, sched)
    top = schedule_keys(prog, params, max(_caps(mlp)), strategy, time_limit_s=5.0)
    assert (top.solver or {})["blocks_split"] == 0


def test_keep_giant_keys_all_or_nothing() -> None:
    """A block's giant keys are kept to its root together or not at all (one dropped early
    splits it anyway), and only while the cap holds at every point they cover."""
    from planner.keys.residency import keep_giant_keys

    # x -> babies r1, r2 (keys 1, 2); products summed per giant step, giant rotations by 4
    # and 8 (keys 4, 8), the block's root the last add
    prog = [
        {"op": "input", "dst": "x", "tensor": "x", "table": "in/x"},  # 0
        {"op": "rot", "dst": "r1", "src": "x", "k": 1},  # 1
        {"op": "pmul", "dst": "a0", "src": "x", "pt": "p0"},  # 2
        {"op": "pmul", "dst": "a1", "src": "r1", "pt": "p1"},  # 3
        {"op": "add", "dst": "g0", "a": "a0", "b": "a1"},  # 4
        {"op": "pmul", "dst": "b0", "src": "x", "pt": "p2"},  # 5
        {"op": "pmul", "dst": "b1", "src": "r1", "pt": "p3"},  # 6
        {"op": "add", "dst": "s1", "a": "b0", "b": "b1"},  # 7
        {"op": "rot", "dst": "g1", "src": "s1", "k": 4},  # 8
        {"op": "pmul", "dst": "c0", "src": "x", "pt": "p4"},  # 9
        {"op": "pmul", "dst": "c1", "src": "r1", "pt": "p5"},  # 10
        {"op": "add", "dst": "s2", "a": "c0", "b": "c1"},  # 11
        {"op": "rot", "dst": "g2", "src": "s2", "k": 8},  # 12
        {"op": "add", "dst": "t", "a": "g0", "b": "g1"},  # 13
        {"op": "add", "dst": "y", "a": "t", "b": "g2"},  # 14
        {"op": "output", "src": "y", "tensor": "y", "table": "out/y"},  # 15
    ]
    from planner.ir.fusion import giant_spans

    assert giant_spans(prog, 64) == [(8, 14, 4), (12, 14, 8)]
    size = {1: 10, 4: 100, 8: 100}
    ivs = [(1, 1, 10), (4, 8, 8), (8, 12, 12)]
    base = [0] * len(prog)
    out, kept, split = keep_giant_keys(prog, ivs, size, base, None, 64)
    assert (kept, split) == (1, 0) and (4, 8, 14) in out and (8, 12, 14) in out and (1, 1, 10) in out
    # room for one giant key beside the other over 12..14, not for both: neither is kept
    out, kept, split = keep_giant_keys(prog, ivs, size, base, 150, 64)
    assert (kept, split) == (0, 1) and sorted(out) == sorted(ivs)
    out, kept, split = keep_giant_keys(prog, ivs, size, base, 200, 64)
    assert (kept, split) == (1, 0)
