"""Ciphertext x ciphertext matmul (FAME/JKLS rolled layouts, Strassen): every variant
executes in the simulator and equals numpy; the strided BSGS split; Rotom Table 4."""

from __future__ import annotations

import numpy as np
import pytest

from backends.sim import simulate
from planner.assign.candidates import PlanError
from planner.frontend.graph import load_graph, parse_graph
from planner.frontend.params import load_params
from planner.ir.builder import LazyTables, ProgramBuilder
from planner.kernels.base import Candidate
from planner.kernels.ctct import CtCtGeom, jkls_candidates
from planner.kernels.problem import KernelError
from planner.layout.rotom import parse_layout
from planner.pipeline import PlanOptions, plan_graph
from solver import SOLVERS
from tests.helpers import REPO_ROOT, check_plan, small_params
from tests.planner.layout.test_rotom import run_conversion

DATA = REPO_ROOT / "data"


def ctct_graph(m: int, k: int, n: int):  # noqa: ANN201
    return parse_graph({
        "schema": "slotplan.graph/1", "name": f"ctct{m}x{k}x{n}",
        "tensors": {"A": {"shape": [m, k], "role": "input"}, "B": {"shape": [k, n], "role": "input"}},
        "nodes": [{"id": "C", "op": "matmul", "inputs": ["A", "B"]}], "outputs": ["C"],
    })


