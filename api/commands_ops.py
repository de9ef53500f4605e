"""Operations commands of the CLI: ``batch``, ``diff``, ``serve``, ``show``, ``golden``.

Registered into ``api.cli.app`` by :func:`register`.  Exit statuses follow
``api.common``: 0 success; 1 a regression (``diff --fail-on-regression``, ``golden``) or
a graph of a batch failed; 2 bad input (one line on stderr).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Annotated, Any

import typer

from api.common import ExitError, err, fail, request_id
from common.errors import SlotplanError
from planner.frontend.params import Params
from planner.pipeline import PlanOptions
from solver import SOLVER_BACKENDS

BATCH_SCHEMA = "slotplan.batch/1"


# --------------------------------------------------------------------------------------
# batch
# --------------------------------------------------------------------------------------


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def batch_key(graph_sha256: str, params_json: Mapping[str, Any], options_json: Mapping[str, Any]) -> str:
    """Resume key of one batch line: what was planned, with which params and options."""
    return hashlib.sha256(
        _canonical({"graph": graph_sha256, "params": params_json, "options": options_json})
    ).hexdigest()


def batch_worker(graph_json: dict[str, Any], params: Params | None, options: PlanOptions) -> dict[str, Any]:
    """Plan one graph (in a worker process); never raises: failures become the line.
    ``params`` None: ``--params auto``, chosen per graph as ``plan`` does."""
    from api.rest import check_memory_cap
    from planner.frontend.graph import parse_graph
    from planner.pipeline import PlanTimeout, auto_params, plan_graph
    from planner.report.diff import node_digest, strip_timings

    t0 = time.perf_counter()
    line: dict[str, Any] = {"status": "error", "error": None, "summary": None, "nodes": []}
    try:
        graph = parse_graph(graph_json)
        if params is None:
            params = auto_params(graph, options)
            line["params_chosen"] = params.name
        res = plan_graph(graph, params, options)
        check_memory_cap(res.plan)
        line.update(
            status="ok",
            summary=strip_timings(res.plan["summary"]),
            nodes=[node_digest(n) for n in res.plan["nodes"]],
            timing={"plan_seconds": round(res.seconds, 6), "solver_seconds": round(res.solution.seconds, 6)},
        )
    except PlanTimeout as e:
        line.update(status="timeout", error=" ".join(str(e).split()))
    except SlotplanError as e:
        line.update(status="error", error=" ".join(str(e).split()))
    except MemoryError:
        line.update(status="error", error="out of memory while planning")
    except Exception as e:  # a planner bug must not stop the batch: record it
        line.update(status="error", error=f"internal error: {type(e).__name__}: {' '.join(str(e).split())}"[:2000])
    line.setdefault("timing", {"plan_seconds": round(time.perf_counter() - t0, 6)})
    return line


@dataclass
class BatchItem:
    path: Path
    key: str
    line: dict[str, Any]  # the deterministic part known before planning
    graph_json: dict[str, Any] | None = None  # None: invalid graph, line is final


@dataclass
class BatchStats:
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)


def expand_paths(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(q for q in p.glob("*.json") if q.is_file())
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise SlotplanError(f"{p}: no such file or directory")
    files = list(dict.fromkeys(files))
    if not files:
        raise SlotplanError("no graph files (*.json) found in " + ", ".join(str(p) for p in paths))
    return files


def read_done_keys(out: Path | None) -> set[str]:
    """Keys already planned in a results file (a crashed worker's line is retried)."""
    done: set[str] = set()
    if out is None or not out.exists():
        return done
    try:
        text = out.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SlotplanError(f"results file {out}: cannot read ({e})") from None
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue  # e.g. a line cut short by an interrupted run
        if isinstance(obj, dict) and isinstance(obj.get("key"), str) and obj.get("status") != "crash":
            done.add(obj["key"])
    return done


def prepare_items(files: list[Path], params_json: dict[str, Any], options_json: dict[str, Any],
                  params_name: str) -> list[BatchItem]:
    from planner.frontend.graph import load_graph

    items: list[BatchItem] = []
    for f in files:
        base = {"schema": BATCH_SCHEMA, "path": str(f), "params": params_name, "options": options_json}
        try:
            if f.suffix.lower() == ".onnx":
                raise SlotplanError(f"{f} is an ONNX model: batch plans graph files (slotplan.graph/1 JSON); "
                                    f"import it first: slotplan import {f} -o GRAPH.json --weights-out W.npz")
            g = load_graph(f)
        except SlotplanError as e:
            try:
                digest = hashlib.sha256(f.read_bytes()).hexdigest()
            except OSError:
                digest = hashlib.sha256(str(f).encode()).hexdigest()
            key = batch_key("file:" + digest, params_json, options_json)
            line = {**base, "key": key, "graph": {"name": f.stem, "sha256": None, "file_sha256": digest},
                    "status": "error", "error": " ".join(str(e).split()), "summary": None, "nodes": []}
            items.append(BatchItem(f, key, line))
            continue
        key = request_id(g.to_json(), params_json, options_json)  # the REST plan id of the same request
        line = {**base, "key": key, "graph": {"name": g.name, "sha256": g.sha256}}
        items.append(BatchItem(f, key, line, g.to_json()))
    return items


def _pool(jobs: int) -> ProcessPoolExecutor:
    ctx = multiprocessing.get_context("forkserver" if os.name == "posix" else "spawn")
    return ProcessPoolExecutor(max_workers=jobs, mp_context=ctx)


def run_batch_items(
    items: list[BatchItem],
    params: Params | None,
    options: PlanOptions,
    jobs: int,
) -> Iterator[tuple[BatchItem, dict[str, Any]]]:
    """Plan items in a process pool, yielding (item, line) as they finish.  At most
    ``jobs`` graphs are in flight, so a worker that dies takes only those with it; they
    are recorded with status ``crash`` (retried by a resumed run) and a fresh pool goes on."""
    queue = list(items)
    pool = _pool(jobs)
    running: dict[Future[dict[str, Any]], BatchItem] = {}
    try:
        while queue or running:
            while queue and len(running) < jobs:
                it = queue.pop(0)
                if it.graph_json is None:
                    yield it, dict(it.line)
                    continue
                fut = pool.submit(batch_worker, it.graph_json, params, options)
                running[fut] = it
            if not running:
                continue
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            broken = False
            for fut in done:
                it = running.pop(fut)
                try:
                    result = fut.result()
                except BrokenProcessPool:
                    broken = True
                    result = {"status": "crash", "error": "the worker process died (out of memory?)",
                              "summary": None, "nodes": []}
                except Exception as e:  # pickling problems and the like
                    result = {"status": "error", "error": f"internal error: {type(e).__name__}: {e}",
                              "summary": None, "nodes": []}
                yield it, {**it.line, **result}
            if broken:
                for fut, it in list(running.items()):
                    running.pop(fut)
                    yield it, {**it.line, "status": "crash", "error": "the worker pool broke while planning",
                               "summary": None, "nodes": []}
                pool.shutdown(wait=False, cancel_futures=True)
                pool = _pool(jobs)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def run_batch_items_ray(
    items: list[BatchItem],
    params: Params | None,
    options: PlanOptions,
    jobs: int,
    address: str | None = None,
) -> Iterator[tuple[BatchItem, dict[str, Any]]]:
    """The same as :func:`run_batch_items` on Ray (a local Ray with ``jobs`` CPUs when no
    address is given).  Results stream as tasks finish; a task whose worker crashed or ran
    out of memory is recorded with status ``crash`` (retried by a resumed run)."""
    try:
        import ray
        from ray import exceptions as rex
    except ImportError:
        raise SlotplanError("--engine ray needs ray, an optional dependency: pip install 'slotplan[ray]'") from None
    started = False
    if not ray.is_initialized():
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False)
        except Exception as e:  # connection refused, bad address, ...
            raise SlotplanError(f"cannot start or reach Ray{f' at {address}' if address else ''}: "
                                f"{' '.join(str(e).split())[:300]}") from None
        started = True
    crashed = (rex.WorkerCrashedError, rex.OutOfMemoryError, rex.NodeDiedError, rex.TaskCancelledError)
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(batch_worker)
        queue = list(items)
        running: dict[Any, BatchItem] = {}
        while queue or running:
            while queue and len(running) < 2 * jobs:
                it = queue.pop(0)
                if it.graph_json is None:
                    yield it, dict(it.line)
                    continue
                running[remote.remote(it.graph_json, params, options)] = it
            if not running:
                continue
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                it = running.pop(ref)
                try:
                    result = ray.get(ref)
                except crashed as e:
                    result = {"status": "crash", "error": f"the Ray worker died ({type(e).__name__})",
                              "summary": None, "nodes": []}
                except rex.RayError as e:
                    result = {"status": "error", "error": f"internal error: {' '.join(str(e).split())[:500]}",
                              "summary": None, "nodes": []}
                yield it, {**it.line, **result}
    finally:
        if started:
            ray.shutdown()


