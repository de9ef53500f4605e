"""Plan summary computed from the program itself (one source of truth).

Counts follow shared/SPEC.md section 4: a ``rot_hoisted`` with ``len(ks)`` offsets counts
``len(ks)`` rotations; ``rotation_keys`` is the number of distinct offsets;
``key_loads`` the number of ``load_key``.  The memory model walks the program: live
ciphertexts (SSA liveness, each at its level), plaintexts (resident from first to last
use, encoded at the level of the ciphertext they meet) and rotation keys (resident
between load and drop; all resident for the whole program when the plan has no key
schedule, the keep-all model of ANT-ACE/Orion).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from planner.params import Params


def plan_key_bytes(plan: Mapping[str, Any]) -> dict[int, int] | None:
    """Per-key sizes recorded by a key schedule (``plan["keys"]``), or None."""
    keys = plan.get("keys")
    return {int(k): int(v["bytes"]) for k, v in keys.items()} if keys else None


def reg_reads(ins: Mapping[str, Any]) -> list[str]:
    op = ins["op"]
    if op in ("add", "sub", "cmul"):
        return [ins["a"], ins["b"]]
    if op in ("rot", "rot_hoisted", "pmul", "padd", "psub", "poly", "rescale", "output"):
        return [ins["src"]]
    return []


def reg_writes(ins: Mapping[str, Any]) -> list[str]:
    if ins["op"] == "rot_hoisted":
        return list(ins["dsts"])
    if "dst" in ins:
        return [ins["dst"]]
    return []


def register_depths(program: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Multiplicative depth of every register (pmul/cmul add one, poly its degree's depth)."""
    d: dict[str, int] = {}
    for ins in program:
        op = ins["op"]
        if op == "input":
            d[ins["dst"]] = 0
        elif op in ("add", "sub"):
            d[ins["dst"]] = max(d[ins["a"]], d[ins["b"]])
        elif op == "cmul":
            d[ins["dst"]] = max(d[ins["a"]], d[ins["b"]]) + 1
        elif op == "pmul":
            d[ins["dst"]] = d[ins["src"]] + 1
        elif op == "poly":
            # degree d costs ceil(log2(d + 1)) levels (power basis / Paterson-Stockmeyer; the
            # leading coefficient's multiplication included), as Lattigo's evaluator uses
            deg = max((i for i, c in enumerate(ins["coeffs"]) if c != 0.0), default=0)
            d[ins["dst"]] = d[ins["src"]] + deg.bit_length()
        elif op == "rot_hoisted":
            for r in ins["dsts"]:
                d[r] = d[ins["src"]]
        elif op in ("rot", "padd", "psub", "rescale"):
            d[ins["dst"]] = d[ins["src"]]
    return d


# The counts every node entry of a plan carries for its program span; summed over the
# nodes they equal the summary's fields of the same names (instructions outside every
# span -- input, output -- count towards none of them).
NODE_COUNT_FIELDS = ("rotations", "pmul", "cmul", "add", "rescale", "poly", "key_loads")


