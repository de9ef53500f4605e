"""Plan files and table files: atomic writes, strict reads."""

from __future__ import annotations

import json
import os
import re
import tempfile
import zipfile
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from common.errors import PlanFileError, SlotplanError, ValuesError
from planner.frontend.graph import Graph
from planner.ir.builder import LazyTables
from planner.ir.fused_plan import read_fused
from planner.ir.plan import MAX_PROGRAM_LENGTH, validate_plan

# Tables above this size are refused unless the user raises the limit (SPEC section 4):
# MVM2 at n16 needs ~1 GiB of int64 indices, which is rarely what a user meant to write.
DEFAULT_MAX_TABLE_BYTES = 512 * 2**20


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6,
          "gb": 10**9, "tb": 10**12}


def parse_size(text: str) -> int:
    """Bytes from '123', '64MiB', '1.5 GiB', '10kB'."""
    m = _SIZE.match(str(text))
    if not m:
        raise PlanFileError(f"memory size {text!r}: expected bytes or a KiB/MiB/GiB suffix")
    unit = (m.group(2) or "B").lower()
    # exact arithmetic (never through a float: 10**30 stays 10**30); a fraction of a byte
    # is rounded down
    val = int(Fraction(m.group(1)) * _UNITS[unit])
    if val < 1:
        raise PlanFileError(f"memory size {text!r} must be positive")
    return val


def dumps_plan(plan: Mapping[str, Any]) -> str:
    return json.dumps(plan, indent=1, sort_keys=False, allow_nan=False) + "\n"


