"""The Lattigo executor's fused linear blocks (backends/lattigo/fused.go) against numpy and
against the same plan executed instruction by instruction (option no_fuse), on the small
test ring; plus the hybrid kernel in the simulator on random shapes. No timing asserts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from backends.lattigo_backend import available
from backends.lattigo_bench import conv_workload, mvm_graph
from common.errors import SlotplanError
from planner.frontend.graph import Graph, parse_graph
from planner.frontend.params import load_params
from planner.ir.fusion import fused_counts
from planner.pipeline import PlanOptions, PlanResult, plan_graph
from tests.helpers import bench_encrypted, check_plan

needs_lattigo = pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)")


_PLANS: dict[tuple[str, tuple[str, ...] | None, int | None], PlanResult] = {}


def _plan(graph: Graph, kernels: tuple[str, ...] | None, cap: int | None = None) -> PlanResult:
    """The n12 plan of ``graph`` (a graph's name names its shape in this module), made once
    per test process: planning is deterministic, and the tests below read the same free and
    capped plans several times (peak, fused run, unfused run, the model's block count)."""
    key = (graph.name, kernels, cap)
    if key not in _PLANS:
        opts = PlanOptions(input_layout="free", allow_insecure=True, memory_cap_bytes=cap,
                           **({"kernels": kernels} if kernels else {}))
        _PLANS[key] = plan_graph(graph, load_params("n12"), opts)
    return _PLANS[key]


def _bench(graph: Graph, kernels: tuple[str, ...] | None, options: dict[str, Any]) -> tuple[dict, dict]:
    options = dict(options)
    cap = options.pop("memory_cap_bytes", None)  # a plan option (the key schedule), not the bench's
    return bench_encrypted(_plan(graph, kernels, cap), graph, options, seed=3)


def _mlp() -> Graph:
    return parse_graph({
        "schema": "slotplan.graph/1", "name": "mlp",
        "tensors": {"x": {"shape": [40], "role": "input"}, "W1": {"shape": [24, 40], "role": "weight"},
                    "W2": {"shape": [10, 24], "role": "weight"}},
        "nodes": [{"id": "h", "op": "matvec", "inputs": ["W1", "x"]},
                  {"id": "a", "op": "poly", "inputs": ["h"], "coeffs": [0.1, 0.5]},
                  {"id": "y", "op": "matvec", "inputs": ["W2", "a"]}],
        "outputs": ["y"],
    })


def _case(name: str, make: Any, kernels: tuple[str, ...] | None) -> Any:
    # one pytest-xdist group per graph: its tests share the process's plans (_plan)
    return pytest.param(name, make, kernels, id=name, marks=pytest.mark.xdist_group(f"fused-{name.split()[0]}"
                                                                                      f"-{name.split()[1]}"))


CASES = [
    _case("mvm 48x80 hybrid", lambda: mvm_graph(48, 80), ("hybrid", "elementwise")),
    _case("mvm 80x48 hybrid", lambda: mvm_graph(80, 48), ("hybrid", "elementwise")),
    _case("mvm 64x64 imra", lambda: mvm_graph(64, 64), ("imra", "elementwise")),
    _case("mvm 30x50 bsgs", lambda: mvm_graph(30, 50), ("bsgs", "elementwise")),
    _case("mvm 20x20 hs-diagonal", lambda: mvm_graph(20, 20), ("hs-diagonal", "elementwise")),
    _case("conv1 default", lambda: conv_workload("conv1").graph, None),
    _case("mlp default", _mlp, None),
    _case("conv2 default (Q-mode blocks)", lambda: conv_workload("conv2").graph, None),
]


@needs_lattigo
@pytest.mark.parametrize(("name", "make", "kernels"), CASES)
def test_fused_matches_numpy_and_unfused(name: str, make: Any, kernels: tuple[str, ...] | None) -> None:
    graph = make()
    fused, err_f = _bench(graph, kernels, {"repeat": 2, "workers": 2})
    plain, err_p = _bench(graph, kernels, {"repeat": 1, "no_fuse": True})
    assert max(err_f.values()) < 1e-4, (name, err_f)
    assert max(err_p.values()) < 1e-4, (name, err_p)
    assert fused["fused_blocks"] >= 1 and fused["fused_products"] >= 2, fused
    assert plain["fused_blocks"] == 0
    assert "bsgs_block" in fused["op_counts"] and "bsgs_block" not in plain["op_counts"]
    # fused blocks perform the plan's rotations (babies once per base, one per giant step)
    assert fused["rotations"] == plain["rotations"]
    # plaintexts were encoded in the preparation run and reused by both timed runs
    assert fused["encode_seconds"] > 0 and fused["cached_plaintext_bytes"] > 0
    assert len(fused["eval_seconds_runs"]) == 2 and len(fused["cpu_seconds_runs"]) == 2


@needs_lattigo
@pytest.mark.xdist_group("fused-conv1-default")
@pytest.mark.parametrize("fraction", [None, 0.75])
def test_q_mode_blocks_as_the_model_counts(fraction: float | None) -> None:
    """The executor runs the Q-mode blocks planner.ir.fusion decides (the plan's fused
    annotation), with and without a key schedule; under one, one-product blocks are fused in
    Q mode only, as many as without it."""
    graph = conv_workload("conv1").graph  # single-product blocks over its babies: Q mode
    params = load_params("n12")
    cap = None if fraction is None else _cap(graph, None, fraction)
    res = _plan(graph, None, cap)
    fc = fused_counts(res.plan["program"], params.slots)
    st, err = _bench(graph, None, {"repeat": 1, "memory_cap_bytes": cap})
    assert max(err.values()) < 1e-4, err
    assert fc.q_blocks > 0
    if cap is not None:
        assert st["key_mode"] == "scheduled"
        free = _plan(graph, None).plan
        assert fc.q_blocks == fused_counts(free["program"], params.slots).q_blocks
    assert st["fused_q_blocks"] == fc.q_blocks
    assert st["fused_blocks"] == fc.blocks + fc.q_blocks
    assert st["fused_products"] == fc.products + fc.q_products


@needs_lattigo
@pytest.mark.parametrize(("m", "k", "n"), [(16, 16, 16), (16, 8, 16), (8, 16, 8)])
def test_product_sums_relinearised_once(m: int, k: int, n: int) -> None:
    """Sums of ct-ct products (relin.go) are relinearised once: equal to numpy and to the
    plan run instruction by instruction, and the sums the model counts (planner.ir.fusion)."""
    from planner import ir
    from planner.ir.fusion import product_sums
    from tests.planner.kernels.test_ctct import ctct_graph

    graph = ctct_graph(m, k, n)
    res = _plan(graph, None)
    sums = product_sums([ir.decode(i) for i in res.plan["program"]])
    fused, err_f = _bench(graph, None, {"repeat": 1})
    plain, err_p = _bench(graph, None, {"repeat": 1, "no_fuse": True})
    assert max(err_f.values()) < 1e-4 and max(err_p.values()) < 1e-4, (err_f, err_p)
    assert len(sums) >= 1
    assert fused["product_sums"] == len(sums)
    assert fused["product_sum_terms"] == sum(len(s.terms) for s in sums)
    assert plain["product_sums"] == 0 and "cmul" in plain["op_counts"]
    assert fused["rotations"] == plain["rotations"]


@needs_lattigo
def test_one_worker_equals_two() -> None:
    graph = mvm_graph(48, 80)
    one, e1 = _bench(graph, ("hybrid", "elementwise"), {"workers": 1})
    two, e2 = _bench(graph, ("hybrid", "elementwise"), {"workers": 2})
    assert one["workers"] == 1 and two["workers"] == 2
    assert max(e1.values()) < 1e-4 and max(e2.values()) < 1e-4


@pytest.mark.parametrize("seed", range(6))
def test_hybrid_kernel_random_shapes_sim(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, k = (int(v) for v in rng.integers(1, 300, size=2))
    params = load_params("n12")
    graph = mvm_graph(n, k)
    for free in ("free", None):
        opts = PlanOptions(kernels=("hybrid", "elementwise"), allow_insecure=True,
                           **({"input_layout": free} if free else {}))
        res = plan_graph(graph, params, opts)
        assert {nd["kernel"] for nd in res.plan["nodes"]} == {"hybrid"}
        check_plan(res, graph, seed=seed)
        # the fewest products: ceil-pow2 n * ceil-pow2 k / slots (at least 1), + the mask
        p2 = [1 << max(0, (v - 1).bit_length()) for v in (n, k)]
        want = max(1, min(p2[0] * p2[1] // params.slots, p2[1]))
        assert res.plan["summary"]["pmul"] in (want, want + 1)


def _cap(graph: Graph, kernels: tuple[str, ...] | None, fraction: float) -> int:
    """A memory cap that leaves the plan's own terms (keys, ciphertexts, plaintexts) about
    ``fraction`` of their keep-all peak: the cap bounds the process model (the executor's
    state beside them, planner.cost.process), so it is the keep-all plan's process peak less
    the rest of its own peak."""
    from planner.cost.process import plan_process_model

    free = _plan(graph, kernels).plan
    peak = int(free["summary"]["peak_bytes"]["total"])
    return int(plan_process_model(free)["growth"] - (1 - fraction) * peak)


def _capped_plan(graph: Graph, kernels: tuple[str, ...] | None, fraction: float) -> dict[str, Any]:
    return _plan(graph, kernels, _cap(graph, kernels, fraction)).plan


def _two_hops(plan: dict[str, Any]) -> bool:
    """Whether the program rotates a register that a rotation wrote."""
    rotated: set[str] = set()
    for ins in plan["program"]:
        if ins["op"] in ("rot", "rot_hoisted"):
            if ins["src"] in rotated:
                return True
            rotated.update(ins.get("dsts") or [ins["dst"]])
    return False


def _check_fused_schedule(name: str, graph: Graph, kernels: tuple[str, ...] | None, fraction: float) -> dict[str, Any]:
    cap = _cap(graph, kernels, fraction)
    try:
        plan = _plan(graph, kernels, cap).plan
    except SlotplanError:
        pytest.skip(f"{name}: no plan under {fraction} of the peak")
    fused, err_f = _bench(graph, kernels, {"repeat": 1, "memory_cap_bytes": cap})
    plain, err_p = _bench(graph, kernels, {"repeat": 1, "no_fuse": True, "memory_cap_bytes": cap})
    assert fused["key_mode"] == "scheduled" and plain["key_mode"] == "scheduled", fused
    assert max(err_f.values()) < 1e-4 and max(err_p.values()) < 1e-4, (name, err_f, err_p)
    assert fused["rotations"] == plain["rotations"] and fused["key_loads"] == plain["key_loads"]
    assert plain["fused_blocks"] == 0
    # the planner's model of the executor (planner.ir.fusion) finds the same blocks
    fc = fused_counts(plan["program"], load_params("n12").slots)
    assert fused["fused_blocks"] == fc.blocks + fc.q_blocks, (fused["fused_blocks"], fc)
    assert fused["fused_products"] == fc.products + fc.q_products
    return fused


@needs_lattigo
@pytest.mark.parametrize("seed", range(3))
def test_fused_under_a_key_schedule_random_shapes(seed: int) -> None:
    """Random matvec shapes, kernels and caps (between the smallest plan and the keep-all
    peak) under a key schedule: the fused run matches numpy and the unfused run, and the
    executor fuses the blocks the planner models (giant keys kept to their roots where the
    cap allows, planner.keys.schedule.keep_giant_keys)."""
    rng = np.random.default_rng(100 + seed)
    n, k = (int(v) for v in rng.integers(12, 90, size=2))
    kernels = [("bsgs", "elementwise"), ("imra", "elementwise"), ("hybrid", "elementwise"), None][int(rng.integers(4))]
    fraction = float(rng.uniform(0.25, 0.8))
    _check_fused_schedule(f"mvm {n}x{k} {kernels} at {fraction:.2f}", mvm_graph(n, k), kernels, fraction)


@needs_lattigo
@pytest.mark.parametrize("fraction", [0.75, 0.3])
@pytest.mark.parametrize(("name", "make", "kernels"), CASES)
def test_fused_under_a_key_schedule(name: str, make: Any, kernels: tuple[str, ...] | None, fraction: float) -> None:
    """Under a memory cap (a key schedule: hoisted groups split, keys dropped right after
    their rotations, two-hop rotations) the blocks run fused, whole where their giant keys
    stay resident until the root, else group by group; babies are computed where the plan
    rotates. Same outputs (numpy), rotations and key loads as instruction by instruction."""
    fused = _check_fused_schedule(name, make(), kernels, fraction)
    assert fused["fused_blocks"] >= 1, fused["fused_blocks"]
    if _two_hops(graph_plan := _capped_plan(make(), kernels, fraction)):
        # the schedule rotates through two hops (a rotation of a rotation): blocks read
        # babies of babies
        assert fused["fused_multi_base"] >= 1, fused
    elif name == "mvm 20x20 hs-diagonal" and fraction < 0.5:
        # the joint strategy's time model prices whether a two-hop chain pays; without one
        # every block has one base
        assert fused["fused_multi_base"] == 0, (fused, graph_plan["summary"]["key_schedule"].get("chains"))


@needs_lattigo
@pytest.mark.parametrize(("name", "make", "kernels", "paid"), [
    ("mvm 64x64 bsgs", lambda: mvm_graph(64, 64), ("bsgs", "elementwise"), True),
    ("conv1 default", lambda: conv_workload("conv1").graph, None, None),
])
def test_q_babies_blocks_as_the_time_model_decides(name: str, make: Any, kernels: tuple[str, ...] | None,
                                                   paid: bool | None) -> None:
    """A one-shot run (``slotplan run``) streams its plaintexts, and the executor runs a QP
    block with its babies in Q where fused_qbabies.go's rule pays; the time model
    (planner/cost/blocks.py ``q_babies``) decides the same blocks, so it prices them so."""
    from backends.runner import run_plan
    from planner.cost.conditions import Run
    from planner.cost.tables import load_costs
    from planner.cost.timing import TimeModel

    graph = make()
    res = _plan(graph, kernels)
    rep = run_plan(res.plan, res.tables, "lattigo", seed=3)
    assert rep.ok, rep.failure()
    params = load_params("n12")
    st: dict[str, int] = {}
    TimeModel(load_costs("n12-lattigo")).program_costs(res.plan["program"], params.max_level, params.slots,
                                                       Run(encode=True), st)
    assert rep.stats["fused_qbaby_blocks"] == st["q_baby_blocks"], (rep.stats["fused_blocks"], st)
    if paid:
        assert st["q_baby_blocks"] >= 1


@needs_lattigo
@pytest.mark.parametrize(("name", "make", "kernels"), [
    ("mvm 64x64 bsgs", lambda: mvm_graph(64, 64), ("bsgs", "elementwise")),
    ("conv2 default", lambda: conv_workload("conv2").graph, None),
])
def test_streamed_diagonals_are_encoded_in_pairs(name: str, make: Any, kernels: tuple[str, ...] | None) -> None:
    """A run that streams its plaintexts encodes a giant step's consecutive real diagonals
    two at a time (backends/lattigo/encode_pair.go): as many pairs as the time model counts
    (``FusedBlock.pairs``), with the outputs matching numpy (the pair's encodings against
    Lattigo's own: TestEmbedPairMatchesLattigo)."""
    from backends.runner import run_plan
    from planner.ir.fusion import fused_blocks

    graph = make()
    res = _plan(graph, kernels)
    blocks, _ = fused_blocks(res.plan["program"], load_params("n12").slots)
    pairs = sum(b.pairs for b in blocks)
    assert pairs >= 1
    rep = run_plan(res.plan, res.tables, "lattigo", seed=3)
    assert rep.ok, rep.failure()
    assert rep.stats["paired_plaintexts"] == 2 * pairs
    assert rep.max_rel_error < 1e-4
