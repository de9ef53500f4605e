"""Counts of a plan's conv layers beside NeuJeans' Table 1 formulas (issue 13 note).

    python scripts/neujeans_counts.py PLAN.json [PLAN.json ...]

Per plan: bootstraps, rotations and pmul of the whole plan (its summary), and over its
CinS conv layers (kernel ``cins-*``) the Table 1 counts of the same layer shapes: for a
layer whose CinS kernel has ``C`` slices per ciphertext, ``P_I`` input and ``P_O`` output
ciphertexts and an ``f x f`` kernel, every one of the ``P_I * P_O`` channel blocks costs
(NeuJeans Table 1, C = C_in = C_out in one ciphertext)

* slot encoding [24]: ``2 f^2 C`` pmul, ``2 f^2 + 2 C - 4`` rotations;
* coefficient encoding [25]: ``2 C - 1`` pmul, ``C - 1`` rotations;
* NeuJeans: ``C`` pmul, ``2 sqrt(C) - 2`` rotations (depthwise: 1 pmul, 0 rotations);

next to the plan's own conv counts (the CinS kernel alone: the node's ``cost``, without
to_cins, masks and conversions) and the whole layers (the node's span).
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any


def table1(n: dict[str, Any], f: int, depthwise: bool) -> dict[str, tuple[float, float]]:
    p = n["params"]
    C, blocks = int(p["C"]), int(p["P_I"]) * int(p["P_O"])
    if depthwise:
        blocks = int(p["P_O"])
    return {
        "slot [24]": (blocks * 2 * f * f * C, blocks * (2 * f * f + 2 * C - 4)),
        "coefficient [25]": (blocks * (2 * C - 1), blocks * (C - 1)),
        "NeuJeans": (blocks * (1 if depthwise else C), 0 if depthwise else blocks * (2 * math.sqrt(C) - 2)),
    }


def main(paths: list[str]) -> None:
    for path in paths:
        with open(path) as fh:
            plan = json.load(fh)
        s = plan["summary"]
        spec = plan["graph"]["spec"]
        wshape = {k: v["shape"] for k, v in spec["tensors"].items()}
        print(f"{path}: bootstraps {s.get('bootstraps')}  rotations {s['rotations']}  pmul {s['pmul']}  "
              f"depth {s['depth']}  solver {s['solver']['status']}")
        tot: dict[str, list[float]] = {}
        own = [0, 0, 0]
        layer = [0, 0, 0]
        nodes = {n["id"]: n for n in spec["nodes"]}
        for n in plan["nodes"]:
            if not n["kernel"].startswith("cins-"):
                continue
            g = nodes[n["id"]]
            ws = wshape[g["inputs"][1]]
            for k, (pm, rot) in table1(n, ws[2], n["kernel"] == "cins-dw").items():
                t = tot.setdefault(k, [0.0, 0.0])
                t[0] += pm
                t[1] += rot
            own[0] += n["cost"]["pmul"]
            own[1] += n["cost"]["rotations"]
            own[2] += n["cost"].get("bootstraps", 0)
            layer[0] += n["pmul"]
            layer[1] += n["rotations"]
            layer[2] += n.get("bootstraps", 0)
        if tot:
            print(f"  CinS conv layers: kernels alone pmul {own[0]} rotations {own[1]}; whole layers "
                  f"(to_cins, conv, bootstrap_cins, exit mask, edge conversions) pmul {layer[0]} "
                  f"rotations {layer[1]} bootstraps {layer[2]}")
            for k, (pm, rot) in tot.items():
                print(f"  Table 1 {k:>17}: pmul {pm:,.0f}  rotations {rot:,.0f}")


if __name__ == "__main__":
    main(sys.argv[1:])
