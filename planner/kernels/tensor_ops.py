"""Kernels for transpose, reshape, sum and ciphertext x ciphertext matmul.

* transpose / reshape: zero-cost views.  A layout maps slots to flat element indices, so a
  transposed tensor is the same ciphertexts with the channel view's axes renamed, and a
  reshaped one is the same index maps read with the new shape (row-major flat order).
  Downstream kernels that need another placement pay a conversion on the edge.
* sum over an axis: the axis is a view dimension with a slot stride; ciphertexts holding
  different channels are added, then ``sum_{r < e} rot(x, r * stride)`` by doubling
  leaves the sum where the axis index is 0 (other slots hold partial sums: unclean).
* matmul ct x ct (generalised diagonal method): C = A @ B with A (m, k) column-major in
  parts of kk columns and C column-major in parts of J columns.  For each diagonal d,
  ``rot(A_ext, d*m)`` (one hoisted rotation) holds ``A[r, (j + d) mod kk]`` at output slot
  ``j*m + r``; it is multiplied (cmul) by B's d-th diagonal broadcast over the rows,
  ``Y[d, q][j*m + r] = B[(q*J + j + d) mod kk, q*J + j]``.  B is consumed in that
  diagonal layout: free when B is a client input, otherwise a priced conversion.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

import numpy as np

from planner.frontend.graph import Graph, Node
from planner.ir.builder import ProgramBuilder
from planner.kernels.base import Candidate
from planner.kernels.imra import sum_of_shifts
from planner.kernels.problem import KernelError
from planner.layout.channels import ChannelLayout, MappedLayout, all_maps, natural_layout, view_layout


def transpose_candidate(graph: Graph, node: Node, lay: Any) -> Candidate:
    x = node.inputs[0]
    perm = node.perm or tuple(reversed(range(len(graph.shape(x)))))
    shape = graph.shape(node.id)
    inv = list(np.argsort(perm))
    if isinstance(lay, ChannelLayout) and lay.axes:
        out: Any = replace(lay, shape=shape, axes=tuple(int(inv[a]) for a in lay.axes))
    else:
        maps = all_maps(lay)
        old_shape = graph.shape(x)
        # flat index of x -> flat index of x transposed
        remap = np.arange(int(np.prod(old_shape))).reshape(old_shape).transpose(perm).ravel()
        inv_remap = np.empty_like(remap)
        inv_remap[remap] = np.arange(remap.size)
        out = MappedLayout.of(shape, np.where(maps >= 0, inv_remap[np.maximum(maps, 0)], -1), lay.clean, "T")
    return Candidate(
        node=node.id, kernel="view", params={"op": "transpose", "perm": list(perm)},
        in_layouts={x: lay}, out_layout=out, lower=lambda b, regs: list(regs[x]),
    )


def reshape_candidate(graph: Graph, node: Node, lay: Any) -> Candidate:
    x = node.inputs[0]
    shape = graph.shape(node.id)
    maps = all_maps(lay)
    out: Any = MappedLayout.of(shape, maps, lay.clean, "reshape")
    try:
        nat = natural_layout(shape, lay.slots).with_clean(lay.clean)
        if nat.n_ct == maps.shape[0] and np.array_equal(all_maps(nat), maps):
            out = nat
    except Exception:  # noqa: BLE001 - a structured view is an optimisation only
        pass
    return Candidate(
        node=node.id, kernel="view", params={"op": "reshape", "shape": list(shape)},
        in_layouts={x: lay}, out_layout=out, lower=lambda b, regs: list(regs[x]),
    )


def sum_candidate(graph: Graph, node: Node, lay: ChannelLayout) -> Candidate:
    """Sum over ``node.axis`` for a channel view whose axes include it."""
    x = node.inputs[0]
    axis = node.axis if node.axis is not None else 0
    if not lay.axes or axis not in lay.axes or lay.reps != 1:
        raise KernelError("sum needs a channel view of the operand")
    pos = lay.axes.index(axis)
    exts = (lay.channels, lay.height, lay.width)
    strides = (lay.lc, lay.lh, lay.lw)
    shift = 0 if node.keepdims else 1  # keepdims: the summed axis stays (length 1)
    rest = [(a - (shift if a > axis else 0), exts[i], strides[i]) for i, a in enumerate(lay.axes) if i != pos]
    ext, stride = exts[pos], strides[pos]
    if not rest:  # a vector sums to one element
        rest = [(0, 1, 1)]
    rest += [(-1, 1, 1)] * (3 - len(rest))
    out = ChannelLayout(
        shape=graph.shape(node.id), channels=rest[0][1], height=rest[1][1], width=rest[2][1],
        slots=lay.slots, cpc=rest[0][1] if pos == 0 else lay.cpc, lc=rest[0][2], lh=rest[1][2],
        lw=rest[2][2], base=lay.base, axes=tuple(a for a, _, _ in rest if a >= 0), clean=ext == 1,
    )

    def lower(b: ProgramBuilder, regs: dict[str, list[str]]) -> list[str]:
        cts = regs[x]
        if pos == 0:
            return [sum_of_shifts(b, b.add_many(list(cts)), min(lay.cpc, ext), stride)]
        return [sum_of_shifts(b, r, ext, stride) for r in cts]

    return Candidate(
        node=node.id, kernel="sum", params={"axis": axis, "extent": ext, "stride": stride},
        in_layouts={x: lay.with_clean(True)}, out_layout=out, lower=lower,
    )


def bdiag_layout(B_shape: tuple[int, int], m: int, kk: int, J: int, slots: int) -> MappedLayout:
    """B (k, n) as the diagonals the ct-ct kernel multiplies: ciphertext (part i, d, q) holds
    ``B[i*kk + (j + d) mod kk, q*J + j]`` at slots ``j*m + r`` for every row r (the row
    that meets ``A[r, (j + d) mod kk]`` in the d-th rotation of A's copies: the lane j of
    every output ciphertext sees the same rotation of A, whatever q)."""
    k, n = B_shape
    P = -(-k // kk)
    Q = -(-n // J)
    maps = np.full((P * kk * Q, slots), -1, dtype=np.int64)
    j = np.arange(J)[:, None]
    r = np.arange(m)[None, :]
    for i in range(P):
        for d in range(kk):
            for q in range(Q):
                row = i * kk + (j + d) % kk
                col = q * J + j
                ok = np.broadcast_to((row < k) & (col < n), (J, m))
                s = np.broadcast_to(j * m + r, (J, m))
                v = np.broadcast_to(row * n + col, (J, m))
                maps[(i * kk + d) * Q + q, s[ok]] = v[ok]
    return MappedLayout.of(B_shape, maps, True, f"bdiag(m={m},kk={kk},J={J})")


def matmul_ct_ct_candidate(graph: Graph, node: Node, a_lay: ChannelLayout, slots: int) -> Candidate:
    A, B = node.inputs
    m, k = graph.shape(A)
    _, n = graph.shape(B)
    if a_lay.axes != (1, 0) or a_lay.reps != 1 or a_lay.lh != 1 or a_lay.lc != m:
        a_lay = view_layout((m, k), slots, (1, 0))
    kk = a_lay.cpc
    if kk * m > slots:
        raise KernelError("a column of A does not fit a ciphertext")
    cyclic = kk * m == slots
    J_max = slots // m if cyclic else slots // m - kk + 1
    J = min(n, J_max)
    if J < 1:
        raise KernelError(f"ct-ct matmul: {kk} columns of {m} rows leave no room for output columns")
    copies = 1 if cyclic else -(-(J + kk - 1) // kk)
    if copies * kk * m > slots:
        raise KernelError("ct-ct matmul: the periodic copy of A does not fit")
    P = a_lay.n_ct
    Q = -(-n // J)
    b_lay = bdiag_layout((k, n), m, kk, J, slots)
    out = ChannelLayout(
        shape=(m, n), channels=n, height=m, width=1, slots=slots, cpc=J, lc=m, lh=1, lw=1, axes=(1, 0),
    )

    def lower(b: ProgramBuilder, regs: dict[str, list[str]]) -> list[str]:
        xs: dict[int, dict[int, str]] = {}
        for i in range(P):
            X = sum_of_shifts(b, regs[A][i], copies, -kk * m) if copies > 1 else regs[A][i]
            xs[i] = b.rot_many(X, [d * m for d in range(kk)])
        outs = []
        for q in range(Q):
            acc: str | None = None
            for i in range(P):
                for d in range(kk):
                    y = regs[B][(i * kk + d) * Q + q]
                    acc = b.accumulate(acc, b.cmul(xs[i][d * m], y))
            assert acc is not None
            outs.append(b.rescale(acc))
        return outs

    return Candidate(
        node=node.id, kernel="ct-ct-diagonal",
        params={"kk": kk, "J": J, "P_I": P, "P_O": Q, "copies": copies},
        in_layouts={A: a_lay.with_clean(True), B: b_lay}, out_layout=out, lower=lower,
        slot_utilization=m * J / slots,
    )


def _preimage(graph: Graph, node: Node, out_lay: Any) -> Any:
    """The layout of the view's input whose view is ``out_lay`` (same slots, input shape)."""
    x = node.inputs[0]
    in_shape = graph.shape(x)
    maps = all_maps(out_lay)
    if node.op == "transpose":
        perm = node.perm or tuple(reversed(range(len(in_shape))))
        fwd = np.arange(int(np.prod(in_shape))).reshape(in_shape).transpose(perm).ravel()
        maps = np.where(maps >= 0, fwd[np.maximum(maps, 0)], -1)
    try:
        nat = natural_layout(in_shape, out_lay.slots)
        if nat.n_ct == maps.shape[0] and np.array_equal(all_maps(nat), maps):
            return nat
    except Exception:  # noqa: BLE001 - a structured view is an optimisation only
        pass
    return MappedLayout.of(in_shape, maps, True, "pre-" + node.op)


