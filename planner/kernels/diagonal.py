"""Diagonal baselines on the channel problem: Halevi-Shoup and baby-step giant-step.

The linear map sends input slot ``ci*lc + p + a_t`` to output slot ``co*lc + p``: every
nonzero (channel difference, tap) is a generalised diagonal with slot offset
``delta = (ci - co) * lc + a_t`` (cyclic in the slot count).  The input is used as it is
(no replication), as Lattigo's ``lintrans`` and FHE-MP-CNN do.

* ``hs-diagonal``: one rotation of the input per distinct nonzero offset
  (FHE-MP-CNN's ``n + k - 2`` for a dense MVM, MetaKernel Table 2).
* ``bsgs``: ``delta = beta + gamma`` with ``beta = delta mod n1``; baby rotations of the
  input (hoisted), plaintexts pre-rotated by ``-gamma``, one giant rotation per distinct
  ``gamma`` after accumulation (Halevi-Shoup 2018; Lattigo lintrans).  ``n1`` is the power
  of two that minimises the exact rotation count.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from planner.kernels.base import Candidate
from planner.kernels.problem import ChannelProblem
from planner.program import ProgramBuilder

MAX_PAIR_CHECK = 4_000_000

DiagKey = tuple[int, int]  # (channel difference ci - co, tap)


class DiagonalKernel:
    def __init__(self, prob: ChannelProblem, kind: str):
        if kind not in ("hs-diagonal", "bsgs"):
            raise ValueError(kind)
        self.prob = prob
        self.kind = kind
        self._keys = {
            (o, i): self._diag_keys(o, i) for o in range(prob.p_out) for i in range(prob.p_in)
        }
        self.n1 = self._choose_n1() if kind == "bsgs" else prob.slots

    def _diag_keys(self, o: int, i: int) -> list[DiagKey]:
        p = self.prob
        n_o = p.part_channels(o, p.cpc_out, p.n)
        k_i = p.part_channels(i, p.cpc_in, p.k)
        if n_o == 0 or k_i == 0:
            return []
        if p.groups == 1 or n_o * k_i > MAX_PAIR_CHECK:
            dcs = list(range(-(n_o - 1), k_i))
        else:
            co = np.arange(n_o)[:, None]
            ci = np.arange(k_i)[None, :]
            ok = p.pair_nonzero(o * p.cpc_out + co, i * p.cpc_in + ci)
            dcs = sorted(set((ci - co)[ok].tolist()))
        return [(dc, t) for dc in dcs for t in range(p.T) if p.tap_used[t]]

    def delta(self, key: DiagKey) -> int:
        dc, t = key
        return (dc * self.prob.lc + self.prob.taps[t]) % self.prob.slots

    def _rotations(self, n1: int) -> int:
        p = self.prob
        total = 0
        for i in range(p.p_in):
            betas = {self.delta(k) % n1 for o in range(p.p_out) for k in self._keys[(o, i)]}
            total += len(betas - {0})
        for o in range(p.p_out):
            gams = {self.delta(k) - self.delta(k) % n1 for i in range(p.p_in) for k in self._keys[(o, i)]}
            total += len(gams - {0})
        return total

    def _choose_n1(self) -> int:
        S = self.prob.slots
        cands = [1 << e for e in range(S.bit_length()) if (1 << e) <= S]
        return min(cands, key=lambda n1: (self._rotations(n1), n1))

    # ------------------------------------------------------------------ tables
    def plaintext_table(self, o: int, i: int, key: DiagKey, gam: int) -> np.ndarray:
        p = self.prob
        S, lc = p.slots, p.lc
        dc, t = key
        n_o = p.part_channels(o, p.cpc_out, p.n)
        k_i = p.part_channels(i, p.cpc_in, p.k)
        _, _, valid = p.anchor_tables
        co_l = np.arange(n_o, dtype=np.int64)[:, None]
        pos = np.arange(lc, dtype=np.int64)[None, :]
        ci_l = co_l + dc
        ok = (ci_l >= 0) & (ci_l < k_i) & valid[t][pos]
        co = np.broadcast_to(o * p.cpc_out + co_l, ok.shape)
        ci = np.broadcast_to(i * p.cpc_in + ci_l, ok.shape)
        widx = p.weight_index(co, ci, t)
        ok &= widx >= 0
        s = (co_l * lc + pos + gam) % S
        s = np.broadcast_to(s, ok.shape)
        idx = np.full(S, -1, dtype=np.int64)
        idx[s[ok]] = widx[ok]
        return idx

    def _gen(self, o: int, i: int, key: DiagKey, gam: int) -> Callable[[], tuple[np.ndarray, None]]:
        def gen() -> tuple[np.ndarray, None]:
            return self.plaintext_table(o, i, key, gam), None

        return gen

    # ------------------------------------------------------------------ lowering
    def lower(self, b: ProgramBuilder, regs: dict[str, list[str]], node: str) -> list[str]:
        p = self.prob
        n1 = self.n1
        xs = regs[p.x]
        babies: dict[int, dict[int, str]] = {}
        for i in range(p.p_in):
            used = sorted({self.delta(k) % n1 for o in range(p.p_out) for k in self._keys[(o, i)]})
            if used:
                babies[i] = b.rot_many(xs[i], used)
        outs = []
        for o in range(p.p_out):
            by_giant: dict[int, list[str]] = {}
            for i in range(p.p_in):
                for key in self._keys[(o, i)]:
                    dl = self.delta(key)
                    beta = dl % n1
                    gam = dl - beta
                    table = f"pt/{node}/o{o}i{i}/d{key[0]}t{key[1]}"
                    pt = b.plaintext(p.w, table, self._gen(o, i, key, gam))
                    by_giant.setdefault(gam, []).append(b.pmul(babies[i][beta], pt))
            rotated = [b.rot(b.rescale(b.add_many(ps)), gam) for gam, ps in sorted(by_giant.items())]
            outs.append(b.add_many(rotated))
        return outs

    def slot_utilization(self) -> float:
        p = self.prob
        return min(1.0, min(p.cpc_out, p.n) * p.H * p.W / p.slots)

    def candidate(self, node: str) -> Candidate:
        params: dict[str, object] = {
            "diagonals": sum(len(v) for v in self._keys.values()),
            "P_I": self.prob.p_in,
            "P_O": self.prob.p_out,
        }
        if self.kind == "bsgs":
            params["n1"] = self.n1
        return Candidate(
            node=node,
            kernel=self.kind,
            params=params,
            in_layouts={self.prob.x: self.prob.in_layout.with_clean(False)},
            out_layout=self.prob.out_layout.with_clean(True),
            lower=lambda b, regs: self.lower(b, regs, node),
            slot_utilization=self.slot_utilization(),
        )
