"""Issue 38: the service, round three -- tenants apart (per-key resources, admin keys, store
migration), the plan page rendered once in a worker, workers measured by growth, bounded
metric labels, rate limits (failed authentication, shared buckets, trusted proxy only)."""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import subprocess
import sys
import time
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.rest import RestLimits, TokenBucket, create_app
from api.store import PlanStore, owner_of_key
from api.workers import WorkerPool
from tests.api.test_rest import matvec, small_body
from tests.helpers import REPO_ROOT

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

ROOT = REPO_ROOT
A, B, ADMIN = "a" * 24, "b" * 24, "z" * 24
HA, HB, HADMIN = ({"X-API-Key": k} for k in (A, B, ADMIN))


def keyed(db: Path, **kw: Any) -> TestClient:
    limits = RestLimits(executor="thread", api_keys=frozenset({A, B}), admin_keys=frozenset({ADMIN}), **kw)
    return TestClient(create_app(db, limits), raise_server_exceptions=False)


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    return tmp_path / "plans.sqlite3"


# ------------------------------------------------------------------------------ tenancy


def test_another_key_gets_404_for_everything(db: Path) -> None:
    with keyed(db) as c:
        r = c.post("/v1/plans", json=small_body(), headers=HA)
        assert r.status_code == 200
        pid = r.json()["id"]
        for path in (f"/v1/plans/{pid}", f"/v1/plans/{pid}/tables", f"/v1/plans/{pid}/view", f"/v1/jobs/{pid}"):
            assert c.get(path, headers=HA).status_code == 200, path
            got = c.get(path, headers=HB)
            assert got.status_code == 404 and got.json()["error"] == "not_found", path
        assert c.post("/v1/diff", json={"base": pid, "head": pid}, headers=HB).status_code == 404
        assert c.get("/v1/plans", headers=HB).json()["total"] == 0
        assert c.delete(f"/v1/plans/{pid}", headers=HB).status_code == 404
        assert c.get(f"/v1/plans/{pid}", headers=HA).status_code == 200  # still A's


def test_same_request_planned_once_stored_per_owner_without_an_oracle(db: Path) -> None:
    with keyed(db) as c:
        service = c.app.state.service  # type: ignore[attr-defined]
        ra = c.post("/v1/plans", json=small_body(), headers=HA)
        rb = c.post("/v1/plans", json=small_body(), headers=HB)
        assert ra.status_code == rb.status_code == 200
        assert service.jobs_started == 1  # planned once (shared cache keyed by content)
        a_id, b_id = ra.json()["id"], rb.json()["id"]
        assert a_id != b_id and ra.json()["plan"] == rb.json()["plan"]
        # B cannot tell that A had planned it: a first request is a miss for B too
        assert ra.headers["x-slotplan-cache"] == rb.headers["x-slotplan-cache"] == "miss"
        assert c.post("/v1/plans", json=small_body(), headers=HB).headers["x-slotplan-cache"] == "hit"
        assert c.post("/v1/plans", json=small_body(), headers=HB).json()["id"] == b_id  # same request, same id
        # ids are not the content address: B knowing the content id learns nothing
        assert c.get(f"/v1/plans/{a_id}", headers=HB).status_code == 404
        assert c.get(f"/v1/plans/{b_id}", headers=HA).status_code == 404
        # deleting A's copy leaves B's
        assert c.delete(f"/v1/plans/{a_id}", headers=HA).status_code == 204
        assert c.get(f"/v1/plans/{b_id}", headers=HB).status_code == 200
        assert c.get(f"/v1/plans/{a_id}", headers=HA).status_code == 404


def test_admin_lists_everyone(db: Path) -> None:
    with keyed(db) as c:
        a_id = c.post("/v1/plans", json=small_body(), headers=HA).json()["id"]
        b_id = c.post("/v1/plans", json={"graph": matvec(8, 8, "other"), "params": "n12"}, headers=HB).json()["id"]
        r = c.get("/v1/plans?all=true", headers=HB)
        assert r.status_code == 403 and r.json()["field"] == "all"
        page = c.get("/v1/plans?all=true", headers=HADMIN).json()
        assert {x["id"] for x in page["items"]} == {a_id, b_id}
        assert {x["owner"] for x in page["items"]} == {owner_of_key(k)[:16] for k in (A, B)}
        assert c.get("/v1/plans", headers=HADMIN).json()["total"] == 0  # its own plans by default
        assert c.get(f"/v1/plans/{a_id}", headers=HADMIN).status_code == 200


def test_async_job_belongs_to_its_key(db: Path) -> None:
    with keyed(db) as c:
        r = c.post("/v1/plans", json=small_body(), headers={**HA, "Prefer": "respond-async"})
        assert r.status_code == 202
        jid = r.json()["id"]
        assert c.get(f"/v1/jobs/{jid}", headers=HB).status_code == 404
        for _ in range(100):
            st = c.get(f"/v1/jobs/{jid}", headers=HA).json()
            if st["status"] != "running":
                break
            time.sleep(0.1)
        assert st["status"] == "done" and c.get(st["plan"], headers=HA).status_code == 200
        assert c.get(st["plan"], headers=HB).status_code == 404


