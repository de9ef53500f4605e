"""``slotplan calibrate``: measure CKKS operation times with Lattigo on this machine and
write them as a planner cost table (``data/costs/<preset>-lattigo.json``).

The Go side (``Calibrate`` in ``backends/lattigo/calibrate.go``) times every operation
``repeat`` times after one untimed warm-up and returns the samples; this module turns the
medians into a ``slotplan.costs/1`` table in milliseconds:

=================== ==========================================================================
weight              measurement (median, top level unless said otherwise)
=================== ==========================================================================
rotation            ``Evaluator.Rotate`` of one ciphertext
hoisted_rotation    each extra offset of a ``RotateHoisted`` batch of B (default 8):
                    ``(t(B offsets) - t(1 offset)) / (B - 1)``
pmul                ``Evaluator.Mul`` by a plaintext that is already encoded (encoding is
                    ``measurements.once_ms`` / ``per_level_ms[..].encode``; the executor
                    encodes inside pmul, so its pmul costs pmul + encode)
cmul                ``Evaluator.MulRelin`` (multiplication and relinearisation)
add                 ``Evaluator.Add`` of two ciphertexts
rescale             ``Evaluator.Rescale`` of a product
poly                a degree-3 polynomial with Lattigo's polynomial evaluator
depth               0: a level is not a time (its cost is bigger parameters, chosen outside
                    the planner); the per-level tables show how much cheaper ops get lower
bootstrap           bootstrapping presets only (params with ``boot``): Lattigo's
                    ``Evaluator.Bootstrap`` of one ciphertext at level 0 (median of
                    ``bootstrap_repeat`` runs, default min(repeat, 3), after one warm-up);
                    written as the weight ``bootstrap`` when the planner's cost table has
                    that weight, and always as ``measurements.bootstrap``
=================== ==========================================================================

A bootstrapping preset is timed on the bootstrapping parameters (where its plans run: the
residual chain followed by the bootstrap's primes, with the bootstrap's own P primes) at
the residual levels; ``measurements.bootstrap`` also keeps the key generation and DFT matrix
encoding times, the block's bytes, each bootstrap's max abs error, and the memory of one
bootstrap: the heap's peak above its start (``transient_bytes``) and the bytes it allocates
(``alloc_bytes``), measured at GOGC 0 (the process model, backends/lattigo_memory.py).

``measurements`` keeps every median (per level: rotate, rotate_hoisted_1/B, pmul, encode
(the executor's encoding, backends/lattigo/encode.go) and encode_lattigo (Lattigo's
``Encoder.Encode``, which allocates per coefficient), add, cmul_relin, rescale, and encode_prec53 when log_scale > 53, where Lattigo's default
encoder switches to a big-float FFT (``encoding_precision_bits``); once: poly3, encrypt, decrypt, keygen_galois, keygen_relin,
key_read_file, key_unmarshal), the raw samples, key and ciphertext sizes, and the machine
(CPU model from /proc/cpuinfo, Go and Lattigo versions, date).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from backends.lattigo_backend import LattigoError, _call, _ext
from common.errors import SlotplanError
from planner.cost.tables import COSTS_DIR, CostTable, Weights
from planner.frontend.params import Params

__all__ = [
    "DEFAULT_HOIST_BATCH",
    "DEFAULT_REPEAT",
    "WEIGHT_KEYS",
    "calibrate",
    "cost_table",
    "default_path",
    "cpu_identity",
    "machine_info",
    "measure",
    "pool_full",
    "same_cpu",
    "write_table",
]

DEFAULT_REPEAT = 5
DEFAULT_HOIST_BATCH = 8
WEIGHT_KEYS = ("rotation", "hoisted_rotation", "pmul", "cmul", "add", "rescale", "poly", "depth")
_MS = 1000.0
_DIGITS = 5  # 10 ns resolution in milliseconds


# the vector extensions a table's prices depend on: Lattigo's Go code runs scalar, but the
# product kernel (backends/lattigo/product.go) takes AVX-512 IFMA where the CPU has it, and a
# CPU with AVX-512 is a later core generation than one with AVX2 only (the "AMD EPYC" of
# these VMs is a Zen 3 without AVX-512 on some days and a Zen 4 with it on others)
CPU_FLAGS_RECORDED = ("avx2", "avx512f", "avx512ifma", "sha_ni", "vaes")


def cpu_identity() -> dict[str, Any]:
    """This CPU as /proc/cpuinfo names it: model name, family, model and stepping numbers and
    the recorded vector extensions (``CPU_FLAGS_RECORDED``); a cost table measured on one
    identity prices another CPU only approximately (:func:`same_cpu`)."""
    ident: dict[str, Any] = {"cpu_model": platform.processor() or "unknown"}
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ident
    first = dict(line.split(":", 1) for line in text.split("\n\n", 1)[0].splitlines() if ":" in line)
    first = {k.strip().lower(): v.strip() for k, v in first.items()}
    if "model name" in first:
        ident["cpu_model"] = first["model name"]
    for key, name in (("cpu family", "cpu_family"), ("model", "cpu_model_number"), ("stepping", "cpu_stepping")):
        if key in first:
            ident[name] = _int_or(first[key])
    flags = set(first.get("flags", "").split())
    ident["cpu_flags"] = [f for f in CPU_FLAGS_RECORDED if f in flags]
    return ident


def _int_or(value: str) -> int | str:
    try:
        return int(value)
    except ValueError:
        return value


def same_cpu(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool | None:
    """Whether two machine records name the same CPU (model name, family, model, stepping and
    recorded flags); None when either record predates the identity (only a model name)."""
    if not a or not b or "cpu_family" not in a or "cpu_family" not in b:
        return None
    keys = ("cpu_model", "cpu_family", "cpu_model_number", "cpu_stepping", "cpu_flags")
    return all(a.get(k) == b.get(k) for k in keys)


def transparent_huge_pages() -> str | None:
    """The kernel's transparent huge page mode (always, madvise or never:
    /sys/kernel/mm/transparent_hugepage/enabled), None where it does not say. Go's heap
    asks for none, so under ``madvise`` (a common default) every page of the keys, DFT
    matrices and ciphertexts is 4 KiB (docs/lattigo.md, "Huge pages")."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    chosen = [w[1:-1] for w in text.split() if w.startswith("[") and w.endswith("]")]
    return chosen[0] if chosen else None


