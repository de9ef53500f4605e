"""Issue 17: seeing a plan -- layout pictures, explanations, progress (CLI side).

The plan page in the service is tested in tests/api/test_plan_page.py (real browser)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from api.show import (
    GARBAGE_RGB,
    NODE_FIELDS,
    grid_shape,
    layout_views,
    node_numbers,
    peak_breakdown,
    render_layouts,
    table_sizes,
    text_report,
)
from planner.frontend.graph import load_graph
from planner.frontend.params import load_params
from planner.ir.io import load_tables, write_outputs
from planner.pipeline import PlanOptions, PlanResult, plan_graph
from planner.report.explain import explain_choices, plan_layouts, replan
from tests.api.test_show import PNG_MAGIC, with_schedule
from tests.helpers import REPO_ROOT, run_cli

ROOT = REPO_ROOT
MLP = ROOT / "data" / "workloads" / "keymemrt_mlp.json"
CONV1 = ROOT / "data" / "workloads" / "conv1.json"


@pytest.fixture(scope="module")
def mlp() -> PlanResult:
    """Dense layers with dirty outputs and mask conversions at n15."""
    return plan_graph(load_graph(MLP), load_params("n15"), PlanOptions())


@pytest.fixture(scope="module")
def conv1() -> PlanResult:
    return plan_graph(load_graph(CONV1), load_params("n13"), PlanOptions())


def _tables(res: PlanResult, tmp: Path) -> dict[str, np.ndarray]:
    f = tmp / "t.npz"
    write_outputs(res.plan, None, res.tables, f)
    return dict(load_tables(f))


# ---------------------------------------------------------------- memory and tables


@pytest.mark.parametrize("scheduled", [False, True])
def test_peak_breakdown_adds_up_to_the_summary(conv1: PlanResult, scheduled: bool) -> None:
    plan = with_schedule(conv1.plan) if scheduled else conv1.plan
    bd = peak_breakdown(plan)
    pk = plan["summary"]["peak_bytes"]
    assert bd.total == pk["total"]
    assert bd.part(bd.keys) + bd.part(bd.ciphertexts) + bd.part(bd.plaintexts) == pk["total"]
    assert bd.scheduled is scheduled
    if not scheduled:  # keep-all: every key the program uses is resident at the peak
        assert sum(n for _, n, _ in bd.keys) == plan["summary"]["rotation_keys"]


def test_table_sizes_match_the_tables_file(mlp: PlanResult, tmp_path: Path) -> None:
    tb = _tables(mlp, tmp_path)
    groups = table_sizes(mlp.plan, tb)
    assert sum(g.bytes for g in groups) == sum(a.nbytes for a in tb.values())
    by = {g.tensor: g for g in groups}
    assert by["x"].role == "input" and by["fc3_b"].role == "output"
    assert sum(g.tables for g in groups) == sum(1 for k in tb if k.endswith(".idx"))


def test_text_report_explains(mlp: PlanResult) -> None:
    ex = explain_choices(mlp.problem, mlp.solution)
    txt = text_report(mlp.plan, ex)
    for needle in ("Layout notation", "~            dirty", "Memory at the modelled peak", "rotation keys",
                   "Tables file", "runner-up", "lost on rotations", "fc1: imra"):
        assert needle in txt, needle


# ---------------------------------------------------------------- runner-up


def test_explain_runner_up(mlp: PlanResult) -> None:
    ex = explain_choices(mlp.problem, mlp.solution)
    assert ex["schema"] == "slotplan.explain/1"
    assert [n["id"] for n in ex["nodes"]] == [n["id"] for n in mlp.plan["nodes"]]
    fc1 = ex["nodes"][0]
    assert fc1["chosen"]["kernel"] == "imra"
    ru = fc1["runner_up"]
    assert ru["kernel"] != "imra" and ru["feasible"] and ru["objective_delta"] > 0
    assert ru["cost"]["rotations"] > fc1["chosen"]["cost"]["rotations"]
    assert mlp.solution.status.value == "optimal"
    for n in ex["nodes"]:  # an optimal plan: no feasible alternative the solver saw is cheaper
        r = n["runner_up"]
        if r is not None and r["feasible"]:
            assert r["objective_delta"] >= 0, n


def test_replan_reproduces(mlp: PlanResult) -> None:
    problem, sol = replan(mlp.plan)
    assert dict(sol.choice) == dict(mlp.solution.choice)
    broken = json.loads(json.dumps(mlp.plan))
    broken["nodes"][0]["kernel"] = "bsgs"
    with pytest.raises(Exception, match="did not reproduce node 'fc1'"):
        replan(broken)


# ---------------------------------------------------------------- layouts


def test_layouts_match_tables_and_lowering(mlp: PlanResult, tmp_path: Path) -> None:
    tb = _tables(mlp, tmp_path)
    infos = plan_layouts(mlp.problem, mlp.solution)
    # inputs and outputs: the planner's layout objects give exactly the plan's tables
    for name, prefix in (("x", "in/x"), ("fc3_b", "out/fc3_b")):
        lay = infos[name].layout
        for q in range(lay.n_ct):
            assert np.array_equal(lay.index_map(q), tb[f"{prefix}/{q}.idx"])
    # a mask conversion keeps every element where it is and makes the layout clean
    conv = infos["conv/fc1_b/fc1"]
    assert conv.kind == "conversion (mask)" and conv.layout.clean and not infos["fc1"].layout.clean
    assert np.array_equal(conv.layout.index_map(0), infos["fc1"].layout.index_map(0))
    # every conversion the plan's nodes report has a picture, and only those
    reported = {f"conv/{n['id']}/{c['operand']}" for n in mlp.plan["nodes"] for c in n["conversions"]}
    assert reported == {k for k in infos if k.startswith("conv/")}
    views = layout_views(mlp.plan, None, tb)
    assert [v.name for v in views] == list(infos)
    assert {v.source for v in views if v.name in ("x", "fc3_b")} == {"tables file"}
    other = dict(tb)
    other["in/x/0.idx"] = np.roll(tb["in/x/0.idx"], 1)
    with pytest.raises(Exception, match="does not match"):
        layout_views(mlp.plan, ["x"], other)


def test_grid_shape() -> None:
    assert grid_shape(32768) == (128, 256)
    assert grid_shape(16384) == (128, 128)
    assert grid_shape(8192) == (64, 128)
    assert grid_shape(100) == (7, 16)


def _rgb(path: Path) -> np.ndarray:
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    return np.asarray(img[..., :3], dtype=np.float64)


def test_render_layouts_png_and_svg(mlp: PlanResult, tmp_path: Path) -> None:
    views = layout_views(mlp.plan, ["x", "fc1", "conv/fc1_b/fc1"], replanned=(mlp.problem, mlp.solution))
    png = render_layouts(views, tmp_path / "l.png")
    assert png.read_bytes().startswith(PNG_MAGIC)
    img = _rgb(png)
    garbage = np.all(np.abs(img - np.array(GARBAGE_RGB)) < 0.02, axis=-1)
    assert garbage.sum() > 5000  # fc1 is dirty (~): its empty slots are drawn as garbage
    clean_only = render_layouts([views[0], views[2]], tmp_path / "c.png")
    # clean layouts only: no garbage slots, only the legend's small red patches
    assert np.all(np.abs(_rgb(clean_only) - np.array(GARBAGE_RGB)) < 0.02, axis=-1).sum() < 1000
    svg = render_layouts(views, tmp_path / "l.svg")
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text and "[c:128:1]~" in text
    again = render_layouts(views, tmp_path / "l2.svg")
    assert again.read_bytes() == svg.read_bytes()  # deterministic


def test_render_layouts_caps_ciphertexts(tmp_path: Path) -> None:
    from api.show import LayoutView

    maps = np.full((20, 32768), -1, dtype=np.int64)
    for q in range(20):
        maps[q, :1000] = np.arange(1000) + q * 1000
    v = LayoutView("big", "node output", "big", (20, 1000), "ct[c/1:20];[c:1:1000][w:1000:1]~", False, maps, "test")
    out = render_layouts([v], tmp_path / "big.svg", max_ct=3)
    text = out.read_text()
    assert "showing 3 of 20 ciphertexts" in text and "ct 2:" in text and "ct 3:" not in text


# ---------------------------------------------------------------- CLI


def test_cli_plan_explain_keeps_plan_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    code, _, _ = run_cli(["plan", str(MLP), "--params", "n15", "-o", str(a)], capsys)
    assert code == 0
    code, out, _ = run_cli(["plan", str(MLP), "--params", "n15", "-o", str(b), "--explain"], capsys)
    assert code == 0 and "runner-up" in out
    with_ex = json.loads(b.read_text())
    ex = with_ex.pop("explain")
    assert ex["nodes"][0]["runner_up"]["kernel"] == "bsgs"
    from planner.ir.io import dumps_plan

    assert dumps_plan(with_ex) == a.read_text()  # the flag only adds the key
    assert "explain" not in json.loads(a.read_text())


def test_cli_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out1, err1 = run_cli(["plan", str(MLP), "--params", "n15"], capsys)
    assert code == 0 and err1 == ""  # stderr is no terminal here: quiet by default
    code, out2, err2 = run_cli(["plan", str(MLP), "--params", "n15", "--progress"], capsys)
    assert code == 0
    for stage in ("candidates", "conversions", "solve", "lowering"):
        assert f"slotplan: {stage}: done in" in err2
    assert "objective" in err2 and "bound" in err2
    strip = [x for x in out1.splitlines() if "plan " not in x]  # the last line has the wall time
    assert strip == [x for x in out2.splitlines() if "plan " not in x]
    code, _, err3 = run_cli(["plan", str(MLP), "--params", "n15", "--memory-cap", "700MiB", "--json",
                             "--progress"], capsys)
    assert code == 0 and "key schedule: done" in err3


def test_bench_progress_keeps_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    suite = str(ROOT / "data" / "suites" / "fame.json")
    code, out1, err1 = run_cli(["bench", suite, "--json"], capsys)
    assert code == 0 and err1 == ""
    code, out2, err2 = run_cli(["bench", suite, "--json", "--progress"], capsys)
    assert code == 0 and "slotplan: bench: started (12 steps)" in err2 and "slotplan: bench: done in" in err2

    def rows(out: str) -> list[dict[str, Any]]:
        return [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in out.splitlines()]

    assert rows(out1) == rows(out2)  # the same rows (wall times aside)


def test_bench_progress_keeps_stdout_one_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """test_bench_progress_keeps_stdout (the whole FAME suite twice; `make test-all`) on a
    suite of its first workload: --progress writes to stderr only, stdout's rows unchanged."""
    suite = json.loads((ROOT / "data" / "suites" / "fame.json").read_text())
    first = suite["workloads"][0]
    first["graph"] = str((ROOT / "data" / "suites" / first["graph"]).resolve())
    path = tmp_path / "one.json"
    path.write_text(json.dumps({**suite, "workloads": [first]}))
    code, out1, err1 = run_cli(["bench", str(path), "--json"], capsys)
    assert code == 0 and err1 == ""
    code, out2, err2 = run_cli(["bench", str(path), "--json", "--progress"], capsys)
    assert code == 0 and "slotplan: bench: started (" in err2 and "slotplan: bench: done in" in err2

    def rows(out: str) -> list[dict[str, Any]]:
        return [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in out.splitlines()]

    assert rows(out1) == rows(out2) and len(rows(out1)) >= 1


