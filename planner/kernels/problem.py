"""The channel problem: matvec and conv2d as one slot-level linear map.

MetaKernel treats MVM and Conv uniformly (section 4.2, Ke2Col): a convolution is an MVM
over channels whose "elements" are channel blocks of ``lc`` slots, multiplied tap by tap
with aligned copies of the input (Eq. 16-19).  MVM is the special case of one tap and
``lc = 1``.  This module derives, from a node and its input layout, everything the
kernels need: channel counts per ciphertext part, the slot offset of each tap, the output
anchor of each slot of a channel block, tap validity (zero padding), and the weight
element multiplied at (output channel, input channel, tap).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from common.errors import SlotplanError
from planner.layout.channels import ChannelLayout, LayoutError, channels_per_ct


class KernelError(SlotplanError):
    """A kernel cannot implement this node with this layout."""


@dataclass(frozen=True)
class ChannelProblem:
    op: str  # "matvec" | "conv2d"
    x: str  # encrypted operand (tensor name)
    w: str  # weight tensor name
    w_shape: tuple[int, ...]
    in_layout: ChannelLayout
    out_layout: ChannelLayout
    n: int  # output channels (total)
    k: int  # input channels (total)
    groups: int
    taps: tuple[int, ...]  # slot offset of each tap relative to the output anchor
    tap_ij: tuple[tuple[int, int], ...]
    # conv geometry (1x1 grid, stride 1 for matvec)
    H: int = 1
    W: int = 1
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    anchor_c: tuple[int, int] = (0, 0)
    out_hw: tuple[int, int] = (1, 1)
    meta: dict[str, int] = field(default_factory=dict, compare=False)

    @property
    def slots(self) -> int:
        return self.in_layout.slots

    @property
    def lc(self) -> int:
        return self.in_layout.lc

    @property
    def cpc_in(self) -> int:
        return self.in_layout.cpc

    @property
    def cpc_out(self) -> int:
        return self.out_layout.cpc

    @property
    def p_in(self) -> int:
        return self.in_layout.n_ct

    @property
    def p_out(self) -> int:
        return self.out_layout.n_ct

    @property
    def T(self) -> int:
        return len(self.taps)

    # ------------------------------------------------------------------ anchors
    @cached_property
    def anchor_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each offset p in a channel block: output (ho, wo) anchored there (or -1),
        and valid[t, p]: tap t reads a real (not zero-padding) input element."""
        lc = self.lc
        ho_of = np.full(lc, -1, dtype=np.int64)
        wo_of = np.full(lc, -1, dtype=np.int64)
        Ho, Wo = self.out_hw
        ho, wo = np.meshgrid(np.arange(Ho), np.arange(Wo), indexing="ij")
        ol = self.out_layout
        p = ol.base + ho * ol.lh + wo * ol.lw
        ho_of[p.ravel()] = ho.ravel()
        wo_of[p.ravel()] = wo.ravel()
        valid = np.zeros((self.T, lc), dtype=bool)
        has = ho_of >= 0
        s1, s2 = self.stride
        p1, p2 = self.padding
        for t, (i, j) in enumerate(self.tap_ij):
            r = ho_of * s1 - p1 + i
            c = wo_of * s2 - p2 + j
            valid[t] = has & (r >= 0) & (r < self.H) & (c >= 0) & (c < self.W)
        return ho_of, wo_of, valid

    @cached_property
    def tap_used(self) -> np.ndarray:
        return np.asarray(self.anchor_tables[2].any(axis=1))

    def weight_index(self, co: np.ndarray, ci: np.ndarray, t: int) -> np.ndarray:
        """Flat index into the weight tensor of W(co, ci, tap t), -1 where structurally zero."""
        if self.op in ("matvec", "matmul-pt-ct"):  # W[co, ci] of an (n, k) matrix
            return np.where((co < self.n) & (ci < self.k), co * self.k + ci, -1)
        if self.op == "matmul-ct-pt":  # B[ci, co] of a (k, n) matrix
            return np.where((co < self.n) & (ci < self.k), ci * self.n + co, -1)
        cg = self.k // self.groups
        og = self.n // self.groups
        i, j = self.tap_ij[t]
        K1, K2 = self.w_shape[2], self.w_shape[3]
        ok = (co < self.n) & (ci < self.k) & (co // og == ci // cg)
        idx = ((co * cg + ci % cg) * K1 + i) * K2 + j
        return np.where(ok, idx, -1)

    def pair_nonzero(self, co: np.ndarray, ci: np.ndarray) -> np.ndarray:
        ok: np.ndarray = np.asarray((co < self.n) & (ci < self.k))
        if self.groups > 1:
            ok &= (co // (self.n // self.groups)) == (ci // (self.k // self.groups))
        return ok

    def part_channels(self, part: int, cpc: int, total: int) -> int:
        return max(0, min(cpc, total - part * cpc))


def slot_mod(x: np.ndarray, slots: int) -> np.ndarray:
    """``x mod slots`` for slot indices (negative shifts included), as a mask when ``slots``
    is a power of two (the plaintext tables' hot path)."""
    return x & (slots - 1) if slots & (slots - 1) == 0 else x % slots


def _conv_out(H: int, K: int, s: int, p: int) -> int:
    return (H + 2 * p - K) // s + 1


def conv_output_layout(
    lay: ChannelLayout, n_out: int, K: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int]
) -> tuple[ChannelLayout, tuple[int, int]]:
    """Output layout of a conv computed in place on the input grid, and the anchor taps (c1, c2).

    Output (ho, wo) is anchored at input-grid position (ho*s1 - p1 + c1, wo*s2 - p2 + c2)
    with c = min(p, K - 1); raises LayoutError when anchors leave the channel block.
    """
    K1, K2 = K
    s1, s2 = stride
    p1, p2 = padding
    c1, c2 = min(p1, K1 - 1), min(p2, K2 - 1)
    Ho, Wo = _conv_out(lay.height, K1, s1, p1), _conv_out(lay.width, K2, s2, p2)
    base = lay.base + (c1 - p1) * lay.lh + (c2 - p2) * lay.lw
    lh, lw = s1 * lay.lh, s2 * lay.lw
    lo = base
    hi = base + (Ho - 1) * lh + (Wo - 1) * lw
    if lo < 0 or hi >= lay.lc:
        raise LayoutError("conv output anchors leave the channel block (padding needs margins)")
    ho, wo = np.meshgrid(np.arange(Ho), np.arange(Wo), indexing="ij")
    anchors = base + ho * lh + wo * lw
    if np.unique(anchors).size != Ho * Wo:
        raise LayoutError("conv output anchors collide in this layout (padding needs margins)")
    cpc_out = channels_per_ct(n_out, lay.lc, lay.slots)
    out = ChannelLayout(
        shape=(n_out, Ho, Wo), channels=n_out, height=Ho, width=Wo, slots=lay.slots,
        cpc=cpc_out, lc=lay.lc, lh=lh, lw=lw, base=base, clean=True,
    )
    return out, (c1, c2)


def margin_layout(
    shape: tuple[int, int, int], slots: int, K: tuple[int, int], stride: tuple[int, int],
    padding: tuple[int, int],
) -> ChannelLayout:
    """Row-major layout whose channel blocks have zero margins so that every output anchor
    of an over-padded convolution (2p > K - 1) lands inside its channel block."""
    C, H, W = shape
    K1, K2 = K
    (s1, s2), (p1, p2) = stride, padding
    c1, c2 = min(p1, K1 - 1), min(p2, K2 - 1)
    Ho, Wo = _conv_out(H, K1, s1, p1), _conv_out(W, K2, s2, p2)
    mt, ml = max(0, p1 - c1), max(0, p2 - c2)
    mb = max(0, (Ho - 1) * s1 - p1 + c1 - (H - 1))
    mr = max(0, (Wo - 1) * s2 - p2 + c2 - (W - 1))
    lh = W + ml + mr
    lc = (H + mt + mb) * lh
    cpc = channels_per_ct(C, lc, slots)
    return ChannelLayout(
        shape=shape, channels=C, height=H, width=W, slots=slots, cpc=cpc, lc=lc, lh=lh, lw=1,
        base=mt * lh + ml,
    )


def matvec_problem(x: str, w: str, n: int, k: int, lay: ChannelLayout) -> ChannelProblem:
    if lay.height != 1 or lay.width != 1 or lay.lc != 1 or lay.base != 0 or lay.reps != 1:
        raise KernelError("matvec kernels take the vector contiguous (one element per slot)")
    cpc_out = min(n, lay.slots)
    out = ChannelLayout(
        shape=(n,), channels=n, height=1, width=1, slots=lay.slots, cpc=cpc_out, lc=1, lh=1, lw=1
    )
    return ChannelProblem(
        op="matvec", x=x, w=w, w_shape=(n, k), in_layout=lay, out_layout=out, n=n, k=k, groups=1,
        taps=(0,), tap_ij=((0, 0),),
    )


def conv_problem(
    x: str, w: str, w_shape: tuple[int, int, int, int], lay: ChannelLayout, stride: tuple[int, int],
    padding: tuple[int, int], groups: int,
) -> ChannelProblem:
    if lay.reps != 1:
        raise KernelError("conv kernels take one copy of the input")
    Co, _, K1, K2 = w_shape
    out, (c1, c2) = conv_output_layout(lay, Co, (K1, K2), stride, padding)
    tap_ij = tuple((i, j) for i in range(K1) for j in range(K2))
    taps = tuple((i - c1) * lay.lh + (j - c2) * lay.lw for i, j in tap_ij)
    return ChannelProblem(
        op="conv2d", x=x, w=w, w_shape=w_shape, in_layout=lay, out_layout=out, n=Co,
        k=lay.channels, groups=groups, taps=taps, tap_ij=tap_ij, H=lay.height, W=lay.width,
        stride=stride, padding=padding, anchor_c=(c1, c2), out_hw=(out.height, out.width),
    )


def matmul_problem(
    x: str, w: str, lay: ChannelLayout, n_out: int, out_shape: tuple[int, int], enc_left: bool
) -> ChannelProblem:
    """A matmul with one plaintext operand as a channel problem (a 1x1 convolution):
    enc_left (A enc (m,k) @ B pt (k,n)): channels are A's columns (column-major view),
    weights B[ci, co], output C column-major; otherwise (A pt (m,k) @ B enc (k,n)):
    channels are B's rows (row-major view), weights A[co, ci], output C row-major."""
    want = (1, 0) if enc_left else (0, 1)
    if lay.axes != want or lay.reps != 1 or lay.width != 1:
        raise KernelError(f"matmul needs the encrypted operand viewed with axes {want}")
    out, _ = conv_output_layout(lay, n_out, (1, 1), (1, 1), (0, 0))
    out = replace(out, shape=out_shape, axes=want)
    return ChannelProblem(
        op="matmul-ct-pt" if enc_left else "matmul-pt-ct", x=x, w=w, w_shape=(n_out, lay.channels, 1, 1),
        in_layout=lay, out_layout=out, n=n_out, k=lay.channels, groups=1, taps=(0,), tap_ij=((0, 0),),
        H=lay.height, W=1, out_hw=(out.height, 1),
    )


def square_dims(n: int, k: int) -> tuple[int, int]:
    """MetaKernel's shape-divisibility padding (sections 4.1, 4.2): returns padded (n, k)
    with one dividing the other.  Pads the shorter side to the next power of two when that
    divides the longer side (Conv1: C_in 3 -> 4), otherwise pads the longer side to a
    multiple of the shorter (MVM2: k 25088 -> 28672).  Both reproduce Table 8."""
    if n % k == 0 or k % n == 0:
        return n, k
    short, long_ = min(n, k), max(n, k)
    p2 = 1 << (short - 1).bit_length()
    if long_ % p2 == 0:
        short_p, long_p = p2, long_
    else:
        short_p, long_p = short, -(-long_ // short) * short
    return (long_p, short_p) if n >= k else (short_p, long_p)


def doubling_cost(m: int) -> int:
    """Rotations to form the sum of m shifted copies by doubling: floor(log2 m) + popcount(m) - 1.
    Never more than MetaKernel's gamma(m) (sum of bit positions + popcount - 1)."""
    if m <= 1:
        return 0
    return (m.bit_length() - 1) + bin(m).count("1") - 1
