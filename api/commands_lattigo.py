"""Lattigo measurement commands: ``slotplan calibrate``, ``slotplan lattigo-bench`` and
``slotplan orion-bench``.

Both run CKKS with Lattigo on this machine (the gopy extension, ``make lattigo``).
Bad input (unknown preset, bad shape, unknown workload, extension not built) exits 2
with one line on stderr; ``lattigo-bench`` exits 1 when a method fails or an encrypted
result disagrees with numpy beyond CKKS precision.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from api.common import ExitError, err, fail, out
from planner.assign.options import DEFAULT_TIME_LIMIT_S, MAX_TIME_LIMIT_S

# Relative error bound of an encrypted result vs numpy (same as `slotplan run`).
RTOL = 1e-4


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)
    app.command("lattigo-bench")(lattigo_bench)
    app.command("orion-bench")(orion_bench)
    from api.model_bench import model_bench_command  # issue 36: whole models (api/model_bench.py)

    app.command("model-bench")(model_bench_command)


# ----------------------------------------------------------------------------- calibrate
def calibrate(
    params: Annotated[str | None, typer.Option("--params", help="preset n12..n16 or a JSON file (required)")] = None,
    repeat: Annotated[int, typer.Option("--repeat", help="timed runs per operation (median)")] = 5,
    output: Annotated[
        Path | None, typer.Option("--out", "-o", help="cost table to write [default: data/costs/<P>-lattigo.json]")
    ] = None,
    hoist_batch: Annotated[int, typer.Option("--hoist-batch", help="offsets of the hoisted-rotation batch")] = 8,
    bootstrap_repeat: Annotated[
        int | None,
        typer.Option("--bootstrap-repeat", help="bootstrapping presets: timed bootstraps [default: min(repeat, 3)]"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the written table as JSON")] = False,
    boot_variants: Annotated[
        str | None,
        typer.Option("--boot-variants", help="bootstrapping presets: also time sparse bootstrap variants: 'all' or "
                     "a list such as s12,h11,p11 (written as boot_variants, ms)"),
    ] = None,
    boot_variants_only: Annotated[
        bool, typer.Option("--boot-variants-only", help="only time the variants; the table at --out keeps the rest"),
    ] = False,
    boot_stream: Annotated[
        int | None, typer.Option("--boot-stream", help="variants: stream the block's Galois keys, D read ahead")
    ] = None,
    executor_only: Annotated[
        bool, typer.Option("--executor-only", help="only measure the executor's sizes (ExecutorMemory, for the "
                           "process model under --memory-cap); the table at --out keeps the rest"),
    ] = False,
    encodings_only: Annotated[
        bool, typer.Option("--encodings-only", help="only time the plaintext encodings (encode, encode_pair, "
                           "encode_lattigo) at the table's levels, on the CPU that measured it; the table at "
                           "--out keeps the rest"),
    ] = False,
) -> None:
    """Measure CKKS operation times with Lattigo here and write a planner cost table (ms).
    A bootstrapping preset (n14boot, n16boot) also times a bootstrap."""
    from backends.calibrate import calibrate as run_calibration
    from backends.lattigo_backend import LattigoError
    from common.errors import SlotplanError
    from planner.cost.tables import load_costs
    from planner.frontend.params import load_params

    try:
        if params is None:
            raise SlotplanError("calibrate needs --params (a preset n12..n16 or a JSON file)")
        p = load_params(params)
        if repeat < 1 or repeat > 1000:
            raise SlotplanError(f"--repeat must be in 1..1000, got {repeat}")
        if output is not None and output.suffix.lower() != ".json":
            raise SlotplanError(f"--out {str(output)!r}: a cost table file must end in .json")
        kinds = None
        if boot_variants is not None:
            from backends.calibrate_variants import parse_kinds

            kinds = parse_kinds(p, boot_variants)
        table, path = run_calibration(p, repeat, output, hoist_batch, bootstrap_repeat=bootstrap_repeat,
                                      boot_variants=kinds, variants_only=boot_variants_only, boot_stream=boot_stream,
                                      executor_only=executor_only, encodings_only=encodings_only)
        load_costs(path)  # the planner accepts what was written
    except (SlotplanError, LattigoError) as e:
        raise fail(e) from None
    if as_json or boot_variants_only or executor_only or encodings_only:
        m_ = table.get("measurements", {})
        if as_json:
            shown = table
        elif executor_only:
            shown = m_.get("executor")
        elif encodings_only:
            shown = {lv: {op: v for op, v in ops.items() if op.startswith("encode")}
                     for lv, ops in (m_.get("per_level_ms") or {}).items()}
        else:
            shown = m_.get("boot_variants")
        out.print_json(json.dumps(shown))
        return
    m = table["measurements"]
    w = table["weights"]
    t = Table(title=escape(f"{table['name']}: Lattigo {p.name} (log N {p.log_n}, {p.slots} slots), ms, median of {repeat}"))
    for col in ("weight", "ms", "measurement"):
        t.add_column(col)
    notes = {
        "rotation": "Rotate, top level",
        "hoisted_rotation": f"per extra offset of a RotateHoisted batch of {m['hoist_batch']}",
        "pmul": "Mul by an encoded plaintext",
        "cmul": "MulRelin",
        "add": "Add",
        "rescale": "Rescale",
        "poly": "degree-3 polynomial",
        "depth": "not a time",
        "bootstrap": "Bootstrap of one ciphertext (level 0 in)",
    }
    for k, v in w.items():
        t.add_row(k, f"{v:.4f}", notes.get(k, ""))
    out.print(t)
    lv = Table(title="per level (ms)")
    ops: tuple[str, ...] = ("rotate", "hoisted_rotation_extra", "pmul", "encode", "add", "cmul_relin", "rescale")
    if any("encode_prec53" in row for row in m["per_level_ms"].values()):
        ops += ("encode_prec53",)
    lv.add_column("level")
    for o in ops:
        lv.add_column(o)
    for level, row in m["per_level_ms"].items():
        lv.add_row(level, *(f"{row[o]:.4f}" if o in row else "-" for o in ops))
    out.print(lv)
    once = m["once_ms"]
    out.print(
        "once (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in once.items())
        + f"; Galois key {m['galois_key_bytes'] / 2**20:.1f} MiB"
    )
    if "bootstrap" in m:
        b = m["bootstrap"]
        out.print(
            f"bootstrap ({b['literal']}): {b['median_ms'] / 1000:.2f} s (~{b['rotations_per_bootstrap']} rotations), "
            f"level {b['input_level']} -> {b['output_level']}, max abs error {max(b['max_abs_error']):.2e}; "
            f"keys {b['evaluation_key_bytes'] / 2**20:.0f} MiB in {b['keygen_ms'] / 1000:.1f} s, "
            f"DFT matrices {b['matrix_bytes'] / 2**20:.0f} MiB in {b['matrix_encoding_ms'] / 1000:.1f} s"
        )
    mc = m["machine"]
    out.print(f"machine: {mc['cpu_model']} x{mc['cpu_count']}, {mc['go_version']}, {mc['date']}")
    out.print(f"wrote {path}  (use with PlanOptions(costs={path.stem!r}) if it is in data/costs/)")


# -------------------------------------------------------------------------- lattigo-bench
@contextlib.contextmanager
def _table_now(p: Any, enabled: bool) -> Iterator[Path | None]:
    """A cost table of preset ``p`` calibrated now, in this job (``--calibrate``), in a
    temporary directory; None when not asked. The machine's speed drifts between days
    (here up to ~1.4x), so a model-vs-measured check is fair only against a table measured
    in the same job; plans are still chosen with the committed table."""
    if not enabled:
        yield None
        return
    from backends.calibrate import calibrate as run_calibration

    with tempfile.TemporaryDirectory(prefix="slotplan-cal-") as tmp:
        err.print(f"calibrating {p.name} in this job ...", markup=False, highlight=False)
        _, path = run_calibration(p, CALIBRATE_NOW_REPEAT, Path(tmp) / f"{p.name}-now.json")
        yield path


# Timed runs per operation of the in-job calibration (the committed tables use 9).
CALIBRATE_NOW_REPEAT = 5


def _progress(name: str, row: Mapping[str, Any], as_json: bool, methods: Sequence[str]) -> None:
    if as_json:
        print(json.dumps(row, sort_keys=True), flush=True)
        return
    done = ", ".join(
        f"{m} {row[m]['eval_seconds']:.3f}s" if row[m].get("status") == "ok" else f"{m} {row[m]['status'][:40]}"
        for m in methods if m in row
    )
    err.print(f"lattigo-bench {name}: {row['workload']}: {done}", markup=False, highlight=False)


def _fmt_s(x: Any) -> str:
    return "-" if x is None else f"{float(x):.3f}"


def _fmt_err(x: Any) -> str:
    return "-" if x is None else f"{float(x):.1e}"


def _cells(r: Mapping[str, Any] | None, rot: str = "rotations") -> list[str]:
    if r is None:
        return ["n/a", "", "", ""]
    status = str(r.get("status", "?"))
    if status.startswith(("skipped", "unsupported")):
        return [status.split(":")[0] + "*", "", "", ""]
    if status != "ok":
        return ["error*", "", "", ""]
    return [_fmt_s(r["eval_seconds"]), str(r[rot]), str(r["keys"]), _fmt_err(r["max_rel_error"])]


def _fmt_opt(x: Any) -> str:
    return "-" if x is None else f"{float(x):.3f}"


def _ratio(x: Any) -> str:
    return "-" if x is None else f"{float(x):.2f}"


def _print_rows(rows: list[dict[str, Any]], title: str) -> None:
    t = Table(title=escape(title))
    cols = [
        "workload", "ours kernel", "ours s", "rot", "keys", "err",
        "fhelipe s", "rot", "keys", "err",
        "lintrans s (best)", "rot b+g(+f)", "keys", "err",
        "lintrans/ours", "fhelipe/ours",
    ]
    for c in cols:
        t.add_column(c, justify="left" if c in ("workload", "ours kernel") else "right")
    for r in rows:
        ours = r.get("ours")
        kern = ",".join(ours.get("kernels", [])) if ours else "-"
        lt = r.get("lintrans")
        lt_cells = _cells(lt)
        if lt and lt.get("status") == "ok":
            # the fastest variant of the sweep: embedding (square / hybrid) and LogBSGSRatio
            lt_cells[0] += f" ({'h' if lt.get('embedding') == 'hybrid' else 'sq'} r={lt['log_bsgs_ratio']})"
            lt_cells[1] = f"{lt['baby_rotations']}+{lt['giant_rotations']}"
            if lt.get("fold_rotations"):
                lt_cells[1] += f"+{lt['fold_rotations']}"
        t.add_row(
            escape(r["workload"]), escape(kern), *_cells(ours), *_cells(r.get("fhelipe")), *lt_cells,
            _ratio(r.get("lintrans_over_ours")), _ratio(r.get("fhelipe_over_ours")),
        )
    out.print(t)
    # wall vs CPU time (a loaded machine inflates wall time) and our modelled time
    m = Table(title="ours vs lintrans in wall and process CPU seconds; ours modelled (calibrated table)")
    for c in ("workload", "ours wall", "ours cpu", "lt wall", "lt cpu", "lt/ours wall", "lt/ours cpu",
              "model", "model/wall", "model/cpu", "now/wall", "blocks", "load"):
        m.add_column(c, justify="left" if c == "workload" else "right")
    for r in rows:
        ours, lt = r.get("ours") or {}, r.get("lintrans") or {}
        ok, lok = ours.get("status") == "ok", lt.get("status") == "ok"
        m.add_row(
            escape(r["workload"]), _fmt_opt(ours.get("eval_seconds") if ok else None),
            _fmt_opt(ours.get("cpu_seconds") if ok else None), _fmt_opt(lt.get("eval_seconds") if lok else None),
            _fmt_opt(lt.get("cpu_seconds") if lok else None), _ratio(r.get("lintrans_over_ours")),
            _ratio(r.get("lintrans_over_ours_cpu")), _fmt_opt(ours.get("modelled_seconds") if ok else None),
            _ratio(ours.get("model_over_eval")), _ratio(ours.get("model_over_cpu")),
            _ratio(ours.get("model_now_over_eval")),
            str(ours.get("fused_blocks", "-")), str(r.get("loadavg_1m_at_start", "-")),
        )
    out.print(m)
    if any("ours-complex" in r for r in rows):
        _print_complex(rows)
    if any("lintrans-interleaved" in r for r in rows):
        _print_interleaved(rows)
    for r in rows:
        for method in ("ours", "fhelipe", "lintrans", "ours-complex"):
            mres = r.get(method)
            if mres and mres.get("status") != "ok":
                out.print(f"* {escape(r['workload'])} {method}: {escape(str(mres.get('status')))}")
            elif mres and mres.get("key_schedule"):
                ks = mres["key_schedule"]
                out.print(
                    f"* {escape(r['workload'])} {method}: keys over the memory budget, run with a key schedule "
                    f"(cap {ks['memory_cap_bytes'] / 2**20:.0f} MiB, {ks['key_loads']} loads, "
                    f"{ks['key_load_seconds']:.2f} s of loading excluded from eval)"
                )
    s = Table(title="not in the times above (seconds): key generation, encryption, plaintext encoding")
    for c in ("workload", "ours keygen", "encrypt", "encode", "fhelipe keygen", "encode",
              "lintrans keygen", "encrypt", "encode (diagonals)", "key MiB ours/fh/lt"):
        s.add_column(c, justify="left" if c == "workload" else "right")
    for r in rows:
        cells = [escape(r["workload"])]
        mib = []
        for name, fields in (("ours", ("keygen_seconds", "encrypt_seconds", "encode_seconds")),
                             ("fhelipe", ("keygen_seconds", "encode_seconds")),
                             ("lintrans", ("keygen_seconds", "encrypt_seconds", "encode_seconds"))):
            res = r.get(name)
            ok = res is not None and res.get("status") == "ok"
            cells += [_fmt_s(res[f]) if ok and res is not None else "-" for f in fields]
            mib.append(f"{res['key_bytes'] / 2**20:.0f}" if ok and res is not None else "-")
        cells.append("/".join(mib))
        s.add_row(*cells)
    out.print(s)
    for r in rows:
        ours, lt = r.get("ours"), r.get("lintrans")
        ratio = r.get("lintrans_over_ours")
        if ratio is None or ratio > 1.0 or not ours or not lt:
            continue
        by = r.get("ours_seconds_by_op", {})
        cnt = ours.get("op_counts", {})
        nrot = ours["rotations"]
        out.print(
            f"[bold]{escape(r['workload'])}[/bold]: lintrans is faster ({lt['eval_seconds']:.3f} s vs ours "
            f"{ours['eval_seconds']:.3f} s). Ours by op: rot {by.get('rot', 0):.3f} s ({nrot} rotations, "
            f"{by.get('rot', 0) / max(nrot, 1) * 1000:.1f} ms each), pmul {by.get('pmul', 0):.3f} s "
            f"({cnt.get('pmul', 0)}), add {by.get('add', 0):.3f} s ({cnt.get('add', 0) + cnt.get('sub', 0)}), "
            f"rescale {by.get('rescale', 0):.3f} s ({cnt.get('rescale', 0)}), other {by.get('other', 0):.3f} s. "
            f"Lintrans: {lt['baby_rotations']} lazy hoisted baby steps + {lt['giant_rotations']} giant key "
            f"switches over {lt['diagonals']} diagonals (d={lt['dimension']}, n1={lt['n1']}), products "
            f"accumulated in the QP basis with one ModDown per giant step; evaluate "
            f"{lt['evaluate_seconds']:.3f} s + rescale {lt['rescale_seconds']:.3f} s."
        )


def _print_interleaved(rows: list[dict[str, Any]]) -> None:
    """lintrans given our row-interleaved diagonals (the same products as our hybrid plan)."""
    t = Table(title="lintrans with our row-interleaved diagonals (lintrans-interleaved) vs ours and lintrans (best of square/hybrid)")
    for col in ("workload", "ours s", "lintrans s", "lt-interleaved s", "diagonals", "rot b+g+f", "err",
                "lintrans/ours", "lt-interleaved/ours"):
        t.add_column(col, justify="left" if col == "workload" else "right")
    for r in rows:
        li, ours, lt = r.get("lintrans-interleaved") or {}, r.get("ours") or {}, r.get("lintrans") or {}
        ok = li.get("status") == "ok"
        t.add_row(
            escape(r["workload"]), _fmt_opt(ours.get("eval_seconds") if ours.get("status") == "ok" else None),
            _fmt_opt(lt.get("eval_seconds") if lt.get("status") == "ok" else None),
            (f"{li['eval_seconds']:.3f} (r={li['log_bsgs_ratio']})" if ok else _cells(li or None)[0]),
            str(li.get("diagonals", "-")),
            f"{li['baby_rotations']}+{li['giant_rotations']}+{li['fold_rotations']}" if ok else "-",
            _fmt_err(li.get("max_rel_error") if ok else None),
            _ratio(r.get("lintrans_over_ours")), _ratio(r.get("lintrans_interleaved_over_ours")),
        )
    out.print(t)


def _print_complex(rows: list[dict[str, Any]]) -> None:
    """ours-complex (complex packing) next to ours and the best lintrans."""
    c = Table(title="ours-complex (--packing complex) vs ours and lintrans (best), eval seconds")
    for col in ("workload", "ours-complex kernel", "ours-complex s", "rot", "keys", "pmul", "err", "model",
                "model/wall", "now/wall", "ours s", "pmul", "lintrans s", "ours/ours-complex", "lintrans/ours-complex",
                "lintrans/ours"):
        c.add_column(col, justify="left" if col in ("workload", "ours-complex kernel") else "right")
    for r in rows:
        oc, ours, lt = r.get("ours-complex") or {}, r.get("ours") or {}, r.get("lintrans") or {}
        cells = _cells(oc or None)
        ok = oc.get("status") == "ok"
        c.add_row(
            escape(r["workload"]), escape(",".join(oc.get("kernels", [])) or "-"), *cells[:3],
            str(oc.get("pmul", "-")), cells[3], _fmt_opt(oc.get("modelled_seconds") if ok else None),
            _ratio(oc.get("model_over_eval") if ok else None), _ratio(oc.get("model_now_over_eval") if ok else None),
            _fmt_opt(ours.get("eval_seconds") if ours.get("status") == "ok" else None), str(ours.get("pmul", "-")),
            _fmt_opt(lt.get("eval_seconds") if lt.get("status") == "ok" else None),
            _ratio(r.get("ours_over_ours_complex")), _ratio(r.get("lintrans_over_ours_complex")),
            _ratio(r.get("lintrans_over_ours")),
        )
    out.print(c)


def lattigo_bench(
    params: Annotated[str, typer.Option("--params", help="preset n12..n16 or a JSON file")] = "n14",
    shapes: Annotated[str, typer.Option("--shapes", help="MVM shapes NxK, comma-separated ('' for none)")] = "512x512,1024x1024,2048x2048,1024x4096,4096x1024",
    convs: Annotated[str, typer.Option("--convs", help="data/workloads convolutions, comma-separated ('' for none)")] = "conv1,conv2,conv3,conv4",
    repeat: Annotated[int, typer.Option("--repeat", help="timed evaluations per method (median)")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="seed of W, x and the conv data")] = 0,
    methods: Annotated[str, typer.Option("--methods", help="ours,fhelipe,lintrans,ours-complex (ours planned with --packing complex),lintrans-interleaved (lintrans given our row-interleaved diagonals)")] = "ours,fhelipe,lintrans",
    log_bsgs_ratio: Annotated[str, typer.Option("--log-bsgs-ratio", help="lintrans LogBabyStepGiantStepRatio(s), comma-separated; the fastest is the baseline")] = "0,1,2,3",
    memory_budget: Annotated[str | None, typer.Option("--memory-budget", help="skip a method whose keys need more (bytes or KiB/MiB/GiB) [default: 60% of MemAvailable]")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON line per workload instead of tables")] = False,
    output: Annotated[Path | None, typer.Option("--out", "-o", help="also write all rows, parameters and machine as one JSON file")] = None,
    calibrate_now: Annotated[bool, typer.Option("--calibrate", help="calibrate the preset first, in this job, and also price each plan with that table (model now/wall)")] = False,
    time_limit: Annotated[float, typer.Option("--time-limit", help="each plan's solver time limit, seconds (as plan --time-limit)")] = DEFAULT_TIME_LIMIT_S,
) -> None:
    """Time our plans, Fhelipe-style plans and Lattigo's lintrans encrypted on this machine."""
    import time

    from backends import lattigo_bench as lb
    from backends.calibrate import machine_info
    from backends.lattigo_backend import LattigoError, version
    from common.errors import SlotplanError
    from planner.frontend.params import load_params
    from planner.ir.io import parse_size

    try:
        p = load_params(params)
        shape_list = lb.parse_shapes(shapes)
        conv_list = lb.parse_convs(convs)
        for c in conv_list:
            lb.conv_workload(c)  # unknown names fail before anything runs
        method_list = [m.strip() for m in methods.split(",") if m.strip()]
        if repeat < 1 or repeat > 1000:
            raise SlotplanError(f"--repeat must be in 1..1000, got {repeat}")
        budget = parse_size(memory_budget) if memory_budget is not None else None
        if output is not None and output.suffix.lower() != ".json":
            raise SlotplanError(f"--out {str(output)!r}: expected a .json file")
        if not shape_list and not conv_list:
            raise SlotplanError("nothing to run: --shapes and --convs are both empty")
        if not 0 < time_limit <= MAX_TIME_LIMIT_S:
            raise SlotplanError(f"--time-limit must be in (0, {MAX_TIME_LIMIT_S:g}] seconds, got {time_limit:g}")
        rows: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        try:
            ratios = tuple(int(r) for r in log_bsgs_ratio.split(",") if r.strip())
        except ValueError:
            raise SlotplanError(f"--log-bsgs-ratio {log_bsgs_ratio!r}: integers 0..16, comma-separated") from None
        if not ratios or any(not 0 <= r <= 16 for r in ratios):
            raise SlotplanError(f"--log-bsgs-ratio {log_bsgs_ratio!r}: integers 0..16, comma-separated")
        with _table_now(p, calibrate_now) as table_now:
            for row in lb.bench(p, shape_list, conv_list, repeat, seed, method_list, budget, ratios, table_now,
                                time_limit):
                rows.append(row)
                _progress(p.name, row, as_json, lb.METHODS)
        total = time.perf_counter() - t0
        backend = version()
    except (SlotplanError, LattigoError) as e:
        raise fail(e) from None
    if output is not None:
        doc = {
            "schema": lb.BENCH_SCHEMA,
            "command": f"slotplan lattigo-bench --params {params} --shapes {shapes} --convs {convs} --repeat {repeat} --seed {seed}"
            + (" --calibrate" if calibrate_now else ""),
            "params": p.to_json(),
            "shapes": [list(s) for s in shape_list],
            "convs": conv_list,
            "repeat": repeat,
            "seed": seed,
            "backend": backend,
            "machine": machine_info() | {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "seconds": round(total, 1),
            "rows": rows,
        }
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(doc, indent=1) + "\n")
    if not as_json:
        _print_rows(rows, f"lattigo-bench {p.name} ({p.slots} slots), eval seconds = evaluation only, median of {repeat}")
        out.print(f"total {total:.1f} s" + (f"; wrote {output}" if output is not None else ""))
    bad: list[str] = []
    for r in rows:
        for m in lb.METHODS:
            res = r.get(m)
            if not res:
                continue
            status = str(res.get("status", ""))
            if status.startswith("error"):
                bad.append(f"{r['workload']}/{m}: {status}")
            elif status == "ok" and res["max_rel_error"] > RTOL:
                bad.append(f"{r['workload']}/{m}: max relative error {res['max_rel_error']:.2e} > {RTOL:g}")
    if bad:
        raise ExitError("lattigo-bench: " + "; ".join(bad), 1)