def machine_info() -> dict[str, Any]:
    """CPU identity (:func:`cpu_identity`), core count, transparent huge pages, OS and Python
    version of this machine."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {
        **cpu_identity(),
        "cpu_count": os.cpu_count(),
        "transparent_hugepage": transparent_huge_pages(),
        "loadavg_1_5_15": load,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def measure(
    params: Params,
    repeat: int = DEFAULT_REPEAT,
    hoist_batch: int = DEFAULT_HOIST_BATCH,
    levels: Sequence[int] | None = None,
    bootstrap_repeat: int | None = None,
) -> dict[str, Any]:
    """Run the Go calibration and return its raw result (seconds)."""
    if repeat < 1:
        raise SlotplanError(f"--repeat must be at least 1, got {repeat}")
    if not 2 <= hoist_batch < params.slots:
        raise SlotplanError(f"--hoist-batch must be in 2..{params.slots - 1}, got {hoist_batch}")
    opts: dict[str, Any] = {"repeat": int(repeat), "hoist_batch": int(hoist_batch)}
    if levels is not None:
        opts["levels"] = [int(x) for x in levels]
    if bootstrap_repeat is not None:
        if not 1 <= bootstrap_repeat <= 100:
            raise SlotplanError(f"--bootstrap-repeat must be in 1..100, got {bootstrap_repeat}")
        opts["bootstrap_repeat"] = int(bootstrap_repeat)
    mod, _ = _ext()
    raw: dict[str, Any] = json.loads(_call(mod.Calibrate, json.dumps(params.to_json()), json.dumps(opts)))
    return raw


def _ms(seconds: float) -> float:
    return round(float(seconds) * _MS, _DIGITS)


def cost_table(params: Params, raw: Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
    """The ``slotplan.costs/1`` table (milliseconds) for a raw calibration result."""
    top = str(raw["max_level"])
    per_level: Mapping[str, Mapping[str, Any]] = raw["per_level"]
    once: Mapping[str, Any] = raw["once"]
    if top not in per_level:
        raise LattigoError(f"calibration has no measurements at the top level {top}")
    b = int(raw["hoist_batch"])
    hb = f"rotate_hoisted_{b}"

    def med(level: str, op: str) -> float:
        return float(per_level[level][op]["median"])

    def extra(level: str) -> float:
        return max(0.0, (med(level, hb) - med(level, "rotate_hoisted_1")) / (b - 1))

    t = per_level[top]
    weights = {
        "rotation": _ms(med(top, "rotate")),
        "hoisted_rotation": _ms(extra(top)),
        "pmul": _ms(med(top, "pmul")),
        "cmul": _ms(med(top, "cmul_relin")),
        "add": _ms(med(top, "add")),
        "rescale": _ms(med(top, "rescale")) if "rescale" in t else 0.0,
        "poly": _ms(float(once["poly3"]["median"])) if "poly3" in once else 0.0,
        "depth": 0.0,
    }
    if "bootstrap" in once and "bootstrap" in Weights.model_fields:
        weights["bootstrap"] = _ms(once["bootstrap"]["median"])
    if "block_product" in t:  # the Lattigo executor's fused blocks (backends/lattigo/fused.go)
        weights |= {
            # with block_base measured: block = the per-block ModDowns, block_base = the
            # decomposition shared by the blocks on one base; else block = both, per block
            "block": _ms(med(top, "block_finish" if "block_base" in t else "block_fixed")),
            **({"block_base": _ms(med(top, "block_base"))} if "block_base" in t else {}),
            "block_baby": _ms(med(top, "block_baby")),
            "block_giant": _ms(med(top, "block_giant")),
            "block_product": _ms(med(top, "block_product")),
        }
    if "cmul_tensor" in t:  # sums of ct-ct products relinearised once (planner/ir/fusion.py)
        weights |= {"cmul_tensor": _ms(med(top, "cmul_tensor")), "relin": _ms(med(top, "relin"))}
    if "block_product_q" in t:  # Q-mode blocks (planner/ir/fusion.py)
        weights |= {
            "block_q": _ms(med(top, "block_q")),
            "block_product_q": _ms(med(top, "block_product_q")),
            "block_baby_q": _ms(med(top, "block_baby_q")),
        }
    per_level_ms = {
        lv: {op: _ms(v["median"]) for op, v in sorted(ops.items())}
        | {"hoisted_rotation_extra": _ms(extra(lv))}
        for lv, ops in sorted(per_level.items(), key=lambda kv: -int(kv[0]))
    }
    samples_ms = {
        "per_level": {
            lv: {op: [_ms(s) for s in v["samples"]] for op, v in sorted(ops.items())}
            for lv, ops in per_level.items()
        },
        "once": {op: [_ms(s) for s in v["samples"]] for op, v in sorted(once.items())},
    }
    now = _dt.datetime.now(_dt.UTC).replace(microsecond=0)
    machine = machine_info() | {
        "go_version": raw.get("go_version"),
        "lattigo_version": raw.get("lattigo_version"),
        # the fused blocks' product kernel (backends/lattigo/product.go): avx512ifma or lattigo
        "product_kernel": raw.get("product_kernel", "lattigo"),
        "goos": raw.get("goos"),
        "goarch": raw.get("goarch"),
        "gomaxprocs": raw.get("gomaxprocs"),
        "date": now.isoformat().replace("+00:00", "Z"),
    }
    measurements: dict[str, Any] = {
        "unit": "millisecond",
        "statistic": f"median of {raw['repeat']} timed runs after one warm-up",
        "clock": raw.get("clock", "wall"),
        "repeat": raw["repeat"],
        "hoist_batch": b,
        # keys (and baby outputs) the block primitives cycle through (calibrate.go: blockOffsets)
        "block_keys": raw.get("block_keys"),
        # key files key_read_file reads in turn (the block's keys: a set that leaves the caches)
        "key_read_keys": raw.get("key_read_keys"),
        "levels": raw["levels"],
        "top_level": raw["max_level"],
        "rotation_ms_by_level": {lv: v["rotate"] for lv, v in per_level_ms.items()},
        "hoisted_rotation_extra_ms_by_level": {lv: v["hoisted_rotation_extra"] for lv, v in per_level_ms.items()},
        "per_level_ms": per_level_ms,
        "once_ms": {op: _ms(v["median"]) for op, v in sorted(once.items())},
        "encode_ms": per_level_ms[top].get("encode"),
        "encoding_precision_bits": raw.get("encoding_precision_bits"),
        "key_generation_ms": _ms(once["keygen_galois"]["median"]),
        "key_load_ms": {
            "read_file": _ms(once["key_read_file"]["median"]),
            "unmarshal": _ms(once["key_unmarshal"]["median"]),
        },
        "galois_key_bytes": raw["galois_key_bytes"],
        "relin_key_bytes": raw["relin_key_bytes"],
        "ciphertext_bytes_top": raw["ciphertext_bytes_top"],
        "samples_ms": samples_ms,
        "calibrate_seconds": round(float(raw.get("total_seconds", 0.0)), 3),
        **({"bootstrap": _boot_measurements(raw)} if raw.get("boot") else {}),
        "executor": executor_measurements(params),
        "machine": machine,
    }
    pname = params.name if params.name != "custom" else f"logn{params.log_n}"
    table: dict[str, Any] = {
        "schema": "slotplan.costs/1",
        "name": name or f"{pname}-lattigo",
        "source": (
            f"measured by `slotplan calibrate` with Lattigo {raw.get('lattigo_version')} "
            f"({raw.get('go_version')}) on {machine['cpu_model']} ({machine['cpu_count']} CPUs) "
            f"at {machine['date']}; weights are medians at the top level {raw['max_level']}"
        ),
        "unit": "millisecond",
        "weights": weights,
        "params": params.to_json(),
        "measurements": measurements,
    }
    CostTable.model_validate(table)  # never write a table the planner would refuse
    return table


def _boot_measurements(raw: Mapping[str, Any]) -> dict[str, Any]:
    boot: Mapping[str, Any] = raw["boot"]
    once = raw["once"]["bootstrap"]
    return {
        "literal": boot["literal"],
        "median_ms": _ms(once["median"]),
        "samples_ms": [_ms(x) for x in once["samples"]],
        "input_level": boot["input_level"],
        "output_level": boot["output_level"],
        "max_abs_error": boot["max_abs_error"],
        "keygen_ms": _ms(boot["keygen_seconds"]),
        "matrix_encoding_ms": _ms(boot["matrix_seconds"]),
        "evaluation_key_bytes": boot["evaluation_key_bytes"],
        "matrix_bytes": boot["matrix_bytes"],
        "galois_keys": boot["galois_keys"],
        "rotations_per_bootstrap": (
            round(float(once["median"]) / float(raw["per_level"][str(raw["max_level"])]["rotate"]["median"]), 1)
        ),
        "peak_rss_bytes": boot.get("peak_rss_bytes"),
        # one bootstrap's temporaries (the heap's peak above its start) and the bytes it
        # allocates (backends/lattigo_memory.py, boot_memory)
        "transient_bytes": boot.get("transient_bytes"),
        "alloc_bytes": boot.get("alloc_bytes"),
    }


def executor_measurements(params: Params) -> dict[str, Any]:
    """``measurements.executor``: the executor's sizes on ``params`` as Go's ``ExecutorMemory``
    reports them for one worker (none depends on the plan: a plan of one input and output
    asks), the planner's process model (planner.cost.process, executor_sizes)."""
    from backends.lattigo_memory import executor_memory
    from planner.cost.process import EXECUTOR_FIELDS

    plan = {"schema": "slotplan.plan/1", "graph": {"name": "executor", "sha256": "0" * 64}, "params": params.to_json(),
            "summary": {}, "nodes": [], "plaintexts": {}, "outputs": {"y": [1]},
            "program": [{"op": "input", "dst": "c0", "tensor": "x", "table": "in/x/0"},
                        {"op": "output", "src": "c0", "tensor": "y", "table": "out/y/0"}]}
    mem = executor_memory(plan, workers=1)
    return {"workers": 1, **{f: mem[f] for f in EXECUTOR_FIELDS}}


