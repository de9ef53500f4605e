"""Tensor graphs: the ``slotplan.graph/1`` JSON file (SPEC section 2) and its validated form.

Two layers:

* :class:`GraphFile` (with :class:`TensorLiteral`, :class:`NodeLiteral`) is the *literal*
  pydantic model of the JSON: it checks types and field names only.
* :class:`Graph` is the validated, immutable graph every other module uses: nodes in a
  deterministic topological order, every tensor's shape and whether it is encrypted,
  op attributes normalised with defaults filled, and a content hash (``sha256``).

:func:`load_graph` / :func:`parse_graph` go from JSON to :class:`Graph`. Any problem with
the input is a :class:`~common.errors.GraphError` that names the node (or tensor), the
field and the rule broken - never a raw traceback, never a pydantic ``ValidationError``.

Decisions where SPEC is silent (tested in ``tests/planner/frontend/test_graph.py``):

* ``sum`` over the only axis of a rank-1 tensor gives shape ``(1,)`` (rank-0 tensors do not
  exist in slotplan: every tensor has rank 1..MAX_RANK).
* ``sum`` needs ``axis`` (negative allowed, normalised to ``0..rank-1``); ``keepdims`` false
  is the default and is omitted from the canonical form (as ``basis: "monomial"`` of
  ``poly``), so graphs written before these fields keep their hash.
* ``slice`` bounds follow Python's: negative ``start``/``stop`` count from the end, bounds
  past the axis are clamped, and the canonical form holds ``0 <= start < stop <= dim``; an
  empty slice is refused.  ``concat`` takes 1..MAX_CONCAT_INPUTS operands.
* ``add``/``sub``/``mul`` broadcast as numpy (both operands may stretch); ``matmul`` takes
  operands of rank 2..4 whose batch dimensions broadcast as ``np.matmul``'s.
* ``transpose``
  defaults ``perm`` to the reversed axes; ``reshape`` allows one ``-1`` which is resolved,
  so the validated/canonical form never contains ``-1``.
* ``outputs`` must name node results (not declared inputs/weights), be non-empty and
  have no duplicates.
* A declared tensor that no node uses, or a node that does not contribute to any output,
  is *not* rejected: it is reported in :attr:`Graph.warnings`.
* A node whose operands are all weights is a plaintext node (``encrypted`` False); allowed.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)
from pydantic_core import ErrorDetails

from common.errors import GraphError

__all__ = [
    "ARITY",
    "MAX_CONCAT_INPUTS",
    "MAX_ELEMENTS",
    "MAX_GRAPH_FILE_BYTES",
    "MAX_NODES",
    "MAX_POLY_COEFFS",
    "MAX_POLY_COEFF_ABS",
    "MAX_RANK",
    "OPS",
    "SCHEMA",
    "Graph",
    "GraphFile",
    "Node",
    "NodeLiteral",
    "OpName",
    "Role",
    "TensorInfo",
    "TensorLiteral",
    "broadcast_shapes",
    "load_graph",
    "matmul_batch",
    "parse_graph",
]

SCHEMA = "slotplan.graph/1"

# --- "absurd size" limits -------------------------------------------------------------
# 2**28 elements: the numpy reference needs 2 GiB of float64 for one such tensor, and at
# N = 2^16 (32768 slots) it already fills 8192 ciphertexts (~0.4 TB at full level); no plan
# for anything larger is useful, and rejecting early keeps the planner and the reference
# from exhausting memory on a typo such as an extra zero in a dimension.
MAX_ELEMENTS = 2**28
# Rank 6: covers every tensor the ops need (conv2d weights are rank 4) with room for
# reshaped views; layout search enumerates per-axis choices, so rank must stay small.
MAX_RANK = 6
# 100k nodes: far beyond real networks (ResNet-50 has ~200 layers), bounds planning time.
MAX_NODES = 100_000
# A polynomial with more than 4096 coefficients needs >= 12 levels just for its powers and
# thousands of ciphertext multiplications per ciphertext; treated as a mistake.
MAX_POLY_COEFFS = 4096
# Graph files describe shapes only; 64 MiB of JSON is far past any real graph.
MAX_GRAPH_FILE_BYTES = 64 * 2**20
# Largest |coefficient| of a poly node: CKKS encodes a constant as round(c * scale), which
# must stay far below q0 (2^60 at most) at the presets' 2^40+ scales; 2^20 leaves room.
MAX_POLY_COEFF_ABS = 2.0**20
# Names of graphs, tensors and nodes.
MAX_NAME_LENGTH = 256

OpName = Literal[
    "matvec", "matmul", "conv2d", "add", "sub", "mul", "poly", "sum", "transpose", "reshape", "slice", "concat"
]
Role = Literal["input", "weight", "node"]

OPS: tuple[OpName, ...] = (
    "matvec",
    "matmul",
    "conv2d",
    "add",
    "sub",
    "mul",
    "poly",
    "sum",
    "transpose",
    "reshape",
    "slice",
    "concat",
)

ARITY: Mapping[str, int] = MappingProxyType(
    {
        "matvec": 2,
        "matmul": 2,
        "conv2d": 2,
        "add": 2,
        "sub": 2,
        "mul": 2,
        "poly": 1,
        "sum": 1,
        "transpose": 1,
        "reshape": 1,
        "slice": 1,
        "concat": -1,  # variadic: one or more operands
    }
)

# Operand names used in error messages.
_OPERANDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "matvec": ("W", "x"),
        "matmul": ("A", "B"),
        "conv2d": ("x", "w"),
        "add": ("a", "b"),
        "sub": ("a", "b"),
        "mul": ("a", "b"),
        "poly": ("x",),
        "sum": ("x",),
        "transpose": ("x",),
        "reshape": ("x",),
        "slice": ("x",),
        "concat": ("x1", "x2", "..."),
    }
)

ATTRIBUTES: tuple[str, ...] = (
    "stride", "padding", "groups", "coeffs", "basis", "domain", "axis", "keepdims", "start", "stop", "perm", "shape"
)
# Largest number of operands of a concat (a model concatenates heads or branches, not more).
MAX_CONCAT_INPUTS = 1024

# Attributes each op accepts, and those it requires.
_ALLOWED_ATTRS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "conv2d": frozenset({"stride", "padding", "groups"}),
        "poly": frozenset({"coeffs", "basis", "domain"}),
        "sum": frozenset({"axis", "keepdims"}),
        "transpose": frozenset({"perm"}),
        "reshape": frozenset({"shape"}),
        "slice": frozenset({"axis", "start", "stop"}),
        "concat": frozenset({"axis"}),
    }
)
_REQUIRED_ATTRS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "poly": frozenset({"coeffs"}),
        "sum": frozenset({"axis"}),
        "reshape": frozenset({"shape"}),
        "slice": frozenset({"axis", "start", "stop"}),
        "concat": frozenset({"axis"}),
    }
)


# --------------------------------------------------------------------------------------
# Literal (unchecked) JSON form
# --------------------------------------------------------------------------------------


class TensorLiteral(BaseModel):
    """A declared tensor as written in the file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shape: list[StrictInt]
    role: Literal["input", "weight"]
    range: list[StrictFloat] | None = None


