"""Requests per second of the inference service with 1 and 2 evaluation workers, local
processes and Ray actors (issue 39; docs/inference-service.md).

    .venv/bin/python scripts/inference_rps.py [--seconds 20] [--clients 4] [--params n13]

A small graph (matvec 16x32, add, square: tests/api/test_inference_service.py) so that the
numbers are about the service (routing, workers, transfers), not one large evaluation.
Each configuration runs a fresh `slotplan serve`; the clients post one ciphertext (one
sample) in a loop; every answer is decrypted and checked against numpy.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
KEY = "rps-key-0123456789abcdef"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(engine: str, workers: int, seconds: float, clients: int, params: str, out: Path) -> dict[str, object]:
    import httpx

    import slotplan
    from tests.api.test_inference_service import GRAPH, OPTIONS, WEIGHTS, _ref

    port = _port()
    (out / "keys.txt").write_text(KEY + "\n")
    exe = Path(sys.executable).parent / "slotplan"
    db = out / f"{engine}{workers}.sqlite3"
    proc = subprocess.Popen([str(exe), "serve", "--port", str(port), "--db", str(db), "--api-keys",
                             str(out / "keys.txt"), "--rate-limit", "0", "--engine", engine, "--eval-workers",
                             str(workers)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}"
        r0 = slotplan.RemoteServer(url, KEY)
        r0.create_plan(GRAPH, params, OPTIONS)
        plan = r0.plan()
        kdir = out / f"K-{engine}{workers}"
        client = slotplan.Client(plan, kdir)
        r0.upload_keys(client.keygen())
        r0.upload_weights(WEIGHTS)
        x = np.random.default_rng(0).uniform(-1, 1, 32)
        ct = client.encrypt({"x": x})
        want = _ref(x, WEIGHTS)
        for _ in range(workers * 2):  # warm every worker
            r0.evaluate(ct)
        done: list[float] = []
        bad: list[str] = []
        stop = time.monotonic() + seconds

        def loop() -> None:
            r = slotplan.RemoteServer(url, KEY, r0.plan_id, key_id=r0.key_id, weights_id=r0.weights_id)
            while time.monotonic() < stop:
                t = time.perf_counter()
                y = client.decrypt(r.evaluate(ct))["y"]
                if float(np.max(np.abs(y - want))) > 1e-4:
                    bad.append("mismatch")
                done.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        ths = [threading.Thread(target=loop) for _ in range(clients)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        wall = time.perf_counter() - t0
        lat = np.asarray(done)
        return {"engine": engine, "workers": workers, "requests": len(done), "seconds": round(wall, 2),
                "rps": round(len(done) / wall, 2), "p50_s": round(float(np.percentile(lat, 50)), 4),
                "p95_s": round(float(np.percentile(lat, 95)), 4), "wrong": len(bad)}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--params", default="n13")
    ap.add_argument("--out", type=Path, default=Path("out/rps"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for engine in ("local", "ray"):
        for workers in (1, 2):
            row = run(engine, workers, a.seconds, a.clients, a.params, a.out.resolve())
            print(json.dumps(row), flush=True)
            rows.append(row)
    (a.out / "rps.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
