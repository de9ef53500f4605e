"""What a calibrated table measured beyond its weights, and how a run differs from what the
planner prices (:class:`Run`); :mod:`planner.cost.timing` prices with them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Run", "executor_bootstraps", "key_load_ms"]


@dataclass(frozen=True)
class Run:
    """How the executor runs a plan, where it differs from what the planner prices (the
    defaults: every instruction at its plan level, plaintexts encoded before the clock, a
    key reader on a core of its own).  ``level_drops``: a bootstrapping plan's fresh values
    dropped to the levels their consumers need (``planner.ir.analysis.level_drops``; the
    Lattigo executor always does); ``encode``: every plaintext encoded in the clock, at its
    level (a one-shot ``slotplan run``; a benchmark or a server with a plaintext cache
    encodes them once, outside); ``loader_core``: the key reader (prefetched keys, a
    streamed block's keys) runs beside the evaluation; without a core of its own (one core,
    or every core evaluating) each read takes its time from the evaluation, in line;
    ``bootstrap_measured``: each bootstrap at its kind's time as the executor runs it
    (``measurements.boot_variants``, ``calibrate --boot-variants``: the instruction with its
    copies, masks and unpacking, in an executor process), not the planning price (Lattigo's
    bootstrap alone times the kind's ratio).  ``plaintext_store``: the fused blocks'
    plaintexts read back from the process's plaintext store (backends/lattigo/ptstore.go: a
    server's evaluations after the first) instead of encoded, each at its bytes' read and its
    values' hash (``TimeModel.store_block``); the other plaintexts as ``encode`` says."""

    level_drops: bool = False
    encode: bool = False
    loader_core: bool = True
    bootstrap_measured: bool = False
    plaintext_store: bool = False


def key_load_ms(load: Mapping[str, Any], read_keys: object) -> float:
    """One key's load in a calibrated table.  The key store reads a key with
    GaloisKey.ReadFrom, which parses as it reads: what ``read_file`` times when the
    calibration cycles through the block's key files (``key_read_keys``; n14boot: 0.60
    ms/MB against 0.43-0.65 ms/MB measured by keymeasure's runs, ``key_load_ms_per_mb``).
    Older tables read one key file over and over from the caches (n14: 0.2 ms/MB against
    1.2-3 ms/MB for LoLa's key sets; with it LoLa's half-cap schedule chose 207 loads, 1.32x
    keep-all measured), so their price adds unmarshal (an in-memory parse, which faults in
    fresh pages: 2-21 ms at n14boot between calibrations) as a stand-in for the disk."""
    if isinstance(read_keys, int) and read_keys > 1 and "read_file" in load:
        return float(load["read_file"])
    return float(sum(float(v) for v in load.values()))


def executor_bootstraps(bv: object) -> tuple[dict[str, float], dict[str, bool]]:
    """``measurements.boot_variants``: each kind's median (ms) and whether its run streamed."""
    if not isinstance(bv, dict):
        return {}, {}
    ms = {k: float(v["median_ms"]) for k, v in bv.items() if isinstance(v, dict) and "median_ms" in v}
    streamed: dict[str, bool] = {}
    for name, v in bv.items():
        if name.startswith("run ") and isinstance(v, dict):
            streamed.update((k, v.get("stream") is not None) for k in name[4:].split(","))
    return ms, streamed
