"""Composite minimax approximations of sign, ReLU, |x| and max (docs/import.md, "Activations").

A single polynomial fitted to ReLU on [-B, B] errs by about B / degree: the kink at 0 is what
polynomials approximate worst. The composite method of Lee, Lee, Lee, Kim and No
("Minimax approximation of sign function by composite polynomial for homomorphic
comparison", IACR eprint 2020/834; used for ReLU in "Low-complexity deep convolutional
neural networks on fully homomorphic encryption using multiplexed parallel convolutions",
eprint 2021/1688, ICML 2022) approximates the sign instead, by a composition of odd
polynomials ``s = p_k o ... o p_1 (x / B)``:

- ``p_1`` is the odd minimax polynomial of ``sgn`` on ``[-1, -eps] U [eps, 1]``; on
  ``[eps, 1]`` its values lie in ``[1 - d_1, 1 + d_1]``.
- ``p_i`` (i > 1) is the odd minimax polynomial of ``sgn`` on ``+-[1 - d_{i-1}, 1 + d_{i-1}]``,
  the image of the previous stage, so the errors shrink stage after stage (roughly squaring
  once the values are near +-1) and ``|s(x) - sgn(x)| <= d_k`` for ``|x| >= eps B``.

Then ``ReLU(x) = x (1 + s) / 2``, ``|x| = x s`` and ``max(a, b) = (a + b) / 2 + |a - b| / 2
= b + ReLU(a - b)`` (the form MaxPool uses):
the error is at most ``B d_k / 2`` where ``|x| >= eps B`` and at most ``|x| <= eps B`` inside.
Each stage is a ``poly`` node in the Chebyshev basis on the symmetric domain that holds its
argument, the last one carrying the affine ``(1 + p_k) / 2`` (no extra level), then one
``mul``: depth ``sum ceil(log2(d_i + 1)) + 1``.

The odd minimax polynomials are computed by the Remez exchange algorithm below on the
Chebyshev basis of odd degree (well conditioned up to degree 31). They are computed once
(``python -m planner.frontend.importers.composite`` regenerates ``data/composite_sign.json``), and the
stored coefficients are checked against their stated errors by the tests.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.polynomial import chebyshev as C

from common.paths import DATA_DIR
from planner.frontend.importers.values import ApproxRow, Dyn

__all__ = [
    "DATA_FILE",
    "Ladder",
    "Stage",
    "ladders",
    "remez_odd_sign",
    "compose",
]

Array = npt.NDArray[np.float64]

DATA_FILE = DATA_DIR / "composite_sign.json"
# Degrees a stage may have: the largest of each depth (2**k - 1 costs k levels).
STAGE_DEGREES: tuple[int, ...] = (3, 7, 15, 31)
# Precisions stored: eps = 2**-alpha and final stage error d_k <= 2**-alpha.
ALPHAS: tuple[int, ...] = tuple(range(4, 13))
MAX_STAGES = 4
# A stage's domain is the largest |value| of the stage before (on a grid of 200001 points),
# widened by this fraction: a grid misses the true maximum by far less.
BOUND_MARGIN = 1e-6


def _odd_cheb(coeffs_odd: Sequence[float] | Array) -> Array:
    """Full Chebyshev coefficient vector of ``sum_j c_j T_{2j+1}``."""
    full = np.zeros(2 * len(coeffs_odd))
    full[1::2] = coeffs_odd
    return full


def _grid(lo: float, hi: float, n: int = 6000) -> Array:
    """Points of [lo, hi], dense near both ends (where minimax errors peak): Chebyshev points
    of the interval, and geometric points near lo (sign's error clusters near eps)."""
    t = np.cos(np.pi * np.arange(n + 1) / n)
    pts = 0.5 * (hi - lo) * t + 0.5 * (hi + lo)
    geo = np.geomspace(lo, hi, n) if lo > 0 else np.empty(0)
    return np.unique(np.concatenate([pts, geo, [lo, hi]]))


def _extrema(x: Array, e: Array) -> list[int]:
    """Indices of the largest |e| of each run of constant sign (alternating by construction)."""
    s = np.sign(e)
    s[s == 0] = 1
    cuts = np.flatnonzero(np.diff(s)) + 1
    out: list[int] = []
    for seg in np.split(np.arange(len(x)), cuts):
        out.append(int(seg[np.argmax(np.abs(e[seg]))]))
    return out


def remez_odd_sign(lo: float, hi: float, degree: int, scale: float,
                   iters: int = 80, tol: float = 1e-9) -> tuple[Array, float]:
    """Odd polynomial ``p(x) = sum_j c_j T_{2j+1}(x / scale)`` of ``degree`` (odd) minimising
    ``max |p(x) - 1|`` over ``[lo, hi]`` (0 < lo < hi <= scale), so that ``p`` is the minimax odd
    approximation of ``sgn`` on ``+-[lo, hi]``: (``c``, the minimax error)."""
    if degree % 2 == 0 or not 0 < lo < hi <= scale:
        raise ValueError(f"need an odd degree and 0 < lo < hi <= scale, got {degree}, [{lo}, {hi}], {scale}")
    m = (degree + 1) // 2  # basis T_1, T_3, ..., T_degree
    grid = _grid(lo, hi)
    basis_grid = np.stack([C.chebval(grid / scale, _odd_cheb(np.eye(m)[j])) for j in range(m)], axis=1)
    # initial reference: m + 1 Chebyshev extrema of [lo, hi] (in sqrt space, denser near lo)
    k = np.arange(m + 1)
    ref = lo + (hi - lo) * (0.5 - 0.5 * np.cos(np.pi * k / m)) ** 2
    idx = np.unique(np.searchsorted(grid, ref).clip(0, len(grid) - 1))
    if len(idx) < m + 1:
        idx = np.linspace(0, len(grid) - 1, m + 1).astype(int)
    c = np.zeros(m)
    err = math.inf
    for _ in range(iters):
        a = np.concatenate([basis_grid[idx], ((-1.0) ** np.arange(m + 1))[:, None]], axis=1)
        sol = np.linalg.solve(a, np.ones(m + 1))
        c = sol[:m]
        e = basis_grid @ c - 1.0
        ext = _extrema(grid, e)
        while len(ext) > m + 1:
            if len(ext) - (m + 1) == 1 or len(ext) < 3:
                ext = ext[1:] if abs(e[ext[0]]) < abs(e[ext[-1]]) else ext[:-1]
            else:
                pair = [min(abs(e[ext[i]]), abs(e[ext[i + 1]])) for i in range(len(ext) - 1)]
                i = int(np.argmin(pair))
                ext = ext[:i] + ext[i + 2:]
        err = float(np.max(np.abs(e)))
        if len(ext) < m + 1:
            break
        idx = np.asarray(ext)
        levels = np.abs(e[idx])
        if err - float(np.min(levels)) <= tol * err:
            break
    return c, err


@dataclass(frozen=True)
class Stage:
    """One odd polynomial of the composition: ``sum_j coeffs[j] T_{2j+1}(x / scale)``,
    minimax for sgn on ``+-[lo, hi]`` with error ``error``; ``bound`` is the largest |value| it
    takes on ``[-scale, scale]`` (the next stage's scale)."""

    degree: int
    scale: float
    lo: float
    hi: float
    coeffs: tuple[float, ...]
    error: float
    bound: float

    def __call__(self, x: Array) -> Array:
        return np.asarray(C.chebval(np.asarray(x) / self.scale, _odd_cheb(self.coeffs)), dtype=np.float64)

    @property
    def depth(self) -> int:
        return math.ceil(math.log2(self.degree + 1))


@dataclass(frozen=True)
class Ladder:
    """A composition for precision alpha: ``|s(x) - sgn(x)| <= error`` for ``eps <= |x| <= 1``
    (``eps = 2**-alpha``), ``|s(x)| <= bound`` on [-1, 1]."""

    alpha: int
    stages: tuple[Stage, ...]
    measured: float | None = None  # max |s - 1| on a dense grid of [eps, 1] (None: the Remez error)

    @property
    def eps(self) -> float:
        return 2.0 ** -self.alpha

    @property
    def degrees(self) -> tuple[int, ...]:
        return tuple(s.degree for s in self.stages)

    @property
    def error(self) -> float:
        return self.measured if self.measured is not None else self.stages[-1].error

    @property
    def depth(self) -> int:
        """Levels of the sign (the ReLU adds one ``mul``)."""
        return sum(s.depth for s in self.stages)

    def sign(self, x: Array) -> Array:
        """s(x) for x in [-1, 1]."""
        v = np.asarray(x, dtype=np.float64)
        for s in self.stages:
            v = s(v)
        return v

    def to_json(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "degrees": list(self.degrees), "error": self.error,
                "stages": [{"degree": s.degree, "scale": s.scale, "lo": s.lo, "hi": s.hi,
                            "coeffs_odd_chebyshev": list(s.coeffs), "error": s.error, "bound": s.bound}
                           for s in self.stages]}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Ladder:
        return Ladder(int(d["alpha"]), tuple(
            Stage(int(s["degree"]), float(s["scale"]), float(s["lo"]), float(s["hi"]),
                  tuple(float(c) for c in s["coeffs_odd_chebyshev"]), float(s["error"]), float(s["bound"]))
            for s in d["stages"]), float(d["error"]))


def _stage(degree: int, lo: float, hi: float, scale: float) -> Stage:
    c, err = remez_odd_sign(lo, hi, degree, scale)
    full = _odd_cheb(c)
    g = np.linspace(0.0, scale, 200001)
    bound = float(np.max(np.abs(C.chebval(g / scale, full))))
    return Stage(degree, scale, lo, hi, tuple(float(v) for v in c), err, max(bound, 1.0 + err))


def compose(alpha: int, degrees: Sequence[int]) -> Ladder:
    """The composition of odd minimax stages of ``degrees`` for ``eps = 2**-alpha``."""
    stages: list[Stage] = []
    lo, hi, scale = 2.0 ** -alpha, 1.0, 1.0
    for d in degrees:
        s = _stage(d, lo, hi, scale)
        stages.append(s)
        lo, hi = max(1.0 - s.error, 1e-12), 1.0 + s.error
        scale = s.bound * (1.0 + BOUND_MARGIN)
    return Ladder(alpha, tuple(stages))


def _search(alpha: int) -> Ladder | None:
    """The ladder of least depth (then least total degree) whose error is at most 2**-alpha,
    found breadth-first over sequences of ``STAGE_DEGREES`` (stages memoised by prefix)."""
    target = 2.0 ** -alpha
    memo: dict[tuple[int, ...], Ladder] = {}

    def ladder(seq: tuple[int, ...]) -> Ladder:
        if seq not in memo:
            if len(seq) == 1:
                memo[seq] = compose(alpha, seq)
            else:
                prev = ladder(seq[:-1])
                last = prev.stages[-1]
                s = _stage(seq[-1], max(1.0 - last.error, 1e-12), 1.0 + last.error, last.bound * (1.0 + BOUND_MARGIN))
                memo[seq] = Ladder(alpha, (*prev.stages, s))
        return memo[seq]

    best: Ladder | None = None
    seqs: list[tuple[int, ...]] = [()]
    for _ in range(MAX_STAGES):
        grown: list[tuple[int, ...]] = []
        for seq in ((*s, d) for s in seqs for d in STAGE_DEGREES):
            depth = sum(math.ceil(math.log2(d + 1)) for d in seq)
            if best is not None and depth > best.depth:
                continue  # deeper than a ladder already found
            lad = ladder(seq)
            if lad.error > target:
                grown.append(seq)
            elif best is None or (lad.depth, sum(lad.degrees)) < (best.depth, sum(best.degrees)):
                best = lad
        seqs = grown
    return None if best is None else verified(best)


def verified(lad: Ladder) -> Ladder:
    """``lad`` with its error measured on 2,000,001 points of [eps, 1] (geometric and uniform)
    rather than taken from the last stage's Remez error."""
    x = np.concatenate([np.geomspace(lad.eps, 1.0, 1000001), np.linspace(lad.eps, 1.0, 1000001)])
    err = float(np.max(np.abs(lad.sign(x) - 1.0)))
    return Ladder(lad.alpha, lad.stages, err)


@cache
def ladders() -> tuple[Ladder, ...]:
    """The stored ladders (``data/composite_sign.json``), by increasing alpha."""
    doc = json.loads(DATA_FILE.read_text())
    return tuple(Ladder.from_json(d) for d in doc["ladders"])


def main() -> int:
    out = []
    for alpha in ALPHAS:
        lad = _search(alpha)
        if lad is None:
            print(f"alpha {alpha}: no ladder of at most {MAX_STAGES} stages", file=sys.stderr)
            continue
        print(f"alpha {alpha}: degrees {'-'.join(map(str, lad.degrees))} depth {lad.depth} "
              f"error {lad.error:.3e} (target {2.0 ** -alpha:.3e})")
        out.append(lad.to_json())
    doc = {"about": "Odd minimax composite approximations of sgn on [-1,-eps] U [eps,1], eps = 2**-alpha "
                    "(Lee et al., eprint 2020/834); stage p(x) = sum_j c_j T_{2j+1}(x / scale). "
                    "Regenerate: python -m planner.frontend.importers.composite",
           "ladders": out}
    DATA_FILE.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())


