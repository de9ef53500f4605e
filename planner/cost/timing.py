"""A plan's modelled time, level by level, under a calibrated cost table.

The solver's objective prices every operation with the table's top-level weights (a
candidate does not know the level its operands will have). A plan does: every register's
multiplicative depth follows from the program (``planner.ir.analysis.register_depths``), so
each instruction runs at a known level, and ``slotplan calibrate`` measured every
operation at several levels (``measurements.per_level_ms``: the top level, the middle one
and 0). ``program_seconds`` prices each executed instruction, and each fused block
(``planner.ir.fusion``: the Lattigo executor's double-hoisted blocks) at the level it runs at,
with the measured times interpolated linearly between the calibrated levels. This is what
``slotplan lattigo-bench`` compares with the measured evaluation time.

Complex packing (docs/formats.md): ``conj`` is one key switch, priced as a rotation at
its level (counter ``rotations``); ``mul_i`` is exact and keyless, priced as an add
(counter ``add``).

Levels: a register of depth d is at level ``max_level - d`` once rescaled; a product not
yet rescaled (pmul/cmul and adds, rotations of it, until its ``rescale``) is still one
level up. Multiplications by such an operand run after the executor's automatic rescale.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from planner import ir
from planner.cost.tables import CostTable
from planner.ir.analysis import register_depths
from planner.ir.fusion import fused_blocks, product_sums

# per_level_ms measurement of each priced operation
_PER_LEVEL_KEYS = ("rotate", "hoisted_rotation_extra", "pmul", "cmul_relin", "add", "rescale",
                   "block_fixed", "block_base", "block_finish", "block_baby", "block_giant", "block_product",
                   "block_product_q", "block_baby_q", "block_q", "cmul_tensor", "relin")


class LevelWeights:
    """Per-level milliseconds of a calibrated table, linearly interpolated in the level."""

    def __init__(self, table: CostTable):
        meas: Mapping[str, Any] = table.measurements or {}
        per = meas.get("per_level_ms") or {}
        self.points: dict[str, list[tuple[int, float]]] = {}
        for key in _PER_LEVEL_KEYS:
            pts = sorted((int(lv), float(m[key])) for lv, m in per.items() if key in m)
            if pts:
                self.points[key] = pts
        w = table.weights
        top = {"rotate": w.rotation, "hoisted_rotation_extra": w.hoisted_rotation, "pmul": w.pmul,
               "cmul_relin": w.cmul, "add": w.add, "rescale": w.rescale, "block_fixed": w.block,
               "block_finish": w.block, "block_base": w.block_base,
               "block_baby": w.block_baby, "block_giant": w.block_giant, "block_product": w.block_product,
               "block_product_q": w.block_product_q, "block_baby_q": w.block_baby_q, "block_q": w.block_q,
               "cmul_tensor": w.cmul_tensor, "relin": w.relin}
        self.top = {k: v for k, v in top.items() if v is not None}
        self.fused = w.fused  # the table prices what the executor fuses
        self.poly = w.poly
        self.bootstrap = w.bootstrap_weight()
        self.scale = {"millisecond": 1e-3, "second": 1.0, "microsecond": 1e-6}[table.unit]

    # a Q-mode weight missing from an older table: priced as its QP counterpart
    _FALLBACK = {"block_product_q": "block_product", "block_baby_q": "block_finish", "block_q": "add",
                 "cmul_tensor": "cmul_relin"}

    def at(self, key: str, level: int) -> float:
        """Milliseconds (the table's unit) of ``key`` at ``level``."""
        pts = self.points.get(key)
        if not pts and key not in self.top and key in self._FALLBACK:
            return self.at(self._FALLBACK[key], level)
        if not pts:
            return self.top.get(key, 0.0)
        if level <= pts[0][0]:
            return pts[0][1]
        for (l0, v0), (l1, v1) in zip(pts, pts[1:], strict=False):
            if level <= l1:
                return v0 + (v1 - v0) * (level - l0) / (l1 - l0)
        return pts[-1][1]


def program_seconds(program: Sequence[Mapping[str, Any]], table: CostTable, max_level: int, slots: int) -> float:
    """The program's modelled time in seconds, every instruction and fused block priced at
    its level (module docstring)."""
    lw = LevelWeights(table)
    depth = register_depths(program)
    blocks, skip = fused_blocks(program, slots)
    # product sums: each cmul term a tensor product at its level, one relinearisation at
    # the lowest level of its terms (where the executor accumulates)
    sum_of: dict[int, int] = {}
    sums = product_sums([ir.decode(dict(raw)) for raw in program]) if lw.fused else []
    for n, ps in enumerate(sums):
        skip = skip | set(ps.instrs)
        sum_of.update((i, n) for i in ps.instrs)
    sum_level: dict[int, int] = {}
    pending: dict[str, bool] = {}
    total = 0.0

    def level(reg: str) -> int:
        return max(0, max_level - depth.get(reg, 0) + (1 if pending.get(reg) else 0))

    for i, raw in enumerate(program):
        ins = ir.decode(dict(raw))
        reads = ins.reads()
        lv = max((level(r) for r in reads), default=max_level)
        if isinstance(ins, ir.PMul | ir.CMul | ir.Poly) and any(pending.get(r) for r in reads):
            # the executor rescales an unrescaled operand before multiplying it
            if i not in skip or isinstance(ins, ir.CMul):
                total += lw.at("rescale", lv)
            lv -= 1
            for r in reads:
                pending[r] = False
        if i not in skip:
            total += _instr_ms(ins, lv, lw)
        elif i in sum_of:
            n = sum_of[i]
            if isinstance(ins, ir.CMul):
                total += lw.at("cmul_tensor", lv)
                sum_level[n] = min(sum_level.get(n, lv), lv)
            if i == sums[n].root:
                total += lw.at("relin", sum_level[n])
        dirty = isinstance(ins, ir.PMul | ir.CMul) or (
            not isinstance(ins, ir.Rescale | ir.Poly) and any(pending.get(r) for r in reads))
        for w in ins.writes():
            pending[w] = dirty
    babies: dict[str, set[tuple[str, int]]] = {}
    q_babies: dict[str, set[tuple[str, int]]] = {}
    decomposed: set[str] = set()
    split = table.weights.block_base is not None  # decomposition once per base
    for blk in blocks:
        lv = level(blk.base)
        fixed = 0.0
        if blk.qmode:  # Q mode (planner.ir.fusion): no ModDown per block, babies brought down once
            new_q = blk.babies - q_babies.setdefault(blk.base, set())
            total += (lw.at("block_q", lv) + lw.at("block_product_q", lv) * blk.products
                      + lw.at("block_baby_q", lv) * len(new_q))
            q_babies[blk.base] |= new_q
        else:
            fixed = lw.at("block_finish", lv) if split else lw.at("block_fixed", lv)
            total += lw.at("block_giant", lv) * blk.giants + lw.at("block_product", lv) * blk.products
        regs = {r for r, _ in blk.babies} - decomposed  # one decomposition per rotated register
        if split and regs:
            fixed += lw.at("block_base", lv) * len(regs)
        decomposed |= regs
        total += fixed
        if blk.rescaled:
            total += lw.at("rescale", lv)
        new = blk.babies - babies.setdefault(blk.base, set())
        total += lw.at("block_baby", lv) * len(new)
        babies[blk.base] |= new
    return total * lw.scale


def _instr_ms(ins: Any, lv: int, lw: LevelWeights) -> float:
    if isinstance(ins, ir.RotHoisted):
        n = ins.count()
        return lw.at("rotate", lv) + lw.at("hoisted_rotation_extra", lv) * max(0, n - 1)
    if isinstance(ins, ir.Rot):
        return lw.at("rotate", lv) * ins.count()
    if isinstance(ins, ir.PMul):
        return lw.at("pmul", lv)
    if isinstance(ins, ir.CMul):
        return lw.at("cmul_relin", lv)
    if isinstance(ins, ir.Rescale):
        return lw.at("rescale", lv)
    if isinstance(ins, ir.Poly):
        return lw.poly
    if ir.is_bootstrap(ins):
        return lw.bootstrap * ins.count()
    if ins.counter == "add":
        return lw.at("add", lv) * ins.count()
    if ins.counter == "rotations":  # other rotating instructions (e.g. CinS butterflies)
        return lw.at("rotate", lv) * ins.count()
    return 0.0

