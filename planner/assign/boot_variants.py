"""Bootstrap variants as options of the choice model (issue 36, docs/time-model.md).

A bootstrapped value may be refreshed by the full-slot bootstrap (``bootstrap``, depth 0)
or by a variant the parameters offer (``params.boot.variants``) and the cost table prices
(``boot_variants``), each ending in one unpacking product (depth 1) into which the node's
range scaling after the bootstrap is folded (the instruction's ``scale``):

* ``s<k>``: a sparse bootstrap at 2^k slots of each ciphertext; every ciphertext is zero
  outside slots [0, 2^k);
* ``h<k>``: one sparse bootstrap at 2^k slots of each ciphertext whose two halves
  [0, 2^k) and [2^k, 2^(k+1)) travel as the real and imaginary part; zero outside
  [0, 2^(k+1)), values within ``boot.max_abs / 2``;
* ``p<k>``: two ciphertexts of the value (each zero outside [0, 2^k)) in one bootstrap
  (``bootstrap2``): ceil(n/2) instructions, the last one of an odd count a sparse
  ``bootstrap`` at 2^k slots; values within ``boot.max_abs / 2``;
* ``r<k>``: ``s<k>`` without the unpacking product (``bootstrap`` with ``replicas``, depth
  0): the sparse bootstrap's copies of slots [0, 2^k) stay in the others, for a layout
  whose readers already take it dirty (their kernels read no free slot), the node's scale
  an exact integer product as the full bootstrap's.  Where the table has no ``r<k>``, priced
  as ``s<k>`` less its unpacking product (planner.cost.timing.TimeModel.variant_units: one
  plaintext product and rescale at the top level, under 1% of the bootstrap).

A layout is zero outside its used slots when it is clean; a dirty one (free slots holding
partial sums) is masked first, as before the full bootstrap (one level before).  Values
scaled down before a bootstrap are scaled by ``1/s`` (``s``: the node's bootstrap scale,
:func:`planner.frontend.ranges.boot_scale`; ``s/2``-halved budgets for halves and pairs).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from planner.cost.tables import OBJECTIVE_SCALE, CostTable
from planner.cost.timing import TimeModel
from planner.frontend.params import Params
from planner.ir.instructions import MAX_BOOT_IN_SCALE, MAX_BOOT_SCALE
from solver.model import FULL, BootOption

_LABEL = re.compile(r"^([shpr])(\d+)$")
KINDS = {"s": "sparse", "h": "halves", "p": "pair", "r": "replicas"}


@dataclass(frozen=True)
class Variant:
    """A variant label parsed: its kind (``s``, ``h``, ``p``) and log2 slot count."""

    kind: str
    log_slots: int

    @property
    def label(self) -> str:
        return f"{self.kind}{self.log_slots}"

    @property
    def packed(self) -> bool:
        """Two real values per complex slot (halves, pairs): values within max_abs / 2."""
        return self.kind in ("h", "p")

    @staticmethod
    def parse(label: str) -> Variant | None:
        m = _LABEL.match(label)
        return Variant(m.group(1), int(m.group(2))) if m else None


def instructions(kind: str, n_ct: int) -> dict[str, int]:
    """The instructions a variant of ``kind`` runs for ``n_ct`` ciphertexts, by the key
    of their price: a pair variant one ``p`` per two, an odd last one as ``s``."""
    if kind == "p":
        return {"p": n_ct // 2, "s": n_ct % 2}
    return {kind: n_ct}


def priced(costs: CostTable, params: Params, enabled: bool = True,
           slots: Collection[int] | None = None) -> dict[str, float]:
    """The variants the choice model may use: offered by the params, priced by the table
    and, with ``slots`` (``PlanOptions.boot_variant_slots``), at one of those slot counts
    (label -> table units per instruction)."""
    if not enabled or params.boot is None or not costs.boot_variants:
        return {}
    offered = {v.log_slots for v in params.boot.variants}
    if slots is not None:
        offered &= set(slots)
    shift = params.variant_shift  # a batch's block ring: the table prices the real ring's variant
    out = {}
    for label, w in sorted(costs.boot_variants.items()):
        v = Variant.parse(label)
        if v is None:
            continue
        k = v.log_slots - shift
        if k in offered and (1 << k) < params.slots:
            if v.kind == "h" and (2 << k) > params.slots:
                continue
            out[f"{v.kind}{k}"] = float(w)
    tm = TimeModel(costs)
    for k in [int(lab[1:]) for lab in out if lab[0] == "s"]:  # (replicas: see above)
        r = tm.variant_units(f"r{k + shift}")
        assert r is not None
        out.setdefault(f"r{k}", float(r))
    return dict(sorted(out.items()))


@lru_cache(maxsize=4096)
def used_span(lay: object) -> int | None:
    """1 + the highest slot any ciphertext of the layout holds an element in (None: a
    layout without index maps)."""
    index_map = getattr(lay, "index_map", None)
    n = getattr(lay, "n_ct", None)
    if index_map is None or not isinstance(n, int):
        return None
    top = 0
    for q in range(n):
        nz = np.flatnonzero(np.asarray(index_map(q)) >= 0)
        if nz.size:
            top = max(top, int(nz[-1]) + 1)
    return top


def options(
    lay: object, n_ct: int, clean: bool, s: int, s_half: int, prices: Mapping[str, float],
    full: BootOption, absorbs: bool = False, replicas: bool = False, halves_free: bool = False,
) -> tuple[BootOption, ...]:
    """The variants of one option besides the full bootstrap ``full`` (its cost, levels
    before and after): per kind the cheapest priced one that the layout fits, unless the
    full bootstrap or another variant is no dearer and needs no more levels.  ``clean``: the
    layout is zero outside its used slots, or its mask costs no level (the node's polys take
    it); ``absorbs``: the option's own plaintext products (or polys) take the ``1/scale``
    before it (no level); ``replicas``: its readers take the result with copies in its
    free slots (planner.assign.problem._reads_replicas), so the ``r<k>`` variants apply;
    ``halves_free``: every result register is a poly's that nothing else reads
    (planner.assign.fold.result_masks), so the halves packing, the ``1/scale`` and a dirty
    layout's mask are that poly's complex mask (no level: ir.Bootstrap ``premasked``)."""
    if not prices:
        return ()
    span = used_span(lay)
    if span is None:
        return ()
    best: dict[str, BootOption] = {}
    for label in prices:
        v = Variant.parse(label)
        assert v is not None
        n = 1 << v.log_slots
        if v.kind in "sr" and span > n or v.kind == "h" and span > 2 * n or v.kind == "p" and (span > n or n_ct < 2):
            continue
        if v.kind == "r" and not replicas:
            continue
        units = 0
        ok = True
        for key, count in instructions(v.kind, n_ct).items():
            p = prices.get(f"{key}{v.log_slots}") if count else 0.0
            if p is None:
                ok = False
                break
            units += count * int(round(p * OBJECTIVE_SCALE))
        if not ok:
            continue
        scale = s_half if v.packed else s
        if scale > MAX_BOOT_SCALE:  # the unpacking product's factor has a bound
            continue
        # the 1/scale before it: the bootstrap's in_scale (no level) but for pairs
        # (bootstrap2: one product, unless the option's own products take it); a dirty
        # layout's mask: one level. halves: the executor multiplies the source by a complex
        # mask (1 on the low half, i on the high one) before the sparse bootstrap, one level
        # (docs/formats.md), unless a poly of the node's takes it (halves_free)
        if v.kind == "p":
            pre = int(scale > 1 and not absorbs or not clean)
        elif v.kind == "h" and halves_free:
            pre = 0
        else:
            # (in_scale takes the 1/scale up to its bound, 2^12; a product above it)
            pre = (0 if absorbs else 1 if not clean else int(scale > MAX_BOOT_IN_SCALE)) + (1 if v.kind == "h" else 0)
        opt = BootOption(label, units, pre, 0 if v.kind == "r" else 1)
        cur = best.get(v.kind)
        if cur is None or (opt.cost, v.log_slots) < (cur.cost, Variant.parse(cur.label).log_slots):  # type: ignore[union-attr]
            best[v.kind] = opt
    out: list[BootOption] = []
    for opt in sorted(best.values(), key=lambda o: (o.cost, o.label)):
        if any(_no_worse(o, opt) for o in [full, *out]):
            continue
        out.append(opt)
    return tuple(sorted(out, key=lambda o: o.label))


def _no_worse(a: BootOption, b: BootOption) -> bool:
    return a.cost <= b.cost and a.pre <= b.pre and a.post <= b.post


def chosen(variants: Mapping[str, str], node: str) -> Variant | None:
    """The variant of a bootstrapped node (None: the full bootstrap)."""
    label = variants.get(node, FULL)
    return None if label == FULL else Variant.parse(label)
