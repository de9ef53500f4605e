"""Sparse bootstrap variants (issue 36) on Lattigo at ``n14boot``: one plan mixes the full-slot
bootstrap with every kind of variant (plain, halves, pair, replicas) at every log_slots n14boot offers,
runs encrypted, and each output must equal the simulator's (numpy) to CKKS precision, with
the scale applied and the level the contract gives (one below the top residual level for a
variant, the top for the full bootstrap). Bad variant fields are refused before any key is
generated. Skipped when the extension is not built or less than 4 GiB is available.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.lattigo_backend import LattigoError, available, run_plan, run_raw
from backends.noise import load_model, simulate_noisy
from backends.sim import SimulationError, simulate
from common.errors import PlanFileError
from planner import ir
from planner.frontend.params import preset
from tests.helpers import mem_available

P = preset("n14boot")
S = P.slots
assert P.boot is not None
A = P.boot.max_abs
# CKKS precision of a bootstrap at n14boot, relative to max_abs (the full-slot bootstrap
# keeps ~21 bits there, planner.frontend.params.BOOT_MAX_ABS): every variant must keep 18
PREC_BITS = 18

lattigo = [
    pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)"),
    pytest.mark.skipif(mem_available() < 4 << 30, reason="a bootstrap at log N 14 needs ~3 GB of memory"),
]


def _plan(program: list[ir.Instr], pts: tuple[str, ...] = ("w",)) -> dict[str, Any]:
    return {
        "schema": ir.PLAN_SCHEMA,
        "graph": {"name": "boot-variants", "sha256": "0" * 64},
        "params": P.to_json(),
        "plaintexts": {p: {"source": p, "table": f"pt/{p}"} for p in pts},
        "program": ir.to_json_program(program),
    }


def _down(prog: list[ir.Instr], name: str, level: int) -> str:
    """input ``name`` brought to ``level`` by products with w (one level each)."""
    prog.append(ir.Input(dst=f"{name}0", tensor=name, table=f"in/{name}"))
    prev = f"{name}0"
    for i in range(1, P.max_level - level + 1):
        prog += [ir.PMul(dst=f"{name}m{i}", src=prev, pt="w"), ir.Rescale(dst=f"{name}r{i}", src=f"{name}m{i}")]
        prev = f"{name}r{i}"
    return prev


# (kind, log_slots, scale, input level): every log_slots n14boot offers, each kind; "hm":
# halves premasked, its source a degree-3 poly (depth 2) with the complex packing mask, so the
# bootstrap reads level 0, where a halves bootstrap that masks its source could not run
CASES = [("full", None, None, 0), ("s", 9, None, 0), ("h", 10, None, 1), ("p", 11, 2.0, 0), ("h", 12, 0.5, 2),
         ("s", 12, -1.5, 0), ("r", 10, 3.0, 0), ("r", 11, None, 2), ("hm", 11, 2.0, 2)]
# the premasked case's poly: |p(x)| <= A / 2 for |x| <= A / 2
HM_COEFFS = (0.0, 0.5, 0.0, 0.25 / A**2)


def mixed_plan(rng: np.random.Generator) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, np.ndarray],
                                                   list[tuple[str, str, int | None]]]:
    prog: list[ir.Instr] = [ir.LoadKey(block="boot")]
    inputs: dict[str, np.ndarray] = {}
    w = rng.uniform(0.8, 1.0, S)
    outs: list[tuple[str, str, int | None]] = []
    masks: dict[str, np.ndarray] = {}
    for j, (kind, k, scale, level) in enumerate(CASES):
        span = S if k is None else (1 << k) * (2 if kind in ("h", "hm") else 1)
        bound = A / (scale or 1) if kind == "r" else A if kind in ("full", "s") else A / 2
        names = [f"x{j}", f"y{j}"] if kind == "p" else [f"x{j}"]
        srcs = []
        for nm in names:
            v = np.zeros(S)
            v[:span] = rng.uniform(-bound, bound, span)
            inputs[nm] = v
            srcs.append(_down(prog, nm, level))
        if kind == "full":
            prog.append(ir.Bootstrap(dst=f"b{j}", src=srcs[0]))
            dsts = [f"b{j}"]
        elif kind == "p":
            prog.append(ir.Bootstrap2(dsts=(f"a{j}", f"b{j}"), srcs=tuple(srcs), log_slots=k, scale=scale))
            dsts = [f"a{j}", f"b{j}"]
        elif kind == "hm":
            assert k is not None
            n = 1 << k
            masks[f"m{j}"] = np.where(np.arange(S) < n, 1.0, 0.0) + 1j * np.where(np.arange(S) >= n, 1.0, 0.0)
            masks[f"m{j}"][2 * n:] = 0
            prog.append(ir.Poly(dst=f"q{j}", src=srcs[0], coeffs=HM_COEFFS, mask=f"m{j}"))
            prog.append(ir.Bootstrap(dst=f"b{j}", src=f"q{j}", log_slots=k, halves=True, scale=scale,
                                     premasked=True))
            dsts = [f"b{j}"]
        else:
            prog.append(ir.Bootstrap(dst=f"b{j}", src=srcs[0], log_slots=k, halves=(kind == "h") or None,
                                     scale=scale, replicas=(kind == "r") or None))
            dsts = [f"b{j}"]
        for d in dsts:
            prog.append(ir.Output(src=d, tensor=f"o{d}", table="out"))
            outs.append((f"o{d}", kind, k))
    prog.append(ir.DropKey(block="boot"))
    ident = np.arange(S, dtype=np.int64)
    tables = {f"in/{nm}.idx": ident for nm in inputs} | {"pt/w.idx": ident, "out.idx": ident}
    plan = _plan(prog)
    for m, v in masks.items():  # complex const plaintexts
        plan["plaintexts"][m] = {"source": "const", "table": f"pt/{m}", "imag_table": f"pt/{m}/im"}
        for t, part in ((f"pt/{m}", v.real), (f"pt/{m}/im", v.imag)):
            tables[f"{t}.idx"] = np.full(S, -1, dtype=np.int64)
            tables[f"{t}.coef"] = part.copy()
    return plan, {**inputs, "w": w}, tables, outs


def _premasked_expected(vals: dict[str, np.ndarray], t: str) -> np.ndarray:
    """What the premasked case's output ``t`` holds (numpy): scale * p(x) on [0, 2^(k+1))."""
    j = int(t[2:])
    kind, k, scale, level = CASES[j]
    assert kind == "hm" and k is not None
    src = vals[f"x{j}"] * vals["w"] ** (P.max_level - level)  # (_down's products)
    return (scale or 1) * np.polynomial.polynomial.polyval(src, HM_COEFFS) * (np.arange(S) < 2 << k)


