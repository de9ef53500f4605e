"""The time model: what every operation, fused block, bootstrap and key load costs.

One model prices time everywhere (docs/time-model.md): the solver's objective
(:meth:`TimeModel.vector`, a candidate's cost vector at the table's top-level weights), a
plan's modelled seconds (:func:`program_seconds`: ``slotplan lattigo-bench``, batches, the
reports), the key strategies (:func:`modelled_time` and its prices :meth:`TimeModel.rot_ms`,
:meth:`TimeModel.split_ms`, :meth:`TimeModel.load_ms`) and ``slotplan keybench``/``keycurve``/
``keymeasure``.  A cost table (:mod:`planner.cost.tables`) gives each operation's weight at
the top level; a calibrated one (``slotplan calibrate``) also every operation at several
levels (read by :func:`interpolate`), the bootstrap and one key's load.  A plan's
instructions and fused blocks (``planner.ir.fusion``, priced by :mod:`planner.cost.blocks`)
are priced at the level of their registers (``max_level`` minus the register's depth, one up
while a product is not yet rescaled); :class:`Run` says how the executor runs the plan when
it differs from the planning model's defaults (levels dropped, plaintexts encoded in the
clock, no core of its own for the key reader).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner import ir
from planner.cost.blocks import price_blocks
from planner.cost.conditions import Run, executor_bootstraps, key_load_ms
from planner.cost.tables import COST_TABLES, OBJECTIVE_SCALE, CostTable, load_costs
from planner.frontend.params import Params
from planner.ir import boot_block
from planner.ir.analysis import level_drops, register_depths
from planner.ir.fusion import fused_blocks, product_sums
from planner.kernels.base import CostVector

__all__ = [
    "BOOTSTRAP_ROTATIONS",
    "KEY_LOAD_MS_PER_BYTE",
    "ROTATION_MS",
    "ModelledTime",
    "Run",
    "TimeModel",
    "interpolate",
    "modelled_time",
    "plan_model",
    "program_seconds",
    "time_model",
]

# Rotation (key switch) at the top level, milliseconds, from shared/notes/lattigo-gopy.md
# ("Rotation at max level: ~5 ms (LogN 13), ~20-40 ms (LogN 14), ~120-200 ms (LogN 16)",
# measured with Lattigo v6.1.1 on these machines).  LogN 14 and 16 take the middle of the
# measured range; LogN 12 and 15 are not measured: scaled by N log N between neighbours.
# Only for presets without a calibrated table.
ROTATION_MS = {12: 2.3, 13: 5.0, 14: 30.0, 15: 70.0, 16: 150.0}
# Reading a key back from the page cache: "an 80 MiB key reads back in ~25-70 ms"
# (same notes); the middle of that range, proportional to the key's bytes.
KEY_LOAD_MS_PER_80MIB = 47.5
KEY_LOAD_MS_PER_BYTE = KEY_LOAD_MS_PER_80MIB / (80 * 2**20)
# Measured with Lattigo v6.1.1 (shared notes, lattigo-bootstrapping.md): one bootstrap of
# N16QP1546H192H32 took 28.5 s, one rotation at level 9 on its evaluator 0.089 s, so a
# bootstrap costs about 319 rotations (183 at log N 14).  The weight of a table without a
# measured ``bootstrap`` weight.
BOOTSTRAP_ROTATIONS = 319.0
# The plaintext store (backends/lattigo/ptstore.go): a plaintext read back is its bytes
# copied from the page cache (readahead issued ahead of the reader) and its values hashed
# with SHA-256 for its key. Measured by ResNet-20 at n16boot on one core (session 32,
# 2026-11-28, the Zen 4 these VMs sometimes are; model-bench --plaintext-store, the second
# run): 19.53 GB read in 3.24 s, 6350 vectors of 256 KiB hashed in 1.09 s.
STORE_READ_BYTES_PER_MS = 6.0e6
STORE_HASH_BYTES_PER_MS = 1.5e6

_UNIT_SECONDS = {"millisecond": 1e-3, "second": 1.0, "microsecond": 1e-6}

# per_level_ms measurement of each priced operation
_PER_LEVEL_KEYS = ("encode", "encode_pair", "rotate", "hoisted_rotation_extra", "pmul", "cmul_relin", "add", "rescale",
                   "block_fixed", "block_base", "block_finish", "block_baby", "block_giant", "block_product",
                   "block_product_q", "block_baby_q", "block_q", "cmul_tensor", "relin")
# a Q-mode weight missing from an older table: priced as its QP counterpart
_FALLBACK = {"block_product_q": "block_product", "block_baby_q": "block_finish", "block_q": "add",
             "cmul_tensor": "cmul_relin"}


def interpolate(points: Sequence[tuple[int, float]], level: int) -> float:
    """The value at ``level`` of (level, value) points sorted by level: linear between two
    points, the nearest point's value outside them."""
    if level <= points[0][0]:
        return points[0][1]
    for (l0, v0), (l1, v1) in zip(points, points[1:], strict=False):
        if level <= l1:
            return v0 + (v1 - v0) * (level - l0) / (l1 - l0)
    return points[-1][1]


