"""Numpy slot simulator: executes every instruction of shared/SPEC.md section 4.

Registers are float64 vectors of ``slots`` values (complex128 in plans of the
complex-packing extension, docs/formats.md: ``mul_i``, ``conj`` and complex plaintexts;
an ``output`` of a register whose imaginary part is not zero is an error).  When the plan carries a key schedule
(any ``load_key``/``drop_key``), every rotation must find its key resident, and a key
recorded at a level below the ciphertext's is refused (Lattigo would silently compute a
wrong result).  Operations are counted; peak resident key bytes follow the plan's
memory model.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common.errors import SlotplanError
from planner import ir
from planner.frontend.params import STOC_LEVELS
from planner.ir.analysis import register_depths
from planner.layout import cins


class SimulationError(SlotplanError):
    pass


@dataclass
class SimResult:
    outputs: dict[str, np.ndarray]
    counts: dict[str, int]
    rotations: int
    key_loads: int
    peak_resident_keys: int
    seconds: float
    written: dict[str, np.ndarray] = field(default_factory=dict)
    # per output tensor: slots of its output ciphertexts that hold no element of it but are
    # not zero (what a client who decrypts sees beyond the answer; 0 for a clean plan)
    leaked_slots: dict[str, int] = field(default_factory=dict)
    # the registers asked for with ``keep`` (layout checks read intermediate values)
    registers: dict[str, np.ndarray] = field(default_factory=dict)
    # Chebyshev ``poly`` instructions whose argument left their domain (any slot): one
    # dict per instruction (backends.runner names the graph node); empty for a sound run
    domain_exits: list[dict[str, Any]] = field(default_factory=list)


def _table(tables: Mapping[str, np.ndarray], name: str, slots: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Table ``name`` of length ``slots`` (``2 * slots`` for a cins register or plaintext)."""
    try:
        idx = np.asarray(tables[f"{name}.idx"], dtype=np.int64)
    except KeyError as e:
        raise SimulationError(f"table {name!r} is missing from the tables file") from e
    if idx.shape != (slots,):
        raise SimulationError(f"table {name!r}: idx has shape {idx.shape}, expected ({slots},)")
    coef = None
    if f"{name}.coef" in tables:
        coef = np.asarray(tables[f"{name}.coef"], dtype=np.float64)
    return idx, coef


def gather(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    flat = values.ravel()
    out = np.zeros(idx.shape[0])
    m = idx >= 0
    if np.any(idx[m] >= flat.size):
        raise SimulationError(f"table index {int(idx[m].max())} out of range for a tensor of {flat.size} elements")
    out[m] = flat[idx[m]]
    return out


def plaintext_vector(
    pt: Mapping[str, Any], tables: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray], slots: int
) -> np.ndarray:
    n = 2 * slots if pt.get("l") else slots  # a cins(l) plaintext: local coefficients
    idx, coef = _table(tables, pt["table"], n)
    if pt["source"] == "const":
        v = np.ones(n)
    else:
        if pt["source"] not in values:
            raise SimulationError(f"plaintext source {pt['source']!r} has no value")
        v = gather(values[pt["source"]], idx)
    re = v * coef if coef is not None else v
    if pt.get("imag_table") is None:
        return re
    # a complex plaintext: value = coef * S[idx] + i * coef_im * S[idx_im]
    idx_i, coef_i = _table(tables, pt["imag_table"], n)
    vi = np.ones(n) if pt["source"] == "const" else gather(values[pt["source"]], idx_i)
    return re + 1j * (vi * coef_i if coef_i is not None else vi)


# Round-off allowed at a Chebyshev domain's ends, relative to its half-width.
DOMAIN_RTOL = 1e-9


