"""REST service: metrics, JSON request logging, strict JSON bodies, body limits, and the
access guard (API keys, Host allow-list, per-key rate limit)."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
import traceback
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from api.rest_models import (
    ASGIApp,
    RestLimits,
)
from planner.frontend.graph import reject_duplicate_keys

log = logging.getLogger("slotplan.rest")


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
        self.page_renders = Counter("slotplan_page_renders_total", "plan pages rendered (in a planning worker)",
                                    registry=self.registry)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


# methods as metric labels: a fixed set, anything else is "other" (a client choosing the
# method token must not add series)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_of(method: str) -> str:
    return method if method in METHODS else "other"


_ROUTE_IDS = re.compile(r"/[0-9a-f]{64}(?=/|$)")
_ROUTES = ("/v1/plans", "/v1/plans/{id}", "/v1/plans/{id}/tables", "/v1/plans/{id}/view", "/v1/jobs/{id}",
           "/v1/diff", "/healthz", "/readyz", "/metrics", "/openapi.json", "/docs",
           "/v1/plans/{id}/keys", "/v1/plans/{id}/evaluate", "/v1/keys/{id}", "/v1/weights", "/v1/weights/{id}",
           "/v1/jobs/{id}/result")


def route_of(path: str) -> str:
    r = _ROUTE_IDS.sub("/{id}", path)
    return r if r in _ROUTES else "other"


# --------------------------------------------------------------------------------------
# ASGI middleware: access control, body limit, one JSON log line per request
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
        from api.rest_inference import is_binary_route

        if is_binary_route(str(scope.get("path", ""))):
            # binary bodies (keys, weights, ciphertexts): streamed by their routes, each
            # under its own limit (api/rest_inference.py)
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
        given_type = _header(scope, b"content-type")
        if given_type is None:
            # a body without Content-Type is read as JSON (documented in docs/rest.md): the
            # app is told so, instead of answering 422 for a body it never looked at
            scope["headers"] = [*scope.get("headers", []), (b"content-type", b"application/json")]
        ctype = (given_type or "application/json").split(";")[0].strip().lower()
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
    """``rate`` requests per minute per client, bursts up to ``rate``, in this process.

    At most ``max_clients`` buckets are kept, least recently used first out; a client is
    only forgotten when it has been idle longest, and buckets that have refilled (which
    mean the same as no bucket) are dropped before any other, so many new clients cannot
    reset the bucket of one that is using its limit now.  The service uses the shared
    bucket of the plan store (:meth:`api.store.PlanStore.take_token`) instead."""

    def __init__(self, rate_per_min: int, max_clients: int = 100_000):
        self.rate = rate_per_min / 60.0
        self.burst = float(max(1, rate_per_min))
        self.max_clients = max_clients
        self.state: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, who: str, now: float | None = None) -> float:
        """0 when allowed, else the seconds until a token is free."""
        now = time.monotonic() if now is None else now
        tokens, last = self.state.get(who, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate
        self.state[who] = (tokens, now)
        self.state.move_to_end(who)
        if len(self.state) > self.max_clients:
            full_after = self.burst / self.rate
            for k in [k for k, (_, t) in self.state.items() if now - t >= full_after]:
                del self.state[k]
            while len(self.state) > self.max_clients:
                self.state.popitem(last=False)
        return wait


OPEN_PATHS = ("/healthz",)


class GuardMiddleware:
    """Host allow-list (DNS rebinding), API keys (``X-API-Key`` or ``Authorization: Bearer``;
    every path but /healthz), a per-key rate limit and a per-address limit of failed
    authentications (429 with Retry-After).  Sets ``state.owner`` (the sha256 of the key;
    ``""`` without keys) and ``state.admin``.  With a ``store`` the buckets live in it and
    are shared by every server process on that database; without, they are per process."""

    def __init__(self, app: ASGIApp, limits: RestLimits, metrics: Metrics, store: Any = None):
        self.app = app
        self.limits = limits
        self.metrics = metrics
        self.store = store
        self.keys = [k.encode() for k in sorted(limits.api_keys | limits.admin_keys)]
        self.admins = {hashlib.sha256(k.encode()).hexdigest() for k in limits.admin_keys}
        self.hosts = {h.lower() for h in limits.allowed_hosts} if limits.allowed_hosts is not None else None
        self.rate = limits.rate_limit_per_min
        self.buckets = {"req": TokenBucket(self.rate) if self.rate else None,
                        "auth": TokenBucket(limits.auth_fail_per_min) if limits.auth_fail_per_min else None}

    def _key_ok(self, given: str) -> bool:
        g = given.encode("utf-8", "replace")
        ok = False
        for k in self.keys:  # constant time per key, no early exit
            ok |= hmac.compare_digest(g, k)
        return ok

    def client_address(self, scope: Mapping[str, Any]) -> str:
        """The TCP peer, or the last address of X-Forwarded-For when the peer is the
        trusted proxy (``--trust-proxy``); the header is ignored from anyone else."""
        peer = str((scope.get("client") or ("?", 0))[0])
        if self.limits.trust_proxy is not None and peer == self.limits.trust_proxy:
            fwd = _header(scope, b"x-forwarded-for")
            if fwd:
                last = fwd.split(",")[-1].strip()
                if last:
                    return last[:64]
        return peer

    async def _take(self, kind: str, who: str, per_min: int, peek: bool = False) -> float:
        if self.store is not None:
            from starlette.concurrency import run_in_threadpool

            if peek:
                return float(await run_in_threadpool(self.store.peek_token, f"{kind}:{who}", per_min / 60.0,
                                                     float(max(1, per_min))))
            return float(await run_in_threadpool(self.store.take_token, f"{kind}:{who}", per_min / 60.0,
                                                 float(max(1, per_min))))
        bucket = self.buckets[kind]
        assert bucket is not None
        if peek:
            tokens, last = bucket.state.get(who, (bucket.burst, time.monotonic()))
            tokens = min(bucket.burst, tokens + (time.monotonic() - last) * bucket.rate)
            return 0.0 if tokens >= 1.0 else (1.0 - tokens) / bucket.rate
        return bucket.take(who)

    async def _too_many(self, send: Callable[[Any], Awaitable[None]], state: MutableMapping[str, Any],
                        wait: float, rule: str) -> None:
        state["error"] = "rate_limit"
        self.metrics.rate_limited.inc()
        retry = max(1, int(wait + 0.999))
        await _send_json(send, 429, {"error": "rate_limit", "rule": rule,
                                     "message": f"over the limit of {rule}; retry in {retry} s"},
                         {"Retry-After": str(retry)})

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["owner"] = ""
        state["admin"] = False
        if self.hosts is not None:
            host = (_header(scope, b"host") or "").lower()
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if host not in self.hosts and name not in self.hosts:
                state["error"] = "host"
                await _send_json(send, 421, {"error": "host", "field": "Host", "rule": "an allowed host name",
                                             "message": f"host {host[:100]!r} is not served here"})
                return
        path = scope.get("path", "")
        addr = self.client_address(scope)
        who = ""
        auth_rate = self.limits.auth_fail_per_min
        if self.keys and path not in OPEN_PATHS:
            if auth_rate:
                # an address that used up its failed attempts waits, whatever key it sends now
                wait = await self._take("auth", addr, auth_rate, peek=True)
                if wait > 0:
                    await self._too_many(send, state, wait, f"{auth_rate} failed authentications per minute")
                    return
            given = _header(scope, b"x-api-key")
            if given is None:
                auth = _header(scope, b"authorization") or ""
                if auth[:7].lower() == "bearer ":
                    given = auth[7:].strip()
            if not given or not self._key_ok(given):
                if auth_rate:
                    await self._take("auth", addr, auth_rate)
                state["error"] = "auth"
                await _send_json(send, 401, {
                    "error": "auth", "field": "X-API-Key", "rule": "a valid API key",
                    "message": "missing or wrong API key: send X-API-Key: KEY or Authorization: Bearer KEY"},
                    {"WWW-Authenticate": 'Bearer realm="slotplan"'})
                return
            owner = hashlib.sha256(given.encode()).hexdigest()
            state["owner"] = owner
            state["admin"] = owner in self.admins
            who = "key:" + owner[:32]
        if self.rate and path not in OPEN_PATHS:
            wait = await self._take("req", who or f"addr:{addr}", self.rate)
            if wait > 0:
                await self._too_many(send, state, wait, f"{self.rate} requests per minute")
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
            method = method_of(str(scope.get("method", "")))
            self.metrics.requests.labels(method, route, str(status)).inc()
            self.metrics.latency.labels(method, route).observe(secs)
            fields = {
                "event": "request",
                "request_id": rid,
                "method": str(scope.get("method", ""))[:16],
                "path": str(scope.get("path", ""))[:200],
                "status": status,
                "seconds": round(secs, 6),
            }
            for key in ("plan_id", "cache", "error"):
                if key in state:
                    fields[key] = state[key]
            log.info("request", extra={"fields": fields})


# --------------------------------------------------------------------------------------
