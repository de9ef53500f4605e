"""Issue 32: where a chain of twelve squarings with one bootstrap at n14boot loses its bits.

Plans the chain (values near +-1, node ranges given), adds an ``output`` of every register
the program writes (a probe: decrypting does not change the computation), runs it on Lattigo
and on the noisy simulator, and prints, per instruction, Lattigo's measured error against
the exact simulator next to the error model's predicted standard deviation.

    flock /tmp/slotplan-heavy.lock env PYTHONPATH=. .venv/bin/python scripts/squaring_chain.py [--const]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from noise_table import squarings12, values_for  # noqa: E402

from backends import noise, sim  # noqa: E402
from backends.lattigo_backend import run_plan as lattigo_run  # noqa: E402
from planner.params import load_params  # noqa: E402
from planner.pipeline import PlanOptions, plan_graph  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--const", action="store_true", help="x = +-1 exactly in every slot (all energy in one coefficient)")
    ap.add_argument("--out")
    a = ap.parse_args()
    p = load_params("n14boot")
    g = squarings12(p.slots)
    res = plan_graph(g, p, PlanOptions(allow_insecure=True))
    vals = values_for(g, "near1", 0)
    assert vals is not None
    if a.const:
        vals = {"x": np.ones(p.slots)}
    plan = json.loads(json.dumps(res.plan))
    tables = dict(res.tables.items()) if hasattr(res.tables, "items") else dict(res.tables)
    tables["probe.idx"] = np.arange(p.slots, dtype=np.int64)
    prog: list[dict[str, Any]] = []
    probes: list[tuple[int, str, str]] = []
    for d in plan["program"]:
        prog.append(d)
        if d["op"] in ("cmul", "pmul", "rescale", "bootstrap", "input", "poly"):
            prog.append({"op": "output", "src": d["dst"], "tensor": f"probe_{d['dst']}", "table": "probe"})
            probes.append((len(probes), d["op"], d["dst"]))
    plan["program"] = prog
    exact = sim.simulate(plan, tables, {**vals}).outputs
    model = noise.load_model(plan["params"])
    nr = noise.simulate_noisy(plan, tables, vals, model, np.random.default_rng(0))
    if os.environ.get("DRY"):
        print(plan["summary"].get("bootstrapping", ""), len(prog))
        return
    lat = lattigo_run(plan, vals, {}, tables)
    rows = []
    print(f"{'#':>3} {'op':10s} {'register':10s} {'max|value|':>11s} {'measured max err':>17s} "
          f"{'rel':>9s} {'bits':>5s} {'predicted sigma':>16s} {'pred max':>9s}")
    for j, op, reg in probes:
        t = f"probe_{reg}"
        e = np.abs(np.ravel(lat.outputs[t]) - np.ravel(exact[t]))
        mx = float(np.max(np.abs(exact[t])))
        var = nr.variances[t]
        pred = noise.predicted_max_error({t: var})
        rel = float(e.max()) / mx if mx else float("nan")
        rows.append({"step": j, "op": op, "register": reg, "max_abs_value": mx, "measured_max_abs_error": float(e.max()),
                     "measured_rms_error": float(np.sqrt(np.mean(e**2))), "measured_rel": rel,
                     "predicted_sigma": float(np.sqrt(np.max(var))), "predicted_max_abs_error": pred})
        print(f"{j:3d} {op:10s} {reg:10s} {mx:11.3e} {e.max():17.3e} {rel:9.2e} {-np.log2(rel) if rel > 0 else 0:5.1f} "
              f"{np.sqrt(np.max(var)):16.3e} {pred:9.2e}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
