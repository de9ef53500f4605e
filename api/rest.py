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
    GET    /v1/plans/{id}/tables  npz bytes (every table the plan names, as planner.ir.io writes)
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

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.rest_jobs import (
    PlanService,
    _plan_response,
    _unlink,
    check_memory_cap,
    graph_work,
    validate_request,
)
from api.rest_middleware import (
    OPEN_PATHS,
    AccessLogMiddleware,
    BodyLimitMiddleware,
    GuardMiddleware,
    JsonFormatter,
    Metrics,
    TokenBucket,
    configure_logging,
)
from api.rest_models import (
    _ERRORS,
    _ID_RE,
    _RETRY,
    API_VERSION,
    ApiError,
    DiffRequest,
    ErrorBody,
    Health,
    JobStatus,
    PlanList,
    PlanListItem,
    PlanRequest,
    PlanResponse,
    Ready,
    RestLimits,
    _err,
    error_body,
)
from api.store import ANONYMOUS, PlanStore
from common.errors import SlotplanError
from planner.pipeline import plan_table_names
from planner.report.diff import DiffInputError, diff_plans, render_markdown

# the service's public names, wherever they are defined (api.rest is what users import)
__all__ = [
    "JsonFormatter", "PlanRequest", "RestLimits", "TokenBucket", "check_memory_cap", "create_app",
    "default_allowed_hosts", "graph_work", "is_loopback", "read_api_keys", "serve", "validate_request",
]

log = logging.getLogger("slotplan.rest")


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
    """The graph schema (planner.frontend.graph.GraphFile), the service's time-limit cap, the
    security schemes and the Retry-After headers, in the generated document."""
    from planner.frontend.graph import GraphFile

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
def _owner(request: Request) -> str:
    return str(getattr(request.state, "owner", ANONYMOUS))

def _admin(request: Request) -> bool:
    return bool(getattr(request.state, "admin", False))

def _accepted(plan_id: str, limits: RestLimits) -> JSONResponse:
    loc = f"/v1/jobs/{plan_id}"
    return JSONResponse(JobStatus(id=plan_id, status="running").model_dump(), status_code=202,
                        headers={"Location": loc, "Retry-After": str(limits.retry_after_s),
                                 "x-slotplan-plan-id": plan_id})


async def _stored(store: PlanStore, plan_id: str, request: Request) -> tuple[str, str]:
    if not _ID_RE.match(plan_id):
        raise _err(404, "not_found", f"no plan {plan_id[:80]!r}: ids are 64 hex digits")
    request.state.plan_id = plan_id
    stored = await run_in_threadpool(store.get_owned, _owner(request), plan_id, _admin(request))
    if stored is None:
        raise _err(404, "not_found", f"no plan with id {plan_id}")
    return plan_id, stored.plan_json


def _register_error_handlers(app: FastAPI) -> None:
    """Every error as one JSON body with a kind and a message; never a traceback."""

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


def _register_plan_routes(app: FastAPI, service: PlanService, store: PlanStore, limits: RestLimits) -> None:
    """Planning: POST /v1/plans (answered, or a job) and the jobs."""

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
        wait = 0.0 if prefer and "respond-async" in prefer.lower() else limits.sync_wait_s
        status, body, hit, oid = await service.plan(vr, wait, _owner(request))
        request.state.plan_id = oid
        request.state.cache = "hit" if hit else "miss"
        if status == 202:
            return _accepted(oid, limits)
        if status != 200:
            assert isinstance(body, dict)
            raise ApiError(status, body)
        assert isinstance(body, str)
        return await run_in_threadpool(_plan_response, oid, body, hit)

    @app.get("/v1/jobs/{job_id}", response_model=JobStatus, responses=_ERRORS, summary="A planning job")
    async def get_job(job_id: str, request: Request) -> JSONResponse:
        if not _ID_RE.match(job_id):
            raise _err(404, "not_found", f"no job {job_id[:80]!r}: ids are 64 hex digits")
        inference = getattr(app.state, "inference", None)
        ev = inference.job(job_id, _owner(request), _admin(request)) if inference is not None else None
        if ev is not None and inference is not None:  # an evaluation job (api/rest_inference.py)
            hdrs = {"Retry-After": str(limits.retry_after_s)} if ev.status == "running" else {}
            if ev.status == "done":
                hdrs["Location"] = f"/v1/jobs/{job_id}/result"
            return JSONResponse(inference.job_status(ev).model_dump(), headers=hdrs)
        st = await service.job(job_id, _owner(request), _admin(request))
        if st is None:
            raise _err(404, "not_found", f"no job with id {job_id}")
        headers = {"Retry-After": str(limits.retry_after_s)} if st.status == "running" else {}
        if st.status == "done":
            headers["Location"] = f"/v1/plans/{job_id}"
        return JSONResponse(st.model_dump(), headers=headers)



