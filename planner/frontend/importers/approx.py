"""Polynomial approximations of the non-polynomial functions an imported model uses.

Every function is fitted in the Chebyshev basis on a domain ``[a, b]`` (graph op ``poly``
with ``basis: "chebyshev"``, SPEC section 2): ``p(x) = sum_i c_i T_i((2x - a - b) / (b - a))``,
by interpolation at the Chebyshev points of the first kind (near-minimax, and the
coefficients stay small: monomial coefficients of a high-degree fit are numerically
useless in CKKS).

The degree is either given (``--degree D``) or chosen per function as the smallest of
``DEGREES`` (each the largest degree of its depth: ``2**k - 1`` costs ``k`` levels) whose
largest error on the recorded samples is at most ``max_error``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numpy.polynomial import chebyshev as C

from planner.frontend.reference import chebyshev

__all__ = [
    "DEFAULT_DEGREE",
    "DEFAULT_DOMAIN",
    "DEGREES",
    "FUNCTIONS",
    "Fit",
    "chebyshev_eval",
    "fit",
    "gelu",
    "minimax",
    "poly_depth",
]

Array = npt.NDArray[np.float64]

# Without calibration: every approximated activation's input is assumed in this domain,
# fitted with this degree (depth 4); with calibration the measured range (widened) is used.
DEFAULT_DOMAIN: tuple[float, float] = (-8.0, 8.0)
DEFAULT_DEGREE = 15
# Degrees tried when the degree is chosen for a stated error (the largest of each depth).
DEGREES: tuple[int, ...] = (1, 3, 7, 15, 31, 63, 127)
MAX_DEGREE = 127
DEFAULT_MAX_ERROR = 1e-3


def _erf(x: Array) -> Array:
    return np.asarray(np.vectorize(math.erf, otypes=[np.float64])(x), dtype=np.float64)


def gelu(x: Array) -> Array:
    """GELU, exact form ``x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))``."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def gelu_tanh(x: Array) -> Array:
    """GELU, tanh form (``approximate="tanh"`` of ONNX Gelu)."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _sigmoid(x: Array) -> Array:
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * x)), dtype=np.float64)


FUNCTIONS: dict[str, Callable[[Array], Array]] = {
    "relu": lambda x: np.maximum(x, 0.0),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "gelu": gelu,
    "gelu_tanh": gelu_tanh,
    "silu": lambda x: x * _sigmoid(x),
    "erf": _erf,
    "exp": np.exp,
    "sqrt": np.sqrt,
    "reciprocal": lambda x: 1.0 / x,
    "invsqrt": lambda x: 1.0 / np.sqrt(x),
}


def poly_depth(degree: int) -> int:
    """Levels a degree-``degree`` polynomial costs: ceil(log2(d + 1)) (SPEC section 2)."""
    return math.ceil(math.log2(degree + 1)) if degree > 0 else 0


def chebyshev_eval(x: Array, coeffs: Sequence[float], domain: tuple[float, float]) -> Array:
    """``sum_i coeffs[i] T_i((2x - a - b) / (b - a))``: the graph's own definition."""
    return chebyshev(x, coeffs, domain)


@dataclass(frozen=True)
class Fit:
    """One fitted polynomial on ``domain`` (Chebyshev coefficients) and its largest error:
    on the calibration samples (``on_samples``), else on a grid of 2001 points of the domain."""

    coeffs: tuple[float, ...]
    domain: tuple[float, float]
    degree: int
    max_error: float
    on_samples: bool

    @property
    def depth(self) -> int:
        return poly_depth(self.degree)

    def __call__(self, x: Array) -> Array:
        return chebyshev_eval(x, self.coeffs, self.domain)


def _interpolate(g: Callable[[Array], Array], degree: int, domain: tuple[float, float]) -> tuple[float, ...]:
    a, b = domain
    k = np.arange(degree + 1, dtype=np.float64)
    t = np.cos(np.pi * (k + 0.5) / (degree + 1))  # Chebyshev points of the first kind
    x = 0.5 * (b - a) * t + 0.5 * (a + b)
    y = np.asarray(g(x), dtype=np.float64)
    coeffs = C.chebfit(t, y, degree)
    return tuple(float(c) for c in coeffs)


# The minimax fit (Remez exchange) of a continuous function with kinks: the grid its error is
# searched on (Chebyshev-Lobatto points of the domain, plus points clustered geometrically on
# either side of each kink, where the error of a fit peaks), the iterations allowed and the
# stopping rule (the reference's error levels within this fraction of the largest error).
REMEZ_GRID = 8001
REMEZ_KINK_POINTS = 400
REMEZ_ITERS = 60
REMEZ_TOL = 1e-6


def _remez_grid(kinks_t: Sequence[float]) -> Array:
    t = np.cos(np.pi * np.arange(REMEZ_GRID) / (REMEZ_GRID - 1))[::-1]
    parts = [t, np.array([-1.0, 1.0])]
    for k in kinks_t:
        if -1.0 < k < 1.0:
            d = np.geomspace(1e-9, 2.0, REMEZ_KINK_POINTS)
            parts += [np.array([k]), k - d, k + d]
    g = np.concatenate(parts)
    return np.unique(g[(g >= -1.0) & (g <= 1.0)])


