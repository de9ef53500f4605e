"""The planning pipeline: graph -> candidates -> choice model -> solver -> plan.

One way only: candidates and conversions are priced here (planner), the solver layer
picks one option per node/input (solver), and the plan is built from that frozen
solution in a separate step (lower_solution), as HEIR separates its ILP analysis from
the rewrite.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from planner import ir
from planner.candidates import (
    CINS_KERNELS,
    COMPLEX_KERNELS,
    ELEMENTWISE_KERNELS,
    KERNEL_FAMILIES,
    KERNELS,
    LINEAR_KERNELS,
    PlanError,
    concat_candidates,
    elementwise_candidates,
    fold_scale,
    input_layout,
    linear_candidates,
    matmul_candidates,
    slice_candidates,
    view_candidates,
    with_clean_output,
)
from planner.convert import plan_conversion
from planner.costs import COST_TABLES, OBJECTIVE_SCALE, CostTable, load_costs
from planner.errors import SlotplanError
from planner.fold import add_scaled_variants, foldable_into
from planner.graph import Graph, Node
from planner.ir import PLAN_SCHEMA
from planner.kernels.base import Candidate
from planner.layout import ChannelLayout
from planner.params import Params
from planner.program import LazyTables, ProgramBuilder
from planner.ranges import RangeReport, boot_scale, graph_ranges, operand_bound
from planner.rotom import parse_layout
from planner.summary import span_counts, summarize
from solver import SOLVER_BACKENDS, create, progress
from solver.model import ChoiceModel, Edge, Group, Solution, Status

# The CinS families offered by default at bootstrapping presets: cins-hs (one rotation per
# slice diagonal) has the layouts of cins-bsgs and never fewer rotations, so it only adds
# options to price and prune; name it in `kernels` to have it.
DEFAULT_CINS_KERNELS = ("cins-bsgs", "cins-dw")

# Default solver time limit: the models of single kernels and small graphs prove optimal
# in milliseconds; 10 s bounds a large graph without making a CLI user wait long.
DEFAULT_TIME_LIMIT_S = 10.0


if TYPE_CHECKING:
    SolverName = str
else:  # the registered solver back ends, as an enum of the JSON schema (REST, OpenAPI)
    SolverName = Literal[SOLVER_BACKENDS.names()]


class PlanOptionsLiteral(BaseModel):
    """Unchecked JSON/CLI form of the planning options."""

    model_config = ConfigDict(extra="forbid")
    solver: SolverName = "cpsat"
    time_limit_s: float = Field(default=DEFAULT_TIME_LIMIT_S, gt=0, le=3600)
    memory_cap_bytes: int | None = Field(default=None, gt=0)
    kernels: list[str] | None = None
    input_layout: Literal["free", "row-major"] = "free"
    input_layouts: dict[str, str] | None = None
    costs: str = "default"
    # what the solver minimises: "time" (modelled seconds of the calibrated table
    # data/costs/<preset>-lattigo.json) or "rotations" (the default table, rotations first);
    # unset: time where the preset has a calibrated table, else rotations. An explicit
    # non-default --costs table wins.
    objective: Literal["time", "rotations"] | None = None
    # graph outputs hold zeros outside their tensor (a mask where the kernel leaves
    # partial sums): what the client decrypts is the output and nothing of the weights
    clean_outputs: bool = True
    allow_insecure: bool = Field(default=False, description="accept parameters above the 128-bit bound")
    # NeuJeans CinS conv layers (docs/cins.md) join the default kernels at bootstrapping
    # presets; false keeps the slot kernels only (a `kernels` list is taken as given)
    cins: bool = True
    # strided CinS convs also in NeuJeans' decomposed form (Alg. 2: polyphase input, a
    # quarter of the bootstraps at stride 2); false: only the densify-first form
    cins_decompose: bool = True
    # "complex": the complex-packing extension of the plan format (docs/formats.md): the
    # hybrid matvec also in its complex form (two inputs per slot, half the diagonals);
    # "real" plans keep SPEC section 4 exactly (real registers)
    packing: Literal["real", "complex"] = "real"
    # samples per ciphertext set (SPEC section 8, planner/batch.py); unset: one sample, the
    # plan keeps SPEC section 4's shapes (and its bytes)
    batch: int | None = Field(default=None, ge=1)


@dataclass(frozen=True)
class PlanOptions:
    solver: str = "cpsat"
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    memory_cap_bytes: int | None = None
    kernels: tuple[str, ...] = KERNELS
    input_layout: str = "free"
    input_layouts: tuple[tuple[str, str], ...] = ()
    costs: str = "default"
    clean_outputs: bool = True
    allow_insecure: bool = False
    objective: str | None = None
    cins: bool = True
    cins_decompose: bool = True
    packing: str = "real"
    batch: int | None = None
    # batched plans only (planner/batch.py, never in the plan's options): strided outputs
    # may also be packed densely (batch.densified_variants)
    densify: bool = False

    @staticmethod
    def from_literal(lit: PlanOptionsLiteral) -> PlanOptions:
        kernels = tuple(lit.kernels) if lit.kernels else KERNELS
        known = KERNELS + CINS_KERNELS + COMPLEX_KERNELS
        unknown = [k for k in kernels if k not in known]
        if unknown:
            raise PlanError(
                f"unknown kernel(s) {', '.join(unknown)}; known kernels: {', '.join(known)}"
            )
        if not any(k in kernels for k in ELEMENTWISE_KERNELS):
            kernels = kernels + ELEMENTWISE_KERNELS
        return PlanOptions(
            solver=lit.solver, time_limit_s=lit.time_limit_s, memory_cap_bytes=lit.memory_cap_bytes,
            kernels=kernels, input_layout=lit.input_layout,
            input_layouts=tuple(sorted((lit.input_layouts or {}).items())), costs=lit.costs,
            clean_outputs=lit.clean_outputs,
            allow_insecure=lit.allow_insecure, objective=lit.objective,
            cins=lit.cins,
            cins_decompose=lit.cins_decompose,
            packing=lit.packing,
            batch=lit.batch,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "solver": self.solver,
            "time_limit_s": self.time_limit_s,
            "memory_cap_bytes": self.memory_cap_bytes,
            "kernels": list(self.kernels),
            "input_layout": self.input_layout,
            "input_layouts": dict(self.input_layouts) or None,
            "costs": self.costs,
            "clean_outputs": self.clean_outputs,
        }
        if self.allow_insecure:  # only when given: existing plans stay byte-identical
            out["allow_insecure"] = True
        if self.objective is not None:
            out["objective"] = self.objective
        if not self.cins:
            out["cins"] = False
        if not self.cins_decompose:
            out["cins_decompose"] = False
        if self.packing != "real":  # only when complex: real plans stay byte-identical
            out["packing"] = self.packing
        if self.batch is not None:  # only when given: plans of one sample stay byte-identical
            out["batch"] = self.batch
        return out

    def with_packing(self) -> PlanOptions:
        """Checked packing: "complex" adds the complex kernel families next to "hybrid"
        (unless some are named) and refuses a memory cap (the key schedules do not place
        the conjugation key)."""
        if self.packing not in ("real", "complex"):
            raise PlanError(f"options.packing must be 'real' or 'complex', got {self.packing!r}")
        named = [k for k in self.kernels if k in COMPLEX_KERNELS]
        if self.packing == "real":
            if named:
                raise PlanError(f"kernel(s) {', '.join(named)} need options.packing 'complex' (--packing complex)")
            return self
        if self.memory_cap_bytes is not None:
            raise PlanError("packing 'complex' cannot be combined with a memory cap: the key schedules do not "
                            "place the conjugation key (plan without a cap, or with packing 'real')")
        if "hybrid" in self.kernels and not named:
            return replace(self, kernels=self.kernels + COMPLEX_KERNELS)
        return self

    def cins_kernels(self, params: Params) -> tuple[str, ...]:
        """The CinS families offered: those ``kernels`` names, else (the default kernel
        list) ``DEFAULT_CINS_KERNELS`` at a bootstrapping preset unless ``cins`` is off."""
        named = tuple(k for k in self.kernels if k in CINS_KERNELS)
        if named:
            if params.boot is None:
                raise PlanError(
                    f"the CinS kernels ({', '.join(named)}) bootstrap every layer: they need a bootstrapping "
                    f"preset (n14boot, n16boot), not {params.name}"
                )
            return named
        if self.cins and params.boot is not None and self.kernels == KERNELS:
            return DEFAULT_CINS_KERNELS
        return ()


def resolve_objective(options: PlanOptions, params: Params) -> PlanOptions:
    """The options with the objective made explicit: ``costs`` the table the solver uses,
    ``objective`` "time" (a calibrated table, modelled milliseconds) or "rotations"."""
    if options.costs != "default":
        return replace(options, objective="time" if load_costs(options.costs).is_time else "rotations")
    if options.objective == "rotations":
        return options
    name = f"{params.name}-lattigo"
    if name in COST_TABLES and load_costs(name).is_time:
        return replace(options, costs=name, objective="time")
    if options.objective == "time":
        raise PlanError(
            f"--objective time needs a calibrated cost table for params {params.name!r} "
            f"(data/costs/{name}.json): run `slotplan calibrate --params {params.name}`, "
            "or plan with --objective rotations"
        )
    return replace(options, objective="rotations")


@dataclass
class PlanProblem:
    """Priced candidates and the choice model built from them."""

    graph: Graph
    params: Params
    options: PlanOptions
    costs: CostTable
    candidates: dict[str, list[Candidate]]
    input_options: dict[str, list[ChannelLayout]]
    model: ChoiceModel
    operand_source: dict[tuple[str, str], str] = field(default_factory=dict)
    # issue 17 (explanations): every node's candidates before dominated options were pruned
    all_candidates: dict[str, list[Candidate]] = field(default_factory=dict)
    # bootstrapping presets: every tensor's interval, the scale s of each bootstrappable
    # value (1: within boot.max_abs), and the values that cannot be bootstrapped because
    # their range is unknown (-> the declared input without a range they depend on)
    ranges: RangeReport | None = None
    boot_scales: dict[str, int] = field(default_factory=dict)
    boot_unknown: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LayoutClaim:
    """What lowering claims about registers: they hold ``tensor`` in ``layout`` (and, when
    the layout is clean, zeros in every other slot).  ``backends.layout_check`` verifies
    every claim of a plan on the simulator's registers instead of trusting the kernels."""

    what: str  # "input x", "node fc1", "conversion x -> fc1"
    tensor: str
    layout: Any
    regs: tuple[str, ...]
    # the registers hold this factor times the tensor (a producer that absorbed a
    # Chebyshev poly's change of variable, planner.fold)
    scale: float = 1.0