def run_candidate(c: Candidate, vals: dict[str, np.ndarray], S: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Client-pack the candidate's input layouts, run its program, read C back by its out
    layout; also return every unused output slot (must be zero: the layout is clean)."""
    b = ProgramBuilder(S)
    regs = {}
    for t, lay in c.in_layouts.items():
        regs[t] = [b.input(t, f"in/{t}/{q}", lambda lay=lay, q=q: (lay.index_map(q).copy(), None))
                   for q in range(lay.n_ct)]
    outs = c.lower(b, regs)
    out_lay = c.out_layout
    maps = [out_lay.index_map(q) for q in range(out_lay.n_ct)]
    for q, r in enumerate(outs):
        # read whole ciphertexts: identity map onto a flat (n_ct * S) tensor
        b.output(r, "raw", f"out/raw/{q}", lambda q=q: (np.arange(S) + q * S, None))
    plan = {"params": {"slots": S, "log_q": [50] + [40] * 8}, "program": b.instrs,
            "plaintexts": {n: {"source": p.source, "table": p.table} for n, p in b.plaintexts.items()},
            "outputs": {"raw": [len(outs) * S]}}
    res = simulate(plan, LazyTables(b.tables), vals)
    raw = res.outputs["raw"].reshape(len(outs), S)
    m, n = out_lay.shape
    got = np.full(m * n, np.nan)
    unused = []
    for q, mp in enumerate(maps):
        used = mp >= 0
        got[mp[used]] = raw[q][used]
        unused.append(raw[q][~used])
    return got.reshape(m, n), np.concatenate(unused), res.rotations


SHAPES = [
    (8, 8, 8, 64),      # one square tile filling the ciphertext (W == S: omega is one rotation)
    (12, 8, 20, 256),   # several tiles per ciphertext, padded tiles
    (6, 5, 7, 64),      # non-powers of two, window smaller than the ciphertext
    (16, 12, 16, 64),   # inner dimension in chunks (12 > sqrt(64)), multi-ciphertext output
    (32, 32, 32, 256),  # 2x2 tiles, one per ciphertext: Strassen applies
    (5, 17, 3, 128),    # tall inner dimension, tiny output
]


@pytest.mark.parametrize("m,k,n,S", SHAPES)
def test_every_jkls_variant_matches_numpy(m: int, k: int, n: int, S: int) -> None:
    g = ctct_graph(m, k, n)
    node = g.nodes[0]
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    vals = {"A": rng.uniform(-1, 1, (m, k)), "B": rng.uniform(-1, 1, (k, n))}
    want = vals["A"] @ vals["B"]
    cands = jkls_candidates(g, node, S)
    assert cands
    kinds = set()
    for c in cands:
        got, unused, rot = run_candidate(c, vals, S)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12, err_msg=c.label)
        assert np.all(unused == 0.0), c.label
        assert rot == c.cost(S).rotations, c.label
        kinds.add(c.kernel)
    if (m, k, n, S) == (32, 32, 32, 256):
        assert "ct-ct-strassen" in kinds


def test_strassen_uses_seven_block_products() -> None:
    g = ctct_graph(32, 32, 32)
    cands = jkls_candidates(g, g.nodes[0], 256)
    plain = [c for c in cands if c.kernel == "ct-ct-jkls" and c.params["lc"] == 16 and c.params["q"] == 1]
    strassen = [c for c in cands if c.kernel == "ct-ct-strassen"]
    assert plain and strassen
    # 8 block products of 16 steps vs 7
    assert min(c.cost(256).cmul for c in plain) == 8 * 16
    assert {c.cost(256).cmul for c in strassen} == {7 * 16}


def test_geometry_rejects_tiles_that_do_not_fit() -> None:
    with pytest.raises(KernelError, match="do not fit"):
        CtCtGeom(8, 16, 8, 64, 16, 1, "A", "x-major")


def test_strided_bsgs_transposition() -> None:
    """Row-major [0:64][1:64] -> column-major: offsets are multiples of 63, the strided
    split needs far fewer rotations than the 2*64 - 1 diagonals, and stays exact."""
    src = parse_layout("[0:64][1:64]", (64, 64), 4096)
    dst = parse_layout("[1:64][0:64]", (64, 64), 4096)
    x, res = run_conversion(src, dst)
    conv = res["conv"]
    assert conv.kind == "permute"
    rot = conv.cost().rotations
    assert rot <= 24, rot
    np.testing.assert_array_equal(res["y"], x)


def test_rotom_table4_col_row_ctct_within_paper_rotations() -> None:
    """Rotom Table 4: [128,64] x [64,128] at 8192 slots with A column-major and B
    row-major (pinned) in at most Rotom's 348 rotations, exact in the simulator."""
    g = load_graph(DATA / "workloads/rotom/bolt_ctct.json")
    opts = PlanOptions(input_layouts=(("A", "[1:64][0:128]"), ("B", "[0:64][1:128]")))
    res = plan_graph(g, load_params("n14"), opts)
    assert res.plan["summary"]["rotations"] <= 348
    assert {n["kernel"] for n in res.plan["nodes"]} <= {"ct-ct-jkls", "ct-ct-strassen"}
    check_plan(res, g)


def test_ctct_in_a_graph_with_conversions() -> None:
    """q @ k^T with both operands produced by ct-pt matmuls: the edge conversions into
    the rolled layouts are priced and executed."""
    g = parse_graph({
        "schema": "slotplan.graph/1", "name": "attn-scores",
        "tensors": {"X": {"shape": [12, 10], "role": "input"}, "Wq": {"shape": [10, 6], "role": "weight"},
                    "Wk": {"shape": [10, 6], "role": "weight"}},
        "nodes": [{"id": "q", "op": "matmul", "inputs": ["X", "Wq"]},
                  {"id": "k", "op": "matmul", "inputs": ["X", "Wk"]},
                  {"id": "kt", "op": "transpose", "inputs": ["k"], "perm": [1, 0]},
                  {"id": "s", "op": "matmul", "inputs": ["q", "kt"]}],
        "outputs": ["s"],
    })
    res = plan_graph(g, small_params(10, 8), PlanOptions(allow_insecure=True, kernels=[
        "bsgs", "hs-diagonal", "elementwise", "view", "ct-ct-jkls", "ct-ct-strassen"]))
    check_plan(res, g)
    assert any(n["kernel"] in ("ct-ct-jkls", "ct-ct-strassen") for n in res.plan["nodes"])


def test_depth_budget_steers_the_kernel_choice() -> None:
    """With only two levels the rolled kernel (depth >= 3 with its conversions) does not
    fit; the model (both solvers) picks a shallower one instead of failing after solving."""
    g = load_graph(DATA / "workloads/rotom/bolt_ctct.json")
    opts = dict(input_layouts=(("A", "[1:64][0:128]"), ("B", "[0:64][1:128]")))
    shallow = small_params(14, levels=2)
    for solver in SOLVERS:
        res = plan_graph(g, shallow, PlanOptions(solver=solver, **opts))
        assert res.plan["summary"]["depth"] <= 2
        assert {n["kernel"] for n in res.plan["nodes"]} == {"ct-ct-diagonal"}
    deep = plan_graph(g, small_params(14, levels=8), PlanOptions(**opts, allow_insecure=True))
    assert {n["kernel"] for n in deep.plan["nodes"]} == {"ct-ct-jkls"}
    with pytest.raises(PlanError, match="fits the 1 levels"):
        plan_graph(g, small_params(14, levels=1), PlanOptions(**opts, allow_insecure=True))


@pytest.mark.parametrize("m,k,n,log_n", [(64, 16, 64, 13), (128, 16, 128, 15), (8, 4, 70, 10), (4, 8, 150, 10)])
def test_diagonal_ct_ct_with_several_output_ciphertexts(m: int, k: int, n: int, log_n: int) -> None:
    """ct-ct-diagonal with P_O > 1 and a non-cyclic copy of A: every output ciphertext's
    lane j meets the same rotation of A (a B diagonal indexed by q*J + j was wrong for q >= 1
    whenever J is not a multiple of the column count; found by the workload hygiene test)."""
    g = parse_graph({
        "schema": "slotplan.graph/1", "name": "ctct-po",
        "tensors": {"A": {"shape": [m, k], "role": "input"}, "B": {"shape": [k, n], "role": "input"}},
        "nodes": [{"id": "C", "op": "matmul", "inputs": ["A", "B"]}], "outputs": ["C"],
    })
    params = small_params(log_n, levels=4) if log_n == 10 else load_params(f"n{log_n}")
    res = plan_graph(g, params, PlanOptions(kernels=("ct-ct-diagonal",), allow_insecure=log_n == 10))
    node = res.plan["nodes"][0]
    assert node["kernel"] == "ct-ct-diagonal" and node["params"]["P_O"] > 1
    check_plan(res, g)
