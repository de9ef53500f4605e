"""A whole planning request is bounded in wall time (``plan_graph(wall_limit_s=)``, CLI
``--wall-limit``, REST's request limit): past it, planning stops at the next checkpoint
(per node in candidate generation, pricing and lowering; the solve; the key schedule) with
an error naming the step, and nothing is written."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from common import progress
from planner.frontend.graph import parse_graph
from planner.frontend.params import load_params
from planner.pipeline import PlanOptions, PlanWallTimeout, plan_graph
from tests.helpers import run_cli


def chain(n: int) -> dict[str, Any]:
    nodes = [{"id": f"n{i}", "op": "add", "inputs": [f"n{i - 1}" if i else "x", "b"]} for i in range(n)]
    return {"schema": "slotplan.graph/1", "name": f"chain{n}",
            "tensors": {"x": {"shape": [64], "role": "input"}, "b": {"shape": [64], "role": "weight"}},
            "nodes": nodes, "outputs": [f"n{n - 1}"]}


def test_deadline_stops_planning_at_a_named_step() -> None:
    g = parse_graph(chain(3000))
    with pytest.raises(PlanWallTimeout, match=r"planning stopped at (candidates|conversions|solve|lowering).*0\.05 s"):
        plan_graph(g, load_params("n13"), PlanOptions(), wall_limit_s=0.05)


def test_a_generous_deadline_changes_nothing() -> None:
    g = parse_graph(chain(40))
    a = plan_graph(g, load_params("n13"), PlanOptions()).plan
    b = plan_graph(g, load_params("n13"), PlanOptions(), wall_limit_s=600).plan
    assert json.dumps(a) == json.dumps(b)


def test_deadline_checks_and_remaining() -> None:
    assert progress.remaining() is None
    progress.check("anything")  # no deadline: never raises
    with progress.deadline(60):
        left = progress.remaining()
        assert left is not None and 59 < left <= 60
    with progress.deadline(0.001):
        time.sleep(0.01)
        with pytest.raises(progress.DeadlineExceeded, match="lowering \\(node7\\)"):
            progress.advance("lowering", "node7")


def test_cli_wall_limit_exits_3_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gf = tmp_path / "chain.json"
    gf.write_text(json.dumps(chain(3000)))
    out = tmp_path / "p.json"
    code, _, err = run_cli(["plan", str(gf), "--params", "n13", "--wall-limit", "0.1", "-o", str(out)], capsys)
    assert code == 3 and "wall limit of 0.1 s ran out" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_plan_job_past_the_planner_share_is_a_413_naming_the_step() -> None:
    """A service job whose planner runs past its share of the wall limit ends with the
    planner's own answer: a 413 naming the step where planning stopped."""
    from api.rest_jobs import plan_job

    res = plan_job(chain(20_000), load_params("n13"), PlanOptions(), wall_limit_s=0.5)
    assert res[0] == "error" and res[1] == 413
    body = res[2]
    assert body["field"] == "limits.request_timeout_s" and "planning stopped at candidates" in body["message"]


def test_rest_request_over_its_wall_limit_is_a_413_naming_the_limit(tmp_path: Path) -> None:
    """Over the service's wall limit a request is a 413 naming limits.request_timeout_s:
    the planner stops itself at its share of the limit (80 %); on a loaded machine the
    service's own limit may come first, with the same status and field."""
    from fastapi.testclient import TestClient

    from api.rest import RestLimits, create_app

    # a 20,000-node chain takes ~15 s to plan here, far over the 4 s limit
    limits = RestLimits(executor="thread", request_timeout_s=4.0, max_nodes=30_000, max_work=10**6, max_slot_blocks=10**6,
                        max_body_bytes=16 * 2**20)
    client = TestClient(create_app(tmp_path / "p.sqlite3", limits), raise_server_exceptions=False)
    r = client.post("/v1/plans", json={"graph": chain(20_000), "params": "n13"})
    assert r.status_code == 413, r.text
    body = r.json()
    assert body["field"] == "limits.request_timeout_s"
    assert "planning stopped at" in body["message"] or "took longer than 4 s" in body["message"], body
