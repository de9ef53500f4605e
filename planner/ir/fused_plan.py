"""The plan's ``fused`` annotation: the fused blocks the Lattigo executor runs, decided once
by the planner (:mod:`planner.ir.fusion`) and written into the plan over its instructions.

The annotation names instructions of ``program`` by index and changes none of them: a
reader that ignores it executes the same program (SPEC section 4). Its schema
(docs/formats.md, "Fused blocks")::

    "fused": {
      "blocks": [{"instrs": [3, 4, 7, 8, 9], "mode": "qp"}, ...],
      "babies": [2, 5]
    }

* ``blocks[j].instrs``: the instructions of one block in increasing order, its root (the
  instruction whose ``dst`` the block writes) last: ``pmul`` products, the ``add`` tree
  over them, at most one ``rescale`` and one giant ``rot`` on the way from each product to
  the root;
* ``blocks[j].mode``: ``"qp"`` (products accumulated in the extended basis, one ModDown
  per block, giant steps allowed) or ``"q"`` (no giant step; the base's baby rotations
  brought down to Q once and the products accumulated in Q);
* ``blocks[j].babies_in_q`` (optional, ``"qp"`` blocks only): ``true`` where a run that
  streams its plaintexts evaluates the block with its babies in Q (:func:`planner.ir.fusion.q_babies`);
* ``babies``: the baby rotations (``rot``/``rot_hoisted``) the blocks rotate lazily
  instead: a product of such a rotation's output is the rotation's source rotated by its
  offset inside the block. Every other product multiplies its register as it is.

:func:`read_fused` checks an annotation against the program (indices in range, operations,
the block being a tree whose only outside reads are its products' registers, one rescale
state and at most one giant rotation per product, lazily rotated outputs read by blocks
only) and returns what each block computes; ``backends/lattigo/fused.go`` applies the same
checks before it runs the blocks. A malformed annotation is refused with one line naming
the field (:class:`common.errors.PlanFileError`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common.errors import PlanFileError
from planner.ir.analysis import level_drops, register_depths
from planner.ir.fusion import _analyse, q_babies
from planner.ir.instructions import Instr, UnknownOpError, decode_program

FIELD = "fused"
MODES = ("qp", "q")


def plan_key_levels(plan: Mapping[str, Any]) -> dict[int, int]:
    """The level each rotation key is made at, where the plan's ``keys`` records one."""
    out: dict[int, int] = {}
    keys = plan.get("keys")
    if not isinstance(keys, Mapping):
        return out
    for k, v in keys.items():
        try:
            off = int(k)
        except (TypeError, ValueError):
            continue
        if isinstance(v, Mapping) and isinstance(v.get("level"), int):
            out[off] = int(v["level"])
    return out


def fused_annotation(
    program: Sequence[Mapping[str, Any] | Instr], slots: int, key_levels: Mapping[int, int] | None = None,
    scheduled: bool | None = None, split_giants: bool = False, level: Callable[[str], int] | None = None,
    p_primes: int = 0,
) -> dict[str, Any]:
    """The ``fused`` annotation of ``program``: the blocks :mod:`planner.ir.fusion` decides
    (which instructions, Q or QP mode) and the baby rotations they absorb. ``scheduled``
    (True: as under a key schedule, for a program that has none yet) and ``split_giants``
    (every block with giant steps fused group by group, as when the schedule drops its giant
    keys early): the key scheduler's views of the plan it is making
    (planner.cost.process.executor_series). ``level`` (a register's level) and ``p_primes``
    (the key-switching basis' special primes): mark the QP blocks a streaming run evaluates
    with their babies in Q (``babies_in_q``; :func:`planner.ir.fusion.q_babies`)."""
    roots, skip, _ = _analyse(program, slots, key_levels, scheduled, split_giants)
    in_q: set[int] = set()
    if level is not None and p_primes:
        fb = [f.block() for f in roots]
        in_q = {fb[k].root for k in q_babies(fb, level, p_primes)}
    blocks = sorted((sorted(f.instrs), f.qmode) for f in roots)
    in_blocks = {i for f in roots for i in f.instrs}
    return {
        "blocks": [{"instrs": instrs, "mode": "q" if q else "qp", **({"babies_in_q": True} if instrs[-1] in in_q else {})}
                   for instrs, q in blocks],
        "babies": sorted(skip - in_blocks),
    }


