"""Joint key/layout model: a 1024x1024 matvec at n13 under shrinking memory caps; prints the
kernel each cap leads to and checks every plan in the simulator (strict key residency)."""

import time

from planner.frontend.params import load_params
from planner.pipeline import PlanOptions, plan_graph
from tests.helpers import check_plan, matvec_graph

g = matvec_graph(1024, 1024)
p = load_params("n13")
for cap in (None, 400 * 2**20, 60 * 2**20, 30 * 2**20, 15 * 2**20):
    t = time.time()
    r = plan_graph(g, p, PlanOptions(memory_cap_bytes=cap))
    check_plan(r, g)
    n, s = r.plan["nodes"][0], r.plan["summary"]
    print(f"cap {cap and cap // 2**20} MiB: {n['kernel']} (own min cap {n.get('min_cap_bytes', 0) // 2**20} MiB) "
          f"rot {s['rotations']} keys {s['rotation_keys']} loads {s['key_loads']} "
          f"peak {s['peak_bytes']['total'] // 2**20} MiB {time.time() - t:.1f}s")
