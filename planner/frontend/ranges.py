"""Value ranges through a graph (interval arithmetic) and the scaling around bootstraps.

Bootstrapping only accepts values with ``|x| <= boot.max_abs`` (Lattigo's EvalMod
approximates x mod 1 for small values: larger ones decrypt to garbage without any error).
Before a bootstrap the plan multiplies a value by ``1/s`` and after it by ``s``, with ``s``
the smallest power of two such that the value's bound divided by ``s`` is within
``max_abs`` (a power of two keeps both multiplications exact in floating point).

The bound of every tensor comes from interval arithmetic from the graph's ``range``
fields (SPEC section 2):

* an input's ``range`` is what the user promises (or an importer measured); an input
  without one is *unknown*, and so is every value computed from it;
* a weight's values are only known at run time: its ``range`` when given, else the plan
  assumes ``DEFAULT_WEIGHT_RANGE``;
* a node may carry a ``range`` too (what an importer measured on calibration data): a
  promise intersected with the propagated interval (or taking its place when that is
  unknown or unbounded).

The plan records every range it assumed (``summary.bootstrapping.assumed_ranges``) and
``run`` checks the inputs, the weights and the reference values of the nodes against them
before trusting the result.

Rules (each sound for every value in the operands' intervals): ``matvec``/``matmul``:
``k * max|W| * max|x|`` for an inner dimension ``k``; ``conv2d``: ``(C/groups) * K1 * K2 *
max|w| * max|x|``; ``add``/``sub``/``mul``: interval sum, difference and product;
``poly``: the exact range of the polynomial over the interval (end points and real
critical points; a Chebyshev series in its own basis over its domain); ``sum`` over an
axis of length n: ``n`` times the interval (with or without ``keepdims``);
``transpose``/``reshape``/``slice``: unchanged; ``concat``: the hull of the operands'
intervals (a batched ``matmul`` and the broadcasting element-wise ops follow the rules
above: broadcasting repeats values, it does not change their range).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.errors import SlotplanError, ValuesError
from planner.frontend.graph import Graph, Node, load_graph
from planner.frontend.reference import poly_node_range

__all__ = [
    "CALIBRATION_MARGIN",
    "DEFAULT_WEIGHT_RANGE",
    "Interval",
    "RangeReport",
    "boot_scale",
    "calibrated_graph",
    "check_input_ranges",
    "check_values",
    "graph_ranges",
    "operand_bound",
]

Interval = tuple[float, float]
# Assumed for a weight that declares no range (checked by ``run`` against the real weights).
DEFAULT_WEIGHT_RANGE: Interval = (-1.0, 1.0)


def _abs(iv: Interval) -> float:
    return max(abs(iv[0]), abs(iv[1]))


def _sym(b: float) -> Interval:
    return (-b, b)


def _node_range(graph: Graph, node: Node, ops: list[Interval]) -> Interval:
    op = node.op
    if op in ("transpose", "reshape", "slice"):
        return ops[0]
    if op == "concat":
        return (min(o[0] for o in ops), max(o[1] for o in ops))
    if op == "add":
        return (ops[0][0] + ops[1][0], ops[0][1] + ops[1][1])
    if op == "sub":
        return (ops[0][0] - ops[1][1], ops[0][1] - ops[1][0])
    if op == "mul":
        ends = [a * b for a in ops[0] for b in ops[1]]
        return (min(ends), max(ends))
    if op == "poly":
        # the series in its own basis (a Chebyshev series is not read as monomial coefficients)
        return poly_node_range(node, ops[0][0], ops[0][1])
    if op == "sum":
        assert node.axis is not None
        n = graph.shape(node.inputs[0])[node.axis]
        return (n * ops[0][0], n * ops[0][1])
    if op == "matvec":
        k = graph.shape(node.inputs[0])[-1]
        return _sym(k * _abs(ops[0]) * _abs(ops[1]))
    if op == "matmul":
        k = graph.shape(node.inputs[0])[-1]
        return _sym(k * _abs(ops[0]) * _abs(ops[1]))
    if op == "conv2d":
        w = graph.shape(node.inputs[1])
        fan_in = w[1] * w[2] * w[3]
        return _sym(fan_in * _abs(ops[0]) * _abs(ops[1]))
    raise SlotplanError(f"node {node.id!r}: no range rule for op {op!r}")


@dataclass(frozen=True)
class RangeReport:
    """Every tensor's interval (None: unknown), the ranges assumed for declared tensors,
    and for an unknown tensor the declared input it depends on that has no range."""

    ranges: Mapping[str, Interval | None]
    assumed: Mapping[str, Interval]
    unknown_source: Mapping[str, str]

    def bound(self, name: str) -> float | None:
        iv = self.ranges.get(name)
        return None if iv is None else _abs(iv)


def graph_ranges(graph: Graph, weights: Mapping[str, Interval] | None = None) -> RangeReport:
    """Interval of every tensor of ``graph``.  ``weights`` overrides the declared (or
    assumed) range of weight tensors (``run`` passes the actual weights' ranges)."""
    ranges: dict[str, Interval | None] = {}
    assumed: dict[str, Interval] = {}
    unknown: dict[str, str] = {}
    for name in graph.inputs:
        r = graph.tensor(name).range
        ranges[name] = r
        if r is None:
            unknown[name] = name
        else:
            assumed[name] = r
    for name in graph.weights:
        r = weights[name] if weights is not None and name in weights else graph.tensor(name).range
        r = r if r is not None else DEFAULT_WEIGHT_RANGE
        ranges[name] = r
        assumed[name] = r
    for node in graph.nodes:
        promised = graph.tensor(node.id).range
        if promised is not None:
            assumed[node.id] = promised
        ops = [ranges[t] for t in node.inputs]
        iv: Interval | None = None
        if all(o is not None for o in ops):
            iv = _node_range(graph, node, [o for o in ops if o is not None])
            if not (math.isfinite(iv[0]) and math.isfinite(iv[1])):
                iv = None
        if promised is not None:
            # the promise (checked at run time) and the sound bound both hold: intersect
            if iv is not None and max(iv[0], promised[0]) <= min(iv[1], promised[1]):
                iv = (max(iv[0], promised[0]), min(iv[1], promised[1]))
            else:
                iv = promised
        ranges[node.id] = iv
        if iv is None:
            src = next((unknown[t] for t, o in zip(node.inputs, ops, strict=True) if o is None), node.id)
            unknown[node.id] = src
    return RangeReport(ranges, assumed, unknown)


def boot_scale(bound: float, max_abs: float) -> int:
    """The smallest power of two ``s`` with ``bound / s <= max_abs`` (1 when it fits)."""
    if bound <= max_abs:
        return 1
    return 1 << max(0, math.ceil(math.log2(bound / max_abs)))


def check_values(
    assumed: Mapping[str, Interval], values: Mapping[str, np.ndarray], what: str = "the plan's bootstrap scaling"
) -> None:
    """Refuse inputs or weights outside the ranges a plan assumed (``run``, before executing)."""
    for name, (lo, hi) in sorted(assumed.items()):
        if name not in values:
            continue
        v = np.asarray(values[name], dtype=np.float64)
        if v.size == 0:
            continue
        vmin, vmax = float(v.min()), float(v.max())
        if vmin < lo or vmax > hi:
            raise ValuesError(
                f"values in [{vmin:.6g}, {vmax:.6g}], outside the range [{lo:g}, {hi:g}] {what} assumes; "
                "give the tensor a `range` in the graph that holds its values and plan again",
                tensor=name,
            )


def _fmt_index(shape: tuple[int, ...], flat: int) -> str:
    idx = np.unravel_index(flat, shape) if shape else ()
    return "[" + ", ".join(str(int(i)) for i in idx) + "]"


def _nanmin(v: np.ndarray) -> float:
    finite = v[~np.isnan(v)]
    return float(finite.min()) if finite.size else math.nan


def _nanmax(v: np.ndarray) -> float:
    finite = v[~np.isnan(v)]
    return float(finite.max()) if finite.size else math.nan


def check_input_ranges(graph: Graph, inputs: Mapping[str, np.ndarray]) -> None:
    """Refuse an input outside its tensor's declared ``range`` (SPEC section 9): ``run``,
    ``encrypt`` and the REST evaluation call this before packing anything.

    ``inputs`` maps input tensor names to arrays of any shape holding the tensor's number of
    elements, or ``N`` times that (a leading sample dimension: the first index reported is
    then ``[sample, ...]`` within the declared shape).  Names that are not inputs of
    ``graph`` or tensors without a ``range`` are not checked (other functions check
    presence and shapes); NaN is outside every range.

    Raises :class:`ValuesError` with one line naming the tensor, its declared range and the
    offending values: their min/max, how many are outside and the first one's index."""
    for name in graph.inputs:
        declared = graph.tensor(name).range
        if declared is None or name not in inputs:
            continue
        lo, hi = float(declared[0]), float(declared[1])
        arr = np.asarray(inputs[name])
        if arr.dtype.kind not in "biuf":
            raise ValuesError(f"values of dtype {arr.dtype} are not real numbers", tensor=name)
        v = arr.astype(np.float64, copy=False).ravel()
        shape = tuple(int(d) for d in graph.shape(name))
        numel = int(np.prod(shape)) if shape else 1
        if v.size == 0:
            continue
        if v.size % numel:
            raise ValuesError(
                f"{v.size} values are not a multiple of the tensor's {numel} elements {list(shape)}", tensor=name)
        bad = ~((v >= lo) & (v <= hi))  # NaN is outside
        count = int(np.count_nonzero(bad))
        if not count:
            continue
        first = int(np.argmax(bad))
        where = _fmt_index(shape, first % numel)
        if v.size > numel:
            where = f"sample {first // numel} index {where}"
        else:
            where = f"index {where}"
        raise ValuesError(
            f"input outside its declared range [{lo:g}, {hi:g}]: values in [{_nanmin(v):.6g}, {_nanmax(v):.6g}], "
            f"{count} of {v.size} outside, the first at {where} = {float(v[first]):.6g}; "
            "scale the data into the range, or widen the tensor's range in the graph and plan again",
            tensor=name,
        )


def operand_bound(graph: Graph, node: Node, report: RangeReport) -> float | None:
    """The bound of a node's result from its operands' intervals alone (no promise of the
    node itself); for ``conv2d`` it also bounds every partial sum of its products (each is
    a sum over a subset of the same ``fan_in`` terms), which a CinS conv leaves in the
    padding cells it bootstraps.  None when an operand's interval is unknown."""
    ops = [report.ranges.get(t) for t in node.inputs]
    if any(o is None for o in ops):
        return None
    iv = _node_range(graph, node, [o for o in ops if o is not None])
    b = _abs(iv)
    return b if math.isfinite(b) else None


# Measured node ranges are widened by this factor of their largest |value| on each side:
# data outside the calibration samples (``run`` refuses values outside a promised range)
# rarely goes 50% beyond what eight samples of the same distribution reached.
CALIBRATION_MARGIN = 1.5


def calibrated_graph(
    graph: Graph, weights: Mapping[str, np.ndarray], samples: Sequence[Mapping[str, np.ndarray]],
    margin: float = CALIBRATION_MARGIN,
) -> Graph:
    """``graph`` with measured ranges, as an importer calibrates (the bootstrap scaling of
    a deep net from interval arithmetic alone is sound but loose: LeNet-5's bound for its
    bootstrapped activation is ~1e12 against values of order 1, leaving none of the
    bootstrap's ~21 bits).

    * each weight's ``range`` is the exact hull of its values (the model is known when it
      is planned);
    * each node's ``range`` is the hull of its values over the numpy reference of every
      input sample in ``samples`` (with ``weights``), widened by ``margin - 1`` times its
      largest |value| on each side. ``run`` checks the promise on its own data.
    Inputs keep their declared ranges."""
    from planner.frontend.reference import reference

    if not samples:
        raise ValueError("calibrated_graph needs at least one input sample")
    doc: dict[str, Any] = graph.to_json()
    tensors: dict[str, Any] = dict(doc["tensors"])
    for name in graph.weights:
        w = np.asarray(weights[name], dtype=np.float64)
        tensors[name] = {**tensors[name], "range": [float(w.min()), float(w.max())]}
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for feed in samples:
        got = reference(graph, {**weights, **{t: feed[t] for t in graph.inputs}})
        for node in graph.nodes:
            v = np.asarray(got[node.id], dtype=np.float64)
            lo[node.id] = min(lo.get(node.id, math.inf), float(v.min()))
            hi[node.id] = max(hi.get(node.id, -math.inf), float(v.max()))
    nodes = []
    for n in doc["nodes"]:
        a, b = lo[n["id"]], hi[n["id"]]
        pad = (margin - 1.0) * max(abs(a), abs(b))
        nodes.append({**n, "range": [a - pad, b + pad]})
    return load_graph({**doc, "tensors": tensors, "nodes": nodes})
