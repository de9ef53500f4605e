"""examples/digits: the training script on a subset, then import, plan and simulate a few test
images; the simulated (encrypted-path) argmax against the float model's."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest

from backends.sim import simulate
from planner.frontend.importers.onnx_import import ImportOptions, import_model
from planner.frontend.params import preset
from planner.frontend.reference import reference
from planner.pipeline import plan_graph
from tests.helpers import REPO_ROOT, needs

pytestmark = needs("sklearn")

SCRIPT = REPO_ROOT / "examples" / "digits" / "train.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("digits_train", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _train(tmp_path: Path, kind: str) -> tuple[ModuleType, Path]:
    mod = _script()
    out = tmp_path / kind
    assert mod.main([str(out), "--model", kind, "--epochs", "6", "--train-limit", "400", "--calib", "64"]) == 0
    return mod, out


def test_split_and_files(tmp_path: Path) -> None:
    mod, out = _train(tmp_path, "cnn")
    tx, ty, vx, vy = mod.load_split()
    assert (len(tx), len(vx)) == (1347, 450)
    assert np.array_equal(np.bincount(vy), np.bincount(np.load(out / "test_y.npy")))
    x = np.load(out / "test_x.npz")["x"]
    assert x.shape == (450, 1, 8, 8) and x.min() >= 0.0 and x.max() <= 1.0
    assert np.load(out / "calib.npz")["x"].shape == (64, 1, 8, 8)
    info = json.loads((out / "float.json").read_text())
    assert info["test"] == 450 and info["float_top1"] > 0.8  # 400 images, 6 epochs
    onnx.checker.check_model(onnx.load(out / "model.onnx"))
    # deterministic: the same command writes the same model
    again = tmp_path / "again"
    mod.main([str(again), "--model", "cnn", "--epochs", "6", "--train-limit", "400", "--calib", "64"])
    assert (again / "model.onnx").read_bytes() == (out / "model.onnx").read_bytes()


@pytest.mark.parametrize(("kind", "degree", "preset_name"), [("mlp", None, "n14"), ("cnn", 3, "n14")])
def test_import_plan_simulate(tmp_path: Path, kind: str, degree: int | None, preset_name: str) -> None:
    mod, out = _train(tmp_path, kind)
    model = onnx.load(out / "model.onnx")
    res = import_model(out / "model.onnx", ImportOptions(degree=degree), calibrate=out / "calib.npz")
    plan = plan_graph(res.graph, preset(preset_name))
    xs = np.load(out / "test_x.npz")["x"][:6]
    float_logits = mod.float_logits(model, xs)
    gin, gout = res.input_map["x"], res.output_map["logits"]
    agree = 0
    for x, want in zip(xs, float_logits, strict=True):
        values = {**res.weights, gin: x.reshape(res.graph.shape(gin))}
        got = simulate(plan.plan, plan.tables, values).outputs[gout].reshape(-1)
        ref = reference(res.graph, values)[gout].reshape(-1)
        np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9 * float(np.max(np.abs(ref))))
        agree += int(np.argmax(got) == np.argmax(want))
    assert agree == len(xs)
