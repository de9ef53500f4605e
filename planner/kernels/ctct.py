"""Ciphertext x ciphertext matmul on rolled layouts (FAME/JKLS sigma-tau-epsilon-omega),
with Strassen's algorithm for 2x2-tiled operands.

FAME (Eq. 1) writes ``A @ B = sum_k eps^k(sigma(A)) * omega^k(tau(B))``: sigma rolls each
row of A by its row index, tau rolls each column of B by its column index, and eps^k /
omega^k shift a rolled operand by k along the summed dimension.  The cost is in the
shifts: a shift that moves whole ciphertext-cyclic segments is one rotation (Rotom
ApplyRotRoll), a shift inside blocks shorter than the ciphertext is two rotations and two
masks.  This module generalises the scheme to tiles, windows and both orientations:

* The inner dimension ``k`` is cut into chunks of ``lc`` (zero padded); output tiles are
  ``lc x lc`` blocks of C.  A ciphertext holds ``nw`` windows of ``lc`` rows, each row
  ``q`` lanes of ``lc`` slots: slot ``s = W*w + R*a + lc*h + b`` (``R = q*lc``,
  ``W = lc*R``).  Lane (w, h) of output ciphertext o holds one tile (cx, cy).
* One operand, X (A or B, the side whose free index is the lane position ``b``), is read
  as ``X[cx*lc + b, K]`` with ``K = p*lc + (a + b + t) mod lc``: step t is a shift of rows
  ``a -> a + t`` inside the window, ``rot(sigma, R*t)`` (one rotation when ``W`` is the
  whole ciphertext, otherwise two rotations and two masks).  This is omega^t.
* The other operand, Y, is read as ``Y[K, cy*lc + a]``: step t shifts each lane
  ``b -> b + t`` cyclically, ``mask*rot(tau, t) + mask*rot(tau, t - lc)``: eps^t.
* ``C[x, y] = sum_{p, t} X-term * Y-term`` lands at (o, w, a, h, b) with ``x = cx*lc + b``,
  ``y = cy*lc + a``.

Every distinct sigma / tau ciphertext is rotated once per step (hoisted), so lanes are
assigned to tiles to share the two-rotation side.  The operands are consumed either
rolled (the edge conversion performs sigma / tau, a Rotom roll) or unrolled and rolled
inside the kernel (a BSGS permutation), whichever the edge makes cheaper; the solver sees
both.  With 2x2 tiles in one tile per ciphertext, Strassen's seven products replace the
eight block products (sigma and tau are linear, so block sums are taken on the rolled
ciphertexts, and each block is still shifted once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from planner.frontend.graph import Graph, Node
from planner.ir.builder import ProgramBuilder
from planner.kernels.base import Candidate
from planner.kernels.convert import plan_conversion
from planner.kernels.problem import KernelError
from planner.layout.channels import MappedLayout

Pattern = tuple[int, ...]

# Strassen's seven products over 2x2 blocks: (left terms, right terms) with signs, and
# the output blocks as signed sums of products.  Blocks are (row, col) of X and Y.
_STRASSEN_L = (
    ((1, (0, 0)), (1, (1, 1))), ((1, (1, 0)), (1, (1, 1))), ((1, (0, 0)),), ((1, (1, 1)),),
    ((1, (0, 0)), (1, (0, 1))), ((1, (1, 0)), (-1, (0, 0))), ((1, (0, 1)), (-1, (1, 1))),
)
_STRASSEN_R = (
    ((1, (0, 0)), (1, (1, 1))), ((1, (0, 0)),), ((1, (0, 1)), (-1, (1, 1))), ((1, (1, 0)), (-1, (0, 0))),
    ((1, (1, 1)),), ((1, (0, 0)), (1, (0, 1))), ((1, (1, 0)), (1, (1, 1))),
)
_STRASSEN_Z = {
    (0, 0): ((1, 0), (1, 3), (-1, 4), (1, 6)),
    (0, 1): ((1, 2), (1, 4)),
    (1, 0): ((1, 1), (1, 3)),
    (1, 1): ((1, 0), (-1, 1), (1, 2), (1, 5)),
}


@dataclass(frozen=True)
class CtCtGeom:
    m: int
    k: int  # inner dimension
    n: int
    S: int
    lc: int
    q: int
    x_side: str  # "A" | "B": the operand shifted by whole rows (omega)
    order: str  # "x-major" | "y-major": how tiles fill the lanes

    def __post_init__(self) -> None:
        if self.lc < 1 or self.q < 1 or self.W > self.S:
            raise KernelError(f"ct-ct jkls: {self.q} lanes of {self.lc}x{self.lc} tiles do not fit {self.S} slots")

    R = property(lambda self: self.q * self.lc)
    W = property(lambda self: self.lc * self.q * self.lc)
    nw = property(lambda self: self.S // self.W)
    G = property(lambda self: self.nw * self.q)
    P = property(lambda self: -(-self.k // self.lc))
    MX = property(lambda self: self.m if self.x_side == "A" else self.n)
    MY = property(lambda self: self.n if self.x_side == "A" else self.m)
    NX = property(lambda self: -(-self.MX // self.lc))
    NY = property(lambda self: -(-self.MY // self.lc))

    @cached_property
    def tiles(self) -> list[tuple[int, int]]:
        if self.order == "x-major":
            return [(cx, cy) for cx in range(self.NX) for cy in range(self.NY)]
        return [(cx, cy) for cy in range(self.NY) for cx in range(self.NX)]

    @property
    def n_out(self) -> int:
        return -(-len(self.tiles) // self.G)

    def lane_tiles(self, o: int) -> list[tuple[int, int]]:
        t = self.tiles[o * self.G : (o + 1) * self.G]
        return t + [(-1, -1)] * (self.G - len(t))

    def x_pattern(self, o: int) -> Pattern:
        return tuple(cx for cx, _ in self.lane_tiles(o))

    def y_pattern(self, o: int) -> Pattern:
        return tuple(cy for _, cy in self.lane_tiles(o))

    @cached_property
    def x_keys(self) -> list[tuple[Pattern, int]]:
        return list(dict.fromkeys((self.x_pattern(o), p) for o in range(self.n_out) for p in range(self.P)))

    @cached_property
    def y_keys(self) -> list[tuple[Pattern, int]]:
        return list(dict.fromkeys((self.y_pattern(o), p) for o in range(self.n_out) for p in range(self.P)))

    # ------------------------------------------------------------------ slot grids
    @cached_property
    def grid(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(lane g, row a, lane offset b, valid) for every slot."""
        s = np.arange(self.S)
        w, r = divmod(s, self.W)
        a, rr = divmod(r, self.R)
        h, b = divmod(rr, self.lc)
        valid = w < self.nw
        g = np.where(valid, w * self.q + h, 0)
        return g, a, b, valid

    def operand_name(self, side: str) -> str:
        """The graph operand ("A" or "B") on the X or Y side."""
        return self.x_side if side == "X" else ("B" if self.x_side == "A" else "A")

    def operand_map(self, side: str, key: tuple[Pattern, int], rolled: bool) -> np.ndarray:
        """Slot -> flat operand index of one sigma (X) or tau (Y) ciphertext.  X reads
        ``X[c*lc + b, K]``, Y reads ``Y[K, c*lc + a]``; rolled ``K = p*lc + (a + b) mod lc``,
        unrolled K follows the row (X) or the lane offset (Y)."""
        pat, p = key
        g, a, b, valid = self.grid
        c = np.asarray(pat)[g]
        free, along = (b, a) if side == "X" else (a, b)
        idx = c * self.lc + free
        kv = p * self.lc + ((a + b) % self.lc if rolled else along)
        ok = valid & (c >= 0) & (idx < (self.MX if side == "X" else self.MY)) & (kv < self.k)
        flat = idx * self.k + kv if self.operand_name(side) == "A" else kv * self.n + idx
        return np.where(ok, flat, -1)

    def out_map(self, o: int) -> np.ndarray:
        g, a, b, valid = self.grid
        lanes = self.lane_tiles(o)
        cx = np.asarray([t[0] for t in lanes])[g]
        cy = np.asarray([t[1] for t in lanes])[g]
        x = cx * self.lc + b
        y = cy * self.lc + a
        ok = valid & (cx >= 0) & (x < self.MX) & (y < self.MY)
        i, j = (x, y) if self.x_side == "A" else (y, x)
        return np.where(ok, i * self.n + j, -1)

    def operand_layout(self, side: str, rolled: bool) -> MappedLayout:
        keys = self.x_keys if side == "X" else self.y_keys
        maps = np.stack([self.operand_map(side, k, rolled) for k in keys])
        name = self.operand_name(side)
        shape = (self.m, self.k) if name == "A" else (self.k, self.n)
        tag = ("sigma" if side == "X" else "tau") if rolled else ("rows" if side == "X" else "cols")
        return MappedLayout.of(shape, maps, True, f"{tag}(lc={self.lc},q={self.q})")

    def out_layout(self) -> MappedLayout:
        maps = np.stack([self.out_map(o) for o in range(self.n_out)])
        return MappedLayout.of((self.m, self.n), maps, True, f"jkls(lc={self.lc},q={self.q},X={self.x_side})")

    def strassen_ok(self) -> bool:
        return self.G == 1 and self.NX == 2 and self.NY == 2 and self.P == 2

    # ------------------------------------------------------------------ lowering
    def _mask(self, b: ProgramBuilder, kind: str, t: int) -> str:
        g, a, bb, valid = self.grid
        coord = a if kind[0] == "x" else bb
        lo = kind.endswith("lo")

        def coef() -> np.ndarray:
            sel = coord < self.lc - t if lo else coord >= self.lc - t
            return (valid & sel).astype(np.float64)

        return b.const_plaintext(("ctct", self.S, self.lc, self.q, kind, t), f"pt/ctct/{kind}/lc{self.lc}q{self.q}t{t}", coef)

    def x_shifts(self, b: ProgramBuilder, reg: str) -> list[str]:
        """omega^t for t < lc: rows a -> a + t inside each window."""
        lc, R, W = self.lc, self.R, self.W
        if W == self.S:
            rots = b.rot_many(reg, [R * t for t in range(lc)])
            return [rots[R * t] for t in range(lc)]
        rots = b.rot_many(reg, [R * t for t in range(lc)] + [R * t - W for t in range(1, lc)])
        out = [reg]
        for t in range(1, lc):
            lo = b.pmul(rots[R * t], self._mask(b, "xlo", t))
            hi = b.pmul(rots[R * t - W], self._mask(b, "xhi", t))
            out.append(b.rescale(b.add(lo, hi)))
        return out

    def y_shifts(self, b: ProgramBuilder, reg: str) -> list[str]:
        """eps^t for t < lc: each lane b -> b + t cyclically."""
        lc = self.lc
        rots = b.rot_many(reg, list(range(lc)) + [t - lc for t in range(1, lc)])
        out = [reg]
        for t in range(1, lc):
            lo = b.pmul(rots[t], self._mask(b, "ylo", t))
            hi = b.pmul(rots[t - lc], self._mask(b, "yhi", t))
            out.append(b.rescale(b.add(lo, hi)))
        return out

    def tile_product(self, b: ProgramBuilder, xs: list[str], ys: list[str], acc: str | None) -> str:
        for xt, yt in zip(xs, ys, strict=True):
            acc = b.accumulate(acc, b.cmul(xt, yt))
        assert acc is not None
        return acc


