"""Convolution when one channel does not fit a ciphertext (MetaKernel section 4.2.4).

"When a channel exceeds ciphertext capacity (H x W > S), we segment it along H ... Each
segment (including halo) must fit within one ciphertext" -- e.g. ImageNet's 3 x 224 x 224
at S = 32768 is six ciphertexts, half a channel each.  Every ciphertext holds one row
segment of one channel (plus the halo rows the filter reaches); an output segment of
channel ``co`` is ``sum_ci sum_t rot(in[ci, seg], a_t) * F[co, ci, t]`` with tap validity
masks: the MetaKernel partitioning of Figure 9 with one channel per part (Pb = 1,
bs_opt = K1*K2), channel mixing happening across ciphertexts (free additions).  Baby
rotations of each input ciphertext are hoisted and shared by all output channels.

The output keeps the segment grid (row segments without halo); a following convolution
asks for its own halo layout and pays the conversion (rows moved between neighbouring
ciphertexts), priced by the generic conversion.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from planner.frontend.graph import Graph, Node
from planner.ir.builder import ProgramBuilder
from planner.kernels.base import Candidate, CostVector
from planner.kernels.problem import KernelError
from planner.layout.channels import MappedLayout


@dataclass(frozen=True)
class SegGeom:
    """Affine placement of a row-segmented tensor: ciphertext (c, s) holds image row r of
    channel c (for r in its row range) at slot base + (r - r0[s]) * rs + w * cs."""

    C: int
    H: int
    W: int
    rs: int
    cs: int
    base: int
    r0: tuple[int, ...]
    lo: tuple[int, ...]  # first row held (inclusive), per segment
    hi: tuple[int, ...]  # last row held (exclusive), per segment
    slots: int

    @property
    def nseg(self) -> int:
        return len(self.r0)

    def maps(self) -> np.ndarray:
        maps = np.full((self.C * self.nseg, self.slots), -1, dtype=np.int64)
        cols = np.arange(self.W)
        for c in range(self.C):
            for s in range(self.nseg):
                r = np.arange(self.lo[s], self.hi[s])
                if r.size == 0:
                    continue
                loc = (self.base + (r - self.r0[s])[:, None] * self.rs + cols[None, :] * self.cs).ravel()
                if loc.min() < 0 or loc.max() >= self.slots:
                    raise KernelError("segment grid leaves the ciphertext")
                maps[c * self.nseg + s, loc] = (c * self.H * self.W + r[:, None] * self.W + cols[None, :]).ravel()
        return maps

    def layout(self, label: str) -> SegLayout:
        m = self.maps()
        return SegLayout((self.C, self.H, self.W), self.slots, m.shape[0], m.tobytes(), True, label, self)


@dataclass(frozen=True, eq=False)
class SegLayout(MappedLayout):
    geom: SegGeom | None = None

    def with_clean(self, clean: bool) -> SegLayout:
        return SegLayout(self.shape, self.slots, self.n_ct_, self.data, clean, self.label, self.geom)


@dataclass(frozen=True)
class SegGrid:
    C: int
    H: int
    W: int
    Wg: int  # grid width (columns plus padding margins)
    ml: int  # left margin
    rows: int  # grid rows per segment
    starts: tuple[int, ...]  # first image row of each segment's grid (may be negative)
    slots: int


def segment_rows_layout(shape: tuple[int, int, int], slots: int) -> MappedLayout:
    """Natural layout of a tensor whose channel exceeds a ciphertext: each ciphertext holds
    as many whole rows of one channel as fit (row-major), channel by channel."""
    C, H, W = shape
    if slots < W:
        raise KernelError(f"one row of {W} elements does not fit a ciphertext of {slots} slots")
    rows = max(1, slots // W)
    nseg = -(-H // rows)
    rows = -(-H // nseg)
    maps = np.full((C * nseg, slots), -1, dtype=np.int64)
    for c in range(C):
        for s in range(nseg):
            r = np.arange(s * rows, min(H, (s + 1) * rows))
            if r.size == 0:
                continue
            loc = ((r - s * rows)[:, None] * W + np.arange(W)[None, :]).ravel()
            maps[c * nseg + s, loc] = (c * H * W + r[:, None] * W + np.arange(W)[None, :]).ravel()
    return MappedLayout.of(shape, maps, True, f"segrows({nseg}x{rows})")


class SegmentedConv:
    def __init__(self, graph: Graph, node: Node, slots: int, src: SegGeom | None = None):
        x, w = node.inputs
        C, H, W = graph.shape(x)
        Co, Cg, K1, K2 = graph.shape(w)
        s1, s2 = node.stride or (1, 1)
        p1, p2 = node.padding or (0, 0)
        self.groups = node.groups or 1
        Ho, Wo = (H + 2 * p1 - K1) // s1 + 1, (W + 2 * p2 - K2) // s2 + 1
        c1, c2 = min(p1, K1 - 1), min(p2, K2 - 1)
        ml = max(0, p2 - c2)
        mr = max(0, (Wo - 1) * s2 - p2 + c2 - (W - 1))
        Wg = W + ml + mr
        if src is not None:
            # read the producer's segments in place: same row segmentation (stride 1 keeps it)
            if s1 != 1 or src.C != C or src.H != H or src.W != W:
                raise KernelError("producer segment grid does not line up with this convolution")
            nseg = src.nseg
            r_out = max(h - lo for lo, h in zip(src.lo, src.hi, strict=True))
            if Ho != H or any(src.lo[k] != k * r_out for k in range(nseg)):
                raise KernelError("producer segment grid does not line up with this convolution")
        else:
            # output rows per segment: the input rows they read (with halo) fit a ciphertext
            r_out = (slots // Wg - K1) // s1 + 1
            if r_out < 1:
                raise KernelError(f"a {K1}-row window of {Wg} columns does not fit a ciphertext")
            nseg = -(-Ho // r_out)
            r_out = -(-Ho // nseg)
        rows = (r_out - 1) * s1 + K1
        starts = tuple(a * r_out * s1 - p1 for a in range(nseg))
        self.g = SegGrid(C, H, W, Wg, ml, rows, starts, slots)
        self.x, self.w = x, w
        self.node = node
        self.Co, self.Cg, self.K1, self.K2 = Co, Cg, K1, K2
        self.s1, self.s2, self.p1, self.p2, self.c1, self.c2 = s1, s2, p1, p2, c1, c2
        self.Ho, self.Wo, self.r_out, self.nseg = Ho, Wo, r_out, nseg
        self.taps = [(i, j) for i in range(K1) for j in range(K2)]
        # input grid: our own compact grid with halos, or the producer's segment grid
        # extended by the halo rows (same affine placement, rows from the neighbours)
        if src is not None:
            lo = tuple(max(0, a * r_out - p1) for a in range(nseg))
            hi = tuple(min(H, a * r_out - p1 + rows) for a in range(nseg))
            self.geom = SegGeom(C, H, W, src.rs, src.cs, src.base, src.r0, lo, hi, slots)
        else:
            self.geom = SegGeom(C, H, W, Wg, 1, ml, starts, tuple(max(0, lo) for lo in starts),
                                tuple(min(H, lo + rows) for lo in starts), slots)
        self.in_layout = self.geom.layout(f"seghalo({nseg}x{rows})")
        self.out_layout = self._out_layout()

    def _anchor_slots(self, s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ho, wo, local slot) of the outputs of segment s: anchored at input grid position
        (ho*s1 - p1 + c1, wo*s2 - p2 + c2)."""
        ge = self.geom
        ho = np.arange(s * self.r_out, min(self.Ho, (s + 1) * self.r_out))
        wo = np.arange(self.Wo)
        HO, WO = np.meshgrid(ho, wo, indexing="ij")
        r = HO * self.s1 - self.p1 + self.c1
        c = WO * self.s2 - self.p2 + self.c2
        slot = ge.base + (r - ge.r0[s]) * ge.rs + c * ge.cs
        return HO.ravel(), WO.ravel(), slot.ravel()

    def _out_layout(self) -> SegLayout:
        ge = self.geom
        for s in range(self.nseg):
            _, _, slot = self._anchor_slots(s)
            if slot.size and (slot.min() < 0 or slot.max() >= ge.slots or np.unique(slot).size != slot.size):
                raise KernelError("segment outputs leave or collide in the ciphertext")
        # outputs keep the input's affine grid (strides scaled by the conv's): output row ho
        # of segment s sits at slot base + (ho - r0[s]) * rs + wo * cs with r0[s] its first row
        rs, cs = ge.rs * self.s1, ge.cs * self.s2
        r0 = tuple(s * self.r_out for s in range(self.nseg))
        hi = tuple(min(self.Ho, r + self.r_out) for r in r0)
        bases = {int(ge.base + (r0[s] * self.s1 - self.p1 + self.c1 - ge.r0[s]) * ge.rs
                     + (self.c2 - self.p2) * ge.cs) for s in range(self.nseg)}
        if len(bases) == 1:
            out = SegGeom(self.Co, self.Ho, self.Wo, rs, cs, bases.pop(), r0, r0, hi, ge.slots)
            return out.layout(f"segout({self.nseg}x{self.r_out})")
        maps = np.full((self.Co * self.nseg, ge.slots), -1, dtype=np.int64)
        for s in range(self.nseg):
            HO, WO, slot = self._anchor_slots(s)
            for co in range(self.Co):
                maps[co * self.nseg + s, slot] = co * self.Ho * self.Wo + HO * self.Wo + WO
        return SegLayout((self.Co, self.Ho, self.Wo), ge.slots, maps.shape[0], maps.tobytes(), True,
                         f"segout({self.nseg}x{self.r_out})", None)

    def tap_offset(self, t: int) -> int:
        i, j = self.taps[t]
        return (i - self.c1) * self.geom.rs + (j - self.c2) * self.geom.cs

    def _tap_valid(self, s: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        i, j = self.taps[t]
        HO, WO, slot = self._anchor_slots(s)
        r = HO * self.s1 - self.p1 + i
        c = WO * self.s2 - self.p2 + j
        ok = (r >= 0) & (r < self.g.H) & (c >= 0) & (c < self.g.W)
        return slot[ok], ok

    def _used(self) -> dict[tuple[int, int], bool]:
        return {(s, t): bool(self._tap_valid(s, t)[1].any()) for s in range(self.nseg) for t in range(len(self.taps))}

    def _ci_range(self, co: int) -> range:
        og = self.Co // self.groups
        grp = co // og
        return range(grp * self.Cg, (grp + 1) * self.Cg)

    def _pt_gen(self, co: int, ci: int, s: int, t: int) -> Callable[[], tuple[np.ndarray, None]]:
        def gen() -> tuple[np.ndarray, None]:
            idx = np.full(self.g.slots, -1, dtype=np.int64)
            slots_, _ = self._tap_valid(s, t)
            i, j = self.taps[t]
            idx[slots_] = ((co * self.Cg + ci % self.Cg) * self.K1 + i) * self.K2 + j
            return idx, None

        return gen

    def lower(self, b: ProgramBuilder, regs: dict[str, list[str]]) -> list[str]:
        used = self._used()
        babies: dict[tuple[int, int], dict[int, str]] = {}
        for ci in range(self.g.C):
            for s in range(self.nseg):
                offs = [self.tap_offset(t) for t in range(len(self.taps)) if used[(s, t)]]
                babies[(ci, s)] = b.rot_many(regs[self.x][ci * self.nseg + s], offs)
        outs = []
        for co in range(self.Co):
            for s in range(self.nseg):
                acc: str | None = None
                for ci in self._ci_range(co):
                    for t in range(len(self.taps)):
                        if not used[(s, t)]:
                            continue
                        pt = b.plaintext(self.w, f"pt/{self.node.id}/co{co}ci{ci}s{s}t{t}", self._pt_gen(co, ci, s, t))
                        acc = b.accumulate(acc, b.pmul(babies[(ci, s)][self.tap_offset(t)], pt))
                outs.append(b.rescale(acc) if acc is not None else b.zero_like(regs[self.x][0]))
        return outs

    def analytic_cost(self) -> CostVector:
        used = self._used()
        S = self.g.slots
        per_seg = [sorted({self.tap_offset(t) % S for t in range(len(self.taps)) if used[(s, t)]} - {0})
                   for s in range(self.nseg)]
        rot = self.g.C * sum(len(p) for p in per_seg)
        terms_seg = [sum(1 for t in range(len(self.taps)) if used[(s, t)]) for s in range(self.nseg)]
        pmul = self.Co * self.Cg * sum(terms_seg)
        n_out = self.Co * self.nseg
        zero = sum(1 for s in range(self.nseg) if terms_seg[s] == 0) * self.Co
        keys = frozenset(k for p in per_seg for k in p)
        return CostVector(
            rotations=rot, rot_keys=keys, hoisted_groups=self.g.C * sum(1 for p in per_seg if len(p) > 1),
            hoisted_rotations=self.g.C * sum(len(p) for p in per_seg if len(p) > 1),
            pmul=pmul + zero, add=pmul - (n_out - zero), rescale=n_out, depth=1,
            plaintexts=pmul + (1 if zero else 0), ciphertexts_out=n_out,
            slot_utilization=self.r_out * self.Wo / S,
        )

    def candidate(self) -> Candidate:
        return Candidate(
            node=self.node.id, kernel="segmented-conv",
            params={"segments": self.nseg, "rows_per_segment": self.r_out, "grid_rows": self.g.rows,
                    "P_I": self.g.C * self.nseg, "P_O": self.Co * self.nseg, "Pb": 1, "Ps": 1,
                    "bs_opt": len(self.taps)},
            in_layouts={self.x: self.in_layout}, out_layout=self.out_layout, lower=self.lower,
            slot_utilization=self.r_out * self.Wo / self.g.slots, analytic=self.analytic_cost,
        )


def segmented_candidates(graph: Graph, node: Node, slots: int, bases: list[object]) -> list[Candidate]:
    """The compact-grid kernel, plus one reading each segmented producer layout in place."""
    out = [SegmentedConv(graph, node, slots).candidate()]
    for b in bases:
        geom = getattr(b, "geom", None)
        if geom is None:
            continue
        try:
            out.append(SegmentedConv(graph, node, slots, src=geom).candidate())
        except KernelError:
            continue
    return out
