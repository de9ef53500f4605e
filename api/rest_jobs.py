"""REST service: request validation and limits, planning jobs (run in the worker pool,
bounded by the request's wall limit), and the planning service (single flight, store)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from api.common import request_id
from api.rest_middleware import (
    Metrics,
)
from api.rest_models import (
    _COSTS_RE,
    API_VERSION,
    ApiError,
    ErrorBody,
    JobStatus,
    PlanRequest,
    RestLimits,
    _err,
    error_body,
)
from api.store import ANONYMOUS, PlanStore, owned_id
from api.workers import JobKilled, WorkerPool
from common.errors import ParamsError, SlotplanError
from planner.cost.tables import COST_TABLES
from planner.frontend.graph import Graph, parse_graph
from planner.frontend.params import AUTO, PRESETS, Params
from planner.pipeline import PlanOptions, PlanTimeout


@dataclass(frozen=True)
class ValidRequest:
    id: str
    graph: Graph
    params: Params | None  # None: "auto", chosen by the planning job
    options: PlanOptions
    canonical: dict[str, Any]


def check_memory_cap(plan: Mapping[str, Any]) -> None:
    """A plan whose modelled peak exceeds its memory cap is refused (as ``slotplan plan`` does)."""
    summary = plan["summary"]
    cap = summary.get("memory_cap_bytes")
    peak = summary["peak_bytes"]["total"]
    if cap is not None and peak > cap:
        scheduled = summary.get("key_loads", 0) > 0
        raise SlotplanError(
            f"modelled peak {peak} bytes exceeds memory_cap_bytes {cap} bytes"
            + ("" if scheduled else " and this plan has no key schedule (keep-all model)")
        )


def graph_work(graph: Graph, params: Params) -> int:
    """Planning work of a graph, in ciphertext-sized blocks: every node pays for the blocks
    of its operands and result (candidates, conversions and lowering grow with them), and a
    ct-ct matmul also for its m*k*n products (its kernels rotate per product block).  A
    chain of many small nodes and one huge node are both bounded by it."""
    S = params.slots
    work = 0
    for node in graph.nodes:
        shapes = [graph.shape(t) for t in node.inputs]
        out = graph.shape(node.id)
        w = 1 + sum(-(-_prod(sh) // S) for sh in shapes) + -(-_prod(out) // S)
        if node.op == "matmul" and sum(graph.encrypted(t) for t in node.inputs) == 2:
            a, b = shapes[0], shapes[1]
            w += -(-(_prod(a) * b[-1]) // S)
        work += w
    return work


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def validate_request(req: PlanRequest, limits: RestLimits) -> ValidRequest:
    raw = req.graph
    nodes = raw.get("nodes")
    tensors = raw.get("tensors")
    if isinstance(nodes, list) and len(nodes) > limits.max_nodes:
        raise _err(413, "too_large", f"graph has {len(nodes)} nodes, over the limit of {limits.max_nodes}",
                   field="nodes", rule=f"at most {limits.max_nodes} nodes")
    if isinstance(tensors, dict) and len(tensors) > limits.max_tensors:
        raise _err(413, "too_large", f"graph declares {len(tensors)} tensors, over the limit of {limits.max_tensors}",
                   field="tensors", rule=f"at most {limits.max_tensors} tensors")
    graph = parse_graph(raw)
    auto = req.params == AUTO
    if auto:
        # "auto" (as plan --params auto): the preset is chosen in the planning worker; the
        # limits below are checked at the largest preset without bootstrapping
        params = PRESETS["n16"]
    elif isinstance(req.params, str):
        if req.params not in PRESETS:
            raise ParamsError(f"unknown preset {req.params!r} (presets: {', '.join(PRESETS)}, auto; "
                              "or give an object)")
        params = PRESETS[req.params]
    else:
        params = Params.from_json(req.params)
    blocks = 0
    for name, t in graph.tensors.items():
        if t.size > limits.max_tensor_elements:
            raise _err(413, "too_large", f"tensor {name!r} has {t.size} elements, over the service limit of "
                       f"{limits.max_tensor_elements}", tensor=name, field="shape",
                       rule=f"at most {limits.max_tensor_elements} elements per tensor")
        blocks += -(-t.size // params.slots)
    if blocks > limits.max_slot_blocks:
        raise _err(413, "too_large", f"the graph's tensors fill {blocks} ciphertext-sized blocks at "
                   f"{params.slots} slots, over the service limit of {limits.max_slot_blocks}; use larger "
                   "params or the CLI", rule=f"at most {limits.max_slot_blocks} slot blocks")
    work = graph_work(graph, params)
    if work > limits.max_work:
        raise _err(413, "too_large", f"planning this graph is {work} units of work at {params.slots} slots, over "
                   f"the service limit of {limits.max_work}; split the graph, use larger params or the CLI",
                   field="limits.max_work", rule=f"at most {limits.max_work} work units (see graph_work)")
    lit = req.options
    if not _COSTS_RE.match(lit.costs) or lit.costs not in COST_TABLES:
        known = COST_TABLES.names()
        raise _err(422, "options", f"options.costs: unknown cost table {lit.costs!r}; known: {', '.join(known)}",
                   field="options.costs", rule="a cost table name")
    if lit.time_limit_s > limits.max_time_limit_s:
        raise _err(422, "options", f"options.time_limit_s: {lit.time_limit_s:g} s is over this service's limit of "
                   f"{limits.max_time_limit_s:g} s", field="options.time_limit_s",
                   rule=f"at most {limits.max_time_limit_s:g}")
    try:
        options = PlanOptions.from_literal(lit)
    except SlotplanError as e:
        raise _err(422, "options", f"options.kernels: {e}", field="options.kernels",
                   rule=getattr(e, "rule", str(e))) from None
    graph_json, options_json = graph.to_json(), options.to_json()
    params_json: dict[str, Any] = {"auto": True} if auto else params.to_json()
    canonical: dict[str, Any] = {"api": API_VERSION, "graph": graph_json, "params": params_json,
                                 "options": options_json}
    rid = request_id(graph_json, params_json, options_json)
    return ValidRequest(rid, graph, None if auto else params, options, canonical)


def progress_exceeded() -> type[Exception]:
    from common import progress

    return progress.DeadlineExceeded


def progress_deadline(wall_limit_s: float | None, started: float) -> Any:
    from common import progress

    return progress.deadline(wall_limit_s, started)


# --------------------------------------------------------------------------------------
# Jobs (run in the worker pool; plain functions of JSON so they pickle)
# --------------------------------------------------------------------------------------

JobResult = tuple[Literal["ok"], str, float] | tuple[Literal["error"], int, dict[str, Any]]


# Share of the request's wall limit the planner itself may use (candidates, solve,
# lowering, key schedule): the rest is for serialising and storing the plan, so a slow
# request ends with the planner's clear answer instead of a killed worker.
PLANNER_WALL_SHARE = 0.8


def plan_job(graph_json: dict[str, Any], params: Params | None, options: PlanOptions,
             wall_limit_s: float | None = None) -> JobResult:
    """Plan a validated request; returns ("ok", plan JSON, solver seconds) or ("error", status, body).
    ``params`` None: "auto" (the smallest secure preset that fits, else n16boot)."""
    from planner.pipeline import PlanWallTimeout, auto_params, plan_graph

    t0 = time.monotonic()
    try:
        graph = parse_graph(graph_json)
        if params is None:
            try:
                with progress_deadline(wall_limit_s, t0):
                    params = auto_params(graph, options)
            except progress_exceeded() as e:
                raise PlanWallTimeout(str(e)) from None
        res = plan_graph(graph, params, options, wall_limit_s=wall_limit_s, wall_started=t0)
        plan = res.plan
        check_memory_cap(plan)
        return "ok", json.dumps(plan, separators=(",", ":"), allow_nan=False), float(res.solution.seconds)
    except PlanWallTimeout as e:
        return "error", 413, {
            "error": "limit", "field": "limits.request_timeout_s",
            "rule": f"a request plans within {wall_limit_s:g} s of planner time",
            "message": f"{e}; the request is over the service's wall limit: split the graph or plan it "
                       "with the CLI"}
    except PlanTimeout:
        return "error", 422, {
            "error": "timeout", "field": "options.time_limit_s", "rule": "the solver must find a plan in time",
            "message": f"the solver found no plan within {options.time_limit_s:g} s; raise options.time_limit_s"}
    except SlotplanError as e:
        return "error", 422, error_body(e)
    except MemoryError:
        return "error", 413, {"error": "limit", "field": "limits.worker_memory_bytes",
                              "rule": "planning must fit the worker's memory",
                              "message": "planning this graph ran out of memory"}
    except ValueError as e:  # e.g. a non-finite number reached the plan
        return "error", 422, {"error": "plan", "message": f"cannot plan this request: {e}"}


def tables_job(plan_json: str, path: str, max_bytes: int) -> JobResult:
    """Regenerate the tables of a plan (deterministic re-planning) and write them as npz."""
    from backends.runner import regenerate_tables
    from planner.ir.builder import LazyTables
    from planner.ir.io import write_outputs

    try:
        plan = json.loads(plan_json)
        tables = regenerate_tables(plan)
        assert isinstance(tables, LazyTables)
        write_outputs(plan, None, tables, Path(path), max_bytes)
        return "ok", path, 0.0
    except SlotplanError as e:
        return "error", 409, {"error": "tables", "message": str(e)}


def page_job(plan_json: str, explain: dict[str, Any] | None) -> JobResult:
    """Render the plan page (with the explanations, computed here unless given): ("ok",
    JSON [html, explain]).  The page names the plan by a placeholder the service replaces
    with the id each owner sees."""
    from api.plan_page import PLAN_ID_PLACEHOLDER, render_page_and_explain

    try:
        plan = json.loads(plan_json)
        if explain is not None and "explain" not in plan:
            plan["explain"] = explain
        html, ex = render_page_and_explain(PLAN_ID_PLACEHOLDER, plan)
        return "ok", json.dumps([html, ex], separators=(",", ":"), allow_nan=False), 0.0
    except SlotplanError as e:
        return "error", 422, error_body(e)
    except MemoryError:
        return "error", 413, {"error": "limit", "field": "limits.worker_memory_bytes",
                              "rule": "rendering must fit the worker's memory",
                              "message": "rendering this page ran out of memory"}


def _warm_worker() -> None:
    import planner.pipeline  # noqa: F401  (import once per worker, not per request)


# The service
# --------------------------------------------------------------------------------------

PlanOutcome = tuple[int, dict[str, Any] | str]
MAX_JOBS = 100_000  # jobs remembered for GET /v1/jobs (oldest forgotten first)


class PlanService:
    def __init__(self, store: PlanStore, limits: RestLimits, metrics: Metrics | None = None):
        self.store = store
        self.limits = limits
        self.metrics = metrics or Metrics()
        self._pool: WorkerPool | None = None
        self._threads: ThreadPoolExecutor | None = None
        self._inflight: dict[str, asyncio.Task[PlanOutcome]] = {}
        # finished jobs that failed (a done job is its stored plan), bounded
        self._failed: dict[str, dict[str, Any]] = {}
        # owners waiting for an in-flight plan (by content id), and the jobs each owner was
        # given (its id -> (owner, content id)), bounded
        self._owners: dict[str, set[str]] = {}
        self._jobs: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._page_inflight: dict[str, asyncio.Task[str | None]] = {}
        self._page_failed: dict[str, ApiError] = {}  # pages refused over a limit, by content id
        self.pages_rendered = 0  # page renders actually run (once per plan is tested on it)
        self._pending = 0
        self.jobs_started = 0  # planning jobs actually run (single-flight is tested on it)

    @property
    def pending(self) -> int:
        return self._pending

    def pool(self) -> WorkerPool:
        if self._pool is None:
            self._pool = WorkerPool(self.limits.workers, warm=_warm_worker,
                                    idle_memory_bytes=self.limits.worker_idle_memory_bytes)
        return self._pool

    def worker_pids(self) -> list[int]:
        return self._pool.pids() if self._pool is not None else []

    def shutdown(self) -> None:
        for t in list(self._inflight.values()):
            t.cancel()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None

    def _busy(self, message: str, kind: str = "busy") -> ApiError:
        return ApiError(503, {"error": kind, "message": message}, {"Retry-After": str(self.limits.retry_after_s)})

    async def _run(self, fn: Callable[..., JobResult], *args: Any) -> JobResult:
        if self._pending >= self.limits.max_pending:
            raise self._busy(f"{self._pending} planning jobs pending; retry later")
        self._pending += 1
        self.metrics.queue.set(self._pending)
        deadline = self.limits.request_timeout_s
        try:
            if self.limits.executor == "thread":
                if self._threads is None:
                    self._threads = ThreadPoolExecutor(self.limits.workers, thread_name_prefix="slotplan-plan")
                loop = asyncio.get_running_loop()
                try:
                    return await asyncio.wait_for(loop.run_in_executor(self._threads, fn, *args), deadline)
                except TimeoutError:
                    raise self._limit("wall_time", f"the request took longer than {deadline:g} s") from None
            try:
                res: JobResult = await asyncio.to_thread(self.pool().call, fn, args, deadline,
                                                         self.limits.worker_memory_bytes)
                return res
            except JobKilled as e:
                if e.limit == "crash":
                    self.metrics.killed.labels("crash").inc()
                    raise self._busy("a planning worker died; retry later", "worker") from None
                raise self._limit(e.limit, str(e)) from None
        finally:
            self._pending -= 1
            self.metrics.queue.set(self._pending)

    def _limit(self, limit: str, detail: str) -> ApiError:
        self.metrics.killed.labels(limit).inc()
        if limit == "wall_time":
            field, rule = "limits.request_timeout_s", f"a request plans within {self.limits.request_timeout_s:g} s"
        else:
            field, rule = ("limits.worker_memory_bytes",
                           f"a request grows its worker by at most {self.limits.worker_memory_bytes} bytes")
        return _err(413, "limit", f"{detail}; the request is over the service limit {field} (its worker was "
                    "recycled): split the graph or plan it with the CLI", field=field, rule=rule)

    async def _plan_and_store(self, vr: ValidRequest) -> PlanOutcome:
        # a request that raced a finished identical one finds its plan here (single flight)
        stored = await run_in_threadpool(self.store.get, vr.id)
        if stored is not None:
            return 200, stored.plan_json
        self.jobs_started += 1
        try:
            res = await self._run(plan_job, vr.canonical["graph"], vr.params, vr.options,
                                  self.limits.request_timeout_s * PLANNER_WALL_SHARE)
        except ApiError as e:
            if e.status == 503:
                raise
            self.metrics.plans.labels("limit").inc()
            return e.status, e.body
        if res[0] == "error":
            self.metrics.plans.labels("error").inc()
            return res[1], res[2]
        plan_json = res[1]
        self.metrics.solver.observe(res[2])
        # the plan is stored with every owner that asked for it meanwhile, in one transaction
        # (an owner who joins during the write is given it by the loop's next round)
        owners = self._owners.setdefault(vr.id, set())
        done: set[str] = set()
        while owners - done:
            new = sorted(owners - done)
            await run_in_threadpool(self.store.put_owned, new, vr.id, vr.canonical, plan_json)
            done.update(new)
        self.metrics.plans.labels("planned").inc()
        return 200, plan_json

    def start(self, vr: ValidRequest, owner: str = ANONYMOUS) -> asyncio.Task[PlanOutcome]:
        """The planning task of ``vr`` (one per content id at a time: concurrent identical
        requests share it, whichever key sent them)."""
        self._owners.setdefault(vr.id, set()).add(owner)
        task = self._inflight.get(vr.id)
        if task is not None and not task.done():
            return task
        task = asyncio.ensure_future(self._plan_and_store(vr))
        self._inflight[vr.id] = task
        self._failed.pop(vr.id, None)
        key = vr.id

        def _done(t: asyncio.Task[PlanOutcome]) -> None:
            if self._inflight.get(key) is t:
                self._inflight.pop(key, None)
                self._owners.pop(key, None)
            if t.cancelled():
                return
            exc = t.exception()
            if exc is not None:
                body = exc.body if isinstance(exc, ApiError) else {"error": "internal", "message": "planning failed"}
                self._remember_failure(key, 503 if not isinstance(exc, ApiError) else exc.status, body)
                return
            status, out = t.result()
            if status != 200 and isinstance(out, dict):
                self._remember_failure(key, status, out)

        task.add_done_callback(_done)
        return task

    def _remember_failure(self, key: str, status: int, body: dict[str, Any]) -> None:
        if len(self._failed) > 10_000:
            self._failed.pop(next(iter(self._failed)))
        self._failed[key] = {**body, "status": status}

    def _remember_page_failure(self, ref: str, e: ApiError) -> None:
        if len(self._page_failed) >= 10_000:
            self._page_failed.pop(next(iter(self._page_failed)))
        self._page_failed[ref] = e

    def _remember_job(self, oid: str, owner: str, ref: str) -> None:
        self._jobs[oid] = (owner, ref)
        self._jobs.move_to_end(oid)
        while len(self._jobs) > MAX_JOBS:
            self._jobs.popitem(last=False)

    async def plan(self, vr: ValidRequest, wait_s: float,
                   owner: str = ANONYMOUS) -> tuple[int, dict[str, Any] | str | None, bool, str]:
        """(status, plan JSON text or error body or None when still running, cache hit, the
        id ``owner`` sees).  A hit is reported only when ``owner`` already had the plan: a plan
        another key made is given to ``owner`` without planning again, but answered as a miss."""
        oid = owned_id(owner, vr.id)
        task = self._inflight.get(vr.id)
        if task is None or task.done():
            mine = await run_in_threadpool(self.store.get_owned, owner, oid)
            if mine is not None:
                return 200, mine.plan_json, True, oid
            if await run_in_threadpool(self.store.claim, owner, vr.id) is not None:
                stored = await run_in_threadpool(self.store.get, vr.id)
                if stored is not None:
                    return 200, stored.plan_json, False, oid
        task = self.start(vr, owner)
        self._remember_job(oid, owner, vr.id)
        if wait_s <= 0:
            return 202, None, False, oid
        try:
            status, body = await asyncio.wait_for(asyncio.shield(task), wait_s)
        except TimeoutError:
            return 202, None, False, oid
        if status == 200:
            await run_in_threadpool(self.store.claim, owner, vr.id)
        return status, body, False, oid

    async def job(self, oid: str, owner: str = ANONYMOUS, admin: bool = False) -> JobStatus | None:
        """The job ``oid`` as ``owner`` sees it (None: not theirs, or unknown)."""
        known = self._jobs.get(oid)
        if known is not None and (known[0] == owner or admin):
            ref = known[1]
            task = self._inflight.get(ref)
            if task is not None and not task.done():
                return JobStatus(id=oid, status="running")
            if await run_in_threadpool(self.store.claim, known[0], ref) is not None:
                return JobStatus(id=oid, status="done", plan=f"/v1/plans/{oid}")
            failed = self._failed.get(ref)
            if failed is not None:
                body = {k: v for k, v in failed.items() if k in ErrorBody.model_fields}
                return JobStatus(id=oid, status="failed", error=ErrorBody(**body))
            return None
        if await run_in_threadpool(self.store.resolve, owner, oid, admin) is not None:
            return JobStatus(id=oid, status="done", plan=f"/v1/plans/{oid}")
        return None

    async def page(self, oid: str, owner: str = ANONYMOUS, admin: bool = False) -> str | None:
        """The HTML page of ``owner``'s plan ``oid`` (None: not theirs).  Rendered once per
        plan in a planning worker under the request limits (single flight), then cached in
        the store with the explanations it computed."""
        ref = await run_in_threadpool(self.store.resolve, owner, oid, admin)
        if ref is None:
            return None
        html = await run_in_threadpool(self.store.get_page, ref)
        failed = self._page_failed.get(ref)
        if html is None and failed is not None:
            raise failed  # the same plan under the same limits: the same answer, without a new render
        if html is None:
            task = self._page_inflight.get(ref)
            if task is None or task.done():
                task = asyncio.ensure_future(self._render_and_store(ref))
                self._page_inflight[ref] = task

                def _done(t: asyncio.Task[str | None], ref: str = ref) -> None:
                    if self._page_inflight.get(ref) is t:
                        self._page_inflight.pop(ref, None)

                task.add_done_callback(_done)
            html = await asyncio.shield(task)
            if html is None:  # deleted while rendering
                return None
        from api.plan_page import with_plan_id

        return with_plan_id(html, oid)

    async def _render_and_store(self, ref: str) -> str | None:
        stored = await run_in_threadpool(self.store.get, ref)
        if stored is None:
            return None
        explain = await run_in_threadpool(self.store.get_explain, ref)
        self.pages_rendered += 1
        self.metrics.page_renders.inc()
        try:
            res = await self._run(page_job, stored.plan_json, explain)
        except ApiError as e:
            if e.status == 413:  # over a limit: remembered (bounded), not rendered again
                self._remember_page_failure(ref, e)
            raise
        if res[0] == "error":
            err = ApiError(res[1], res[2])
            self._remember_page_failure(ref, err)
            raise err
        html, explain_json = json.loads(res[1])
        await run_in_threadpool(self.store.put_page, ref, html, explain_json)
        return str(html)

    async def tables(self, plan_id: str, plan_json: str) -> Path:
        fd, tmp = tempfile.mkstemp(prefix=f"slotplan-{plan_id[:12]}-", suffix=".npz")
        os.close(fd)
        try:
            res = await self._run(tables_job, plan_json, tmp, self.limits.max_table_bytes)
        except BaseException:
            _unlink(tmp)
            raise
        if res[0] == "error":
            _unlink(tmp)
            raise ApiError(res[1], res[2])
        return Path(tmp)


def _unlink(path: str | Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _plan_response(plan_id: str, plan_json: str, cache: bool) -> Response:
    plan = json.loads(plan_json)
    body = (
        '{"id":' + json.dumps(plan_id) + ',"summary":' + json.dumps(plan["summary"], separators=(",", ":"))
        + ',"plan":' + plan_json + "}"
    )
    return Response(body, media_type="application/json",
                    headers={"x-slotplan-cache": "hit" if cache else "miss", "x-slotplan-plan-id": plan_id})
