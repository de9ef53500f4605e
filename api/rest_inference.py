"""Private inference over REST (shared/SPEC.md section 7; docs/inference-service.md).

Endpoints (every resource belongs to the API key that created it; another key gets 404)::

    POST   /v1/plans/{id}/keys       tar of keygen's eval/ (application/x-tar, streamed to disk)
                                     -> 201 {"key_id", ...}
    DELETE /v1/keys/{key_id}         -> 204
    POST   /v1/weights               weights .npz (application/octet-stream) -> 201 {"weights_id", ...}
    DELETE /v1/weights/{weights_id}  -> 204
    POST   /v1/plans/{id}/evaluate?key_id=K&weights_id=W
                                     ciphertext file (application/octet-stream)
                                     -> 200 output ciphertext file, or 202 + Location: /v1/jobs/{job}
    GET    /v1/jobs/{job}            (api.rest) the job's status, for evaluation jobs too
    GET    /v1/jobs/{job}/result     -> 200 the output ciphertext file of a finished job

Uploads are durable before they are acknowledged: the body is streamed in chunks into a
temporary file under the data directory (never held whole in memory, bounded by its own
limit), checked, made durable (files fsynced, renamed into place, the directory fsynced),
recorded in the plan store (a committed SQLite transaction), and only then answered with
201.  A start-up sweep removes what a killed server left half-done (temporary files and
uploads that were renamed but never recorded).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import tarfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from fastapi import FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from api.eval_workers import EvalPool, EvalResult, JobKilled, Triple
from api.rest_models import _ERRORS, _ID_RE, _RETRY, ApiError, ErrorBody, RestLimits, _err
from api.store import KEYS, WEIGHTS, PlanStore
from common.errors import SlotplanError

log = logging.getLogger("slotplan.rest")

__all__ = ["InferenceService", "register"]

MAX_KEY_FILES = 100_000
_KEY_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_CHUNK = 1 << 20
_BINARY_ROUTES = re.compile(r"^/v1/(plans/[0-9a-f]{64}/(keys|evaluate)|weights)$")


def is_binary_route(path: str) -> bool:
    """The routes whose bodies are binary and streamed (the JSON body checks skip them)."""
    return bool(_BINARY_ROUTES.match(path))


# ------------------------------------------------------------------------------------
# Models (what /openapi.json documents)


class KeysCreated(BaseModel):
    key_id: str = Field(description="the key set's id for this API key (use as ?key_id=)")
    key_set_id: str = Field(description="the key set id keygen recorded in its manifest and every ciphertext")
    plan_id: str
    bytes: int = Field(description="bytes of evaluation keys stored")
    files: int


class WeightsCreated(BaseModel):
    weights_id: str = Field(description="the weights' id for this API key (use as ?weights_id=)")
    bytes: int
    tensors: dict[str, list[int]] = Field(description="every array of the .npz with its shape")


class EvalJobStatus(BaseModel):
    id: str
    status: str = Field(description="running | done | failed")
    result: str | None = Field(default=None, description="URL of the output ciphertext file once done")
    error: ErrorBody | None = None


# ------------------------------------------------------------------------------------
# Files


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _rm(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _tar_error(member: str, rule: str, status: int = 422) -> ApiError:
    return _err(status, "keys", f"evaluation keys: tar member {member[:200]!r}: {rule}", field="body",
                rule=rule)


def _member_file(m: tarfile.TarInfo) -> str | None:
    """The key file a tar member holds (its name in the key directory), None for the
    directory itself; :class:`ApiError` naming the member for anything else."""
    from backends import inference as inf

    name = m.name
    pp = PurePosixPath(name)
    if name.startswith("/") or pp.is_absolute():
        raise _tar_error(name, "an absolute path (members are relative to the key directory)")
    if ".." in pp.parts:
        raise _tar_error(name, "'..' in the path (members stay inside the key directory)")
    if m.issym() or m.islnk():
        raise _tar_error(name, "a link (only regular files are accepted)")
    if not (m.isfile() or m.isdir()):
        raise _tar_error(name, "a device or special file (only regular files are accepted)")
    parts = [p for p in pp.parts if p not in (".", "")]
    if parts and parts[0] == inf.EVAL_DIR_NAME:
        parts = parts[1:]
    if any(p.lower() == inf.SECRET_KEY_NAME for p in parts):
        raise _tar_error(name, "a secret key: the service never accepts one (upload keygen's eval/ "
                               "directory only; secret.key stays with the client)")
    if m.isdir():
        if parts:
            raise _tar_error(name, "a subdirectory (the evaluation key directory is flat)")
        return None
    if len(parts) != 1:
        raise _tar_error(name, "not in the key directory itself (the evaluation key directory is flat)")
    fname = parts[0]
    if not _KEY_FILE.match(fname) or not (fname == inf.MANIFEST_NAME or fname.endswith(".key")):
        raise _tar_error(name, "not an evaluation key file (manifest.json or *.key)")
    return fname


def _check_manifest(dest: Path, plan: dict[str, Any], seen: dict[str, str]) -> Any:
    """The key set's manifest: this plan's, naming exactly the files the tar held."""
    from backends import inference as inf

    if inf.MANIFEST_NAME not in seen:
        raise _err(422, "keys", "evaluation keys: no manifest.json in the tar (upload the eval/ directory keygen "
                                "wrote)", field="body", rule="keygen's eval/ directory")
    try:
        manifest = inf.read_manifest(dest)
        inf._check_keys_for(plan, "evaluation keys", manifest.plan_digest, manifest.params_digest)
    except SlotplanError as e:
        raise _err(422, "keys", " ".join(str(e).split()).replace(str(dest), "evaluation keys"), field="body",
                   rule="the manifest of this plan's keys") from None
    named = {k.file for k in manifest.rotations}
    if manifest.relin:
        named.add(manifest.relin)
    if manifest.boot is not None:
        b = manifest.boot
        named |= {k.file for k in b.galois} | {b.relin, b.dense_to_sparse, b.sparse_to_dense}
    extra = sorted(set(seen) - named - {inf.MANIFEST_NAME})
    if extra:
        raise _tar_error(seen[extra[0]], "not an evaluation key file of this key set (manifest.json does not name it)")
    missing = sorted(named - set(seen))
    if missing:
        raise _err(422, "keys", f"evaluation keys: manifest.json names {missing[0]!r}, which the tar does not hold",
                   field="body", rule="every key the manifest names")
    return manifest


def extract_keys(tar_path: Path, dest: Path, plan: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """Check a key upload's tar member by member and write its files into ``dest`` (made
    here, fsynced): regular files only, relative names inside the directory, no ``..``,
    no links or devices, no ``secret.key``, only ``manifest.json`` and ``*.key`` files
    that the manifest names; the manifest must be this plan's.  Returns what the store
    records.  Raises :class:`ApiError` (422, the member named) for anything else."""
    dest.mkdir(parents=True)
    try:
        tar = tarfile.open(tar_path, mode="r:")  # noqa: SIM115 - closed by the with below
    except (tarfile.TarError, OSError) as e:
        raise _err(422, "keys", f"evaluation keys: the body is not an uncompressed tar ({' '.join(str(e).split())})",
                   field="body", rule="an uncompressed tar of keygen's eval/ directory") from None
    seen: dict[str, str] = {}  # file name -> the tar member's name
    total = 0
    with tar:
        while True:
            try:
                m = tar.next()
            except tarfile.TarError as e:
                raise _err(422, "keys", f"evaluation keys: corrupt tar ({' '.join(str(e).split())})",
                           field="body", rule="an uncompressed tar") from None
            if m is None:
                break
            if len(seen) >= MAX_KEY_FILES:
                raise _tar_error(m.name, f"more than {MAX_KEY_FILES} members")
            fname = _member_file(m)
            if fname is None:
                continue
            if fname in seen:
                raise _tar_error(m.name, "given twice")
            seen[fname] = m.name
            total += int(m.size)
            if total > max_bytes:
                raise _tar_error(m.name, f"the key set is over the limit of {max_bytes} bytes", 413)
            src = tar.extractfile(m)
            if src is None:
                raise _tar_error(m.name, "cannot be read")
            out = dest / fname
            with src, open(out, "xb") as fh:
                shutil.copyfileobj(src, fh, _CHUNK)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(out, 0o444)
    manifest = _check_manifest(dest, plan, seen)
    _fsync_dir(dest)
    return {"key_set_id": manifest.key_set_id, "files": len(seen), "plan_digest": manifest.plan_digest,
            "bytes": total}


def check_weights(path: Path) -> dict[str, Any]:
    """Every array of a weights ``.npz`` (no pickles; real, finite numbers)."""
    from planner.ir.io import read_arrays

    try:
        arrays = read_arrays(path, "weights")
    except SlotplanError as e:
        raise _err(422, "weights", " ".join(str(e).split()).replace(str(path), "the body"), field="body",
                   rule="a .npz of real arrays") from None
    if not arrays:
        raise _err(422, "weights", "weights: the .npz holds no arrays", field="body", rule="one array per weight")
    for name, a in arrays.items():
        if not np.all(np.isfinite(a)):
            raise _err(422, "weights", f"weight {name!r}: holds NaN or infinite values", tensor=name,
                       field="body", rule="finite values")
    return {"tensors": {k: [int(d) for d in v.shape] for k, v in sorted(arrays.items())}}


# ------------------------------------------------------------------------------------
# Jobs


@dataclass
class EvalJob:
    id: str
    owner: str
    created: float = field(default_factory=time.time)
    status: str = "running"
    result: Path | None = None
    error: dict[str, Any] | None = None
    error_status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    data: bytes | None = None


@dataclass
class _PlanInfo:
    plan_json: str
    plan: dict[str, Any]
    digest: str
    params_digest: str


# ------------------------------------------------------------------------------------
# The service


class InferenceService:
    """Uploads on disk and in the store, the evaluation worker pool, evaluation jobs and
    their metrics."""

    def __init__(self, store: PlanStore, limits: RestLimits, metrics: Any) -> None:
        self.store = store
        self.limits = limits
        self.data = Path(limits.data_dir) if limits.data_dir else Path(str(store.path) + ".data")
        for sub in ("keys", "weights", "tmp", "jobs"):
            (self.data / sub).mkdir(parents=True, exist_ok=True)
        self.sweep()
        if limits.eval_engine == "ray":
            from api.eval_workers import RayEvalPool

            self.pool: EvalPool = RayEvalPool(limits.eval_workers, limits.ray_address,
                                              idle_s=limits.eval_worker_idle_s,
                                              max_memory_bytes=limits.eval_worker_memory_bytes)
        else:
            self.pool = EvalPool(limits.eval_workers, idle_s=limits.eval_worker_idle_s,
                                 max_memory_bytes=limits.eval_worker_memory_bytes)
        self.jobs: dict[str, EvalJob] = {}
        self._plans: OrderedDict[str, _PlanInfo] = OrderedDict()
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._metrics(metrics)

    def _metrics(self, metrics: Any) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        reg = metrics.registry
        self.m_requests = Counter("slotplan_eval_requests_total", "evaluation requests by outcome and warmth",
                                  ["outcome", "warm"], registry=reg)
        self.m_seconds = Histogram("slotplan_eval_seconds", "seconds per evaluation in its worker", ["warm"],
                                   registry=reg, buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300))
        self.m_bytes = Counter("slotplan_eval_bytes_total", "ciphertext bytes evaluated", ["direction"],
                               registry=reg)
        self.m_uploads = Counter("slotplan_uploads_total", "uploads by kind and outcome", ["kind", "outcome"],
                                 registry=reg)
        self.m_upload_bytes = Counter("slotplan_upload_bytes_total", "bytes of accepted uploads", ["kind"],
                                      registry=reg)
        self.m_workers = Gauge("slotplan_eval_workers", "evaluation worker processes", registry=reg)
        self.m_recycled = Gauge("slotplan_eval_workers_recycled", "evaluation workers replaced, by reason",
                                ["reason"], registry=reg)

    def sweep(self) -> None:
        """Remove what a killed server left: temporary files, job results, and uploads on
        disk that the store does not record (renamed, never acknowledged)."""
        keep = self.store.blob_paths()
        for sub in ("tmp", "jobs"):
            for p in (self.data / sub).iterdir():
                _rm(p)
        for sub in ("keys", "weights"):
            for p in (self.data / sub).iterdir():
                if str(p) not in keep:
                    _rm(p)

    def shutdown(self) -> None:
        self.pool.shutdown()

    def _tmp(self, suffix: str) -> Path:
        return self.data / "tmp" / f"{secrets.token_hex(16)}{suffix}"

    def plan_info(self, ref: str, plan_json: str) -> _PlanInfo:
        from backends import inference as inf

        with self._lock:
            info = self._plans.get(ref)
            if info is not None:
                self._plans.move_to_end(ref)
                return info
        plan = json.loads(plan_json)
        info = _PlanInfo(plan_json, plan, inf.inference_plan_digest(plan), inf.params_digest(plan))
        with self._lock:
            self._plans[ref] = info
            while len(self._plans) > 8:
                self._plans.popitem(last=False)
        return info

    # ---------------------------------------------------------------- bodies

    async def receive(self, request: Request, path: Path, limit: int, limit_field: str) -> int:
        """Stream the body into ``path`` in chunks (never whole in memory); 413 over ``limit``."""
        too_big = _err(413, "too_large", f"request body over the limit of {limit} bytes", field=f"limits.{limit_field}",
                       rule=f"at most {limit} bytes")
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise _err(422, "request", "bad Content-Length header", field="Content-Length", rule="an integer")
            if int(declared) > limit:
                raise too_big
        size = 0
        try:
            with open(path, "xb") as fh:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise too_big
                    fh.write(chunk)
                fh.flush()
                await run_in_threadpool(os.fsync, fh.fileno())
        except BaseException:
            _rm(path)
            raise
        return size

    async def read_body(self, request: Request, limit: int, limit_field: str) -> bytes:
        """The body in memory, bounded (ciphertexts: limited, and the worker needs them whole)."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _err(413, "too_large", f"request body over the limit of {limit} bytes",
                       field=f"limits.{limit_field}", rule=f"at most {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _err(413, "too_large", f"request body over the limit of {limit} bytes",
                           field=f"limits.{limit_field}", rule=f"at most {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    # ---------------------------------------------------------------- uploads

    def store_keys(self, owner: str, plan_ref: str, plan_id: str, tar: Path) -> KeysCreated:
        info = self.plan_info(plan_ref, self._plan_json(plan_ref))
        blob = secrets.token_hex(16)
        staging = self._tmp(".keys")
        final = self.data / "keys" / blob
        try:
            meta = extract_keys(tar, staging, info.plan, self.limits.max_eval_keys_bytes)
            os.rename(staging, final)
            _fsync_dir(final.parent)
        except BaseException:
            _rm(staging)
            raise
        finally:
            _rm(tar)
        try:
            kid = self.store.put_blob(owner, KEYS, blob, plan_ref, {**meta, "plan_id": plan_id}, str(final),
                                      int(meta["bytes"]))
        except BaseException:
            _rm(final)
            raise
        return KeysCreated(key_id=kid, key_set_id=str(meta["key_set_id"]), plan_id=plan_id, bytes=int(meta["bytes"]),
                           files=int(meta["files"]))

    def store_weights(self, owner: str, tmp: Path) -> WeightsCreated:
        blob = secrets.token_hex(16)
        final = self.data / "weights" / f"{blob}.npz"
        try:
            meta = check_weights(tmp)
            os.rename(tmp, final)
            _fsync_dir(final.parent)
        except BaseException:
            _rm(tmp)
            raise
        size = final.stat().st_size
        try:
            wid = self.store.put_blob(owner, WEIGHTS, blob, None, meta, str(final), size)
        except BaseException:
            _rm(final)
            raise
        return WeightsCreated(weights_id=wid, bytes=size, tensors=meta["tensors"])

    def _plan_json(self, ref: str) -> str:
        stored = self.store.get(ref)
        if stored is None:
            raise _err(404, "not_found", "the plan was deleted meanwhile")
        return stored.plan_json

    # ---------------------------------------------------------------- evaluation

    def check_ciphertext(self, info: _PlanInfo, key_meta: dict[str, Any], ct: bytes) -> None:
        from backends import inference as inf

        try:
            h, _ = inf.ciphertext_header(ct, "ciphertext file")
            # backends.inference._check_ct's rules, with this plan's digests computed once
            if h.kind != "inputs":
                raise inf.InferenceError(f"ciphertext file: holds {h.kind}, expected inputs (encrypt writes inputs, "
                                         "evaluate outputs)")
            if h.params_digest != info.params_digest:
                raise inf.InferenceError(f"ciphertext file: made for other parameters (params digest "
                                         f"{h.params_digest[:12]}...)")
            if h.plan_digest != info.digest:
                raise inf.InferenceError(f"ciphertext file: made for another plan (plan digest {h.plan_digest[:12]}..., "
                                         f"this plan's {info.digest[:12]}...)")
            per = len(inf._program_ops(info.plan, "input"))
            if len(h.ciphertexts) != h.samples * per:
                raise inf.InferenceError(f"ciphertext file: {len(h.ciphertexts)} ciphertexts for {h.samples} samples "
                                         f"of {per}")
        except SlotplanError as e:
            raise _err(422, "ciphertext", " ".join(str(e).split()), field="body",
                       rule="a ciphertext file encrypt wrote for this plan and key set") from None
        if h.key_set_id != key_meta.get("key_set_id"):
            raise _err(422, "ciphertext", f"ciphertext file: encrypted under other keys (key set "
                       f"{h.key_set_id[:12]}..., the key set {str(key_meta.get('key_set_id'))[:12]}... of key_id)",
                       field="body", rule="the key set of key_id")

    def evaluate_sync(self, triple: Triple, info: _PlanInfo, eval_dir: str, weights_path: str,
                      ct: bytes) -> EvalResult:
        return self.pool.call(triple, info.plan_json, eval_dir, weights_path, ct, self.limits.eval_timeout_s)

    def _observe(self, outcome: str, warm: str, res: EvalResult | None) -> None:
        self.m_requests.labels(outcome, warm).inc()
        if res is not None:
            self.m_seconds.labels(warm).observe(res.seconds)
        self.m_workers.set(len(self.pool.pids()))
        for reason, n in self.pool.recycled.items():
            self.m_recycled.labels(reason).set(n)

    async def run_job(self, job: EvalJob, triple: Triple, info: _PlanInfo, eval_dir: str, weights_path: str,
                      ct: bytes, keep_file: bool) -> None:
        """Evaluate and record the outcome in ``job`` (never raises)."""
        try:
            res = await run_in_threadpool(self.evaluate_sync, triple, info, eval_dir, weights_path, ct)
        except JobKilled as e:
            if e.limit == "crash":
                job.error_status, job.error = 503, {
                    "error": "worker", "message": f"{e}; the worker was replaced, retry the request",
                    "rule": "retry after Retry-After"}
                job.headers = {"Retry-After": str(self.limits.retry_after_s)}
                self._observe("crash", "none", None)
            else:
                job.error_status, job.error = 413, {"error": "limit", "message": str(e),
                                                    "field": f"limits.eval_{'timeout_s' if e.limit == 'wall_time' else 'worker_memory_bytes'}"}
                self._observe("limit", "none", None)
            job.status = "failed"
            job.done.set()
            return
        except Exception as e:  # noqa: BLE001 - recorded, the client gets a clean answer
            log.error("evaluation", exc_info=e, extra={"fields": {"event": "eval_internal_error"}})
            job.status, job.error_status = "failed", 503
            job.error = {"error": "worker", "message": f"evaluation failed: {type(e).__name__}; retry the request"}
            job.headers = {"Retry-After": str(self.limits.retry_after_s)}
            self._observe("crash", "none", None)
            job.done.set()
            return
        warm = "warm" if res.warm else "cold"
        if res.error is not None:
            job.status, job.error_status = "failed", 422
            fld = "weights_id" if res.error.startswith("weight") else "key_id" if "evaluation keys" in res.error else "body"
            job.error = {"error": "evaluate", "message": res.error, "field": fld}
            self._observe("bad_input", warm, res)
        else:
            assert res.data is not None
            self.m_bytes.labels("in").inc(len(ct))
            self.m_bytes.labels("out").inc(len(res.data))
            self._observe("ok", warm, res)
            job.headers = {"x-slotplan-warm": warm, "x-slotplan-eval-seconds": f"{res.seconds:.6f}",
                           "x-slotplan-key-load-seconds": f"{res.key_load_seconds:.6f}"}
            if keep_file:
                path = self.data / "jobs" / f"{job.id}.ct"
                await run_in_threadpool(path.write_bytes, res.data)
                job.result = path
            else:
                job.data = res.data
            job.status = "done"
        job.done.set()

    def new_job(self, owner: str) -> EvalJob:
        self.prune()
        job = EvalJob(id=secrets.token_hex(32), owner=owner)
        self.jobs[job.id] = job
        return job

    def prune(self) -> None:
        cutoff = time.time() - self.limits.eval_job_ttl_s
        for jid in [j.id for j in self.jobs.values() if j.created < cutoff and j.done.is_set()]:
            job = self.jobs.pop(jid)
            if job.result is not None:
                _rm(job.result)

    def job(self, job_id: str, owner: str, admin: bool) -> EvalJob | None:
        job = self.jobs.get(job_id)
        if job is None or (job.owner != owner and not admin):
            return None
        return job

    def job_status(self, job: EvalJob) -> EvalJobStatus:
        return EvalJobStatus(id=job.id, status=job.status,
                             result=f"/v1/jobs/{job.id}/result" if job.status == "done" else None,
                             error=ErrorBody(**{k: v for k, v in (job.error or {}).items()
                                                if k in ErrorBody.model_fields}) if job.error else None)


