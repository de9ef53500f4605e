"""``slotplan keys`` (rewrite a plan with a rotation-key schedule) and ``slotplan keybench``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from api.common import fail, out
from common.errors import SlotplanError
from planner.ir import PLAN_SCHEMA
from planner.keys.basis import BASES
from planner.keys.residency import KEY_STRATEGIES, MERGE_WINDOW


def _mib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**20:.1f}"


def keys(
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN", help=f"plan file ({PLAN_SCHEMA})")],
    memory_cap: Annotated[str | None, typer.Option("--memory-cap", help="bytes, or with KiB/MiB/GiB (none: no cap)")] = None,
    strategy: Annotated[str, typer.Option("--strategy", help=KEY_STRATEGIES.help())] = "exact",
    max_keys: Annotated[int | None, typer.Option("--max-keys", help="rewrite rotations as chains over at most N keys")] = None,
    basis: Annotated[str, typer.Option("--basis", help=f"key basis for --max-keys: {' | '.join(BASES)}")] = "auto",
    key_levels: Annotated[bool, typer.Option("--key-levels/--no-key-levels", help="generate each key at the highest level it rotates")] = True,
    merge_window: Annotated[int, typer.Option("--merge-window", help="keymemrt: merge live ranges when the next use is within N operations")] = MERGE_WINDOW,
    prefetch: Annotated[int, typer.Option("--prefetch", help="keymemrt: load keys up to N operations early where the cap allows")] = 0,
    time_limit: Annotated[float, typer.Option("--time-limit", help="exact: solver time limit, seconds")] = 10.0,
    cross_check: Annotated[bool, typer.Option("--cross-check", help="exact: also solve small models with z3 and compare")] = False,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="plan file to write")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the schedule summary as JSON")] = False,
    progress: Annotated[bool, typer.Option("--progress", help="progress on stderr even when it is not a terminal")] = False,
) -> None:
    """Rewrite a plan with a rotation-key schedule (load_key/drop_key) under a memory cap."""
    from api.progress import shown, wanted
    from planner.ir.io import load_plan, parse_size, write_outputs
    from planner.keys.schedule import schedule_plan

    try:
        KEY_STRATEGIES.check(strategy)
        if basis not in BASES:
            raise SlotplanError(f"unknown key basis {basis!r}; known: {', '.join(BASES)}")
        if time_limit <= 0:
            raise SlotplanError(f"--time-limit must be positive, got {time_limit}")
        cap = parse_size(memory_cap) if memory_cap is not None else None
        plan = load_plan(plan_file)
        with shown(wanted(progress, as_json)):
            new, sched = schedule_plan(
                plan, cap, strategy, max_keys, basis=basis, key_levels=key_levels, merge_window=merge_window,
                prefetch=prefetch, time_limit_s=time_limit, cross_check=cross_check,
            )
        write_outputs(new, output, None, None)
    except SlotplanError as e:
        raise fail(e) from None
    s = new["summary"]
    if as_json:
        out.print_json(json.dumps({"summary": s, "keys": new["keys"]}))
        return
    pk = s["peak_bytes"]
    rot = f"{sched.rotations_before}->{sched.rotations}" if sched.rotations != sched.rotations_before else str(sched.rotations)
    out.print(
        f"keys {strategy}: cap {_mib(cap)} MiB  loads {sched.loads}  keys {sched.rotation_keys}  rotations {rot}  "
        f"peak {_mib(pk['total'])} MiB (keys {_mib(pk['keys'])})  min feasible cap {_mib(sched.min_cap_bytes)} MiB"
        + (f"  solver {sched.solver.get('status')}" if sched.solver else "")
        + (f"  -> {output}" if output else ""),
        highlight=False,
    )


def keybench(
    suite: Annotated[Path, typer.Argument(help="key suite file (data/suites/keymemrt.json)")],
    params: Annotated[str | None, typer.Option("--params", help="override every workload's preset")] = None,
    strategies: Annotated[str, typer.Option("--strategies", help="comma-separated")] = KEY_STRATEGIES.help(","),
    caps: Annotated[int, typer.Option("--caps", help="caps per workload, keep-all peak down to the smallest feasible")] = 6,
    key_levels: Annotated[bool, typer.Option("--key-levels/--no-key-levels")] = True,
    max_keys: Annotated[int | None, typer.Option("--max-keys", help="rewrite rotations over at most N keys first")] = None,
    time_limit: Annotated[float, typer.Option("--time-limit", help="exact: solver time limit per cap, seconds")] = 10.0,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON line per workload, then the summary")] = False,
    progress: Annotated[bool, typer.Option("--progress", help="progress on stderr even when it is not a terminal")] = False,
) -> None:
    """Per workload and cap: rotations, key loads and peak per strategy; geomean peak
    reduction vs keep-all (ANT-ACE) at <= 5% extra modelled time."""
    from api.keybench import run_key_suite, summarize_suite
    from api.progress import shown, wanted

    strats = [s.strip() for s in strategies.split(",") if s.strip()]
    results: list[dict[str, Any]] = []
    try:
        if caps < 1:
            raise SlotplanError(f"--caps must be at least 1, got {caps}")
        if time_limit <= 0:
            raise SlotplanError(f"--time-limit must be positive, got {time_limit}")
        with shown(wanted(progress, as_json)):
            for r in run_key_suite(suite, params, strats, caps, key_levels, time_limit, max_keys):
                results.append(r)
                if as_json:
                    print(json.dumps(r, sort_keys=True), flush=True)
                else:
                    _print_workload(r, strats)
    except SlotplanError as e:
        raise fail(e) from None
    summary = summarize_suite(results, strats)
    if as_json:
        print(json.dumps({"summary": summary}, sort_keys=True))
        return
    t = Table(title="geomean peak reduction vs keep-all (ANT-ACE, top-level keys) at <= 5% extra modelled time")
    t.add_column("strategy")
    t.add_column("geomean reduction")
    t.add_column("workloads meeting the time budget")
    for s in strats:
        g = summary[s]["geomean_reduction"]
        t.add_row(s, "-" if g is None else f"{g:.2f}x", f"{summary[s]['workloads']}/{summary[s]['of']}")
    out.print(t)
    out.print(
        "modelled time: planner.cost.timing (the preset's calibrated table: operations and fused blocks by level, "
        "bootstraps, prefetched key loads)", highlight=False,
    )


def _print_workload(r: dict[str, Any], strats: list[str]) -> None:
    b = r["baseline"]
    paper = r.get("paper") or {}
    ptxt = f"; paper: {paper.get('keys')} keys, {paper.get('key_memory_gb')} GB" if paper else ""
    t = Table(
        title=escape(
            f"{r['workload']} @ {r['params']}: {r['rotations']} rotations, {r['rotation_keys']} keys, depth {r['depth']}, "
            f"keep-all {_mib(b['peak_bytes'])} MiB, {b['time_ms'] / 1000:.2f} s{ptxt}"
        )
    )
    t.add_column("cap MiB")
    for s in strats:
        t.add_column(f"{s}\nrot/loads/peak MiB/time")
    by_cap: dict[int, dict[str, dict[str, Any]]] = {}
    for row in r["rows"]:
        by_cap.setdefault(row["cap"], {})[row["strategy"]] = row
    for cap in r["caps"]:
        cells = [_mib(cap)]
        for s in strats:
            row = by_cap.get(cap, {}).get(s)
            if row is None or not row["feasible"]:
                cells.append("infeasible")
            else:
                cells.append(
                    f"{row['rotations']}/{row['key_loads']}/{_mib(row['peak_bytes'])}/{row['time_ms'] / b['time_ms']:.3f}x"
                )
        t.add_row(*cells)
    best_cells = ["best <=5%"]
    for s in strats:
        bs = r["best"].get(s)
        best_cells.append("-" if bs is None else f"{bs['reduction']:.2f}x @ {_mib(bs['peak_bytes'])}")
    t.add_row(*best_cells)
    out.print(t)


def keycurve(
    suite: Annotated[Path, typer.Argument(help="key suite file (data/suites/keymemrt.json)")],
    params: Annotated[str | None, typer.Option("--params", help="override every workload's preset")] = None,
    fractions: Annotated[str, typer.Option("--fractions", help="caps as fractions of the keep-all peak, comma-separated")] = "1,0.75,0.5,0.25",
    low: Annotated[int, typer.Option("--low", help="more caps below the smallest fraction, down to the smallest feasible cap")] = 2,
    time_limit: Annotated[float, typer.Option("--time-limit", help="solver time limit per cap, seconds")] = 10.0,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON line per workload")] = False,
    progress: Annotated[bool, typer.Option("--progress", help="progress on stderr even when it is not a terminal")] = False,
) -> None:
    """The joint key strategy's trade-off curve per workload: cap -> rotations, key loads,
    hoisted splits, composed offsets, peak and modelled time against keep-all (ANT-ACE)."""
    from api.keybench import run_key_curve
    from api.progress import shown, wanted

    try:
        fr = [float(x) for x in fractions.split(",") if x.strip()]
        if not fr or any(not 0 < f <= 1 for f in fr):
            raise SlotplanError(f"--fractions must be numbers in (0, 1], got {fractions!r}")
        if low < 0:
            raise SlotplanError(f"--low must be non-negative, got {low}")
        if time_limit <= 0:
            raise SlotplanError(f"--time-limit must be positive, got {time_limit}")
        with shown(wanted(progress, as_json)):
            for r in run_key_curve(suite, params, fr, low, time_limit):
                if as_json:
                    print(json.dumps(r, sort_keys=True), flush=True)
                else:
                    _print_curve(r)
    except ValueError:
        raise fail(SlotplanError(f"--fractions must be comma-separated numbers, got {fractions!r}")) from None
    except SlotplanError as e:
        raise fail(e) from None


def _print_curve(r: dict[str, Any]) -> None:
    t = Table(title=escape(
        f"{r['workload']} @ {r['params']}: keep-all {_mib(r['keep_all_peak_bytes'])} MiB, smallest feasible cap "
        f"{_mib(r['min_feasible_cap'])} MiB (time model: {r['time_model']})"
    ))
    for c in ("cap MiB", "of keep-all", "strategy", "rotations", "loads", "splits", "composed", "peak MiB",
              "keys MiB", "time ms", "stall ms", "time vs keep-all"):
        t.add_column(c)
    for row in r["rows"]:
        if row.get("feasible") is False:
            t.add_row(_mib(row["cap"]), f"{row['fraction']:.2f}", row["strategy"], "infeasible", row["error"])
            continue
        t.add_row(
            _mib(row["cap"]), f"{row['fraction']:.2f}", row["strategy"], str(row["rotations"]), str(row["key_loads"]),
            str(row["hoisted_splits"]), str(row["composed"]), _mib(row["peak_bytes"]), _mib(row["peak_key_bytes"]),
            f"{row['time_ms']:.0f}", f"{row['stall_ms']:.0f}", f"{row['time_ratio']:.3f}x",
        )
    out.print(t)


def keymeasure(
    suite: Annotated[Path, typer.Argument(help="key suite file (data/suites/keymemrt.json)")],
    params: Annotated[str | None, typer.Option("--params", help="override every workload's preset")] = None,
    only: Annotated[str, typer.Option("--only", help="workload names, comma-separated (default: all)")] = "",
    fractions: Annotated[str, typer.Option("--fractions", help="caps as fractions of the keep-all peak")] = "0.5,0.25",
    time_limit: Annotated[float, typer.Option("--time-limit", help="solver time limit, seconds")] = 10.0,
    repeat: Annotated[int, typer.Option("--repeat", help="runs per plan (median evaluation time)")] = 1,
    no_plaintext_cache: Annotated[bool, typer.Option(
        "--no-plaintext-cache", help="encode each plaintext when read in every run (as run does) instead of once for all runs")] = False,
    workers: Annotated[int | None, typer.Option(
        "--workers", help="evaluation workers of the fused blocks (default GOMAXPROCS); the key reader is a goroutine "
                          "of its own, so GOMAXPROCS=2 with --workers 1 gives it a core while one core evaluates")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON line per workload")] = False,
    plans_out: Annotated[Path | None, typer.Option("--plans-out", help="write each measured plan into this folder")] = None,
) -> None:
    """Measure on Lattigo: keep-all (ANT-ACE) and the joint key schedule at caps of the
    keep-all peak; peak key bytes (key store), process RSS growth, evaluation and key-read
    time, against the model."""
    from api.lattigo_keys import geomean, measure_suite
    from backends.lattigo_backend import LattigoError

    try:
        fr = tuple(float(x) for x in fractions.split(",") if x.strip())
        if not fr or any(not 0 < f <= 1 for f in fr):
            raise SlotplanError(f"--fractions must be numbers in (0, 1], got {fractions!r}")
        names = [x.strip() for x in only.split(",") if x.strip()]
        results = []
        if not 1 <= repeat <= 100:
            raise SlotplanError(f"--repeat must be in 1..100, got {repeat}")
        if workers is not None and not 1 <= workers <= 64:
            raise SlotplanError(f"--workers must be in 1..64, got {workers}")
        for r in measure_suite(suite, params, fr, names, time_limit, repeat, plaintext_cache=not no_plaintext_cache,
                               workers=workers, plans_out=plans_out):
            results.append(r)
            if as_json:
                print(json.dumps(r, sort_keys=True), flush=True)
            else:
                _print_measure(r)
    except ValueError:
        raise fail(SlotplanError(f"--fractions must be comma-separated numbers, got {fractions!r}")) from None
    except (SlotplanError, LattigoError) as e:
        raise fail(SlotplanError(str(e))) from None
    if not as_json and results:
        for f in fr:
            rows = [x for r in results for x in r["runs"]
                    if x.get("requested_fraction", x["fraction"]) == f and x["strategy"] != "keep-all"]
            red = geomean([x["peak_reduction"] for x in rows])
            tr = geomean([x["time_ratio"] for x in rows])
            out.print(f"cap {f:g} x keep-all: geomean measured peak (RSS growth) reduction "
                      f"{'-' if red is None else f'{red:.2f}x'} at {'-' if tr is None else f'{tr:.3f}x'} time",
                      highlight=False)


def _print_measure(r: dict[str, Any]) -> None:
    t = Table(title=escape(f"{r['workload']} @ {r['params']} on Lattigo (time model: {r['time_model']})"))
    for c in ("run", "cap MiB", "keys MiB meas/model", "RSS growth MiB / process model (x)", "eval s", "vs keep-all",
              "key read s", "key wait s", "loads", "splits", "rel err"):
        t.add_column(c)
    for x in r["runs"]:
        t.add_row(
            x["strategy"] if x["cap"] is None else f"{x['fraction']:g} x keep-all"
            + (f" (asked {x['requested_fraction']:g}: smallest feasible)" if "requested_fraction" in x else ""),
            _mib(x["cap"]),
            f"{_mib(x['peak_key_bytes'])}/{_mib(x['model_key_bytes'])}",
            f"{_mib(x['rss_growth_bytes'])}/{_mib(x['model_process_growth_bytes'])} ({x['rss_vs_process_model']:.2f}x)",
            f"{x['eval_seconds']:.2f}",
            f"{x['time_ratio']:.3f}x", f"{x['key_load_seconds']:.2f}", f"{x['key_wait_seconds']:.2f}",
            str(x["key_loads"]), str(x["hoisted_splits"]), f"{x['max_rel_error']:.1e}",
        )
    out.print(t)


def register(app: typer.Typer) -> None:
    app.command(name="keys")(keys)
    app.command(name="keybench")(keybench)
    app.command(name="keycurve")(keycurve)
    app.command(name="keymeasure")(keymeasure)


__all__ = ["keybench", "keycurve", "keymeasure", "keys", "register"]
