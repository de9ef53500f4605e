"""Bounded loopback load test of the REST service.

    python -m api.loadtest --requests 200 --concurrency 8
    python -m api.loadtest --tenants 4 --clients 16 --per-client 100 [--kill 3]

Starts ``slotplan serve`` on 127.0.0.1 (a free port) with a temporary plan store, sends a
fixed, bounded mix of requests with httpx (distinct small matvec graphs -> planning;
repeats -> stored plans; GET by id; invalid graphs that must get 422; oversized bodies that must get 413), then prints the
error count and latency percentiles and stops the server.  Only loopback addresses are
used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

HOST = "127.0.0.1"
MAX_REQUESTS = 5000
MAX_CONCURRENCY = 64


def matvec_graph(n: int, k: int) -> dict[str, Any]:
    return {
        "schema": "slotplan.graph/1",
        "name": f"mv{n}x{k}",
        "tensors": {"W": {"shape": [n, k], "role": "weight"}, "x": {"shape": [k], "role": "input"}},
        "nodes": [{"id": "y", "op": "matvec", "inputs": ["W", "x"]}],
        "outputs": ["y"],
    }


def request_mix(count: int, distinct: int) -> list[tuple[str, str, dict[str, Any] | None, set[int]]]:
    """(kind, method/path, body, accepted statuses) for every request, deterministic."""
    sizes = [(n, k) for n in (32, 64, 128, 256) for k in (32, 64, 128, 256)][:distinct]
    out: list[tuple[str, str, dict[str, Any] | None, set[int]]] = []
    for i in range(count):
        n, k = sizes[i % len(sizes)]
        if i % 20 == 19:
            bad = matvec_graph(n, k)
            bad["nodes"][0]["inputs"] = ["W", "nope"]
            out.append(("invalid", "POST /v1/plans", {"graph": bad, "params": "n12"}, {422}))
        elif i % 20 == 14:  # oversized: over the service's 8 MiB body limit
            big = matvec_graph(n, k)
            big["name"] = "x" * (9 * 2**20)
            out.append(("oversized", "POST /v1/plans", {"graph": big, "params": "n12"}, {413}))
        elif i % 10 == 9:
            out.append(("healthz", "GET /healthz", None, {200}))
        else:
            body = {"graph": matvec_graph(n, k), "params": "n12", "options": {"time_limit_s": 5}}
            out.append(("plan", "POST /v1/plans", body, {200}))
    return out


@dataclass
class Results:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    cache: Counter[str] = field(default_factory=Counter)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    i = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[i]


async def drive(base: str, mix: list[tuple[str, str, dict[str, Any] | None, set[int]]], concurrency: int,
                timeout: float) -> tuple[Results, float]:
    res = Results()
    sem = asyncio.Semaphore(concurrency)
    ids: list[str] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=timeout, limits=limits) as client:

        async def one(kind: str, what: str, body: dict[str, Any] | None, ok: set[int]) -> None:
            method, path = what.split(" ", 1)
            async with sem:
                if kind == "healthz" and ids:  # alternate health checks with GET by id
                    kind, path = "get", f"/v1/plans/{ids[len(ids) // 2]}"
                t0 = time.perf_counter()
                try:
                    r = await client.request(method, path, json=body)
                except httpx.HTTPError as e:
                    res.errors.append(f"{kind}: {type(e).__name__}: {e}")
                    return
                dt = time.perf_counter() - t0
            res.latencies.setdefault(kind, []).append(dt)
            res.statuses[f"{kind} {r.status_code}"] += 1
            if r.status_code not in ok:
                res.errors.append(f"{kind}: HTTP {r.status_code}: {r.text[:200]}")
            elif kind == "plan":
                ids.append(r.json()["id"])
                res.cache[r.headers.get("x-slotplan-cache", "?")] += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one(*m) for m in mix))
        return res, time.perf_counter() - t0


def wait_ready(base: str, proc: subprocess.Popen[bytes], deadline_s: float = 60.0) -> None:
    t0 = time.time()
    while time.time() - t0 < deadline_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode}")
        try:
            if httpx.get(base + "/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not become ready")


# --------------------------------------------------------------------------------------
# Tenants: clients on several API keys, cross-key probes, kill -9 of the server
# --------------------------------------------------------------------------------------


@dataclass
class TenantResults:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)  # another key's resource answered
    down: int = 0  # requests that met a killed server (not acknowledged)
    acked: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> plan id -> graph name
    deleted: dict[str, set[str]] = field(default_factory=dict)


class ServerProc:
    """``slotplan serve`` on loopback with API keys, restartable on the same store."""

    def __init__(self, db: Path, keys_file: Path, port: int, workers: int, log: Path):
        self.cmd = [sys.executable, "-c", "from api.cli import main; main()", "serve", "--host", HOST,
                    "--port", str(port), "--db", str(db), "--workers", str(workers), "--api-keys",
                    str(keys_file), "--rate-limit", "0"]
        self.base = f"http://{HOST}:{port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_ready(self.base, self.proc)

    def kill9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)  # the server and its planning workers
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


# one loop of request kinds per client: long, but each branch is one request
async def tenant_drive(  # noqa: C901, PLR0915
        server: ServerProc, keys: list[str], clients: int, per_client: int, kills: int,
                       timeout: float) -> tuple[TenantResults, float]:
    res = TenantResults(acked={k: {} for k in keys}, deleted={k: set() for k in keys})
    shared = [(n, k) for n in (16, 32, 64) for k in (16, 32, 64)][:8]  # planned by every key
    up = asyncio.Event()
    up.set()

    async def client_loop(c: int) -> None:  # noqa: C901, PLR0915
        key = keys[c % len(keys)]
        others = [k for k in keys if k != key]
        mine: list[str] = []  # this client's unique plans, deleted later
        hdr = {"X-API-Key": key}
        async with httpx.AsyncClient(base_url=server.base, timeout=timeout) as http:
            for i in range(per_client):
                op = i % 10
                body: dict[str, Any] | None = None
                method, path, ok, kind = "GET", "/v1/plans?limit=500", {200}, "list"
                # gets and pages: the plans every key shares (a client's own plans are deleted soon)
                known_shared = [p for p, name in res.acked[key].items() if not name.startswith("client")]
                if op in (0, 1, 2):
                    n, k = shared[(c + i) % len(shared)]
                    body = {"graph": matvec_graph(n, k), "params": "n12", "options": {"time_limit_s": 5}}
                    method, path, kind = "POST", "/v1/plans", "plan"
                elif op == 3:
                    g = matvec_graph(8 + (c * per_client + i) % 56, 8)
                    g["name"] = f"client{c}-{i}"
                    body = {"graph": g, "params": "n12", "options": {"time_limit_s": 5}}
                    method, path, kind = "POST", "/v1/plans", "plan-own"
                elif op in (4, 5) and known_shared:
                    # the shared plans: a client's own may be in the middle of its DELETE
                    pid = known_shared[(c + i) % len(known_shared)]
                    path, kind = f"/v1/plans/{pid}", "get"
                elif op == 7 and known_shared:
                    pid = known_shared[(c * 7 + i) % len(known_shared)]
                    path, kind = f"/v1/plans/{pid}/view", "page"
                elif op == 8 and mine:
                    pid = mine.pop(0)
                    method, path, ok, kind = "DELETE", f"/v1/plans/{pid}", {204}, "delete"
                elif op == 9:
                    theirs = [p for k in others for p in res.acked[k]]
                    if not theirs:
                        continue
                    pid = theirs[(c + i) % len(theirs)]
                    sub = ("", "/view", "/tables", "")[i % 4]
                    method = "DELETE" if i % 4 == 3 else "GET"
                    path, ok, kind = f"/v1/plans/{pid}{sub}", {404}, "probe"
                await up.wait()
                t0 = time.perf_counter()
                try:
                    r = await http.request(method, path, json=body, headers=hdr)
                except httpx.HTTPError:
                    if kills:
                        res.down += 1
                        if kind == "delete":
                            mine.append(pid)  # not acknowledged: try again later
                        continue
                    res.errors.append(f"{kind} {path}: connection error")
                    continue
                dt = time.perf_counter() - t0
                res.latencies.setdefault(kind, []).append(dt)
                res.statuses[f"{kind} {r.status_code}"] += 1
                if kind == "probe" and r.status_code != 404:
                    res.leaks.append(f"{method} {path} with another key: HTTP {r.status_code}")
                    continue
                if r.status_code not in ok:
                    if kills and r.status_code == 503:
                        res.down += 1
                        continue
                    res.errors.append(f"{kind} {method} {path}: HTTP {r.status_code}: {r.text[:160]}")
                    continue
                if kind in ("plan", "plan-own"):
                    pid = r.json()["id"]
                    res.acked[key][pid] = body["graph"]["name"] if body else ""
                    if kind == "plan-own":
                        mine.append(pid)
                elif kind == "delete":
                    res.deleted[key].add(pid)
                elif kind == "list":
                    for item in r.json()["items"]:
                        if any(item["id"] in res.acked[k] for k in others):
                            res.leaks.append(f"list with one key shows another key's plan {item['id']}")

    async def killer() -> None:
        for _ in range(kills):
            await asyncio.sleep(4.0)
            up.clear()
            await asyncio.to_thread(server.kill9)
            await asyncio.to_thread(server.start)
            up.set()

    t0 = time.perf_counter()
    await asyncio.gather(killer(), *(client_loop(c) for c in range(clients)))
    return res, time.perf_counter() - t0


async def verify_acked(base: str, res: TenantResults) -> tuple[int, list[str]]:
    """Every acknowledged plan not deleted is there for its key; every deleted one is gone."""
    lost: list[str] = []
    checked = 0
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        for key, ids in res.acked.items():
            for pid in ids:
                r = await http.get(f"/v1/plans/{pid}", headers={"X-API-Key": key})
                checked += 1
                want = 404 if pid in res.deleted[key] else 200
                if r.status_code != want:
                    lost.append(f"{pid[:16]}: HTTP {r.status_code}, expected {want}")
    return checked, lost


def tenant_main(args: argparse.Namespace) -> int:
    import secrets

    keys = [secrets.token_hex(16) for _ in range(args.tenants)]
    with tempfile.TemporaryDirectory(prefix="slotplan-loadtest-") as tmp:
        keys_file = Path(tmp) / "keys"
        keys_file.write_text("\n".join(keys) + "\n")
        server = ServerProc(Path(tmp) / "plans.sqlite3", keys_file, free_port(), args.workers, Path(tmp) / "log")
        server.start()
        try:
            res, wall = asyncio.run(tenant_drive(server, keys, args.clients, args.per_client, args.kill,
                                                 args.timeout))
            checked, lost = asyncio.run(verify_acked(server.base, res))
        finally:
            server.stop()
    all_lat = [x for xs in res.latencies.values() for x in xs]
    print(f"tenants: {args.tenants} API keys, {args.clients} clients x {args.per_client} requests, "
          f"{args.workers} planning workers, kill -9 of the server {args.kill} times")
    print(f"errors: {len(res.errors)}")
    for e in res.errors[:10]:
        print(f"  {e}")
    print(f"cross-key visibility: {len(res.leaks)}")
    for e in res.leaks[:10]:
        print(f"  {e}")
    if args.kill:
        print(f"requests that met a killed server (not acknowledged): {res.down}")
    acked = sum(len(v) for v in res.acked.values())
    deleted = sum(len(v) for v in res.deleted.values())
    print(f"acknowledged plans: {acked} ({deleted} deleted); verified after the run: {checked}, lost: {len(lost)}")
    for e in lost[:10]:
        print(f"  {e}")
    print("statuses: " + ", ".join(f"{k}: {v}" for k, v in sorted(res.statuses.items())))
    print(f"latency all: n={len(all_lat)} p50 {percentile(all_lat, 50) * 1000:.1f} ms, "
          f"p95 {percentile(all_lat, 95) * 1000:.1f} ms, max {max(all_lat, default=0) * 1000:.1f} ms")
    for kind in sorted(res.latencies):
        xs = res.latencies[kind]
        print(f"  {kind:<8} n={len(xs):<4} p50 {percentile(xs, 50) * 1000:8.1f} ms   "
              f"p95 {percentile(xs, 95) * 1000:8.1f} ms")
    print(f"wall {wall:.2f} s")
    return 1 if res.errors or res.leaks or lost else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m api.loadtest", description=__doc__.splitlines()[0])
    ap.add_argument("--tenants", type=int, default=0,
                    help="API keys (1..16): the tenant mix (plan, get, list, page, delete, cross-key probes)")
    ap.add_argument("--clients", type=int, default=16, help="tenant mode: concurrent clients (1..64)")
    ap.add_argument("--per-client", type=int, default=100, help="tenant mode: requests per client (1..1000)")
    ap.add_argument("--kill", type=int, default=0, help="tenant mode: kill -9 the server this many times (0..5)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--distinct", type=int, default=16, help="distinct graphs (1..16): planning jobs")
    ap.add_argument("--workers", type=int, default=2, help="server planning workers")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request client timeout, seconds")
    args = ap.parse_args(argv)
    if args.tenants:
        if not (1 <= args.tenants <= 16 and 1 <= args.clients <= MAX_CONCURRENCY and 1 <= args.per_client <= 1000
                and 0 <= args.kill <= 5):
            ap.error("--tenants 1..16, --clients 1..64, --per-client 1..1000, --kill 0..5")
        return tenant_main(args)
    if not 1 <= args.requests <= MAX_REQUESTS:
        ap.error(f"--requests must be in 1..{MAX_REQUESTS}")
    if not 1 <= args.concurrency <= MAX_CONCURRENCY:
        ap.error(f"--concurrency must be in 1..{MAX_CONCURRENCY}")
    if not 1 <= args.distinct <= 16:
        ap.error("--distinct must be in 1..16")

    port = free_port()
    base = f"http://{HOST}:{port}"
    with tempfile.TemporaryDirectory(prefix="slotplan-loadtest-") as tmp:
        db = Path(tmp) / "plans.sqlite3"
        log_path = Path(tmp) / "server.log"
        cmd = [sys.executable, "-c", "from api.cli import main; main()", "serve", "--host", HOST,
               "--port", str(port), "--db", str(db), "--workers", str(args.workers)]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ},
                                    start_new_session=True)
            try:
                wait_ready(base, proc)
                mix = request_mix(args.requests, args.distinct)
                res, wall = asyncio.run(drive(base, mix, args.concurrency, args.timeout))
            finally:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        log_lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.startswith("{")]
        requests_logged = sum(1 for ln in log_lines if json.loads(ln).get("event") == "request")

    all_lat = [x for xs in res.latencies.values() for x in xs]
    print(f"server: {base} ({args.workers} planning workers), {args.requests} requests, "
          f"concurrency {args.concurrency}, {args.distinct} distinct graphs")
    print(f"errors: {len(res.errors)}")
    for e in res.errors[:10]:
        print(f"  {e}")
    print("statuses: " + ", ".join(f"{k}: {v}" for k, v in sorted(res.statuses.items())))
    print("plan cache: " + ", ".join(f"{k} {v}" for k, v in sorted(res.cache.items())))
    print(f"latency all: p50 {percentile(all_lat, 50) * 1000:.1f} ms, p95 {percentile(all_lat, 95) * 1000:.1f} ms, "
          f"max {max(all_lat, default=0) * 1000:.1f} ms")
    for kind in sorted(res.latencies):
        xs = res.latencies[kind]
        print(f"  {kind:<8} n={len(xs):<4} p50 {percentile(xs, 50) * 1000:8.1f} ms   "
              f"p95 {percentile(xs, 95) * 1000:8.1f} ms")
    print(f"wall {wall:.2f} s, {len(all_lat) / wall:.1f} requests/s; server logged {requests_logged} JSON request lines")
    return 1 if res.errors else 0


if __name__ == "__main__":
    sys.exit(main())
