"""The modelled memory of a Lattigo run (backends/lattigo_memory.py, Go memmodel.go): the
executor's terms are Lattigo's BinarySize of the objects they stand for, the fused-block
walk follows the executor's cache and pool, and the totals add up."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from backends.lattigo_backend import available, sizes
from backends.lattigo_memory import BootMemory, boot_memory, executor_memory, fused_series, process_model
from planner.frontend.params import Params, load_params
from planner.ir.analysis import memory_series
from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT
P13: dict[str, Any] = {"log_n": 13, "slots": 4096, "log_q": [50, 40, 40, 40], "log_p": [48], "log_scale": 40}
needs_lattigo = pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)")


def _plan(program: list[dict[str, Any]], plaintexts: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"schema": "slotplan.plan/1", "graph": {"name": "t", "sha256": "0" * 64}, "params": P13,
            "summary": {}, "nodes": [], "plaintexts": plaintexts or {}, "program": program}


@needs_lattigo
def test_executor_terms_are_binary_sizes() -> None:
    """Relinearisation key, rotation key, Q polys and QP elements as Lattigo sizes them; the
    evaluator's buffers as the sum of the polys rlwe/ckks allocate for these parameters."""
    prog = [{"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
            {"op": "cmul", "dst": "c1", "a": "c0", "b": "c0"},
            {"op": "output", "src": "c1", "tensor": "y", "table": "out/y"}]
    mem = executor_memory(_plan(prog), workers=1)
    s = sizes(P13)
    n, n_q, n_p = 1 << 13, 4, 1
    assert mem["relin_key_bytes"] == s["relin_key_bytes"] and mem["relin_resident"]
    assert mem["galois_key_bytes"] == s["galois_key_bytes"][3]
    for lv in range(4):
        # a ciphertext is two Q polys plus its metadata (a few hundred bytes)
        assert 0 <= s["ciphertext_bytes"][lv] - 2 * mem["q_poly_bytes"][lv] < 512
        # ring.Poly.BinarySize: 8 bytes + per modulus 8 + 8N; a QP poly adds the P part
        assert mem["q_poly_bytes"][lv] == 8 + (lv + 1) * (8 + 8 * n)
        assert mem["qp_poly_bytes"][lv] == mem["q_poly_bytes"][lv] + 8 + n_p * (8 + 8 * n)
        assert 0 <= mem["qp_element_bytes"][lv] - 2 * mem["qp_poly_bytes"][lv] < 512
    # rlwe.EvaluatorBuffers + ckks buffers + encoder, word for word
    q, qp = (n_q * n * 8), ((n_q + n_p) * n * 8)
    dnum = -(-n_q // n_p)
    words = 3 * q + 6 * qp + q + dnum * qp + 8 * n + 3 * q + q + 16 * (2 * n + 1) + 16 * (n // 2)
    assert abs(mem["evaluator_bytes"] - words) < 0.001 * words
    assert not mem["fused"] and mem["blocks"] == []


def _mem(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"top": 3, "workers": 2, "fused_worker_bytes": 7, "fused_decomp_bytes": 5, "fused": bool(blocks),
            "qp_element_bytes": [100, 200, 300, 400], "qp_poly_bytes": [10, 20, 30, 40],
            "q_poly_bytes": [1, 2, 3, 4], "blocks": blocks}


def test_fused_walk_cache_pool_and_level_change() -> None:
    """Two blocks on base c0 (level 3) share its baby rotations until the last; they go to the
    pool, which a later block at the same level reuses and one at another level drops."""
    prog = [
        {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},  # 0
        {"op": "pmul", "dst": "c1", "src": "c0", "pt": "p0"},  # 1: block A root (base c0)
        {"op": "pmul", "dst": "c2", "src": "c0", "pt": "p1"},  # 2: block B root (base c0)
        {"op": "add", "dst": "c3", "a": "c1", "b": "c2"},  # 3
        {"op": "pmul", "dst": "c4", "src": "c3", "pt": "p2"},  # 4: block C (base c3, level 2)
        {"op": "output", "src": "c4", "tensor": "y", "table": "out/y"},  # 5
    ]
    params = Params.from_json(P13)
    blocks = [
        {"root": 1, "first": 1, "base": "c0", "bases": {"c0": [1, 2]}, "terms": 3},
        {"root": 2, "first": 2, "base": "c0", "bases": {"c0": [2, 4]}, "terms": 1},
        {"root": 4, "first": 4, "base": "c3", "bases": {"c3": [1]}, "terms": 2},
    ]
    s = fused_series(prog, params, _mem(blocks))
    fixed = 2 * 7 + 5
    # A: babies {1,2} at level 3 (400 each) + P*c0, P*c1 (2 x 4) + 3 QP plaintexts (40 each)
    assert s[0] == 0
    assert s[1] == 2 * 400 + 8 + 3 * 40 + fixed
    # B: babies {1,2,4} + 1 plaintext; after B its three rotations are pooled at level 3
    assert s[2] == 3 * 400 + 8 + 40 + fixed
    assert s[3] == 3 * 400 + fixed
    # C at level 2 needs one new rotation: the level-3 pool is dropped
    assert s[4] == 300 + 2 * 3 + 2 * 30 + fixed
    assert s[5] == 300 + fixed  # C's rotation pooled at level 2
    # the same blocks at one level: C reuses a pooled rotation
    blocks[2]["base"] = "c0b"
    blocks[2]["bases"] = {"c0b": [1]}
    prog2 = [*prog[:4], {"op": "pmul", "dst": "c4", "src": "c0b", "pt": "p2"}, prog[5]]
    prog2.insert(1, {"op": "input", "dst": "c0b", "tensor": "x", "table": "in/x"})
    for b in blocks:
        b["root"] += 1
    s2 = fused_series(prog2, params, _mem(blocks))
    assert s2[5] == 3 * 400 + 2 * 4 + 2 * 40 + fixed  # 2 pooled + 1 taken from the pool + P*c
    assert fused_series(prog, params, _mem([])).tolist() == [0] * len(prog)
    # streamed plaintexts (no plaintext cache): a QP-mode block holds none of its own, a
    # Q-mode block still encodes all of them first
    blocks[1]["qmode"] = True
    st = fused_series(prog2, params, _mem(blocks), streamed=True)
    assert st[2] == 2 * 400 + 8 + fixed  # A: no plaintexts
    assert st[3] == 3 * 400 + 8 + 40 + fixed  # B (Q mode): its one plaintext
    assert st[5] == s2[5] - 2 * 40  # C: no plaintexts


def test_fused_walk_several_bases() -> None:
    """A block whose products read its origin c0 rotated lazily and a two-hop rotation c1 of
    it (multiplied as it is): P*c for each register, babies of c0 only; both released after
    the last block that reads them."""
    prog = [
        {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},  # 0
        {"op": "rot", "dst": "c1", "src": "c0", "k": 3},  # 1
        {"op": "pmul", "dst": "c2", "src": "c1", "pt": "p0"},  # 2: block A root
        {"op": "pmul", "dst": "c3", "src": "c0", "pt": "p1"},  # 3: block B root (c0 only)
        {"op": "output", "src": "c3", "tensor": "y", "table": "out/y"},  # 4
    ]
    params = Params.from_json(P13)
    blocks = [
        {"root": 2, "first": 2, "base": "c0", "bases": {"c0": [1, 2], "c1": []}, "terms": 3},
        {"root": 3, "first": 3, "base": "c0", "bases": {"c0": [2]}, "terms": 1},
    ]
    s = fused_series(prog, params, _mem(blocks))
    fixed = 2 * 7 + 5
    assert s[2] == 2 * 400 + 2 * (2 * 4) + 3 * 40 + fixed
    # c1 released after A (nothing lazily rotated: nothing pooled), c0 kept for B
    assert s[3] == 2 * 400 + 2 * 4 + 40 + fixed
    assert s[4] == 2 * 400 + fixed  # c0's two rotations pooled


def test_process_model_adds_up() -> None:
    prog = [
        {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
        {"op": "rot", "dst": "c1", "src": "c0", "k": 1},
        {"op": "pmul", "dst": "c2", "src": "c1", "pt": "p0"},
        {"op": "cmul", "dst": "c3", "a": "c2", "b": "c2"},
        {"op": "output", "src": "c3", "tensor": "y", "table": "out/y"},
    ]
    plan = _plan(prog, {"p0": {"source": "const", "table": "pt/c"}})
    mem = _mem([]) | {"evaluator_bytes": 1000, "relin_key_bytes": 77, "relin_resident": True, "galois_key_bytes": 55}
    pm = process_model(plan, mem, inline_plaintexts=True, baseline_bytes=10_000)
    ser = memory_series(prog, Params.from_json(P13), key_bytes={1: 55})
    total = ser["keys"] + ser["plaintexts"] + ser["ciphertexts"]
    at = pm["peak_step"]
    assert total[at] == total.max() and pm["keys"] == 55
    assert (pm["keys"], pm["plaintexts"], pm["ciphertexts"]) == (ser["keys"][at], ser["plaintexts"][at],
                                                                 ser["ciphertexts"][at])
    assert pm["evaluator"] == 1000 and pm["relin_key"] == 77 and pm["fused"] == 0
    assert pm["plaintext_values"] == 8 * 4096
    assert pm["growth"] == int(total.max()) + 1000 + 77 + 8 * 4096
    assert pm["total"] == pm["growth"] + 10_000
    # through a file: one vector; no relinearisation key held beside the plan's keys
    pm2 = process_model(plan, mem | {"relin_resident": False}, inline_plaintexts=False, baseline_bytes=0)
    assert pm2["plaintext_values"] == 8 * 4096 and pm2["relin_key"] == 0 and pm2["total"] == pm2["growth"]


def test_bootstrap_terms_temporaries_and_garbage() -> None:
    """A bootstrap holds its temporaries at its own step; from the first bootstrap on the heap
    carries garbage up to GOGC percent of its live bytes, and never more than the bootstraps so
    far allocated; a plan without a bootstrap, or no measurement, adds neither."""
    params = load_params("n14boot")
    prog = [
        {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},  # 0
        {"op": "bootstrap", "dst": "b1", "src": "c0"},  # 1
        {"op": "rot", "dst": "r1", "src": "b1", "k": 1},  # 2
        {"op": "bootstrap", "dst": "b2", "src": "r1"},  # 3
        {"op": "output", "src": "b2", "tensor": "y", "table": "out/y"},  # 4
    ]
    plan = _plan(prog) | {"params": params.to_json()}
    mem = _mem([]) | {"evaluator_bytes": 1000, "relin_key_bytes": 77, "relin_resident": False, "galois_key_bytes": 55,
                      "run_gc_percent": 10, "top": params.max_level}
    bare = process_model(plan, mem, baseline_bytes=0)
    assert bare["boot_transient"] == 0 and bare["gc_slack"] == 0
    # garbage capped by what one bootstrap allocated at step 1, by GOGC's share at step 3
    alloc = 150 * 2**20  # the keep-all block is ~1.9 GB: its tenth lies between one and two
    boot = BootMemory(transient_bytes=80 * 2**20, alloc_bytes=alloc)
    pm = process_model(plan, mem, baseline_bytes=0, boot=boot)
    ser = memory_series(prog, params, key_bytes={1: 55})
    live = ser["keys"] + ser["plaintexts"] + ser["ciphertexts"] + 1000  # one evaluator; no plaintexts
    heap = live + np.array([0, 1, 0, 1, 0]) * boot.transient_bytes
    slack = np.minimum(heap // 10, np.array([0, 1, 1, 2, 2]) * alloc)
    assert slack[1] == alloc and slack[3] == heap[3] // 10 < 2 * alloc
    at = pm["peak_step"]
    assert at == int(np.argmax(heap + slack)) and prog[at]["op"] == "bootstrap"
    assert (pm["boot_transient"], pm["gc_slack"]) == (boot.transient_bytes, slack[at])
    assert pm["growth"] == int((heap + slack)[at]) == bare["growth"] - int(live[bare["peak_step"]]) + int((heap + slack)[at])
    # no bootstrap: no temporaries and no garbage
    plain = _plan(prog[:1] + [{"op": "output", "src": "c0", "tensor": "y", "table": "out/y"}]) | {"params": params.to_json()}
    pm0 = process_model(plain, mem, baseline_bytes=0, boot=boot)
    assert pm0["boot_transient"] == 0 and pm0["gc_slack"] == 0


def test_boot_memory_from_the_calibrated_table() -> None:
    """n14boot's table measured one bootstrap (calibrate); presets without bootstrapping, or
    parameters the table was not calibrated on, have none."""
    import json

    table = json.loads((ROOT / "data/costs/n14boot-lattigo.json").read_text())
    b = boot_memory(load_params("n14boot"))
    assert b is not None
    assert (b.transient_bytes, b.alloc_bytes) == (table["measurements"]["bootstrap"]["transient_bytes"],
                                                  table["measurements"]["bootstrap"]["alloc_bytes"])
    # a bootstrap holds tens of MiB of temporaries and allocates more than it holds
    assert 16 * 2**20 < b.transient_bytes < b.alloc_bytes
    assert boot_memory(load_params("n13")) is None
    other = dict(load_params("n14boot").to_json()) | {"log_scale": 39}
    assert boot_memory(Params.from_json(other)) is None


@needs_lattigo
def test_run_reports_the_process_model() -> None:
    """A keep-all run (fused blocks) reports the process model next to its measured RSS; the
    fused blocks Go lists are the ones the executor ran."""
    from backends.runner import run_plan as run_and_compare
    from planner.frontend.graph import load_graph
    from planner.frontend.params import load_params
    from planner.pipeline import PlanOptions, plan_graph

    g = load_graph(ROOT / "data/workloads/mvm1.json")
    res = plan_graph(g, load_params("n13"), PlanOptions())
    rep = run_and_compare(res.plan, res.tables, "lattigo", seed=3)
    assert rep.ok, rep.max_rel_error
    mem = rep.memory
    pm = mem["modelled_process_bytes"]
    assert pm["total"] == pm["growth"] + mem["rss_start_bytes"]
    assert pm["growth"] >= res.plan["summary"]["peak_bytes"]["keys"]
    em = executor_memory(res.plan, rep.stats["workers"])
    assert len(em["blocks"]) == rep.stats["fused_blocks"]
    assert rep.stats["gc_percent"] == 10
    assert np.isfinite(mem["rss_over_process_model"]) and mem["rss_over_process_model"] > 0


@needs_lattigo
def test_small_run_reports_the_process_model() -> None:
    """test_run_reports_the_process_model (mvm1 at n13, minutes; `make test-all`) on a 64 x 64
    matvec at n12: the same report, and at least one fused block run."""
    from backends.runner import run_plan as run_and_compare
    from planner.frontend.params import load_params
    from planner.pipeline import PlanOptions, plan_graph
    from tests.helpers import matvec_graph

    res = plan_graph(matvec_graph(64, 64), load_params("n12"), PlanOptions())
    rep = run_and_compare(res.plan, res.tables, "lattigo", seed=3)
    assert rep.ok, rep.max_rel_error
    mem = rep.memory
    pm = mem["modelled_process_bytes"]
    assert pm["total"] == pm["growth"] + mem["rss_start_bytes"]
    assert pm["growth"] >= res.plan["summary"]["peak_bytes"]["keys"]
    em = executor_memory(res.plan, rep.stats["workers"])
    assert rep.stats["fused_blocks"] >= 1 and len(em["blocks"]) == rep.stats["fused_blocks"]
    assert rep.stats["gc_percent"] == 10
    assert np.isfinite(mem["rss_over_process_model"]) and mem["rss_over_process_model"] > 0
