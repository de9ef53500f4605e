"""Issue 15 acceptance (modelled side): small conv nets at n14 (two and three 3x3
convolutions with squares between) and the KeyMemRT suite, each planned at a quarter of its
keep-all peak (ANT-ACE: every key at the top level, all resident) through the pipeline
(`memory_cap_bytes`: the joint key schedule); rotations, key loads, hoisted splits, composed
offsets, peak and modelled time against keep-all; every capped plan runs in the simulator
with strict key residency and key levels and must equal numpy.

Run from the repository root: PYTHONPATH=. .venv/bin/python scripts/quarter_cap_check.py
"""

import json
import sys
import time
from pathlib import Path

import numpy as np

from backends.sim import simulate
from planner.cost.timing import modelled_time, time_model
from planner.frontend.graph import load_graph, parse_graph
from planner.frontend.params import load_params
from planner.frontend.reference import random_values, reference
from planner.ir.analysis import plan_key_bytes
from planner.keys.schedule import schedule_keys
from planner.pipeline import PlanOptions, plan_graph
from tests.planner.keys.test_keyplan import convnet

FRACTION = float(sys.argv[1]) if len(sys.argv) > 1 else 0.25
work = [(parse_graph(convnet(2, 3, 32, 16)), "n14"), (parse_graph(convnet(3, 3, 32, 16)), "n14")]
suite = json.loads(Path("data/suites/keymemrt.json").read_text())
work += [(load_graph("data/suites/" + w["graph"]), w["params"]) for w in suite["workloads"]]
for g, preset in work:
    t0 = time.time()
    p = load_params(preset)
    tm = time_model(p)
    free = plan_graph(g, p, PlanOptions())
    ka = schedule_keys(free.plan["program"], p, None, "keep-all", key_levels=False)
    ka_t = modelled_time(free.plan["program"], p, {}, tm)
    cap = int(ka.peak_bytes["total"] * FRACTION)
    res = plan_graph(g, p, PlanOptions(memory_cap_bytes=cap, time_limit_s=5.0))
    s = res.plan["summary"]
    assert s["peak_bytes"]["total"] <= cap
    vals = random_values(g, 5)
    ref = reference(g, vals)
    levels = {int(k): int(v["level"]) for k, v in res.plan["keys"].items()}
    out = simulate(res.plan, res.tables, vals, key_levels=levels)
    err = max(float(np.max(np.abs(out.outputs[t] - ref[t]))) / max(1e-300, float(np.max(np.abs(ref[t]))))
              for t in g.outputs)
    assert err < 1e-9, err
    mt = modelled_time(res.plan["program"], p, plan_key_bytes(res.plan) or {}, tm)
    ks = s["key_schedule"]
    print(f"{g.name:18s} {preset}: keep-all peak {ka.peak_bytes['total'] / 2**20:8.1f} MiB rot {ka.rotations:4d} "
          f"loads {len(ka.keys):3d} time {ka_t.total_ms:8.0f} ms | cap {cap / 2**20:7.1f} MiB: peak "
          f"{s['peak_bytes']['total'] / 2**20:7.1f} MiB ({ka.peak_bytes['total'] / s['peak_bytes']['total']:.2f}x less) "
          f"rot {s['rotations']:4d} loads {s['key_loads']:4d} splits {ks.get('hoisted_splits', 0):3d} "
          f"composed {len(ks.get('chains', {})):3d} time {mt.total_ms:8.0f} ms ({mt.total_ms / ka_t.total_ms:.3f}x) "
          f"sim relerr {err:.1e} strict residency ok, {time.time() - t0:.0f}s", flush=True)