def test_version_1_store_is_migrated(db: Path) -> None:
    con = sqlite3.connect(db)
    con.executescript("""
        CREATE TABLE plans (id TEXT PRIMARY KEY, created REAL NOT NULL, graph_name TEXT NOT NULL,
            graph_sha256 TEXT NOT NULL, params TEXT NOT NULL, request BLOB NOT NULL, plan BLOB NOT NULL);
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('version', '1');""")
    plan = '{"graph":{"name":"old","sha256":"00"},"params":{"name":"n12"},"summary":{}}'
    con.execute("INSERT INTO plans VALUES (?, 1.0, 'old', '00', 'n12', ?, ?)",
                ("e" * 64, zlib.compress(b"{}"), zlib.compress(plan.encode())))
    con.commit()
    con.close()
    store = PlanStore(db)
    assert store.get_owned("", "e" * 64) is not None  # the anonymous owner keeps its ids
    assert store.page_owned("", 10, 0)[0] == 1
    with sqlite3.connect(db) as con2:
        assert con2.execute("SELECT value FROM meta WHERE key='version'").fetchone() == ("2",)
    PlanStore(db)  # opening again changes nothing
    assert store.page_owned(None, 10, 0)[0] == 1
    with keyed(db) as c:  # once keys are on, legacy plans are the admin's to see
        assert c.get("/v1/plans/" + "e" * 64, headers=HA).status_code == 404
        assert c.get("/v1/plans/" + "e" * 64, headers=HADMIN).status_code == 200


# ------------------------------------------------------------------------------ the plan page


def test_page_rendered_once_and_cached_in_the_store(db: Path) -> None:
    with keyed(db) as c:
        service = c.app.state.service  # type: ignore[attr-defined]
        a_id = c.post("/v1/plans", json=small_body(), headers=HA).json()["id"]
        b_id = c.post("/v1/plans", json=small_body(), headers=HB).json()["id"]

        async def views() -> list[httpx.Response]:
            t = httpx.ASGITransport(app=c.app)
            async with httpx.AsyncClient(transport=t, base_url="http://testserver") as ac:
                return await asyncio.gather(*(ac.get(f"/v1/plans/{pid}/view", headers=h)
                                              for pid, h in ((a_id, HA), (a_id, HA), (b_id, HB))))

        pages = asyncio.run(views())
        assert [p.status_code for p in pages] == [200, 200, 200]
        assert service.pages_rendered == 1  # three concurrent views, two owners: one render
        assert a_id in pages[0].text and b_id not in pages[0].text
        assert b_id in pages[2].text and a_id not in pages[2].text
        h = pages[0].headers
        assert "default-src 'none'" in h["content-security-policy"] and "frame-ancestors 'none'" in \
            h["content-security-policy"]
        assert h["x-content-type-options"] == "nosniff" and h["x-frame-options"] == "DENY"
        ref = PlanStore(db).resolve(owner_of_key(A), a_id)
        assert ref is not None and PlanStore(db).get_explain(ref) is not None  # stored with the plan
    with keyed(db) as c2:  # a restarted server serves the stored page without rendering
        assert c2.get(f"/v1/plans/{a_id}/view", headers=HA).text == pages[0].text
        assert c2.app.state.service.pages_rendered == 0  # type: ignore[attr-defined]


def test_page_runs_in_a_worker_under_the_memory_limit(db: Path) -> None:
    """With the process executor the page is rendered by a planning worker: a page whose
    render grows the worker over worker_memory_bytes is refused (413), the server intact."""
    with TestClient(create_app(db, RestLimits(executor="thread")), raise_server_exceptions=False) as c:
        pid = c.post("/v1/plans", json=small_body()).json()["id"]
    limits = RestLimits(executor="process", workers=1, worker_memory_bytes=1, worker_idle_memory_bytes=None)
    with TestClient(create_app(db, limits), raise_server_exceptions=False) as c:
        r = c.get(f"/v1/plans/{pid}/view")
        assert r.status_code == 413 and r.json()["field"] == "limits.worker_memory_bytes"
        assert c.get("/healthz").status_code == 200
        again = c.get(f"/v1/plans/{pid}/view")  # the same answer, without rendering again
        assert again.status_code == 413 and again.json() == r.json()
        assert c.app.state.service.pages_rendered == 1  # type: ignore[attr-defined]
    limits = RestLimits(executor="process", workers=1)
    with TestClient(create_app(db, limits), raise_server_exceptions=False) as c:
        r = c.get(f"/v1/plans/{pid}/view")
        assert r.status_code == 200 and pid in r.text
        assert c.app.state.service.worker_pids()  # type: ignore[attr-defined]


def test_openapi_documents_view_errors(db: Path) -> None:
    with keyed(db) as c:
        doc = c.get("/openapi.json", headers=HA).json()
        view = doc["paths"]["/v1/plans/{plan_id}/view"]["get"]["responses"]
        assert {"401", "404", "421", "429"} <= set(view)
        assert "Retry-After" in view["429"]["headers"]
        assert "421" in doc["paths"]["/v1/plans"]["post"]["responses"]


