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
