"""ONNX model -> ``slotplan.graph/1`` graph + its weights (``slotplan import``, docs/import.md).

Shapes. Every value of the model has its ONNX shape (batch dimension included); the graph
tensor that holds it has the *graph shape*: the ONNX shape without its leading dimension
when that dimension is 1 and the rank is at least 2 (``[1, 784] -> (784,)``,
``[1, 16, 32, 32] -> (16, 32, 32)``, ``[1, 12, 128, 64] -> (12, 128, 64)``), else the ONNX
shape itself. Graph inputs are the model's inputs with a batch of one.

Names. Graph tensors and nodes are named after the model's values (a node's first output,
an initializer), sanitised to ``[A-Za-z0-9_.-]`` (other characters become ``_``; leading
``_`` and ``.`` are dropped; at most 200 characters; ``.2``, ``.3``... when two values would
get the same name). Nodes the importer adds around one ONNX node are named after its output
with a suffix (``.exp``, ``.sum``, ``.recip``...).

Constants (initializers, ``Constant``, anything computed from them and from ``Shape``) are
folded at import with onnx's reference evaluator; those an encrypted value meets become
``weight`` tensors, their values written to the weights file under the same names.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from common.errors import GraphError, ModelError
from planner.frontend.graph import MAX_RANK, SCHEMA, Graph, parse_graph
from planner.frontend.importers import approx, composite
from planner.frontend.importers.onnx_model import (
    FUSED_DOMAIN,
    OnnxGraph,
    attr,
    calibration_samples,
    load_model,
    node_label,
    run_float,
)
from planner.frontend.importers.values import ApproxRow, Dyn, graph_shape

__all__ = ["ApproxRow", "ImportOptions", "ImportResult", "import_model", "sanitise"]

Array = npt.NDArray[np.float64]

MAX_NAME = 200
DEFAULT_MARGIN = 0.1
DEFAULT_NEWTON = 1
# Uncalibrated: the range assumed for a softmax row sum is [1, n] (the row's largest logit
# near the top of the default domain) and for a LayerNorm variance [VAR_LO, VAR_HI].
VAR_LO, VAR_HI = 1e-2, 16.0

SUPPORTED = (
    "Gemm, MatMul, Conv, BatchNormalization, Relu, LeakyRelu, Abs, Sigmoid, Tanh, Gelu, Erf (GELU pattern), SiLU "
    "(x*Sigmoid(x)), Exp, Sqrt, Reciprocal, Softmax, LayerNormalization, Add, Sub, Mul, Div, Neg, Pow (2, 3), "
    "AveragePool, GlobalAveragePool, MaxPool, GlobalMaxPool, ReduceMean, ReduceSum, Flatten, Reshape, Transpose, Squeeze, Unsqueeze, "
    "Identity, Dropout, Cast, Slice, Concat, Split, and constant subgraphs (Shape, Gather, Constant, ...)"
)
HINTS = {
    "ReduceMax": "use ReduceMean or a polynomial activation",
    "ArgMax": "take the arg max of the decrypted output on the client",
    "Resize": "use a transposed convolution or reshape",
    "Upsample": "use a transposed convolution or reshape",
    "ConvTranspose": "use Conv",
    "Pad": "use the pads attribute of Conv / AveragePool",
    "Gather": "use Slice (a constant index on an encrypted value)",
    "Expand": "let Add/Mul broadcast instead",
    "Where": "use a polynomial (a select is not one)",
    "Max": "use a polynomial activation (a max is not a polynomial)",
    "Min": "use a polynomial activation (a min is not a polynomial)",
}


def sanitise(name: str) -> str:
    """A model value's name as a graph name (see the module docstring)."""
    text = re.sub(r"[^A-Za-z0-9_.\-]", "_", name).lstrip("_.")
    return (text or "t")[:MAX_NAME]


@dataclass(frozen=True)
class ImportOptions:
    degree: int | None = None  # fixed degree of every fit; None: DEFAULT_DEGREE or per max_error
    max_error: float | None = None  # choose each degree for this error on the samples
    margin: float = DEFAULT_MARGIN  # measured ranges widened by this fraction of their width each side
    newton: int = DEFAULT_NEWTON  # Newton steps after the reciprocal / inverse square root polynomial
    domain: tuple[float, float] = approx.DEFAULT_DOMAIN  # uncalibrated activation domain
    name: str | None = None
    outputs: tuple[str, ...] = ()  # cut the model at these values (--output); () strips classifier heads
    allow_error: bool = False  # a missed error target is a warning instead of a refusal (--allow-error)
    relu: str = "auto"  # Relu/LeakyRelu: auto | direct | composite (planner.frontend.importers.composite)


@dataclass
class ImportResult:
    graph_json: dict[str, Any]
    graph: Graph
    weights: dict[str, Array]
    approximations: list[ApproxRow]
    calibrated: int  # number of calibration samples (0: uncalibrated defaults)
    notes: list[str]
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    end_to_end_error: float | None = None  # max |graph reference - onnx| on the samples
    input_map: dict[str, str] = field(default_factory=dict)  # onnx input -> graph input
    output_map: dict[str, str] = field(default_factory=dict)  # onnx output -> graph output
    warnings: list[str] = field(default_factory=list)  # printed on stderr (the file is still written)
    calibrator: str | None = None  # what ran the model in float on the samples


Value = Dyn | np.ndarray


class _Unsupported(Exception):
    pass