# -- the importer's choice for ReLU-like activations ----------------------------------------------
RELU_MODES: tuple[str, ...] = ("auto", "direct", "composite")
# Without --max-error, a ReLU's error target is this fraction of B = max |domain| (1.6%; the
# direct degree-15 fit errs by about 2% of B on a symmetric domain, so wide ranges move to a
# higher degree; a tighter --max-error is what makes the composite pay for its depth).
DEFAULT_RELU_TARGET = 2.0**-6
# Points of the domain on which each candidate's error is measured (with the samples).
CHECK_POINTS = 20001


@dataclass(frozen=True)
class ReluApprox:
    """One candidate approximation of ``x -> x if x >= 0 else slope x`` on ``domain``:
    the direct Chebyshev fit (``ladder`` None) or the composite ``x (a + b s(x / B))`` with
    ``a = (1 + slope) / 2``, ``b = (1 - slope) / 2``."""

    domain: tuple[float, float]
    slope: float
    depth: int
    max_error: float  # on CHECK_POINTS points of the domain and the samples
    coeffs: tuple[float, ...] = ()  # direct: Chebyshev coefficients on the domain
    degree: int = 0
    ladder: Ladder | None = None

    @property
    def method(self) -> str:
        return "direct" if self.ladder is None else "composite"

    @property
    def bound(self) -> float:
        return max(abs(self.domain[0]), abs(self.domain[1]))

    def __call__(self, x: Array) -> Array:
        from planner.frontend.reference import chebyshev

        x = np.asarray(x, dtype=np.float64)
        if self.ladder is None:
            return chebyshev(x, self.coeffs, self.domain)
        s = self.ladder.sign(x / self.bound)
        return x * (0.5 * (1 + self.slope) + 0.5 * (1 - self.slope) * s)

    def polys(self) -> list[tuple[list[float], tuple[float, float]]]:
        """The ``poly`` nodes of the sign, in order: (Chebyshev coefficients, domain); the last
        one carries ``a + b p_k`` (composite only)."""
        assert self.ladder is not None
        out: list[tuple[list[float], tuple[float, float]]] = []
        n = len(self.ladder.stages)
        for i, st in enumerate(self.ladder.stages):
            c = _odd_cheb(st.coeffs)
            scale = self.bound * st.scale if i == 0 else st.scale
            if i == n - 1:
                c = 0.5 * (1 - self.slope) * c
                c[0] += 0.5 * (1 + self.slope)
            out.append(([float(v) for v in c], (-scale, scale)))
        return out