def _atomic_write(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_outputs(
    plan: Mapping[str, Any],
    plan_path: Path | None,
    tables: LazyTables | None,
    tables_path: Path | None,
    max_table_bytes: int = DEFAULT_MAX_TABLE_BYTES,
) -> None:
    """Write the plan and (optionally) its tables; nothing is written unless both succeed."""
    for what, target in (("plan", plan_path), ("tables", tables_path)):
        if target is None:
            continue
        if target.is_dir():
            raise PlanFileError(f"cannot write the {what} to {target}: it is a directory")
        parent = target.parent if str(target.parent) else Path(".")
        if not parent.is_dir():
            raise PlanFileError(f"cannot write the {what} to {target}: directory {parent} does not exist")
    staged: list[tuple[str, Path]] = []
    try:
        if tables_path is not None:
            assert tables is not None
            slots = int(plan["params"]["slots"])
            names = tables.table_names()
            estimate = len(names) * slots * 8
            if estimate > max_table_bytes:
                raise PlanFileError(
                    f"tables need about {estimate / 2**20:.0f} MiB (> limit {max_table_bytes / 2**20:.0f} MiB);"
                    " raise --max-table-bytes to write them"
                )
            fd, tmp = tempfile.mkstemp(prefix=f".{tables_path.name}.", suffix=".npz", dir=tables_path.parent or ".")
            os.close(fd)
            staged.append((tmp, tables_path))
            with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
                _npz_add(zf, DIGEST_KEY, np.array(plan_digest(plan)))
                for name in names:
                    idx, coef = tables._get(name)
                    _npz_add(zf, f"{name}.idx", idx.astype(np.int64))
                    if coef is not None:
                        _npz_add(zf, f"{name}.coef", coef.astype(np.float64))
        if plan_path is not None:
            fd, tmp = tempfile.mkstemp(prefix=f".{plan_path.name}.", dir=plan_path.parent or ".")
            with os.fdopen(fd, "w") as fh:
                fh.write(dumps_plan(plan))
            staged.append((tmp, plan_path))
        for tmp, final in staged:
            os.replace(tmp, final)
        staged = []
    except OSError as e:
        raise PlanFileError(f"cannot write {getattr(e, 'filename', None) or 'the output'}: {e.strerror or e}") from None
    finally:
        for tmp, _ in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _npz_add(zf: zipfile.ZipFile, key: str, arr: np.ndarray) -> None:
    # np.savez's member layout: "<key>.npy" holding a .npy file; keys may contain '/'
    with zf.open(key + ".npy", "w", force_zip64=True) as fh:
        np.lib.format.write_array(fh, np.ascontiguousarray(arr), allow_pickle=False)


# Plans larger than this are refused when read (a plan file is JSON text; MVM2 at n16 is ~40 MB).
MAX_PLAN_FILE_BYTES = 512 * 2**20
# Name of the npz member that ties a tables file to its plan (see plan_digest).
DIGEST_KEY = "slotplan.plan_digest"

__all__ = ["MAX_PROGRAM_LENGTH", "PlanFileError", "validate_plan"]


def load_plan(path: str | Path) -> dict[str, Any]:
    """Read and validate a plan file (one line naming the field on any problem)."""
    p = Path(path)
    try:
        if p.is_dir():
            raise PlanFileError(f"plan file {p} is a directory")
        size = p.stat().st_size
        if size > MAX_PLAN_FILE_BYTES:
            raise PlanFileError(f"plan file {p} is {size} bytes, over the limit of {MAX_PLAN_FILE_BYTES}")
        with p.open("rb") as fh:
            head = fh.read(4)
        if head.startswith(b"PK"):
            raise PlanFileError(f"plan file {p} is a zip/npz archive (tables?), not a JSON plan")
        plan = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanFileError(f"plan file {p} not found") from None
    except UnicodeDecodeError:
        raise PlanFileError(f"plan file {p} is not UTF-8 JSON text") from None
    except json.JSONDecodeError as e:
        raise PlanFileError(f"plan file {p}: not JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise PlanFileError(f"plan file {p}: JSON nested too deeply") from None
    except OSError as e:
        raise PlanFileError(f"plan file {p}: cannot read ({e.strerror or e})") from None
    plan = validate_plan(plan, f"plan file {p}")
    try:
        read_fused(plan)  # a malformed fused-block annotation: one line naming the field
    except PlanFileError as e:
        raise PlanFileError(f"plan file {p}: {e}") from None
    return plan


def plan_digest(plan: Mapping[str, Any]) -> str:
    """What a plan's tables belong to: the graph, the slot count, the node layouts and the
    names of the tables the program reads (a re-scheduled or hand-edited program keeps its
    tables; a plan with other layouts does not)."""
    import hashlib

    names: list[str] = []
    for ins in plan["program"]:
        if isinstance(ins, dict) and isinstance(ins.get("table"), str):
            names.append(ins["table"])
    for p in plan["plaintexts"].values():
        if isinstance(p, dict):
            names.append(str(p.get("table")))
            if "imag_table" in p:  # a complex plaintext (complex packing)
                names.append(str(p["imag_table"]))
    doc = {
        "graph": plan["graph"].get("sha256"),
        "slots": plan["params"].get("slots"),
        "tables": list(dict.fromkeys(names)),
        "layouts": [[n.get("id"), n.get("in_layouts"), n.get("out_layout")] for n in plan["nodes"]
                    if isinstance(n, dict)],
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _read_member(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, p: Path, slots: int | None, wide: frozenset[str] = frozenset()
) -> tuple[str, np.ndarray]:
    """One array of a tables file, its header checked before its data is read."""
    if not info.filename.endswith(".npy"):
        raise PlanFileError(f"tables file {p}: member {info.filename!r} is not a .npy array")
    key = info.filename[:-4]
    with zf.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
        n = slots * 2 if slots is not None and key.rsplit(".", 1)[0] in wide else slots
        _check_member(f"tables file {p}: array {key!r}", key, tuple(shape), dtype, n, info.file_size)
        fh.seek(0)
        arr = np.lib.format.read_array(fh, allow_pickle=False)
    if key.endswith(".coef") and not np.all(np.isfinite(arr)):
        raise PlanFileError(f"tables file {p}: array {key!r}: coefficients must be finite")
    return key, arr


def _check_member(
    where: str, key: str, shape: tuple[int, ...], dtype: np.dtype[Any], slots: int | None, file_size: int
) -> None:
    n = int(np.prod(shape, dtype=np.float64)) if shape else 1
    if dtype.hasobject:
        raise PlanFileError(f"{where}: object arrays are not allowed")
    if key == DIGEST_KEY:
        if dtype.kind != "U" or n != 1:
            raise PlanFileError(f"{where}: must be one string")
    elif key.endswith(".idx"):
        if dtype.kind not in "iu":
            raise PlanFileError(f"{where}: index tables are integers (int64), got {dtype}")
    elif key.endswith(".coef"):
        if dtype.kind != "f":
            raise PlanFileError(f"{where}: coefficient tables are float64, got {dtype}")
    else:
        raise PlanFileError(f"{where}: names end in .idx or .coef")
    if key != DIGEST_KEY and (len(shape) != 1 or (slots is not None and shape[0] != slots)):
        want = f"({slots},)" if slots is not None else "one-dimensional"
        raise PlanFileError(f"{where}: shape {tuple(shape)}, expected {want}")
    if n * dtype.itemsize > file_size:
        raise PlanFileError(f"{where}: its header claims {n * dtype.itemsize} bytes but the "
                            f"member holds {file_size}")


def cins_tables(plan: Mapping[str, Any]) -> frozenset[str]:
    """Tables of length ``2 * slots`` (docs/cins.md): those of cins plaintexts and of
    inputs with ``l``."""
    names = {str(pt.get("table")) for pt in plan.get("plaintexts", {}).values() if isinstance(pt, dict) and pt.get("l")}
    names |= {str(i.get("table")) for i in plan.get("program", []) if isinstance(i, dict) and i.get("op") == "input"
              and i.get("l")}
    return frozenset(names)


def load_tables(path: str | Path, plan: Mapping[str, Any] | None = None) -> Mapping[str, np.ndarray]:
    """Read a tables file strictly: every member's header is checked before its data is
    read (dtype: int64 indices ``T.idx``, finite float64 ``T.coef``; length ``slots`` when
    the plan is given), and a file written for another plan is refused."""
    p = Path(path)
    slots = int(plan["params"]["slots"]) if plan is not None else None
    wide = cins_tables(plan) if plan is not None else frozenset()
    out: dict[str, np.ndarray] = {}
    try:
        if p.is_dir():
            raise PlanFileError(f"tables file {p} is a directory")
        with zipfile.ZipFile(p) as zf:
            for info in zf.infolist():
                key, arr = _read_member(zf, info, p, slots, wide)
                out[key] = arr
    except FileNotFoundError:
        raise PlanFileError(f"tables file {p} not found") from None
    except PlanFileError:
        raise
    except (ValueError, zipfile.BadZipFile, OSError, EOFError) as e:
        raise PlanFileError(f"tables file {p}: not a valid npz file ({' '.join(str(e).split())[:200]})") from None
    except MemoryError:
        raise PlanFileError(f"tables file {p}: an array is too large to load") from None
    if plan is not None:
        digest = out.pop(DIGEST_KEY, None)
        if digest is not None and str(digest.reshape(-1)[0]) != plan_digest(plan):
            raise PlanFileError(
                f"tables file {p} was written for another plan (its plan digest {str(digest.reshape(-1)[0])[:12]}... "
                f"differs from this plan's {plan_digest(plan)[:12]}...); use the tables written with this plan"
            )
    else:
        out.pop(DIGEST_KEY, None)
    return out


if TYPE_CHECKING:
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")


def load_model_file(path: str | Path, model: type[M], what: str) -> tuple[M, Path]:
    """A JSON file validated by a pydantic model, and its folder (suite paths are relative
    to it); errors name the file."""
    p = Path(path)
    try:
        return model.model_validate(json.loads(p.read_text())), p.parent
    except FileNotFoundError as e:
        raise SlotplanError(f"{what} {p} not found") from e
    except (ValueError, json.JSONDecodeError) as e:
        raise SlotplanError(f"{what} {p}: {' '.join(str(e).split())}") from e


# --------------------------------------------------------------------------------------
# The user's tensors (run --inputs X.npz --weights W.npz --out Y.npz)
# --------------------------------------------------------------------------------------


def read_arrays(path: str | Path, what: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file (no pickles; each header checked before its data)."""
    p = Path(path)
    out: dict[str, np.ndarray] = {}
    try:
        if p.is_dir():
            raise ValuesError(f"{what} file {p} is a directory")
        with zipfile.ZipFile(p) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    raise ValuesError(f"{what} file {p}: member {info.filename!r} is not a .npy array")
                key = info.filename[:-4]
                with zf.open(info) as fh:
                    version = np.lib.format.read_magic(fh)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
                    else:
                        shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
                    n = int(np.prod(shape, dtype=np.float64)) if shape else 1
                    if dtype.kind not in "biuf":
                        raise ValuesError(f"{what} file {p}: values must be real numbers, got dtype {dtype}",
                                          tensor=key)
                    if n * dtype.itemsize > max(info.file_size, 1) or n > 2**28:
                        raise ValuesError(f"{what} file {p}: its header claims {n} elements, more than the file "
                                          "holds or the limit 2**28", tensor=key)
                    fh.seek(0)
                    out[key] = np.lib.format.read_array(fh, allow_pickle=False)
    except FileNotFoundError:
        raise ValuesError(f"{what} file {p} not found") from None
    except ValuesError:
        raise
    except (ValueError, zipfile.BadZipFile, OSError, EOFError) as e:
        raise ValuesError(f"{what} file {p}: not a valid npz file ({' '.join(str(e).split())[:200]})") from None
    return out


def user_values(graph: Graph, inputs: str | Path | None, weights: str | Path | None,
                samples: bool = False, known_weights: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The graph's encrypted inputs from ``inputs`` and its weights from ``weights``, each
    array named as its tensor and of any shape with the tensor's number of elements (a
    leading batch dimension of 1, a flattened image), reshaped to the declared shape.  A
    missing, extra, mis-sized or non-finite array is refused naming the tensor.
    ``known_weights`` (an imported model's own) serve when ``weights`` is None."""
    out: dict[str, np.ndarray] = {}
    for role, path, names, flag in (
        ("input", inputs, graph.inputs, "--inputs"), ("weight", weights, graph.weights, "--weights"),
    ):
        if path is None and role == "weight" and known_weights is not None:
            out |= {t: np.asarray(known_weights[t], dtype=np.float64).reshape(graph.shape(t)) for t in names}
            continue
        if path is None:
            if names:
                raise ValuesError(
                    f"the graph has {role}s ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''}): "
                    f"give them with {flag} FILE.npz", tensor=names[0])
            continue
        arrays = read_arrays(path, flag[2:])
        for key in arrays:
            if key not in names:
                if key in graph.tensors:
                    kind = graph.tensor(key).role
                    where = "it is computed by a node" if kind == "node" else (
                        f"it is a{'n' if kind == 'input' else ''} {kind}: put it in "
                        f"{'--inputs' if kind == 'input' else '--weights'}")
                    raise ValuesError(f"array in {path} is not a graph {role} ({where})", tensor=key)
                raise ValuesError(f"array in {path} names no tensor of the graph (its {role}s: "
                                  f"{', '.join(names[:8])}{', ...' if len(names) > 8 else ''})", tensor=key)
        for name in names:
            if name not in arrays:
                raise ValuesError(f"no array named {name!r} in {path} (one per graph {role})", tensor=name)
            arr = np.asarray(arrays[name])
            shape = graph.shape(name)
            size = int(np.prod(shape))
            if samples and role == "input" and arr.size != size and arr.ndim >= 2 and arr.size == arr.shape[0] * size:
                shape = (int(arr.shape[0]), *shape)  # a batched plan: N samples (SPEC section 8)
            if arr.size != int(np.prod(shape)):
                raise ValuesError(
                    f"array in {path} has shape {tuple(arr.shape)} ({arr.size} elements); the graph declares "
                    f"{tuple(shape)} ({int(np.prod(shape))} elements)", tensor=name)
            val = arr.astype(np.float64).reshape(shape)
            if not np.all(np.isfinite(val)):
                raise ValuesError(f"array in {path} holds NaN or infinite values", tensor=name)
            out[name] = val
    return out


def write_arrays(path: str | Path, arrays: Mapping[str, np.ndarray]) -> None:
    """An ``.npz`` of float64 arrays, written atomically."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ValuesError(f"cannot write {p}: it is a directory")
    if not parent.is_dir():
        raise ValuesError(f"cannot write {p}: directory {parent} does not exist")

    def write(fh: Any) -> None:  # np.savez's keywords would clash with names like "file"
        with zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED) as zf:
            for k, v in arrays.items():
                with zf.open(f"{k}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.ascontiguousarray(v, dtype=np.float64),
                                              allow_pickle=False)

    _atomic_write(p, write)