class Importer:
    """One import: walks the (rewritten) ONNX nodes in order and emits graph nodes."""

    def __init__(self, og: OnnxGraph, opts: ImportOptions, samples: Mapping[str, Array] | None) -> None:
        self.og = og
        self.opts = opts
        self.samples = samples  # onnx value -> stacked float values (one per sample)
        self.values: dict[str, Value] = {k: np.asarray(v) for k, v in og.constants.items()}
        self.tensors: dict[str, dict[str, Any]] = {}
        self.nodes: list[dict[str, Any]] = []
        self.weights: dict[str, Array] = {}
        self._weight_keys: dict[tuple[str, bytes, tuple[int, ...]], str] = {}
        self.used: set[str] = set()
        self.rows: list[ApproxRow] = []
        self.ranges: dict[str, tuple[float, float]] = {}
        self.node: Any = None  # the ONNX node being converted (for messages)
        self.input_map: dict[str, str] = {}

    # -- errors ---------------------------------------------------------------------------
    def fail(self, rule: str, hint: str | None = None) -> ModelError:
        n = self.node
        return ModelError(rule, node=node_label(n) if n is not None else None,
                          op=n.op_type if n is not None else None, hint=hint)

    # -- names, tensors, nodes --------------------------------------------------------------
    def fresh(self, base: str) -> str:
        name = sanitise(base)
        if name in self.used:
            k = 2
            while f"{name}.{k}" in self.used:
                k += 1
            name = f"{name}.{k}"
        self.used.add(name)
        return name

    def weight(self, base: str, value: npt.ArrayLike) -> str:
        arr = np.ascontiguousarray(np.asarray(value, dtype=np.float64))
        if arr.ndim == 0:
            arr = arr.reshape(1)
        if not np.all(np.isfinite(arr)):
            raise self.fail(f"constant {base!r} holds NaN or infinite values")
        if arr.ndim > MAX_RANK:
            raise self.fail(f"constant {base!r} has rank {arr.ndim}, over the limit {MAX_RANK}")
        key = (sanitise(base), arr.tobytes(), arr.shape)
        if key in self._weight_keys:
            return self._weight_keys[key]
        name = self.fresh(base)
        self._weight_keys[key] = name
        self.tensors[name] = {"shape": list(arr.shape), "role": "weight"}
        self.weights[name] = arr
        return name

    def emit(self, op: str, inputs: Sequence[str], base: str, oshape: Sequence[int],
             g: Sequence[int] | None = None, **attrs: Any) -> Dyn:
        """A graph node computing the ONNX-shaped ``oshape`` (its graph tensor has shape ``g``
        when given, else ``graph_shape(oshape)``)."""
        name = self.fresh(base)
        self.nodes.append({"id": name, "op": op, "inputs": list(inputs), **attrs})
        shp = tuple(int(d) for d in oshape)
        gs = None if g is None or tuple(g) == graph_shape(shp) else tuple(int(d) for d in g)
        return Dyn(name, shp, gs)

    def out_name(self, i: int = 0) -> str:
        return str(self.node.output[i])

    # -- values ----------------------------------------------------------------------------
    def get(self, name: str) -> Value:
        try:
            return self.values[name]
        except KeyError:
            raise self.fail(f"input {name!r} has no value (missing initializer?)") from None

    def dyn_inputs(self) -> list[Value]:
        return [self.get(i) if i else np.zeros(0) for i in self.node.input]

    def as_shape(self, d: Dyn, shape: Sequence[int], base: str) -> Dyn:
        """``d`` viewed as ONNX shape ``shape`` (a reshape node when the graph shapes differ)."""
        shape = tuple(int(s) for s in shape)
        if math.prod(shape) != math.prod(d.shape):
            raise self.fail(f"cannot view {d.shape} as {shape}")
        if graph_shape(shape) == d.gshape:
            return Dyn(d.name, shape)
        return self.emit("reshape", [d.name], base, shape, shape=list(graph_shape(shape)))

    def full(self, d: Dyn, base: str) -> Dyn:
        """``d`` with a graph tensor of its full ONNX shape (the batch axis kept)."""
        if d.gshape == d.shape:
            return d
        if len(d.shape) > MAX_RANK:
            raise self.fail(f"rank {len(d.shape)} is over the limit {MAX_RANK}")
        return self.emit("reshape", [d.name], base + ".full", d.shape, g=d.shape, shape=list(d.shape))

    def canonical(self, d: Dyn, base: str) -> Dyn:
        """``d`` held in a graph tensor of its graph shape."""
        if d.g is None:
            return d
        return self.emit("reshape", [d.name], base, d.shape, shape=list(graph_shape(d.shape)))

    def const_operand(self, c: Array, shape: tuple[int, ...], base: str) -> str:
        """A constant broadcast onto a value of ONNX shape ``shape``, as a compact weight
        whose numpy broadcasting against the value's graph shape is the ONNX one."""
        c = np.asarray(c, dtype=np.float64)
        if c.size and np.all(c == c.reshape(-1)[0]):
            return self.weight(base, c.reshape(-1)[:1])
        gs = graph_shape(shape)
        c = c.reshape((1,) * (len(shape) - c.ndim) + c.shape) if c.ndim < len(shape) else c
        if len(gs) < len(shape):
            c = c.reshape(c.shape[len(shape) - len(gs):])
        while c.ndim > 1 and c.shape[0] == 1:
            c = c.reshape(c.shape[1:])
        return self.weight(base, c)

    # -- ranges (calibration) -----------------------------------------------------------------
    def measured(self, onnx_name: str) -> Array | None:
        if self.samples is None:
            return None
        v = self.samples.get(onnx_name)
        return None if v is None else np.asarray(v, dtype=np.float64)

    def widen(self, lo: float, hi: float) -> tuple[float, float]:
        width = max(hi - lo, 1e-6 * max(1.0, abs(lo), abs(hi)), 1e-6)
        pad = self.opts.margin * width
        return (lo - pad, hi + pad)

    def approximate(
        self, x: Dyn, function: str, g: Callable[[Array], Array], xs: Array | None,
        default: tuple[float, float], base: str, positive: bool = False,
    ) -> tuple[Dyn, approx.Fit]:
        """A Chebyshev ``poly`` node of ``g`` on ``x``: on the measured range of ``xs``
        widened by the margin (clipped above 0 when ``positive``), else on ``default``."""
        measured = None
        if xs is not None and xs.size:
            measured = (float(np.min(xs)), float(np.max(xs)))
            domain = self.widen(*measured)
            if positive:
                domain = (max(domain[0], 0.5 * measured[0]), domain[1])
        else:
            domain = default
        try:
            f = approx.fit(g, domain, degree=self.opts.degree if self.opts.degree is not None
                           else (None if self.opts.max_error is not None else approx.DEFAULT_DEGREE),
                           samples=xs, max_error=self.opts.max_error)
        except ValueError as exc:
            raise self.fail(f"cannot fit {function}: {exc}") from None
        if max(abs(c) for c in f.coeffs) > 2.0**20:
            raise self.fail(f"the {function} polynomial on [{domain[0]:.4g}, {domain[1]:.4g}] has a "
                            "coefficient over 2**20", hint="calibrate, or lower --degree")
        node = self.emit("poly", [x.name], base, x.shape, coeffs=list(f.coeffs), basis="chebyshev",
                         domain=[float(domain[0]), float(domain[1])])
        check = np.ravel(xs) if xs is not None and xs.size else np.linspace(domain[0], domain[1], 2001)
        with np.errstate(all="ignore"):
            scale = float(np.max(np.abs(np.asarray(g(check), dtype=np.float64))))
        self.rows.append(ApproxRow(node.name, node_label(self.node), function, measured, f.domain,
                                   f.degree, f.depth, f.max_error, f.on_samples, scale=scale))
        return node, f

    # -- the walk -----------------------------------------------------------------------------
    def run(self) -> None:
        og = self.og
        for name, shape in og.inputs.items():
            gname = self.fresh(name)
            self.input_map[name] = gname
            self.tensors[gname] = {"shape": list(graph_shape(shape)), "role": "input"}
            self.values[name] = Dyn(gname, shape)
        for node in og.nodes:
            self.node = node
            self.convert(node)
        self.node = None

    def convert(self, node: Any) -> None:
        ins = [i for i in node.input if i]
        dynamic = [i for i in ins if isinstance(self.values.get(i), Dyn)]
        if node.op_type in ("Shape", "Size") and dynamic:
            d = self.values[ins[0]]
            assert isinstance(d, Dyn)
            self.fold(node, {ins[0]: np.zeros(d.shape, dtype=np.float32)})
            return
        if not dynamic and node.domain != FUSED_DOMAIN:
            self.fold(node, {})
            return
        handler = _HANDLERS.get(node.op_type)
        if handler is None:
            hint = HINTS.get(node.op_type)
            raise self.fail(
                f"unsupported op {node.op_type}" + ("" if hint else f" (supported: {SUPPORTED})"), hint=hint
            )
        outs = handler(self)
        for name, v in zip(node.output, outs, strict=False):
            if name:
                self.values[name] = self.canonical(v, name + ".view") if isinstance(v, Dyn) else v

    def fold(self, node: Any, overrides: Mapping[str, Array]) -> None:
        """Evaluate a node on constants with onnx's reference evaluator."""
        from onnx import helper
        from onnx.reference import ReferenceEvaluator

        feeds: dict[str, Array] = {}
        vis = []
        for i in node.input:
            if not i:
                continue
            v = overrides.get(i)
            if v is None:
                got = self.get(i)
                assert not isinstance(got, Dyn)
                v = got
            feeds[i] = v
            vis.append(helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)))
        outs = [helper.make_tensor_value_info(o, 0, None) for o in node.output if o]
        graph = helper.make_graph([node], "fold", vis, outs)
        model = helper.make_model(graph, opset_imports=list(self.og.model.opset_import))
        try:
            res = ReferenceEvaluator(model).run(None, feeds)
        except Exception as exc:
            raise self.fail(f"cannot fold this constant node ({' '.join(str(exc).split())[:200]})") from None
        for name, v in zip([o for o in node.output if o], res, strict=True):
            self.values[name] = np.asarray(v)


# --------------------------------------------------------------------------------------
# Converters: one function per ONNX op (self is the Importer); each returns the outputs
# --------------------------------------------------------------------------------------

Handler = Callable[[Importer], list[Value]]
_HANDLERS: dict[str, Handler] = {}


