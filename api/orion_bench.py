"""``slotplan orion-bench``: Orion's MLP encrypted by Orion and by slotplan, same job.

Orion (baahl-nyu/orion, PyPI ``orion-fhe``) runs in its own interpreter
(``make orion`` installs it into ``.venv-orion``: it needs torch, which slotplan does not):
``scripts/orion_mlp.py`` builds ``orion.models.MLP`` (784-128-128-10, BatchNorm, x^2) with
seeded weights, encrypts one MNIST-like input with Orion's ``configs/mlp.yml`` parameters and
times Orion's encrypted inference. It writes the input, the eval-mode weights (BatchNorm
folded) and its decrypted outputs. slotplan then plans ``data/models/orion_mlp.json`` (the
same network) on ``data/params/orion-n13.json`` (Orion's modulus chain) and runs it on
Lattigo with those weights and that input (Go ``BenchPlan``). Both are compared with the
same float64 cleartext output.

Times are what each system's user waits for: Orion's ``net(ciphertext)`` (its example's
timer, Python included) and our evaluation (``eval_seconds``); key generation, plaintext
encoding and Orion's fit/compile are reported apart. Both inherit this process's CPU
affinity and ``GOMAXPROCS`` (run under ``taskset -c 1 env GOMAXPROCS=1`` for one core).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from common.errors import SlotplanError

REPO = Path(__file__).resolve().parent.parent
ORION_SCRIPT = REPO / "scripts" / "orion_mlp.py"
DEFAULT_ORION_PYTHON = REPO / ".venv-orion" / "bin" / "python"
GRAPH = REPO / "data" / "models" / "orion_mlp.json"
PARAMS = REPO / "data" / "params" / "orion-n13.json"
# Orion compiles the MLP in ~10 s and evaluates it in < 1 s here; the bound is for a
# stuck interpreter, with room for --repeat up to MAX_REPEAT on a loaded machine.
ORION_TIMEOUT_S = 1800
MAX_REPEAT = 50
# The float64 fold of Linear+BatchNorm against torch's float32 forward (~1e-7 relative).
FOLD_RTOL = 1e-4
TENSORS = ("x", "W1", "b1", "W2", "b2", "W3", "b3")


def run_orion(python: Path, repeat: int, seed: int, workdir: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Orion's own run (subprocess in Orion's interpreter): its JSON summary and arrays."""
    if not python.exists():
        raise SlotplanError(
            f"--orion-python {str(python)!r} does not exist: run `make orion` (installs orion-fhe from PyPI "
            "into .venv-orion) or pass Orion's interpreter"
        )
    prefix = workdir / "orion"
    cmd = [str(python), str(ORION_SCRIPT), "--out", str(prefix), "--repeat", str(repeat), "--seed", str(seed)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=ORION_TIMEOUT_S, cwd=workdir)
    except subprocess.TimeoutExpired:
        raise SlotplanError(f"Orion did not finish within {ORION_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SlotplanError(f"Orion failed (exit {proc.returncode}): {last}")
    info = json.loads(Path(f"{prefix}.json").read_text())
    with np.load(f"{prefix}.npz") as z:
        arrays = {k: np.asarray(z[k]) for k in z.files}
    return info, arrays


def run_ours(arrays: dict[str, np.ndarray], repeat: int, table_now: Path | None = None,
             batch: int | None = None) -> dict[str, Any]:
    """slotplan's plan of the same network on Orion's chain, run on Lattigo (BenchPlan);
    with ``batch``, a plan of that many samples (SPEC section 8) fed Orion's input in every
    sample."""
    from backends.lattigo_bench import run_plan_bench
    from planner.frontend.graph import load_graph
    from planner.frontend.params import load_params
    from planner.pipeline import PlanOptions

    graph = load_graph(GRAPH)
    params = load_params(str(PARAMS))
    values = {t: arrays[t] for t in TENSORS}
    if batch is not None:
        values["x"] = np.repeat(np.asarray(arrays["x"])[None], batch, axis=0)
    return run_plan_bench(graph, params, PlanOptions(batch=batch), values, repeat=repeat, budget=None,
                          keep_outputs=True, table_now=table_now)


def orion_bench(
    python: Path | None = None, repeat: int = 3, seed: int = 0, table_now: Path | None = None,
    batch: int | None = None,
) -> dict[str, Any]:
    """Both systems on the same weights and input; one row with times, errors and ratios.
    ``batch``: our plan holds that many samples per ciphertext (the same input in each) and
    the row adds samples per second for both systems (Orion's MLP takes one per inference)."""
    if not 1 <= repeat <= MAX_REPEAT:
        raise SlotplanError(f"--repeat must be in 1..{MAX_REPEAT}, got {repeat}")
    with tempfile.TemporaryDirectory(prefix="slotplan-orion-") as tmp:
        info, arrays = run_orion(python or DEFAULT_ORION_PYTHON, repeat, seed, Path(tmp))
    fold = float(info["fold_vs_torch_max_abs"]) / max(float(np.max(np.abs(arrays["y_clear"]))), 1e-300)
    if fold > FOLD_RTOL:
        raise SlotplanError(
            f"the folded weights do not reproduce Orion's cleartext network (relative {fold:.1e} > {FOLD_RTOL:g}): "
            "the comparison would not be on the same network"
        )
    from backends.lattigo_bench import rel_error

    ours = run_ours(arrays, repeat, table_now, batch)
    clear = arrays["y_clear"]
    y_all = np.asarray(ours["outputs"]["y"], dtype=np.float64) if ours.get("status") == "ok" else None
    # a batched plan: every sample holds Orion's input; the worst sample is compared
    rows_ours = [] if y_all is None else ([y_all] if batch is None else list(y_all))
    y_ours = None if y_all is None else max(rows_ours, key=lambda y: rel_error(y, clear)[1])
    orion_err = [rel_error(y, clear)[1] for y in arrays["y_orion"]]
    row: dict[str, Any] = {
        "workload": "orion_mlp 784-128-128-10 (BatchNorm, x^2)",
        "affinity_cpus": len(os.sched_getaffinity(0)),
        "gomaxprocs": os.environ.get("GOMAXPROCS", ""),
        "orion": {
            **info,
            "max_rel_error": max(orion_err),
            "argmax_agrees": all(int(np.argmax(y)) == int(np.argmax(clear)) for y in arrays["y_orion"]),
        },
        "ours": {
            **{k: ours.get(k) for k in (
                "status", "kernels", "plan_rotations", "keys", "key_bytes", "pmul", "depth", "workers",
                "eval_seconds", "eval_seconds_runs", "cpu_seconds", "modelled_seconds", "model_over_eval",
                "modelled_seconds_now", "model_now_over_eval",
                "encode_seconds", "keygen_seconds", "max_rel_error",
            )},
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "max_rel_error_vs_clear": None if y_ours is None else rel_error(y_ours, clear)[1],
            "argmax_agrees": None if y_ours is None else int(np.argmax(y_ours)) == int(np.argmax(clear)),
        },
        "clear_output": [float(v) for v in clear],
    }
    if ours.get("status") == "ok":
        row["orion_over_ours"] = round(float(info["eval_seconds"]) / float(ours["eval_seconds"]), 3)
    if batch is not None:
        row["batch"] = batch
        row["ours"]["argmax_agrees"] = None if y_all is None else all(
            int(np.argmax(y)) == int(np.argmax(clear)) for y in rows_ours)
        orion_sps = 1.0 / float(info["eval_seconds"])
        row["orion"]["samples_per_second"] = round(orion_sps, 4)
        if ours.get("status") == "ok":
            ours_sps = batch / float(ours["eval_seconds"])
            row["ours"]["samples_per_second"] = round(ours_sps, 4)
            row["ours_over_orion_samples_per_second"] = round(ours_sps / orion_sps, 3)
    return row