def test_simulator_variants_and_noise() -> None:
    """The simulator's values (scale * source) and the noisy simulator (zeros of the plan
    holding noise are still zeros; the output's error is a bootstrap's)."""
    rng = np.random.default_rng(3)
    plan, vals, tables, outs = mixed_plan(rng)
    sim = simulate(plan, tables, vals)
    noisy = simulate_noisy(plan, tables, vals, load_model(plan["params"]), np.random.default_rng(1))
    for t, kind, k in outs:
        err = float(np.max(np.abs(noisy.result.outputs[t] - sim.outputs[t])))
        assert 0 < err < A * 2.0**-PREC_BITS, (t, err)
        if kind == "r":  # every slot a copy of the first 2^k, times the scale (and its noise)
            n = 1 << k
            _, _, sc, level = next(c for c in CASES if c[:2] == (kind, k))
            src = vals["x" + t[2:]] * vals["w"] ** (P.max_level - level)  # (_down's products)
            sc = sc or 1
            np.testing.assert_allclose(sim.outputs[t], sc * np.tile(src[:n], S // n), rtol=0, atol=1e-12)
            assert np.all(np.abs(noisy.result.outputs[t][n:]) > 0)
        elif kind == "s":  # unpacked: zeros outside [0, 2^k)
            assert not np.any(sim.outputs[t][1 << k:]) and not np.any(noisy.result.outputs[t][1 << k:])
        if kind == "hm":  # the poly's values, unpacked from the packing (numpy)
            np.testing.assert_allclose(sim.outputs[t], _premasked_expected(vals, t), rtol=0, atol=1e-12)


def test_premasked_needs_the_packing() -> None:
    """A premasked halves bootstrap: the IR refuses it without halves, the plan check when a
    poly with a complex mask did not write its source, and the simulator when the values do
    not carry the packing (a real mask: the high half is not i times a real value)."""
    with pytest.raises(PlanFileError, match=r"premasked belongs to a halves bootstrap"):
        ir.Instr.from_json({"op": "bootstrap", "dst": "b", "src": "x", "log_slots": 9, "premasked": True})
    ident = np.arange(S, dtype=np.int64)
    prog: list[ir.Instr] = [ir.LoadKey(block="boot"), ir.Input(dst="x0", tensor="x", table="in/x"),
                            ir.Bootstrap(dst="b", src="x0", log_slots=9, halves=True, premasked=True),
                            ir.Output(src="b", tensor="y", table="out")]
    with pytest.raises(PlanFileError, match=r"field 'program\[2\]\.premasked': register 'x0' must be written by a poly "
                                                r"with a complex mask \(the halves packing\), not by input"):
        ir.validate_plan(_plan(prog) | {"summary": {}, "nodes": [], "options": {}})
    prog[2:3] = [ir.Poly(dst="q", src="x0", coeffs=(0.0, 1.0), mask="w"),
                 ir.Bootstrap(dst="b", src="q", log_slots=9, halves=True, premasked=True)]
    x = np.zeros(S)
    x[:1024] = 0.1
    tables = {"in/x.idx": ident, "pt/w.idx": ident, "out.idx": ident}
    with pytest.raises(SimulationError, match=r"instruction 3 \(bootstrap b <- q\): field 'premasked': the source "
                                              r"does not carry the halves packing \(slots \[0, 512\) real values, "
                                              r"\[512, 1024\) i times real values\)"):
        simulate(_plan(prog), tables, {"x": x, "w": np.ones(S)})


def test_simulator_refuses_unoffered_log_slots() -> None:
    plan = _plan([ir.Input(dst="x0", tensor="x", table="in/x"), ir.Bootstrap(dst="b", src="x0", log_slots=8)])
    tables = {"in/x.idx": np.arange(S, dtype=np.int64), "pt/w.idx": np.arange(S, dtype=np.int64)}
    with pytest.raises(SimulationError, match=r"instruction 1 \(bootstrap\): field 'log_slots': .* 2\^8 slots"):
        simulate(plan, tables, {"x": np.zeros(S), "w": np.ones(S)})


@pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)")
@pytest.mark.parametrize(("ins", "message"), [
    ({"op": "bootstrap2", "dsts": ["a", "b"], "srcs": ["x0", "x0"], "log_slots": 9},
     r'instruction 1 \(bootstrap2\): field "srcs": bootstrap2 reads two different registers'),
    ({"op": "bootstrap", "dst": "b", "src": "x0", "halves": True},
     r'instruction 1 \(bootstrap\): field "halves" belongs to a sparse bootstrap'),
    ({"op": "bootstrap", "dst": "b", "src": "x0", "scale": 2.5},
     r'instruction 1 \(bootstrap\): field "scale": a full-slot bootstrap\'s scale is an integer'),
    ({"op": "bootstrap", "dst": "b", "src": "x0", "log_slots": 9, "in_scale": 8192},
     r'instruction 1 \(bootstrap\): field "in_scale": a number with 1 <= in_scale <= 2\^12'),
    ({"op": "bootstrap", "dst": "b", "src": "x0", "log_slots": 9, "scale": 0},
     r'instruction 1 \(bootstrap\): field "scale": a finite nonzero number'),
    ({"op": "bootstrap", "dst": "b", "src": "x0", "log_slots": 13},
     r'instruction 1 \(bootstrap\): field "log_slots": an integer k >= 1 with 2\^k < the 8192 slots'),
    ({"op": "bootstrap", "dst": "b", "src": "x0", "replicas": True},
     r'instruction 1 \(bootstrap\): field "replicas" belongs to a sparse bootstrap'),
    ({"op": "bootstrap", "dst": "b", "src": "x0", "log_slots": 9, "halves": True, "replicas": True},
     r'instruction 1 \(bootstrap\): field "replicas": a halves bootstrap is always unpacked'),
    ({"op": "bootstrap", "dst": "b", "src": "x0", "log_slots": 9, "replicas": True, "scale": 1.5},
     r'instruction 1 \(bootstrap\): field "scale": a replicas bootstrap\'s scale is an integer'),
    ({"op": "bootstrap", "dst": "b", "src": "x0", "log_slots": 9, "premasked": True},
     r'instruction 1 \(bootstrap\): field "premasked" belongs to a halves bootstrap'),
    ({"op": "bootstrap", "dst": "b", "src": "x0", "log_slots": 9, "halves": True, "premasked": True},
     r'instruction 1 \(bootstrap\): field "premasked": register "x0" must be written by a poly with a complex '
     r'mask \(the halves packing\), not by instruction 0 \(input\)'),
])
def test_lattigo_refuses_bad_variant(tmp_path: Path, ins: dict[str, Any], message: str) -> None:
    """Malformed variant fields: the executor's one line naming instruction and field, no
    key generated (the plan is built raw: the IR would refuse it too)."""
    plan = _plan([ir.Input(dst="x0", tensor="x", table="in/x")])
    plan["program"] = [*plan["program"], ins, {"op": "output", "src": ins.get("dst", "a"), "tensor": "y",
                                                "table": "in/x"}]
    with pytest.raises(LattigoError, match=message):
        run_raw(json.dumps(plan), np.zeros(S).tobytes(), np.ones(S).tobytes(), {"key_dir": str(tmp_path / "keys")})
    assert not (tmp_path / "keys" / "manifest.json").exists()


@pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)")
def test_lattigo_refuses_unoffered_log_slots(tmp_path: Path) -> None:
    """A log_slots the params do not offer: one line naming the instruction and the field,
    before any key is generated."""
    prog: list[ir.Instr] = [ir.Input(dst="x0", tensor="x", table="in/x"),
                            ir.Bootstrap(dst="b", src="x0", log_slots=9),
                            ir.Output(src="b", tensor="y", table="in/x")]
    plan = _plan(prog)
    plan["params"]["boot"]["variants"] = [v for v in plan["params"]["boot"]["variants"] if v["log_slots"] != 9]
    ident = np.arange(S, dtype=np.int64)
    with pytest.raises(LattigoError, match=r"instruction 1 \(bootstrap\): field \"log_slots\": the params' boot "
                                           r"object offers no sparse bootstrap at 2\^9 slots"):
        run_plan(plan, {"x": np.zeros(S)}, {"w": np.ones(S)}, {"in/x.idx": ident, "pt/w.idx": ident},
                 key_dir=str(tmp_path / "keys"))
    assert not (tmp_path / "keys" / "manifest.json").exists()