def _check_points(domain: tuple[float, float], samples: Array | None) -> Array:
    """CHECK_POINTS points of the domain and the samples' distinct values (at most
    CHECK_POINTS of them, evenly spaced in sorted order, the extremes included)."""
    pts = np.linspace(domain[0], domain[1], CHECK_POINTS)
    if samples is not None and samples.size:
        u = np.unique(np.ravel(samples))
        if len(u) > CHECK_POINTS:
            u = u[np.linspace(0, len(u) - 1, CHECK_POINTS).round().astype(int)]
        pts = np.concatenate([pts, u])
    return pts


def _unmeasured(domain: tuple[float, float], slope: float, degrees: Sequence[int]) -> list[ReluApprox]:
    """The candidates without their errors, shallowest first (the direct fit first on a tie)."""
    from planner.frontend.importers import approx

    def relu(v: Array) -> Array:
        return np.where(v >= 0, v, slope * v)

    out = []
    for d in degrees:
        coeffs = approx.minimax(relu, d, domain, kinks=(0.0,))
        out.append(ReluApprox(domain, slope, approx.poly_depth(d), math.nan, coeffs, d))
    for lad in ladders():
        out.append(ReluApprox(domain, slope, lad.depth + 1, math.nan, ladder=lad, degree=math.prod(lad.degrees)))
    return sorted(out, key=lambda c: (c.depth, c.ladder is not None, c.degree))