def handles(*ops: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        for op in ops:
            _HANDLERS[op] = fn
        return fn

    return deco


def _dyn(im: Importer, v: Value, what: str = "input") -> Dyn:
    if not isinstance(v, Dyn):
        raise im.fail(f"{what} must be computed from the model's input here, got a constant")
    return v


def _const(im: Importer, v: Value, what: str) -> Array:
    if isinstance(v, Dyn):
        raise im.fail(f"{what} must be a constant (an initializer or computed from constants), "
                      "got a value computed from the model's input")
    return np.asarray(v)


def _ints(im: Importer, v: Value, what: str) -> list[int]:
    return [int(x) for x in _const(im, v, what).reshape(-1)]


def _axis(im: Importer, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise im.fail(f"axis {axis} out of range for rank {rank}")
    return axis % rank


def _gaxis(im: Importer, d: Dyn, axis: int) -> int:
    """The graph axis of ONNX axis ``axis`` of ``d`` (refused on the dropped batch axis)."""
    axis = _axis(im, axis, len(d.shape))
    drop = len(d.shape) - len(d.gshape)
    if axis < drop:
        raise im.fail(f"axis {axis} is the batch dimension (one sample of size 1)",
                      hint="operate on the feature axes (the graph holds one sample)")
    return axis - drop


# -- linear layers --------------------------------------------------------------------------


@handles("Gemm")
def _gemm(im: Importer) -> list[Value]:
    a, b, *rest = im.dyn_inputs()
    alpha, beta = float(attr(im.node, "alpha", 1.0)), float(attr(im.node, "beta", 1.0))
    ta, tb = int(attr(im.node, "transA", 0)), int(attr(im.node, "transB", 0))
    base = im.out_name()
    if isinstance(a, Dyn) and ta:
        a = _transpose(im, a, [1, 0], base + ".A_T")
    if isinstance(b, Dyn) and tb:
        b = _transpose(im, b, [1, 0], base + ".B_T")
    bn = im.node.input[1]
    if not isinstance(a, Dyn):
        a = np.asarray(a).T if ta else np.asarray(a)
    if not isinstance(b, Dyn):
        b = np.asarray(b).T if tb else np.asarray(b)
    has_c = bool(rest) and (isinstance(rest[0], Dyn) or np.asarray(rest[0]).size > 0)
    y = _matmul2(im, a, b, base + (".mm" if has_c else ""), bn, alpha)
    if rest and not isinstance(rest[0], Dyn) and np.asarray(rest[0]).size:
        c = beta * np.asarray(rest[0], dtype=np.float64)
        y = _binary(im, "add", y, c, base, im.node.input[2])
    elif rest and isinstance(rest[0], Dyn):
        c_dyn = rest[0] if beta == 1.0 else _scale(im, rest[0], beta, base + ".C")
        y = _binary(im, "add", y, c_dyn, base, "")
    return [y]


def _matmul2(im: Importer, a: Value, b: Value, base: str, wname: str, alpha: float = 1.0) -> Dyn:
    """A (m,k) @ B (k,n) with ONNX shapes (batch of one: m == 1 is a matvec)."""
    if isinstance(a, Dyn) and not isinstance(b, Dyn):
        b = np.asarray(b, dtype=np.float64) * alpha
        if b.ndim != 2 or a.shape[-1] != b.shape[0]:
            raise im.fail(f"shapes {a.shape} and {b.shape} do not multiply")
        return _times_weight(im, a, b, base, wname)
    if not isinstance(a, Dyn) and isinstance(b, Dyn):
        aw = np.asarray(a, dtype=np.float64) * alpha
        w = im.weight(wname or base + ".A", aw)
        bb = im.full(b, base) if len(b.gshape) < 2 else b
        return _emit_matmul(im, w, aw.shape, bb.name, bb.gshape, (*aw.shape[:-1], b.shape[-1]), base)
    assert isinstance(a, Dyn) and isinstance(b, Dyn)
    y = _matmul_dyn(im, a, b, base)
    return y if alpha == 1.0 else _scale(im, y, alpha, base + ".alpha")


def _times_weight(im: Importer, a: Dyn, w: Array, base: str, wname: str) -> Dyn:
    """``a @ w`` for a constant 2-D ``w`` (k, n): a matvec when ``a`` is one row, else a
    matmul on ``a`` viewed as rows."""
    k, n = w.shape
    out_shape = (*a.shape[:-1], n)
    rows = math.prod(a.shape[:-1])
    if rows == 1:
        x = a if a.gshape == (k,) else im.as_shape(a, (1, k), base + ".row")
        name = im.weight(wname or base + ".W", w.T)
        y = im.emit("matvec", [name, x.name], base, (1, n))
        return im.as_shape(y, out_shape, base + ".view") if out_shape != (1, n) else y
    x = a if len(a.gshape) == 2 else im.as_shape(a, (rows, k), base + ".rows")
    name = im.weight(wname or base + ".W", w)
    y = im.emit("matmul", [x.name, name], base, (*x.shape[:-1], n))
    return y if y.shape == out_shape else im.as_shape(y, out_shape, base + ".view")


def _emit_matmul(im: Importer, a: str, ga: tuple[int, ...], b: str, gb: tuple[int, ...],
                 out: tuple[int, ...], base: str) -> Dyn:
    """A graph matmul of tensors ``a`` and ``b`` (graph shapes ``ga``, ``gb``, rank 2..4)
    computing the ONNX-shaped ``out``."""
    for t in (ga, gb):
        if not 2 <= len(t) <= 4:
            raise im.fail(f"matmul of a rank {len(t)} operand (graph matmul takes rank 2..4)")
    try:
        batch = np.broadcast_shapes(ga[:-2], gb[:-2])
    except ValueError:
        raise im.fail(f"matmul batch dimensions {ga[:-2]} and {gb[:-2]} do not broadcast") from None
    return im.emit("matmul", [a, b], base, out, g=(*batch, ga[-2], gb[-1]))


def _matmul_dyn(im: Importer, a: Dyn, b: Dyn, base: str) -> Dyn:
    try:
        out = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
    except ValueError:
        raise im.fail(f"shapes {list(a.shape)} and {list(b.shape)} do not multiply") from None
    if len(a.shape) < 2 or len(b.shape) < 2 or a.shape[-1] != b.shape[-2]:
        raise im.fail(f"shapes {list(a.shape)} and {list(b.shape)} do not multiply")
    aa = im.full(a, base + ".A") if len(a.gshape) < 2 else a
    bb = im.full(b, base + ".B") if len(b.gshape) < 2 else b
    return _emit_matmul(im, aa.name, aa.gshape, bb.name, bb.gshape, out, base)


@handles("MatMul")
def _matmul(im: Importer) -> list[Value]:
    a, b = im.dyn_inputs()[:2]
    base = im.out_name()
    if isinstance(a, Dyn) and not isinstance(b, Dyn) and np.asarray(b).ndim == 2:
        return [_times_weight(im, a, np.asarray(b, dtype=np.float64), base, im.node.input[1])]
    if isinstance(a, Dyn) and not isinstance(b, Dyn):
        bw = np.asarray(b, dtype=np.float64)
        name = im.weight(im.node.input[1], bw)
        aa = im.full(a, base + ".A") if len(a.gshape) < 2 else a
        out = (*np.broadcast_shapes(a.shape[:-2], bw.shape[:-2]), a.shape[-2], bw.shape[-1])
        return [_emit_matmul(im, aa.name, aa.gshape, name, bw.shape, out, base)]
    if not isinstance(a, Dyn) and isinstance(b, Dyn):
        aw = np.asarray(a, dtype=np.float64)
        name = im.weight(im.node.input[0], aw)
        bb = im.full(b, base + ".B") if len(b.gshape) < 2 else b
        out = (*np.broadcast_shapes(aw.shape[:-2], b.shape[:-2]), aw.shape[-2], b.shape[-1])
        return [_emit_matmul(im, name, aw.shape, bb.name, bb.gshape, out, base)]
    return [_matmul_dyn(im, _dyn(im, a), _dyn(im, b), base)]


def _conv_pads(im: Importer, x: Dyn, w: Array) -> tuple[int, int]:
    node = im.node
    dil = attr(node, "dilations", [1, 1])
    if any(int(d) != 1 for d in dil):
        raise im.fail(f"dilations {list(dil)} are not supported", hint="use dilations 1")
    strides = [int(s) for s in attr(node, "strides", [1, 1])]
    auto = attr(node, "auto_pad", "NOTSET")
    k = w.shape[2:]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for i in range(2):
            size = x.shape[2 + i]
            total = max((math.ceil(size / strides[i]) - 1) * strides[i] + k[i] - size, 0)
            if total % 2:
                raise im.fail(f"auto_pad {auto} needs asymmetric padding here ({total} on axis {i})",
                              hint="use explicit symmetric pads")
            pads.append(total // 2)
        return pads[0], pads[1]
    if auto == "VALID":
        return 0, 0
    p = [int(v) for v in attr(node, "pads", [0, 0, 0, 0])]
    if p[0] != p[2] or p[1] != p[3]:
        raise im.fail(f"asymmetric pads {p} are not supported", hint="use symmetric pads [p1, p2, p1, p2]")
    return p[0], p[1]


@handles("Conv")
def _conv(im: Importer) -> list[Value]:
    x, w, *rest = im.dyn_inputs()
    x = _dyn(im, x)
    w = _const(im, w, "the weight of Conv")
    if len(x.shape) != 4 or x.shape[0] != 1 or w.ndim != 4:
        raise im.fail(f"Conv on input of shape {list(x.shape)} (only 2-D convolutions of one image, "
                      "[1, C, H, W], are supported)", hint="reshape 1-D signals to [1, C, 1, L]")
    p1, p2 = _conv_pads(im, x, w)
    s = [int(v) for v in attr(im.node, "strides", [1, 1])]
    groups = int(attr(im.node, "group", 1))
    base = im.out_name()
    has_bias = bool(rest) and np.asarray(rest[0]).size > 0
    wn = im.weight(im.node.input[1], w)
    co = w.shape[0]
    ho = (x.shape[2] + 2 * p1 - w.shape[2]) // s[0] + 1
    wo = (x.shape[3] + 2 * p2 - w.shape[3]) // s[1] + 1
    y = im.emit("conv2d", [x.name, wn], base + (".conv" if has_bias else ""), (1, co, ho, wo),
                stride=s, padding=[p1, p2], groups=groups)
    if has_bias:
        b = _const(im, rest[0], "the bias of Conv").astype(np.float64).reshape(co, 1, 1)
        y = _binary(im, "add", y, b, base, im.node.input[2])
    return [y]


# -- element-wise -----------------------------------------------------------------------


def _binary(im: Importer, op: str, a: Value, b: Value, base: str, cname: str) -> Dyn:
    """``a op b`` with numpy broadcasting; a constant side becomes a compact weight."""
    sa = a.shape if isinstance(a, Dyn) else np.asarray(a).shape
    sb = b.shape if isinstance(b, Dyn) else np.asarray(b).shape
    try:
        out = tuple(np.broadcast_shapes(tuple(sa), tuple(sb)))
    except ValueError:
        raise im.fail(f"shapes {list(sa)} and {list(sb)} do not broadcast") from None
    if isinstance(a, Dyn) and isinstance(b, Dyn):
        aa, bb = a, b
        if graph_shape(out) != tuple(np.broadcast_shapes(a.gshape, b.gshape)):
            aa, bb = im.full(a, base + ".a"), im.full(b, base + ".b")
        return im.emit(op, [aa.name, bb.name], base, out, g=np.broadcast_shapes(aa.gshape, bb.gshape))
    d = a if isinstance(a, Dyn) else b
    assert isinstance(d, Dyn)
    if out != d.shape:
        raise im.fail(f"a constant of shape {list(sa if d is b else sb)} broadcasts the value of shape "
                      f"{list(d.shape)} to {list(out)}", hint="fold the constant into a weight of the value's shape")
    c = np.asarray(b if d is a else a, dtype=np.float64)
    w = im.const_operand(c, d.shape, cname or base + ".c")
    return im.emit(op, [d.name, w] if d is a else [w, d.name], base, out)


def _scale(im: Importer, x: Dyn, c: float, base: str) -> Dyn:
    """``c * x`` for a scalar ``c``: a degree-1 poly (one constant multiplication)."""
    return im.emit("poly", [x.name], base, x.shape, coeffs=[0.0, float(c)])


@handles("Add", "Sub", "Mul")
def _arith(im: Importer) -> list[Value]:
    a, b = im.dyn_inputs()[:2]
    op = im.node.op_type.lower()
    base = im.out_name()
    names = list(im.node.input)
    if op == "mul" and not (isinstance(a, Dyn) and isinstance(b, Dyn)):
        d = a if isinstance(a, Dyn) else b
        c = np.asarray(b if d is a else a, dtype=np.float64)
        assert isinstance(d, Dyn)
        if c.size and np.all(c == c.reshape(-1)[0]) and np.broadcast_shapes(d.shape, c.shape) == d.shape:
            return [_scale(im, d, float(c.reshape(-1)[0]), base)]
    cname = names[1] if isinstance(a, Dyn) else names[0]
    return [_binary(im, op, a, b, base, cname)]


@handles("Div")
def _div(im: Importer) -> list[Value]:
    a, b = im.dyn_inputs()[:2]
    base = im.out_name()
    if not isinstance(b, Dyn):
        c = np.asarray(b, dtype=np.float64)
        if np.any(c == 0):
            raise im.fail("division by a constant holding zeros")
        if c.size and np.all(c == c.reshape(-1)[0]):
            return [_scale(im, _dyn(im, a), 1.0 / float(c.reshape(-1)[0]), base)]
        return [_binary(im, "mul", a, 1.0 / c, base, im.node.input[1] + ".inv")]
    r = _reciprocal(im, b, im.node.input[1], base + ".recip")
    if not isinstance(a, Dyn):
        return [_binary(im, "mul", r, np.asarray(a, dtype=np.float64), base, im.node.input[0])]
    return [_binary(im, "mul", a, r, base, "")]


@handles("Neg")
def _neg(im: Importer) -> list[Value]:
    return [_scale(im, _dyn(im, im.dyn_inputs()[0]), -1.0, im.out_name())]


@handles("Pow")
def _pow(im: Importer) -> list[Value]:
    x, e = im.dyn_inputs()[:2]
    x = _dyn(im, x)
    p = _const(im, e, "the exponent of Pow").reshape(-1)
    if p.size != 1 or float(p[0]) not in (1.0, 2.0, 3.0, 4.0):
        raise im.fail(f"exponent {p.tolist()} is not supported (only 1, 2, 3, 4)",
                      hint="use Mul, or Sqrt/Reciprocal for fractional powers")
    k = int(p[0])
    base = im.out_name()
    if k == 1:
        return [x]
    sq = im.emit("mul", [x.name, x.name], base if k == 2 else base + ".sq", x.shape)
    if k == 2:
        return [sq]
    if k == 4:
        return [im.emit("mul", [sq.name, sq.name], base, x.shape)]
    return [im.emit("mul", [sq.name, x.name], base, x.shape)]


# -- activations --------------------------------------------------------------------------


def _activation(im: Importer, function: str, g: Callable[[Array], Array] | None = None) -> list[Value]:
    x = _dyn(im, im.dyn_inputs()[0])
    fn = g or approx.FUNCTIONS[function]
    y, _ = im.approximate(x, function, fn, im.measured(im.node.input[0]), im.opts.domain, im.out_name())
    return [y]


def _relu_like(im: Importer, function: str, slope: float) -> list[Value]:
    """Relu / LeakyRelu: the direct fit under ``--relu direct`` or a fixed ``--degree`` (with
    ``auto``), else chosen between the direct fit and the composite sign polynomial."""
    if im.opts.relu == "direct" or (im.opts.relu == "auto" and im.opts.degree is not None):
        return _activation(im, function, lambda x: np.where(x >= 0, x, slope * x))
    return [composite.emit(im, function, slope)]


@handles("Relu")
def _relu(im: Importer) -> list[Value]:
    return _relu_like(im, "relu", 0.0)


@handles("LeakyRelu")
def _leaky(im: Importer) -> list[Value]:
    alpha = float(attr(im.node, "alpha", 0.01))
    return _relu_like(im, f"leaky_relu({alpha:g})", alpha)


@handles("Abs")
def _abs(im: Importer) -> list[Value]:
    """|x| = x sgn(x): a leaky ReLU of slope -1."""
    return _relu_like(im, "abs", -1.0)


@handles("MaxPool", "GlobalMaxPool")
def _maxpool(im: Importer) -> list[Value]:
    """max(a, b) = b + relu(a - b) over each window (planner.frontend.importers.composite)."""
    return [composite.emit_maxpool(im)]


@handles("Sigmoid")
def _sigmoid(im: Importer) -> list[Value]:
    return _activation(im, "sigmoid")


@handles("Tanh")
def _tanh(im: Importer) -> list[Value]:
    return _activation(im, "tanh")


@handles("Gelu", "GeluErf")
def _gelu(im: Importer) -> list[Value]:
    if str(attr(im.node, "approximate", "none")) == "tanh":
        return _activation(im, "gelu_tanh")
    return _activation(im, "gelu")


@handles("SiLU")
def _silu(im: Importer) -> list[Value]:
    return _activation(im, "silu")


@handles("Erf")
def _erf(im: Importer) -> list[Value]:
    return _activation(im, "erf")


@handles("Exp")
def _exp(im: Importer) -> list[Value]:
    return _activation(im, "exp")


@handles("Sqrt")
def _sqrt(im: Importer) -> list[Value]:
    x = _dyn(im, im.dyn_inputs()[0])
    y, _ = im.approximate(x, "sqrt", np.sqrt, im.measured(im.node.input[0]), (1e-2, 16.0), im.out_name(),
                          positive=True)
    return [y]


@handles("Reciprocal")
def _recip_op(im: Importer) -> list[Value]:
    x = _dyn(im, im.dyn_inputs()[0])
    return [_reciprocal(im, x, im.node.input[0], im.out_name())]


@handles("InvSqrt")
def _invsqrt_op(im: Importer) -> list[Value]:
    x = _dyn(im, im.dyn_inputs()[0])
    xs = im.measured(im.node.input[0])
    return [_inverse(im, x, xs, "invsqrt", (VAR_LO, VAR_HI), im.out_name())]


def _reciprocal(im: Importer, x: Dyn, onnx_name: str, base: str) -> Dyn:
    return _inverse(im, x, im.measured(onnx_name), "reciprocal", (1.0, 16.0), base)


def _inverse(im: Importer, x: Dyn, xs: Array | None, function: str, default: tuple[float, float], base: str,
             pre: tuple[float, float] = (0.0, 1.0)) -> Dyn:
    """``1 / a`` or ``1 / sqrt(a)`` of ``a = pre[0] + pre[1] * x`` (a > 0): a Chebyshev fit on
    the measured range of ``x`` (kept where a > 0), then ``opts.newton`` Newton steps
    (``y <- y (2 - a y)``, ``y <- y (3 - a y^2) / 2``), each squaring the relative error."""
    c0, c1 = pre
    a_s = None if xs is None else c0 + c1 * xs
    if a_s is not None and np.any(a_s <= 0):
        raise im.fail(f"{function} of values that reach {float(np.min(a_s)):.4g} <= 0 on the calibration samples")
    inv = approx.FUNCTIONS[function]

    def g(v: Array) -> Array:
        return inv(c0 + c1 * v)

    dom_default = ((default[0] - c0) / c1, (default[1] - c0) / c1)
    steps = im.opts.newton
    y, f = im.approximate(x, function, g, xs, dom_default, base + (".init" if steps else ""), positive=True)
    if steps:
        half = function == "invsqrt"
        # reciprocal: y <- (y + y) - (a y) y (2 levels); inverse square root:
        # y <- 1.5 y - ((a/2) y^2) y (3 levels); a = pre[0] + pre[1] x (halved for invsqrt)
        h = (c0 / 2, c1 / 2) if half else (c0, c1)
        a = x if h == (0.0, 1.0) else im.emit("poly", [x.name], base + ".arg", x.shape, coeffs=[h[0], h[1]])
        for k in range(steps):
            name = base if k == steps - 1 else f"{base}.newton{k + 1}"
            if half:
                y2 = im.emit("mul", [y.name, y.name], f"{base}.y2_{k + 1}", x.shape)
                t = im.emit("mul", [a.name, y2.name], f"{base}.ay2_{k + 1}", x.shape)
                lin = im.emit("poly", [y.name], f"{base}.y15_{k + 1}", x.shape, coeffs=[0.0, 1.5])
            else:
                t = im.emit("mul", [a.name, y.name], f"{base}.ay_{k + 1}", x.shape)
                lin = im.emit("add", [y.name, y.name], f"{base}.y2x_{k + 1}", x.shape)
            t3 = im.emit("mul", [t.name, y.name], f"{base}.t_{k + 1}", x.shape)
            y = im.emit("sub", [lin.name, t3.name], name, x.shape)
        row = im.rows[-1]
        err = _newton_error(function, g, f, steps, xs, f.domain, pre)
        im.rows[-1] = replace(row, depth=row.depth + (3 if half else 2) * steps, max_error=err, newton=steps)
    return y


def _newton_error(function: str, g: Callable[[Array], Array], f: approx.Fit, steps: int, xs: Array | None,
                  domain: tuple[float, float], pre: tuple[float, float]) -> float:
    v = np.ravel(xs) if xs is not None and xs.size else np.linspace(domain[0], domain[1], 2001)
    a = pre[0] + pre[1] * v
    y = f(v)
    for _ in range(steps):
        y = y * (2.0 - a * y) if function == "reciprocal" else y * (1.5 - 0.5 * a * y * y)
    return float(np.max(np.abs(y - g(v))))


# -- softmax, layer norm, reductions -----------------------------------------------------------


@handles("Softmax")
def _softmax(im: Importer) -> list[Value]:
    x = _dyn(im, im.dyn_inputs()[0])
    rank = len(x.shape)
    axis = _axis(im, int(attr(im.node, "axis", -1 if im.og.opset >= 13 else 1)), rank)
    if im.og.opset < 13 and axis != rank - 1:
        raise im.fail(f"Softmax (opset {im.og.opset}) over the flattened axes {axis}..{rank - 1}",
                      hint="export with opset >= 13 or softmax over the last axis")
    ga = _gaxis(im, x, axis)
    base = im.out_name()
    xs = im.measured(im.node.input[0])
    top = float(np.max(xs)) if xs is not None and xs.size else im.opts.domain[1]
    top = im.widen(float(np.min(xs)), top)[1] if xs is not None and xs.size else top
    e, _ = im.approximate(x, "exp", lambda v: np.exp(v - top), xs, im.opts.domain, base + ".exp")
    im.rows[-1] = _renamed(im.rows[-1], f"exp(x - {top:.4g})")
    sshape = tuple(1 if i == axis else d for i, d in enumerate(x.shape))
    s = im.emit("sum", [e.name], base + ".sum", sshape, axis=ga, keepdims=True)
    ss = None if xs is None else np.sum(np.exp(xs - top), axis=axis + 1, keepdims=True)
    n = x.shape[axis]
    r = _inverse(im, s, ss, "reciprocal", (1.0, float(n)), base + ".recip")
    return [_binary(im, "mul", e, r, base, "")]


def _renamed(row: ApproxRow, function: str) -> ApproxRow:
    return replace(row, function=function)


@handles("LayerNormalization")
def _layernorm(im: Importer) -> list[Value]:
    x, scale, *rest = im.dyn_inputs()
    x = _dyn(im, x)
    rank = len(x.shape)
    axis = _axis(im, int(attr(im.node, "axis", -1)), rank)
    if axis != rank - 1:
        raise im.fail(f"LayerNormalization over axes {axis}..{rank - 1} (only the last axis is supported)",
                      hint="normalise over the last axis")
    eps = float(attr(im.node, "epsilon", 1e-5))
    ga = _gaxis(im, x, axis)
    base = im.out_name()
    n = x.shape[-1]
    kshape = (*x.shape[:-1], 1)
    s = im.emit("sum", [x.name], base + ".sum", kshape, axis=ga, keepdims=True)
    mean = _scale(im, s, 1.0 / n, base + ".mean")
    d = im.emit("sub", [x.name, mean.name], base + ".centered", x.shape)
    q = im.emit("mul", [d.name, d.name], base + ".sq", x.shape)
    v = im.emit("sum", [q.name], base + ".var_sum", kshape, axis=ga, keepdims=True)
    xs = im.measured(im.node.input[0])
    vs = None
    if xs is not None:
        centred = xs - xs.mean(axis=-1, keepdims=True)
        vs = np.sum(centred * centred, axis=-1, keepdims=True)
    inv = _inverse(im, v, vs, "invsqrt", (VAR_LO, VAR_HI), base + ".invstd", pre=(eps, 1.0 / n))
    y = im.emit("mul", [d.name, inv.name], base + ".norm", x.shape)
    sc = _const(im, scale, "the scale of LayerNormalization").astype(np.float64)
    has_bias = bool(rest) and np.asarray(rest[0]).size > 0
    y = _binary(im, "mul", y, sc, base + (".scaled" if has_bias else ""), im.node.input[1])
    if has_bias:
        y = _binary(im, "add", y, _const(im, rest[0], "the bias of LayerNormalization"), base, im.node.input[2])
    return [y]


def _reduce_axes(im: Importer, d: Dyn) -> list[int]:
    axes = attr(im.node, "axes")
    if axes is None and len(im.node.input) > 1 and im.node.input[1]:
        axes = _ints(im, im.get(im.node.input[1]), "the axes of " + im.node.op_type)
    if axes is None or len(axes) == 0:
        if int(attr(im.node, "noop_with_empty_axes", 0)):
            return []
        axes = list(range(len(d.shape)))
    return sorted({_axis(im, int(a), len(d.shape)) for a in axes})


@handles("ReduceMean", "ReduceSum")
def _reduce(im: Importer) -> list[Value]:
    x = _dyn(im, im.dyn_inputs()[0])
    keep = bool(int(attr(im.node, "keepdims", 1)))
    axes = _reduce_axes(im, x)
    base = im.out_name()
    y = x
    count = 1
    for ax in sorted(axes, reverse=True):
        shape = (*y.shape[:ax], 1, *y.shape[ax + 1:])
        y = im.emit("sum", [y.name], f"{base}.sum{ax}", shape, axis=_gaxis(im, y, ax), keepdims=True)
        count *= x.shape[ax]
    if im.node.op_type == "ReduceMean" and axes:
        y = _scale(im, y, 1.0 / count, base if keep else base + ".mean")
    if not keep and axes:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        y = im.as_shape(y, shape or (1,), base)
    return [y]


@handles("GlobalAveragePool")
def _gap(im: Importer) -> list[Value]:
    x = _dyn(im, im.dyn_inputs()[0])
    if len(x.shape) != 4:
        raise im.fail(f"GlobalAveragePool on shape {list(x.shape)} (expects [1, C, H, W])")
    base = im.out_name()
    c, h, w = x.shape[1:]
    y = im.emit("sum", [x.name], base + ".sum_w", (1, c, h, 1), axis=2, keepdims=True)
    y = im.emit("sum", [y.name], base + ".sum", (1, c, 1, 1), axis=1, keepdims=True)
    return [_scale(im, y, 1.0 / (h * w), base)]


@handles("AveragePool")
def _avgpool(im: Importer) -> list[Value]:
    x = _dyn(im, im.dyn_inputs()[0])
    if len(x.shape) != 4:
        raise im.fail(f"AveragePool on shape {list(x.shape)} (expects [1, C, H, W])")
    if int(attr(im.node, "ceil_mode", 0)):
        raise im.fail("ceil_mode 1 is not supported", hint="use ceil_mode 0")
    k = [int(v) for v in attr(im.node, "kernel_shape")]
    c = x.shape[1]
    w = np.ones((c, 1, k[0], k[1]), dtype=np.float64)
    p1, p2 = _conv_pads(im, x, w)
    s = [int(v) for v in attr(im.node, "strides", [1, 1])]
    include = int(attr(im.node, "count_include_pad", 0))
    base = im.out_name()
    ho = (x.shape[2] + 2 * p1 - k[0]) // s[0] + 1
    wo = (x.shape[3] + 2 * p2 - k[1]) // s[1] + 1
    if include or (p1 == 0 and p2 == 0):
        wn = im.weight(base + ".avg", w / (k[0] * k[1]))
        return [im.emit("conv2d", [x.name, wn], base, (1, c, ho, wo), stride=s, padding=[p1, p2], groups=c)]
    wn = im.weight(base + ".ones", w)
    y = im.emit("conv2d", [x.name, wn], base + ".sum", (1, c, ho, wo), stride=s, padding=[p1, p2], groups=c)
    from planner.frontend.reference import conv2d

    counts = conv2d(np.ones((1, x.shape[2], x.shape[3])), np.ones((1, 1, k[0], k[1])), stride=(s[0], s[1]),
                    padding=(p1, p2))
    return [_binary(im, "mul", y, (1.0 / counts).reshape(1, 1, ho, wo), base, base + ".count")]


# -- views ----------------------------------------------------------------------------------


@handles("BatchNormalization")
def _batchnorm(im: Importer) -> list[Value]:
    """A BatchNorm not folded into a linear layer: a per-channel affine map (2 plaintext ops)."""
    x, *params = im.dyn_inputs()
    x = _dyn(im, x)
    if len(params) < 4 or len(x.shape) < 2:
        raise im.fail("BatchNormalization needs scale, bias, mean and variance, on [N, C, ...]")
    scale, beta, mean, var = (_const(im, p, "BatchNormalization parameters").astype(np.float64) for p in params[:4])
    eps = float(attr(im.node, "epsilon", 1e-5))
    k = scale / np.sqrt(var + eps)
    per = (1, -1, *([1] * (len(x.shape) - 2)))
    base = im.out_name()
    y = _binary(im, "mul", x, k.reshape(per), base + ".scale", base + ".bn_scale")
    return [_binary(im, "add", y, (beta - mean * k).reshape(per), base, base + ".bn_shift")]


@handles("Identity", "Dropout", "Cast", "CastLike")
def _identity(im: Importer) -> list[Value]:
    if im.node.op_type in ("Cast", "CastLike"):
        to = attr(im.node, "to")
        from onnx import TensorProto

        if to is not None and to not in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16,
                                         TensorProto.BFLOAT16):
            raise im.fail("Cast of an encrypted value to a non-float type", hint="keep values real")
    x = _dyn(im, im.dyn_inputs()[0])
    return [x]


@handles("Reshape")
def _reshape(im: Importer) -> list[Value]:
    x, s = im.dyn_inputs()[:2]
    x = _dyn(im, x)
    target = _ints(im, s, "the shape of Reshape")
    allowzero = int(attr(im.node, "allowzero", 0))
    out = [x.shape[i] if (d == 0 and not allowzero and i < len(x.shape)) else d for i, d in enumerate(target)]
    if out.count(-1) > 1 or any(d < -1 for d in out):
        raise im.fail(f"shape {target} cannot be resolved")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or math.prod(x.shape) % known:
            raise im.fail(f"shape {target} does not fit {list(x.shape)}")
        out[out.index(-1)] = math.prod(x.shape) // known
    if math.prod(out) != math.prod(x.shape):
        raise im.fail(f"cannot reshape {list(x.shape)} to {target}")
    return [im.as_shape(x, out, im.out_name())]


@handles("Flatten")
def _flatten(im: Importer) -> list[Value]:
    x = _dyn(im, im.dyn_inputs()[0])
    axis = int(attr(im.node, "axis", 1))
    axis = axis % (len(x.shape) + 1) if axis < 0 else axis
    out = (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
    return [im.as_shape(x, out, im.out_name())]


@handles("Squeeze", "Unsqueeze")
def _squeeze(im: Importer) -> list[Value]:
    vals = im.dyn_inputs()
    x = _dyn(im, vals[0])
    axes = attr(im.node, "axes")
    if axes is None and len(vals) > 1 and im.node.input[1]:
        axes = _ints(im, vals[1], "the axes of " + im.node.op_type)
    if im.node.op_type == "Squeeze":
        r = len(x.shape)
        drop = {_axis(im, int(a), r) for a in axes} if axes else {i for i, d in enumerate(x.shape) if d == 1}
        out = [d for i, d in enumerate(x.shape) if i not in drop]
    else:
        r = len(x.shape) + len(axes or [])
        add = {_axis(im, int(a), r) for a in (axes or [])}
        it = iter(x.shape)
        out = [1 if i in add else next(it) for i in range(r)]
    return [im.as_shape(x, out or [1], im.out_name())]


def _transpose(im: Importer, x: Dyn, perm: Sequence[int], base: str) -> Dyn:
    out = tuple(x.shape[p] for p in perm)
    drop = len(x.shape) - len(x.gshape)
    if drop and perm[0] == 0:
        gperm = [p - 1 for p in perm[1:]]
        if gperm == sorted(gperm):
            return Dyn(x.name, out)
        return im.emit("transpose", [x.name], base, out, perm=gperm)
    xf = im.full(x, base + ".in")
    return im.emit("transpose", [xf.name], base, out, g=out, perm=list(perm))


@handles("Transpose")
def _transpose_op(im: Importer) -> list[Value]:
    x = _dyn(im, im.dyn_inputs()[0])
    perm = attr(im.node, "perm") or list(range(len(x.shape)))[::-1]
    if sorted(perm) != list(range(len(x.shape))):
        raise im.fail(f"perm {perm} is not a permutation of the {len(x.shape)} axes")
    return [_transpose(im, x, [int(p) for p in perm], im.out_name())]


@handles("Slice")
def _slice(im: Importer) -> list[Value]:
    vals = im.dyn_inputs()
    x = _dyn(im, vals[0])
    starts = _ints(im, vals[1], "starts of Slice")
    ends = _ints(im, vals[2], "ends of Slice")
    axes = _ints(im, vals[3], "axes of Slice") if len(vals) > 3 and im.node.input[3] else list(range(len(starts)))
    steps = _ints(im, vals[4], "steps of Slice") if len(vals) > 4 and im.node.input[4] else [1] * len(starts)
    y = x
    base = im.out_name()
    for i, (st, en, ax, sp) in enumerate(zip(starts, ends, axes, steps, strict=True)):
        ax = _axis(im, ax, len(x.shape))
        if sp != 1:
            raise im.fail(f"step {sp} on axis {ax} (only step 1 is supported)")
        lo, hi, _ = slice(st, en).indices(y.shape[ax])
        if lo == 0 and hi == y.shape[ax]:
            continue
        if hi <= lo:
            raise im.fail(f"empty slice {st}:{en} on axis {ax}")
        shape = (*y.shape[:ax], hi - lo, *y.shape[ax + 1:])
        last = i == len(starts) - 1
        y = im.emit("slice", [y.name], base if last else f"{base}.{ax}", shape, axis=_gaxis(im, y, ax),
                    start=lo, stop=hi)
    return [y if y is not x else Dyn(x.name, x.shape)]


@handles("Split")
def _split(im: Importer) -> list[Value]:
    vals = im.dyn_inputs()
    x = _dyn(im, vals[0])
    axis = _axis(im, int(attr(im.node, "axis", 0)), len(x.shape))
    n_out = len(im.node.output)
    sizes = attr(im.node, "split")
    if sizes is None and len(vals) > 1 and im.node.input[1]:
        sizes = _ints(im, vals[1], "split of Split")
    if sizes is None:
        dim = x.shape[axis]
        per = -(-dim // n_out)
        sizes = [min(per, dim - i * per) for i in range(n_out)]
    outs: list[Value] = []
    start = 0
    for k, size in enumerate(sizes):
        shape = (*x.shape[:axis], size, *x.shape[axis + 1:])
        outs.append(im.emit("slice", [x.name], str(im.node.output[k]), shape, axis=_gaxis(im, x, axis),
                            start=start, stop=start + size))
        start += size
    return outs


@handles("Concat")
def _concat(im: Importer) -> list[Value]:
    vals = im.dyn_inputs()
    ref = next(v for v in vals if isinstance(v, Dyn))
    axis = _axis(im, int(attr(im.node, "axis")), len(ref.shape))
    names: list[str] = []
    total = 0
    for name, v in zip(im.node.input, vals, strict=True):
        if isinstance(v, Dyn):
            names.append(v.name)
            total += v.shape[axis]
        else:
            c = np.asarray(v, dtype=np.float64)
            if c.size == 0:
                continue
            names.append(im.weight(name, c.reshape(graph_shape(c.shape))))
            total += c.shape[axis]
    shape = (*ref.shape[:axis], total, *ref.shape[axis + 1:])
    return [im.emit("concat", names, im.out_name(), shape, axis=_gaxis(im, ref, axis))]


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------


def _load_samples(path: str | Path) -> dict[str, Array]:
    p = Path(path)
    try:
        with np.load(p, allow_pickle=False) as z:
            return {k: np.asarray(z[k]) for k in z.files}
    except FileNotFoundError:
        raise ModelError(f"cannot read calibration file {str(p)!r}: no such file") from None
    except Exception as exc:
        raise ModelError(f"calibration file {str(p)!r} is not a readable .npz ({' '.join(str(exc).split())[:200]})") \
            from None


def import_model(
    model_path: str | Path,
    opts: ImportOptions | None = None,
    calibrate: str | Path | Mapping[str, npt.ArrayLike] | None = None,
) -> ImportResult:
    """Import an ONNX model (see the module docstring and docs/import.md)."""
    opts = opts or ImportOptions()
    if opts.degree is not None and not 1 <= opts.degree <= approx.MAX_DEGREE:
        raise ModelError(f"--degree must be in 1..{approx.MAX_DEGREE}, got {opts.degree}")
    if opts.max_error is not None and not opts.max_error > 0:
        raise ModelError(f"--max-error must be > 0, got {opts.max_error}")
    if opts.relu not in composite.RELU_MODES:
        raise ModelError(f"--relu must be one of {', '.join(composite.RELU_MODES)}, got {opts.relu!r}")
    model = load_model(model_path)
    model, end_notes, warnings = _model_end(model, opts)
    og = OnnxGraph.from_model(model)
    og.notes[:0] = end_notes
    samples_in: list[dict[str, Array]] = []
    recorded: dict[str, Array] | None = None
    calibrator = None
    if calibrate is not None:
        where = f"calibration file {str(calibrate)!r}" if isinstance(calibrate, str | Path) else "calibration data"
        data = _load_samples(calibrate) if isinstance(calibrate, str | Path) else {
            k: np.asarray(v) for k, v in calibrate.items()}
        samples_in = calibration_samples(og, data, where)
        names = list(dict.fromkeys(o for n in model.graph.node for o in n.output if o))
        recorded, calibrator = run_float(model, samples_in, names)
        recorded.update({k: np.stack([s[k] for s in samples_in]) for k in og.inputs})
    im = Importer(og, opts, recorded)
    im.run()
    outputs = _outputs(im)
    _fold_affine_into_chebyshev(im, set(outputs.values()))
    name = opts.name or sanitise(model.graph.name or Path(str(model_path)).stem)
    doc: dict[str, Any] = {"schema": SCHEMA, "name": name, "tensors": im.tensors, "nodes": im.nodes,
                           "outputs": [outputs[o] for o in og.outputs]}
    ranges = _ranges(im, recorded)
    for gname in im.input_map.values():
        if gname in ranges:  # the measured range, widened by the margin, is what the graph promises
            im.tensors[gname]["range"] = list(im.widen(*ranges[gname]))
    for wname, w in im.weights.items():  # the weights' exact range (run checks them)
        im.tensors[wname]["range"] = [float(np.min(w)), float(np.max(w))]
    graph = _parse(doc)
    res = ImportResult(doc, graph, im.weights, im.rows, len(samples_in), og.notes, ranges,
                       input_map=im.input_map, output_map=outputs, warnings=warnings, calibrator=calibrator)
    res.warnings.extend(_judge_fits(im.rows, opts))
    if recorded is not None:
        res.end_to_end_error, node_ranges = _sample_pass(res, samples_in, recorded)
        for n in im.nodes:  # every node's range on the samples, widened by the margin
            if n["id"] in node_ranges:
                n["range"] = list(im.widen(*node_ranges[n["id"]]))
        res.graph = _parse(doc)
    return res


# Without --max-error, a fit whose largest error exceeds this fraction of the largest |value|
# of the function it stands for (where the error was measured) carries no information.
USELESS_FIT_FRACTION = 0.1


def _judge_fits(rows: Sequence[ApproxRow], opts: ImportOptions) -> list[str]:
    """Each approximation against its error target: ``--max-error`` when given (met or
    refused), else ``USELESS_FIT_FRACTION`` of the function's largest |value|.  A miss is
    a :class:`ModelError` naming the ONNX node, or with ``allow_error`` a warning line."""
    warnings: list[str] = []
    for r in rows:
        if opts.max_error is not None:
            target, what = opts.max_error, f"--max-error {opts.max_error:g}"
        else:
            target = USELESS_FIT_FRACTION * r.scale
            what = (f"{USELESS_FIT_FRACTION:g} x its largest |value| {r.scale:.4g} (a useless fit; "
                    "set a target with --max-error)")
        if r.max_error <= target:
            continue
        where = "on the calibration samples" if r.on_samples else "on the domain"
        rule = (f"the {r.function} polynomial on [{r.domain[0]:.4g}, {r.domain[1]:.4g}] reaches a largest error of "
                f"{r.max_error:.4g} {where} at degree {r.degree}" + (f" with {r.newton} Newton step(s)" if r.newton
                                                                        else "") + f", over {what}")
        if opts.allow_error:
            warnings.append(f"onnx node {r.onnx_node!r}: {rule}; written anyway (--allow-error)")
            continue
        hint = ("calibrate on representative samples (a narrower range), cut the model before this node "
                "(--output NAME), or pass --allow-error to write it with a warning")
        if opts.max_error is not None and r.degree < approx.MAX_DEGREE:
            hint = "a larger --degree, or " + hint
        raise ModelError(rule, node=r.onnx_node, hint=hint)
    return warnings


def _model_end(model: Any, opts: ImportOptions) -> tuple[Any, list[str], list[str]]:
    """Where the imported model ends: cut at ``opts.outputs`` when given, else with any
    classifier head stripped (planner.frontend.importers.heads); the notes saying so, and a warning
    per output that is a probability (a Softmax at the end)."""
    from planner.frontend.importers import heads

    notes: list[str] = []
    if opts.outputs:
        model = heads.cut_model(model, opts.outputs)
        notes.append(f"cut the model at {', '.join(repr(o) for o in opts.outputs)} (--output)")
    else:
        model, stripped = heads.strip_heads(model)
        notes.extend(stripped)
    warnings = [
        f"output {p.output!r} is a probability ({p.op} {p.node!r} at the end of the model): normalising under "
        "encryption costs a reciprocal of the row sum (deep, and inexact over a wide range) and does not change "
        f"which class wins; cut at the logits with --output {p.logits}"
        for p in heads.probability_outputs(model)
    ]
    return model, notes, warnings


def _outputs(im: Importer) -> dict[str, str]:
    """Graph output per model output: the node computing it (a view node when the value is
    an input or an alias of another output)."""
    out: dict[str, str] = {}
    produced = {n["id"] for n in im.nodes}
    for o in im.og.outputs:
        v = im.values.get(o)
        if not isinstance(v, Dyn):
            raise ModelError(f"graph output {o!r} does not depend on the model's input (a constant)")
        if v.name not in produced or v.name in out.values() or v.name in im.input_map.values():
            v = im.emit("reshape", [v.name], o, v.shape, shape=list(v.gshape))
            produced.add(v.name)
        elif sanitise(o) != v.name and sanitise(o) not in im.used:
            _rename(im, v.name, im.fresh(o))
            v = Dyn(sanitise(o), v.shape)
        out[o] = v.name
    return out


def _fold_affine_into_chebyshev(im: Importer, outputs: set[str]) -> None:
    """A degree-1 ``poly`` ``c0 + c1 v`` whose only consumer is a Chebyshev ``poly`` p on
    [a, b] is dropped: p(c0 + c1 v) is the same Chebyshev series on the domain
    ``[(a - c0) / c1, (b - c0) / c1]`` (coefficients of odd degree negated when c1 < 0),
    which saves the level of the constant multiplication (e.g. attention's 1/sqrt(d)
    before the softmax exponential)."""
    users: dict[str, list[dict[str, Any]]] = {}
    for n in im.nodes:
        for i in dict.fromkeys(n["inputs"]):
            users.setdefault(i, []).append(n)
    by_id = {n["id"]: n for n in im.nodes}
    drop: set[str] = set()
    for n in im.nodes:
        if n["op"] != "poly" or n.get("basis") != "chebyshev":
            continue
        src = by_id.get(n["inputs"][0])
        if src is None or src["op"] != "poly" or src.get("basis") or len(src["coeffs"]) != 2:
            continue
        if src["id"] in outputs or len(users.get(src["id"], [])) != 1:
            continue
        c0, c1 = (float(c) for c in src["coeffs"])
        if c1 == 0.0:
            continue
        a, b = n["domain"]
        lo, hi = (a - c0) / c1, (b - c0) / c1
        coeffs = list(n["coeffs"])
        if c1 < 0:
            lo, hi = hi, lo
            coeffs = [-c if i % 2 else c for i, c in enumerate(coeffs)]
        n["inputs"] = list(src["inputs"])
        n["domain"] = [lo, hi]
        n["coeffs"] = coeffs
        drop.add(src["id"])
        im.rows = [_refolded(r, c0, c1, (lo, hi)) if r.node == n["id"] else r for r in im.rows]
    im.nodes = [n for n in im.nodes if n["id"] not in drop]


def _refolded(row: ApproxRow, c0: float, c1: float, domain: tuple[float, float]) -> ApproxRow:
    measured = None
    if row.measured is not None:
        m = sorted(((row.measured[0] - c0) / c1, (row.measured[1] - c0) / c1))
        measured = (m[0], m[1])
    return replace(row, function=f"{row.function} of {c1:.4g}x" + (f" + {c0:.4g}" if c0 else ""),
                   measured=measured, domain=domain)


def _rename(im: Importer, old: str, new: str) -> None:
    for n in im.nodes:
        if n["id"] == old:
            n["id"] = new
        n["inputs"] = [new if i == old else i for i in n["inputs"]]
    for k, v in list(im.values.items()):
        if isinstance(v, Dyn) and v.name == old:
            im.values[k] = Dyn(new, v.shape)


def _ranges(im: Importer, recorded: Mapping[str, Array] | None) -> dict[str, tuple[float, float]]:
    """The measured range of every graph tensor that holds a model value (calibrated only)."""
    out: dict[str, tuple[float, float]] = {}
    if recorded is None:
        return out
    for onnx_name, v in im.values.items():
        if isinstance(v, Dyn) and onnx_name in recorded and v.name not in out:
            arr = np.asarray(recorded[onnx_name], dtype=np.float64)
            if arr.size:
                out[v.name] = (float(np.min(arr)), float(np.max(arr)))
    return dict(sorted(out.items()))


def _parse(doc: dict[str, Any]) -> Graph:
    try:
        return parse_graph(doc)
    except GraphError as exc:
        raise ModelError(f"the imported graph is not valid: {exc}") from None


def _sample_pass(res: ImportResult, samples: list[dict[str, Array]],
                 recorded: Mapping[str, Array]) -> tuple[float, dict[str, tuple[float, float]]]:
    """The graph's numpy reference on every calibration sample: the largest |graph - model in
    float| over the outputs, and the range of every node's values."""
    from planner.frontend.reference import reference

    worst = 0.0
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for i, feed in enumerate(samples):
        values: dict[str, Any] = dict(res.weights)
        for onnx_name, gname in res.input_map.items():
            values[gname] = np.asarray(feed[onnx_name], dtype=np.float64).reshape(res.graph.shape(gname))
        got = reference(res.graph, values)
        for onnx_name, gname in res.output_map.items():
            want = np.asarray(recorded[onnx_name][i], dtype=np.float64).reshape(-1)
            worst = max(worst, float(np.max(np.abs(got[gname].reshape(-1) - want))))
        for node in res.graph.nodes:
            v = got[node.id]
            lo[node.id] = min(lo.get(node.id, math.inf), float(np.min(v)))
            hi[node.id] = max(hi.get(node.id, -math.inf), float(np.max(v)))
    return worst, {k: (lo[k], hi[k]) for k in lo}
