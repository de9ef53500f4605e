"""Kernel candidates and their exact cost vectors.

A candidate knows how to lower itself into a ProgramBuilder.  Its cost vector is obtained
by lowering it once into a scratch builder and counting instructions, so the cost the
solver optimises is, by construction, the cost of the program the plan contains.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from common.cache import BoundedCache
from planner import ir
from planner.ir.builder import ProgramBuilder
from planner.ir.fusion import FusedCounts, fused_counts

# in_regs: per encrypted operand, the registers of its ciphertexts (in layout order)
LowerFn = Callable[[ProgramBuilder, dict[str, list[str]]], list[str]]


@dataclass(frozen=True)
class CostVector:
    rotations: int = 0
    rot_keys: frozenset[int] = frozenset()
    hoisted_groups: int = 0
    hoisted_rotations: int = 0  # rotations inside rot_hoisted groups (one decomposition each)
    pmul: int = 0
    cmul: int = 0
    add: int = 0
    rescale: int = 0
    poly: int = 0
    depth: int = 0
    plaintexts: int = 0
    ciphertexts_out: int = 0
    slot_utilization: float = 0.0
    # what the Lattigo executor fuses (planner.ir.fusion), priced by a time table; not part of
    # the counts (kernels' analytic costs leave it empty: priced unfused)
    fused: FusedCounts = field(default=FusedCounts(), compare=False)
    # bootstraps inside the kernel (a NeuJeans CinS layer ends in bootstrap_cins)
    bootstraps: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "rotations": self.rotations,
            "rotation_keys": len(self.rot_keys),
            "hoisted_groups": self.hoisted_groups,
            "hoisted_rotations": self.hoisted_rotations,
            "pmul": self.pmul,
            "cmul": self.cmul,
            "add": self.add,
            "rescale": self.rescale,
            "poly": self.poly,
            "depth": self.depth,
            "plaintexts": self.plaintexts,
            "ciphertexts_out": self.ciphertexts_out,
            "slot_utilization": round(self.slot_utilization, 6),
            **({"bootstraps": self.bootstraps} if self.bootstraps else {}),
        }


def sequential(first: CostVector, then: CostVector) -> CostVector:
    """The cost of running ``first`` and then ``then`` on its result (depths add)."""
    return CostVector(
        rotations=first.rotations + then.rotations,
        rot_keys=first.rot_keys | then.rot_keys,
        hoisted_groups=first.hoisted_groups + then.hoisted_groups,
        hoisted_rotations=first.hoisted_rotations + then.hoisted_rotations,
        pmul=first.pmul + then.pmul,
        cmul=first.cmul + then.cmul,
        add=first.add + then.add,
        rescale=first.rescale + then.rescale,
        poly=first.poly + then.poly,
        depth=first.depth + then.depth,
        plaintexts=first.plaintexts + then.plaintexts,
        ciphertexts_out=then.ciphertexts_out or first.ciphertexts_out,
        slot_utilization=first.slot_utilization,
        fused=first.fused + then.fused,
        bootstraps=first.bootstraps + then.bootstraps,
    )


def count_program(
    instrs: Sequence[Mapping[str, Any] | ir.Instr], depth_in: int, depth_out: int, n_pt: int, n_out: int, util: float,
    slots: int | None = None,
) -> CostVector:
    counts: Counter[str] = Counter()
    keys: set[int] = set()
    hoisted = 0
    hoisted_rot = 0
    prog = [ir.decode(raw) for raw in instrs]
    for ins in prog:
        if ins.counter is not None:
            counts[ins.counter] += ins.count()
        keys.update(ins.rot_keys())
        if isinstance(ins, ir.RotHoisted):
            hoisted += 1
            hoisted_rot += ins.count()
    if slots:  # a fused CinS convolution makes its S_(N/2<-l) K's rotations instead of its own
        counts["rotations"] = ir.executed_rotations(prog, slots)
    return CostVector(
        rotations=counts["rotations"],
        rot_keys=frozenset(keys),
        hoisted_groups=hoisted,
        hoisted_rotations=hoisted_rot,
        pmul=counts["pmul"],
        cmul=counts["cmul"],
        add=counts["add"],
        rescale=counts["rescale"],
        poly=counts["poly"],
        depth=depth_out - depth_in,
        plaintexts=n_pt,
        ciphertexts_out=n_out,
        slot_utilization=util,
        fused=fused_counts(prog, slots) if slots else FusedCounts(),
        bootstraps=counts["bootstraps"],
    )


# Cost vectors of structurally identical candidates, shared (ResNet-20 makes the same
# candidates for its six convolutions of a stage: 131 of its 206 scratch lowerings at n16boot
# repeated one before them). A candidate's ``share`` key, set where it is made
# (planner.assign.candidates.share_keys), holds everything its lowering reads: the node's op,
# attributes and operand shapes, the kernel, its parameters, layouts and scales, and the
# lowering's code; tensor names are left out (they name registers and tables, never a count).
# Bounded: an entry is two count vectors (a large kernel's key set: ~100 KB), and a
# long-lived service plans many graphs (ResNet-20 needs ~75 entries).
SHARED_COSTS = BoundedCache[tuple[CostVector | None, FusedCounts | None]](2048)


@dataclass
class Candidate:
    node: str
    kernel: str  # "imra" | "hs-diagonal" | "bsgs" | "fhelipe" | "elementwise" | ...
    params: dict[str, Any]
    in_layouts: dict[str, Any]  # encrypted operand -> layout it consumes (planner.kernels.convert.Layout)
    out_layout: Any
    lower: LowerFn
    slot_utilization: float = 0.0
    note: str = ""
    # the smallest memory cap under which this candidate runs by itself (its working set
    # plus the keys its largest hoisted rotation needs at once); set when a cap is planned
    min_cap_bytes: int | None = None
    analytic: Callable[[], CostVector] | None = field(default=None, repr=False)
    # the kernel object a wrapper may lower again (a CinS conv: planner.assign.cins_flow)
    source: Any = field(default=None, repr=False)
    # the candidate bootstraps inside itself (a NeuJeans CinS layer): its result's depth
    # does not depend on its operands' (solver.model Group.resets)
    resets: bool = False
    # planner.assign.fold: the result registers hold out_scale times the node's value (a
    # Chebyshev change of variable folded into this producer), and the operands named
    # here must arrive scaled by their factor (the solver pairs options accordingly)
    out_scale: float = 1.0
    operand_scales: dict[str, float] = field(default_factory=dict)
    # operands of ``operand_scales`` whose factor a product after their conversion applies
    # (one level on that operand's edge; its producer stays unscaled): a residual sum's skip
    # operand, read elsewhere, while its other operand's chain takes the factor for free
    scale_products: frozenset[str] = frozenset()
    scaled_from: Candidate | None = field(default=None, repr=False, compare=False)
    _cost: CostVector | None = field(default=None, repr=False)
    _fused: FusedCounts | None = field(default=None, repr=False)
    _reset_depths: tuple[int, int] | None = field(default=None, repr=False)
    # structurally identical candidates share their cost (module comment above; None: not
    # shared): set by ``set_share``, ignored by a copy whose lowering or layouts were replaced
    share: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)
    _share_of: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)

    def _identity(self) -> tuple[Any, ...]:
        return (self.lower, self.params, self.in_layouts, self.out_layout, self.operand_scales, self.out_scale,
                self.analytic, self.resets, self.scaled_from, self.source, self.scale_products)

    def set_share(self, key: tuple[Any, ...]) -> None:
        self.share = key
        self._share_of = self._identity()

    def arrival_scale(self, t: str) -> float:
        """The factor operand ``t``'s producer must leave it with for this candidate (1 for
        an operand whose factor a product on its edge applies: ``scale_products``)."""
        return 1.0 if t in self.scale_products else self.operand_scales.get(t, 1.0)

    def derived_share(self, *how: Any) -> tuple[Any, ...] | None:
        """The key of a candidate made from this one by a deterministic step ``how`` (its
        parameters part of ``how``); None where this one has no valid key."""
        mine = self.shared_key(0)
        return None if mine is None else (*mine[:-1], *how)

    def shared_key(self, slots: int) -> tuple[Any, ...] | None:
        """This candidate's ``share`` key at ``slots``; None when it has none or is a copy
        (``dataclasses.replace``) that changed what the key describes."""
        if self.share is None or self._share_of is None:
            return None
        mine = self._identity()
        if any(a is not b for a, b in zip(mine, self._share_of, strict=True)):
            return None
        return (*self.share, slots)

    def cost(self, slots: int, fused: bool = False) -> CostVector:
        """Exact cost vector: analytic when the kernel provides one (tests check it equals
        the lowered program's counts), otherwise counted from a scratch lowering.

        ``fused``: the vector must also say what the Lattigo executor fuses in the
        candidate's program (``CostVector.fused``, priced by a time table with block
        weights). An analytic cost does not know it: the program is lowered once for it
        (without it, a table with block weights priced bsgs / hs-diagonal candidates
        instruction by instruction and lowered ones such as imra fused: conv4 at n13
        chose imra at 272 modelled ms over bsgs at 181)."""
        key = None
        if self._cost is None or (fused and self.analytic is not None and self._fused is None):
            key = self.shared_key(slots)
        if key is not None:
            cost, fz = SHARED_COSTS.get(key) or (None, None)
            if self._cost is None:
                self._cost = cost
            if self._fused is None:
                self._fused = fz
        if self._cost is None and self.analytic is not None:
            self._cost = self.analytic()
        c = self.lowered_cost(slots) if self._cost is None else self._cost
        if fused and self.analytic is not None:
            if self._fused is None:
                b, _ = self.dry_program(slots)
                self._fused = fused_counts(b.objs, slots)
            c = replace(c, fused=self._fused)
        if key is not None:
            SHARED_COSTS.put(key, (self._cost, self._fused))
        return c

    def dry_program(self, slots: int) -> tuple[ProgramBuilder, list[str]]:
        """Lower into a scratch builder (tables stay lazy): the program and output registers."""
        b, _, outs = self.dry_lowering(slots)
        return b, outs

    def dry_lowering(self, slots: int) -> tuple[ProgramBuilder, dict[str, list[str]], list[str]]:
        """``dry_program`` with the operand registers it gave the candidate."""
        b = ProgramBuilder(slots)
        regs: dict[str, list[str]] = {}
        for name, lay in self.in_layouts.items():
            regs[name] = [b._reg(0) for _ in range(lay.n_ct)]
        return b, regs, self.lower(b, regs)

    def lowered_cost(self, slots: int) -> CostVector:
        if self._cost is None or self.analytic is not None:
            b, outs = self.dry_program(slots)
            d_out = max((b.depth[r] for r in outs), default=0)
            counted = count_program(b.objs, 0, d_out, len(b.plaintexts), len(outs), self.slot_utilization, slots)
            if self.analytic is not None:
                return counted
            self._cost = counted
        assert self._cost is not None
        return self._cost

    def reset_depths(self, slots: int) -> tuple[int, int] | None:
        """For a candidate that bootstraps inside itself: (levels it uses on its operands
        before its bootstraps, depth of its result), from a scratch lowering with the
        operands at depth 0; None for any other candidate."""
        if not self.resets:
            return None
        if self._reset_depths is None:
            b, outs = self.dry_program(slots)
            pre = max((b.depth[r] for ins in b.objs if ir.is_bootstrap(ins) for r in ins.reads()),
                      default=0)
            self._reset_depths = (pre, max((b.depth[r] for r in outs), default=0))
        return self._reset_depths

    @property
    def label(self) -> str:
        ps = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()) if not isinstance(v, dict))
        return f"{self.kernel}({ps})"
