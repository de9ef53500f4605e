"""Ciphertext layouts: which tensor element sits in which slot of which ciphertext.

The layouts the MetaKernel (IMRA) and diagonal kernels work on are *channel-affine*:
a tensor is viewed as ``C`` channels of an ``H x W`` grid (a vector of length ``k`` is
``k`` channels of a 1x1 grid).  Ciphertext ``q`` holds channels
``[q * cpc, (q + 1) * cpc)``; element ``(c, h, w)`` of local channel ``cl = c - q * cpc``
sits at slot ``base + cl * lc + h * lh + w * lw`` (plus ``r * period`` for each of
``reps`` periodic copies).  The row-major CHW layout is ``lc = H * W, lh = W, lw = 1``;
a stride-2 convolution leaves ``lh = 2 W, lw = 2`` (a layout with gaps), which the next
kernel can consume directly.

``clean`` says whether every slot that holds no element is zero.  Kernels that replicate
a ciphertext by rotate-and-add need a clean input; a mask conversion makes one.  A layout
that is not clean prints with a trailing ``~``: its free slots may hold garbage (partial
sums, rotated-in neighbours, polynomial constants).

What an element-wise operation does to the free slots is one rule, :func:`clean_result`
(every kernel states its claim through it or through a layout; the tests derive the claim
from the lowered program and compare, see ``backends/layout_check.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from common.errors import SlotplanError


class LayoutError(SlotplanError):
    """A layout that cannot exist (slots out of range, two elements in one slot)."""


# Element-wise operations whose effect on free slots clean_result knows.
CLEAN_RULE_OPS = ("add", "sub", "mul", "poly")


def clean_result(op: str, operands_clean: Sequence[bool], const_term: float = 0.0) -> bool:
    """Whether the result of a slot-wise operation on operands sharing one placement is
    clean (zero in every slot that holds no element), given which operands are clean.

    A plaintext operand counts as clean: its table holds 0 where ``idx < 0`` (SPEC section
    4), and a mask plaintext is 0 outside the tensor by construction.

    - ``add`` / ``sub`` (ct+ct, ct+pt): free slots hold the sum of the operands' free slots,
      so the result is clean only when every operand is.
    - ``mul`` (ct*ct, ct*pt): ``0 * g = 0``, so one clean operand suffices; ``g * g`` (a
      square of a dirty layout) keeps garbage.
    - ``poly``: free slots hold ``p(g)``; clean only when the operand is clean and
      ``p(0) = const_term = 0``.
    """
    if op not in CLEAN_RULE_OPS:
        raise ValueError(f"no cleanliness rule for op {op!r}")
    if not operands_clean:
        raise ValueError("clean_result needs at least one operand")
    if op in ("add", "sub"):
        return all(operands_clean)
    if op == "mul":
        return any(operands_clean)
    return operands_clean[0] and const_term == 0.0


@dataclass(frozen=True)
class ChannelLayout:
    shape: tuple[int, ...]  # logical tensor shape
    channels: int  # C of the (C, H, W) view
    height: int
    width: int
    slots: int
    cpc: int  # channels per ciphertext
    lc: int  # slot distance between channels
    lh: int  # slot distance between rows
    lw: int  # slot distance between columns
    base: int = 0
    reps: int = 1  # periodic copies of each ciphertext's content
    period: int = 0  # slot distance between copies (0 when reps == 1)
    clean: bool = True
    limit: int = 0  # copies are cut at this slot (0: no cut); lets the last copy be partial
    # tensor axes viewed as (channel, h, w); () = the tensor flattened (or its own (C, H, W))
    axes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.cpc < 1 or self.lc < 1 or self.lh < 1 or self.lw < 1:
            raise LayoutError(f"layout strides must be positive: {self}")
        if self.reps > 1 and self.period < 1:
            raise LayoutError("a replicated layout needs a positive period")
        if self.extent > self.slots:
            raise LayoutError(
                f"layout needs {self.extent} slots per ciphertext but a ciphertext has {self.slots}"
            )

    # ------------------------------------------------------------------ geometry
    @property
    def n_ct(self) -> int:
        return -(-self.channels // self.cpc)

    @property
    def size(self) -> int:
        """Elements of the logical tensor (the grid may be larger: extra cells are absent)."""
        return int(np.prod(self.shape))

    @property
    def block_extent(self) -> int:
        """Slots spanned by the data of one ciphertext's channels (one copy)."""
        last = self.base + (self.cpc - 1) * self.lc + (self.height - 1) * self.lh + (self.width - 1) * self.lw
        return max(last + 1, self.cpc * self.lc)

    @property
    def extent(self) -> int:
        full = self.block_extent + (self.reps - 1) * self.period
        return min(full, self.limit) if self.limit else full

    @property
    def is_natural(self) -> bool:
        """Row-major channel blocks, no gaps, one copy (what a previous layer leaves)."""
        return (
            self.base == 0
            and self.lw == 1
            and self.lh == self.width
            and self.lc == self.height * self.width
            and self.reps == 1
        )

    def notation(self) -> str:
        """A compact, Rotom-like description: dims outer to inner as [dim:extent:slot-stride]."""
        parts = []
        if self.n_ct > 1:
            parts.append(f"ct[c/{self.cpc}:{self.n_ct}]")
        names = [str(a) for a in self.axes] + ["h", "w"] if self.axes else ["c", "h", "w"]
        dims = [f"[{names[0]}:{min(self.cpc, self.channels)}:{self.lc}]"]
        if self.height > 1:
            dims.append(f"[{names[1]}:{self.height}:{self.lh}]")
        if self.width > 1:
            dims.append(f"[{names[2]}:{self.width}:{self.lw}]")
        if self.base:
            dims.insert(0, f"+{self.base}")
        if self.reps > 1:
            cut = f"<{self.limit}" if self.limit else ""
            dims.insert(0, f"[R:{self.reps}:{self.period}{cut}]")
        s = ";".join(parts + ["".join(dims)])
        return s if self.clean else s + "~"

    def with_clean(self, clean: bool) -> ChannelLayout:
        return replace(self, clean=clean)

    # ------------------------------------------------------------------ tables
    def slot_of(self, c: np.ndarray, h: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ciphertext, slot) of elements (first copy)."""
        q = c // self.cpc
        s = self.base + (c - q * self.cpc) * self.lc + h * self.lh + w * self.lw
        return q, s

    @cached_property
    def _maps(self) -> np.ndarray:
        maps = np.full((self.n_ct, self.slots), -1, dtype=np.int64)
        c, h, w = np.meshgrid(
            np.arange(self.channels), np.arange(self.height), np.arange(self.width), indexing="ij"
        )
        if self.axes:
            t = [np.zeros(c.size, dtype=np.int64) for _ in self.shape]
            for ax, v in zip(self.axes, (c, h, w), strict=False):
                t[ax] = v.ravel()
            flat = np.ravel_multi_index(tuple(t), self.shape) if self.shape else np.zeros(c.size, dtype=np.int64)
            flat = np.asarray(flat, dtype=np.int64)
        else:
            flat = (c * self.height * self.width + h * self.width + w).ravel()
        q, s = self.slot_of(c.ravel(), h.ravel(), w.ravel())
        real = flat < self.size
        flat, q, s = flat[real], q[real], s[real]
        for r in range(self.reps):
            sr = s + r * self.period
            keep = sr < self.limit if self.limit else np.ones(sr.shape, dtype=bool)
            if np.any(maps[q[keep], sr[keep]] >= 0):
                raise LayoutError(f"two elements share a slot in layout {self.notation()}")
            maps[q[keep], sr[keep]] = flat[keep]
        maps.setflags(write=False)
        return maps

    def index_map(self, ct: int) -> np.ndarray:
        """idx[s] = flat element index held in slot s of ciphertext ct, or -1."""
        return self._maps[ct]

    def validate(self) -> None:
        """Raise LayoutError when two elements collide (materialises the maps)."""
        _ = self._maps


def vector_shape_view(shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(shape) == 1:
        return shape[0], 1, 1
    if len(shape) == 3:
        return shape[0], shape[1], shape[2]
    n = int(np.prod(shape))
    return n, 1, 1


def channels_per_ct(channels: int, block: int, slots: int) -> int:
    """Channels per ciphertext for a natural layout.

    MetaKernel (section 4.2.4, Table 8) partitions along channels so that each part fits a
    ciphertext, using equal parts: the largest divisor of C that fits.  When that divisor
    would waste more than half of what fits (e.g. a prime channel count), fill the
    ciphertexts instead and let the last one be partial.
    """
    fit = slots // block
    if fit < 1:
        raise LayoutError(
            f"one channel of {block} elements does not fit a ciphertext of {slots} slots"
        )
    if channels <= fit:
        return channels
    best = max(d for d in range(1, fit + 1) if channels % d == 0)
    return best if 2 * best >= fit else fit


def view_layout(shape: tuple[int, ...], slots: int, axes: tuple[int, ...]) -> ChannelLayout:
    """Packed layout viewing tensor ``axes`` as (channel, h, w), channels whole per ciphertext:
    ``axes=(1, 0)`` of an (m, k) matrix is column-major (k channels of m slots)."""
    dims = [shape[a] for a in axes] + [1] * (3 - len(axes))
    c, h, w = dims[0], dims[1], dims[2]
    block = h * w
    cpc = min(c, slots) if block == 1 else channels_per_ct(c, block, slots)
    return ChannelLayout(
        shape=tuple(shape), channels=c, height=h, width=w, slots=slots,
        cpc=cpc, lc=block, lh=w, lw=1, axes=tuple(axes),
    )


def natural_layout(shape: tuple[int, ...], slots: int) -> ChannelLayout:
    """Row-major layout with whole channels per ciphertext (what a user or a previous layer has)."""
    if len(shape) == 2 and shape[1] <= slots:
        return view_layout(shape, slots, (0, 1))
    c, h, w = vector_shape_view(shape)
    block = h * w
    if block == 1:
        cpc = min(c, slots)
    else:
        cpc = channels_per_ct(c, block, slots)
    return ChannelLayout(
        shape=tuple(shape), channels=c, height=h, width=w, slots=slots,
        cpc=cpc, lc=block, lh=w, lw=1,
    )


@dataclass(frozen=True, eq=False)
class MappedLayout:
    """A layout given by its index maps (e.g. a reshaped view of another layout)."""

    shape: tuple[int, ...]
    slots: int
    n_ct_: int
    data: bytes  # int64 index maps, n_ct x slots
    clean: bool = True
    label: str = "mapped"

    @staticmethod
    def of(shape: tuple[int, ...], maps: np.ndarray, clean: bool, label: str) -> MappedLayout:
        m = np.ascontiguousarray(maps, dtype=np.int64)
        return MappedLayout(tuple(shape), int(m.shape[1]), int(m.shape[0]), m.tobytes(), clean, label)

    @property
    def n_ct(self) -> int:
        return self.n_ct_

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def index_map(self, ct: int) -> np.ndarray:
        return np.frombuffer(self.data, dtype=np.int64).reshape(self.n_ct_, self.slots)[ct]

    def with_clean(self, clean: bool) -> MappedLayout:
        return MappedLayout(self.shape, self.slots, self.n_ct_, self.data, clean, self.label)

    def notation(self) -> str:
        return f"{self.label}{list(self.shape)}x{self.n_ct_}ct" + ("" if self.clean else "~")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MappedLayout) and (self.shape, self.slots, self.data, self.clean) == (
            other.shape, other.slots, other.data, other.clean)

    def __hash__(self) -> int:
        return hash((self.shape, self.slots, self.data, self.clean))


def all_maps(lay: object) -> np.ndarray:
    n = lay.n_ct  # type: ignore[attr-defined]
    return np.stack([lay.index_map(q) for q in range(n)])  # type: ignore[attr-defined]
