"""Cut one node's fused BSGS blocks out of a plan, as a plan of their own.

    .venv/bin/python scripts/block_subplan.py PLAN.json NODE_ID OUT.json

The sub-plan keeps the node's fused blocks (the plan's ``fused`` annotation) and the baby
rotations they read, with the plan's params; every register the blocks read from outside
becomes an ``input``, every block root an ``output``. Key schedule (load_key/drop_key),
the node's other instructions (the adds over block outputs, rescales) and the bootstrap
block are left out: the sub-plan times the blocks alone, with only their rotation keys
(backends/lattigo ProfileBlock, cmd/blockprof; docs/lattigo.md "Profiling fused blocks").
"""

from __future__ import annotations

import json
import sys
from typing import Any


def subplan(plan: dict[str, Any], node_id: str) -> dict[str, Any]:
    nodes = {n["id"]: n for n in plan["nodes"]}
    if node_id not in nodes:
        raise SystemExit(f"node {node_id!r} is not in the plan (nodes: {', '.join(nodes)})")
    start, stop = nodes[node_id]["span"]
    prog = plan["program"]
    fused = plan.get("fused") or {"blocks": [], "babies": []}
    blocks = [b for b in fused["blocks"] if start <= b["instrs"][-1] < stop]
    if not blocks:
        raise SystemExit(f"node {node_id!r} has no fused block")
    keep = sorted({i for b in blocks for i in b["instrs"]})
    reads = {prog[i]["src"] for i in keep if prog[i]["op"] == "pmul"}
    babies = [i for i in fused["babies"] if any(d in reads for d in _writes(prog[i]))]
    keep = sorted(set(keep) | set(babies))
    written: set[str] = set()
    inputs: list[str] = []
    for i in keep:
        for r in _reads(prog[i]):
            if r not in written and r not in inputs:
                inputs.append(r)
        written.update(_writes(prog[i]))
    program: list[dict[str, Any]] = [
        {"op": "input", "dst": r, "tensor": "x", "table": f"in/{r}"} for r in inputs
    ]
    index = {}
    for i in keep:
        index[i] = len(program)
        program.append(prog[i])
    for j, b in enumerate(blocks):
        program.append(
            {"op": "output", "src": prog[b["instrs"][-1]]["dst"], "tensor": "y", "table": f"out/{j}"}
        )
    pts = {prog[i]["pt"] for i in keep if prog[i]["op"] == "pmul"}
    return {
        "schema": plan["schema"],
        "params": plan["params"],
        "plaintexts": {k: v for k, v in plan["plaintexts"].items() if k in pts},
        "program": program,
        "fused": {
            "blocks": [{"instrs": [index[i] for i in b["instrs"]], "mode": b["mode"]} for b in blocks],
            "babies": [index[i] for i in babies],
        },
    }


def _reads(ins: dict[str, Any]) -> list[str]:
    op = ins["op"]
    if op in ("add",):
        return [ins["a"], ins["b"]]
    return [ins["src"]] if "src" in ins else []


def _writes(ins: dict[str, Any]) -> list[str]:
    return list(ins["dsts"]) if "dsts" in ins else [ins["dst"]]


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    sub = subplan(plan, sys.argv[2])
    with open(sys.argv[3], "w") as f:
        json.dump(sub, f)
    n = sum(1 for i in sub["program"] if i["op"] == "pmul")
    print(
        f"{sys.argv[2]}: {len(sub['fused']['blocks'])} blocks, {n} pmul, {len(sub['program'])} instructions"
    )