def default_path(params: Params) -> Path:
    pname = params.name if params.name != "custom" else f"logn{params.log_n}"
    return COSTS_DIR / f"{pname}-lattigo.json"


def write_table(table: Mapping[str, Any], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(table, indent=2) + "\n")
    tmp.replace(p)
    return p


def calibrate(
    params: Params,
    repeat: int = DEFAULT_REPEAT,
    out: str | Path | None = None,
    hoist_batch: int = DEFAULT_HOIST_BATCH,
    levels: Sequence[int] | None = None,
    bootstrap_repeat: int | None = None,
    boot_variants: Sequence[str] | None = None,
    variants_only: bool = False,
    boot_stream: int | None = None,
    executor_only: bool = False,
    encodings_only: bool = False,
) -> tuple[dict[str, Any], Path]:
    """Measure, build the cost table and write it (default ``data/costs/<preset>-lattigo.json``).

    ``boot_variants`` (kinds ``full``, ``s<k>``, ``h<k>``, ``p<k>``; backends/calibrate_variants.py)
    also times the sparse bootstrap variants and writes ``boot_variants`` (ms) and
    ``measurements.boot_variants``; with ``variants_only`` the table already at the path keeps
    everything else (its weights and measurements) and only those two are replaced."""
    path = Path(out) if out is not None else default_path(params)
    if encodings_only:
        if boot_variants or variants_only or executor_only:
            raise SlotplanError("--encodings-only measures the encodings alone: drop --boot-variants, "
                                "--boot-variants-only and --executor-only")
        return _encodings_only(params, path, repeat)
    if executor_only:
        # the executor's sizes only (seconds): the table at the path keeps everything else
        if not path.exists():
            raise SlotplanError(f"--executor-only: no cost table at {path} to add the executor's sizes to")
        table = json.loads(path.read_text())
        if table.get("params") is None or Params.from_json(table["params"]) != params:
            raise SlotplanError(f"--executor-only: the table at {path} was calibrated on other parameters")
        table.setdefault("measurements", {})["executor"] = executor_measurements(params)
        CostTable.model_validate(table)
        return table, write_table(table, path)
    if variants_only:
        if not boot_variants:
            raise SlotplanError("--boot-variants-only needs --boot-variants")
        if not path.exists():
            raise SlotplanError(f"--boot-variants-only: no cost table at {path} to add the variants to")
        table = json.loads(path.read_text())
    else:
        raw = measure(params, repeat, hoist_batch, levels, bootstrap_repeat)
        table = cost_table(params, raw, path.stem if out is not None else None)
    if boot_variants:
        from backends.calibrate_variants import boot_variants_weights, measure_variants

        n = bootstrap_repeat or min(repeat, 3)
        measured = measure_variants(params, boot_variants, n, stream=boot_stream)
        full_w = (table.get("weights") or {}).get("bootstrap")
        table["boot_variants"] = {**(table.get("boot_variants") or {}),
                                  **boot_variants_weights(measured, float(full_w) if full_w else None)}
        table["params"] = params.to_json()  # the variants the table prices are the params'
        m = table.setdefault("measurements", {})
        old = dict(m.get("boot_variants") or {})
        new = _variant_measurements(measured)
        if same_cpu(m.get("machine"), cpu_identity()):
            new = pool_full(old, new)
        m["boot_variants"] = {**old, **new}
        CostTable.model_validate(table)
    return table, write_table(table, path)


