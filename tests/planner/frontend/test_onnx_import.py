"""ONNX import (issue 12): models built with onnx.helper, the imported graph's numpy
reference against onnx's reference evaluator; calibration; every refusal."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from common.errors import ModelError
from planner.frontend.importers import approx
from planner.frontend.importers.onnx_import import (
    ImportOptions,
    ImportResult,
    graph_shape,
    import_model,
    sanitise,
)
from planner.frontend.reference import reference
from tests import onnx_models as M

pytest.importorskip("onnx")


def _import(tmp_path: Path, model: onnx.ModelProto, calib: dict[str, np.ndarray] | None = None,
            opts: ImportOptions | None = None) -> ImportResult:
    path = M.save(model, tmp_path / f"{model.graph.name}.onnx")
    return import_model(path, opts, calib)


def _compare(model: onnx.ModelProto, res: ImportResult, feeds: dict[str, np.ndarray]) -> tuple[float, float]:
    """(max |graph reference - onnx evaluator|, max |onnx output|) over the outputs."""
    want = ReferenceEvaluator(model).run(None, feeds)
    values: dict[str, Any] = dict(res.weights)
    for name, gname in res.input_map.items():
        values[gname] = np.asarray(feeds[name], dtype=np.float64).reshape(res.graph.shape(gname))
    got = reference(res.graph, values)
    err = scale = 0.0
    for o, w in zip(model.graph.output, want, strict=True):
        g = got[res.output_map[o.name]]
        assert g.size == np.asarray(w).size
        err = max(err, float(np.max(np.abs(g.reshape(-1) - np.asarray(w, dtype=np.float64).reshape(-1)))))
        scale = max(scale, float(np.max(np.abs(w))))
    return err, scale


def _rand(shape: tuple[int, ...], seed: int = 1, dtype: Any = np.float64) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


# -- whole models ------------------------------------------------------------------------------


def test_mlp_square_is_exact(tmp_path: Path) -> None:
    model = M.mlp("square", dtype=np.float64)
    res = _import(tmp_path, model)
    assert res.approximations == []
    assert [n.op for n in res.graph.nodes] == ["matvec", "add", "mul", "matvec", "add", "mul", "matvec", "add"]
    assert res.graph.shape("input") == (64,) and res.graph.outputs == ("logits",)
    for seed in range(3):
        err, scale = _compare(model, res, {"input": _rand((1, 64), seed)})
        assert err <= 1e-9 * max(1.0, scale)


def test_lenet5_square_is_exact(tmp_path: Path) -> None:
    model = M.lenet5("square", dtype=np.float64)
    res = _import(tmp_path, model)
    ops = [n.op for n in res.graph.nodes]
    assert ops.count("conv2d") == 4  # 2 convolutions and 2 average pools (depthwise, 1/4)
    assert ops.count("matvec") == 3
    err, scale = _compare(model, res, {"image": _rand((1, 1, 28, 28))})
    assert err <= 1e-9 * max(1.0, scale)


def test_resnet20_folds_batchnorm_and_matches(tmp_path: Path) -> None:
    model = M.resnet20("Relu")
    calib = {"image": np.random.default_rng(3).normal(size=(3, 3, 32, 32)).astype(np.float32)}
    res = _import(tmp_path, model, calib)
    assert sum("folded" in n for n in res.notes) == 21  # 19 conv-BN + 2 shortcut conv-BN
    assert "bn" not in " ".join(res.graph.weights).replace("bn_folded", "").replace("bn_bias", "")
    assert len(res.approximations) == 19  # stem + 2 per block x 9
    assert res.graph.tensors["image"].range is not None
    g = res.graph
    assert all(g.tensor(n.id).range is not None for n in g.nodes)  # measured on the samples, widened
    for w in g.weights:
        assert g.tensor(w).range == (float(res.weights[w].min()), float(res.weights[w].max()))
    got = reference(g, {**res.weights, "image": calib["image"][0].astype(np.float64)})
    for n in g.nodes:
        lo, hi = g.tensor(n.id).range or (0.0, 0.0)
        assert lo <= float(got[n.id].min()) and float(got[n.id].max()) <= hi
    assert res.end_to_end_error is not None and res.end_to_end_error < 0.1
    err, scale = _compare(model, res, {"image": calib["image"][:1]})
    assert err <= res.end_to_end_error + 1e-6


def test_relu_mlp_predicts_the_float_class(tmp_path: Path) -> None:
    """The direct fit (--relu direct; auto's choice is tested in tests/planner/frontend/test_composite_relu.py)."""
    model = M.mlp("Relu", seed=3)
    rng = np.random.default_rng(5)
    res = _import(tmp_path, model, {"input": rng.normal(size=(64, 64)).astype(np.float32)},
                  ImportOptions(relu="direct"))
    assert [r.function for r in res.approximations] == ["relu", "relu"]
    ev = ReferenceEvaluator(model)
    same = 0
    for x in rng.normal(size=(100, 64)).astype(np.float32):
        want = ev.run(None, {"input": x[None]})[0]
        got = reference(res.graph, {**res.weights, "input": x.astype(np.float64)})["logits"]
        same += int(np.argmax(got) == np.argmax(want))
    assert same == 100


def test_bert_block_imports_and_matches(tmp_path: Path) -> None:
    model = M.bert_block()
    rng = np.random.default_rng(7)
    calib = {"hidden_states": rng.normal(size=(2, 128, 768)).astype(np.float32)}
    res = _import(tmp_path, model, calib)
    g = res.graph
    assert g.shape("hidden_states") == (128, 768) and g.shape("block_output") == (128, 768)
    heads = [n for n in g.nodes if n.op == "matmul" and g.encrypted(n.inputs[0]) and g.encrypted(n.inputs[1])]
    assert [g.shape(n.id) for n in heads] == [(12, 128, 128), (12, 128, 64)]
    functions = [r.function.split("(")[0] for r in res.approximations]
    assert functions == ["exp", "reciprocal", "invsqrt", "gelu", "invsqrt"]
    assert all(r.on_samples for r in res.approximations)
    assert res.end_to_end_error is not None and res.end_to_end_error < 1e-3
    err, scale = _compare(model, res, {"hidden_states": calib["hidden_states"][1:]})
    assert err <= res.end_to_end_error + 1e-6


# -- single ops --------------------------------------------------------------------------------


def _single(op: str, shape: list[int], attrs: dict[str, Any] | None = None, extra: list[str] | None = None,
            b: M.Builder | None = None, opset: int = M.OPSET, out_shape: list[int] | None = None) -> onnx.ModelProto:
    b = b or M.Builder(dtype=np.float64)
    b.op(op, ["x", *(extra or [])], out="y", **(attrs or {}))
    return b.model({"x": shape}, {"y": out_shape}, opset=opset)


POLYNOMIAL_CASES: list[tuple[str, Any]] = []


def _case(name: str) -> Any:
    def deco(fn: Any) -> Any:
        POLYNOMIAL_CASES.append((name, fn))
        return fn

    return deco


@_case("conv-groups-stride-bias")
def _conv_case() -> tuple[onnx.ModelProto, list[int]]:
    b = M.Builder(dtype=np.float64)
    w, bias = b.rand("w", (8, 2, 3, 3)), b.rand("bias", (8,))
    return _single("Conv", [1, 4, 9, 9], {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}, [w, bias], b), \
        [1, 4, 9, 9]


@_case("conv-same-upper")
def _conv_same() -> tuple[onnx.ModelProto, list[int]]:
    b = M.Builder(dtype=np.float64)
    return _single("Conv", [1, 2, 6, 6], {"auto_pad": "SAME_UPPER"}, [b.rand("w", (3, 2, 3, 3))], b), [1, 2, 6, 6]


@_case("batchnorm-alone")
def _bn_alone() -> tuple[onnx.ModelProto, list[int]]:
    b = M.Builder(dtype=np.float64)
    ins = [b.init("g", [1.5, 0.5, 2.0]), b.init("be", [0.1, -0.2, 0.3]), b.init("m", [0.0, 0.5, -0.5]),
           b.init("v", [1.0, 2.0, 0.5])]
    return _single("BatchNormalization", [1, 3, 4, 4], {"epsilon": 1e-3}, ins, b), [1, 3, 4, 4]


@_case("gemm-alpha-beta-no-trans")
def _gemm_case() -> tuple[onnx.ModelProto, list[int]]:
    b = M.Builder(dtype=np.float64)
    return _single("Gemm", [1, 6], {"alpha": 0.5, "beta": 2.0}, [b.rand("w", (6, 4)), b.rand("c", (1, 4))], b), \
        [1, 6]


@_case("gemm-batchnorm1d")
def _gemm_bn() -> tuple[onnx.ModelProto, list[int]]:
    b = M.Builder(dtype=np.float64)
    h = b.op("Gemm", ["x", b.rand("w", (4, 6)), b.rand("c", (4,))], transB=1)
    b.op("BatchNormalization", [h, b.init("g", [1, 2, 3, 4]), b.init("be", [0, 1, 0, 1]), b.init("m", [1, 0, 1, 0]),
                                b.init("v", [1, 1, 4, 4])], out="y")
    return b.model({"x": [1, 6]}, {"y": None}), [1, 6]


@_case("matmul-3d-per-head")
def _matmul3() -> tuple[onnx.ModelProto, list[int]]:
    b = M.Builder(dtype=np.float64)
    k = b.op("Transpose", ["x"], perm=[0, 1, 3, 2])
    s = b.op("MatMul", ["x", k])
    b.op("MatMul", [s, b.rand("w", (3, 4, 2))], out="y")
    return b.model({"x": [1, 3, 4, 5]}, {"y": None}), [1, 3, 4, 5]


@_case("shape-subgraph-reshape-flatten")
def _shape_chain() -> tuple[onnx.ModelProto, list[int]]:
    b = M.Builder(dtype=np.float64)
    shp = b.op("Shape", ["x"])
    n = b.op("Gather", [shp, b.ints("zero", [0])], axis=0)
    tgt = b.op("Concat", [n, b.ints("minus1", [-1])], axis=0)
    r = b.op("Reshape", ["x", tgt])
    u = b.op("Unsqueeze", [r, b.ints("ax", [1])])
    s = b.op("Squeeze", [u, b.ints("ax1", [1])])
    d = b.op("Dropout", [b.op("Identity", [s])])
    b.op("Flatten", [d], out="y", axis=1)
    return b.model({"x": ["batch", 2, 3, 4]}, {"y": None}), [1, 2, 3, 4]


@_case("elementwise-constants")
def _elementwise() -> tuple[onnx.ModelProto, list[int]]:
    b = M.Builder(dtype=np.float64)
    a = b.op("Add", ["x", b.rand("bias", (4,))])
    s = b.op("Sub", [b.init("two", np.array(2.0)), a])
    m = b.op("Mul", [s, b.rand("scale", (3, 1))])
    d = b.op("Div", [m, b.init("four", np.array([4.0]))])
    d2 = b.op("Div", [d, b.init("col", np.array([1.0, 2.0, -4.0, 8.0]))])
    p = b.op("Pow", [b.op("Neg", [d2]), b.init("e2", np.array(2.0))])
    b.op("Mul", [p, b.op("Mul", [d2, d2])], out="y")
    return b.model({"x": [1, 3, 4]}, {"y": None}), [1, 3, 4]


@_case("ct-ct-broadcast-and-reductions")
def _reductions() -> tuple[onnx.ModelProto, list[int]]:
    b = M.Builder(dtype=np.float64)
    mean = b.op("ReduceMean", ["x"], axes=[-1], keepdims=1)
    c = b.op("Sub", ["x", mean])
    s = b.op("ReduceSum", [b.op("Mul", [c, c]), b.ints("axes", [1])], keepdims=0)
    b.op("Add", [s, b.op("ReduceMean", ["x"], axes=[1, 2], keepdims=0)], out="y")
    return b.model({"x": [1, 3, 4]}, {"y": None}), [1, 3, 4]


@_case("pools")
def _pools() -> tuple[onnx.ModelProto, list[int]]:
    b = M.Builder(dtype=np.float64)
    a = b.op("AveragePool", ["x"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
    c = b.op("AveragePool", [a], kernel_shape=[2, 2], pads=[1, 1, 1, 1], strides=[2, 2], count_include_pad=1)
    b.op("GlobalAveragePool", [c], out="y")
    return b.model({"x": [1, 2, 6, 6]}, {"y": None}), [1, 2, 6, 6]


@_case("slice-split-concat")
def _slices() -> tuple[onnx.ModelProto, list[int]]:
    b = M.Builder(dtype=np.float64)
    s = b.op("Slice", ["x", b.ints("st", [1]), b.ints("en", [5]), b.ints("ax", [2])])
    b.op("Split", [s], n_out=2, axis=1)
    p0, p1 = b.nodes[-1].output
    b.op("Concat", [p1, p0, b.init("k", np.ones((1, 1, 4)))], out="y", axis=1)
    return b.model({"x": [1, 4, 6]}, {"y": None}), [1, 4, 6]


@pytest.mark.parametrize("name", [n for n, _ in POLYNOMIAL_CASES])
def test_polynomial_ops_are_exact(tmp_path: Path, name: str) -> None:
    model, shape = dict(POLYNOMIAL_CASES)[name]()
    res = _import(tmp_path, model)
    assert res.approximations == []
    err, scale = _compare(model, res, {"x": _rand(tuple(shape), 3)})
    assert err <= 1e-9 * max(1.0, scale)


ACTIVATIONS = [
    ("Relu", {}, "relu"), ("Sigmoid", {}, "sigmoid"), ("Tanh", {}, "tanh"), ("Gelu", {}, "gelu"),
    ("Gelu", {"approximate": "tanh"}, "gelu_tanh"), ("LeakyRelu", {"alpha": 0.1}, "leaky_relu(0.1)"),
    ("Exp", {}, "exp"), ("Erf", {}, "erf"), ("Abs", {}, "abs"),
]


@pytest.mark.parametrize(("op", "attrs", "function"), ACTIVATIONS)
def test_activation_within_reported_error(tmp_path: Path, op: str, attrs: dict[str, Any], function: str) -> None:
    model = _single(op, [1, 40], attrs, opset=20)
    calib = {"x": np.random.default_rng(0).normal(scale=2.0, size=(8, 40))}
    res = _import(tmp_path, model, calib, ImportOptions(degree=31))
    (row,) = res.approximations
    assert row.function == function and row.degree == 31 and row.depth == 5 and row.on_samples
    lo, hi = float(calib["x"].min()), float(calib["x"].max())
    assert row.measured == pytest.approx((lo, hi))
    assert row.domain[0] < lo and row.domain[1] > hi
    node = res.graph.node(row.node)
    assert node.basis == "chebyshev" and node.domain == row.domain
    # onnx's evaluator computes erf in float to about 1e-7; the fit's error is against math.erf
    for i in range(8):
        err, _ = _compare(model, res, {"x": calib["x"][i:i + 1]})
        assert err <= row.max_error + 1e-6
    assert res.end_to_end_error == pytest.approx(row.max_error, rel=1e-6, abs=1e-6)


def test_silu_and_gelu_patterns_become_one_polynomial(tmp_path: Path) -> None:
    b = M.Builder(dtype=np.float64)
    s = b.op("Mul", ["x", b.op("Sigmoid", ["x"])])
    e = b.op("Erf", [b.op("Mul", [s, b.init("r2", np.array(1 / math.sqrt(2)))])])
    half = b.op("Mul", [s, b.init("half", np.array(0.5))])
    b.op("Mul", [half, b.op("Add", [b.init("one", np.array(1.0)), e])], out="y")
    model = b.model({"x": [1, 30]}, {"y": None})
    calib = {"x": np.random.default_rng(1).normal(size=(4, 30))}
    res = _import(tmp_path, model, calib)
    assert [r.function for r in res.approximations] == ["silu", "gelu"]
    assert [n.op for n in res.graph.nodes] == ["poly", "poly"]
    assert res.end_to_end_error is not None and res.end_to_end_error < 1e-3


def test_softmax_and_layernorm_with_newton(tmp_path: Path) -> None:
    b = M.Builder(dtype=np.float64)
    sm = b.op("Softmax", ["x"], axis=-1)
    b.op("LayerNormalization", [sm, b.init("g", np.linspace(0.5, 1.5, 16)), b.init("be", np.zeros(16))],
         out="y", epsilon=1e-5)
    model = b.model({"x": [1, 8, 16]}, {"y": None})
    calib = {"x": np.random.default_rng(2).normal(size=(4, 8, 16))}
    for newton in (0, 1, 2):
        res = _import(tmp_path, model, calib, ImportOptions(newton=newton))
        fns = [r.function.split("(")[0] for r in res.approximations]
        assert fns == ["exp", "reciprocal", "invsqrt"]
        assert [r.newton for r in res.approximations[1:]] == [newton, newton]
        assert res.approximations[1].depth == 4 + 2 * newton and res.approximations[2].depth == 4 + 3 * newton
        err, _ = _compare(model, res, {"x": calib["x"][:1]})
        assert res.end_to_end_error is not None and err <= res.end_to_end_error + 1e-12
    assert res.end_to_end_error < 1e-3


def test_sqrt_reciprocal_and_div_by_values(tmp_path: Path) -> None:
    b = M.Builder(dtype=np.float64)
    pos = b.op("Add", [b.op("Mul", ["x", "x"]), b.init("one", np.array(1.0))])
    r = b.op("Reciprocal", [pos])
    q = b.op("Div", ["x", b.op("Sqrt", [pos])])  # read as x * invsqrt(pos)
    d = b.op("Div", [r, pos])
    b.op("Add", [b.op("Add", [q, d]), b.op("Sqrt", [pos])], out="y")
    model = b.model({"x": [1, 10]}, {"y": None})
    calib = {"x": np.random.default_rng(4).normal(size=(5, 10))}
    res = _import(tmp_path, model, calib, ImportOptions(degree=15, newton=2))
    assert sorted(r.function for r in res.approximations) == ["invsqrt", "reciprocal", "reciprocal", "sqrt"]
    assert res.end_to_end_error is not None and res.end_to_end_error < 1e-4


def test_max_error_chooses_degrees(tmp_path: Path) -> None:
    b = M.Builder(dtype=np.float64)
    b.op("Relu", [b.op("Tanh", ["x"])], out="y")
    model = b.model({"x": [1, 50]}, {"y": None})
    calib = {"x": np.random.default_rng(0).normal(size=(20, 50))}
    # the direct fit of the ReLU's kink misses 1e-4 even at degree 127: refused naming its
    # node (SPEC section 9); --relu auto meets it with a composite sign polynomial
    with pytest.raises(ModelError, match=r"onnx node '/Relu_2'.*at degree 127, over --max-error 0.0001"):
        _import(tmp_path, model, calib, ImportOptions(max_error=1e-4, relu="direct"))
    auto = _import(tmp_path, model, calib, ImportOptions(max_error=1e-4))
    assert "composite" in auto.approximations[1].function and auto.approximations[1].max_error <= 1e-4
    assert auto.warnings == []
    res = _import(tmp_path, model, calib, ImportOptions(max_error=1e-4, allow_error=True, relu="direct"))
    tanh, relu = res.approximations
    assert tanh.max_error <= 1e-4 and tanh.degree in approx.DEGREES
    smaller = approx.DEGREES[approx.DEGREES.index(tanh.degree) - 1]
    f = approx.fit(np.tanh, tanh.domain, degree=smaller, samples=calib["x"])
    assert f.max_error > 1e-4  # the chosen degree is the smallest that reaches the error
    assert relu.degree == approx.DEGREES[-1] and relu.max_error > 1e-4
    (warning,) = res.warnings  # --allow-error: written with a warning naming the node
    assert warning.startswith("onnx node '/Relu_2': the relu polynomial") and "degree 127" in warning


def test_uncalibrated_defaults(tmp_path: Path) -> None:
    res = _import(tmp_path, _single("Sigmoid", [1, 5]))
    (row,) = res.approximations
    assert row.domain == approx.DEFAULT_DOMAIN and row.degree == approx.DEFAULT_DEGREE
    assert not row.on_samples and row.measured is None and res.calibrated == 0
    assert res.graph.tensors["x"].range is None


def test_calibration_stacking(tmp_path: Path) -> None:
    """Samples stacked along the batch dimension of 1, or along a new leading one."""
    batch1 = _single("Relu", [1, 6])
    nobatch = _single("Relu", [2, 3])
    x = np.random.default_rng(0).normal(size=(7, 6))
    r1 = _import(tmp_path, batch1, {"x": x})
    r2 = _import(tmp_path, nobatch, {"x": x.reshape(7, 2, 3)})
    assert r1.calibrated == r2.calibrated == 7
    assert r1.approximations[0].measured == r2.approximations[0].measured == (x.min(), x.max())


def test_names_are_sanitised_and_weights_match(tmp_path: Path) -> None:
    assert sanitise("/layer1/conv/Conv_output_0") == "layer1_conv_Conv_output_0"
    assert sanitise("a b:c") == "a_b_c" and sanitise("///") == "t" and len(sanitise("x" * 999)) == 200
    assert graph_shape([1, 784]) == (784,) and graph_shape([1]) == (1,) and graph_shape([2, 3]) == (2, 3)
    b = M.Builder(dtype=np.float64)
    b.op("Gemm", ["in put", b.rand("fc/weight", (3, 4)), b.rand("fc/bias", (3,))], out="out:0", transB=1)
    res = _import(tmp_path, b.model({"in put": [1, 4]}, {"out:0": None}))
    assert res.graph.inputs == ("in_put",) and res.graph.outputs == ("out_0",)
    assert set(res.weights) == set(res.graph.weights) == {"fc_weight", "fc_bias"}
    for name, w in res.weights.items():
        assert w.shape == res.graph.shape(name)


# -- refusals ----------------------------------------------------------------------------------


def _refused(tmp_path: Path, model: onnx.ModelProto | bytes, *needles: str,
             calib: dict[str, np.ndarray] | None = None) -> str:
    path = tmp_path / "bad.onnx"
    if isinstance(model, bytes):
        path.write_bytes(model)
    else:
        onnx.save(model, str(path))
    with pytest.raises(ModelError) as info:
        import_model(path, None, calib)
    text = str(info.value)
    assert "\n" not in text
    for n in needles:
        assert n in text, text
    return text


def test_padded_maxpool_refused_with_hint(tmp_path: Path) -> None:
    _refused(tmp_path, _single("MaxPool", [1, 1, 4, 4], {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]}),
             "onnx node '/MaxPool_1'", "(MaxPool)", "padding [1, 1, 1, 1] is not supported", "hint: use pads 0")


def test_unknown_op_refused_listing_supported(tmp_path: Path) -> None:
    b = M.Builder(dtype=np.float64)
    b.op("TopK", ["x", b.ints("k", [2])], n_out=2, out="y")
    b.nodes[-1].output[0] = "y"
    text = _refused(tmp_path, b.model({"x": [1, 5]}, {"y": None}), "(TopK)", "unsupported op TopK")
    assert "supported: Gemm" in text


@pytest.mark.parametrize(("attrs", "needle"), [
    ({"dilations": [2, 2]}, "hint: use dilations 1"),
    ({"pads": [1, 0, 0, 0]}, "asymmetric pads"),
    ({"auto_pad": "SAME_UPPER"}, "asymmetric padding"),
])
def test_conv_refusals(tmp_path: Path, attrs: dict[str, Any], needle: str) -> None:
    b = M.Builder(dtype=np.float64)
    _refused(tmp_path, _single("Conv", [1, 1, 6, 6], attrs, [b.rand("w", (1, 1, 2, 2))], b), "(Conv)", needle)


def test_malformed_files_refused(tmp_path: Path) -> None:
    _refused(tmp_path, b"\x00\x01 not a model at all \xff" * 10, "is not an ONNX model")
    _refused(tmp_path, b"", "has no nodes")
    with pytest.raises(ModelError, match="no such file|cannot read"):
        import_model(tmp_path / "missing.onnx")


def test_missing_initializer_refused(tmp_path: Path) -> None:
    node = helper.make_node("Add", ["x", "bias"], ["y"], name="add_bias")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    text = _refused(tmp_path, model, "bias")
    assert "malformed" in text or "missing initializer" in text


def test_dynamic_shape_refused(tmp_path: Path) -> None:
    _refused(tmp_path, _single("Relu", [1, "features"]), "dynamic dimension 'features'", "static shapes")


def test_other_refusals(tmp_path: Path) -> None:
    b = M.Builder(dtype=np.float64)
    _refused(tmp_path, _single("Pow", [1, 3], None, [b.init("e", np.array(0.5))], b), "(Pow)", "exponent")
    b = M.Builder(dtype=np.float64)
    _refused(tmp_path, _single("Softmax", [1, 4, 5], {"axis": 0}, None, b), "(Softmax)", "batch dimension")
    b = M.Builder(dtype=np.float64)
    _refused(tmp_path, _single("Slice", [1, 6], None, [b.ints("s", [0]), b.ints("e", [6]), b.ints("a", [1]),
                                                       b.ints("st", [2])], b), "step 2")
    b = M.Builder(dtype=np.float64)
    b.op("Add", ["x", b.rand("c", (3, 4))], out="y")
    _refused(tmp_path, b.model({"x": [1, 4]}, {"y": None}), "(Add)", "broadcasts the value")
    b = M.Builder(dtype=np.float64)
    b.op("Add", [b.rand("c", (3, 4)), b.rand("d", (3, 4))], out="y")
    _refused(tmp_path, b.model({"x": [1, 4]}, {"y": None}), "does not depend on the model's input")


def test_calibration_refusals(tmp_path: Path) -> None:
    model = _single("Relu", [1, 6])
    _refused(tmp_path, model, "has no array 'x'", calib={"y": np.zeros((2, 6))})
    _refused(tmp_path, model, "not a stack of samples", calib={"x": np.zeros((2, 5))})
    _refused(tmp_path, model, "NaN", calib={"x": np.full((2, 6), np.nan)})
    path = tmp_path / "ok.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ModelError, match="not a readable .npz"):
        (tmp_path / "c.npz").write_bytes(b"junk")
        import_model(path, None, tmp_path / "c.npz")
    with pytest.raises(ModelError, match="--degree"):
        import_model(path, ImportOptions(degree=0))


def test_scalar_affine_folds_into_the_chebyshev_domain(tmp_path: Path) -> None:
    b = M.Builder(dtype=np.float64)
    scaled = b.op("Div", ["x", b.init("minus4", np.array(-4.0))])
    b.op("Tanh", [scaled], out="y")
    model = b.model({"x": [1, 20]}, {"y": None})
    calib = {"x": np.random.default_rng(3).normal(size=(6, 20))}
    res = _import(tmp_path, model, calib)
    (node,) = res.graph.nodes  # the division by -4 is folded into the domain
    (row,) = res.approximations
    assert node.op == "poly" and node.inputs == ("x",) and node.domain == row.domain
    assert row.measured == pytest.approx((calib["x"].min(), calib["x"].max()))
    err, _ = _compare(model, res, {"x": calib["x"][2:3]})
    assert err <= row.max_error + 1e-12


def _m(op: str, shape: list[int | str], *extra: Any, opset: int = M.OPSET, **attrs: Any) -> onnx.ModelProto:
    b = M.Builder()
    inputs = ["x", *[e(b) if callable(e) else e for e in extra]]
    b.op(op, inputs, out="y", **attrs)
    return b.model({"x": shape}, {"y": None}, opset=opset)


REFUSALS: list[tuple[str, Any, tuple[str, ...]]] = [
    ("conv1d", lambda: _m("Conv", [1, 1, 8], lambda b: b.rand("w", (2, 1, 3))), ("(Conv)", "2-D convolutions")),
    ("pad", lambda: _m("Pad", [1, 4], lambda b: b.ints("p", [0, 1, 0, 1])), ("(Pad)", "hint: use the pads")),
    ("gather", lambda: _m("Gather", [1, 4], lambda b: b.ints("i", [0]), axis=1), ("(Gather)", "hint: use Slice")),
    ("matmul-rank5", lambda: _m("MatMul", [1, 2, 2, 2, 4], lambda b: b.rand("w", (2, 2, 2, 4, 3))),
     ("(MatMul)", "rank 2..4")),
    ("softmax-opset11", lambda: _m("Softmax", [1, 3, 4], opset=11, axis=1), ("(Softmax)", "opset >= 13")),
    ("div-by-zero", lambda: _m("Div", [1, 4], lambda b: b.init("z", np.zeros(4))), ("(Div)", "zeros")),
    ("layernorm-axes", lambda: _m("LayerNormalization", [1, 3, 4], lambda b: b.init("g", np.ones((3, 4))), axis=1),
     ("(LayerNormalization)", "last axis")),
    ("concat-batch", lambda: _m("Concat", [1, 4], "x", axis=0), ("(Concat)", "batch dimension")),
    ("avgpool-ceil", lambda: _m("AveragePool", [1, 1, 5, 5], kernel_shape=[2, 2], ceil_mode=1), ("ceil_mode",)),
    ("reduce-batch", lambda: _m("ReduceSum", [1, 3, 4], keepdims=0), ("(ReduceSum)", "batch dimension")),
    ("rank7", lambda: _m("Mul", [1, 2, 2, 2, 2, 2, 2, 2], "x"), ("MAX_RANK",)),
    ("cast-to-int", lambda: _m("Cast", [1, 4], to=TensorProto.INT64), ("(Cast)", "non-float")),
]


@pytest.mark.parametrize("name", [r[0] for r in REFUSALS])
def test_more_refusals(tmp_path: Path, name: str) -> None:
    _, build, needles = next(r for r in REFUSALS if r[0] == name)
    _refused(tmp_path, build(), *needles)
