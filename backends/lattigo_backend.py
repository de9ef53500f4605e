"""Encrypted execution of slotplan plans with Lattigo v6 (CKKS), through gopy.

The Go side (``backends/lattigo``, built by ``make lattigo``) runs a whole plan: the client
part generates a secret key and only the plan's rotation keys into a key directory,
encrypts and decrypts; the evaluation part never sees the secret key, loads rotation keys
from the directory following the plan's ``load_key``/``drop_key`` schedule (all up front
when the plan has none) and executes every instruction of SPEC section 4.

A plan whose params carry ``boot`` (``n14boot``, ``n16boot``) runs entirely on Lattigo's
bootstrapping parameters; the client also generates the bootstrapping keys once into the key
directory and the evaluation side loads them as the key block ``boot`` (docs/lattigo.md).

This module does what needs tensors and tables, so Go never sees them: it packs one
length-``slots`` vector per ``input`` instruction (program order) and per plaintext (sorted
by name), and scatters the decrypted vector of each ``output`` instruction back into its
tensor. How levels and scales are managed (automatic rescaling of unrescaled products
before a multiplication, ...) is documented at the top of ``backends/lattigo/executor.go``.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from planner import ir

# Above PLAINTEXT_INLINE_BYTES of plaintext vectors, run_plan hands them to Go through a file
# (the process model's threshold, planner.cost.process).
from planner.cost.process import PLAINTEXT_INLINE_BYTES

__all__ = [
    "LattigoError",
    "LattigoResult",
    "available",
    "pack_vectors",
    "run_plan",
    "run_raw",
    "sizes",
    "version",
    "write_plaintexts",
]

_EXT = "slotlattigo.slotlattigo"
_BUILD_HINT = ("the Lattigo extension is not built: run `make lattigo` in a checkout, or install with Go and a "
               "C compiler present and without SLOTPLAN_NO_LATTIGO (docs/install.md)")


class LattigoError(Exception):
    """Any failure of the Lattigo backend: bad plan or data, missing key, Go-side error."""


@dataclass
class OutputVector:
    """One ``output`` instruction's decrypted vector and where it came from."""

    tensor: str
    table: str
    level: int
    log2_scale: float
    values: np.ndarray


@dataclass
class LattigoResult:
    outputs: dict[str, np.ndarray]
    """Output tensors by name (shape from ``output_shapes`` or flat)."""
    stats: dict[str, Any]
    """Go-side statistics: ``op_counts``, ``op_seconds`` (per op class), ``rotations``,
    ``rotation_keys``, ``key_mode`` (``scheduled``/``keep_all``), ``key_loads``,
    ``galois_key_bytes`` (one key), ``peak_key_bytes``, ``peak_resident_keys``,
    ``relin_key_bytes``, ``peak_ciphertext_bytes``, ``keygen_seconds``, ``eval_seconds``,
    ``total_seconds``, ... plus ``pack_seconds`` and ``wall_seconds`` measured here."""
    vectors: list[OutputVector] = field(default_factory=list)
    """The raw decrypted vectors, one per ``output`` instruction in program order."""


_modules: tuple[Any, Any] | None = None


def _ext() -> tuple[Any, Any]:
    global _modules
    if _modules is None:
        try:
            _modules = (importlib.import_module(_EXT), importlib.import_module("slotlattigo.go"))
        except ImportError as e:
            raise LattigoError(f"{_BUILD_HINT} ({e})") from e
    return _modules


def available() -> bool:
    """True when the gopy extension imports."""
    try:
        _ext()
    except LattigoError:
        return False
    return True


def version() -> str:
    return str(_ext()[0].Version())


def _call(fn: Any, *args: Any) -> str:
    try:
        return str(fn(*args))
    except RuntimeError as e:  # gopy turns a Go error into RuntimeError
        raise LattigoError(str(e)) from None


def sizes(params: Mapping[str, Any]) -> dict[str, Any]:
    """Lattigo's ``BinarySize`` of a ciphertext / plaintext / rotation key per level."""
    mod, _ = _ext()
    out: dict[str, Any] = json.loads(_call(mod.Sizes, json.dumps(dict(params))))
    return out


