"""Fused linear blocks: which instructions of a program the Lattigo executor evaluates as
one double-hoisted baby-step giant-step block (``backends/lattigo/fused.go``), counted for
the time model.

This is the one definition of the blocks: the planner writes them into the plan as its
``fused`` annotation (:mod:`planner.ir.fused_plan`, docs/formats.md) and the executor runs
those blocks without deciding any itself. The rules, on the program's dataflow:

* a *baby* is a register written by ``rot_hoisted``/``rot`` of a register that is no
  linear form; ``pmul`` of a baby, or of any other register that is no form (offset 0),
  starts a form ``sum_g rot_g(sum pt * rot_b(x))`` over one base x;
* ``add`` of two forms on the same base with the same rescale state merges them;
  ``rescale`` marks a form rescaled (once); ``rot`` of a form made of unrotated products
  makes it one giant step;
* a form is absorbed by its consumer only when that is its only use; a form that is not
  absorbed is a *root*: with more than one product or any rotation it is one fused block,
  and the instructions of its tree are absorbed; a baby rotation whose every use is
  absorbed (and that no other rotation reads) is absorbed too;
* a form's products may read its origin x or rotations of rotations of it (a key
  schedule's two-hop rotations); a baby rotation that runs as an instruction is multiplied
  as it is (offset 0 on its output register);
* under a key schedule (``load_key``/``drop_key``) a one-product form is a block only in
  Q mode (below), and a block whose giant keys are dropped before its root is fused group by
  group: the analysis is repeated with its giant rotations not absorbed (each giant step's
  products are one block, the giant rotations and additions run as written);
* a block whose giant rotation follows its rescale, with a key made (the plan's
  ``keys[k].level``) below the level of its base's baby keys, is split the same way: the
  block rotates its giant steps at the base's level (``_key_levels_fit``; this planner makes
  such keys at the block's level, so only other plans meet it).

* *Q mode*: a base's blocks without giant steps (only products, summed) are evaluated in
  Q when they outnumber the distinct non-zero baby offsets they use: each such baby is
  brought down to Q once (two ModDowns, shared by the base's Q-mode blocks) and the
  products accumulate in Q, with no ModDown per block (a convolution's many small output
  blocks over a few rotations of one input). Blocks with giant steps run in QP.
* *Q babies* (:func:`q_babies`, the annotation's ``babies_in_q``): a QP block that a run
  streaming its plaintexts (``slotplan run``: each diagonal encoded just before its product)
  evaluates with its babies brought down to Q once and its products and plaintexts in Q, the
  giant steps' key switches still in QP (backends/lattigo/fused_qbabies.go), where that saves
  NTTs; an executor with its plaintexts cached keeps such blocks in QP.

*Product sums* (``backends/lattigo/relin.go``, which still finds them itself): ``cmul`` starts a sum of one term; ``add``
of two sums, each used only there, merges them; a sum with two or more terms that is not
merged further is relinearised once: its tensor products accumulate in degree 2
(``cmul_tensor`` per term) and one relinearisation (``relin``) ends it, where the plan
relinearises every ``cmul`` and adds the results. (The executor does this only without a
key schedule; the counts here are those of a plan without one.)

A QP block costs ``block`` (two ModDowns) + ``block_baby`` per distinct non-zero baby
offset of its base (shared by the blocks on that base) + ``block_giant`` per non-zero giant
offset + ``block_product`` per product, and each base with baby rotations
``block_base`` once (the decomposition of its c1, shared by its blocks; tables without
``block_base`` count it in ``block``) (calibrated weights, see ``backends/calibrate.py``).
A Q-mode block costs ``block_q`` (its output and final reduction) + ``block_product_q`` per
product, and each distinct baby offset of its base ``block_baby`` + ``block_baby_q`` once
(the lazy rotation and its two ModDowns).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from planner import ir


@dataclass(frozen=True)
class FusedCounts:
    """What the executor fuses in a program, and the plan counts it replaces."""

    blocks: int = 0
    products: int = 0
    babies: int = 0  # lazy baby rotations (distinct non-zero offsets per base)
    giants: int = 0  # key switches of giant steps
    # absorbed instructions by summary counter (rot, hoisted groups and their rotations,
    # pmul, add, rescale), priced by the block weights instead
    rot: int = 0
    hoisted_groups: int = 0
    hoisted_rotations: int = 0
    pmul: int = 0
    add: int = 0
    rescale: int = 0
    block_rescales: int = 0  # one Rescale per block the plan rescales
    bases: int = 0  # base ciphertexts with baby rotations (one decomposition each)
    # Q-mode blocks (module docstring): their products, and the babies brought down to Q
    # (distinct non-zero offsets per base); ``blocks``/``products`` count the QP blocks only
    q_blocks: int = 0
    q_products: int = 0
    q_babies: int = 0
    # product sums (module docstring): their number and their cmul terms (absorbed cmul
    # instructions; their adds are counted in ``add``)
    sums: int = 0
    cmul: int = 0

    def __add__(self, o: FusedCounts) -> FusedCounts:
        return FusedCounts(*(a + b for a, b in zip(self.astuple(), o.astuple(), strict=True)))

    def astuple(self) -> tuple[int, ...]:
        return (self.blocks, self.products, self.babies, self.giants, self.rot, self.hoisted_groups,
                self.hoisted_rotations, self.pmul, self.add, self.rescale, self.block_rescales, self.bases,
                self.q_blocks, self.q_products, self.q_babies, self.sums, self.cmul)

    def to_json(self) -> dict[str, int]:
        keys = ("blocks", "products", "babies", "giants", "rot", "hoisted_groups", "hoisted_rotations",
                "pmul", "add", "rescale", "block_rescales", "bases", "q_blocks", "q_products", "q_babies",
                "sums", "cmul")
        return dict(zip(keys, self.astuple(), strict=True))


@dataclass(frozen=True)
class _Term:
    """One product of a form: the register it rotates lazily (offset ``beta``) or multiplies
    as it is (``beta`` 0), its plaintext, the baby rotation's instruction (-1: none) and
    the register the plan multiplies."""

    base: str
    beta: int
    pt: str
    rot_at: int
    reg: str


@dataclass
class _Form:
    base: str  # the origin: every product reads it or rotations (of rotations) of it
    groups: dict[int, list[_Term]]
    rescaled: bool = False
    rotated: bool = False
    instrs: list[int] = field(default_factory=list)
    qmode: bool = False  # set for the roots by _mark_qmode
    # giant offsets the plan rotates after the form's rescale (one level below the base,
    # where the fused block rotates): their keys may have been made a level lower
    low_giants: frozenset[int] = frozenset()

    def giantless(self) -> bool:
        return set(self.groups) == {0}

    def terms(self) -> int:
        return sum(len(v) for v in self.groups.values())

    def worth(self) -> bool:
        if self.terms() > 1:
            return True
        return any(g != 0 or any(t.beta != 0 for t in ts) for g, ts in self.groups.items())

    def babies(self) -> set[tuple[str, int]]:
        """The lazily rotated (register, offset) pairs the form reads."""
        return {(t.base, t.beta) for ts in self.groups.values() for t in ts if t.beta != 0}

    def block(self) -> FusedBlock:
        """The fused block this root form is."""
        return FusedBlock(self.base, self.terms(), sum(1 for g in self.groups if g != 0), frozenset(self.babies()),
                          self.rescaled, self.qmode, self.instrs[-1],
                          sum(len(ts) // 2 for ts in self.groups.values()))


def fused_counts(program: Sequence[Mapping[str, Any] | ir.Instr], slots: int) -> FusedCounts:
    """The executor's fused blocks of ``program`` (rules in the module docstring)."""
    roots, skip, instrs = _analyse(program, slots)
    sums = product_sums(instrs)
    for ps in sums:
        skip.update(ps.instrs)
    return _counts(instrs, roots, skip, len(sums))


