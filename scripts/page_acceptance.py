"""Issue 38 acceptance: the plan page of a 512x512 ct-ct matmul at n16 while three views
render: the API server's RSS, /healthz latency, and the number of renders.

    python scripts/page_acceptance.py [--n 512] [--params n16] [--views 3]

Starts ``slotplan serve`` on 127.0.0.1 (temporary store), plans the graph (POST, waits),
then sends ``--views`` concurrent GET /v1/plans/{id}/view while sampling the server
process's RSS (/proc, the server only: planning workers are separate processes) and the
latency of /healthz every 100 ms; then one more view (cached).  Prints the numbers.
Run it under ``flock /tmp/slotplan-heavy.lock``: the render plans the graph again."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from api.loadtest import HOST, free_port, wait_ready
from api.workers import rss_bytes


def graph(n: int) -> dict[str, object]:
    return {"schema": "slotplan.graph/1", "name": f"ctct{n}",
            "tensors": {"A": {"shape": [n, n], "role": "input"}, "B": {"shape": [n, n], "role": "input"}},
            "nodes": [{"id": "C", "op": "matmul", "inputs": ["A", "B"]}], "outputs": ["C"]}


async def run(base: str, pid: int, n: int, params: str, views: int) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=900) as http:
        t0 = time.perf_counter()
        r = await http.post("/v1/plans", json={"graph": graph(n), "params": params, "options": {"time_limit_s": 30}})
        print(f"POST /v1/plans: HTTP {r.status_code} in {time.perf_counter() - t0:.1f} s; server RSS "
              f"{rss_bytes(pid) / 2**20:.0f} MiB")
        plan_id = r.json()["id"]
        while r.status_code == 202:  # planning took longer than the server's wait: poll the job
            await asyncio.sleep(2)
            r = await http.get(f"/v1/jobs/{plan_id}")
            if r.json().get("status") != "running":
                print(f"job: {r.json().get('status')} after {time.perf_counter() - t0:.1f} s")
                break
        r.raise_for_status()
        samples: list[tuple[float, float]] = []
        done = asyncio.Event()

        async def sample() -> None:
            async with httpx.AsyncClient(base_url=base, timeout=30) as h2:
                while not done.is_set():
                    t = time.perf_counter()
                    await h2.get("/healthz")
                    samples.append((time.perf_counter() - t, rss_bytes(pid)))
                    await asyncio.sleep(0.1)

        async def view() -> tuple[int, float, int]:
            t = time.perf_counter()
            v = await http.get(f"/v1/plans/{plan_id}/view")
            if v.status_code != 200:
                print(f"view: {v.text[:300]}")
            return v.status_code, time.perf_counter() - t, len(v.content)

        rss0 = rss_bytes(pid)
        sampler = asyncio.create_task(sample())
        res = await asyncio.gather(*(view() for _ in range(views)))
        done.set()
        await sampler
        for status, secs, size in res:
            print(f"view: HTTP {status} in {secs:.1f} s ({size} bytes)")
        t = time.perf_counter()
        again = await http.get(f"/v1/plans/{plan_id}/view")
        print(f"cached view: HTTP {again.status_code} in {(time.perf_counter() - t) * 1000:.0f} ms")
        lat = sorted(s[0] for s in samples)
        print(f"server RSS before the views {rss0 / 2**20:.0f} MiB, max during {max(s[1] for s in samples) / 2**20:.0f}"
              f" MiB, after {rss_bytes(pid) / 2**20:.0f} MiB")
        print(f"/healthz during the views: n={len(lat)} p50 {lat[len(lat) // 2] * 1000:.1f} ms, "
              f"max {lat[-1] * 1000:.1f} ms")
        metrics = (await http.get("/metrics")).text
        renders = [ln for ln in metrics.splitlines() if ln.startswith("slotplan_page_renders_total")]
        print(f"renders: {renders}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--params", default="n16")
    ap.add_argument("--views", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--worker-memory", default="3GiB", help="the server's --worker-memory (growth of one job)")
    args = ap.parse_args()
    port = free_port()
    base = f"http://{HOST}:{port}"
    with tempfile.TemporaryDirectory(prefix="slotplan-page-") as tmp:
        cmd = [sys.executable, "-c", "from api.cli import main; main()", "serve", "--port", str(port), "--db",
               str(Path(tmp) / "db.sqlite3"), "--workers", str(args.workers), "--request-timeout", "600",
               "--worker-memory", args.worker_memory,
               "--rate-limit", "0"]
        with open(Path(tmp) / "log", "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(base, proc)
            asyncio.run(run(base, proc.pid, args.n, args.params, args.views))
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