def domain_exit(x: np.ndarray, domain: tuple[float, float]) -> dict[str, Any] | None:
    """How values ``x`` leave ``domain`` [a, b] (None when every one is inside, up to
    ``DOMAIN_RTOL`` of the half-width): the domain, the values' min/max, how many are out,
    the index of the first, and the largest distance beyond an end (absolute, and in
    half-widths: the Chebyshev argument ``t`` then has ``|t| = 1 + beyond_halfwidths``)."""
    a, b = domain
    half = 0.5 * (b - a)
    v = np.asarray(x, dtype=np.float64).ravel()
    if v.size == 0:
        return None
    tol = DOMAIN_RTOL * half
    out = ~((v >= a - tol) & (v <= b + tol))  # NaN is out
    count = int(np.count_nonzero(out))
    if not count:
        return None
    with np.errstate(invalid="ignore"):
        beyond = float(np.nanmax(np.maximum(a - v, v - b))) if np.any(~np.isnan(v)) else float("nan")
    if np.any(np.isnan(v)):
        beyond = float("inf")
    return {
        "domain": [float(a), float(b)], "min": float(np.nanmin(v)) if np.any(~np.isnan(v)) else float("nan"),
        "max": float(np.nanmax(v)) if np.any(~np.isnan(v)) else float("nan"), "count": count, "size": int(v.size),
        "first_index": int(np.argmax(out)), "beyond": beyond, "beyond_halfwidths": beyond / half,
    }


