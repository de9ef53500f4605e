"""``slotplan model-bench``: whole models planned and encrypted on Lattigo in one job, the
modelled time beside the measured one, against published per-image figures and Orion.

For each MODEL (a graph file, or an ONNX model imported as ``slotplan plan`` does):

1. plan it (``--params``, default ``n16boot``; ``--memory-cap``, ``--batch``,
   ``--boot-variants``) and time the planning;
2. price the plan under the conditions ``slotplan run`` evaluates it in
   (:data:`RUN_CONDITIONS`: levels dropped in a bootstrapping plan, plaintexts and DFT
   matrices encoded in the clock, key reads in line, each bootstrap at its kind's executor
   time; no key preloaded before the clock): total, bootstraps by kind, fused blocks, key
   loads, the rest;
3. run it encrypted on Lattigo as ``slotplan run --backend lattigo`` does
   (:func:`backends.runner.run_plan`: keys generated, inputs encrypted, evaluated,
   decrypted and compared with the graph's numpy reference), ``--repeat`` times, on the
   user's data (``--inputs``/``--weights``) or seeded random data;
4. report the measured components beside the modelled ones, key generation, per-sample
   seconds, the peak RSS against the process model, the largest relative error and its bits;
5. add the published per-image figures of the network (``data/published/*.json``: cited,
   not measured here) and, with ``--orion``, Orion 1.0.2's own run of its model of the same
   network in this job (:func:`run_orion_resnet`, :func:`api.orion_bench.run_orion`).

``--dry-run`` stops after step 2 (plans and prices; nothing is encrypted).
"""

from __future__ import annotations

import json
import math
import os
import resource
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.errors import SlotplanError
from common.paths import DATA_DIR

REPO = Path(__file__).resolve().parent.parent
PUBLISHED_DIR = DATA_DIR / "published"
PUBLISHED_SCHEMA = "slotplan.published/1"
ORION_RESNET_SCRIPT = REPO / "scripts" / "orion_resnet.py"
DEFAULT_ORION_PYTHON = REPO / ".venv-orion" / "bin" / "python"
# Orion's ResNet-20 at LogN 16 on this 24 GiB machine shared with others: stopped past
# these (the watchdog of run_orion_resnet; both can be changed on the command line)
ORION_RSS_LIMIT_BYTES = 18 * 10**9
ORION_TIMEOUT_S = 25 * 60
MAX_REPEAT = 20
SCHEMA = "slotplan.model-bench/1"


# ------------------------------------------------------------------------------ published
class Figure(BaseModel):
    """One published per-image figure (not measured here)."""

    model_config = ConfigDict(extra="forbid")
    system: str
    hardware: str
    threads: str
    ring: str
    security: str
    seconds_per_image: float = Field(gt=0)
    # "=": the figure; "<": the source gives an upper bound ("under 5 minutes")
    bound: Literal["=", "<"] = "="
    source: str
    note: str = ""


class Network(BaseModel):
    """A network's published figures; ``graphs``: the graph names (``graph.name``) that are
    this network; ``orion``: Orion's model of it that ``--orion`` runs (None: none)."""

    model_config = ConfigDict(extra="forbid")
    network: str
    description: str
    graphs: list[str]
    orion: Literal["resnet20", "mlp"] | None = None
    figures: list[Figure]