def _binary(desc: str, media: str = "application/octet-stream") -> dict[str, Any]:
    return {"required": True, "description": desc, "content": {media: {"schema": {"type": "string", "format": "binary"}}}}


class _Routes:
    """What the inference routes do, one method per route (``register`` adds thin FastAPI
    functions that call them): the caller's identity, plan and blob lookups scoped to it,
    bounded uploads, evaluation and its job's result."""

    def __init__(self, svc: InferenceService, store: PlanStore, limits: RestLimits):
        self.svc, self.store, self.limits = svc, store, limits

    @staticmethod
    def owner(request: Request) -> str:
        return str(getattr(request.state, "owner", ""))

    @staticmethod
    def admin(request: Request) -> bool:
        return bool(getattr(request.state, "admin", False))

    @staticmethod
    def ctype(request: Request, allowed: tuple[str, ...]) -> None:
        ctype = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
        if ctype not in allowed:
            raise _err(415, "request", f"the body must be {allowed[0]}, not {ctype[:60] or 'without a Content-Type'}",
                       field="Content-Type", rule=allowed[0])

    async def plan_ref(self, plan_id: str, request: Request) -> tuple[str, str]:
        if not _ID_RE.match(plan_id):
            raise _err(404, "not_found", f"no plan {plan_id[:80]!r}: ids are 64 hex digits")
        request.state.plan_id = plan_id
        ref = await run_in_threadpool(self.store.resolve, self.owner(request), plan_id, self.admin(request))
        if ref is None:
            raise _err(404, "not_found", f"no plan with id {plan_id}")
        stored = await run_in_threadpool(self.store.get, ref)
        if stored is None:
            raise _err(404, "not_found", f"no plan with id {plan_id}")
        return ref, stored.plan_json

    async def blob(self, oid: str, kind: str, request: Request, what: str) -> Any:
        fld = "key_id" if kind == KEYS else "weights_id"
        if not _ID_RE.match(oid):
            raise _err(404, "not_found", f"no {what} {oid[:80]!r}: ids are 64 hex digits", field=fld)
        blob = await run_in_threadpool(self.store.get_blob, self.owner(request), oid, kind, self.admin(request))
        if blob is None:
            raise _err(404, "not_found", f"no {what} with id {oid}", field=fld)
        return blob

    async def upload(self, request: Request, kind: str, suffix: str, limit: int, limit_name: str,
                     store_fn: Callable[[Path], BaseModel]) -> JSONResponse:
        """Stream a body to a temporary file (bounded), store it (one line on a refusal) and
        count it; the temporary file never outlives the request."""
        svc = self.svc
        tmp = svc._tmp(suffix)
        try:
            size = await svc.receive(request, tmp, limit, limit_name)
            created = await run_in_threadpool(store_fn, tmp)
        except ApiError:
            svc.m_uploads.labels(kind, "refused").inc()
            raise
        finally:
            _rm(tmp)
        svc.m_uploads.labels(kind, "stored").inc()
        svc.m_upload_bytes.labels(kind).inc(size)
        return JSONResponse(created.model_dump(), status_code=201)

    async def post_keys(self, plan_id: str, request: Request) -> JSONResponse:
        ref, _ = await self.plan_ref(plan_id, request)
        self.ctype(request, ("application/x-tar", "application/tar"))
        # the tar itself may be a little larger than the keys it holds (512-byte headers)
        return await self.upload(request, "keys", ".tar", self.limits.max_eval_keys_bytes + (1 << 20),
                                 "max_eval_keys_bytes",
                                 lambda tmp: self.svc.store_keys(self.owner(request), ref, plan_id, tmp))

    async def post_weights(self, request: Request) -> JSONResponse:
        self.ctype(request, ("application/octet-stream", "application/x-npz"))
        return await self.upload(request, "weights", ".npz", self.limits.max_weights_bytes, "max_weights_bytes",
                                 lambda tmp: self.svc.store_weights(self.owner(request), tmp))

    async def delete(self, request: Request, blob_id: str, kind: str, what: str, field: str) -> Response:
        await self.blob(blob_id, kind, request, what)
        blob = await run_in_threadpool(self.store.delete_blob, self.owner(request), blob_id, kind, self.admin(request))
        if blob is None:
            raise _err(404, "not_found", f"no {what} with id {blob_id}", field=field)
        await run_in_threadpool(_rm, Path(blob.path))
        return Response(status_code=204)

    async def evaluate(self, plan_id: str, request: Request, key_id: str, weights_id: str,
                       prefer: str | None) -> Response:
        svc, limits = self.svc, self.limits
        ref, plan_json = await self.plan_ref(plan_id, request)
        keys = await self.blob(key_id, KEYS, request, "key set")
        weights = await self.blob(weights_id, WEIGHTS, request, "weights")
        if keys.plan_ref != ref:
            raise _err(422, "keys", f"key set {key_id[:16]}... was uploaded for another plan (plan "
                       f"{str(keys.meta.get('plan_id', ''))[:16]}...)", field="key_id", rule="keys of this plan")
        self.ctype(request, ("application/octet-stream",))
        ct = await svc.read_body(request, limits.max_ciphertext_bytes, "max_ciphertext_bytes")
        info = await run_in_threadpool(svc.plan_info, ref, plan_json)
        try:
            await run_in_threadpool(svc.check_ciphertext, info, keys.meta, ct)
        except ApiError:
            svc._observe("bad_input", "none", None)
            raise
        job = svc.new_job(self.owner(request))
        wait = 0.0 if prefer and "respond-async" in prefer.lower() else limits.eval_sync_wait_s
        self._spawn(svc.run_job(job, (ref, keys.id, weights.id), info, keys.path, weights.path, ct,
                                keep_file=wait == 0.0))
        if wait > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(job.done.wait()), wait)
        if job.done.is_set():
            svc.jobs.pop(job.id, None)
            if job.status == "failed":
                assert job.error is not None
                raise ApiError(job.error_status, job.error, job.headers)
            assert job.data is not None
            return Response(job.data, media_type="application/octet-stream", headers=job.headers)

        # the job outlives this request: keep its result on disk for GET /v1/jobs/{job}/result
        async def keep() -> None:
            await job.done.wait()
            if job.data is not None:
                path = svc.data / "jobs" / f"{job.id}.ct"
                await run_in_threadpool(path.write_bytes, job.data)
                job.result, job.data = path, None

        if wait > 0:
            self._spawn(keep())
        loc = f"/v1/jobs/{job.id}"
        return JSONResponse(svc.job_status(job).model_dump(), status_code=202,
                            headers={"Location": loc, "Retry-After": str(limits.retry_after_s)})

    def _spawn(self, coro: Any) -> None:
        """Run ``coro`` as a task the service holds until it ends (shutdown waits for it)."""
        task = asyncio.create_task(coro)
        self.svc._tasks.add(task)
        task.add_done_callback(self.svc._tasks.discard)

    async def result(self, job_id: str, request: Request) -> Response:
        svc = self.svc
        job = svc.job(job_id, self.owner(request), self.admin(request)) if _ID_RE.match(job_id) else None
        if job is None:
            raise _err(404, "not_found", f"no evaluation job with id {job_id[:80]}")
        if job.status == "running" or (job.status == "done" and job.result is None and job.data is None):
            return JSONResponse(svc.job_status(job).model_dump(), status_code=202,
                                headers={"Retry-After": str(self.limits.retry_after_s), "Location": f"/v1/jobs/{job.id}"})
        if job.status == "failed":
            assert job.error is not None
            raise ApiError(job.error_status, job.error, job.headers)
        data = job.data if job.data is not None else await run_in_threadpool(job.result.read_bytes)  # type: ignore[union-attr]
        return Response(data, media_type="application/octet-stream", headers=job.headers)