class NodeLiteral(BaseModel):
    """A node as written in the file (attributes not yet checked against the op)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: StrictStr
    op: StrictStr
    inputs: list[StrictStr]
    stride: list[StrictInt] | None = None
    padding: list[StrictInt] | None = None
    groups: StrictInt | None = None
    coeffs: list[StrictFloat] | None = None
    basis: Literal["monomial", "chebyshev"] | None = None
    domain: list[StrictFloat] | None = None
    axis: StrictInt | None = None
    keepdims: StrictBool | None = None
    start: StrictInt | None = None
    stop: StrictInt | None = None
    perm: list[StrictInt] | None = None
    shape: list[StrictInt] | None = None
    range: list[StrictFloat] | None = None


class GraphFile(BaseModel):
    """The ``slotplan.graph/1`` file, literally (types and field names checked only)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: Literal["slotplan.graph/1"] = Field(alias="schema")
    name: StrictStr
    tensors: dict[StrictStr, TensorLiteral]
    nodes: list[NodeLiteral]
    outputs: list[StrictStr]


_TOP_FIELDS = ("schema", "name", "tensors", "nodes", "outputs")
_TENSOR_FIELDS = ("shape", "role", "range")
_NODE_FIELDS = ("id", "op", "inputs", *ATTRIBUTES, "range")


# --------------------------------------------------------------------------------------
# Validated form
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorInfo:
    """A tensor of the validated graph: a declared input/weight or a node result."""

    name: str
    shape: tuple[int, ...]
    role: Role
    encrypted: bool
    # [lo, hi]: the values the user promises (or an importer measured) for this tensor;
    # planning uses it to keep bootstrap inputs within ``boot.max_abs`` (None: unknown)
    range: tuple[float, float] | None = None

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class Node:
    """A validated node. Only the attributes meaningful for ``op`` are set (others None);
    defaults are filled (conv2d stride/padding/groups, transpose perm) and values are
    normalised (sum axis >= 0, reshape shape without -1)."""

    id: str
    op: OpName
    inputs: tuple[str, ...]
    stride: tuple[int, int] | None = None
    padding: tuple[int, int] | None = None
    groups: int | None = None
    coeffs: tuple[float, ...] | None = None
    # poly: "chebyshev" with its domain (a, b); None is the monomial basis (the canonical
    # form omits the default, so graphs written before these fields keep their hash)
    basis: Literal["chebyshev"] | None = None
    domain: tuple[float, float] | None = None
    axis: int | None = None
    keepdims: bool | None = None  # sum: True only (False is the default, omitted)
    start: int | None = None  # slice: 0 <= start < stop <= dim (normalised)
    stop: int | None = None
    perm: tuple[int, ...] | None = None
    shape: tuple[int, ...] | None = None

    @property
    def attrs(self) -> dict[str, int | bool | str | list[int] | list[float]]:
        """The op's attributes (JSON form, defaults filled)."""
        out: dict[str, int | bool | str | list[int] | list[float]] = {}
        if self.stride is not None:
            out["stride"] = list(self.stride)
        if self.padding is not None:
            out["padding"] = list(self.padding)
        if self.groups is not None:
            out["groups"] = self.groups
        if self.coeffs is not None:
            out["coeffs"] = [float(c) for c in self.coeffs]
        if self.basis is not None:
            out["basis"] = self.basis
        if self.domain is not None:
            out["domain"] = [float(v) for v in self.domain]
        if self.axis is not None:
            out["axis"] = self.axis
        if self.keepdims:
            out["keepdims"] = True
        if self.start is not None:
            out["start"] = self.start
        if self.stop is not None:
            out["stop"] = self.stop
        if self.perm is not None:
            out["perm"] = list(self.perm)
        if self.shape is not None:
            out["shape"] = list(self.shape)
        return out

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "op": self.op, "inputs": list(self.inputs), **self.attrs}