class PublishedFile(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    schema_: Literal["slotplan.published/1"] = Field(alias="schema")
    networks: list[Network]


def load_published(directory: Path = PUBLISHED_DIR) -> list[Network]:
    """Every network of ``data/published/*.json`` (validated; a bad file names itself)."""
    nets: list[Network] = []
    for path in sorted(directory.glob("*.json")):
        try:
            nets += PublishedFile.model_validate_json(path.read_text()).networks
        except ValidationError as e:
            first = e.errors()[0]
            raise SlotplanError(f"{path}: {'.'.join(str(x) for x in first['loc'])}: {first['msg']}") from None
    return nets


def find_network(nets: Sequence[Network], graph_name: str, network: str | None) -> Network | None:
    """The network a model is: ``--network`` by name, else the one listing the graph's name."""
    if network is not None:
        for n in nets:
            if n.network == network:
                return n
        raise SlotplanError(f"--network {network!r}: no such network in {PUBLISHED_DIR} "
                            f"(known: {', '.join(n.network for n in nets)})")
    return next((n for n in nets if graph_name in n.graphs), None)


# ------------------------------------------------------------------------------ modelled
def run_conditions(params: Any, plaintext_store: bool = False) -> Any:
    """How ``slotplan run`` evaluates a plan (planner.cost.conditions.Run): a bootstrapping
    plan's fresh values dropped to the levels their consumers need, every plaintext (and the
    block's DFT matrices) encoded in the clock, key reads in line (no loader core), each
    bootstrap at its kind's executor time. ``plaintext_store``: an evaluation after the
    first with ``--plaintext-store`` (the fused blocks' plaintexts read back, not encoded)."""
    from planner.cost.conditions import Run

    return Run(level_drops=params.boot is not None, encode=True, loader_core=False, bootstrap_measured=True,
               plaintext_store=plaintext_store)


def modelled(plan: Mapping[str, Any], plaintext_store: bool = False, table: str | None = None) -> dict[str, Any]:
    """The plan priced under :func:`run_conditions` (nothing preloaded before the clock):
    seconds in total, by bootstrap kind (count, seconds each), fused blocks, key loads and
    the rest, and the time model's source: the calibrated table the plan was made with
    (``--costs``), else its preset's (planner.cost.timing.plan_model); ``table``: that
    calibrated table instead (the plan itself unchanged)."""
    from planner import ir
    from planner.cost.timing import TimeModel, modelled_time, plan_model, time_model
    from planner.frontend.params import Params
    from planner.ir import boot_block
    from planner.ir.analysis import plan_key_bytes

    params = Params.from_json(plan["params"])
    tm: TimeModel = plan_model(plan, params, table) or time_model(params)
    run = run_conditions(params, plaintext_store)
    prog = plan["program"]
    mt = modelled_time(prog, params, plan_key_bytes(plan) or {}, tm, preload_prologue=False, run=run)
    costs = tm.program_costs(prog, params.max_level, params.slots, run)
    kinds: dict[str, list[float]] = {}
    for ins, units in zip(ir.decode_program(prog), costs, strict=True):
        if ir.is_bootstrap(ins):
            kinds.setdefault(boot_block.variant_label(ins) or "full", []).append(units * tm.ms_per_unit / 1e3)
    by_op = tm.breakdown_ms(prog, params.max_level, params.slots, run)
    boots = sum(sum(v) for v in kinds.values())
    fused = by_op.get("fused", 0.0) / 1e3
    up_front = keep_all_load_ms(prog, params, tm) / 1e3
    matrices = mt.matrix_ms / 1e3 + keep_all_load_ms(prog, params, tm, matrices_only=True) / 1e3
    return {
        "total_seconds": round(mt.total_ms / 1e3 + up_front, 3),
        # the DFT matrices' encoding in it (at each block load; a process that keeps them,
        # backends/lattigo/bootstate.go, pays it at the first only): the counterpart of the
        # measured eval_seconds_without_matrices is total_seconds - matrix_seconds
        "matrix_seconds": round(matrices, 3),
        "keep_all_load_seconds": round(up_front, 3),
        "bootstrap_seconds": round(boots, 3),
        "bootstraps": _by_kind(kinds),
        "fused_seconds": round(fused, 3),
        "key_load_seconds": round(mt.load_ms / 1e3 + up_front, 3),
        "stall_seconds": round(mt.stall_ms / 1e3, 3),
        "other_seconds": round(mt.compute_ms / 1e3 - boots - fused, 3),
        "time_model": tm.source,
        "conditions": vars(run) | {"preload_prologue": False},
        **table_cpu(tm),
    }


def table_cpu(tm: Any) -> dict[str, Any]:
    """The CPU the time model's table was measured on, and whether it is this machine's
    (``backends.calibrate.same_cpu``: None when the table predates the CPU identity). A
    table measured on another CPU prices this one only approximately: these VMs' "AMD EPYC"
    is a Zen 4 with AVX-512 on some days and a Zen 3 without it on others."""
    from backends.calibrate import cpu_identity, same_cpu

    machine = (tm.table.measurements or {}).get("machine") if tm.table is not None else None
    if not isinstance(machine, Mapping):
        return {"table_cpu": None, "table_cpu_matches": None}
    keys = ("cpu_model", "cpu_family", "cpu_model_number", "cpu_stepping", "cpu_flags", "product_kernel", "date")
    return {"table_cpu": {k: machine[k] for k in keys if k in machine},
            "table_cpu_matches": same_cpu(machine, cpu_identity())}


def table_of_this_cpu(preset: str) -> str | None:
    """The first (by name) calibrated table of ``data/costs`` measured at ``preset`` on this
    machine's CPU (:func:`backends.calibrate.same_cpu`), None when there is none: the table a
    plan priced under another CPU's table is priced again with (``modelled_this_cpu``)."""
    from backends.calibrate import cpu_identity, same_cpu
    from planner.cost.tables import COST_TABLES, CostTableError, load_costs

    here = cpu_identity()
    for name in sorted(COST_TABLES.names()):
        try:
            t = load_costs(name)
        except CostTableError:
            continue
        machine = (t.measurements or {}).get("machine")
        if t.is_time and (t.params or {}).get("name") == preset and isinstance(machine, Mapping) \
                and same_cpu(machine, here):
            return name
    return None


def table_cpu_warning(md: Mapping[str, Any]) -> str | None:
    """One line when the modelled seconds come from a table measured on another CPU (or one
    that does not say which), None when it is this machine's CPU."""
    match = md.get("table_cpu_matches")
    if match:
        return None
    cpu = md.get("table_cpu") or {}
    from backends.calibrate import cpu_identity

    here = cpu_identity()

    def name(c: Mapping[str, Any]) -> str:
        fam = f" family {c['cpu_family']} model {c['cpu_model_number']}" if "cpu_family" in c else ""
        return f"{c.get('cpu_model', '?')}{fam} [{' '.join(c.get('cpu_flags') or [])}]"

    if match is None:
        return (f"{md.get('time_model')}: measured on {cpu.get('cpu_model', 'an unrecorded CPU')} "
                f"({cpu.get('date', 'undated')}) without its family/model; this machine is {name(here)}: "
                "the modelled seconds may be another CPU's (slotplan calibrate re-measures them here)")
    return (f"{md.get('time_model')}: measured on {name(cpu)} ({cpu.get('date', 'undated')}), this machine is "
            f"{name(here)}: the modelled seconds are another CPU's (slotplan calibrate re-measures them here)")


def keep_all_load_ms(program: Sequence[Mapping[str, Any]], params: Any, tm: Any, matrices_only: bool = False) -> float:
    """A plan without key schedule (keep-all): ``slotplan run``'s executor reads every key
    it generated (and the bootstrapping block, encoding its DFT matrices) at the start of
    the evaluation, inside its clock (backends/lattigo/executor.go ``run``: ``loadAll``),
    where the planner's model has them resident beforehand. 0 for a scheduled plan.
    ``matrices_only``: the DFT matrices' part."""
    from planner import ir
    from planner.ir import boot_block
    from planner.ir.analysis import default_key_level

    prog = ir.decode_program(program)
    if ir.has_key_schedule(prog):
        return 0.0
    keys = ir.rot_keys_of(prog)
    ms = len(keys) * tm.load_ms(params.rotation_key_bytes(default_key_level(prog, params))) if keys else 0.0
    mat = 0.0
    if params.boot is not None and any(ir.is_bootstrap(i) for i in prog):
        used = boot_block.variants_used(prog, params)
        ms += tm.load_ms(boot_block.keys_in_line(params, None, used))
        mat = tm.matrix_ms * (1 + sum(v.matrix_bytes for v in used) / max(1, params.boot.matrix_bytes))
    return float(mat if matrices_only else ms + mat)


def _by_kind(kinds: Mapping[str, Sequence[float]]) -> dict[str, dict[str, float]]:
    return {k: {"count": len(v), "mean_seconds": round(sum(v) / len(v), 3), "seconds": round(sum(v), 3)}
            for k, v in sorted(kinds.items()) if v}


def process_model(plan: Mapping[str, Any]) -> dict[str, Any] | None:
    """The process model of the run (backends/lattigo_memory.py) without running it: what
    ``--dry-run`` reports (``total`` adds the model's estimate of the resident set at the
    start; a run replaces it by the one it measures). None when the Lattigo extension is
    not built."""
    from backends.lattigo_backend import PLAINTEXT_INLINE_BYTES, available
    from backends.lattigo_memory import boot_memory, executor_memory
    from backends.lattigo_memory import process_model as pm
    from planner.frontend.params import Params

    if not available():
        return None
    params = Params.from_json(plan["params"])
    inline = len(plan.get("plaintexts") or {}) * int(params.slots) * 8 <= PLAINTEXT_INLINE_BYTES
    return dict(pm(plan, executor_memory(plan), inline_plaintexts=inline, boot=boot_memory(params)))


# ------------------------------------------------------------------------------ measured
def _phases(ph: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not ph:
        return None
    return {"bootstraps": int(ph.get("bootstraps", 0)),
            **{part: {k: round(float(v), 3) for k, v in (ph.get(part) or {}).items()}
               for part in ("seconds", "cpu_seconds", "key_wait_seconds")}}


def measured(rep: Any) -> dict[str, Any]:
    """A ``slotplan run --backend lattigo`` report (backends.runner.RunReport) as the same
    components as :func:`modelled`, plus key generation, memory and error."""
    st = rep.stats
    ops = st.get("op_seconds") or {}
    secs = [float(x) for x in st.get("bootstrap_seconds") or []]
    kinds_list = list(st.get("bootstrap_kinds") or [])
    if len(kinds_list) != len(secs):
        kinds_list = ["full"] * len(secs)
    kinds: dict[str, list[float]] = {}
    for k, x in zip(kinds_list, secs, strict=True):
        kinds.setdefault(k, []).append(x)
    mem = rep.memory
    pm = mem.get("modelled_process_bytes") or {}
    fused = float(ops.get("bsgs_block", 0.0)) + float(ops.get("cmul_sum", 0.0))
    ev = float(st.get("eval_seconds", rep.seconds))
    err = float(rep.max_rel_error)
    return {
        "ok": bool(rep.ok),
        "eval_seconds": round(ev, 3),
        "bootstrap_seconds": round(sum(secs), 3),
        "bootstraps": _by_kind(kinds),
        "bootstrap_input_levels": list(st.get("bootstrap_input_levels") or []),
        "fused_seconds": round(fused, 3),
        "fused_blocks": int(st.get("fused_blocks", 0)),
        "key_load_seconds": round(float(st.get("key_load_seconds", 0.0)), 3),
        "key_loads": int(st.get("key_loads", 0)),
        "key_load_split": {k: round(float(v), 3) for k, v in sorted((st.get("key_load_split") or {}).items())},
        # the key reads the page cache did not serve, by what was read, and the streamed
        # block keys mapped rather than copied (docs/lattigo.md, "Streamed keys mapped")
        "key_storage_read_bytes": dict(sorted((st.get("key_storage_read_bytes") or {}).items())),
        "key_stream_mapped": int(st.get("key_stream_mapped", 0)),
        "key_load_cpu_seconds": round(float(st.get("key_load_cpu_seconds", 0.0)), 3),
        "key_wait_seconds": round(float(st.get("key_wait_seconds", 0.0)), 3),
        # a streamed block: key orders predicted, bootstraps begun learning one (keys read
        # in line), the times one left its order (backends/lattigo/bootorder.go), and its
        # keys read against those the bootstraps asked for (reads above requests: unused)
        "boot_stream": {k: int(st.get(f"boot_stream_{k}", 0))
                        for k in ("predicted", "learned", "misses", "reads", "requests")},
        "bootstrap_seconds_each": [[k, round(x, 3)] for k, x in zip(kinds_list, secs, strict=True)],
        # the sparse bootstraps by phase (wall, thread CPU, key waits) and the process's CPU,
        # collector and page faults over the evaluation (docs/lattigo.md, "Where the time goes")
        "bootstrap_phases": _phases(st.get("bootstrap_phases")),
        "eval_cpu": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in (st.get("eval_cpu") or {}).items()},
        "other_seconds": round(ev - sum(secs) - fused - float(st.get("key_load_seconds", 0.0)), 3),
        "op_seconds": {k: round(float(v), 3) for k, v in sorted(ops.items())},
        "keygen_seconds": round(float(st.get("keygen_seconds", 0.0)), 3),
        "boot_keygen_seconds": round(float(st.get("boot_keygen_seconds", 0.0)), 3),
        "boot_matrix_seconds": round(float(st.get("boot_matrix_seconds", 0.0)), 3),
        "eval_seconds_without_matrices": round(ev - float(st.get("boot_matrix_seconds", 0.0)), 3),
        "matrices_built": int(st.get("boot_matrix_builds", 0)) > 0,
        "key_write_seconds": round(float(st.get("key_write_seconds", 0.0)), 3),
        "wall_seconds": round(float(rep.seconds), 3),
        "peak_rss_bytes": mem.get("peak_rss_bytes"),
        "rss_start_bytes": mem.get("rss_start_bytes"),
        "process_model_bytes": pm.get("total"),
        "rss_over_process_model": mem.get("rss_over_process_model"),
        "modelled_peak_bytes": mem.get("modelled_peak_bytes"),
        "max_abs_error": float(rep.max_abs_error),
        "max_rel_error": err,
        "bits": round(-math.log2(err), 2) if err > 0 else None,
        "tolerance": rep.tolerance,
        "failure": rep.failure(),
    }


# ------------------------------------------------------------------------------ Orion
def _rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in bytes, (0, 0) once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0, 0
    vals = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in text.splitlines()
            if ln.startswith(("VmRSS:", "VmHWM:"))}
    return vals.get("VmRSS", 0), vals.get("VmHWM", 0)