def _measured(c: ReluApprox, pts: Array, exact: Array) -> ReluApprox:
    err = float(np.max(np.abs(c(pts) - exact)))
    return ReluApprox(c.domain, c.slope, c.depth, err, c.coeffs, c.degree, c.ladder)


def candidates(domain: tuple[float, float], samples: Array | None, slope: float = 0.0,
               degrees: Sequence[int] | None = None) -> list[ReluApprox]:
    """Every candidate, shallowest first: the direct fits of ``degrees`` (default:
    approx.DEGREES) and the composite of every stored ladder, each with its error measured on
    CHECK_POINTS points of the domain and the samples."""
    from planner.frontend.importers import approx

    pts = _check_points(domain, samples)
    exact = np.where(pts >= 0, pts, slope * pts)
    return [_measured(c, pts, exact) for c in _unmeasured(domain, slope, degrees or approx.DEGREES)]


def choose(domain: tuple[float, float], samples: Array | None, mode: str, target: float | None,
           degree: int | None, slope: float = 0.0) -> ReluApprox:
    """The approximation of a ReLU (or leaky ReLU of ``slope``) on ``domain``.

    ``mode`` ``composite``: the shallowest composite meeting the target, else the most
    accurate composite. ``auto``: the shallowest of all candidates meeting the target, the
    direct fit on ties; when none does, the most accurate. The target is ``target``
    (--max-error) or ``DEFAULT_RELU_TARGET * B``; with ``degree`` given the direct candidate is
    that degree alone. (``direct`` is the importer's plain Chebyshev fit, not chosen here.)
    Candidates are measured shallowest first and the first to meet the target is taken."""
    from planner.frontend.importers import approx

    if mode not in ("auto", "composite"):
        raise ValueError(f"choose() takes --relu auto or composite, got {mode!r}")
    bound = max(abs(domain[0]), abs(domain[1]))
    goal = target if target is not None else DEFAULT_RELU_TARGET * bound
    pts = _check_points(domain, samples)
    exact = np.where(pts >= 0, pts, slope * pts)
    seen: list[ReluApprox] = []
    for c in _unmeasured(domain, slope, [degree] if degree is not None else approx.DEGREES):
        if mode == "composite" and c.ladder is None:
            continue
        m = _measured(c, pts, exact)
        if m.max_error <= goal:
            return m
        seen.append(m)
    return min(seen, key=lambda c: (c.max_error, c.depth))