def _alternating(e: Array, want: int) -> list[int] | None:
    """Indices of ``want`` alternating extrema of ``e`` (the largest of each run of one sign,
    the weakest adjacent pairs and ends dropped), or None when there are fewer."""
    s = np.sign(e)
    s[s == 0] = 1
    cuts = np.flatnonzero(np.diff(s)) + 1
    ext = [int(seg[np.argmax(np.abs(e[seg]))]) for seg in np.split(np.arange(len(e)), cuts)]
    if len(ext) < want:
        return None
    while len(ext) > want:
        if len(ext) - want == 1:
            ext = ext[1:] if abs(e[ext[0]]) < abs(e[ext[-1]]) else ext[:-1]
        else:
            pair = [min(abs(e[ext[i]]), abs(e[ext[i + 1]])) for i in range(len(ext) - 1)]
            i = int(np.argmin(pair))
            if i == 0 and abs(e[ext[0]]) < abs(e[ext[1]]):
                ext = ext[1:]
            elif i == len(ext) - 2 and abs(e[ext[-1]]) < abs(e[ext[-2]]):
                ext = ext[:-1]
            else:
                ext = ext[:i] + ext[i + 2:]
    return ext


def minimax(g: Callable[[Array], Array], degree: int, domain: tuple[float, float],
            kinks: Sequence[float] = ()) -> tuple[float, ...]:
    """The Chebyshev coefficients (on ``domain``) of the degree-``degree`` polynomial of least
    largest error to ``g`` on ``domain``, by the Remez exchange algorithm on a grid that is dense
    near ``kinks`` (points of ``domain`` where ``g`` is not smooth). ``g`` must be continuous.
    Starts from the interpolant at the Chebyshev points and returns whichever of the iterates
    (the interpolant included) has the least largest error on the grid."""
    a, b = domain
    start = _interpolate(g, degree, domain)
    if degree < 1:
        return start
    t = _remez_grid([(2.0 * k - a - b) / (b - a) for k in kinks])
    x = 0.5 * (b - a) * t + 0.5 * (a + b)
    f = np.asarray(g(x), dtype=np.float64)
    v = C.chebvander(t, degree)
    best = np.asarray(start)
    best_err = float(np.max(np.abs(v @ best - f)))
    want = degree + 2
    # the first reference: the extrema of T_(degree+1) (the interpolant's error may alternate
    # fewer times near a kink), then the grid points nearest them
    ext_t = np.cos(np.pi * np.arange(want) / (want - 1))[::-1]
    first = sorted(set(int(i) for i in np.searchsorted(t, ext_t).clip(0, len(t) - 1)))
    ref = first if len(first) == want else _alternating(v @ best - f, want)
    sign = (-1.0) ** np.arange(want)
    for _ in range(REMEZ_ITERS):
        if ref is None:
            break
        try:
            sol = np.linalg.solve(np.concatenate([v[ref], sign[:, None]], axis=1), f[ref])
        except np.linalg.LinAlgError:
            break
        c = sol[:-1]
        e = v @ c - f
        err = float(np.max(np.abs(e)))
        if err < best_err:
            best, best_err = c, err
        if err - abs(float(sol[-1])) <= REMEZ_TOL * err:
            break
        ref = _alternating(e, want)
    return tuple(float(c) for c in best)


def fit(
    g: Callable[[Array], Array],
    domain: tuple[float, float],
    *,
    degree: int | None,
    samples: Array | None,
    max_error: float | None = None,
) -> Fit:
    """Fit ``g`` on ``domain``: with ``degree`` given, that degree; else the smallest degree of
    ``DEGREES`` whose largest error on ``samples`` (or on a dense grid of the domain when there
    are none) is at most ``max_error``, the largest of ``DEGREES`` when none reaches it."""
    a, b = domain
    if not (math.isfinite(a) and math.isfinite(b) and a < b):
        raise ValueError(f"domain must be finite with a < b, got [{a}, {b}]")
    on_samples = samples is not None and samples.size > 0
    check = np.ravel(samples) if samples is not None and on_samples else np.linspace(a, b, 2001)
    exact = np.asarray(g(check), dtype=np.float64)

    def error_of(coeffs: tuple[float, ...]) -> float:
        return float(np.max(np.abs(chebyshev_eval(check, coeffs, domain) - exact)))

    if degree is not None:
        coeffs = _interpolate(g, degree, domain)
        return Fit(coeffs, domain, degree, error_of(coeffs), on_samples)
    target = DEFAULT_MAX_ERROR if max_error is None else max_error
    best: tuple[float, ...] = ()
    for d in DEGREES:
        best = _interpolate(g, d, domain)
        if error_of(best) <= target:
            return Fit(best, domain, d, error_of(best), on_samples)
    return Fit(best, domain, DEGREES[-1], error_of(best), on_samples)
