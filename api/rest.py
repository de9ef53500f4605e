"""REST planning service (shared/SPEC.md section 6).

Endpoints::

    POST /v1/plans            {"graph": {...}, "params": "n16" | {...}, "options": {...}}
                              -> {"id", "summary", "plan"}; same request -> same id
    GET  /v1/plans/{id}       -> {"id", "summary", "plan"}
    GET  /v1/plans/{id}/tables  npz bytes (every table the plan names, as planner.io writes)
    POST /v1/diff             {"base": plan | id, "head": plan | id} -> diff JSON (?format=md: Markdown)
    GET  /healthz
    GET  /openapi.json

The id is the sha256 of the canonical JSON of the *validated* request (graph in its
canonical form, the full parameter set, the effective options), so two requests that
mean the same thing share an id, and a stored plan is returned without planning again.

Robustness: request bodies above ``max_body_bytes`` and graphs above the size limits get
413; any invalid input gets 422 with a body that names the node / field and the rule
(``GraphError.to_json()``); the solver time limit is capped per request; planning runs in
a worker pool (processes by default), never on the event loop, and concurrent identical
requests share one planning job.  Every request is logged as one JSON line (logger
``slotplan.rest``) with its request id, plan id, status and seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import multiprocessing
import os
import re
import tempfile
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from api.store import PlanStore
from planner.costs import COSTS_DIR
from planner.diff import DiffInputError, diff_plans, render_markdown
from planner.errors import GraphError, ParamsError, SlotplanError
from planner.graph import Graph, canonical_json, parse_graph
from planner.io import DEFAULT_MAX_TABLE_BYTES
from planner.params import PRESETS, Params
from planner.pipeline import PlanOptions, PlanOptionsLiteral, PlanTimeout, plan_table_names

log = logging.getLogger("slotplan.rest")

API_VERSION = "1"
_ID_RE = re.compile(r"^[0-9a-f]{64}$")
_COSTS_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")

ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
                   Awaitable[None]]


@dataclass(frozen=True)
class RestLimits:
    """Resource limits of the service (all per request unless said otherwise)."""

    max_body_bytes: int = 8 * 2**20
    max_nodes: int = 256
    max_tensors: int = 512
    # largest tensor; the graph format itself allows 2**28 elements, MVM2's weight has 2**26.6
    max_tensor_elements: int = 2**27
    # sum over all tensors of ceil(elements / slots): bounds the planner's work and the
    # plan's size (MVM2 at n16 needs 3138)
    max_slot_blocks: int = 4096
    max_time_limit_s: float = 30.0
    max_table_bytes: int = DEFAULT_MAX_TABLE_BYTES
    # wall-clock bound of one request (the job keeps running and stores its plan)
    request_timeout_s: float = 300.0
    # queued + running planning jobs before new ones get 503
    max_pending: int = 64
    workers: int = 2
    executor: Literal["process", "thread"] = "process"


# --------------------------------------------------------------------------------------
# Request / response models (these are what /openapi.json documents)
# --------------------------------------------------------------------------------------


class PlanRequest(BaseModel):
    """Body of ``POST /v1/plans``."""

    model_config = ConfigDict(extra="forbid")
    graph: dict[str, Any] = Field(description="a slotplan.graph/1 document")
    params: str | dict[str, Any] = Field(
        default="n16", description="preset name (n12..n16) or a CKKS parameter object"
    )
    options: PlanOptionsLiteral = Field(default_factory=PlanOptionsLiteral)


class PlanResponse(BaseModel):
    id: str = Field(description="sha256 of the canonical validated request")
    summary: dict[str, Any]
    plan: dict[str, Any] = Field(description="a slotplan.plan/1 document")


class DiffRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base: dict[str, Any] | str = Field(description="a plan document or the id of a stored plan")
    head: dict[str, Any] | str = Field(description="a plan document or the id of a stored plan")


class ErrorBody(BaseModel):
    error: str = Field(description="graph | params | options | request | plan | timeout | too_large | ...")
    message: str
    node: str | None = None
    tensor: str | None = None
    field: str | None = None
    rule: str | None = None


class Health(BaseModel):
    status: str
    api: str
    plans: int
    executor: str
    workers: int
    pending: int


_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "no such plan"},
    413: {"model": ErrorBody, "description": "request body or graph too large"},
    422: {"model": ErrorBody, "description": "invalid input: names the node / field and the rule"},
    503: {"model": ErrorBody, "description": "busy or timed out; retry"},
}


class ApiError(Exception):
    def __init__(self, status: int, body: Mapping[str, Any]):
        super().__init__(body.get("message", ""))
        self.status = status
        self.body = dict(body)


def _err(status: int, kind: str, message: str, **extra: Any) -> ApiError:
    return ApiError(status, {"error": kind, "message": message, **extra})


def error_body(e: SlotplanError) -> dict[str, Any]:
    if isinstance(e, GraphError | ParamsError):
        return dict(e.to_json())
    body: dict[str, Any] = {"error": "timeout" if isinstance(e, PlanTimeout) else "plan", "message": str(e)}
    node = getattr(e, "node", None)
    rule = getattr(e, "rule", None)
    if isinstance(node, str):
        body["node"] = node
    if isinstance(rule, str):
        body["rule"] = rule
    return body


# --------------------------------------------------------------------------------------
# Validation of a planning request (on the event loop: cheap, bounded by the limits)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ValidRequest:
    id: str
    graph: Graph
    params: Params
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
    if isinstance(req.params, str):
        if req.params not in PRESETS:
            raise ParamsError(f"unknown preset {req.params!r} (presets: {', '.join(PRESETS)}; or give an object)")
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
    lit = req.options
    if not _COSTS_RE.match(lit.costs) or not (COSTS_DIR / f"{lit.costs}.json").is_file():
        known = sorted(q.stem for q in COSTS_DIR.glob("*.json"))
        raise _err(422, "options", f"options.costs: unknown cost table {lit.costs!r}; known: {', '.join(known)}",
                   field="options.costs", rule="a cost table name")
    if lit.time_limit_s > limits.max_time_limit_s:
        lit = lit.model_copy(update={"time_limit_s": limits.max_time_limit_s})
    try:
        options = PlanOptions.from_literal(lit)
    except SlotplanError as e:
        raise _err(422, "options", f"options.kernels: {e}", field="options.kernels",
                   rule=getattr(e, "rule", str(e))) from None
    canonical = {
        "api": API_VERSION,
        "graph": graph.to_json(),
        "params": params.to_json(),
        "options": options.to_json(),
    }
    rid = hashlib.sha256(canonical_json(canonical)).hexdigest()
    return ValidRequest(rid, graph, params, options, canonical)


# --------------------------------------------------------------------------------------
# Jobs (run in the worker pool; plain functions of JSON so they pickle)
# --------------------------------------------------------------------------------------

JobResult = tuple[Literal["ok"], str] | tuple[Literal["error"], int, dict[str, Any]]


def plan_job(graph_json: dict[str, Any], params: Params, options: PlanOptions) -> JobResult:
    """Plan a validated request; returns ("ok", plan JSON) or ("error", status, body)."""
    from planner.pipeline import plan_graph

    try:
        graph = parse_graph(graph_json)
        plan = plan_graph(graph, params, options).plan
        check_memory_cap(plan)
        return "ok", json.dumps(plan, separators=(",", ":"), allow_nan=False)
    except SlotplanError as e:
        return "error", 422, error_body(e)
    except MemoryError:
        return "error", 413, {"error": "too_large", "message": "planning this graph ran out of memory"}
    except ValueError as e:  # e.g. a non-finite number reached the plan
        return "error", 422, {"error": "plan", "message": f"cannot plan this request: {e}"}


def tables_job(plan_json: str, path: str, max_bytes: int) -> JobResult:
    """Regenerate the tables of a plan (deterministic re-planning) and write them as npz."""
    from backends.runner import regenerate_tables
    from planner.io import write_outputs
    from planner.program import LazyTables

    try:
        plan = json.loads(plan_json)
        tables = regenerate_tables(plan)
        assert isinstance(tables, LazyTables)
        write_outputs(plan, None, tables, Path(path), max_bytes)
        return "ok", path
    except SlotplanError as e:
        return "error", 409, {"error": "tables", "message": str(e)}


def _warm_worker() -> None:
    import planner.pipeline  # noqa: F401  (import once per worker, not per request)


# --------------------------------------------------------------------------------------
# ASGI middleware: body limit and one JSON log line per request
# --------------------------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            doc.update(fields)
        else:
            doc["message"] = record.getMessage()
        if record.exc_info:
            doc["exception"] = "".join(traceback.format_exception(*record.exc_info))[-4000:]
        return json.dumps(doc, default=str)


def configure_logging(level: int = logging.INFO) -> None:
    if not any(getattr(h, "_slotplan", False) for h in log.handlers):
        h = logging.StreamHandler()
        h.setFormatter(JsonFormatter())
        h._slotplan = True  # type: ignore[attr-defined]
        log.addHandler(h)
    log.setLevel(level)
    log.propagate = False


async def _send_json(send: Callable[[Any], Awaitable[None]], status: int, body: Mapping[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


class BodyLimitMiddleware:
    """Refuse request bodies above ``max_bytes`` with 413 before the app parses them."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        too_big = {"error": "too_large", "message": f"request body over the limit of {self.max_bytes} bytes",
                   "rule": f"at most {self.max_bytes} bytes"}
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    declared = int(v)
                except ValueError:
                    await _send_json(send, 400, {"error": "request", "message": "bad Content-Length"})
                    return
                if declared > self.max_bytes:
                    await _send_json(send, 413, too_big)
                    return
        # buffer the body (bounded), then replay it to the app
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _send_json(send, 413, too_big)
                return
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class AccessLogMiddleware:
    """One JSON log line per request: request id, method, path, status, seconds, plan id."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        rid = ""
        for k, v in scope.get("headers", []):
            if k == b"x-request-id":
                rid = v.decode("latin-1")[:64]
        rid = rid or uuid.uuid4().hex[:16]
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        status = 500

        async def send_wrapper(msg: Any) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = int(msg["status"])
                msg = dict(msg)
                msg["headers"] = [*msg.get("headers", []), (b"x-request-id", rid.encode("latin-1"))]
            await send(msg)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            fields = {
                "event": "request",
                "request_id": rid,
                "method": scope.get("method"),
                "path": scope.get("path"),
                "status": status,
                "seconds": round(time.perf_counter() - t0, 6),
            }
            for key in ("plan_id", "cache", "error"):
                if key in state:
                    fields[key] = state[key]
            log.info("request", extra={"fields": fields})


# --------------------------------------------------------------------------------------
# The service
# --------------------------------------------------------------------------------------


class PlanService:
    def __init__(self, store: PlanStore, limits: RestLimits):
        self.store = store
        self.limits = limits
        self._executor: Executor | None = None
        self._inflight: dict[str, asyncio.Task[tuple[int, dict[str, Any] | str]]] = {}
        self._pending = 0

    @property
    def pending(self) -> int:
        return self._pending

    def executor(self) -> Executor:
        if self._executor is None:
            if self.limits.executor == "process":
                ctx = multiprocessing.get_context("forkserver" if os.name == "posix" else "spawn")
                self._executor = ProcessPoolExecutor(self.limits.workers, mp_context=ctx, initializer=_warm_worker)
            else:
                self._executor = ThreadPoolExecutor(self.limits.workers, thread_name_prefix="slotplan-plan")
        return self._executor

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def _run(self, fn: Callable[..., JobResult], *args: Any) -> JobResult:
        if self._pending >= self.limits.max_pending:
            raise _err(503, "busy", f"{self._pending} planning jobs pending; retry later")
        self._pending += 1
        try:
            loop = asyncio.get_running_loop()
            try:
                return await loop.run_in_executor(self.executor(), fn, *args)
            except BrokenProcessPool:
                # a worker died (e.g. killed for memory); start a fresh pool for the next jobs
                self.shutdown()
                raise _err(503, "worker", "a planning worker died (out of memory?); retry later") from None
        finally:
            self._pending -= 1

    async def _plan_and_store(self, vr: ValidRequest) -> tuple[int, dict[str, Any] | str]:
        res = await self._run(plan_job, vr.canonical["graph"], vr.params, vr.options)
        if res[0] == "error":
            return res[1], res[2]
        plan_json = res[1]
        await run_in_threadpool(self.store.put, vr.id, vr.canonical, plan_json)
        return 200, plan_json

    async def plan(self, vr: ValidRequest) -> tuple[int, dict[str, Any] | str, bool]:
        """(status, plan JSON text or error body, cache hit)."""
        stored = await run_in_threadpool(self.store.get, vr.id)
        if stored is not None:
            return 200, stored.plan_json, True
        task = self._inflight.get(vr.id)
        if task is None:
            task = asyncio.ensure_future(self._plan_and_store(vr))
            self._inflight[vr.id] = task
            key = vr.id

            def _done(t: asyncio.Task[tuple[int, dict[str, Any] | str]]) -> None:
                self._inflight.pop(key, None)
                if not t.cancelled() and t.exception() is not None:  # retrieved: no "never retrieved" noise
                    log.debug("job failed", extra={"fields": {"event": "job_failed", "plan_id": key}})

            task.add_done_callback(_done)
        try:
            status, body = await asyncio.wait_for(asyncio.shield(task), self.limits.request_timeout_s)
        except TimeoutError:
            raise _err(503, "timeout", f"planning takes longer than {self.limits.request_timeout_s} s; the plan "
                       f"will be stored under id {vr.id}: GET /v1/plans/{vr.id} later") from None
        return status, body, False

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


def _validation_body(errors: list[Any]) -> dict[str, Any]:
    """A JSON-safe 422 body from pydantic / FastAPI errors (never echoes the input)."""
    clean: list[dict[str, Any]] = []
    for e in errors[:10]:
        loc = [x if isinstance(x, int | str) else str(x) for x in e.get("loc", ())]
        clean.append({"loc": loc, "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))})
    first_loc: list[int | str] = clean[0]["loc"] if clean else []
    rule: str = clean[0]["msg"] if clean else "invalid request"
    if clean and clean[0]["type"] == "json_invalid":
        pos = first_loc[-1] if first_loc else "?"
        return {"error": "request", "field": None, "rule": "the body must be valid JSON",
                "message": f"the request body is not valid JSON (error at character {pos})", "errors": clean}
    path = [x for x in first_loc if x != "body"]
    field = ".".join(str(x) for x in path) or None
    head = path[0] if path else None
    kind = head if isinstance(head, str) and head in ("graph", "params", "options") else "request"
    message = f"field {field!r}: {rule}" if field else rule
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return {"error": kind, "field": field, "rule": rule, "message": message, "errors": clean}


def create_app(
    db_path: str | Path | None = None,
    limits: RestLimits | None = None,
    store: PlanStore | None = None,
) -> FastAPI:
    """The FastAPI application.  ``db_path`` (or ``$SLOTPLAN_DB``, or the user cache dir)
    holds the plan store; ``limits`` bounds what a request may ask for."""
    limits = limits or RestLimits()
    store = store or PlanStore(db_path)
    service = PlanService(store, limits)
    configure_logging()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            service.shutdown()

    app = FastAPI(
        title="slotplan",
        version="0.1.0",
        description="Layout planning for CKKS tensor programs (shared/SPEC.md section 6).",
        lifespan=lifespan,
    )
    app.state.service = service
    app.state.limits = limits

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        request.state.error = e.body.get("error")
        return JSONResponse(e.body, status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        body = _validation_body(list(e.errors()))
        request.state.error = body["error"]
        return JSONResponse(body, status_code=422)

    @app.exception_handler(SlotplanError)
    async def _slotplan_error(request: Request, e: SlotplanError) -> JSONResponse:
        body = error_body(e)
        request.state.error = body["error"]
        return JSONResponse(body, status_code=422)

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception) -> JSONResponse:
        log.error("internal error", exc_info=e, extra={"fields": {"event": "internal_error",
                                                                  "path": request.url.path}})
        return JSONResponse({"error": "internal", "message": f"internal error: {type(e).__name__}"},
                            status_code=500)

    @app.post("/v1/plans", response_model=PlanResponse, responses=_ERRORS, summary="Plan a graph")
    async def post_plan(req: PlanRequest, request: Request) -> Response:
        try:
            vr = validate_request(req, limits)
        except (ApiError, SlotplanError):
            raise
        except Exception as e:
            # a validator tripped on input it did not expect: still the user's input (logged,
            # since it points at a validator that should have named the rule)
            log.error("validation", exc_info=True, extra={"fields": {"event": "unexpected_validation_error"}})
            raise _err(422, "request", f"invalid request: {' '.join(str(e).split())[:500]}") from None
        request.state.plan_id = vr.id
        status, body, hit = await service.plan(vr)
        request.state.cache = "hit" if hit else "miss"
        if status != 200:
            assert isinstance(body, dict)
            raise ApiError(status, body)
        assert isinstance(body, str)
        return await run_in_threadpool(_plan_response, vr.id, body, hit)

    async def _stored(plan_id: str, request: Request) -> tuple[str, str]:
        if not _ID_RE.match(plan_id):
            raise _err(404, "not_found", f"no plan {plan_id[:80]!r}: ids are 64 hex digits")
        request.state.plan_id = plan_id
        stored = await run_in_threadpool(store.get, plan_id)
        if stored is None:
            raise _err(404, "not_found", f"no plan with id {plan_id}")
        return plan_id, stored.plan_json

    @app.get("/v1/plans/{plan_id}", response_model=PlanResponse, responses=_ERRORS, summary="A stored plan")
    async def get_plan(plan_id: str, request: Request) -> Response:
        pid, plan_json = await _stored(plan_id, request)
        return await run_in_threadpool(_plan_response, pid, plan_json, True)

    @app.get(
        "/v1/plans/{plan_id}/tables",
        responses={**_ERRORS, 200: {"content": {"application/octet-stream": {}},
                                    "description": "npz: T.idx (int64) and T.coef (float64) per table"},
                   409: {"model": ErrorBody, "description": "tables cannot be regenerated"}},
        response_class=Response,
        summary="The slot tables of a stored plan (npz)",
    )
    async def get_tables(plan_id: str, request: Request) -> Response:
        pid, plan_json = await _stored(plan_id, request)
        plan = json.loads(plan_json)
        slots = int(plan["params"]["slots"])
        estimate = len(plan_table_names(plan)) * slots * 8
        if estimate > limits.max_table_bytes:
            raise _err(413, "too_large", f"tables need about {estimate / 2**20:.0f} MiB, over the service limit "
                       f"of {limits.max_table_bytes / 2**20:.0f} MiB; write them with the CLI "
                       "(slotplan plan --tables --max-table-bytes)")
        path = await service.tables(pid, plan_json)
        return FileResponse(path, media_type="application/octet-stream", filename=f"{pid[:16]}.npz",
                            background=BackgroundTask(_unlink, path))

    @app.post("/v1/diff", responses={**_ERRORS, 200: {"content": {"application/json": {}, "text/markdown": {}}}},
              summary="Diff two plans")
    async def post_diff(req: DiffRequest, request: Request,
                        format: Literal["json", "md"] = Query("json", description="json or md")) -> Response:
        async def resolve(x: dict[str, Any] | str) -> dict[str, Any]:
            if isinstance(x, str):
                _, text = await _stored(x, request)
                obj: dict[str, Any] = json.loads(text)
                return obj
            return x

        base = await resolve(req.base)
        head = await resolve(req.head)
        labels = [x if isinstance(x, str) else "request " + which for x, which in ((req.base, "base"),
                                                                                    (req.head, "head"))]
        try:
            report = diff_plans(base, head, labels[0], labels[1])
        except DiffInputError as e:
            raise _err(422, "diff", str(e)) from None
        except (TypeError, ValueError, AttributeError) as e:
            raise _err(422, "diff", f"cannot diff these documents: {e}") from None
        if format == "md":
            return PlainTextResponse(render_markdown(report), media_type="text/markdown")
        return JSONResponse(report.to_json())

    @app.get("/healthz", response_model=Health, summary="Liveness and store status")
    async def healthz() -> Health:
        count = await run_in_threadpool(store.count)
        return Health(status="ok", api=API_VERSION, plans=count, executor=limits.executor,
                      workers=limits.workers, pending=service.pending)

    from api.plan_page import register as register_plan_page  # issue 17: GET /v1/plans/{id}/view + Link
    register_plan_page(app, store)
    app.add_middleware(BodyLimitMiddleware, max_bytes=limits.max_body_bytes)  # type: ignore[arg-type]
    app.add_middleware(AccessLogMiddleware)  # type: ignore[arg-type]
    return app


def serve(host: str = "127.0.0.1", port: int = 8000, db_path: str | Path | None = None,
          limits: RestLimits | None = None, log_level: str = "info") -> None:
    """Run the service with uvicorn (blocking)."""
    import uvicorn

    app = create_app(db_path, limits)
    # uvicorn's own messages (start-up, shutdown, errors) as JSON lines too
    fmt = JsonFormatter()
    for name in ("uvicorn", "uvicorn.error"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        h = logging.StreamHandler()
        h.setFormatter(fmt)
        lg.addHandler(h)
        lg.setLevel(log_level.upper())
        lg.propagate = False
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False, log_config=None)
