"""MetaKernel IMRA kernels (shared/papers/metakernel-imra-mvm-conv.txt).

Algorithm 1 (MVM) and Algorithm 3 (Conv via Ke2Col) build a blocked IMRA pattern over a
square-ified channel matrix (``nd = min(n, k)`` diagonals of length ``kd = max(n, k)``
channel blocks, ``T`` taps per block, ``Shift = lc``).  Algorithm 2 (OPTIMIZE_IMRA)
picks (Pb, Ps) by Eq. 11 and composes:

* superblocking: ``f = nd / Pb`` consecutive diagonals per MetaKernel, so each
  MetaKernel multiplies ``bs_opt = f * T`` aligned input copies (the baby rotations
  ``c * lc + a_t``) and rotates once by ``i * f * lc`` (the giant rotations);
* horizontal batching: ``Ps`` superblocks share one MetaKernel, laid out in regions of
  ``kd * lc + s_f`` slots, the superblock of region ``r`` cyclically embedded with its
  shift buffer ``s_f = gs * f * lc`` so that every region needs the same rotation;
* Reduce(Ps, kd*lc + s_f) sums the regions, and for short matrices Reduce(k/n, n*lc)
  sums the hybrid-diagonal partial products (Algorithm 1 line 5b).

The input copy X is the periodic extension (period ``k * lc``) of the input, made by
rotate-and-add doubling from a clean input, or packed directly by the client when the
operand is a graph input and the plan lets inputs take the kernel's layout.

When not even Ps = 1 fits (large convolutions, Table 8's search space of 1), the kernel is
purely vertical (Pb = nd, Ps = 1) and giant steps whose reads would leave the valid
copy are split into a direct part and a wrapped part (rotation ``i*lc - m*k*lc``), the
two-rotations-per-diagonal structure behind the paper's Table 5 counts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from common.cache import BoundedCache
from planner.ir.builder import ProgramBuilder
from planner.kernels.base import Candidate
from planner.kernels.problem import ChannelProblem, KernelError, doubling_cost, slot_mod, square_dims
from planner.layout.channels import ChannelLayout
from solver.formulas import eq11

# Dense checks of which channel diagonals carry weights are skipped above this many
# (diagonal, block) pairs: a zero plaintext only wastes a pmul, it is never wrong.
MAX_STRUCTURE_CHECK = 20_000_000
# Plaintext tables: a part pair's weight indices over its channel block are kept when the
# block has at most this many (channel, channel) entries (512 KiB), for at most
# PAIR_CACHE_ENTRIES (pair, tap) at once per kernel (the tables of one pair share them);
# a larger block (a wide matvec) looks up only the pairs of each table, as the table has
# at most S entries where the block may have S^2.
PAIR_TABLE_MAX_ENTRIES = 1 << 16
PAIR_CACHE_ENTRIES = 32


@dataclass(frozen=True)
class ImraChoice:
    Pb: int
    Ps: int
    bs_opt: int  # rows per superblock: f * T (Algorithm 2 line 2)
    search_space: int  # feasible (Pb, Ps) pairs under Eq. 11's constraints
    eq11: int  # Eq. 11 objective of the choice (the paper's rotation model)
    fallback: bool  # no pair feasible: purely vertical composition


def feasible_pairs(nd: int, kd: int, lc: int, slots: int) -> list[tuple[int, int]]:
    """(Pb, Ps) pairs satisfying Eq. 11's constraints.

    (1) nd*T % Pb == 0 and (2) (nd*T/Pb) % T == 0 together say Pb divides nd; (3) Ps
    divides Pb; (4) the composed row fits a ciphertext: Ps regions of kd*lc slots plus
    the shift buffers Ps * s_f = nd * lc (ANT-ACE's form ``kd*Ps + nd <= S``, which for
    square blocks is the paper's ``kd*(Ps+1) <= S``).
    """
    out = []
    for Pb in range(1, nd + 1):
        if nd % Pb:
            continue
        for Ps in range(1, Pb + 1):
            if Pb % Ps == 0 and Ps * kd * lc + nd * lc <= slots:
                out.append((Pb, Ps))
    return out


def select_imra(nd: int, kd: int, T: int, lc: int, slots: int) -> ImraChoice:
    """Exhaustive search of Eq. 11: fewest rotations, ties to higher slot utilisation
    (larger Ps), then smaller Pb (deterministic)."""
    pairs = feasible_pairs(nd, kd, lc, slots)
    if not pairs:
        return ImraChoice(Pb=nd, Ps=1, bs_opt=T, search_space=1, eq11=eq11(nd, T, nd, 1), fallback=True)
    best = min(pairs, key=lambda pp: (eq11(nd, T, pp[0], pp[1]), -pp[1], pp[0]))
    Pb, Ps = best
    return ImraChoice(
        Pb=Pb, Ps=Ps, bs_opt=(nd // Pb) * T, search_space=len(pairs), eq11=eq11(nd, T, Pb, Ps),
        fallback=False,
    )


def sum_of_shifts(b: ProgramBuilder, reg: str, m: int, step: int) -> str:
    """sum_{r < m} rot(reg, r * step) with floor(log2 m) + popcount(m) - 1 rotations."""
    if m <= 1:
        return reg
    powers = [reg]  # powers[e] = sum_{r < 2^e} rot(reg, r*step)
    while (1 << len(powers)) <= m:
        e = len(powers) - 1
        prev = powers[-1]
        powers.append(b.add(prev, b.rot(prev, (1 << e) * step)))
    acc: str | None = None
    offset = 0
    for e in range(len(powers) - 1, -1, -1):
        if m >> e & 1:
            term = powers[e] if offset == 0 else b.rot(powers[e], offset * step)
            acc = term if acc is None else b.add(acc, term)
            offset += 1 << e
    assert acc is not None
    return acc


@dataclass(frozen=True)
class ImraGeometry:
    nn: int  # padded output channels per part
    kk: int  # padded input channels per part
    nd: int
    kd: int
    f: int  # diagonals per superblock
    gs: int  # vertically stacked MetaKernels
    R: int  # region length kd*lc + s_f
    Ltot: int  # slots of X that are read
    period: int  # k * lc
    copies: int  # full copies of the input in X
    partial: int  # slots of a masked partial copy (0: none)
    Eb: int  # blocks of X that are valid (fallback wrap logic)


class ImraKernel:
    def __init__(self, prob: ChannelProblem, free_input: bool):
        self.prob = prob
        S = prob.slots
        lc = prob.lc
        nn, kk = square_dims(prob.cpc_out, prob.cpc_in)
        nd, kd = min(nn, kk), max(nn, kk)
        if kd * lc > S:
            raise KernelError(
                f"IMRA needs {kd} channel blocks of {lc} slots in one ciphertext (> {S} slots)"
            )
        self.choice = select_imra(nd, kd, prob.T, lc, S)
        ch = self.choice
        f = nd // ch.Pb
        gs = ch.Pb // ch.Ps
        period = kk * lc
        if ch.fallback:
            R = kd * lc
            Ltot = R
            copies = S // period
            partial = 0
            Eb = copies * kk
        else:
            R = kd * lc + gs * f * lc
            Ltot = ch.Ps * R
            need = -(-Ltot // period)
            if need * period <= S:
                copies, partial = need, 0
            else:
                copies, partial = need - 1, Ltot - (need - 1) * period
            Eb = 0
        self.g = ImraGeometry(nn, kk, nd, kd, f, gs, R, Ltot, period, copies, partial, Eb)
        self.free_input = free_input
        lay = prob.in_layout
        if free_input:
            reps = copies + (1 if partial else 0)
            self.x_layout = replace(
                lay, reps=reps, period=period if reps > 1 else 0,
                limit=Ltot if partial else 0, clean=True,
            )
        else:
            self.x_layout = lay.with_clean(True)
        self._nz_cache: dict[tuple[int, int], np.ndarray] = {}
        self._grid_cache: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._pair_cache: BoundedCache[tuple[np.ndarray | None, np.ndarray]] = BoundedCache(PAIR_CACHE_ENTRIES)

    # ------------------------------------------------------------------ structure
    def _part_sizes(self, o: int, i: int) -> tuple[int, int]:
        p = self.prob
        return p.part_channels(o, p.cpc_out, p.n), p.part_channels(i, p.cpc_in, p.k)

    def _diag_nonzero(self, o: int, i: int) -> np.ndarray:
        """nz[d]: channel diagonal d of part pair (o, i) carries a structurally nonzero weight."""
        key = (o, i)
        if key in self._nz_cache:
            return self._nz_cache[key]
        g, p = self.g, self.prob
        n_o, k_i = self._part_sizes(o, i)
        if n_o == 0 or k_i == 0:
            nz = np.zeros(g.nd, dtype=bool)
        elif (p.groups == 1 and (n_o == g.nn or k_i == g.kk)) or g.nd * g.kd > MAX_STRUCTURE_CHECK:
            nz = np.ones(g.nd, dtype=bool)
        else:
            j = np.arange(g.kd)[None, :]
            d = np.arange(g.nd)[:, None]
            co_l = j % g.nn
            ci_l = (j + d) % g.kk
            ok = (co_l < n_o) & (ci_l < k_i)
            ok &= p.pair_nonzero(o * p.cpc_out + co_l, i * p.cpc_in + ci_l)
            nz = np.asarray(ok.any(axis=1))
        self._nz_cache[key] = nz
        return nz

    def _wrap_m(self, q: np.ndarray) -> np.ndarray:
        g = self.g
        return np.where(q < g.Eb, 0, -(-(q - g.Eb + 1) // g.kk))

    def _wrap_bounds(self, m: int) -> tuple[int, int]:
        """The q >= 0 with ``_wrap_m(q) == m``, as an interval (lo, hi) (it is monotone)."""
        g = self.g
        return (0, g.Eb - 1) if m == 0 else (g.Eb + (m - 1) * g.kk, g.Eb + m * g.kk - 1)

    def plaintext_keys(self, o: int, i: int) -> list[tuple[int, int, int, int]]:
        """(giant i, wrap m, baby c, tap t) of the nonzero plaintexts of part pair (o, i)."""
        g, p, ch = self.g, self.prob, self.choice
        nz = self._diag_nonzero(o, i)
        taps = [t for t in range(p.T) if p.tap_used[t]]
        keys: list[tuple[int, int, int, int]] = []
        for ig in range(g.gs):
            for c in range(g.f):
                ds = [(ig + r * g.gs) * g.f + c for r in range(ch.Ps)]
                if not any(nz[d] for d in ds):
                    continue
                if ch.fallback:
                    d = ds[0]
                    ms = np.unique(self._wrap_m(np.arange(g.kd) + d))
                    for m in ms.tolist():
                        keys.extend((ig, int(m), c, t) for t in taps)
                else:
                    keys.extend((ig, 0, c, t) for t in taps)
        return keys

    # ------------------------------------------------------------------ tables
    def _grid(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What every table of this kernel shares: row r (Ps, 1), channel block j of each
        read slot (1, kd * lc), its row offset in a pair table (j % nn) * kk, and the
        slot of (r, read slot) before the giant's shift."""
        if self._grid_cache is None:
            g, p, ch = self.g, self.prob, self.choice
            r = np.arange(ch.Ps, dtype=np.int64)[:, None]
            ol = np.arange(g.kd * p.lc, dtype=np.int64)[None, :]
            j = ol // p.lc
            self._grid_cache = (r, j, (j % g.nn) * g.kk, r * g.R + ol)
        return self._grid_cache

    def _pair_table(self, o: int, i: int, t: int) -> tuple[np.ndarray | None, np.ndarray]:
        """For part pair (o, i) and tap t: the weight index of every (co_l, ci_l) channel
        pair, flat (co_l * kk + ci_l; -1 outside the parts or structurally zero; None above
        ``PAIR_TABLE_MAX_ENTRIES``), and which read slots hold a valid output channel and
        anchor (1, kd * lc)."""
        key = (o, i, t)
        hit = self._pair_cache.get(key)
        if hit is None:
            g, p = self.g, self.prob
            n_o, k_i = self._part_sizes(o, i)
            w: np.ndarray | None = None
            if g.nn * g.kk <= PAIR_TABLE_MAX_ENTRIES:
                co_l = np.arange(g.nn, dtype=np.int64)[:, None]
                ci_l = np.arange(g.kk, dtype=np.int64)[None, :]
                co = np.broadcast_to(o * p.cpc_out + co_l, (g.nn, g.kk))
                ci = np.broadcast_to(i * p.cpc_in + ci_l, (g.nn, g.kk))
                w = np.where((co_l < n_o) & (ci_l < k_i), p.weight_index(co, ci, t), -1).ravel()
            _, j, _, _ = self._grid()
            pos = np.arange(g.kd * p.lc, dtype=np.int64)[None, :] % p.lc
            valid = ((j % g.nn) < n_o) & p.anchor_tables[2][t][pos]
            hit = (w, valid)
            self._pair_cache.put(key, hit)
        return hit

    def plaintext_table(self, o: int, i: int, key: tuple[int, int, int, int]) -> np.ndarray:
        ig, m, c, t = key
        g, p, ch = self.g, self.prob, self.choice
        S = p.slots
        r, j, row, base = self._grid()
        wpair, valid = self._pair_table(o, i, t)
        q = j + (ig + r * g.gs) * g.f + c
        ci_l = q % g.kk
        if wpair is not None:
            widx = wpair[row + ci_l]
        else:  # a large channel block: the weights of this table's pairs only
            co = np.broadcast_to(o * p.cpc_out + j % g.nn, q.shape)
            widx = p.weight_index(co, i * p.cpc_in + ci_l, t)
            widx = np.where(ci_l < self._part_sizes(o, i)[1], widx, -1)
        ok = valid & (widx >= 0)
        if ch.fallback:
            lo, hi = self._wrap_bounds(m)
            ok &= (q >= lo) & (q <= hi)
        s = slot_mod(base + ig * g.f * p.lc - m * g.kk * p.lc, S)
        idx = np.full(S, -1, dtype=np.int64)
        idx[s[ok]] = widx[ok]
        return idx

    # ------------------------------------------------------------------ lowering
    def giant_offset(self, key: tuple[int, int, int, int]) -> int:
        ig, m, _, _ = key
        return ig * self.g.f * self.prob.lc - m * self.g.kk * self.prob.lc

    def baby_offset(self, key: tuple[int, int, int, int]) -> int:
        _, _, c, t = key
        return c * self.prob.lc + self.prob.taps[t]

    def _replicate(self, b: ProgramBuilder, x: str, tag: str) -> str:
        g = self.g
        if self.free_input:
            return x
        X = sum_of_shifts(b, x, g.copies, -g.period)
        if g.partial:
            S = self.prob.slots
            keep = g.partial

            def mask() -> np.ndarray:
                v = np.zeros(S)
                v[:keep] = 1.0
                return v

            pt = b.const_plaintext(("imra-partial", S, keep), f"pt/mask/first{keep}", mask)
            part = b.rescale(b.pmul(x, pt))
            X = b.add(X, b.rot(part, -g.copies * g.period))
        return X

    def lower(self, b: ProgramBuilder, regs: dict[str, list[str]], node: str) -> list[str]:
        p, g, ch = self.prob, self.g, self.choice
        xs = regs[p.x]
        keys = {(o, i): self.plaintext_keys(o, i) for o in range(p.p_out) for i in range(p.p_in)}
        babies: dict[int, dict[int, str]] = {}
        for i in range(p.p_in):
            used = sorted({self.baby_offset(k) for o in range(p.p_out) for k in keys[(o, i)]})
            if not used:
                continue
            X = self._replicate(b, xs[i], f"{node}/{i}")
            babies[i] = b.rot_many(X, used)
        outs: list[str] = []
        for o in range(p.p_out):
            by_giant: dict[int, list[tuple[int, tuple[int, int, int, int]]]] = {}
            for i in range(p.p_in):
                for key in keys[(o, i)]:
                    by_giant.setdefault(self.giant_offset(key), []).append((i, key))
            if not by_giant:  # every weight of this part is structurally zero
                outs.append(b.zero_like(xs[0]))
                continue
            Z: str | None = None
            for gam, terms in sorted(by_giant.items()):
                acc: str | None = None
                for i, key in terms:
                    table = f"pt/{node}/o{o}i{i}/g{key[0]}m{key[1]}c{key[2]}t{key[3]}"
                    pt = b.plaintext(p.w, table, self._pt_gen(o, i, key))
                    acc = b.accumulate(acc, b.pmul(babies[i][self.baby_offset(key)], pt))
                assert acc is not None
                Z = b.accumulate(Z, b.rot(b.rescale(acc), gam))
            assert Z is not None
            if ch.Ps > 1:
                Z = sum_of_shifts(b, Z, ch.Ps, g.R)
            if g.kk > g.nn:
                Z = sum_of_shifts(b, Z, g.kk // g.nn, g.nn * p.lc)
            outs.append(Z)
        return outs

    def _pt_gen(self, o: int, i: int, key: tuple[int, int, int, int]):  # noqa: ANN202
        def gen() -> tuple[np.ndarray, None]:
            return self.plaintext_table(o, i, key), None

        return gen

    # ------------------------------------------------------------------ candidate
    def out_layout(self) -> ChannelLayout:
        clean = self.choice.Ps == 1 and self.g.kk <= self.g.nn
        return self.prob.out_layout.with_clean(clean)

    def params(self) -> dict[str, object]:
        ch, g, p = self.choice, self.g, self.prob
        return {
            "Pb": ch.Pb,
            "Ps": ch.Ps,
            "bs_opt": ch.bs_opt,
            "search_space": ch.search_space,
            "eq11_rotations": ch.eq11,
            "P_I": p.p_in,
            "P_O": p.p_out,
            "gs": g.gs,
            "nd": g.nd,
            "kd": g.kd,
            "padded_nk": [g.nn, g.kk],
            "fallback": ch.fallback,
            "input": "client-packed" if self.free_input else "replicated",
        }

    def slot_utilization(self) -> float:
        p, g = self.prob, self.g
        n_real = min(p.cpc_out, p.n)
        k_real = min(p.cpc_in, p.k)
        used = self.choice.Ps * max(n_real, k_real) * p.H * p.W if p.op == "conv2d" else (
            self.choice.Ps * max(n_real, k_real)
        )
        if self.choice.fallback:
            used = g.kd * p.lc
        return min(1.0, used / p.slots)

    def candidate(self, node: str) -> Candidate:
        return Candidate(
            node=node,
            kernel="imra",
            params=self.params(),
            in_layouts={self.prob.x: self.x_layout},
            out_layout=self.out_layout(),
            lower=lambda b, regs: self.lower(b, regs, node),
            slot_utilization=self.slot_utilization(),
        )


def imra_rotation_estimate(k: ImraKernel) -> int:
    """Rotations of one input part / one output part ignoring structural zeros (for docs)."""
    g, ch = k.g, k.choice
    rep = 0 if k.free_input else doubling_cost(g.copies) + (1 if g.partial else 0)
    return rep + (g.f * k.prob.T - 1) + (g.gs - 1) + doubling_cost(ch.Ps) + doubling_cost(g.kk // g.nn)