@dataclass(frozen=True)
class ProductSum:
    """A sum of ct-ct products relinearised once: its (a, b) operand registers, its
    instructions (cmuls and adds, the root last)."""

    terms: tuple[tuple[str, str], ...]
    instrs: tuple[int, ...]

    @property
    def root(self) -> int:
        return self.instrs[-1]


def product_sums(instrs: Sequence[Any]) -> list[ProductSum]:
    """The product sums of a decoded program (module docstring; relin.go's rules)."""
    users: dict[str, int] = {}
    for ins in instrs:
        for r in ins.reads():
            users[r] = users.get(r, 0) + 1
    # (terms, instructions) by register, grown in place: an absorbed operand's lists are
    # its sum's alone (each operand has one user), so a long chain of adds stays linear
    sums: dict[str, tuple[list[tuple[str, str]], list[int]]] = {}
    absorbed: set[str] = set()
    for i, ins in enumerate(instrs):
        if isinstance(ins, ir.CMul):
            sums[ins.dst] = ([(ins.a, ins.b)], [i])
        elif isinstance(ins, ir.Add):
            sa, sb = sums.get(ins.a), sums.get(ins.b)
            if sa is None or sb is None or ins.a == ins.b or users.get(ins.a) != 1 or users.get(ins.b) != 1:
                continue
            sa[0].extend(sb[0])
            sa[1].extend(sb[1])
            sa[1].append(i)
            sums[ins.dst] = sa
            absorbed.update((ins.a, ins.b))
    return [ProductSum(tuple(t), tuple(ix)) for r, (t, ix) in sums.items() if r not in absorbed and len(t) >= 2]


