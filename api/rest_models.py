"""REST service: limits, request and response models, and the error shape (the CLI's
one-line fields)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from common.errors import GraphError, ParamsError, SlotplanError
from planner.ir import PLAN_SCHEMA
from planner.ir.io import DEFAULT_MAX_TABLE_BYTES
from planner.pipeline import PlanOptionsLiteral, PlanTimeout

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
    # keys that may list every key's plans (GET /v1/plans?all=true) and read or delete any
    # of them; each is also an API key
    admin_keys: frozenset[str] = frozenset()
    # requests with a missing or wrong API key per minute per client address; past it
    # every request from that address gets 429 (key checked or not) until the bucket refills
    auth_fail_per_min: int = 10
    # the address of a reverse proxy whose X-Forwarded-For is believed (None: the header
    # is ignored, the TCP peer is the client)
    trust_proxy: str | None = None
    # a worker whose resident memory after a job is over this is replaced before the next
    # job (a job's own limit, worker_memory_bytes, counts its growth during the job)
    worker_idle_memory_bytes: int | None = 1 * 2**30
    # private inference (docs/inference-service.md): upload limits (an n14boot key set is
    # 1.4 GB, n16boot 7.9 GB), evaluation workers, their bounds and the jobs' lifetime
    max_eval_keys_bytes: int = 4 * 2**30
    max_weights_bytes: int = 512 * 2**20
    max_ciphertext_bytes: int = 256 * 2**20
    eval_workers: int = 2
    eval_timeout_s: float = 600.0
    eval_sync_wait_s: float = 60.0
    eval_worker_idle_s: float = 300.0
    # a cap on the evaluation worker's own bound (the plan's process model with headroom)
    eval_worker_memory_bytes: int | None = None
    eval_job_ttl_s: float = 900.0
    # where uploads live (None: beside the plan store, "<db>.data/")
    data_dir: str | None = None
    # evaluation workers: local processes, or Ray actors (a local Ray, or the cluster at
    # ray_address)
    eval_engine: Literal["local", "ray"] = "local"
    ray_address: str | None = None


# --------------------------------------------------------------------------------------
# Request / response models (these are what /openapi.json documents)
# --------------------------------------------------------------------------------------


class PlanRequest(BaseModel):
    """Body of ``POST /v1/plans``."""

    model_config = ConfigDict(extra="forbid")
    graph: dict[str, Any] = Field(description="a slotplan.graph/1 document")
    params: str | dict[str, Any] = Field(
        default="n16", description="preset name (n12..n16, n14boot, n16boot), \"auto\" (the smallest secure "
                                   "preset that fits without bootstrapping, else n16boot) or a CKKS parameter object"
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
    owner: str | None = Field(default=None, description="with all=true (admin keys): the owner, the first "
                                                        "16 hex digits of the sha256 of its API key")


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
    421: {"model": ErrorBody, "description": "the Host header is not served here (DNS rebinding guard)"},
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