def _write_line(fh: IO[str], line: Mapping[str, Any]) -> None:
    ordered = {k: line[k] for k in ("schema", "key", "path", "graph", "params", "options", "status", "error",
                                    "summary", "nodes") if k in line}
    ordered.update({k: v for k, v in line.items() if k not in ordered})
    fh.write(json.dumps(ordered, sort_keys=False, allow_nan=False) + "\n")
    fh.flush()


def batch(
    paths: Annotated[list[Path], typer.Argument(metavar="PATH...", help="graph files or directories of *.json graphs")],
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, max=64, help="parallel planning processes")] = 2,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="results file (JSON lines, appended; resumable)")] = None,
    params: Annotated[str, typer.Option("--params", help="preset n12..n16 or a JSON file")] = "n16",
    time_limit: Annotated[float, typer.Option("--time-limit", help="solver time limit per graph, seconds")] = 10.0,
    solver: Annotated[str, typer.Option("--solver", help=SOLVER_BACKENDS.help())] = "cpsat",
    memory_cap: Annotated[str | None, typer.Option("--memory-cap", help="bound on the modelled process memory of a Lattigo run (plan + executor state + bootstrap garbage; not the process baseline, ~62 MiB + plan): bytes, or with KiB/MiB/GiB")] = None,
    input_layout: Annotated[str, typer.Option("--input-layout", help="free | row-major")] = "free",
    kernels: Annotated[str | None, typer.Option("--kernels", help="allowed kernels, comma-separated")] = None,
    allow_insecure: Annotated[bool, typer.Option("--allow-insecure", help="accept custom params above the 128-bit bound")] = False,
    engine: Annotated[str, typer.Option("--engine", help="local (process pool) | ray")] = "local",
    address: Annotated[str | None, typer.Option("--address", help="Ray cluster address (default: start a local Ray)")] = None,
) -> None:
    """Plan many graphs in parallel: one JSON line per graph (resumable with --out)."""
    from pydantic import ValidationError
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner.frontend.params import AUTO, load_params
    from planner.ir.io import parse_size
    from planner.pipeline import PlanOptionsLiteral

    try:
        if engine not in ("local", "ray"):
            raise SlotplanError(f"unknown engine {engine!r}; known engines: local, ray")
        if address is not None and engine != "ray":
            raise SlotplanError("--address needs --engine ray")
        files = expand_paths(paths)
        p = load_params(params) if params != AUTO else None  # auto: per graph, as plan --params auto
        SOLVER_BACKENDS.check(solver)
        lit = PlanOptionsLiteral(
            solver=solver,
            time_limit_s=time_limit,
            memory_cap_bytes=parse_size(memory_cap) if memory_cap is not None else None,
            kernels=[k.strip() for k in kernels.split(",") if k.strip()] if kernels else None,
            input_layout=input_layout,  # type: ignore[arg-type]
            allow_insecure=allow_insecure,
        )
        options = PlanOptions.from_literal(lit)
        from planner.frontend.params import check_security

        if p is not None:
            check_security(p, allow_insecure)  # refuse before any graph is planned
        options_json = options.to_json()
        params_json: dict[str, Any] = p.to_json() if p is not None else {"auto": True}
        done = read_done_keys(out)
        items = prepare_items(files, params_json, options_json, p.name if p is not None else AUTO)
    except ValidationError as e:
        first = e.errors()[0]
        raise fail(ValueError(f"option {'.'.join(str(x) for x in first['loc'])}: {first['msg']}")) from None
    except SlotplanError as e:
        raise fail(e) from None
    stats = BatchStats()
    todo = [it for it in items if it.key not in done]
    stats.skipped = len(items) - len(todo)
    t0 = time.perf_counter()
    fh: IO[str]
    if out is not None:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            needs_newline = out.exists() and out.stat().st_size > 0 and not out.read_bytes().endswith(b"\n")
            fh = out.open("a", encoding="utf-8")
        except OSError as e:
            raise fail(SlotplanError(f"results file {out}: {e.strerror or e}")) from None
        if needs_newline:
            fh.write("\n")
    else:
        fh = sys.stdout
    progress = Progress(
        TextColumn("[bold]batch"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=err,
        transient=False,
    )
    try:
        with progress:
            task = progress.add_task("", total=len(todo), status="")
            runner = (run_batch_items(todo, p, options, jobs) if engine == "local"
                      else run_batch_items_ray(todo, p, options, jobs, address))
            for it, line in runner:
                _write_line(fh, line)
                if line["status"] == "ok":
                    stats.ok += 1
                else:
                    stats.failed += 1
                    stats.failures.append(f"{it.path}: {line['status']}: {line.get('error')}")
                progress.update(
                    task, advance=1, description=str(it.path.name),
                    status=f"[green]{stats.ok} ok[/green] [red]{stats.failed} failed[/red]",
                )
    except SlotplanError as e:
        raise fail(e) from None
    finally:
        if fh is not sys.stdout:
            fh.close()
    secs = time.perf_counter() - t0
    where = f" -> {out}" if out is not None else ""
    err.print(
        f"batch: {len(todo)} planned ({stats.ok} ok, {stats.failed} failed), {stats.skipped} skipped "
        f"(already in the results file) in {secs:.1f}s{where}",
        highlight=False,
    )
    for f in stats.failures[:20]:
        err.print(f"  {f}", highlight=False, markup=False)
    if stats.failed:
        raise ExitError(f"batch: {stats.failed} of {len(todo)} graphs failed", 1)


# --------------------------------------------------------------------------------------
# diff
# --------------------------------------------------------------------------------------


def diff(
    base: Annotated[Path, typer.Argument(help="plan file, golden digest or batch results (JSON lines)")],
    head: Annotated[Path, typer.Argument(help="plan file, golden digest or batch results (JSON lines)")],
    fmt: Annotated[str, typer.Option("--format", help="md | json")] = "md",
    fail_on_regression: Annotated[bool, typer.Option("--fail-on-regression",
                                                     help="exit 1 when rotations, key loads or peak memory grow")] = False,
) -> None:
    """Plan-diff report between two plans or two batch results."""
    from planner.report.diff import diff_files, render_markdown

    if fmt not in ("md", "json"):
        raise fail(SlotplanError(f"unknown format {fmt!r}; known formats: md, json"))
    try:
        report = diff_files(base, head)
    except SlotplanError as e:
        raise fail(e) from None
    if fmt == "md":
        sys.stdout.write(render_markdown(report))
    else:
        sys.stdout.write(json.dumps(report.to_json(), indent=1) + "\n")
    sys.stdout.flush()
    if fail_on_regression and report.regressed:
        raise ExitError(f"{len(report.regressions)} regression(s): " + "; ".join(report.regressions[:3]), 1)


# --------------------------------------------------------------------------------------
# serve
# --------------------------------------------------------------------------------------


def serve(
    host: Annotated[str, typer.Option("--host", help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 8000,
    db: Annotated[Path | None, typer.Option("--db", help="SQLite plan store (default $SLOTPLAN_DB or the user cache)")] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, max=64, help="planning worker processes")] = 2,
    max_time_limit: Annotated[float, typer.Option("--max-time-limit", help="largest time_limit_s a request may ask")] = 30.0,
    max_body: Annotated[str, typer.Option("--max-body", help="largest request body")] = "8MiB",
    max_table_bytes: Annotated[str, typer.Option("--max-table-bytes", help="largest tables download")] = "512MiB",
    api_keys: Annotated[Path | None, typer.Option("--api-keys", help="file with one API key per line (default $SLOTPLAN_API_KEYS_FILE); required when --host is not loopback")] = None,
    allowed_hosts: Annotated[str | None, typer.Option("--allowed-hosts", help="comma-separated Host names served (default: loopback names and --host)")] = None,
    rate_limit: Annotated[int, typer.Option("--rate-limit", min=0, help="requests per minute per API key (or client address); 0: unlimited")] = 600,
    request_timeout: Annotated[float, typer.Option("--request-timeout", help="wall-time limit of one planning job, seconds (candidates, solve, lowering)")] = 120.0,
    worker_memory: Annotated[str, typer.Option("--worker-memory", help="resident memory limit of one planning worker")] = "3GiB",
    max_work: Annotated[int, typer.Option("--max-work", min=1, help="largest planning work of a graph (slot blocks per node summed)")] = 20_000,
    admin_keys: Annotated[Path | None, typer.Option("--admin-keys", help="file with admin API keys (one per line): they may list every key's plans (GET /v1/plans?all=true) and read or delete any")] = None,
    trust_proxy: Annotated[str | None, typer.Option("--trust-proxy", help="address of the reverse proxy whose X-Forwarded-For names the client (default: the header is ignored)")] = None,
    auth_fail_limit: Annotated[int, typer.Option("--auth-fail-limit", min=0, help="failed authentications per minute per client address before 429; 0: unlimited")] = 10,
    worker_idle_memory: Annotated[str, typer.Option("--worker-idle-memory", help="a planning worker holding more than this after a job is replaced")] = "1GiB",
    eval_workers: Annotated[int, typer.Option("--eval-workers", min=1, max=64, help="evaluation worker processes (each keeps one plan, key set and weights warm)")] = 2,
    max_eval_keys: Annotated[str, typer.Option("--max-eval-keys", help="largest evaluation key upload (n14boot: 1.4 GB)")] = "4GiB",
    max_weights: Annotated[str, typer.Option("--max-weights", help="largest weights upload")] = "512MiB",
    max_ciphertext: Annotated[str, typer.Option("--max-ciphertext", help="largest ciphertext file to evaluate")] = "256MiB",
    eval_timeout: Annotated[float, typer.Option("--eval-timeout", help="wall-time limit of one evaluation, seconds")] = 600.0,
    eval_worker_idle: Annotated[float, typer.Option("--eval-worker-idle", help="an evaluation worker idle this many seconds is recycled")] = 300.0,
    eval_worker_memory: Annotated[str | None, typer.Option("--eval-worker-memory", help="cap on an evaluation worker's resident memory (default: the plan's process model with headroom)")] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="where uploaded keys and weights live (default: beside the plan store, DB.data/)")] = None,
    engine: Annotated[str, typer.Option("--engine", help="evaluation workers: local (processes) or ray (actors; the ray extra)")] = "local",
    address: Annotated[str | None, typer.Option("--address", help="with --engine ray: the Ray cluster (default: a local Ray with --eval-workers CPUs)")] = None,
) -> None:
    """REST service: POST /v1/plans, GET /v1/plans, GET /v1/plans/ID, GET /v1/plans/ID/tables,
    GET /v1/plans/ID/view, DELETE /v1/plans/ID, GET /v1/jobs/ID, POST /v1/diff, GET /healthz,
    /readyz, /metrics (docs/rest.md); private inference: POST /v1/plans/ID/keys, POST /v1/weights,
    POST /v1/plans/ID/evaluate, GET /v1/jobs/ID/result, DELETE /v1/keys/ID, /v1/weights/ID
    (docs/inference-service.md)."""
    from api.rest import RestLimits, default_allowed_hosts, is_loopback, read_api_keys
    from api.rest import serve as run_server
    from api.store import PlanStore
    from planner.ir.io import parse_size

    try:
        keys_file = api_keys or (Path(os.environ["SLOTPLAN_API_KEYS_FILE"])
                                 if os.environ.get("SLOTPLAN_API_KEYS_FILE") else None)
        keys = read_api_keys(keys_file) if keys_file is not None else frozenset()
        admins = read_api_keys(admin_keys) if admin_keys is not None else frozenset()
        keys = keys | admins
        if trust_proxy is not None:
            import ipaddress

            try:
                trust_proxy = str(ipaddress.ip_address(trust_proxy.strip("[]")))
            except ValueError:
                raise SlotplanError(f"--trust-proxy {trust_proxy!r}: an IP address (the proxy's)") from None
        if not is_loopback(host) and not keys:
            raise SlotplanError(f"--host {host} is not loopback: API keys are required (--api-keys FILE or "
                                "SLOTPLAN_API_KEYS_FILE)")
        hosts = (tuple(h.strip().lower() for h in allowed_hosts.split(",") if h.strip()) if allowed_hosts
                 else default_allowed_hosts(host, port))
        if request_timeout <= max_time_limit:
            raise SlotplanError(f"--request-timeout {request_timeout:g} must exceed --max-time-limit {max_time_limit:g}")
        limits = RestLimits(workers=workers, max_time_limit_s=max_time_limit, max_body_bytes=parse_size(max_body),
                            max_table_bytes=parse_size(max_table_bytes), api_keys=keys, allowed_hosts=hosts,
                            rate_limit_per_min=rate_limit or None, request_timeout_s=request_timeout,
                            worker_memory_bytes=parse_size(worker_memory), max_work=max_work,
                            admin_keys=admins, trust_proxy=trust_proxy, auth_fail_per_min=auth_fail_limit,
                            worker_idle_memory_bytes=parse_size(worker_idle_memory),
                            eval_workers=eval_workers, max_eval_keys_bytes=parse_size(max_eval_keys),
                            max_weights_bytes=parse_size(max_weights), max_ciphertext_bytes=parse_size(max_ciphertext),
                            eval_timeout_s=eval_timeout, eval_worker_idle_s=eval_worker_idle,
                            eval_worker_memory_bytes=parse_size(eval_worker_memory) if eval_worker_memory else None,
                            data_dir=str(data_dir) if data_dir is not None else None,
                            eval_engine="ray" if engine == "ray" else "local", ray_address=address)
        if engine not in ("local", "ray"):
            raise SlotplanError(f"--engine {engine!r}: local or ray")
        if address is not None and engine != "ray":
            raise SlotplanError("--address is for --engine ray")
        store = PlanStore(db)
    except SlotplanError as e:
        raise fail(e) from None
    err.print(f"slotplan: serving on http://{host}:{port} (plan store {store.path}, {workers} workers, "
              f"{'API keys required' if keys else 'no API keys'})", highlight=False, markup=False)
    run_server(host, port, store.path, limits)


