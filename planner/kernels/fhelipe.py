"""Fhelipe-style matrix-vector product (MetaKernel Figure 2, Table 2 formula).

Full replication: pad n and k to powers of two, replicate x into every row slot of a
ciphertext (log2(rows) rotations), multiply by R = S/k2 rows of the matrix per
plaintext, sum each row in place by log2(k2) rotate-and-adds, then mask and merge the
ceil(n2 k2 / S) partial ciphertexts into one by rotating ciphertext j right by j
(n_ct - 1 rotations).  Rotations: log2(min(S, n k)/k) + log2(k) * n_ct + n_ct - 1.
The result is left scattered (row r at slot (r mod R) * k2 + r div R), as in Fhelipe.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from planner.ir.builder import ProgramBuilder
from planner.kernels.base import Candidate, CostVector
from planner.kernels.imra import sum_of_shifts
from planner.kernels.problem import ChannelProblem, KernelError
from planner.layout.channels import ChannelLayout


def _pow2(v: int) -> int:
    return 1 << (v - 1).bit_length()


class FhelipeMatvec:
    def __init__(self, prob: ChannelProblem):
        if prob.op != "matvec" or prob.p_in != 1:
            raise KernelError("the Fhelipe baseline handles matvec with the vector in one ciphertext")
        S = prob.slots
        self.prob = prob
        self.n2, self.k2 = _pow2(prob.n), _pow2(prob.k)
        if self.k2 > S:
            raise KernelError("row longer than a ciphertext")
        self.R = min(S // self.k2, self.n2)
        self.nct = -(-self.n2 // self.R)
        if self.nct > self.k2:
            raise KernelError(f"Fhelipe merge needs n_ct <= k2 ({self.nct} > {self.k2})")
        self.out = ChannelLayout(
            shape=(prob.n,), channels=self.nct, height=self.R, width=1, slots=S, cpc=self.nct,
            lc=1, lh=self.k2, lw=1, clean=self.nct > 1,
        )

    def _pt(self, j: int) -> Callable[[], tuple[np.ndarray, None]]:
        p, k2, R = self.prob, self.k2, self.R

        def gen() -> tuple[np.ndarray, None]:
            idx = np.full(p.slots, -1, dtype=np.int64)
            rl = np.arange(R)[:, None]
            c = np.arange(p.k)[None, :]
            row = j * R + rl
            ok = np.broadcast_to(row < p.n, (R, p.k))
            s = np.broadcast_to(rl * k2 + c, (R, p.k))
            w = np.broadcast_to(row * p.k + c, (R, p.k))
            idx[s[ok]] = w[ok]
            return idx, None

        return gen

    def lower(self, b: ProgramBuilder, regs: dict[str, list[str]], node: str) -> list[str]:
        p, k2, R, S = self.prob, self.k2, self.R, self.prob.slots
        X = sum_of_shifts(b, regs[p.x][0], R, -k2)
        m: str | None = None
        if self.nct > 1:

            def mask() -> np.ndarray:
                v = np.zeros(S)
                v[np.arange(R) * k2] = 1.0
                return v

            m = b.const_plaintext(("fhelipe-mask", S, k2, R), f"pt/{node}/rowmask", mask)
        merged: str | None = None
        for j in range(self.nct):
            pt = b.plaintext(p.w, f"pt/{node}/rows{j}", self._pt(j))
            acc = b.rescale(b.pmul(X, pt))
            step = 1
            while step < k2:
                acc = b.add(acc, b.rot(acc, step))
                step *= 2
            if m is None:
                return [acc]
            # mask and merge each partial as soon as it exists: one partial live at a time
            merged = b.accumulate(merged, b.rot(b.rescale(b.pmul(acc, m)), -j))
        assert merged is not None
        return [merged]

    def analytic_cost(self) -> CostVector:
        """Counts of the program ``lower`` emits (checked against it by the tests)."""
        S, k2, R, nct = self.prob.slots, self.k2, self.R, self.nct
        lr, lk = R.bit_length() - 1, k2.bit_length() - 1
        keys = {(-(1 << e) * k2) % S for e in range(lr)} | {1 << e for e in range(lk)}
        merge = nct - 1 if nct > 1 else 0
        keys |= {(-j) % S for j in range(1, nct)} if nct > 1 else set()
        masks = nct if nct > 1 else 0
        return CostVector(
            rotations=lr + nct * lk + merge, rot_keys=frozenset(keys), hoisted_groups=0,
            pmul=nct + masks, add=lr + nct * lk + merge, rescale=nct + masks,
            depth=2 if nct > 1 else 1, plaintexts=nct + (1 if nct > 1 else 0), ciphertexts_out=1,
            slot_utilization=self.prob.n * self.prob.k / (S * nct),
        )

    def candidate(self, node: str) -> Candidate:
        p = self.prob
        return Candidate(
            node=node, kernel="fhelipe",
            params={"n2": self.n2, "k2": self.k2, "rows_per_ct": self.R, "n_ct": self.nct},
            in_layouts={p.x: p.in_layout.with_clean(True)},
            out_layout=self.out,
            lower=lambda b, regs: self.lower(b, regs, node),
            slot_utilization=p.n * p.k / (p.slots * self.nct),
            analytic=self.analytic_cost,
        )