# --------------------------------------------------------------------------- orion-bench
# Orion's scale is 2^26 over a 29-bit q0: both systems keep ~6-11 bits here (Orion's own
# example prints its precision in bits). Ours must stay within 1e-2 of the float64 output.
ORION_RTOL = 1e-2


def orion_bench(
    orion_python: Annotated[
        Path | None,
        typer.Option("--orion-python", help="Orion's interpreter [default: .venv-orion/bin/python, from `make orion`]"),
    ] = None,
    repeat: Annotated[int, typer.Option("--repeat", help="timed encrypted inferences per system (median)")] = 3,
    seed: Annotated[int, typer.Option("--seed", help="seed of the weights, BatchNorm statistics and input")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the row as JSON")] = False,
    output: Annotated[Path | None, typer.Option("--out", "-o", help="also write the row as a JSON file")] = None,
    calibrate_now: Annotated[bool, typer.Option("--calibrate", help="calibrate Orion's chain first, in this job, and also price our plan with that table")] = False,
    batch: Annotated[int | None, typer.Option("--batch", min=1, help="our plan holds this many samples per ciphertext (Orion's input in each): samples per second for both")] = None,
) -> None:
    """Orion's MLP (784-128-128-10, x^2) encrypted by Orion and by slotplan in one job, on the
    same weights, input and modulus chain; times, errors against float64, keys."""
    from api.orion_bench import PARAMS
    from api.orion_bench import orion_bench as run_bench
    from backends.lattigo_backend import LattigoError
    from common.errors import SlotplanError
    from planner.frontend.params import load_params

    try:
        if output is not None and output.suffix.lower() != ".json":
            raise SlotplanError(f"--out {str(output)!r}: expected a .json file")
        with _table_now(load_params(str(PARAMS)), calibrate_now) as table_now:
            row = run_bench(orion_python, repeat, seed, table_now, batch)
    except (SlotplanError, LattigoError) as e:
        raise fail(e) from None
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(row, indent=1, sort_keys=True) + "\n")
    if as_json:
        print(json.dumps(row, sort_keys=True))
    else:
        _print_orion(row, repeat)
        if batch is not None and "samples_per_second" in row["ours"]:
            print(f"samples per second: Orion {row['orion']['samples_per_second']:.4g} (one per inference), "
                  f"slotplan {row['ours']['samples_per_second']:.4g} (batch {batch}): "
                  f"{row['ours_over_orion_samples_per_second']:.4g}x")
    err_ours = float(row["ours"].get("max_rel_error") or 0.0)
    if err_ours > ORION_RTOL:
        raise ExitError(f"orion-bench: ours: max relative error {err_ours:.2e} > {ORION_RTOL:g}", 1)


