"""Kernel candidates per node, for each layout its encrypted operands may arrive in."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from common.errors import SlotplanError
from common.registry import Registry
from planner.frontend.graph import Graph, Node
from planner.ir.builder import ProgramBuilder, poly_depth
from planner.kernels.base import Candidate
from planner.kernels.ctct import jkls_candidates
from planner.kernels.diagonal import DiagonalKernel
from planner.kernels.fhelipe import FhelipeMatvec
from planner.kernels.hybrid import hybrid_candidates
from planner.kernels.imra import ImraKernel
from planner.kernels.model_ops import (
    batched_matmul_candidate,
    concat_candidate,
    concat_packed_candidate,
    matrix_subgraph,
    slice_candidate,
    slice_compact_candidate,
)
from planner.kernels.problem import (
    ChannelProblem,
    KernelError,
    conv_problem,
    margin_layout,
    matmul_problem,
    matvec_problem,
)
from planner.kernels.segmented import segment_rows_layout, segmented_candidates
from planner.kernels.tensor_ops import matmul_ct_ct_candidate, shape_view_candidates, sum_candidate
from planner.layout.channels import (
    ChannelLayout,
    LayoutError,
    MappedLayout,
    all_maps,
    clean_result,
    natural_layout,
    view_layout,
)


class PlanError(SlotplanError):
    """The graph is valid but cannot be planned; names the node and the reason."""

    def __init__(self, rule: str, node: str | None = None):
        self.node = node
        self.rule = rule
        super().__init__(f"node {node!r}: {rule}" if node else rule)


def _linear_problem(graph: Graph, node: Node, base: ChannelLayout) -> ChannelProblem:
    x, w = node.inputs
    if node.op == "matvec":
        n, k = graph.shape(x)
        return matvec_problem(w, x, n, k, base)
    stride = node.stride or (1, 1)
    padding = node.padding or (0, 0)
    groups = node.groups or 1
    w_shape = graph.shape(w)
    assert len(w_shape) == 4
    try:
        return conv_problem(x, w, (w_shape[0], w_shape[1], w_shape[2], w_shape[3]), base, stride, padding, groups)
    except LayoutError:
        c, h, ww = graph.shape(x)
        m = margin_layout((c, h, ww), base.slots, (w_shape[2], w_shape[3]), stride, padding)
        return conv_problem(x, w, (w_shape[0], w_shape[1], w_shape[2], w_shape[3]), m, stride, padding, groups)


def _imra_kernel(prob: ChannelProblem) -> ImraKernel:
    """IMRA with the default output partition, else with fewer output channels per
    ciphertext (a smaller square-ified block can fit when padding would not)."""
    first: KernelError | None = None
    tried: set[int] = set()
    cpc = prob.cpc_out
    options = [cpc, min(prob.cpc_in, prob.n)] + [max(1, cpc >> s) for s in range(1, cpc.bit_length())]
    for c in options:
        if c in tried:
            continue
        tried.add(c)
        variant = prob if c == cpc else replace(prob, out_layout=replace(prob.out_layout, cpc=c))
        try:
            return ImraKernel(variant, free_input=False)
        except KernelError as e:
            first = first or e
    assert first is not None
    raise first


# ---------------------------------------------------------------------- kernel families

# (problem, node, free_input, out): appends the family's candidates to ``out`` (those made
# before a KernelError stay)
LinearCandidates = Callable[[ChannelProblem, Node, bool, list[Candidate]], None]


@dataclass(frozen=True)
class KernelFamily:
    """A kernel family a user can allow (``--kernels``).  ``kind``: ``linear`` (matvec,
    conv and plaintext-weight matmul, from a channel problem: ``linear`` makes its
    candidates), ``ct-ct`` (matmul of two ciphertexts) or ``elementwise`` (every other
    op; always allowed)."""

    name: str
    kind: str
    linear: LinearCandidates | None = None
    # kind "cins": (graph, node, slots) -> the family's CinS candidates (docs/cins.md)
    cins: Callable[[Graph, Node, int], list[Candidate]] | None = None


# Kernel families by name, in the order plans record them (PlanOptions.kernels).
KERNEL_FAMILIES: Registry[KernelFamily] = Registry("kernel", "known kernels")


def _family(
    name: str, kind: str, linear: LinearCandidates | None = None,
    cins: Callable[[Graph, Node, int], list[Candidate]] | None = None,
) -> None:
    fam = KernelFamily(name, kind, linear, cins)
    KERNEL_FAMILIES.register(name, lambda: fam)


def _cins_family(kind: str, depthwise: bool) -> Callable[[Graph, Node, int], list[Candidate]]:
    """NeuJeans conv candidates of a conv2d node (planner/kernels/cins.py): unit stride, or
    a strided conv both direct (step s) and decomposed (Alg. 2)."""

    def make(graph: Graph, node: Node, slots: int) -> list[Candidate]:
        from planner.kernels.cins import cins_conv

        if node.op != "conv2d":
            return []
        x, w = node.inputs
        xs, ws = graph.shape(x), graph.shape(w)
        groups = node.groups or 1
        if depthwise != (groups > 1 and ws[1] == 1):
            return []
        s1, s2 = node.stride or (1, 1)
        if s1 != s2:
            raise KernelError("cins kernels take square strides")
        pad = node.padding or (0, 0)
        out = []
        for decomposed in ([False, True] if s1 > 1 else [False]):
            k = cins_conv(x, w, (xs[0], xs[1], xs[2]), (ws[0], ws[1], ws[2], ws[3]), slots, s1, pad, groups,
                          decomposed, kind)
            out.append(k.candidate(node.id, "cins-dw" if depthwise else f"cins-{kind}"))
        return out

    return make


def _imra_candidates(prob: ChannelProblem, node: Node, free_input: bool, out: list[Candidate]) -> None:
    k = _imra_kernel(prob)
    out.append(k.candidate(node.id))
    if free_input:
        out.append(ImraKernel(k.prob, free_input=True).candidate(node.id))


def _diagonal_candidates(kind: str) -> LinearCandidates:
    def make(prob: ChannelProblem, node: Node, free_input: bool, out: list[Candidate]) -> None:
        out.append(DiagonalKernel(prob, kind).candidate(node.id))

    return make


def _fhelipe_candidates(prob: ChannelProblem, node: Node, free_input: bool, out: list[Candidate]) -> None:
    if prob.op == "matvec":
        out.append(FhelipeMatvec(prob).candidate(node.id))


def _hybrid_candidates(prob: ChannelProblem, node: Node, free_input: bool, out: list[Candidate]) -> None:
    if prob.op == "matvec":
        out.extend(hybrid_candidates(prob, node.id, free_input))


def _hybrid_complex_candidates(prob: ChannelProblem, node: Node, free_input: bool, out: list[Candidate]) -> None:
    if prob.op == "matvec":
        out.extend(hybrid_candidates(prob, node.id, free_input, complex_pack=True))


_family("imra", "linear", _imra_candidates)
_family("bsgs", "linear", _diagonal_candidates("bsgs"))
_family("hs-diagonal", "linear", _diagonal_candidates("hs-diagonal"))
_family("fhelipe", "linear", _fhelipe_candidates)
_family("hybrid", "linear", _hybrid_candidates)
# complex packing (docs/formats.md): offered next to "hybrid" with PlanOptions.packing
# "complex" only (its plans use the complex-slot extension of the plan format)
_family("hybrid-complex", "complex", _hybrid_complex_candidates)
# CinS kernels (docs/cins.md): candidates with exact cost vectors, not yet offered by
# default (their layouts leave the coefficient domain only through bootstrap_cins, which
# needs the bootstrapping model of the pipeline; issue 13 step 4)
_family("cins-bsgs", "cins", cins=_cins_family("bsgs", False))
_family("cins-hs", "cins", cins=_cins_family("hs", False))
_family("cins-dw", "cins", cins=_cins_family("bsgs", True))
_family("elementwise", "elementwise")
_family("ct-ct-diagonal", "ct-ct")
_family("ct-ct-jkls", "ct-ct")
_family("ct-ct-strassen", "ct-ct")
_family("view", "elementwise")
_family("sum", "elementwise")


def kernels_of_kind(*kinds: str) -> tuple[str, ...]:
    return tuple(n for n in KERNEL_FAMILIES.names() if KERNEL_FAMILIES.create(n).kind in kinds)


KERNELS = kernels_of_kind("linear", "ct-ct", "elementwise")
COMPLEX_KERNELS = kernels_of_kind("complex")
CINS_KERNELS = kernels_of_kind("cins")
LINEAR_KERNELS = kernels_of_kind("linear")
CTCT_KERNELS = kernels_of_kind("ct-ct")
# allowed whatever the user restricts (the graph's other ops need them)
ELEMENTWISE_KERNELS = kernels_of_kind("elementwise", "ct-ct")


def problem_candidates(
    prob: ChannelProblem, node: Node, allowed: Sequence[str], free_input: bool
) -> list[Candidate]:
    out: list[Candidate] = []
    errors: list[str] = []
    for kind in allowed:
        linear = KERNEL_FAMILIES.create(kind).linear if kind in KERNEL_FAMILIES else None
        if linear is None:
            continue
        try:
            linear(prob, node, free_input, out)
        except (KernelError, LayoutError) as e:
            errors.append(f"{kind}: {e}")
    if not out:
        why = "; ".join(errors) if errors else f"no allowed kernel ({', '.join(allowed)}) implements {node.op}"
        raise PlanError(why, node.id)
    return out


def matmul_candidates(
    graph: Graph, node: Node, bases: dict[str, list[Any]], allowed: Sequence[str], free: set[str]
) -> list[Candidate]:
    if len(graph.shape(node.id)) > 2:
        return batched_matmul_candidates(graph, node, next(iter(bases.values()))[0].slots, allowed, free)
    A, B = node.inputs
    (m, k), (_, n) = graph.shape(A), graph.shape(B)
    S = next(iter(bases.values()))[0].slots
    ea, eb = graph.encrypted(A), graph.encrypted(B)
    out: list[Candidate] = []
    if ea and eb:
        if not any(k_ in allowed for k_ in CTCT_KERNELS):
            raise PlanError(f"ct-ct matmul needs one of the kernels {', '.join(CTCT_KERNELS)}", node.id)
        errors: list[str] = []
        if "ct-ct-diagonal" in allowed:
            for base in dict.fromkeys(bases[A]):
                lay = base if isinstance(base, ChannelLayout) else view_layout((m, k), S, (1, 0))
                try:
                    out.append(matmul_ct_ct_candidate(graph, node, lay, S))
                except KernelError as e:
                    errors.append(f"ct-ct-diagonal: {e}")
        if "ct-ct-jkls" in allowed or "ct-ct-strassen" in allowed:
            cands = jkls_candidates(graph, node, S, strassen="ct-ct-strassen" in allowed)
            out.extend(c for c in cands if c.kernel in allowed)
        if not out:
            raise PlanError("; ".join(errors) or "no ct-ct kernel fits", node.id)
        return out
    x, axes = (A, (1, 0)) if ea else (B, (0, 1))
    lin = [a for a in allowed if a in LINEAR_KERNELS]
    for base in dict.fromkeys(bases[x]):
        ok = isinstance(base, ChannelLayout) and base.axes == axes and base.width == 1 and base.reps == 1
        try:
            lay = base.with_clean(True) if ok else view_layout(graph.shape(x), S, axes)
            prob = matmul_problem(x, B if ea else A, lay, n if ea else m, (m, n), ea)
        except (KernelError, LayoutError) as e:
            raise PlanError(str(e), node.id) from e
        out.extend(problem_candidates(prob, node, lin, free_input=x in free))
    return out


def batched_matmul_candidates(
    graph: Graph, node: Node, S: int, allowed: Sequence[str], free: set[str]
) -> list[Candidate]:
    """A matmul over a batch: every candidate of one entry's (m, k) x (k, n) matmul,
    unrolled over the entries (planner/kernels/model_ops.py)."""
    sub = matrix_subgraph(graph, node)
    A, B = node.inputs
    sub_bases: dict[str, list[Any]] = {}
    for t in dict.fromkeys((A, B)):
        if sub.encrypted(t):
            sub_bases[t] = [input_layout(sub, t, S)]
    # a client-packed operand is free only when every entry reads a block of its own
    sub_free = {t for t in free if len(graph.shape(t)) > 2}
    inner = matmul_candidates(sub, sub.node(node.id), sub_bases, allowed, sub_free)
    out: list[Candidate] = []
    for c in inner:
        try:
            out.append(batched_matmul_candidate(graph, node, c, S))
        except (KernelError, LayoutError) as e:  # pragma: no cover - the 2-D layouts stack
            raise PlanError(str(e), node.id) from e
    return out


def view_candidates(graph: Graph, node: Node, bases: dict[str, list[Any]]) -> list[Candidate]:
    x = node.inputs[0]
    if node.op in ("transpose", "reshape"):
        return shape_view_candidates(graph, node, list(dict.fromkeys(bases[x])))
    # sum
    out = []
    axis = node.axis if node.axis is not None else 0
    S = bases[x][0].slots
    for base in dict.fromkeys(bases[x]):
        lay = base if isinstance(base, ChannelLayout) and base.axes and axis in base.axes else None
        if lay is None:
            shape = graph.shape(x)
            lay = view_layout(shape, S, tuple(range(len(shape)))) if len(shape) <= 3 else None
        if lay is None:
            raise PlanError("sum over a tensor of rank > 3 is not supported", node.id)
        try:
            out.append(sum_candidate(graph, node, lay))
        except (KernelError, LayoutError) as e:
            raise PlanError(str(e), node.id) from e
    return out


def slice_candidates(graph: Graph, node: Node, bases: dict[str, list[Any]]) -> list[Candidate]:
    """A view of each producer layout (dirty outside the slice), and the slice made
    directly in its natural layout (clean; the edge moves the sliced elements)."""
    x = node.inputs[0]
    out: list[Candidate] = []
    try:
        for lay in dict.fromkeys(bases[x]):
            out.append(slice_candidate(graph, node, lay))
        S = bases[x][0].slots
        nat = input_layout(graph, node.id, S)
        if all(c.out_layout.with_clean(True) != nat.with_clean(True) for c in out):
            out.append(slice_compact_candidate(graph, node, nat))
    except (KernelError, LayoutError) as e:
        raise PlanError(str(e), node.id) from e
    return out


def concat_candidates(graph: Graph, node: Node, bases: dict[str, list[Any]]) -> list[Candidate]:
    """Views over the operands' ciphertexts (the operands' i-th layout options together),
    and the concatenation packed into its natural layout (masked parts added up)."""
    enc = [t for t in dict.fromkeys(node.inputs) if graph.encrypted(t)]
    if not enc:
        raise PlanError("concat of plaintext tensors: fold it before planning", node.id)
    S = bases[enc[0]][0].slots
    out: list[Candidate] = []
    try:
        weight_lays = {t: input_layout(graph, t, S) for t in node.inputs if not graph.encrypted(t)}
        widest = max(len(list(dict.fromkeys(bases[t]))) for t in enc)
        for i in range(widest):
            lays = {t: list(dict.fromkeys(bases[t]))[min(i, len(dict.fromkeys(bases[t])) - 1)] for t in enc}
            out.append(concat_candidate(graph, node, lays, weight_lays))
        if not any(list(node.inputs).count(t) > 1 for t in enc):
            out.append(concat_packed_candidate(graph, node, input_layout(graph, node.id, S)))
    except (KernelError, LayoutError) as e:
        raise PlanError(str(e), node.id) from e
    return out


def linear_candidates(
    graph: Graph, node: Node, base: ChannelLayout, allowed: Sequence[str], free_input: bool
) -> list[Candidate]:
    if node.op == "matvec":
        mat, vec = node.inputs
        if graph.encrypted(mat):
            raise PlanError("matvec with an encrypted matrix is not supported: use matmul", node.id)
        if not graph.encrypted(vec):
            raise PlanError("matvec needs an encrypted vector operand", node.id)
    else:
        x, w = node.inputs
        if graph.encrypted(w):
            raise PlanError("conv2d with encrypted filters is not supported (filters are plaintext)", node.id)
    x = node.inputs[1] if node.op == "matvec" else node.inputs[0]
    if node.op == "conv2d":
        _, hh, ww = graph.shape(x)
        too_big = hh * ww > base.slots
        if too_big or getattr(base, "geom", None) is not None:
            # one channel exceeds a ciphertext (MetaKernel 4.2.4), or the producer left the
            # tensor in row segments: segmented kernels (reading the producer's grid in place)
            try:
                seg = segmented_candidates(graph, node, base.slots, [base])
            except KernelError as e:
                raise PlanError(str(e), node.id) from e
            if too_big:
                return seg
            return seg + linear_candidates(graph, node, input_layout(graph, x, base.slots), allowed, False)
    if not isinstance(base, ChannelLayout):
        base = input_layout(graph, x, base.slots)
    try:
        prob = _linear_problem(graph, node, base)
    except (KernelError, LayoutError):
        # the producer's layout does not suit the slot kernels: consume the natural
        # layout instead (the edge pays the conversion)
        try:
            prob = _linear_problem(graph, node, input_layout(graph, x, base.slots))
        except (KernelError, LayoutError) as e:
            raise PlanError(str(e), node.id) from e
    return problem_candidates(prob, node, allowed, free_input)


def share_keys(graph: Graph, node: Node, cands: Sequence[Candidate], free: set[str]) -> None:
    """Give the candidates of a matvec, conv, matmul or element-wise node their ``share`` key
    (planner.kernels.base: structurally identical candidates share their cost). The key
    holds what the lowering reads: the node's op, attributes, operand shapes, which
    operands are encrypted, equal or free, the result's shape, the kernel and its
    parameters, layouts, scales and the lowering's code. Tensor names are replaced by the
    operand's position. Wrapped or multi-node candidates (CinS layers, folded or scaled
    variants), any whose parameters print abbreviated (a long array's ``...``) and any with
    an unhashable layout keep none."""
    pos: dict[str, int] = {}
    operands = tuple((pos.setdefault(t, len(pos)), graph.shape(t), graph.encrypted(t), t in free)
                     for t in node.inputs)
    sig = (node.op, json.dumps(node.attrs, sort_keys=True), operands, graph.shape(node.id))
    for c in cands:
        if c.source is not None or c.resets or c.scaled_from is not None or c.node != node.id:
            continue
        code = getattr(getattr(c.lower, "__func__", c.lower), "__code__", None)
        if code is None or not set(c.in_layouts) <= set(pos) or not set(c.operand_scales) <= set(pos):
            continue
        params = repr(sorted(c.params.items()))
        if "..." in params:
            continue
        # layouts by value (their own equality and hash; a mapped layout's label too)
        lays = tuple((pos[t], _by_value(lay)) for t, lay in sorted(c.in_layouts.items(), key=lambda kv: pos[kv[0]]))
        key = (sig, c.kernel, params, lays, _by_value(c.out_layout), c.out_scale,
               tuple(sorted((pos[t], v) for t, v in c.operand_scales.items())), code)
        try:
            hash(key)
        except TypeError:  # (a layout without a value hash)
            continue
        c.set_share(key)


def _by_value(lay: Any) -> tuple[Any, ...]:
    return (type(lay).__name__, lay, getattr(lay, "label", None))


def _pt_table_gen(lay: ChannelLayout, q: int):  # noqa: ANN202
    def gen() -> tuple[np.ndarray, None]:
        return lay.index_map(q).copy(), None

    return gen


def elementwise_candidates(
    graph: Graph, node: Node, bases: dict[str, list[Any]], folded: bool = False
) -> list[Candidate]:
    """add/sub/mul/poly in the layout of one encrypted operand of the result's shape (the
    other converts); an operand that broadcasts (numpy rules) is read in the result's
    placement with each slot holding the operand element it stretches to: a weight's table
    repeats it, an encrypted operand converts to that replicated layout on its edge (a
    priced replicate/permute conversion, free when the client packs it so)."""
    enc = [t for t in node.inputs if graph.encrypted(t)]
    if not enc:
        raise PlanError(f"{node.op} has no encrypted operand: fold plaintext-only nodes before planning", node.id)
    out: list[Candidate] = []
    seen: set[Any] = set()
    shape = graph.shape(node.id)
    full = [t for t in dict.fromkeys(enc) if graph.shape(t) == shape]
    lays: list[Any] = [lay for t in full for lay in bases[t]]
    if not lays:  # every encrypted operand broadcasts: the result's natural layout
        lays = [input_layout(graph, node.id, next(iter(bases.values()))[0].slots)]
    for lay in lays:
        if getattr(lay, "reps", 1) != 1:
            continue
        lay_out = replace(lay, shape=shape)
        if lay_out in seen:
            continue
        seen.add(lay_out)
        out.append(_elementwise(graph, node, lay_out, enc, folded))
    if not out:  # every producer layout carries periodic copies: work in the natural one
        out.append(_elementwise(graph, node, input_layout(graph, node.id, lays[0].slots), enc, folded))
    return out


def broadcast_index(src: tuple[int, ...], dst: tuple[int, ...]) -> np.ndarray:
    """For every flat element of a ``dst``-shaped result, the flat element of the
    ``src``-shaped operand numpy broadcasting reads."""
    return np.ascontiguousarray(
        np.broadcast_to(np.arange(int(np.prod(src)), dtype=np.int64).reshape(src), dst).ravel()
    )


def broadcast_layout(lay: Any, src: tuple[int, ...]) -> Any:
    """``lay`` (a layout of the result) read as a layout of the broadcast operand: each
    slot of the result holds the operand element it stretches to (copies where it
    stretches)."""
    if tuple(src) == tuple(lay.shape):
        return lay
    bidx = broadcast_index(tuple(src), tuple(lay.shape))
    maps = all_maps(lay)
    mapped = np.where(maps >= 0, bidx[np.maximum(maps, 0)], -1)
    return MappedLayout.of(tuple(src), mapped, lay.clean, "bcast")


def _operand_table(lay: Any, src: tuple[int, ...], q: int):  # noqa: ANN202
    def gen() -> tuple[np.ndarray, None]:
        idx = lay.index_map(q)
        if tuple(src) == tuple(lay.shape):
            return idx.copy(), None
        bidx = broadcast_index(tuple(src), tuple(lay.shape))
        return np.where(idx >= 0, bidx[np.maximum(idx, 0)], -1).astype(np.int64), None

    return gen


def chebyshev_map(domain: tuple[float, float]) -> tuple[float, float]:
    """(s, c) with s * x + c = (2x - a - b)/(b - a), the variable of a Chebyshev series
    over [a, b]."""
    a, b = domain
    return 2.0 / (b - a), -(a + b) / (b - a)


# A Chebyshev series over [a, b] != [-1, 1] is evaluated in the monomial basis of x (one
# level less: no change of variable) only when that is numerically harmless: at most this
# degree, a condition number max sum|b_i x^i| / max|p(x)| over [a, b] of at most
# MONOMIAL_MAX_CONDITION (loses at most 4 bits), and powers |x|^d of at most
# MONOMIAL_MAX_POWER (CKKS values must stay far below q0 / scale).
MONOMIAL_MAX_DEGREE = 7
MONOMIAL_MAX_CONDITION = 16.0
MONOMIAL_MAX_POWER = 2.0**8


def chebyshev_as_monomial(node: Node) -> tuple[float, ...] | None:
    """The monomial coefficients (in x) of a Chebyshev node over a domain other than
    [-1, 1] when evaluating them loses nothing that matters (rules above), else None."""
    if node.basis != "chebyshev" or node.domain is None or tuple(node.domain) == (-1.0, 1.0):
        return None
    coeffs = node.coeffs or (0.0,)
    deg = max((i for i, c in enumerate(coeffs) if c != 0.0), default=0)
    if not 1 <= deg <= MONOMIAL_MAX_DEGREE:
        return None
    a, b = node.domain
    if max(abs(a), abs(b)) ** deg > MONOMIAL_MAX_POWER:
        return None
    mono = np.polynomial.Chebyshev(np.asarray(coeffs[: deg + 1]), domain=[a, b]).convert(
        kind=np.polynomial.Polynomial).coef
    if mono.size and (not np.all(np.isfinite(mono)) or float(np.max(np.abs(mono))) > 2.0**20):
        return None
    x = np.linspace(a, b, 1025)
    powers = np.abs(x)[:, None] ** np.arange(mono.size)[None, :]
    worst = float(np.max(powers @ np.abs(mono)))
    peak = float(np.max(np.abs(np.polynomial.polynomial.polyval(x, mono))))
    if worst > MONOMIAL_MAX_CONDITION * max(peak, 1e-300):
        return None
    return tuple(float(v) for v in mono)


def poly_const_term(node: Node) -> float:
    """What a poly node leaves in a slot that held 0 (exactly as the lowered program
    computes it): p(0) in the monomial basis, the unit-domain series at the mapped 0 for
    Chebyshev."""
    coeffs = node.coeffs or (0.0,)
    if node.basis != "chebyshev":
        return float(coeffs[0])
    mono = chebyshev_as_monomial(node)
    if mono is not None:
        return mono[0]
    assert node.domain is not None
    s, c = chebyshev_map(node.domain)
    t = 0.0 * s + c if tuple(node.domain) != (-1.0, 1.0) else 0.0
    return float(np.polynomial.chebyshev.chebval(t, np.asarray(coeffs, dtype=np.float64)))


# A quadratic a x^2 + b x + c (a > 0) whose producer multiplies its result by s = sqrt(a)
# costs one level: with y = s x it is y (y + b / s) + c, a padd, a cmul and a rescale (a
# degree-2 ``poly`` takes ceil(log2 3) = 2).  y is s times smaller than x, so the CKKS error
# the producer leaves in y weighs 1/s more in x: s is kept within [QUADRATIC_MIN_SCALE,
# QUADRATIC_MAX_SCALE] (at most 4 bits lost; values at most 16 times larger).
QUADRATIC_MIN_SCALE = 2.0**-4
QUADRATIC_MAX_SCALE = 2.0**4


def quadratic_coeffs(node: Node) -> tuple[float, float, float] | None:
    """(c0, c1, c2) of a poly node evaluated as the monomial quadratic c0 + c1 x + c2 x^2
    (c2 != 0): a monomial poly of degree 2, or a Chebyshev one that chebyshev_as_monomial
    evaluates so; else None."""
    if node.op != "poly":
        return None
    coeffs = chebyshev_as_monomial(node) if node.basis == "chebyshev" else tuple(node.coeffs or (0.0,))
    if coeffs is None or max((i for i, c in enumerate(coeffs) if c != 0.0), default=0) != 2:
        return None
    return float(coeffs[0]), float(coeffs[1]), float(coeffs[2])


def quadratic_scale(node: Node) -> float | None:
    """s = sqrt(c2) for a quadratic poly whose producer may absorb s (rule above): c2 > 0,
    not already 1, s within the bounds."""
    q = quadratic_coeffs(node)
    if q is None or q[2] <= 0.0 or q[2] == 1.0:
        return None
    s = float(np.sqrt(q[2]))
    return s if QUADRATIC_MIN_SCALE <= s <= QUADRATIC_MAX_SCALE else None


def fold_scale(node: Node) -> float | None:
    """The factor s on a poly's input that its producer may absorb (planner.assign.fold): a
    Chebyshev series over [a, b] != [-1, 1] of degree >= 1 evaluated as such (its change of
    variable), or sqrt(c2) of a quadratic (``quadratic_scale``: one level instead of two)."""
    if (q := quadratic_scale(node)) is not None:
        return q
    if node.op != "poly" or node.basis != "chebyshev" or node.domain is None:
        return None
    if tuple(node.domain) == (-1.0, 1.0) or poly_depth(node.coeffs or (0.0,)) == 0:
        return None
    if chebyshev_as_monomial(node) is not None:
        return None
    return chebyshev_map(node.domain)[0]


def lower_poly(b: ProgramBuilder, node: Node, r: str, folded: bool = False) -> str:
    """A poly node on one ciphertext: a monomial poly, or a Chebyshev series as the change
    of variable (a pmul by s and a padd of c, over all slots; none for [-1, 1]) followed by
    a Chebyshev poly over [-1, 1] (the instruction whose depth is ceil(log2(d + 1))).
    ``folded``: the operand already holds s times the value (planner.assign.fold), only c is
    added; or, for a quadratic, the operand holds sqrt(c2) times the value (``quadratic_scale``)
    and the poly is the monic y (y + c1 / s) + c0."""
    coeffs = tuple(node.coeffs or (0.0,))
    if folded and (s := quadratic_scale(node)) is not None:
        q = quadratic_coeffs(node)
        assert q is not None
        return lower_monomial(b, r, (q[0], q[1] / s, 1.0), b.slots)
    if node.basis != "chebyshev":
        return lower_monomial(b, r, coeffs, b.slots)
    mono = chebyshev_as_monomial(node)
    if mono is not None:
        return lower_monomial(b, r, tuple(mono), b.slots)
    assert node.domain is not None
    if tuple(node.domain) != (-1.0, 1.0) and poly_depth(coeffs) > 0:
        s, c = chebyshev_map(node.domain)
        S = b.slots
        ps = b.const_plaintext(("cheb-scale", s, S), f"pt/const/scale{s!r}", lambda: np.full(S, s))
        pc = b.const_plaintext(("cheb-shift", c, S), f"pt/const/shift{c!r}", lambda: np.full(S, c))
        r = b.padd(r if folded else b.rescale(b.pmul(r, ps)), pc)
    return b.poly(r, coeffs, poly_depth(coeffs), basis="chebyshev", domain=(-1.0, 1.0))


def _elementwise(graph: Graph, node: Node, lay: Any, enc: list[str], folded: bool = False) -> Candidate:
    op = node.op
    a = node.inputs[0]
    b_ = node.inputs[1] if len(node.inputs) > 1 else None
    shape = graph.shape(node.id)
    # the slot-hygiene rule lives in planner.layout.channels.clean_result; operands share lay's
    # placement (a broadcast operand reads it through its copies) and a plaintext operand
    # is clean (its table is 0 outside the tensor)
    const_term = poly_const_term(node) if op == "poly" else 0.0
    n_pt = len(node.inputs) - len(enc)
    if clean_result(op, [False] * len(enc) + [True] * n_pt, const_term):
        clean = True  # clean whatever the operands hold (a product with a weight)
        in_clean = False
    else:
        clean = clean_result(op, [lay.clean] * len(enc) + [True] * n_pt, const_term)
        # a clean claim needs clean operands; otherwise the operands may be dirty
        in_clean = clean
    in_layouts = {t: broadcast_layout(lay.with_clean(in_clean), graph.shape(t)) for t in enc}
    out_layout = replace(lay, shape=shape, clean=clean)
    bcast = sorted(t for t in dict.fromkeys(node.inputs) if graph.shape(t) != shape)

    def lower(b: ProgramBuilder, regs: dict[str, list[str]]) -> list[str]:
        outs = []
        for q in range(lay.n_ct):
            if op == "poly":
                outs.append(lower_poly(b, node, regs[a][q], folded))
                continue
            assert b_ is not None
            ea, eb = graph.encrypted(a), graph.encrypted(b_)
            if ea and eb:
                ra, rb = regs[a][q], regs[b_][q]
                if op == "add":
                    outs.append(b.add(ra, rb))
                elif op == "sub":
                    outs.append(b.sub(ra, rb))
                else:
                    outs.append(b.rescale(b.cmul(ra, rb)))
                continue
            ct, w = (a, b_) if ea else (b_, a)
            pt = b.plaintext(w, f"pt/{node.id}/{q}", _operand_table(lay, graph.shape(w), q))
            r = regs[ct][q]
            if op == "add":
                outs.append(b.padd(r, pt))
            elif op == "mul":
                outs.append(b.rescale(b.pmul(r, pt)))
            elif ea:  # ct - w
                outs.append(b.psub(r, pt))
            else:  # w - ct = (-1) * ct + w
                neg = b.const_plaintext(("neg", lay.slots), "pt/const/minus1", lambda: -np.ones(lay.slots))
                outs.append(b.padd(b.rescale(b.pmul(r, neg)), pt))
        return outs

    params: dict[str, Any] = {"op": op}
    if bcast:
        params["broadcast"] = bcast
    if op == "poly" and node.basis == "chebyshev":
        params["basis"] = "chebyshev"
        if chebyshev_as_monomial(node) is not None:
            params["evaluated"] = "monomial"
    scales: dict[str, float] = {}
    if folded:
        s = fold_scale(node)
        assert s is not None
        params["input_scaled_by"] = s
        scales[a] = s
    return Candidate(
        node=node.id, kernel="elementwise", params=params, in_layouts=in_layouts,
        out_layout=out_layout, lower=lower, slot_utilization=lay.size / (lay.n_ct * lay.slots),
        operand_scales=scales,
    )


def lower_monomial(b: ProgramBuilder, r: str, coeffs: tuple[float, ...], slots: int) -> str:
    """An element-wise polynomial at its fewest levels: ``x^2 + c1 x + c0`` is
    ``cmul(x, x + c1)`` (one level, where a ``poly`` of degree 2 takes ceil(log2 3) = 2; for
    Orion's and CryptoNets' square activation, c1 = 0, ``cmul(x, x)``), plus a constant
    ``padd`` when c0 != 0; every other polynomial is one ``poly`` instruction
    (ceil(log2(d + 1)) levels)."""
    deg = max((i for i, c in enumerate(coeffs) if c != 0.0), default=0)
    if deg == 2 and coeffs[2] == 1.0:
        c1 = float(coeffs[1])
        t = r
        if c1 != 0.0:
            pt1 = b.const_plaintext(("const", slots, c1), f"pt/const/{c1!r}", lambda: np.full(slots, c1))
            t = b.padd(r, pt1)
        sq = b.rescale(b.cmul(r, t))
        c0 = float(coeffs[0])
        if c0 == 0.0:
            return sq
        pt = b.const_plaintext(("const", slots, c0), f"pt/const/{c0!r}", lambda: np.full(slots, c0))
        return b.padd(sq, pt)
    return b.poly(r, coeffs, poly_depth(coeffs))


def input_layout(graph: Graph, tensor: str, slots: int) -> Any:
    """The layout a tensor has when nobody chose one: row-major whole channels, or row
    segments of each channel when a channel exceeds a ciphertext."""
    shape = graph.shape(tensor)
    try:
        return natural_layout(shape, slots)
    except LayoutError as e:
        if len(shape) == 3:
            try:
                return segment_rows_layout((shape[0], shape[1], shape[2]), slots)
            except KernelError:
                pass
        raise PlanError(f"tensor {tensor!r}: {e}") from e


def with_clean_output(c: Candidate, slots: int) -> Candidate:
    """``c`` followed by the mask that zeroes its output's free slots (the clean-output
    rule for graph outputs: the client who decrypts must not see partial sums of the
    weights).  A candidate whose output is already clean is returned unchanged; otherwise
    the mask is one ``pmul`` per output ciphertext, charged to the node (cost and depth),
    so the solver weighs a dirty kernel plus its mask against a kernel that ends clean."""
    if c.out_layout.clean:
        return c
    from planner.kernels.base import sequential
    from planner.kernels.convert import plan_conversion

    mask = plan_conversion(c.out_layout, c.out_layout.with_clean(True))
    inner = c.lower

    def lower(b: ProgramBuilder, regs: dict[str, list[str]]) -> list[str]:
        return mask.lower(b, inner(b, regs), f"mask/{c.node}")

    def analytic() -> Any:
        return sequential(c.cost(slots), mask.cost())

    return Candidate(
        node=c.node, kernel=c.kernel, params={**c.params, "output_mask": True}, in_layouts=c.in_layouts,
        out_layout=c.out_layout.with_clean(True), lower=lower, slot_utilization=c.slot_utilization,
        note=c.note, analytic=analytic, out_scale=c.out_scale, operand_scales=c.operand_scales,
    )