def _analyse(
    program: Sequence[Mapping[str, Any] | ir.Instr], slots: int, key_levels: Mapping[int, int] | None = None,
    scheduled: bool | None = None, split_giants: bool = False,
) -> tuple[list[_Form], set[int], list[Any]]:
    """(fused roots, absorbed instruction indices, decoded instructions); ``key_levels``:
    the level each rotation key is made at, where the plan records it (``keys``);
    ``scheduled``: decide the blocks as under a key schedule (None: whether the program has
    ``load_key``/``drop_key``); ``split_giants``: every block with giant steps fused group by
    group, as when a schedule drops each giant key before the block's root."""
    instrs = [ir.decode(raw) for raw in program]
    if scheduled is None:
        scheduled = any(isinstance(ins, ir.LoadKey | ir.DropKey) for ins in instrs)
    roots, skip, split = _analyse_once(instrs, slots, scheduled, set(), key_levels)
    if split_giants:
        split |= {i for f in roots for i in f.instrs if isinstance(instrs[i], ir.Rot)}
    if split:
        roots, skip, _ = _analyse_once(instrs, slots, scheduled, split, key_levels)
    _mark_qmode(roots)
    return roots, skip, instrs


def _analyse_once(
    instrs: list[Any], slots: int, scheduled: bool, no_giant: set[int], key_levels: Mapping[int, int] | None = None
) -> tuple[list[_Form], set[int], set[int]]:
    """(roots, absorbed instructions, giant rotations of the blocks refused for their giant
    keys), the giant rotations in ``no_giant`` not absorbed."""
    users: dict[str, list[int]] = {}
    for i, ins in enumerate(instrs):
        for r in ins.reads():
            users.setdefault(r, []).append(i)
    forms, absorbed, baby_instr = _forms(instrs, slots, no_giant, users)
    roots: list[_Form] = []
    split: set[int] = set()
    for r, f in forms.items():
        if r in absorbed or not f.worth():
            continue
        if _key_levels_fit(f, key_levels) and (not scheduled or _giant_keys_stay(instrs, f, slots)):
            roots.append(f)
        else:
            split.update(i for i in f.instrs if isinstance(instrs[i], ir.Rot))
    if scheduled:
        roots = _drop_lone_qp_blocks(roots)
    skip = _absorbed(roots, baby_instr, users)
    for f in roots:
        # a baby the plan computes anyway is multiplied as it is
        f.groups = {g: [t if t.rot_at < 0 or t.rot_at in skip else _Term(t.reg, 0, t.pt, -1, t.reg) for t in ts]
                    for g, ts in f.groups.items()}
    return roots, skip, split


