"""Ranges enforced on every plan (SPEC section 9): an input outside its declared ``range`` is
refused (exit 2, one line naming the tensor and the values), and a run whose values leave a
Chebyshev ``poly``'s ``domain`` is a failure naming the node (exit 1), on the simulator and
on Lattigo alike."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from common.errors import ValuesError
from planner.frontend.graph import parse_graph
from planner.frontend.ranges import check_input_ranges

Cli = Callable[..., tuple[int, str, str]]


def _graph(x_range: list[float] | None, domain: list[float] = [-2.0, 2.0]) -> dict:  # noqa: B006
    x: dict = {"shape": [2, 4], "role": "input"}
    if x_range is not None:
        x["range"] = x_range
    return {
        "schema": "slotplan.graph/1", "name": "ranged",
        "tensors": {"x": x, "W": {"shape": [4, 8], "role": "weight"}},
        "nodes": [{"id": "flat", "op": "reshape", "inputs": ["x"], "shape": [8]},
                  {"id": "h", "op": "matvec", "inputs": ["W", "flat"]},
                  # a degree-15 Chebyshev fit of ReLU on the domain (what an importer writes)
                  {"id": "act", "op": "poly", "inputs": ["h"], "basis": "chebyshev", "domain": domain,
                   "coeffs": _relu_coeffs(domain)}],
        "outputs": ["act"],
    }


def _relu_coeffs(domain: list[float]) -> list[float]:
    from planner.frontend.importers.approx import FUNCTIONS, fit

    return list(fit(FUNCTIONS["relu"], (domain[0], domain[1]), degree=15, samples=None).coeffs)


# ------------------------------------------------------------------ check_input_ranges
def test_check_input_ranges_accepts_inside_and_any_shape() -> None:
    g = parse_graph(_graph([-1.0, 1.0]))
    check_input_ranges(g, {"x": np.linspace(-1, 1, 8)})  # flat, end points included
    check_input_ranges(g, {"x": np.zeros((1, 2, 4))})  # a leading batch dimension of 1
    check_input_ranges(g, {"x": np.zeros((5, 8))})  # N = 5 samples
    check_input_ranges(g, {"other": np.full(8, 9.0)})  # not an input: not checked here
    check_input_ranges(parse_graph(_graph(None)), {"x": np.full(8, 1e9)})  # no declared range


def test_check_input_ranges_one_line_naming_tensor_range_values() -> None:
    g = parse_graph(_graph([-0.1, 1.1]))
    x = np.full((3, 2, 4), 0.5)
    x[1, 1, 2] = 1.25
    x[2, 0, 0] = -0.3
    with pytest.raises(ValuesError) as ei:
        check_input_ranges(g, {"x": x})
    msg = str(ei.value)
    assert "\n" not in msg
    assert ei.value.tensor == "x"
    assert msg.startswith("tensor 'x': input outside its declared range [-0.1, 1.1]")
    assert "values in [-0.3, 1.25]" in msg
    assert "2 of 24 outside" in msg
    assert "sample 1 index [1, 2] = 1.25" in msg


def test_check_input_ranges_nan_and_bad_size() -> None:
    g = parse_graph(_graph([0.0, 1.0]))
    x = np.zeros(8)
    x[3] = np.nan
    with pytest.raises(ValuesError, match=r"1 of 8 outside, the first at index \[0, 3\] = nan"):
        check_input_ranges(g, {"x": x})
    with pytest.raises(ValuesError, match="not a multiple of the tensor's 8 elements"):
        check_input_ranges(g, {"x": np.zeros(12)})


# ------------------------------------------------------------------ slotplan run
def _save(path: Path, **arrays: np.ndarray) -> Path:
    with path.open("wb") as fh:
        np.savez(fh, **arrays)
    return path


def _plan(tmp_path: Path, cli: Cli, doc: dict, params: str = "n14") -> tuple[Path, Path]:
    g = tmp_path / "g.json"
    g.write_text(json.dumps(doc))
    plan, tables = tmp_path / "p.json", tmp_path / "t.npz"
    code, _, err = cli("plan", g, "--params", params, "-o", plan, "--tables", tables)
    assert code == 0, err
    return plan, tables


def test_run_refuses_input_outside_range(tmp_path: Path, cli: Cli) -> None:
    plan, tables = _plan(tmp_path, cli, _graph([-0.1, 1.1]))
    W = _save(tmp_path / "w.npz", W=np.full((4, 8), 0.1))
    x = np.full((2, 4), 0.5)
    x[0, 1] = 1.2  # slightly above the calibrated range
    X = _save(tmp_path / "x.npz", x=x[None])
    out_file = tmp_path / "y.npz"
    code, out, err = cli("run", plan, "--tables", tables, "--inputs", X, "--weights", W, "--out", out_file)
    assert code == 2
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert len(lines) == 1, err
    assert "tensor 'x'" in lines[0] and "[-0.1, 1.1]" in lines[0] and "index [0, 1] = 1.2" in lines[0]
    assert not out_file.exists()  # nothing written
    # seeded random inputs are drawn inside the declared range: run --seed keeps working
    code, out, err = cli("run", plan, "--tables", tables, "--seed", "7", "--json")
    assert code == 0, err
    assert json.loads(out)["ok"] is True


def _run_wide(tmp_path: Path, cli: Cli, backend: str, params: str = "n14") -> tuple[int, str, str]:
    """The same model with a wide input range: the input passes, the ReLU's argument leaves
    the domain [-2, 2] its polynomial was fitted on."""
    plan, tables = _plan(tmp_path, cli, _graph([-10.0, 10.0]), params)
    W = _save(tmp_path / "w.npz", W=np.full((4, 8), 0.1))
    x = np.full((2, 4), 0.5)
    x[0, 1] = 9.0
    x[1, :] = 8.0  # inside [-10, 10]; every h = 0.1 * (3 * 0.5 + 9 + 4 * 8) = 4.25: beyond 2 by 2.25
    X = _save(tmp_path / "x.npz", x=x)
    return cli("run", plan, "--tables", tables, "--inputs", X, "--weights", W, "--backend", backend, "--json")


def test_run_fails_when_poly_argument_leaves_domain_sim(tmp_path: Path, cli: Cli) -> None:
    code, out, err = _run_wide(tmp_path, cli, "sim")
    assert code == 1
    doc = json.loads(out)
    assert doc["ok"] is False
    where = {e["where"]: e for e in doc["poly_domain_exits"]}
    assert set(where) == {"reference", "simulator's registers"}  # both checks see it
    ref = where["reference"]
    assert ref["node"] == "act" and ref["domain"] == [-2.0, 2.0]
    assert ref["max"] == pytest.approx(4.25) and ref["beyond"] == pytest.approx(2.25)
    assert ref["count"] == 4 and ref["beyond_halfwidths"] == pytest.approx(1.125)
    assert where["simulator's registers"]["node"] == "act"
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert len(lines) == 1 and lines[0].startswith("slotplan: poly 'act': its argument left the Chebyshev domain [-2, 2]")
    assert "2.25 beyond an end" in lines[0]


def test_sim_register_check_catches_what_the_reference_does_not() -> None:
    """A wrong plan (its register holds values the graph never computes) is caught by the
    simulator's own check of the Chebyshev argument."""
    from backends.sim import domain_exit

    assert domain_exit(np.array([-2.0, 0.0, 2.0 + 1e-12]), (-2.0, 2.0)) is None
    e = domain_exit(np.array([0.0, 1.0, -7.0, 3.0]), (-2.0, 2.0))
    assert e is not None and e["count"] == 2 and e["first_index"] == 2 and e["beyond"] == pytest.approx(5.0)
    from backends.sim import simulate

    plan = {"params": {"slots": 4, "log_q": [40, 40, 40]}, "plaintexts": {}, "outputs": {"y": [4]},
            "program": [{"op": "input", "dst": "c0", "tensor": "x", "table": "in"},
                        {"op": "poly", "dst": "c1", "src": "c0", "coeffs": [0.0, 1.0], "basis": "chebyshev",
                         "domain": [-1.0, 1.0]},
                        {"op": "output", "src": "c1", "tensor": "y", "table": "in"}]}
    tables = {"in.idx": np.arange(4)}
    res = simulate(plan, tables, {"x": np.array([0.5, -0.5, 1.0, 0.0])})
    assert res.domain_exits == []
    res = simulate(plan, tables, {"x": np.array([0.5, -0.5, 1.5, 0.0])})
    assert [(e["instruction"], e["count"], e["max"]) for e in res.domain_exits] == [(1, 1, 1.5)]