@dataclass
class PlanResult:
    plan: dict[str, Any]
    tables: LazyTables
    solution: Solution
    problem: PlanProblem
    seconds: float
    claims: list[LayoutClaim] = field(default_factory=list)
    # a plan of several samples (planner/batch.py): its geometry; claims then speak of
    # tensors with a leading sample dimension (padding blocks included)
    batch: Any = None


def _group_of(graph: Graph, tensor: str) -> str:
    return tensor if graph.producer(tensor) is not None else f"input:{tensor}"


def build_problem(graph: Graph, params: Params, options: PlanOptions) -> PlanProblem:
    """Candidates of every node, layout options of every encrypted input, conversion
    costs between them: the choice model the solver picks from."""
    S = params.slots
    options = resolve_objective(options.with_packing(), params)
    costs = load_costs(options.costs)
    free = options.input_layout == "free"
    pinned = _pinned_layouts(graph, options, S)
    ranges = graph_ranges(graph) if params.boot is not None else None
    cins_families = options.cins_kernels(params)  # (refuses CinS kernels at a preset without bootstrapping)
    cins_ctx = _CinsContext(cins_families, params, ranges, options.cins_decompose) if ranges is not None else None
    cands: dict[str, list[Candidate]] = {}
    progress.begin("candidates", len(graph.nodes))
    for node in graph.nodes:
        out = _node_candidates(graph, node, cands, pinned, options, S, cins_ctx)
        if options.clean_outputs and node.id in graph.outputs:
            out = [with_clean_output(c, S) for c in out]
        if options.densify:
            from planner.batch import densified_variants

            out = out + densified_variants(out, S)
        cands[node.id] = _prune(out, costs, S)
        progress.advance("candidates", node.id)
    progress.end("candidates")
    _fold_chebyshev(graph, cands, params, ranges, costs)
    input_options = _input_options(graph, cands, pinned, free, S)
    penalty: dict[str, list[int]] = {}
    if options.memory_cap_bytes is not None:
        penalty = _apply_residency(cands, params, options.memory_cap_bytes, costs)
    groups: list[Group] = []
    for t, opts in input_options.items():
        groups.append(Group(f"input:{t}", tuple(0 for _ in opts), tuple(o.notation() for o in opts)))
    boot_scales: dict[str, int] = {}
    boot_unknown: dict[str, str] = {}
    fused = costs.weights.fused  # price what the Lattigo executor fuses (Candidate.cost)
    for node in graph.nodes:
        cs = cands[node.id]
        bootable, pres, post = _boot_options(graph, node, cs, params, ranges, boot_scales, boot_unknown)
        # a candidate that bootstraps inside itself (a CinS layer): the levels it uses
        # before its bootstraps, and its result's depth
        rds = [c.reset_depths(S) for c in cs]
        groups.append(
            Group(node.id, tuple(costs.iscore(c.cost(S, fused)) + p
                                 for c, p in zip(cs, penalty.get(node.id) or [0] * len(cs), strict=True)),
                  tuple(c.label for c in cs),
                  depths=tuple(c.cost(S).depth if rd is None else rd[0] for c, rd in zip(cs, rds, strict=True)),
                  n_cts=tuple(c.out_layout.n_ct for c in cs) if params.boot is not None else (),
                  bootable=bootable, boot_pres=pres, boot_post=post,
                  resets=tuple(-1 if rd is None else rd[1] for rd in rds) if any(rds) else ())
        )
    edges: list[Edge] = []
    operand_source: dict[tuple[str, str], str] = {}
    progress.begin("conversions", len(graph.nodes))
    for node in graph.nodes:
        for t in dict.fromkeys(node.inputs):
            if not graph.encrypted(t):
                continue
            src = _group_of(graph, t)
            operand_source[(node.id, t)] = src
            src_layouts = input_options[t] if src.startswith("input:") else [c.out_layout for c in cands[src]]
            src_scales = [1.0] * len(src_layouts) if src.startswith("input:") else [c.out_scale for c in cands[src]]
            # a free input read by one node: the client packs what the chosen candidate
            # reads, so only matching (option, candidate) pairs can be optimal; pricing the
            # other conversions would only cost planning time
            own = src.startswith("input:") and free and t not in pinned and len(graph.consumers(t)) == 1
            mat, dmat = _conversion_costs(src_layouts, cands[node.id], t, own, costs, src_scales)
            edges.append(Edge(src, node.id, t, mat, dmat, adapts=own))
        progress.advance("conversions", node.id)
    progress.end("conversions")
    all_candidates = {k: list(v) for k, v in cands.items()}  # issue 17: runner-ups may be pruned ones
    boot_weight = costs.boot_iscore() if params.boot is not None else None
    model, keep = ChoiceModel(tuple(groups), tuple(edges), params.max_level, boot_weight).prune_dominated()
    for node in graph.nodes:
        cands[node.id] = [cands[node.id][o] for o in keep[node.id]]
    hint, lazy = model.greedy_boots() if model.bootstraps else (model.greedy(), frozenset())
    model = ChoiceModel(
        tuple(replace(g, hint=hint.get(g.name, 0), boot_hint=g.name in (lazy or ())) for g in model.groups),
        model.edges, model.max_depth, model.boot_weight,
    )
    return PlanProblem(graph, params, options, costs, cands, input_options, model, operand_source,
                       all_candidates, ranges, boot_scales, boot_unknown)


