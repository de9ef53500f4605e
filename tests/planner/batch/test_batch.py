"""``slotplan batch``: parallel planning, one JSON line per graph, resumable, failures isolated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO_ROOT, run_cli

VOLATILE = ("timing",)


def matvec(n: int, k: int, name: str) -> dict[str, Any]:
    return {
        "schema": "slotplan.graph/1",
        "name": name,
        "tensors": {"W": {"shape": [n, k], "role": "weight"}, "x": {"shape": [k], "role": "input"}},
        "nodes": [{"id": "y", "op": "matvec", "inputs": ["W", "x"]}],
        "outputs": ["y"],
    }




def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def stable(line: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in line.items() if k not in VOLATILE and k != "path"}


@pytest.fixture()
def graphs(tmp_path: Path) -> Path:
    d = tmp_path / "graphs"
    d.mkdir()
    (d / "a.json").write_text(json.dumps(matvec(16, 16, "a")))
    (d / "b.json").write_text(json.dumps(matvec(32, 16, "b")))
    (d / "broken.json").write_text('{"schema": "slotplan.graph/1", "name": "broken", "tensors": {}, '
                                   '"nodes": [{"id": "n1", "op": "conv2d", "inputs": ["q"]}], "outputs": ["n1"]}')
    (d / "notes.txt").write_text("not a graph")
    return d


def test_batch_directory_lines_and_failures(graphs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results.jsonl"
    code, _, err = run_cli(["batch", str(graphs), "--params", "n12", "--jobs", "2", "--out", str(out)], capsys)
    assert code == 1  # one graph failed; the others were planned
    assert "1 failed" in err and "Traceback" not in err
    got = {x["graph"]["name"]: x for x in lines(out)}
    assert set(got) == {"a", "b", "broken"}
    for name in ("a", "b"):
        x = got[name]
        assert x["status"] == "ok" and x["error"] is None
        assert x["schema"] == "slotplan.batch/1"
        assert len(x["graph"]["sha256"]) == 64 and len(x["key"]) == 64
        assert x["params"] == "n12"
        assert x["summary"]["rotations"] >= 0 and "plan_seconds" not in x["summary"]
        assert "seconds" not in x["summary"]["solver"]
        assert x["nodes"][0]["id"] == "y" and x["nodes"][0]["kernel"]
        assert "plan_seconds" in x["timing"]
    bad = got["broken"]
    assert bad["status"] == "error" and "n1" in bad["error"] and bad["summary"] is None


def test_batch_is_deterministic_and_resumable(graphs: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (graphs / "broken.json").unlink()
    out1, out2 = tmp_path / "r1.jsonl", tmp_path / "r2.jsonl"
    assert run_cli(["batch", str(graphs), "--params", "n12", "--out", str(out1)], capsys)[0] == 0
    assert run_cli(["batch", str(graphs / "b.json"), str(graphs / "a.json"), "--params", "n12", "--jobs", "1",
                    "--out", str(out2)], capsys)[0] == 0
    key = lambda x: x["key"]  # noqa: E731
    assert sorted(map(stable, lines(out1)), key=key) == sorted(map(stable, lines(out2)), key=key)

    # resume: nothing new to do
    code, _, err = run_cli(["batch", str(graphs), "--params", "n12", "--out", str(out1)], capsys)
    assert code == 0 and "0 planned" in err and "2 skipped" in err
    assert len(lines(out1)) == 2
    # a new graph, and an interrupted previous run (a cut line): only the new graph is planned
    (graphs / "c.json").write_text(json.dumps(matvec(8, 8, "c")))
    with out1.open("a") as fh:
        fh.write('{"schema": "slotplan.batch/1", "key": "abc", "sta')
    code, _, err = run_cli(["batch", str(graphs), "--params", "n12", "--out", str(out1)], capsys)
    assert code == 0 and "1 planned" in err
    names = [x["graph"]["name"] for x in _valid_lines(out1)]
    assert sorted(names) == ["a", "b", "c"]
    # other options are another key: planned again
    code, _, err = run_cli(["batch", str(graphs / "a.json"), "--params", "n12", "--kernels", "bsgs",
                            "--out", str(out1)], capsys)
    assert code == 0 and "1 planned" in err


def _valid_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for x in path.read_text().splitlines():
        try:
            out.append(json.loads(x))
        except json.JSONDecodeError:
            continue
    return out


def test_batch_stdout_without_out(graphs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["batch", str(graphs / "a.json"), "--params", "n12"], capsys)
    assert code == 0
    (line,) = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert line["graph"]["name"] == "a" and line["status"] == "ok"


def test_batch_time_limit_and_timeout_status(graphs: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.jsonl"
    code, _, _ = run_cli(["batch", str(graphs / "a.json"), "--params", "n12", "--time-limit", "0.5",
                          "--out", str(out)], capsys)
    assert code == 0
    (line,) = lines(out)
    assert line["options"]["time_limit_s"] == 0.5


@pytest.mark.parametrize(
    "args",
    [
        ["batch", "/nonexistent/dir"],
        ["batch", "GRAPHS", "--params", "n99"],
        ["batch", "GRAPHS", "--solver", "gurobi"],
        ["batch", "GRAPHS", "--time-limit", "-3"],
        ["batch", "GRAPHS", "--memory-cap", "lots"],
        ["batch", "GRAPHS", "--kernels", "magic"],
    ],
)
def test_batch_bad_input_exit_2(graphs: Path, args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(graphs) if a == "GRAPHS" else a for a in args]
    code, _, err = run_cli(args, capsys)
    assert code == 2
    msg = [x for x in err.splitlines() if x.strip()]
    assert len(msg) == 1 and msg[0].startswith("slotplan: ") and "Traceback" not in err


def test_batch_empty_directory_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["batch", str(tmp_path)], capsys)
    assert code == 2 and "no graph files" in err


def test_batch_on_ray_matches_the_pool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--engine ray (local Ray, 2 CPUs) gives the same lines as the process pool, keyed by the
    REST plan id, and a resumed run skips them."""
    pytest.importorskip("ray")
    d = tmp_path / "g"
    d.mkdir()
    root = REPO_ROOT / "data" / "workloads"
    for name in ("conv1", "conv2"):
        (d / f"{name}.json").write_text((root / f"{name}.json").read_text())
    (d / "mv.json").write_text(json.dumps(matvec(16, 16, "mv")))
    pool_out, ray_out = tmp_path / "pool.jsonl", tmp_path / "ray.jsonl"
    assert run_cli(["batch", str(d), "--params", "n13", "--out", str(pool_out)], capsys)[0] == 0
    code, _, err = run_cli(["batch", str(d), "--params", "n13", "--engine", "ray", "--jobs", "2",
                            "--out", str(ray_out)], capsys)
    assert code == 0, err
    key = lambda x: x["key"]  # noqa: E731
    assert sorted(map(stable, lines(pool_out)), key=key) == sorted(map(stable, lines(ray_out)), key=key)
    # the key is the REST plan id of the same request
    from api.rest import PlanRequest, RestLimits, validate_request

    mv = next(x for x in lines(ray_out) if x["graph"]["name"] == "mv")
    vr = validate_request(PlanRequest(graph=matvec(16, 16, "mv"), params="n13", options=mv["options"]),
                          RestLimits())
    assert vr.id == mv["key"]
    code, _, err = run_cli(["batch", str(d), "--params", "n13", "--engine", "ray", "--out", str(ray_out)], capsys)
    assert code == 0 and "3 skipped" in err


def test_batch_engine_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.json").write_text(json.dumps(matvec(8, 8, "a")))
    code, _, err = run_cli(["batch", str(tmp_path), "--engine", "spark"], capsys)
    assert code == 2 and "unknown engine" in err
    code, _, err = run_cli(["batch", str(tmp_path), "--address", "x:1"], capsys)
    assert code == 2 and "--engine ray" in err
