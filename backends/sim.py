"""Numpy slot simulator: executes every instruction of shared/SPEC.md section 4.

Registers are float64 vectors of ``slots`` values.  When the plan carries a key schedule
(any ``load_key``/``drop_key``), every rotation must find its key resident, and a key
recorded at a level below the ciphertext's is refused (Lattigo would silently compute a
wrong result).  Operations are counted; peak resident key bytes follow the plan's
memory model.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.errors import SlotplanError
from planner.summary import reg_reads, register_depths


class SimulationError(SlotplanError):
    pass


@dataclass
class SimResult:
    outputs: dict[str, np.ndarray]
    counts: dict[str, int]
    rotations: int
    key_loads: int
    peak_resident_keys: int
    seconds: float
    written: dict[str, np.ndarray] = field(default_factory=dict)
    # per output tensor: slots of its output ciphertexts that hold no element of it but are
    # not zero (what a client who decrypts sees beyond the answer; 0 for a clean plan)
    leaked_slots: dict[str, int] = field(default_factory=dict)
    # the registers asked for with ``keep`` (layout checks read intermediate values)
    registers: dict[str, np.ndarray] = field(default_factory=dict)


def _table(tables: Mapping[str, np.ndarray], name: str, slots: int) -> tuple[np.ndarray, np.ndarray | None]:
    try:
        idx = np.asarray(tables[f"{name}.idx"], dtype=np.int64)
    except KeyError as e:
        raise SimulationError(f"table {name!r} is missing from the tables file") from e
    if idx.shape != (slots,):
        raise SimulationError(f"table {name!r}: idx has shape {idx.shape}, expected ({slots},)")
    coef = None
    if f"{name}.coef" in tables:
        coef = np.asarray(tables[f"{name}.coef"], dtype=np.float64)
    return idx, coef


def gather(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    flat = values.ravel()
    out = np.zeros(idx.shape[0])
    m = idx >= 0
    if np.any(idx[m] >= flat.size):
        raise SimulationError(f"table index {int(idx[m].max())} out of range for a tensor of {flat.size} elements")
    out[m] = flat[idx[m]]
    return out


def plaintext_vector(
    pt: Mapping[str, Any], tables: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray], slots: int
) -> np.ndarray:
    idx, coef = _table(tables, pt["table"], slots)
    if pt["source"] == "const":
        v = np.ones(slots)
    else:
        if pt["source"] not in values:
            raise SimulationError(f"plaintext source {pt['source']!r} has no value")
        v = gather(values[pt["source"]], idx)
    return v * coef if coef is not None else v


def simulate(
    plan: Mapping[str, Any],
    tables: Mapping[str, np.ndarray],
    values: Mapping[str, np.ndarray],
    key_levels: Mapping[int, int] | None = None,
    keep: Collection[str] = (),
) -> SimResult:
    """Execute ``plan`` on ``values`` (inputs and weights by tensor name).  The registers
    named in ``keep`` are returned in ``SimResult.registers``."""
    t0 = time.perf_counter()
    S = int(plan["params"]["slots"])
    shapes = {k: tuple(v) for k, v in plan.get("outputs", {}).items()}
    program = plan["program"]
    pts = plan["plaintexts"]
    regs: dict[str, np.ndarray] = {}
    counts: Counter[str] = Counter()
    schedule = any(i["op"] in ("load_key", "drop_key") for i in program)
    resident: set[int] = set()
    peak_keys = 0
    loads = 0
    rotations = 0
    depth = register_depths(program) if key_levels else {}
    max_level = len(plan["params"]["log_q"]) - 1
    last_use: dict[str, int] = {}
    for i, ins in enumerate(program):
        for r in reg_reads(ins):
            last_use[r] = i
    out_vals: dict[str, np.ndarray] = {}
    written: dict[str, np.ndarray] = {}
    leaked: dict[str, int] = {}
    keep = frozenset(keep)
    kept: dict[str, np.ndarray] = {}

    def get(r: str, i: int) -> np.ndarray:
        try:
            return regs[r]
        except KeyError:
            raise SimulationError(f"instruction {i}: register {r!r} read before it is written") from None

    def put(r: str, v: np.ndarray, i: int) -> None:
        if r in regs:
            raise SimulationError(f"instruction {i}: register {r!r} written twice (program is not SSA)")
        regs[r] = v

    def check_key(k: int, src: str, i: int, op: str) -> None:
        if not 1 <= k < S:
            raise SimulationError(f"instruction {i} ({op}): offset {k} outside 1..{S - 1}")
        if schedule and k not in resident:
            raise SimulationError(f"instruction {i} ({op}): no key for k={k} resident")
        if key_levels and k in key_levels:
            ct_level = max_level - depth.get(src, 0)
            if key_levels[k] < ct_level:
                raise SimulationError(
                    f"instruction {i} ({op}): key for k={k} has level {key_levels[k]} below the "
                    f"ciphertext's level {ct_level}"
                )

    for i, ins in enumerate(program):
        op = ins["op"]
        counts[op] += 1
        if op == "input":
            t = ins["tensor"]
            if t not in values:
                raise SimulationError(f"instruction {i}: no value for input tensor {t!r}")
            idx, _ = _table(tables, ins["table"], S)
            put(ins["dst"], gather(values[t], idx), i)
        elif op == "rot":
            k = int(ins["k"])
            check_key(k, ins["src"], i, op)
            put(ins["dst"], np.roll(get(ins["src"], i), -k), i)
            rotations += 1
        elif op == "rot_hoisted":
            src = get(ins["src"], i)
            if len(ins["dsts"]) != len(ins["ks"]):
                raise SimulationError(f"instruction {i}: rot_hoisted needs as many dsts as ks")
            for dst, k in zip(ins["dsts"], ins["ks"], strict=True):
                check_key(int(k), ins["src"], i, op)
                put(dst, np.roll(src, -int(k)), i)
                rotations += 1
        elif op in ("add", "sub", "cmul"):
            a, b = get(ins["a"], i), get(ins["b"], i)
            put(ins["dst"], a + b if op == "add" else a - b if op == "sub" else a * b, i)
        elif op in ("pmul", "padd", "psub"):
            name = ins["pt"]
            if name not in pts:
                raise SimulationError(f"instruction {i}: unknown plaintext {name!r}")
            v = plaintext_vector(pts[name], tables, values, S)
            x = get(ins["src"], i)
            put(ins["dst"], x * v if op == "pmul" else x + v if op == "padd" else x - v, i)
        elif op == "poly":
            x = get(ins["src"], i)
            acc = np.zeros(S)
            for c in reversed(ins["coeffs"]):
                acc = acc * x + float(c)
            put(ins["dst"], acc, i)
        elif op == "rescale":
            put(ins["dst"], get(ins["src"], i).copy(), i)
        elif op == "load_key":
            k = int(ins["k"])
            if k in resident:
                raise SimulationError(f"instruction {i}: key {k} loaded while already resident")
            resident.add(k)
            loads += 1
            peak_keys = max(peak_keys, len(resident))
        elif op == "drop_key":
            k = int(ins["k"])
            if k not in resident:
                raise SimulationError(f"instruction {i}: key {k} dropped but not resident")
            resident.discard(k)
        elif op == "output":
            t = ins["tensor"]
            idx, _ = _table(tables, ins["table"], S)
            v = get(ins["src"], i)
            if t not in out_vals:
                size = int(np.prod(shapes[t])) if t in shapes else int(idx.max()) + 1
                out_vals[t] = np.full(size, np.nan)
                written[t] = np.zeros(size, dtype=bool)
            m = idx >= 0
            tgt = idx[m]
            prev = out_vals[t][tgt]
            seen = written[t][tgt]
            if np.any(seen & ~np.isclose(prev, v[m], rtol=1e-9, atol=1e-12)):
                raise SimulationError(f"instruction {i}: duplicate copies of {t!r} disagree")
            out_vals[t][tgt] = v[m]
            written[t][tgt] = True
            leaked[t] = leaked.get(t, 0) + int(np.count_nonzero(v[~m]))
        else:
            raise SimulationError(f"instruction {i}: unknown op {op!r}")
        # free registers after their last use (keeps large plans within memory); a
        # register nobody reads is dropped at once (a plan full of dead adds stays small)
        for r in reg_reads(ins):
            if last_use.get(r) == i:
                v_ = regs.pop(r, None)
                if r in keep and v_ is not None:
                    kept[r] = v_
        for r in ins.get("dsts", ()) if op == "rot_hoisted" else (ins["dst"],) if "dst" in ins else ():
            if r not in last_use and r not in keep:
                regs.pop(r, None)
    if not schedule:  # keep-all: every key the program uses is resident throughout
        used: set[int] = set()
        for ins in program:
            if ins["op"] == "rot":
                used.add(int(ins["k"]))
            elif ins["op"] == "rot_hoisted":
                used.update(int(k) for k in ins["ks"])
        peak_keys = len(used)
    outputs: dict[str, np.ndarray] = {}
    for t, v in out_vals.items():
        if not written[t].all():
            missing = int((~written[t]).sum())
            raise SimulationError(f"output {t!r}: {missing} elements never written")
        outputs[t] = v.reshape(shapes[t]) if t in shapes else v
    return SimResult(
        outputs=outputs, counts=dict(counts), rotations=rotations, key_loads=loads,
        peak_resident_keys=peak_keys, seconds=time.perf_counter() - t0, written=written,
        leaked_slots=leaked, registers={**kept, **{r: regs[r] for r in keep if r in regs}},
    )
