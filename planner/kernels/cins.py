"""NeuJeans convolutions on cins(l) registers (docs/cins.md, NeuJeans Sec. 3.3).

In CinS a conv2d is a matrix-vector product over channels (Remark 4): the C_out x C_in
"matrix" holds kernel polynomials, the "vector" the channel slices, and a product is the
slice-wise negacyclic convolution (one ``pmul``).  Slices of one ciphertext sit ``l``
slots apart, so the channel problem has channel stride ``l`` and one tap; every nonzero
cyclic slice diagonal ``d`` is one plaintext, rotations are by ``d * l``:

* ``cins-bsgs``: ``d = G*B + b``; babies ``b*l`` per input ciphertext (hoisted), plaintexts
  pre-rotated by ``-G*B`` slices, one giant rotation ``G*B*l`` per output ciphertext and
  giant.  C = C_in = C_out in one ciphertext: C pmul, ``2 sqrt(C) - 2`` rotations when C
  is a square (Table 1).
* ``cins-hs``: one rotation per diagonal and input ciphertext (``B = C``).
* ``cins-dw``: depthwise (groups = C): only diagonal 0 is nonzero: one pmul per
  ciphertext, no rotation (Sec. 3.3.5).  It is ``cins-bsgs`` on a grouped problem; the
  family exists so a user can allow it alone.

A stride-s conv either runs at stride 1 on the full grid and leaves its outputs every s
cells (``step = s``, the densify-first flow), or reads its input split into ``s^2``
polyphase sub-images (``phase = s``, NeuJeans Alg. 2): then it is a unit-stride conv of
``s^2 C_in`` sub-channels with sub-kernels, and its output is dense.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from planner.ir.builder import ProgramBuilder
from planner.kernels.base import Candidate
from planner.kernels.problem import KernelError
from planner.layout.channels import LayoutError
from planner.layout.cins import CinSLayout, cins_layout_for


def _conv_out(H: int, K: int, s: int, p: int) -> int:
    return (H + 2 * p - K) // s + 1


@dataclass(frozen=True)
class CinsConv:
    """One conv2d node on cins registers.  ``mode``: "direct" (stride at step s) or
    "decomposed" (polyphase input).  ``split``: baby range B ("hs": all babies)."""

    x: str
    w: str
    w_shape: tuple[int, int, int, int]
    in_hw: tuple[int, int]
    stride: int
    padding: tuple[int, int]
    groups: int
    in_layout: CinSLayout
    out_layout: CinSLayout
    kind: str = "bsgs"  # "bsgs" | "hs"
    # the kernel computes conv / scale (a power of two folded into its plaintexts: a layer
    # that bootstraps its result keeps every coefficient within boot.max_abs)
    scale: int = 1

    # ------------------------------------------------------------------ geometry
    @property
    def phase(self) -> int:
        return self.in_layout.phase

    @property
    def l(self) -> int:  # noqa: E743
        return self.in_layout.l

    @property
    def slices(self) -> int:
        return self.in_layout.slices

    @cached_property
    def class_taps(self) -> list[list[tuple[int, int, int]]]:
        """Per polyphase class (u, v) (index u*s + v): the taps (e, i, j) it carries, e the
        slice offset an output reads (input position = output position + e)."""
        _, _, K1, K2 = self.w_shape
        p1, p2 = self.padding
        s = self.phase
        w = self.in_layout.w
        out: list[list[tuple[int, int, int]]] = [[] for _ in range(s * s)]
        for i in range(K1):
            for j in range(K2):
                r, c = i - p1, j - p2
                u, v = r % s, c % s
                dh, dw = (r - u) // s, (c - v) // s
                out[u * s + v].append((dh * w + dw, i, j))
        return out

    def pair_nonzero(self, o: np.ndarray, g: np.ndarray) -> np.ndarray:
        Co, Cg = self.w_shape[0], self.w_shape[1]
        C_in = Cg * self.groups
        c = g // (self.phase * self.phase)
        ok = (o < Co) & (c < C_in)
        if self.groups > 1:
            ok &= (o // (Co // self.groups)) == (c // Cg)
        return np.asarray(ok)

    @cached_property
    def diagonals(self) -> dict[tuple[int, int], list[int]]:
        """(output ct, input ct) -> the nonzero cyclic slice diagonals d."""
        lin, lout = self.in_layout, self.out_layout
        C = self.slices
        out: dict[tuple[int, int], list[int]] = {}
        so = np.arange(lout.cpc)
        si = np.arange(lin.cpc)
        for oq in range(lout.n_ct):
            for iq in range(lin.n_ct):
                o = oq * lout.cpc + so[:, None]
                g = iq * lin.cpc + si[None, :]
                ok = self.pair_nonzero(o, g) & (g < lin.channels) & (o < lout.channels)
                d = ((si[None, :] - so[:, None]) % C)[ok]
                ds = sorted(set(d.tolist()))
                if ds:
                    out[(oq, iq)] = ds
        return out

    def _counts(self, B: int) -> int:
        babies: dict[int, set[int]] = {}
        giants: dict[int, set[int]] = {}
        for (oq, iq), ds in self.diagonals.items():
            babies.setdefault(iq, set()).update(d % B for d in ds)
            giants.setdefault(oq, set()).update(d - d % B for d in ds)
        return sum(len(v - {0}) for v in babies.values()) + sum(len(v - {0}) for v in giants.values())

    @cached_property
    def B(self) -> int:
        C = self.slices
        if self.kind == "hs":
            return C
        return min(range(1, C + 1), key=lambda b: (self._counts(b), b))

    # ------------------------------------------------------------------ plaintexts
    def plaintext_table(self, oq: int, iq: int, d: int, G: int) -> tuple[np.ndarray, np.ndarray]:
        """Slice t of the plaintext of diagonal d pre-rotated by G slices holds the kernel
        polynomial of (output slice t - G, input slice t - G + d): tap offset e sits at
        coefficient (-e) mod 2l with sign -1 when e > 0 (Y^-e = -Y^(2l-e))."""
        lin, lout = self.in_layout, self.out_layout
        C, L = self.slices, 2 * self.l
        N = 2 * lin.slots
        _, Cg, K1, K2 = self.w_shape
        s2 = self.phase * self.phase
        idx = np.full(N, -1, dtype=np.int64)
        coef = np.zeros(N)
        so = np.arange(lout.cpc)
        si = (so + d) % C
        o = oq * lout.cpc + so
        g = iq * lin.cpc + si
        ok = (si < lin.cpc) & (g < lin.channels) & (o < lout.channels) & self.pair_nonzero(o, g)
        t = (so + G) % C
        for o_, g_, t_ in zip(o[ok].tolist(), g[ok].tolist(), t[ok].tolist(), strict=True):
            c = g_ // s2
            for e, i, j in self.class_taps[g_ % s2]:
                pos = (-e) % L
                idx[t_ * L + pos] = ((o_ * Cg + c % Cg) * K1 + i) * K2 + j
                coef[t_ * L + pos] = (-1.0 if e > 0 else 1.0) / self.scale
        return idx, coef

    def _gen(self, oq: int, iq: int, d: int, G: int) -> Callable[[], tuple[np.ndarray, np.ndarray]]:
        def gen() -> tuple[np.ndarray, np.ndarray]:
            return self.plaintext_table(oq, iq, d, G)

        return gen

    # ------------------------------------------------------------------ lowering
    def lower(self, b: ProgramBuilder, regs: dict[str, list[str]], node: str) -> list[str]:
        lin, lout = self.in_layout, self.out_layout
        l, B = self.l, self.B  # noqa: E741
        xs = regs[self.x]
        babies: dict[int, dict[int, str]] = {}
        for iq in range(lin.n_ct):
            used = sorted({d % B for (oq, iq2), ds in self.diagonals.items() if iq2 == iq for d in ds})
            if used:
                babies[iq] = b.rot_many(xs[iq], [bb * l for bb in used])
        outs = []
        for oq in range(lout.n_ct):
            by_giant: dict[int, list[tuple[int, int]]] = {}
            for iq in range(lin.n_ct):
                for d in self.diagonals.get((oq, iq), []):
                    by_giant.setdefault(d - d % B, []).append((iq, d))
            if not by_giant:
                outs.append(self._zero(b, xs[0], node, oq))
                continue
            total: str | None = None
            for G, terms in sorted(by_giant.items()):
                acc: str | None = None
                for iq, d in terms:
                    table = f"pt/{node}/cins/o{oq}i{iq}/d{d}"
                    pt = b.plaintext(self.w, table, self._gen(oq, iq, d, G), l=l)
                    acc = b.accumulate(acc, b.pmul(babies[iq][(d % B) * l], pt))
                assert acc is not None
                total = b.accumulate(total, b.rot(b.rescale(acc), G * l))
            assert total is not None
            outs.append(total)
        return outs

    def _zero(self, b: ProgramBuilder, src: str, node: str, oq: int) -> str:
        N = 2 * self.in_layout.slots

        def gen() -> tuple[np.ndarray, np.ndarray]:
            return np.full(N, -1, dtype=np.int64), np.zeros(N)

        pt = b.plaintext("const", f"pt/{node}/cins/zero{oq}", gen, l=self.l)
        return b.rescale(b.pmul(src, pt))

    def candidate(self, node: str, kernel: str) -> Candidate:
        params: dict[str, object] = {
            "l": self.l, "w": self.in_layout.w, "C": self.slices, "B": self.B,
            "P_I": self.in_layout.n_ct, "P_O": self.out_layout.n_ct,
            "diagonals": sum(len(v) for v in self.diagonals.values()),
        }
        if self.phase > 1:
            params["decomposed"] = self.phase
        return Candidate(
            node=node, kernel=kernel, params=params,
            in_layouts={self.x: self.in_layout.with_clean(True)},
            out_layout=self.out_layout.with_clean(False),
            lower=lambda b, regs: self.lower(b, regs, node),
            slot_utilization=self.out_layout.size / (self.out_layout.n_ct * self.out_layout.N),
            source=self,
        )


def cins_conv(
    x: str, w: str, x_shape: tuple[int, int, int], w_shape: tuple[int, int, int, int], slots: int,
    stride: int = 1, padding: tuple[int, int] = (0, 0), groups: int = 1, decomposed: bool = False,
    kind: str = "bsgs", l: int | None = None,  # noqa: E741
) -> CinsConv:
    """The CinS conv of a node: input and output layouts sized so that no negacyclic wrap
    reaches a valid output (``planner.layout.cins.cins_layout_for``)."""
    C_in, H, W = x_shape
    Co, Cg, K1, K2 = w_shape
    if Cg * groups != C_in or Co % groups:
        raise KernelError(f"cins: weights {w_shape} with groups={groups} do not fit {C_in} input channels")
    p1, p2 = padding
    s = stride
    Ho, Wo = _conv_out(H, K1, s, p1), _conv_out(W, K2, s, p2)
    if Ho < 1 or Wo < 1:
        raise KernelError("cins: the kernel is larger than the padded input")
    phase = s if decomposed else 1
    if decomposed and s == 1:
        raise KernelError("cins: decomposition is for strided convolutions")
    # reach of the taps in the slice grid
    dhs = [(i - p1 - (i - p1) % phase) // phase for i in range(K1)]
    dws = [(j - p2 - (j - p2) % phase) // phase for j in range(K2)]
    reach = (max(0, -min(dhs)), max(0, max(dhs)), max(0, -min(dws)), max(0, max(dws)))
    if decomposed:
        out_hw = (Ho, Wo)
        step = 1
    else:
        out_hw = ((Ho - 1) * s + 1, (Wo - 1) * s + 1)
        step = s
    try:
        lin = cins_layout_for(x_shape, slots, reach, phase, out_hw, l)
        lout = CinSLayout(
            shape=(Co, Ho, Wo), channels=Co, height=Ho, width=Wo, l=lin.l, w=lin.w, slots=slots,
            cpc=min(Co, lin.slices), step=step,
        )
    except LayoutError as e:
        raise KernelError(str(e)) from e
    return CinsConv(x, w, w_shape, (H, W), s, padding, groups, lin, lout, kind)
