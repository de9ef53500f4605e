"""REST planning service (docs/rest.md; SPEC section 6).

Endpoints::

    POST   /v1/plans            {"graph": {...}, "params": "n16" | {...}, "options": {...}}
                                -> 200 {"id", "summary", "plan"}; same request -> same id;
                                   202 + Location: /v1/jobs/{id} when planning takes longer
                                   than sync_wait_s (or with Prefer: respond-async)
    GET    /v1/jobs/{id}        -> {"id", "status": running|done|failed, "plan", "error"}
    GET    /v1/plans            -> {"items", "total", "limit", "offset", "next"} (newest first)
    GET    /v1/plans/{id}       -> {"id", "summary", "plan"}
    DELETE /v1/plans/{id}       -> 204
    GET    /v1/plans/{id}/tables  npz bytes (every table the plan names, as planner.io writes)
    POST   /v1/diff             {"base": plan | id, "head": plan | id} -> diff JSON (?format=md: Markdown)
    GET    /healthz, /readyz, /metrics (Prometheus), /openapi.json

The id is the sha256 of the canonical JSON of the *validated* request (graph in its
canonical form, the full parameter set, the effective options), so two requests that
mean the same thing share an id, and a stored plan is returned without planning again;
concurrent identical requests share one planning job (single flight).

Limits bound a whole request: body bytes, graph size and planning work (413), the
solver's time limit (422 above the service's cap), and the planning job's wall time and
its worker's resident memory (413 naming the limit; the worker is killed and replaced).
Access: API keys (``X-API-Key`` or ``Authorization: Bearer``, all paths but /healthz), a
Host allow-list, and a per-key rate limit (429 with ``Retry-After``).  Errors carry the
fields of the CLI's one line (error, message, node, tensor, field, rule).  Every request
is logged as one JSON line (logger ``slotplan.rest``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import tempfile
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.common import request_id
from api.store import PlanStore
from api.workers import JobKilled, WorkerPool
from planner.costs import COST_TABLES
from planner.diff import DiffInputError, diff_plans, render_markdown
from planner.errors import GraphError, ParamsError, SlotplanError
from planner.graph import Graph, parse_graph, reject_duplicate_keys
from planner.io import DEFAULT_MAX_TABLE_BYTES
from planner.ir import PLAN_SCHEMA
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
    # planning work of a graph (see graph_work): bounds candidates and lowering, which the
    # solver's time limit does not
    max_work: int = 20_000
    max_time_limit_s: float = 30.0
    max_table_bytes: int = DEFAULT_MAX_TABLE_BYTES
    # wall-clock bound of one planning job as a whole (candidates, solve, lowering, key
    # schedule, tables); a job over it is killed with its worker (413, limit "wall_time_s")
    request_timeout_s: float = 120.0
    # resident memory of one worker; over it the job is killed (413, "worker_memory_bytes")
    worker_memory_bytes: int | None = 3 * 2**30
    # a POST waits this long for its plan, then answers 202 with Location: /v1/jobs/{id}
    sync_wait_s: float = 60.0
    # queued + running planning jobs before new ones get 503
    max_pending: int = 64
    workers: int = 2
    executor: Literal["process", "thread"] = "process"
    # access control: API keys (empty: none needed), Host allow-list (None: any host),
    # requests per minute per key (or per client address without keys; None: unlimited)
    api_keys: frozenset[str] = frozenset()
    allowed_hosts: tuple[str, ...] | None = None
    rate_limit_per_min: int | None = None
    retry_after_s: int = 5


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
    plan: dict[str, Any] = Field(description=f"a {PLAN_SCHEMA} document")


class DiffRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base: dict[str, Any] | str = Field(description="a plan document or the id of a stored plan")
    head: dict[str, Any] | str = Field(description="a plan document or the id of a stored plan")


class ErrorBody(BaseModel):
    """The CLI's one line, as fields: ``message`` is the line itself (without ``slotplan: ``)."""

    error: str = Field(description="graph | params | options | request | plan | timeout | too_large | limit | "
                                   "auth | rate_limit | host | busy | worker | not_found | ...")
    message: str
    node: str | None = None
    tensor: str | None = None
    field: str | None = None
    rule: str | None = None