def annotate(plan: dict[str, Any]) -> dict[str, Any]:
    """Set ``plan["fused"]`` to the annotation of its program (in place; returned), the Q
    babies decided at the levels the executor runs the registers at (a bootstrapping plan's
    fresh values dropped to the levels their consumers need: planner.ir.analysis.level_drops)."""
    params = plan["params"]
    slots = int(params["slots"])
    max_level = int(params.get("max_level", 0))
    program = decode_program(plan["program"])  # once for the analyses below
    try:
        drops = level_drops(program, max_level) if params.get("boot") else None
        depth: dict[str, int] | None = register_depths(program, drops, max_level)
    except KeyError:  # a register read before it is written: no marks; the executor's
        depth = None  # validation names the instruction

    def level(reg: str) -> int:
        assert depth is not None
        return max(0, max_level - depth.get(reg, 0))

    plan[FIELD] = fused_annotation(program, slots, plan_key_levels(plan),
                                   level=level if depth is not None else None,
                                   p_primes=len(params.get("log_p") or []))
    return plan


def with_fused(plan: Mapping[str, Any]) -> dict[str, Any]:
    """``plan`` as the Lattigo executor gets it: its own ``fused`` annotation when it has one
    (checked: :func:`read_fused`), else a copy with the annotation computed now (older and
    hand-written plans)."""
    if FIELD in plan:
        read_fused(plan)
        return dict(plan)
    try:
        return annotate(dict(plan))
    except UnknownOpError:
        # a program the executor cannot decode either: it is handed over unannotated, and
        # the executor's own validation names the instruction at fault
        return dict(plan)


@dataclass(frozen=True)
class Product:
    """One product of a block: ``pt`` times ``base`` rotated by ``beta`` (0: as it is),
    summed into the giant step of offset ``giant`` (0: none); ``at`` is its ``pmul``."""

    at: int
    base: str
    beta: int
    pt: str
    giant: int


@dataclass(frozen=True)
class Block:
    """One block as the executor runs it: where it runs (``root``, writing ``dst``), its
    instructions, products, rescale and mode."""

    root: int
    dst: str
    instrs: tuple[int, ...]
    products: tuple[Product, ...]
    rescaled: bool
    qmode: bool

    @property
    def giants(self) -> tuple[int, ...]:
        return tuple(sorted({p.giant for p in self.products} - {0}))


_BLOCK_OPS = ("pmul", "add", "rescale", "rot")


def read_fused(plan: Mapping[str, Any]) -> tuple[list[Block], list[int]]:
    """Check the plan's ``fused`` annotation against its program and return its blocks and
    baby rotations (([], []) without an annotation). Raises :class:`PlanFileError` naming
    the field and the rule."""
    ann = plan.get(FIELD)
    if ann is None:
        return [], []
    prog = plan.get("program")
    slots = (plan.get("params") or {}).get("slots")
    if not isinstance(prog, list) or not isinstance(slots, int) or slots <= 0:
        raise PlanFileError(f"plan field '{FIELD}': the plan has no program or no params.slots to annotate")
    return _Reader(prog, slots).read(ann)


def _bad(where: str, rule: str) -> PlanFileError:
    return PlanFileError(f"plan field '{FIELD}{where}': {rule}")


def _reads(d: Mapping[str, Any]) -> list[str]:
    o = d.get("op")
    if o in ("add", "sub", "cmul"):
        return [str(d.get("a")), str(d.get("b"))]
    if o == "to_cins":
        return [str(d.get("re"))] + ([] if d.get("im") is None else [str(d.get("im"))])
    return [str(d["src"])] if "src" in d else []


def _writes(d: Mapping[str, Any]) -> list[str]:
    if isinstance(d.get("dsts"), list):
        return [str(r) for r in d["dsts"]]
    return [str(d["dst"])] if "dst" in d else []