def _or(x: float | None, default: float) -> float:
    return default if x is None else x


class TimeModel:
    """A cost table's prices (module docstring).  Weights are in the table's unit
    (``unit``); ``ms_per_unit`` converts them to milliseconds (1 for a table in
    milliseconds; the measured rotation's milliseconds for a table in rotations)."""

    def __init__(self, table: CostTable, *, ms_per_unit: float | None = None,
                 load_ms_per_byte: float | None = None, source: str | None = None):
        self.table = table
        w = table.weights
        self.weights = w
        meas: Mapping[str, Any] = table.measurements or {}
        per = meas.get("per_level_ms") or {}
        self.points: dict[str, list[tuple[int, float]]] = {}
        for key in _PER_LEVEL_KEYS:
            pts = sorted((int(lv), float(m[key])) for lv, m in per.items() if key in m)
            if pts:
                self.points[key] = pts
        top = {"rotate": w.rotation, "hoisted_rotation_extra": w.hoisted_rotation, "pmul": w.pmul,
               "cmul_relin": w.cmul, "add": w.add, "rescale": w.rescale, "block_fixed": w.block,
               "block_finish": w.block, "block_base": w.block_base,
               "block_baby": w.block_baby, "block_giant": w.block_giant, "block_product": w.block_product,
               "block_product_q": w.block_product_q, "block_baby_q": w.block_baby_q, "block_q": w.block_q,
               "cmul_tensor": w.cmul_tensor, "relin": w.relin}
        self.top = {k: v for k, v in top.items() if v is not None}
        self.fused = w.fused  # the table prices what the executor fuses
        self.bootstrap = w.bootstrap if w.bootstrap is not None else BOOTSTRAP_ROTATIONS * w.rotation
        # issue 36: one instruction of each bootstrap variant the table prices
        self.boot_variants: dict[str, float] = dict(table.boot_variants or {})
        unit_s = _UNIT_SECONDS.get(table.unit)
        self.seconds_per_unit = unit_s if unit_s is not None else (ms_per_unit or 0.0) * 1e-3
        self.ms_per_unit = ms_per_unit if ms_per_unit is not None else (unit_s or 0.0) * 1e3
        if load_ms_per_byte is None:
            load = meas.get("key_load_ms")
            kb = meas.get("galois_key_bytes")
            if isinstance(load, dict) and isinstance(kb, int | float) and kb > 0:
                load_ms_per_byte = key_load_ms(load, meas.get("key_read_keys")) / float(kb)
            else:
                load_ms_per_byte = KEY_LOAD_MS_PER_BYTE
        self.load_ms_per_byte = load_ms_per_byte
        self.source = source or f"cost table {table.name}"
        # encoding the bootstrap's DFT matrices when the block is loaded (calibrated)
        boot_meas = meas.get("bootstrap")
        self.matrix_ms = float(boot_meas.get("matrix_encoding_ms", 0.0)) if isinstance(boot_meas, dict) else 0.0
        # each bootstrap kind timed as the executor runs it (calibrate --boot-variants), and
        # whether that run streamed the block (its reads then inside the time)
        self.boot_run, self.boot_run_streamed = executor_bootstraps(meas.get("boot_variants"))
        # the key-switching primes P of the calibrated parameters (a QP encoding's extra NTTs)
        self.p_primes = len((table.params or {}).get("log_p") or [])  # type: ignore[arg-type]

    # -- weights by level ------------------------------------------------------------

    def at(self, key: str, level: int) -> float:
        """``key`` at ``level`` in the table's unit."""
        pts = self.points.get(key)
        if not pts and key not in self.top and key in _FALLBACK:
            return self.at(_FALLBACK[key], level)
        if not pts:
            return self.top.get(key, 0.0)
        return interpolate(pts, level)

    def variant_units(self, label: str) -> float | None:
        """One instruction of a bootstrap variant (table units; None: not priced): the
        table's price, or for ``r<k>`` without one (the sparse bootstrap left unpacked,
        planner.assign.boot_variants) ``s<k>``'s less its unpacking product, one plaintext
        product and rescale at the highest level the table measured."""
        if label in self.boot_variants:
            return self.boot_variants[label]
        sparse = self.boot_variants.get("s" + label[1:]) if label[:1] == "r" else None
        if sparse is None:
            return None
        top = max((lv for lv, _ in self.points.get("pmul", [])), default=0)
        return max(0.0, sparse - self.at("pmul", top) - self.at("rescale", top))

    def rot_ms(self, level: int) -> float:
        """One rotation (key switch) at ``level``, milliseconds."""
        return self.at("rotate", level) * self.ms_per_unit

    def hoist_ms(self, level: int) -> float:
        """One more offset of a hoisted rotation at ``level``, milliseconds."""
        return self.at("hoisted_rotation_extra", level) * self.ms_per_unit

    def split_ms(self, level: int) -> float:
        """What one more sub-group of a hoisted rotation costs: a decomposition."""
        return max(0.0, self.rot_ms(level) - self.hoist_ms(level))

    def load_ms(self, nbytes: int) -> float:
        """Reading one key of ``nbytes`` from the key store, milliseconds."""
        return nbytes * self.load_ms_per_byte

    def encode(self, level: int, qp: bool) -> float:
        """Encoding one plaintext at ``level`` (table units): in Q, or in QP (a QP block's
        plaintexts: the P primes too).  An encoding is one inverse FFT and one NTT per
        prime, so it is the line through the calibrated ``encode`` at the top level and at
        level 0 (``level + 1`` primes; the middle level is not used: at n16boot it measured
        78-147 ms between 23.6 and 11.3), read at the encoding's number of primes."""
        return self._per_prime("encode", level, qp)

    def encode_pair(self, level: int, qp: bool) -> float:
        """Encoding two real plaintexts together (table units), as a streaming run encodes
        consecutive products of a block (backends/lattigo/encode_pair.go: one inverse FFT and
        one NTT per prime for both): the line through the calibrated ``encode_pair`` as
        :meth:`encode`; a table without it prices the two one by one."""
        if not self.points.get("encode_pair"):
            return 2 * self.encode(level, qp)
        return self._per_prime("encode_pair", level, qp)

    def encode_block(self, level: int, qp: bool, products: int, pairs: int) -> float:
        """A streamed block's plaintexts: ``pairs`` pairs and the rest one by one."""
        return self.encode_pair(level, qp) * pairs + self.encode(level, qp) * (products - 2 * pairs)

    def store_read(self, level: int, qp: bool, slots: int) -> float:
        """One plaintext read back from the plaintext store (table units): its limbs (``level
        + 1`` primes, the P primes too in QP, of 2 * ``slots`` words) copied at
        :data:`STORE_READ_BYTES_PER_MS` and its values (``slots`` doubles) hashed at
        :data:`STORE_HASH_BYTES_PER_MS` (the entry's key)."""
        limbs = level + 1 + (self.p_primes if qp else 0)
        ms = limbs * 2 * slots * 8 / STORE_READ_BYTES_PER_MS + slots * 8 / STORE_HASH_BYTES_PER_MS
        return ms / self.ms_per_unit

    def _per_prime(self, key: str, level: int, qp: bool) -> float:
        pts = self.points.get(key)
        if not pts:
            return 0.0
        (l0, e0), (l1, e1) = pts[0], pts[-1]
        per_prime = (e1 - e0) / (l1 - l0) if l1 > l0 else 0.0
        primes = level + 1 + (self.p_primes if qp else 0)
        return e0 + per_prime * (primes - (l0 + 1))

    # -- the objective (a candidate's cost vector, top-level weights) ------------------

    def vector(self, c: CostVector) -> float:
        """A cost vector in the table's unit at the top-level weights: the solver's
        objective for one candidate (fused blocks as the executor runs them when the
        table prices them)."""
        w = self.weights
        f = c.fused
        if not w.fused:
            f = type(f)()
        # a hoisted group pays one full rotation, its other offsets the hoisted price
        extra_hoisted = (c.hoisted_rotations - f.hoisted_rotations) - (c.hoisted_groups - f.hoisted_groups)
        rotations = c.rotations - f.rot - f.hoisted_rotations
        base = (
            w.rotation * (rotations - extra_hoisted)
            + w.hoisted_rotation * extra_hoisted
            + w.pmul * (c.pmul - f.pmul)
            + w.cmul * (c.cmul - f.cmul)
            + _or(w.cmul_tensor, w.cmul) * f.cmul + _or(w.relin, 0.0) * f.sums
            + w.add * (c.add - f.add)
            + w.rescale * (c.rescale - f.rescale + f.block_rescales)
            + w.poly * c.poly
            + w.depth * c.depth
            + (self.bootstrap * c.bootstraps if c.bootstraps else 0.0)
        )
        if f.blocks or f.q_blocks:
            assert w.block is not None and w.block_baby is not None
            assert w.block_giant is not None and w.block_product is not None
            base += (w.block * f.blocks + w.block_baby * f.babies + w.block_giant * f.giants
                     + w.block_product * f.products + (w.block_base or 0.0) * f.bases)
        if f.q_blocks:
            assert w.block is not None and w.block_product is not None
            base += (_or(w.block_product_q, w.block_product) * f.q_products
                     + _or(w.block_baby_q, w.block) * f.q_babies + _or(w.block_q, w.add) * f.q_blocks)
        return base

    def units(self, c: CostVector) -> int:
        """:meth:`vector` in the solvers' integer objective units."""
        return int(round(self.vector(c) * OBJECTIVE_SCALE))

    def bootstrap_units(self) -> int:
        """Objective units of bootstrapping one ciphertext."""
        return int(round(self.bootstrap * OBJECTIVE_SCALE))

    def node_key_load(self, nbytes: int) -> float:
        """The objective's estimate of loading one key of ``nbytes`` under a cap (table
        units; each node loads its distinct keys once, before the instruction-level key
        schedule exists): the constants' load-to-rotation ratio at log N 16
        (:data:`KEY_LOAD_MS_PER_80MIB` over ``ROTATION_MS[16]``) times the table's rotation
        weight.  Kept as it was when the model was unified, so that plans stay byte for
        byte as they were; it is not the calibrated :meth:`load_ms` (at n14boot 8.6x
        lower), which the instruction-level schedule and the runtime use."""
        return self.weights.rotation * (KEY_LOAD_MS_PER_80MIB / ROTATION_MS[16]) * nbytes / (80 * 2**20)

    # -- a program, level by level ------------------------------------------------------

    def instr(self, ins: Any, lv: int) -> float:
        """One instruction run as written at level ``lv`` (table units)."""
        if isinstance(ins, ir.RotHoisted):
            n = ins.count()
            return self.at("rotate", lv) + self.at("hoisted_rotation_extra", lv) * max(0, n - 1)
        if isinstance(ins, ir.Rot):
            return self.at("rotate", lv) * ins.count()
        if isinstance(ins, ir.PMul):
            return self.at("pmul", lv)
        if isinstance(ins, ir.CMul):
            return self.at("cmul_relin", lv)
        if isinstance(ins, ir.Rescale):
            return self.at("rescale", lv)
        if isinstance(ins, ir.Poly):
            # calibrated once, at the top level (``once_ms.poly3``); a polynomial is its
            # ciphertext products and rescales, so it scales with the level as a product
            # does (LeNet-5 at n14boot: priced flat, its polys measured 0.45-0.77 of the
            # model relative to the rotations of the same run)
            prod = self.points.get("cmul_relin")
            base = self.weights.poly * self.at("cmul_relin", lv) / prod[-1][1] if prod and prod[-1][1] > 0 \
                else self.weights.poly
            if ins.mask is not None:
                # a masked poly (Lattigo's PolynomialVector): each coefficient's product is by
                # a plaintext vector encoded for it, not by a constant (priced at the input's
                # level, where the baby steps' products are, or above)
                base += (ins.degree() + 1) * (self.encode(lv, False) + self.at("pmul", lv))
            return base
        if ir.is_bootstrap(ins):  # a variant at its price (the full one's where the table has none)
            w = self.variant_units(boot_block.variant_label(ins) or "")
            return self.bootstrap * ins.count() if w is None else w
        if ins.counter == "add":
            return self.at("add", lv) * ins.count()
        if ins.counter == "rotations":  # other rotating instructions (e.g. CinS butterflies)
            return self.at("rotate", lv) * ins.count()
        return 0.0

    def program_costs(self, program: Sequence[Mapping[str, Any]], max_level: int, slots: int,
                      run: Run | None = None, stats: dict[str, int] | None = None) -> list[float]:
        """Each instruction's cost (table units) with every instruction and fused block at
        its level; a fused block or product sum is charged at its root, the instructions it
        absorbs cost nothing of their own.  ``run`` (:class:`Run`): at the levels the
        executor drops fresh values to, and with each plaintext's encoding.  ``stats``:
        :func:`planner.cost.blocks.price_blocks`'s."""
        run = run or Run()
        prog = [ir.decode(dict(raw)) for raw in program]
        cost = [0.0] * len(prog)
        drops = level_drops(program, max_level) if run.level_drops else None
        depth = register_depths(program, drops, max_level)
        blocks, skip = fused_blocks(program, slots)
        # product sums: each cmul term a tensor product at its level, one relinearisation at
        # the lowest level of its terms (where the executor accumulates)
        sum_of: dict[int, int] = {}
        sums = product_sums(prog) if self.fused else []
        for n, ps in enumerate(sums):
            skip = skip | set(ps.instrs)
            sum_of.update((i, n) for i in ps.instrs)
        sum_level: dict[int, int] = {}
        pending: dict[str, bool] = {}

        def level(reg: str) -> int:
            return max(0, max_level - depth.get(reg, 0) + (1 if pending.get(reg) else 0))

        for i, ins in enumerate(prog):
            reads = ins.reads()
            lv = max((level(r) for r in reads), default=max_level)
            if isinstance(ins, ir.PMul | ir.CMul | ir.Poly) and any(pending.get(r) for r in reads):
                # the executor rescales an unrescaled operand before multiplying it
                if i not in skip or isinstance(ins, ir.CMul):
                    cost[i] += self.at("rescale", lv)
                lv -= 1
                for r in reads:
                    pending[r] = False
            if i not in skip and run.bootstrap_measured and ir.is_bootstrap(ins) and self.boot_run:
                kind = boot_block.variant_label(ins) or "full"
                cost[i] += self.boot_run.get(kind, self.instr(ins, lv) * self.ms_per_unit) / self.ms_per_unit
            elif i not in skip:
                cost[i] += self.instr(ins, lv)
                if run.encode and isinstance(ins, ir.PMul):
                    cost[i] += self.encode(lv, qp=False)
            elif i in sum_of:
                n = sum_of[i]
                if isinstance(ins, ir.CMul):
                    cost[i] += self.at("cmul_tensor", lv)
                    sum_level[n] = min(sum_level.get(n, lv), lv)
                if i == sums[n].root:
                    cost[i] += self.at("relin", sum_level[n])
            dirty = isinstance(ins, ir.PMul | ir.CMul) or (
                not isinstance(ins, ir.Rescale | ir.Poly) and any(pending.get(r) for r in reads))
            for w in ins.writes():
                pending[w] = dirty
        enc: Callable[[int, bool, int, int], float] | None = self.encode_block if run.encode else None
        if run.plaintext_store:
            def enc(lv: int, qp: bool, products: int, pairs: int) -> float:
                return products * self.store_read(lv, qp, slots)
        price_blocks(self.at, self.weights.block_base is not None, blocks, level, cost, enc, self.p_primes, stats)
        return cost

    def breakdown_ms(self, program: Sequence[Mapping[str, Any]], max_level: int, slots: int,
                     run: Run | None = None) -> dict[str, float]:
        """:meth:`program_costs` in milliseconds summed by the op of the instruction charged
        (a fused block's or product sum's cost under ``fused``), for comparing with the
        executor's measured seconds per op."""
        blocks, skip = fused_blocks(program, slots)
        roots = {b.root for b in blocks}
        out: dict[str, float] = {}
        for i, (raw, c) in enumerate(zip(program, self.program_costs(program, max_level, slots, run), strict=True)):
            if c:
                name = "fused" if i in skip or i in roots else str(raw.get("op"))
                out[name] = out.get(name, 0.0) + c * self.ms_per_unit
        return out

    def program_seconds(self, program: Sequence[Mapping[str, Any]], max_level: int, slots: int,
                        run: Run | None = None) -> float:
        """The program's modelled compute time in seconds (:meth:`program_costs`)."""
        return sum(self.program_costs(program, max_level, slots, run)) * self.seconds_per_unit


