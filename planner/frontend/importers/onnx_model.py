"""Reading an ONNX model for import: load and check it, fold its constants, rewrite the
patterns that are one function (GELU written with Erf, SiLU, BatchNorm after a linear
layer, ``a / sqrt(b)``), and run it in float on calibration samples.

Everything here works on the ONNX graph; :mod:`planner.frontend.importers.onnx_import` turns the
result into a ``slotplan.graph/1`` graph.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from common.errors import ModelError

__all__ = [
    "MAX_MODEL_BYTES",
    "OnnxGraph",
    "attr",
    "calibration_samples",
    "load_model",
    "node_label",
    "run_float",
]

Array = npt.NDArray[Any]

# A model file larger than this is refused before parsing (2 GiB is protobuf's own limit).
MAX_MODEL_BYTES = 2**31 - 1
FUSED_DOMAIN = "slotplan.fused"


def node_label(node: Any) -> str:
    """How error messages name an ONNX node: its name, else its first output."""
    if node.name:
        return str(node.name)
    return str(node.output[0]) if len(node.output) else f"<{node.op_type}>"


def attr(node: Any, name: str, default: Any = None) -> Any:
    """The value of attribute ``name`` of an ONNX node (ints/floats/strings/lists/tensors)."""
    from onnx import helper, numpy_helper

    for a in node.attribute:
        if a.name == name:
            value = helper.get_attribute_value(a)
            if isinstance(value, bytes):
                return value.decode("utf-8", "replace")
            if hasattr(value, "dims") and hasattr(value, "data_type"):
                return numpy_helper.to_array(value)
            if isinstance(value, list):
                return list(value)
            return value
    return default


def load_model(path: str | Path) -> Any:
    """Read and check an ONNX model file; any problem is one :class:`ModelError` line."""
    import onnx

    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise ModelError(f"cannot read model file {str(p)!r}: {exc.strerror or exc}") from None
    if size > MAX_MODEL_BYTES:
        raise ModelError(f"model file {str(p)!r} is {size} bytes, over the limit of {MAX_MODEL_BYTES}")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise ModelError(f"model file {str(p)!r} is not an ONNX model ({_short(exc)})") from None
    if not model.graph.node:
        raise ModelError(f"model file {str(p)!r} has no nodes (not an ONNX model, or an empty graph)")
    try:
        onnx.checker.check_model(model)
    except Exception as exc:
        raise ModelError(f"model file {str(p)!r} is malformed: {_short(exc)}") from None
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            raise ModelError(
                f"initializer {init.name!r} is stored in an external data file, which import does not read",
                hint="save the model with all tensors inside the .onnx file",
            )
    return model


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def opset(model: Any) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 1


@dataclass
class OnnxGraph:
    """The model's graph as plain Python: nodes (after the rewrites), constants, the inputs
    with their static shapes, the outputs, and each value's consumers."""

    model: Any
    nodes: list[Any]
    constants: dict[str, Array]
    inputs: dict[str, tuple[int, ...]]
    input_dtypes: dict[str, Any]
    outputs: list[str]
    opset: int
    consumers: dict[str, list[Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_model(cls, model: Any) -> OnnxGraph:
        from onnx import helper, numpy_helper

        g = model.graph
        constants: dict[str, Array] = {}
        for init in g.initializer:
            try:
                constants[init.name] = numpy_helper.to_array(init)
            except Exception as exc:
                raise ModelError(f"initializer {init.name!r} cannot be read ({_short(exc)})") from None
        inputs: dict[str, tuple[int, ...]] = {}
        dtypes: dict[str, Any] = {}
        for vi in g.input:
            if vi.name in constants:
                continue  # old exporters list initializers as inputs too
            inputs[vi.name] = _static_shape(vi)
            dtypes[vi.name] = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        if not inputs:
            raise ModelError("the model has no input (every graph input has an initializer)")
        out = cls(model, list(g.node), constants, inputs, dtypes, [o.name for o in g.output], opset(model))
        out._check_names()
        out.rewrite()
        return out

    def _check_names(self) -> None:
        known = set(self.constants) | set(self.inputs)
        for node in self.nodes:
            if node.domain not in ("", "ai.onnx"):
                raise ModelError(
                    f"op {node.op_type} of domain {node.domain!r} is not a standard ONNX op",
                    node=node_label(node), op=node.op_type,
                    hint="export with standard ONNX ops only",
                )
            for name in node.input:
                if name and name not in known:
                    raise ModelError(
                        f"input {name!r} is neither a graph input, an initializer nor an earlier node's output "
                        "(missing initializer, or nodes out of order)",
                        node=node_label(node), op=node.op_type,
                    )
            known.update(o for o in node.output if o)
        for name in self.outputs:
            if name not in known:
                raise ModelError(f"graph output {name!r} is computed by no node")

    # -- consumers, liveness --------------------------------------------------------------
    def index(self) -> None:
        self.consumers = {}
        for node in self.nodes:
            for name in dict.fromkeys(node.input):
                if name:
                    self.consumers.setdefault(name, []).append(node)

    def producer_map(self) -> dict[str, Any]:
        return {o: n for n in self.nodes for o in n.output if o}

    def prune(self) -> None:
        """Drop the nodes no graph output needs (pattern rewrites leave some)."""
        live = set(self.outputs)
        keep: list[Any] = []
        for node in reversed(self.nodes):
            if any(o in live for o in node.output):
                keep.append(node)
                live.update(i for i in node.input if i)
        self.nodes = keep[::-1]
        self.index()

    def is_const(self, name: str, known: set[str]) -> bool:
        return name in self.constants or name in known

    def constant_values(self) -> set[str]:
        """Names whose value does not depend on the encrypted inputs (folded at import)."""
        const: set[str] = set(self.constants)
        for node in self.nodes:
            ins = [i for i in node.input if i]
            if node.op_type in ("Shape", "Size") or all(i in const for i in ins):
                const.update(o for o in node.output if o)
        return const

    # -- rewrites -------------------------------------------------------------------------
    def rewrite(self) -> None:
        self.index()
        const = self.constant_values()
        _fold_batchnorm(self)
        self.index()
        _fuse_gelu_erf(self, const)
        self.index()
        _fuse_silu(self)
        self.index()
        _fuse_div_sqrt(self, const)
        self.prune()

    def replace(self, old: Iterable[Any], new: Any, at: Any) -> None:
        """Put ``new`` (a node or a list of nodes) where ``at`` is; remove ``at`` and ``old``."""
        drop = {id(n) for n in old} | {id(at)}
        out: list[Any] = []
        for node in self.nodes:
            if node is at:
                out.extend(new if isinstance(new, list) else [new])
            if id(node) not in drop:
                out.append(node)
        self.nodes = out


def _static_shape(vi: Any) -> tuple[int, ...]:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        raise ModelError(f"graph input {vi.name!r} has no tensor shape", hint="export with static input shapes")
    dims: list[int] = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        elif i == 0:
            dims.append(1)  # a symbolic batch dimension: one sample at a time
        else:
            label = d.dim_param or "?"
            raise ModelError(
                f"graph input {vi.name!r} has a dynamic dimension {label!r} at axis {i} that cannot be resolved "
                "(only the leading batch dimension may be symbolic; it is taken as 1)",
                hint="export with static shapes",
            )
    return tuple(dims)


def _single_consumer(g: OnnxGraph, name: str) -> Any:
    users = g.consumers.get(name, [])
    if len(users) != 1 or name in g.outputs:
        return None
    return users[0]


def _fold_batchnorm(g: OnnxGraph) -> None:
    """``BatchNormalization(Conv(x, W, b))`` -> ``Conv(x, W', b')`` (likewise after Gemm with
    ``transB=1`` / a 2-D MatMul weight) when the linear layer's result feeds only the BN."""
    from onnx import helper

    prod = g.producer_map()
    for bn in list(g.nodes):
        if bn.op_type != "BatchNormalization" or len(bn.input) < 5:
            continue
        lin = prod.get(bn.input[0])
        if lin is None or _single_consumer(g, bn.input[0]) is not bn:
            continue
        if any(i not in g.constants for i in bn.input[1:5]):
            continue
        scale, beta, mean, var = (np.asarray(g.constants[i], dtype=np.float64) for i in bn.input[1:5])
        eps = float(attr(bn, "epsilon", 1e-5))
        k = scale / np.sqrt(var + eps)
        shift = beta - mean * k
        folded = _fold_into(g, lin, k, shift)
        if folded is None:
            continue
        weight, bias, op_inputs = folded
        wname = f"{op_inputs[1]}.bn_folded"
        bname = f"{bn.output[0]}.bn_bias"
        g.constants[wname] = weight
        g.constants[bname] = bias
        new = helper.make_node(
            lin.op_type, [op_inputs[0], wname, bname], [bn.output[0]], name=lin.name or bn.name
        )
        new.attribute.extend(lin.attribute)
        g.replace([lin, bn], new, bn)
        g.notes.append(f"BatchNormalization {node_label(bn)!r} folded into {lin.op_type} {node_label(lin)!r}")
        prod = g.producer_map()


def _fold_into(g: OnnxGraph, lin: Any, k: Array, shift: Array) -> tuple[Array, Array, list[str]] | None:
    ins = list(lin.input)
    if lin.op_type == "Conv":
        if len(ins) < 2 or ins[1] not in g.constants:
            return None
        w = np.asarray(g.constants[ins[1]], dtype=np.float64)
        if w.shape[0] != k.shape[0]:
            return None
        b = np.asarray(g.constants[ins[2]], dtype=np.float64) if len(ins) > 2 and ins[2] else np.zeros(w.shape[0])
        return w * k.reshape((-1,) + (1,) * (w.ndim - 1)), b * k + shift, ins
    if lin.op_type == "Gemm":
        if len(ins) < 2 or ins[1] not in g.constants or attr(lin, "transA", 0):
            return None
        if float(attr(lin, "alpha", 1.0)) != 1.0 or float(attr(lin, "beta", 1.0)) != 1.0:
            return None
        w = np.asarray(g.constants[ins[1]], dtype=np.float64)
        trans_b = int(attr(lin, "transB", 0))
        n = w.shape[0] if trans_b else w.shape[1]
        if n != k.shape[0]:
            return None
        b = np.asarray(g.constants[ins[2]], dtype=np.float64) if len(ins) > 2 and ins[2] else np.zeros(n)
        b = np.broadcast_to(b, (n,)) if b.size in (1, n) and b.ndim <= 1 else None  # type: ignore[assignment]
        if b is None:
            return None
        w2 = w * k[:, None] if trans_b else w * k[None, :]
        return w2, b * k + shift, ins
    return None


def _const_scalar(g: OnnxGraph, name: str, const: set[str]) -> float | None:
    if name in g.constants:
        v = np.asarray(g.constants[name])
        if v.size == 1:
            return float(v.reshape(-1)[0])
    prod = g.producer_map().get(name)
    if prod is not None and prod.op_type == "Constant":
        v = attr(prod, "value")
        if v is None:
            v = attr(prod, "value_float")
        if v is not None and np.asarray(v).size == 1:
            return float(np.asarray(v).reshape(-1)[0])
    return None


def _other(node: Any, name: str) -> str | None:
    ins = [i for i in node.input if i]
    if len(ins) != 2:
        return None
    if ins[0] == name:
        return ins[1]
    if ins[1] == name:
        return ins[0]
    return None


def _fuse_gelu_erf(g: OnnxGraph, const: set[str]) -> None:
    """``0.5 * x * (1 + erf(x / sqrt 2))`` (any order of the two products) -> one GELU."""
    from onnx import helper

    prod = g.producer_map()
    for erf in list(g.nodes):
        if erf.op_type != "Erf":
            continue
        scaled = prod.get(erf.input[0])
        if scaled is None or scaled.op_type not in ("Div", "Mul"):
            continue
        x = scaled.input[0]
        c = _const_scalar(g, scaled.input[1], const)
        if c is None:
            continue
        factor = 1.0 / c if scaled.op_type == "Div" else c
        if not math.isclose(factor, 1.0 / math.sqrt(2.0), rel_tol=1e-3):
            continue
        add = _single_consumer(g, erf.output[0])
        if add is None or add.op_type != "Add":
            continue
        one = _const_scalar(g, _other(add, erf.output[0]) or "", const)
        if one is None or not math.isclose(one, 1.0, rel_tol=1e-6):
            continue
        chain = _gelu_tail(g, prod, x, add, const)
        if chain is None:
            continue
        last, used = chain
        new = helper.make_node("GeluErf", [x], [last.output[0]], name=erf.name or last.name, domain=FUSED_DOMAIN)
        g.replace([scaled, erf, add, *used], new, last)
        g.notes.append(f"Erf pattern at {node_label(erf)!r} read as GELU of {x!r}")
        g.index()
        prod = g.producer_map()


def _gelu_tail(g: OnnxGraph, prod: Mapping[str, Any], x: str, add: Any, const: set[str]) -> tuple[Any, list[Any]] | None:
    """The two products after ``1 + erf``: ``(x * (1+erf)) * 0.5`` or ``(0.5 x) * (1+erf)``."""
    mul = _single_consumer(g, add.output[0])
    if mul is None or mul.op_type != "Mul":
        return None
    other = _other(mul, add.output[0])
    if other == x:
        half = _single_consumer(g, mul.output[0])
        if half is None or half.op_type != "Mul":
            return None
        c = _const_scalar(g, _other(half, mul.output[0]) or "", const)
        if c is None or not math.isclose(c, 0.5, rel_tol=1e-6):
            return None
        return half, [mul, half]
    hx = prod.get(other or "")
    if hx is None or hx.op_type != "Mul" or _other(hx, x) is None or _single_consumer(g, hx.output[0]) is not mul:
        return None
    c = _const_scalar(g, _other(hx, x) or "", const)
    if c is None or not math.isclose(c, 0.5, rel_tol=1e-6):
        return None
    return mul, [hx, mul]


def _fuse_silu(g: OnnxGraph) -> None:
    """``x * sigmoid(x)`` -> one SiLU."""
    from onnx import helper

    prod = g.producer_map()
    for mul in list(g.nodes):
        if mul.op_type != "Mul" or len([i for i in mul.input if i]) != 2:
            continue
        for s_name, x in ((mul.input[0], mul.input[1]), (mul.input[1], mul.input[0])):
            sig = prod.get(s_name)
            if sig is None or sig.op_type != "Sigmoid" or sig.input[0] != x:
                continue
            if _single_consumer(g, s_name) is not mul:
                continue
            new = helper.make_node("SiLU", [x], [mul.output[0]], name=mul.name or sig.name, domain=FUSED_DOMAIN)
            g.replace([sig, mul], new, mul)
            g.notes.append(f"x * Sigmoid(x) at {node_label(mul)!r} read as SiLU of {x!r}")
            g.index()
            prod = g.producer_map()
            break


def _fuse_div_sqrt(g: OnnxGraph, const: set[str]) -> None:
    """``a / sqrt(b)`` -> ``a * invsqrt(b)`` (one approximation instead of two)."""
    from onnx import helper

    prod = g.producer_map()
    for div in list(g.nodes):
        if div.op_type != "Div" or len(div.input) != 2 or div.input[1] in const:
            continue
        sq = prod.get(div.input[1])
        if sq is None or sq.op_type != "Sqrt" or _single_consumer(g, div.input[1]) is not div:
            continue
        inv_name = f"{div.input[1]}.invsqrt"
        inv = helper.make_node("InvSqrt", [sq.input[0]], [inv_name], name=sq.name, domain=FUSED_DOMAIN)
        mul = helper.make_node("Mul", [div.input[0], inv_name], [div.output[0]], name=div.name)
        g.replace([sq], [inv, mul], div)
        g.notes.append(f"Div by Sqrt at {node_label(div)!r} read as a product with an inverse square root")
        g.index()
        prod = g.producer_map()


# --------------------------------------------------------------------------------------
# Float runs (calibration)
# --------------------------------------------------------------------------------------


def calibration_samples(g: OnnxGraph, data: Mapping[str, Array], where: str) -> list[dict[str, Array]]:
    """Split ``data`` (arrays named as the model's inputs) into single samples: stacked along
    the input's batch dimension when its first dimension is 1, else along a new leading
    dimension."""
    counts: dict[str, int] = {}
    split: dict[str, list[Array]] = {}
    for name, shape in g.inputs.items():
        if name not in data:
            raise ModelError(f"{where} has no array {name!r} (the model's inputs: {', '.join(g.inputs)})")
        arr = np.asarray(data[name])
        if arr.dtype.kind not in "biuf":
            raise ModelError(f"{where}: array {name!r} must hold real numbers, got dtype {arr.dtype}")
        size = math.prod(shape)
        if shape and shape[0] == 1:
            per = size
            count, rem = divmod(arr.size, per) if per else (0, 1)
            if rem or count == 0:
                raise ModelError(
                    f"{where}: array {name!r} of shape {arr.shape} is not a stack of samples of shape {shape} "
                    "along the batch dimension"
                )
            samples = list(arr.reshape((count, *shape)))
        else:
            if arr.ndim == len(shape):
                arr = arr[None]
            if arr.size == 0 or math.prod(arr.shape[1:]) != size:
                raise ModelError(
                    f"{where}: array {name!r} of shape {arr.shape} is not a stack of samples of shape {shape} "
                    "along a new leading dimension"
                )
            samples = [a.reshape(shape) for a in arr]
        if not all(np.all(np.isfinite(s)) for s in samples):
            raise ModelError(f"{where}: array {name!r} holds NaN or infinite values")
        counts[name] = len(samples)
        split[name] = [s.astype(g.input_dtypes.get(name, np.float32)) for s in samples]
    if len(set(counts.values())) > 1:
        text = ", ".join(f"{k}: {v}" for k, v in counts.items())
        raise ModelError(f"{where}: the inputs hold different numbers of samples ({text})")
    n = next(iter(counts.values()))
    return [{name: split[name][i] for name in split} for i in range(n)]


def run_float(model: Any, samples: list[dict[str, Array]], names: list[str]) -> tuple[dict[str, Array], str]:
    """Run ``model`` in float on every sample: the values of ``names`` stacked over the
    samples (leading axis), and what ran it: ONNX Runtime when it is installed and takes
    the model with every value as an output, else onnx's reference evaluator."""
    got = _run_onnxruntime(model, samples, names)
    if got is not None:
        import onnxruntime

        return got, f"onnxruntime {onnxruntime.__version__}"
    return _run_reference(model, samples, names), "onnx reference evaluator"


def _run_onnxruntime(model: Any, samples: list[dict[str, Array]], names: list[str]) -> dict[str, Array] | None:
    """None when ONNX Runtime is missing or cannot run this model (the caller falls back)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
        types = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input)}
        m = onnx.ModelProto()
        m.CopyFrom(model)
        have = {o.name for o in m.graph.output}
        for n in names:
            if n in have:
                continue
            if n not in types:
                return None  # a value of unknown type: ONNX Runtime needs one per output
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(types[n])
            m.graph.output.append(vi)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # values as the model states
        opts.log_severity_level = 3
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        got: dict[str, list[Array]] = {n: [] for n in names}
        for feed in samples:
            res = sess.run(names, feed)
            for n, v in zip(names, res, strict=True):
                got[n].append(np.asarray(v))
        return {n: np.stack(v) for n, v in got.items()}
    except Exception:  # ONNX Runtime refused the model or a run: the reference evaluator decides
        return None


def _run_reference(model: Any, samples: list[dict[str, Array]], names: list[str]) -> dict[str, Array]:
    from onnx.reference import ReferenceEvaluator

    try:
        ev = ReferenceEvaluator(model)
    except Exception as exc:
        raise ModelError(f"onnx's reference evaluator cannot load the model ({_short(exc)})") from None
    got: dict[str, list[Array]] = {n: [] for n in names}
    for i, feed in enumerate(samples):
        try:
            res = ev.run(names, feed)
        except Exception as exc:
            raise ModelError(f"running the model in float on calibration sample {i} failed ({_short(exc)})") from None
        for n, v in zip(names, res, strict=True):
            got[n].append(np.asarray(v))
    return {n: np.stack(v) for n, v in got.items()}