def watched(cmd: Sequence[str], rss_limit: int, timeout_s: float, cwd: Path, poll_s: float = 0.5
            ) -> dict[str, Any]:
    """Run ``cmd``; kill it (its process group) when its RSS passes ``rss_limit`` bytes or
    after ``timeout_s``. Returns the exit status, why it stopped, its peak RSS (sampled, and
    the kernel's high-water mark) and the wall seconds."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(list(cmd), cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        peak = hwm = 0
        stopped: str | None = None
        while proc.poll() is None:
            rss, h = _rss(proc.pid)
            peak, hwm = max(peak, rss), max(hwm, h)
            if rss > rss_limit:
                stopped = f"RSS {rss / 1e9:.2f} GB passed the limit {rss_limit / 1e9:.2f} GB"
            elif time.monotonic() - t0 > timeout_s:
                stopped = f"still running after {timeout_s:.0f} s"
            if stopped:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(poll_s)
        log.seek(0)
        tail = log.read().decode(errors="replace").strip().splitlines()[-5:]
    return {"returncode": proc.returncode, "stopped": stopped, "peak_rss_bytes": max(peak, hwm),
            "wall_seconds": round(time.monotonic() - t0, 1), "log_tail": tail}


def run_orion_resnet(python: Path, seed: int, rss_limit: int = ORION_RSS_LIMIT_BYTES,
                     timeout_s: float = ORION_TIMEOUT_S) -> dict[str, Any]:
    """Orion's ResNet-20 at its own parameters (``scripts/orion_resnet.py``, Orion's
    interpreter) under the watchdog :func:`watched`: seconds per phase, peak RSS, error
    against its cleartext model; or where and why it stopped."""
    with tempfile.TemporaryDirectory(prefix="slotplan-orion-resnet-") as tmp:
        prefix = Path(tmp) / "orion"
        w = watched([str(python), str(ORION_RESNET_SCRIPT), "--out", str(prefix), "--seed", str(seed)],
                    rss_limit, timeout_s, Path(tmp))
        try:
            info = json.loads(Path(f"{prefix}.json").read_text())
        except (OSError, ValueError):
            info = {}
    info.pop("y_clear", None)
    info.pop("y_orion", None)
    if info.get("finished") and w["returncode"] == 0:
        status = "ok"
    elif w["stopped"]:
        status = f"stopped in phase {info.get('phase') or 'start-up'}: {w['stopped']}"
    else:
        last = (w["log_tail"] or ["(no output)"])[-1]
        status = f"failed in phase {info.get('phase') or 'start-up'} (exit {w['returncode']}): {last}"
    return {"system": "Orion", "model": "orion.models.ResNet20 (configs/resnet.yml)", "status": status,
            **{k: v for k, v in info.items() if k != "max_rss_bytes"},
            "peak_rss_bytes": max(int(w["peak_rss_bytes"]), int(info.get("max_rss_bytes") or 0)),
            "wall_seconds": w["wall_seconds"], "rss_limit_bytes": rss_limit, "timeout_seconds": timeout_s,
            "log_tail": w["log_tail"] if status != "ok" else []}


def run_orion_mlp(python: Path, repeat: int, seed: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Orion's MLP (``scripts/orion_mlp.py``, as ``slotplan orion-bench``): its row and its
    arrays (input, folded weights) that our run is then given."""
    from api.orion_bench import run_orion
    from backends.lattigo_bench import rel_error

    with tempfile.TemporaryDirectory(prefix="slotplan-orion-") as tmp:
        info, arrays = run_orion(python, repeat, seed, Path(tmp))
    clear = arrays["y_clear"]
    errs = [rel_error(y, clear)[1] for y in arrays["y_orion"]]
    row = {"system": "Orion", "model": "orion.models.MLP (configs/mlp.yml)", "status": "ok",
           "orion_version": info.get("orion_version"), "config": info.get("config"),
           "eval_seconds": info["eval_seconds"], "eval_seconds_runs": info.get("eval_seconds_runs"),
           "phase_seconds": {"init_scheme": info.get("init_seconds"), "fit_compile": info.get("fit_compile_seconds")},
           "peak_rss_bytes": info.get("max_rss_bytes"), "max_rel_error": max(errs),
           "argmax_agrees": all(int(np.argmax(y)) == int(np.argmax(clear)) for y in arrays["y_orion"])}
    return row, arrays


