"""Kernels for the ops whole models need beyond the linear ones: ``slice``, ``concat`` and
``matmul`` over a batch (attention heads).

* slice: a view.  The result is the operand's ciphertexts that hold any sliced element,
  read with new index maps (each kept element renumbered, the others gone).  Zero cost; the
  slots of dropped elements still hold their values, so the view of a clean layout is
  *dirty* (``~``) unless nothing was dropped: a consumer that needs zeros pays a mask on its
  edge (planner/kernels/convert.py), and a graph output is masked by the clean-output rule.
* concat: a view too.  The result's ciphertexts are the operands' ciphertexts one after
  the other, each element renumbered to its place in the concatenation; clean when every
  operand is.  A weight operand is encrypted into the result as ``x - x + w`` (no level) on
  the first ciphertext of an encrypted operand.
* batched matmul: the 2-D kernels unrolled per batch entry.  One 2-D candidate (planned
  for the (m, k) x (k, n) problem, any kernel family) is lowered once per entry of the
  broadcast batch, on that entry's block of ciphertexts; a weight operand's plaintexts read
  its entry's block (``ProgramBuilder.weight_blocks``), and an operand without batch (or
  with batch 1) is read from the same ciphertexts by every entry.  The stacked layouts
  (entry after entry) are what the candidate reads and writes; the edges price whatever
  conversion the producers need.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from planner.frontend.graph import Graph, Node, parse_graph
from planner.ir.builder import ProgramBuilder
from planner.kernels.base import Candidate, CostVector
from planner.layout.channels import MappedLayout, all_maps

# ----------------------------------------------------------------------------- slice


def slice_candidate(graph: Graph, node: Node, lay: Any) -> Candidate:
    x = node.inputs[0]
    in_shape = graph.shape(x)
    out_shape = graph.shape(node.id)
    assert node.axis is not None and node.start is not None and node.stop is not None
    axis, start, stop = node.axis, node.start, node.stop
    # flat index of x -> flat index of the slice, or -1 for a dropped element
    grid = np.arange(math.prod(in_shape), dtype=np.int64).reshape(in_shape)
    remap = np.full(grid.size, -1, dtype=np.int64)
    index = [slice(None)] * len(in_shape)
    index[axis] = slice(start, stop)
    remap[grid[tuple(index)].ravel()] = np.arange(math.prod(out_shape), dtype=np.int64)
    maps = all_maps(lay)
    mapped = np.where(maps >= 0, remap[np.maximum(maps, 0)], -1)
    keep = [q for q in range(mapped.shape[0]) if np.any(mapped[q] >= 0)]
    dropped = stop - start < in_shape[axis]
    out = MappedLayout.of(out_shape, mapped[keep], lay.clean and not dropped, "slice")

    def lower(b: ProgramBuilder, regs: dict[str, list[str]]) -> list[str]:
        return [regs[x][q] for q in keep]

    return Candidate(
        node=node.id, kernel="view", params={"op": "slice", "axis": axis, "start": start, "stop": stop},
        in_layouts={x: lay}, out_layout=out, lower=lower,
        analytic=lambda: CostVector(ciphertexts_out=len(keep)),
    )


# ----------------------------------------------------------------------------- concat


def _concat_offsets(graph: Graph, node: Node) -> list[np.ndarray]:
    """Per operand, the flat index of each of its elements in the concatenation."""
    assert node.axis is not None
    out_shape = graph.shape(node.id)
    grid = np.arange(math.prod(out_shape), dtype=np.int64).reshape(out_shape)
    out: list[np.ndarray] = []
    pos = 0
    for t in node.inputs:
        n = graph.shape(t)[node.axis]
        index = [slice(None)] * len(out_shape)
        index[node.axis] = slice(pos, pos + n)
        out.append(np.ascontiguousarray(grid[tuple(index)].ravel()))
        pos += n
    return out


def concat_candidate(graph: Graph, node: Node, lays: dict[str, Any], weight_lays: dict[str, Any]) -> Candidate:
    """``lays``: the layout each encrypted operand is read in; ``weight_lays``: the layout a
    weight operand is encrypted into."""
    offsets = _concat_offsets(graph, node)
    blocks: list[np.ndarray] = []
    for j, t in enumerate(node.inputs):
        lay = lays.get(t, weight_lays.get(t))
        maps = all_maps(lay)
        blocks.append(np.where(maps >= 0, offsets[j][np.maximum(maps, 0)], -1))
    clean = all(lay.clean for lay in lays.values())
    out = MappedLayout.of(graph.shape(node.id), np.concatenate(blocks), clean, "concat")
    enc = [t for t in node.inputs if t in lays]

    def lower(b: ProgramBuilder, regs: dict[str, list[str]]) -> list[str]:
        outs: list[str] = []
        zero: str | None = None
        for t in node.inputs:
            if t in lays:
                outs.extend(regs[t])
                continue
            if zero is None:
                r0 = regs[enc[0]][0]
                zero = b.sub(r0, r0)
            wl = weight_lays[t]
            for q in range(wl.n_ct):
                pt = b.plaintext(t, f"pt/{node.id}/{t}/{q}", _table_of(wl, q))
                outs.append(b.padd(zero, pt))
        return outs

    return Candidate(
        node=node.id, kernel="view", params={"op": "concat", "axis": node.axis},
        in_layouts=dict(lays), out_layout=out, lower=lower,
    )


def _table_of(lay: Any, q: int) -> Callable[[], tuple[np.ndarray, None]]:
    def gen() -> tuple[np.ndarray, None]:
        return np.asarray(lay.index_map(q), dtype=np.int64).copy(), None

    return gen


# ----------------------------------------------------------------------------- batched matmul


def _batch_index(shape: Sequence[int], batch: Sequence[int]) -> np.ndarray:
    """For every entry of the broadcast ``batch`` (row-major), the entry of an operand of
    ``shape`` (rank >= 2) that np.matmul reads (its own batch dimensions broadcast)."""
    own = tuple(shape[:-2])
    n_own = math.prod(own) if own else 1
    grid = np.arange(n_own, dtype=np.int64).reshape(own) if own else np.zeros((), dtype=np.int64)
    return np.ascontiguousarray(np.broadcast_to(grid, tuple(batch)).ravel())


def matrix_subgraph(graph: Graph, node: Node) -> Graph:
    """The (m, k) x (k, n) matmul one batch entry of ``node`` computes, with the operands'
    names (so the 2-D kernels name the right weight) and encryption."""
    A, B = node.inputs
    sa, sb = graph.shape(A), graph.shape(B)
    tensors = {A: {"shape": list(sa[-2:]), "role": "input" if graph.encrypted(A) else "weight"}}
    if B != A:
        tensors[B] = {"shape": list(sb[-2:]), "role": "input" if graph.encrypted(B) else "weight"}
    return parse_graph({
        "schema": "slotplan.graph/1", "name": f"{graph.name}/{node.id}/entry",
        "tensors": tensors, "nodes": [{"id": node.id, "op": "matmul", "inputs": [A, B]}], "outputs": [node.id],
    })


def _stack(lay: Any, shape: tuple[int, ...], entries: int, clean: bool | None = None) -> Any:
    """``entries`` copies of a 2-D layout, entry e's elements offset by e * (its size)."""
    maps = all_maps(lay)
    size = lay.size
    blocks = [np.where(maps >= 0, maps + e * size, -1) for e in range(entries)]
    return MappedLayout.of(shape, np.concatenate(blocks), lay.clean if clean is None else clean, "batch")