def _register_stored_routes(app: FastAPI, service: PlanService, store: PlanStore, limits: RestLimits) -> None:
    """The stored plans of an API key: list, read, delete, their tables, diffs."""

    @app.get("/v1/plans", response_model=PlanList, responses=_ERRORS, summary="Stored plans, newest first")
    async def list_plans(request: Request, limit: int = Query(50, ge=1, le=500),
                         offset: int = Query(0, ge=0, le=10**9),
                         all: bool = Query(False, description="admin keys only: every key's plans, with "
                                                              "their owner")) -> PlanList:
        if all and not _admin(request):
            raise _err(403, "forbidden", "all=true lists every key's plans: an admin key only",
                       field="all", rule="an admin key (--admin-keys)")
        total, rows = await run_in_threadpool(store.page_owned, None if all else _owner(request), limit, offset)
        more = "&all=true" if all else ""
        nxt = f"/v1/plans?limit={limit}&offset={offset + limit}{more}" if offset + limit < total else None
        return PlanList(items=[PlanListItem(**r) for r in rows], total=total, limit=limit, offset=offset, next=nxt)

    @app.get("/v1/plans/{plan_id}", response_model=PlanResponse, responses=_ERRORS, summary="A stored plan")
    async def get_plan(plan_id: str, request: Request) -> Response:
        pid, plan_json = await _stored(store, plan_id, request)
        return await run_in_threadpool(_plan_response, pid, plan_json, True)

    @app.delete("/v1/plans/{plan_id}", status_code=204, response_class=Response, responses=_ERRORS,
                summary="Delete a stored plan")
    async def delete_plan(plan_id: str, request: Request) -> Response:
        if not _ID_RE.match(plan_id) or not await run_in_threadpool(store.delete_owned, _owner(request), plan_id,
                                                                    _admin(request)):
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
        pid, plan_json = await _stored(store, plan_id, request)
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
                _, text = await _stored(store, x, request)
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


def _register_ops_routes(app: FastAPI, service: PlanService, store: PlanStore, limits: RestLimits, metrics: Metrics) -> None:
    """Liveness, readiness and Prometheus metrics."""

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


def create_app(
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
            inference = getattr(app.state, "inference", None)
            if inference is not None:
                inference.shutdown()

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
    _register_error_handlers(app)
    _register_plan_routes(app, service, store, limits)
    _register_stored_routes(app, service, store, limits)
    _register_ops_routes(app, service, store, limits, metrics)

    from api.rest_inference import register as register_inference  # issue 39: keys, weights, evaluate

    app.state.inference = register_inference(app, store, limits, metrics)
    from api.plan_page import register as register_plan_page  # issue 17: GET /v1/plans/{id}/view + Link
    register_plan_page(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=limits.max_body_bytes)  # type: ignore[arg-type]
    app.add_middleware(GuardMiddleware, limits=limits, metrics=metrics, store=store)  # type: ignore[arg-type]
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
    # proxy headers are the guard's business (RestLimits.trust_proxy): uvicorn's own default
    # would believe X-Forwarded-For from any loopback peer
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False, log_config=None,
                proxy_headers=False, server_header=False)