def _combine(b: ProgramBuilder, terms: list[tuple[int, str]]) -> str:
    sign, acc = terms[0]
    if sign < 0:
        raise ValueError("a signed combination must start with a positive term")
    for s, r in terms[1:]:
        acc = b.add(acc, r) if s > 0 else b.sub(acc, r)
    return acc


def jkls_candidate(
    graph: Graph, node: Node, geom: CtCtGeom, roll_x_inside: bool, roll_y_inside: bool, strassen: bool
) -> Candidate:
    A, B = node.inputs
    xname, yname = (A, B) if geom.x_side == "A" else (B, A)
    x_rolled = geom.operand_layout("X", True)
    y_rolled = geom.operand_layout("Y", True)
    x_in = geom.operand_layout("X", False) if roll_x_inside else x_rolled
    y_in = geom.operand_layout("Y", False) if roll_y_inside else y_rolled
    out = geom.out_layout()
    if strassen and not geom.strassen_ok():
        raise KernelError("Strassen needs 2x2 tiles of one tile per ciphertext")
    xidx = {k: i for i, k in enumerate(geom.x_keys)}
    yidx = {k: i for i, k in enumerate(geom.y_keys)}

    def lower(b: ProgramBuilder, regs: dict[str, list[str]]) -> list[str]:
        xr = regs[xname]
        yr = regs[yname]
        if roll_x_inside:
            xr = plan_conversion(x_in, x_rolled).lower(b, xr, f"{node.id}/sigma")
        if roll_y_inside:
            yr = plan_conversion(y_in, y_rolled).lower(b, yr, f"{node.id}/tau")
        if strassen:
            return _lower_strassen(b, geom, xr, yr, xidx, yidx)
        xs = [geom.x_shifts(b, r) for r in xr]
        ys = [geom.y_shifts(b, r) for r in yr]
        outs = []
        for o in range(geom.n_out):
            acc: str | None = None
            for p in range(geom.P):
                kx = xidx[(geom.x_pattern(o), p)]
                ky = yidx[(geom.y_pattern(o), p)]
                acc = geom.tile_product(b, xs[kx], ys[ky], acc)
            assert acc is not None
            outs.append(b.rescale(acc))
        return outs

    kernel = "ct-ct-strassen" if strassen else "ct-ct-jkls"
    params = {
        "lc": geom.lc, "q": geom.q, "X": geom.x_side, "order": geom.order, "chunks": geom.P,
        "roll_x": "kernel" if roll_x_inside else "edge", "roll_y": "kernel" if roll_y_inside else "edge",
    }
    return Candidate(
        node=node.id, kernel=kernel, params=params,
        in_layouts={xname: x_in, yname: y_in}, out_layout=out, lower=lower,
        slot_utilization=geom.m * geom.n / (geom.n_out * geom.S),
    )