class JobStatus(BaseModel):
    id: str = Field(description="the plan id (content-addressed); the plan appears at /v1/plans/{id}")
    status: Literal["running", "done", "failed"]
    plan: str | None = Field(default=None, description="URL of the plan once done")
    error: ErrorBody | None = None


class PlanListItem(BaseModel):
    id: str
    created: float
    graph: dict[str, Any]
    params: str


class PlanList(BaseModel):
    items: list[PlanListItem]
    total: int
    limit: int
    offset: int
    next: str | None = Field(description="URL of the next page, or null")


class Ready(BaseModel):
    status: Literal["ready", "not_ready"]
    reason: str | None = None


class Health(BaseModel):
    status: str
    api: str
    plans: int
    executor: str
    workers: int
    pending: int


_RETRY = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}
_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "missing or wrong API key (X-API-Key or Authorization: Bearer)"},
    404: {"model": ErrorBody, "description": "no such plan"},
    413: {"model": ErrorBody, "description": "request body, graph or planning work over a service limit "
                                             "(the field names the limit)"},
    415: {"model": ErrorBody, "description": "the body must be application/json"},
    422: {"model": ErrorBody, "description": "invalid input (also bodies that are not JSON or repeat a key): "
                                             "names the node / field and the rule"},
    429: {"model": ErrorBody, "description": "over the rate limit; retry after Retry-After", "headers": _RETRY},
    503: {"model": ErrorBody, "description": "busy or a worker died; retry after Retry-After", "headers": _RETRY},
}


class ApiError(Exception):
    def __init__(self, status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None):
        super().__init__(body.get("message", ""))
        self.status = status
        self.body = dict(body)
        self.headers = dict(headers or {})


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
    graph_json, params_json, options_json = graph.to_json(), params.to_json(), options.to_json()
    canonical: dict[str, Any] = {"api": API_VERSION, "graph": graph_json, "params": params_json,
                                 "options": options_json}
    rid = request_id(graph_json, params_json, options_json)
    return ValidRequest(rid, graph, params, options, canonical)


# --------------------------------------------------------------------------------------
# Jobs (run in the worker pool; plain functions of JSON so they pickle)
# --------------------------------------------------------------------------------------

JobResult = tuple[Literal["ok"], str, float] | tuple[Literal["error"], int, dict[str, Any]]


# Share of the request's wall limit the planner itself may use (candidates, solve,
# lowering, key schedule): the rest is for serialising and storing the plan, so a slow
# request ends with the planner's clear answer instead of a killed worker.
PLANNER_WALL_SHARE = 0.8


def plan_job(graph_json: dict[str, Any], params: Params, options: PlanOptions,
             wall_limit_s: float | None = None) -> JobResult:
    """Plan a validated request; returns ("ok", plan JSON, solver seconds) or ("error", status, body)."""
    from planner.pipeline import PlanWallTimeout, plan_graph

    t0 = time.monotonic()
    try:
        graph = parse_graph(graph_json)
        left = None if wall_limit_s is None else max(0.01, wall_limit_s - (time.monotonic() - t0))
        res = plan_graph(graph, params, options, wall_limit_s=left)
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
    from planner.io import write_outputs
    from planner.program import LazyTables

    try:
        plan = json.loads(plan_json)
        tables = regenerate_tables(plan)
        assert isinstance(tables, LazyTables)
        write_outputs(plan, None, tables, Path(path), max_bytes)
        return "ok", path, 0.0
    except SlotplanError as e:
        return "error", 409, {"error": "tables", "message": str(e)}


def _warm_worker() -> None:
    import planner.pipeline  # noqa: F401  (import once per worker, not per request)


# --------------------------------------------------------------------------------------
# Metrics (Prometheus, one registry per app)
# --------------------------------------------------------------------------------------


class Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("slotplan_requests_total", "HTTP requests", ["method", "route", "status"],
                                registry=self.registry)
        self.latency = Histogram("slotplan_request_seconds", "HTTP request latency", ["method", "route"],
                                 registry=self.registry,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.queue = Gauge("slotplan_queue_depth", "planning jobs queued or running", registry=self.registry)
        self.solver = Histogram("slotplan_solver_seconds", "solver seconds per planning job", registry=self.registry,
                                buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60))
        self.plans = Counter("slotplan_plans_total", "planning outcomes", ["outcome"], registry=self.registry)
        self.killed = Counter("slotplan_jobs_killed_total", "jobs killed over a limit (worker recycled)",
                              ["limit"], registry=self.registry)
        self.rate_limited = Counter("slotplan_rate_limited_total", "requests refused with 429",
                                    registry=self.registry)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


_ROUTE_IDS = re.compile(r"/[0-9a-f]{64}(?=/|$)")
_ROUTES = ("/v1/plans", "/v1/plans/{id}", "/v1/plans/{id}/tables", "/v1/jobs/{id}", "/v1/diff", "/healthz",
           "/readyz", "/metrics", "/openapi.json", "/docs")


def route_of(path: str) -> str:
    r = _ROUTE_IDS.sub("/{id}", path)
    return r if r in _ROUTES else "other"


# --------------------------------------------------------------------------------------
# ASGI middleware: access control, body limit, one JSON log line per request
# --------------------------------------------------------------------------------------

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



