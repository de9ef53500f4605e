"""Plan diffs (planner/report/diff.py) and ``slotplan diff``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from planner.frontend.graph import load_graph
from planner.frontend.params import load_params
from planner.pipeline import PlanOptions, plan_graph
from planner.report.diff import (
    DiffReport,
    diff_digests,
    diff_files,
    diff_plans,
    load_digests,
    plan_digest,
    render_markdown,
    strip_timings,
)
from tests.helpers import REPO_ROOT, run_cli

ROOT = REPO_ROOT


@pytest.fixture(scope="module")
def plans() -> dict[str, dict[str, Any]]:
    g = load_graph(ROOT / "data" / "workloads" / "conv1.json")
    p = load_params("n13")
    free = plan_graph(g, p, PlanOptions()).plan
    imra = plan_graph(g, p, PlanOptions(kernels=("imra", "elementwise"))).plan
    timed = plan_graph(g, p, PlanOptions(), record_timings=True).plan
    return {"free": free, "imra": imra, "timed": timed}


def write(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj))
    return path


def test_identical_plans_no_change(plans: dict[str, dict[str, Any]]) -> None:
    rep = diff_plans(plans["free"], copy.deepcopy(plans["free"]))
    assert not rep.changed and not rep.regressed and rep.regressions == []
    # timings are not part of the comparison
    rep = diff_plans(plans["free"], plans["timed"])
    assert not rep.changed
    assert "no changes" in render_markdown(rep)


def test_strip_timings(plans: dict[str, dict[str, Any]]) -> None:
    s = strip_timings(plans["timed"]["summary"])
    assert "plan_seconds" not in s and "seconds" not in s["solver"]
    assert plans["timed"]["summary"]["plan_seconds"] > 0  # the input is untouched


def test_kernel_change_and_deltas(plans: dict[str, dict[str, Any]]) -> None:
    base, head = plans["free"], plans["imra"]
    rep = diff_plans(base, head)
    (e,) = rep.entries
    assert rep.changed
    rot = e.metric("rotations")
    assert rot is not None
    b, h = base["summary"]["rotations"], head["summary"]["rotations"]
    assert (rot.base, rot.head) == (b, h)
    assert rot.delta == h - b
    if b:
        assert rot.ratio == pytest.approx(h / b, rel=1e-5)
    assert any(f.field == "options.kernels" for f in e.fields)
    if base["nodes"][0]["kernel"] != head["nodes"][0]["kernel"]:
        (n,) = e.nodes
        kern = next(f for f in n.fields if f.field == "kernel")
        assert (kern.base, kern.head) == (base["nodes"][0]["kernel"], head["nodes"][0]["kernel"])
    # growth of rotations / key loads / peak memory is a regression; shrinking is not
    grow = [m.name for m in e.metrics if m.delta and m.delta > 0 and m.name in ("rotations", "key_loads",
                                                                                   "peak_bytes.total")]
    assert rep.regressed == bool(grow)
    assert diff_plans(head, base).regressed == any(
        m.delta and m.delta < 0 for m in e.metrics if m.name in ("rotations", "key_loads", "peak_bytes.total"))


@pytest.mark.parametrize("metric", ["rotations", "key_loads", "peak_bytes.total"])
def test_each_regression_metric(plans: dict[str, dict[str, Any]], metric: str) -> None:
    head = copy.deepcopy(plans["free"])
    if metric == "peak_bytes.total":
        head["summary"]["peak_bytes"]["total"] += 2**20
    else:
        head["summary"][metric] += 3
    rep = diff_plans(plans["free"], head)
    assert rep.regressed and len(rep.regressions) == 1 and metric in rep.regressions[0]
    m = rep.entries[0].metric(metric)
    assert m is not None and m.regression and m.delta == (2**20 if metric == "peak_bytes.total" else 3)
    md = render_markdown(rep)
    assert "regression" in md and ":warning:" in md
    # improvement: changed, not regressed
    better = diff_plans(head, plans["free"])
    assert better.changed and not better.regressed


def test_other_metrics_do_not_regress(plans: dict[str, dict[str, Any]]) -> None:
    head = copy.deepcopy(plans["free"])
    head["summary"]["pmul"] += 10
    head["summary"]["solver"]["status"] = "feasible"
    rep = diff_plans(plans["free"], head)
    assert rep.changed and not rep.regressed
    assert any(f.field == "solver.status" and f.head == "feasible" for f in rep.entries[0].fields)


def batch_line(name: str, status: str, summary: dict[str, Any] | None, params: str = "n13") -> dict[str, Any]:
    return {"schema": "slotplan.batch/1", "key": name, "path": f"{name}.json", "graph": {"name": name, "sha256": "s"},
            "params": params, "options": {}, "status": status, "error": None if status == "ok" else "boom",
            "summary": summary, "nodes": [], "timing": {"plan_seconds": 1.0}}


def test_batch_results_diff(plans: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    s = plans["free"]["summary"]
    base = [batch_line("a", "ok", s), batch_line("b", "ok", s), batch_line("gone", "ok", s)]
    head = [batch_line("a", "ok", s), batch_line("b", "error", None), batch_line("new", "ok", s)]
    bp, hp = tmp_path / "base.jsonl", tmp_path / "head.jsonl"
    bp.write_text("".join(json.dumps(x) + "\n" for x in base))
    hp.write_text("".join(json.dumps(x) + "\n" for x in head))
    kind, digests = load_digests(bp)
    assert kind == "batch" and len(digests) == 3
    rep = diff_files(bp, hp)
    assert rep.kind == "batch"
    assert rep.added == ["new@n13"] and rep.removed == ["gone@n13"]
    assert rep.regressed and any("b@n13" in r and "error" in r for r in rep.regressions)
    by = {e.key: e for e in rep.entries}
    assert not by["a@n13"].changed
    # a resumed file may hold several lines for one graph: the last one counts
    hp.write_text(hp.read_text() + json.dumps(batch_line("b", "ok", s)) + "\n")
    assert not diff_files(bp, hp).regressed


def test_digest_round_trip(plans: dict[str, dict[str, Any]]) -> None:
    d = plan_digest(plans["free"])
    rep = diff_digests([d], [json.loads(json.dumps(d))], "plan")
    assert not rep.changed
    again = DiffReport.model_validate(rep.to_json())
    assert again == rep


def test_cli_diff_formats_and_exit_codes(plans: dict[str, dict[str, Any]], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path / "a.json", plans["free"])
    worse = copy.deepcopy(plans["free"])
    worse["summary"]["rotations"] += 5
    w = write(tmp_path / "w.json", worse)
    code, out, _ = run_cli(["diff", str(a), str(a), "--fail-on-regression"], capsys)
    assert code == 0 and out.startswith("## slotplan plan diff: no changes")
    code, out, err = run_cli(["diff", str(a), str(w)], capsys)
    assert code == 0 and "| conv1@n13 |" in out  # no --fail-on-regression: report only
    code, out, err = run_cli(["diff", str(a), str(w), "--fail-on-regression"], capsys)
    assert code == 1 and "rotations" in err and "regression" in out
    code, out, _ = run_cli(["diff", str(w), str(a), "--fail-on-regression", "--format", "json"], capsys)
    assert code == 0
    rep = DiffReport.model_validate(json.loads(out))
    assert rep.changed and not rep.regressed


@pytest.mark.parametrize(
    "content",
    [None, "", "not json", "[1, 2]", '{"schema": "slotplan.plan/1"}', '{"hello": 1}\n{"x": 2}', "{}\n"],
)
def test_cli_diff_bad_input_exit_2(tmp_path: Path, content: str | None, plans: dict[str, dict[str, Any]],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path / "good.json", plans["free"])
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    code, _, err = run_cli(["diff", str(good), str(bad)], capsys)
    assert code == 2, err
    msg = [x for x in err.splitlines() if x.strip()]
    assert len(msg) == 1 and "Traceback" not in err
    code, _, err = run_cli(["diff", str(good), str(good), "--format", "html"], capsys)
    assert code == 2


def test_leaking_outputs_and_insecure_params_are_regressions() -> None:
    """Privacy and security are part of correctness: a head whose outputs stop being clean,
    or whose parameters fall below 128 bits, regresses (the reverse does not)."""
    g = load_graph(REPO_ROOT / "data" / "workloads" / "keymemrt_mlp.json")
    clean = plan_graph(g, load_params("n15"), PlanOptions()).plan
    raw = plan_graph(g, load_params("n15"), PlanOptions(clean_outputs=False)).plan
    worse = diff_plans(clean, raw)
    assert worse.regressed and any("outputs no longer clean" in r for r in worse.regressions)
    assert not diff_plans(raw, clean).regressed
    insecure = copy.deepcopy(clean)
    insecure["summary"]["insecure"] = True
    report = diff_plans(clean, insecure)
    assert report.regressed and any("128-bit" in r for r in report.regressions)