@dataclass(frozen=True, eq=False)
class Graph:
    """A validated tensor graph (immutable).

    ``tensors`` holds declared tensors (file order) then node results (topological order).
    ``nodes`` are in a deterministic topological order: among nodes whose operands are
    ready, the one earliest in the file comes first. Equality and hash use ``sha256``.
    """

    name: str
    tensors: Mapping[str, TensorInfo]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    sha256: str = field(init=False)
    _node_by_id: Mapping[str, Node] = field(init=False, repr=False)
    _consumers: Mapping[str, tuple[Node, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensors", MappingProxyType(dict(self.tensors)))
        object.__setattr__(self, "_node_by_id", MappingProxyType({n.id: n for n in self.nodes}))
        consumers: dict[str, list[Node]] = {name: [] for name in self.tensors}
        for n in self.nodes:
            for name in dict.fromkeys(n.inputs):  # a node using x twice consumes it once
                consumers.setdefault(name, []).append(n)
        object.__setattr__(self, "_consumers", MappingProxyType({k: tuple(v) for k, v in consumers.items()}))
        object.__setattr__(self, "sha256", hashlib.sha256(canonical_json(self.to_json())).hexdigest())

    # -- lookups ------------------------------------------------------------------------
    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"graph {self.name!r} has no tensor {name!r}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of a declared tensor or node result."""
        return self.tensor(name).shape

    def encrypted(self, name: str) -> bool:
        return self.tensor(name).encrypted

    def node(self, node_id: str) -> Node:
        try:
            return self._node_by_id[node_id]
        except KeyError:
            raise KeyError(f"graph {self.name!r} has no node {node_id!r}") from None

    def producer(self, name: str) -> Node | None:
        """The node computing ``name``, or None for a declared input/weight."""
        return self._node_by_id.get(name)

    def consumers(self, name: str) -> tuple[Node, ...]:
        """Nodes that use ``name`` as an operand, in topological order."""
        if name not in self.tensors:
            raise KeyError(f"graph {self.name!r} has no tensor {name!r}")
        return self._consumers.get(name, ())

    @property
    def inputs(self) -> tuple[str, ...]:
        """Declared encrypted inputs (file order)."""
        return tuple(t.name for t in self.tensors.values() if t.role == "input")

    @property
    def weights(self) -> tuple[str, ...]:
        """Declared plaintext weights (file order)."""
        return tuple(t.name for t in self.tensors.values() if t.role == "weight")

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    # -- identity -----------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return self.sha256 == other.sha256

    def __hash__(self) -> int:
        return hash(self.sha256)

    def to_json(self) -> dict[str, object]:
        """Canonical JSON form (defaults filled, nodes in topological order). Loading it
        again gives an equal graph; ``sha256`` is the hash of its canonical serialisation."""
        return {
            "schema": SCHEMA,
            "name": self.name,
            "tensors": {t.name: _tensor_json(t) for t in self.tensors.values() if t.role != "node"},
            "nodes": [_node_json(n, self.tensors[n.id]) for n in self.nodes],
            "outputs": list(self.outputs),
        }


def _node_json(n: Node, t: TensorInfo) -> dict[str, object]:
    out = n.to_json()
    if t.range is not None:  # a node result's promised (or measured) range
        out["range"] = [float(t.range[0]), float(t.range[1])]
    return out


def _tensor_json(t: TensorInfo) -> dict[str, object]:
    out: dict[str, object] = {"shape": list(t.shape), "role": t.role}
    if t.range is not None:  # only when given: graphs without ranges keep their hash
        out["range"] = [float(t.range[0]), float(t.range[1])]
    return out


def canonical_json(obj: object) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the bytes that ``Graph.sha256`` hashes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------


def load_graph(src: str | Path | Mapping[str, object]) -> Graph:
    """Load and validate a graph from a JSON file path, a JSON text (a string starting
    with ``{``) or an already-decoded dict. Raises :class:`GraphError` on any problem."""
    if isinstance(src, Mapping):
        return parse_graph(src)
    if isinstance(src, str) and src.lstrip().startswith("{"):
        return parse_graph(_decode_json(src, "graph JSON"))
    if not isinstance(src, str | Path):
        raise GraphError(f"graph source must be a path, JSON text or dict, got {type(src).__name__}")
    path = Path(src)
    try:
        size = path.stat().st_size
        if size > MAX_GRAPH_FILE_BYTES:
            raise GraphError(
                f"graph file {str(path)!r} is {size} bytes, over the limit of {MAX_GRAPH_FILE_BYTES} bytes"
            )
        text = path.read_text(encoding="utf-8")
    except GraphError:
        raise
    except UnicodeDecodeError as exc:
        raise GraphError(f"graph file {str(path)!r} is not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise GraphError(f"cannot read graph file {str(path)!r}: {exc.strerror or exc}") from None
    return parse_graph(_decode_json(text, f"graph file {str(path)!r}"))


def reject_duplicate_keys(pairs: list[tuple[str, Any]], error: type[Exception] = GraphError) -> dict[str, Any]:
    """``json.loads(object_pairs_hook=...)``: refuse an object that repeats a key (the CLI
    and REST read graphs and requests alike)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise error(f"duplicate key {key!r} in a JSON object (JSON keys must be unique)")
        out[key] = value
    return out


def _decode_json(text: str, what: str) -> Mapping[str, object]:
    try:
        obj: object = json.loads(text, object_pairs_hook=reject_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise GraphError(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise GraphError(f"{what} is nested too deeply") from None
    if not isinstance(obj, dict):
        raise GraphError(f"a graph must be a JSON object, got {_json_type(obj)}")
    return cast(dict[str, object], obj)


def parse_graph(raw: Mapping[str, object]) -> Graph:
    """Validate a decoded ``slotplan.graph/1`` document. Raises :class:`GraphError`."""
    if not isinstance(raw, Mapping):
        raise GraphError(f"a graph must be a JSON object, got {_json_type(raw)}")
    try:
        literal = GraphFile.model_validate(dict(raw))
    except ValidationError as exc:
        raise _graph_error_from_pydantic(exc, raw) from None
    return _Builder(literal).build()


# --------------------------------------------------------------------------------------
# pydantic ValidationError -> GraphError
# --------------------------------------------------------------------------------------


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _path(loc: Sequence[int | str]) -> str | None:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or None


def _graph_error_from_pydantic(exc: ValidationError, raw: Mapping[str, object]) -> GraphError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = list(first["loc"])
    node: str | None = None
    tensor: str | None = None
    rest: list[int | str] = loc
    allowed: tuple[str, ...] = _TOP_FIELDS
    if len(loc) >= 2 and loc[0] == "nodes" and isinstance(loc[1], int):
        index = loc[1]
        allowed = _NODE_FIELDS
        nodes = raw.get("nodes")
        node_id: object = None
        if isinstance(nodes, list | tuple) and index < len(nodes) and isinstance(nodes[index], Mapping):
            node_id = cast(Mapping[str, object], nodes[index]).get("id")
        if isinstance(node_id, str) and node_id:
            node, rest = node_id, loc[2:]
        else:
            rest = loc
    elif len(loc) >= 2 and loc[0] == "tensors" and isinstance(loc[1], str):
        allowed = _TENSOR_FIELDS
        tensor, rest = loc[1], loc[2:]
    rule = _rule_for(first, allowed, is_dim=tensor is not None and rest[:1] == ["shape"])
    if len(errors) > 1:
        rule += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return GraphError(rule, node=node, tensor=tensor, field=_path(rest))


def _rule_for(err: ErrorDetails, allowed: tuple[str, ...], *, is_dim: bool) -> str:
    kind = err["type"]
    value = err.get("input")
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return f"unknown field (allowed: {', '.join(allowed)})"
    if kind == "int_type":
        if is_dim:
            return f"dims must be positive integers, got {_short(value)}"
        return f"must be an integer, got {_short(value)}"
    if kind == "float_type":
        return f"must be a number, got {_short(value)}"
    if kind == "string_type":
        return f"must be a string, got {_json_type(value)}"
    if kind == "list_type":
        return f"must be a list, got {_json_type(value)}"
    if kind in ("dict_type", "model_type"):
        return f"must be an object, got {_json_type(value)}"
    if kind == "literal_error":
        ctx = err.get("ctx") or {}
        return f"must be {ctx.get('expected', 'one of the allowed values')}, got {_short(value)}"
    return str(err["msg"])


# --------------------------------------------------------------------------------------
# Semantic validation
# --------------------------------------------------------------------------------------


def _fmt_shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _check_name(name: str, what: str, *, node: str | None = None, tensor: str | None = None) -> None:
    field_name = "id" if node is not None else None
    if not name or not name.strip():
        raise GraphError(f"{what} must be a non-empty string", node=node, tensor=tensor, field=field_name)
    if len(name) > MAX_NAME_LENGTH:
        raise GraphError(
            f"{what} is {len(name)} characters long, over the limit of {MAX_NAME_LENGTH}",
            node=node,
            tensor=tensor,
            field=field_name,
        )
    if not name.isprintable():
        raise GraphError(
            f"{what} must not contain control characters", node=node, tensor=tensor, field=field_name
        )


def _check_size(shape: tuple[int, ...], *, node: str | None, tensor: str | None, field_name: str) -> None:
    if len(shape) > MAX_RANK:
        raise GraphError(
            f"rank {len(shape)} of shape {_fmt_shape(shape)} exceeds the limit MAX_RANK = {MAX_RANK}",
            node=node,
            tensor=tensor,
            field=field_name,
        )
    size = math.prod(shape)
    if size > MAX_ELEMENTS:
        raise GraphError(
            f"absurd size: shape {_fmt_shape(shape)} has {size} elements, over the limit "
            f"MAX_ELEMENTS = 2**28 = {MAX_ELEMENTS}",
            node=node,
            tensor=tensor,
            field=field_name,
        )


def _check_range(name: str, value: Sequence[float] | None, node: bool = False) -> tuple[float, float] | None:
    """A tensor's (or node result's) ``range`` [lo, hi]: two finite numbers with lo <= hi."""
    if value is None:
        return None
    where: dict[str, str] = {"node": name} if node else {"tensor": name}
    if len(value) != 2:
        raise GraphError(f"range must be [lo, hi] (two numbers), got {len(value)} numbers", field="range", **where)
    lo, hi = float(value[0]), float(value[1])
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise GraphError(f"range bounds must be finite, got [{lo}, {hi}]", field="range", **where)
    if lo > hi:
        raise GraphError(f"range must have lo <= hi, got [{lo}, {hi}]", field="range", **where)
    return (lo, hi)


class _Builder:
    def __init__(self, literal: GraphFile) -> None:
        self.lit = literal
        self.tensors: dict[str, TensorInfo] = {}
        self.node_index: dict[str, int] = {}

    def build(self) -> Graph:
        lit = self.lit
        _check_name(lit.name, "graph name")
        self._declared_tensors()
        self._node_headers()
        order = self._topological_order()
        nodes = tuple(self._infer(lit.nodes[i]) for i in order)
        outputs = self._outputs()
        warnings = self._warnings(nodes, outputs)
        return Graph(name=lit.name, tensors=self.tensors, nodes=nodes, outputs=outputs, warnings=warnings)

    # -- declared tensors ---------------------------------------------------------------
    def _declared_tensors(self) -> None:
        for name, t in self.lit.tensors.items():
            _check_name(name, "tensor name", tensor=name)
            if not t.shape:
                raise GraphError(
                    f"shape must have rank 1..{MAX_RANK}, got [] (rank-0 tensors are not supported; use [1])",
                    tensor=name,
                    field="shape",
                )
            for i, d in enumerate(t.shape):
                if d <= 0:
                    raise GraphError(
                        f"dims must be positive integers, got {d}", tensor=name, field=f"shape[{i}]"
                    )
            shape = tuple(t.shape)
            _check_size(shape, node=None, tensor=name, field_name="shape")
            self.tensors[name] = TensorInfo(
                name, shape, t.role, encrypted=t.role == "input", range=_check_range(name, t.range)
            )

    # -- per-node checks that do not need shapes ------------------------------------------
    def _node_headers(self) -> None:
        nodes = self.lit.nodes
        if not nodes:
            raise GraphError("a graph needs at least one node, got an empty list", field="nodes")
        if len(nodes) > MAX_NODES:
            raise GraphError(
                f"absurd size: {len(nodes)} nodes, over the limit MAX_NODES = {MAX_NODES}", field="nodes"
            )
        for i, n in enumerate(nodes):
            _check_name(n.id, "node id", node=n.id or f"nodes[{i}]")
            if n.id in self.node_index:
                raise GraphError(
                    f"duplicate node id (nodes[{self.node_index[n.id]}] and nodes[{i}] are both {n.id!r})",
                    node=n.id,
                    field="id",
                )
            if n.id in self.lit.tensors:
                raise GraphError(
                    f"duplicate id: node id {n.id!r} is already a declared tensor name", node=n.id, field="id"
                )
            self.node_index[n.id] = i
        for n in nodes:
            if n.op not in ARITY:
                raise GraphError(f"unknown op {n.op!r} (known ops: {', '.join(OPS)})", node=n.id, field="op")
            allowed = _ALLOWED_ATTRS.get(n.op, frozenset())
            for attr in ATTRIBUTES:
                if getattr(n, attr) is not None and attr not in allowed:
                    allowed_text = ", ".join(a for a in ATTRIBUTES if a in allowed) or "none"
                    raise GraphError(
                        f"attribute {attr!r} is not allowed for op {n.op} (allowed attributes: {allowed_text})",
                        node=n.id,
                        field=attr,
                    )
            for attr in sorted(_REQUIRED_ATTRS.get(n.op, frozenset())):
                if getattr(n, attr) is None:
                    raise GraphError(f"op {n.op} requires attribute {attr!r}", node=n.id, field=attr)
            arity = ARITY[n.op]
            if arity < 0:
                if not 1 <= len(n.inputs) <= MAX_CONCAT_INPUTS:
                    raise GraphError(
                        f"{n.op} expects 1..{MAX_CONCAT_INPUTS} inputs, got {len(n.inputs)} (operands: x1, x2, ...)",
                        node=n.id,
                        field="inputs",
                    )
            elif len(n.inputs) != arity:
                operands = ", ".join(_OPERANDS[n.op])
                raise GraphError(
                    f"{n.op} expects {arity} input{'s' if arity > 1 else ''}, got {len(n.inputs)} "
                    f"(operands: {operands})",
                    node=n.id,
                    field="inputs",
                )
            for j, ref in enumerate(n.inputs):
                if ref not in self.tensors and ref not in self.node_index:
                    raise GraphError(
                        f"unknown tensor or node {ref!r} (not a declared tensor nor a node id)",
                        node=n.id,
                        field=f"inputs[{j}]",
                    )

    # -- topological order ----------------------------------------------------------------
    def _topological_order(self) -> list[int]:
        nodes = self.lit.nodes
        preds: list[list[int]] = []
        succs: list[list[int]] = [[] for _ in nodes]
        for i, n in enumerate(nodes):
            ps = list(dict.fromkeys(self.node_index[r] for r in n.inputs if r in self.node_index))
            preds.append(ps)
            for p in ps:
                succs[p].append(i)
        indegree = [len(p) for p in preds]
        ready = [i for i, d in enumerate(indegree) if d == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for s in succs[i]:
                indegree[s] -= 1
                if indegree[s] == 0:
                    heapq.heappush(ready, s)
        if len(order) == len(nodes):
            return order
        # Every unplaced node still waits for an unplaced producer: walking producers from
        # any unplaced node must revisit a node, and the revisited stretch is a cycle.
        placed = set(order)
        start = min(i for i in range(len(nodes)) if i not in placed)
        walk: list[int] = []
        seen: dict[int, int] = {}
        cur = start
        while cur not in seen:
            seen[cur] = len(walk)
            walk.append(cur)
            cur = next(p for p in preds[cur] if p not in placed)
        cycle = walk[seen[cur] :][::-1]  # data-flow order (producer before consumer)
        k = cycle.index(min(cycle))  # start at the node earliest in the file
        cycle = cycle[k:] + cycle[:k]
        names = [nodes[i].id for i in cycle]
        text = " -> ".join([*names, names[0]])
        raise GraphError(
            f"cycle: {text} (a node cannot depend on its own result)", node=names[0], field="inputs"
        )

    # -- shapes, attributes, encryption ---------------------------------------------------
    def _infer(self, n: NodeLiteral) -> Node:
        op = cast(OpName, n.op)
        operands = [self.tensors[r] for r in n.inputs]
        infer: Callable[[NodeLiteral, list[TensorInfo]], tuple[Node, tuple[int, ...]]] = _INFER[op]
        node, shape = infer(n, operands)
        _check_size(shape, node=n.id, tensor=None, field_name="inputs")
        encrypted = any(t.encrypted for t in operands)
        self.tensors[n.id] = TensorInfo(n.id, shape, "node", encrypted, range=_check_range(n.id, n.range, node=True))
        return node

    # -- outputs and warnings ----------------------------------------------------------------
    def _outputs(self) -> tuple[str, ...]:
        outs = self.lit.outputs
        if not outs:
            raise GraphError("a graph needs at least one output, got an empty list", field="outputs")
        seen: set[str] = set()
        for j, name in enumerate(outs):
            if name in seen:
                raise GraphError(f"duplicate output {name!r}", field=f"outputs[{j}]")
            seen.add(name)
            if name not in self.tensors:
                raise GraphError(f"unknown tensor {name!r} in outputs", field=f"outputs[{j}]")
            if name not in self.node_index:
                raise GraphError(
                    f"output {name!r} is a declared {self.tensors[name].role}, not a node result "
                    "(outputs must name nodes)",
                    field=f"outputs[{j}]",
                )
        return tuple(outs)

    def _warnings(self, nodes: tuple[Node, ...], outputs: tuple[str, ...]) -> tuple[str, ...]:
        used = {r for n in nodes for r in n.inputs}
        out: list[str] = []
        for name in self.lit.tensors:
            if name not in used:
                out.append(f"tensor {name!r}: declared {self.tensors[name].role} is never used")
        live = set(outputs)
        for n in reversed(nodes):
            if n.id in live:
                live.update(n.inputs)
        for n in nodes:
            if n.id not in live:
                out.append(f"node {n.id!r}: result does not contribute to any output")
        if not any(t.role == "input" for t in self.tensors.values()):
            out.append("graph has no encrypted input: every node is plaintext")
        return tuple(out)


# --------------------------------------------------------------------------------------
# Per-op shape inference
# --------------------------------------------------------------------------------------


def _need_rank(op: str, n: NodeLiteral, t: TensorInfo, role: str, rank: int, pattern: str, j: int) -> None:
    if t.rank != rank:
        raise GraphError(
            f"{op} expects {role} of rank {rank} {pattern}, got {t.name!r} with shape {_fmt_shape(t.shape)}",
            node=n.id,
            field=f"inputs[{j}]",
        )


def _infer_matvec(n: NodeLiteral, ops: list[TensorInfo]) -> tuple[Node, tuple[int, ...]]:
    w, x = ops
    _need_rank("matvec", n, w, "W", 2, "(n,k)", 0)
    _need_rank("matvec", n, x, "x", 1, "(k,)", 1)
    if w.shape[1] != x.shape[0]:
        raise GraphError(
            f"shape mismatch: matvec needs W (n,k) and x (k,), got W {w.name!r} {_fmt_shape(w.shape)} "
            f"and x {x.name!r} {_fmt_shape(x.shape)}",
            node=n.id,
            field="inputs",
        )
    return Node(n.id, "matvec", tuple(n.inputs)), (w.shape[0],)


def broadcast_shapes(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
    """numpy broadcasting of two shapes (trailing dimensions aligned, a dimension of 1
    stretches), or None when they do not broadcast."""
    out: list[int] = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(reversed(out))


def matmul_batch(a_shape: Sequence[int], b_shape: Sequence[int]) -> tuple[int, ...] | None:
    """The broadcast batch shape of ``np.matmul`` on operands of rank >= 2 (``()`` for two
    matrices), or None when the batch dimensions do not broadcast."""
    return broadcast_shapes(a_shape[:-2], b_shape[:-2])


def _infer_matmul(n: NodeLiteral, ops: list[TensorInfo]) -> tuple[Node, tuple[int, ...]]:
    a, b = ops
    for j, (t, role, pattern) in enumerate(((a, "A", "(..., m, k)"), (b, "B", "(..., k, n)"))):
        if not 2 <= t.rank <= 4:
            raise GraphError(
                f"matmul expects {role} of rank 2..4 {pattern}, got {t.name!r} with shape {_fmt_shape(t.shape)}",
                node=n.id,
                field=f"inputs[{j}]",
            )
    if a.shape[-1] != b.shape[-2]:
        raise GraphError(
            f"shape mismatch: matmul needs A (..., m, k) and B (..., k, n), got A {a.name!r} "
            f"{_fmt_shape(a.shape)} and B {b.name!r} {_fmt_shape(b.shape)}",
            node=n.id,
            field="inputs",
        )
    batch = matmul_batch(a.shape, b.shape)
    if batch is None:
        raise GraphError(
            f"shape mismatch: the batch dimensions of A {a.name!r} {_fmt_shape(a.shape)} and B {b.name!r} "
            f"{_fmt_shape(b.shape)} do not broadcast (equal, or 1, as np.matmul)",
            node=n.id,
            field="inputs",
        )
    return Node(n.id, "matmul", tuple(n.inputs)), (*batch, a.shape[-2], b.shape[-1])


def _pair(n: NodeLiteral, attr: str, value: list[int] | None, default: int, minimum: int) -> tuple[int, int]:
    if value is None:
        return (default, default)
    if len(value) != 2:
        raise GraphError(
            f"{attr} must have 2 entries [{attr[0]}1, {attr[0]}2], got {value}", node=n.id, field=attr
        )
    for i, v in enumerate(value):
        if v < minimum:
            raise GraphError(f"{attr} must be >= {minimum}, got {v}", node=n.id, field=f"{attr}[{i}]")
    return (value[0], value[1])


def _infer_conv2d(n: NodeLiteral, ops: list[TensorInfo]) -> tuple[Node, tuple[int, ...]]:
    x, w = ops
    _need_rank("conv2d", n, x, "x", 3, "(C,H,W)", 0)
    _need_rank("conv2d", n, w, "w", 4, "(Co,C/groups,K1,K2)", 1)
    stride = _pair(n, "stride", n.stride, 1, 1)
    padding = _pair(n, "padding", n.padding, 0, 0)
    groups = 1 if n.groups is None else n.groups
    if groups < 1:
        raise GraphError(f"groups must be >= 1, got {groups}", node=n.id, field="groups")
    c, h, wd = x.shape
    co, cg, k1, k2 = w.shape
    if c % groups:
        raise GraphError(
            f"groups {groups} does not divide the input channels C = {c} of {x.name!r} {_fmt_shape(x.shape)}",
            node=n.id,
            field="groups",
        )
    if cg != c // groups:
        raise GraphError(
            f"shape mismatch: conv2d weight must be (Co, C/groups = {c // groups}, K1, K2) for input "
            f"{x.name!r} {_fmt_shape(x.shape)} with groups {groups}, got {w.name!r} {_fmt_shape(w.shape)}",
            node=n.id,
            field="inputs",
        )
    if co % groups:
        raise GraphError(
            f"groups {groups} does not divide the output channels Co = {co} of weight {w.name!r} "
            f"{_fmt_shape(w.shape)}",
            node=n.id,
            field="groups",
        )
    hp, wp = h + 2 * padding[0], wd + 2 * padding[1]
    if k1 > hp or k2 > wp:
        raise GraphError(
            f"kernel {k1}x{k2} of {w.name!r} is larger than the padded input {hp}x{wp} "
            f"(H + 2*p1 = {h} + 2*{padding[0]}, W + 2*p2 = {wd} + 2*{padding[1]})",
            node=n.id,
            field="inputs",
        )
    padded = c * hp * wp
    if padded > MAX_ELEMENTS:
        raise GraphError(
            f"absurd size: the padded input ({c}, {hp}, {wp}) has {padded} elements, over the limit "
            f"MAX_ELEMENTS = {MAX_ELEMENTS}",
            node=n.id,
            field="padding",
        )
    ho = (hp - k1) // stride[0] + 1
    wo = (wp - k2) // stride[1] + 1
    node = Node(n.id, "conv2d", tuple(n.inputs), stride=stride, padding=padding, groups=groups)
    return node, (co, ho, wo)


def _infer_elementwise(n: NodeLiteral, ops: list[TensorInfo]) -> tuple[Node, tuple[int, ...]]:
    a, b = ops
    shape = broadcast_shapes(a.shape, b.shape)
    if shape is None:
        raise GraphError(
            f"shape mismatch: {n.op} broadcasts as numpy (trailing dimensions equal or 1), got {a.name!r} "
            f"{_fmt_shape(a.shape)} and {b.name!r} {_fmt_shape(b.shape)}",
            node=n.id,
            field="inputs",
        )
    return Node(n.id, cast(OpName, n.op), tuple(n.inputs)), shape


def _infer_poly(n: NodeLiteral, ops: list[TensorInfo]) -> tuple[Node, tuple[int, ...]]:
    coeffs = n.coeffs or []
    if not coeffs:
        raise GraphError("coeffs must be a non-empty list [c0, c1, ...]", node=n.id, field="coeffs")
    if len(coeffs) > MAX_POLY_COEFFS:
        raise GraphError(
            f"absurd size: {len(coeffs)} coefficients, over the limit MAX_POLY_COEFFS = {MAX_POLY_COEFFS}",
            node=n.id,
            field="coeffs",
        )
    for i, c in enumerate(coeffs):
        if not math.isfinite(c):
            raise GraphError(f"coefficients must be finite numbers, got {c}", node=n.id, field=f"coeffs[{i}]")
        if abs(c) > MAX_POLY_COEFF_ABS:
            raise GraphError(f"coefficients must satisfy |c| <= 2**20 = {MAX_POLY_COEFF_ABS:g}, got {c:g}",
                             node=n.id, field=f"coeffs[{i}]")
    basis = n.basis or "monomial"
    domain: tuple[float, float] | None = None
    if basis == "chebyshev":
        if n.domain is None:
            raise GraphError("basis 'chebyshev' requires domain [a, b]", node=n.id, field="domain")
        if len(n.domain) != 2:
            raise GraphError(f"domain must be [a, b], got {n.domain}", node=n.id, field="domain")
        lo, hi = float(n.domain[0]), float(n.domain[1])
        if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
            raise GraphError(f"domain [a, b] needs finite a < b, got [{lo:g}, {hi:g}]", node=n.id, field="domain")
        if max(abs(lo), abs(hi)) > MAX_POLY_COEFF_ABS:
            raise GraphError(f"domain bounds must satisfy |v| <= 2**20, got [{lo:g}, {hi:g}]",
                             node=n.id, field="domain")
        domain = (lo, hi)
    elif n.domain is not None:
        raise GraphError("domain is only meaningful with basis 'chebyshev'", node=n.id, field="domain")
    node = Node(n.id, "poly", tuple(n.inputs), coeffs=tuple(float(c) for c in coeffs),
                basis="chebyshev" if basis == "chebyshev" else None, domain=domain)
    return node, ops[0].shape


def _norm_axis(n: NodeLiteral, x: TensorInfo, axis: int) -> int:
    r = x.rank
    if not -r <= axis < r:
        raise GraphError(
            f"axis {axis} out of range for {x.name!r} {_fmt_shape(x.shape)} of rank {r} "
            f"(allowed {-r}..{r - 1})",
            node=n.id,
            field="axis",
        )
    return axis % r


def _infer_sum(n: NodeLiteral, ops: list[TensorInfo]) -> tuple[Node, tuple[int, ...]]:
    (x,) = ops
    axis = _norm_axis(n, x, cast(int, n.axis))
    keep = bool(n.keepdims)
    shape = x.shape[:axis] + ((1,) if keep else ()) + x.shape[axis + 1 :]
    return Node(n.id, "sum", tuple(n.inputs), axis=axis, keepdims=True if keep else None), shape or (1,)


def _infer_slice(n: NodeLiteral, ops: list[TensorInfo]) -> tuple[Node, tuple[int, ...]]:
    (x,) = ops
    axis = _norm_axis(n, x, cast(int, n.axis))
    dim = x.shape[axis]
    # Python's slice bounds: negative counts from the end, out-of-range clamps
    start, stop, _ = slice(cast(int, n.start), cast(int, n.stop)).indices(dim)
    if stop <= start:
        raise GraphError(
            f"empty slice: [{n.start}:{n.stop}] of axis {axis} (length {dim}) of {x.name!r} "
            f"{_fmt_shape(x.shape)} selects nothing",
            node=n.id,
            field="stop",
        )
    shape = x.shape[:axis] + (stop - start,) + x.shape[axis + 1 :]
    return Node(n.id, "slice", tuple(n.inputs), axis=axis, start=start, stop=stop), shape


def _infer_concat(n: NodeLiteral, ops: list[TensorInfo]) -> tuple[Node, tuple[int, ...]]:
    first = ops[0]
    axis = _norm_axis(n, first, cast(int, n.axis))
    total = 0
    for j, t in enumerate(ops):
        same = t.rank == first.rank and all(
            d == e for i, (d, e) in enumerate(zip(t.shape, first.shape, strict=False)) if i != axis
        )
        if not same:
            raise GraphError(
                f"shape mismatch: concat along axis {axis} needs equal ranks and equal dims off the axis, got "
                f"{first.name!r} {_fmt_shape(first.shape)} and {t.name!r} {_fmt_shape(t.shape)}",
                node=n.id,
                field=f"inputs[{j}]",
            )
        total += t.shape[axis]
    shape = first.shape[:axis] + (total,) + first.shape[axis + 1 :]
    return Node(n.id, "concat", tuple(n.inputs), axis=axis), shape


def _infer_transpose(n: NodeLiteral, ops: list[TensorInfo]) -> tuple[Node, tuple[int, ...]]:
    (x,) = ops
    r = x.rank
    perm = tuple(range(r - 1, -1, -1)) if n.perm is None else tuple(n.perm)
    if sorted(perm) != list(range(r)):
        raise GraphError(
            f"perm {list(perm)} is not a permutation of 0..{r - 1} (rank of {x.name!r} {_fmt_shape(x.shape)})",
            node=n.id,
            field="perm",
        )
    shape = tuple(x.shape[p] for p in perm)
    return Node(n.id, "transpose", tuple(n.inputs), perm=perm), shape


def _infer_reshape(n: NodeLiteral, ops: list[TensorInfo]) -> tuple[Node, tuple[int, ...]]:
    (x,) = ops
    target = list(n.shape or [])
    if not target:
        raise GraphError(f"shape must have rank 1..{MAX_RANK}, got []", node=n.id, field="shape")
    if len(target) > MAX_RANK:
        raise GraphError(
            f"rank {len(target)} exceeds the limit MAX_RANK = {MAX_RANK}", node=n.id, field="shape"
        )
    if target.count(-1) > 1:
        raise GraphError(f"at most one -1 is allowed in shape, got {target}", node=n.id, field="shape")
    for i, d in enumerate(target):
        if d == 0 or d < -1:
            raise GraphError(
                f"dims must be positive integers (or one -1), got {d}", node=n.id, field=f"shape[{i}]"
            )
    known = math.prod(d for d in target if d != -1)
    if -1 in target:
        if x.size % known:
            raise GraphError(
                f"cannot reshape {x.name!r} {_fmt_shape(x.shape)} ({x.size} elements) to {target}: "
                f"{x.size} is not divisible by {known}",
                node=n.id,
                field="shape",
            )
        target[target.index(-1)] = x.size // known
    elif known != x.size:
        raise GraphError(
            f"cannot reshape {x.name!r} {_fmt_shape(x.shape)} ({x.size} elements) to "
            f"{_fmt_shape(target)} ({known} elements): element counts differ",
            node=n.id,
            field="shape",
        )
    shape = tuple(target)
    return Node(n.id, "reshape", tuple(n.inputs), shape=shape), shape


_INFER: Mapping[str, Callable[[NodeLiteral, list[TensorInfo]], tuple[Node, tuple[int, ...]]]] = (
    MappingProxyType(
        {
            "matvec": _infer_matvec,
            "matmul": _infer_matmul,
            "conv2d": _infer_conv2d,
            "add": _infer_elementwise,
            "sub": _infer_elementwise,
            "mul": _infer_elementwise,
            "poly": _infer_poly,
            "sum": _infer_sum,
            "transpose": _infer_transpose,
            "reshape": _infer_reshape,
            "slice": _infer_slice,
            "concat": _infer_concat,
        }
    )
)
