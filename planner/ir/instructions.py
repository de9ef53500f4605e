"""The plan's instructions (shared/SPEC.md section 4) as typed values.

Every instruction is a frozen dataclass whose fields, in declaration order, are the JSON
fields after ``"op"`` (so :meth:`Instr.to_json` reproduces a plan's instruction dicts key
for key).  Each class states what the rest of slotplan asks of an instruction:

* ``reads()`` / ``writes()``: the registers it reads and writes (SSA);
* ``depth(d)``: the multiplicative depth of what it writes, given its operands' depths;
* ``rot_keys()``: the rotation offsets it needs a key for;
* ``counter`` / ``count()``: the summary counter it adds to (``rotations``, ``pmul``,
  ``cmul``, ``add``, ``rescale``, ``poly``, ``key_loads``, ``bootstraps``) and by how much.

:func:`decode` turns a trusted instruction dict (one the planner built) into its object
without checks; :meth:`Instr.from_json` checks a dict from outside and names the field at
fault.  Adding an instruction is one class here (registered in :data:`OPS`) plus its
executors (``backends/sim.py``, the Lattigo runner).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, ClassVar, TypeVar

import numpy as np

from common.errors import PlanFileError

# Largest |coefficient| of a poly instruction (as planner.frontend.graph.MAX_POLY_COEFF_ABS).
MAX_POLY_COEFF_ABS = 2.0**20

Bad = Callable[[str, str], PlanFileError]  # (field, rule) -> error naming the field


# as planner.frontend.graph.MAX_POLY_COEFFS: a plan's poly is bounded like the graph's poly node
MAX_PLAN_POLY_COEFFS = 4096


class UnknownOpError(ValueError):
    """An instruction whose ``op`` no class of :data:`OPS` implements."""

    def __init__(self, op: object) -> None:
        self.op = op
        super().__init__(f"unknown op {op!r}")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_offset(bad: Bad, field: str, k: object, slots: int | None) -> None:
    if not _is_int(k):
        raise bad(field, f"rotation offsets are integers, got {json.dumps(k)}")
    assert isinstance(k, int)
    if slots is not None and not 1 <= k < slots:
        raise bad(field, f"rotation offset {k} outside 1..{slots - 1}")


def _check_slice(bad: Bad, field: str, l: object, slots: int | None) -> None:  # noqa: E741
    """A CinS slice half-length: a power of two dividing ``slots`` (docs/cins.md)."""
    if not _is_int(l) or l < 1 or l & (l - 1):  # type: ignore[operator]
        raise bad(field, f"l must be a positive power of two, got {json.dumps(l)}")
    if slots is not None and (slots % l or l > slots):  # type: ignore[operator]
        raise bad(field, f"l={l} must divide the {slots} slots")


def lattigo_bsgs_steps(offsets: set[int], slots: int, log_ratio: int = 1) -> tuple[set[int], set[int]]:
    """(giant, baby) steps, nonzero, that Lattigo's lintrans makes for a matrix with these
    diagonal offsets (mod ``slots``): ``BSGSIndex`` at the split ``FindBestBSGSRatio``
    picks (circuits/common/lintrans, Lattigo v6.1.1), what the Lattigo executor runs for
    ``to_cins`` and the CinS matrices (backends/lattigo/cins_exec.go)."""
    diags = sorted({d % slots for d in offsets})
    if not diags:
        return set(), set()

    def index(n1: int) -> tuple[set[int], set[int]]:
        return {(d // n1) * n1 % slots for d in diags}, {d & (n1 - 1) for d in diags}

    max_ratio = float(1 << log_ratio)
    best = 1
    n1 = 1
    while n1 < slots:
        r1, r2 = index(n1)
        a, b = len(r1) - 1, len(r2) - 1
        ratio = b / a if a else (math.inf if b else math.nan)
        if ratio == max_ratio:
            best = n1
            break
        if ratio > max_ratio:
            best = n1 // 2
            break
        n1 <<= 1
    r1, r2 = index(max(best, 1))
    return r1 - {0}, r2 - {0}


def lattigo_bsgs_rotations(offsets: set[int], slots: int, log_ratio: int = 1) -> int:
    """Rotations of :func:`lattigo_bsgs_steps` (giant and baby steps)."""
    giants, babies = lattigo_bsgs_steps(offsets, slots, log_ratio)
    return len(giants) + len(babies)


def _to_cins_factor_offsets(l: int, levels: int) -> list[set[int]]:  # noqa: E741
    out = []
    for group in to_cins_stages(l, levels):
        offs = {0}
        for h in group:
            offs = {d + s * h for d in offs for s in (-1, 0, 1)}
        out.append(offs)
    return out


def to_cins_keys(l: int, levels: int, slots: int) -> tuple[int, ...]:  # noqa: E741
    """The rotation keys ``to_cins``'s S_(l<-1) factors use on Lattigo (sorted)."""
    keys: set[int] = set()
    for offs in _to_cins_factor_offsets(l, levels):
        giants, babies = lattigo_bsgs_steps(offs, slots)
        keys |= giants | babies
    return tuple(sorted(keys))


