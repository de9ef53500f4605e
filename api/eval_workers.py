"""Evaluation worker processes that keep a (plan, key set, weights) warm (docs/inference-service.md).

Each worker is one ``spawn``ed process (the planning pool's worker loop,
:func:`api.workers._worker_main`) that holds at most one *triple* at a time: the parsed
plan and its slot tables, the weights (checked against the plan's weight tensors), their
packed plaintext vectors and, in the Go runtime, their encodings (``serverCache``), and
the evaluation key directory it reads keys from.  A request for a triple goes to a free
worker that holds it (warm); otherwise to a new worker, or to the free worker idle
longest, which drops what it held and loads the triple (cold).

Bounds: a worker's resident memory is bounded by the plan's process model
(:func:`backends.lattigo_memory.process_model` with cached plaintexts) times a headroom,
capped by ``max_memory_bytes``; a job that grows it over the bound is killed, and a
worker over it after a job, or idle longer than ``idle_s``, is recycled.  A worker that
dies mid-evaluation (killed, crashed) makes the request fail with :class:`JobKilled`
(``"crash"``) and is replaced by the next request.

No worker ever sees a secret key: the service never accepts one (key uploads with a
``secret.key`` member are refused), and :func:`evaluate_job` refuses a key directory
holding any file called ``secret.key`` before the Go side opens it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from api.workers import JobKilled, _worker_main, rss_bytes

__all__ = ["EvalPool", "EvalResult", "JobKilled", "RayEvalPool", "Triple", "evaluate_job", "memory_bound"]

Triple = tuple[str, str, str]  # (plan content id, key set id, weights id)

# the worker may hold this much more than the plan's modelled process (Python, numpy,
# the tables, glibc's arenas and Go's garbage between collections)
MEMORY_HEADROOM = 1.5
MEMORY_SLACK_BYTES = 512 * 2**20

# ------------------------------------------------------------------------------------
# In the worker process

_STATE: dict[str, Any] = {}


def _warm() -> None:
    """Imports and the Go runtime, before the worker says it is ready."""
    from backends import inference  # noqa: F401
    from backends.lattigo_backend import _ext

    _ext()


def memory_bound(plan: dict[str, Any], cap: int | None) -> int:
    """Resident bytes a worker holding ``plan`` may reach: its process model with the
    weights' encodings cached, times :data:`MEMORY_HEADROOM`, plus a fixed slack; at
    most ``cap``."""
    from backends.lattigo_backend import PLAINTEXT_INLINE_BYTES
    from backends.lattigo_memory import boot_memory, executor_memory, process_model
    from planner.frontend.params import Params

    params = Params.from_json(plan["params"])
    mem = executor_memory(plan)
    inline = len(plan.get("plaintexts") or {}) * int(params.slots) * 8 <= PLAINTEXT_INLINE_BYTES
    pm = process_model(plan, mem, inline_plaintexts=inline, cached_plaintexts=True, boot=boot_memory(params))
    bound = int(pm["total"] * MEMORY_HEADROOM) + MEMORY_SLACK_BYTES
    return bound if cap is None else min(bound, cap)


def _secret_in(eval_dir: Path) -> Path | None:
    for p in eval_dir.rglob("*"):
        if p.name.lower() == "secret.key":
            return p
    return None


@dataclass
class EvalResult:
    """What a worker answers: the output ciphertext file (or the one line saying why the
    input is refused) and the figures of the call."""

    data: bytes | None
    error: str | None
    warm: bool
    seconds: float
    sample_seconds: list[float] = field(default_factory=list)
    memory_bound: int = 0
    pid: int = 0
    # seconds the Go key store spent reading evaluation keys in this call (it reads them
    # from the key directory as the plan's key schedule asks, warm worker or not)
    key_load_seconds: float = 0.0


def evaluate_job(triple: Triple, plan_json: str | None, eval_dir: str, weights_path: str, ct: bytes,
                 cap: int | None) -> EvalResult:
    """Evaluate ``ct`` with the worker's triple (loaded first when it holds another or
    none: ``plan_json`` is then required).  Bad input (weights that do not fit the plan,
    a ciphertext of other keys) comes back as ``error``; nothing here reads a secret key."""
    import json

    from backends import inference as inf
    from common.errors import SlotplanError
    from planner.ir.io import read_arrays

    t0 = time.perf_counter()
    warm = _STATE.get("triple") == triple
    try:
        secret = _secret_in(Path(eval_dir))
        if secret is not None:
            raise inf.InferenceError(f"evaluation keys: {secret.name}: a secret key in the key directory; "
                                     "the evaluator never reads one")
        if not warm:
            _STATE.clear()
            if plan_json is None:
                raise inf.InferenceError("the worker does not hold this plan")
            plan = json.loads(plan_json)
            weights = inf._weights(inf._graph(plan), read_arrays(weights_path, "weights"))
            tables = inf._plan_tables(plan, None)
            _STATE.update(triple=triple, plan=plan, weights=weights, tables=tables,
                          bound=memory_bound(plan, cap))
        stats: dict[str, Any] = {}
        out = inf.evaluate(_STATE["plan"], eval_dir, _STATE["weights"], ct, tables=_STATE["tables"], stats=stats)
    except SlotplanError as e:
        if not warm:
            _STATE.clear()
        return EvalResult(None, " ".join(str(e).split()), warm, time.perf_counter() - t0, pid=os.getpid())
    go = stats.get("go") or {}
    return EvalResult(out, None, warm, time.perf_counter() - t0, list(stats.get("sample_seconds", [])),
                      int(_STATE["bound"]), os.getpid(), float(go.get("key_load_seconds") or 0.0))


# ------------------------------------------------------------------------------------
# In the server process


@dataclass
class _Worker:
    proc: Any  # a multiprocessing process (local pool) or a Ray actor handle (RayEvalPool)
    conn: Connection | None
    pid: int = 0
    triple: Triple | None = None
    bound: int | None = None
    busy: bool = False
    last: float = field(default_factory=time.monotonic)


class EvalPool:
    """At most ``size`` evaluation workers; :meth:`call` runs one evaluation (blocking:
    call it from a thread)."""

    def __init__(self, size: int, *, idle_s: float = 300.0, max_memory_bytes: int | None = None,
                 poll_s: float = 0.05, start_timeout_s: float = 120.0,
                 warm: Callable[[], None] | None = _warm) -> None:
        self.size = max(1, int(size))
        self.idle_s = idle_s
        self.max_memory_bytes = max_memory_bytes
        self.poll_s = poll_s
        self.start_timeout_s = start_timeout_s
        self.warm_fn = warm
        self._ctx = multiprocessing.get_context("spawn")
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="slotplan-eval-spawner")
        self._workers: list[_Worker] = []
        self._starting = 0
        self._cond = threading.Condition()
        self._closed = False
        self.recycled = {"idle": 0, "memory": 0, "crash": 0, "wall_time": 0, "switch": 0}
        self._reaper = threading.Thread(target=self._reap, name="slotplan-eval-reaper", daemon=True)
        self._reaper.start()

    # -------------------------------------------------------------- workers

    def _spawn(self) -> _Worker:
        # The worker asks for PR_SET_PDEATHSIG, which Linux sends when the *thread* that
        # forked it exits: a request thread (anyio retires idle ones) would take its worker
        # down with it, mid-evaluation.  Workers are therefore started by one thread that
        # lives as long as the pool.
        return self._spawner.submit(self._spawn_here).result()

    def _spawn_here(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker_main, args=(child, os.getpid(), self.warm_fn),
                                 name="slotplan-eval-worker", daemon=True)
        proc.start()
        child.close()
        w = _Worker(proc, parent, proc.pid or 0)
        try:
            ready = parent.poll(self.start_timeout_s) and parent.recv() == ("ready", None)
        except (EOFError, OSError):
            ready = False
        if not ready:
            self._kill(w, None)
            raise JobKilled("crash", "an evaluation worker did not start")
        return w

    def _kill(self, w: _Worker, why: str | None) -> None:
        self._stop(w)
        with self._cond:
            if w in self._workers:
                self._workers.remove(w)
            if why is not None:
                self.recycled[why] = self.recycled.get(why, 0) + 1
            self._cond.notify_all()

    def _stop(self, w: _Worker) -> None:
        with contextlib.suppress(OSError):
            w.proc.kill()
        w.proc.join(5)
        if w.conn is not None:
            with contextlib.suppress(OSError):
                w.conn.close()

    def _acquire(self, triple: Triple) -> tuple[_Worker, bool]:
        """A free worker holding ``triple`` (warm), else a new one, else the free worker
        idle longest (cold); waits while every worker is busy."""
        with self._cond:
            while True:
                if self._closed:
                    raise JobKilled("crash", "the evaluation pool is shut down")
                free = [w for w in self._workers if not w.busy]
                for w in free:
                    if w.triple == triple:
                        w.busy = True
                        return w, True
                if len(self._workers) + self._starting < self.size:
                    self._starting += 1
                    break
                if free:
                    w = min(free, key=lambda x: x.last)
                    w.busy = True
                    if w.triple is not None:
                        self.recycled["switch"] += 1
                    return w, False
                self._cond.wait(1.0)
        try:
            w = self._spawn()
        finally:
            with self._cond:
                self._starting -= 1
        w.busy = True
        with self._cond:
            self._workers.append(w)
        return w, False

    def _release(self, w: _Worker) -> None:
        with self._cond:
            w.busy = False
            w.last = time.monotonic()
            self._cond.notify_all()

    def _reap(self) -> None:
        while not self._closed:
            time.sleep(min(5.0, max(0.5, self.idle_s / 4)))
            now = time.monotonic()
            with self._cond:
                idle = [w for w in self._workers if not w.busy and now - w.last > self.idle_s]
                for w in idle:
                    w.busy = True  # nobody takes it while it is killed
            for w in idle:
                self._kill(w, "idle")

    # -------------------------------------------------------------- calls

    def call(self, triple: Triple, plan_json: str, eval_dir: str, weights_path: str, ct: bytes,
             deadline_s: float) -> EvalResult:
        """Evaluate on a worker; raises :class:`JobKilled` when the worker died, ran past
        ``deadline_s`` or grew over its memory bound (the worker is then replaced)."""
        w, warm = self._acquire(triple)
        t0 = time.monotonic()
        assert w.conn is not None
        try:
            w.conn.send((evaluate_job, (triple, None if warm else plan_json, eval_dir, weights_path, ct,
                                        self.max_memory_bytes)))
            while True:
                if w.conn.poll(self.poll_s):
                    kind, value = w.conn.recv()
                    break
                if not w.proc.is_alive():
                    raise JobKilled("crash", "the evaluation worker died mid-evaluation")
                if time.monotonic() - t0 > deadline_s:
                    raise JobKilled("wall_time", f"the evaluation took longer than {deadline_s:g} s")
                if w.bound is not None and rss_bytes(w.pid) > w.bound:
                    raise JobKilled("memory", f"the evaluation grew its worker over {w.bound} bytes, the plan's "
                                              "modelled process memory with headroom")
        except JobKilled as e:
            self._kill(w, e.limit)
            raise
        except (EOFError, OSError):
            self._kill(w, "crash")
            raise JobKilled("crash", "the evaluation worker died mid-evaluation") from None
        if kind != "ok":
            self._kill(w, "crash")
            raise JobKilled("crash", f"the evaluation worker failed: {value}")
        return self._done(w, triple, value)

    def _done(self, w: _Worker, triple: Triple, res: EvalResult) -> EvalResult:
        w.triple = triple if res.error is None else None
        w.bound = res.memory_bound or None
        if w.bound is not None and rss_bytes(w.pid) > w.bound:
            self._kill(w, "memory")  # holds more than its plan allows: the next request gets a fresh one
        else:
            self._release(w)
        return res

    # -------------------------------------------------------------- introspection

    def pids(self) -> list[int]:
        with self._cond:
            return sorted(w.pid for w in self._workers)

    def status(self) -> list[dict[str, Any]]:
        """One entry per worker: pid, busy, the triple it holds, its bound and resident bytes."""
        with self._cond:
            ws = list(self._workers)
        return [{"pid": w.pid, "busy": w.busy, "triple": w.triple, "memory_bound": w.bound,
                 "rss": rss_bytes(w.pid)} for w in ws]

    def busy_pids(self) -> list[int]:
        with self._cond:
            return sorted(w.pid for w in self._workers if w.busy)

    def shutdown(self) -> None:
        self._closed = True
        with self._cond:
            ws = list(self._workers)
            self._cond.notify_all()
        for w in ws:
            with contextlib.suppress(OSError):
                os.kill(w.pid, signal.SIGKILL)
            w.proc.join(2)
        self._spawner.shutdown(wait=False)


# ------------------------------------------------------------------------------------
# On Ray (serve --engine ray)


class _EvalActor:
    """A Ray actor process: the same state and function as a local worker."""

    def __init__(self) -> None:
        _warm()

    def pid(self) -> int:
        return os.getpid()

    def run(self, triple: Triple, plan_json: str | None, eval_dir: str, weights_path: str, ct: bytes,
            cap: int | None) -> EvalResult:
        return evaluate_job(triple, plan_json, eval_dir, weights_path, ct, cap)


class RayEvalPool(EvalPool):
    """The pool's routing (warm triples, new actors up to ``size``, the idle longest
    repurposed) over Ray actors, one CPU each; a local Ray with ``size`` CPUs when no
    ``address`` is given.  Actors read the key set and weights by path: on a cluster the
    data directory must be shared storage mounted at the same path on every node."""

    def __init__(self, size: int, address: str | None = None, **kw: Any) -> None:
        from common.errors import SlotplanError

        try:
            import ray
        except ImportError:
            raise SlotplanError("--engine ray needs ray, an optional dependency: pip install 'slotplan[ray]'") from None
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            try:
                if address:
                    ray.init(address=address, log_to_driver=False)
                else:
                    ray.init(num_cpus=max(1, int(size)), include_dashboard=False, log_to_driver=False)
            except Exception as e:  # noqa: BLE001 - connection refused, bad address, ...
                raise SlotplanError(f"cannot start or reach Ray{f' at {address}' if address else ''}: "
                                    f"{' '.join(str(e).split())[:300]}") from None
            self._started = True
        self._actor: Any = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(_EvalActor)
        super().__init__(size, **kw)

    def _spawn(self) -> _Worker:
        h: Any = self._actor.remote()
        try:
            pid = int(self._ray.get(h.pid.remote(), timeout=self.start_timeout_s))
        except Exception:  # noqa: BLE001 - the actor did not come up
            with contextlib.suppress(Exception):
                self._ray.kill(h)
            raise JobKilled("crash", "a Ray evaluation actor did not start") from None
        return _Worker(h, None, pid)

    def _stop(self, w: _Worker) -> None:
        with contextlib.suppress(Exception):
            self._ray.kill(w.proc)

    def call(self, triple: Triple, plan_json: str, eval_dir: str, weights_path: str, ct: bytes,
             deadline_s: float) -> EvalResult:
        from ray import exceptions as rex

        w, warm = self._acquire(triple)
        try:
            ref = w.proc.run.remote(triple, None if warm else plan_json, eval_dir, weights_path, ct,
                                    self.max_memory_bytes)
            res: EvalResult = self._ray.get(ref, timeout=deadline_s)
        except rex.GetTimeoutError:
            self._kill(w, "wall_time")
            raise JobKilled("wall_time", f"the evaluation took longer than {deadline_s:g} s") from None
        except rex.RayError as e:
            self._kill(w, "crash")
            raise JobKilled("crash", f"the Ray evaluation actor died mid-evaluation ({type(e).__name__})") from None
        except BaseException:
            self._kill(w, "crash")
            raise
        return self._done(w, triple, res)

    def shutdown(self) -> None:
        self._closed = True
        with self._cond:
            ws = list(self._workers)
            self._cond.notify_all()
        for w in ws:
            self._stop(w)
        self._spawner.shutdown(wait=False)
        if self._started:
            with contextlib.suppress(Exception):
                self._ray.shutdown()