def _table(
    tables: Mapping[str, np.ndarray], name: str, slots: int, what: str
) -> tuple[np.ndarray, np.ndarray | None]:
    key = f"{name}.idx"
    if key not in tables:
        raise LattigoError(f"{what}: table {name!r} has no {key!r} array")
    idx = np.asarray(tables[key])
    if idx.shape != (slots,) or not np.issubdtype(idx.dtype, np.integer):
        raise LattigoError(
            f"{what}: {key} must be an integer array of length {slots}, got {idx.dtype} {idx.shape}"
        )
    coef = None
    if f"{name}.coef" in tables:
        coef = np.asarray(tables[f"{name}.coef"], dtype=np.float64)
        if coef.shape != (slots,):
            raise LattigoError(f"{what}: {name}.coef must have length {slots}, got shape {coef.shape}")
    return idx.astype(np.int64, copy=False), coef


def _gather(values: np.ndarray, idx: np.ndarray, what: str) -> np.ndarray:
    flat = np.asarray(values, dtype=np.float64).ravel()
    if idx.size and int(idx.max()) >= flat.size:
        raise LattigoError(f"{what}: table index {int(idx.max())} is out of range for {flat.size} elements")
    out = np.zeros(idx.shape, dtype=np.float64)
    mask = idx >= 0
    out[mask] = flat[idx[mask]]
    return out


def pack_vectors(
    plan: Mapping[str, Any],
    inputs: Mapping[str, np.ndarray],
    weights: Mapping[str, np.ndarray],
    tables: Mapping[str, np.ndarray],
) -> tuple[bytes, bytes]:
    """The packed input and plaintext vectors ``Run`` expects (SPEC section 4 semantics)."""
    slots = _slots(plan)
    vecs = []
    for i, raw in enumerate(plan.get("program", [])):
        ins = ir.try_decode(raw)
        if not isinstance(ins, ir.Input):
            continue
        what = f"instruction {i} (input)"
        tensor = ins.tensor
        if tensor not in inputs:
            raise LattigoError(f"{what}: input tensor {tensor!r} was not given")
        idx, _ = _table(tables, str(ins.table), slots, what)
        vecs.append(_gather(inputs[tensor], idx, f"{what}, tensor {tensor!r}"))
    return _pack(vecs), _pack(list(_plaintext_vectors(plan, weights, tables)))


def _plaintext_vectors(
    plan: Mapping[str, Any], weights: Mapping[str, np.ndarray], tables: Mapping[str, np.ndarray]
) -> Iterator[np.ndarray]:
    """Each plaintext's value vector, in sorted name order (one at a time); a complex
    plaintext (complex packing, ``imag_table``) is 2 * slots values: real parts, then
    imaginary parts (what ``Run`` unpacks for it); a cins(l) plaintext (``l``) is its 2 * slots
    local coefficients (``Run`` encodes their CinS slots, docs/neujeans.md)."""
    plaintexts = plan.get("plaintexts") or {}
    for name in sorted(plaintexts):
        spec = plaintexts[name]
        slots = _slots(plan) * (2 if spec.get("l") else 1)
        what = f"plaintext {name!r}"
        parts = [str(spec.get("table"))] + ([str(spec["imag_table"])] if "imag_table" in spec else [])
        vecs = []
        for table in parts:
            idx, coef = _table(tables, table, slots, what)
            source = spec.get("source")
            if coef is None:
                coef = np.ones(slots)
            if source == "const":
                vecs.append(np.array(coef, dtype=np.float64))
            elif source in weights:
                vecs.append(coef * _gather(weights[source], idx, f"{what}, weight {source!r}"))
            else:
                raise LattigoError(f"{what}: weight tensor {source!r} was not given")
        yield vecs[0] if len(vecs) == 1 else np.concatenate(vecs)


def write_plaintexts(
    plan: Mapping[str, Any], weights: Mapping[str, np.ndarray], tables: Mapping[str, np.ndarray], path: str | Path
) -> int:
    """Write the packed plaintext vectors ``Run`` reads with its ``plaintext_file`` option
    (one vector in memory at a time); returns the number of vectors."""
    n = 0
    with open(path, "wb") as f:
        for v in _plaintext_vectors(plan, weights, tables):
            f.write(np.ascontiguousarray(v, dtype="<f8").tobytes())
            n += 1
    return n


