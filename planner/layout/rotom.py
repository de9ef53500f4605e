"""Rotom's layout representation (shared/papers/rotom-layout-rolls.txt, section 4).

A layout is a list of *traversal dimensions* ``[dim:extent:stride]`` (plus repeated
``[R:n]`` and gap ``[G:n]`` dimensions), split by ``;`` into vector dimensions (which
ciphertext) and slot dimensions (which slot), and a list of *rolls* ``roll(i,j)`` that
replace the indices of traversal dimension ``i`` by ``(ind_i + ind_j) % extent_i``.
Traversal dimensions are nested loops, outermost first; the tensor index along tensor
dimension ``d`` is the sum of ``ind * stride`` over the traversal dimensions of ``d``.
Gap dimensions hold the element at index 0 and zeros elsewhere; repeated dimensions copy.

Unlike Rotom, extents need not be powers of two: indices past a tensor's shape are empty
slots (Rotom's Appendix E names power-of-two padding as a limitation).

Notation, as Rotom prints it: ``roll(0,1) [1:128:1];[R:128:1][0:64:1]``; strides of 1 may
be omitted (``[0:64]``), ``[R:4]`` may be written ``[4]``, several rolls are separated by
spaces before the dimensions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from common.errors import SlotplanError


class NotationError(SlotplanError):
    pass


@dataclass(frozen=True)
class TDim:
    kind: str  # "T" (tensor traversal) | "R" (repeated) | "G" (gap)
    extent: int
    dim: int = -1
    stride: int = 1

    def __post_init__(self) -> None:
        if self.kind not in ("T", "R", "G"):
            raise NotationError(f"unknown traversal kind {self.kind!r}")
        if self.extent < 1 or self.stride < 1:
            raise NotationError(f"traversal extents and strides must be positive: {self}")
        if self.kind == "T" and self.dim < 0:
            raise NotationError("a tensor traversal needs a dimension")

    def text(self) -> str:
        if self.kind == "R":
            return f"[R:{self.extent}]"
        if self.kind == "G":
            return f"[G:{self.extent}]"
        return f"[{self.dim}:{self.extent}:{self.stride}]"


@dataclass(frozen=True)
class RotomLayout:
    shape: tuple[int, ...]
    dims: tuple[TDim, ...]
    n_vec: int  # the first n_vec traversal dimensions are vector (ciphertext) dimensions
    slots: int
    rolls: tuple[tuple[int, int], ...] = ()
    clean: bool = True
    _cache: dict[str, np.ndarray] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.n_vec <= len(self.dims):
            raise NotationError("segmentation index outside the traversal dimensions")
        span = int(np.prod([d.extent for d in self.dims[self.n_vec:]], dtype=np.int64)) if self.dims else 1
        if span > self.slots:
            raise NotationError(f"slot dimensions span {span} slots but a ciphertext has {self.slots}")
        for i, j in self.rolls:
            if not (0 <= i < len(self.dims) and 0 <= j < len(self.dims)) or i == j:
                raise NotationError(f"roll({i},{j}) names no pair of traversal dimensions")
            if self.dims[i].kind != "T":
                raise NotationError(f"roll({i},{j}) rolls a repeated or gap dimension")
        for d in self.dims:
            if d.kind == "T" and d.dim >= len(self.shape):
                raise NotationError(f"traversal over dimension {d.dim} of a rank-{len(self.shape)} tensor")
        covered = self._coverage()
        if not covered:
            raise NotationError(f"layout {self.notation()} does not cover every element of shape {self.shape}")

    # ------------------------------------------------------------------ notation
    def notation(self) -> str:
        vec = "".join(d.text() for d in self.dims[: self.n_vec])
        sl = "".join(d.text() for d in self.dims[self.n_vec :])
        body = f"{vec};{sl}" if self.n_vec else sl
        rolls = "".join(f"roll({i},{j}) " for i, j in self.rolls)
        return rolls + body + ("" if self.clean else "~")

    def __str__(self) -> str:
        return self.notation()

    # ------------------------------------------------------------------ geometry
    @property
    def n_ct(self) -> int:
        return int(np.prod([d.extent for d in self.dims[: self.n_vec]], dtype=np.int64)) if self.n_vec else 1

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def with_clean(self, clean: bool) -> RotomLayout:
        return RotomLayout(self.shape, self.dims, self.n_vec, self.slots, self.rolls, clean)

    def _indices(self) -> tuple[np.ndarray, np.ndarray]:
        """(ct, slot) and flat tensor index of every traversal point (-1: empty)."""
        if "idx" in self._cache:
            return self._cache["pos"], self._cache["idx"]
        ext = [d.extent for d in self.dims]
        grids = np.meshgrid(*[np.arange(e, dtype=np.int64) for e in ext], indexing="ij") if ext else []
        ind = [g.ravel() for g in grids]
        for i, j in self.rolls:
            ind[i] = (ind[i] + ind[j]) % ext[i]
        npts = int(np.prod(ext, dtype=np.int64)) if ext else 1
        tidx = [np.zeros(npts, dtype=np.int64) for _ in self.shape]
        valid = np.ones(npts, dtype=bool)
        for k, d in enumerate(self.dims):
            if d.kind == "T":
                tidx[d.dim] = tidx[d.dim] + ind[k] * d.stride
            elif d.kind == "G":
                valid &= ind[k] == 0
        for t, n in enumerate(self.shape):
            valid &= tidx[t] < n
        flat = np.zeros(npts, dtype=np.int64)
        for t, n in enumerate(self.shape):
            flat = flat * n + tidx[t]
        flat = np.where(valid, flat, -1)
        # position: mixed radix over vector dims (ct) and slot dims (slot), original order
        ct = np.zeros(npts, dtype=np.int64)
        for k in range(self.n_vec):
            ct = ct * ext[k] + (grids[k].ravel() if ext else 0)
        slot = np.zeros(npts, dtype=np.int64)
        for k in range(self.n_vec, len(ext)):
            slot = slot * ext[k] + grids[k].ravel()
        pos = ct * self.slots + slot
        self._cache["pos"], self._cache["idx"] = pos, flat
        return pos, flat

    def _coverage(self) -> bool:
        _, flat = self._indices()
        seen = np.zeros(self.size, dtype=bool)
        seen[flat[flat >= 0]] = True
        return bool(seen.all())

    @cached_property
    def _maps(self) -> np.ndarray:
        pos, flat = self._indices()
        flat_maps = np.full(self.n_ct * self.slots, -1, dtype=np.int64)
        flat_maps[pos] = flat
        maps: np.ndarray = flat_maps.reshape(self.n_ct, self.slots)
        maps.setflags(write=False)
        return maps

    def index_map(self, ct: int) -> np.ndarray:
        return self._maps[ct]


_TD = re.compile(r"\[\s*([^\]]*)\]")
_ROLL = re.compile(r"roll\(\s*(\d+)\s*,\s*(\d+)\s*\)", re.IGNORECASE)


def parse_layout(text: str, shape: tuple[int, ...], slots: int) -> RotomLayout:
    """Parse Rotom notation (see the module docstring) for a tensor of ``shape``."""
    s = text.strip()
    clean = not s.endswith("~")
    s = s.rstrip("~").strip()
    rolls: list[tuple[int, int]] = []
    while True:
        m = _ROLL.match(s)
        if not m:
            break
        rolls.append((int(m.group(1)), int(m.group(2))))
        s = s[m.end() :].strip()
    if s.count(";") > 1:
        raise NotationError(f"{text!r}: at most one ';' (segmentation)")
    vec_part, _, slot_part = s.rpartition(";") if ";" in s else ("", "", s)
    dims: list[TDim] = []
    n_vec = 0
    for part, is_vec in ((vec_part, True), (slot_part, False)):
        pos = 0
        for m in _TD.finditer(part):
            if part[pos : m.start()].strip():
                raise NotationError(f"{text!r}: unexpected {part[pos:m.start()].strip()!r}")
            pos = m.end()
            fields = [f.strip() for f in m.group(1).split(":")]
            try:
                if fields[0].upper() in ("R", "G"):
                    dims.append(TDim(fields[0].upper(), int(fields[1])))
                elif len(fields) == 1:
                    dims.append(TDim("R", int(fields[0])))
                else:
                    stride = int(fields[2]) if len(fields) > 2 else 1
                    dims.append(TDim("T", int(fields[1]), int(fields[0]), stride))
            except (ValueError, IndexError) as e:
                raise NotationError(f"{text!r}: bad traversal [{m.group(1)}]") from e
            if is_vec:
                n_vec += 1
        if part[pos:].strip():
            raise NotationError(f"{text!r}: unexpected {part[pos:].strip()!r}")
    if not dims:
        raise NotationError(f"{text!r}: no traversal dimensions")
    return RotomLayout(tuple(shape), tuple(dims), n_vec, slots, tuple(rolls), clean)