def _print_orion(row: Mapping[str, Any], repeat: int) -> None:
    o, u = row["orion"], row["ours"]
    t = Table(title=escape(f"{row['workload']}: encrypted inference, median of {repeat} "
                           f"({row['affinity_cpus']} CPUs, GOMAXPROCS={row['gomaxprocs'] or 'default'})"))
    for c in ("system", "eval s (runs)", "rel. error", "argmax", "keys", "prep s", "notes"):
        t.add_column(c, justify="left" if c in ("system", "notes") else "right")
    runs = ", ".join(f"{r:.3f}" for r in o["eval_seconds_runs"])
    t.add_row(
        f"Orion {escape(str(o['orion_version']))}", f"{o['eval_seconds']:.3f} ({runs})", _fmt_err(o["max_rel_error"]),
        "ok" if o["argmax_agrees"] else "differs", "-", f"{o['fit_compile_seconds']:.1f}",
        escape(f"ring {o['config']['ckks_params']['RingType']}, hybrid lintrans; peak RSS {o['max_rss_bytes'] / 2**30:.2f} GiB"),
    )
    runs = ", ".join(f"{r:.3f}" for r in (u.get("eval_seconds_runs") or []))
    t.add_row(
        "slotplan", f"{_fmt_s(u.get('eval_seconds'))} ({runs})", _fmt_err(u.get("max_rel_error_vs_clear")),
        "ok" if u.get("argmax_agrees") else "differs", str(u.get("keys")),
        _fmt_s(u.get("encode_seconds")),
        escape(f"{','.join(u.get('kernels') or [])}; {u.get('plan_rotations')} rotations, {u.get('pmul')} pmul, "
               f"depth {u.get('depth')}, {u.get('workers')} workers; model {_fmt_s(u.get('modelled_seconds'))} s"
               + (f" (calibrated now: {_fmt_s(u.get('modelled_seconds_now'))} s)" if u.get("modelled_seconds_now") else "")),
    )
    out.print(t)
    out.print(f"Orion / slotplan: {_ratio(row.get('orion_over_ours'))}x  (prep: Orion's fit+compile, our plaintext encoding)")