class _Machine:
    """State of one simulation; one ``exec_*`` method per instruction class (:data:`_EXEC`)."""

    def __init__(
        self,
        plan: Mapping[str, Any],
        tables: Mapping[str, np.ndarray],
        values: Mapping[str, np.ndarray],
        key_levels: Mapping[int, int] | None,
        program: list[ir.Instr | None],
    ) -> None:
        self.S = int(plan["params"]["slots"])
        self.shapes = {k: tuple(v) for k, v in plan.get("outputs", {}).items()}
        self.pts = plan["plaintexts"]
        self.tables = tables
        self.values = values
        self.key_levels = key_levels
        self.regs: dict[str, np.ndarray] = {}
        # register domain: None = slot, l = cins(l) (value: local coefficients, docs/cins.md)
        self.dom: dict[str, int | None] = {}
        self.schedule = ir.has_key_schedule([i for i in program if i is not None])
        self.resident: set[int] = set()
        self.peak_keys = 0
        self.loads = 0
        self.rotations = 0
        self.depth = register_depths([i for i in program if i is not None]) if key_levels else {}
        self.program = program
        self.all_depths: dict[str, int] | None = None  # every register's depth, when a check needs it
        self.max_level = len(plan["params"]["log_q"]) - 1
        boot = plan["params"].get("boot")
        # bootstrapping presets: the block "boot" (its Galois keys serve plan rotations of
        # the same offsets while resident) and the largest |value| a bootstrap accepts
        self.boot_offsets: frozenset[int] = frozenset(int(k) for k in boot["key_offsets"]) if boot else frozenset()
        self.boot_max_abs: float | None = float(boot["max_abs"]) if boot else None
        # the sparse bootstrap variants the params offer (their log2 slot counts, issue 36)
        self.boot_variants: frozenset[int] = frozenset(
            int(v["log_slots"]) for v in (boot.get("variants") or ())) if boot else frozenset()
        # the SlotsToCoeffs levels a bootstrap_cins may give back (planner.frontend.params.STOC_LEVELS)
        self.stoc_levels = STOC_LEVELS.get(str(boot.get("literal")), 0) if boot else 0
        self.boot_resident = False
        self.boot_streamed = False  # a streamed block's keys serve only its bootstraps
        self.bootstraps = 0
        self.out_vals: dict[str, np.ndarray] = {}
        self.written: dict[str, np.ndarray] = {}
        self.leaked: dict[str, int] = {}
        self.domain_exits: list[dict[str, Any]] = []

    def get(self, r: str, i: int) -> np.ndarray:
        try:
            return self.regs[r]
        except KeyError:
            raise SimulationError(f"instruction {i}: register {r!r} read before it is written") from None

    def put(self, r: str, v: np.ndarray, i: int, dom: int | None = None) -> None:
        if r in self.regs:
            raise SimulationError(f"instruction {i}: register {r!r} written twice (program is not SSA)")
        self.regs[r] = v
        self.dom[r] = dom

    def same_domain(self, regs: tuple[str, ...], i: int, op: str) -> int | None:
        doms = {self.dom.get(r) for r in regs}
        if len(doms) > 1:
            raise SimulationError(f"instruction {i} ({op}): operands of different domains (slot and cins)")
        return doms.pop() if doms else None

    def slot_only(self, r: str, i: int, op: str) -> None:
        if self.dom.get(r) is not None:
            raise SimulationError(f"instruction {i} ({op}): not defined on a cins register ({r!r})")

    def rotated(self, src: str, k: int, i: int, op: str) -> np.ndarray:
        v = self.get(src, i)
        lv = self.dom.get(src)
        if lv is None:
            return np.roll(v, -k)
        if k % lv:
            raise SimulationError(f"instruction {i} ({op}): rotation {k} of a cins(l={lv}) register is not a multiple of l")
        return cins.rotate_slices(v, k, lv)

    def check_key(self, k: int, src: str, i: int, op: str) -> None:
        S = self.S
        if not 1 <= k < S:
            raise SimulationError(f"instruction {i} ({op}): offset {k} outside 1..{S - 1}")
        by_block = self.boot_resident and not self.boot_streamed and k in self.boot_offsets
        if self.schedule and k not in self.resident and not by_block:
            raise SimulationError(f"instruction {i} ({op}): no key for k={k} resident")
        if self.key_levels and k in self.key_levels and not by_block:
            ct_level = self.max_level - self.depth.get(src, 0)
            if self.key_levels[k] < ct_level:
                raise SimulationError(
                    f"instruction {i} ({op}): key for k={k} has level {self.key_levels[k]} below the "
                    f"ciphertext's level {ct_level}"
                )

    # ------------------------------------------------------------------ executors
    def exec_input(self, ins: ir.Input, i: int) -> None:
        if ins.tensor not in self.values:
            raise SimulationError(f"instruction {i}: no value for input tensor {ins.tensor!r}")
        idx, _ = _table(self.tables, ins.table, 2 * self.S if ins.l else self.S)
        self.put(ins.dst, gather(self.values[ins.tensor], idx), i, ins.l)

    def exec_rot(self, ins: ir.Rot, i: int) -> None:
        k = int(ins.k)
        self.check_key(k, ins.src, i, ins.op)
        self.put(ins.dst, self.rotated(ins.src, k, i, ins.op), i, self.dom.get(ins.src))
        self.rotations += 1

    def exec_rot_hoisted(self, ins: ir.RotHoisted, i: int) -> None:
        src = self.get(ins.src, i)
        if len(ins.dsts) != len(ins.ks):
            raise SimulationError(f"instruction {i}: rot_hoisted needs as many dsts as ks")
        del src
        for dst, k in zip(ins.dsts, ins.ks, strict=True):
            self.check_key(int(k), ins.src, i, ins.op)
            self.put(dst, self.rotated(ins.src, int(k), i, ins.op), i, self.dom.get(ins.src))
            self.rotations += 1

    def exec_ct_ct(self, ins: ir.Add | ir.Sub | ir.CMul, i: int) -> None:
        a, b = self.get(ins.a, i), self.get(ins.b, i)
        dom = self.same_domain((ins.a, ins.b), i, ins.op)
        if isinstance(ins, ir.CMul) and dom is not None:
            self.slot_only(ins.a, i, ins.op)
        self.put(ins.dst, a + b if isinstance(ins, ir.Add) else a - b if isinstance(ins, ir.Sub) else a * b, i, dom)

    def exec_ct_pt(self, ins: ir.PMul | ir.PAdd | ir.PSub, i: int) -> None:
        if ins.pt not in self.pts:
            raise SimulationError(f"instruction {i}: unknown plaintext {ins.pt!r}")
        pt = self.pts[ins.pt]
        dom = self.dom.get(ins.src)
        if (pt.get("l") or None) != dom:
            raise SimulationError(
                f"instruction {i} ({ins.op}): plaintext {ins.pt!r} (l={pt.get('l')}) does not match the "
                f"register's domain ({'slot' if dom is None else f'cins(l={dom})'})"
            )
        v = self.pt_vector(ins.pt)
        x = self.get(ins.src, i)
        if isinstance(ins, ir.PMul):
            r = x * v if dom is None else cins.negacyclic(x, v, dom)
        else:
            r = x + v if isinstance(ins, ir.PAdd) else x - v
        self.put(ins.dst, r, i, dom)

    def pt_vector(self, name: str) -> np.ndarray:
        return plaintext_vector(self.pts[name], self.tables, self.values, self.S)

    def exec_to_cins(self, ins: ir.ToCins, i: int) -> None:
        for r in ins.reads():
            self.slot_only(r, i, ins.op)
        re = self.get(ins.re, i)
        im = self.get(ins.im, i) if ins.im is not None else np.zeros(self.S)
        self.put(ins.dst, cins.to_cins(re, im, int(ins.l)), i, int(ins.l))
        self.rotations += ins.count()  # the rotations of its S_(l<-1) lowering (docs/cins.md)

    def exec_bootstrap_cins(self, ins: ir.BootstrapCins, i: int) -> None:
        if self.dom.get(ins.src) != int(ins.l):
            raise SimulationError(f"instruction {i} ({ins.op}): {ins.src!r} is not a cins(l={ins.l}) register")
        if (ins.stoc_levels or 0) > self.stoc_levels:
            raise SimulationError(
                f"instruction {i} ({ins.op}): field 'stoc_levels': {ins.stoc_levels} levels given back, but "
                f"the parameters' bootstrap leaves {self.stoc_levels} SlotsToCoeffs levels free")
        x = self.get(ins.src, i)
        self.check_boot_input(x, i, f"{ins.op} {ins.dsts[0]}, {ins.dsts[1]} <- {ins.src}", "coefficient")
        re, im = cins.bootstrap_cins(x, int(ins.l))
        self.put(ins.dsts[0], re, i)
        self.put(ins.dsts[1], im, i)
        self.bootstraps += 1

    def check_boot_input(self, x: np.ndarray, i: int, what: str, where: str, share: float = 1.0) -> None:
        """A bootstrap needs params with a 'boot' object, the key block resident (in a plan
        with a key schedule) and every value within boot.max_abs (times ``share``: 1/2 for
        two real values packed as one complex one)."""
        op = what.split(" ")[0]
        if self.boot_max_abs is None:
            raise SimulationError(f"instruction {i} ({op}): the plan's params carry no 'boot' object")
        if self.schedule and not self.boot_resident:
            raise SimulationError(f"instruction {i} ({op}): the key block 'boot' is not resident")
        if x.size:
            s = int(np.argmax(np.abs(x)))
            if not abs(x[s]) <= self.boot_max_abs * share:
                limit = "boot.max_abs" if share == 1.0 else f"boot.max_abs * {share:g} (packed variant)"
                raise SimulationError(
                    f"instruction {i} ({what}): |value| {abs(float(x[s])):.6g} at {where} "
                    f"{s} exceeds {limit} {self.boot_max_abs * share:g} (Lattigo would return garbage)"
                )

    def exec_poly(self, ins: ir.Poly, i: int) -> None:
        self.slot_only(ins.src, i, ins.op)
        x = self.get(ins.src, i)
        if ins.chebyshev and ins.domain is not None:
            # a Chebyshev series explodes outside its domain (T_d(t) ~ (2t)^d / 2), on
            # Lattigo too: every slot's argument must be inside (padding slots included:
            # a huge value in one slot overflows the whole ciphertext)
            xr = np.real(x)
            exit_ = domain_exit(xr, (float(ins.domain[0]), float(ins.domain[1])))
            if exit_ is not None:
                a, b = float(ins.domain[0]), float(ins.domain[1])
                tol = DOMAIN_RTOL * 0.5 * (b - a)
                out = ~((xr >= a - tol) & (xr <= b + tol))
                # the slots' values outside (backends.runner tells zero padding from elements)
                self.domain_exits.append({"instruction": i, "dst": ins.dst, "coeffs": list(ins.coeffs),
                                          "_outside": xr[out].copy(), **exit_})
        y = ins.evaluate(x)
        if ins.mask is not None:
            y = y * self.poly_mask(ins, i)
        self.put(ins.dst, np.asarray(y, dtype=np.complex128 if np.iscomplexobj(y) else np.float64).reshape(self.S), i)

    def poly_mask(self, ins: ir.Poly, i: int) -> np.ndarray:
        """A poly's mask (a slot plaintext, real or complex, of at most
        ir.MAX_POLY_MASK_VALUES distinct nonzero values, as the executor evaluates it)."""
        assert ins.mask is not None
        if ins.mask not in self.pts:
            raise SimulationError(f"instruction {i}: unknown plaintext {ins.mask!r}")
        if self.pts[ins.mask].get("l"):
            raise SimulationError(f"instruction {i} (poly): the mask {ins.mask!r} is a slot plaintext, not a CinS one")
        m = self.pt_vector(ins.mask)
        if not (np.iscomplexobj(m) and np.any(np.imag(m) != 0)):
            m = np.real(m)
        if len(np.unique(m[m != 0])) > ir.MAX_POLY_MASK_VALUES:
            raise SimulationError(f"instruction {i} (poly): the mask {ins.mask!r} holds more than "
                                  f"{ir.MAX_POLY_MASK_VALUES} distinct nonzero values")
        return m

    def exec_mul_i(self, ins: ir.MulI, i: int) -> None:
        self.slot_only(ins.src, i, ins.op)
        self.put(ins.dst, 1j * self.get(ins.src, i), i)

    def exec_conj(self, ins: ir.Conj, i: int) -> None:
        # the conjugation key is resident throughout (docs/formats.md), also under a schedule
        self.slot_only(ins.src, i, ins.op)
        self.put(ins.dst, np.conj(self.get(ins.src, i)), i)
        self.rotations += 1

    def exec_rescale(self, ins: ir.Rescale, i: int) -> None:
        self.put(ins.dst, self.get(ins.src, i).copy(), i, self.dom.get(ins.src))

    def exec_bootstrap(self, ins: ir.Bootstrap, i: int) -> None:
        self.slot_only(ins.src, i, ins.op)
        x = self.get(ins.src, i)
        if ins.in_scale is not None:  # the source's scale relabelled: it refreshes src / in_scale
            x = x / float(ins.in_scale)
        what = f"bootstrap {ins.dst} <- {ins.src}"
        if ins.period is None:
            self.check_boot_input(x, i, what, "slot")
            self.put(ins.dst, x * (1.0 if ins.scale is None else float(ins.scale)), i)
        else:
            span = ins.period * (2 if ins.halves else 1)
            if ins.premasked:
                # the source carries the halves packing: the high half times i (unpacked here,
                # so that the checks below see the real values it stands for)
                x = unpack_premasked(x, ins.period)
            self.check_variant(x, i, what, int(ins.log_slots or 0), span, bool(ins.halves), bool(ins.premasked))
            if ins.premasked:  # (unpacked: an imaginary part within a noisy register's tolerance)
                x = np.real(x)
            if ins.halves and not ins.premasked:
                # the executor masks the source with one product before the bootstrap
                if self.all_depths is None:
                    self.all_depths = register_depths([p for p in self.program if p is not None])
                if self.all_depths.get(ins.src, 0) >= self.max_level:
                    raise SimulationError(
                        f"instruction {i} ({what}): field 'halves': the source is at level 0, but a halves "
                        "bootstrap multiplies it by a complex mask first (one level)")
            if ins.replicas:  # not unpacked: the sparse bootstrap's copies of [0, 2^k) everywhere
                x = np.tile(x[:ins.period], x.size // ins.period)
            self.put(ins.dst, x * (1.0 if ins.scale is None else float(ins.scale)), i)
        self.bootstraps += 1

    def exec_bootstrap2(self, ins: ir.Bootstrap2, i: int) -> None:
        for j, r in enumerate(ins.srcs):
            self.slot_only(r, i, ins.op)
            x = self.get(r, i)
            self.check_variant(x, i, f"bootstrap2 {ins.dsts[j]} <- {r}", int(ins.log_slots), ins.period, True)
        for r, d in zip(ins.srcs, ins.dsts, strict=True):
            self.put(d, self.get(r, i) * (1.0 if ins.scale is None else float(ins.scale)), i)
        self.bootstraps += 1

    def check_variant(self, x: np.ndarray, i: int, what: str, log_slots: int, span: int, packed: bool,
                      premasked: bool = False) -> None:
        """A sparse bootstrap (issue 36): the params offer its slot count, the value is zero
        outside slots [0, span) (the sparse bootstrap sums the slot vector's blocks) and
        within boot.max_abs (/ 2 when two real values travel as one complex one)."""
        op = what.split(" ")[0]
        if log_slots not in self.boot_variants:
            offered = ", ".join(str(k) for k in sorted(self.boot_variants)) or "none"
            raise SimulationError(
                f"instruction {i} ({op}): field 'log_slots': the params' boot object offers no sparse bootstrap "
                f"at 2^{log_slots} slots (boot.variants: {offered})")
        if span > x.size:
            raise SimulationError(f"instruction {i} ({op}): field 'log_slots': {span} slots exceed the {x.size} slots")
        tail = np.abs(x[span:])
        if tail.size and np.any(tail != 0):
            s = span + int(np.argmax(tail))
            raise SimulationError(
                f"instruction {i} ({what}): slot {s} holds {complex(x[s]).real:.6g}, but a bootstrap at 2^{log_slots} "
                f"slots{' (halves)' if span > (1 << log_slots) else ''} needs zeros from slot {span} on")
        if np.iscomplexobj(x) and np.any(x.imag != 0):
            if premasked:  # (x: the source unpacked, unpack_premasked)
                n = 1 << log_slots
                raise SimulationError(
                    f"instruction {i} ({what}): field 'premasked': the source does not carry the halves packing "
                    f"(slots [0, {n}) real values, [{n}, {2 * n}) i times real values)")
            raise SimulationError(f"instruction {i} ({what}): a sparse bootstrap variant refreshes real values only")
        self.check_boot_input(x, i, what, "slot", 0.5 if packed else 1.0)

    def _block(self, ins: ir.KeyOp, i: int, load: bool) -> None:
        if ins.block != "boot" or self.boot_max_abs is None:
            raise SimulationError(f"instruction {i}: key block {ins.block!r} needs params with a 'boot' object")
        if load == self.boot_resident:
            raise SimulationError(
                f"instruction {i}: key block 'boot' {'loaded while already resident' if load else 'dropped but not resident'}"
            )
        self.boot_resident = load
        self.boot_streamed = load and isinstance(ins, ir.LoadKey) and ins.stream is not None
        if load:
            self.loads += 1

    def exec_load_key(self, ins: ir.LoadKey, i: int) -> None:
        if ins.k is None:
            self._block(ins, i, True)
            return
        k = int(ins.k)
        if k in self.resident:
            raise SimulationError(f"instruction {i}: key {k} loaded while already resident")
        self.resident.add(k)
        self.loads += 1
        self.peak_keys = max(self.peak_keys, len(self.resident))

    def exec_drop_key(self, ins: ir.DropKey, i: int) -> None:
        if ins.k is None:
            self._block(ins, i, False)
            return
        k = int(ins.k)
        if k not in self.resident:
            raise SimulationError(f"instruction {i}: key {k} dropped but not resident")
        self.resident.discard(k)

    def exec_output(self, ins: ir.Output, i: int) -> None:
        t = ins.tensor
        v = self.get(ins.src, i)
        if np.iscomplexobj(v):  # complex packing: what a client decodes is the real part
            if np.any(v.imag != 0):
                s = int(np.argmax(np.abs(v.imag)))
                raise SimulationError(
                    f"instruction {i}: output of {t!r} from {ins.src!r}: imaginary part {float(v.imag[s]):.3g} "
                    f"at slot {s} is not zero (outputs are real)")
            v = v.real
        idx, _ = _table(self.tables, ins.table, v.size)
        if t not in self.out_vals:
            size = int(np.prod(self.shapes[t])) if t in self.shapes else int(idx.max()) + 1
            self.out_vals[t] = np.full(size, np.nan)
            self.written[t] = np.zeros(size, dtype=bool)
        m = idx >= 0
        tgt = idx[m]
        prev = self.out_vals[t][tgt]
        seen = self.written[t][tgt]
        if np.any(seen & ~np.isclose(prev, v[m], rtol=1e-9, atol=1e-12)):
            raise SimulationError(f"instruction {i}: duplicate copies of {t!r} disagree")
        self.out_vals[t][tgt] = v[m]
        self.written[t][tgt] = True
        self.leaked[t] = self.leaked.get(t, 0) + int(np.count_nonzero(v[~m]))


# Executor of every instruction class the simulator runs (planner.ir: one class per op).
_EXEC: dict[type[ir.Instr], Callable[[_Machine, Any, int], None]] = {
    ir.Input: _Machine.exec_input,
    ir.Rot: _Machine.exec_rot,
    ir.RotHoisted: _Machine.exec_rot_hoisted,
    ir.Add: _Machine.exec_ct_ct,
    ir.Sub: _Machine.exec_ct_ct,
    ir.CMul: _Machine.exec_ct_ct,
    ir.PMul: _Machine.exec_ct_pt,
    ir.PAdd: _Machine.exec_ct_pt,
    ir.PSub: _Machine.exec_ct_pt,
    ir.Poly: _Machine.exec_poly,
    ir.Rescale: _Machine.exec_rescale,
    ir.MulI: _Machine.exec_mul_i,
    ir.Conj: _Machine.exec_conj,
    ir.ToCins: _Machine.exec_to_cins,
    ir.BootstrapCins: _Machine.exec_bootstrap_cins,
    ir.Bootstrap: _Machine.exec_bootstrap,
    ir.Bootstrap2: _Machine.exec_bootstrap2,
    ir.LoadKey: _Machine.exec_load_key,
    ir.DropKey: _Machine.exec_drop_key,
    ir.Output: _Machine.exec_output,
}


def simulate(
    plan: Mapping[str, Any],
    tables: Mapping[str, np.ndarray],
    values: Mapping[str, np.ndarray],
    key_levels: Mapping[int, int] | None = None,
    keep: Collection[str] = (),
    machine: Callable[..., _Machine] | None = None,
) -> SimResult:
    """Execute ``plan`` on ``values`` (inputs and weights by tensor name).  The registers
    named in ``keep`` are returned in ``SimResult.registers``; ``machine`` makes the machine
    (a subclass adds the CKKS error model, backends/noise.py)."""
    t0 = time.perf_counter()
    program = [ir.try_decode(d) for d in plan["program"]]
    m = (machine or _Machine)(plan, tables, values, key_levels, program)
    counts: Counter[str] = Counter()
    last_use: dict[str, int] = {}
    for i, ins in enumerate(program):
        for r in ins.reads() if ins is not None else ():
            last_use[r] = i
    keep = frozenset(keep)
    kept: dict[str, np.ndarray] = {}
    for i, ins in enumerate(program):
        run = getattr(m, _EXEC[type(ins)].__name__) if ins is not None and type(ins) in _EXEC else None
        if ins is None or run is None:
            counts[ir.op_name(plan["program"][i])] += 1
            raise SimulationError(f"instruction {i}: unknown op {ir.op_name(plan['program'][i])!r}")
        counts[ins.op] += 1
        run(ins, i)
        # free registers after their last use (keeps large plans within memory); a
        # register nobody reads is dropped at once (a plan full of dead adds stays small)
        for r in ins.reads():
            if last_use.get(r) == i:
                v_ = m.regs.pop(r, None)
                if r in keep and v_ is not None:
                    kept[r] = v_
        for r in ins.writes():
            if r not in last_use and r not in keep:
                m.regs.pop(r, None)
    peak_keys = m.peak_keys
    if not m.schedule:  # keep-all: every key the program uses is resident throughout
        peak_keys = ir.galois_key_count([i for i in program if i is not None])
    elif ir.uses_conjugation([i for i in program if i is not None]):
        peak_keys += 1  # the conjugation key, resident throughout
    outputs: dict[str, np.ndarray] = {}
    for t, v in m.out_vals.items():
        if not m.written[t].all():
            missing = int((~m.written[t]).sum())
            raise SimulationError(f"output {t!r}: {missing} elements never written")
        outputs[t] = v.reshape(m.shapes[t]) if t in m.shapes else v
    # a fused bootstrap_cins makes its S_(N/2<-l) K's rotations in place of its convolution's
    # (what the Lattigo executor runs: planner.ir.executed_rotations)
    rotations = m.rotations + ir.fused_rotation_delta([i for i in program if i is not None], m.S)
    return SimResult(
        outputs=outputs, counts=dict(counts), rotations=rotations, key_loads=m.loads,
        peak_resident_keys=peak_keys, seconds=time.perf_counter() - t0, written=m.written,
        leaked_slots=m.leaked, registers={**kept, **{r: m.regs[r] for r in keep if r in m.regs}},
        domain_exits=m.domain_exits,
    )


def unpack_premasked(x: np.ndarray, n: int) -> np.ndarray:
    """The value a premasked halves bootstrap at ``n`` slots refreshes: its source with slots
    ``[n, 2n)`` divided by ``i`` (ir.Bootstrap ``premasked``); every slot is then real when
    the source carries the halves packing."""
    u = np.array(x, dtype=np.complex128, copy=True)
    u[n:2 * n] = -1j * u[n:2 * n]
    return u
