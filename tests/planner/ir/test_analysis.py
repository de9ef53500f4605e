"""planner.ir.analysis on hand-written programs (depths, key levels, counts, node spans after
a rewrite, lifetimes, the summary) and its memory model against a direct recount on random
programs (every register, plaintext and key tallied at every step from its definition)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from planner.ir.analysis import (
    default_key_level,
    lifetimes,
    memory_profile,
    memory_series,
    plan_key_bytes,
    reg_reads,
    reg_writes,
    register_depths,
    remap_spans,
    rotation_key_levels,
    span_counts,
    summarize,
)
from planner.ir.instructions import decode_program
from tests.helpers import small_params

PARAMS = small_params(10, levels=4)  # 512 slots, max_level 4

# x -> pmul -> rescale -> rot 3 -> add with rot_hoisted(x, [1, 2]) -> cmul -> poly -> output
PROGRAM: list[dict[str, Any]] = [
    {"op": "input", "dst": "x", "tensor": "x", "table": "in"},                  # 0
    {"op": "pmul", "dst": "m", "src": "x", "pt": "p0"},                         # 1
    {"op": "rescale", "dst": "r", "src": "m"},                                  # 2
    {"op": "rot", "dst": "a", "src": "r", "k": 3},                              # 3
    {"op": "rot_hoisted", "dsts": ["b1", "b2"], "src": "x", "ks": [1, 2]},      # 4
    {"op": "add", "dst": "s", "a": "a", "b": "b1"},                             # 5
    {"op": "padd", "dst": "t", "src": "b2", "pt": "p1"},                        # 6
    {"op": "cmul", "dst": "c", "a": "s", "b": "t"},                             # 7
    {"op": "poly", "dst": "y", "src": "c", "coeffs": [0.0, 1.0, 0.0, 0.5]},     # 8
    {"op": "output", "src": "y", "tensor": "y", "table": "out"},                # 9
]


def test_register_depths_and_reads_writes() -> None:
    assert register_depths(PROGRAM) == {"x": 0, "m": 1, "r": 1, "a": 1, "b1": 0, "b2": 0, "s": 1, "t": 0,
                                        "c": 2, "y": 4}
    assert reg_reads(PROGRAM[5]) == ["a", "b1"] and reg_writes(PROGRAM[4]) == ["b1", "b2"]
    assert reg_reads(PROGRAM[0]) == [] and reg_writes(PROGRAM[9]) == []


def test_rotation_key_levels_one_higher_after_a_rescale() -> None:
    # rot of the rescaled r (depth 1): level 4 - 1 + 1; the hoisted rotations of x: level 4
    assert rotation_key_levels(PROGRAM, 4) == [None, None, None, 4, 4, None, None, None, None, None]
    deeper = [*PROGRAM[:3], {"op": "pmul", "dst": "m2", "src": "r", "pt": "p0"},
              {"op": "rot", "dst": "z", "src": "m2", "k": 5}]
    assert rotation_key_levels(deeper, 4)[-1] == 2  # not rescaled: its own level 4 - 2
    assert rotation_key_levels(deeper, 1)[-1] == 0  # never below 0


def test_span_counts_and_summary() -> None:
    assert span_counts(PROGRAM) == {"rotations": 3, "pmul": 1, "cmul": 1, "add": 2, "rescale": 1, "poly": 1,
                                    "key_loads": 0}
    assert span_counts(PROGRAM[3:6]) == {"rotations": 3, "pmul": 0, "cmul": 0, "add": 1, "rescale": 0, "poly": 0,
                                         "key_loads": 0}
    s = summarize(PROGRAM, PARAMS, n_plaintexts=2)
    assert {k: s[k] for k in ("rotations", "rotation_keys", "pmul", "cmul", "add", "rescale", "poly", "depth",
                              "key_loads", "plaintexts", "instructions")} == {
        "rotations": 3, "rotation_keys": 3, "pmul": 1, "cmul": 1, "add": 2, "rescale": 1, "poly": 1, "depth": 4,
        "key_loads": 0, "plaintexts": 2, "instructions": 10}
    assert "bootstraps" not in s  # a preset without bootstrapping keeps its summary's fields
    assert s["peak_bytes"] == memory_profile(PROGRAM, PARAMS)


def test_lifetimes() -> None:
    prog = decode_program(PROGRAM)
    life = lifetimes(prog, register_depths(prog), 4)
    assert life.last_use == {"x": 4, "m": 2, "r": 3, "a": 5, "b1": 5, "b2": 6, "s": 7, "t": 7, "c": 8, "y": 9}
    assert life.pt_first == {"p0": 1, "p1": 6} and life.pt_last == {"p0": 1, "p1": 6}
    assert life.pt_level == {"p0": 4, "p1": 4}  # encoded at the level of the ciphertext met first


def test_remap_spans_after_key_loads_and_a_chain() -> None:
    """Node 0 = instructions 1..3, node 1 = 4..8; the rewrite loads keys before the rotations and
    splits rot 3 into a chain 1 + 2 through a fresh register: the loads and the chain's middle
    belong to the node of the next instruction with a known destination."""
    spans = [[1, 4], [4, 9]]
    new = [PROGRAM[0], PROGRAM[1], PROGRAM[2],
           {"op": "load_key", "k": 1}, {"op": "load_key", "k": 2},
           {"op": "rot", "dst": "mid", "src": "r", "k": 1}, {"op": "rot", "dst": "a", "src": "mid", "k": 2},
           *PROGRAM[4:]]
    assert remap_spans(PROGRAM, spans, new) == [[1, 7], [7, 12]]
    # an unknown node order: node 1's instruction before node 0's is not contiguous
    swapped = [PROGRAM[0], PROGRAM[4], PROGRAM[1], PROGRAM[2], PROGRAM[3], *PROGRAM[5:]]
    with pytest.raises(ValueError, match="not contiguous"):
        remap_spans(PROGRAM, spans, swapped)
    # a node without instructions keeps an empty span where the previous node ends
    assert remap_spans(PROGRAM, [[1, 4], [4, 4], [4, 9]], new) == [[1, 7], [7, 7], [7, 12]]


def test_plan_key_bytes_and_default_key_level() -> None:
    assert plan_key_bytes({"keys": {"3": {"bytes": 10, "level": 2}}}) == {3: 10}
    assert plan_key_bytes({}) is None
    assert default_key_level(PROGRAM, PARAMS) == PARAMS.max_level


# ----------------------------------------------------------------- memory model, recounted


def _random_program(seed: int) -> list[dict[str, Any]]:
    """A random SSA program over two inputs with plaintexts, rotations and (half of the
    seeds) a key schedule that loads each offset before a use and drops it after some use."""
    rng = random.Random(seed)
    prog: list[dict[str, Any]] = [{"op": "input", "dst": "r0", "tensor": "x", "table": "x"},
                                  {"op": "input", "dst": "r1", "tensor": "y", "table": "y"}]
    regs, n, depth = ["r0", "r1"], 2, {"r0": 0, "r1": 0}
    schedule = seed % 2 == 1
    resident: set[int] = set()
    for _ in range(rng.randint(6, 16)):
        src = rng.choice(regs)
        dst = f"r{n}"
        n += 1
        op = rng.choice(["rot", "rot", "pmul", "padd", "add", "cmul"])
        if op == "rot":
            k = rng.choice([1, 2, 5, 7])
            if schedule and k not in resident:
                prog.append({"op": "load_key", "k": k})
                resident.add(k)
            prog.append({"op": "rot", "dst": dst, "src": src, "k": k})
            depth[dst] = depth[src]
            if schedule and rng.random() < 0.5:
                prog.append({"op": "drop_key", "k": k})
                resident.discard(k)
        elif op in ("pmul", "padd"):
            if op == "pmul" and depth[src] >= 3:
                continue
            prog.append({"op": op, "dst": dst, "src": src, "pt": f"p{rng.randint(0, 3)}"})
            depth[dst] = depth[src] + (op == "pmul")
        else:
            other = rng.choice(regs)
            if op == "cmul" and max(depth[src], depth[other]) >= 3:
                continue
            prog.append({"op": op, "dst": dst, "a": src, "b": other})
            depth[dst] = max(depth[src], depth[other]) + (op == "cmul")
        regs.append(dst)
    for r in rng.sample(regs[2:], min(2, len(regs) - 2)):
        prog.append({"op": "output", "src": r, "tensor": r, "table": r})
    return prog


def _recount(prog: list[dict[str, Any]], key_bytes: dict[int, int] | None) -> dict[str, np.ndarray]:
    """Resident bytes at every step, from the definitions: a register from its write to its
    last read (its write step alone when nobody reads it), at its level; a plaintext from its
    first to its last use, at the level of the first ciphertext it meets; a key from its load
    to its drop, or every key throughout without a schedule."""
    depth = register_depths(prog)
    L = PARAMS.max_level
    reads = [reg_reads(i) for i in prog]
    writes = [reg_writes(i) for i in prog]
    n = len(prog)
    out = {k: np.zeros(n, dtype=np.int64) for k in ("keys", "plaintexts", "ciphertexts")}
    top = PARAMS.rotation_key_bytes(L)
    sizes = (lambda k: key_bytes.get(k, top)) if key_bytes else (lambda k: top)  # noqa: E731
    offsets = {k for i in prog for k in ([i["k"]] if i["op"] == "rot" else [])}
    scheduled = any(i["op"] in ("load_key", "drop_key") for i in prog)
    for t in range(n):
        for w in range(n):
            for r in writes[w]:
                last = max([j for j in range(n) if r in reads[j]], default=w)
                if w <= t <= last:
                    out["ciphertexts"][t] += PARAMS.ciphertext_bytes(max(0, L - depth[r]))
        for p in {i["pt"] for i in prog if "pt" in i}:
            uses = [j for j in range(n) if prog[j].get("pt") == p]
            if uses[0] <= t <= uses[-1]:
                lv = max(0, L - depth[prog[uses[0]]["src"]])
                out["plaintexts"][t] += PARAMS.plaintext_bytes(lv)
        if not scheduled:
            out["keys"][t] = sum(sizes(k) for k in offsets)
            continue
        for k in offsets:
            loads = [j for j in range(n) if prog[j]["op"] == "load_key" and prog[j]["k"] == k]
            drops = [j for j in range(n) if prog[j]["op"] == "drop_key" and prog[j]["k"] == k]
            for a in loads:
                z = min([d for d in drops if d >= a], default=n)
                if a <= t <= z:
                    out["keys"][t] += sizes(k)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_memory_series_equals_a_direct_recount(seed: int) -> None:
    prog = _random_program(seed)
    key_bytes = {1: 1000, 2: 2000, 5: 5000, 7: 7000} if seed % 3 == 0 else None
    got = memory_series(prog, PARAMS, key_bytes=key_bytes)
    want = _recount(prog, key_bytes)
    for name in ("ciphertexts", "plaintexts", "keys"):
        assert np.array_equal(got[name], want[name]), name
    prof = memory_profile(prog, PARAMS, key_bytes=key_bytes)
    assert prof["total"] == int(max(want["keys"] + want["plaintexts"] + want["ciphertexts"]))
    assert prof["keys"] == int(want["keys"].max()) and prof["ciphertexts"] == int(want["ciphertexts"].max())


def test_memory_of_an_empty_program_is_zero() -> None:
    assert memory_profile([], PARAMS) == {"keys": 0, "plaintexts": 0, "ciphertexts": 0, "total": 0}