def emit(im: Any, function: str, slope: float) -> Any:
    """The importer's hook for Relu / LeakyRelu under ``--relu auto|composite``, on the ONNX
    node's input (see :func:`emit_relu`). ``im`` is the
    :class:`planner.frontend.importers.onnx_import.Importer`."""

    x = im.dyn_inputs()[0]
    if not isinstance(x, Dyn):
        raise im.fail("input 0 must be computed from the model's input")
    return emit_relu(im, x, im.measured(im.node.input[0]), function, slope, im.out_name())


def emit_relu(im: Any, x: Any, xs: Array | None, function: str, slope: float, base: str) -> Any:
    """``x -> x if x >= 0 else slope x`` on the graph tensor of ``x`` (a ``Dyn``) whose values
    on the calibration samples are ``xs``: the plain fit under ``--relu direct`` (or ``auto``
    with ``--degree``); else chosen by :func:`choose` on the measured range widened by the
    margin (the default domain uncalibrated) and emitted: a direct Chebyshev ``poly``, or the
    sign's ``poly`` chain ``BASE.sgn1`` ... and a ``mul``. The choice is a row of the
    calibration table."""
    from planner.frontend.importers.onnx_model import node_label

    if im.opts.relu == "direct" or (im.opts.relu == "auto" and im.opts.degree is not None):
        y, _ = im.approximate(x, function, lambda v: np.where(v >= 0, v, slope * v), xs, im.opts.domain, base)
        return y
    measured = None
    if xs is not None and xs.size:
        measured = (float(np.min(xs)), float(np.max(xs)))
        domain = im.widen(*measured)
    else:
        domain = im.opts.domain
    try:
        c = choose(domain, xs, im.opts.relu, im.opts.max_error, im.opts.degree, slope)
    except ValueError as exc:
        raise im.fail(str(exc)) from None
    if c.ladder is None:
        y = im.emit("poly", [x.name], base, x.shape, coeffs=list(c.coeffs), basis="chebyshev",
                    domain=[float(domain[0]), float(domain[1])])
        label = function
    else:
        v = x
        for i, (coeffs, dom) in enumerate(c.polys(), start=1):
            v = im.emit("poly", [v.name], f"{base}.sgn{i}", x.shape, coeffs=coeffs, basis="chebyshev",
                        domain=[dom[0], dom[1]])
        y = im.emit("mul", [x.name, v.name], base, x.shape)
        label = f"{function} (composite {'-'.join(map(str, c.ladder.degrees))}, eps 2^-{c.ladder.alpha})"
    # the largest |value| of the function on the domain (its end points: the function is
    # piecewise linear through 0), for the import's useless-fit rule
    scale = max(abs(float(e)) if e >= 0 else abs(slope * float(e)) for e in domain)
    im.rows.append(ApproxRow(y.name, node_label(im.node), label, measured, domain, c.degree, c.depth,
                             c.max_error, False, scale=scale))
    return y


