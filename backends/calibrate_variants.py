"""Calibration of the sparse bootstrap variants (issue 36, ``slotplan calibrate --boot-variants``).

Each variant is timed as the executor runs it: one plan holds, per requested kind and
repetition, an input brought down to its bootstrap's input level by products with a
plaintext of ones, the bootstrap instruction and its output(s); it runs once through the Go
``Run`` (keys generated once: the block is the union of the full-slot bootstrap's keys and
every variant's, backends/lattigo/bootvariant.go). The executor times each bootstrap
instruction as a whole (``stats.bootstrap_seconds`` with ``bootstrap_kinds``): for a variant
the masks, the sparse bootstrap and the unpacking (conjugation, products, rescale). The
full-slot bootstrap is measured in the same process for the ratio.

Kinds (the keys of a cost table's ``boot_variants``):

* ``full``: ``bootstrap`` of a full-slot random vector, level 0 in;
* ``s<k>``: ``bootstrap {log_slots: k}`` of a vector zero outside [0, 2^k), level 0 in;
* ``h<k>``: ``bootstrap {log_slots: k, halves: true}`` of a vector zero outside
  [0, 2^(k+1)), |values| <= max_abs/2, level 1 in (the executor's mask before the bootstrap
  needs one level: docs/formats.md);
* ``p<k>``: ``bootstrap2 {log_slots: k}`` of two vectors zero outside [0, 2^k), |values| <=
  max_abs/2, level 0 in;
* ``r<k>``: ``bootstrap {log_slots: k, replicas: true}`` of a vector zero outside [0, 2^k),
  level 0 in; its output holds the copies of [0, 2^k) in every slot (expected so).

Precision: the max abs error of each output against ``scale * input`` over all slots, and
``bits = log2(max_abs / error)`` (the bits kept relative to the largest value a bootstrap
accepts, the measure of ``planner.frontend.params.BOOT_MAX_ABS``).
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from common.errors import SlotplanError
from planner.frontend.params import Params

__all__ = ["KIND_RE", "parse_kinds", "variant_plan", "measure_variants"]

KIND_RE = re.compile(r"^(full|[shpr](\d+))$")


def parse_kinds(params: Params, spec: str) -> list[str]:
    """``all`` (every variant the preset offers, as s/h/p/r, and the full bootstrap) or a
    comma list of kinds; each must be one the params offer."""
    boot = params.boot
    if boot is None:
        raise SlotplanError(f"--boot-variants: params {params.name} carry no 'boot' object")
    offered = sorted(v.log_slots for v in boot.variants)
    if spec.strip() == "all":
        return ["full"] + [f"{c}{k}" for k in offered for c in "shpr"]
    kinds = [s.strip() for s in spec.split(",") if s.strip()]
    if not kinds:
        raise SlotplanError("--boot-variants: give 'all' or a comma list such as s12,h11,p11")
    for kd in kinds:
        m = KIND_RE.match(kd)
        if m is None:
            raise SlotplanError(f"--boot-variants: {kd!r} is not a kind (full, s<k>, h<k>, p<k>, r<k>)")
        if m.group(2) is not None and int(m.group(2)) not in offered:
            raise SlotplanError(f"--boot-variants: {kd!r}: params {params.name} offer log_slots {offered}")
    if "full" not in kinds:
        kinds = ["full", *kinds]
    return list(dict.fromkeys(kinds))


def variant_plan(params: Params, kinds: Sequence[str], repeat: int, seed: int = 1, stream: int | None = None
                 ) -> tuple[dict[str, Any], list[np.ndarray], list[tuple[str, np.ndarray, float]]]:
    """The calibration plan, its input vectors (program order) and, per output (program
    order), (kind, expected vector, bound of its values). ``stream``: the block's Galois keys
    are streamed with this read-ahead (``load_key {"block": "boot", "stream": D}``; the keys
    of a secure ring do not fit beside the matrices), else the whole block is resident."""
    assert params.boot is not None
    rng = np.random.default_rng(seed)
    S, top, A = params.slots, params.max_level, float(params.boot.max_abs)
    prog: list[dict[str, Any]] = [] if stream is None else [{"op": "load_key", "block": "boot", "stream": stream}]
    inputs: list[np.ndarray] = []
    expect: list[tuple[str, np.ndarray, float]] = []
    reg = iter(range(1 << 30))

    def down(v: np.ndarray, level: int) -> str:
        r = f"c{next(reg)}"
        prog.append({"op": "input", "dst": r, "tensor": "x", "table": "t"})
        inputs.append(v)
        for _ in range(top - level):
            m, d = f"c{next(reg)}", f"c{next(reg)}"
            prog.append({"op": "pmul", "dst": m, "src": r, "pt": "one"})
            prog.append({"op": "rescale", "dst": d, "src": m})
            r = d
        return r

    def vec(n: int, bound: float) -> np.ndarray:
        v = np.zeros(S)
        v[:n] = rng.uniform(-bound, bound, n)
        return v

    for _ in range(repeat):
        for kd in kinds:
            if kd == "full":
                x = vec(S, A)
                d = f"c{next(reg)}"
                prog.append({"op": "bootstrap", "dst": d, "src": down(x, 0)})
                outs = [(d, x, A)]
            else:
                c, k = kd[0], int(kd[1:])
                n = 1 << k
                if c in "sr":
                    x = vec(n, A)
                    d = f"c{next(reg)}"
                    prog.append({"op": "bootstrap", "dst": d, "src": down(x, 0), "log_slots": k,
                                 **({"replicas": True} if c == "r" else {})})
                    outs = [(d, np.tile(x[:n], S // n) if c == "r" else x, A)]
                elif c == "h":
                    x = vec(2 * n, A / 2)
                    d = f"c{next(reg)}"
                    prog.append({"op": "bootstrap", "dst": d, "src": down(x, 1), "log_slots": k, "halves": True})
                    outs = [(d, x, A / 2)]
                else:
                    x, y = vec(n, A / 2), vec(n, A / 2)
                    a, b = f"c{next(reg)}", f"c{next(reg)}"
                    prog.append({"op": "bootstrap2", "dsts": [a, b], "srcs": [down(x, 0), down(y, 0)], "log_slots": k})
                    outs = [(a, x, A / 2), (b, y, A / 2)]
            for d, v, bound in outs:
                prog.append({"op": "output", "src": d, "tensor": "y", "table": "t"})
                expect.append((kd, v, bound))
    plan = {"schema": "slotplan.plan/1", "params": params.to_json(),
            "plaintexts": {"one": {"source": "const", "table": "one"}}, "program": prog}
    return plan, inputs, expect


def measure_variants(params: Params, kinds: Sequence[str], repeat: int = 3, seed: int = 1,
                     stream: int | None = None) -> dict[str, Any]:
    """Run the calibration plan on Lattigo: per kind the median seconds of its bootstrap
    instruction, the samples, the input level, and the max abs error / bits of its outputs."""
    from backends.lattigo_backend import run_raw

    plan, inputs, expect = variant_plan(params, kinds, repeat, seed, stream)
    ones = np.ones(params.slots)
    pack = b"".join(np.ascontiguousarray(v, dtype="<f8").tobytes() for v in inputs)
    res = run_raw(json.dumps(plan), pack, np.ascontiguousarray(ones, dtype="<f8").tobytes(), {})
    st = res["stats"]
    secs, kinds_run, levels = st["bootstrap_seconds"], st.get("bootstrap_kinds") or [], st["bootstrap_input_levels"]
    if len(kinds_run) != len(secs):
        raise SlotplanError(f"the executor reported {len(secs)} bootstrap times but {len(kinds_run)} kinds")
    out: dict[str, Any] = {}
    for kd, s, lv in zip(kinds_run, secs, levels, strict=True):
        e = out.setdefault(kd, {"samples_s": [], "input_level": lv, "max_abs_error": 0.0, "bound": None})
        e["samples_s"].append(float(s))
    for (kd, v, bound), o in zip(expect, res["outputs"], strict=True):
        got = np.frombuffer(base64.b64decode(o["data"]), dtype="<f8")
        e = out[kd]
        e["max_abs_error"] = max(e["max_abs_error"], float(np.max(np.abs(got - v))))
        e["bound"] = bound
        e["output_level"] = int(o["level"])
    for e in out.values():
        e["median_s"] = float(np.median(e["samples_s"]))
        e["bits"] = round(math.log2(float(params.boot.max_abs) / e["max_abs_error"]), 2) if e["max_abs_error"] > 0 else None  # type: ignore[union-attr]
    full = out.get("full", {}).get("median_s")
    for e in out.values():
        e["ratio_to_full"] = round(e["median_s"] / full, 4) if full else None
    return {"kinds": out, "repeat": repeat, "stream": stream, "peak_rss_bytes": st.get("peak_rss_bytes"),
            "boot_key_bytes": st.get("boot_key_bytes"), "boot_matrix_bytes": st.get("boot_matrix_bytes"),
            "boot_keygen_seconds": st.get("boot_keygen_seconds"), "boot_matrix_seconds": st.get("boot_matrix_seconds"),
            "bootstrap_phases": st.get("bootstrap_phases")}


def boot_variants_weights(measured: Mapping[str, Any], full_weight_ms: float | None = None) -> dict[str, float]:
    """The cost table's ``boot_variants`` (ms) from :func:`measure_variants`: each kind's
    median over the full bootstrap's median of the same job, times ``full_weight_ms`` (the
    table's own ``bootstrap`` weight), so that variants and the full bootstrap are priced on
    one basis: the variants are timed with their keys streamed and read from disk while the
    table's bootstrap was timed with the block resident, and at n16boot the same job's full
    bootstrap took 28.1 s and 37.8 s in two runs against the table's 17.8 s. Without a
    full bootstrap in the job (or no weight): the medians themselves."""
    full = measured["kinds"].get("full", {}).get("median_s")
    out = {}
    for kd, e in sorted(measured["kinds"].items()):
        if kd == "full":
            continue
        ms = e["median_s"] * 1000.0
        if full and full_weight_ms:
            ms = e["median_s"] / full * full_weight_ms
        out[kd] = round(ms, 3)
    return out
