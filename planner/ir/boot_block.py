"""The key block ``boot`` of a plan (issue 36, shared/SPEC.md section 4): the bootstrapping
keys and DFT matrices of the full-slot bootstrap, joined by those of every sparse bootstrap
variant the program uses (``bootstrap`` with ``log_slots``, ``bootstrap2``).

A rotation key of one offset is one key whatever bootstrap uses it, so the block's Galois
keys are the union of the full set's offsets and the used variants' (plus the conjugation
key); each used variant adds its own DFT matrices.  The keys a variant adds are counted at
the size of the block's Galois keys (generated at the top of the bootstrapping chain).
Without variants every number here is the parameters' own (``Params.boot_block_bytes``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from planner.frontend.params import BootVariant, Params
from planner.ir import instructions as ir


def variants_used(program: Sequence[Mapping[str, Any] | ir.Instr], params: Params) -> tuple[BootVariant, ...]:
    """The sparse bootstraps the program runs (by log slot count), as the params offer them."""
    if params.boot is None:
        return ()
    ks: set[int] = set()
    for raw in program:
        op = raw.op if isinstance(raw, ir.Instr) else raw.get("op")
        if op not in ("bootstrap", "bootstrap2"):
            continue
        ins = ir.decode(raw)
        ls = getattr(ins, "log_slots", None)
        if ls is not None:
            ks.add(int(ls))
    out = []
    for k in sorted(ks):
        v = params.boot.variant(k)
        if v is not None:
            out.append(v)
    return tuple(out)


def block_offsets(params: Params, variants: Sequence[BootVariant] = ()) -> frozenset[int]:
    """The rotation offsets of the block's Galois keys."""
    if params.boot is None:
        return frozenset()
    offs = set(params.boot.key_offsets)
    for v in variants:
        offs.update(v.key_offsets)
    return frozenset(offs)


def extra_keys(params: Params, variants: Sequence[BootVariant]) -> int:
    """Galois keys the variants add to the full bootstrap's."""
    if params.boot is None:
        return 0
    return len(block_offsets(params, variants)) - len(set(params.boot.key_offsets))


def galois_keys(params: Params, variants: Sequence[BootVariant] = ()) -> int:
    """The block's Galois keys: one per offset of the union, and the conjugation key."""
    if params.boot is None:
        return 0
    return params.boot.galois_keys + extra_keys(params, variants)


def added_bytes(params: Params, variants: Sequence[BootVariant]) -> int:
    """Bytes the variants add to the block: their extra Galois keys and DFT matrices."""
    if params.boot is None or not variants:
        return 0
    key = params.rotation_key_bytes(params.key_max_level)
    return extra_keys(params, variants) * key + sum(v.matrix_bytes for v in variants)


def block_bytes(params: Params, variants: Sequence[BootVariant] = (), stream: int | None = None) -> int:
    """The resident block (``Params.boot_block_bytes`` with the variants' keys and matrices):
    whole, or streamed with ``stream`` Galois keys read ahead."""
    if params.boot is None:
        return 0
    if stream is None:
        return params.boot_block_bytes() + added_bytes(params, variants)
    return stream_bytes(params, variants, stream + 1)


def stream_bytes(params: Params, variants: Sequence[BootVariant], keys: int) -> int:
    """A streamed block holding ``keys`` of its Galois keys (``Params.boot_stream_bytes``
    with the variants')."""
    if params.boot is None:
        return 0
    if not variants:
        return params.boot_stream_bytes(keys)
    absent = max(0, galois_keys(params, variants) - keys)
    return params.boot_block_bytes() + added_bytes(params, variants) - absent * params.rotation_key_bytes(
        params.key_max_level)


def variant_label(ins: ir.Instr) -> str | None:
    """The cost table's key of a bootstrap variant instruction (``s<k>``, ``h<k>``,
    ``p<k>``, ``r<k>``; planner.cost.tables.CostTable.boot_variants), None for any other."""
    if isinstance(ins, ir.Bootstrap2):
        return f"p{int(ins.log_slots)}"
    if isinstance(ins, ir.Bootstrap) and ins.log_slots is not None:
        return f"{'h' if ins.halves else 'r' if ins.replicas else 's'}{int(ins.log_slots)}"
    return None


def keys_in_line(params: Params, stream: int | None, used: Sequence[BootVariant] = ()) -> int:
    """Bytes of bootstrapping keys the key store reads when the plan loads the block
    ``boot`` (backends/lattigo/keystore.go ``loadBlock``): every key (with the Galois keys
    the variants ``used`` add), or with ``stream`` all but the Galois keys."""
    if params.boot is None:
        return 0
    key = params.rotation_key_bytes(params.key_max_level)
    if stream is None:
        return params.boot.key_bytes + extra_keys(params, used) * key
    return params.boot.key_bytes - params.boot.galois_keys * key