def _forms(
    instrs: list[Any], slots: int, no_giant: set[int], users: dict[str, list[int]]
) -> tuple[dict[str, _Form], set[str], dict[str, int]]:
    """The linear forms of a program by register, the registers absorbed by their consumer,
    and the instruction of every baby rotation (module docstring)."""

    def single(r: str) -> bool:
        return len(users.get(r, ())) == 1

    babies: dict[str, tuple[str, int]] = {}
    baby_instr: dict[str, int] = {}
    origin: dict[str, str] = {}
    forms: dict[str, _Form] = {}
    absorbed: set[str] = set()
    for i, ins in enumerate(instrs):
        if isinstance(ins, ir.RotHoisted):
            if ins.src not in forms:
                for d, k in zip(ins.dsts, ins.ks, strict=True):
                    babies[d] = (ins.src, k % slots)
                    baby_instr[d] = i
                    origin[d] = origin.get(ins.src, ins.src)
        elif isinstance(ins, ir.Rot):
            f = forms.get(ins.src)
            if f is None:
                babies[ins.dst] = (ins.src, ins.k % slots)
                baby_instr[ins.dst] = i
                origin[ins.dst] = origin.get(ins.src, ins.src)
            elif single(ins.src) and not f.rotated and set(f.groups) == {0} and i not in no_giant:
                g = ins.k % slots
                low = f.low_giants | {g} if f.rescaled else f.low_giants
                f.instrs.append(i)  # (f is absorbed: its lists pass to the new form)
                forms[ins.dst] = _Form(f.base, {g: f.groups[0]}, f.rescaled, True, f.instrs, low_giants=low)
                absorbed.add(ins.src)
        elif isinstance(ins, ir.PMul):
            if ins.src in babies:
                base, beta = babies[ins.src]
                t = _Term(base, beta, ins.pt, baby_instr[ins.src], ins.src)
                forms[ins.dst] = _Form(origin.get(base, base), {0: [t]}, instrs=[i])
            elif ins.src not in forms:
                t = _Term(ins.src, 0, ins.pt, -1, ins.src)
                forms[ins.dst] = _Form(origin.get(ins.src, ins.src), {0: [t]}, instrs=[i])
        elif isinstance(ins, ir.Add):
            fa, fb = forms.get(ins.a), forms.get(ins.b)
            if (fa is None or fb is None or ins.a == ins.b or not single(ins.a) or not single(ins.b)
                    or fa.base != fb.base or fa.rescaled != fb.rescaled):
                continue
            # both operands are absorbed (one user each, never looked up again): fa grows in
            # place and becomes the sum's form, so a long sum of products stays linear
            for g, ts in fb.groups.items():
                fa.groups.setdefault(g, []).extend(ts)
            fa.instrs.extend(fb.instrs)
            fa.instrs.append(i)
            fa.rotated = fa.rotated or fb.rotated
            if fb.low_giants:
                fa.low_giants = fa.low_giants | fb.low_giants
            forms[ins.dst] = fa
            absorbed.update((ins.a, ins.b))
        elif isinstance(ins, ir.Rescale):
            f = forms.get(ins.src)
            if f is None or f.rescaled or not single(ins.src):
                continue
            f.instrs.append(i)
            f.rescaled = True  # (absorbed: f becomes the rescaled register's form)
            forms[ins.dst] = f
            absorbed.add(ins.src)
    return forms, absorbed, baby_instr


def _giant_keys_stay(instrs: list[Any], f: _Form, slots: int) -> bool:
    """Every giant rotation's key (and the block ``boot``) stays resident from the rotation
    to the form's root, where the fused block rotates."""
    root = f.instrs[-1]
    for i in f.instrs:
        rot = instrs[i]
        if not isinstance(rot, ir.Rot):
            continue
        for q in range(i + 1, root):
            d = instrs[q]
            if isinstance(d, ir.DropKey) and (d.block is not None or (d.k is not None and d.k % slots == rot.k % slots)):
                return False
    return True