ENCODING_OPS = ("encode", "encode_pair", "encode_lattigo", "encode_prec53")


def _encodings_only(params: Params, path: Path, repeat: int) -> tuple[dict[str, Any], Path]:
    """``--encodings-only``: time the encodings (``encode``, ``encode_pair``,
    ``encode_lattigo``; calibrate.go ``measureEncodings``) at the table's levels and replace
    them in the table at ``path``, which keeps everything else; only on the CPU that measured
    the table (its other entries were timed there). Seconds, where a whole table takes
    minutes (n16boot: 5.5 min and 18.6 GB): what an executor change to encoding needs."""
    if not path.exists():
        raise SlotplanError(f"--encodings-only: no cost table at {path} to put the encodings in")
    table = json.loads(path.read_text())
    if table.get("params") is None or Params.from_json(table["params"]) != params:
        raise SlotplanError(f"--encodings-only: the table at {path} was calibrated on other parameters")
    m = table.setdefault("measurements", {})
    here = cpu_identity()
    if not same_cpu(m.get("machine"), here):
        raise SlotplanError(f"--encodings-only: the table at {path} was measured on another CPU "
                            f"({(m.get('machine') or {}).get('cpu_model', 'not said')}); calibrate the whole table here")
    levels = sorted((int(lv) for lv in m.get("per_level_ms") or {}), reverse=True)
    if not levels:
        raise SlotplanError(f"--encodings-only: the table at {path} has no per-level measurements")
    mod, _ = _ext()
    opts = {"repeat": int(repeat), "levels": levels, "encodings_only": True}
    raw = json.loads(_call(mod.Calibrate, json.dumps(params.to_json()), json.dumps(opts)))
    per_ms = m["per_level_ms"]
    samples = m.setdefault("samples_ms", {}).setdefault("per_level", {})
    for lv, ops in raw["per_level"].items():
        for op in ENCODING_OPS:
            per_ms[lv].pop(op, None)
            samples.get(lv, {}).pop(op, None)
        for op, v in sorted(ops.items()):
            per_ms[lv][op] = _ms(v["median"])
            samples.setdefault(lv, {})[op] = [_ms(x) for x in v["samples"]]
        per_ms[lv] = dict(sorted(per_ms[lv].items()))
    m["encode_ms"] = per_ms[str(m.get("top_level", levels[0]))].get("encode")
    now = _dt.datetime.now(_dt.UTC).replace(microsecond=0)
    m["encodings"] = {"date": now.isoformat().replace("+00:00", "Z"), "repeat": int(repeat),
                      "calibrate_seconds": round(float(raw.get("total_seconds", 0.0)), 3),
                      "note": "encode, encode_pair and encode_lattigo re-measured alone (calibrate --encodings-only)"}
    CostTable.model_validate(table)
    return table, write_table(table, path)