@pytest.mark.parametrize("_", [0], ids=["n14boot"])
@pytest.mark.filterwarnings("ignore")
def test_variants_on_lattigo(tmp_path: Path, _: int) -> None:
    for m in lattigo:
        if m.args[0]:
            pytest.skip(m.kwargs["reason"])
    rng = np.random.default_rng(7)
    plan, vals, tables, outs = mixed_plan(rng)
    sim = simulate(plan, tables, vals)
    inputs = {k: v for k, v in vals.items() if k != "w"}
    res = run_plan(plan, inputs, {"w": vals["w"]}, tables, key_dir=str(tmp_path / "keys"))
    st = res.stats
    kinds = [("full" if k is None else f"{kd[0]}{k}") for _, kd, k in outs]
    assert {"r10", "r11"} <= set(kinds)
    assert st["bootstrap_kinds"] == list(dict.fromkeys(kinds))
    levels = {v.tensor: v.level for v in res.vectors}
    for t, kind, _k in outs:
        err = float(np.max(np.abs(res.outputs[t] - sim.outputs[t])))
        bits = math.log2(A / err)
        assert bits >= PREC_BITS, (t, kind, err, bits)
        # (replicas: no unpacking product, the top level as after the full bootstrap)
        assert levels[t] == P.max_level - (0 if kind in ("full", "r") else 1), (t, levels[t])
    # the block is the union of the full-slot bootstrap's keys and the variants' (one key per
    # Galois element): more keys than the full-slot block alone
    assert st["boot_key_bytes"] > P.boot.key_bytes
    assert st["boot_matrix_bytes"] == P.boot.matrix_bytes + sum(v.matrix_bytes for v in P.boot.variants)


