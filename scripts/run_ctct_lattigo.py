"""Issue 3: the ct-ct kernels run encrypted on Lattigo and agree with numpy to CKKS precision.

Rotom Table 4 ([128,64] x [64,128], A column-major and B row-major pinned, n14) and the
Table 3 shape (128x128 at n13, row-major inputs) with the rolled kernel and with Strassen.

Run from the repository root: PYTHONPATH=. .venv/bin/python scripts/run_ctct_lattigo.py
"""

import time
from dataclasses import replace

from backends.runner import run_plan
from planner.frontend.graph import load_graph
from planner.frontend.params import load_params
from planner.pipeline import PlanOptions, plan_graph

CASES = [
    ("table4 col-row", "data/workloads/rotom/bolt_ctct.json", "n14",
     {"A": "[1:64][0:128]", "B": "[0:64][1:128]"}, None),
    ("table3 rolled", "data/workloads/rotom/ctct_128.json", "n13",
     {"A": "[0:4:32];[0:32][1:128]", "B": "[0:4:32];[0:32][1:128]"}, ("ct-ct-jkls",)),
    ("table3 strassen", "data/workloads/rotom/ctct_128.json", "n13",
     {"A": "[0:4:32];[0:32][1:128]", "B": "[0:4:32];[0:32][1:128]"}, ("ct-ct-strassen",)),
]
for name, path, preset, pins, kernels in CASES:
    opts = PlanOptions(input_layouts=tuple(sorted(pins.items())))
    if kernels:
        opts = replace(opts, kernels=kernels)
    res = plan_graph(load_graph(path), load_params(preset), opts)
    t0 = time.perf_counter()
    rep = run_plan(res.plan, res.tables, "lattigo", seed=1)
    s = res.plan["summary"]
    print(f"{name:16s} {preset} kernels={sorted({n['kernel'] for n in res.plan['nodes']})} rot={s['rotations']} "
          f"cmul={s['cmul']} depth={s['depth']} ok={rep.ok} max_rel_err={rep.max_rel_error:.2e} "
          f"run={time.perf_counter() - t0:.1f}s", flush=True)