async def _send_json(send: Callable[[Any], Awaitable[None]], status: int, body: Mapping[str, Any],
                     headers: Mapping[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    hdrs += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": data})


def _header(scope: Mapping[str, Any], name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k == name:
            return str(v.decode("latin-1"))
    return None


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return reject_duplicate_keys(pairs, ValueError)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def check_json_body(body: bytes) -> dict[str, Any] | None:
    """None when ``body`` is strict JSON (unique keys, no NaN/Infinity), else a 422 body
    saying what is wrong (the same rules as the CLI's graph reader)."""
    rule = "the body must be valid JSON with unique keys"
    try:
        json.loads(body, object_pairs_hook=_reject_duplicate_keys, parse_constant=_no_constants)
    except json.JSONDecodeError as e:
        return {"error": "request", "field": None, "rule": rule,
                "message": f"the request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"}
    except UnicodeDecodeError:
        return {"error": "request", "field": None, "rule": rule, "message": "the request body is not UTF-8 JSON"}
    except RecursionError:
        return {"error": "request", "field": None, "rule": rule, "message": "the request body is nested too deeply"}
    except ValueError as e:
        return {"error": "request", "field": None, "rule": rule, "message": f"the request body is not valid: {e}"}
    return None


class BodyLimitMiddleware:
    """Refuse request bodies above ``max_bytes`` with 413 before the app parses them, and
    bodies that are not strict JSON with 422 (415 for another content type)."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        too_big = {"error": "too_large", "message": f"request body over the limit of {self.max_bytes} bytes",
                   "field": "limits.max_body_bytes", "rule": f"at most {self.max_bytes} bytes"}
        declared_text = _header(scope, b"content-length")
        if declared_text is not None:
            try:
                declared = int(declared_text)
            except ValueError:
                await _send_json(send, 422, {"error": "request", "field": "Content-Length",
                                             "rule": "an integer", "message": "bad Content-Length header"})
                return
            if declared > self.max_bytes:
                await _send_json(send, 413, too_big)
                return
        ctype = (_header(scope, b"content-type") or "application/json").split(";")[0].strip().lower()
        if ctype != "application/json" and not ctype.endswith("+json"):
            await _send_json(send, 415, {"error": "request", "field": "Content-Type", "rule": "application/json",
                                         "message": f"the body must be application/json, not {ctype[:60]}"})
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
        bad = check_json_body(body)
        if bad is not None:
            scope.setdefault("state", {})["error"] = "request"
            await _send_json(send, 422, bad)
            return
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class TokenBucket:
    """``rate`` requests per minute per client, bursts up to ``rate``."""

    def __init__(self, rate_per_min: int):
        self.rate = rate_per_min / 60.0
        self.burst = float(max(1, rate_per_min))
        self.state: dict[str, tuple[float, float]] = {}

    def take(self, who: str, now: float | None = None) -> float:
        """0 when allowed, else the seconds until a token is free."""
        now = time.monotonic() if now is None else now
        tokens, last = self.state.get(who, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens >= 1.0:
            self.state[who] = (tokens - 1.0, now)
            if len(self.state) > 100_000:  # bounded memory under many clients
                self.state.clear()
            return 0.0
        self.state[who] = (tokens, now)
        return (1.0 - tokens) / self.rate


OPEN_PATHS = ("/healthz",)


class GuardMiddleware:
    """Host allow-list (DNS rebinding), API keys (``X-API-Key`` or ``Authorization: Bearer``;
    every path but /healthz) and a per-key rate limit (429 with Retry-After)."""

    def __init__(self, app: ASGIApp, limits: RestLimits, metrics: Metrics):
        self.app = app
        self.limits = limits
        self.metrics = metrics
        self.keys = [k.encode() for k in sorted(limits.api_keys)]
        self.hosts = {h.lower() for h in limits.allowed_hosts} if limits.allowed_hosts is not None else None
        self.bucket = TokenBucket(limits.rate_limit_per_min) if limits.rate_limit_per_min else None

    def _key_ok(self, given: str) -> bool:
        g = given.encode("utf-8", "replace")
        ok = False
        for k in self.keys:  # constant time per key, no early exit
            ok |= hmac.compare_digest(g, k)
        return ok

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        if self.hosts is not None:
            host = (_header(scope, b"host") or "").lower()
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if host not in self.hosts and name not in self.hosts:
                state["error"] = "host"
                await _send_json(send, 421, {"error": "host", "field": "Host", "rule": "an allowed host name",
                                             "message": f"host {host[:100]!r} is not served here"})
                return
        path = scope.get("path", "")
        who = ""
        if self.keys and path not in OPEN_PATHS:
            given = _header(scope, b"x-api-key")
            if given is None:
                auth = _header(scope, b"authorization") or ""
                if auth[:7].lower() == "bearer ":
                    given = auth[7:].strip()
            if not given or not self._key_ok(given):
                state["error"] = "auth"
                await _send_json(send, 401, {
                    "error": "auth", "field": "X-API-Key", "rule": "a valid API key",
                    "message": "missing or wrong API key: send X-API-Key: KEY or Authorization: Bearer KEY"},
                    {"WWW-Authenticate": 'Bearer realm="slotplan"'})
                return
            who = "key:" + hashlib.sha256(given.encode()).hexdigest()[:16]
        if self.bucket is not None and path not in OPEN_PATHS:
            client = scope.get("client") or ("?", 0)
            wait = self.bucket.take(who or f"addr:{client[0]}")
            if wait > 0:
                state["error"] = "rate_limit"
                self.metrics.rate_limited.inc()
                retry = max(1, int(wait + 0.999))
                await _send_json(send, 429, {
                    "error": "rate_limit", "rule": f"at most {self.limits.rate_limit_per_min} requests per minute",
                    "message": f"over the rate limit of {self.limits.rate_limit_per_min} requests per minute; "
                               f"retry in {retry} s"}, {"Retry-After": str(retry)})
                return
        await self.app(scope, receive, send)


class AccessLogMiddleware:
    """One JSON log line per request (request id, method, path, status, seconds, plan id)
    and the request metrics."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

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
            secs = time.perf_counter() - t0
            route = route_of(str(scope.get("path", "")))
            method = str(scope.get("method", ""))
            self.metrics.requests.labels(method, route, str(status)).inc()
            self.metrics.latency.labels(method, route).observe(secs)
            fields = {
                "event": "request",
                "request_id": rid,
                "method": scope.get("method"),
                "path": scope.get("path"),
                "status": status,
                "seconds": round(secs, 6),
            }
            for key in ("plan_id", "cache", "error"):
                if key in state:
                    fields[key] = state[key]
            log.info("request", extra={"fields": fields})


# --------------------------------------------------------------------------------------
# The service
# --------------------------------------------------------------------------------------

PlanOutcome = tuple[int, dict[str, Any] | str]


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
        self._pending = 0
        self.jobs_started = 0  # planning jobs actually run (single-flight is tested on it)

    @property
    def pending(self) -> int:
        return self._pending

    def pool(self) -> WorkerPool:
        if self._pool is None:
            self._pool = WorkerPool(self.limits.workers, warm=_warm_worker)
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
            field, rule = "limits.worker_memory_bytes", f"a request plans within {self.limits.worker_memory_bytes} bytes"
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
        await run_in_threadpool(self.store.put, vr.id, vr.canonical, plan_json)
        self.metrics.plans.labels("planned").inc()
        return 200, plan_json

    def start(self, vr: ValidRequest) -> asyncio.Task[PlanOutcome]:
        """The planning task of ``vr`` (one per id at a time: concurrent identical requests share it)."""
        task = self._inflight.get(vr.id)
        if task is not None:
            return task
        task = asyncio.ensure_future(self._plan_and_store(vr))
        self._inflight[vr.id] = task
        self._failed.pop(vr.id, None)
        key = vr.id

        def _done(t: asyncio.Task[PlanOutcome]) -> None:
            self._inflight.pop(key, None)
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

    async def plan(self, vr: ValidRequest, wait_s: float) -> tuple[int, dict[str, Any] | str | None, bool]:
        """(status, plan JSON text or error body or None when still running, cache hit)."""
        if vr.id not in self._inflight:
            stored = await run_in_threadpool(self.store.get, vr.id)
            if stored is not None:
                return 200, stored.plan_json, True
        task = self.start(vr)
        if wait_s <= 0:
            return 202, None, False
        try:
            status, body = await asyncio.wait_for(asyncio.shield(task), wait_s)
        except TimeoutError:
            return 202, None, False
        return status, body, False

    async def job(self, plan_id: str) -> JobStatus | None:
        if plan_id in self._inflight:
            return JobStatus(id=plan_id, status="running")
        if await run_in_threadpool(self.store.contains, plan_id):
            return JobStatus(id=plan_id, status="done", plan=f"/v1/plans/{plan_id}")
        failed = self._failed.get(plan_id)
        if failed is not None:
            body = {k: v for k, v in failed.items() if k in ErrorBody.model_fields}
            return JobStatus(id=plan_id, status="failed", error=ErrorBody(**body))
        return None

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


def _openapi_extras(schema: dict[str, Any], limits: RestLimits) -> dict[str, Any]:
    """The graph schema (planner.graph.GraphFile), the service's time-limit cap, the
    security schemes and the Retry-After headers, in the generated document."""
    from planner.graph import GraphFile

    comps = schema.setdefault("components", {}).setdefault("schemas", {})
    gschema = GraphFile.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, d in gschema.pop("$defs", {}).items():
        comps.setdefault(name, d)
    comps["GraphFile"] = gschema
    req = comps.get("PlanRequest", {}).get("properties", {})
    if "graph" in req:
        req["graph"] = {"$ref": "#/components/schemas/GraphFile", "description": "a slotplan.graph/1 document"}
    opts = comps.get("PlanOptionsLiteral", {}).get("properties", {})
    if "time_limit_s" in opts:
        opts["time_limit_s"]["maximum"] = limits.max_time_limit_s
    schema["components"]["securitySchemes"] = {
        "ApiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
        "Bearer": {"type": "http", "scheme": "bearer"},
    }
    if limits.api_keys:
        for path, ops in schema.get("paths", {}).items():
            if path in OPEN_PATHS:
                continue
            for op in ops.values():
                if isinstance(op, dict):
                    op["security"] = [{"ApiKey": []}, {"Bearer": []}]
    return schema


# create_app registers every route as a closure over the app's store, pool and limits: each
# route is short, but mccabe and the statement count add them all to the factory.
def create_app(  # noqa: C901, PLR0915
    db_path: str | Path | None = None,
    limits: RestLimits | None = None,
    store: PlanStore | None = None,
) -> FastAPI:
    """The FastAPI application.  ``db_path`` (or ``$SLOTPLAN_DB``, or the user cache dir)
    holds the plan store; ``limits`` bounds what a request may ask for and who may ask."""
    limits = limits or RestLimits()
    store = store or PlanStore(db_path)
    metrics = Metrics()
    service = PlanService(store, limits, metrics)
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
        description="Layout planning for CKKS tensor programs (docs/rest.md).",
        lifespan=lifespan,
    )
    app.state.service = service
    app.state.limits = limits
    app.state.metrics = metrics

    def custom_openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            doc = get_openapi(title=app.title, version=app.version, description=app.description,
                              routes=app.routes)
            app.openapi_schema = _openapi_extras(doc, limits)
        return app.openapi_schema

    app.openapi = custom_openapi  # type: ignore[method-assign]

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        request.state.error = e.body.get("error")
        return JSONResponse(e.body, status_code=e.status, headers=e.headers or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "method"}.get(e.status_code, "request")
        request.state.error = kind
        return JSONResponse({"error": kind, "message": str(e.detail)}, status_code=e.status_code,
                            headers=getattr(e, "headers", None))

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

    def _accepted(plan_id: str) -> JSONResponse:
        loc = f"/v1/jobs/{plan_id}"
        return JSONResponse(JobStatus(id=plan_id, status="running").model_dump(), status_code=202,
                            headers={"Location": loc, "Retry-After": str(limits.retry_after_s),
                                     "x-slotplan-plan-id": plan_id})

    @app.post("/v1/plans", response_model=PlanResponse, summary="Plan a graph",
              responses={**_ERRORS, 202: {"model": JobStatus, "description": "planning takes long: poll the "
                                          "Location (/v1/jobs/{id})", "headers": {"Location": {
                                              "schema": {"type": "string"}}}}})
    async def post_plan(req: PlanRequest, request: Request,
                        prefer: str | None = Header(None, description="respond-async: answer 202 at once")) -> Response:
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
        wait = 0.0 if prefer and "respond-async" in prefer.lower() else limits.sync_wait_s
        status, body, hit = await service.plan(vr, wait)
        request.state.cache = "hit" if hit else "miss"
        if status == 202:
            return _accepted(vr.id)
        if status != 200:
            assert isinstance(body, dict)
            raise ApiError(status, body)
        assert isinstance(body, str)
        return await run_in_threadpool(_plan_response, vr.id, body, hit)

    @app.get("/v1/jobs/{job_id}", response_model=JobStatus, responses=_ERRORS, summary="A planning job")
    async def get_job(job_id: str, request: Request) -> JSONResponse:
        if not _ID_RE.match(job_id):
            raise _err(404, "not_found", f"no job {job_id[:80]!r}: ids are 64 hex digits")
        st = await service.job(job_id)
        if st is None:
            raise _err(404, "not_found", f"no job with id {job_id}")
        headers = {"Retry-After": str(limits.retry_after_s)} if st.status == "running" else {}
        if st.status == "done":
            headers["Location"] = f"/v1/plans/{job_id}"
        return JSONResponse(st.model_dump(), headers=headers)

    async def _stored(plan_id: str, request: Request) -> tuple[str, str]:
        if not _ID_RE.match(plan_id):
            raise _err(404, "not_found", f"no plan {plan_id[:80]!r}: ids are 64 hex digits")
        request.state.plan_id = plan_id
        stored = await run_in_threadpool(store.get, plan_id)
        if stored is None:
            raise _err(404, "not_found", f"no plan with id {plan_id}")
        return plan_id, stored.plan_json

    @app.get("/v1/plans", response_model=PlanList, responses=_ERRORS, summary="Stored plans, newest first")
    async def list_plans(limit: int = Query(50, ge=1, le=500), offset: int = Query(0, ge=0, le=10**9)) -> PlanList:
        total, rows = await run_in_threadpool(store.page, limit, offset)
        nxt = f"/v1/plans?limit={limit}&offset={offset + limit}" if offset + limit < total else None
        return PlanList(items=[PlanListItem(**r) for r in rows], total=total, limit=limit, offset=offset, next=nxt)

    @app.get("/v1/plans/{plan_id}", response_model=PlanResponse, responses=_ERRORS, summary="A stored plan")
    async def get_plan(plan_id: str, request: Request) -> Response:
        pid, plan_json = await _stored(plan_id, request)
        return await run_in_threadpool(_plan_response, pid, plan_json, True)

    @app.delete("/v1/plans/{plan_id}", status_code=204, response_class=Response, responses=_ERRORS,
                summary="Delete a stored plan")
    async def delete_plan(plan_id: str, request: Request) -> Response:
        if not _ID_RE.match(plan_id) or not await run_in_threadpool(store.delete, plan_id):
            raise _err(404, "not_found", f"no plan with id {plan_id[:80]}")
        request.state.plan_id = plan_id
        return Response(status_code=204)

    @app.get(
        "/v1/plans/{plan_id}/tables",
        responses={**_ERRORS, 200: {"content": {"application/octet-stream": {}},
                                    "description": "npz: T.idx (int64) and T.coef (float64) per table, "
                                                   "and slotplan.plan_digest"},
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
                       "(slotplan plan --tables --max-table-bytes)", field="limits.max_table_bytes")
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
        except (TypeError, ValueError, AttributeError, KeyError) as e:
            raise _err(422, "diff", f"cannot diff these documents: {e}") from None
        if format == "md":
            return PlainTextResponse(render_markdown(report), media_type="text/markdown")
        return JSONResponse(report.to_json())

    @app.get("/healthz", response_model=Health, summary="Liveness and store status (no API key needed)")
    async def healthz() -> Health:
        count = await run_in_threadpool(store.count)
        return Health(status="ok", api=API_VERSION, plans=count, executor=limits.executor,
                      workers=limits.workers, pending=service.pending)

    @app.get("/readyz", response_model=Ready, summary="Readiness: the store answers and the queue has room",
             responses={503: {"model": Ready, "description": "not ready; retry", "headers": _RETRY}})
    async def readyz() -> JSONResponse:
        reason = None
        try:
            await run_in_threadpool(store.count)
        except Exception as e:  # noqa: BLE001 - any store failure means not ready
            reason = f"plan store: {type(e).__name__}"
        if reason is None and service.pending >= limits.max_pending:
            reason = f"{service.pending} planning jobs pending"
        if reason is not None:
            return JSONResponse(Ready(status="not_ready", reason=reason).model_dump(), status_code=503,
                                headers={"Retry-After": str(limits.retry_after_s)})
        return JSONResponse(Ready(status="ready").model_dump())

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics (text format)",
             responses={200: {"content": {"text/plain": {}}}})
    async def metrics_endpoint() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        metrics.queue.set(service.pending)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    from api.plan_page import register as register_plan_page  # issue 17: GET /v1/plans/{id}/view + Link
    register_plan_page(app, store)
    app.add_middleware(BodyLimitMiddleware, max_bytes=limits.max_body_bytes)  # type: ignore[arg-type]
    app.add_middleware(GuardMiddleware, limits=limits, metrics=metrics)  # type: ignore[arg-type]
    app.add_middleware(AccessLogMiddleware, metrics=metrics)  # type: ignore[arg-type]
    return app


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    import ipaddress

    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_api_keys(path: str | Path) -> frozenset[str]:
    """One key per line (blank lines and ``#`` comments ignored); at least 16 characters."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SlotplanError(f"API keys file {p}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    keys = [x.strip() for x in text.splitlines() if x.strip() and not x.strip().startswith("#")]
    if not keys:
        raise SlotplanError(f"API keys file {p} has no keys (one per line)")
    for i, k in enumerate(keys):
        if len(k) < 16 or any(c.isspace() for c in k):
            raise SlotplanError(f"API keys file {p}: key {i + 1} must be at least 16 characters, no spaces")
    return frozenset(keys)


def default_allowed_hosts(host: str, port: int) -> tuple[str, ...]:
    names = set(LOOPBACK_NAMES)
    if host not in ("0.0.0.0", "::", ""):
        names.add(host.lower())
    return tuple(sorted(names | {f"{n}:{port}" for n in names}))


def serve(host: str = "127.0.0.1", port: int = 8000, db_path: str | Path | None = None,
          limits: RestLimits | None = None, log_level: str = "info") -> None:
    """Run the service with uvicorn (blocking).  Refuses a non-loopback bind without API keys."""
    import uvicorn

    limits = limits or RestLimits()
    if not is_loopback(host) and not limits.api_keys:
        raise SlotplanError(f"--host {host} is not loopback: API keys are required (--api-keys FILE or "
                            "SLOTPLAN_API_KEYS_FILE)")
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