def pool_full(old: Mapping[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Every variant run times the full-slot bootstrap beside its kinds (their ratios are to
    that run's own). The executor median of ``full`` (what the model prices a plan's full
    bootstraps at) pools the samples of the runs on this CPU instead of keeping the last
    run's: at n16boot on 2026-11-27 a run of two gave 36.6 and 33.3 s and the next run's one
    sample 39.5 s, which alone priced the ONNX ResNet-20's eight full bootstraps 18% above
    the 33.5 s they took. ``old``: the table's entries, ``new``: this run's."""
    before, now = old.get("full"), new.get("full")
    if not isinstance(before, Mapping) or not isinstance(now, Mapping):
        return new
    samples = [float(x) for x in [*before.get("samples_ms", []), *now.get("samples_ms", [])]]
    if not samples:
        return new
    pooled = dict(now)
    pooled["samples_ms"] = samples
    pooled["median_ms"] = round(float(statistics.median(samples)), _DIGITS)
    pooled["max_abs_error"] = max(float(before.get("max_abs_error", 0.0)), float(now.get("max_abs_error", 0.0)))
    pooled["bits"] = min(float(before.get("bits", now["bits"])), float(now["bits"]))
    return {**new, "full": pooled}


def _variant_measurements(measured: Mapping[str, Any]) -> dict[str, Any]:
    """``measurements.boot_variants``: per kind the samples and median (ms), the input and
    output levels, the max abs error and the bits kept (relative to boot.max_abs), the ratio
    to the full-slot bootstrap of the same run; and the run's block and peak RSS."""
    out: dict[str, Any] = {}
    for kd, e in sorted(measured["kinds"].items()):
        out[kd] = {"median_ms": _ms(e["median_s"]), "samples_ms": [_ms(x) for x in e["samples_s"]],
                   "input_level": e["input_level"], "output_level": e.get("output_level"),
                   "max_abs_error": e["max_abs_error"], "bits": e["bits"], "ratio_to_full": e["ratio_to_full"]}
    # each run (the kinds timed together, with their own full bootstrap for the ratio)
    run = {k: measured[k] for k in ("repeat", "stream", "peak_rss_bytes", "boot_key_bytes", "boot_matrix_bytes",
                                    "boot_keygen_seconds", "boot_matrix_seconds")}
    if "full" in measured["kinds"]:
        run["full_median_ms"] = _ms(measured["kinds"]["full"]["median_s"])
    if measured.get("bootstrap_phases"):  # the sparse bootstraps by phase (docs/lattigo.md)
        run["bootstrap_phases"] = measured["bootstrap_phases"]
    out["run " + ",".join(sorted(measured["kinds"]))] = run
    return out
