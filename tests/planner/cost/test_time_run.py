"""planner.cost.timing.Run, the time model of a plan as the executor runs it (no Lattigo): levels
dropped, plaintexts and DFT matrices encoded in the clock, key reads without a core of their own."""

from __future__ import annotations

from typing import Any

import pytest

from planner.cost.timing import Run, modelled_time, time_model
from planner.frontend.params import load_params
from planner.ir.analysis import level_drops
from planner.ir.fusion import fused_blocks
from tests.helpers import one_key_load_program, qp_block_program


def _segment() -> list[dict[str, Any]]:
    """A fresh input rotated, summed and multiplied once before a bootstrap: it needs one
    level of the nine it holds (no fused block: the product reads a sum)."""
    return [
        {"op": "input", "dst": "x", "tensor": "x", "table": "x"},
        {"op": "rot", "dst": "y", "src": "x", "k": 1},
        {"op": "add", "dst": "s", "a": "x", "b": "y"},
        {"op": "pmul", "dst": "t", "src": "s", "pt": "p"},
        {"op": "rescale", "dst": "u", "src": "t"},
        {"op": "bootstrap", "dst": "z", "src": "u"},
        {"op": "output", "src": "z", "tensor": "z", "table": "z"},
    ]


def test_level_drops_price_the_segment_at_the_dropped_level() -> None:
    params = load_params("n14boot")
    tm = time_model(params)
    L = params.max_level
    prog = _segment()
    drops = level_drops(prog, L)
    assert drops == {0: 1}  # the input keeps the one level its product needs
    plan = tm.program_costs(prog, L, params.slots)
    run = tm.program_costs(prog, L, params.slots, Run(level_drops=True))
    assert plan[1] == pytest.approx(tm.at("rotate", L)) and run[1] == pytest.approx(tm.at("rotate", 1))
    assert plan[2] == pytest.approx(tm.at("add", L)) and run[2] == pytest.approx(tm.at("add", 1))
    assert plan[3] == pytest.approx(tm.at("pmul", L)) and run[3] == pytest.approx(tm.at("pmul", 1))
    assert run[4] == pytest.approx(tm.at("rescale", 1))
    assert run[5] == plan[5] == pytest.approx(tm.bootstrap)  # the bootstrap itself is priced as before
    assert sum(run) < sum(plan)
    # a plan without bootstrapping drops nothing: the same prices
    body = [*prog[:5], {"op": "output", "src": "u", "tensor": "u", "table": "u"}]
    assert tm.program_costs(body, L, params.slots, Run(level_drops=True)) == tm.program_costs(body, L, params.slots)


def test_encoding_is_one_fft_and_one_ntt_per_prime() -> None:
    """The calibrated encode at the top level and at 0, read at the encoding's primes: Q
    (level + 1) for a product by a plaintext, QP (+ the P primes) for a QP block's."""
    params = load_params("n14boot")
    tm = time_model(params)
    per = tm.table.measurements["per_level_ms"]  # type: ignore[index]
    top, bottom = float(per["9"]["encode"]), float(per["0"]["encode"])
    per_prime = (top - bottom) / 9
    assert tm.p_primes == len(params.log_p) == 5
    assert tm.encode(9, qp=False) == pytest.approx(top) and tm.encode(0, qp=False) == pytest.approx(bottom)
    assert tm.encode(4, qp=False) == pytest.approx(bottom + 4 * per_prime)
    assert tm.encode(6, qp=True) == pytest.approx(bottom + 11 * per_prime)


def test_encoding_in_the_clock_prices_each_plaintext_of_a_product_and_a_block() -> None:
    params = load_params("n13")
    tm = time_model(params)
    L = params.max_level
    prog = qp_block_program()
    blocks, _ = fused_blocks(prog, params.slots)
    (blk,) = blocks
    # its two products are one giant step's: the executor encodes them as a pair
    assert not blk.qmode and blk.products == 2 and blk.pairs == 1
    cached = tm.program_costs(prog, L, params.slots)
    oneshot = tm.program_costs(prog, L, params.slots, Run(encode=True))
    assert sum(oneshot) - sum(cached) == pytest.approx(tm.encode_pair(L, qp=True))
    assert oneshot[blk.root] - cached[blk.root] == pytest.approx(tm.encode_pair(L, qp=True))
    # a product the executor runs as written encodes its plaintext in Q at its level
    single = [prog[0], {"op": "pmul", "dst": "a", "src": "x", "pt": "pa"},
              {"op": "output", "src": "a", "tensor": "a", "table": "a"}]
    d = sum(tm.program_costs(single, L, params.slots, Run(encode=True))) - sum(tm.program_costs(single, L, params.slots))
    assert d == pytest.approx(tm.encode(L, qp=False)) and d > 0