def _boot_options(
    graph: Graph, node: Node, cs: Sequence[Candidate], params: Params, ranges: RangeReport | None,
    scales: dict[str, int], unknown: dict[str, str],
) -> tuple[bool, tuple[int, ...], int]:
    """Whether a node's result may be bootstrapped, and the levels around a bootstrap: per
    candidate one level before it when its layout is dirty (a mask zeroes the free slots,
    whose partial sums no range bounds) or the value must be scaled down by ``1/s``; one
    after it when scaled (times ``s``)."""
    if params.boot is None or ranges is None or not graph.encrypted(node.id) or not graph.consumers(node.id):
        return False, (), 0
    bound = ranges.bound(node.id)
    if bound is None:
        unknown[node.id] = ranges.unknown_source.get(node.id, node.id)
        return False, (), 0
    s = boot_scale(bound, params.boot.max_abs)
    scales[node.id] = s
    return True, tuple(int(s > 1 or not c.out_layout.clean) for c in cs), int(s > 1)


def _fold_chebyshev(
    graph: Graph, cands: dict[str, list[Candidate]], params: Params, ranges: RangeReport | None, costs: CostTable
) -> None:
    """Scaled variants of the producers of folded Chebyshev polys (planner.fold).  At a
    bootstrapping preset a factor that would need a larger bootstrap scaling than the
    unscaled value is refused (the node's bootstrap scale serves both variants)."""

    def keep_scale(node_id: str, s: float) -> bool:
        if params.boot is None or ranges is None:
            return True
        bound = ranges.bound(node_id)
        return bound is None or boot_scale(bound * s, params.boot.max_abs) <= boot_scale(bound, params.boot.max_abs)

    before = {k: len(v) for k, v in cands.items()}
    add_scaled_variants(graph, cands, params.slots, keep_scale)
    for k, v in cands.items():
        if len(v) != before[k] or any(c.out_scale != 1.0 or c.operand_scales for c in v):
            cands[k] = _prune(v, costs, params.slots)


