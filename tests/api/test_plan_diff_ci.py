"""Issue 38: the plan-diff CI recipe (docs/ci/plan-diff.yml) runs scripts/plan_diff_ci.sh;
this runs the same script on two commits of a clone of this repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT
SCRIPT = "scripts/plan_diff_ci.sh"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_workflow_runs_the_script() -> None:
    wf = yaml.safe_load((ROOT / "docs" / "ci" / "plan-diff.yml").read_text())
    steps = wf["jobs"]["plan-diff"]["steps"]
    runs = [s.get("run", "") for s in steps]
    assert any(r.startswith(SCRIPT) and "base.sha" in r and "head.sha" in r for r in runs)
    assert any(s.get("with", {}).get("fetch-depth") == 0 for s in steps)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_script_reports_a_regression_and_passes_a_clean_head(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    # the committed tree of this checkout, with the script as it is here
    subprocess.run(["git", "clone", "--quiet", "--shared", "--no-checkout", str(ROOT), str(repo)], check=True)
    git(repo, "checkout", "--quiet", git(ROOT, "rev-parse", "HEAD"))
    for f in (SCRIPT,):
        shutil.copy(ROOT / f, repo / f)
    g = repo / "ci_graph.json"
    mv = {"schema": "slotplan.graph/1", "name": "mv",
          "tensors": {"W": {"shape": [16, 16], "role": "weight"}, "x": {"shape": [16], "role": "input"}},
          "nodes": [{"id": "y", "op": "matvec", "inputs": ["W", "x"]}], "outputs": ["y"]}
    g.write_text(json.dumps(mv))
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "--quiet", "-m", "base"], check=True, env=env)
    base = git(repo, "rev-parse", "HEAD")
    mv["tensors"]["W"]["shape"] = [64, 64]  # the head's graph needs more rotations
    mv["tensors"]["x"]["shape"] = [64]
    g.write_text(json.dumps(mv))
    subprocess.run(["git", "-C", str(repo), "commit", "--quiet", "-am", "head"], check=True, env=env)
    head = git(repo, "rev-parse", "HEAD")

    def run(a: str, b: str, summary: Path) -> subprocess.CompletedProcess[str]:
        e = {**env, "GITHUB_STEP_SUMMARY": str(summary), "PYTHON": sys.executable, "PLAN_DIFF_TIME_LIMIT": "10"}
        return subprocess.run(["bash", SCRIPT, a, b, "ci_graph.json"], cwd=repo, env=e, capture_output=True,
                              text=True, timeout=600)

    bad = run(base, head, tmp_path / "bad.md")
    report = (tmp_path / "bad.md").read_text()
    assert bad.returncode == 1, bad.stderr
    assert report.startswith("## slotplan plan diff") and "rotations" in report and "regression" in report.lower()
    same = run(base, base, tmp_path / "same.md")
    assert same.returncode == 0, same.stderr
    assert "## slotplan plan diff" in (tmp_path / "same.md").read_text()
    assert git(repo, "worktree", "list").count("\n") == 0  # the temporary worktrees are gone
