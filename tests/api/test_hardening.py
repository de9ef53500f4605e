"""Issue #16: bad input gets one line and exit 2 (never a traceback), caps, security of
parameters, tables tied to their plan, plan validation on load."""

from __future__ import annotations

import copy
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from api.rest import RestLimits, create_app
from common.errors import ParamsError
from planner.frontend.graph import load_graph, parse_graph
from planner.frontend.params import PRESETS, Params, check_security
from planner.ir.io import DIGEST_KEY, PlanFileError, load_plan, load_tables, validate_plan
from planner.pipeline import PlanOptions, plan_graph
from tests.helpers import REPO_ROOT
from tests.planner.batch.test_batch import matvec, run_cli

ROOT = REPO_ROOT
CONV1 = ROOT / "data" / "workloads" / "conv1.json"


def one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("slotplan: ") and "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """matvec 16x16 at n12 (free layout) and row-major, each with its tables."""
    d = tmp_path_factory.mktemp("planned")
    g = d / "mv.json"
    g.write_text(json.dumps(matvec(16, 16, "mv")))
    out: dict[str, Path] = {"graph": g}
    for tag, extra in (("free", []), ("row", ["--input-layout", "row-major"])):
        p, t = d / f"{tag}.plan.json", d / f"{tag}.npz"
        plan = parse_graph(json.loads(g.read_text()))
        assert plan is not None
        res = plan_graph(plan, PRESETS["n12"], PlanOptions(input_layout="row-major" if extra else "free"))
        from planner.ir.io import write_outputs

        write_outputs(res.plan, p, res.tables, t)
        out[tag], out[tag + "_tables"] = p, t
    return out


# ---------------------------------------------------------------------------------- item 1


def test_huge_memory_cap_plans_instead_of_crashing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["plan", str(CONV1), "--params", "n13", "--memory-cap", str(2**63), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["summary"]["memory_cap_bytes"] == 2**63


# ---------------------------------------------------------------------------------- item 4


def test_smallest_feasible_cap_does_not_depend_on_the_cap_asked(capsys: pytest.CaptureFixture[str]) -> None:
    g = str(ROOT / "data" / "workloads" / "mvm1.json")
    advice = []
    for cap in ("100MiB", "200MiB"):
        code, _, err = run_cli(["plan", g, "--params", "n16", "--memory-cap", cap], capsys)
        assert code == 2
        line = one_line(err)
        advice.append(int(line.split("smallest feasible cap is ")[1].split()[0]))
    assert advice[0] == advice[1]
    # the advised cap plans
    code, out, err = run_cli(["plan", g, "--params", "n16", "--memory-cap", str(advice[0]), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["summary"]["peak_bytes"]["total"] <= advice[0]


def test_smallest_feasible_cap_does_not_depend_on_the_cap_asked_small(capsys: pytest.CaptureFixture[str]) -> None:
    """The test above (mvm1 at n16, a minute; `make test-all`) on conv1 at n13."""
    g = str(ROOT / "data" / "workloads" / "conv1.json")
    advice = []
    for cap in ("1MiB", "2MiB"):
        code, _, err = run_cli(["plan", g, "--params", "n13", "--memory-cap", cap], capsys)
        assert code == 2
        line = one_line(err)
        advice.append(int(line.split("smallest feasible cap is ")[1].split()[0]))
    assert advice[0] == advice[1] > 2 << 20
    code, out, err = run_cli(["plan", g, "--params", "n13", "--memory-cap", str(advice[0]), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["summary"]["peak_bytes"]["total"] <= advice[0]


# ---------------------------------------------------------------------------------- item 5


def test_output_into_missing_directory_or_onto_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for target in (tmp_path / "nope" / "p.json", tmp_path):
        code, _, err = run_cli(["plan", str(CONV1), "--params", "n13", "-o", str(target)], capsys)
        assert code == 2
        one_line(err)
    assert list(tmp_path.iterdir()) == []  # nothing written, no directory created
    code, _, err = run_cli(["plan", str(CONV1), "--params", "n13", "--tables", str(tmp_path / "x" / "t.npz"),
                            "-o", str(tmp_path / "p.json")], capsys)
    assert code == 2 and not (tmp_path / "p.json").exists()


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def _mutated(planned: dict[str, Path], tmp_path: Path, fn: Any) -> Path:
    plan = json.loads(planned["free"].read_text())
    fn(plan)
    return _write(tmp_path, "bad.plan.json", json.dumps(plan))


def _set_k(plan: dict[str, Any], value: Any) -> None:
    for ins in plan["program"]:
        if ins["op"] == "rot":
            ins["k"] = value
            return
        if ins["op"] == "rot_hoisted":
            ins["ks"][0] = value
            return
    raise AssertionError("no rotation")


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("empty_program", "program"),
        ("npz_as_plan", "npz"),
        ("directory", "directory"),
        ("deep", "nested"),
        ("k_float", "integers"),
        ("k_string", "integers"),
        ("nan_coeff", "coeffs"),
        ("unknown_op", "unknown op"),
        ("not_ssa", "SSA"),
    ],
)
def test_run_refuses_bad_plans(case: str, needle: str, planned: dict[str, Path], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    if case == "empty_program":
        path = _mutated(planned, tmp_path, lambda p: p.update(program=[]))
    elif case == "npz_as_plan":
        path = planned["free_tables"]
    elif case == "directory":
        path = tmp_path
    elif case == "deep":
        path = _write(tmp_path, "deep.json", "[" * 100_000 + "]" * 100_000)
    elif case == "k_float":
        path = _mutated(planned, tmp_path, lambda p: _set_k(p, 2.5))
    elif case == "k_string":
        path = _mutated(planned, tmp_path, lambda p: _set_k(p, "3"))
    elif case == "nan_coeff":
        def add_poly(p: dict[str, Any]) -> None:
            p["program"].insert(1, {"op": "poly", "dst": "zz", "src": p["program"][0]["dst"],
                                    "coeffs": [float("nan"), 1.0]})
        path = _mutated(planned, tmp_path, add_poly)
    elif case == "unknown_op":
        path = _mutated(planned, tmp_path, lambda p: p["program"].insert(1, {"op": "teleport"}))
    else:
        path = _mutated(planned, tmp_path, lambda p: p["program"].insert(1, dict(p["program"][0])))
    code, _, err = run_cli(["run", str(path)], capsys)
    assert code == 2, err
    assert needle in one_line(err)


def test_run_seed_must_be_non_negative(planned: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["run", str(planned["free"]), "--seed", "-1"], capsys)
    assert code == 2
    one_line(err)


def _npz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for k, v in members.items():
            zf.writestr(k + ".npy", v)
    return buf.getvalue()


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=False)
    return buf.getvalue()


def test_tables_header_claiming_128_gib_is_refused(planned: dict[str, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False, "shape": (2**34,)})
    path = _write(tmp_path, "huge.npz", _npz({"in/x/0.idx": header.getvalue()}))
    code, _, err = run_cli(["run", str(planned["free"]), "--tables", str(path)], capsys)
    assert code == 2
    assert "tables file" in one_line(err)


def test_float_index_tables_are_refused(planned: dict[str, Path], tmp_path: Path) -> None:
    plan = load_plan(planned["free"])
    good = dict(np.load(planned["free_tables"]))
    name = next(k for k in good if k.endswith(".idx"))
    bad = {k: _npy(v) for k, v in good.items()}
    bad[name] = _npy(good[name].astype(np.float64))
    path = _write(tmp_path, "float.npz", _npz(bad))
    with pytest.raises(PlanFileError, match="integers"):
        load_tables(path, plan)


def test_simulator_drops_dead_registers(planned: dict[str, Path], tmp_path: Path) -> None:
    from backends.runner import run_plan

    plan = load_plan(planned["free"])
    src = plan["program"][0]["dst"]
    dead = [{"op": "add", "dst": f"dead{i}", "a": src, "b": src} for i in range(20_000)]
    plan["program"][1:1] = dead
    validate_plan(plan)
    import tracemalloc

    tracemalloc.start()
    rep = run_plan(plan, load_tables(planned["free_tables"], load_plan(planned["free"])), "sim", 0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert rep.ok
    assert peak < 200 * 2**20  # 20k live registers of 2048 float64 would be 330 MB


# ---------------------------------------------------------------------------------- item 6


def test_tables_of_another_plan_are_refused(planned: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    tabs = dict(np.load(planned["free_tables"]))
    assert DIGEST_KEY in tabs
    code, out, err = run_cli(["run", str(planned["row"]), "--tables", str(planned["free_tables"])], capsys)
    assert code == 2
    assert "another plan" in one_line(err)
    code, _, err = run_cli(["run", str(planned["row"]), "--tables", str(planned["row_tables"])], capsys)
    assert code == 0, err


# ---------------------------------------------------------------------------------- item 7

INSECURE = {"log_n": 13, "log_q": [60] * 8 + [40], "log_p": [60] * 1, "log_scale": 40}


def test_insecure_custom_params_refused_unless_allowed(planned: dict[str, Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    p = Params.from_json(INSECURE)
    assert p.log_qp > 218 and not p.secure
    with pytest.raises(ParamsError, match="128-bit"):
        check_security(p)
    pfile = _write(tmp_path, "params.json", json.dumps(INSECURE))
    code, _, err = run_cli(["plan", str(planned["graph"]), "--params", str(pfile)], capsys)
    assert code == 2 and "128-bit" in one_line(err)
    code, out, err = run_cli(["plan", str(planned["graph"]), "--params", str(pfile), "--allow-insecure",
                              "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["summary"]["insecure"] is True
    # the labelled test preset keeps working, and its plans say insecure too (SPEC section 9,
    # issue 38); a secure preset's summary has no such key
    code, out, err = run_cli(["plan", str(planned["graph"]), "--params", "n12", "--json"], capsys)
    assert code == 0 and json.loads(out)["summary"]["insecure"] is True
    code, out, err = run_cli(["plan", str(planned["graph"]), "--params", "n13", "--json"], capsys)
    assert code == 0 and "insecure" not in json.loads(out)["summary"]


def test_poly_coefficients_are_bounded() -> None:
    g = {"schema": "slotplan.graph/1", "name": "p", "tensors": {"x": {"shape": [8], "role": "input"}},
         "nodes": [{"id": "y", "op": "poly", "inputs": ["x"], "coeffs": [0.0, 1e308]}], "outputs": ["y"]}
    from common.errors import GraphError

    with pytest.raises(GraphError, match="coeffs"):
        parse_graph(g)


# ---------------------------------------------------------------------------------- item 9 (CLI)


def test_plan_json_reports_measured_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["plan", str(CONV1), "--params", "n13", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and "timing" not in doc
    assert doc["summary"]["plan_seconds"] > 0 and doc["summary"]["solver"]["seconds"] > 0


def test_keys_output_is_byte_deterministic(planned: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    outs = []
    for i in range(2):
        o = tmp_path / f"k{i}.json"
        code, _, err = run_cli(["keys", str(planned["free"]), "--strategy", "exact", "-o", str(o)], capsys)
        assert code == 0, err
        outs.append(o.read_bytes())
    assert outs[0] == outs[1]
    # a re-scheduled plan keeps its tables
    code, _, err = run_cli(["run", str(tmp_path / "k0.json"), "--tables", str(planned["free_tables"])], capsys)
    assert code == 0, err


def test_show_png_into_missing_directory(planned: dict[str, Path], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "missing" / "x.png"
    code, _, err = run_cli(["show", str(planned["free"]), "--png", str(target)], capsys)
    assert code == 2 and "does not exist" in err
    assert not target.parent.exists()


def test_graph_loads_golden_workload_unchanged() -> None:
    # the coefficient bound does not touch the workloads
    for p in (ROOT / "data" / "workloads").glob("*.json"):
        load_graph(p)


_ = (copy, RestLimits, create_app)