def stoc_keys(l: int, slots: int) -> tuple[int, ...]:  # noqa: E741
    """The rotation keys of ``bootstrap_cins``'s S_(N/2<-l) on Lattigo (fused with the
    convolution or not, the matrix has every slice diagonal ``k l``; sorted)."""
    giants, babies = lattigo_bsgs_steps({k * l for k in range(slots // l)}, slots)
    return tuple(sorted(giants | babies))


def _check_keys(bad: Bad, d: Mapping[str, Any], slots: int | None) -> None:
    if "keys" not in d:
        return
    ks = d["keys"]
    if not isinstance(ks, list):
        raise bad("keys", "keys is a list of rotation offsets")
    for k in ks:
        _check_offset(bad, "keys", k, slots)


def to_cins_stages(l: int, levels: int) -> list[list[int]]:  # noqa: E741
    """Butterfly distances of S_(l<-1) (log2 l stages) merged into ``levels`` factors
    (Lattigo's ceil rule: factor i takes ceil(remaining / (levels - i)) stages)."""
    dists = [1 << j for j in range(l.bit_length() - 1)]
    levels = min(levels, len(dists))
    out: list[list[int]] = []
    for i in range(levels):
        take = -(-len(dists) // (levels - i))
        out.append(dists[:take])
        dists = dists[take:]
    return out


def to_cins_rotations(l: int, levels: int) -> int:  # noqa: E741
    """Rotations of ``to_cins``'s lowering: per merged factor, Lattigo's BSGS rotations of
    its diagonals ``{sum s_i h_i : s_i in {-1, 0, 1}}`` (block-diagonal, so no wrap; the
    count does not depend on the slot count once it exceeds twice the span, 4l here)."""
    return sum(lattigo_bsgs_rotations(offs, 1 << 40) for offs in _to_cins_factor_offsets(l, levels))


@dataclass(frozen=True, slots=True)
class Instr:
    """Base of all instructions; subclasses set ``op`` and their fields."""

    op: ClassVar[str] = ""
    counter: ClassVar[str | None] = None
    # fields holding register names that must be strings (checked in this order)
    string_fields: ClassVar[tuple[str, ...]] = ()
    # fields naming the registers read, in order (a field may hold a single register)
    read_fields: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------------ registers
    def reads(self) -> tuple[str, ...]:
        return _READERS[type(self)](self)

    def write_fields(self) -> Iterator[tuple[str, str]]:
        """(field path, register) of every register written."""
        dst = getattr(self, "dst", None)
        if dst is not None:
            yield "dst", dst

    def writes(self) -> tuple[str, ...]:
        return _WRITERS[type(self)](self)

    def plaintexts(self) -> tuple[str, ...]:
        """Plaintexts the instruction reads."""
        return ()

    def depth(self, d: Mapping[str, int]) -> int:
        """Depth of the registers written (default: the deepest operand)."""
        return max((d[r] for r in self.reads()), default=0)

    def rot_keys(self) -> tuple[int, ...]:
        return ()

    def count(self) -> int:
        """How much the instruction adds to its ``counter``."""
        return 1

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op}
        for name in _FIELD_NAMES[type(self)]:  # (filled by ``instruction``)
            v = getattr(self, name)
            if v is not None:
                out[name] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def _check(cls, d: Mapping[str, Any], bad: Bad, slots: int | None) -> None:
        """Rules beyond ``string_fields`` (subclasses)."""

    @classmethod
    def from_json(
        cls, d: object, *, where: str = "instruction", path: str = "", slots: int | None = None
    ) -> Instr:
        """Check an instruction dict from outside and build its object.  Raises
        :class:`PlanFileError` ``"<where>: field '<path>.<field>': <rule>"``; ``slots``
        (when given) bounds rotation offsets."""
        prefix = f"{path}." if path else ""

        def bad(field: str, rule: str) -> PlanFileError:
            return PlanFileError(f"{where}: field {prefix + field!r}: {rule}")

        if not isinstance(d, dict):
            raise PlanFileError(f"{where}: field {path or 'instruction'!r}: an instruction must be a JSON object")
        op = d.get("op")
        klass = OPS.get(op) if isinstance(op, str) else None
        if klass is None:
            raise bad("op", f"unknown op {json.dumps(op)[:40]}")
        if cls is not Instr and klass is not cls:
            raise bad("op", f"expected {cls.op!r}, got {json.dumps(op)[:40]}")
        for key in klass.string_fields:
            if not isinstance(d.get(key), str):
                raise bad(key, f"{op} needs a string {key!r}")
        klass._check(d, bad, slots)
        return klass._decode(d)

    @classmethod
    def _decode(cls, d: Mapping[str, Any]) -> Instr:
        names = _FIELD_NAMES.get(cls) or cls._names()
        return cls(*[tuple(v) if isinstance(v, list) else v for v in map(d.get, names)])

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        names = _FIELD_NAMES.get(cls)
        if names is None:
            names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
        return names


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
OPS: dict[str, type[Instr]] = {}
_I = TypeVar("_I", bound=type[Instr])


def instruction(cls: _I) -> _I:
    """Register an instruction class under its ``op``."""
    if not cls.op or cls.op in OPS:
        raise ValueError(f"instruction class {cls.__name__}: op {cls.op!r} missing or taken")
    OPS[cls.op] = cls
    _READERS[cls] = _getter(cls.read_fields)
    names = cls._names()
    _WRITERS[cls] = (_writes_fields if cls.write_fields is not Instr.write_fields
                     else _writes_dst if "dst" in names else lambda _o: ())
    return cls


def _writes_dst(o: Any) -> tuple[str, ...]:
    return () if o.dst is None else (o.dst,)


def _writes_fields(o: Any) -> tuple[str, ...]:
    return tuple(r for _, r in o.write_fields())


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A function giving the tuple of an object's fields ``names`` (attrgetter: ``reads``
    is a hot path, the cost model analyses ~10^6 instructions per plan)."""
    if not names:
        return lambda _o: ()
    get = attrgetter(*names)
    if len(names) == 1:
        return lambda o: (get(o),)
    return get  # type: ignore[return-value]


# per instruction class (filled by ``instruction``): the registers it reads, and those it
# writes (``dst`` unless the class names its own ``write_fields``; the same hot path)
_READERS: dict[type, Callable[[Any], tuple[Any, ...]]] = {}
_WRITERS: dict[type, Callable[[Any], tuple[str, ...]]] = {}


# ---------------------------------------------------------------------- ciphertext I/O


@instruction
@dataclass(frozen=True, slots=True)
class Input(Instr):
    op: ClassVar[str] = "input"
    string_fields: ClassVar[tuple[str, ...]] = ("dst", "tensor", "table")
    dst: str
    tensor: str
    table: str
    l: int | None = None  # noqa: E741  (a cins(l) register: table of length 2 * slots, docs/cins.md)

    @classmethod
    def _check(cls, d: Mapping[str, Any], bad: Bad, slots: int | None) -> None:
        if "l" in d:
            _check_slice(bad, "l", d["l"], slots)

    def depth(self, d: Mapping[str, int]) -> int:
        return 0


@instruction
@dataclass(frozen=True, slots=True)
class Output(Instr):
    op: ClassVar[str] = "output"
    string_fields: ClassVar[tuple[str, ...]] = ("src", "tensor", "table")
    read_fields: ClassVar[tuple[str, ...]] = ("src",)
    src: str
    tensor: str
    table: str


# ---------------------------------------------------------------------- rotations


@instruction
@dataclass(frozen=True, slots=True)
class Rot(Instr):
    op: ClassVar[str] = "rot"
    counter: ClassVar[str | None] = "rotations"
    string_fields: ClassVar[tuple[str, ...]] = ("dst", "src")
    read_fields: ClassVar[tuple[str, ...]] = ("src",)
    dst: str
    src: str
    k: int

    @classmethod
    def _check(cls, d: Mapping[str, Any], bad: Bad, slots: int | None) -> None:
        _check_offset(bad, "k", d.get("k"), slots)

    def rot_keys(self) -> tuple[int, ...]:
        return (int(self.k),)


@instruction
@dataclass(frozen=True, slots=True)
class RotHoisted(Instr):
    """One key-switch decomposition of ``src``, ``len(ks)`` rotations."""

    op: ClassVar[str] = "rot_hoisted"
    counter: ClassVar[str | None] = "rotations"
    string_fields: ClassVar[tuple[str, ...]] = ("src",)
    read_fields: ClassVar[tuple[str, ...]] = ("src",)
    dsts: tuple[str, ...]
    src: str
    ks: tuple[int, ...]

    @classmethod
    def _check(cls, d: Mapping[str, Any], bad: Bad, slots: int | None) -> None:
        ks, dsts = d.get("ks"), d.get("dsts")
        if not isinstance(ks, list) or not isinstance(dsts, list) or len(ks) != len(dsts) or not ks:
            raise bad("ks", "rot_hoisted needs non-empty lists ks and dsts of equal length")
        for j, k in enumerate(ks):
            _check_offset(bad, f"ks[{j}]", k, slots)
        if not all(isinstance(r, str) for r in dsts):
            raise bad("dsts", "must be a list of register names")

    def write_fields(self) -> Iterator[tuple[str, str]]:
        for j, r in enumerate(self.dsts):
            yield f"dsts[{j}]", r

    def rot_keys(self) -> tuple[int, ...]:
        return tuple(int(k) for k in self.ks)

    def count(self) -> int:
        return len(self.ks)


# ---------------------------------------------------------------------- arithmetic


@dataclass(frozen=True, slots=True)
class _CtCt(Instr):
    string_fields: ClassVar[tuple[str, ...]] = ("dst", "a", "b")
    read_fields: ClassVar[tuple[str, ...]] = ("a", "b")
    dst: str
    a: str
    b: str


@instruction
@dataclass(frozen=True, slots=True)
class Add(_CtCt):
    op: ClassVar[str] = "add"
    counter: ClassVar[str | None] = "add"


@instruction
@dataclass(frozen=True, slots=True)
class Sub(_CtCt):
    op: ClassVar[str] = "sub"
    counter: ClassVar[str | None] = "add"


@instruction
@dataclass(frozen=True, slots=True)
class CMul(_CtCt):
    """Ciphertext x ciphertext (relinearised): one level."""

    op: ClassVar[str] = "cmul"
    counter: ClassVar[str | None] = "cmul"

    def depth(self, d: Mapping[str, int]) -> int:
        return max(d[self.a], d[self.b]) + 1


@dataclass(frozen=True, slots=True)
class _CtPt(Instr):
    string_fields: ClassVar[tuple[str, ...]] = ("dst", "src", "pt")
    read_fields: ClassVar[tuple[str, ...]] = ("src",)
    dst: str
    src: str
    pt: str

    def plaintexts(self) -> tuple[str, ...]:
        return (self.pt,)


@instruction
@dataclass(frozen=True, slots=True)
class PMul(_CtPt):
    op: ClassVar[str] = "pmul"
    counter: ClassVar[str | None] = "pmul"

    def depth(self, d: Mapping[str, int]) -> int:
        return d[self.src] + 1


@instruction
@dataclass(frozen=True, slots=True)
class PAdd(_CtPt):
    op: ClassVar[str] = "padd"
    counter: ClassVar[str | None] = "add"


@instruction
@dataclass(frozen=True, slots=True)
class PSub(_CtPt):
    op: ClassVar[str] = "psub"
    counter: ClassVar[str | None] = "add"


# The most distinct nonzero values a poly's mask may hold: the executor evaluates one
# polynomial per value (Lattigo's PolynomialVector, a plaintext per coefficient of each); the
# planner's masks hold one (a layout's used slots, times a bootstrap's 1/s)
MAX_POLY_MASK_VALUES = 16


@instruction
@dataclass(frozen=True, slots=True)
class Poly(Instr):
    """Element-wise polynomial (power basis, or Chebyshev over ``domain``); with ``mask`` (a
    plaintext), ``dst[s] = mask[s] * p(src[s])`` at the same depth: the products by the
    coefficients become products by ``mask`` times them (Lattigo's ``PolynomialVector``: a
    polynomial per distinct nonzero value of the mask, 0 on its zero slots), so the product
    by a mask after the polynomial costs no level of its own.  A complex mask (at most
    ``MAX_POLY_MASK_VALUES`` distinct nonzero values as the real one) is the halves packing
    of a ``premasked`` bootstrap that reads the result (:class:`Bootstrap`)."""

    op: ClassVar[str] = "poly"
    counter: ClassVar[str | None] = "poly"
    string_fields: ClassVar[tuple[str, ...]] = ("dst", "src")
    read_fields: ClassVar[tuple[str, ...]] = ("src",)
    dst: str
    src: str
    coeffs: tuple[float, ...]
    basis: str | None = None
    domain: tuple[float, ...] | None = None
    mask: str | None = None

    def plaintexts(self) -> tuple[str, ...]:
        return () if self.mask is None else (self.mask,)

    @classmethod
    def _check(cls, d: Mapping[str, Any], bad: Bad, slots: int | None) -> None:
        cs = d.get("coeffs")
        if not isinstance(cs, list) or not cs:
            raise bad("coeffs", "must be a non-empty list of numbers")
        if len(cs) > MAX_PLAN_POLY_COEFFS:
            raise bad("coeffs", f"at most {MAX_PLAN_POLY_COEFFS} coefficients (as a graph's poly node), "
                                f"got {len(cs)}")
        for j, c in enumerate(cs):
            if not isinstance(c, int | float) or isinstance(c, bool) or not math.isfinite(c) \
                    or abs(c) > MAX_POLY_COEFF_ABS:
                raise bad(f"coeffs[{j}]", f"coefficients are finite numbers with |c| <= 2**20, got {json.dumps(c)}")
        basis = d.get("basis")
        if basis not in (None, "monomial", "chebyshev"):
            raise bad("basis", f"must be 'monomial' or 'chebyshev', got {json.dumps(basis)[:40]}")
        dom = d.get("domain")
        if basis == "chebyshev":
            ok = isinstance(dom, list) and len(dom) == 2 and all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in dom)
            if not ok or not isinstance(dom, list) or not dom[0] < dom[1]:
                raise bad("domain", f"a Chebyshev poly needs domain [a, b] with finite a < b, got {json.dumps(dom)}")
        elif dom is not None:
            raise bad("domain", "only a Chebyshev poly (basis 'chebyshev') has a domain")
        mask = d.get("mask")
        if mask is not None:
            if not isinstance(mask, str):
                raise bad("mask", f"mask names a plaintext, got {json.dumps(mask)[:40]}")
            deg = max((j for j, c in enumerate(cs) if c != 0), default=0)
            if deg == 0:
                raise bad("mask", "a masked poly has degree >= 1 (a constant's mask is a plaintext product)")

    def degree(self) -> int:
        return max((i for i, c in enumerate(self.coeffs) if c != 0.0), default=0)

    @property
    def chebyshev(self) -> bool:
        return self.basis == "chebyshev"

    def unit_domain(self) -> bool:
        """A Chebyshev poly over [-1, 1] (no change of variable)."""
        return self.domain is None or tuple(self.domain) == (-1.0, 1.0)

    def depth(self, d: Mapping[str, int]) -> int:
        # degree d costs ceil(log2(d + 1)) levels (power basis / Paterson-Stockmeyer; the
        # leading coefficient's multiplication included), as Lattigo's evaluator uses; a
        # Chebyshev poly over a domain other than [-1, 1] first maps x to (2x - a - b)/(b - a),
        # a multiplication by a constant: one level more (slotplan's own plans emit that map
        # as pmul/padd and a poly over [-1, 1])
        extra = 1 if self.chebyshev and not self.unit_domain() and self.degree() > 0 else 0
        return d[self.src] + self.degree().bit_length() + extra

    def evaluate(self, x: Any) -> Any:
        """The polynomial on a float64 array (the simulator's and the cost models' meaning)."""
        if not self.chebyshev:
            acc = np.zeros(np.shape(x))
            for c in reversed(self.coeffs):
                acc = acc * x + float(c)
            return acc
        t = np.asarray(x, dtype=np.complex128 if np.iscomplexobj(x) else np.float64)
        if not self.unit_domain():
            assert self.domain is not None
            a, b = float(self.domain[0]), float(self.domain[1])
            t = (2.0 * t - a - b) / (b - a)
        return np.polynomial.chebyshev.chebval(t, np.asarray(self.coeffs, dtype=np.float64))


@instruction
@dataclass(frozen=True, slots=True)
class Rescale(Instr):
    """Value unchanged (level bookkeeping)."""

    op: ClassVar[str] = "rescale"
    counter: ClassVar[str | None] = "rescale"
    string_fields: ClassVar[tuple[str, ...]] = ("dst", "src")
    read_fields: ClassVar[tuple[str, ...]] = ("src",)
    dst: str
    src: str


def _check_boot_variant(d: Mapping[str, Any], bad: Bad, slots: int | None, *, span: int,
                        check_scale: bool = True) -> None:
    """``log_slots`` (the period 2^log_slots of a sparse bootstrap; ``span`` times it must
    fit the slots) and ``scale`` of a bootstrap variant (docs/formats.md)."""
    ls = d.get("log_slots")
    top = (slots.bit_length() - 1) if slots else MAX_BOOT_LOG_SLOTS
    total = slots or 1 << MAX_BOOT_LOG_SLOTS
    if not _is_int(ls) or ls < 1 or (1 << ls) >= total or (1 << ls) * span > total:  # type: ignore[operator]
        raise bad("log_slots", f"log_slots is an integer k >= 1 with 2^k < the slots (2^{top})"
                  f"{' and 2^(k+1) <= the slots' if span > 1 else ''}, got {json.dumps(ls)[:40]}")
    if "scale" in d and check_scale:
        sc = d["scale"]
        if isinstance(sc, bool) or not isinstance(sc, (int, float)) or not math.isfinite(sc) or sc == 0 \
                or abs(sc) > MAX_BOOT_SCALE or abs(sc) < 1 / MAX_BOOT_SCALE:
            raise bad("scale", f"scale is a finite nonzero number with 1/{MAX_BOOT_SCALE:g} <= |scale| <= {MAX_BOOT_SCALE:g}, got {json.dumps(sc)}")


# the largest log2 slot count a plan's bootstrap variant may name (n17) and the largest
# |scale| folded into a variant's unpacking plaintext
MAX_BOOT_LOG_SLOTS = 16
MAX_BOOT_SCALE = 2.0**20
# the largest in_scale (the source's scale relabelled, backends/lattigo/bootvariant.go): the
# default scale times it stays within what Lattigo's ScaleDown brings an input to,
# q0 / 2^LogMessageRatio (2^52 for N16QP1546H192H32, 2^12 times its scale 2^40)
MAX_BOOT_IN_SCALE = 2.0**12


def _check_in_scale(d: Mapping[str, Any], bad: Bad) -> None:
    """``in_scale`` of a bootstrap: 1 <= in_scale <= MAX_BOOT_IN_SCALE."""
    if "in_scale" in d:
        v = d["in_scale"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 1 <= v <= MAX_BOOT_IN_SCALE:
            raise bad("in_scale", f"in_scale is a number with 1 <= in_scale <= 2^12, got {json.dumps(v)[:40]}")


@instruction
@dataclass(frozen=True, slots=True)
class Bootstrap(Instr):
    """Value unchanged, depth reset (bootstrapping presets).

    Variants (issue 36, docs/formats.md): with ``log_slots = k`` the bootstrap runs Lattigo's
    sparse bootstrapping at 2^k slots. ``src`` must be zero outside slots ``[0, 2^k)``
    (``halves``: outside ``[0, 2^(k+1))``, whose two halves travel as the real and imaginary
    part of one complex slot vector). The executor unpacks (masks) the result with one
    plaintext product, so ``dst = scale * src`` (``scale`` default 1) at depth 1.  With
    ``halves`` every |value| must be within boot.max_abs / 2.  With ``replicas`` (not with
    ``halves``) the result is not unpacked: every slot ``j`` holds ``scale * src[j mod
    2^k]`` (the sparse bootstrap's copies of the first 2^k slots fill the others) at depth 0,
    ``scale`` an integer multiplied exactly as the full bootstrap's.  Without ``log_slots``:
    the full-slot bootstrap, ``dst = scale * src`` at depth 0 (``scale`` an integer,
    multiplied exactly: no level; ``halves``, ``replicas`` not allowed).

    ``in_scale`` (either kind): the source's scale is relabelled (no product, no level), so
    the bootstrap refreshes ``src / in_scale``: ``dst = scale * src / in_scale``, and the
    range rules above apply to ``src / in_scale``.

    ``premasked`` (with ``halves`` only): the source already carries the halves packing, so
    the executor multiplies it by no mask (no level before the bootstrap): slots
    ``[0, 2^k)`` hold the low half's values, slots ``[2^k, 2^(k+1))`` ``i`` times the high
    half's (a poly's complex ``mask``, planner.lower.lowering), and every other slot 0.
    ``dst`` is the unpacked real value as without it: ``dst[s] = scale * src[s]`` for
    ``s < 2^k``, ``scale * src[s] / i`` for ``2^k <= s < 2^(k+1)``."""

    op: ClassVar[str] = "bootstrap"
    counter: ClassVar[str | None] = "bootstraps"
    string_fields: ClassVar[tuple[str, ...]] = ("dst", "src")
    read_fields: ClassVar[tuple[str, ...]] = ("src",)
    dst: str
    src: str
    log_slots: int | None = None
    halves: bool | None = None
    scale: float | None = None
    in_scale: float | None = None
    replicas: bool | None = None
    premasked: bool | None = None

    @classmethod
    def _check(cls, d: Mapping[str, Any], bad: Bad, slots: int | None) -> None:
        _check_in_scale(d, bad)
        if "premasked" in d:
            if not isinstance(d["premasked"], bool):
                raise bad("premasked", "premasked is true or false")
            if d["premasked"] and not d.get("halves"):
                raise bad("premasked", "premasked belongs to a halves bootstrap (its source carries the halves packing)")
        for f in ("halves", "replicas"):
            if f in d and "log_slots" not in d:
                raise bad(f, f"{f} belongs to a sparse bootstrap (give log_slots)")
            if f in d and not isinstance(d[f], bool):
                raise bad(f, f"{f} is true or false")
        if d.get("halves") and d.get("replicas"):
            raise bad("replicas", "a halves bootstrap is always unpacked (replicas and halves exclude each other)")
        if "log_slots" not in d or d.get("replicas"):
            if "scale" in d:
                sc = d["scale"]
                if isinstance(sc, bool) or not isinstance(sc, (int, float)) or not math.isfinite(sc) \
                        or sc != int(sc) or not 1 <= sc <= MAX_BOOT_SCALE:
                    what = "a replicas bootstrap's" if d.get("replicas") else "a full-slot bootstrap's"
                    raise bad("scale", f"{what} scale is an integer with 1 <= scale <= 2^20, "
                                       f"got {json.dumps(sc)[:40]}")
            if "log_slots" not in d:
                return
        _check_boot_variant(d, bad, slots, span=2 if d.get("halves") else 1,
                            check_scale=not d.get("replicas"))

    def depth(self, d: Mapping[str, int]) -> int:
        return 0 if self.log_slots is None or self.replicas else 1

    @property
    def period(self) -> int | None:
        """2^log_slots, or None for the full-slot bootstrap."""
        return None if self.log_slots is None else 1 << int(self.log_slots)


@instruction
@dataclass(frozen=True, slots=True)
class Bootstrap2(Instr):
    """Two slot registers bootstrapped together (issue 36, docs/formats.md): both must be
    zero outside slots ``[0, 2^log_slots)``; they travel as the real and imaginary part of
    one complex slot vector through one sparse bootstrap at 2^log_slots slots and are
    unpacked with plaintext products: ``dsts[j] = scale * srcs[j]`` at depth 1.  Every
    |value| must be within boot.max_abs / 2."""

    op: ClassVar[str] = "bootstrap2"
    counter: ClassVar[str | None] = "bootstraps"
    dsts: tuple[str, ...]
    srcs: tuple[str, ...]
    log_slots: int
    scale: float | None = None

    def reads(self) -> tuple[str, ...]:
        return tuple(self.srcs)

    def write_fields(self) -> Iterator[tuple[str, str]]:
        for j, r in enumerate(self.dsts):
            yield f"dsts[{j}]", r

    @classmethod
    def _check(cls, d: Mapping[str, Any], bad: Bad, slots: int | None) -> None:
        for f in ("dsts", "srcs"):
            v = d.get(f)
            if not isinstance(v, list) or len(v) != 2 or not all(isinstance(r, str) for r in v):
                raise bad(f, f"bootstrap2 {'writes' if f == 'dsts' else 'reads'} two registers")
        if d["srcs"][0] == d["srcs"][1]:
            raise bad("srcs", "bootstrap2 reads two different registers")
        _check_boot_variant(d, bad, slots, span=1)

    def depth(self, d: Mapping[str, int]) -> int:
        return 1

    @property
    def period(self) -> int:
        return 1 << int(self.log_slots)


@instruction
@dataclass(frozen=True, slots=True)
class ToCins(Instr):
    """Two slot registers (the Re/Im pair in CoeffsToSlots order) -> one cins(l) register
    (docs/cins.md): on Lattigo ``S_(l<-1) (re + i * im)``, a linear transform of
    ``levels`` merged butterfly factors; its rotations are counted here."""

    op: ClassVar[str] = "to_cins"
    counter: ClassVar[str | None] = "rotations"
    string_fields: ClassVar[tuple[str, ...]] = ("dst", "re")
    read_fields: ClassVar[tuple[str, ...]] = ("re", "im")
    dst: str
    re: str
    im: str | None  # None: the Im half is zero (no element of the layout lies there)
    l: int  # noqa: E741
    levels: int
    # the rotation keys its lowering uses on Lattigo (to_cins_keys; None in plans from
    # before issue 37): what the key schedule and the memory model count for it
    keys: tuple[int, ...] | None = None

    def reads(self) -> tuple[str, ...]:
        return (self.re,) if self.im is None else (self.re, self.im)

    def rot_keys(self) -> tuple[int, ...]:
        return tuple(self.keys or ())

    @classmethod
    def _check(cls, d: Mapping[str, Any], bad: Bad, slots: int | None) -> None:
        if d.get("im") is not None and not isinstance(d.get("im"), str):
            raise bad("im", "to_cins needs a string 'im' (or null when the Im half is zero)")
        _check_slice(bad, "l", d.get("l"), slots)
        lv = d.get("levels")
        if not _is_int(lv) or lv < 0:  # type: ignore[operator]
            raise bad("levels", f"levels is a non-negative integer, got {json.dumps(lv)}")
        _check_keys(bad, d, slots)

    def used_levels(self) -> int:
        return len(to_cins_stages(int(self.l), int(self.levels)))

    def depth(self, d: Mapping[str, int]) -> int:
        return max(d[r] for r in self.reads()) + self.used_levels()

    def count(self) -> int:
        return to_cins_rotations(int(self.l), int(self.levels))


@instruction
@dataclass(frozen=True, slots=True)
class BootstrapCins(Instr):
    """A cins(l) register's ring polynomial bootstrapped into two slot registers
    ``dsts = [re, im]`` in CoeffsToSlots order (docs/cins.md); depth reset.  ``fused``:
    the producer already applied SlotsToCoeffs' l-granular part S_(N/2<-l) (NeuJeans
    Sec. 4); otherwise the bootstrap applies it first."""

    op: ClassVar[str] = "bootstrap_cins"
    counter: ClassVar[str | None] = "bootstraps"
    string_fields: ClassVar[tuple[str, ...]] = ("src",)
    read_fields: ClassVar[tuple[str, ...]] = ("src",)
    dsts: tuple[str, ...]
    src: str
    l: int  # noqa: E741
    fused: bool | None = None
    # the rotation keys of its S_(N/2<-l) (fused: S_(N/2<-l) K) on Lattigo (stoc_keys; None
    # in plans from before issue 37)
    keys: tuple[int, ...] | None = None
    # the SlotsToCoeffs levels the bootstrap leaves free (NeuJeans' order skips the stock
    # SlotsToCoeffs at its end): the outputs have depth -stoc_levels, i.e. lie that many
    # levels above the residual top (Boot.stoc_levels; None or 0: at the top, as before)
    stoc_levels: int | None = None

    def rot_keys(self) -> tuple[int, ...]:
        return tuple(self.keys or ())

    @classmethod
    def _check(cls, d: Mapping[str, Any], bad: Bad, slots: int | None) -> None:
        dsts = d.get("dsts")
        if not isinstance(dsts, list) or len(dsts) != 2 or not all(isinstance(r, str) for r in dsts):
            raise bad("dsts", "bootstrap_cins writes two registers [re, im]")
        _check_slice(bad, "l", d.get("l"), slots)
        if "fused" in d and not isinstance(d["fused"], bool):
            raise bad("fused", "fused is true or false")
        _check_keys(bad, d, slots)
        if "stoc_levels" in d:
            sl = d["stoc_levels"]
            if not _is_int(sl) or not 0 <= sl <= MAX_STOC_LEVELS:  # type: ignore[operator]
                raise bad("stoc_levels", f"stoc_levels is an integer in [0, {MAX_STOC_LEVELS}], got {json.dumps(sl)}")

    def write_fields(self) -> Iterator[tuple[str, str]]:
        for j, r in enumerate(self.dsts):
            yield f"dsts[{j}]", r

    def depth(self, d: Mapping[str, int]) -> int:
        return -int(self.stoc_levels or 0)


# a bootstrap_cins gives back at most this many SlotsToCoeffs levels (the executors check
# the plan's parameters' own number, planner.frontend.params.Boot.stoc_levels)
MAX_STOC_LEVELS = 8


def _cins_registers(program: Sequence[Instr]) -> set[str]:
    """The registers of the cins domain (docs/cins.md: ``input`` with ``l`` and ``to_cins``
    write them; rot, add, sub, pmul, padd, psub, rescale keep their operand's domain)."""
    cins: set[str] = set()
    keep = (Rot, RotHoisted, Add, Sub, PMul, PAdd, PSub, Rescale)
    for ins in program:
        if isinstance(ins, ToCins) or (isinstance(ins, Input) and ins.l is not None) or (
                isinstance(ins, keep) and any(r in cins for r in ins.reads())):
            cins.update(ins.writes())
    return cins


@dataclass(frozen=True)
class FusedCins:
    """A fused ``bootstrap_cins`` (at program index ``at``) and the convolution it absorbs
    (the instructions ``instrs``, reading the registers ``bases``): what the Lattigo executor
    evaluates as one matrix S_(N/2<-l) K_b per base (backends/lattigo/cins_exec.go,
    analyseCins: back from ``src`` through rescale, add, sub, rot, rot_hoisted and cins
    pmuls)."""

    at: int
    l: int  # noqa: E741
    instrs: frozenset[int]
    bases: tuple[str, ...]

    def rotations(self, slots: int) -> int:
        """The rotations the executor makes for it: per base, Lattigo's BSGS over the
        diagonals of S_(N/2<-l) K_b, every slice diagonal ``k l`` (S_(N/2<-l) has them all
        and K_b's are multiples of ``l``; none when one slice fills the ciphertext)."""
        if self.l >= slots:
            return 0
        return len(self.bases) * lattigo_bsgs_rotations({k * self.l for k in range(slots // self.l)}, slots)


def fused_cins(program: Sequence[Instr]) -> list[FusedCins]:
    """The fused ``bootstrap_cins`` of a decoded program and their convolutions."""
    if not any(isinstance(ins, BootstrapCins) and ins.fused for ins in program):
        return []
    cins = _cins_registers(program)
    defs: dict[str, int] = {}
    for i, ins in enumerate(program):
        for r in ins.writes():
            defs[r] = i
    out = []
    for i, ins in enumerate(program):
        if not (isinstance(ins, BootstrapCins) and ins.fused):
            continue
        region: set[int] = set()
        bases: set[str] = set()
        stack = [ins.src]
        while stack:
            r = stack.pop()
            j = defs.get(r)
            p = program[j] if j is not None else None
            linear = isinstance(p, Rescale | Add | Sub | Rot | RotHoisted) or (
                isinstance(p, PMul) and p.src in cins)
            if p is None or not linear:
                bases.add(r)
                continue
            assert j is not None
            if j not in region:
                region.add(j)
                stack.extend(p.reads())
        out.append(FusedCins(i, int(ins.l), frozenset(region), tuple(sorted(bases))))
    return out


def executed_rotations(program: Sequence[Instr], slots: int) -> int:
    """``summary.rotations``: the rotations the Lattigo executor makes for the program.
    Each instruction counts its own (``rot``, ``rot_hoisted``, ``conj``, ``to_cins``'s
    factors), except that a fused ``bootstrap_cins`` replaces the rotations of the
    convolution it absorbs by those of its S_(N/2<-l) K matrices (:class:`FusedCins`)."""
    return sum(ins.count() for ins in program if ins.counter == "rotations") + fused_rotation_delta(program, slots)


def fused_rotation_delta(program: Sequence[Instr], slots: int) -> int:
    """What the executor's CinS matrices add to the instructions' own rotation count: a
    fused convolution's S_(N/2<-l) K matrices less the instructions it absorbs, and an
    unfused ``bootstrap_cins``'s S_(N/2<-l) (one lintrans)."""
    total = 0
    for ins in program:
        if isinstance(ins, BootstrapCins) and not ins.fused and ins.l < slots:
            total += lattigo_bsgs_rotations({k * ins.l for k in range(slots // ins.l)}, slots)
    for f in fused_cins(program):
        total += f.rotations(slots) - sum(program[j].count() for j in f.instrs if program[j].counter == "rotations")
    return total


# ---------------------------------------------------------------------- complex slots
# (the complex-packing extension, docs/formats.md: registers hold complex vectors only in
# plans that use these instructions or complex plaintexts)


@instruction
@dataclass(frozen=True, slots=True)
class MulI(Instr):
    """``dst = i * src`` slot-wise: exact on CKKS (multiplication by the monomial X^(N/2)),
    no level, no key; priced and counted like an add."""

    op: ClassVar[str] = "mul_i"
    counter: ClassVar[str | None] = "add"
    string_fields: ClassVar[tuple[str, ...]] = ("dst", "src")
    read_fields: ClassVar[tuple[str, ...]] = ("src",)
    dst: str
    src: str


@instruction
@dataclass(frozen=True, slots=True)
class Conj(Instr):
    """``dst = conj(src)`` slot-wise: one key switch with the conjugation key (a Galois key
    of a rotation key's size), counted as a rotation; the conjugation key is one more
    key of ``rotation_keys`` and resident for the whole program (:func:`uses_conjugation`)."""

    op: ClassVar[str] = "conj"
    counter: ClassVar[str | None] = "rotations"
    string_fields: ClassVar[tuple[str, ...]] = ("dst", "src")
    read_fields: ClassVar[tuple[str, ...]] = ("src",)
    dst: str
    src: str


# ---------------------------------------------------------------------- key residency


@dataclass(frozen=True, slots=True)
class KeyOp(Instr):
    """Rotation key ``k`` (or the key block ``block``) becomes resident / is dropped."""

    k: int | None = None
    block: str | None = None

    @classmethod
    def _check(cls, d: Mapping[str, Any], bad: Bad, slots: int | None) -> None:
        if "block" in d:
            if d["block"] != "boot":
                raise bad("block", "the only key block is 'boot'")
        else:
            _check_offset(bad, "k", d.get("k"), slots)


# A streamed block's read-ahead depth is at most this (the Go side's maxStreamDepth).
MAX_STREAM_DEPTH = 64


@instruction
@dataclass(frozen=True, slots=True)
class LoadKey(KeyOp):
    """``stream`` (block only): the block's Galois keys are streamed during each bootstrap,
    ``stream`` of them read ahead, instead of all resident (Params.boot_block_bytes)."""

    op: ClassVar[str] = "load_key"
    counter: ClassVar[str | None] = "key_loads"
    stream: int | None = None

    @classmethod
    def _check(cls, d: Mapping[str, Any], bad: Bad, slots: int | None) -> None:
        KeyOp._check(d, bad, slots)
        if "stream" in d:
            v = d["stream"]
            if "block" not in d:
                raise bad("stream", "only a load_key of the block 'boot' is streamed")
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_STREAM_DEPTH:
                raise bad("stream", f"must be a read-ahead depth, an integer in [0, {MAX_STREAM_DEPTH}]")


@instruction
@dataclass(frozen=True, slots=True)
class DropKey(KeyOp):
    op: ClassVar[str] = "drop_key"


# ---------------------------------------------------------------------- programs


def decode(d: Mapping[str, Any] | Instr) -> Instr:
    """The object of a trusted instruction dict (no checks; objects pass through).
    Raises :class:`UnknownOpError` for an op no class implements."""
    if isinstance(d, Instr):
        return d
    op = d.get("op")
    klass = OPS.get(op) if isinstance(op, str) else None
    if klass is None:
        raise UnknownOpError(op)
    return klass._decode(d)


def try_decode(d: Mapping[str, Any] | Instr) -> Instr | None:
    """:func:`decode`, or None for an unknown op (executors report it at its turn)."""
    try:
        return decode(d)
    except UnknownOpError:
        return None


def decode_program(program: Sequence[Mapping[str, Any] | Instr]) -> list[Instr]:
    return [decode(d) for d in program]


def to_json_program(program: Sequence[Instr]) -> list[dict[str, Any]]:
    return [ins.to_json() for ins in program]


def op_name(d: Mapping[str, Any] | Instr) -> str:
    """The op of an instruction (dict or object), for display."""
    return d.op if isinstance(d, Instr) else str(d.get("op"))


# Instructions that bootstrap (each needs the key block "boot" resident).
BOOTSTRAP_OPS: tuple[type[Instr], ...] = (Bootstrap, Bootstrap2, BootstrapCins)


def is_bootstrap(ins: Instr) -> bool:
    return isinstance(ins, BOOTSTRAP_OPS)


def has_key_schedule(program: Sequence[Instr]) -> bool:
    """True when the program loads or drops keys (a plan with a key schedule)."""
    return any(isinstance(ins, KeyOp) for ins in program)


def rot_keys_of(program: Sequence[Instr]) -> set[int]:
    """Every rotation offset the program needs a key for."""
    return {k for ins in program for k in ins.rot_keys()}


def uses_conjugation(program: Sequence[Instr]) -> bool:
    """True when the program conjugates (it needs the conjugation key besides its rotation
    keys; the key is resident throughout, also under a key schedule)."""
    return any(isinstance(ins, Conj) for ins in program)


def galois_key_count(program: Sequence[Instr]) -> int:
    """Keys the program needs: its rotation offsets, and the conjugation key if it
    conjugates (``summary.rotation_keys``)."""
    return len(rot_keys_of(program)) + (1 if uses_conjugation(program) else 0)
