"""Issue 4 acceptance: each KeyMemRT workload at caps from the keep-all peak down to the
smallest feasible one; every strategy's plan is feasible, runs in the simulator with strict
key residency (key levels checked), equals numpy, and never exceeds the cap.

Run from the repository root: PYTHONPATH=. .venv/bin/python scripts/check_key_caps.py
"""

import json
import time
from pathlib import Path

import numpy as np

from backends.sim import simulate
from planner.frontend.graph import load_graph
from planner.frontend.params import load_params
from planner.frontend.reference import random_values, reference
from planner.keys.schedule import schedule_plan
from planner.pipeline import PlanOptions, plan_graph

suite = json.loads(Path("data/suites/keymemrt.json").read_text())
for w in suite["workloads"]:
    g = load_graph("data/suites/" + w["graph"])
    p = load_params(w["params"])
    t0 = time.time()
    res = plan_graph(g, p, PlanOptions())
    base, _ = schedule_plan(res.plan, None, "keep-all")
    top = base["summary"]["peak_bytes"]["total"]
    lo = schedule_plan(res.plan, None, "belady")[1].min_cap_bytes
    vals = random_values(g, 7)
    ref = reference(g, vals)
    caps = sorted({int(lo + (top - lo) * f) for f in (1.0, 0.66, 0.33, 0.1, 0.0)}, reverse=True)
    for cap in caps:
        for strat in ("keymemrt", "belady", "exact"):
            plan, _ = schedule_plan(res.plan, cap, strat, time_limit_s=10.0)
            assert plan["summary"]["peak_bytes"]["total"] <= cap
            levels = {int(k): int(v["level"]) for k, v in plan["keys"].items()}
            out = simulate(plan, res.tables, vals, key_levels=levels)
            err = max(
                float(np.max(np.abs(out.outputs[t] - ref[t])) / max(1e-300, float(np.max(np.abs(ref[t])))))
                for t in g.outputs
            )
            assert err < 1e-9, err
            s = plan["summary"]
            print(f"{g.name:22s} {w['params']} cap {cap / 2**20:9.1f} MiB {strat:9s} loads {s['key_loads']:4d} "
                  f"rot {s['rotations']:4d} peak {s['peak_bytes']['total'] / 2**20:9.1f} MiB relerr {err:.1e}",
                  flush=True)
    print(f"{g.name}: keep-all peak {top / 2**20:.1f} MiB, smallest feasible cap {lo / 2**20:.1f} MiB, "
          f"{time.time() - t0:.0f}s", flush=True)