def _key_levels_fit(f: _Form, levels: Mapping[int, int] | None) -> bool:
    """A block rotates its giant steps at its base's level, where the plan may rotate one
    level lower (after the form's rescale) with a key made there: such a giant key (with a
    recorded level) must reach the base's level. Every lazily rotated baby's key reaches it
    (the plan rotates the base with it), so the base's level is at most the lowest of them
    (a key without a recorded level is at the top); without such a baby key the base's level
    is unknown and the block is split."""
    if not f.low_giants or not levels:
        return True
    bound = float("inf")  # no baby key with a recorded level: the base may be at the top
    babies = False
    for ts in f.groups.values():
        for t in ts:
            if t.beta == 0:
                continue
            babies = True
            if t.beta in levels:
                bound = min(bound, levels[t.beta])
    return not any(g in levels and (not babies or levels[g] < bound) for g in f.low_giants)


def _drop_lone_qp_blocks(roots: list[_Form]) -> list[_Form]:
    """Under a key schedule, the one-product blocks that run in Q mode: in QP each would pay
    two ModDowns where the plan's hoisted rotation pays one (LoLa at n14 under a half cap:
    9181 such blocks, 36.7 s fused against 10.6 s as written, measured when the executor
    decided this); in Q mode they share their base's babies."""
    _mark_qmode(roots)
    return [f for f in roots if f.terms() >= 2 or f.qmode]


def _mark_qmode(roots: list[_Form]) -> None:
    """Q mode for an origin's giantless blocks when they outnumber the distinct lazily
    rotated babies they read (module docstring; conv2 at n13 has 688 blocks of 1.3 products
    over 32 babies)."""
    blocks: dict[str, int] = {}
    babies: dict[str, set[tuple[str, int]]] = {}
    for f in roots:
        if f.giantless():
            blocks[f.base] = blocks.get(f.base, 0) + 1
            babies.setdefault(f.base, set()).update(f.babies())
    for f in roots:
        f.qmode = f.giantless() and blocks[f.base] > len(babies[f.base])


@dataclass(frozen=True)
class FusedBlock:
    """One fused block: its origin register, its products, its non-zero giant offsets, the
    lazily rotated (register, offset) babies it needs (shared with the other blocks on the
    same registers) and whether the plan rescales it."""

    base: str
    products: int
    giants: int
    babies: frozenset[tuple[str, int]]
    rescaled: bool
    qmode: bool = False  # evaluated in Q (module docstring)
    root: int = -1  # the instruction where the executor runs the block (its last)
    # products whose plaintexts a streaming run encodes two at a time (consecutive products
    # of a giant step, backends/lattigo/encode_pair.go): len // 2 per giant step
    pairs: int = 0


def q_babies(blocks: Sequence[FusedBlock], level: Callable[[str], int], p_primes: int) -> set[int]:
    """Indices of the QP blocks a run that streams its plaintexts evaluates with their babies
    in Q (module docstring, *Q babies*), decided block by block in program order: for every
    register a block reads, the NTTs (of one prime) saved over all the QP blocks on it, the P
    primes of each product's plaintext and one ModDown of c1 per giant step (``products x P +
    giants x (Q + P)``), must exceed the two ModDowns of each of its babies not yet in Q
    (``fresh x 2 (Q + P)``; a Q-mode block brings its babies down too); a register whose
    babies came down in place serves only such blocks after. ``level``: a register's level
    (Q = level + 1 primes); ``p_primes``: P."""
    work: dict[str, list[int]] = {}
    betas: dict[str, set[int]] = {}
    for blk in blocks:
        for r in _regs(blk):
            if not blk.qmode:
                w = work.setdefault(r, [0, 0])
                w[0] += blk.products
                w[1] += blk.giants
        for r, beta in blk.babies:
            betas.setdefault(r, set()).add(beta)
    down: dict[str, set[int]] = {}  # babies already in Q, per register
    in_place: set[str] = set()
    out: set[int] = set()
    for k in sorted(range(len(blocks)), key=lambda k: blocks[k].root):
        blk = blocks[k]
        regs = _regs(blk)
        if not blk.qmode:
            q = level(blk.base) + 1

            def pays(r: str, q: int = q) -> bool:
                fresh = len(betas.get(r, set()) - down.get(r, set()))
                products, giants = work.get(r, (0, 0))
                return products * p_primes + giants * (q + p_primes) > fresh * 2 * (q + p_primes)

            if not (regs & in_place or all(pays(r) for r in regs)):
                continue
            out.add(k)
            in_place |= regs
        for r, beta in blk.babies:  # brought down (a Q-mode block's too: pooled copies)
            down.setdefault(r, set()).add(beta)
    return out


