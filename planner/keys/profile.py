"""What every key schedule is built on: its errors, and a program's key memory profile
(live ciphertexts and plaintexts per instruction, before any key is resident)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from common.errors import SlotplanError
from planner import ir
from planner.frontend.params import Params
from planner.ir.analysis import (
    memory_series,
)


class KeyScheduleError(SlotplanError):
    """A key schedule cannot be built (bad option, unusable basis, solver failure)."""


class KeyCapError(KeyScheduleError):
    """The memory cap is below what one step of the program needs under this strategy."""

    def __init__(self, cap: int, min_cap: int, strategy: str, where: str):
        self.cap = cap
        self.min_cap = min_cap
        self.strategy = strategy
        self.where = where
        super().__init__(
            f"modelled peak of at least {min_cap} bytes exceeds memory_cap_bytes {cap} ({_mib(cap)}) "
            f"under key strategy {strategy!r}: {where}; the smallest feasible cap is {min_cap} bytes "
            f"({_mib(min_cap)})"
        )

    def __reduce__(self) -> tuple[type[KeyCapError], tuple[int, int, str, str]]:
        return (type(self), (self.cap, self.min_cap, self.strategy, self.where))


def _mib(b: int) -> str:
    return f"{b / 2**20:.2f} MiB"


# --------------------------------------------------------------------------------------
# Memory model (planner.ir.analysis.memory_profile semantics, keys at their own sizes)
# --------------------------------------------------------------------------------------


def _rot_keys(ins: Mapping[str, Any]) -> list[int]:
    return list(ir.decode(ins).rot_keys())


def _is_key_op(ins: Mapping[str, Any]) -> bool:
    return isinstance(ir.decode(ins), ir.KeyOp)


def _walk(
    program: Sequence[Mapping[str, Any]],
    params: Params,
    key_bytes: Mapping[int, int] | None,
    depth: Mapping[str, int] | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """Per program point: (resident key bytes, live plaintext bytes, live ciphertext bytes),
    from :func:`planner.ir.analysis.memory_series` (the walk behind every reported peak)."""
    ser = memory_series(program, params, depth, key_bytes)
    return ser["keys"].tolist(), ser["plaintexts"].tolist(), ser["ciphertexts"].tolist()


def key_memory_profile(
    program: Sequence[Mapping[str, Any]],
    params: Params,
    key_bytes: Mapping[int, int] | None = None,
    depth: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Peak modelled bytes (keys, plaintexts, ciphertexts, total) like
    :func:`planner.ir.analysis.memory_profile`, with every key at its own size."""
    ks, ps, cs = _walk(program, params, key_bytes, depth)
    if not ks:
        return {"keys": 0, "plaintexts": 0, "ciphertexts": 0, "total": 0}
    return {
        "keys": max(ks),
        "plaintexts": max(ps),
        "ciphertexts": max(cs),
        "total": max(k + p + c for k, p, c in zip(ks, ps, cs, strict=True)),
    }


# Bytes the executor holds at each step beside the plan's own terms (the fused blocks' state,
# planner.cost.process.executor_series), for a program without key ops: set while the key
# schedule runs under a cap on the process model (planner.keys.schedule.schedule_plan), so
# that every strategy sees it in the base profile of whatever program it schedules.
EXECUTOR_SERIES: ContextVar[Callable[[Sequence[Mapping[str, Any]]], Any] | None] = ContextVar(
    "executor_series", default=None)


def base_profile(
    program: Sequence[Mapping[str, Any]], params: Params, depth: Mapping[str, int] | None = None
) -> list[int]:
    """Live ciphertext + plaintext bytes at every point of a program without key ops, plus
    the executor's step-wise bytes when :data:`EXECUTOR_SERIES` is set."""
    core = [i for i in program if not _is_key_op(i)]
    _, ps, cs = _walk(core, params, {}, depth)
    out = [p + c for p, c in zip(ps, cs, strict=True)]
    series = EXECUTOR_SERIES.get()
    if series is not None:
        out = [o + int(e) for o, e in zip(out, series(core), strict=True)]
    return out
