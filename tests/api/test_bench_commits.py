"""scripts/bench_commits.py refuses bad arguments before it builds anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "bench_commits.py"


def _run(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--before", "HEAD", "--work", str(tmp / "w"), *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_unknown_workload_exits_2_naming_it(tmp_path: Path) -> None:
    p = _run("--workloads", "conv1@n13,nosuch@n13", tmp=tmp_path)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["bench_commits: unknown workload 'nosuch' (no data/workloads/nosuch.json)"]
    assert not (tmp_path / "w").exists()  # nothing built


def test_repeat_below_one_exits_2(tmp_path: Path) -> None:
    p = _run("--repeat", "0", tmp=tmp_path)
    assert p.returncode == 2
    assert "--repeat must be at least 1" in p.stderr
    assert not (tmp_path / "w").exists()
