"""Issue 32 acceptance: the noisy simulator's predicted output error against Lattigo's
measured error on the workloads of the Lattigo test suite (data/suites/lattigo_n12.json,
lattigo_n14.json: their matvec shapes and convolutions; the planned n14boot chains of
tests/backends/test_lattigo_boot.py). One table: workload, preset, predicted, measured, ratio.

Each Lattigo run takes /tmp/slotplan-heavy.lock (one heavy job on the machine at a time).

    PYTHONPATH=. .venv/bin/python scripts/noise_table.py [--only n12,n14,n14boot] [--out table.json]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import time
from contextlib import contextmanager
from typing import Any

import numpy as np

from backends.lattigo_bench import conv_workload, mvm_workload
from backends.runner import run_plan
from planner.frontend.graph import Graph, parse_graph
from planner.frontend.params import load_params
from planner.pipeline import PlanOptions, plan_graph

SUITES = {
    "n12": ([(512, 512), (1024, 1024), (2048, 2048), (1024, 4096)], ["conv1", "conv2", "conv3", "conv4"]),
    "n14": ([(512, 512), (2048, 2048), (1024, 4096)], ["conv1", "conv2", "conv3", "conv4"]),
}


@contextmanager
def heavy_lock() -> Any:
    if os.environ.get("SLOTPLAN_HEAVY_LOCK_HELD"):  # run under `flock /tmp/slotplan-heavy.lock` already
        yield
        return
    with open("/tmp/slotplan-heavy.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def chain12(S: int) -> Graph:
    """tests/backends/test_lattigo_boot.py: twelve products, one bootstrap at n14boot."""
    tensors: dict[str, Any] = {"x": {"shape": [S], "role": "input", "range": [-1.0, 1.0]}}
    nodes, prev = [], "x"
    for i in range(12):
        tensors[f"w{i}"] = {"shape": [S], "role": "weight", "range": [-1.0, 1.0]}
        nodes.append({"id": f"m{i}", "op": "mul", "inputs": [prev, f"w{i}"]})
        prev = f"m{i}"
    return parse_graph({"schema": "slotplan.graph/1", "name": "chain12", "tensors": tensors, "nodes": nodes,
                        "outputs": [prev]})


def squarings12(S: int) -> Graph:
    """Issue 32's case: twelve squarings, values near +-1, node ranges given."""
    tensors: dict[str, Any] = {"x": {"shape": [S], "role": "input", "range": [-1.0, 1.0]}}
    nodes, prev = [], "x"
    for i in range(12):
        nodes.append({"id": f"s{i}", "op": "mul", "inputs": [prev, prev], "range": [0.0, 1.0]})
        prev = f"s{i}"
    return parse_graph({"schema": "slotplan.graph/1", "name": "squarings12", "tensors": tensors, "nodes": nodes,
                        "outputs": [prev]})


def workloads(only: set[str]) -> list[tuple[str, str, Graph, str]]:
    rows = []
    for preset, (shapes, convs) in SUITES.items():
        if preset not in only:
            continue
        rows += [(f"{n}x{k}", preset, mvm_workload(n, k).graph, "fan-in") for n, k in shapes]
        rows += [(c, preset, conv_workload(c).graph, "fan-in") for c in convs]
    if "n14boot" in only:
        S = load_params("n14boot").slots
        rows += [("chain12", "n14boot", chain12(S), "ones"), ("squarings12", "n14boot", squarings12(S), "near1")]
    return rows


def values_for(g: Graph, init: str, seed: int) -> dict[str, np.ndarray] | None:
    if init == "fan-in":
        return None
    rng = np.random.default_rng(seed)
    if init == "ones":  # the test's worst case: every value at its bound
        v = {t: np.ones(g.shape(t)) for t in (*g.inputs, *g.weights)}
        v["x"] = -np.ones(g.shape("x"))
        return v
    # near +-1: random signs, |x| in [1 - 1e-4, 1]
    x = rng.choice([-1.0, 1.0], g.shape("x")) * (1 - 1e-4 * rng.uniform(0, 1, g.shape("x")))
    return {"x": x}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="n12,n14,n14boot")
    ap.add_argument("--out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--measured", default="data/noise/lattigo_measured.json",
                    help="cache of Lattigo's measured errors (re-used; --remeasure runs Lattigo again)")
    ap.add_argument("--remeasure", action="store_true")
    a = ap.parse_args()
    cache: dict[str, Any] = {}
    try:
        with open(a.measured) as f:
            cache = json.load(f)
    except FileNotFoundError:
        pass
    rows = []
    for name, preset, g, init in workloads(set(a.only.split(","))):
        res = plan_graph(g, load_params(preset), PlanOptions(allow_insecure=True))
        vals = values_for(g, init, a.seed)
        noisy = run_plan(res.plan, res.tables, "noisy", seed=a.seed, values=vals)
        pred = float(noisy.stats["noise"]["predicted_max_abs_error"])
        key = f"{name}@{preset}/seed{a.seed}"
        if key not in cache or a.remeasure:
            t0 = time.time()
            with heavy_lock():
                lat = run_plan(res.plan, res.tables, "lattigo", seed=a.seed, values=vals)
            cache[key] = {"max_abs_error": lat.max_abs_error, "max_rel_error": lat.max_rel_error,
                          "seconds": round(time.time() - t0, 1), "program_ops": len(res.plan["program"]),
                          "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            with open(a.measured, "w") as f:
                json.dump(cache, f, indent=1, sort_keys=True)
        m = cache[key]
        row = {"workload": name, "preset": preset, "predicted": pred, "noisy_sampled": noisy.max_abs_error,
               "measured": m["max_abs_error"], "ratio": pred / m["max_abs_error"] if m["max_abs_error"] else None,
               "measured_rel": m["max_rel_error"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| workload | preset | predicted | noisy sim (sampled) | Lattigo measured | predicted/measured |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workload']} | {r['preset']} | {r['predicted']:.3e} | {r['noisy_sampled']:.3e} | "
              f"{r['measured']:.3e} | {r['ratio']:.2f} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    worst = max((max(r["ratio"], 1 / r["ratio"]) for r in rows if r["ratio"]), default=1.0)
    print(f"\nworst factor {worst:.2f} (acceptance: within 4x)")
    return 0 if worst <= 4 else 1


if __name__ == "__main__":
    sys.exit(main())
