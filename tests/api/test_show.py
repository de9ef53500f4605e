"""``slotplan show``: text overview, key residency timeline, memory series, PNG."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from api.show import key_timeline, memory_timeline, render_png, text_report
from planner.frontend.graph import load_graph
from planner.frontend.params import Params, load_params
from planner.ir.analysis import memory_profile
from planner.pipeline import PlanOptions, plan_graph
from tests.helpers import REPO_ROOT, run_cli

ROOT = REPO_ROOT
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def plan() -> dict[str, Any]:
    g = load_graph(ROOT / "data" / "workloads" / "conv1.json")
    # imra: rotations over several steps, so a per-use key schedule lowers the key peak
    # (the time objective now picks hs-diagonal here: one hoisted group needs all its keys)
    return plan_graph(g, load_params("n13"), PlanOptions(kernels=("imra", "elementwise"))).plan


def with_schedule(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan with a key schedule: each key loaded before its first use and dropped
    after its last (what a memory-capped plan looks like)."""
    prog = plan["program"]
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, ins in enumerate(prog):
        ks = [ins["k"]] if ins["op"] == "rot" else ins["ks"] if ins["op"] == "rot_hoisted" else []
        for k in ks:
            first.setdefault(k, i)
            last[k] = i
    out: list[dict[str, Any]] = []
    for i, ins in enumerate(prog):
        out += [{"op": "load_key", "k": k} for k, f in sorted(first.items()) if f == i]
        out.append(ins)
        out += [{"op": "drop_key", "k": k} for k, j in sorted(last.items()) if j == i]
    p = copy.deepcopy(plan)
    p["program"] = out
    params = Params.from_json(p["params"])
    p["summary"]["peak_bytes"] = memory_profile(out, params)
    p["summary"]["key_loads"] = len(first)
    p["summary"]["memory_cap_bytes"] = int(p["summary"]["peak_bytes"]["total"] * 1.25)
    return p


def test_key_timeline_keep_all(plan: dict[str, Any]) -> None:
    tl = key_timeline(plan["program"])
    assert not tl.scheduled
    assert len(tl.keys) == plan["summary"]["rotation_keys"]
    n = len(plan["program"])
    assert all(tl.intervals[k] == [(0, n)] for k in tl.keys)
    assert sum(len(v) for v in tl.uses.values()) == plan["summary"]["rotations"]


def test_key_timeline_with_schedule(plan: dict[str, Any]) -> None:
    p = with_schedule(plan)
    tl = key_timeline(p["program"])
    assert tl.scheduled and len(tl.keys) == plan["summary"]["rotation_keys"]
    for k in tl.keys:
        (start, end) = tl.intervals[k][0]
        assert all(start <= u < end for u in tl.uses[k])  # every use while resident


@pytest.mark.parametrize("scheduled", [False, True])
def test_memory_series_matches_summary_peak(plan: dict[str, Any], scheduled: bool) -> None:
    p = with_schedule(plan) if scheduled else plan
    mem = memory_timeline(p["program"], Params.from_json(p["params"]))
    total = mem["keys"] + mem["plaintexts"] + mem["ciphertexts"]
    pk = p["summary"]["peak_bytes"]
    assert total.max() == pk["total"]
    assert mem["keys"].max() == pk["keys"]
    assert mem["ciphertexts"].max() == pk["ciphertexts"]
    assert mem["plaintexts"].max() == pk["plaintexts"]
    if scheduled:
        assert mem["keys"].max() < plan["summary"]["peak_bytes"]["keys"]


def test_text_report(plan: dict[str, Any]) -> None:
    txt = text_report(plan)
    assert "conv1 @ n13" in txt and f"rotations {plan['summary']['rotations']}" in txt
    assert "all keys resident" in txt


@pytest.mark.parametrize("scheduled", [False, True])
def test_render_png(plan: dict[str, Any], tmp_path: Path, scheduled: bool) -> None:
    p = with_schedule(plan) if scheduled else plan
    out = render_png(p, tmp_path / "sub" / "plan.png")
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000
    import matplotlib.image as mpimg

    img = mpimg.imread(out)
    assert img.shape[0] > 600 and img.shape[1] > 1000


def test_cli_show(plan: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pf = tmp_path / "plan.json"
    pf.write_text(json.dumps(plan))
    png = tmp_path / "plan.png"
    code, out, _ = run_cli(["show", str(pf), "--png", str(png)], capsys)
    assert code == 0 and f"wrote {png}" in out
    assert png.read_bytes().startswith(PNG_MAGIC)
    code, out, _ = run_cli(["show", str(pf)], capsys)
    assert code == 0 and "kernel" in out


@pytest.mark.parametrize("content", [None, "{}", "not json", '{"schema": "slotplan.plan/1"}'])
def test_cli_show_bad_input(tmp_path: Path, content: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    pf = tmp_path / "plan.json"
    if content is not None:
        pf.write_text(content)
    code, _, err = run_cli(["show", str(pf), "--png", str(tmp_path / "x.png")], capsys)
    assert code == 2 and "Traceback" not in err
    assert len([x for x in err.splitlines() if x.strip()]) == 1


def test_cli_show_png_name(plan: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pf = tmp_path / "plan.json"
    pf.write_text(json.dumps(plan))
    code, _, err = run_cli(["show", str(pf), "--png", str(tmp_path / "x.jpg")], capsys)
    assert code == 2 and ".png" in err
