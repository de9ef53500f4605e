"""Train a small model on scikit-learn's digits and export it as ONNX for slotplan.

    python examples/digits/train.py OUT [--model cnn|mlp] [--epochs N] [--train-limit N]

Data: ``sklearn.datasets.load_digits`` (1797 8x8 images, shipped with scikit-learn, nothing
is downloaded), pixels scaled to [0, 1] (divided by 16), split by
``train_test_split(test_size=450, random_state=0, stratify=y)``: 1347 training images and 450
held-out test images. Training is plain numpy (hand-written backprop, Adam, seed 0, full
float64), so the same command writes the same files.

Models (input ``x``, output ``logits``, 10 classes):

- ``cnn``: Conv 1->4 3x3 pad 1, Relu, Conv 4->8 3x3 stride 2 pad 1, Relu, Flatten, Gemm 128->10.
  Input ``x`` of shape [1, 1, 8, 8].
- ``mlp``: Gemm 64->32, Relu, Gemm 32->10. Input ``x`` of shape [1, 64].

Written into OUT:

- ``model.onnx``: the model (onnx.helper, opset 17).
- ``calib.npz``: ``x``, calibration inputs (the first ``--calib`` training images), stacked
  along the batch axis, for ``slotplan import --calibrate``.
- ``test_x.npz``: ``x``, the 450 test images with a leading sample axis and the graph's input
  shape ((450, 1, 8, 8) for the CNN, (450, 64) for the MLP).
- ``test_y.npy``: their labels (int64).
- ``float.json``: the float model's top-1 on the test images, the split and the model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

TEST_SIZE = 450
SEED = 0


def load_split(train_limit: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits scaled to [0, 1]: (train_x, train_y, test_x, test_y), images (N, 8, 8)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = d.images.astype(np.float64) / 16.0
    y = d.target.astype(np.int64)
    tx, vx, ty, vy = train_test_split(x, y, test_size=TEST_SIZE, random_state=0, stratify=y)
    if train_limit is not None:
        tx, ty = tx[:train_limit], ty[:train_limit]
    return tx, ty, vx, vy


# -- layers (forward returns a cache for backward) ------------------------------------------------
def conv_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int) -> tuple[np.ndarray, Any]:
    """3x3 convolution with zero padding 1 (cross-correlation, as ONNX Conv): x (N, C, H, W)."""
    n, c, h, wd = x.shape
    k = w.shape[2]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ho, wo = (h + 2 - k) // stride + 1, (wd + 2 - k) // stride + 1
    patches = np.empty((n, c, k, k, ho, wo))
    for i in range(k):
        for j in range(k):
            patches[:, :, i, j] = xp[:, :, i:i + stride * ho:stride, j:j + stride * wo:stride]
    out = np.einsum("ncijuv,ocij->nouv", patches, w, optimize=True) + b[None, :, None, None]
    return out, (x.shape, xp.shape, patches, stride)


def conv_backward(dout: np.ndarray, w: np.ndarray, cache: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xshape, xpshape, patches, stride = cache
    k = w.shape[2]
    dw = np.einsum("nouv,ncijuv->ocij", dout, patches, optimize=True)
    db = dout.sum(axis=(0, 2, 3))
    dpatches = np.einsum("nouv,ocij->ncijuv", dout, w, optimize=True)
    dxp = np.zeros(xpshape)
    ho, wo = dout.shape[2], dout.shape[3]
    for i in range(k):
        for j in range(k):
            dxp[:, :, i:i + stride * ho:stride, j:j + stride * wo:stride] += dpatches[:, :, i, j]
    return dxp[:, :, 1:-1, 1:-1], dw, db


def init_params(kind: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    def he(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape)

    if kind == "cnn":
        return {"c1w": he((4, 1, 3, 3), 9), "c1b": np.zeros(4), "c2w": he((8, 4, 3, 3), 36),
                "c2b": np.zeros(8), "fw": he((10, 128), 128), "fb": np.zeros(10)}
    return {"f1w": he((32, 64), 64), "f1b": np.zeros(32), "f2w": he((10, 32), 32), "f2b": np.zeros(10)}


def forward(kind: str, p: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, list[Any]]:
    """Logits for images x (N, 8, 8) and what backward needs."""
    if kind == "cnn":
        h1, c1 = conv_forward(x[:, None], p["c1w"], p["c1b"], 1)
        a1 = np.maximum(h1, 0.0)
        h2, c2 = conv_forward(a1, p["c2w"], p["c2b"], 2)
        a2 = np.maximum(h2, 0.0)
        f = a2.reshape(len(x), -1)
        return f @ p["fw"].T + p["fb"], [c1, h1, c2, h2, f]
    xf = x.reshape(len(x), -1)
    h = xf @ p["f1w"].T + p["f1b"]
    a = np.maximum(h, 0.0)
    return a @ p["f2w"].T + p["f2b"], [xf, h, a]


def backward(kind: str, p: dict[str, np.ndarray], cache: list[Any], dz: np.ndarray) -> dict[str, np.ndarray]:
    if kind == "cnn":
        c1, h1, c2, h2, f = cache
        g = {"fw": dz.T @ f, "fb": dz.sum(0)}
        da2 = (dz @ p["fw"]).reshape(h2.shape) * (h2 > 0)
        da1, g["c2w"], g["c2b"] = conv_backward(da2, p["c2w"], c2)
        _, g["c1w"], g["c1b"] = conv_backward(da1 * (h1 > 0), p["c1w"], c1)
        return g
    xf, h, a = cache
    g = {"f2w": dz.T @ a, "f2b": dz.sum(0)}
    dh = (dz @ p["f2w"]) * (h > 0)
    g["f1w"], g["f1b"] = dh.T @ xf, dh.sum(0)
    return g


def train(kind: str, x: np.ndarray, y: np.ndarray, epochs: int, batch: int = 32, lr: float = 0.01,
          weight_decay: float = 1e-4) -> dict[str, np.ndarray]:
    """Softmax cross-entropy, Adam, a fixed shuffle per epoch (seed 0)."""
    rng = np.random.default_rng(SEED)
    p = init_params(kind, rng)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    b1, b2, t = 0.9, 0.999, 0
    for epoch in range(epochs):
        step = lr * (0.5 * (1 + np.cos(np.pi * epoch / epochs)))  # cosine decay
        order = rng.permutation(len(x))
        for s in range(0, len(x), batch):
            idx = order[s:s + batch]
            z, cache = forward(kind, p, x[idx])
            z = z - z.max(axis=1, keepdims=True)
            prob = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
            prob[np.arange(len(idx)), y[idx]] -= 1.0
            g = backward(kind, p, cache, prob / len(idx))
            t += 1
            for k in p:
                gk = g[k] + weight_decay * p[k]
                m[k] = b1 * m[k] + (1 - b1) * gk
                v2[k] = b2 * v2[k] + (1 - b2) * gk * gk
                p[k] -= step * (m[k] / (1 - b1**t)) / (np.sqrt(v2[k] / (1 - b2**t)) + 1e-8)
    return p


# -- ONNX export -------------------------------------------------------------------------------------
def export(kind: str, p: dict[str, np.ndarray]) -> onnx.ModelProto:
    def init(name: str, a: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(a, dtype=np.float32), name)

    if kind == "cnn":
        xin = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])
        nodes = [
            helper.make_node("Conv", ["x", "c1w", "c1b"], ["conv1"], name="conv1", pads=[1, 1, 1, 1],
                             kernel_shape=[3, 3]),
            helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
            helper.make_node("Conv", ["relu1", "c2w", "c2b"], ["conv2"], name="conv2", pads=[1, 1, 1, 1],
                             strides=[2, 2], kernel_shape=[3, 3]),
            helper.make_node("Relu", ["conv2"], ["relu2"], name="relu2"),
            helper.make_node("Flatten", ["relu2"], ["flat"], name="flatten"),
            helper.make_node("Gemm", ["flat", "fw", "fb"], ["logits"], name="fc", transB=1),
        ]
        inits = [init(k, p[k]) for k in ("c1w", "c1b", "c2w", "c2b", "fw", "fb")]
    else:
        xin = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
        nodes = [
            helper.make_node("Gemm", ["x", "f1w", "f1b"], ["fc1"], name="fc1", transB=1),
            helper.make_node("Relu", ["fc1"], ["relu1"], name="relu1"),
            helper.make_node("Gemm", ["relu1", "f2w", "f2b"], ["logits"], name="fc2", transB=1),
        ]
        inits = [init(k, p[k]) for k in ("f1w", "f1b", "f2w", "f2b")]
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])
    graph = helper.make_graph(nodes, f"digits_{kind}", [xin], [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="slotplan-examples-digits")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def float_logits(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The exported model's logits (onnx's reference evaluator, float32) on inputs x (N, ...)."""
    from onnx.reference import ReferenceEvaluator

    ev = ReferenceEvaluator(model)
    return np.stack([ev.run(None, {"x": xi[None].astype(np.float32)})[0][0] for xi in x])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="output directory")
    ap.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--train-limit", type=int, default=None, help="train on the first N training images")
    ap.add_argument("--calib", type=int, default=256, help="calibration images (from the training set)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    tx, ty, vx, vy = load_split(args.train_limit)
    p = train(args.model, tx, ty, args.epochs)
    model = export(args.model, p)
    shape = (1, 8, 8) if args.model == "cnn" else (64,)
    test_x = vx.reshape((len(vx), *shape))
    calib = tx[:args.calib].reshape((-1, *shape))
    logits = float_logits(model, test_x)
    acc = float(np.mean(np.argmax(logits, axis=1) == vy))
    args.out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, args.out / "model.onnx")
    np.savez(args.out / "calib.npz", x=calib)
    np.savez(args.out / "test_x.npz", x=test_x)
    np.save(args.out / "test_y.npy", vy)
    info = {"model": args.model, "epochs": args.epochs, "train": len(tx), "test": len(vx),
            "calibration": len(calib), "float_top1": acc,
            "split": "train_test_split(test_size=450, random_state=0, stratify=y)"}
    (args.out / "float.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"{args.model}: trained on {len(tx)} images, {args.epochs} epochs, float top-1 on the "
          f"{len(vx)} test images {acc:.4f} ({time.perf_counter() - t0:.1f} s); wrote {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
