"""``slotplan.plan``: a graph (or an ONNX model) to a :class:`Plan`.

A thin layer over :mod:`planner.pipeline` (the CLI's ``plan`` does the same steps):
load or import the graph, check the options with the same pydantic model the CLI and
REST use, plan, and keep the plan document with its tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.errors import PlanFileError, SlotplanError

# the options plan() passes to planner.pipeline.PlanOptionsLiteral (same names)
_PLAN_OPTIONS = ("solver", "time_limit_s", "memory_cap_bytes", "kernels", "input_layout", "input_layouts",
                 "costs", "objective", "clean_outputs", "allow_insecure", "cins", "cins_decompose", "packing",
                 "batch", "boot_variants", "boot_variant_slots")
# the options that only an ONNX model takes (as `slotplan import`)
_IMPORT_OPTIONS = ("calibrate", "degree", "max_error", "relu", "margin", "newton", "output", "allow_error")

GraphSource = str | Path | Mapping[str, Any]


@dataclass(eq=False)
class Plan:
    """A plan (``slotplan.plan/1``) and its slot tables.

    ``document`` is the plan file's JSON object, byte-for-byte what ``slotplan plan -o``
    writes for the same request; ``tables`` maps each table name to its int64 slot indices.
    ``weights`` holds the weights an ONNX import produced (BatchNorm folded), named as the
    graph's weight tensors; None for a graph file."""

    document: dict[str, Any]
    tables: Mapping[str, np.ndarray]
    weights: dict[str, np.ndarray] | None = None
    seconds: float | None = None
    """Planning time in seconds (not part of the document)."""

    @property
    def summary(self) -> dict[str, Any]:
        """The plan's summary: rotations, keys, depth, peak bytes, solver, ..."""
        return dict(self.document["summary"])

    @property
    def digest(self) -> str:
        """The plan digest that key sets and ciphertexts are bound to."""
        from planner.ir.io import plan_digest

        return plan_digest(self.document)

    @property
    def graph(self) -> Any:
        """The graph the plan was made for (:class:`planner.frontend.graph.Graph`, from the plan)."""
        from planner.frontend.graph import parse_graph

        return parse_graph(self.document["graph"]["spec"])

    @property
    def inputs(self) -> list[str]:
        """Names of the graph's encrypted inputs."""
        return [str(t) for t in self.graph.inputs]

    @property
    def outputs(self) -> list[str]:
        """Names of the graph's outputs."""
        return [str(t) for t in self.graph.outputs]

    def to_json(self) -> str:
        """The plan file's text (deterministic)."""
        from planner.ir.io import dumps_plan

        return dumps_plan(self.document)

    def save(self, path: str | Path, tables: str | Path | None = None) -> None:
        """Write the plan file (and, with ``tables``, the ``.npz`` tables), atomically."""
        from backends.runner import regenerate_tables
        from planner.ir.builder import LazyTables
        from planner.ir.io import DEFAULT_MAX_TABLE_BYTES, write_outputs

        lazy: LazyTables | None = None
        if tables is not None:
            # a plan read with a tables file holds plain arrays: the writer streams them from
            # the plan's table generators (planning is deterministic; checked against the program)
            got = self.tables if isinstance(self.tables, LazyTables) else regenerate_tables(self.document)
            if not isinstance(got, LazyTables):
                raise PlanFileError("cannot write the tables: they do not come from a plan's generators")
            lazy = got
        write_outputs(self.document, Path(path), lazy, Path(tables) if tables is not None else None,
                      DEFAULT_MAX_TABLE_BYTES)

    @classmethod
    def load(cls, path: str | Path, tables: str | Path | None = None) -> Plan:
        """Read a plan file (and its tables; rebuilt from the plan when not given)."""
        from backends.runner import regenerate_tables
        from planner.ir.io import load_plan, load_tables

        doc = load_plan(path)
        tb = load_tables(tables, doc) if tables is not None else regenerate_tables(doc)
        return cls(doc, tb)

    def simulate(self, inputs: Mapping[str, Any] | None = None, weights: Mapping[str, Any] | None = None,
                 *, seed: int = 0, backend: str = "sim") -> dict[str, np.ndarray]:
        """Run the plan on the numpy slot simulator (``backend="lattigo"``: encrypted, one
        process) and return the outputs by name, after checking them against the graph's
        numpy reference (a :class:`SlotplanError` when they disagree).  Inputs and weights
        missing from the arguments are seeded random values (``self.weights`` are used when
        an ONNX import gave them)."""
        from backends.runner import EXECUTION_BACKENDS, run_plan
        from planner.frontend.graph import parse_graph
        from planner.frontend.reference import random_values

        EXECUTION_BACKENDS.check(backend)
        graph = parse_graph(self.document["graph"]["spec"])
        values = dict(random_values(graph, seed, "fan-in"))
        # a plan of B samples (docs/batch.md): inputs with a leading dimension N; none given:
        # B seeded samples, as slotplan run draws them
        batched = "batch" in self.document.get("summary", {})
        for given in (self.weights or {}, weights or {}, inputs or {}):
            for name, arr in given.items():
                if name not in values:
                    raise SlotplanError(f"tensor {name!r}: not an input or weight of graph {graph.name!r}")
                a = np.asarray(arr, dtype=np.float64)
                size = int(np.prod(graph.shape(name)))
                if batched and name in graph.inputs and a.ndim >= 2 and a.size != size and a.size == a.shape[0] * size:
                    values[name] = a.reshape((a.shape[0], *graph.shape(name)))  # N samples (docs/batch.md)
                    continue
                if a.size != int(np.prod(graph.shape(name))):
                    raise SlotplanError(f"tensor {name!r}: {a.size} values, the graph's shape "
                                        f"{list(graph.shape(name))} has {int(np.prod(graph.shape(name)))}")
                values[name] = a.reshape(graph.shape(name))
        if batched and not any(t in (inputs or {}) for t in graph.inputs):
            per = [random_values(graph, seed + b, "fan-in") for b in range(int(self.document["summary"]["batch"]))]
            values.update({t: np.stack([p[t] for p in per]) for t in graph.inputs})
        rep = run_plan(self.document, self.tables, backend, seed, values=values)
        if not rep.ok:
            raise SlotplanError(f"{backend} run mismatched the numpy reference: max relative error "
                                f"{rep.max_rel_error:.3e} > {rep.tolerance:g}")
        return dict(rep.outputs)


