"""Import that refuses to be wrong (SPEC section 9, issue 32): a real skl2onnx classifier
(scikit-learn's digits) imported with its head stripped, planned and run on real digits;
``--output NAME`` cuts the model; a probability output is warned about; an approximation
that misses ``--max-error`` (or is useless without one) is refused naming the ONNX node,
with nothing written, unless ``--allow-error``."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import needs

onnx = pytest.importorskip("onnx", reason="onnx is not installed")
pytestmark = needs("sklearn", "skl2onnx")

Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture(scope="module")
def digits_mlp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An MLPClassifier (64-32-10, ReLU) on digits scaled to [0, 1], exported by skl2onnx
    with and without ZipMap; 64 calibration images and held-out test images."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a few iterations: ConvergenceWarning
        clf = MLPClassifier(hidden_layer_sizes=(32,), max_iter=30, random_state=0).fit(X[:1000], y[:1000])
    d = tmp_path_factory.mktemp("digits")
    plain, zipmap = d / "mlp.onnx", d / "mlp_zipmap.onnx"
    onnx.save(to_onnx(clf, X[:1], options={"zipmap": False}), str(plain))
    onnx.save(to_onnx(clf, X[:1]), str(zipmap))
    cal = d / "cal.npz"
    np.savez(cal, X=X[:64])
    return {"clf": clf, "X": X, "y": y, "plain": plain, "zipmap": zipmap, "cal": cal, "dir": d}


def _lines(text: str, prefix: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(prefix)]


@pytest.mark.parametrize("which", ["plain", "zipmap"])
def test_skl2onnx_head_stripped_and_noted(tmp_path: Path, cli: Cli, digits_mlp: dict[str, Any], which: str) -> None:
    g, w = tmp_path / "g.json", tmp_path / "w.npz"
    code, out, err = cli("import", digits_mlp[which], "-o", g, "--weights-out", w, "--calibrate", digits_mlp["cal"])
    assert code == 0, err
    doc = json.loads(g.read_text())
    assert doc["outputs"] == ["add_result1"]  # the logits
    assert [n["op"] for n in doc["nodes"]] == ["matvec", "add", "poly", "matvec", "add"]
    notes = _lines(out, "note:")
    assert any("stripped the classifier head" in n and "ArgMax" in n and "ArrayFeatureExtractor (ai.onnx.ml)" in n
               for n in notes), out
    if which == "zipmap":
        assert any("ZipMap (ai.onnx.ml)" in n and "'output_label', 'output_probability'" in n for n in notes)
    assert any("dropped Softmax" in n and "'add_result1'" in n for n in notes), out
    # the margin and the calibrator, on stderr
    (margin_line,) = _lines(err, "note: calibrated ranges")
    assert "widened by 0.1 x their width" in margin_line
    # ONNX Runtime when installed (the dev extra), else onnx's reference evaluator
    assert ("float runs by onnxruntime" if _have("onnxruntime") else "float runs by onnx reference evaluator") \
        in margin_line
    assert doc["tensors"]["X"]["range"] == pytest.approx([-0.1, 1.1])  # [0, 1] widened by 10% of 1


def test_digits_mlp_planned_and_run_on_real_digits(tmp_path: Path, cli: Cli, digits_mlp: dict[str, Any]) -> None:
    from backends.runner import run_plan
    from planner.ir.io import load_plan, load_tables

    g, w = tmp_path / "g.json", tmp_path / "w.npz"
    plan, tables = tmp_path / "p.json", tmp_path / "t.npz"
    # plan MODEL.onnx: the same import, then planning (n13's 3 levels are too few for depth 6)
    code, out, err = cli("plan", digits_mlp["plain"], "--params", "n13", "--calibrate", digits_mlp["cal"])
    assert code == 2 and "levels" in err
    code, out, err = cli("plan", digits_mlp["plain"], "--params", "n14", "--calibrate", digits_mlp["cal"],
                         "--graph-out", g, "--weights-out", w, "-o", plan, "--tables", tables)
    assert code == 0, err
    assert "stripped the classifier head" in err
    pl = load_plan(plan)
    tb = load_tables(tables, pl)
    weights = dict(np.load(w))
    X, clf = digits_mlp["X"], digits_mlp["clf"]
    test = X[1500:1530]
    agree = 0
    for x in test:
        rep = run_plan(pl, tb, "sim", values={**weights, "X": x.astype(np.float64)})
        assert rep.ok and not rep.domain_exits, rep.failure()
        agree += int(np.argmax(rep.outputs["add_result1"]) == clf.predict(x[None])[0])
    # the degree-15 ReLU errs by ~0.04 on the samples: the class agrees on (nearly) every image
    assert agree >= 29, agree


def test_output_cuts_the_model(tmp_path: Path, cli: Cli, digits_mlp: dict[str, Any]) -> None:
    g, w = tmp_path / "g.json", tmp_path / "w.npz"
    code, out, err = cli("import", digits_mlp["plain"], "-o", g, "--weights-out", w, "--output", "next_activations")
    assert code == 0, err
    doc = json.loads(g.read_text())
    assert doc["outputs"] == ["next_activations"]
    assert [n["op"] for n in doc["nodes"]] == ["matvec", "add", "poly"]
    assert "cut the model at 'next_activations' (--output)" in out
    code, _, err = cli("import", digits_mlp["plain"], "-o", tmp_path / "g2.json", "--weights-out", tmp_path / "w2.npz",
                       "--output", "no_such_value")
    assert code == 2 and "--output 'no_such_value': the model has no value of that name" in err
    assert not (tmp_path / "g2.json").exists()
    # on a graph file --output is refused (the plan file is -o)
    code, _, err = cli("plan", g, "--params", "n14", "--output", "x")
    assert code == 2 and "only for an ONNX model" in err


def test_probability_output_warned(tmp_path: Path, cli: Cli, digits_mlp: dict[str, Any]) -> None:
    g, w = tmp_path / "g.json", tmp_path / "w.npz"
    code, out, err = cli("import", digits_mlp["plain"], "-o", g, "--weights-out", w, "--calibrate", digits_mlp["cal"],
                         "--output", "probabilities")
    assert code == 0, err
    (warning,) = _lines(err, "warning:")
    assert "output 'probabilities' is a probability (Softmax" in warning
    assert warning.endswith("cut at the logits with --output add_result1")


def test_missed_max_error_refused_naming_the_node(tmp_path: Path, cli: Cli, digits_mlp: dict[str, Any]) -> None:
    g, w = tmp_path / "g.json", tmp_path / "w.npz"
    args = ("import", digits_mlp["plain"], "-o", g, "--weights-out", w, "--calibrate", digits_mlp["cal"],
            "--max-error", "0.001", "--relu", "direct")
    code, out, err = cli(*args)
    assert code == 2
    (line,) = [ln for ln in err.splitlines() if ln]
    assert line.startswith("slotplan: onnx node 'Relu': the relu polynomial on [-1.72, 3.206] reaches a largest error")
    assert "at degree 127, over --max-error 0.001" in line
    assert not g.exists() and not w.exists()  # nothing half-written
    code, out, err = cli(*args, "--allow-error")
    assert code == 0, err
    (warning,) = _lines(err, "warning:")
    assert warning.startswith("warning: onnx node 'Relu': the relu polynomial") and "--allow-error" in warning
    assert g.exists() and w.exists()
    # --relu auto (the default) meets the same target with the composite sign polynomial
    code, out, err = cli(*args[:-2], "--json")
    assert code == 0, err
    (row,) = json.loads(out)["approximations"]
    assert "composite" in row["function"] and row["max_error"] <= 0.001 and json.loads(out)["warnings"] == []
    # a target the fit meets: the smallest degree that meets it
    code, out, err = cli("import", digits_mlp["plain"], "-o", g, "--weights-out", w, "--calibrate",
                         digits_mlp["cal"], "--max-error", "0.05", "--json")
    assert code == 0, err
    (row,) = json.loads(out)["approximations"]
    assert row["degree"] == 15 and row["max_error"] <= 0.05 and json.loads(out)["warnings"] == []


def _reciprocal_model(path: Path) -> None:
    from onnx import TensorProto, helper

    node = helper.make_node("Reciprocal", ["x"], ["y"], name="recip")
    graph = helper.make_graph([node], "recip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_useless_fit_refused_without_max_error(tmp_path: Path, cli: Cli) -> None:
    """The issue's case: the reciprocal over [3.8e-10, 0.011] (a probability's row sum)."""
    m = tmp_path / "recip.onnx"
    _reciprocal_model(m)
    cal = tmp_path / "cal.npz"
    np.savez(cal, x=np.geomspace(3.8e-10, 0.011, 64, dtype=np.float32).reshape(4, 16))
    g, w = tmp_path / "g.json", tmp_path / "w.npz"
    code, out, err = cli("import", m, "-o", g, "--weights-out", w, "--calibrate", cal)
    assert code == 2
    (line,) = [ln for ln in err.splitlines() if ln]
    assert line.startswith("slotplan: onnx node 'recip': the reciprocal polynomial on [")
    assert "over 0.1 x its largest |value|" in line and "a useless fit" in line
    assert not g.exists() and not w.exists()
    # a range where the fit is good imports silently
    np.savez(cal, x=np.linspace(1.0, 4.0, 64, dtype=np.float32).reshape(4, 16))
    code, out, err = cli("import", m, "-o", g, "--weights-out", w, "--calibrate", cal)
    assert code == 0, err
    assert not _lines(err, "warning:")


def test_calibration_falls_back_to_the_reference_evaluator(digits_mlp: dict[str, Any],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from planner.frontend.importers.onnx_model import run_float

    model = onnx.load(str(digits_mlp["plain"]))
    samples = [{"X": x[None]} for x in digits_mlp["X"][:3]]
    names = ["add_result", "add_result1"]
    ort_vals = None
    if _have("onnxruntime"):
        ort_vals, who = run_float(model, samples, names)
        assert who.startswith("onnxruntime ")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
    ref_vals, who = run_float(model, samples, names)
    assert who == "onnx reference evaluator"
    assert ref_vals["add_result1"].shape == (3, 1, 10)
    if ort_vals is not None:
        np.testing.assert_allclose(ort_vals["add_result1"], ref_vals["add_result1"], rtol=1e-5, atol=1e-5)


def _have(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def test_string_labels_head_stripped(tmp_path: Path, cli: Cli, digits_mlp: dict[str, Any]) -> None:
    """Class names as labels: skl2onnx's label output is a string tensor (ZipMap keyed by
    strings); stripped all the same, the model ends at the logits."""
    from skl2onnx import to_onnx
    from sklearn.neural_network import MLPClassifier

    names = np.array(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])
    X, y = digits_mlp["X"], digits_mlp["y"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = MLPClassifier(hidden_layer_sizes=(16,), max_iter=5, random_state=0).fit(X[:500], names[y[:500]])
    m = tmp_path / "str.onnx"
    onnx.save(to_onnx(clf, X[:1]), str(m))
    g, w = tmp_path / "g.json", tmp_path / "w.npz"
    code, out, err = cli("import", m, "-o", g, "--weights-out", w, "--calibrate", digits_mlp["cal"])
    assert code == 0, err
    assert json.loads(g.read_text())["outputs"] == ["add_result1"]
    assert "ZipMap (ai.onnx.ml)" in out and "'output_label'" in out


def test_normalisation_at_the_end_warned(tmp_path: Path, cli: Cli) -> None:
    """exp(z) / ReduceSum(exp(z)) written out by hand is a probability too."""
    from tests import onnx_models as M

    b = M.Builder(seed=1)
    z = b.op("Gemm", ["x", b.rand("w", (4, 8)), b.rand("b", (4,))], out="logits", transB=1)
    e = b.op("Exp", [z])
    s = b.op("ReduceSum", [e, b.ints("axes", [1])], keepdims=1)
    b.op("Div", [e, s], out="p")
    m = M.save(b.model({"x": [1, 8]}, {"p": [1, 4]}), tmp_path / "norm.onnx")
    cal = tmp_path / "cal.npz"
    np.savez(cal, x=np.random.default_rng(0).uniform(-1, 1, (16, 8)).astype(np.float32))
    code, out, err = cli("import", m, "-o", tmp_path / "g.json", "--weights-out", tmp_path / "w.npz",
                         "--calibrate", cal)
    assert code == 0, err
    (warning,) = _lines(err, "warning:")
    assert "output 'p' is a probability (Div by its ReduceSum" in warning
    assert warning.endswith("cut at the logits with --output logits")