def batched_matmul_candidate(graph: Graph, node: Node, inner: Candidate, slots: int) -> Candidate:
    """Unroll the 2-D candidate ``inner`` (of :func:`matrix_subgraph`) over the batch."""
    A, B = node.inputs
    out_shape = graph.shape(node.id)
    batch = out_shape[:-2]
    n_entries = math.prod(batch)
    entry_of = {t: _batch_index(graph.shape(t), batch) for t in (A, B)}
    n_own = {t: (math.prod(graph.shape(t)[:-2]) if len(graph.shape(t)) > 2 else 1) for t in (A, B)}
    in_layouts: dict[str, Any] = {}
    for t, lay in inner.in_layouts.items():
        shape = graph.shape(t)
        in_layouts[t] = _stack(lay, shape, n_own[t]) if len(shape) > 2 else lay
    out_layout = _stack(inner.out_layout, out_shape, n_entries)
    weight = {t: math.prod(graph.shape(t)[-2:]) for t in dict.fromkeys((A, B)) if not graph.encrypted(t)}

    def lower(b: ProgramBuilder, regs: dict[str, list[str]]) -> list[str]:
        outs: list[str] = []
        for e in range(n_entries):
            sub: dict[str, list[str]] = {}
            for t, lay in inner.in_layouts.items():
                n = lay.n_ct
                own = int(entry_of[t][e]) if len(graph.shape(t)) > 2 else 0
                sub[t] = regs[t][own * n:(own + 1) * n]
            saved = dict(b.weight_blocks)
            for w, size in weight.items():
                b.weight_blocks[w] = int(entry_of[w][e]) * size
            try:
                outs.extend(inner.lower(b, sub))
            finally:
                b.weight_blocks.clear()
                b.weight_blocks.update(saved)
        return outs

    def analytic() -> CostVector:
        """The entry's counts times the entries; plaintexts: the weight's per distinct block
        read, the constant ones (masks, shared by key) once."""
        c = inner.cost(slots)
        b, _ = inner.dry_program(slots)
        n_weight = sum(1 for p in b.plaintexts.values() if p.source in weight)
        blocks = len({int(entry_of[w][e]) for w in weight for e in range(n_entries)}) if weight else 1
        return CostVector(
            rotations=c.rotations * n_entries, rot_keys=c.rot_keys,
            hoisted_groups=c.hoisted_groups * n_entries, hoisted_rotations=c.hoisted_rotations * n_entries,
            pmul=c.pmul * n_entries, cmul=c.cmul * n_entries, add=c.add * n_entries,
            rescale=c.rescale * n_entries, poly=c.poly * n_entries, depth=c.depth,
            plaintexts=c.plaintexts - n_weight + n_weight * blocks,
            ciphertexts_out=c.ciphertexts_out * n_entries, slot_utilization=c.slot_utilization,
        )

    return Candidate(
        node=node.id, kernel=inner.kernel, params={**inner.params, "batch": list(batch)},
        in_layouts=in_layouts, out_layout=out_layout, lower=lower, slot_utilization=inner.slot_utilization,
        note=inner.note, analytic=analytic,
    )


