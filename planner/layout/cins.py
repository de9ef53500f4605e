"""Channel-in-slot (CinS) registers and layouts (NeuJeans, shared/papers/neujeans-*.txt).

A ``cins(l)`` register's *value* is its real local-coefficient vector ``m`` of length
``N = 2 * slots``: ``C = slots / l`` slices ``m_i`` of ``2l`` reals each (NeuJeans'
real CinS encoding, Sec. 3.3.1).  Its operations (docs/cins.md):

* product with a ``cins(l)`` plaintext: slice-wise negacyclic convolution
  ``dst_i = src_i * pt_i`` in ``R[Y] / (Y^(2l) + 1)`` (Thm 4, Eq. 7);
* rotation by ``k`` (a multiple of ``l``): the slice sequence rotated left by ``k / l``
  (Sec. 3.2.2);
* ``bootstrap_cins``: the ring polynomial's coefficients (``a_(C j + k) = m_(rev_C k)[j]``,
  Thm 3) returned as two slot registers in Lattigo's CoeffsToSlots order (bit-reversed):
  ``re[i l + r] = m_i[rev_l(r)]``, ``im[i l + r] = m_i[l + rev_l(r)]``
  (:func:`pair_positions`); ``to_cins`` is its inverse.

The Lattigo executor holds the ciphertext ``<S_(l<-1) P_l fold(m)>_slot``: slot ``i l + j``
holds ``m_i(w^(5^j))`` with ``w = exp(2 pi i / (4 l))`` (:func:`cins_slot_vector`), so these
meanings are exactly what slot-wise products, slot rotations and Lattigo's C2S do.

:class:`CinSLayout` places a (C, H, W) tensor: element ``(c, h, x)`` (polyphase factor
``s``: sub-channel ``g = c s^2 + (h mod s) s + (x mod s)`` at ``(h div s, x div s)``) at local
coefficient ``(g mod cpc) * 2l + (hh * step) * w + xx * step`` of ciphertext ``g div cpc``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache

import numpy as np

from planner.layout.channels import LayoutError, MappedLayout


def _log2(n: int) -> int:
    if n < 1 or n & (n - 1):
        raise LayoutError(f"{n} is not a power of two")
    return n.bit_length() - 1


@lru_cache(maxsize=64)
def bitrev(n: int) -> np.ndarray:
    """rev_n(j) for j < n (n a power of two)."""
    bits = _log2(n)
    j = np.arange(n, dtype=np.int64)
    r = np.zeros(n, dtype=np.int64)
    for b in range(bits):
        r |= ((j >> b) & 1) << (bits - 1 - b)
    r.setflags(write=False)
    return r


@lru_cache(maxsize=64)
def pair_positions(l: int, slots: int) -> tuple[np.ndarray, np.ndarray]:  # noqa: E741
    """(re_pos, im_pos): local-coefficient position held by slot s of the Re / Im register
    of a ``cins(l)`` value (Lattigo's bit-reversed CoeffsToSlots order)."""
    if slots % l:
        raise LayoutError(f"l={l} does not divide {slots} slots")
    s = np.arange(slots, dtype=np.int64)
    i, r = s // l, s % l
    rv = bitrev(l)[r]
    re = i * 2 * l + rv
    im = re + l
    re.setflags(write=False)
    im.setflags(write=False)
    return re, im


def ring_coefficients(m: np.ndarray, l: int) -> np.ndarray:  # noqa: E741
    """The ring polynomial's coefficients ``a`` of a ``cins(l)`` value (Thm 3):
    ``a[C j + k] = m_(rev_C k)[j]``."""
    N = m.size
    C = N // (2 * l)
    sl = m.reshape(C, 2 * l)[bitrev(C)]  # row k = slice rev_C(k)
    return np.ascontiguousarray(sl.T).reshape(N)


def bootstrap_cins(m: np.ndarray, l: int) -> tuple[np.ndarray, np.ndarray]:  # noqa: E741
    re, im = pair_positions(l, m.size // 2)
    return m[re].copy(), m[im].copy()


def to_cins(re: np.ndarray, im: np.ndarray, l: int) -> np.ndarray:  # noqa: E741
    pr, pi = pair_positions(l, re.size)
    m = np.zeros(2 * re.size)
    m[pr] = re
    m[pi] = im
    return m


def negacyclic(x: np.ndarray, y: np.ndarray, l: int) -> np.ndarray:  # noqa: E741
    """Slice-wise negacyclic products of two length-N vectors (slices of 2l)."""
    L = 2 * l
    a = x.reshape(-1, L)
    b = y.reshape(-1, L)
    psi = np.exp(1j * np.pi * np.arange(L) / L)
    fa = np.fft.fft(a * psi, axis=1)
    fb = np.fft.fft(b * psi, axis=1)
    out = np.fft.ifft(fa * fb, axis=1) * np.conj(psi)
    return np.asarray(out.real.reshape(-1))


def rotate_slices(x: np.ndarray, k: int, l: int) -> np.ndarray:  # noqa: E741
    """Slot rotation by k (a multiple of l) of a cins(l) value: slices rotated left k/l."""
    if k % l:
        raise ValueError(f"rotation {k} of a cins(l={l}) register is not a multiple of l")
    return np.roll(x.reshape(-1, 2 * l), -(k // l), axis=0).reshape(-1)


def cins_slot_vector(m: np.ndarray, l: int) -> np.ndarray:  # noqa: E741
    """Complex slots of ``<m>_CinS``: slot ``i l + j`` = ``m_i(w^(5^j))``, ``w = e^(2 pi i/(4l))``
    (what the Lattigo executor encodes for a cins plaintext or input)."""
    L = 2 * l
    sl = m.reshape(-1, L)
    e = np.array([pow(5, j, 4 * l) for j in range(l)], dtype=np.int64)
    # powers (5^j * k) mod 4l of w
    ex = (e[:, None] * np.arange(L)[None, :]) % (4 * l)
    V = np.exp(2j * np.pi * ex / (4 * l))  # l x 2l
    return np.asarray((sl @ V.T).reshape(-1))


# ---------------------------------------------------------------------- the layout


@dataclass(frozen=True)
class CinSLayout:
    """A (C, H, W) tensor in ``cins(l)`` registers (module docstring).  ``channels``,
    ``height`` and ``width`` are those of the slice grid (after the polyphase split
    ``phase``); ``step`` spaces the cells (a strided conv computed at stride 1)."""

    shape: tuple[int, ...]
    channels: int
    height: int
    width: int
    l: int  # noqa: E741
    w: int  # row stride inside a slice
    slots: int
    cpc: int  # slices used per ciphertext
    phase: int = 1
    step: int = 1
    clean: bool = True

    domain = "cins"

    def __post_init__(self) -> None:
        _log2(self.l)
        if self.slots % self.l or self.l >= self.slots * 2:
            raise LayoutError(f"cins: l={self.l} must divide {self.slots} slots")
        if not 1 <= self.cpc <= self.slots // self.l:
            raise LayoutError(f"cins: {self.cpc} slices per ciphertext, at most {self.slots // self.l}")
        if self.w < 1 or (2 * self.l) % self.w:
            raise LayoutError(f"cins: row stride {self.w} must divide the slice length {2 * self.l}")
        if (self.width - 1) * self.step + 1 > self.w or (self.height - 1) * self.step + 1 > self.rows:
            raise LayoutError(
                f"cins: a {self.height}x{self.width} grid (step {self.step}) does not fit a "
                f"{self.rows}x{self.w} slice"
            )

    @property
    def N(self) -> int:
        return 2 * self.slots

    @property
    def rows(self) -> int:
        return 2 * self.l // self.w

    @property
    def slices(self) -> int:
        """Slices per ciphertext (C of NeuJeans)."""
        return self.slots // self.l

    @property
    def n_ct(self) -> int:
        return -(-self.channels // self.cpc)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def with_clean(self, clean: bool) -> CinSLayout:
        return replace(self, clean=clean)

    def notation(self) -> str:
        parts = [f"cins(l={self.l},w={self.w})"]
        if self.n_ct > 1:
            parts.append(f"ct[c/{self.cpc}:{self.n_ct}]")
        d = f"[c:{min(self.cpc, self.channels)}][h:{self.height}][w:{self.width}]"
        if self.phase > 1:
            d = f"poly{self.phase}" + d
        if self.step > 1:
            d += f"/step{self.step}"
        s = ";".join(parts + [d])
        return s if self.clean else s + "~"

    # ------------------------------------------------------------------ tables
    def position(self, g: np.ndarray, hh: np.ndarray, xx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ciphertext, local-coefficient position) of sub-channel g at grid cell (hh, xx)."""
        q = g // self.cpc
        return q, (g % self.cpc) * 2 * self.l + hh * self.step * self.w + xx * self.step

    @cached_property
    def _maps(self) -> np.ndarray:
        C0, H0, W0 = self.shape if len(self.shape) == 3 else (self.size, 1, 1)
        s = self.phase
        c, h, x = np.meshgrid(np.arange(C0), np.arange(H0), np.arange(W0), indexing="ij")
        flat = (c * H0 * W0 + h * W0 + x).ravel()
        g = (c * s * s + (h % s) * s + (x % s)).ravel()
        q, pos = self.position(g, (h // s).ravel(), (x // s).ravel())
        maps = np.full((self.n_ct, self.N), -1, dtype=np.int64)
        if np.any(maps[q, pos] >= 0):  # pragma: no cover - positions are distinct by construction
            raise LayoutError("two elements share a coefficient")
        maps[q, pos] = flat
        maps.setflags(write=False)
        return maps

    def index_map(self, ct: int) -> np.ndarray:
        """idx[p] = flat element index at local coefficient p of ciphertext ct, or -1
        (length N = 2 * slots)."""
        return self._maps[ct]

    def pair_layout(self) -> MappedLayout:
        """The slot layout of the Re/Im pair ``bootstrap_cins`` returns (ciphertexts
        re_0, im_0, re_1, im_1, ...), the layout ``to_cins`` consumes."""
        re, im = pair_positions(self.l, self.slots)
        maps = np.empty((2 * self.n_ct, self.slots), dtype=np.int64)
        for q in range(self.n_ct):
            m = self.index_map(q)
            maps[2 * q] = m[re]
            maps[2 * q + 1] = m[im]
        return MappedLayout.of(self.shape, maps, self.clean, f"cins-pair(l={self.l})")


def cins_layout_for(
    shape: tuple[int, int, int], slots: int, reach: tuple[int, int, int, int] = (0, 0, 0, 0),
    phase: int = 1, out_hw: tuple[int, int] | None = None, l: int | None = None,  # noqa: E741
) -> CinSLayout:
    """The smallest CinS layout of a (C, H, W) tensor (polyphase ``phase``) whose slices
    leave room for a convolution reading ``reach = (up, down, left, right)`` cells around
    every output and writing ``out_hw`` cells (default: the grid): row stride
    ``w >= max(Wo + right, W - left)`` (a power of two), rows likewise, so the flattened
    negacyclic product never wraps real data into an output (docs/cins.md)."""
    C0, H0, W0 = shape
    s = phase
    Hs, Ws = -(-H0 // s), -(-W0 // s)
    Ho, Wo = out_hw if out_hw is not None else (Hs, Ws)
    up, down, left, right = reach
    need_w = max(Wo + right, Ws + left, Ws, Wo)
    need_h = max(Ho + down, Hs + up, Hs, Ho)
    w = 1 << max(0, math.ceil(math.log2(need_w)))
    rows = 1 << max(0, math.ceil(math.log2(need_h)))
    if l is None:
        l = max(1, (w * rows) // 2)  # noqa: E741
        if w * rows < 2:
            l = 1  # noqa: E741
    if 2 * l < w * rows:
        raise LayoutError(f"cins: slices of {2 * l} cannot hold {rows}x{w} cells")
    if l > slots:
        raise LayoutError(f"cins: a {rows}x{w} slice needs l={l} > {slots} slots")
    channels = C0 * s * s
    cpc = min(channels, slots // l)
    return CinSLayout(
        shape=shape, channels=channels, height=Hs, width=Ws, l=l, w=w, slots=slots, cpc=cpc, phase=s,
    )