def program_seconds(program: Sequence[Mapping[str, Any]], table: CostTable, max_level: int, slots: int) -> float:
    """The program's modelled time in seconds under ``table``, every instruction and fused
    block priced at its level (module docstring)."""
    return TimeModel(table).program_seconds(program, max_level, slots)


def rotation_ms(params: Params) -> float:
    """A top-level rotation at the ring size of ``params`` (:data:`ROTATION_MS`)."""
    if params.log_n in ROTATION_MS:
        return ROTATION_MS[params.log_n]
    # outside the table: N log N scaling from the nearest entry
    ref = min(ROTATION_MS, key=lambda n: abs(n - params.log_n))
    return ROTATION_MS[ref] * (2 ** (params.log_n - ref)) * params.log_n / ref


def time_model(params: Params) -> TimeModel:
    """The time model of a preset: its calibrated table ``<preset>-lattigo`` when there is
    one, else the default table's weights in milliseconds of a rotation at its ring size
    (:func:`rotation_ms`) and loads at :data:`KEY_LOAD_MS_PER_BYTE`."""
    name = f"{params.name}-lattigo"
    if name in COST_TABLES:
        t = COST_TABLES.create(name)
        if t.is_time:
            return TimeModel(t)
    return TimeModel(load_costs("default"), ms_per_unit=rotation_ms(params), load_ms_per_byte=KEY_LOAD_MS_PER_BYTE,
                     source=f"default table x {rotation_ms(params)} ms per rotation (planner.cost.timing.ROTATION_MS)")


