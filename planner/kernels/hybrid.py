"""Hybrid diagonal matrix-vector product (GAZELLE, Juvekar et al. 2018), row-interleaved,
with baby-step giant-step: the fewest plaintext multiplications a dense matvec can have.

For ``y = W x`` with W (n, k) and S slots: ``kp = 2^ceil(log2 k)`` (the input period),
``n' = 2^ceil(log2 n)``, ``f = min(S / n', kp)`` slots per row and ``D = kp / f`` diagonals.
The input is x repeated with period kp (``xr[s] = x[s mod kp]``, zeros at ``s mod kp >= k``;
the client packs it, or ``log2(S / kp)`` rotate-and-adds replicate a clean x). Row rho
owns the f slots ``rho*f .. rho*f + f - 1``; diagonal ``t < D`` is

    pt_t[s] = W[s // f, (s + f t) mod kp]          (0 where the row or column is absent)

so that slot ``rho*f + j`` accumulates row rho over the columns ``rho*f + j + f t``
(``t < D``): the f slots of a row see every column once, and ``log2 f`` rotate-and-adds
(offsets f/2, ..., 1) sum them into slot ``rho*f``. The output is y with stride f
(``lc = f``), dirty in the other slots when f > 1 (partial sums): a graph output pays the
mask. ``D = n' * kp / S`` products: ``n*k/S`` for powers of two, against the
``max(n, k)`` of a square embedding (2x fewer for a square matrix in 2x the slots, 8x
for 512x512 in 4096 slots). Wide matrices are GAZELLE's case (f = S / n'), tall ones
need no fold (f = 1 when n' = S).

The D diagonal rotations (offsets ``f t``) use baby-step giant-step: ``t = n1 * a + b``,
baby rotations ``f b`` of the input (one hoisted group), plaintexts pre-rotated by the
giant offset ``-f n1 a``, one giant rotation per ``a`` after accumulating (the shape the
Lattigo executor fuses into one double-hoisted block, ``backends/lattigo/fused.go``).

Complex packing (``complex_pack``, the ``hybrid-complex`` family, docs/formats.md): CKKS
slots are complex, so two real inputs share a slot and the diagonals halve. With the pair
period ``q = kp / 2``, ``z = xr + i * rot(xr, q)`` holds ``z[s] = x_u + i x_(u+q)`` for
``u = s mod kp < q`` and the same pair swapped (``x_u + i x_(u-q)``, "twisted") for
``u >= q``. The hybrid above runs on z with kp replaced by q: ``f' = min(S / n', q)``,
``D' = q / f'``; diagonal t reads slot ``c = (s + f' t) mod kp``, pair ``c0 = c mod q``,
and with ``a = W[row, c0]``, ``b = W[row, c0 + q]`` its plaintext is ``(a - i b) / 2``
(``(b - i a) / 2`` where c is twisted), so that ``Re(pt * z) = (a x_c0 + b x_(c0+q)) / 2``.
Same BSGS and fold on the complex accumulator w; the result is ``w + conj(w) = 2 Re(w)``,
exactly real. Extra work: one rotation by q, one ``mul_i``, two adds, one ``conj`` (a key
switch with the conjugation key); same depth and output layout (stride f').
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from planner.ir.builder import ProgramBuilder, TableGen
from planner.kernels.base import Candidate
from planner.kernels.imra import sum_of_shifts
from planner.kernels.problem import ChannelProblem, KernelError
from planner.layout.channels import ChannelLayout


def _pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


class HybridMatvec:
    def __init__(self, prob: ChannelProblem, free_input: bool, n1: int | None = None,
                 complex_pack: bool = False):
        if prob.op != "matvec":
            raise KernelError("the hybrid kernel implements matvec only")
        S = prob.slots
        lay = prob.in_layout
        if lay.n_ct != 1 or prob.n > S or prob.k > S:
            raise KernelError(f"the hybrid kernel needs n, k <= {S} slots (one ciphertext each)")
        self.prob = prob
        self.free_input = free_input
        self.complex_pack = complex_pack
        self.kp = _pow2(prob.k)
        self.np = _pow2(prob.n)
        if complex_pack and self.kp < 2:
            raise KernelError("complex packing pairs input elements: it needs k >= 2")
        # the period the diagonals run over: kp, or the pair period kp / 2 (complex)
        self.q = self.kp // 2 if complex_pack else self.kp
        self.f = min(S // self.np, self.q)
        self.D = self.q // self.f
        self.copies = S // self.kp
        self.n1 = n1 if n1 is not None else self.best_n1(self.D)
        if self.n1 < 1 or self.n1 > self.D or self.n1 & (self.n1 - 1):
            raise KernelError(f"hybrid: n1 must be a power of two in [1, {self.D}], got {self.n1}")
        if free_input:
            self.x_layout = replace(lay, reps=self.copies, period=self.kp if self.copies > 1 else 0,
                                    limit=0, clean=True)
        else:
            self.x_layout = lay.with_clean(True)

    @staticmethod
    def best_n1(D: int) -> int:
        """The power of two minimising baby + giant rotations (ties: more baby steps, which
        are the cheaper lazy ones)."""
        cands = [1 << e for e in range(D.bit_length()) if (1 << e) <= D]
        return min(cands, key=lambda n1: ((n1 - 1) + (-(-D // n1) - 1), -n1))

    # ------------------------------------------------------------------ layouts
    def out_layout(self) -> ChannelLayout:
        p = self.prob
        return ChannelLayout(shape=(p.n,), channels=p.n, height=1, width=1, slots=p.slots, cpc=p.n,
                             lc=self.f, lh=1, lw=1, clean=self.f == 1)

    # ------------------------------------------------------------------ tables
    def table(self, t: int, gamma: int) -> np.ndarray:
        """idx of diagonal t pre-rotated by -gamma (weight flat index or -1)."""
        p = self.prob
        S = p.slots
        s = np.arange(S, dtype=np.int64)
        row = s // self.f
        col = (s + self.f * t) % self.kp
        idx = p.weight_index(row, col, 0)
        return np.roll(idx, gamma)  # pt'[u] = pt[u - gamma]

    def complex_tables(self, t: int, gamma: int) -> tuple[np.ndarray, np.ndarray]:
        """Complex packing: idx of the real and of the imaginary part of diagonal t
        pre-rotated by -gamma; the value is ``0.5 * W[re] - 0.5i * W[im]`` (module docstring)."""
        p = self.prob
        s = np.arange(p.slots, dtype=np.int64)
        row = s // self.f
        c = (s + self.f * t) % self.kp
        c0 = c % self.q
        a = p.weight_index(row, c0, 0)
        b = p.weight_index(row, c0 + self.q, 0)
        twisted = c >= self.q
        re, im = np.where(twisted, b, a), np.where(twisted, a, b)
        return np.roll(re, gamma), np.roll(im, gamma)

    def _nonzero(self, t: int) -> bool:
        if self.complex_pack:
            return any(bool((v >= 0).any()) for v in self.complex_tables(t, 0))
        return bool((self.table(t, 0) >= 0).any())

    def _gen(self, t: int, gamma: int) -> Callable[[], tuple[np.ndarray, None]]:
        def gen() -> tuple[np.ndarray, None]:
            return self.table(t, gamma), None

        return gen

    def _complex_gens(self, t: int, gamma: int) -> tuple[TableGen, TableGen]:
        half = np.full(self.prob.slots, 0.5)

        def re() -> tuple[np.ndarray, np.ndarray | None]:
            return self.complex_tables(t, gamma)[0], half

        def im() -> tuple[np.ndarray, np.ndarray | None]:
            return self.complex_tables(t, gamma)[1], -half

        return re, im

    # ------------------------------------------------------------------ lowering
    def lower(self, b: ProgramBuilder, regs: dict[str, list[str]], node: str) -> list[str]:
        p = self.prob
        x = regs[p.x][0]
        if not self.free_input and self.copies > 1:
            x = sum_of_shifts(b, x, self.copies, -self.kp)
        f, n1, D = self.f, self.n1, self.D
        if self.complex_pack:  # z = xr + i rot(xr, q): two inputs per slot
            x = b.add(x, b.mul_i(b.rot(x, self.q)))
        babies = b.rot_many(x, [f * bb for bb in range(min(n1, D))])
        total: str | None = None
        for a in range(-(-D // n1)):
            gamma = f * n1 * a
            acc: str | None = None
            for bb in range(n1):
                t = n1 * a + bb
                if t >= D:
                    break
                if not self._nonzero(t):
                    continue  # structurally zero diagonal
                if self.complex_pack:
                    re, im = self._complex_gens(t, gamma)
                    pt = b.plaintext(p.w, f"pt/{node}/hybc/n{n1}/t{t}", re, imag=im)
                else:
                    pt = b.plaintext(p.w, f"pt/{node}/hyb/n{n1}/t{t}", self._gen(t, gamma))
                acc = b.accumulate(acc, b.pmul(babies[f * bb], pt))
            if acc is not None:
                total = b.accumulate(total, b.rot(b.rescale(acc), gamma))
        if total is None:
            return [b.zero_like(x)]
        sh = f // 2
        while sh >= 1:
            total = b.add(total, b.rot(total, sh))
            sh //= 2
        if self.complex_pack:  # 2 Re(w) (the plaintexts hold the 1/2)
            total = b.add(total, b.conj(total))
        return [total]

    def params(self) -> dict[str, object]:
        out: dict[str, object] = {"diagonals": self.D, "f": self.f, "period": self.kp, "n1": self.n1,
                                  "input": "client-packed" if self.free_input else "replicated"}
        if self.complex_pack:
            out["packing"] = "complex"
        return out

    def candidate(self, node: str) -> Candidate:
        p = self.prob
        return Candidate(
            node=node,
            kernel="hybrid-complex" if self.complex_pack else "hybrid",
            params=self.params(),
            in_layouts={p.x: self.x_layout},
            out_layout=self.out_layout(),
            lower=lambda b, regs: self.lower(b, regs, node),
            slot_utilization=min(1.0, self.np * self.f / p.slots),
        )


def hybrid_candidates(prob: ChannelProblem, node: str, free_input: bool, complex_pack: bool = False) -> list[Candidate]:
    """The hybrid kernel with the rotation-minimal n1 and with 2, 4 and 8 times as many baby
    steps (a fused block's lazy baby rotation costs ~1/9 of a giant key switch on Lattigo:
    the time objective prefers more of them, the rotation objective the minimum), for a
    replicated-in-plan input and, when the input is free, a client-packed one.
    ``complex_pack``: the complex-packed form (module docstring), offered only where the
    real kernel has at least two diagonals."""
    out: list[Candidate] = []
    modes = (False, True) if free_input else (False,)
    for free in modes:
        base = HybridMatvec(prob, free, complex_pack=complex_pack)
        if complex_pack and HybridMatvec(prob, free).D < 2:
            return []  # the real kernel has one diagonal: pairing saves nothing
        n1s = [base.n1 << j for j in range(4) if base.n1 << j <= base.D]
        for n1 in n1s:
            out.append((base if n1 == base.n1 else HybridMatvec(prob, free, n1, complex_pack)).candidate(node))
    return out