def test_calibration_plan_simulates() -> None:
    """The plan `slotplan calibrate --boot-variants` runs: every kind at the level the executor
    needs, its outputs scale * input (the simulator's), and the kinds it parses."""
    from backends.calibrate_variants import parse_kinds, variant_plan
    from common.errors import SlotplanError

    kinds = parse_kinds(P, "all")
    assert kinds == ["full"] + [f"{c}{k}" for k in (9, 10, 11, 12) for c in "shpr"]
    assert parse_kinds(P, "h10,p9") == ["full", "h10", "p9"]
    for bad in ("s8", "x9", ""):
        with pytest.raises(SlotplanError, match="--boot-variants"):
            parse_kinds(P, bad)
    plan, inputs, expect = variant_plan(P, ["full", "s9", "h10", "p11", "r10"], 1, stream=2)
    assert plan["program"][0] == {"op": "load_key", "block": "boot", "stream": 2}
    ident = np.arange(S, dtype=np.int64)
    n_in = sum(1 for ins in plan["program"] if ins["op"] == "input")
    assert n_in == len(inputs)
    # one tensor per input instruction for the simulator (the plan reuses one name)
    prog = []
    j = 0
    for ins in plan["program"]:
        ins = dict(ins)
        if ins["op"] == "input":
            ins["tensor"], j = f"x{j}", j + 1
        prog.append(ins)
    o = 0
    for ins in prog:
        if ins["op"] == "output":
            ins["tensor"], o = f"y{o}", o + 1
    sim = simulate({**plan, "program": prog}, {"t.idx": ident, "one.idx": ident},
                   {**{f"x{i}": v for i, v in enumerate(inputs)}, "one": np.ones(S)})
    assert [e[0] for e in expect] == ["full", "s9", "h10", "p11", "p11", "r10"]
    for i, (_, want, bound) in enumerate(expect):
        assert np.array_equal(sim.outputs[f"y{i}"], want) and np.max(np.abs(want)) <= bound