def _pinned_layouts(graph: Graph, options: PlanOptions, S: int) -> dict[str, Any]:
    """The input layouts the user fixed (``input_layouts``), parsed."""
    pinned: dict[str, Any] = {}
    for t, text in options.input_layouts:
        if t not in graph.tensors or not graph.encrypted(t) or graph.producer(t) is not None:
            raise PlanError(f"input layout given for {t!r}, which is not an encrypted graph input")
        try:
            pinned[t] = parse_layout(text, graph.shape(t), S)
        except SlotplanError as e:
            raise PlanError(f"input layout of {t!r}: {e}") from e
    return pinned


@dataclass(frozen=True)
class _CinsContext:
    """What the CinS layer candidates need: the families offered, the bootstrapping
    parameters and the graph's ranges (each layer scales its bootstraps)."""

    families: tuple[str, ...]
    params: Params
    ranges: RangeReport
    decompose: bool = True


def _cins_candidates(graph: Graph, node: Node, ctx: _CinsContext) -> list[Candidate]:
    """The NeuJeans conv layers of a conv2d node (planner.cins_flow.layer_candidate), one
    per family and form (direct, decomposed); none when the layer cannot be bootstrapped
    (its operand's range unknown, or its bound above 2^BOOT_BOUND_WARN_BITS)
    or no CinS layout fits the ring."""
    from planner.cins_flow import layer_candidate
    from planner.kernels.problem import KernelError
    from planner.layout import LayoutError

    boot = ctx.params.boot
    bound = operand_bound(graph, node, ctx.ranges)
    if boot is None or bound is None or not ctx.families:
        return []
    scale = boot_scale(bound, boot.max_abs)
    if bound > 2.0**BOOT_BOUND_WARN_BITS:
        # the conv's interval bound would leave values of order 1 few of the bootstrap's bits
        # (a separately placed bootstrap scales by the node's promised range instead)
        return []
    out: list[Candidate] = []
    for fam in ctx.families:
        make = KERNEL_FAMILIES.create(fam).cins
        if make is None:
            continue
        try:
            out.extend(layer_candidate(c, scale) for c in make(graph, node, ctx.params.slots)
                       if ctx.decompose or not c.params.get("decomposed"))
        except (KernelError, LayoutError):
            continue
    return out


def _node_candidates(
    graph: Graph, node: Node, cands: Mapping[str, list[Candidate]], pinned: Mapping[str, Any],
    options: PlanOptions, S: int, cins_ctx: _CinsContext | None = None,
) -> list[Candidate]:
    """One node's candidates, for every layout its encrypted operands may arrive in (the
    candidates of their producers, or the input layouts)."""
    free = options.input_layout == "free"
    enc = [t for t in node.inputs if graph.encrypted(t)]
    bases: dict[str, list[ChannelLayout]] = {}
    for t in enc:
        prod = graph.producer(t)
        if prod is None:
            bases[t] = [pinned[t]] if t in pinned else [input_layout(graph, t, S)]
        else:
            opts = list(dict.fromkeys(c.out_layout for c in cands[prod.id]))
            bases[t] = opts
    if node.op in ("matvec", "conv2d"):
        t = enc[0] if enc else node.inputs[-1 if node.op == "matvec" else 0]
        if not enc:
            raise PlanError(f"{node.op} has no encrypted operand: nothing to plan", node.id)
        is_input = graph.producer(t) is None and t not in pinned
        linear_allowed = [k for k in options.kernels if k in LINEAR_KERNELS or k in COMPLEX_KERNELS]
        out: list[Candidate] = []
        cins = _cins_candidates(graph, node, cins_ctx) if cins_ctx is not None and node.op == "conv2d" else []
        seen_bases = list(dict.fromkeys(b.with_clean(True) for b in bases[t]))
        try:
            for base in seen_bases:
                out.extend(linear_candidates(graph, node, base, linear_allowed, free and is_input))
        except PlanError:
            if not cins:  # no slot kernel fits: the CinS layers may
                raise
        return out + cins
    if node.op in ("add", "sub", "mul", "poly"):
        out = elementwise_candidates(graph, node, bases)
        if fold_scale(node) is not None and foldable_into(graph, node.inputs[0]) is not None:
            # the change of variable folded into the producer (planner.fold)
            out += elementwise_candidates(graph, node, bases, folded=True)
        return out
    if node.op == "matmul":
        if not enc:
            raise PlanError("matmul has no encrypted operand: nothing to plan", node.id)
        free_inputs = {t for t in enc if graph.producer(t) is None and free and t not in pinned}
        return matmul_candidates(graph, node, bases, options.kernels, free_inputs)
    if node.op in ("slice", "concat"):
        if not enc:
            raise PlanError(f"{node.op} of plaintext tensors: fold it before planning", node.id)
        return slice_candidates(graph, node, bases) if node.op == "slice" else concat_candidates(graph, node, bases)
    if node.op in ("transpose", "reshape", "sum"):
        if not enc:
            raise PlanError(f"{node.op} of a plaintext tensor: fold it before planning", node.id)
        return view_candidates(graph, node, bases)
    raise PlanError(f"op {node.op!r} is not supported by the slot kernels", node.id)