def test_plaintext_store_prices_each_block_plaintext_as_a_read_and_a_hash() -> None:
    """With the plaintext store a block's plaintexts are read back (their QP bytes at the
    read rate, their values hashed for the key) instead of encoded; a product outside a
    block still encodes its plaintext in the clock."""
    from planner.cost.timing import STORE_HASH_BYTES_PER_MS, STORE_READ_BYTES_PER_MS

    params = load_params("n13")
    tm = time_model(params)
    L = params.max_level
    prog = qp_block_program()
    (blk,), _ = fused_blocks(prog, params.slots)
    cached = tm.program_costs(prog, L, params.slots)
    stored = tm.program_costs(prog, L, params.slots, Run(encode=True, plaintext_store=True))
    limbs = L + 1 + tm.p_primes
    one_ms = limbs * 2 * params.slots * 8 / STORE_READ_BYTES_PER_MS + params.slots * 8 / STORE_HASH_BYTES_PER_MS
    assert tm.store_read(L, True, params.slots) * tm.ms_per_unit == pytest.approx(one_ms)
    assert stored[blk.root] - cached[blk.root] == pytest.approx(blk.products * tm.store_read(L, True, params.slots))
    # cheaper than encoding the pair at this ring (an NTT per prime against a copy)
    oneshot = tm.program_costs(prog, L, params.slots, Run(encode=True))
    assert cached[blk.root] < stored[blk.root] < oneshot[blk.root]
    single = [prog[0], {"op": "pmul", "dst": "a", "src": "x", "pt": "pa"},
              {"op": "output", "src": "a", "tensor": "a", "table": "a"}]
    assert tm.program_costs(single, L, params.slots, Run(encode=True, plaintext_store=True)) == \
        tm.program_costs(single, L, params.slots, Run(encode=True))


def test_block_load_encodes_the_dft_matrices_in_a_one_shot_run() -> None:
    params = load_params("n14boot")
    tm = time_model(params)
    assert tm.matrix_ms == pytest.approx(tm.table.measurements["bootstrap"]["matrix_encoding_ms"])  # type: ignore[index]
    prog = [{"op": "load_key", "block": "boot"}, *_segment()[:1],
            {"op": "bootstrap", "dst": "z", "src": "x"}, {"op": "output", "src": "z", "tensor": "z", "table": "z"}]
    cached = modelled_time(prog, params, {}, tm)
    oneshot = modelled_time(prog, params, {}, tm, run=Run(encode=True))
    assert oneshot.total_ms - cached.total_ms == pytest.approx(tm.matrix_ms)


def test_key_reads_without_a_core_of_their_own_are_in_line() -> None:
    """Prefetching hides a read behind the evaluation only when the reader has a core; on the
    evaluation's core every read adds its time (the program never waits: it reads)."""
    params = load_params("n13")
    tm = time_model(params)
    kb = params.rotation_key_bytes()
    body = one_key_load_program()
    compute = sum(tm.program_costs(body, params.max_level, params.slots)) * tm.ms_per_unit
    beside = modelled_time(body, params, {3: kb}, tm)
    one = modelled_time(body, params, {3: kb}, tm, run=Run(loader_core=False))
    assert beside.total_ms < compute + tm.load_ms(kb)
    assert one.total_ms == pytest.approx(compute + tm.load_ms(kb)) and one.stall_ms == 0.0


def test_a_streamed_blocks_reads_are_in_line_without_a_core_of_their_own() -> None:
    params = load_params("n14boot")
    tm = time_model(params)
    prog = [{"op": "load_key", "block": "boot", "stream": 2},
            {"op": "input", "dst": "x", "tensor": "x", "table": "x"},
            {"op": "bootstrap", "dst": "z", "src": "x"}, {"op": "output", "src": "z", "tensor": "z", "table": "z"}]
    one = modelled_time(prog, params, {}, tm, run=Run(loader_core=False))
    assert one.stall_ms == 0.0
    assert one.total_ms == pytest.approx(one.compute_ms + one.load_ms)
    assert one.total_ms >= modelled_time(prog, params, {}, tm).total_ms - 1e-6