def _pack(vecs: list[np.ndarray]) -> bytes:
    return b"".join(np.ascontiguousarray(v, dtype="<f8").tobytes() for v in vecs)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"plan contains a {type(obj).__name__}, which is not JSON")


def _slots(plan: Mapping[str, Any]) -> int:
    params = plan.get("params")
    if not isinstance(params, Mapping) or not isinstance(params.get("log_n"), int):
        raise LattigoError("plan has no params.log_n")
    slots = 1 << (params["log_n"] - 1)
    if params.get("slots", slots) != slots:
        raise LattigoError(
            f"plan params: slots = {params.get('slots')} but log_n = {params['log_n']} gives {slots}"
        )
    return slots


def _scatter(
    vectors: list[OutputVector],
    tables: Mapping[str, np.ndarray],
    slots: int,
    output_shapes: Mapping[str, Sequence[int]] | None,
) -> dict[str, np.ndarray]:
    by_tensor: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for ov in vectors:
        idx, _ = _table(tables, ov.table, slots, f"output {ov.tensor!r}")
        by_tensor.setdefault(ov.tensor, []).append((idx, ov.values))
    out: dict[str, np.ndarray] = {}
    for tensor, parts in by_tensor.items():
        if output_shapes is not None and tensor in output_shapes:
            shape = tuple(int(d) for d in output_shapes[tensor])
            size = int(np.prod(shape, dtype=np.int64))
        else:
            size = max((int(idx.max()) + 1 for idx, _ in parts), default=0)
            shape = (size,)
        y = np.full(size, np.nan)
        for idx, vals in parts:
            mask = idx >= 0
            if mask.any() and int(idx[mask].max()) >= size:
                raise LattigoError(
                    f"output {tensor!r}: table index {int(idx[mask].max())} out of range for shape {shape}"
                )
            y[idx[mask]] = vals[mask]
        missing = int(np.isnan(y).sum())
        if missing:
            raise LattigoError(
                f"output {tensor!r}: {missing} of {size} elements are written by no output instruction"
            )
        out[tensor] = y.reshape(shape)
    return out


_BASIC_OPS = frozenset({"input", "output", "rot", "rot_hoisted", "add", "sub", "cmul", "pmul", "padd", "psub",
                        "poly", "rescale", "load_key", "drop_key", "mul_i", "conj"})


def go_plan_json(plan: Mapping[str, Any]) -> str:
    """The plan as the Go executor gets it: with its ``fused`` annotation (the blocks the
    planner decided, checked here), or, for a plan without one (older or hand-written), the
    annotation :mod:`planner.ir.fused_plan` computes now. The Go side runs exactly these
    blocks and decides none itself. A bootstrapping plan also gets ``level_drops``: the
    levels its fresh values keep unused (:func:`planner.ir.analysis.level_drops`), dropped
    by the executor."""
    from planner.ir.analysis import level_drops
    from planner.ir.fused_plan import with_fused

    out = with_fused(plan)
    params = plan.get("params") or {}
    try:
        drops = level_drops(plan["program"], len(params["log_q"]) - 1)
    except (KeyError, TypeError, ValueError):
        drops = {}  # a plan the executor refuses anyway: its own validation names the fault
    if drops:
        out["level_drops"] = {str(i): lv for i, lv in drops.items()}
    return json.dumps(out, default=_json_default)


