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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from planner.kernels.base import Candidate
from planner.kernels.imra import sum_of_shifts
from planner.kernels.problem import ChannelProblem, KernelError
from planner.layout import ChannelLayout
from planner.program import ProgramBuilder


def _pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


class HybridMatvec:
    def __init__(self, prob: ChannelProblem, free_input: bool, n1: int | None = None):
        if prob.op != "matvec":
            raise KernelError("the hybrid kernel implements matvec only")
        S = prob.slots
        lay = prob.in_layout
        if lay.n_ct != 1 or prob.n > S or prob.k > S:
            raise KernelError(f"the hybrid kernel needs n, k <= {S} slots (one ciphertext each)")
        self.prob = prob
        self.free_input = free_input
        self.kp = _pow2(prob.k)
        self.np = _pow2(prob.n)
        self.f = min(S // self.np, self.kp)
        self.D = self.kp // self.f
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

    def _nonzero(self, t: int) -> bool:
        return bool((self.table(t, 0) >= 0).any())

    def _gen(self, t: int, gamma: int) -> Callable[[], tuple[np.ndarray, None]]:
        def gen() -> tuple[np.ndarray, None]:
            return self.table(t, gamma), None

        return gen

    # ------------------------------------------------------------------ lowering
    def lower(self, b: ProgramBuilder, regs: dict[str, list[str]], node: str) -> list[str]:
        p = self.prob
        x = regs[p.x][0]
        if not self.free_input and self.copies > 1:
            x = sum_of_shifts(b, x, self.copies, -self.kp)
        f, n1, D = self.f, self.n1, self.D
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
        return [total]

    def params(self) -> dict[str, object]:
        return {"diagonals": self.D, "f": self.f, "period": self.kp, "n1": self.n1,
                "input": "client-packed" if self.free_input else "replicated"}

    def candidate(self, node: str) -> Candidate:
        p = self.prob
        return Candidate(
            node=node,
            kernel="hybrid",
            params=self.params(),
            in_layouts={p.x: self.x_layout},
            out_layout=self.out_layout(),
            lower=lambda b, regs: self.lower(b, regs, node),
            slot_utilization=min(1.0, self.np * self.f / p.slots),
        )


def hybrid_candidates(prob: ChannelProblem, node: str, free_input: bool) -> list[Candidate]:
    """The hybrid kernel with the rotation-minimal n1 and with 2, 4 and 8 times as many baby
    steps (a fused block's lazy baby rotation costs ~1/9 of a giant key switch on Lattigo:
    the time objective prefers more of them, the rotation objective the minimum), for a
    replicated-in-plan input and, when the input is free, a client-packed one."""
    out: list[Candidate] = []
    modes = (False, True) if free_input else (False,)
    for free in modes:
        base = HybridMatvec(prob, free)
        n1s = [base.n1 << j for j in range(4) if base.n1 << j <= base.D]
        for n1 in n1s:
            out.append((base if n1 == base.n1 else HybridMatvec(prob, free, n1)).candidate(node))
    return out