class _Reader:
    """The program's dataflow, and the annotation checked against it (read_fused)."""

    def __init__(self, prog: list[Any], slots: int) -> None:
        self.prog, self.slots = prog, slots
        self.ops: list[str] = []
        self.writer: dict[str, int] = {}
        self.users: dict[str, list[int]] = {}
        self.rotated: dict[str, tuple[str, int]] = {}  # a rotation's output -> (its source, offset)
        for i, d in enumerate(prog):
            if not isinstance(d, Mapping):
                self.ops.append("?")
                continue
            self.ops.append(str(d.get("op")))
            for r in _writes(d):
                self.writer[r] = i
            for r in _reads(d):
                self.users.setdefault(r, []).append(i)
            if self.ops[i] == "rot" and isinstance(d.get("k"), int):
                self.rotated[str(d.get("dst"))] = (str(d.get("src")), d["k"] % slots)
            elif self.ops[i] == "rot_hoisted" and isinstance(d.get("ks"), list) and isinstance(d.get("dsts"), list):
                for r, k in zip(d["dsts"], d["ks"], strict=False):
                    if isinstance(k, int):
                        self.rotated[str(r)] = (str(d.get("src")), k % slots)
        self.babies: set[int] = set()
        self.owner: dict[int, int] = {}
        self.lazy_readers: set[int] = set()  # pmuls that rotate a baby's source lazily

    def index(self, v: Any, where: str) -> int:
        n = len(self.prog)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n:
            raise _bad(where, f"{v!r} is not an instruction index (0..{n - 1})")
        return v

    def read(self, ann: Any) -> tuple[list[Block], list[int]]:
        if not isinstance(ann, Mapping):
            raise _bad("", 'must be an object {"blocks": [...], "babies": [...]}')
        extra = sorted(set(ann) - {"blocks", "babies"})
        if extra:
            raise _bad("", f"unknown key {extra[0]!r} (expected 'blocks' and 'babies')")
        blocks_raw, babies_raw = ann.get("blocks"), ann.get("babies")
        if not isinstance(blocks_raw, list):
            raise _bad(".blocks", "must be a list of blocks")
        if not isinstance(babies_raw, list):
            raise _bad(".babies", "must be a list of instruction indices")
        babies = []
        for j, v in enumerate(babies_raw):
            i = self.index(v, f".babies[{j}]")
            if self.ops[i] not in ("rot", "rot_hoisted"):
                raise _bad(f".babies[{j}]", f"instruction {i} ({self.ops[i]}) is no rot/rot_hoisted")
            if i in self.babies:
                raise _bad(f".babies[{j}]", f"instruction {i} is listed twice")
            self.babies.add(i)
            babies.append(i)
        blocks = [self.block(b, blk) for b, blk in enumerate(blocks_raw)]
        # a lazily rotated baby's outputs are read only by block products (they are never made)
        for j, i in enumerate(babies):
            us = [u for r in _writes(self.prog[i]) for u in self.users.get(r, [])]
            if not us or any(u not in self.lazy_readers for u in us):
                raise _bad(f".babies[{j}]", f"instruction {i} ({self.ops[i]}): its outputs must be read, and only "
                           "by the pmul products of blocks")
        return blocks, babies

    def block(self, b: int, blk: Any) -> Block:
        w = f".blocks[{b}]"
        if not isinstance(blk, Mapping):
            raise _bad(w, 'must be an object {"instrs": [...], "mode": "qp"|"q"}')
        extra = sorted(set(blk) - {"instrs", "mode", "babies_in_q"})
        if extra:
            raise _bad(w, f"unknown key {extra[0]!r} (expected 'instrs', 'mode' and optionally 'babies_in_q')")
        mode = blk.get("mode")
        if mode not in MODES:
            raise _bad(f"{w}.mode", f"{mode!r} is not one of {list(MODES)}")
        if "babies_in_q" in blk and (blk["babies_in_q"] is not True or mode != "qp"):
            raise _bad(f"{w}.babies_in_q", "is true, on a 'qp' block only (absent: false)")
        raw = blk.get("instrs")
        if not isinstance(raw, list) or not raw:
            raise _bad(f"{w}.instrs", "must be a non-empty list of instruction indices")
        instrs = [self.index(v, f"{w}.instrs[{j}]") for j, v in enumerate(raw)]
        for j, i in enumerate(instrs):
            if j and i <= instrs[j - 1]:
                raise _bad(f"{w}.instrs[{j}]", "indices must be strictly increasing (the root last)")
            if self.ops[i] not in _BLOCK_OPS:
                raise _bad(f"{w}.instrs[{j}]", f"instruction {i} ({self.ops[i]}) cannot be part of a block "
                           f"(only {', '.join(_BLOCK_OPS)})")
            if i in self.owner:
                raise _bad(f"{w}.instrs[{j}]", f"instruction {i} is already in block {self.owner[i]}")
            if i in self.babies:
                raise _bad(f"{w}.instrs[{j}]", f"instruction {i} is also listed in '{FIELD}.babies'")
            self.owner[i] = b
        self.check_tree(w, instrs)
        products = self.products(w, instrs)
        if mode == "q" and any(p.giant for p in products):
            raise _bad(f"{w}.mode", "'q' is for blocks without a giant rotation")
        root = instrs[-1]
        rescaled = self.above(instrs)[products[0].at][1] == 1
        return Block(root, str(self.prog[root].get("dst")), tuple(instrs), tuple(products), rescaled, mode == "q")

    def check_tree(self, w: str, instrs: list[int]) -> None:
        """Every value but the root's is read once, inside the block; every operand of an
        add/rescale/rot is a value of the block (a pmul's register comes from outside)."""
        root, inside = instrs[-1], set(instrs)
        for j, i in enumerate(instrs):
            d, op = self.prog[i], self.ops[i]
            if i != root:
                us = self.users.get(str(d.get("dst")), [])
                if len(us) != 1 or us[0] not in inside:
                    raise _bad(f"{w}.instrs[{j}]", f"instruction {i} ({op}) writes {d.get('dst')}, which must be "
                               "read once, by an instruction of the same block")
            if op == "pmul":
                continue
            rs = _reads(d)
            if op == "add" and rs[0] == rs[1]:
                raise _bad(f"{w}.instrs[{j}]", f"instruction {i} (add) adds {rs[0]} to itself")
            for r in rs:
                if self.writer.get(r) not in inside:
                    raise _bad(f"{w}.instrs[{j}]", f"instruction {i} ({op}) reads {r}, which no instruction of "
                               "the block writes (a block's only outside reads are its products' registers)")

    def above(self, instrs: list[int]) -> dict[int, tuple[int, int, int]]:
        """(rotations, rescales, giant offset) strictly above each instruction of a tree."""
        out: dict[int, tuple[int, int, int]] = {instrs[-1]: (0, 0, 0)}
        for i in reversed(instrs[:-1]):
            at = self.users[str(self.prog[i].get("dst"))][0]
            n_rot, n_res, giant = out[at]
            if self.ops[at] == "rot":
                k = self.prog[at].get("k")
                n_rot, giant = n_rot + 1, (k if isinstance(k, int) else 0) % self.slots
            elif self.ops[at] == "rescale":
                n_res += 1
            out[i] = (n_rot, n_res, giant)
        return out

    def products(self, w: str, instrs: list[int]) -> list[Product]:
        """The block's products: at most one rotation and one rescale from each to the root,
        every product rescaled alike; a product of a listed baby rotation reads its source."""
        above = self.above(instrs)
        products: list[Product] = []
        rescales: set[int] = set()
        for j, i in enumerate(instrs):
            if self.ops[i] != "pmul":
                continue
            n_rot, n_res, giant = above[i]
            if n_rot > 1 or n_res > 1:
                raise _bad(f"{w}.instrs[{j}]", f"product {i} reaches the root through {n_rot} rotations and "
                           f"{n_res} rescales (at most one of each)")
            rescales.add(n_res)
            d = self.prog[i]
            reg = str(d.get("src"))
            base, beta = reg, 0
            if self.writer.get(reg) in self.babies and reg in self.rotated:
                base, beta = self.rotated[reg]
                self.lazy_readers.add(i)
            products.append(Product(i, base, beta, str(d.get("pt")), giant))
        if not products:
            raise _bad(f"{w}.instrs", "a block has at least one pmul")
        if len(rescales) > 1:
            raise _bad(f"{w}.instrs", "its products do not share one rescale state (every product is rescaled "
                       "once, or none)")
        return products