def test_bootstraps_at_the_executors_measured_time() -> None:
    """``bootstrap_measured``: each kind at its median as the executor ran it (the calibration's
    ``boot_variants`` runs); a kind measured with a streamed block has its reads inside."""
    params = load_params("n14boot")
    tm = time_model(params)
    meas = tm.table.measurements["boot_variants"]  # type: ignore[index]
    prog = [{"op": "input", "dst": "x", "tensor": "x", "table": "x"},
            {"op": "bootstrap", "dst": "z", "src": "x"},
            {"op": "bootstrap", "dst": "w", "src": "z", "log_slots": 9},
            {"op": "output", "src": "w", "tensor": "w", "table": "w"}]
    plan = tm.program_costs(prog, params.max_level, params.slots)
    run = tm.program_costs(prog, params.max_level, params.slots, Run(bootstrap_measured=True))
    assert plan[1] == pytest.approx(tm.bootstrap) and plan[2] == pytest.approx(tm.boot_variants["s9"])
    assert run[1] == pytest.approx(meas["full"]["median_ms"]) and run[2] == pytest.approx(meas["s9"]["median_ms"])
    assert tm.boot_run_streamed["full"] is False  # n14boot's variants ran with the block resident
    # n16boot's ran streamed (stream 2, one core): a streamed plan adds no reads beside them
    p16 = load_params("n16boot")
    t16 = time_model(p16)
    assert t16.boot_run_streamed["s13"] is True
    streamed = [{"op": "load_key", "block": "boot", "stream": 2}, prog[0],
                {"op": "bootstrap", "dst": "z", "src": "x", "log_slots": 13},
                {"op": "output", "src": "z", "tensor": "z", "table": "z"}]
    one = modelled_time(streamed, p16, {}, t16, run=Run(loader_core=False, bootstrap_measured=True))
    in_line = modelled_time(streamed[:1], p16, {}, t16).load_ms
    assert one.compute_ms == pytest.approx(t16.boot_run["s13"])
    assert one.total_ms == pytest.approx(t16.boot_run["s13"] + in_line)


def test_keymeasure_models_benchplan_as_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """keymeasure's Run: levels dropped for a bootstrapping preset, encoding outside the clock,
    a reader core only when the process may use more cores than the evaluation's workers."""
    from api.lattigo_keys import bench_run

    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0})
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    one = bench_run(load_params("n14boot"), None)
    assert one == Run(level_drops=True, encode=False, loader_core=False, bootstrap_measured=True)
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1})
    assert bench_run(load_params("n14"), 1).loader_core and not bench_run(load_params("n14"), 1).level_drops
    assert not bench_run(load_params("n14"), None).loader_core  # GOMAXPROCS workers on both cores
    monkeypatch.setenv("GOMAXPROCS", "1")
    assert not bench_run(load_params("n14"), 1).loader_core


def test_two_real_plaintexts_are_encoded_for_about_the_price_of_one() -> None:
    """``encode_pair`` (backends/lattigo/encode_pair.go) is a line through its calibrated
    points like ``encode``; a table without it prices a pair as two encodings; a block pays
    its pairs and its odd products one by one."""
    params = load_params("n16boot")
    tm = time_model(params)
    per = tm.table.measurements["per_level_ms"]  # type: ignore[index]
    assert "encode_pair" in per["9"] and "encode_pair" in per["0"]
    top, bottom = float(per["9"]["encode_pair"]), float(per["0"]["encode_pair"])
    assert tm.encode_pair(9, qp=False) == pytest.approx(top)
    assert tm.encode_pair(4, qp=True) == pytest.approx(bottom + 9 * (top - bottom) / 9)
    # measured: a pair costs well under two encodings (one inverse FFT, one NTT per prime)
    assert tm.encode_pair(9, qp=False) < 1.5 * tm.encode(9, qp=False)
    assert tm.encode_block(5, False, 7, 3) == pytest.approx(3 * tm.encode_pair(5, False) + tm.encode(5, False))
    old = time_model(params)
    old.points.pop("encode_pair")
    assert old.encode_pair(5, True) == pytest.approx(2 * old.encode(5, True))