# ------------------------------------------------------------------------------ workers


def _keep(n: int) -> int:
    """Allocate ``n`` bytes and keep them (as a planning job's caches would)."""
    blob = bytearray(n)
    for i in range(0, n, 4096):
        blob[i] = 1
    _KEPT.append(blob)
    return len(_KEPT)


_KEPT: list[bytearray] = []


def test_worker_limit_counts_the_jobs_growth_not_leftovers() -> None:
    pool = WorkerPool(1, idle_memory_bytes=None)
    try:
        # each job grows its worker by 150 MiB and keeps it: three times the same answer
        assert [pool.call(_keep, (150 * 2**20,), 60, 250 * 2**20) for _ in range(3)] == [1, 2, 3]
        assert pool.recycled == 0
    finally:
        pool.shutdown()


def test_worker_recycled_when_idle_memory_is_over_the_bound() -> None:
    pool = WorkerPool(1, idle_memory_bytes=120 * 2**20)
    try:
        assert pool.call(_keep, (150 * 2**20,), 60, 250 * 2**20) == 1
        assert pool.recycled_idle == 1 and pool.pids() == []
        assert pool.call(_keep, (150 * 2**20,), 60, 250 * 2**20) == 1  # a fresh worker: same answer
    finally:
        pool.shutdown()


# ------------------------------------------------------------------------------ metrics


def test_metric_labels_are_bounded(db: Path) -> None:
    with TestClient(create_app(db, RestLimits(executor="thread")), raise_server_exceptions=False) as c:
        def odd(start: int) -> int:
            for i in range(start, start + 50):
                c.request(f"M{i}ETHOD", "/v1/plans")
                c.request(f"X{i}", f"/nope/{i}")
                c.get(f"/v1/plans/{'x' * i}")
            return len([x for x in c.get("/metrics").text.splitlines() if not x.endswith("_created")
                        and "_created{" not in x])

        c.get("/metrics")
        first = odd(0)
        assert odd(50) == first  # 150 more odd requests: no new series
        text = c.get("/metrics").text
        assert "M1ETHOD" not in text and "X1" not in text and 'method="other"' in text


# ------------------------------------------------------------------------------ rate limits


def test_failed_authentication_is_rate_limited(db: Path) -> None:
    with keyed(db, auth_fail_per_min=5) as c:
        codes = [c.get("/v1/plans", headers={"X-API-Key": "w" * 20}).status_code for _ in range(7)]
        assert codes == [401] * 5 + [429] * 2
        r = c.get("/v1/plans", headers=HA)  # the address waits, whatever it sends now
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert c.get("/healthz").status_code == 200


def test_rate_limits_are_shared_by_processes_on_one_store(db: Path) -> None:
    with keyed(db, rate_limit_per_min=4) as one, keyed(db, rate_limit_per_min=4) as two:
        codes = [c.get("/v1/plans", headers=HA).status_code for c in (one, two, one, two, one)]
        assert codes == [200, 200, 200, 200, 429]
        assert two.get("/v1/plans", headers=HB).status_code == 200  # per key


def test_token_bucket_forgets_no_abuser() -> None:
    b = TokenBucket(2, max_clients=100)
    assert b.take("abuser", 0.0) == 0 and b.take("abuser", 0.0) == 0 and b.take("abuser", 0.0) > 0
    for i in range(1000):  # many new clients at once
        b.take(f"c{i}", 1.0)
        b.take("abuser", 1.0)
    assert len(b.state) <= 100 and b.take("abuser", 1.0) > 0


def test_store_bucket_prunes_only_refilled_clients(db: Path) -> None:
    s = PlanStore(db)
    assert s.take_token("abuser", 1.0, 2.0, now=0.0) == 0 and s.take_token("abuser", 1.0, 2.0, now=0.0) == 0
    for i in range(200):
        s.take_token(f"c{i}", 1.0, 2.0, now=float(i) * 0.001)
    assert s.take_token("abuser", 1.0, 2.0, now=0.5) > 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture()
def serve(tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> int:
        port = _free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen([sys.executable, "-m", "api.cli", "serve", "--port", str(port), "--db",
                                 str(tmp_path / f"db{port}.sqlite3"), "--workers", "1", *args], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        for _ in range(300):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        return port

    try:
        yield start
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_forwarded_for_is_ignored_unless_the_proxy_is_trusted(serve: Any) -> None:
    port = serve("--rate-limit", "5")
    codes = [httpx.get(f"http://127.0.0.1:{port}/v1/plans", headers={"X-Forwarded-For": f"10.0.0.{i}"}).status_code
             for i in range(8)]
    assert codes == [200] * 5 + [429] * 3
    port = serve("--rate-limit", "5", "--trust-proxy", "127.0.0.1")
    codes = [httpx.get(f"http://127.0.0.1:{port}/v1/plans", headers={"X-Forwarded-For": f"10.0.0.{i}"}).status_code
             for i in range(8)]
    assert codes == [200] * 8  # one client each, behind the trusted proxy