# ------------------------------------------------------------------------------ one model
@dataclass(frozen=True)
class BenchOptions:
    params: str = "n16boot"
    memory_cap: int | None = None
    batch: int | str | None = None
    boot_variants: bool = True
    seed: int = 0
    inputs: Path | None = None
    weights: Path | None = None
    repeat: int = 1
    orion: bool = False
    orion_python: Path | None = None
    orion_rss_limit: int = ORION_RSS_LIMIT_BYTES
    orion_timeout_s: float = ORION_TIMEOUT_S
    dry_run: bool = False
    time_limit_s: float = 10.0
    network: str | None = None
    calibrate: Path | None = None
    degree: int | None = None
    plaintext_store: Path | None = None
    costs: str | None = None  # a calibrated table (slotplan calibrate): planned and priced with it


def check_options(models: Sequence[Path], o: BenchOptions) -> None:
    """Refuse bad input before anything runs (one line each)."""
    if not models:
        raise SlotplanError("model-bench needs at least one MODEL (a graph JSON or an ONNX model)")
    for m in models:
        if not m.is_file():
            raise SlotplanError(f"MODEL {str(m)!r}: no such file")
    if not 1 <= o.repeat <= MAX_REPEAT:
        raise SlotplanError(f"--repeat must be in 1..{MAX_REPEAT}, got {o.repeat}")
    if (o.inputs is not None or o.weights is not None) and len(models) > 1:
        raise SlotplanError("--inputs/--weights name one graph's tensors: give one MODEL with them")
    if (o.inputs is not None or o.weights is not None) and o.dry_run:
        raise SlotplanError("--inputs/--weights: nothing runs with --dry-run")
    if o.orion and not o.dry_run:
        py = o.orion_python or DEFAULT_ORION_PYTHON
        if not py.exists():
            raise SlotplanError(f"--orion: Orion's interpreter {str(py)!r} does not exist: run `make orion` "
                                "(installs orion-fhe from PyPI into .venv-orion) or pass --orion-python")
    if o.orion_rss_limit < 1:
        raise SlotplanError(f"--orion-rss-limit must be positive, got {o.orion_rss_limit}")
    if o.plaintext_store is not None and not o.plaintext_store.is_dir():
        raise SlotplanError(f"--plaintext-store {str(o.plaintext_store)!r}: no such directory")
    if o.costs is not None:
        check_costs(o.costs, o.params)


