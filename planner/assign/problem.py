"""The assignment problem: every node's priced candidates, every input's layout options and
the conversions between them, built into one solver-neutral choice model
(:class:`solver.model.ChoiceModel`).  Analysis only: nothing here writes a program."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from common import progress
from common.errors import SlotplanError
from planner import ir
from planner.assign import boot_variants
from planner.assign.candidates import (
    COMPLEX_KERNELS,
    KERNEL_FAMILIES,
    LINEAR_KERNELS,
    PlanError,
    concat_candidates,
    elementwise_candidates,
    fold_scale,
    input_layout,
    linear_candidates,
    matmul_candidates,
    share_keys,
    slice_candidates,
    view_candidates,
    with_clean_output,
)
from planner.assign.densify import densified_variants
from planner.assign.fold import (
    add_scaled_variants,
    foldable_into,
    result_absorbs,
    result_masks,
    scale_product_cost,
)
from planner.assign.options import PlanOptions, resolve_objective
from planner.cost.tables import OBJECTIVE_SCALE, CostTable, load_costs
from planner.cost.timing import TimeModel
from planner.frontend.graph import Graph, Node
from planner.frontend.params import Params
from planner.frontend.ranges import RangeReport, boot_scale, graph_ranges, operand_bound
from planner.ir.instructions import MAX_BOOT_IN_SCALE, MAX_BOOT_SCALE
from planner.kernels.base import Candidate, sequential
from planner.kernels.convert import plan_conversion
from planner.layout.channels import ChannelLayout
from planner.layout.rotom import parse_layout
from solver.model import FULL, BootOption, ChoiceModel, Edge, Group

# Bits of precision of one bootstrap on Lattigo relative to the bound of its input, in the
# worst case (a constant vector at |x| = boot.max_abs = 1/16: 3.2e-8, about 21 bits; see
# planner/frontend/params.py BOOT_MAX_ABS), and the bound (in bits) above which a plan warns that
# values of order 1 keep fewer than 21 - 8 = 13 of them.
BOOT_PRECISION_BITS = 21
BOOT_BOUND_WARN_BITS = 8


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
    # issue 36: the scale of each bootstrappable value for the packed variants (halves,
    # pairs: within boot.max_abs / 2), and the variants offered (label -> table units)
    boot_half_scales: dict[str, int] = field(default_factory=dict)
    boot_prices: dict[str, float] = field(default_factory=dict)


def _group_of(graph: Graph, tensor: str) -> str:
    return tensor if graph.producer(tensor) is not None else f"input:{tensor}"


def build_problem(graph: Graph, params: Params, options: PlanOptions, least_memory: bool = False) -> PlanProblem:
    """Candidates of every node, layout options of every encrypted input, conversion
    costs between them: the choice model the solver picks from. ``least_memory`` (with a
    memory cap): every node keeps only its candidates that need the least memory, whatever
    the cap (the plan whose smallest feasible cap a refusal names, planner/single.py)."""
    S = params.slots
    options = resolve_objective(options.with_packing(), params)
    if options.boot_variant_slots is not None:
        offered = sorted(v.log_slots for v in params.boot.variants) if params.boot is not None else []
        unknown = [k for k in options.boot_variant_slots if k not in offered]
        if unknown:
            raise PlanError(f"options.boot_variant_slots: {unknown[0]} is not the log2 slot count of a bootstrap "
                            f"variant these params offer (offered: {', '.join(map(str, offered)) or 'none'})")
    costs = load_costs(options.costs)
    tm = TimeModel(costs)  # the objective's prices (planner.cost.timing)
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
            out = out + densified_variants(out, S, options.densify_room)
        cands[node.id] = _prune(out, tm, S)
        progress.advance("candidates", node.id)
    progress.end("candidates")
    _fold_chebyshev(graph, cands, params, ranges, tm)
    input_options = _input_options(graph, cands, pinned, free, S)
    penalty: dict[str, list[int]] = {}
    if options.memory_cap_bytes is not None:
        # the cap bounds the process (planner.cost.process): the candidates' working sets
        # keep to what the executor's fixed state leaves of it
        from planner.cost.process import fixed_reserve

        cut = 1 if least_memory else max(1, fixed_reserve(params).plan_cap(options.memory_cap_bytes))
        penalty = _apply_residency(cands, params, cut, tm)
    groups: list[Group] = []
    for t, opts in input_options.items():
        groups.append(Group(f"input:{t}", tuple(0 for _ in opts), tuple(o.notation() for o in opts)))
    boot_scales: dict[str, int] = {}
    boot_unknown: dict[str, str] = {}
    half_scales: dict[str, int] = {}
    # (complex-packed plans keep the full-slot bootstrap: a variant refreshes real values only)
    prices = boot_variants.priced(costs, params, options.boot_variants and options.packing == "real",
                                  options.boot_variant_slots)
    fused = costs.weights.fused  # price what the Lattigo executor fuses (Candidate.cost)
    for node in graph.nodes:
        cs = cands[node.id]
        bootable, pres, post = _boot_options(graph, node, cs, params, ranges, boot_scales, boot_unknown)
        variants = _variant_options(node.id, cs, bootable, pres, post, prices, boot_scales, half_scales, ranges,
                                    params, tm, partial(_reads_replicas, graph, node.id, cands=cands))
        # a candidate that bootstraps inside itself (a CinS layer): the levels it uses
        # before its bootstraps, and its result's depth
        rds = [c.reset_depths(S) for c in cs]
        groups.append(
            Group(node.id, tuple(tm.units(c.cost(S, fused)) + p
                                 for c, p in zip(cs, penalty.get(node.id) or [0] * len(cs), strict=True)),
                  tuple(c.label for c in cs),
                  depths=tuple(c.cost(S).depth if rd is None else rd[0] for c, rd in zip(cs, rds, strict=True)),
                  n_cts=tuple(c.out_layout.n_ct for c in cs) if params.boot is not None else (),
                  bootable=bootable, boot_pres=pres, boot_post=post,
                  resets=tuple(None if rd is None else rd[1] for rd in rds) if any(rds) else (),
                  boot_variants=variants)
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
            mat, dmat = _conversion_costs(src_layouts, cands[node.id], t, own, tm, src_scales)
            edges.append(Edge(src, node.id, t, mat, dmat, adapts=own))
        progress.advance("conversions", node.id)
    progress.end("conversions")
    all_candidates = {k: list(v) for k, v in cands.items()}  # issue 17: runner-ups may be pruned ones
    boot_weight = tm.bootstrap_units() if params.boot is not None else None
    model, keep = ChoiceModel(tuple(groups), tuple(edges), params.max_level, boot_weight).prune_dominated()
    for node in graph.nodes:
        cands[node.id] = [cands[node.id][o] for o in keep[node.id]]
    hint, lazy = model.greedy_boots() if model.bootstraps else (model.greedy(), frozenset())
    model = ChoiceModel(
        tuple(replace(g, hint=hint.get(g.name, 0), boot_hint=g.name in (lazy or ())) for g in model.groups),
        model.edges, model.max_depth, model.boot_weight,
    )
    return PlanProblem(graph, params, options, costs, cands, input_options, model, operand_source,
                       all_candidates, ranges, boot_scales, boot_unknown, half_scales, prices)


def _variant_options(
    node_id: str, cs: Sequence[Candidate], bootable: bool, pres: tuple[int, ...], post: int,
    prices: Mapping[str, float], scales: Mapping[str, int], half_scales: dict[str, int],
    ranges: RangeReport | None, params: Params, tm: TimeModel,
    replicas: Callable[[Candidate], bool] = lambda c: False,
) -> tuple[tuple[BootOption, ...], ...]:
    """Each candidate's bootstrap variants besides the full bootstrap
    (planner.assign.boot_variants); () when none is offered.  ``replicas``: whether the
    node's readers take a candidate's result with copies in its free slots (``r<k>``)."""
    if not bootable or not prices or ranges is None or params.boot is None:
        return ()
    bound = ranges.bound(node_id)
    assert bound is not None
    s = scales[node_id]
    # (a candidate holding a factor times the value, planner.assign.fold, within it too)
    sh = half_scales[node_id] = boot_scale(bound * max(1.0, *(abs(c.out_scale) for c in cs)), params.boot.max_abs / 2)
    full_w = tm.bootstrap_units()
    out = tuple(
        boot_variants.options(c.out_layout, c.out_layout.n_ct, c.out_layout.clean or result_masks(c, params.slots),
                              s, sh, prices, BootOption(FULL, full_w * c.out_layout.n_ct, pre, post),
                              absorbs=c.out_layout.clean and result_absorbs(c, params.slots)
                              or result_masks(c, params.slots),
                              replicas=any(k[0] == "r" for k in prices) and replicas(c),
                              halves_free=result_masks(c, params.slots))
        for c, pre in zip(cs, pres, strict=True)
    )
    return out if any(out) else ()


def _reads_replicas(graph: Graph, node_id: str, c: Candidate, *, cands: Mapping[str, Sequence[Candidate]]) -> bool:
    """Whether the readers of node ``node_id`` take candidate ``c``'s result with copies in
    its free slots (an ``r<k>`` bootstrap's, planner.assign.boot_variants) as they take the
    candidate's own: its layout is dirty already, or every reader candidate's conversion
    from it is the same (kind and cost) from that layout dirty (its kernel reads no free
    slot: a diagonal product's zero columns, an element-wise op with a dirty result).  A
    graph output keeps a clean layout clean."""
    lay = c.out_layout
    if not lay.clean:
        return True
    if node_id in graph.outputs:
        return False
    dirty = lay.with_clean(False)
    for reader in graph.consumers(node_id):
        for d in cands[reader.id]:
            dl = d.in_layouts.get(node_id)
            if dl is None:
                continue
            try:
                a = plan_conversion(lay, dl)
            except ValueError:
                continue
            b = plan_conversion(dirty, dl)
            if a.kind != b.kind or a.cost() != b.cost():
                return False
    return True


def _boot_options(
    graph: Graph, node: Node, cs: Sequence[Candidate], params: Params, ranges: RangeReport | None,
    scales: dict[str, int], unknown: dict[str, str],
) -> tuple[bool, tuple[int, ...], int]:
    """Whether a node's result may be bootstrapped, and the levels around a bootstrap: per
    candidate one level before it when its layout is dirty (a mask zeroes the free slots,
    whose partial sums no range bounds) but for a result its own polys write (the mask is
    theirs), and for a clean one whose ``s`` exceeds in_scale's bound (2^12) and whose own
    products cannot take the 1/s; one after it where ``s`` exceeds the full bootstrap's
    integer scale's bound (2^20); none otherwise: the scaling by ``1/s`` is the bootstrap's
    ``in_scale`` (a relabelled scale) and the ``s`` after it its ``scale`` (an exact integer
    product; planner.lower.lowering._lower_bootstrap)."""
    if params.boot is None or ranges is None or not graph.encrypted(node.id) or not graph.consumers(node.id):
        return False, (), 0
    bound = ranges.bound(node.id)
    if bound is None:
        unknown[node.id] = ranges.unknown_source.get(node.id, node.id)
        return False, (), 0
    # (a candidate holding a factor times the value, planner.assign.fold: the scaled bound)
    s = boot_scale(bound * max(1.0, *(abs(c.out_scale) for c in cs)), params.boot.max_abs)
    scales[node.id] = s

    def pre(c: Candidate) -> int:
        if result_masks(c, params.slots):  # the mask (and 1/s) is the node's polys' own
            return 0
        if not c.out_layout.clean:  # the mask product, with the 1/s
            return 1
        # in_scale takes the 1/s up to its bound; above it the node's products, else a product
        return int(s > MAX_BOOT_IN_SCALE and not result_absorbs(c, params.slots))

    # after it: the full bootstrap's integer scale up to its bound, a product above it
    return True, tuple(pre(c) for c in cs), int(s > MAX_BOOT_SCALE)


def _fold_chebyshev(
    graph: Graph, cands: dict[str, list[Candidate]], params: Params, ranges: RangeReport | None, tm: TimeModel
) -> None:
    """Scaled variants of the producers of folded Chebyshev polys (planner.assign.fold).  At a
    bootstrapping preset a node's bootstrap scale is that of its largest factor times its
    bound (``_boot_options``), so a factor above 1 is kept unless the scaled bound leaves
    what a bootstrap may refresh (``BOOT_BOUND_WARN_BITS``): the relative precision of the
    refreshed value is the same (value and scale grow alike).  Until session 35 such a
    factor was refused, which left every Chebyshev ReLU over a domain narrower than 2 one
    level dearer (the ONNX ResNet-20's second and third stages)."""

    def keep_scale(node_id: str, s: float) -> bool:
        if params.boot is None or ranges is None:
            return True
        bound = ranges.bound(node_id)
        return bound is None or s <= 1.0 or bound * s <= 2.0 ** BOOT_BOUND_WARN_BITS

    before = {k: len(v) for k, v in cands.items()}
    add_scaled_variants(graph, cands, params.slots, keep_scale)
    for k, v in cands.items():
        if len(v) != before[k] or any(c.out_scale != 1.0 or c.operand_scales for c in v):
            cands[k] = _prune(v, tm, params.slots)


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
    """The NeuJeans conv layers of a conv2d node (planner.assign.cins_flow.layer_candidate), one
    per family and form (direct, decomposed); none when the layer cannot be bootstrapped
    (its operand's range unknown, or its bound above 2^BOOT_BOUND_WARN_BITS)
    or no CinS layout fits the ring."""
    from planner.assign.cins_flow import layer_candidate
    from planner.kernels.problem import KernelError
    from planner.layout.channels import LayoutError

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
            out.extend(layer_candidate(c, scale, stoc_levels=boot.stoc_levels) for c in make(graph, node, ctx.params.slots)
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
            share_keys(graph, node, out, {t} if free and is_input else set())
        except PlanError:
            if not cins:  # no slot kernel fits: the CinS layers may
                raise
        return out + cins
    if node.op in ("add", "sub", "mul", "poly"):
        out = elementwise_candidates(graph, node, bases)
        if fold_scale(node) is not None and foldable_into(graph, node.inputs[0]) is not None:
            # the change of variable folded into the producer (planner.assign.fold)
            out += elementwise_candidates(graph, node, bases, folded=True)
        share_keys(graph, node, out, set())
        return out
    if node.op == "matmul":
        if not enc:
            raise PlanError("matmul has no encrypted operand: nothing to plan", node.id)
        free_inputs = {t for t in enc if graph.producer(t) is None and free and t not in pinned}
        out = matmul_candidates(graph, node, bases, options.kernels, free_inputs)
        share_keys(graph, node, out, free_inputs)
        return out
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
    src_layouts: Sequence[Any], cands: Sequence[Candidate], t: str, own: bool, tm: TimeModel,
    src_scales: Sequence[float] | None = None,
) -> tuple[tuple[tuple[int | None, ...], ...], tuple[tuple[int, ...], ...]]:
    """Cost (None: impossible or not worth pricing) and depth of converting operand ``t``
    from each source layout to what each candidate reads.  A source option whose result is
    scaled (planner.assign.fold) pairs only with a candidate that expects that factor; a
    candidate that scales the operand on its edge (``Candidate.scale_products``) pays that
    product's cost and level here."""
    mat: list[tuple[int | None, ...]] = []
    dmat: list[tuple[int, ...]] = []
    for i, sl in enumerate(src_layouts):
        row: list[int | None] = []
        drow: list[int] = []
        scale = src_scales[i] if src_scales is not None else 1.0
        for c in cands:
            dl = c.in_layouts.get(t)
            drow.append(0)
            if dl is None or own and sl.with_clean(True) != dl.with_clean(True) or c.arrival_scale(t) != scale:
                row.append(None)
                continue
            try:
                cv = plan_conversion(sl, dl).cost()
            except ValueError:
                row.append(None)
                continue
            if t in c.scale_products:  # the factor: a product by a constant per ciphertext after it
                cv = sequential(cv, scale_product_cost(dl.n_ct))
            row.append(tm.units(cv))
            drow[-1] = cv.depth
        mat.append(tuple(row))
        dmat.append(tuple(drow))
    return tuple(mat), tuple(dmat)


# Node-granularity key residency (used when a memory cap is set): each key load priced by
# the time model's node estimate (planner.cost.timing.TimeModel.node_key_load).
# Candidates whose own program is too large to walk for the residency model are kept
# (the instruction-level schedule still checks them).
MAX_RESIDENCY_WALK = 200_000


def candidate_min_cap(c: Candidate, params: Params) -> int:
    """Smallest cap under which this candidate can run by itself: the maximum over its
    instructions of its live ciphertexts and plaintexts plus one key (the joint key schedule,
    planner.keys.joint, splits a hoisted rotation down to one offset at a time when the cap
    requires it), walked over the candidate's program with its hoisted groups split."""
    from planner.ir.analysis import memory_series
    from planner.ir.hoisting import fully_split

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
    cands: dict[str, list[Candidate]], params: Params, cap: int, tm: TimeModel
) -> dict[str, list[int]]:
    """Under a cap, drop candidates that cannot run within it (when another can; each keeps
    its ``min_cap_bytes``) and return, per node and in the order of its remaining candidates,
    each one's key-load penalty (objective units): every node loads its distinct keys once
    when they cannot all stay resident (node granularity; the exact instruction-level
    schedule refines it after the solve)."""
    key = params.rotation_key_bytes()
    load_w = tm.node_key_load(key)
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


def _prune(cands: list[Candidate], tm: TimeModel, slots: int) -> list[Candidate]:
    """Keep the cheapest candidate per (kernel, input layouts, output layout) (Rotom keeps the
    cheapest kernel per output layout; we keep one per kernel family so reports can show
    every baseline).  Ties break on the label: deterministic."""
    best: dict[tuple[Any, ...], Candidate] = {}
    fused = tm.fused
    for c in cands:
        key = (c.kernel, tuple(sorted(c.in_layouts.items(), key=lambda kv: kv[0])), c.out_layout,
               c.out_scale, tuple(sorted(c.operand_scales.items())), c.scale_products)
        cur = best.get(key)
        if cur is None or (tm.units(c.cost(slots, fused)), c.label) < (tm.units(cur.cost(slots, fused)), cur.label):
            best[key] = c
    return sorted(best.values(), key=lambda c: (tm.units(c.cost(slots, fused)), c.kernel, c.label))


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
            # (an operand may arrive below depth 0: a CinS layer gives levels back)
            d = max((min([best[e.src][a] + e.depth(a, o) for a in range(len(best[e.src]))
                          if e.costs[a][o] is not None], default=big)
                     for e in inc.get(g.name, [])), default=0)
            reset = g.reset(o)
            row.append(d + g.depth(o) if reset is None else reset)  # (its levels before the reset ignored)
        best[g.name] = row
    return max((min(r) for r in best.values()), default=0)


def kernel_names() -> Sequence[str]:
    return KERNEL_FAMILIES.names()
