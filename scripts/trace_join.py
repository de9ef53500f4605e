"""Join an instruction trace of a Lattigo run with the time model's price of each instruction.

    SLOTPLAN_OP_TRACE=trace.tsv slotplan run plan.json --backend lattigo ...
    PYTHONPATH=. .venv/bin/python scripts/trace_join.py plan.json trace.tsv [--json]

``trace.tsv`` is what the executor wrote for ``plan.json`` (``SLOTPLAN_OP_TRACE``,
docs/lattigo.md "Where a bootstrapping evaluation's time goes"); a ``model-bench`` run
plans in-process, so plan the same graph with the same options (``slotplan plan ... -o``:
the same request gives the same plan) and trace that plan's run. Each instruction is
priced as ``model-bench`` prices a one-shot run (``api.model_bench.run_conditions``:
``TimeModel.program_costs``), and both sides are summed by class:

* ``bootstrap``: the bootstrap instructions;
* ``fused``: the fused blocks, with what the executor runs of them as written (the giant
  steps of a block split under the key schedule, which count under ``rot``, and the adds
  that end it); the model charges a block at its root;
* ``rot``: the plan's single rotations; ``key loads``: the plan's ``load_key`` of single
  keys (modelled: ``modelled_time``'s loads); ``block load``: ``load_key`` of the
  bootstrapping block, its DFT matrices encoded (modelled: their encoding);
* every other op under its own name.

A trace that holds several evaluations of the plan (one process, several runs) is summed
over all of them, and the modelled side multiplied by their number. Output: a Markdown table
(class, steps, measured s, modelled s, ratio) or ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from api.model_bench import run_conditions
from planner import ir
from planner.cost.timing import modelled_time, time_model
from planner.frontend.params import Params
from planner.ir.analysis import plan_key_bytes
from planner.ir.fusion import fused_blocks


class TraceError(ValueError):
    """A trace that does not belong to the plan (or is not a trace)."""


def read_trace(path: Path) -> list[tuple[int, str, float]]:
    """(instruction index, op, seconds) of each line of an op trace."""
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        f = line.split("\t")
        if len(f) < 4:
            raise TraceError(f"{path}:{n}: {len(f)} tab-separated fields, an op trace line has at least 4")
        try:
            rows.append((int(f[0]), f[1], float(f[3])))
        except ValueError as e:
            raise TraceError(f"{path}:{n}: {e}") from None
    return rows


def join(plan: Mapping[str, Any], trace: Sequence[tuple[int, str, float]],
         plaintext_store: bool = False) -> dict[str, dict[str, float]]:
    """Measured and modelled seconds (and the measured steps) by class (module docstring);
    ``plaintext_store``: the trace is of evaluations that read their block plaintexts back
    from the plaintext store (model-bench --plaintext-store, the runs after the first)."""
    params = Params.from_json(plan["params"])
    prog = plan["program"]
    tm = time_model(params)
    run = run_conditions(params, plaintext_store)
    costs = tm.program_costs(prog, params.max_level, params.slots, run)
    blocks, skip = fused_blocks(prog, params.slots)
    fused = set(skip) | {b.root for b in blocks}
    decoded = ir.decode_program(prog)

    def cls(i: int) -> str:
        ins = decoded[i]
        if ir.is_bootstrap(ins):
            return "bootstrap"
        if i in fused or (isinstance(ins, ir.Rot) and costs[i] == 0):
            return "fused"
        if isinstance(ins, ir.LoadKey):
            return "block load" if ins.k is None else "key loads"
        return str(prog[i].get("op"))

    out: dict[str, dict[str, float]] = defaultdict(lambda: {"steps": 0, "measured": 0.0, "modelled": 0.0})
    runs = 1  # a new evaluation starts where the index goes back
    for n, (i, _op, sec) in enumerate(trace):
        if not 0 <= i < len(prog):
            raise TraceError(f"the trace names instruction {i}; the plan has {len(prog)}")
        runs += n > 0 and i < trace[n - 1][0]
        row = out[cls(i)]
        row["steps"] += 1
        row["measured"] += sec
    for i, c in enumerate(costs):
        if c:
            out[cls(i)]["modelled"] += runs * c * tm.ms_per_unit / 1e3
    mt = modelled_time(prog, params, plan_key_bytes(plan) or {}, tm, preload_prologue=False, run=run)
    out["key loads"]["modelled"] += runs * (mt.load_ms / 1e3)
    if any(isinstance(ins, ir.LoadKey) and ins.k is None for ins in decoded):
        out["block load"]["modelled"] += runs * mt.matrix_ms / 1e3
    return {k: v for k, v in out.items() if v["steps"] or v["modelled"]}


def table(rows: Mapping[str, Mapping[str, float]]) -> str:
    lines = ["| class | steps | measured s | modelled s | modelled / measured |", "|---|---|---|---|---|"]
    for k, v in sorted(rows.items(), key=lambda kv: -kv[1]["measured"]):
        ratio = f"{v['modelled'] / v['measured']:.3f}" if v["measured"] > 0 else "-"
        lines.append(f"| {k} | {int(v['steps'])} | {v['measured']:.3f} | {v['modelled']:.3f} | {ratio} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan", type=Path)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--json", action="store_true", help="print the classes as JSON")
    ap.add_argument("--plaintext-store", action="store_true",
                    help="price the block plaintexts as plaintext-store reads (a trace of the runs after the first)")
    a = ap.parse_args(argv)
    try:
        plan = json.loads(a.plan.read_text())
        rows = join(plan, read_trace(a.trace), a.plaintext_store)
    except (OSError, json.JSONDecodeError, TraceError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=1, sort_keys=True) if a.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