def check_executable(plan: Mapping[str, Any]) -> None:
    """Refuse, before any key is generated, a plan that cannot run as written (issue 38: a
    malformed plan is bad input, exit 2, not a mismatch): a bootstrap in a plan whose params
    have no ``boot`` object, and for plans without bootstrapping a rotation whose key is not
    resident under the plan's key schedule or a register deeper than ``params.max_level``
    (SPEC section 4's depth rule).  Raises :class:`PlanFileError` naming the instruction."""
    from common.errors import PlanFileError
    from planner.ir.fused_plan import read_fused

    read_fused(plan)  # a malformed fused-block annotation: one line naming the field
    params = plan.get("params") or {}
    prog = plan.get("program") or []
    ops = [ins.get("op") for ins in prog if isinstance(ins, Mapping)]
    boot = params.get("boot")
    for i, ins in enumerate(prog):
        if isinstance(ins, Mapping) and str(ins.get("op", "")).startswith("bootstrap") and not boot:
            raise PlanFileError(f"instruction {i} ({ins.get('op')}): the plan's params carry no 'boot' object "
                                "(a bootstrapping preset is needed to bootstrap)")
    if boot or not set(ops) <= _BASIC_OPS:
        return  # bootstrapping and cins plans: the backend's own checks
    schedule = "load_key" in ops
    max_level = params.get("max_level")
    resident: set[int] = set()
    depth: dict[str, int] = {}
    for i, ins in enumerate(prog):
        op = ins["op"]
        if op == "load_key" and isinstance(ins.get("k"), int):
            resident.add(int(ins["k"]))
        elif op == "drop_key" and isinstance(ins.get("k"), int):
            resident.discard(int(ins["k"]))
        keys = [ins.get("k")] if op == "rot" else list(ins.get("ks") or []) if op == "rot_hoisted" else []
        for k in keys:
            if schedule and isinstance(k, int) and k not in resident:
                raise PlanFileError(f"instruction {i} ({op}): no key for k={k} resident (the key schedule must "
                                    "load_key it before this rotation)")
        reads = [depth.get(str(ins[f]), 0) for f in ("src", "a", "b") if f in ins]
        d = max(reads, default=0)
        if op in ("pmul", "cmul"):
            d += 1
        elif op == "poly":  # as planner.ir's Poly.depth: ceil(log2(degree + 1)), +1 for a mapped domain
            coeffs = ins.get("coeffs") or []
            deg = max((j for j, c in enumerate(coeffs) if c != 0), default=0)
            dom = ins.get("domain")
            mapped = ins.get("basis") == "chebyshev" and dom is not None and list(dom) != [-1, 1] and deg > 0
            d += deg.bit_length() + (1 if mapped else 0)
        dsts = [ins["dst"]] if "dst" in ins else list(ins.get("dsts") or [])
        for r in dsts:
            depth[str(r)] = d
        if isinstance(max_level, int) and d > max_level:
            raise PlanFileError(f"instruction {i} ({op}): depth {d} exceeds the {max_level} levels of params "
                                f"{params.get('name', '?')} (SPEC section 4: every register's depth is at most "
                                "params.max_level)")


