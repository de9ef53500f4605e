"""Calibrate the simulator's CKKS error model (backends/noise.py) against Lattigo.

One hand-written plan per preset runs encrypted through the ordinary Lattigo path
(backends/lattigo_backend.run_plan: the same executor as ``slotplan run --backend lattigo``)
and every output is compared with the exact simulator on the same values. Each output
isolates one instruction class, and the variance of its error over the slots (thousands of
samples each) gives that class's standard deviation:

* ``fresh``: input -> output (encoding, encryption, decryption);
* ``rot``: eight chained rotations: (var - fresh) / 8;
* ``pmul``: a product by +-1 decrypted before its rescale: var - fresh;
* ``rescale``: a chain of plaintext products by +-1 and rescales through every level:
  (var at the bottom - fresh - levels * pmul) / levels (each level's value is recorded);
* ``cmul``: x * y, both fresh, rescaled: var - (x^2 + y^2) fresh^2 - rescale, per slot;
* ``poly``: two polynomials (a Chebyshev interpolant of ReLU of the largest degree the
  levels allow, and 1.5 x - 0.5 x^3): (var - p'(x)^2 fresh^2) / weight^2 (noise.poly_weight),
  their geometric mean;
* bootstrapping presets: a bootstrap of uniform values within ``boot.max_abs`` (its
  coefficients are tiny: the floor) and of the constant ``max_abs`` (all energy in one
  coefficient: the floor plus the cube term).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from backends import noise, sim
from common.errors import SlotplanError
from planner.frontend.params import Params

ROT_CHAIN = 8


def _poly_a(levels: int) -> list[float]:
    deg = (1 << min(levels, 4)) - 1
    k = np.arange(deg + 1)
    t = np.cos(np.pi * (k + 0.5) / (deg + 1))
    return [float(c) for c in np.polynomial.chebyshev.chebfit(t, np.maximum(t, 0.0), deg)]


def calibration_plan(params: Params, rng: np.random.Generator, level0: bool = True) -> tuple[dict[str, Any], dict[str, np.ndarray],
                                                                         dict[str, np.ndarray]]:
    S = params.slots
    L = params.max_level if params.boot is None else params.boot.levels_after
    ar = np.arange(S, dtype=np.int64)
    tables: dict[str, np.ndarray] = {"in.idx": ar, "out.idx": ar}
    values = {"x": rng.uniform(-1, 1, S), "y": rng.uniform(-1, 1, S)}
    prog: list[dict[str, Any]] = [
        {"op": "input", "dst": "x", "tensor": "x", "table": "in"},
        {"op": "input", "dst": "y", "tensor": "y", "table": "in"},
        {"op": "output", "src": "x", "tensor": "fresh", "table": "out"},
    ]
    prev = "x"
    for j in range(1, ROT_CHAIN + 1):
        prog.append({"op": "rot", "dst": f"r{j}", "src": prev, "k": 1})
        prev = f"r{j}"
    prog.append({"op": "output", "src": prev, "tensor": f"rot{ROT_CHAIN}", "table": "out"})
    pts: dict[str, Any] = {}
    prev = "x"
    for j in range(1, L + 1):
        pts[f"s{j}"] = {"source": "const", "table": f"pt/s{j}"}
        tables[f"pt/s{j}.idx"] = ar
        tables[f"pt/s{j}.coef"] = rng.choice([-1.0, 1.0], S)
        prog += [{"op": "pmul", "dst": f"p{j}", "src": prev, "pt": f"s{j}"}]
        if j == 1:  # the product before its rescale
            prog.append({"op": "output", "src": "p1", "tensor": "pmul_raw", "table": "out"})
        prog += [{"op": "rescale", "dst": f"q{j}", "src": f"p{j}"},
                 {"op": "output", "src": f"q{j}", "tensor": f"pmul{j}", "table": "out"}]
        prev = f"q{j}"
    prog += [{"op": "cmul", "dst": "c", "a": "x", "b": "y"}, {"op": "rescale", "dst": "c2", "src": "c"},
             {"op": "output", "src": "c2", "tensor": "cmul", "table": "out"}]
    prog += [{"op": "poly", "dst": "pa", "src": "x", "coeffs": _poly_a(L), "basis": "chebyshev", "domain": [-1, 1]},
             {"op": "output", "src": "pa", "tensor": "poly_a", "table": "out"},
             {"op": "poly", "dst": "pb", "src": "y", "coeffs": [0.0, 1.5, 0.0, -0.5]},
             {"op": "output", "src": "pb", "tensor": "poly_b", "table": "out"}]
    if params.boot is not None:
        A = params.boot.max_abs
        values["u"] = rng.uniform(-A, A, S)
        values["k"] = np.full(S, A)
        prog += [{"op": "input", "dst": "u", "tensor": "u", "table": "in"},
                 {"op": "input", "dst": "k", "tensor": "k", "table": "in"},
                 {"op": "bootstrap", "dst": "bu", "src": "u"},
                 {"op": "output", "src": "bu", "tensor": "boot_uniform", "table": "out"},
                 {"op": "bootstrap", "dst": "bk", "src": "k"},
                 {"op": "output", "src": "bk", "tensor": "boot_const", "table": "out"}]
    if params.boot is not None and level0:
        # the same two bootstraps from level 0 (Lattigo's ScaleDown cannot set the scale
        # there: the message enters EvalMod at the operand's own scale)
        pts["one"] = {"source": "const", "table": "pt/one"}
        tables["pt/one.idx"] = ar
        tables["pt/one.coef"] = np.ones(S)
        for src in ("u", "k"):
            prev = src
            for j in range(1, L + 1):
                prog += [{"op": "pmul", "dst": f"{src}p{j}", "src": prev, "pt": "one"},
                         {"op": "rescale", "dst": f"{src}q{j}", "src": f"{src}p{j}"}]
                prev = f"{src}q{j}"
            prog += [{"op": "bootstrap", "dst": f"{src}b0", "src": prev},
                     {"op": "output", "src": f"{src}b0", "tensor": f"boot0_{'uniform' if src == 'u' else 'const'}",
                      "table": "out"}]
    plan = {"schema": "slotplan.plan/1", "graph": {"name": "noise-calibration", "sha256": "0" * 64},
            "params": params.to_json(), "plaintexts": pts, "program": prog}
    return plan, tables, values


def _fit(params: Params, plan: Mapping[str, Any], values: Mapping[str, np.ndarray],
         errs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    def ms(t: str) -> float:
        return float(np.mean(errs[t] ** 2))

    x, y = values["x"], values["y"]
    f2 = ms("fresh")
    out: dict[str, Any] = {"fresh": math.sqrt(f2)}
    out["rot"] = math.sqrt(max(ms(f"rot{ROT_CHAIN}") - f2, 0.0) / ROT_CHAIN)
    L = sum(1 for t in errs if t.startswith("pmul") and t[4:].isdigit())
    per_level = [math.sqrt(ms(f"pmul{j}")) for j in range(1, L + 1)]
    pmul2 = max(ms("pmul_raw") - f2, 0.0)
    out["pmul"] = math.sqrt(pmul2)
    rs2 = max(ms(f"pmul{L}") - f2 - L * pmul2, 0.0) / L
    out["rescale"] = math.sqrt(rs2)
    out["cmul"] = math.sqrt(max(float(np.mean(errs["cmul"] ** 2 - (x**2 + y**2) * f2)) - rs2, 0.0))
    polys = {ins["tensor"]: None for ins in plan["program"] if ins["op"] == "output"}
    del polys
    from planner import ir

    fits = {}
    for name, src, vals in (("poly_a", "pa", x), ("poly_b", "pb", y)):
        ins = next(ir.decode(d) for d in plan["program"] if d.get("dst") == src)
        assert isinstance(ins, ir.Poly)
        resid = float(np.mean(errs[name] ** 2 - noise.poly_derivative(ins, vals) ** 2 * f2))
        fits[name] = math.sqrt(max(resid, 0.0)) / noise.poly_weight(ins)
    out["poly"] = math.sqrt(max(fits["poly_a"], 1e-300) * max(fits["poly_b"], 1e-300))
    detail: dict[str, Any] = {
        "rms_error": {t: math.sqrt(ms(t)) for t in sorted(errs)},
        "pmul_chain_rms_by_depth": per_level,
        "poly_fits": fits,
    }
    if params.boot is not None:
        A = params.boot.max_abs
        floor2 = max(ms("boot_uniform") - f2, 0.0)
        out["boot_floor"] = math.sqrt(floor2)
        const2 = max(ms("boot_const") - f2, 0.0)
        out["boot_cube"] = math.sqrt(max(const2 - floor2, 0.0)) / A**3
        # Lattigo's ScaleDown at level 0 (backends/noise.py, Sigmas.boot0_scale_rel): derived
        # from the moduli and the default message ratio 2^8; measured on the squaring chain
        out["boot0_scale_rel"] = 1.0 / (math.sqrt(3.0) * 2.0 ** (params.log_q[0] - params.log_scale - 8))
        detail["boot_const_max_abs_error"] = float(np.max(np.abs(errs["boot_const"])))
        detail["boot_uniform_max_abs_error"] = float(np.max(np.abs(errs["boot_uniform"])))
        if "boot0_const" in errs:
            # from level 0 (rms of the input's own error, 9 rescales, subtracted)
            f0 = max(ms("boot0_uniform") - ms(f"pmul{L}"), 0.0)
            out["boot0_floor"] = math.sqrt(f0)
            out["boot0_cube"] = math.sqrt(max(ms("boot0_const") - ms(f"pmul{L}") - f0, 0.0)) / A**3
            detail["boot0_const_max_abs_error"] = float(np.max(np.abs(errs["boot0_const"])))
            detail["boot0_uniform_max_abs_error"] = float(np.max(np.abs(errs["boot0_uniform"])))
    return {"sigma": out, "detail": detail}


def calibrate_noise(params: Params, seed: int = 0, repeat: int = 1, out: str | Path | None = None) -> tuple[dict[str, Any], Path]:
    """Run the calibration plan ``repeat`` times on Lattigo and write data/noise/<preset>.json."""
    from backends.lattigo_backend import run_plan, version

    if not params.name:
        raise SlotplanError("noise calibration needs named params (a preset or a params file with a name)")
    if not 1 <= repeat <= 20:
        raise SlotplanError(f"--repeat must be in 1..20, got {repeat}")
    rng = np.random.default_rng(seed)
    pooled: dict[str, list[np.ndarray]] = {}
    vals_pooled: dict[str, list[np.ndarray]] = {}
    plan: dict[str, Any] = {}
    seconds = 0.0
    for _ in range(repeat):
        plan, tables, values = calibration_plan(params, rng)
        want = sim.simulate(plan, tables, values).outputs
        got = run_plan(plan, values, {}, tables)
        seconds += float(got.stats.get("wall_seconds", 0.0))
        for t, w in want.items():
            pooled.setdefault(t, []).append(np.asarray(got.outputs[t]).ravel() - np.asarray(w).ravel())
        for t, v in values.items():
            vals_pooled.setdefault(t, []).append(v)
    errs = {t: np.concatenate(v) for t, v in pooled.items()}
    vals = {t: np.concatenate(v) for t, v in vals_pooled.items()}
    fit = _fit(params, plan, vals, errs)
    doc = {
        "schema": noise.SCHEMA,
        "preset": params.name,
        "sigma": fit["sigma"],
        "calibrated": {
            "at": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": f"slotplan noise-calibrate --params {params.name} --seed {seed} --repeat {repeat}",
            "backend": version(),
            "samples_per_op": int(params.slots * repeat),
            "lattigo_seconds": round(seconds, 2),
        },
        "detail": fit["detail"],
    }
    path = Path(out) if out is not None else noise.NOISE_DIR / f"{params.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return doc, path
