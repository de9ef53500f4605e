"""Plan files and table files: atomic writes, strict reads."""

from __future__ import annotations

import json
import os
import re
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import SlotplanError
from planner.program import LazyTables

# Tables above this size are refused unless the user raises the limit (SPEC section 4):
# MVM2 at n16 needs ~1 GiB of int64 indices, which is rarely what a user meant to write.
DEFAULT_MAX_TABLE_BYTES = 512 * 2**20


class PlanFileError(SlotplanError):
    pass


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6,
          "gb": 10**9, "tb": 10**12}


def parse_size(text: str) -> int:
    """Bytes from '123', '64MiB', '1.5 GiB', '10kB'."""
    m = _SIZE.match(str(text))
    if not m:
        raise PlanFileError(f"memory size {text!r}: expected bytes or a KiB/MiB/GiB suffix")
    unit = (m.group(2) or "B").lower()
    val = float(m.group(1)) * _UNITS[unit]
    if val < 1:
        raise PlanFileError(f"memory size {text!r} must be positive")
    return int(val)


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
    finally:
        for tmp, _ in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _npz_add(zf: zipfile.ZipFile, key: str, arr: np.ndarray) -> None:
    # np.savez's member layout: "<key>.npy" holding a .npy file; keys may contain '/'
    with zf.open(key + ".npy", "w", force_zip64=True) as fh:
        np.lib.format.write_array(fh, np.ascontiguousarray(arr), allow_pickle=False)


def load_plan(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        plan = json.loads(p.read_text())
    except FileNotFoundError as e:
        raise PlanFileError(f"plan file {p} not found") from e
    except json.JSONDecodeError as e:
        raise PlanFileError(f"plan file {p}: not JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(plan, dict) or plan.get("schema") != "slotplan.plan/1":
        raise PlanFileError(f"plan file {p}: schema must be 'slotplan.plan/1'")
    for key in ("graph", "params", "summary", "nodes", "plaintexts", "program"):
        if key not in plan:
            raise PlanFileError(f"plan file {p}: field {key!r} is missing")
    return plan


def load_tables(path: str | Path) -> Mapping[str, np.ndarray]:
    p = Path(path)
    try:
        return dict(np.load(p, allow_pickle=False))
    except FileNotFoundError as e:
        raise PlanFileError(f"tables file {p} not found") from e
    except (ValueError, zipfile.BadZipFile, OSError) as e:
        raise PlanFileError(f"tables file {p}: not an npz file ({e})") from e
