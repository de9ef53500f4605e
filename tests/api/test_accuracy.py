"""``slotplan accuracy`` (SPEC section 9) on a small synthetic classifier: a matvec, an x^2
activation and a second matvec, with its float ONNX model (onnx.helper) beside the plan."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import REPO_ROOT, cli_in_process, run_cli

ROOT = REPO_ROOT
N = 40


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """``slotplan ARGS`` in this process (tests/api/test_cli.py runs the real process)."""
    return cli_in_process(args, cwd=ROOT)


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import onnx
    from onnx import helper, numpy_helper

    d = tmp_path_factory.mktemp("acc")
    rng = np.random.default_rng(7)
    W1, W2 = rng.normal(0, 0.4, (12, 16)), rng.normal(0, 0.5, (10, 12))
    graph = {"schema": "slotplan.graph/1", "name": "tiny_cls",
             "tensors": {"x": {"shape": [16], "role": "input", "range": [-1.0, 1.0]},
                         "W1": {"shape": [12, 16], "role": "weight"}, "W2": {"shape": [10, 12], "role": "weight"}},
             "nodes": [{"id": "h", "op": "matvec", "inputs": ["W1", "x"]},
                       {"id": "a", "op": "poly", "inputs": ["h"], "coeffs": [0.0, 0.0, 1.0]},
                       {"id": "y", "op": "matvec", "inputs": ["W2", "a"]}],
             "outputs": ["y"]}
    (d / "g.json").write_text(json.dumps(graph))
    np.savez(d / "w.npz", W1=W1, W2=W2)
    X = rng.uniform(-1, 1, (N, 16))
    logits = ((X @ W1.T) ** 2) @ W2.T
    y = np.argmax(logits, axis=1)
    y[:3] = (y[:3] + 1) % 10  # three wrong labels: every model scores (N - 3) / N
    np.savez(d / "x.npz", x=X)
    np.save(d / "y.npy", y)
    nodes = [helper.make_node("MatMul", ["x", "W1T"], ["h"]), helper.make_node("Mul", ["h", "h"], ["a"]),
             helper.make_node("MatMul", ["a", "W2T"], ["logits"])]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [1, 10])],
                          [numpy_helper.from_array(W1.T.astype(np.float32), "W1T"),
                           numpy_helper.from_array(W2.T.astype(np.float32), "W2T")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(d / "m.onnx"))
    r = _run("plan", str(d / "g.json"), "--params", "n12", "-o", str(d / "p.json"), "--tables", str(d / "t.npz"))
    assert r.returncode == 0, r.stderr
    return {"dir": d, "plan": d / "p.json", "tables": d / "t.npz", "w": d / "w.npz", "x": d / "x.npz",
            "y": d / "y.npy", "model": d / "m.onnx"}


def _acc(case: dict[str, Path], *extra: str) -> subprocess.CompletedProcess[str]:
    return _run("accuracy", str(case["plan"]), "--tables", str(case["tables"]), "--weights", str(case["w"]),
                "--data", str(case["x"]), "--labels", str(case["y"]), *extra)


@pytest.mark.parametrize("backend", ["sim", "noisy"])
def test_accuracy_side_by_side(case: dict[str, Path], backend: str) -> None:
    r = _acc(case, "--model", str(case["model"]), "--backend", backend, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["samples"] == N
    for k in ("float", "reference", "backend"):
        assert rep["top1"][k] == pytest.approx((N - 3) / N), k
    assert set(rep["argmax_agreement"].values()) == {1.0}
    if backend == "sim":
        assert rep["max_abs_error"] < 1e-9
    else:  # CKKS-sized errors, and the model's prediction of them
        assert 1e-11 < rep["max_abs_error"] < 1e-5
        assert 0.25 < rep["predicted_max_abs_error"]["max"] / rep["max_abs_error"] < 4
    assert len(rep["worst"]) == 5 and rep["worst"][0]["max_abs_error"] == rep["max_abs_error"]


def test_accuracy_limit_and_table(case: dict[str, Path]) -> None:
    r = _acc(case, "--limit", "5", "--backend", "sim")
    assert r.returncode == 0, r.stderr
    assert "5 samples" in r.stdout and "argmax agreement reference~backend: 100.00%" in r.stdout


def test_accuracy_bad_input_one_line(case: dict[str, Path], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """(in this process: the CLI's error path is the same; the subprocess runs above check
    the real command line)"""
    np.save(tmp_path / "short.npy", np.zeros(N - 1, dtype=np.int64))
    np.savez(tmp_path / "bad.npz", z=np.zeros((N, 16)))
    np.savez(tmp_path / "shape.npz", x=np.zeros((N, 15)))
    cases = [
        (["--labels", str(tmp_path / "short.npy")], "39 labels for 40 samples"),
        (["--data", str(tmp_path / "bad.npz")], "'z'"),
        (["--data", str(tmp_path / "shape.npz")], "expected (samples, 16)"),
        (["--backend", "gpu"], "unknown --backend"),
        (["--labels", str(case["x"])], "labels are one .npy array"),
        (["--labels", str(tmp_path / "missing.npy")], "cannot read a .npy array"),
    ]
    for extra, msg in cases:
        base = {"--labels": str(case["y"]), "--data": str(case["x"])}
        args = list(extra)
        for k, v in base.items():
            if k not in args:
                args += [k, v]
        code, _, err = run_cli(["accuracy", str(case["plan"]), "--tables", str(case["tables"]),
                                "--weights", str(case["w"]), *args], capsys)
        assert code == 2, (extra, err)
        assert msg in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.skipif("not __import__('backends.lattigo_backend', fromlist=['x']).available()")
def test_accuracy_on_lattigo(case: dict[str, Path]) -> None:
    r = _acc(case, "--backend", "lattigo", "--limit", "2", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["samples"] == 2 and rep["argmax_agreement"]["reference~backend"] == 1.0
    assert 0 < rep["max_abs_error"] < 1e-5


def test_accuracy_on_digits_images(tmp_path: Path) -> None:
    """examples/digits: a ReLU CNN trained on a subset, imported (degree-3 ReLU fits), planned
    at n14 and scored on 8 held-out images by the float model, the graph and the noisy
    simulator: the encrypted-path argmax follows the polynomial graph's on every image."""
    pytest.importorskip("sklearn")
    import importlib.util

    spec = importlib.util.spec_from_file_location("digits_train", ROOT / "examples" / "digits" / "train.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "cnn"
    assert mod.main([str(out), "--model", "cnn", "--epochs", "6", "--train-limit", "400", "--calib", "64"]) == 0
    r = _run("import", str(out / "model.onnx"), "-o", str(out / "g.json"), "--weights-out", str(out / "w.npz"),
             "--calibrate", str(out / "calib.npz"), "--degree", "3")
    assert r.returncode == 0, r.stderr
    r = _run("plan", str(out / "g.json"), "--params", "n14", "-o", str(out / "p.json"), "--tables", str(out / "t.npz"))
    assert r.returncode == 0, r.stderr
    r = _run("accuracy", str(out / "p.json"), "--tables", str(out / "t.npz"), "--weights", str(out / "w.npz"),
             "--data", str(out / "test_x.npz"), "--labels", str(out / "test_y.npy"), "--model",
             str(out / "model.onnx"), "--backend", "noisy", "--limit", "8", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["samples"] == 8 and set(rep["top1"]) == {"float", "reference", "backend"}
    assert rep["argmax_agreement"]["reference~backend"] == 1.0
    assert 0 < rep["max_abs_error"] < 1e-3