def run_raw(
    plan_json: str, inputs: bytes, plaintexts: bytes, options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Low-level call of the Go ``Run``: packed vectors in (see ``pack_vectors``), the
    parsed result JSON out (``outputs`` with base64 vectors, ``stats``)."""
    mod, go = _ext()
    raw = _call(
        mod.Run,
        plan_json,
        go.Slice_byte.from_bytes(bytes(inputs)),
        go.Slice_byte.from_bytes(bytes(plaintexts)),
        json.dumps(dict(options or {})),
    )
    result: dict[str, Any] = json.loads(raw)
    return result


def run_plan(
    plan: Mapping[str, Any],
    inputs: Mapping[str, np.ndarray],
    weights: Mapping[str, np.ndarray],
    tables: Mapping[str, np.ndarray],
    key_dir: str | None = None,
    *,
    output_shapes: Mapping[str, Sequence[int]] | None = None,
    key_level: int | None = None,
    memory_limit_extra_bytes: int | None = None,
    keep_boot_state: bool = False,
    plaintext_store: str | None = None,
) -> LattigoResult:
    """Execute ``plan`` encrypted with Lattigo and return the decrypted output tensors.

    ``tables`` maps ``"T.idx"`` / ``"T.coef"`` to arrays (npz content); ``inputs`` and
    ``weights`` map tensor names to arrays of the graph's shapes. ``key_dir`` is where the
    client writes the evaluation keys (kept afterwards; default: a temporary directory).
    ``output_shapes`` gives the graph's output shapes (else outputs are flat, sized by the
    largest table index). ``key_level`` generates the rotation keys at a lower level (they
    are smaller, and refused for ciphertexts above that level). ``memory_limit_extra_bytes``
    sets Go's soft memory limit to the Go runtime's memory at the start plus this (the
    modelled growth, backends/lattigo_memory.py). ``keep_boot_state`` leaves the
    bootstrapping evaluators with their encoded DFT matrices in the process for the next call
    with the same bootstrapping parameters (backends/lattigo/bootstate.go); a call uses such a
    state whether or not it keeps it. ``plaintext_store`` names a directory for the
    process's plaintext store (backends/lattigo/ptstore.go): a fused block's streamed
    plaintexts are spilled there when first encoded (an unlinked file) and read back by this
    and later calls instead of encoded again (``stats.plaintext_store``).
    """
    t0 = time.perf_counter()
    check_executable(plan)
    _ext()
    slots = _slots(plan)
    options: dict[str, Any] = {}
    own_keys = None
    if key_dir is None:
        # the evaluation keys go to a private directory named after this process, removed
        # afterwards; one left by a process that was killed (SIGKILL runs no clean-up) is
        # removed by the next run
        sweep_key_dirs()
        own_keys = tempfile.mkdtemp(prefix=f"{KEY_DIR_PREFIX}{os.getpid()}-")
        key_dir = own_keys
    options["key_dir"] = str(key_dir)
    if keep_boot_state:
        options["keep_boot_state"] = True
    if plaintext_store is not None:
        options["plaintext_store"] = str(plaintext_store)
    try:
        return _run_plan(plan, inputs, weights, tables, options, t0, slots, output_shapes, key_level,
                         memory_limit_extra_bytes)
    finally:
        if own_keys is not None:
            shutil.rmtree(own_keys, ignore_errors=True)


KEY_DIR_PREFIX = "slotplan-keys-"


def sweep_key_dirs(tmp: str | None = None) -> list[str]:
    """Remove this user's key directories (``slotplan-keys-PID-*`` in the temp dir) whose
    process is gone; returns the paths removed."""
    base = Path(tmp or tempfile.gettempdir())
    removed = []
    for d in base.glob(f"{KEY_DIR_PREFIX}*-*"):
        try:
            pid = int(d.name[len(KEY_DIR_PREFIX):].split("-", 1)[0])
            st = d.lstat()
        except (ValueError, OSError):
            continue
        if not d.is_dir() or d.is_symlink() or st.st_uid != os.getuid() or pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue  # its process still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(str(d))
    return removed


def _run_plan(plan: Mapping[str, Any], inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
              tables: Mapping[str, np.ndarray], options: dict[str, Any], t0: float, slots: int,
              output_shapes: Mapping[str, Sequence[int]] | None, key_level: int | None,
              memory_limit_extra_bytes: int | None) -> LattigoResult:
    if key_level is not None:
        options["key_level"] = int(key_level)
    if memory_limit_extra_bytes:
        options["memory_limit_extra_bytes"] = int(memory_limit_extra_bytes)
    n_pt = len(plan.get("plaintexts") or {})
    with tempfile.TemporaryDirectory(prefix="slotplan-pt-") as tmp:
        if n_pt * slots * 8 > PLAINTEXT_INLINE_BYTES:
            # many plaintexts (a deep network): the Go side reads them one at a time from a
            # file, so neither side holds them all
            packed_inputs, _ = pack_vectors({**plan, "plaintexts": {}}, inputs, weights, tables)
            packed_pts = b""
            options["plaintext_file"] = str(Path(tmp) / "plaintexts.f64")
            write_plaintexts(plan, weights, tables, options["plaintext_file"])
        else:
            packed_inputs, packed_pts = pack_vectors(plan, inputs, weights, tables)
        pack_seconds = time.perf_counter() - t0
        result = run_raw(go_plan_json(plan), packed_inputs, packed_pts, options)
    vectors = [
        OutputVector(
            tensor=o["tensor"],
            table=o["table"],
            level=int(o["level"]),
            log2_scale=float(o["log2_scale"]),
            values=np.frombuffer(base64.b64decode(o["data"]), dtype="<f8").astype(np.float64),
        )
        for o in result["outputs"]
    ]
    outputs = _scatter(vectors, tables, slots, output_shapes)
    stats: dict[str, Any] = result["stats"]
    stats["pack_seconds"] = pack_seconds
    stats["plaintexts_inline"] = "plaintext_file" not in options
    stats["wall_seconds"] = time.perf_counter() - t0
    return LattigoResult(outputs=outputs, stats=stats, vectors=vectors)