def check_costs(costs: str, params: str) -> None:
    """``--costs``: a calibrated time table (``slotplan calibrate``) measured at the preset
    the models are planned at."""
    from planner.cost.tables import load_costs
    from planner.frontend.params import load_params

    t = load_costs(costs)
    if not t.is_time:
        raise SlotplanError(f"--costs {costs!r}: not a calibrated table of milliseconds (slotplan calibrate writes one)")
    want = load_params(params).name
    got = (t.params or {}).get("name")
    if got != want:
        raise SlotplanError(f"--costs {costs!r}: measured at params {got!r}, not at --params {want!r}")


def _load(model: Path, o: BenchOptions) -> tuple[Any, dict[str, np.ndarray] | None]:
    """A graph file, or an ONNX model imported (its weights with it)."""
    from api.commands_import import is_onnx
    from planner.frontend.graph import load_graph

    if is_onnx(model):
        from api.commands_import import _run_import
        from planner.frontend.importers.onnx_import import DEFAULT_MARGIN

        res = _run_import(model, o.calibrate, o.degree, None, DEFAULT_MARGIN, 1)
        return res.graph, {k: np.asarray(v, dtype=np.float64) for k, v in res.weights.items()}
    if o.calibrate is not None or o.degree is not None:
        raise SlotplanError(f"--calibrate/--degree: only for an ONNX model, not the graph file {str(model)!r}")
    return load_graph(model), None


def _plan(graph: Any, o: BenchOptions) -> tuple[Any, Any, float]:
    from planner.batch import plan_auto_batch
    from planner.frontend.params import load_params
    from planner.pipeline import PlanOptions, PlanOptionsLiteral, plan_graph

    p = load_params(o.params)
    lit = PlanOptionsLiteral(memory_cap_bytes=o.memory_cap, boot_variants=o.boot_variants, time_limit_s=o.time_limit_s)
    opts = PlanOptions.from_literal(lit if o.costs is None else lit.model_copy(update={"costs": o.costs}))
    t0 = time.perf_counter()
    if o.batch == "auto":
        res = plan_auto_batch(graph, p, opts)
    else:
        res = plan_graph(graph, p, replace(opts, batch=int(o.batch)) if o.batch else opts)
    return p, res, time.perf_counter() - t0


