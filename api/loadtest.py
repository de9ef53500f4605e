"""Bounded loopback load test of the REST service.

    python -m api.loadtest --requests 200 --concurrency 8

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m api.loadtest", description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--distinct", type=int, default=16, help="distinct graphs (1..16): planning jobs")
    ap.add_argument("--workers", type=int, default=2, help="server planning workers")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request client timeout, seconds")
    args = ap.parse_args(argv)
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
