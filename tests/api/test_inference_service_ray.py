"""Issue 39: ``serve --engine ray``: evaluation on Ray actors (api/eval_workers.py,
RayEvalPool) gives the same outputs as the local workers, keeps triples warm, and a killed
actor is a 503 and replaced."""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from api.rest import RestLimits, create_app
from backends.lattigo_backend import available
from tests.api.test_inference_service import GRAPH, HA, OCTET, OPTIONS, WEIGHTS, A, _close, _ref
from tests.helpers import needs

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

pytestmark = [needs("ray"),
              pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)")]


def test_ray_actors_same_outputs_warm_and_replaced(tmp_path: Path) -> None:
    import slotplan

    limits = RestLimits(executor="thread", api_keys=frozenset({A}), eval_workers=2, eval_engine="ray")
    with TestClient(create_app(tmp_path / "plans.sqlite3", limits), raise_server_exceptions=False) as tc:
        svc = tc.app.state.inference  # type: ignore[attr-defined]
        assert type(svc.pool).__name__ == "RayEvalPool"
        remote = slotplan.RemoteServer("http://testserver", A, http=tc)
        remote.create_plan(GRAPH, "n13", OPTIONS)
        plan = remote.plan()
        client = slotplan.Client(plan, tmp_path / "K")
        remote.upload_keys(client.keygen())
        remote.upload_weights(WEIGHTS)
        rng = np.random.default_rng(1)
        x = rng.uniform(-1, 1, (2, 32))
        ct = client.encrypt({"x": x})
        outs = [client.decrypt(remote.evaluate(ct))["y"] for _ in range(3)]
        assert remote.last["warm"] == "warm"
        for y in outs:
            _close(y, _ref(x, WEIGHTS))
        # the same ciphertext through the local pool: the same answer within CKKS precision
        local = slotplan.Server(plan, client.eval_keys, WEIGHTS).evaluate(ct)
        assert float(np.max(np.abs(client.decrypt(local)["y"] - outs[0]))) < 1e-5
        (pid,) = svc.pool.pids()
        # an actor killed mid-evaluation: 503, then a new actor serves
        os.kill(pid, signal.SIGSTOP)
        box: dict[str, Any] = {}
        t = threading.Thread(target=lambda: box.update(r=tc.post(
            f"/v1/plans/{remote.plan_id}/evaluate", params={"key_id": remote.key_id, "weights_id": remote.weights_id},
            content=ct.to_bytes(), headers={**HA, **OCTET})))
        t.start()
        for _ in range(200):
            if svc.pool.busy_pids() == [pid]:
                break
            time.sleep(0.02)
        time.sleep(0.2)
        os.kill(pid, signal.SIGKILL)
        t.join(120)
        assert box["r"].status_code == 503 and box["r"].headers["retry-after"]
        _close(client.decrypt(remote.evaluate(ct))["y"], _ref(x, WEIGHTS))
        assert pid not in svc.pool.pids()