def _graph(src: GraphSource | Any, import_opts: dict[str, Any]) -> tuple[Any, dict[str, np.ndarray] | None]:
    from planner.frontend.graph import Graph, load_graph

    if isinstance(src, Graph):
        graph, weights = src, None
    elif isinstance(src, Mapping):
        graph, weights = load_graph(src), None
    elif isinstance(src, str | Path):
        path = Path(src)
        if path.suffix.lower() == ".onnx":
            from api.commands_import import _options
            from planner.frontend.importers.onnx_import import import_model

            output = import_opts.get("output")
            cut = [output] if isinstance(output, str) else list(output or [])
            opts = _options(import_opts.get("degree"), import_opts.get("max_error"), import_opts.get("margin", 0.1),
                            import_opts.get("newton", 1), cut=cut, allow_error=bool(import_opts.get("allow_error")),
                            relu=import_opts.get("relu", "auto"))
            res = import_model(path, opts, import_opts.get("calibrate"))
            return res.graph, {k: np.asarray(v) for k, v in res.weights.items()}
        if not path.is_file():
            raise SlotplanError(f"graph file {str(path)!r}: no such file")
        graph, weights = load_graph(path), None
    else:
        raise SlotplanError(f"graph_or_model: expected a graph dict, a graph file or an .onnx path, "
                            f"got {type(src).__name__}")
    if import_opts:
        raise SlotplanError(f"{', '.join(sorted(import_opts))}: only for an ONNX model (.onnx), not a graph")
    return graph, weights


def plan(graph_or_model: GraphSource | Any, params: str | Mapping[str, Any] = "n16", **options: Any) -> Plan:
    """Plan a graph and return a :class:`Plan`.

    ``graph_or_model``: a ``slotplan.graph/1`` dict, a graph file path, a parsed
    :class:`planner.frontend.graph.Graph`, or an ONNX model path (``.onnx``; imported as ``slotplan
    import`` does, its weights kept in ``Plan.weights``).  ``params``: a preset name (``n12`` ..
    ``n16``, ``n14boot``, ``n16boot``), ``"auto"``, a parameters JSON file or a dict.
    ``options`` are the CLI's planning options with their JSON names (``solver``,
    ``time_limit_s``, ``memory_cap_bytes`` (int, or a string such as ``"2GiB"``), ``kernels``,
    ``input_layout``, ``costs``, ``objective``, ``clean_outputs``, ``allow_insecure``,
    ``cins``, ``cins_decompose``, ``packing``, ``batch``: samples per ciphertext set or
    ``"auto"``, docs/batch.md), plus for ONNX models the import options of
    ``slotplan import``: ``calibrate`` (a ``.npz`` path or a dict of arrays), ``degree``,
    ``max_error``, ``relu`` (``auto``/``direct``/``composite``), ``margin``, ``newton``, ``output`` (a value
    name or a list of them: cut the model there) and ``allow_error``.  Every bad value raises a
    :class:`SlotplanError` subclass whose message names the field and the rule."""
    import time

    from pydantic import ValidationError

    from planner.frontend.params import AUTO, Params, load_params
    from planner.ir.io import parse_size
    from planner.pipeline import PlanOptions, PlanOptionsLiteral, auto_params, plan_graph

    unknown = sorted(set(options) - set(_PLAN_OPTIONS) - set(_IMPORT_OPTIONS))
    if unknown:
        raise SlotplanError(f"unknown option(s) {', '.join(unknown)}; known: "
                            f"{', '.join(_PLAN_OPTIONS + _IMPORT_OPTIONS)}")
    import_opts = {k: options.pop(k) for k in _IMPORT_OPTIONS if options.get(k) is not None}
    options = {k: v for k, v in options.items() if k not in _IMPORT_OPTIONS}
    if isinstance(options.get("memory_cap_bytes"), str):
        options["memory_cap_bytes"] = parse_size(options["memory_cap_bytes"])
    t0 = time.perf_counter()
    graph, weights = _graph(graph_or_model, import_opts)
    auto_batch = options.get("batch") == "auto"
    if auto_batch:
        options.pop("batch")
    try:
        opts = PlanOptions.from_literal(PlanOptionsLiteral(**options))
    except ValidationError as e:
        first = e.errors()[0]
        raise SlotplanError(f"option {'.'.join(str(x) for x in first['loc'])}: {first['msg']}") from None
    p: Params = auto_params(graph, opts) if params == AUTO else load_params(params)
    if auto_batch:  # the power of two with the least modelled time per sample (docs/batch.md)
        from planner.batch import plan_auto_batch

        res = plan_auto_batch(graph, p, opts)
    else:
        res = plan_graph(graph, p, opts)
    return Plan(res.plan, res.tables, weights, time.perf_counter() - t0)


def _check_plan(obj: Any) -> Plan:
    if not isinstance(obj, Plan):
        raise PlanFileError(f"expected a slotplan.Plan (slotplan.plan() or Plan.load()), got {type(obj).__name__}")
    return obj