def _lower_strassen(
    b: ProgramBuilder, geom: CtCtGeom, xr: list[str], yr: list[str],
    xidx: dict[tuple[Pattern, int], int], yidx: dict[tuple[Pattern, int], int],
) -> list[str]:
    """Strassen over the 2x2 blocks.  The shifts are linear, so each block is shifted
    once (the rotations of the plain kernel) and the seven products' operands are signed
    sums of shifted blocks: 7 instead of 8 ciphertext products per step."""
    # one tile per ciphertext: X block (cx, p) and Y block (p, cy) are single ciphertexts
    xs = {(cx, p): geom.x_shifts(b, xr[xidx[((cx,), p)]]) for cx in range(2) for p in range(2)}
    ys = {(p, cy): geom.y_shifts(b, yr[yidx[((cy,), p)]]) for p in range(2) for cy in range(2)}
    prods: list[str | None] = [None] * 7
    for t in range(geom.lc):
        for r, (lt, rt) in enumerate(zip(_STRASSEN_L, _STRASSEN_R, strict=True)):
            left = _combine(b, [(s, xs[blk][t]) for s, blk in lt])
            right = _combine(b, [(s, ys[blk][t]) for s, blk in rt])
            prods[r] = b.accumulate(prods[r], b.cmul(left, right))
    outs = []
    for o in range(geom.n_out):
        cx, cy = geom.lane_tiles(o)[0]
        terms = [(s, prods[i]) for s, i in _STRASSEN_Z[(cx, cy)]]
        outs.append(b.rescale(_combine(b, [(s, r) for s, r in terms if r is not None])))
    return outs