_UP_ERRORS = {**_ERRORS, 413: {"model": ErrorBody, "description": "over the upload's own size limit"},
              415: {"model": ErrorBody, "description": "wrong Content-Type"}}
_CT_RESPONSE = {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}


def register(app: FastAPI, store: PlanStore, limits: RestLimits, metrics: Any) -> InferenceService:
    """Add the inference routes to ``app`` (each calls its :class:`_Routes` method); returns
    the service (its pool must be shut down)."""
    svc = InferenceService(store, limits, metrics)
    r = _Routes(svc, store, limits)

    @app.post("/v1/plans/{plan_id}/keys", status_code=201, response_model=KeysCreated, responses=_UP_ERRORS,
              summary="Upload a plan's evaluation keys (tar of keygen's eval/)",
              openapi_extra={"requestBody": _binary("an uncompressed tar of the eval/ directory keygen wrote "
                                                    "(manifest.json and *.key files; never secret.key); streamed "
                                                    "to disk, limit limits.max_eval_keys_bytes", "application/x-tar")})
    async def post_keys(plan_id: str, request: Request) -> JSONResponse:
        return await r.post_keys(plan_id, request)

    @app.delete("/v1/keys/{key_id}", status_code=204, response_class=Response, responses=_ERRORS,
                summary="Delete an uploaded key set")
    async def delete_keys(key_id: str, request: Request) -> Response:
        return await r.delete(request, key_id, KEYS, "key set", "key_id")

    @app.post("/v1/weights", status_code=201, response_model=WeightsCreated, responses=_UP_ERRORS,
              summary="Upload weights (.npz)",
              openapi_extra={"requestBody": _binary("the weights .npz (arrays named as the graph's weight tensors; "
                                                    "checked against a plan when evaluated), limit "
                                                    "limits.max_weights_bytes")})
    async def post_weights(request: Request) -> JSONResponse:
        return await r.post_weights(request)

    @app.delete("/v1/weights/{weights_id}", status_code=204, response_class=Response, responses=_ERRORS,
                summary="Delete uploaded weights")
    async def delete_weights(weights_id: str, request: Request) -> Response:
        return await r.delete(request, weights_id, WEIGHTS, "weights", "weights_id")

    @app.post("/v1/plans/{plan_id}/evaluate", summary="Evaluate the plan on a ciphertext file",
              response_class=Response,
              responses={**_UP_ERRORS,
                         200: {**_CT_RESPONSE, "description": "the output ciphertext file (what decrypt reads)"},
                         202: {"model": EvalJobStatus, "description": "evaluation takes long: poll Location "
                               "(/v1/jobs/{job}), then GET /v1/jobs/{job}/result",
                               "headers": {"Location": {"schema": {"type": "string"}}, **_RETRY}},
                         503: {"model": ErrorBody, "description": "the evaluation worker died (replaced); retry",
                               "headers": _RETRY}},
              openapi_extra={"requestBody": _binary("a ciphertext file as encrypt writes it (this plan, the key "
                                                    "set of key_id), limit limits.max_ciphertext_bytes")})
    async def post_evaluate(plan_id: str, request: Request,
                            key_id: str = Query(..., description="from POST /v1/plans/{id}/keys"),
                            weights_id: str = Query(..., description="from POST /v1/weights"),
                            prefer: str | None = Header(None, description="respond-async: answer 202 at once")) -> Response:
        return await r.evaluate(plan_id, request, key_id, weights_id, prefer)

    @app.get("/v1/jobs/{job_id}/result", response_class=Response, summary="The output of a finished evaluation job",
             responses={**_ERRORS,
                        200: {**_CT_RESPONSE, "description": "the output ciphertext file"},
                        202: {"model": EvalJobStatus, "description": "still running; retry after Retry-After"}})
    async def get_result(job_id: str, request: Request) -> Response:
        return await r.result(job_id, request)

    app.state.inference = svc
    return svc