def _pool_shape(im: Any, x: Any) -> tuple[tuple[int, int], tuple[int, int], int, int]:
    """(kernel, strides, Ho, Wo) of a MaxPool / GlobalMaxPool on ``x`` [1, C, H, W]."""
    node = im.node
    h, w = int(x.shape[2]), int(x.shape[3])
    if node.op_type == "GlobalMaxPool":
        return (h, w), (1, 1), 1, 1
    from planner.frontend.importers.onnx_model import attr

    k = tuple(int(v) for v in attr(node, "kernel_shape"))
    s = tuple(int(v) for v in attr(node, "strides", [1, 1]))
    pads = [int(v) for v in attr(node, "pads", [0, 0, 0, 0])]
    if any(pads) or attr(node, "auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise im.fail(f"padding {pads} is not supported (max pooling pads with -infinity)", hint="use pads 0")
    if any(int(d) != 1 for d in attr(node, "dilations", [1, 1])):
        raise im.fail("dilations other than 1 are not supported", hint="use dilations 1")
    if len(k) != 2 or len(s) != 2 or min(*k, *s) < 1:
        raise im.fail(f"kernel_shape {list(k)} / strides {list(s)}: only 2-D pooling is supported")
    ho, wo = (h - k[0]) // s[0] + 1, (w - k[1]) // s[1] + 1
    if int(attr(node, "ceil_mode", 0)) and ((h - k[0]) % s[0] or (w - k[1]) % s[1]):
        raise im.fail("ceil_mode 1 with a partial last window is not supported", hint="use ceil_mode 0")
    if ho < 1 or wo < 1:
        raise im.fail(f"kernel {list(k)} is larger than the input {h}x{w}")
    return (k[0], k[1]), (s[0], s[1]), ho, wo


def emit_maxpool(im: Any) -> Any:
    """MaxPool / GlobalMaxPool on [1, C, H, W] without padding: the window's elements reduced
    pairwise by ``max(a, b) = b + relu(a - b)``. A pair of window elements is two depthwise
    ``conv2d`` nodes (kernels ``e_a - e_b`` and ``e_b``, the pooling's stride), later pairs a
    ``sub`` and an ``add``; each ReLU is chosen as for Relu (``--relu``), on the range of
    ``a - b`` measured on the samples. Depth: 1 + ceil(log2(k1 k2)) ReLUs."""

    x = im.dyn_inputs()[0]
    if not isinstance(x, Dyn) or len(x.shape) != 4 or x.shape[0] != 1:
        raise im.fail(f"{im.node.op_type} expects an encrypted [1, C, H, W] input")
    if len(im.node.output) > 1 and im.node.output[1]:
        raise im.fail("the Indices output is not supported")
    (k1, k2), (s1, s2), ho, wo = _pool_shape(im, x)
    c = int(x.shape[1])
    base = im.out_name()
    oshape = (1, c, ho, wo)
    xs = im.measured(im.node.input[0])

    def window(di: int, dj: int) -> Array | None:
        if xs is None:
            return None
        return np.asarray(xs[..., di:di + s1 * (ho - 1) + 1:s1, dj:dj + s2 * (wo - 1) + 1:s2])

    def conv(kernel: Array, name: str) -> Any:
        wn = im.weight(f"{base}.{name}", np.broadcast_to(kernel, (c, 1, k1, k2)))
        return im.emit("conv2d", [x.name, wn], f"{base}.{name}", oshape, stride=[s1, s2], padding=[0, 0],
                       groups=c)

    def onehot(i: int) -> Array:
        e = np.zeros((k1, k2))
        e[divmod(i, k2)] = 1.0
        return e

    # items: (window index or None, graph value or None, sample values)
    items: list[tuple[int | None, Any, Array | None]] = [(i, None, window(*divmod(i, k2))) for i in range(k1 * k2)]
    if len(items) == 1:
        return conv(onehot(0), "pick")
    step = 0
    while len(items) > 1:
        nxt: list[tuple[int | None, Any, Array | None]] = []
        for j in range(0, len(items) - 1, 2):
            (ia, va, xa), (ib, vb, xb) = items[j], items[j + 1]
            step += 1
            if ia is not None and ib is not None:
                diff = conv(onehot(ia) - onehot(ib), f"d{step}")
                vb = conv(onehot(ib), f"b{step}")
            else:
                if va is None:
                    va = conv(onehot(ia), f"a{step}")  # type: ignore[arg-type]
                if vb is None:
                    vb = conv(onehot(ib), f"b{step}")  # type: ignore[arg-type]
                diff = im.emit("sub", [va.name, vb.name], f"{base}.d{step}", oshape)
            xd = None if xa is None or xb is None else xa - xb
            r = emit_relu(im, diff, xd, "max (b + relu(a - b))", 0.0, f"{base}.r{step}")
            last = len(items) == 2
            m = im.emit("add", [vb.name, r.name], base if last else f"{base}.m{step}", oshape)
            nxt.append((None, m, None if xa is None or xb is None else np.maximum(xa, xb)))
        if len(items) % 2:
            nxt.append(items[-1])
        items = nxt
    return items[0][1]