def chunk_options(k: int, S: int) -> list[int]:
    """Inner chunk sizes: the whole inner dimension when an lc x lc tile fits, else the
    largest fitting chunk, the balanced chunk and the largest power of two."""
    top = min(k, math.isqrt(S))
    opts = [top, -(-k // -(-k // top)), 1 << (top.bit_length() - 1)]
    return sorted(set(o for o in opts if o >= 1), reverse=True)


def jkls_geoms(m: int, k: int, n: int, S: int) -> list[CtCtGeom]:
    out: list[CtCtGeom] = []
    for lc in chunk_options(k, S):
        for q in sorted({1, S // (lc * lc)}):
            if q < 1:
                continue
            for xs in ("A", "B"):
                best: CtCtGeom | None = None
                best_key: tuple[int, ...] = ()
                for order in ("x-major", "y-major"):
                    try:
                        g = CtCtGeom(m, k, n, S, lc, q, xs, order)
                    except KernelError:
                        continue
                    x_cost = 1 if g.W == S else 2
                    key = (2 * len(g.y_keys) + x_cost * len(g.x_keys), len(g.y_keys))
                    if best is None or key < best_key:
                        best, best_key = g, key
                if best is not None:
                    out.append(best)
    return out


def jkls_candidates(graph: Graph, node: Node, S: int, strassen: bool = True) -> list[Candidate]:
    A, B = node.inputs
    (m, k), (_, n) = graph.shape(A), graph.shape(B)
    out: list[Candidate] = []
    for g in jkls_geoms(m, k, n, S):
        for rx in (False, True):
            for ry in (False, True):
                out.append(jkls_candidate(graph, node, g, rx, ry, False))
                if strassen and g.strassen_ok():
                    out.append(jkls_candidate(graph, node, g, rx, ry, True))
    return out
