"""Solver-neutral choice model: one option per group, pairwise costs on edges.

Groups are graph nodes (options: kernel candidates) and encrypted graph inputs (options:
the layouts the client may pack).  An edge prices every (producer option, consumer
option) pair with the conversion between the producer's out-layout and the layout the
consumer reads (``None``: not allowed).  Costs are non-negative integers (the pipeline
scales the weighted objective), so CP-SAT and z3 optimise the same numbers.

Multiplicative depth is part of the model: each option has a depth (levels its kernel
consumes), each edge pair the depth of its conversion, and with ``max_depth`` set every
group's output depth ``D[g] >= D[src] + conversion + kernel`` must stay within the levels
of the parameters (a plan that does not fit is infeasible, not an error after solving).

Bootstrapping (``boot_weight`` set): every *bootable* group (an encrypted node result that
some node reads) has a decision ``b[g]`` = "bootstrap all ciphertexts of g before its
consumers read it" (per value, not per edge: a value read twice is bootstrapped once).
Depth then counts the levels used since the last bootstrap: consumers read g at
``R[g] = D[g]`` when not bootstrapped, else at ``boot_post`` (the levels the scaling after
the bootstrap uses, 0 or 1); a bootstrapped value needs ``D[g] + boot_pre <= max_depth``
(the scaling or mask before it, per option).  A bootstrap costs ``boot_weight`` per ciphertext of the chosen
option (``n_cts``).  Linearised the same way in CP-SAT and z3.

Bootstrap variants (issue 36): an option may offer, besides the full-slot bootstrap above,
variants (:class:`BootOption`: a sparse bootstrap at 2^k slots, two halves in one, two
ciphertexts in one), each with its own cost (all the option's ciphertexts), levels before
it (``pre``) and the level its readers see (``post``: 1, the unpacking product).  A
bootstrapped group then picks one (option, variant) pair: ``v[g][o][j]`` with
``sum v = b[g]`` and ``v[g][o][j] -> x[g][o]``; the chosen pair's cost, ``pre`` and ``post``
replace the full bootstrap's.  Groups without variants keep the encoding above exactly.

Options that bootstrap inside themselves (``resets``: a NeuJeans CinS conv layer ends in
``bootstrap_cins``, docs/cins.md) read their operands like any option, with their own
levels (``depths``) consumed before the reset: ``P[g] = max(R[src] + conversion) + depth
<= max_depth``; their result leaves at the fixed depth ``resets[o]`` (the levels after
the internal bootstrap), whatever the operands' depth.  Their bootstraps are part of the
option's cost.

Built in named steps by the back ends: variables, choice constraints, edge (layout)
constraints, depth (and bootstraps), objective.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import cached_property

# the label of the full-slot bootstrap (the variant every bootstrapped option has)
FULL = "full"


@dataclass(frozen=True)
class BootOption:
    """A bootstrap variant of one option (issue 36): ``label`` (``s<k>``, ``h<k>``,
    ``p<k>``), the cost of bootstrapping all the option's ciphertexts with it, the levels
    before it (mask, range scaling) and the depth its readers see after it."""

    label: str
    cost: int
    pre: int
    post: int


@dataclass(frozen=True)
class Group:
    name: str
    costs: tuple[int, ...]  # one per option
    labels: tuple[str, ...]
    hint: int = 0  # index of a good option (greedy), given to the solver as a hint
    depths: tuple[int, ...] = ()  # levels each option consumes (empty: none)
    # bootstrapping: ciphertexts of each option's result (empty: 1 each), whether the
    # group may be bootstrapped, the levels of the range scaling before/after a bootstrap
    n_cts: tuple[int, ...] = ()
    bootable: bool = False
    boot_pres: tuple[int, ...] = ()  # per option (empty: 0): e.g. a mask of a dirty layout
    boot_post: int = 0
    boot_hint: bool = False
    # per option (empty: none): None, or the depth of the result of an option that
    # bootstraps inside itself (its ``depths`` entry: the levels it uses before that); it may
    # be below 0 when the bootstrap leaves levels above the top (a CinS layer, docs/cins.md)
    resets: tuple[int | None, ...] = ()
    # per option (empty: none): the bootstrap variants it offers besides the full one
    boot_variants: tuple[tuple[BootOption, ...], ...] = ()
    # the variant of the hinted bootstrap (with ``boot_hint`` and ``hint``)
    variant_hint: str = FULL

    def depth(self, o: int) -> int:
        return self.depths[o] if self.depths else 0

    def n_ct(self, o: int) -> int:
        return self.n_cts[o] if self.n_cts else 1

    def boot_pre(self, o: int) -> int:
        return self.boot_pres[o] if self.boot_pres else 0

    def reset(self, o: int) -> int | None:
        """The result depth of option ``o`` when it bootstraps inside itself, else None."""
        return self.resets[o] if self.resets else None

    def variants(self, o: int) -> tuple[BootOption, ...]:
        """The bootstrap variants option ``o`` offers besides the full one."""
        return self.boot_variants[o] if self.boot_variants else ()

    @property
    def has_variants(self) -> bool:
        return any(self.boot_variants)

    def boot_choice(self, o: int, variant: str, boot_weight: int) -> BootOption | None:
        """Cost, levels before and depth after bootstrapping option ``o`` with ``variant``
        (:data:`FULL` or one of :meth:`variants`); None when the option does not offer it."""
        if variant == FULL:
            return BootOption(FULL, boot_weight * self.n_ct(o), self.boot_pre(o), self.boot_post)
        return next((v for v in self.variants(o) if v.label == variant), None)

    @property
    def has_resets(self) -> bool:
        return any(r is not None for r in self.resets)

    def keep(self, opts: list[int], hint: int | None = None) -> Group:
        """The group restricted to options ``opts`` (in that order)."""
        h = self.hint if hint is None else hint
        return Group(
            self.name, tuple(self.costs[o] for o in opts), tuple(self.labels[o] for o in opts),
            opts.index(h) if h in opts else 0,
            tuple(self.depths[o] for o in opts) if self.depths else (),
            tuple(self.n_cts[o] for o in opts) if self.n_cts else (),
            self.bootable, tuple(self.boot_pres[o] for o in opts) if self.boot_pres else (),
            self.boot_post, self.boot_hint,
            tuple(self.resets[o] for o in opts) if self.resets else (),
            tuple(self.boot_variants[o] for o in opts) if self.boot_variants else (),
            self.variant_hint,
        )


@dataclass(frozen=True)
class Edge:
    src: str  # group name of the producer
    dst: str  # group name of the consumer
    operand: str
    costs: tuple[tuple[int | None, ...], ...]  # [src option][dst option]
    depths: tuple[tuple[int, ...], ...] = ()  # conversion levels [src option][dst option]
    # the source is a free client input read by this edge alone: every consumer option
    # has a source option packed exactly as it reads (cost 0), the others are forbidden
    adapts: bool = False

    def depth(self, a: int, b: int) -> int:
        return self.depths[a][b] if self.depths else 0


@dataclass(frozen=True)
class ChoiceModel:
    groups: tuple[Group, ...]
    edges: tuple[Edge, ...]
    max_depth: int | None = None
    # cost of bootstrapping one ciphertext (None: the parameters cannot bootstrap)
    boot_weight: int | None = None

    @property
    def depth_floor(self) -> int:
        """The lowest depth a value can have: 0, or below when an option's result leaves
        above the top level (a CinS layer whose bootstrap gives SlotsToCoeffs' levels back,
        ``Group.resets`` below 0)."""
        return min([0, *(r for g in self.groups for r in g.resets if r is not None)])

    @property
    def bootstraps(self) -> bool:
        return self.boot_weight is not None and self.max_depth is not None

    def bootable(self) -> list[Group]:
        return [g for g in self.groups if g.bootable] if self.bootstraps else []

    def incoming(self) -> dict[str, list[Edge]]:
        out: dict[str, list[Edge]] = {}
        for e in self.edges:
            out.setdefault(e.dst, []).append(e)
        return out

    def depths_of(self, choice: Mapping[str, int], boots: Collection[str] = (),
                  variants: Mapping[str, str] | None = None) -> dict[str, int]:
        """Output depth of every group under a full choice (groups are topological), the
        groups in ``boots`` bootstrapped (their readers see ``boot_post``, or the ``post``
        of their variant in ``variants``: group -> label, absent: the full bootstrap)."""
        return self.walk_depths(choice, boots, variants)[0]

    def walk_depths(
        self, choice: Mapping[str, int], boots: Collection[str] = (), variants: Mapping[str, str] | None = None
    ) -> tuple[dict[str, int], dict[str, int]]:
        """(output depth, depth before an option's own reset) of every group."""
        variants = variants or {}
        inc = self.incoming()
        d: dict[str, int] = {}
        pre: dict[str, int] = {}
        r: dict[str, int] = {}
        for g in self.groups:
            o = choice[g.name]
            pre[g.name] = max(
                [r[e.src] + e.depth(choice[e.src], o) for e in inc.get(g.name, []) if e.src in r], default=0
            ) + g.depth(o)
            reset = g.reset(o)
            d[g.name] = pre[g.name] if reset is None else reset
            if g.name in boots:
                bc = g.boot_choice(o, variants.get(g.name, FULL), self.boot_weight or 0)
                r[g.name] = bc.post if bc is not None else g.boot_post
            else:
                r[g.name] = d[g.name]
        return d, pre

    def evaluate_boots(self, choice: Mapping[str, int], boots: Collection[str],
                       variants: Mapping[str, str] | None = None) -> int | None:
        """Objective of a choice with the groups ``boots`` bootstrapped, each with its
        variant in ``variants`` (absent: the full bootstrap) (None: infeasible)."""
        boots = frozenset(boots)
        variants = variants or {}
        if boots and not self.bootstraps or any(not self.group(b).bootable for b in boots):
            return None
        if any(v not in boots for v in variants):
            return None
        chosen = {b: self.group(b).boot_choice(choice[b], variants.get(b, FULL), self.boot_weight or 0)
                  for b in boots}
        if any(bc is None for bc in chosen.values()):
            return None
        total = sum(g.costs[choice[g.name]] for g in self.groups)
        for e in self.edges:
            c = e.costs[choice[e.src]][choice[e.dst]]
            if c is None:
                return None
            total += c
        if self.max_depth is not None:
            d, pre = self.walk_depths(choice, boots, variants)
            if max([*d.values(), *pre.values()], default=0) > self.max_depth:
                return None
            if any(d[b] + bc.pre > self.max_depth for b, bc in chosen.items() if bc is not None):
                return None
        total += sum(bc.cost for bc in chosen.values() if bc is not None)
        return total

    @property
    def has_variants(self) -> bool:
        return any(g.has_variants for g in self.groups)

    def without_variants(self) -> ChoiceModel:
        """The model with the full-slot bootstrap only."""
        return replace(self, groups=tuple(replace(g, boot_variants=(), variant_hint=FULL) for g in self.groups))

    def improve_variants(self, choice: Mapping[str, int], boots: Collection[str]) -> dict[str, str]:
        """For a feasible placement, each bootstrapped group in turn (model order) takes its
        cheapest variant that keeps the assignment feasible and lowers the objective: a
        solution of the model without variants made a (no dearer) hint for this one."""
        vs: dict[str, str] = {}
        cur = self.evaluate_boots(choice, boots, vs)
        if cur is None:
            return vs
        for g in self.groups:
            if g.name not in boots:
                continue
            for v in sorted(g.variants(choice[g.name]), key=lambda v: (v.cost, v.label)):
                val = self.evaluate_boots(choice, boots, {**vs, g.name: v.label})
                if val is not None and val < cur:
                    vs[g.name], cur = v.label, val
                    break
        return vs

    def best_variants(self, choice: Mapping[str, int], boots: Collection[str]) -> dict[str, str]:
        """For a placement, each bootstrapped group's cheapest variant that keeps the choice
        feasible (brute force over the variants; a baseline and a check on small models)."""
        names = sorted(b for b in boots if self.group(b).variants(choice[b]))
        best: tuple[int, dict[str, str]] | None = None
        for combo in itertools.product(*[[FULL, *(v.label for v in self.group(b).variants(choice[b]))]
                                         for b in names]):
            vs = {b: v for b, v in zip(names, combo, strict=True) if v != FULL}
            val = self.evaluate_boots(choice, boots, vs)
            if val is not None and (best is None or val < best[0]):
                best = (val, vs)
        return best[1] if best is not None else {}

    def lazy_boots(self, choice: Mapping[str, int]) -> frozenset[str] | None:
        """The first-fit placement (what a compiler without a placement model does): walk
        the groups in order and bootstrap an operand only when the reader would exceed
        ``max_depth`` without it (less the levels its own bootstrap would need first),
        deepest operand first (as late as possible).  None when even that does not fit."""
        if self.max_depth is None:
            return frozenset()
        L = self.max_depth
        inc = self.incoming()
        d: dict[str, int] = {}
        r: dict[str, int] = {}
        boots: set[str] = set()
        for g in self.groups:
            o = choice[g.name]
            edges = [e for e in inc.get(g.name, []) if e.src in r]
            # a value that may be bootstrapped later keeps room for the levels before its
            # bootstrap (its scaling or mask)
            reset = g.reset(o)
            limit = L - (g.boot_pre(o) if g.bootable and self.bootstraps and reset is None else 0)
            while True:
                need = max([r[e.src] + e.depth(choice[e.src], o) for e in edges], default=0) + g.depth(o)
                if need <= limit:
                    break
                cands = [e for e in edges if e.src not in boots and self.group(e.src).bootable and self.bootstraps
                         and d[e.src] + self.group(e.src).boot_pre(choice[e.src]) <= L]
                if not cands:
                    return None
                e = max(cands, key=lambda e: (r[e.src] + e.depth(choice[e.src], o), e.src))
                boots.add(e.src)
                r[e.src] = self.group(e.src).boot_post
            if reset is not None and reset + (g.boot_pre(o) if g.bootable and self.bootstraps else 0) > L:
                return None
            d[g.name] = r[g.name] = need if reset is None else reset
        return frozenset(boots)

    @cached_property
    def _by_name(self) -> dict[str, Group]:
        return {g.name: g for g in self.groups}

    def group(self, name: str) -> Group:
        """The group of that name (constant time: the model of a 100,000-node chain asks
        for a group per edge)."""
        return self._by_name[name]

    def evaluate(self, choice: Mapping[str, int]) -> int | None:
        """Objective of a choice without bootstraps (None: infeasible)."""
        return self.evaluate_boots(choice, ())

    def greedy(self) -> dict[str, int]:
        """Per-group cheapest option in topological (group) order, paying incoming edges:
        the baseline the exact model is compared with, and the solver's hint.  Groups
        without incoming edges (graph inputs) are fixed by their first consumer: each of
        its options takes the input option cheapest for it."""
        choice: dict[str, int] = {}
        depth: dict[str, int] = {}
        incoming = self.incoming()
        deferred = {g.name for g in self.groups if g.name not in incoming}
        for g in self.groups:
            if g.name in deferred:
                continue
            best: tuple[int, int, int, dict[str, int]] | None = None
            for o, c in enumerate(g.costs):
                total = c
                d = 0
                d_boot = 0
                ok = True
                fixed: dict[str, int] = {}
                for e in incoming.get(g.name, []):
                    if e.src in choice:
                        a = choice[e.src]
                    elif e.src in fixed:
                        a = fixed[e.src]
                    else:  # an unfixed input: its cheapest option for this consumer option
                        src = self.group(e.src)
                        opts = [(ec_ + src.costs[a_], a_) for a_ in range(len(src.costs))
                                if (ec_ := e.costs[a_][o]) is not None]
                        if not opts:
                            ok = False
                            break
                        a = min(opts)[1]
                        fixed[e.src] = a
                        total += src.costs[a]
                    ec = e.costs[a][o]
                    if ec is None:
                        ok = False
                        break
                    total += ec
                    d = max(d, depth.get(e.src, 0) + e.depth(a, o))
                    d_boot = max(d_boot, (self.group(e.src).boot_post if self._can_boot(e.src) else depth.get(e.src, 0))
                                 + e.depth(a, o))
                d += g.depth(o)
                d_boot += g.depth(o)
                if self.max_depth is not None and d > self.max_depth:
                    # with bootstrapping, the operands may be bootstrapped (first fit)
                    if self.bootstraps and d_boot <= self.max_depth:
                        d = d_boot
                    else:
                        ok = False
                if g.reset(o) is not None:
                    d = g.reset(o) or 0
                if ok and (best is None or (total, o) < best[:2]):
                    best = (total, o, d, fixed)
            if best is None:
                choice[g.name], depth[g.name] = 0, 0
                continue
            choice[g.name], depth[g.name] = best[1], best[2]
            for name, a in best[3].items():
                choice[name], depth[name] = a, 0
        for name in deferred:
            choice.setdefault(name, 0)
        return {g.name: choice[g.name] for g in self.groups}

    def _can_boot(self, name: str) -> bool:
        return self.bootstraps and self.group(name).bootable

    def greedy_boots(self) -> tuple[dict[str, int], frozenset[str] | None]:
        """The greedy choice with first-fit bootstraps (:meth:`lazy_boots`): the baseline
        a compiler without a placement model reaches."""
        choice = self.greedy()
        return choice, self.lazy_boots(choice)


    def outgoing(self) -> dict[str, list[Edge]]:
        out: dict[str, list[Edge]] = {}
        for e in self.edges:
            out.setdefault(e.src, []).append(e)
        return out

    def prune_dominated(self) -> tuple[ChoiceModel, dict[str, list[int]]]:
        """Drop options no optimal assignment needs (sound dominance; the optimum and its
        objective are unchanged).  Option c1 dominates c2 of the same group when both
        have the same outgoing rows (same out-layout), and for every incoming edge and
        producer option c1 is feasible wherever c2 is, no deeper, and its kernel cost
        plus the largest per-edge conversion difference is at most c2's kernel cost.
        Returns the pruned model and, per group, the kept option indices."""
        inc, outg = self.incoming(), self.outgoing()
        keep = {g.name: list(range(len(g.costs))) for g in self.groups}
        for g in self.groups:
            if g.name not in inc:
                continue
            # same outgoing rows and, for bootstrapping, the same ciphertext count: the two
            # options look alike to every reader and to the bootstrap decision of g; the
            # depth rule below then treats bootstraps like depth (no deeper option dominates)
            sig = {o: (g.n_ct(o), g.boot_pre(o), g.reset(o), g.variants(o), tuple((e.costs[o], e.depths[o] if e.depths else ()) for e in outg.get(g.name, [])))
                   for o in keep[g.name]}
            kept: list[int] = []
            for c2 in sorted(keep[g.name], key=lambda o: (g.costs[o], o)):
                if not any(sig[c1] == sig[c2] and self._dominates(g, c1, c2, inc[g.name], keep) for c1 in kept):
                    kept.append(c2)
            keep[g.name] = sorted(kept)
        groups = tuple(g.keep(keep[g.name]) for g in self.groups)
        edges = tuple(
            Edge(e.src, e.dst, e.operand,
                 tuple(tuple(e.costs[a][b] for b in keep[e.dst]) for a in keep[e.src]),
                 tuple(tuple(e.depths[a][b] for b in keep[e.dst]) for a in keep[e.src]) if e.depths else (),
                 e.adapts)
            for e in self.edges
        )
        return ChoiceModel(groups, edges, self.max_depth, self.boot_weight), keep

    @staticmethod
    def _dominates(g: Group, c1: int, c2: int, incoming: list[Edge], keep: dict[str, list[int]]) -> bool:
        total = g.costs[c1]
        for e in incoming:
            if e.adapts:  # both read a layout the client packs for them, at no cost
                continue
            worst: int | None = None
            for a in keep[e.src]:
                k2 = e.costs[a][c2]
                if k2 is None:
                    continue
                k1 = e.costs[a][c1]
                if k1 is None or e.depth(a, c1) + g.depth(c1) > e.depth(a, c2) + g.depth(c2):
                    return False
                worst = k1 - k2 if worst is None else max(worst, k1 - k2)
            total += worst or 0
        if (not incoming or any(e.adapts for e in incoming)) and g.depth(c1) > g.depth(c2):
            return False
        return total <= g.costs[c2]


class Status(StrEnum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"  # time limit reached with a solution
    INFEASIBLE = "infeasible"
    UNKNOWN = "unknown"  # time limit reached without a solution


@dataclass(frozen=True)
class Solution:
    """Typed, frozen result: one option per group plus the solver's report."""

    choice: tuple[tuple[str, int], ...]
    status: Status
    objective: int | None
    bound: int | None
    seconds: float
    solver: str
    boots: tuple[str, ...] = ()  # bootstrapped groups (model order)
    # the bootstrap variant of each bootstrapped group that is not the full one (issue 36)
    variants: tuple[tuple[str, str], ...] = ()

    def option(self, group: str) -> int:
        return dict(self.choice)[group]