def _regs(blk: FusedBlock) -> set[str]:
    """The registers a block's products read (its base and its babies' registers)."""
    return {blk.base} | {r for r, _ in blk.babies}


def fused_blocks(program: Sequence[Mapping[str, Any]], slots: int) -> tuple[list[FusedBlock], set[int]]:
    """The executor's fused blocks of ``program`` and the indices of the instructions they
    absorb (the same analysis as ``fused_counts``)."""
    roots, skip, _ = _analyse(program, slots)
    return [f.block() for f in roots], skip


def giant_spans(program: Sequence[Mapping[str, Any]], slots: int) -> list[tuple[int, int, int]]:
    """The giant rotations of the blocks the executor fuses in ``program`` without a key
    schedule, as (rotation's index, block root's index, key offset): a key schedule keeps
    such a block whole only when the key stays resident from the rotation to the root
    (module docstring; the key schedule's ``keep_giant_keys``)."""
    instrs = [ir.decode(raw) for raw in program]
    roots, _, _ = _analyse_once(instrs, slots, False, set())
    out: list[tuple[int, int, int]] = []
    for f in roots:
        root = f.instrs[-1]
        for i in f.instrs:
            rot = instrs[i]
            if isinstance(rot, ir.Rot) and i < root:
                out.append((i, root, rot.rot_keys()[0]))
    return sorted(out)


def _absorbed(roots: list[_Form], baby_instr: dict[str, int], users: dict[str, list[int]]) -> set[int]:
    """Instructions the fused roots absorb, with baby rotations whose every use is absorbed
    and that no other baby rotation reads (a two-hop rotation's first hop runs)."""
    skip: set[int] = set()
    for f in roots:
        skip.update(f.instrs)
    by_instr: dict[int, list[str]] = {}
    for d, i in baby_instr.items():
        by_instr.setdefault(i, []).append(d)
    baby_at = set(by_instr)
    for i, ds in by_instr.items():
        uses = [u for d in ds for u in users.get(d, ())]
        if uses and all(u in skip and u not in baby_at for u in uses):
            skip.add(i)
    return skip


def _counts(instrs: list[Any], roots: list[_Form], skip: set[int], sums: int = 0) -> FusedCounts:
    betas: dict[str, set[tuple[str, int]]] = {}
    q_betas: dict[str, set[tuple[str, int]]] = {}
    products = giants = q_products = 0
    for f in roots:
        bs = f.babies()
        if f.qmode:
            q_products += f.terms()
            q_betas.setdefault(f.base, set()).update(bs)
        else:
            products += f.terms()
        giants += sum(1 for g in f.groups if g != 0)
        betas.setdefault(f.base, set()).update(bs)
    rot = hg = hr = pmul = add = rescale = cmul = 0
    for i in skip:
        ins = instrs[i]
        if isinstance(ins, ir.CMul):
            cmul += 1
        if isinstance(ins, ir.RotHoisted):
            hg += 1
            hr += ins.count()
        elif isinstance(ins, ir.Rot):
            rot += 1
        elif isinstance(ins, ir.PMul):
            pmul += 1
        elif isinstance(ins, ir.Add):
            add += 1
        elif isinstance(ins, ir.Rescale):
            rescale += 1
    return FusedCounts(
        blocks=sum(1 for f in roots if not f.qmode), products=products, babies=sum(len(b) for b in betas.values()), giants=giants,
        rot=rot, hoisted_groups=hg, hoisted_rotations=hr, pmul=pmul, add=add, rescale=rescale,
        block_rescales=sum(1 for f in roots if f.rescaled),
        bases=len({r for b in betas.values() for r, _ in b}),
        q_blocks=sum(1 for f in roots if f.qmode), q_products=q_products,
        q_babies=sum(len(b) for b in q_betas.values()), sums=sums, cmul=cmul,
    )