def _input_options(
    graph: Graph, cands: Mapping[str, list[Candidate]], pinned: Mapping[str, Any], free: bool, S: int
) -> dict[str, list[ChannelLayout]]:
    """Layout options of the encrypted graph inputs: the client packs any layout a
    consumer asks for (free input layout), else the row-major one; pinned ones as given."""
    input_options: dict[str, list[ChannelLayout]] = {}
    for t in graph.inputs:
        if not graph.encrypted(t) or not graph.consumers(t):
            continue
        if t in pinned:
            input_options[t] = [pinned[t]]
            continue
        opts = [input_layout(graph, t, S)]
        if free:
            for n in graph.consumers(t):
                for c in cands.get(n.id, []):
                    lay = c.in_layouts.get(t)
                    if lay is not None:
                        opts.append(lay.with_clean(True))
        input_options[t] = list(dict.fromkeys(opts))
    return input_options


def _conversion_costs(
    src_layouts: Sequence[Any], cands: Sequence[Candidate], t: str, own: bool, costs: CostTable,
    src_scales: Sequence[float] | None = None,
) -> tuple[tuple[tuple[int | None, ...], ...], tuple[tuple[int, ...], ...]]:
    """Cost (None: impossible or not worth pricing) and depth of converting operand ``t``
    from each source layout to what each candidate reads.  A source option whose result is
    scaled (planner.fold) pairs only with a candidate that expects that factor."""
    mat: list[tuple[int | None, ...]] = []
    dmat: list[tuple[int, ...]] = []
    for i, sl in enumerate(src_layouts):
        row: list[int | None] = []
        drow: list[int] = []
        scale = src_scales[i] if src_scales is not None else 1.0
        for c in cands:
            dl = c.in_layouts.get(t)
            drow.append(0)
            if dl is None or own and sl.with_clean(True) != dl.with_clean(True) or c.operand_scales.get(t, 1.0) != scale:
                row.append(None)
                continue
            try:
                cv = plan_conversion(sl, dl).cost()
            except ValueError:
                row.append(None)
                continue
            row.append(costs.iscore(cv))
            drow[-1] = cv.depth
        mat.append(tuple(row))
        dmat.append(tuple(drow))
    return tuple(mat), tuple(dmat)


# Node-granularity key residency (used when a memory cap is set): key load time relative
# to one rotation, from shared/notes/lattigo-gopy.md at LogN 16 (an 80 MiB key reads back
# in ~47.5 ms; a rotation at the top level takes ~150 ms), scaled by key size.
KEY_LOAD_ROTATIONS_PER_80MIB = 47.5 / 150.0
# Candidates whose own program is too large to walk for the residency model are kept
# (the instruction-level schedule still checks them).
MAX_RESIDENCY_WALK = 200_000


def candidate_min_cap(c: Candidate, params: Params) -> int:
    """Smallest cap under which this candidate can run by itself: the maximum over its
    instructions of its live ciphertexts and plaintexts plus one key (the joint key schedule,
    planner.keyplan, splits a hoisted rotation down to one offset at a time when the cap
    requires it), walked over the candidate's program with its hoisted groups split."""
    from planner.keyplan import fully_split
    from planner.summary import memory_series

    b, _ = c.dry_program(params.slots)
    prog = fully_split(b.instrs).program  # same registers: b.depth covers them
    ser = memory_series(prog, params, depth=b.depth)
    key = params.rotation_key_bytes()
    need = 0
    for i, raw in enumerate(prog):
        n_keys = min(1, len(ir.decode(raw).rot_keys()))
        need = max(need, int(ser["plaintexts"][i] + ser["ciphertexts"][i]) + n_keys * key)
    return need


def _apply_residency(
    cands: dict[str, list[Candidate]], params: Params, cap: int, costs: CostTable
) -> dict[str, list[int]]:
    """Under a cap, drop candidates that cannot run within it (when another can; each keeps
    its ``min_cap_bytes``) and return, per node and in the order of its remaining candidates,
    each one's key-load penalty (objective units): every node loads its distinct keys once
    when they cannot all stay resident (node granularity; the exact instruction-level
    schedule refines it after the solve)."""
    key = params.rotation_key_bytes()
    load_w = costs.weights.rotation * KEY_LOAD_ROTATIONS_PER_80MIB * key / (80 * 2**20)
    penalty: dict[str, list[int]] = {}
    for node, cs in cands.items():
        fits = []
        for c in cs:
            if c.cost(params.slots).rotations + c.cost(params.slots).pmul > MAX_RESIDENCY_WALK:
                fits.append(c)
                continue
            if c.min_cap_bytes is None:
                c.min_cap_bytes = candidate_min_cap(c, params)
            if c.min_cap_bytes <= cap:
                fits.append(c)
        if fits:
            cands[node] = fits
        else:
            # nothing fits: keep the candidates that need the least, so the refusal names
            # the smallest feasible cap whatever cap was asked
            walked = [c.min_cap_bytes for c in cs if c.min_cap_bytes is not None]
            if walked:
                least = min(walked)
                cands[node] = [c for c in cs if (c.min_cap_bytes if c.min_cap_bytes is not None else least) == least]
        penalty[node] = [
            int(round(load_w * len(c.cost(params.slots).rot_keys) * OBJECTIVE_SCALE)) for c in cands[node]
        ]
    return penalty


def _prune(cands: list[Candidate], costs: CostTable, slots: int) -> list[Candidate]:
    """Keep the cheapest candidate per (kernel, input layouts, output layout) (Rotom keeps the
    cheapest kernel per output layout; we keep one per kernel family so reports can show
    every baseline).  Ties break on the label: deterministic."""
    best: dict[tuple[Any, ...], Candidate] = {}
    fused = costs.weights.fused
    for c in cands:
        key = (c.kernel, tuple(sorted(c.in_layouts.items(), key=lambda kv: kv[0])), c.out_layout,
               c.out_scale, tuple(sorted(c.operand_scales.items())))
        cur = best.get(key)
        if cur is None or (costs.iscore(c.cost(slots, fused)), c.label) < (costs.iscore(cur.cost(slots, fused)), cur.label):
            best[key] = c
    return sorted(best.values(), key=lambda c: (costs.iscore(c.cost(slots, fused)), c.kernel, c.label))


