"""slotplan command line (docs/cli.md).  Calls the pipeline only.

Exit status: 0 success; 1 a run mismatched its reference (or a regression in diff);
2 bad input (one line on stderr, nothing written); 3 solver time-out without a plan.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.main
from rich.markup import escape
from rich.table import Table

from api.common import ExitError, err, fail, out, solver_gap_note
from backends.runner import EXECUTION_BACKENDS
from common.errors import SlotplanError
from planner.assign.candidates import KERNEL_FAMILIES
from planner.ir.io import DEFAULT_MAX_TABLE_BYTES, load_plan, load_tables, parse_size, write_outputs
from planner.pipeline import PlanOptions, PlanOptionsLiteral, PlanTimeout
from solver import SOLVER_BACKENDS

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Layout planner for CKKS tensor programs.")


def _print_version(value: bool) -> None:
    if value:
        from slotplan._version import version_lines

        out.print("\n".join(version_lines()), markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                          help="print slotplan's version (and the Lattigo extension's) and exit")] = False,
) -> None:
    """Layout planner for CKKS tensor programs."""
_fail = fail


def _print_totals(summary: dict[str, Any], seconds: float) -> None:
    """The plan's totals in one line, and a note when the solver stopped far from its bound."""
    pk = summary["peak_bytes"]
    out.print(
        f"rotations {summary['rotations']}  keys {summary['rotation_keys']}  pmul {summary['pmul']}  "
        f"depth {summary['depth']}  peak {pk['total'] / 2**20:.1f} MiB (keys {pk['keys'] / 2**20:.1f})  "
        f"solver {summary['solver']['name']}:{summary['solver']['status']}  plan {seconds:.2f}s"
    )
    gap = solver_gap_note(summary["solver"])
    if gap:
        out.print(f"note: {escape(gap)}")