def test_cli_show_layouts(mlp: PlanResult, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pf = tmp_path / "plan.json"
    pf.write_text(json.dumps(mlp.plan))
    tf = tmp_path / "t.npz"
    write_outputs(mlp.plan, None, mlp.tables, tf)
    png, svg = tmp_path / "l.png", tmp_path / "l.svg"
    code, out, err = run_cli(["show", str(pf), "--tables", str(tf), "--layout", "x", "--layout", "conv/fc2_b/fc2",
                              "--png", str(png), "--svg", str(svg)], capsys)
    assert code == 0, err
    assert f"wrote {png}" in out and f"wrote {svg}" in out and "re-derived" in out
    assert png.read_bytes().startswith(PNG_MAGIC) and "conv/fc2_b/fc2" in svg.read_text()
    code, _, err = run_cli(["show", str(pf), "--layout", "nope", "--png", str(png)], capsys)
    assert code == 2 and "no layout 'nope'" in err and "conv/fc1_b/fc1" in err
    with zipfile.ZipFile(tf) as zf:
        assert not any(n.startswith("layout/") for n in zf.namelist())  # tables untouched


# ---------------------------------------------------------------- per-node numbers


@pytest.mark.parametrize("workload,preset", [("keymemrt_mlp", "n15"), ("conv1", "n13")])
def test_node_numbers_sum_to_summary(workload: str, preset: str) -> None:
    """What `show` and the plan page display per node must add up to the plan's summary."""
    plan: dict[str, Any] = plan_graph(load_graph(ROOT / "data" / "workloads" / f"{workload}.json"),
                                      load_params(preset), PlanOptions()).plan
    rows = [node_numbers(n) for n in plan["nodes"]]
    checked = 0
    for f in NODE_FIELDS:
        if f == "depth" or f not in plan["summary"] or not all(f in r for r in rows):
            continue
        assert sum(r[f] for r in rows) == plan["summary"][f], f
        checked += 1
    assert checked == len(NODE_FIELDS) - 1  # every counted field, not just some