def solve_problem(problem: PlanProblem) -> Solution:
    progress.begin("solve")
    # a whole-request wall limit (progress.deadline) caps the solver's own limit
    left = progress.remaining()
    limit = problem.options.time_limit_s if left is None else max(0.05, min(problem.options.time_limit_s, left))
    sol = create(problem.options.solver).solve(problem.model, limit)
    progress.end("solve")
    if sol.status is Status.UNKNOWN and limit < problem.options.time_limit_s:
        progress.check("solve")  # the wall limit, not the solver's own, stopped it
        raise progress.DeadlineExceeded("solve", "no plan found in the time left", progress.limit_seconds() or 0.0)
    if sol.status is Status.INFEASIBLE:
        m = problem.model
        if m.bootstraps and problem.boot_unknown:
            _refuse_unknown_ranges(problem, limit)
        if m.max_depth is not None:
            relaxed = create(problem.options.solver).solve(replace(m, max_depth=None), limit)
            if relaxed.status is not Status.INFEASIBLE:
                raise PlanError(
                    f"no assignment of layouts fits the {m.max_depth} levels of params "
                    f"{problem.params.name}; choose a preset with more levels"
                )
        raise PlanError("no consistent assignment of layouts exists for this graph")
    return sol


def _refuse_unknown_ranges(problem: PlanProblem, limit: float) -> None:
    """The plan needs a bootstrap of a value whose range is unknown: name the tensor."""
    m = problem.model
    relaxed = replace(m, groups=tuple(replace(g, bootable=True) if g.name in problem.boot_unknown else g
                                      for g in m.groups))
    sol = create(problem.options.solver).solve(relaxed, limit)
    if sol.status in (Status.OPTIMAL, Status.FEASIBLE):
        need = [b for b in sol.boots if b in problem.boot_unknown] or sorted(problem.boot_unknown)
        src = problem.boot_unknown[need[0]]
        why = (f"input {src!r} has no `range` [lo, hi] in the graph" if src in problem.graph.tensors
               and problem.graph.producer(src) is None else f"the interval of {src!r} is unbounded")
        raise PlanError(
            f"the graph is deeper than the {m.max_depth} levels of params {problem.params.name}, so the value of "
            f"{need[0]!r} must be bootstrapped, but its range is unknown ({why}); bootstrapping accepts "
            f"only |values| <= {problem.params.boot.max_abs if problem.params.boot else 0:g}",
            need[0],
        )


class PlanTimeout(PlanError):
    """The solver hit its time limit before finding any plan (CLI exit status 3)."""


class PlanWallTimeout(PlanTimeout):
    """The whole planning request ran past its wall limit (``plan_graph(wall_limit_s=)``)."""


def lower_solution(
    problem: PlanProblem, sol: Solution, claims: list[LayoutClaim] | None = None
) -> tuple[dict[str, Any], LazyTables]:
    """The plan of a solved problem.  Each node's entry records the program span it owns
    (its conversions, its kernel, its output mask) and the counts of that span, so the
    per-node numbers add up to the summary.  ``claims`` (when given) receives what the
    lowering asserts about registers, for ``backends.layout_check``."""
    graph, params = problem.graph, problem.params
    S = params.slots
    b = ProgramBuilder(S)
    choice = dict(sol.choice)
    boots = frozenset(sol.boots)
    regs: dict[str, list[str]] = {}
    layout_of: dict[str, ChannelLayout] = {}
    claims = claims if claims is not None else []
    for t, opts in problem.input_options.items():
        lay = opts[choice[f"input:{t}"]]
        layout_of[t] = lay
        regs[t] = [
            b.input(t, f"in/{t}/{q}", _map_gen(lay, q)) for q in range(lay.n_ct)
        ]
        claims.append(LayoutClaim(f"input {t}", t, lay, tuple(regs[t])))
    nodes_json: list[dict[str, Any]] = []
    progress.begin("lowering", len(graph.nodes))
    for node in graph.nodes:
        cand = problem.candidates[node.id][choice[node.id]]
        start = len(b.instrs)
        op_regs: dict[str, list[str]] = {}
        conversions = []
        for t in dict.fromkeys(node.inputs):
            if not graph.encrypted(t):
                continue
            conv = plan_conversion(layout_of[t], cand.in_layouts[t])
            op_regs[t] = conv.lower(b, regs[t], f"conv/{node.id}/{t}")
            if conv.kind != "none":
                conversions.append({"operand": t, "kind": conv.kind, "rotations": conv.cost().rotations})
                claims.append(LayoutClaim(f"conversion {t} -> {node.id}", t, cand.in_layouts[t], tuple(op_regs[t]),
                                          cand.operand_scales.get(t, 1.0)))
        outs = cand.lower(b, op_regs)
        out_layout = cand.out_layout
        if node.id in boots:
            outs, out_layout = _lower_bootstrap(b, outs, out_layout, problem.boot_scales[node.id], node.id)
        regs[node.id] = outs
        layout_of[node.id] = out_layout
        claims.append(LayoutClaim(f"node {node.id}", node.id, out_layout, tuple(outs), cand.out_scale))
        end = len(b.instrs)
        cv = cand.cost(S)
        nodes_json.append(
            {
                "id": node.id,
                "op": node.op,
                "kernel": cand.kernel,
                "params": cand.params,
                **({"min_cap_bytes": cand.min_cap_bytes} if cand.min_cap_bytes is not None else {}),
                **span_counts(b.instrs[start:end]),
                "span": [start, end],
                "cost": cv.to_json(),
                "in_layouts": [
                    (cand.in_layouts[t].notation() if t in cand.in_layouts else "plaintext")
                    for t in node.inputs
                ],
                "out_layout": cand.out_layout.notation(),
                "conversions": conversions,
                **({"bootstraps": sum(1 for i in b.instrs[start:end] if ir.is_bootstrap(ir.decode(i)))}
                   if params.boot is not None else {}),
            }
        )
        progress.advance("lowering", node.id)
    progress.end("lowering")
    for t in graph.outputs:
        lay = layout_of[t]
        for q in range(lay.n_ct):
            b.output(regs[t][q], t, f"out/{t}/{q}", _map_gen(lay, q))
    program = b.instrs
    summary = summarize(program, params, len(b.plaintexts))
    if summary["depth"] > params.max_level:
        raise PlanError(
            f"the plan needs multiplicative depth {summary['depth']} but params {params.name} have "
            f"{params.max_level} levels; choose a preset with more levels"
        )
    summary["memory_cap_bytes"] = problem.options.memory_cap_bytes
    # whether every output ciphertext holds zeros outside its tensor (checked on the
    # simulator's registers by backends.layout_check)
    summary["clean_outputs"] = all(
        layout_of[t].clean for t in graph.outputs if graph.encrypted(t) and t in layout_of
    )
    summary["solver"] = {
        "name": sol.solver,
        "status": sol.status.value,
        "objective": sol.objective,
        "bound": sol.bound,
        "seconds": 0.0,
    }
    summary["plan_seconds"] = 0.0
    if params.boot is not None:
        summary["bootstrapping"] = _boot_report(problem, sol)
    plan = {
        "schema": PLAN_SCHEMA,
        "graph": {"name": graph.name, "sha256": graph.sha256, "spec": graph.to_json()},
        "params": params.to_json(),
        "options": problem.options.to_json(),
        "summary": summary,
        "outputs": {t: list(graph.shape(t)) for t in graph.outputs},
        "nodes": nodes_json,
        "plaintexts": {
            name: p.to_json() for name, p in b.plaintexts.items()
        },
        "program": program,
    }
    return plan, LazyTables(b.tables)


