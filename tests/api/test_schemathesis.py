"""Bounded property-based run of the whole OpenAPI document (schemathesis): no 5xx, and
every response conforms to the schema it documents.  Deterministic (derandomized)."""

from __future__ import annotations

import warnings

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402

from api.rest import RestLimits, create_app  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient  # noqa: F401,E402

# the key upload's tar body (api/rest_inference.py): sent as the bytes generated
schemathesis.serializer.alias("application/x-tar", "application/octet-stream")


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> object:
    """The app and its OpenAPI document, made when the test runs: the cases are generated
    then, in the one worker that runs them, not at every worker's collection (3.6 s each)."""
    app = create_app(tmp_path_factory.mktemp("st") / "plans.sqlite3",
                     RestLimits(executor="thread", workers=2, max_time_limit_s=2.0, max_work=256,
                                max_slot_blocks=64, request_timeout_s=20.0))
    return schemathesis.openapi.from_asgi("/openapi.json", app)


schema = schemathesis.pytest.from_fixture("api_schema")
CASES: list[int] = []


@schema.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_api_never_500(case: schemathesis.Case) -> None:
    response = case.call()
    CASES.append(response.status_code)
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:300])
    case.validate_response(response, checks=(schemathesis.checks.not_a_server_error,))


def teardown_module() -> None:
    statuses = sorted(set(CASES))
    print(f"\nschemathesis: {len(CASES)} cases, statuses {statuses}")
