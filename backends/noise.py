"""A CKKS error model for the simulator (``--backend noisy``, docs/noise.md).

Every instruction of a plan adds the error Lattigo adds at the plan's parameters, as a
seeded Gaussian per slot whose standard deviation was measured once per preset on Lattigo
(``slotplan noise-calibrate``, backends/noise_calibrate.py, ``data/noise/<preset>.json``):

* ``input``: encoding and encryption (and the decryption at the end): ``fresh``;
* ``rot``/``rot_hoisted``/``conj``: one key switch: ``rot``;
* ``pmul``: the plaintext's encoding: ``pmul``;
* ``cmul``: relinearisation: ``cmul``;
* ``rescale``: a real rescale (explicit, or Lattigo's automatic one of an operand carrying an
  unrescaled product, as backends/lattigo/executor.go does it): ``rescale``; a key switch of
  an unrescaled product adds nothing measurable (its scale is ~2^(2 log_scale));
* ``poly``: the products of Lattigo's polynomial evaluator: ``poly`` times the size of the
  coefficients (see :func:`poly_sigma`);
* ``bootstrap``: a floor plus EvalMod's error, which grows like the cube of the largest
  coefficient of the encoded plaintext (:func:`boot_sigma`).

Errors already in a register propagate through the exact operations (the values the
simulator computes are the noisy ones). Alongside, the variance of every slot is propagated
analytically (``var(a*b) = b^2 var(a) + a^2 var(b) + sigma^2``, ``var(p(x)) = p'(x)^2 var(x)
+ sigma^2``, ...), which gives the predicted output error without sampling: the expected
largest absolute error over the output elements.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from backends import sim
from common.errors import SlotplanError
from planner import ir
from planner.ir.analysis import register_depths
from planner.layout import cins

NOISE_DIR = Path(__file__).resolve().parent.parent / "data" / "noise"
SCHEMA = "slotplan.noise/1"
# draws of the output errors that estimate the expected maximum from the variances
MAX_DRAWS = 64


class Sigmas(BaseModel):
    """Standard deviations of the absolute error one instruction adds to a slot (values in
    the message's units: the default scale divided out)."""

    model_config = ConfigDict(extra="forbid")
    fresh: float
    rot: float
    pmul: float
    cmul: float
    rescale: float
    poly: float
    boot_floor: float | None = None
    boot_cube: float | None = None
    # a bootstrap whose input is at level 0 (measured separately: much larger)
    boot0_floor: float | None = None
    boot0_cube: float | None = None
    # relative error of a bootstrap from level 0 of a value whose scale drifted from the
    # default (a product of ciphertexts: s_a s_b / q): Lattigo's ScaleDown multiplies by the
    # integer part of (q0 / scale) / MessageRatio and cannot rescale at level 0; the default
    # Evaluate drops the resulting scale error (errScale), so the value comes back multiplied
    # by it. rms of frac(r) / r, r ~ q0 / (scale 2^8): 1 / (sqrt(3) 2^(log q0 - log_scale - 8))
    boot0_scale_rel: float | None = None


class NoiseFile(BaseModel):
    model_config = ConfigDict(extra="allow")
    schema_: str
    preset: str
    sigma: Sigmas


@dataclass(frozen=True)
class NoiseModel:
    preset: str
    sigma: Sigmas
    source: str

    def boot(self, x: np.ndarray, level0: bool = False) -> float:
        return boot_sigma(self.sigma, x, level0)


def load_model(params: Mapping[str, Any], path: str | Path | None = None) -> NoiseModel:
    """The calibrated model of the plan's parameters (its preset name), or of ``path``."""
    name = str(params.get("name") or "")
    if path is None:
        if not name or not (NOISE_DIR / f"{name}.json").exists():
            known = ", ".join(sorted(p.stem for p in NOISE_DIR.glob("*.json"))) or "none"
            raise SlotplanError(
                f"params {name or '(unnamed)'!r}: no calibrated noise model (data/noise/{name or 'NAME'}.json; "
                f"calibrated: {known}); run `slotplan noise-calibrate --params {name or 'NAME'}`"
            )
        path = NOISE_DIR / f"{name}.json"
    try:
        raw = json.loads(Path(path).read_text())
        raw["schema_"] = raw.pop("schema", None)
        f = NoiseFile.model_validate(raw)
    except (OSError, ValueError, ValidationError) as e:
        raise SlotplanError(f"noise model {path}: {str(e).splitlines()[0]}") from None
    if f.schema_ != SCHEMA:
        raise SlotplanError(f"noise model {path}: schema must be {SCHEMA!r}")
    if params.get("boot") and f.sigma.boot_floor is None:
        raise SlotplanError(f"noise model {path}: a bootstrapping plan needs a calibrated bootstrap (boot_floor)")
    return NoiseModel(f.preset, f.sigma, str(path))


# ----------------------------------------------------------------------------- formulas
def plaintext_coefficients(slots: np.ndarray) -> np.ndarray:
    """The coefficients of the CKKS plaintext (unit scale) that encodes ``slots`` (N/2 values)
    in Lattigo's slot order (slot j is the evaluation at zeta^(5^j), zeta = exp(i pi / N))."""
    z = np.asarray(slots, dtype=np.complex128)
    S = z.size
    N = 2 * S
    e = np.empty(S, dtype=np.int64)
    g = 1
    for j in range(S):
        e[j] = g
        g = g * 5 % (2 * N)
    v = np.zeros(N, dtype=np.complex128)
    v[(e - 1) // 2] = z
    v[(2 * N - e - 1) // 2] = np.conj(z)
    # m(zeta^(2k+1)) = sum_i (m_i zeta^i) w^(ik), w = exp(2 pi i / N)
    m = np.fft.fft(v) / N * np.exp(-1j * np.pi * np.arange(N) / N)
    return np.asarray(m.real)


def boot_sigma(s: Sigmas, x: np.ndarray, level0: bool = False) -> float:
    """The error one bootstrap adds: a floor plus EvalMod's, ~ cube of the largest coefficient
    (with the level-0 constants when the input is at level 0 and they were measured)."""
    if level0 and s.boot0_floor is not None:
        floor, cube = s.boot0_floor, s.boot0_cube or 0.0
    else:
        floor, cube = s.boot_floor or 0.0, s.boot_cube or 0.0
    vals = np.asarray(x)
    a = float(np.max(np.abs(plaintext_coefficients(vals)))) if vals.size else 0.0
    return math.hypot(floor, cube * a**3)


def poly_weight(ins: ir.Poly) -> float:
    """How much a polynomial's own evaluation errs, in units of ``sigma.poly``: 1 for
    coefficients up to 1 in magnitude (measured: the error of Lattigo's evaluator is about
    one rescale's, whatever the degree), growing with the largest coefficient above that
    (the products by the coefficients scale the rounding they follow); 0 for a constant."""
    if ins.degree() == 0:
        return 0.0
    return max(1.0, float(np.max(np.abs(np.asarray(ins.coeffs, dtype=np.float64)))))


def poly_derivative(ins: ir.Poly, x: np.ndarray) -> np.ndarray:
    c = np.asarray(ins.coeffs, dtype=np.float64)
    if not ins.chebyshev:
        return np.asarray(np.polynomial.polynomial.polyval(x, np.polynomial.polynomial.polyder(c)))
    a, b = (-1.0, 1.0) if ins.domain is None else (float(ins.domain[0]), float(ins.domain[1]))
    t = (2.0 * x - a - b) / (b - a)
    return np.asarray(np.polynomial.chebyshev.chebval(t, np.polynomial.chebyshev.chebder(c)) * (2.0 / (b - a)))


# ----------------------------------------------------------------------------- the machine
class _Vars(dict):  # type: ignore[type-arg]
    """Registers whose removal also drops their variance."""

    def __init__(self, var: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.var = var

    def pop(self, key: Any, *default: Any) -> Any:
        self.var.pop(key, None)
        return super().pop(key, *default)


class NoisyMachine(sim._Machine):
    """The simulator's machine plus the error model: each executor adds its instruction's
    error to the registers it writes and propagates the variance of every slot."""

    model: NoiseModel
    rng: np.random.Generator

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.var: dict[str, np.ndarray] = {}
        self.regs = _Vars(self.var)
        self.out_var: dict[str, np.ndarray] = {}
        self.added: dict[str, float] = {}  # variance added per op class (summed over slots)
        self.last_pt: tuple[str, np.ndarray] = ("", np.zeros(0))
        self.unres: set[str] = set()  # registers carrying an unrescaled product
        self.drift: set[str] = set()  # registers whose scale drifted (from a cmul, until a bootstrap)
        self.tail_tol: float | None = None  # sparse bootstrap: |value| counted as zero (check_variant)
        self.depths = register_depths([p for p in a[4] if p is not None]) if len(a) > 4 else {}
        # fused linear blocks (backends/lattigo/fused.go), recognised as the executor does:
        # the ciphertext a baby step rotates, and the ciphertext a linear form multiplies
        self.base: dict[str, str] = {}
        self.form: dict[str, str] = {}

    def noise(self, dst: str, sigma: float, op: str, base: np.ndarray) -> None:
        v = self.regs[dst]
        if sigma > 0:
            e = self.rng.normal(0.0, sigma, v.shape)
            if np.iscomplexobj(v):
                e = e + 1j * self.rng.normal(0.0, sigma, v.shape)
            self.regs[dst] = v + e
        self.var[dst] = base + sigma**2
        self.added[op] = self.added.get(op, 0.0) + sigma**2 * v.size

    def check_boot_input(self, x: np.ndarray, i: int, what: str, where: str, share: float = 1.0) -> None:
        # the plan's values were checked against boot.max_abs; CKKS noise may push a value
        # at the bound just past it (Lattigo does not fail on that): allow a 1e-6 margin
        if self.boot_max_abs is not None:
            m = self.boot_max_abs * share
            x = np.where(np.abs(x) <= m * (1 + 1e-6), np.clip(np.real(x), -m, m), x)
        super().check_boot_input(x, i, what, where, share)

    def level(self, r: str) -> int:
        return self.max_level - self.depths.get(r, 0)

    def pt_vector(self, name: str) -> np.ndarray:
        v = super().pt_vector(name)
        self.last_pt = (name, v)
        return v

    def v(self, r: str) -> np.ndarray:
        return self.var.get(r, np.zeros(self.S))

    def rescale_in_place(self, r: str) -> None:
        """Lattigo's automatic rescale of an operand that carries an unrescaled product
        (backends/lattigo/executor.go: before a multiplication, a bootstrap, or an addition
        to a rescaled operand): the register takes the rounding error of one rescale."""
        if r in self.unres:
            self.unres.discard(r)
            self.noise(r, self.model.sigma.rescale, "rescale", self.v(r))

    def exec_input(self, ins: ir.Input, i: int) -> None:
        super().exec_input(ins, i)
        self.noise(ins.dst, self.model.sigma.fresh, "input", np.zeros(self.regs[ins.dst].shape))

    def ks_sigma(self, src: str) -> float:
        # a key switch adds its error at the ciphertext's scale: negligible on an unrescaled
        # product (scale ~ 2^(2 log_scale))
        # a giant step of a fused block (a rotation of a sum of products of one ciphertext,
        # rescaled or not) runs in QP before the block's ModDown and rescale on Lattigo
        # (backends/lattigo/fused.go): the same
        return 0.0 if src in self.unres or src in self.form else self.model.sigma.rot

    def exec_rot(self, ins: ir.Rot, i: int) -> None:
        super().exec_rot(ins, i)
        self.noise(ins.dst, self.ks_sigma(ins.src), "rot", self.rotated_var(ins.src, int(ins.k)))
        self.inherit(ins.dst, ins.src)
        self.track_rot(ins.dst, ins.src)

    def track_rot(self, dst: str, src: str) -> None:
        if src in self.form:
            self.form[dst] = self.form[src]  # a giant step: still one block
        else:
            self.base[dst] = self.base.get(src, src)

    def inherit(self, dst: str, *srcs: str) -> None:
        if any(s in self.unres for s in srcs):
            self.unres.add(dst)
        if any(s in self.drift for s in srcs):
            self.drift.add(dst)

    def rotated_var(self, src: str, k: int) -> np.ndarray:
        v = self.v(src)
        lv = self.dom.get(src)
        return np.roll(v, -k) if lv is None else cins.rotate_slices(v, k, lv)

    def exec_rot_hoisted(self, ins: ir.RotHoisted, i: int) -> None:
        super().exec_rot_hoisted(ins, i)
        for dst, k in zip(ins.dsts, ins.ks, strict=True):
            self.noise(dst, self.ks_sigma(ins.src), "rot", self.rotated_var(ins.src, int(k)))
            self.inherit(dst, ins.src)
            self.track_rot(dst, ins.src)

    def exec_ct_ct(self, ins: ir.Add | ir.Sub | ir.CMul, i: int) -> None:
        ua, ub = ins.a in self.unres, ins.b in self.unres
        if isinstance(ins, ir.CMul) or ua != ub:
            self.rescale_in_place(ins.a)
            self.rescale_in_place(ins.b)
        super().exec_ct_ct(ins, i)
        va, vb = self.v(ins.a), self.v(ins.b)
        if isinstance(ins, ir.CMul):
            a, b = np.abs(self.regs[ins.a]) ** 2, np.abs(self.regs[ins.b]) ** 2
            self.noise(ins.dst, self.model.sigma.cmul, "cmul", b * va + a * vb + va * vb)
            self.unres.add(ins.dst)
            self.drift.add(ins.dst)
        else:
            self.var[ins.dst] = va + vb
            self.inherit(ins.dst, ins.a, ins.b)
            fa, fb = self.form.get(ins.a), self.form.get(ins.b)
            if fa is not None and fa == fb:
                self.form[ins.dst] = fa

    def exec_ct_pt(self, ins: ir.PMul | ir.PAdd | ir.PSub, i: int) -> None:
        if isinstance(ins, ir.PMul):
            self.rescale_in_place(ins.src)
        super().exec_ct_pt(ins, i)
        vx = self.v(ins.src)
        if isinstance(ins, ir.PMul):
            w2 = np.abs(self.last_pt[1]) ** 2
            dom = self.dom.get(ins.src)
            base = vx * w2 if dom is None else cins.negacyclic(vx, w2, dom).real
            self.noise(ins.dst, self.model.sigma.pmul, "pmul", np.asarray(base, dtype=np.float64))
            self.unres.add(ins.dst)
            if ins.src in self.drift:
                self.drift.add(ins.dst)
            if ins.src not in self.form:
                self.form[ins.dst] = self.base.get(ins.src, ins.src)
        else:
            self.var[ins.dst] = vx
            self.inherit(ins.dst, ins.src)

    def exec_poly(self, ins: ir.Poly, i: int) -> None:
        self.rescale_in_place(ins.src)
        x = self.get(ins.src, i)
        super().exec_poly(ins, i)
        d = np.abs(poly_derivative(ins, x)) ** 2
        sigma = self.model.sigma.poly * poly_weight(ins)
        if ins.mask is not None:  # the mask scales the polynomial (its rounding with it) and zeroes slots
            m2 = np.abs(self.poly_mask(ins, i)) ** 2
            d = d * m2
            sigma *= math.sqrt(float(np.max(m2))) if m2.size else 0.0
        self.noise(ins.dst, sigma, "poly", d * self.v(ins.src))

    def exec_mul_i(self, ins: ir.MulI, i: int) -> None:
        super().exec_mul_i(ins, i)
        self.var[ins.dst] = self.v(ins.src)
        self.inherit(ins.dst, ins.src)

    def exec_conj(self, ins: ir.Conj, i: int) -> None:
        super().exec_conj(ins, i)
        self.noise(ins.dst, self.ks_sigma(ins.src), "rot", self.v(ins.src))
        self.inherit(ins.dst, ins.src)

    def exec_rescale(self, ins: ir.Rescale, i: int) -> None:
        super().exec_rescale(ins, i)
        if ins.src in self.drift:
            self.drift.add(ins.dst)
        if ins.src in self.unres:  # a real rescale; otherwise Lattigo passes the value through
            if ins.src in self.form:
                self.form[ins.dst] = self.form[ins.src]
            self.noise(ins.dst, self.model.sigma.rescale, "rescale", self.v(ins.src))
        else:
            self.var[ins.dst] = self.v(ins.src)

    def exec_to_cins(self, ins: ir.ToCins, i: int) -> None:
        super().exec_to_cins(ins, i)
        base = self.v(ins.re) + (self.v(ins.im) if ins.im is not None else 0.0)
        base = np.full(2 * self.S, float(np.max(base)) if np.size(base) else 0.0)
        self.noise(ins.dst, self.model.sigma.rot * math.sqrt(max(1, ins.count())), "rot", base)

    def check_variant(self, x: np.ndarray, i: int, what: str, log_slots: int, span: int, packed: bool,
                      premasked: bool = False) -> None:
        # a noisy register holds noise where the plan holds zeros: a value within the
        # register's noise (tail_tol) counts as zero, as does a noise-sized imaginary part
        tol = self.tail_tol
        if tol is not None:
            x = np.array(x, copy=True)
            if np.iscomplexobj(x):
                x = np.where(np.abs(x.imag) <= tol, x.real, x)
            tail = x[span:]
            tail[np.abs(tail) <= tol] = 0
        super().check_variant(x, i, what, log_slots, span, packed, premasked)

    def noise_tol(self, *regs: str) -> float:
        """How far from zero a slot may be and still hold a zero of the plan: 8 standard
        deviations of the largest variance of the registers (plus a floor)."""
        var = max((float(np.max(self.v(r))) if np.size(self.v(r)) else 0.0) for r in regs)
        return 8.0 * math.sqrt(max(var, 0.0)) + 1e-12

    def variant_noise(self, dst: str, z: np.ndarray, n: int, span: int, scale: float, level0: bool,
                      base: np.ndarray, replicas: bool = False) -> None:
        """A sparse bootstrap's output: the bootstrap's error for the packed message ``z``
        (the 2^k complex slots it refreshes, replicated with period n as Lattigo sees them)
        times the unpacking scale, on slots [0, span); the unpacking mask leaves zeros
        elsewhere (``replicas``: no mask, the copies and their error everywhere)."""
        zz = np.tile(np.asarray(z, dtype=np.complex128)[:n], self.S // n)
        sigma = abs(scale) * self.model.boot(zz, level0)
        base = np.array(base, dtype=np.float64, copy=True)
        if replicas:
            self.noise(dst, sigma, "bootstrap", np.tile(base[:n], self.S // n))
            return
        base[span:] = 0.0
        self.noise(dst, sigma, "bootstrap", base)
        self.regs[dst] = np.array(self.regs[dst], copy=True)
        self.regs[dst][span:] = 0.0
        self.var[dst][span:] = 0.0

    def exec_bootstrap2(self, ins: ir.Bootstrap2, i: int) -> None:
        for r in ins.srcs:
            self.rescale_in_place(r)
        x, y = (np.real(self.get(r, i)) for r in ins.srcs)
        self.tail_tol = self.noise_tol(*ins.srcs)
        try:
            super().exec_bootstrap2(ins, i)
        finally:
            self.tail_tol = None
        n = int(ins.period)
        sc = 1.0 if ins.scale is None else float(ins.scale)
        level0 = min(self.level(r) for r in ins.srcs) == 0
        for d, r in zip(ins.dsts, ins.srcs, strict=True):
            self.variant_noise(d, x + 1j * y, n, n, sc, level0, sc**2 * self.v(r))

    def exec_bootstrap(self, ins: ir.Bootstrap, i: int) -> None:
        self.rescale_in_place(ins.src)
        # in_scale: the bootstrap refreshes src / in_scale (the source's noise with it)
        inv = 1.0 if ins.in_scale is None else 1.0 / float(ins.in_scale)
        x = self.get(ins.src, i) * inv
        sc = 1.0 if ins.scale is None else float(ins.scale)
        if ins.log_slots is not None:
            self.tail_tol = self.noise_tol(ins.src)
            try:
                super().exec_bootstrap(ins, i)
            finally:
                self.tail_tol = None
            n = int(ins.period or 0)
            xr = np.real(x)
            # premasked: the source carries the halves packing (the high half times i), as
            # the sparse bootstrap's trace adds the two halves
            z = x[:n] + x[n:2 * n] if ins.premasked else xr[:n] + 1j * xr[n:2 * n] if ins.halves else xr[:n]
            # halves: the executor masks the source first (one level), so the bootstrap's
            # input is one level below the source (premasked: no mask)
            level0 = self.level(ins.src) <= (1 if ins.halves and not ins.premasked else 0)
            self.variant_noise(ins.dst, z, n, 2 * n if ins.halves else n, sc, level0,
                               (sc * inv) ** 2 * self.v(ins.src), bool(ins.replicas))
            return
        super().exec_bootstrap(ins, i)
        level0 = self.level(ins.src) == 0
        # a full-slot bootstrap's scale is an exact integer product of its result
        base = (sc * inv) ** 2 * self.v(ins.src)
        rel = self.model.sigma.boot0_scale_rel
        if level0 and rel and ins.src in self.drift:
            # one factor for the whole ciphertext (a scale error), drawn once
            eps = float(self.rng.normal(0.0, rel))
            self.regs[ins.dst] = self.regs[ins.dst] * (1.0 + eps)
            base = base + np.abs(sc * x) ** 2 * rel**2
        self.noise(ins.dst, sc * self.model.boot(x, level0), "bootstrap", base)

    def exec_bootstrap_cins(self, ins: ir.BootstrapCins, i: int) -> None:
        self.rescale_in_place(ins.src)
        x = self.get(ins.src, i)
        vx = self.v(ins.src)
        super().exec_bootstrap_cins(ins, i)
        s = self.model.boot(x[: self.S], self.level(ins.src) == 0)
        re_v, im_v = cins.bootstrap_cins(vx, int(ins.l))
        self.noise(ins.dsts[0], s, "bootstrap", re_v)
        self.noise(ins.dsts[1], s, "bootstrap", im_v)

    def exec_output(self, ins: ir.Output, i: int) -> None:
        t = ins.tensor
        v = self.get(ins.src, i)
        if np.iscomplexobj(v):
            v = v.real  # the imaginary part of a noisy register is noise
        idx, _ = sim._table(self.tables, ins.table, v.size)
        if t not in self.out_vals:
            size = int(np.prod(self.shapes[t])) if t in self.shapes else int(idx.max()) + 1
            self.out_vals[t] = np.full(size, np.nan)
            self.out_var[t] = np.zeros(size)
            self.written[t] = np.zeros(size, dtype=bool)
        m = idx >= 0
        # duplicate copies of an element carry different noise: the last one is decrypted
        self.out_vals[t][idx[m]] = v[m]
        self.out_var[t][idx[m]] = self.v(ins.src)[m]
        self.written[t][idx[m]] = True  # (leaked slots are not counted: every slot is noisy)


@dataclass
class NoisyResult:
    result: sim.SimResult
    variances: dict[str, np.ndarray]
    added: dict[str, float]


def simulate_noisy(
    plan: Mapping[str, Any],
    tables: Mapping[str, np.ndarray],
    values: Mapping[str, np.ndarray],
    model: NoiseModel,
    rng: np.random.Generator,
    key_levels: Mapping[int, int] | None = None,
) -> NoisyResult:
    holder: dict[str, NoisyMachine] = {}

    def factory(*a: Any, **kw: Any) -> NoisyMachine:
        m = NoisyMachine(*a, **kw)
        m.model = model
        m.rng = rng
        holder["m"] = m
        return m

    res = sim.simulate(plan, tables, values, key_levels=key_levels, machine=factory)
    m = holder["m"]
    variances = {t: (v.reshape(res.outputs[t].shape) if t in res.outputs else v) for t, v in m.out_var.items()}
    return NoisyResult(res, variances, dict(m.added))


def predicted_max_error(variances: Mapping[str, np.ndarray], seed: int = 0) -> float:
    """The expected largest absolute error over all output elements: the mean over
    ``MAX_DRAWS`` seeded draws of the elements' Gaussian errors (with their variances)."""
    sd = np.sqrt(np.concatenate([np.ravel(v) for v in variances.values()])) if variances else np.zeros(0)
    if sd.size == 0:
        return 0.0
    rng = np.random.default_rng(seed)
    total = 0.0
    for _ in range(MAX_DRAWS):
        total += float(np.max(np.abs(rng.standard_normal(sd.size)) * sd))
    return total / MAX_DRAWS


def noise_report(nr: NoisyResult, model: NoiseModel) -> dict[str, Any]:
    sd = {t: np.sqrt(v) for t, v in nr.variances.items()}
    return {
        "model": model.source.split("/data/", 1)[-1] if "/data/" in model.source else model.source,
        "preset": model.preset,
        "predicted_max_abs_error": predicted_max_error(nr.variances),
        "predicted_rms_error": float(np.sqrt(np.mean(np.concatenate([v.ravel() for v in nr.variances.values()]))))
        if nr.variances else 0.0,
        "predicted_max_sigma": max((float(np.max(s)) for s in sd.values() if s.size), default=0.0),
        "variance_by_op": {k: v for k, v in sorted(nr.added.items())},
    }