# Bits of precision of one bootstrap on Lattigo relative to the bound of its input, in the
# worst case (a constant vector at |x| = boot.max_abs = 1/16: 3.2e-8, about 21 bits; see
# planner/params.py BOOT_MAX_ABS), and the bound (in bits) above which a plan warns that
# values of order 1 keep fewer than 21 - 8 = 13 of them.
BOOT_PRECISION_BITS = 21
BOOT_BOUND_WARN_BITS = 8


def _lower_bootstrap(
    b: ProgramBuilder, regs: list[str], lay: ChannelLayout, s: int, node_id: str
) -> tuple[list[str], ChannelLayout]:
    """Bootstrap every ciphertext of a node's result: before it one pmul by ``1/s`` on the
    layout's slots and 0 on its free slots (when scaled, or when the layout is dirty: the
    free slots' partial sums have no bound), after it one pmul by ``s`` (when scaled)."""
    slots = b.slots
    masked = not lay.clean
    out: list[str] = []
    for q, r in enumerate(regs):
        if s > 1 or masked:
            pt = b.const_plaintext(
                ("boot-in", node_id, q), f"pt/boot/{node_id}/{q}",
                lambda q=q: np.where(lay.index_map(q) >= 0, 1.0 / s, 0.0),  # type: ignore[misc]
            )
            r = b.rescale(b.pmul(r, pt))
        r = b.bootstrap(r)
        if s > 1:
            up = b.const_plaintext(("boot-up", s), f"pt/boot/scale/{s}", lambda: np.full(slots, float(s)))
            r = b.rescale(b.pmul(r, up))
        out.append(r)
    return out, lay.with_clean(True) if masked else lay


def _boot_report(problem: PlanProblem, sol: Solution) -> dict[str, Any]:
    """What a bootstrapping plan assumes and how its placement compares with first fit."""
    m = problem.model
    choice = dict(sol.choice)
    lazy = m.lazy_boots(choice)
    greedy, greedy_lazy = m.greedy_boots()
    ranges = problem.ranges

    def n_boot(groups: frozenset[str] | None, ch: Mapping[str, int]) -> int | None:
        return None if groups is None else sum(m.group(g).n_ct(ch[g]) for g in groups)

    scales = {v: problem.boot_scales[v] for v in sorted(sol.boots) if problem.boot_scales.get(v, 1) > 1}
    # Lattigo's bootstrap keeps about 21 bits relative to the bound of what it refreshes;
    # a loose bound (interval arithmetic through many layers) leaves values of order 1 fewer
    def warn(v: str, s: int) -> str | None:
        bound = ranges.bound(v) if ranges else None
        if bound is None or bound <= 2.0**BOOT_BOUND_WARN_BITS:
            return None
        left = max(0, BOOT_PRECISION_BITS - math.ceil(math.log2(bound)))
        return (f"the bootstrap of {v!r} scales by 2^{s.bit_length() - 1} (worst-case bound {bound:.3g}): Lattigo keeps "
                f"~{BOOT_PRECISION_BITS} bits relative to that bound, so values of order 1 keep about {left}; "
                "give the graph's nodes measured `range`s for a tighter bound")

    warnings = [w for v, s in scales.items() if (w := warn(v, s)) is not None]
    return {
        "values": sorted(sol.boots),
        "scales": scales,
        **({"warnings": warnings} if warnings else {}),
        "bounds": {v: ranges.bound(v) for v in sorted(sol.boots)} if ranges is not None else {},
        "assumed_ranges": {t: list(iv) for t, iv in sorted(ranges.assumed.items())} if ranges is not None else {},
        "max_abs": problem.params.boot.max_abs if problem.params.boot is not None else None,
        # first fit (bootstrap an operand only when its reader would not fit, as late as
        # possible) on the same layouts, and on the greedy layouts
        "first_fit": {"values": None if lazy is None else len(lazy), "bootstraps": n_boot(lazy, choice)},
        "first_fit_greedy_layouts": {
            "values": None if greedy_lazy is None else len(greedy_lazy),
            "bootstraps": n_boot(greedy_lazy, greedy),
        },
    }