def span_counts(program: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The summary's counters over a slice of a program (one node's span)."""
    counts: dict[str, int] = dict.fromkeys(NODE_COUNT_FIELDS, 0)
    for ins in program:
        op = ins["op"]
        if op == "rot":
            counts["rotations"] += 1
        elif op == "rot_hoisted":
            counts["rotations"] += len(ins["ks"])
        elif op in ("add", "sub", "padd", "psub"):
            counts["add"] += 1
        elif op == "load_key":
            counts["key_loads"] += 1
        elif op in counts:
            counts[op] += 1
    return counts


def remap_spans(
    old: Sequence[Mapping[str, Any]], spans: Sequence[Sequence[int]], new: Sequence[Mapping[str, Any]]
) -> list[list[int]]:
    """Node spans of ``new``, a rewrite of ``old`` (key schedule: load/drop inserted,
    rotations re-expressed as chains) that keeps the names of the registers ``old``
    writes.  An instruction belongs to the node that wrote one of its destinations in
    ``old``; one that writes only fresh registers (a chain's middle) or nothing (a key
    load) belongs to the node of the next instruction that has one.  Spans stay
    contiguous and in node order."""
    owner_of_reg: dict[str, int] = {}
    for n, (a, z) in enumerate(spans):
        for ins in old[a:z]:
            for r in reg_writes(ins):
                owner_of_reg[r] = n
    owner: list[int | None] = [None] * len(new)
    pending: list[int] = []
    for i, ins in enumerate(new):
        if ins["op"] == "input":
            continue  # inputs belong to no node; keep what waits for the next owner
        hit = next((owner_of_reg[r] for r in reg_writes(ins) if r in owner_of_reg), None)
        if hit is None and ins["op"] != "output":
            pending.append(i)
            continue
        for j in pending:
            owner[j] = hit
        pending = []
        owner[i] = hit
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, o in enumerate(owner):
        if o is not None:
            first.setdefault(o, i)
            last[o] = i
    out: list[list[int]] = []
    pos = 0
    for n in range(len(spans)):
        if n not in first:
            out.append([pos, pos])
            continue
        a, z = first[n], last[n] + 1
        if a < pos or any(o != n for o in owner[a:z] if o is not None):
            raise ValueError(f"node {n}: its instructions are not contiguous after the rewrite")
        out.append([a, z])
        pos = z
    return out


def summarize(
    program: Sequence[Mapping[str, Any]],
    params: Params,
    n_plaintexts: int,
    key_bytes: Mapping[int, int] | None = None,
) -> dict[str, Any]:
    counts: dict[str, int] = {}
    rotations = 0
    offsets: set[int] = set()
    for ins in program:
        counts[ins["op"]] = counts.get(ins["op"], 0) + 1
        if ins["op"] == "rot":
            rotations += 1
            offsets.add(int(ins["k"]))
        elif ins["op"] == "rot_hoisted":
            rotations += len(ins["ks"])
            offsets.update(int(k) for k in ins["ks"])
    depth = register_depths(program)
    out_depth = max((depth[ins["src"]] for ins in program if ins["op"] == "output"), default=0)
    mem = memory_profile(program, params, depth, key_bytes)
    return {
        "rotations": rotations,
        "rotation_keys": len(offsets),
        "pmul": counts.get("pmul", 0),
        "cmul": counts.get("cmul", 0),
        "add": sum(counts.get(k, 0) for k in ("add", "sub", "padd", "psub")),
        "rescale": counts.get("rescale", 0),
        "poly": counts.get("poly", 0),
        "depth": out_depth,
        "key_loads": counts.get("load_key", 0),
        "plaintexts": n_plaintexts,
        "instructions": len(program),
        "peak_bytes": mem,
    }


def memory_series(
    program: Sequence[Mapping[str, Any]],
    params: Params,
    depth: Mapping[str, int] | None = None,
    key_bytes: Mapping[int, int] | None = None,
) -> dict[str, np.ndarray]:
    """Modelled resident bytes at every program step (after the step's allocations, before
    its frees): ``keys``, ``plaintexts``, ``ciphertexts``.  ``key_bytes`` gives each key's
    size (a plan's ``keys[k].bytes``, for keys generated below the top level); default:
    every key at the top level.  Without a key schedule every key is resident throughout."""
    depth = depth if depth is not None else register_depths(program)
    L = params.max_level

    def level(reg: str) -> int:
        return max(0, L - depth[reg])

    last_use: dict[str, int] = {}
    pt_first: dict[str, int] = {}
    pt_last: dict[str, int] = {}
    pt_level: dict[str, int] = {}
    for i, ins in enumerate(program):
        for r in reg_reads(ins):
            last_use[r] = i
        if "pt" in ins:
            pt_first.setdefault(ins["pt"], i)
            pt_last[ins["pt"]] = i
            pt_level.setdefault(ins["pt"], level(ins["src"]))
    has_schedule = any(ins["op"] in ("load_key", "drop_key") for ins in program)
    top_key = params.rotation_key_bytes()

    def kb(k: int) -> int:
        return key_bytes.get(k, top_key) if key_bytes is not None else top_key

    all_keys: set[int] = set()
    for ins in program:
        if ins["op"] == "rot":
            all_keys.add(int(ins["k"]))
        elif ins["op"] == "rot_hoisted":
            all_keys.update(int(k) for k in ins["ks"])
    pt_start: dict[int, list[str]] = {}
    pt_end: dict[int, list[str]] = {}
    for p, i in pt_first.items():
        pt_start.setdefault(i, []).append(p)
    for p, i in pt_last.items():
        pt_end.setdefault(i, []).append(p)

    n = len(program)
    out = {name: np.zeros(n, dtype=np.int64) for name in ("keys", "plaintexts", "ciphertexts")}
    live_ct = 0
    live_pt = 0
    keys = 0 if has_schedule else sum(kb(k) for k in all_keys)
    resident: set[int] = set()
    live: set[str] = set()
    for i, ins in enumerate(program):
        op = ins["op"]
        if op == "load_key":
            resident.add(int(ins["k"]))
            keys = sum(kb(k) for k in resident)
        for p in pt_start.get(i, []):
            live_pt += params.plaintext_bytes(pt_level[p])
        for r in reg_writes(ins):
            live.add(r)
            live_ct += params.ciphertext_bytes(level(r))
        out["keys"][i], out["plaintexts"][i], out["ciphertexts"][i] = keys, live_pt, live_ct
        # frees after the instruction: registers with no later read
        for r in set(reg_reads(ins)) | set(reg_writes(ins)):
            if last_use.get(r, -1) <= i and r in live:
                live.discard(r)
                live_ct -= params.ciphertext_bytes(level(r))
        for p in pt_end.get(i, []):
            live_pt -= params.plaintext_bytes(pt_level[p])
        if op == "drop_key":
            resident.discard(int(ins["k"]))
            keys = sum(kb(k) for k in resident)
    return out


def memory_profile(
    program: Sequence[Mapping[str, Any]],
    params: Params,
    depth: Mapping[str, int] | None = None,
    key_bytes: Mapping[int, int] | None = None,
) -> dict[str, int]:
    """Peak modelled bytes of keys, plaintexts and ciphertexts, and of their sum, over
    program points (the maxima of :func:`memory_series`)."""
    ser = memory_series(program, params, depth, key_bytes)
    if not program:
        return {"keys": 0, "plaintexts": 0, "ciphertexts": 0, "total": 0}
    total = ser["keys"] + ser["plaintexts"] + ser["ciphertexts"]
    return {
        "keys": int(ser["keys"].max()),
        "plaintexts": int(ser["plaintexts"].max()),
        "ciphertexts": int(ser["ciphertexts"].max()),
        "total": int(total.max()),
    }