# --------------------------------------------------------------------------------------
# show
# --------------------------------------------------------------------------------------


def show(
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN", help="plan file")],
    png: Annotated[Path | None, typer.Option("--png", help="write a PNG: cost per node, key residency, memory (with --layout: the layout pictures)")] = None,
    svg: Annotated[Path | None, typer.Option("--svg", help="the same picture as SVG")] = None,
    title: Annotated[str | None, typer.Option("--title", help="figure title")] = None,
    tables: Annotated[Path | None, typer.Option("--tables", help="the plan's npz tables (in/ and out/ slot maps)")] = None,
    layout: Annotated[list[str] | None, typer.Option("--layout", help="draw this layout: an input, a node id, conv/NODE/OPERAND, or 'all' (repeatable)")] = None,
    max_ct: Annotated[int, typer.Option("--max-ct", min=1, max=256, help="ciphertexts drawn per layout")] = 8,
    explain: Annotated[bool, typer.Option("--explain/--no-explain", help="runner-up per node (re-plans the embedded graph when the plan has no 'explain')")] = True,
    progress: Annotated[bool, typer.Option("--progress", help="progress on stderr even when it is not a terminal")] = False,
) -> None:
    """A plan at a glance: summary, cost per node, why each kernel, memory at the peak,
    tables by tensor and a legend; --png/--svg draw it, with --layout the slot layouts."""
    from api.progress import shown, wanted
    from api.show import layout_views, render_layouts, render_png, text_report
    from planner.ir.io import load_plan, load_tables
    from planner.report.explain import ExplainError, explain_choices, replan

    target = png
    try:
        for f, ext in ((png, ".png"), (svg, ".svg")):
            if f is not None and f.suffix.lower() != ext:
                raise SlotplanError(f"--{ext[1:]} {f}: the file name must end in {ext}")
        plan = load_plan(plan_file)
        for f in (png, svg):
            if f is not None and not f.parent.is_dir():
                raise SlotplanError(f"--{f.suffix[1:].lower()} {f}: directory {f.parent} does not exist")
            if f is not None and f.is_dir():
                raise SlotplanError(f"--{f.suffix[1:].lower()} {f}: is a directory")
        tb = load_tables(tables, plan) if tables is not None else None
        replanned = None
        note = ""
        ex = plan.get("explain")
        with shown(wanted(progress)):
            if (explain and ex is None) or layout:
                try:
                    replanned = replan(plan)
                except ExplainError as e:
                    note = str(e)
            if explain and ex is None and replanned is not None:
                ex = explain_choices(*replanned)
                note = "; re-derived by planning the embedded graph again"
        sys.stdout.write(text_report(plan, ex if explain else None, tb, note if explain else "not requested"))
        if layout:
            names = None if "all" in layout else list(dict.fromkeys(layout))
            views = layout_views(plan, names, tb, replanned)
            for target in (png, svg):
                if target is not None:
                    sys.stdout.write(f"wrote {render_layouts(views, target, max_ct=max_ct, title=title)}\n")
        else:
            for target in (png, svg):
                if target is not None:
                    sys.stdout.write(f"wrote {render_png(plan, target, title)}\n")
    except SlotplanError as e:
        raise fail(e) from None
    except (KeyError, TypeError, ValueError) as e:
        raise fail(SlotplanError(f"plan file {plan_file}: malformed ({type(e).__name__}: {e})")) from None
    except OSError as e:
        raise fail(SlotplanError(f"cannot write {target}: {e.strerror or e}")) from None


