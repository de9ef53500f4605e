"""ONNX models for the importer's tests, built with onnx.helper (nothing downloaded):
an MLP, LeNet-5, ResNet-20 (CIFAR-10 shapes, BatchNorm unfolded), one BERT-base encoder
block, and small models for single ops and for the refusals."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class Builder:
    """A tiny graph builder: named initializers, nodes with generated output names."""

    def __init__(self, seed: int = 0, dtype: Any = np.float32) -> None:
        self.rng = np.random.default_rng(seed)
        self.dtype = dtype
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.count = 0

    @property
    def elem(self) -> int:
        return TensorProto.DOUBLE if self.dtype == np.float64 else TensorProto.FLOAT

    def init(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=self.dtype), name))
        return name

    def ints(self, name: str, value: Sequence[int]) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.int64), name))
        return name

    def rand(self, name: str, shape: Sequence[int], scale: float | None = None) -> str:
        fan = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
        s = scale if scale is not None else 1.0 / math.sqrt(fan)
        return self.init(name, self.rng.uniform(-s, s, size=shape))

    def op(self, op_type: str, inputs: Sequence[str], out: str | None = None, n_out: int = 1, **attrs: Any) -> str:
        self.count += 1
        outs = [out or f"/{op_type.lower()}_{self.count}/output_0"] if n_out == 1 else [
            f"{out or op_type.lower()}_{self.count}_{k}" for k in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=f"/{op_type}_{self.count}", **attrs))
        return outs[0]

    def model(self, inputs: dict[str, Sequence[int | str]], outputs: dict[str, Sequence[int | str] | None],
              name: str = "model", opset: int = OPSET) -> onnx.ModelProto:
        ins = [helper.make_tensor_value_info(k, self.elem, list(v)) for k, v in inputs.items()]
        outs = [helper.make_tensor_value_info(k, self.elem, list(v) if v is not None else None)
                for k, v in outputs.items()]
        g = helper.make_graph(self.nodes, name, ins, outs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8 if opset <= 17 else 9
        if any(v is None for v in outputs.values()):  # output shapes by onnx's shape inference
            inferred = onnx.shape_inference.infer_shapes(m)
            for o in m.graph.output:
                if not o.type.tensor_type.HasField("shape"):
                    known = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output)}
                    o.type.tensor_type.shape.CopyFrom(known[o.name].type.tensor_type.shape)
        onnx.checker.check_model(m)
        return m


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def linear(b: Builder, x: str, n_in: int, n_out: int, name: str) -> str:
    w = b.rand(f"{name}.weight", (n_out, n_in))
    bias = b.rand(f"{name}.bias", (n_out,))
    return b.op("Gemm", [x, w, bias], transB=1)


def mlp(activation: str = "square", sizes: Sequence[int] = (64, 32, 16, 10), seed: int = 0,
        dtype: Any = np.float32) -> onnx.ModelProto:
    """Gemm layers with the activation between them: 'square' (Mul(x, x)), 'relu', ..."""
    b = Builder(seed, dtype)
    x = "input"
    for i in range(len(sizes) - 1):
        x = linear(b, x, sizes[i], sizes[i + 1], f"fc{i + 1}")
        if i < len(sizes) - 2:
            x = b.op("Mul", [x, x]) if activation == "square" else b.op(activation, [x])
    b.nodes[-1].output[0] = "logits"
    return b.model({"input": ["N", sizes[0]]}, {"logits": ["N", sizes[-1]]}, name="mlp")


def lenet5(activation: str = "square", seed: int = 0, dtype: Any = np.float32) -> onnx.ModelProto:
    """LeNet-5 on 1x28x28 (padding 2): conv 6@5x5, avgpool 2, conv 16@5x5, avgpool 2,
    flatten, 120, 84, 10."""
    b = Builder(seed, dtype)

    def act(v: str) -> str:
        return b.op("Mul", [v, v]) if activation == "square" else b.op(activation, [v])

    x = b.op("Conv", ["image", b.rand("conv1.weight", (6, 1, 5, 5)), b.rand("conv1.bias", (6,))],
             kernel_shape=[5, 5], pads=[2, 2, 2, 2])
    x = b.op("AveragePool", [act(x)], kernel_shape=[2, 2], strides=[2, 2])
    x = b.op("Conv", [x, b.rand("conv2.weight", (16, 6, 5, 5)), b.rand("conv2.bias", (16,))], kernel_shape=[5, 5])
    x = b.op("AveragePool", [act(x)], kernel_shape=[2, 2], strides=[2, 2])
    x = b.op("Flatten", [x], axis=1)
    x = act(linear(b, x, 400, 120, "fc1"))
    x = act(linear(b, x, 120, 84, "fc2"))
    linear(b, x, 84, 10, "fc3")
    b.nodes[-1].output[0] = "logits"
    return b.model({"image": [1, 1, 28, 28]}, {"logits": [1, 10]}, name="lenet5")


def _conv_bn(b: Builder, x: str, c_in: int, c_out: int, stride: int, name: str) -> str:
    y = b.op("Conv", [x, b.rand(f"{name}.conv.weight", (c_out, c_in, 3, 3))], kernel_shape=[3, 3],
             pads=[1, 1, 1, 1], strides=[stride, stride])
    gamma = b.init(f"{name}.bn.weight", b.rng.uniform(0.5, 1.5, c_out))
    beta = b.init(f"{name}.bn.bias", b.rng.uniform(-0.1, 0.1, c_out))
    mean = b.init(f"{name}.bn.running_mean", b.rng.uniform(-0.1, 0.1, c_out))
    var = b.init(f"{name}.bn.running_var", b.rng.uniform(0.5, 1.5, c_out))
    return b.op("BatchNormalization", [y, gamma, beta, mean, var], epsilon=1e-5)


def resnet20(activation: str = "Relu", seed: int = 0, width: int = 16) -> onnx.ModelProto:
    """ResNet-20 for CIFAR-10 (3x32x32): conv-BN-act, 3 stages of 3 basic blocks (16, 32, 64
    channels; the first block of stages 2 and 3 strides 2 with a 1x1 conv-BN shortcut),
    global average pool, Gemm 64 -> 10. BatchNorm is left unfolded in the file."""
    b = Builder(seed)

    def act(v: str) -> str:
        return b.op("Mul", [v, v]) if activation == "square" else b.op(activation, [v])

    x = act(_conv_bn(b, "image", 3, width, 1, "stem"))
    c = width
    for stage, c_out in enumerate((width, 2 * width, 4 * width)):
        for block in range(3):
            stride = 2 if stage > 0 and block == 0 else 1
            name = f"layer{stage + 1}.{block}"
            y = act(_conv_bn(b, x, c, c_out, stride, name + ".a"))
            y = _conv_bn(b, y, c_out, c_out, 1, name + ".b")
            if stride != 1 or c != c_out:
                sc = b.op("Conv", [x, b.rand(f"{name}.down.weight", (c_out, c, 1, 1))], kernel_shape=[1, 1],
                          strides=[stride, stride])
                gamma = b.init(f"{name}.down.bn.weight", b.rng.uniform(0.5, 1.5, c_out))
                beta = b.init(f"{name}.down.bn.bias", np.zeros(c_out))
                mean = b.init(f"{name}.down.bn.running_mean", np.zeros(c_out))
                var = b.init(f"{name}.down.bn.running_var", np.ones(c_out))
                x = b.op("BatchNormalization", [sc, gamma, beta, mean, var])
            x = act(b.op("Add", [y, x]))
            c = c_out
    x = b.op("GlobalAveragePool", [x])
    x = b.op("Flatten", [x])
    linear(b, x, c, 10, "fc")
    b.nodes[-1].output[0] = "logits"
    return b.model({"image": [1, 3, 32, 32]}, {"logits": [1, 10]}, name="resnet20")


def bert_block(seq: int = 128, hidden: int = 768, heads: int = 12, ffn: int = 3072, seed: int = 0,
               erf_gelu: bool = True) -> onnx.ModelProto:
    """One BERT-base encoder block as torch exports it (opset 17): Q/K/V MatMul+Add,
    Reshape/Transpose per head, scaled QK^T, Softmax, context, output projection, residual,
    LayerNormalization, FFN with GELU (the Erf pattern), residual, LayerNormalization."""
    b = Builder(seed)
    dh = hidden // heads
    x = "hidden_states"

    def dense(v: str, n_in: int, n_out: int, name: str) -> str:
        w = b.rand(f"{name}.weight", (n_in, n_out))
        y = b.op("MatMul", [v, w])
        return b.op("Add", [y, b.rand(f"{name}.bias", (n_out,))])

    heads_shape = b.ints("heads_shape", [1, seq, heads, dh])
    merged_shape = b.ints("merged_shape", [1, seq, hidden])
    q = b.op("Transpose", [b.op("Reshape", [dense(x, hidden, hidden, "query"), heads_shape])], perm=[0, 2, 1, 3])
    k = b.op("Transpose", [b.op("Reshape", [dense(x, hidden, hidden, "key"), heads_shape])], perm=[0, 2, 3, 1])
    v = b.op("Transpose", [b.op("Reshape", [dense(x, hidden, hidden, "value"), heads_shape])], perm=[0, 2, 1, 3])
    scores = b.op("Div", [b.op("MatMul", [q, k]), b.init("sqrt_dh", np.array(math.sqrt(dh)))])
    probs = b.op("Softmax", [scores], axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    ctx = b.op("Reshape", [ctx, merged_shape])
    attn = b.op("Add", [dense(ctx, hidden, hidden, "attention.output"), x])
    attn = b.op("LayerNormalization", [attn, b.init("ln1.weight", b.rng.uniform(0.8, 1.2, hidden)),
                                       b.init("ln1.bias", b.rng.uniform(-0.1, 0.1, hidden))], epsilon=1e-12)
    h = dense(attn, hidden, ffn, "intermediate")
    if erf_gelu:
        e = b.op("Erf", [b.op("Div", [h, b.init("sqrt2", np.array(math.sqrt(2.0)))])])
        g = b.op("Mul", [b.op("Mul", [h, b.op("Add", [e, b.init("one", np.array(1.0))])]),
                         b.init("half", np.array(0.5))])
    else:
        g = b.op("Gelu", [h]) if False else b.op("Relu", [h])
    out = b.op("Add", [dense(g, ffn, hidden, "output"), attn])
    b.op("LayerNormalization", [out, b.init("ln2.weight", b.rng.uniform(0.8, 1.2, hidden)),
                                b.init("ln2.bias", b.rng.uniform(-0.1, 0.1, hidden))], out="block_output",
         epsilon=1e-12)
    return b.model({x: [1, seq, hidden]}, {"block_output": [1, seq, hidden]}, name="bert_block")
