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

from planner.ir.builder import ProgramBuilder
from planner.kernels.base import Candidate, CostVector
from planner.kernels.problem import ChannelProblem, slot_mod

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
        taps = np.asarray(prob.taps, dtype=np.int64)
        self._deltas = {
            oi: (np.asarray([dc for dc, _ in ks], dtype=np.int64) * prob.lc
                 + taps[np.asarray([t for _, t in ks], dtype=np.int64)]) % prob.slots
            if ks else np.zeros(0, dtype=np.int64)
            for oi, ks in self._keys.items()
        }
        self.n1 = self._choose_n1() if kind == "bsgs" else prob.slots
        self._valid_pos: dict[int, np.ndarray] = {}  # tap -> its valid anchor positions

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

    def _sets(self, n1: int) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
        """Per input part the baby offsets, per output part the giant offsets and the
        number of (giant, input-part) accumulation groups... per output part."""
        p = self.prob
        betas = []
        for i in range(p.p_in):
            d = np.concatenate([self._deltas[(o, i)] for o in range(p.p_out)])
            betas.append(np.unique(d % n1))
        gammas = []
        for o in range(p.p_out):
            d = np.concatenate([self._deltas[(o, i)] for i in range(p.p_in)])
            gammas.append(np.unique(d - d % n1))
        return betas, gammas, []

    def _rotations(self, n1: int) -> int:
        betas, gammas, _ = self._sets(n1)
        return sum(int(np.count_nonzero(b)) for b in betas) + sum(int(np.count_nonzero(g)) for g in gammas)

    def _choose_n1(self) -> int:
        S = self.prob.slots
        cands = [1 << e for e in range(S.bit_length()) if (1 << e) <= S]
        return min(cands, key=lambda n1: (self._rotations(n1), n1))

    def analytic_cost(self) -> CostVector:
        """Counts of the program ``lower`` emits (checked against it by the tests)."""
        p = self.prob
        betas, gammas, _ = self._sets(self.n1)
        rot_b = [int(np.count_nonzero(b)) for b in betas]
        rot_g = [int(np.count_nonzero(g)) for g in gammas]
        keys: set[int] = set()
        for b in betas:
            keys.update(int(v) for v in b if v)
        for g in gammas:
            keys.update(int(v) % p.slots for v in g if v)
        terms = sum(len(v) for v in self._deltas.values())
        n_giants = sum(len(g) for g in gammas)
        zero_parts = sum(1 for g in gammas if len(g) == 0)
        # per output part: (terms - 1) adds inside giant groups, (giants - 1) to combine them
        adds = terms - n_giants + sum(max(0, len(g) - 1) for g in gammas)
        return CostVector(
            rotations=sum(rot_b) + sum(rot_g), rot_keys=frozenset(keys),
            hoisted_groups=sum(1 for r in rot_b if r > 1), hoisted_rotations=sum(r for r in rot_b if r > 1),
            pmul=terms + zero_parts, add=adds,
            rescale=n_giants + zero_parts, depth=1, plaintexts=terms + (1 if zero_parts else 0),
            ciphertexts_out=p.p_out, slot_utilization=self.slot_utilization(),
        )

    # ------------------------------------------------------------------ tables
    def plaintext_table(self, o: int, i: int, key: DiagKey, gam: int) -> np.ndarray:
        """Slot ``co_l*lc + pos + gam`` (mod S) holds W(co, co + dc, tap t) for the output
        channels whose input channel ``co_l + dc`` is in the part, at the tap's valid
        anchor positions; -1 elsewhere."""
        p = self.prob
        S, lc = p.slots, p.lc
        dc, t = key
        n_o = p.part_channels(o, p.cpc_out, p.n)
        k_i = p.part_channels(i, p.cpc_in, p.k)
        pos = self._valid_pos.get(t)
        if pos is None:
            pos = self._valid_pos[t] = np.flatnonzero(p.anchor_tables[2][t]).astype(np.int64)
        co_l = np.arange(max(0, -dc), max(0, min(n_o, k_i - dc)), dtype=np.int64)
        w = p.weight_index(o * p.cpc_out + co_l, i * p.cpc_in + co_l + dc, t)
        keep = w >= 0
        co_l, w = co_l[keep], w[keep]
        s = slot_mod((co_l[:, None] * lc + pos[None, :] + gam).ravel(), S)
        idx = np.full(S, -1, dtype=np.int64)
        idx[s] = np.repeat(w, pos.size)
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
            by_giant: dict[int, list[tuple[int, DiagKey, int]]] = {}
            for i in range(p.p_in):
                for key in self._keys[(o, i)]:
                    dl = self.delta(key)
                    beta = dl % n1
                    by_giant.setdefault(dl - beta, []).append((i, key, beta))
            if not by_giant:  # every weight of this part is structurally zero
                outs.append(b.zero_like(xs[0]))
                continue
            total: str | None = None
            for gam, terms in sorted(by_giant.items()):
                # BSGS: one sum per input part, then the parts added, so that each part's
                # products are one linear form over its own babies (planner.ir.fusion fuses
                # it as one block); one chain across the parts leaves every product after the
                # first part's a block of its own (ResNet-20's s3b1_cb at n16boot, P_I = 2:
                # 1072 single-product blocks). Halevi-Shoup keeps the one chain: summed per
                # part, the time model re-prices it and the uncapped plans of seven goldens
                # move to it at 6-9x the rotations and keys, unmeasured (docs/lattigo.md)
                chains = ([[t for t in terms if t[0] == i] for i in sorted({t[0] for t in terms})]
                          if self.kind == "bsgs" else [terms])
                acc: str | None = None
                for chain in chains:
                    part: str | None = None
                    for i, key, beta in chain:
                        table = f"pt/{node}/o{o}i{i}/d{key[0]}t{key[1]}"
                        pt = b.plaintext(p.w, table, self._gen(o, i, key, gam))
                        part = b.accumulate(part, b.pmul(babies[i][beta], pt))
                    assert part is not None
                    acc = b.accumulate(acc, part)
                assert acc is not None
                total = b.accumulate(total, b.rot(b.rescale(acc), gam))
            assert total is not None
            outs.append(total)
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
            analytic=self.analytic_cost,
        )