def shape_view_candidates(graph: Graph, node: Node, lays: list[Any]) -> list[Candidate]:
    """A view of each producer layout, plus views that end in the packed layouts a consumer
    usually wants (row- and column-major): their input pre-images are requested from the
    producer (free for a client-packed input), so desired layouts flow back through views."""
    out = []
    seen = set()
    for lay in lays:
        c = transpose_candidate(graph, node, lay) if node.op == "transpose" else reshape_candidate(graph, node, lay)
        out.append(c)
        seen.add(c.out_layout)
    shape = graph.shape(node.id)
    slots = lays[0].slots
    wants: list[Any] = []
    with contextlib.suppress(Exception):  # a structured target is an optimisation only
        wants.append(natural_layout(shape, slots))
    if len(shape) == 2 and shape[0] <= slots:
        wants.append(view_layout(shape, slots, (1, 0)))
    for w in wants:
        if w in seen:
            continue
        pre = _preimage(graph, node, w)
        x = node.inputs[0]
        out.append(Candidate(
            node=node.id, kernel="view", params={"op": node.op, "to": w.notation()},
            in_layouts={x: pre}, out_layout=w, lower=_passthrough(x),
        ))
    return out


def _passthrough(x: str):  # noqa: ANN202
    def lower(b: ProgramBuilder, regs: dict[str, list[str]]) -> list[str]:
        return list(regs[x])

    return lower


