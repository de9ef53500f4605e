"""The modelled memory of a Lattigo run: the plan's memory model plus what the executor holds.

The model itself is the planner's (:mod:`planner.cost.process`: its terms, the fused-block
walk, the bootstrap's temporaries and garbage), one definition for both sides: the planner
evaluates it with the executor's sizes stored per preset by ``slotplan calibrate``, a run
with the sizes Go's ``ExecutorMemory`` reports for the plan (:func:`executor_memory`,
backends/lattigo/memmodel.go, built with the executor's own constructors) and the workers it
really uses.  Here: that call, and Go's soft memory limit during a run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from planner.cost.process import (
    BASELINE_BYTES,
    BootMemory,
    boot_memory,
    boot_series,
    fused_series,
    plaintext_cache_bytes,
    process_model,
)

__all__ = ["BASELINE_BYTES", "GC_LIMIT_HEADROOM", "BootMemory", "boot_memory", "boot_series", "executor_memory",
           "fused_series", "plaintext_cache_bytes", "process_model"]

# Go's soft memory limit during a run: the Go runtime's memory at its start plus the
# modelled growth times this (the collector then runs before the heap passes the model;
# Go's GOGC alone, 10 during a run, would let it reach 1.1x the live bytes). At 1.03 a
# run whose real need passed the model by 4% (LeNet-5 keep-all at n14boot once blocks
# stream their plaintexts: RSS 1.044x the model) sat on the limit: the collector ran back
# to back (sweeping 42% of the CPU profile) and the evaluation took 21-23 s instead of
# 9.8 s. At 1.10 LoLa's capped runs at n14 (RSS 1.23x the model: 170 MiB the model does
# not explain yet) sat on it in turn (runs of 4.66, 5.80, 5.83 s against 4.42-4.52 s for
# the same schedule at the quarter cap). GOGC 10 already keeps the heap within 1.1x the
# live bytes; the limit only has to stop a runaway, so it leaves a quarter of room.
GC_LIMIT_HEADROOM = 1.25


def executor_memory(plan: Mapping[str, Any], workers: int | None = None) -> dict[str, Any]:
    """Go's ``ExecutorMemory`` for a plan: sizes of the executor's buffers and fused blocks."""
    from backends.lattigo_backend import _call, _ext, go_plan_json

    mod, _ = _ext()
    opts = {"workers": int(workers)} if workers else {}
    return dict(json.loads(_call(mod.ExecutorMemory, go_plan_json(plan), json.dumps(opts))))