def _values(graph: Any, plan: Mapping[str, Any], o: BenchOptions, imported: dict[str, np.ndarray] | None,
            orion_arrays: dict[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
    """The run's data: the user's files (an ONNX model's own weights where ``--weights`` is
    not given), Orion's input and weights (its MLP), an ONNX model's own weights with seeded
    inputs, or None (seeded random, as ``slotplan run``)."""
    from planner.frontend.reference import random_values
    from planner.ir.io import user_values

    batch = plan.get("summary", {}).get("batch")
    if o.inputs is not None or o.weights is not None:
        return user_values(graph, o.inputs, o.weights, samples=batch is not None, known_weights=imported)
    if orion_arrays is not None and set(graph.inputs) | set(graph.weights) <= set(orion_arrays):
        vals = {t: orion_arrays[t].reshape(graph.shape(t)) for t in (*graph.inputs, *graph.weights)}
    elif imported is not None:
        vals = random_values(graph, o.seed, "fan-in") | {t: imported[t].reshape(graph.shape(t)) for t in graph.weights}
        if batch is not None:  # B seeded samples, as run draws them
            per = [random_values(graph, o.seed + b, "fan-in") for b in range(int(batch))]
            vals |= {t: np.stack([s[t] for s in per]) for t in graph.inputs}
        return vals
    else:
        return None
    if batch is not None:
        vals |= {t: np.repeat(vals[t][None], int(batch), axis=0) for t in graph.inputs}
    return vals


def _security(params: Any) -> dict[str, Any]:
    from planner.frontend.params import insecure_line

    line = insecure_line(params.to_json())
    return {"secure": line is None, "line": line, "log_qp": params.log_qp,
            "boot_log_qp": params.boot.log_qp if params.boot is not None else None}


def bench_model(model: Path, o: BenchOptions, nets: Sequence[Network]) -> dict[str, Any]:
    """One model: plan, price, run (unless ``dry_run``), published figures, Orion's row."""
    from backends.runner import run_plan

    graph, imported = _load(model, o)
    if (o.inputs is not None or o.weights is not None) and not o.dry_run:
        from planner.ir.io import user_values

        # the user's files are checked before planning (minutes at n16boot), not after
        user_values(graph, o.inputs, o.weights, samples=True, known_weights=imported)
    net = find_network(nets, graph.name, o.network)
    orion_row: dict[str, Any] | None = None
    orion_arrays = None
    py = o.orion_python or DEFAULT_ORION_PYTHON
    if o.orion and not o.dry_run and net is not None and net.orion == "mlp":
        # first: our run is then given Orion's input and folded weights (the same network)
        orion_row, orion_arrays = run_orion_mlp(py, o.repeat, o.seed)
    params, res, plan_s = _plan(graph, o)
    plan = res.plan
    s = plan["summary"]
    row: dict[str, Any] = {
        "model": str(model), "graph": graph.name, "params": params.name, "ring": f"N=2^{params.log_n}",
        "slots": params.slots, "security": _security(params), "batch": s.get("batch", 1),
        "memory_cap_bytes": s.get("memory_cap_bytes"), "boot_variants": o.boot_variants,
        "plan_seconds": round(plan_s, 3), "bootstraps_planned": s.get("bootstraps", 0),
        "solver": {k: s["solver"].get(k) for k in ("name", "status", "objective", "bound")},
        "rotations": s["rotations"], "rotation_keys": s["rotation_keys"], "key_loads_planned": s["key_loads"],
        "modelled_peak_bytes": s["peak_bytes"]["total"],
        # with --plaintext-store the reported run is one after the first (its steady state)
        "modelled": modelled(plan, o.plaintext_store is not None and o.repeat > 1 and not o.dry_run),
        "affinity_cpus": len(os.sched_getaffinity(0)), "gomaxprocs": os.environ.get("GOMAXPROCS", ""),
    }
    # priced under another CPU's table: priced again with a table of this CPU where data/costs
    # has one (the same plan; its choices stay those of the table it was planned with)
    other = table_of_this_cpu(params.name) if row["modelled"].get("table_cpu_matches") is False else None
    if other is not None:
        row["modelled_this_cpu"] = modelled(plan, o.plaintext_store is not None and o.repeat > 1 and not o.dry_run,
                                            other) | {"table": other}
    if o.dry_run:
        row["process_model"] = process_model(plan)
    else:
        vals = _values(graph, plan, o, imported, orion_arrays)
        # the repeats are evaluations one after the other in this process: the first encodes
        # the bootstrapping DFT matrices and keeps them for the next (a server's steady state;
        # backends/lattigo/bootstate.go), the last lets go of them
        # with --plaintext-store the first evaluation encodes the streamed plaintexts and
        # spills them (the model's preparation, reported apart: plaintext_store.preparation)
        # and the next ones read them back: the median is theirs (a server's steady state)
        runs, reads = [], []
        store = str(o.plaintext_store) if o.plaintext_store is not None else None
        for i in range(o.repeat):
            before = storage_read_bytes()
            runs.append(run_plan(plan, res.tables, "lattigo", o.seed, "fan-in", values=vals,
                                 keep_boot_state=i < o.repeat - 1, plaintext_store=store))
            after = storage_read_bytes()
            reads.append(None if before is None or after is None else after - before)
        evals = [float(r.stats.get("eval_seconds", r.seconds)) for r in runs]
        without = [e - float(r.stats.get("boot_matrix_seconds", 0.0)) for e, r in zip(evals, runs, strict=True)]
        steady = list(range(1, len(runs))) if store is not None and len(runs) > 1 else list(range(len(runs)))
        med = sorted(steady, key=lambda i: without[i])[len(steady) // 2]
        m = measured(runs[med])
        if store is not None:
            m["plaintext_store"] = {"runs": [r.stats.get("plaintext_store") for r in runs], "median_run": med,
                                    "preparation_eval_seconds_without_matrices": round(without[0], 3)}
        # what the page cache did not serve (keys read back from disk when the machine's
        # memory cannot cache the key files beside the process: the model prices reads at
        # page-cache speed; docs/model-bench.md)
        m["storage_read_bytes"] = reads[med]
        m["eval_seconds_runs"] = [round(x, 3) for x in evals]
        m["eval_seconds_without_matrices_runs"] = [round(x, 3) for x in without]
        m["evaluations"] = [e | {"run": i} for i, r in enumerate(runs) for e in r.stats.get("evaluations") or []]
        m["ok"] = all(r.ok for r in runs)
        m["max_rel_error"] = max(float(r.max_rel_error) for r in runs)
        m["bits"] = round(-math.log2(m["max_rel_error"]), 2) if m["max_rel_error"] > 0 else None
        samples = int(runs[med].stats.get("samples", row["batch"]))
        m["samples"] = samples
        # the headline per sample: the evaluation without the DFT matrices' encoding (setup,
        # once per process; reported apart as boot_matrix_seconds, like keygen); with them
        # beside it
        ev_med = runs[med].stats.get("evaluations") or [{"eval_seconds": m["eval_seconds"],
                                                          "eval_seconds_without_matrices": without[med]}]
        m["per_sample_seconds"] = round(sum(float(e["eval_seconds_without_matrices"]) for e in ev_med) / max(1, samples), 4)
        m["per_sample_seconds_with_matrices"] = round(sum(float(e["eval_seconds"]) for e in ev_med) / max(1, samples), 4)
        m["per_sample_basis"] = "without the DFT matrices' encoding (setup: boot_matrix_seconds)"
        row["measured"] = m
        row["model_over_measured"] = round(row["modelled"]["total_seconds"] / max(1e-9, m["eval_seconds"]), 3)
        # the same without the DFT matrices' encoding on either side (the per-sample headline)
        md = row["modelled"]
        row["model_over_measured_without_matrices"] = round(
            (md["total_seconds"] - md["matrix_seconds"]) / max(1e-9, m["eval_seconds_without_matrices"]), 3)
        mh = row.get("modelled_this_cpu")
        if mh is not None:
            mh["model_over_measured"] = round(mh["total_seconds"] / max(1e-9, m["eval_seconds"]), 3)
            mh["model_over_measured_without_matrices"] = round(
                (mh["total_seconds"] - mh["matrix_seconds"]) / max(1e-9, m["eval_seconds_without_matrices"]), 3)
        row["max_rss_bytes_job"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    row["modelled"]["per_sample_seconds"] = round(row["modelled"]["total_seconds"] / max(1, int(row["batch"])), 4)
    row["network"] = net.network if net is not None else None
    row["published"] = [f.model_dump() | {"measured_here": False} for f in net.figures] if net is not None else []
    if o.orion and not o.dry_run:
        if net is None or net.orion is None:
            row["orion"] = {"system": "Orion", "status": "no Orion model of this network"}
        elif net.orion == "resnet20":
            row["orion"] = run_orion_resnet(py, o.seed, o.orion_rss_limit, o.orion_timeout_s)
        else:
            row["orion"] = orion_row
    return row


def storage_read_bytes() -> int | None:
    """Bytes this process (the run is in process: keys, evaluation) has read from storage,
    i.e. not from the page cache (``/proc/self/io`` ``read_bytes``); None where the kernel
    does not say."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def bench(models: Sequence[Path], o: BenchOptions) -> list[dict[str, Any]]:
    check_options(models, o)
    nets = load_published()
    return [bench_model(m, o, nets) for m in models]


def failures(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Models whose encrypted run mismatched its reference (exit 1)."""
    return [f"{r['graph']}: {r['measured']['failure']}" for r in rows
            if "measured" in r and not r["measured"]["ok"]]


def document(rows: Sequence[Mapping[str, Any]], argv: Sequence[str]) -> dict[str, Any]:
    """``--out``/``--json``: the rows with the command and the machine."""
    from backends.calibrate import machine_info

    return {"schema": SCHEMA, "command": " ".join(argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine_info(), "rows": list(rows)}


# ------------------------------------------------------------------------------ command
def _gb(x: Any) -> str:
    return "-" if not x else f"{float(x) / 1e9:.2f}"


def _s(x: Any) -> str:
    return "-" if x is None else f"{float(x):.2f}"


def _kinds(b: Mapping[str, Mapping[str, Any]]) -> str:
    return ", ".join(f"{k} {v['count']}x{v['mean_seconds']:.2f}" for k, v in b.items()) or "-"


def _matrices(m: Mapping[str, Any]) -> str:
    """The DFT matrices' encoding (setup) of the evaluations: seconds of those that encoded
    them, '0 (kept)' for those that used an earlier one's."""
    ev = m.get("evaluations") or []
    if not ev:
        return _s(m.get("boot_matrix_seconds"))
    return ", ".join(_s(e["boot_matrix_seconds"]) if e["matrices_built"] else "0 (kept)" for e in ev)


def print_rows(rows: Sequence[Mapping[str, Any]]) -> None:
    """The rich tables: per model, then modelled against measured by component, then the
    published figures and Orion's row."""
    from rich.markup import escape
    from rich.table import Table

    from api.common import out, solver_gap_note

    t = Table(title="model-bench: planned and encrypted on Lattigo in this job (seconds; GB = 1e9 bytes)")
    for c in ("model", "ring", "security", "batch", "cap GB", "plan s", "modelled s", "measured s", "model/meas",
              "model/meas no matrices", "per sample s (no matrices)", "keygen s", "matrices s", "peak RSS GB", "process model GB", "RSS/model",
              "max rel err", "bits"):
        t.add_column(c, justify="left" if c in ("model", "ring", "security") else "right")
    for r in rows:
        m = r.get("measured") or {}
        sec = r["security"]
        t.add_row(
            escape(r["graph"]), f"{r['params']} ({r['ring']})", "128-bit" if sec["secure"] else "[red]BELOW 128[/red]",
            str(r["batch"]), _gb(r["memory_cap_bytes"]), _s(r["plan_seconds"]), _s(r["modelled"]["total_seconds"]),
            _s(m.get("eval_seconds")), _s(r.get("model_over_measured")),
            _s(r.get("model_over_measured_without_matrices")),
            _s(m.get("per_sample_seconds", r["modelled"]["per_sample_seconds"])), _s(m.get("keygen_seconds")),
            _matrices(m),
            _gb(m.get("peak_rss_bytes")), _gb(m.get("process_model_bytes") or (r.get("process_model") or {}).get("total")),
            _s(m.get("rss_over_process_model")), "-" if not m else f"{m['max_rel_error']:.1e}",
            "-" if m.get("bits") is None else f"{m['bits']:.1f}",
        )
    out.print(t)
    comp = Table(title="by component: modelled (slotplan run's conditions) | measured (seconds)")
    for col in ("model", "bootstraps (kind count x mean s)", "boot s", "fused s (blocks)", "key loads s (loads)",
                "other s", "total s"):
        comp.add_column(col, justify="left" if col.startswith(("model", "bootstraps")) else "right")
    for r in rows:
        md, m = r["modelled"], r.get("measured")
        comp.add_row(escape(r["graph"]) + " modelled", _kinds(md["bootstraps"]), _s(md["bootstrap_seconds"]),
                  _s(md["fused_seconds"]), f"{_s(md['key_load_seconds'])} ({r['key_loads_planned']})",
                  _s(md["other_seconds"]), _s(md["total_seconds"]))
        if m:
            comp.add_row(escape(r["graph"]) + " measured", _kinds(m["bootstraps"]), _s(m["bootstrap_seconds"]),
                      f"{_s(m['fused_seconds'])} ({m['fused_blocks']})",
                      f"{_s(m['key_load_seconds'])} ({m['key_loads']})", _s(m["other_seconds"]), _s(m["eval_seconds"]))
    out.print(comp)
    for r in rows:
        if not r["security"]["secure"]:
            out.print(f"[red]warning[/red]: {escape(r['graph'])}: {escape(r['security']['line'])}")
        gap = solver_gap_note(r.get("solver") or {})
        if gap:
            out.print(f"note: {escape(r['graph'])}: {escape(gap)}")
        cpu_line = table_cpu_warning(r["modelled"])
        if cpu_line:
            out.print(f"[yellow]warning[/yellow]: {escape(r['graph'])}: {escape(cpu_line)}")
        mh = r.get("modelled_this_cpu")
        if mh is not None:
            ratio = "" if "model_over_measured" not in mh else (
                f"; model/measured {_s(mh['model_over_measured'])}, "
                f"{_s(mh['model_over_measured_without_matrices'])} without the DFT matrices")
            out.print(f"{escape(r['graph'])}: priced again with {escape(mh['table'])}, calibrated on this CPU: "
                      f"{_s(mh['total_seconds'])} s modelled{ratio}")
        if not r["published"] and "orion" not in r:
            continue
        p = Table(title=escape(f"{r['graph']}: per image, published (NOT measured here) and measured in this job"))
        for col in ("system", "hardware", "threads", "ring / security", "s per image", "source"):
            p.add_column(col, justify="right" if col == "s per image" else "left")
        m = r.get("measured")
        if m:
            p.add_row("slotplan (this job; DFT matrices apart)", "this machine", f"affinity {r['affinity_cpus']} CPUs",
                      f"{r['params']} / {'128-bit' if r['security']['secure'] else 'below 128-bit'}",
                      _s(m["per_sample_seconds"]), "measured here")
        o = r.get("orion")
        if o:
            cfg = (o.get("config") or {}).get("ckks_params") or {}
            ring = f"LogN {cfg['LogN']}" if cfg else "-"
            p.add_row(f"Orion {escape(str(o.get('orion_version', '')))} (this job)", "this machine",
                      f"affinity {r['affinity_cpus']} CPUs", ring,
                      _s(o["eval_seconds"]) if o.get("status") == "ok" else escape(str(o.get("status"))),
                      "measured here")
        for f in r["published"]:
            p.add_row(escape(f["system"]), escape(f["hardware"]), escape(f["threads"]),
                      escape(f"{f['ring']} / {f['security']}"),
                      ("< " if f["bound"] == "<" else "") + f"{f['seconds_per_image']:g}", escape(f["source"]))
        out.print(p)


def model_bench_command(
    models: Annotated[list[Path], typer.Argument(metavar="MODEL...", help="graph JSON files or ONNX models")],
    params: Annotated[str, typer.Option("--params", help="preset (n12..n16, n14boot, n16boot) or a JSON file")] = "n16boot",
    memory_cap: Annotated[str | None, typer.Option("--memory-cap", help="bytes, or with KiB/MiB/GiB")] = None,
    batch: Annotated[str | None, typer.Option("--batch", help="samples per ciphertext set: B or auto")] = None,
    boot_variants: Annotated[str, typer.Option("--boot-variants", help="on (default) | off: the full-slot bootstrap only")] = "on",
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**32 - 1, help="seed of the random data")] = 0,
    inputs: Annotated[Path | None, typer.Option("--inputs", help="the inputs (.npz, as slotplan run; one MODEL)")] = None,
    weights: Annotated[Path | None, typer.Option("--weights", help="the weights (.npz, as slotplan run; one MODEL)")] = None,
    repeat: Annotated[int, typer.Option("--repeat", help="encrypted runs per model (median)")] = 1,
    orion: Annotated[bool, typer.Option("--orion", help="also run Orion's own model of the network in this job (ResNet-20, the MLP)")] = False,
    orion_python: Annotated[Path | None, typer.Option("--orion-python", help="Orion's interpreter [default: .venv-orion/bin/python, make orion]")] = None,
    orion_rss_limit: Annotated[str, typer.Option("--orion-rss-limit", help="stop Orion's ResNet-20 past this RSS")] = str(ORION_RSS_LIMIT_BYTES),
    orion_timeout: Annotated[float, typer.Option("--orion-timeout", min=1, help="stop Orion's ResNet-20 after this many seconds")] = ORION_TIMEOUT_S,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="plan and price only; nothing is encrypted")] = False,
    time_limit: Annotated[float, typer.Option("--time-limit", help="solver time limit, seconds")] = 10.0,
    network: Annotated[str | None, typer.Option("--network", help="the published network the model is (default: by graph name)")] = None,
    calibrate: Annotated[Path | None, typer.Option("--calibrate", help="ONNX only: calibration samples .npz (slotplan import)")] = None,
    degree: Annotated[int | None, typer.Option("--degree", help="ONNX only: degree of the activation polynomials")] = None,
    plaintext_store: Annotated[Path | None, typer.Option("--plaintext-store", help="a directory for the streamed plaintexts: the first run encodes and spills them, the next read them back (use with --repeat 2 or more)")] = None,
    costs: Annotated[str | None, typer.Option("--costs", help="a table slotplan calibrate measured on this machine (data/costs/<name> or a path): plan and price with it [default: the preset's committed table]")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the rows as one JSON document")] = False,
    output: Annotated[Path | None, typer.Option("--out", "-o", help="also write the JSON document to this file")] = None,
) -> None:
    """Whole models planned and encrypted on Lattigo in one job: modelled against measured
    seconds, memory and error, against published per-image figures (and Orion with --orion)."""
    import sys

    from api.common import ExitError, fail
    from backends.lattigo_backend import LattigoError
    from planner.ir.io import parse_size
    from planner.pipeline import PlanTimeout

    try:
        if boot_variants not in ("on", "off"):
            raise SlotplanError(f"option --boot-variants: expected on or off, got {boot_variants!r}")
        n_batch: int | str | None = batch
        if batch is not None and batch != "auto":
            n_batch = int(batch) if batch.isdigit() and int(batch) >= 1 else None
            if n_batch is None:
                raise SlotplanError(f"option --batch: expected a positive number of samples or 'auto', got {batch!r}")
        if output is not None and (output.suffix.lower() != ".json" or not output.parent.is_dir()):
            raise SlotplanError(f"--out {str(output)!r}: expected a .json file in an existing directory")
        o = BenchOptions(
            params=params, memory_cap=parse_size(memory_cap) if memory_cap is not None else None, batch=n_batch,
            boot_variants=boot_variants == "on", seed=seed, inputs=inputs, weights=weights, repeat=repeat,
            orion=orion, orion_python=orion_python, orion_rss_limit=parse_size(orion_rss_limit),
            orion_timeout_s=orion_timeout, dry_run=dry_run, time_limit_s=time_limit, network=network,
            calibrate=calibrate, degree=degree, plaintext_store=plaintext_store, costs=costs)
        rows = bench(models, o)
    except PlanTimeout as e:  # the solver found no plan within its limit (as plan: exit 3)
        raise fail(e, 3) from None
    except ValidationError as e:
        first = e.errors()[0]
        raise fail(ValueError(f"option {'.'.join(str(x) for x in first['loc'])}: {first['msg']}")) from None
    except SlotplanError as e:
        raise fail(e) from None
    except LattigoError as e:  # the backend failed on a valid plan
        raise ExitError(f"lattigo: {e}", 1) from None
    doc = document(rows, ["slotplan", "model-bench", *sys.argv[2:]])
    if output is not None:
        output.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    if as_json:
        print(json.dumps(doc, sort_keys=True))
    else:
        print_rows(rows)
    bad = failures(rows)
    if bad:
        raise ExitError("model-bench: " + "; ".join(bad), 1)