@app.command()
def plan(
    graph: Annotated[Path, typer.Argument(help="graph file (slotplan.graph/1)")],
    params: Annotated[str, typer.Option("--params", help="preset n12..n16, n14boot, n16boot, auto (the smallest secure preset that fits without bootstrapping, else n16boot) or a JSON file")] = "n16",
    memory_cap: Annotated[str | None, typer.Option("--memory-cap", help="bound on the modelled process memory of a Lattigo run (plan + executor state + bootstrap garbage; not the process baseline, ~62 MiB + plan): bytes, or with KiB/MiB/GiB")] = None,
    solver: Annotated[str, typer.Option("--solver", help=SOLVER_BACKENDS.help())] = "cpsat",
    time_limit: Annotated[float, typer.Option("--time-limit", help="solver time limit, seconds")] = 10.0,
    wall_limit: Annotated[float | None, typer.Option("--wall-limit", min=0.1, help="bound the whole planning (candidates, solve, lowering, key schedule) to this many seconds of wall time; past it, exit 3 naming the step")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--plan-out", help="plan file to write")] = None,
    tables: Annotated[Path | None, typer.Option("--tables", help="npz tables file to write")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print {summary, nodes} as JSON")] = False,
    kernels: Annotated[str | None, typer.Option("--kernels", help=f"allowed kernels, comma-separated: {KERNEL_FAMILIES.help(',')}")] = None,
    input_layout: Annotated[str, typer.Option("--input-layout", help="free (client packs any layout) | row-major")] = "free",
    cins: Annotated[bool, typer.Option("--cins/--no-cins", help="offer NeuJeans CinS conv layers (each bootstraps its result) at bootstrapping presets (default) | slot kernels only; a --kernels list is taken as given")] = True,
    cins_decompose: Annotated[bool, typer.Option("--cins-decomposition/--no-cins-decomposition", help="strided CinS convs also in NeuJeans' decomposed form (Alg. 2, default) | only densify-first")] = True,
    packing: Annotated[str, typer.Option("--packing", help="real (SPEC plans, real registers; default) | complex (also the hybrid matvec with two inputs per complex slot: half the diagonals; plans use mul_i/conj and complex plaintexts, docs/formats.md; no --memory-cap)")] = "real",
    max_table_bytes: Annotated[str, typer.Option("--max-table-bytes", help="refuse larger tables files")] = str(DEFAULT_MAX_TABLE_BYTES),
    costs: Annotated[str, typer.Option("--costs", help="objective weights: data/costs/<name>.json or a path")] = "default",
    objective: Annotated[str | None, typer.Option("--objective", help="time (modelled seconds of the preset's calibrated table data/costs/<preset>-lattigo.json; the default where one exists) | rotations (the minimum-rotation plan)")] = None,
    record_timings: Annotated[bool, typer.Option("--record-timings", help="write solver/plan seconds into the plan (plans are otherwise byte-for-byte deterministic)")] = False,
    clean_outputs: Annotated[bool, typer.Option("--clean-outputs/--raw-outputs", help="outputs hold zeros outside their tensor (default; a mask where a kernel leaves partial sums of the weights) | leave what the kernel leaves (the client may see linear combinations of the weights)")] = True,
    allow_insecure: Annotated[bool, typer.Option("--allow-insecure", help="accept custom params above the 128-bit bound (the plan summary then says insecure: true)")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="add 'explain' to the plan: per node the runner-up kernel, its cost and why it lost; print it")] = False,
    progress: Annotated[bool, typer.Option("--progress", help="progress on stderr even when it is not a terminal (off with --json unless given)")] = False,
    calibrate: Annotated[Path | None, typer.Option("--calibrate", help="MODEL.onnx only: calibration samples .npz (see slotplan import)")] = None,
    degree: Annotated[int | None, typer.Option("--degree", help="MODEL.onnx only: degree of the activation polynomials")] = None,
    max_error: Annotated[float | None, typer.Option("--max-error", help="MODEL.onnx only: choose each activation's degree for this error")] = None,
    weights_out: Annotated[Path | None, typer.Option("--weights-out", help="MODEL.onnx only: write the imported weights (.npz)")] = None,
    graph_out: Annotated[Path | None, typer.Option("--graph-out", help="MODEL.onnx only: write the imported graph (JSON)")] = None,
    cut: Annotated[list[str] | None, typer.Option("--output", help="MODEL.onnx only: cut the model at this value (see slotplan import --output); the plan file is -o")] = None,
    allow_error: Annotated[bool, typer.Option("--allow-error", help="MODEL.onnx only: an approximation that misses its error target is a warning, not a refusal")] = False,
    batch: Annotated[str | None, typer.Option("--batch", help="samples per ciphertext set: B (every input gains a leading dimension B, docs/batch.md) | auto (the power of two with the least modelled time per sample)")] = None,
    boot_variants: Annotated[str, typer.Option("--boot-variants", help="on (default): bootstrap variants (sparse, halves, pairs) where the params offer them and the cost table prices them | off: the full-slot bootstrap only")] = "on",
) -> None:
    """Plan one graph (or an ONNX model: imported first, as slotplan import)."""
    from pydantic import ValidationError

    from api.progress import shown, wanted
    from planner.frontend.params import AUTO, load_params
    from planner.pipeline import auto_params, plan_graph

    started = time.monotonic()  # the wall limit counts loading and validating the graph too
    try:
        g = _graph_or_model(graph, calibrate, degree, max_error, weights_out, graph_out, cut, allow_error)
        p = load_params(params) if params != AUTO else None
        cap = parse_size(memory_cap) if memory_cap is not None else None
        limit = parse_size(max_table_bytes)
        SOLVER_BACKENDS.check(solver)
        lit = PlanOptionsLiteral(
            solver=solver,
            time_limit_s=time_limit,
            memory_cap_bytes=cap,
            kernels=[k.strip() for k in kernels.split(",") if k.strip()] if kernels else None,
            input_layout=input_layout,  # type: ignore[arg-type]
            costs=costs,
            clean_outputs=clean_outputs,
            allow_insecure=allow_insecure,
            objective=objective,  # type: ignore[arg-type]
            cins=cins,
            cins_decompose=cins_decompose,
            packing=packing,  # type: ignore[arg-type]
            boot_variants=_on_off("--boot-variants", boot_variants),
        )
        opts = PlanOptions.from_literal(lit)
        n_batch = _batch_option(batch)
        with shown(wanted(progress, as_json)):
            if p is None:  # --params auto: the smallest secure preset that fits, else n16boot
                p = auto_params(g, opts)
            if n_batch == "auto":
                from planner.batch import plan_auto_batch

                res = plan_auto_batch(g, p, opts, record_timings, wall_limit, started)
            else:
                res = plan_graph(g, p, replace(opts, batch=int(n_batch)) if n_batch else opts,
                                 record_timings=record_timings, wall_limit_s=wall_limit, wall_started=started)
            if explain:
                from planner.report.explain import explain_choices

                res.plan["explain"] = explain_choices(res.problem, res.solution)
        summary = res.plan["summary"]
        write_outputs(res.plan, output, res.tables if tables else None, tables, limit)
    except PlanTimeout as e:
        raise _fail(e, 3) from None
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise _fail(ValueError(f"option {loc}: {first['msg']}")) from None
    except SlotplanError as e:
        raise _fail(e) from None
    if summary.get("insecure"):  # SPEC section 9: said wherever a plan is shown (stderr: stdout stays JSON)
        from planner.frontend.params import insecure_line

        err.print(f"slotplan: warning: {insecure_line(res.plan['params']) or 'parameters below the 128-bit bound'}",
                  highlight=False, markup=False)
    if as_json:
        # the printed summary carries the measured seconds (the plan file stays deterministic
        # unless --record-timings)
        shown_summary = dict(summary)
        shown_summary["solver"] = {**summary["solver"], "seconds": round(res.solution.seconds, 6)}
        shown_summary["plan_seconds"] = round(res.seconds, 6)
        doc = {"summary": shown_summary, "nodes": res.plan["nodes"]}
        if explain:
            doc["explain"] = res.plan["explain"]
        out.print_json(json.dumps(doc))
        return
    t = Table(title=escape(f"{g.name} @ {p.name} ({p.slots} slots)"))
    for col in ("node", "kernel", "params", "rotations", "pmul", "out layout"):
        t.add_column(col)
    for n in res.plan["nodes"]:
        ps = ", ".join(f"{k}={v}" for k, v in n["params"].items() if k in ("Pb", "Ps", "bs_opt", "search_space", "P_I", "P_O", "n1", "op"))
        t.add_row(escape(n["id"]), n["kernel"], ps, str(n["rotations"]), str(n.get("pmul", n["cost"]["pmul"])), escape(n["out_layout"]))
    out.print(t)
    _print_totals(summary, res.seconds)
    if "bootstraps" in summary:
        bt = summary.get("bootstrapping", {})
        ff = bt.get("first_fit", {})
        out.print(
            f"bootstraps {summary['bootstraps']} ({len(bt.get('values', []))} values; first fit on the same layouts: "
            f"{ff.get('bootstraps')})  scaled: {', '.join(f'{k} 1/{v}' for k, v in bt.get('scales', {}).items()) or 'none'}"
        )
        for w in bt.get("warnings", []):
            out.print(f"warning: {escape(w)}")
        _print_boot_variants(bt)
    out.print(
        "outputs: clean (zeros outside each output tensor)" if summary.get("clean_outputs")
        else "outputs: RAW (--raw-outputs): output ciphertexts may hold partial sums of the weights"
    )
    if "per_sample" in summary:
        ps = summary["per_sample"]
        sec = "-" if ps["seconds"] is None else f"{ps['seconds']:.4g} s"
        auto = summary.get("batch_auto")
        out.print(f"batch {summary['batch']}: per sample {sec} modelled, {ps['rotations']:g} rotations"
                  + (f" (--batch auto over {', '.join(str(c['batch']) for c in auto['candidates'])})" if auto else ""))
    if explain:
        from api.show import explain_lines

        out.print("\n".join(explain_lines(res.plan["explain"])), markup=False, highlight=False)


def _on_off(option: str, value: str) -> bool:
    if value not in ("on", "off"):
        raise SlotplanError(f"option {option}: expected on or off, got {value!r}")
    return value == "on"


def _print_boot_variants(bootstrapping: dict[str, Any]) -> None:
    """Each bootstrap's variant and its modelled saving (issue 36; plans that offered variants)."""
    from planner.report.explain import boot_variant_lines

    for line in boot_variant_lines(bootstrapping):
        out.print(escape(line))


def _batch_option(value: str | None) -> int | str | None:
    """``--batch``: a positive number of samples or ``auto``."""
    if value is None or value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise SlotplanError(f"option --batch: expected a positive number of samples or 'auto', got {value!r}")
    return n


def _graph_or_model(path: Path, calibrate: Path | None, degree: int | None, max_error: float | None,
                    weights_out: Path | None, graph_out: Path | None, cut: list[str] | None = None,
                    allow_error: bool = False) -> Any:
    """``plan``'s graph: a graph file, or an ONNX model imported (its report on stderr)."""
    from api.commands_import import import_for_plan, is_onnx
    from planner.frontend.graph import load_graph

    if is_onnx(path):
        return import_for_plan(path, calibrate, degree, max_error, weights_out, graph_out, err, cut, allow_error)
    given = [n for n, v in (("--calibrate", calibrate), ("--degree", degree), ("--max-error", max_error),
                            ("--weights-out", weights_out), ("--graph-out", graph_out),
                            ("--output (the plan file is -o)", cut or None),
                            ("--allow-error", allow_error or None)) if v is not None]
    if given:
        raise SlotplanError(f"{', '.join(given)}: only for an ONNX model (MODEL.onnx), not a graph file")
    return load_graph(path)


@app.command()
def run(
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN", help="plan file")],
    tables: Annotated[Path | None, typer.Option("--tables", help="npz tables (regenerated from the plan if absent)")] = None,
    backend: Annotated[str, typer.Option("--backend", help=EXECUTION_BACKENDS.help())] = "sim",
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**32 - 1, help="random seed, 0..2**32-1")] = 0,
    init: Annotated[str, typer.Option("--init", help="weights: fan-in (divided by sqrt(fan-in), keeps CKKS values in range) | uniform [-1,1)")] = "fan-in",
    as_json: Annotated[bool, typer.Option("--json")] = False,
    progress: Annotated[bool, typer.Option("--progress", help="progress on stderr even when it is not a terminal")] = False,
    inputs: Annotated[Path | None, typer.Option("--inputs", help="the encrypted inputs: .npz with one array per graph input, named as the tensor (any shape with its number of elements)")] = None,
    weights: Annotated[Path | None, typer.Option("--weights", help="the weights: .npz with one array per graph weight, named as the tensor")] = None,
    out_file: Annotated[Path | None, typer.Option("--out", help="write the decrypted outputs (.npz, named and shaped as the graph's outputs)")] = None,
) -> None:
    """Execute a plan on seeded random data (or the user's --inputs/--weights) and compare
    with the numpy reference."""
    from api.progress import shown, step, wanted
    from backends.lattigo_backend import LattigoError
    from backends.runner import run_plan
    from planner.frontend.graph import parse_graph
    from planner.ir.io import user_values, write_arrays

    try:
        EXECUTION_BACKENDS.check(backend)
        pl = load_plan(plan_file)
        tb = load_tables(tables, pl) if tables is not None else None
        if init not in ("fan-in", "uniform"):
            raise SlotplanError(f"unknown --init {init!r}; known: fan-in, uniform")
        values = None
        if inputs is not None or weights is not None:
            if "spec" not in pl["graph"]:
                raise SlotplanError("the plan does not embed its graph (graph.spec): cannot read tensors by name")
            values = user_values(parse_graph(pl["graph"]["spec"]), inputs, weights,
                                 samples="batch" in pl.get("summary", {}))
        if out_file is not None and (out_file.is_dir() or not (out_file.parent if str(out_file.parent) else Path(".")).is_dir()):
            raise SlotplanError(f"cannot write --out {out_file}: not a file in an existing directory")
        with shown(wanted(progress, as_json)), step(f"run on {backend}"):
            rep = run_plan(pl, tb, backend, seed, init, values=values)
        if out_file is not None:
            write_arrays(out_file, rep.outputs)
    except SlotplanError as e:
        raise _fail(e) from None
    except LattigoError as e:  # the backend failed on a valid plan: one line, exit 1
        raise ExitError(f"lattigo: {e}", 1) from None
    if as_json:
        out.print_json(json.dumps(rep.to_json()))
    else:
        status = "[green]OK[/green]" if rep.ok else "[red]FAILED[/red]" if rep.domain_exits else "[red]MISMATCH[/red]"
        out.print(
            f"{status} backend={rep.backend} max_abs_error={rep.max_abs_error:.3e} "
            f"max_rel_error={rep.max_rel_error:.3e} (tolerance {rep.tolerance:g})"
        )
        ops = ", ".join(f"{k} {v}" for k, v in sorted(rep.counts.items()))
        out.print(f"ops: {ops}")
        out.print(
            f"rotations {rep.rotations}  key loads {rep.key_loads}  "
            f"peak resident keys {rep.peak_resident_key_bytes / 2**20:.1f} MiB  time {rep.seconds:.3f}s"
        )
        if rep.bootstraps.get("count"):
            b = rep.bootstraps
            each = f"  {b['mean_seconds']:.2f}s each" if "mean_seconds" in b else ""
            out.print(f"bootstraps {b['count']}{each}")
        evs = rep.stats.get("evaluations") or []
        if any(e["matrices_built"] or e["matrices_reused"] for e in evs):  # setup, apart (bootstate.go)
            out.print("DFT matrices: " + "; ".join(
                f"evaluation {i + 1} " + (f"encoded them {e['boot_matrix_seconds']:.2f}s (eval {e['eval_seconds']:.2f}s, "
                                          f"{e['eval_seconds_without_matrices']:.2f}s without)" if e["matrices_built"]
                                          else f"reused them (eval {e['eval_seconds']:.2f}s)") for i, e in enumerate(evs)))
        mem = rep.memory
        if mem.get("modelled_peak_bytes") and (mem.get("peak_rss_bytes") or mem.get("peak_tracked_bytes")):
            parts = [f"modelled peak {mem['modelled_peak_bytes'] / 2**20:.1f} MiB"]
            if mem.get("peak_tracked_bytes"):
                parts.append(f"tracked {mem['peak_tracked_bytes'] / 2**20:.1f} MiB (x{mem['tracked_over_model']:.3f})")
            if mem.get("peak_rss_bytes"):
                parts.append(
                    f"peak RSS {mem['peak_rss_bytes'] / 2**20:.1f} MiB (x{mem['rss_over_model']:.3f}; "
                    f"{mem.get('rss_start_bytes', 0) / 2**20:.1f} MiB at start)"
                )
            out.print("memory: " + "  ".join(parts))
        if rep.stats:
            out.print(f"backend stats: {json.dumps(rep.stats, sort_keys=True)[:2000]}")
        if out_file is not None:
            out.print(escape(f"wrote {out_file}: {', '.join(rep.outputs)}"))
    if not rep.ok:
        raise ExitError(rep.failure() or "run failed", 1)