# ----------------------------------------------------------------------------- packed forms


def _restrict(lay: Any, elements: np.ndarray, shape: tuple[int, ...], label: str) -> tuple[Any, list[int]]:
    """``lay`` (a layout of a larger tensor) restricted to ``elements`` (their flat indices
    there, in the order of the smaller tensor of ``shape``): the ciphertexts holding any of
    them, with every other slot free.  Returns the layout and those ciphertexts."""
    maps = all_maps(lay)
    local = np.full(int(maps.max()) + 1 if maps.size else 0, -1, dtype=np.int64)
    inside = elements[elements < local.size]
    local[inside] = np.nonzero(elements < local.size)[0]
    mapped = np.where(maps >= 0, local[np.maximum(maps, 0)], -1)
    keep = [q for q in range(mapped.shape[0]) if np.any(mapped[q] >= 0)]
    return MappedLayout.of(shape, mapped[keep], True, label), keep


def slice_compact_candidate(graph: Graph, node: Node, out_lay: Any) -> Candidate:
    """The slice produced directly in ``out_lay`` (clean): the operand is read in the
    pre-image holding only the sliced elements, so the edge's conversion (free for a
    client-packed input) moves them into place and drops the rest."""
    x = node.inputs[0]
    in_shape = graph.shape(x)
    assert node.axis is not None and node.start is not None and node.stop is not None
    grid = np.arange(math.prod(in_shape), dtype=np.int64).reshape(in_shape)
    index = [slice(None)] * len(in_shape)
    index[node.axis] = slice(node.start, node.stop)
    fwd = grid[tuple(index)].ravel()  # slice element -> x element
    maps = all_maps(out_lay)
    pre = MappedLayout.of(in_shape, np.where(maps >= 0, fwd[np.maximum(maps, 0)], -1), True, "pre-slice")
    return Candidate(
        node=node.id, kernel="view", params={"op": "slice", "axis": node.axis, "start": node.start,
                                             "stop": node.stop, "to": out_lay.notation()},
        in_layouts={x: pre}, out_layout=out_lay.with_clean(True), lower=lambda b, regs: list(regs[x]),
    )


def concat_packed_candidate(graph: Graph, node: Node, out_lay: Any) -> Candidate:
    """The concatenation produced in ``out_lay`` (clean): each operand is read in the part
    of ``out_lay`` that holds its elements (zeros elsewhere), and every result ciphertext is
    the sum of the operands' ciphertexts that share it (a weight is added as a plaintext)."""
    offsets = _concat_offsets(graph, node)
    out_lay = out_lay.with_clean(True)
    parts: dict[str, tuple[Any, list[int]]] = {}
    for j, t in enumerate(node.inputs):
        if t not in parts:
            parts[t] = _restrict(out_lay, offsets[j], graph.shape(t), "part")
    enc = [t for t in dict.fromkeys(node.inputs) if graph.encrypted(t)]
    if any(list(node.inputs).count(t) > 1 for t in enc):
        raise ValueError("an operand repeated in a concat has no packed form (it would need two layouts)")
    in_layouts = {t: parts[t][0] for t in enc}

    def lower(b: ProgramBuilder, regs: dict[str, list[str]]) -> list[str]:
        outs: list[str] = []
        zero: str | None = None
        for q in range(out_lay.n_ct):
            terms = [regs[t][parts[t][1].index(q)] for t in enc if q in parts[t][1]]
            if terms:
                acc = b.add_many(terms)
            else:
                if zero is None:
                    r0 = regs[enc[0]][0]
                    zero = b.sub(r0, r0)
                acc = zero
            for t in dict.fromkeys(node.inputs):
                if t in in_layouts or q not in parts[t][1]:
                    continue
                lay, cts = parts[t]
                pt = b.plaintext(t, f"pt/{node.id}/{t}/{q}", _table_of(lay, cts.index(q)))
                acc = b.padd(acc, pt)
            outs.append(acc)
        return outs

    return Candidate(
        node=node.id, kernel="view", params={"op": "concat", "axis": node.axis, "to": out_lay.notation()},
        in_layouts=in_layouts, out_layout=out_lay, lower=lower,
    )
