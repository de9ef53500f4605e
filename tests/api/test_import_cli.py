"""``slotplan import`` and ``slotplan plan MODEL.onnx``: files written, the calibration
table, exit status 2 with one line naming the ONNX node for every refusal."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from planner.frontend.graph import load_graph
from planner.frontend.reference import reference
from tests import onnx_models as M

pytest.importorskip("onnx")

Cli = Callable[..., tuple[int, str, str]]


def _files(tmp_path: Path) -> tuple[Path, Path, Path]:
    model = M.save(M.mlp("Relu", seed=3), tmp_path / "mlp.onnx")
    calib = tmp_path / "calib.npz"
    np.savez(calib, input=np.random.default_rng(0).normal(size=(16, 64)).astype(np.float32))
    return model, calib, tmp_path / "mlp.json"


def test_import_writes_graph_and_weights(tmp_path: Path, cli: Cli) -> None:
    model, calib, graph = _files(tmp_path)
    weights = tmp_path / "w.npz"
    code, out, err = cli("import", model, "-o", graph, "--weights-out", weights, "--calibrate", calib)
    assert code == 0, err
    assert "calibrated on 16 sample(s)" in out and "approximated activations" in out
    assert "/Relu_2" in out and "max error (samples)" in out and "end-to-end" in out
    g = load_graph(graph)
    with np.load(weights) as z:
        w = {k: z[k] for k in z.files}
    assert set(w) == set(g.weights)
    x = np.random.default_rng(1).normal(size=64)
    y = reference(g, {**w, "input": x})["logits"]
    assert y.shape == (10,)
    assert g.tensors["input"].range is not None


def test_import_json_report(tmp_path: Path, cli: Cli) -> None:
    model, calib, graph = _files(tmp_path)
    code, out, _ = cli("import", model, "-o", graph, "--weights-out", tmp_path / "w.npz", "--calibrate", calib,
                       "--max-error", "0.05", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["calibrated"] == 16 and doc["outputs"] == {"logits": "logits"}
    assert all(a["max_error"] <= 0.05 or a["degree"] == 127 for a in doc["approximations"])
    assert "input" in doc["ranges"]


def test_uncalibrated_import_states_the_defaults(tmp_path: Path, cli: Cli) -> None:
    model, _, graph = _files(tmp_path)
    code, out, _ = cli("import", model, "-o", graph, "--weights-out", tmp_path / "w.npz", "--degree", "7")
    assert code == 0
    assert "uncalibrated: activations fitted on the default domain [-8, 8]" in out
    nodes = [n for n in load_graph(graph).nodes if n.op == "poly"]
    assert [len(n.coeffs or ()) for n in nodes] == [8, 8]


def test_plan_model_onnx(tmp_path: Path, cli: Cli) -> None:
    model = M.save(M.mlp("square", dtype=np.float64), tmp_path / "sq.onnx")
    plan, weights, graph = tmp_path / "p.json", tmp_path / "w.npz", tmp_path / "g.json"
    code, out, err = cli("plan", model, "--params", "n14", "-o", plan, "--weights-out", weights,
                         "--graph-out", graph, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["summary"]["depth"] >= 5
    assert json.loads(plan.read_text())["graph"]["name"] == "mlp"
    assert weights.exists() and load_graph(graph).outputs == ("logits",)


def test_plan_graph_refuses_import_options(tmp_path: Path, cli: Cli) -> None:
    code, _, err = cli("plan", "data/workloads/conv1.json", "--degree", "7")
    assert code == 2 and "--degree: only for an ONNX model" in err


def _bad_cases(tmp_path: Path) -> list[tuple[list[object], str]]:
    b = M.Builder()
    b.op("MaxPool", ["x"], out="y", kernel_shape=[2, 2], pads=[1, 1, 1, 1])
    maxpool = M.save(b.model({"x": [1, 1, 4, 4]}, {"y": None}), tmp_path / "maxpool.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x08\x07garbage" * 20)
    ok = M.save(M.mlp("Relu"), tmp_path / "ok.onnx")
    bad_calib = tmp_path / "bad.npz"
    np.savez(bad_calib, other=np.zeros(3))
    return [
        ([maxpool], "onnx node '/MaxPool_1' (MaxPool): padding [1, 1, 1, 1] is not supported (max pooling "
                    "pads with -infinity); hint: use pads 0"),
        ([junk], "is not an ONNX model"),
        ([tmp_path / "none.onnx"], "cannot read model file"),
        ([ok, "--calibrate", bad_calib], "has no array 'input'"),
        ([ok, "--calibrate", tmp_path / "missing.npz"], "no such file"),
        ([ok, "--degree", "3", "--max-error", "0.1"], "not both"),
        ([ok, "--degree", "1000"], "--degree must be in 1..127"),
    ]


def test_refusals_exit_2_one_line_nothing_written(tmp_path: Path, cli: Cli) -> None:
    for args, needle in _bad_cases(tmp_path):
        graph, weights = tmp_path / "g.json", tmp_path / "w.npz"
        code, out, err = cli("import", *args, "-o", graph, "--weights-out", weights)
        assert code == 2, (args, err)
        assert needle in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert not graph.exists() and not weights.exists()
        code, _, err = cli("plan", *args, "--params", "n13")
        assert code == 2 and needle in err and "Traceback" not in err


def test_onnx_is_model_not_graph() -> None:
    """A ``.onnx`` path is imported, never parsed as a graph (JSON) file."""
    from api.commands_import import is_onnx

    assert is_onnx(Path("a/b.ONNX")) and not is_onnx(Path("g.json"))


def _evaluate(model_path: Path, x: np.ndarray) -> np.ndarray:
    import onnx
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(model_path))
    name = model.graph.input[0].name
    return np.asarray(ReferenceEvaluator(model).run(None, {name: x})[0], dtype=np.float64)


@pytest.mark.parametrize("activation", ["square", "Relu"])
def test_import_plan_run_on_user_data(tmp_path: Path, cli: Cli, activation: str) -> None:
    """import -> plan --params auto -> run --inputs/--weights/--out in the simulator: the
    decrypted output against onnx's evaluator, exact for x*x, within the import's measured
    end-to-end error for ReLU."""
    model = M.save(M.mlp(activation, sizes=(16, 8, 4), seed=2), tmp_path / "m.onnx")
    rng = np.random.default_rng(0)
    calib = tmp_path / "c.npz"
    np.savez(calib, input=rng.normal(size=(32, 16)).astype(np.float32))
    graph, weights, plan, tables = (tmp_path / n for n in ("g.json", "w.npz", "p.json", "t.npz"))
    code, out, err = cli("import", model, "-o", graph, "--weights-out", weights, "--calibrate", calib, "--json")
    assert code == 0, err
    report = json.loads(out)
    code, _, err = cli("plan", graph, "--params", "auto", "-o", plan, "--tables", tables)
    assert code == 0, err
    x = rng.normal(size=(1, 16)).astype(np.float32)
    xs, ys = tmp_path / "x.npz", tmp_path / "y.npz"
    np.savez(xs, input=x)
    code, out, err = cli("run", plan, "--tables", tables, "--inputs", xs, "--weights", weights, "--out", ys)
    assert code == 0, err
    with np.load(ys) as z:
        y = z["logits"].reshape(-1)
    want = _evaluate(model, x).reshape(-1)
    bound = 1e-6 if activation == "square" else 2 * report["end_to_end_error"] + 1e-6
    assert np.max(np.abs(y - want)) <= bound
