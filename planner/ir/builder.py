"""Straight-line HE program builder (SSA) with lazily generated slot tables.

Instructions follow shared/SPEC.md section 4.  Tables (``T.idx`` / ``T.coef``) are not
materialised while planning: each is a generator called when the tables are written or
the plan is simulated, so planning an MVM2-sized kernel stays fast.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from planner import ir
from planner.ir.instructions import stoc_keys, to_cins_keys

TableGen = Callable[[], tuple[np.ndarray, np.ndarray | None]]


@dataclass
class TableSpec:
    name: str
    gen: TableGen


@dataclass
class Plaintext:
    name: str
    source: str  # weight tensor name or "const"
    table: str
    l: int | None = None  # noqa: E741  (a cins(l) plaintext: table of length 2 * slots)
    # a complex plaintext (complex packing): its imaginary part's table over the same source
    imag_table: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "table": self.table}
        if self.l is not None:
            out["l"] = self.l
        if self.imag_table is not None:
            out["imag_table"] = self.imag_table
        return out


class LazyTables(Mapping[str, np.ndarray]):
    """npz-like mapping ``"T.idx" / "T.coef" -> array`` backed by table generators.

    Generated tables are cached only for the most recent table, so streaming through a
    large plan keeps memory bounded.
    """

    def __init__(self, specs: Mapping[str, TableSpec]):
        self._specs = dict(specs)
        self._last: tuple[str, np.ndarray, np.ndarray | None] | None = None

    def _get(self, table: str) -> tuple[np.ndarray, np.ndarray | None]:
        if self._last is not None and self._last[0] == table:
            return self._last[1], self._last[2]
        idx, coef = self._specs[table].gen()
        self._last = (table, idx, coef)
        return idx, coef

    def __getitem__(self, key: str) -> np.ndarray:
        table, _, kind = key.rpartition(".")
        if table not in self._specs or kind not in ("idx", "coef"):
            raise KeyError(key)
        idx, coef = self._get(table)
        if kind == "idx":
            return idx
        if coef is None:
            raise KeyError(key)
        return coef

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        table, _, kind = key.rpartition(".")
        if table not in self._specs:
            return False
        if kind == "idx":
            return True
        if kind == "coef":
            return self._get(table)[1] is not None
        return False

    def __iter__(self) -> Iterator[str]:
        for name in self._specs:
            yield f"{name}.idx"
            if self._get(name)[1] is not None:
                yield f"{name}.coef"

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def table_names(self) -> list[str]:
        return list(self._specs)


@dataclass
class ProgramBuilder:
    slots: int
    plaintexts: dict[str, Plaintext] = field(default_factory=dict)
    tables: dict[str, TableSpec] = field(default_factory=dict)
    depth: dict[str, int] = field(default_factory=dict)
    _n: int = 0
    _np: int = 0
    _const_cache: dict[tuple[Any, ...], str] = field(default_factory=dict)
    # weight name -> flat offset: a kernel lowered for one block of a larger weight (an
    # entry of a batched matmul) reads that block; its plaintexts' tables are offset and
    # named per block, and a block read again (a weight without batch) reuses them
    weight_blocks: dict[str, int] = field(default_factory=dict)
    _block_cache: dict[tuple[str, str, int], str] = field(default_factory=dict)
    # (plaintext, factor) -> its scaled copy (planner.assign.fold)
    _scaled_cache: dict[tuple[str, float], str] = field(default_factory=dict)
    _n_scaled: int = 0
    # the program's instructions as objects; ``instrs`` is their JSON form, made when read
    # (the cost paths count and analyse scratch lowerings from the objects alone)
    objs: list[ir.Instr] = field(default_factory=list)
    _json: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def instrs(self) -> list[dict[str, Any]]:
        """The program in its JSON form (what the plan's program holds), up to date with
        ``objs`` whenever read."""
        n = len(self._json)
        if n < len(self.objs):
            self._json.extend(ins.to_json() for ins in self.objs[n:])
        return self._json

    # ---------------------------------------------------------------- registers
    def _reg(self, d: int) -> str:
        name = f"c{self._n}"
        self._n += 1
        self.depth[name] = d
        return name

    def norm(self, k: int) -> int:
        return k % self.slots

    # ---------------------------------------------------------------- tables
    def table(self, name: str, gen: TableGen) -> str:
        if name in self.tables:
            raise ValueError(f"table {name} defined twice")
        self.tables[name] = TableSpec(name, gen)
        return name

    def plaintext(
        self, source: str, table: str, gen: TableGen, l: int | None = None,  # noqa: E741
        imag: TableGen | None = None,
    ) -> str:
        """A plaintext over ``source`` read through table ``table``; ``imag`` (complex
        packing) generates its imaginary part's table (``<table>/im``)."""
        offset = self.weight_blocks.get(source)
        if offset is not None:
            key = (source, table, offset)
            if key in self._block_cache:
                return self._block_cache[key]
            name = self._plaintext(source, f"{table}@{offset}", _offset_table(gen, offset), l,
                                   None if imag is None else _offset_table(imag, offset))
            self._block_cache[key] = name
            return name
        return self._plaintext(source, table, gen, l, imag)

    def _plaintext(
        self, source: str, table: str, gen: TableGen, l: int | None = None,  # noqa: E741
        imag: TableGen | None = None,
    ) -> str:
        self.table(table, gen)
        imag_table = None if imag is None else self.table(f"{table}/im", imag)
        name = f"p{self._np}"
        self._np += 1
        self.plaintexts[name] = Plaintext(name, source, table, l, imag_table)
        return name

    def const_plaintext(self, key: tuple[Any, ...], table: str, coef: Callable[[], np.ndarray],
                        imag: Callable[[], np.ndarray] | None = None) -> str:
        """A ``source: "const"`` plaintext (masks); identical keys share one plaintext.
        ``imag``: its imaginary part (a complex plaintext, table ``<table>/im``)."""
        if key in self._const_cache:
            return self._const_cache[key]
        slots = self.slots

        def gen() -> tuple[np.ndarray, np.ndarray | None]:
            return np.full(slots, -1, dtype=np.int64), coef().astype(np.float64)

        def gen_imag() -> tuple[np.ndarray, np.ndarray | None]:
            assert imag is not None
            return np.full(slots, -1, dtype=np.int64), imag().astype(np.float64)

        name = self.plaintext("const", table, gen, imag=None if imag is None else gen_imag)
        self._const_cache[key] = name
        return name

    def scaled_plaintext(self, pt: str, s: float, scale: Callable[[TableGen], TableGen]) -> str:
        """A copy of plaintext ``pt`` times ``s`` (``scale`` wraps its table generator; a
        Chebyshev change of variable folded into a producer, planner.assign.fold); one copy per
        (plaintext, factor)."""
        key = (pt, s)
        if key not in self._scaled_cache:
            src = self.plaintexts[pt]
            name = f"{src.table}/scaled{self._n_scaled}"
            self._n_scaled += 1
            imag = None if src.imag_table is None else scale(self.tables[src.imag_table].gen)
            self._scaled_cache[key] = self._plaintext(src.source, name, scale(self.tables[src.table].gen), src.l,
                                                      imag)
        return self._scaled_cache[key]

    def drop_plaintexts(self, names: Iterable[str]) -> None:
        """Forget plaintexts nothing reads (and their tables and cache entries)."""
        gone = set(names)
        for p in gone:
            pt = self.plaintexts.pop(p)
            self.tables.pop(pt.table, None)
            if pt.imag_table is not None:
                self.tables.pop(pt.imag_table, None)
        for cache in (self._const_cache, self._block_cache, self._scaled_cache):
            for k in [k for k, v in cache.items() if v in gone]:
                del cache[k]  # type: ignore[arg-type]

    # ---------------------------------------------------------------- instructions
    def _emit(self, ins: ir.Instr) -> None:
        self.objs.append(ins)

    def set_instr(self, i: int, ins: ir.Instr) -> None:
        """Replace the ``i``-th instruction (its object, and its JSON form if made)."""
        self.objs[i] = ins
        if i < len(self._json):
            self._json[i] = ins.to_json()

    def maskable_poly(self, reg: str, since: int = 0) -> int | None:
        """The index of the poly (degree >= 1, no mask yet) among ``objs[since:]`` that writes
        ``reg``, when nothing after it reads ``reg``: a mask on ``reg`` can then be the poly's
        own (:meth:`mask_poly`); None otherwise."""
        for i in range(len(self.objs) - 1, since - 1, -1):
            ins = self.objs[i]
            if reg in ins.writes():
                ok = isinstance(ins, ir.Poly) and ins.mask is None and ins.degree() >= 1
                return i if ok else None
            if reg in ins.reads():
                return None
        return None

    def mask_poly(self, i: int, pt: str) -> str:
        """Give the poly ``objs[i]`` (:meth:`maskable_poly`) the mask ``pt``: its register then
        holds ``pt`` times the polynomial, at the same depth. Returns the register."""
        ins = self.objs[i]
        assert isinstance(ins, ir.Poly) and ins.mask is None
        self.set_instr(i, replace(ins, mask=pt))
        return ins.dst

    def input(self, tensor: str, table: str, gen: TableGen, l: int | None = None) -> str:  # noqa: E741
        self.table(table, gen)
        dst = self._reg(0)
        self._emit(ir.Input(dst, tensor, table, l))
        return dst

    def to_cins(self, re: str, im: str | None, l: int, levels: int) -> str:  # noqa: E741
        ins = ir.ToCins("", re, im, l, levels)
        dst = self._reg(ins.depth(self.depth))
        self._emit(ir.ToCins(dst, re, im, l, levels, to_cins_keys(l, levels, self.slots)))
        return dst

    def bootstrap_cins(self, src: str, l: int, fused: bool | None = None,  # noqa: E741
                       stoc_levels: int = 0) -> tuple[str, str]:
        """``stoc_levels``: the SlotsToCoeffs levels the bootstrap gives back (the outputs'
        depth is minus that, docs/cins.md)."""
        re, im = self._reg(-stoc_levels), self._reg(-stoc_levels)
        self._emit(ir.BootstrapCins((re, im), src, l, fused, stoc_keys(l, self.slots), stoc_levels or None))
        return re, im

    def output(self, src: str, tensor: str, table: str, gen: TableGen) -> None:
        self.table(table, gen)
        self._emit(ir.Output(src, tensor, table))

    def rot(self, src: str, k: int) -> str:
        k = self.norm(k)
        if k == 0:
            return src
        dst = self._reg(self.depth[src])
        self._emit(ir.Rot(dst, src, k))
        return dst

    def rot_many(self, src: str, ks: Iterable[int]) -> dict[int, str]:
        """Rotations of one ciphertext by several offsets: one hoisted instruction.

        Returns a map from each requested offset (as given) to its register; offset 0
        (mod slots) maps to ``src`` itself.
        """
        ks = list(ks)
        norm = sorted({self.norm(k) for k in ks} - {0})
        out: dict[int, str] = {}
        if len(norm) == 1:
            out[norm[0]] = self.rot(src, norm[0])
        elif norm:
            dsts = [self._reg(self.depth[src]) for _ in norm]
            self._emit(ir.RotHoisted(tuple(dsts), src, tuple(norm)))
            out.update(zip(norm, dsts, strict=True))
        return {k: (src if self.norm(k) == 0 else out[self.norm(k)]) for k in ks}

    def _bin(self, kind: type[ir.Add | ir.Sub], a: str, b: str) -> str:
        dst = self._reg(max(self.depth[a], self.depth[b]))
        self._emit(kind(dst, a, b))
        return dst

    def add(self, a: str, b: str) -> str:
        return self._bin(ir.Add, a, b)

    def sub(self, a: str, b: str) -> str:
        return self._bin(ir.Sub, a, b)

    def cmul(self, a: str, b: str) -> str:
        dst = self._reg(max(self.depth[a], self.depth[b]) + 1)
        self._emit(ir.CMul(dst, a, b))
        return dst

    def pmul(self, src: str, pt: str) -> str:
        dst = self._reg(self.depth[src] + 1)
        self._emit(ir.PMul(dst, src, pt))
        return dst

    def padd(self, src: str, pt: str) -> str:
        dst = self._reg(self.depth[src])
        self._emit(ir.PAdd(dst, src, pt))
        return dst

    def psub(self, src: str, pt: str) -> str:
        dst = self._reg(self.depth[src])
        self._emit(ir.PSub(dst, src, pt))
        return dst

    def poly(
        self, src: str, coeffs: Iterable[float], depth_cost: int, basis: str | None = None,
        domain: tuple[float, float] | None = None,
    ) -> str:
        dst = self._reg(self.depth[src] + depth_cost)
        self._emit(ir.Poly(dst, src, tuple(float(c) for c in coeffs), basis, domain))
        return dst

    def mul_i(self, src: str) -> str:
        """i * src (complex packing; exact, no level)."""
        dst = self._reg(self.depth[src])
        self._emit(ir.MulI(dst, src))
        return dst

    def conj(self, src: str) -> str:
        """The slot-wise complex conjugate of src (complex packing; the conjugation key)."""
        dst = self._reg(self.depth[src])
        self._emit(ir.Conj(dst, src))
        return dst

    def rescale(self, src: str) -> str:
        dst = self._reg(self.depth[src])
        self._emit(ir.Rescale(dst, src))
        return dst

    def bootstrap(self, src: str, log_slots: int | None = None, halves: bool | None = None,
                  scale: float | None = None, in_scale: float | None = None, replicas: bool | None = None,
                  premasked: bool = False) -> str:
        """``scale`` times the value over ``in_scale`` (default 1 each), depth reset to 0
        (bootstrapping presets); with ``log_slots`` a sparse variant (issue 36) at depth 1,
        or at depth 0 with ``replicas`` (the first 2^log_slots slots copied over the others).
        ``premasked`` (halves): ``src`` carries the halves packing already (a poly's complex
        mask, :meth:`mask_poly`)."""
        dst = self._reg(0 if log_slots is None or replicas else 1)
        self._emit(ir.Bootstrap(dst, src, log_slots, halves, scale, in_scale, replicas or None, premasked or None))
        return dst

    def bootstrap2(self, srcs: tuple[str, str], log_slots: int, scale: float | None = None) -> tuple[str, str]:
        """Two registers in one sparse bootstrap at 2^log_slots slots (issue 36): ``scale``
        times each value at depth 1."""
        a, b = self._reg(1), self._reg(1)
        self._emit(ir.Bootstrap2((a, b), tuple(srcs), log_slots, scale))
        return a, b

    def accumulate(self, acc: str | None, term: str) -> str:
        """acc + term, or term when acc is None: summing as terms are produced keeps
        only one partial sum live (the peak-memory friendly order)."""
        return term if acc is None else self.add(acc, term)

    def zero_like(self, src: str) -> str:
        """A ciphertext of zeros (the output of a map whose weights are all zero), made by
        multiplying any ciphertext by a zero plaintext."""
        slots = self.slots
        pt = self.const_plaintext(("zero", slots), "pt/const/zero", lambda: np.zeros(slots))
        return self.rescale(self.pmul(src, pt))

    def add_many(self, regs: list[str]) -> str:
        """Balanced-tree sum (depth-neutral; the shape keeps noise growth even)."""
        if not regs:
            raise ValueError("add_many of nothing")
        level = list(regs)
        while len(level) > 1:
            nxt = [self.add(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
        return level[0]


def _offset_table(gen: TableGen, offset: int) -> TableGen:
    def shifted() -> tuple[np.ndarray, np.ndarray | None]:
        idx, coef = gen()
        return np.where(idx >= 0, idx + offset, -1).astype(np.int64), coef

    return shifted


def poly_depth(coeffs: Iterable[float]) -> int:
    """Multiplicative depth of evaluating a polynomial of this degree (ceil(log2(deg + 1)))."""
    deg = max((i for i, c in enumerate(coeffs) if c != 0.0), default=0)
    return int(np.ceil(np.log2(deg + 1))) if deg > 0 else 0
