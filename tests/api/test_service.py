"""Issue #16: an exposable planning service (keys, hosts, rate limit, metrics, readiness,
jobs, list/delete, single flight, whole-request limits, workers that die with the server)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.rest import RestLimits, TokenBucket, create_app, graph_work
from api.workers import JobKilled, WorkerPool
from tests.api.test_rest import matvec, small_body
from tests.helpers import REPO_ROOT

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

ROOT = REPO_ROOT
KEY = "k" * 24


def app_client(db: Path, **kw: Any) -> TestClient:
    return TestClient(create_app(db, RestLimits(executor="thread", **kw)), raise_server_exceptions=False)


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    return tmp_path / "plans.sqlite3"


# ------------------------------------------------------------------------------ access control


def test_api_keys_required_except_healthz(db: Path) -> None:
    with app_client(db, api_keys=frozenset({KEY})) as c:
        assert c.get("/healthz").status_code == 200
        for r in (c.post("/v1/plans", json=small_body()), c.get("/v1/plans"), c.get("/metrics"),
                  c.post("/v1/plans", json=small_body(), headers={"X-API-Key": "wrong" * 5})):
            assert r.status_code == 401 and r.json()["error"] == "auth" and r.json()["message"]
        assert c.post("/v1/plans", json=small_body(), headers={"X-API-Key": KEY}).status_code == 200
        assert c.get("/v1/plans", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        spec = c.get("/openapi.json", headers={"X-API-Key": KEY}).json()
        assert "ApiKey" in spec["components"]["securitySchemes"]
        assert spec["paths"]["/v1/plans"]["post"]["security"]


def test_host_allow_list(db: Path) -> None:
    with app_client(db, allowed_hosts=("127.0.0.1:8000", "localhost")) as c:
        r = c.get("/healthz", headers={"host": "evil.example:8000"})
        assert r.status_code == 421 and r.json()["error"] == "host"
        assert c.get("/healthz", headers={"host": "localhost:8000"}).status_code == 200
        assert c.get("/healthz", headers={"host": "127.0.0.1:8000"}).status_code == 200


def test_rate_limit_429_with_retry_after(db: Path) -> None:
    with app_client(db, rate_limit_per_min=3, api_keys=frozenset({KEY, "q" * 20})) as c:
        codes = [c.get("/v1/plans", headers={"X-API-Key": KEY}).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        r = c.get("/v1/plans", headers={"X-API-Key": KEY})
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"] == "rate_limit"
        # per key: another key is not limited by the first
        assert c.get("/v1/plans", headers={"X-API-Key": "q" * 20}).status_code == 200
        assert c.get("/healthz").status_code == 200


def test_token_bucket_refills() -> None:
    b = TokenBucket(60)  # one per second
    assert all(b.take("a", 0.0) == 0 for _ in range(60))
    assert b.take("a", 0.0) > 0
    assert b.take("a", 1.01) == 0


# ------------------------------------------------------------------------------ endpoints


def test_list_and_delete_plans(db: Path) -> None:
    with app_client(db) as c:
        ids = [c.post("/v1/plans", json={"graph": matvec(8 * (i + 1), 8, f"g{i}"), "params": "n12"}).json()["id"]
               for i in range(3)]
        page = c.get("/v1/plans?limit=2").json()
        assert page["total"] == 3 and len(page["items"]) == 2 and page["next"]
        rest = c.get(page["next"]).json()
        assert {x["id"] for x in page["items"] + rest["items"]} == set(ids) and rest["next"] is None
        assert c.delete(f"/v1/plans/{ids[0]}").status_code == 204
        assert c.get(f"/v1/plans/{ids[0]}").status_code == 404
        r = c.delete(f"/v1/plans/{ids[0]}")
        assert r.status_code == 404 and r.json()["error"] == "not_found"
        assert c.get("/v1/plans").json()["total"] == 2


def test_long_plans_become_jobs(db: Path) -> None:
    with app_client(db) as c:
        r = c.post("/v1/plans", json=small_body(), headers={"Prefer": "respond-async"})
        assert r.status_code == 202
        loc = r.headers["Location"]
        pid = r.json()["id"]
        assert loc == f"/v1/jobs/{pid}" and r.headers["Retry-After"]
        for _ in range(200):
            st = c.get(loc).json()
            if st["status"] != "running":
                break
            time.sleep(0.05)
        assert st == {"id": pid, "status": "done", "plan": f"/v1/plans/{pid}", "error": None}
        assert c.get(st["plan"]).status_code == 200
        bad = small_body(memory_cap_bytes=1000)
        r = c.post("/v1/plans", json=bad, headers={"Prefer": "respond-async"})
        for _ in range(200):
            st = c.get(r.headers["Location"]).json()
            if st["status"] != "running":
                break
            time.sleep(0.05)
        assert st["status"] == "failed" and "memory_cap_bytes" in st["error"]["message"]
        assert c.get("/v1/jobs/" + "0" * 64).status_code == 404


def test_sync_wait_answers_202_when_planning_takes_longer(db: Path) -> None:
    with app_client(db, sync_wait_s=0.001) as c:
        r = c.post("/v1/plans", json={"graph": json.loads((ROOT / "data/workloads/conv2.json").read_text()),
                                      "params": "n16"})
        assert r.status_code == 202 and r.headers["Location"].startswith("/v1/jobs/")


def test_single_flight_under_load(db: Path) -> None:
    app = create_app(db, RestLimits(executor="thread", workers=2))

    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            first = [c.post("/v1/plans", json=small_body()) for _ in range(8)]
            return list(await asyncio.gather(*first))

    rs = asyncio.run(go())
    assert {r.status_code for r in rs} == {200}
    assert len({r.content for r in rs}) == 1
    assert app.state.service.jobs_started == 1
    app.state.service.shutdown()


def test_errors_have_the_cli_fields(db: Path) -> None:
    with app_client(db) as c:
        r = c.post("/v1/plans", content=b'{"graph": {}, "graph": {}}', headers={"content-type": "application/json"})
        assert r.status_code == 422 and "duplicate key 'graph'" in r.json()["message"]
        r = c.post("/v1/plans", content=b"graph=1", headers={"content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 415 and r.json()["error"] == "request"
        r = c.get("/v2/nothing")
        assert r.status_code == 404 and set(r.json()) >= {"error", "message"}
        r = c.post("/v1/plans", json={"graph": matvec(), "params": "n12", "options": {"memory_cap_bytes": 2**63}})
        assert r.status_code == 200
        body = {"graph": matvec(), "params": {"log_n": 13, "log_q": [60] * 8 + [40], "log_p": [60],
                                              "log_scale": 40}}
        r = c.post("/v1/plans", json=body)
        assert r.status_code == 422 and r.json()["field"] == "log_qp" and "128-bit" in r.json()["message"]
        body["options"] = {"allow_insecure": True}
        r = c.post("/v1/plans", json=body)
        assert r.status_code == 200 and r.json()["summary"]["insecure"] is True


def test_graph_schema_in_openapi(db: Path) -> None:
    with app_client(db) as c:
        spec = c.get("/openapi.json").json()
        schemas = spec["components"]["schemas"]
        assert spec["components"]["schemas"]["PlanRequest"]["properties"]["graph"]["$ref"].endswith("/GraphFile")
        assert "nodes" in schemas["GraphFile"]["properties"] and "NodeLiteral" in schemas
        for path in ("/v1/jobs/{job_id}", "/readyz", "/metrics"):
            assert path in spec["paths"]
        assert "Retry-After" in spec["paths"]["/v1/plans"]["post"]["responses"]["503"]["headers"]


def test_metrics_and_readyz(db: Path) -> None:
    with app_client(db) as c:
        assert c.get("/readyz").json() == {"status": "ready", "reason": None}
        c.post("/v1/plans", json=small_body())
        text = c.get("/metrics").text
        assert 'slotplan_requests_total{method="POST",route="/v1/plans",status="200"} 1.0' in text
        assert "slotplan_request_seconds_bucket" in text and "slotplan_queue_depth" in text
        assert "slotplan_solver_seconds_count 1.0" in text
        pid = c.get("/v1/plans").json()["items"][0]["id"]
        assert c.get(f"/v1/plans/{pid}/view").status_code == 200
        text = c.get("/metrics").text
        assert 'slotplan_requests_total{method="GET",route="/v1/plans/{id}/view",status="200"} 1.0' in text


def test_graph_work_bounds_requests(db: Path) -> None:
    chain = {"schema": "slotplan.graph/1", "name": "chain", "tensors": {"x": {"shape": [2048], "role": "input"}},
             "nodes": [{"id": f"n{i}", "op": "poly", "inputs": ["x" if i == 0 else f"n{i - 1}"],
                        "coeffs": [0.0, 1.0]} for i in range(200)], "outputs": ["n199"]}
    with app_client(db, max_work=500) as c:
        r = c.post("/v1/plans", json={"graph": chain, "params": "n12"})
        assert r.status_code == 413 and r.json()["field"] == "limits.max_work"
    from planner.frontend.graph import parse_graph
    from planner.frontend.params import PRESETS

    assert graph_work(parse_graph(chain), PRESETS["n12"]) == 200 * 3


# ------------------------------------------------------------------------------ workers


def _sleep(s: float) -> str:
    time.sleep(s)
    return "slept"


def _hog(n: int) -> int:
    blob = bytearray(n)
    for i in range(0, n, 4096):
        blob[i] = 1
    time.sleep(5)
    return len(blob)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_worker_pool_deadline_and_memory_recycle_the_worker() -> None:
    pool = WorkerPool(1)
    try:
        assert pool.call(_sleep, (0.01,), 30, None) == "slept"
        (pid,) = pool.pids()
        with pytest.raises(JobKilled) as e:
            pool.call(_sleep, (30,), 0.5, None)
        assert e.value.limit == "wall_time" and not _alive(pid)
        with pytest.raises(JobKilled) as e:
            pool.call(_hog, (600 * 2**20,), 60, 300 * 2**20)
        assert e.value.limit == "memory"
        assert pool.call(_sleep, (0.01,), 30, None) == "slept"  # a fresh worker took over
        assert pool.recycled == 2
    finally:
        pool.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _descendants(pid: int) -> set[int]:
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        kids: list[str] = []
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids += (task / "children").read_text().split()
            except OSError:
                continue
        for k in map(int, kids):
            if k not in out:
                out.add(k)
                todo.append(k)
    return out


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "api.cli", "serve", "--port", str(port), "--db",
                             str(tmp_path / "db.sqlite3"), "--workers", "2"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_process_of_serve_survives_it(server: tuple[subprocess.Popen[bytes], int], sig: int) -> None:
    proc, port = server
    body = {"graph": json.loads((ROOT / "data/workloads/conv2.json").read_text()), "params": "n16"}
    r = httpx.post(f"http://127.0.0.1:{port}/v1/plans", json=small_body(), timeout=120)
    assert r.status_code == 200, r.text
    # a long job in flight when the signal comes
    httpx.post(f"http://127.0.0.1:{port}/v1/plans", json=body, headers={"Prefer": "respond-async"}, timeout=30)
    kids = _descendants(proc.pid)
    assert kids, "the server has no worker processes"
    os.kill(proc.pid, sig)
    proc.wait(30)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(k) for k in kids):
        time.sleep(0.2)
    assert not [k for k in kids if _alive(k)]


def test_serve_refuses_public_bind_without_keys(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "api.cli", "serve", "--host", "0.0.0.0", "--db",
                        str(tmp_path / "d.sqlite3")], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "SLOTPLAN_API_KEYS_FILE"})
    assert r.returncode == 2 and "API keys are required" in r.stderr
    keys = tmp_path / "keys"
    keys.write_text("short\n")
    r = subprocess.run([sys.executable, "-m", "api.cli", "serve", "--host", "0.0.0.0", "--api-keys", str(keys)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "16 characters" in r.stderr