# ------------------------------------------------------------------ the ReLU CNN
def _lattigo_available() -> bool:
    from backends.lattigo_backend import available

    return available()


@pytest.fixture(scope="module")
def relu_cnn(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Issue 32's case: a ReLU CNN (two convolutions) imported with calibration on digit
    images in [0, 1] (its input `range` becomes [-0.1, 1.1]), planned at n14."""
    pytest.importorskip("onnx", reason="onnx is not installed")
    from tests import onnx_models as M

    b = M.Builder(seed=3)
    h = b.op("Conv", ["image", b.rand("c1.w", (4, 1, 3, 3)), b.rand("c1.b", (4,))], pads=[1, 1, 1, 1])
    h = b.op("Relu", [h], out="relu1")
    h = b.op("Conv", [h, b.rand("c2.w", (4, 4, 3, 3)), b.rand("c2.b", (4,))], pads=[1, 1, 1, 1])
    h = b.op("Flatten", [h])
    b.op("Gemm", [h, b.rand("fc.w", (10, 256)), b.rand("fc.b", (10,))], out="logits", transB=1)
    d = tmp_path_factory.mktemp("cnn")
    model = M.save(b.model({"image": [1, 1, 8, 8]}, {"logits": [1, 10]}, name="cnn"), d / "cnn.onnx")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 17, size=(32, 1, 8, 8)) / 16.0  # digit-like pixels in [0, 1]
    images[:, :, :, 0] = 0.0  # as digits: empty border columns
    np.savez(d / "cal.npz", image=images.astype(np.float32))
    from api.commands_import import write_weights
    from planner.frontend.importers.onnx_import import import_model

    res = import_model(model, None, d / "cal.npz")
    write_weights(d / "w.npz", res.weights)
    (d / "g.json").write_text(json.dumps(res.graph_json))
    wide = json.loads(json.dumps(res.graph_json))
    wide["tensors"]["image"]["range"] = [-10.0, 10.0]  # the range check out of the way
    (d / "g_wide.json").write_text(json.dumps(wide))
    return {"dir": d, "graph": d / "g.json", "wide": d / "g_wide.json", "weights": d / "w.npz"}


def _cnn_run(tmp_path: Path, cli: Cli, graph: Path, weights: Path, image: np.ndarray, backend: str
             ) -> tuple[int, str, str]:
    plan, tables = tmp_path / "p.json", tmp_path / "t.npz"
    code, _, err = cli("plan", graph, "--params", "n14", "-o", plan, "--tables", tables)
    assert code == 0, err
    X = _save(tmp_path / "x.npz", image=image)
    return cli("run", plan, "--tables", tables, "--inputs", X, "--weights", weights, "--backend", backend, "--json")


def _digit(scale: float) -> np.ndarray:
    img = np.random.default_rng(5).integers(0, 17, size=(1, 1, 8, 8)) / 16.0
    return img * scale


@pytest.mark.parametrize("backend", ["sim", pytest.param("lattigo", marks=pytest.mark.skipif(
    not _lattigo_available(), reason="Lattigo extension not built (make lattigo)"))])
def test_relu_cnn_out_of_range_image_refused_then_poly_domain_fails(
        tmp_path: Path, cli: Cli, relu_cnn: dict[str, Path], backend: str) -> None:
    g = json.loads(relu_cnn["graph"].read_text())
    assert g["tensors"]["image"]["range"] == pytest.approx([-0.1, 1.1])
    relu = next(n for n in g["nodes"] if n["op"] == "poly")
    if backend == "sim":  # an image inside the calibrated range runs OK (one Lattigo run below)
        code, out, err = _cnn_run(tmp_path, cli, relu_cnn["graph"], relu_cnn["weights"], _digit(1.0), backend)
        assert code == 0, err
        assert json.loads(out)["poly_domain_exits"] == []
    # slightly outside (pixels up to 1.25): refused before anything runs, one line
    code, out, err = _cnn_run(tmp_path, cli, relu_cnn["graph"], relu_cnn["weights"], _digit(1.25), backend)
    assert code == 2
    (line,) = [ln for ln in err.splitlines() if ln]
    assert "tensor 'image': input outside its declared range [-0.1, 1.1]" in line
    # with a wide declared range the ReLU polynomial's argument leaves its domain: a failure
    # naming the poly node (was: OK max_abs_error=1.4e+73)
    code, out, err = _cnn_run(tmp_path, cli, relu_cnn["wide"], relu_cnn["weights"], _digit(8.0), backend)
    assert code == 1, err
    doc = json.loads(out)
    assert doc["ok"] is False
    ref = next(e for e in doc["poly_domain_exits"] if e["where"] == "reference")
    assert ref["node"] == relu["id"] and ref["domain"] == pytest.approx(relu["domain"])
    assert ref["beyond"] > 0
    assert f"slotplan: poly {relu['id']!r}: its argument left the Chebyshev domain" in err
    if backend == "sim":  # the simulator's own register check sees it too
        assert any(e["where"] == "simulator's registers" and e["node"] == relu["id"]
                   for e in doc["poly_domain_exits"])


def test_wrong_plan_caught_by_the_register_check(tmp_path: Path, cli: Cli) -> None:
    """A plan whose Chebyshev instruction reads its register on the wrong scale (its domain
    shrunk 20x): the reference stays inside the graph's domain, the simulator's registers
    blow up, and the run fails naming the node."""
    from backends.runner import run_plan
    from planner.ir.io import load_plan, load_tables

    plan_path, tables_path = _plan(tmp_path, cli, _graph([-1.0, 1.0]))
    plan = load_plan(plan_path)
    tables = load_tables(tables_path, plan)
    values = {"x": np.full((2, 4), 0.5), "W": np.full((4, 8), 0.2)}  # h = 0.8 inside [-2, 2]
    rep = run_plan(plan, tables, "sim", values=values)
    assert rep.ok and rep.domain_exits == []
    (k,) = [i for i, ins in enumerate(plan["program"]) if ins["op"] == "poly"]
    a, b = plan["program"][k]["domain"]
    plan["program"][k] = {**plan["program"][k], "domain": [a / 20, b / 20]}
    rep = run_plan(plan, tables, "sim", values=values)
    assert not rep.ok
    (e,) = rep.domain_exits
    assert e["where"] == "simulator's registers" and e["node"] == "act" and e["instruction"] == k
    assert e["beyond_halfwidths"] == pytest.approx(7.0)  # t = 0.4 read as 8 on [-1, 1]
    assert rep.failure() is not None and rep.failure().startswith("poly 'act'")  # type: ignore[union-attr]


def test_free_slots_outside_a_positive_domain_are_not_exits(tmp_path: Path, cli: Cli) -> None:
    """A reciprocal on [0.4, 2.2] after a matvec: the register's free slots (zero padding,
    partial sums) lie outside the domain, tamely; the run is OK."""
    from planner.frontend.importers.approx import FUNCTIONS, fit

    f = fit(FUNCTIONS["reciprocal"], (0.4, 2.2), degree=7, samples=None)
    doc = {"schema": "slotplan.graph/1", "name": "recip",
           "tensors": {"x": {"shape": [16], "role": "input", "range": [0.5, 1.0]},
                       "W": {"shape": [16, 16], "role": "weight", "range": [0.0, 0.2]}},
           "nodes": [{"id": "h", "op": "matvec", "inputs": ["W", "x"]},
                     {"id": "r", "op": "poly", "inputs": ["h"], "basis": "chebyshev", "domain": [0.4, 2.2],
                      "coeffs": list(f.coeffs)}],
           "outputs": ["r"]}
    plan, tables = _plan(tmp_path, cli, doc)
    code, out, err = cli("run", plan, "--tables", tables, "--seed", "0", "--json")
    assert code == 0, err
    assert json.loads(out)["poly_domain_exits"] == []


@pytest.mark.skipif(not _lattigo_available(), reason="Lattigo extension not built (make lattigo)")
def test_run_fails_when_poly_argument_leaves_domain_lattigo(tmp_path: Path, cli: Cli) -> None:
    """On Lattigo too (n14, seconds): the run exits 1 naming the poly node, never OK."""
    code, out, err = _run_wide(tmp_path, cli, "lattigo")
    assert code == 1, err
    doc = json.loads(out)
    assert doc["ok"] is False
    ref = next(e for e in doc["poly_domain_exits"] if e["where"] == "reference")
    assert ref["node"] == "act" and ref["beyond"] == pytest.approx(2.25)
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert len(lines) == 1 and lines[0].startswith("slotplan: poly 'act': its argument left the Chebyshev domain")