def plan_model(plan: Mapping[str, Any], params: Params, table: str | Path | None = None) -> TimeModel | None:
    """The model a plan's time is reported under: the calibrated table its objective used,
    else its preset's ``<preset>-lattigo``; ``table``: that table instead; None without a
    calibrated one."""
    t = load_costs(table if table is not None else str((plan.get("options") or {}).get("costs") or "default"))
    if not t.is_time:
        alt = f"{params.name}-lattigo"
        if alt not in COST_TABLES:
            return None
        t = load_costs(alt)
    return TimeModel(t)


@dataclass
class ModelledTime:
    total_ms: float
    compute_ms: float
    load_ms: float  # all loads, whether hidden or not
    stall_ms: float  # time the program waited for a key
    matrix_ms: float = 0.0  # of compute_ms: the bootstrapping DFT matrices encoded at block loads

    def to_json(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in vars(self).items()}


def modelled_time(
    program: Sequence[Mapping[str, Any]], params: Params, key_bytes: Mapping[int, int], tm: TimeModel,
    prefetch: bool = True,
    preload_prologue: bool = True,
    run: Run | None = None,
) -> ModelledTime:
    """The program's modelled evaluation time: compute as :meth:`TimeModel.program_costs`
    prices it (fused blocks included), and its key traffic.  Keys named by ``load_key``
    are read by one background loader in ``load_key`` order from that point on
    (``prefetch``) and the program waits at a key's first use until it is read; without
    ``prefetch`` a load runs in line.  A plan without key schedule has every key in memory
    beforehand (keep-all); with ``preload_prologue`` so have the keys a schedule loads
    before its first computing instruction or block load (the counterpart of keep-all's
    up-front loads: both read before the clock, as BenchPlan's ``preload_prologue``).  The
    block ``boot`` is read in line where the plan loads it (``boot_block.keys_in_line``);
    keep-all has it resident beforehand.  ``run`` (:class:`Run`): the program as the
    executor runs it; without ``loader_core`` every read is in line (prefetching saves
    nothing on a core the evaluation uses)."""
    run = run or Run()
    prefetch = prefetch and run.loader_core
    prog = ir.decode_program(program)
    cost = tm.program_costs(program, params.max_level, params.slots, run)
    used = boot_block.variants_used(prog, params)
    clock = compute = loads = stall = matrices = 0.0
    loader_free = 0.0
    ready: dict[int, float] = {}
    top = params.rotation_key_bytes()
    prologue = preload_prologue
    stream = False
    for ins, units in zip(prog, cost, strict=True):
        if prologue and not (isinstance(ins, ir.Input) or isinstance(ins, ir.LoadKey) and ins.k is not None):
            prologue = False
        if isinstance(ins, ir.LoadKey | ir.DropKey) and ins.k is None:
            stream = isinstance(ins, ir.LoadKey) and ins.stream is not None
            if isinstance(ins, ir.LoadKey) and params.boot is not None:
                # the block's keys are read in line where the plan loads it (a streamed
                # block: its relinearisation and encapsulation keys; the loader reads the
                # Galois keys during the bootstraps, below)
                ms = tm.load_ms(boot_block.keys_in_line(params, ins.stream, used))
                loads += ms
                clock += ms
                if run.encode:  # and its DFT matrices encoded: the calibrated full set's time per byte
                    mat = tm.matrix_ms * (1 + sum(v.matrix_bytes for v in used) / max(1, params.boot.matrix_bytes))
                    clock += mat
                    compute += mat
                    matrices += mat
            continue
        if isinstance(ins, ir.LoadKey):
            if ins.k is None:
                continue
            ms = tm.load_ms(key_bytes.get(int(ins.k), top))
            loads += ms
            if prologue:
                ready[int(ins.k)] = 0.0
            elif prefetch:
                start = max(clock, loader_free)
                loader_free = start + ms
                ready[int(ins.k)] = loader_free
            else:
                clock += ms
            continue
        if isinstance(ins, ir.DropKey):
            if ins.k is not None and ready.get(int(ins.k), 0.0) > clock:
                stall += ready[int(ins.k)] - clock
                clock = ready[int(ins.k)]
            continue
        wait = max((ready.get(k, 0.0) for k in ins.rot_keys()), default=0.0)
        if wait > clock:
            stall += wait - clock
            clock = wait
        ms = units * tm.ms_per_unit
        compute += ms
        clock += ms
        measured_streamed = run.bootstrap_measured and tm.boot_run_streamed.get(
            boot_block.variant_label(ins) or "full", False) if ir.is_bootstrap(ins) else False
        if stream and ir.is_bootstrap(ins) and params.boot is not None and not measured_streamed:
            # a streamed block: the loader reads the bootstrap's Galois keys (each distinct
            # key once: a lower bound, DFT stages share a few) while it runs
            read = boot_block.galois_keys(params, used) * tm.load_ms(params.rotation_key_bytes(params.key_max_level))
            loads += read
            if not run.loader_core:
                clock += read
                continue
            start = max(clock - ms, loader_free)
            loader_free = start + read
            if loader_free > clock:
                stall += loader_free - clock
                clock = loader_free
    return ModelledTime(clock, compute, loads, stall, matrices)
