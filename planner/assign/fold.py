"""Folding a factor on a poly's input into its producers: the change of variable of a
Chebyshev poly (SPEC section 2: a degree-d Chebyshev poly over [a, b] costs
ceil(log2(d + 1)) levels), or sqrt(a) of a convex quadratic a x^2 + b x + c, which then costs
one level (planner.assign.candidates.quadratic_scale).  The Chebyshev case below; the
quadratic's takes the same path with s = sqrt(a).

A Chebyshev ``poly`` over [a, b] != [-1, 1] evaluates its series at ``s * x + c`` with
``s = 2 / (b - a)``, ``c = -(a + b) / (b - a)``.  Lowered on its own, the product by ``s``
is a ``pmul`` + ``rescale``: one level more than the SPEC's rule.  When the value ``x`` is
computed by linear ciphertext operations that end in plaintext products, ``s`` multiplies
those plaintexts instead (no level): this module finds, in the lowered program of a
candidate, the instructions that absorb a factor ``s`` on its result (the *cone*), and
builds the candidate variants that carry it:

- a *scaled* variant of a producer's candidate (``out_scale = s``: its result registers
  hold ``s`` times the node's value; plan node ``params.scaled_by``), whose operands may in
  turn have to arrive scaled (``operand_scales``) when a path reaches them without a
  plaintext product (an ``add`` of a bias, a view);
- a *folded* variant of the poly's candidate (``operand_scales = {x: s}``; plan node
  ``params.input_scaled_by``) that only adds ``c``.

A chain folds only when every candidate of every node in it has a scaled variant (but a
candidate that bootstraps inside, a CinS layer, which keeps its unscaled self and pairs with
the poly's unfolded candidates): its nodes then offer only their scaled candidates and the
poly only its folded ones (and its unfolded ones where a CinS candidate stays), so the
choice model has as many options as without folding and the depth it sees is the plan's
(offering both made CP-SAT miss ResNet-20's optimum within its time limit); otherwise only
the unscaled ones stay.  Edges still pair a producer option only with reading options that
expect its factor (planner.assign.problem._conversion_costs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from common.cache import BoundedCache
from planner import ir
from planner.frontend.graph import Graph, Node
from planner.ir.builder import ProgramBuilder, TableGen
from planner.ir.fusion import fused_counts
from planner.kernels.base import Candidate, CostVector

_LINEAR = (ir.Add, ir.Sub)
_PASS = (ir.Rot, ir.RotHoisted, ir.Rescale, ir.MulI, ir.Conj)  # (a real factor commutes with i and conj)


@dataclass(frozen=True)
class ConePlan:
    """How one lowered span absorbs a factor on its result registers."""

    scale_pt: frozenset[int]  # instruction indices (in the span) whose plaintext is scaled
    scale_coeffs: frozenset[int]  # poly instructions whose coefficients are scaled
    operands: frozenset[str]  # candidate operands that must arrive scaled


def foldable_into(graph: Graph, tensor: str) -> Node | None:
    """The producer of ``tensor`` when a factor may be folded into it: an encrypted node
    result that is no graph output, read by exactly one node, once."""
    prod = graph.producer(tensor)
    if prod is None or tensor in graph.outputs or not graph.encrypted(tensor):
        return None
    readers = graph.consumers(tensor)
    if len(readers) != 1 or list(readers[0].inputs).count(tensor) != 1:
        return None
    return prod


def plan_cone(
    instrs: Sequence[Mapping[str, Any] | ir.Instr], outs: Sequence[str], in_regs: Mapping[str, str],
    through: bool = False,
) -> ConePlan | None:
    """Which instructions of ``instrs`` (one candidate's span) absorb a factor on every
    register of ``outs``; ``in_regs`` maps the candidate's operand registers to their
    tensors.  None when a path reaches what cannot absorb (a bootstrap, a register that is
    also read unscaled, a square of the scaled value).  Backward: a plaintext product
    absorbs (its plaintext is scaled), a poly absorbs (its coefficients), add/sub/rot/
    rescale pass the factor to their operands, padd/psub pass it and scale their plaintext,
    a ciphertext product passes it to one operand.  Then a forward pass checks that every
    register holds either its value or exactly the factor times it, as each reader expects.
    ``through``: no product or poly takes the factor, every path passes it to an operand (a
    plaintext product passes it like a rotation; a poly stops the fold)."""
    decoded = [ir.decode(raw) for raw in instrs]
    back = _backward(decoded, outs, through)
    if back is None:
        return None
    want, pt_marks, coeff_marks = back
    written = {r for ins in decoded for r in ins.writes()}
    if any(r not in written and r not in in_regs for r in want):
        return None
    scaled: dict[str, bool] = {r: (r in want) for r in in_regs}
    for i, ins in enumerate(decoded):
        out = _forward(ins, [scaled.get(r, False) for r in ins.reads()], i in pt_marks, i in coeff_marks)
        if out is None:
            return None
        for r in ins.writes():  # (every result of a hoisted rotation of a scaled value)
            scaled[r] = out
    if not all(scaled.get(r, False) for r in outs):
        return None
    operands = frozenset(in_regs[r] for r in want if r not in written and r in in_regs)
    return ConePlan(frozenset(pt_marks), frozenset(coeff_marks), operands)


def _backward(decoded: Sequence[ir.Instr], outs: Sequence[str],
              through: bool = False) -> tuple[set[str], set[int], set[int]] | None:
    """The registers that must hold the factor, and the instructions whose plaintext or
    coefficients take it (first plaintext product or poly on each backward path; none
    ``through``)."""
    want: set[str] = set(outs)
    pt_marks: set[int] = set()
    coeff_marks: set[int] = set()
    for i in range(len(decoded) - 1, -1, -1):
        ins = decoded[i]
        if not any(r in want for r in ins.writes()):
            continue
        if isinstance(ins, ir.PMul) and through:
            want.add(ins.src)
        elif isinstance(ins, ir.PMul):
            pt_marks.add(i)
        elif isinstance(ins, ir.PAdd | ir.PSub):
            pt_marks.add(i)
            want.add(ins.src)
        elif isinstance(ins, ir.Poly) and not through:
            coeff_marks.add(i)
        elif isinstance(ins, _LINEAR):
            want.update((ins.a, ins.b))
        elif isinstance(ins, _PASS):
            want.add(ins.src)
        elif isinstance(ins, ir.CMul) and ins.a != ins.b:
            want.add(ins.a)
        else:  # x * x, bootstrap, bootstrap_cins, to_cins, input, ...: the factor cannot pass
            return None
    return want, pt_marks, coeff_marks


def _forward(ins: ir.Instr, rd: list[bool], pt_mark: bool, coeff_mark: bool) -> bool | None:
    """Whether ``ins``'s results hold the factor given whether its operands do (``rd``);
    None when the result would be neither the value nor the factor times it."""
    if isinstance(ins, ir.PMul):
        return None if rd[0] and pt_mark else rd[0] != pt_mark
    if isinstance(ins, ir.PAdd | ir.PSub):
        return rd[0] if rd[0] == pt_mark else None
    if isinstance(ins, ir.Poly):
        return None if rd[0] else coeff_mark
    if isinstance(ins, ir.CMul):
        return None if rd[0] and rd[1] else rd[0] or rd[1]
    if isinstance(ins, _LINEAR):
        return rd[0] if rd[0] == rd[1] else None
    if isinstance(ins, _PASS):
        return rd[0]
    return None if any(rd) else False


def _scaled_gen(gen: TableGen, s: float) -> TableGen:
    def scaled() -> tuple[np.ndarray, np.ndarray | None]:
        idx, coef = gen()
        base = np.ones(idx.shape[0], dtype=np.float64) if coef is None else np.asarray(coef, dtype=np.float64)
        return idx, base * s

    return scaled


def apply_cone(b: ProgramBuilder, start: int, n_pt_before: int, cone: ConePlan, s: float) -> None:
    """Rewrite ``b.instrs[start:]`` by ``cone``: each marked plaintext replaced by a copy
    scaled by ``s`` (one copy per plaintext), each marked poly's coefficients multiplied by
    ``s``; the plaintexts the span made (from the ``n_pt_before``-th on) and no longer
    reads are dropped."""
    copies: dict[str, str] = {}
    for j in sorted(cone.scale_pt | cone.scale_coeffs):
        i = start + j
        ins = b.objs[i]
        if isinstance(ins, ir.Poly):
            b.set_instr(i, replace(ins, coeffs=tuple(float(c) * s for c in ins.coeffs)))
            continue
        assert isinstance(ins, ir.PMul | ir.PAdd | ir.PSub)
        if ins.pt not in copies:
            copies[ins.pt] = b.scaled_plaintext(ins.pt, s, lambda gen: _scaled_gen(gen, s))
        b.set_instr(i, replace(ins, pt=copies[ins.pt]))
    made = list(b.plaintexts)[n_pt_before:]
    replaced = [p for p in made if p in copies]
    if replaced:
        used = {p for ins in b.objs[start:] for p in ins.plaintexts()}
        b.drop_plaintexts([p for p in replaced if p not in used])


# Scaled variants of structurally identical candidates (``Candidate.share``): the variant's
# cost, or None where the program cannot absorb the factor, and its cone's operands.
SCALED_COSTS = BoundedCache[tuple[CostVector | None, tuple[int, ...]]](1024)


def scaled_candidate(c: Candidate, s: float, slots: int, through: bool = False) -> Candidate | None:
    """The variant of ``c`` whose result is ``s`` times the node's value (no level more),
    or None when its program cannot absorb the factor (see ``plan_cone``; ``through``: the
    factor passed to the operands, none absorbed)."""
    if c.out_scale != 1.0 or c.resets:  # (a candidate that bootstraps inside cannot absorb)
        return None
    names = list(c.in_layouts)
    # (structurally identical candidates: planner.kernels.base, the cone's operands by position)
    shared = c.shared_key(slots)
    key = None if shared is None else (*shared, s, through)
    hit = None if key is None else SCALED_COSTS.get(key)
    if hit is None:
        b, regs, outs = c.dry_lowering(slots)
        in_regs = {r: t for t, rs in regs.items() for r in rs}
        cone = plan_cone(b.objs, outs, in_regs, through)
        if cone is not None:
            # the variant's cost: c's instructions, only plaintexts swapped for scaled copies
            # (a copy may stay beside an original that unscaled reads still need: counted here)
            apply_cone(b, 0, 0, cone, s)
            cost = replace(c.cost(slots), plaintexts=len(b.plaintexts), fused=fused_counts(b.objs, slots))
        hit = (None, ()) if cone is None else (cost, tuple(sorted(names.index(t) for t in cone.operands)))
        if key is not None:
            SCALED_COSTS.put(key, hit)
    scaled_cost, positions = hit
    if scaled_cost is None:
        return None
    operands = {names[i] for i in positions}
    if any(c.operand_scales.get(t, 1.0) != 1.0 for t in operands):
        return None
    inner = c.lower

    def lower(bb: ProgramBuilder, regs: dict[str, list[str]]) -> list[str]:
        start, n_pt = len(bb.objs), len(bb.plaintexts)
        res = inner(bb, regs)
        cone_here = plan_cone(bb.objs[start:], res, {r: t for t, rs in regs.items() for r in rs}, through)
        assert cone_here is not None and set(cone_here.operands) == operands, "scaled lowering changed shape"
        apply_cone(bb, start, n_pt, cone_here, s)
        return res

    return replace(
        c, params={**c.params, "scaled_by": s}, lower=lower, out_scale=s,
        operand_scales={**c.operand_scales, **{t: s for t in sorted(operands)}}, analytic=None, _cost=scaled_cost,
        _reset_depths=None, scaled_from=c,
    )


# Whether structurally identical candidates' results absorb a factor alone (``result_absorbs``).
# What a candidate's own program can take on its result, by structural key (one scratch
# lowering per key and question)
RESULT_FACTS = BoundedCache[bool](2048)


def _result_fact(c: Candidate, slots: int, what: str,
                 fact: Callable[[ProgramBuilder, dict[str, list[str]], list[str]], bool]) -> bool:
    """``fact`` of ``c``'s scratch lowering (builder, operand registers, result registers),
    cached under ``c``'s shared key and ``what``."""
    shared = c.shared_key(slots)
    key = None if shared is None else (*shared, what)
    hit = None if key is None else RESULT_FACTS.get(key)
    if hit is None:
        hit = fact(*c.dry_lowering(slots))
        if key is not None:
            RESULT_FACTS.put(key, hit)
    return hit


def result_absorbs(c: Candidate, slots: int) -> bool:
    """Whether ``c``'s own program can take a factor on its result without any operand
    taking it (``plan_cone`` reaches only its plaintext products and polys): a bootstrap's
    ``1/s`` range scaling then multiplies those plaintexts (coefficients) instead of costing
    a product and a level of its own (planner.assign.problem, planner.lower.lowering)."""
    if c.out_scale != 1.0 or c.resets:
        return False

    def absorbs(b: ProgramBuilder, regs: dict[str, list[str]], outs: list[str]) -> bool:
        cone = plan_cone(b.objs, outs, {r: t for t, rs in regs.items() for r in rs})
        return cone is not None and not cone.operands

    return _result_fact(c, slots, "absorbs", absorbs)


def result_masks(c: Candidate, slots: int) -> bool:
    """Whether every result register of ``c``'s own program is written by a poly (degree >= 1)
    that nothing else in it reads: a mask on the result (a dirty layout's before a
    bootstrap, with the bootstrap's ``1/s``) is then that poly's ``mask`` and costs no level
    (planner.ir.builder.ProgramBuilder.maskable_poly, planner.lower.lowering)."""
    if c.resets:
        return False

    def masks(b: ProgramBuilder, _regs: dict[str, list[str]], outs: list[str]) -> bool:
        return bool(outs) and len(set(outs)) == len(outs) and all(b.maskable_poly(r) is not None for r in outs)

    return _result_fact(c, slots, "masks", masks)


def prescaled_candidate(c: Candidate, s: float, slots: int) -> Candidate:
    """``c`` lowered with its result multiplied by ``s`` in its own plaintext products (a
    candidate for which ``result_absorbs`` holds); used only to lower a bootstrapped node
    whose range scaling is folded, so the node keeps ``c``'s parameters."""
    v = scaled_candidate(c, s, slots)
    assert v is not None and v.operand_scales == c.operand_scales, "the result does not absorb alone"
    return v


def add_scaled_variants(
    graph: Graph, cands: dict[str, list[Candidate]], slots: int, keep_scale: Callable[[str, float], bool] | None = None
) -> None:
    """Make every chain that can fold fold: add, in reverse topological order, the scaled
    variants of every node some reading option expects scaled (a folded poly, or a scaled
    variant that passes the factor to its operand); drop the variants nobody can pair with
    (fixpoint); then per folded poly (topological order) keep either its chain's scaled
    candidates and its folded ones, when every candidate of every node of the chain has a
    scaled variant (the solver chooses among as many options as without folding, and the
    depth it sees is the plan's), or else only the unscaled ones (no fold).
    ``keep_scale(node_id, s)`` may refuse a factor for a node (bootstrap scaling)."""
    for node in reversed(graph.nodes):
        want = _wanted(graph, node.id, cands)
        if want is None or (keep_scale is not None and not keep_scale(node.id, want)):
            continue
        extra = [v for c in cands[node.id] if (v := scaled_candidate(c, want, slots)) is not None]
        cands[node.id] = cands[node.id] + [_product_scaled(graph, v) for v in _uniform(extra, want, slots)]
    _drop_unpaired(graph, cands)
    for node in graph.nodes:
        if not any(c.out_scale == 1.0 and c.operand_scales for c in cands[node.id]):
            continue
        chain = _full_chain(graph, node.inputs[0], cands)
        for nid in chain or _chain_nodes(graph, node.inputs[0], cands):
            # (a candidate that bootstraps inside, a CinS layer, cannot absorb the factor: it
            # stays beside the scaled ones, read by the poly's unfolded candidates)
            cands[nid] = [c for c in cands[nid] if (c.out_scale != 1.0) == (chain is not None)
                          or chain is not None and c.resets]
        t = node.inputs[0]
        resetting = chain is not None and any(c.resets for nid in chain for c in cands[nid])
        # the poly's folded candidates (and their scaled variants when it is itself in a
        # chain), or its unfolded ones; both where a producer may bootstrap inside
        cands[node.id] = [c for c in cands[node.id]
                          if ((c.scaled_from or c).operand_scales.get(t, 1.0) != 1.0) == (chain is not None)
                          or resetting]
    _drop_unpaired(graph, cands)


# The smallest factor a product on a skip's edge applies: a smaller one shrinks the sum (and
# what a bootstrap later refreshes, within a range fixed by its bound) by more than a bit
# against CKKS noise of fixed size. Session 35: ResNet-20 (data/workloads) at n16boot, whose
# quadratic activations fold with sqrt(a) = 0.354, measured 2.5e-4 with such products
# against 1.3e-5 before; the ONNX ResNet-20's factors (0.59-1.72) measured 9.7e-8.
MIN_PRODUCT_SCALE = 0.5


def _product_scaled(graph: Graph, v: Candidate) -> Candidate:
    """``v`` with the factor of each operand that its producer cannot take (read by another
    node too, a graph input or output) applied by a product on that operand's edge, where
    another operand's producer can take it: a residual sum whose skip operand is read by
    the block's first layer as well. The product costs a level on the skip's edge alone,
    which usually arrives levels below the other operand (solver.model: the edge's depth),
    and the factor then folds up the other operand's chain for free. Session 35: the ReLUs
    after the ONNX ResNet-20's residual sums paid the change of variable's level."""
    req = _required(v)
    fixed = frozenset(t for t in req if foldable_into(graph, t) is None and graph.encrypted(t))
    if not fixed or fixed == req or v.out_scale < MIN_PRODUCT_SCALE:
        return v
    return replace(v, scale_products=fixed,
                   params={**v.params, "scaled_operands_by_product": sorted(fixed)})


def _uniform(variants: list[Candidate], s: float, slots: int) -> list[Candidate]:
    """``variants`` (one node's scaled candidates) where some absorb the factor in a product
    of their own (a densified candidate's mask) and the others pass it to one set of
    operands: the former passed through too where they can, so that the chain folds
    (``_full_chain`` needs one set; session 35: the ONNX ResNet-20's third stage)."""
    reqs = {_required(v) for v in variants}
    if len(reqs) != 2 or frozenset() not in reqs:
        return variants
    (want,) = reqs - {frozenset()}
    out = []
    for v in variants:
        if not _required(v) and v.scaled_from is not None:
            w = scaled_candidate(v.scaled_from, s, slots, through=True)
            if w is not None and _required(w) == want:
                v = w
        out.append(v)
    return out


def scale_product_cost(n_ct: int) -> CostVector:
    """What ``scale_operand`` costs on ``n_ct`` ciphertexts: a product by one constant
    plaintext and a rescale each, one level."""
    return CostVector(pmul=n_ct, rescale=n_ct, depth=1, plaintexts=1)


def scale_operand(b: ProgramBuilder, regs: Sequence[str], s: float) -> list[str]:
    """``s`` times each register (``Candidate.scale_products``: the factor of an operand its
    producer does not take), one level."""
    S = b.slots
    pt = b.const_plaintext(("operand-scale", s, S), f"pt/const/operand-scale{s!r}", lambda: np.full(S, s))
    return [b.rescale(b.pmul(r, pt)) for r in regs]


def _chain_nodes(graph: Graph, tensor: str, cands: Mapping[str, list[Candidate]]) -> list[str]:
    """The nodes whose scaled variants a fold through ``tensor`` may use."""
    out: list[str] = []
    todo = [tensor]
    while todo:
        prod = foldable_into(graph, todo.pop())
        if prod is None or prod.id in out:
            continue
        out.append(prod.id)
        todo.extend(t for c in cands[prod.id] if c.out_scale != 1.0 for t in _required(c))
    return out


def _full_chain(graph: Graph, tensor: str, cands: Mapping[str, list[Candidate]]) -> list[str] | None:
    """The nodes of the fold through ``tensor`` when every candidate of each has a scaled
    variant (but those that bootstrap inside, which keep their own) and all variants of a
    node need the same operands scaled; else None."""
    out: list[str] = []
    todo = [tensor]
    while todo:
        prod = foldable_into(graph, todo.pop())
        if prod is None:
            return None
        cs = cands[prod.id]
        orig = [c for c in cs if c.out_scale == 1.0 and not c.resets]
        var = [c for c in cs if c.out_scale != 1.0]
        if not var or len(var) != len(orig) or not all(any(v.scaled_from is o for v in var) for o in orig):
            return None
        reqs = {_required(v) for v in var}
        if len(reqs) != 1:
            return None
        out.append(prod.id)
        todo.extend(sorted(next(iter(reqs))))
    return out


def _required(v: Candidate) -> frozenset[str]:
    """The operands a scaled variant needs scaled beyond what its origin needed (but those
    its edge's product scales: ``Candidate.scale_products``)."""
    base = v.scaled_from.operand_scales if v.scaled_from is not None else {}
    return frozenset(t for t, f in v.operand_scales.items() if f != base.get(t, 1.0) and t not in v.scale_products)


def _drop_unpaired(graph: Graph, cands: dict[str, list[Candidate]]) -> None:
    """Drop, until nothing changes, the options no producer or reader option pairs with."""
    changed = True
    while changed:
        changed = False
        for node in graph.nodes:
            keep = []
            for c in cands[node.id]:
                ok = all(_provides(graph, t, c.arrival_scale(t), cands)
                         for t in dict.fromkeys(node.inputs) if graph.producer(t) is not None and graph.encrypted(t))
                if ok and c.out_scale != 1.0:
                    ok = _wanted(graph, node.id, cands) == c.out_scale
                keep.append(ok)
            if not all(keep):
                cands[node.id] = [c for c, k in zip(cands[node.id], keep, strict=True) if k]
                changed = True


def _wanted(graph: Graph, tensor: str, cands: Mapping[str, list[Candidate]]) -> float | None:
    if foldable_into(graph, tensor) is None:
        return None
    reader = graph.consumers(tensor)[0]
    fs = {c.operand_scales.get(tensor, 1.0) for c in cands.get(reader.id, [])} - {1.0}
    return next(iter(fs)) if len(fs) == 1 else None


def _provides(graph: Graph, tensor: str, f: float, cands: Mapping[str, list[Candidate]]) -> bool:
    """Some option of ``tensor``'s producer leaves it scaled by ``f`` (1: unscaled)."""
    prod = graph.producer(tensor)
    if prod is None:
        return f == 1.0
    if f != 1.0 and foldable_into(graph, tensor) is None:
        return False
    return any(c.out_scale == f for c in cands.get(prod.id, []))
