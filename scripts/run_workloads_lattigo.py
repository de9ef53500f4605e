"""Issue 5 acceptance: plans of the data/ workloads that fit presets up to n14, run encrypted
on Lattigo (seeded data, fan-in weights) and compared with numpy.

Run from the repository root: PYTHONPATH=. .venv/bin/python scripts/run_workloads_lattigo.py
"""

import glob

from backends.runner import run_plan
from common.errors import SlotplanError
from planner.frontend.graph import load_graph
from planner.frontend.params import load_params
from planner.pipeline import PlanOptions, plan_graph

cands = sorted(glob.glob("data/workloads/*.json")) + sorted(glob.glob("data/workloads/rotom/*.json"))
# too large to encrypt-run in minutes on 2 cores, or sized for n16
SKIP = {
    "mvm2": "4096x25088: 2^27 weights, ~12k plaintexts at n14",
    "bert_attention": "107 nodes, 270k pmul / 30k rotations at n14 (hours)",
    "double_matmul_32k": "32k variant", "matmul_32k": "32k variant", "conv_32k": "32k variant",
    "imagenet_resnet18_stem": "3x224x224 needs n16",
    "conv1_large": "n16-size kernel", "conv2_large": "n16-size kernel", "conv3_large": "n16-size kernel",
    "conv4_large": "n16-size kernel", "ttm": "32 input ciphertexts",
}
for path in cands:
    name = path.split("/")[-1][:-5]
    if name in SKIP:
        print(f"{name:24s} skipped: {SKIP[name]}", flush=True)
        continue
    g = load_graph(path)
    for preset in ("n13", "n14"):
        try:
            res = plan_graph(g, load_params(preset), PlanOptions())
        except SlotplanError as e:
            print(f"{name:24s} {preset} not plannable: {' '.join(str(e).split())[:120]}", flush=True)
            continue
        rep = run_plan(res.plan, res.tables, "lattigo", seed=1)
        st = rep.stats
        model = res.plan["summary"]["peak_bytes"]["keys"] / 2**20
        print(f"{name:24s} {preset} rot {res.plan['summary']['rotations']:5d} ok={rep.ok} "
              f"max_rel_err {rep.max_rel_error:.2e} eval {st.get('eval_seconds', 0):.2f}s "
              f"keygen {st.get('keygen_seconds', 0):.2f}s peak_keys model {model:.1f} MiB "
              f"measured {st.get('peak_key_bytes', 0) / 2**20:.1f} MiB", flush=True)
        break