# --------------------------------------------------------------------------------------
# golden
# --------------------------------------------------------------------------------------


def golden(
    regenerate: Annotated[bool, typer.Option("--regenerate", help="rewrite data/golden/*.json from fresh plans")] = False,
    golden_dir: Annotated[Path | None, typer.Option("--dir", help="golden directory (default data/golden)")] = None,
    fmt: Annotated[str, typer.Option("--format", help="md | json (check mode)")] = "md",
) -> None:
    """Check fresh plans of the workloads against data/golden, or rewrite it with --regenerate.

    Check mode prints the Markdown diff and exits 1 on any difference."""
    from planner.report import golden as g
    from planner.report.diff import render_markdown

    d = golden_dir or g.GOLDEN_DIR
    try:
        if regenerate:
            for path in g.regenerate(d):
                sys.stdout.write(f"wrote {path}\n")
            return
        report = g.check(d)
    except SlotplanError as e:
        raise fail(e) from None
    sys.stdout.write(render_markdown(report) if fmt == "md" else json.dumps(report.to_json(), indent=1) + "\n")
    if report.changed:
        what = "regressed" if report.regressed else "changed (no regression)"
        raise ExitError(f"golden plans {what}; if intended, run `slotplan golden --regenerate`", 1)


def register(app: typer.Typer) -> None:
    app.command()(batch)
    app.command()(diff)
    app.command()(serve)
    app.command()(show)
    app.command()(golden)
