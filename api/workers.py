"""Planning worker processes that die with the server and can be recycled.

Each worker is one process (``spawn``: no forkserver left behind) with a pipe.  A job runs
under a wall-clock deadline and a memory budget on its *growth*: the worker's resident
memory (``/proc``, read by the parent) minus what it held when the job started, so what
an earlier job left behind does not count against the next one.  A job over either limit
is killed with its worker, which is replaced; a worker that holds more than
``idle_memory_bytes`` after a job is replaced too, so the same request gets the same
answer whichever worker takes it.  Workers exit when
the server goes away, whatever the signal: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux
and a thread that watches the parent pid everywhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Make the calling process exit when ``parent_pid`` does (SIGKILL included)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=watch, name="slotplan-parent-watch", daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before the watch started
        os._exit(0)


def _worker_main(conn: Connection, parent_pid: int, warm: Callable[[], None] | None) -> None:
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server handles ^C and kills us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if warm is not None:
        warm()
    conn.send(("ready", None))  # the deadline of a job starts after the imports
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        if msg is None:
            os._exit(0)
        fn, args = msg
        try:
            res: tuple[str, Any] = ("ok", fn(*args))
        except MemoryError:
            res = ("memory", None)
        except BaseException as e:  # noqa: BLE001 - reported to the parent, never lost
            res = ("exc", f"{type(e).__name__}: {e}")
        try:
            conn.send(res)
        except (OSError, ValueError):
            os._exit(1)


class JobKilled(Exception):
    """The job was killed: ``limit`` is ``"wall_time"``, ``"memory"`` or ``"crash"``."""

    def __init__(self, limit: str, detail: str):
        super().__init__(detail)
        self.limit = limit


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (0 when unknown)."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@dataclass
class _Worker:
    proc: multiprocessing.process.BaseProcess
    conn: Connection


class WorkerPool:
    """``size`` worker processes; :meth:`call` runs one job in a free worker (blocking, call
    it from a thread)."""

    def __init__(self, size: int, warm: Callable[[], None] | None = None, poll_s: float = 0.1,
                 start_timeout_s: float = 120.0, idle_memory_bytes: int | None = None):
        self.size = size
        self.idle_memory_bytes = idle_memory_bytes
        self.start_timeout_s = start_timeout_s
        self.warm = warm
        self.poll_s = poll_s
        self._ctx = multiprocessing.get_context("spawn")
        self._free: list[_Worker] = []
        self._all: set[int] = set()
        self._lock = threading.Lock()
        self._sem = threading.BoundedSemaphore(size)
        self._closed = False
        self.recycled = 0
        self.recycled_idle = 0
        self.last_growth = 0  # bytes the last finished job added to its worker's RSS (peak seen)

    def _spawn(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker_main, args=(child, os.getpid(), self.warm),
                                 name="slotplan-worker", daemon=True)
        proc.start()
        child.close()
        assert proc.pid is not None
        with self._lock:
            self._all.add(proc.pid)
        w = _Worker(proc, parent)
        try:
            ready = parent.poll(self.start_timeout_s) and parent.recv() == ("ready", None)
        except (EOFError, OSError):
            ready = False
        if not ready:
            self._kill(w)
            raise JobKilled("crash", "a planning worker did not start")
        return w

    def _take(self) -> _Worker:
        with self._lock:
            if self._free:
                return self._free.pop()
        return self._spawn()

    def _kill(self, w: _Worker) -> None:
        with contextlib.suppress(OSError):
            w.proc.kill()
        w.proc.join(5)
        with contextlib.suppress(OSError):
            w.conn.close()
        with self._lock:
            self._all.discard(w.proc.pid or -1)
        self.recycled += 1

    def pids(self) -> list[int]:
        with self._lock:
            return sorted(self._all)

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], deadline_s: float, memory_bytes: int | None) -> Any:
        if self._closed:
            raise JobKilled("crash", "the worker pool is shut down")
        with self._sem:
            w = self._take()
            t0 = time.monotonic()
            base = rss_bytes(w.proc.pid or 0)
            peak = base
            try:
                w.conn.send((fn, args))
                while True:
                    if w.conn.poll(self.poll_s):
                        kind, value = w.conn.recv()
                        break
                    if not w.proc.is_alive():
                        raise JobKilled("crash", "the planning worker died")
                    if time.monotonic() - t0 > deadline_s:
                        raise JobKilled("wall_time", f"the request took longer than {deadline_s:g} s")
                    now = rss_bytes(w.proc.pid or 0)
                    peak = max(peak, now)
                    if memory_bytes is not None and now - base > memory_bytes:
                        raise JobKilled("memory", f"the planning job grew its worker by over {memory_bytes} bytes")
            except JobKilled:
                self._kill(w)
                raise
            except (EOFError, OSError, BrokenPipeError):
                self._kill(w)
                raise JobKilled("crash", "the planning worker died") from None
            self.last_growth = peak - base
            idle = rss_bytes(w.proc.pid or 0)
            if self.idle_memory_bytes is not None and idle > self.idle_memory_bytes:
                self.recycled_idle += 1
                self._kill(w)  # holds too much after its job: the next job gets a fresh one
            else:
                with self._lock:
                    if not self._closed:
                        self._free.append(w)
                if self._closed:
                    self._kill(w)
        if kind == "memory":
            raise JobKilled("memory", "planning ran out of memory")
        if kind == "exc":
            raise RuntimeError(value)
        return value

    def shutdown(self) -> None:
        """Kill every worker now (running jobs included)."""
        self._closed = True
        with self._lock:
            free, self._free = self._free, []
            pids = sorted(self._all)
        for w in free:
            self._kill(w)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
