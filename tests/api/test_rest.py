"""REST service (SPEC section 6): round trip, content addressing, errors, limits, restart, fuzz."""

from __future__ import annotations

import asyncio
import copy
import io
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.rest import RestLimits, create_app
from planner.pipeline import plan_table_names
from tests.helpers import REPO_ROOT

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's TestClient warns about httpx vs httpx2
    from fastapi.testclient import TestClient

ROOT = REPO_ROOT
CONV1 = json.loads((ROOT / "data" / "workloads" / "conv1.json").read_text())
FAST = RestLimits(executor="thread", workers=2)


def matvec(n: int = 16, k: int = 16, name: str = "mv") -> dict[str, Any]:
    return {
        "schema": "slotplan.graph/1",
        "name": name,
        "tensors": {"W": {"shape": [n, k], "role": "weight"}, "x": {"shape": [k], "role": "input"}},
        "nodes": [{"id": "y", "op": "matvec", "inputs": ["W", "x"]}],
        "outputs": ["y"],
    }


def small_body(**opts: Any) -> dict[str, Any]:
    return {"graph": matvec(), "params": "n12", "options": {"time_limit_s": 5, **opts}}


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    return tmp_path / "plans.sqlite3"


@pytest.fixture()
def client(db: Path) -> Iterator[TestClient]:
    with TestClient(create_app(db, FAST), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def conv1_plan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """conv1 at n13, planned once through the service (id, plan, tables bytes)."""
    db = tmp_path_factory.mktemp("rest") / "plans.sqlite3"
    with TestClient(create_app(db, FAST), raise_server_exceptions=False) as c:
        r = c.post("/v1/plans", json={"graph": CONV1, "params": "n13", "options": {"solver": "cpsat"}})
        assert r.status_code == 200, r.text
        body = r.json()
        t = c.get(f"/v1/plans/{body['id']}/tables")
        assert t.status_code == 200, t.text
        return {"db": db, "body": body, "tables": t.content}


# --------------------------------------------------------------------------------------
# round trip
# --------------------------------------------------------------------------------------


def test_round_trip_post_get_tables(conv1_plan: dict[str, Any]) -> None:
    body = conv1_plan["body"]
    assert set(body) == {"id", "summary", "plan"}
    assert len(body["id"]) == 64
    plan = body["plan"]
    assert plan["schema"] == "slotplan.plan/1"
    assert body["summary"] == plan["summary"]
    assert plan["params"]["name"] == "n13"
    with TestClient(create_app(conv1_plan["db"], FAST)) as c:
        got = c.get(f"/v1/plans/{body['id']}")
        assert got.status_code == 200
        assert got.json() == body
    # the tables: an npz numpy loads without pickle, one .idx per table the plan names
    tables = np.load(io.BytesIO(conv1_plan["tables"]), allow_pickle=False)
    slots = plan["params"]["slots"]
    for name in plan_table_names(plan):
        idx = tables[f"{name}.idx"]
        assert idx.dtype == np.int64 and idx.shape == (slots,)
    for key in tables.files:
        if key.endswith(".coef"):
            assert tables[key].dtype == np.float64


def test_tables_execute_the_plan(conv1_plan: dict[str, Any]) -> None:
    from backends.runner import run_plan

    tables = dict(np.load(io.BytesIO(conv1_plan["tables"]), allow_pickle=False))
    rep = run_plan(conv1_plan["body"]["plan"], tables, "sim", seed=3)
    assert rep.ok, rep.to_json()


def test_same_request_same_id(client: TestClient) -> None:
    a = client.post("/v1/plans", json=small_body())
    b = client.post("/v1/plans", json=small_body())
    assert a.status_code == b.status_code == 200
    assert a.json()["id"] == b.json()["id"]
    assert a.headers["x-slotplan-cache"] == "miss" and b.headers["x-slotplan-cache"] == "hit"
    assert a.content == b.content
    # the same meaning written differently (key order, defaults spelled out) -> the same id
    g = matvec()
    reordered = {"outputs": g["outputs"], "nodes": g["nodes"], "tensors": dict(reversed(g["tensors"].items())),
                 "name": g["name"], "schema": g["schema"]}
    c = client.post("/v1/plans", json={"options": {"time_limit_s": 5.0, "solver": "cpsat", "input_layout": "free"},
                                       "params": "n12", "graph": reordered})
    assert c.json()["id"] == a.json()["id"]
    # a preset given by name or as its object is the same request
    from planner.frontend.params import PRESETS

    d = client.post("/v1/plans", json={**small_body(), "params": PRESETS["n12"].to_json()})
    assert d.status_code == 200 and d.json()["id"] == a.json()["id"]
    # different options -> a different id
    e = client.post("/v1/plans", json=small_body(kernels=["bsgs"]))
    assert e.status_code == 200 and e.json()["id"] != a.json()["id"]


def test_time_limit_over_the_cap_is_refused_and_documented(db: Path) -> None:
    limits = RestLimits(executor="thread", max_time_limit_s=2.0)
    with TestClient(create_app(db, limits)) as c:
        r = c.post("/v1/plans", json=small_body(time_limit_s=3000))
        assert r.status_code == 422 and r.json()["field"] == "options.time_limit_s"
        assert "2" in r.json()["rule"]
        r2 = c.post("/v1/plans", json=small_body(time_limit_s=2.0))
        assert r2.status_code == 200 and r2.json()["plan"]["options"]["time_limit_s"] == 2.0
        spec = c.get("/openapi.json").json()
        assert spec["components"]["schemas"]["PlanOptionsLiteral"]["properties"]["time_limit_s"]["maximum"] == 2.0


def test_concurrent_identical_requests_share_one_job(db: Path) -> None:
    app = create_app(db, FAST)

    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return list(await asyncio.gather(*(c.post("/v1/plans", json=small_body()) for _ in range(6))))

    rs = asyncio.run(go())
    assert {r.status_code for r in rs} == {200}
    assert len({r.json()["id"] for r in rs}) == 1
    assert app.state.service.store.count() == 1
    app.state.service.shutdown()


def test_process_pool_executor(db: Path) -> None:
    with TestClient(create_app(db, RestLimits(executor="process", workers=1))) as c:
        r = c.post("/v1/plans", json=small_body())
        assert r.status_code == 200, r.text
        bad = c.post("/v1/plans", json={**small_body(), "options": {"memory_cap_bytes": 1}})
        assert bad.status_code == 422 and "memory_cap_bytes" in bad.json()["message"]
        t = c.get(f"/v1/plans/{r.json()['id']}/tables")
        assert t.status_code == 200
        assert np.load(io.BytesIO(t.content)).files


def test_restart_keeps_plans(db: Path) -> None:
    with TestClient(create_app(db, FAST)) as c:
        first = c.post("/v1/plans", json=small_body()).json()
    with TestClient(create_app(db, FAST)) as c:  # a new app (a restarted server) on the same file
        again = c.get(f"/v1/plans/{first['id']}")
        assert again.status_code == 200 and again.json() == first
        r = c.post("/v1/plans", json=small_body())
        assert r.headers["x-slotplan-cache"] == "hit"
        assert c.get("/healthz").json()["plans"] == 1


def test_db_path_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "env" / "store.sqlite3"
    monkeypatch.setenv("SLOTPLAN_DB", str(target))
    with TestClient(create_app(None, FAST)) as c:
        assert c.post("/v1/plans", json=small_body()).status_code == 200
    assert target.exists()


# --------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------


def test_invalid_graph_names_node_and_rule(client: TestClient) -> None:
    g = matvec()
    g["nodes"][0]["inputs"] = ["W"]
    r = client.post("/v1/plans", json={"graph": g, "params": "n12"})
    assert r.status_code == 422
    body = r.json()
    assert body["error"] == "graph" and body["node"] == "y" and body["field"] == "inputs"
    assert "expects 2 inputs" in body["rule"]
    g = matvec()
    g["nodes"][0]["op"] = "frobnicate"
    body = client.post("/v1/plans", json={"graph": g, "params": "n12"}).json()
    assert body["node"] == "y" and "unknown op" in body["rule"]
    g = matvec()
    g["tensors"]["x"]["shape"] = [15]
    body = client.post("/v1/plans", json={"graph": g, "params": "n12"}).json()
    assert body["node"] == "y" and body["rule"]


@pytest.mark.parametrize(
    ("body", "error", "field"),
    [
        ({"graph": matvec(), "params": "n99"}, "params", None),
        ({"graph": matvec(), "params": {"log_n": 13, "log_q": [50], "log_p": [50], "log_scale": 80}}, "params",
         "log_scale"),
        ({"graph": matvec(), "params": "./etc/passwd.json"}, "params", None),
        ({"graph": matvec(), "options": {"solver": "gurobi"}}, "options", "options.solver"),
        ({"graph": matvec(), "options": {"time_limit_s": -1}}, "options", "options.time_limit_s"),
        ({"graph": matvec(), "options": {"kernels": ["magic"]}}, "options", "options.kernels"),
        ({"graph": matvec(), "options": {"costs": "../../etc/passwd"}}, "options", "options.costs"),
        ({"graph": matvec(), "options": {"bogus": 1}}, "options", "options.bogus"),
        ({"graph": "not a graph"}, "graph", "graph"),
        ({"params": "n12"}, "graph", "graph"),
        ({"graph": matvec(), "extra": 1}, "request", "extra"),
    ],
)
def test_invalid_request_422(client: TestClient, body: dict[str, Any], error: str, field: str | None) -> None:
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 422, r.text
    out = r.json()
    assert out["error"] == error
    assert out["field"] == field
    assert out["message"]


def test_not_json_and_wrong_types(client: TestClient) -> None:
    r = client.post("/v1/plans", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "not valid JSON" in r.json()["message"]
    r = client.post("/v1/plans", content=b"[1, 2]", headers={"content-type": "application/json"})
    assert r.status_code == 422
    r = client.post("/v1/plans", content=b"NaN", headers={"content-type": "application/json"})
    assert r.status_code == 422
    deep = b"[" * 100_000 + b"]" * 100_000
    r = client.post("/v1/plans", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 422 and "nested too deeply" in r.json()["message"]


def test_unknown_and_malformed_ids_404(client: TestClient) -> None:
    assert client.get("/v1/plans/" + "0" * 64).status_code == 404
    assert client.get("/v1/plans/xyz").status_code == 404
    assert client.get("/v1/plans/" + "0" * 64 + "/tables").status_code == 404
    assert client.post("/v1/diff", json={"base": "0" * 64, "head": "0" * 64}).status_code == 404


def test_oversized_body_413(db: Path) -> None:
    limits = RestLimits(executor="thread", max_body_bytes=4096)
    with TestClient(create_app(db, limits)) as c:
        big = small_body()
        big["graph"]["name"] = "x" * 5000
        r = c.post("/v1/plans", json=big)
        assert r.status_code == 413 and r.json()["error"] == "too_large"
        # chunked upload without content-length: counted while streaming

        def chunks() -> Iterator[bytes]:
            yield b'{"graph": {"name": "'
            for _ in range(10):
                yield b"x" * 1000
            yield b'"}}'

        r = c.post("/v1/plans", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert c.post("/v1/plans", json=small_body()).status_code == 200


def test_oversized_graph_413(db: Path) -> None:
    limits = RestLimits(executor="thread", max_nodes=3, max_tensor_elements=2**20, max_slot_blocks=64)
    with TestClient(create_app(db, limits)) as c:
        g = matvec()
        g["nodes"] = [{"id": f"n{i}", "op": "poly", "inputs": ["x"], "coeffs": [0.0, 1.0]} for i in range(5)]
        g["outputs"] = ["n4"]
        r = c.post("/v1/plans", json={"graph": g, "params": "n12"})
        assert r.status_code == 413 and r.json()["field"] == "nodes"
        r = c.post("/v1/plans", json={"graph": matvec(2048, 1024), "params": "n12"})
        assert r.status_code == 413 and r.json()["tensor"] == "W"
        r = c.post("/v1/plans", json={"graph": matvec(512, 512), "params": "n12"})
        assert r.status_code == 413 and "slot blocks" in r.json()["rule"]


def test_tables_over_limit_413(db: Path) -> None:
    with TestClient(create_app(db, RestLimits(executor="thread", max_table_bytes=1024))) as c:
        pid = c.post("/v1/plans", json=small_body()).json()["id"]
        r = c.get(f"/v1/plans/{pid}/tables")
        assert r.status_code == 413 and "MiB" in r.json()["message"]


def test_unplannable_graph_is_422_not_500(client: TestClient) -> None:
    g = matvec()
    g["tensors"]["x"]["role"] = "weight"  # nothing encrypted: nothing to plan
    r = client.post("/v1/plans", json={"graph": g, "params": "n12"})
    assert r.status_code == 422 and r.json()["node"] == "y"
    r = client.post("/v1/plans", json={**small_body(), "options": {"memory_cap_bytes": 1000}})
    assert r.status_code == 422 and "exceeds memory_cap_bytes" in r.json()["message"]


# --------------------------------------------------------------------------------------
# diff, health, openapi, logs
# --------------------------------------------------------------------------------------


def test_diff_endpoint(client: TestClient) -> None:
    a = client.post("/v1/plans", json=small_body()).json()
    b = client.post("/v1/plans", json=small_body(kernels=["hs-diagonal"])).json()
    r = client.post("/v1/diff", json={"base": a["plan"], "head": b["plan"]})
    assert r.status_code == 200
    rep = r.json()
    assert rep["schema"] == "slotplan.diff/1" and rep["kind"] == "plan"
    assert rep["entries"][0]["key"] == "mv@n12"
    assert isinstance(rep["regressed"], bool)
    same = client.post("/v1/diff", json={"base": a["id"], "head": a["plan"]}).json()
    assert same["changed"] is False and same["regressed"] is False
    md = client.post("/v1/diff?format=md", json={"base": a["id"], "head": b["id"]})
    assert md.status_code == 200 and md.headers["content-type"].startswith("text/markdown")
    assert "| graph | status | rotations" in md.text
    bad = client.post("/v1/diff", json={"base": {"what": 1}, "head": a["plan"]})
    assert bad.status_code == 422


def test_healthz_and_openapi(client: TestClient) -> None:
    h = client.get("/healthz")
    assert h.status_code == 200 and h.json()["status"] == "ok"
    spec = client.get("/openapi.json").json()
    for path in ("/v1/plans", "/v1/plans/{plan_id}", "/v1/plans/{plan_id}/tables", "/v1/diff", "/healthz"):
        assert path in spec["paths"]
    assert "PlanRequest" in spec["components"]["schemas"]


def test_one_json_log_line_per_request(client: TestClient) -> None:
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    h = Collect()
    logger = logging.getLogger("slotplan.rest")
    logger.addHandler(h)
    try:
        r = client.post("/v1/plans", json=small_body(), headers={"x-request-id": "req-123"})
        client.get("/healthz")
    finally:
        logger.removeHandler(h)
    reqs = [getattr(x, "fields", {}) for x in records if getattr(x, "fields", {}).get("event") == "request"]
    assert len(reqs) == 2
    first = reqs[0]
    assert first["request_id"] == "req-123" and r.headers["x-request-id"] == "req-123"
    assert first["status"] == 200 and first["plan_id"] == r.json()["id"] and first["seconds"] >= 0
    from api.rest import JsonFormatter

    line = JsonFormatter().format(records[0])
    assert json.loads(line)["path"] == "/v1/plans"


# --------------------------------------------------------------------------------------
# fuzz: never a 500
# --------------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
)
json_values = st.recursive(
    json_scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)),
    max_leaves=12,
)
keys = st.sampled_from(["graph", "params", "options", "schema", "name", "tensors", "nodes", "outputs", "shape",
                        "role", "id", "op", "inputs", "stride", "padding", "coeffs", "solver", "time_limit_s",
                        "memory_cap_bytes", "kernels", "x", "W", "y", "log_n", "log_q"])


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_bodies(draw: st.DrawFn) -> Any:
    body = copy.deepcopy(draw(st.sampled_from([
        small_body(),
        {"graph": matvec(8, 24), "params": "n12", "options": {"kernels": ["bsgs"], "time_limit_s": 2}},
        {"graph": {**matvec(8, 8), "nodes": [{"id": "y", "op": "matvec", "inputs": ["W", "x"]},
                                              {"id": "z", "op": "poly", "inputs": ["y"], "coeffs": [0.5, 1.0, 0.25]}],
                   "outputs": ["z"]}, "params": "n12"},
    ])))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(body)
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "delete", "add", "dup"]))
        if not path:
            if action == "replace":
                body = draw(json_values)
            continue
        parent: Any = body
        for p in path[:-1]:
            parent = parent[p]
        last = path[-1]
        if action == "replace":
            parent[last] = draw(json_values)
        elif action == "delete":
            del parent[last]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(keys)] = draw(json_values)
        elif action == "dup" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[last]))
    return body


@pytest.fixture(scope="module")
def fuzz_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db = tmp_path_factory.mktemp("fuzz") / "plans.sqlite3"
    limits = RestLimits(executor="thread", max_time_limit_s=2.0, max_slot_blocks=64)
    with TestClient(create_app(db, limits), raise_server_exceptions=False) as c:
        yield c


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                     HealthCheck.too_slow])
@given(body=st.one_of(json_values, mutated_bodies()))
def test_fuzz_post_never_500(fuzz_client: TestClient, body: Any) -> None:
    r = fuzz_client.post("/v1/plans", json=body)
    assert r.status_code in (200, 413, 422), (r.status_code, r.text[:500], body)
    out = r.json()
    if r.status_code != 200:
        assert out["error"] and out["message"]
    else:
        assert out["plan"]["schema"] == "slotplan.plan/1"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=json_values)
def test_fuzz_diff_never_500(fuzz_client: TestClient, body: Any) -> None:
    r = fuzz_client.post("/v1/diff", json={"base": body, "head": body} if not isinstance(body, dict) or
                         "base" not in body else body)
    assert r.status_code in (200, 404, 422), (r.status_code, r.text[:500])