@app.command()
def bench(
    suite: Annotated[Path, typer.Argument(help="suite file (data/suites/*.json)")],
    params: Annotated[str | None, typer.Option("--params", help="override the suite's preset")] = None,
    sim: Annotated[bool, typer.Option("--sim/--no-sim", help="also run the IMRA plans in the simulator")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON line per workload")] = False,
    progress: Annotated[bool, typer.Option("--progress", help="progress on stderr even when it is not a terminal")] = False,
) -> None:
    """Our plans vs the paper's MKR / FHELIPE / BSGS numbers and the baselines."""
    from api.bench import run_suite
    from api.progress import shown, wanted

    rows: list[dict[str, Any]] = []
    try:
        with shown(wanted(progress, as_json)):
            for row in run_suite(suite, params, sim):
                rows.append(row)
                if as_json:
                    print(json.dumps(row, sort_keys=True), flush=True)
    except SlotplanError as e:
        raise _fail(e) from None
    if as_json:
        return
    if rows and rows[0].get("kind") in ("graph", "conversion") or any(r.get("kind") for r in rows):
        _print_graph_bench(rows, suite.name, sim)
        return
    t = Table(title=f"bench {suite.name}")
    cols = ["kernel", "IMRA rot", "MKR(paper)", "Pb,Ps,bs,ss", "T8", "best", "bsgs", "hs-diag", "fhelipe",
            "FHELIPE(p)", "BSGS(p)", "util", "plan s"]
    if sim:
        cols.append("sim err")
    for c in cols:
        t.add_column(c)
    for r in rows:
        ip = r["imra"]["params"]
        bl = r["baselines"]
        cells = [
            r["workload"], str(r["imra"]["rotations"]), str(r["paper"].get("MKR")),
            f"{ip['Pb']},{ip['Ps']},{ip['bs_opt']},{ip['search_space']}",
            "yes" if r["table8_match"] else "NO" if r["table8_match"] is False else "-",
            f"{r['best']['kernel']}:{r['best']['rotations']}",
            str(bl.get("bsgs", {}).get("rotations", "-")), str(bl.get("hs-diagonal", {}).get("rotations", "-")),
            str(bl.get("fhelipe", {}).get("rotations", "-")),
            str(r["paper"].get("FHELIPE", "-")), str(r["paper"].get("BSGS") or "-"),
            f"{r['imra']['slot_utilization']:.1%}", f"{r['imra_seconds']:.2f}",
        ]
        if sim:
            cells.append(f"{r['sim']['max_rel_error']:.1e}")
        t.add_row(*cells)
    out.print(t)


def _print_graph_bench(rows: list[dict[str, Any]], name: str, sim: bool) -> None:
    t = Table(title=f"bench {name}")
    for c in ("workload", "params", "rotations", "paper", "cmul", "depth", "input cts", "exact obj",
              "greedy obj (rot)", "status", "plan s") + (("sim err",) if sim else ()):
        t.add_column(c)
    for r in rows:
        paper = ", ".join(f"{k}={v}" for k, v in r.get("paper", {}).items())
        if r["kind"] == "conversion":
            t.add_row(escape(r["workload"]), "-", str(r["rotations"]), paper, "-", "-", "-", "-", "-",
                      r["conversion"], f"{r['seconds']:.2f}", *(("-",) if sim else ()))
            continue
        gr = r.get("greedy")
        cells = [
            escape(r["workload"]), r["params"], str(r["rotations"]), paper, str(r["cmul"]), str(r["depth"]),
            ",".join(f"{k}:{v}" for k, v in r["input_cts"].items()), str(r["objective"]),
            f"{gr['objective']} ({gr['rotations']})" if gr else "-", r["status"], f"{r['seconds']:.2f}",
        ]
        if sim:
            cells.append(f"{r['sim']['max_rel_error']:.1e}" if "sim" in r else "-")
        t.add_row(*cells)
    out.print(t)


def _register_extensions() -> None:
    """Commands that live in their own modules (batch, diff, serve, show, calibrate, ...)."""
    import importlib

    for mod in ("api.commands_ops", "api.commands_keys", "api.commands_lattigo", "api.commands_import",
                "api.commands_inference", "api.commands_accuracy"):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
            continue
        m.register(app)


_register_extensions()

_COMMAND: dict[tuple[int, int], Any] = {}


def command() -> Any:
    """The click command tree typer builds from ``app``: built once per process (typer's
    ``app()`` rebuilds it at every call, ~0.15 s of signature inspection), so in-process
    callers (the Python facade, tests) pay it once.  Keyed by the registered commands and
    groups, so a command registered later is seen."""
    key = (len(app.registered_commands), len(app.registered_groups))
    if key not in _COMMAND:
        _COMMAND.clear()
        _COMMAND[key] = typer.main.get_command(app)
    return _COMMAND[key]


def main() -> None:
    try:
        command()(standalone_mode=False)
    except ExitError as e:
        if e.code != 1 or str(e):
            err.print(f"slotplan: {e}", highlight=False, markup=False, soft_wrap=True)
        sys.exit(e.code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err.print("slotplan: aborted")
        sys.exit(130)
    except Exception as e:  # click usage errors and the like (typer vendors its own click)
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            err.print(f"slotplan: {e.format_message()}", markup=False)
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