def _map_gen(lay: ChannelLayout, q: int):  # noqa: ANN202
    def gen() -> tuple[np.ndarray, None]:
        return lay.index_map(q).copy(), None

    return gen


def plan_graph(
    graph: Graph, params: Params, options: PlanOptions | None = None, record_timings: bool = False,
    wall_limit_s: float | None = None, wall_started: float | None = None,
) -> PlanResult:
    """Plan a graph.  Timings go to PlanResult.seconds and solution.seconds; the plan
    document records them only with ``record_timings`` (plans are byte-for-byte
    deterministic by default).  ``wall_limit_s`` bounds the whole planning (candidates,
    pricing, solve, lowering, key schedule) in wall time, counted from ``wall_started`` (a
    ``time.monotonic()`` reading; default: the call) so that callers can include reading the
    graph: past it, :class:`PlanWallTimeout` names the step where planning stopped (the
    solver's limit is capped by what is left)."""
    options = options or PlanOptions()
    if options.batch is not None:
        from planner.batch import plan_batched

        return plan_batched(graph, params, options, record_timings, wall_limit_s, wall_started)
    t0 = time.perf_counter()
    from planner.params import check_security

    insecure = check_security(params, options.allow_insecure)
    claims: list[LayoutClaim] = []
    try:
        with progress.deadline(wall_limit_s, wall_started):
            problem = build_problem(graph, params, options)
            try:
                sol = solve_problem(problem)
            except PlanError as e:
                # under a cap, the candidates were cut to those that fit it: when that leaves no
                # assignment within the levels, plan without the cut and let the key schedule
                # below name the smallest feasible cap (or fit the cap after all)
                if options.memory_cap_bytes is None or problem.model.max_depth is None:
                    raise
                problem = build_problem(graph, params, replace(options, memory_cap_bytes=None))
                try:
                    sol = solve_problem(problem)
                except PlanError:
                    raise e from None
            if sol.status is Status.UNKNOWN:
                raise PlanTimeout(
                    f"the solver found no plan within {options.time_limit_s} s; raise --time-limit"
                )
            plan, tables = lower_solution(problem, sol, claims)
            if options.memory_cap_bytes is not None:
                # rotation-key schedule under the cap (planner.keyplan: key set, hoisted-group
                # splits and residency chosen together for the smallest modelled time; raises
                # KeyCapError naming the smallest feasible cap); every table stays valid
                from planner.keys import schedule_plan

                left = progress.remaining()
                plan, _ = schedule_plan(
                    plan, options.memory_cap_bytes, "joint",
                    time_limit_s=options.time_limit_s if left is None else max(0.05, min(options.time_limit_s, left)),
                )
                progress.check("key schedule")
    except progress.DeadlineExceeded as e:
        raise PlanWallTimeout(str(e)) from None
    seconds = time.perf_counter() - t0
    if insecure:
        plan["summary"]["insecure"] = True
    if record_timings:
        plan["summary"]["solver"]["seconds"] = round(sol.seconds, 6)
        plan["summary"]["plan_seconds"] = round(seconds, 6)
    return PlanResult(plan, tables, sol, problem, seconds, claims)


def auto_params(graph: Graph, options: PlanOptions | None = None) -> Params:
    """``--params auto``: the smallest secure preset whose levels fit the graph without
    bootstrapping (n13, n14, n15, n16 in this order), else ``n16boot``.  A preset is skipped
    at once when even the shallowest option of some node is too deep (a lower bound from
    the choice model), else the solver decides whether an assignment fits."""
    from planner.params import PRESETS, SECURE_PRESETS_BY_SIZE

    options = options or PlanOptions()
    for name in SECURE_PRESETS_BY_SIZE:
        params = PRESETS[name]
        try:
            with progress.stage(f"auto: {name}"):
                problem = build_problem(graph, params, replace(options, memory_cap_bytes=None))
                if min_depth(problem.model) > params.max_level:
                    continue
                solve_problem(problem)
        except PlanTimeout:
            raise
        except SlotplanError:
            continue  # does not fit this preset (depth, slots): try the next one
        return params
    return PRESETS["n16boot"]


def min_depth(model: ChoiceModel) -> int:
    """A lower bound on the depth of every assignment without bootstraps: per option the
    shallowest way its operands can arrive (ignoring that readers of one value share its
    option)."""
    inc = model.incoming()
    best: dict[str, list[int]] = {}
    big = 1 << 30
    for g in model.groups:
        row = []
        for o in range(len(g.costs)):
            d = 0
            for e in inc.get(g.name, []):
                arr = [best[e.src][a] + e.depth(a, o) for a in range(len(best[e.src])) if e.costs[a][o] is not None]
                d = max(d, min(arr, default=big))
            reset = g.reset(o)
            row.append(d + g.depth(o) if reset is None else reset)  # (its levels before the reset ignored)
        best[g.name] = row
    return max((min(r) for r in best.values()), default=0)


def plan_table_names(plan: Mapping[str, Any]) -> list[str]:
    names: list[str] = []
    for ins in plan["program"]:
        if "table" in ins:
            names.append(ins["table"])
    for p in plan["plaintexts"].values():
        names.append(p["table"])
        if "imag_table" in p:  # a complex plaintext (complex packing)
            names.append(p["imag_table"])
    return list(dict.fromkeys(names))


def kernel_names() -> Sequence[str]:
    return KERNEL_FAMILIES.names()
