"""Golden plans: every reference workload planned fresh must match data/golden/.

On a difference the test fails with the Markdown plan-diff report (regressions flagged).
If a change is intended, rewrite the goldens with ``slotplan golden --regenerate`` and
commit them together with the change.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from planner.frontend.graph import load_graph
from planner.report import golden
from planner.report.diff import diff_digests, render_markdown
from tests.helpers import REPO_ROOT, run_cli

ROOT = REPO_ROOT
CASES = golden.load_manifest()
# one pytest-xdist group per workload: its golden and hygiene tests run in one process
WORKLOAD_PARAMS = [
    pytest.param(c, id=f"{c.name}.{c.entry.params}", marks=pytest.mark.xdist_group(f"workload-{c.name}.{c.entry.params}"))
    for c in CASES
]


_PLANNED: dict[Path, golden.PlanResult] = {}


def planned(case: golden.GoldenCase) -> golden.PlanResult:
    """Each workload is planned once per test session (tests/planner/report/test_workload_hygiene.py
    reads the same plans)."""
    if case.golden_path not in _PLANNED:
        _PLANNED[case.golden_path] = golden.fresh_plan(case)
    return _PLANNED[case.golden_path]


def test_manifest_covers_every_workload() -> None:
    workloads = {p.resolve() for p in (ROOT / "data" / "workloads").glob("**/*.json")}
    big = set(golden.planning_only())
    assert workloads <= {c.graph_path for c in CASES} | big
    assert big <= workloads and not big & {c.graph_path for c in CASES}
    for p in big:  # planning only: the graph loads and validates
        load_graph(p)
    for c in CASES:
        assert c.golden_path.exists(), f"{c.golden_path} missing: run `slotplan golden --regenerate`"


@pytest.mark.parametrize("case", WORKLOAD_PARAMS)
def test_golden(case: golden.GoldenCase, request: pytest.FixtureRequest) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") and request.config.getvalue("dist") == "loadgroup":
        # the group reached xdist (pytest 9.2 and xdist 3.8 lose it: pyproject.toml's pin)
        assert request.node.nodeid.endswith(f"@workload-{case.name}.{case.entry.params}"), request.node.nodeid
    expected = golden.load_golden(case)
    assert expected is not None, f"{case.golden_path} missing: run `slotplan golden --regenerate`"
    fresh = golden.fresh_digest(case, planned(case))
    report = diff_digests([expected], [fresh], "batch", str(case.golden_path), "fresh plan")
    if report.changed:
        what = "REGRESSION" if report.regressed else "changed (no regression)"
        pytest.fail(
            f"golden plan {case.name} @ {case.entry.params}: {what}; if intended, run "
            f"`slotplan golden --regenerate`\n\n{render_markdown(report)}",
            pytrace=False,
        )


def test_golden_cli_regenerate_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "golden"
    d.mkdir()
    shutil.copy(ROOT / "data" / "workloads" / "conv1.json", tmp_path / "conv1.json")
    (d / "manifest.json").write_text(json.dumps({
        "schema": "slotplan.golden-manifest/1",
        "entries": [{"graph": "../conv1.json", "params": "n13", "options": {}}],
    }))
    code, out, _ = run_cli(["golden", "--regenerate", "--dir", str(d)], capsys)
    assert code == 0 and "conv1.n13.json" in out
    g = json.loads((d / "conv1.n13.json").read_text())
    assert g["schema"] == "slotplan.digest/1" and g["status"] == "ok"
    assert "plan_seconds" not in g["summary"] and g["nodes"][0]["kernel"]
    code, out, _ = run_cli(["golden", "--dir", str(d)], capsys)
    assert code == 0 and "no changes" in out
    # a golden that promised fewer rotations: the fresh plan regresses
    g["summary"]["rotations"] -= 1
    (d / "conv1.n13.json").write_text(json.dumps(g))
    code, out, err = run_cli(["golden", "--dir", str(d)], capsys)
    assert code == 1 and "regression" in out and "regressed" in err
    # a golden that promised more: changed, still a failure (goldens must be kept current)
    g["summary"]["rotations"] += 2
    (d / "conv1.n13.json").write_text(json.dumps(g))
    code, out, err = run_cli(["golden", "--dir", str(d)], capsys)
    assert code == 1 and "no regression" in err


def test_golden_bad_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "manifest.json").write_text('{"schema": "nope"}')
    code, _, err = run_cli(["golden", "--dir", str(tmp_path)], capsys)
    assert code == 2 and "manifest" in err
