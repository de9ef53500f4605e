"""A NeuJeans CinS plan executed by the plan executor on Lattigo (issue 37, docs/neujeans.md):
`slotplan run --backend lattigo` at n14boot against numpy, and the counts the plan claims
(bootstraps, levels at each bootstrap, rotations) against what the run counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from planner import ir
from planner.frontend.graph import parse_graph
from planner.frontend.params import preset
from planner.ir.instructions import lattigo_bsgs_rotations
from planner.pipeline import PlanOptions, plan_graph
from tests.helpers import REPO_ROOT

N14BOOT = preset("n14boot")

# dense 3x3 stride 2 (decomposed, NeuJeans Alg. 2), an activation, a depthwise 3x3 and a
# dense 3x3, all in CinS layers (each ends in a fused bootstrap_cins). Positive data with
# tight declared ranges: each layer divides its result by the power of two that brings the
# worst case (fan-in * max|w| * max|x|) within boot.max_abs before its bootstrap, so the
# closer the data come to that bound, the fewer bits the bootstrap's error takes
# (docs/cins.md)
# (data/cins/cins_net_n14boot.json, also keymeasure's CinS workload: data/suites/keymemrt_cins.json)
NET: dict[str, Any] = json.loads((REPO_ROOT / "data" / "cins" / "cins_net_n14boot.json").read_text())
KERNELS = ("cins-bsgs", "cins-dw", "elementwise")


def cins_plan() -> Any:
    return plan_graph(parse_graph(NET), N14BOOT, PlanOptions(allow_insecure=True, kernels=KERNELS))


def fused_regions(prog: list[ir.Instr], plaintexts: dict[str, Any]) -> dict[int, set[int]]:
    """Per fused bootstrap_cins: the instructions of the convolution it absorbs (what the
    Lattigo executor evaluates as one S_(N/2<-l) K matrix: backends/lattigo/cins_exec.go)."""
    defs: dict[str, int] = {}
    for i, ins in enumerate(prog):
        for _, r in ins.write_fields():
            defs[r] = i
    out: dict[int, set[int]] = {}
    for i, ins in enumerate(prog):
        if not (isinstance(ins, ir.BootstrapCins) and ins.fused):
            continue
        region: set[int] = set()
        stack = [ins.src]
        while stack:
            j = defs.get(stack.pop())
            if j is None or j in region:
                continue
            p = prog[j]
            linear = isinstance(p, ir.Rescale | ir.Add | ir.Sub | ir.Rot | ir.RotHoisted) or (
                isinstance(p, ir.PMul) and plaintexts[p.pt].get("l"))
            if linear:
                region.add(j)
                stack.extend(p.reads())
        out[i] = region
    return out


def test_plan_uses_every_cins_form() -> None:
    res = cins_plan()
    kernels = {n["id"]: n for n in res.plan["nodes"]}
    assert kernels["c0"]["kernel"] == "cins-bsgs" and kernels["c0"]["params"].get("decomposed") == 2
    assert kernels["c1"]["kernel"] == "cins-dw" and kernels["c2"]["kernel"] == "cins-bsgs"
    prog = [ir.decode(r) for r in res.plan["program"]]
    boots = [i for i in prog if isinstance(i, ir.BootstrapCins)]
    assert len(boots) == res.plan["summary"]["bootstraps"] == 3 and all(b.fused for b in boots)
    regions = fused_regions(prog, res.plan["plaintexts"])
    assert all(regions.values())  # every fused bootstrap absorbs a convolution
    # the planner's regions are the test's (the executor's rule, written independently)
    assert {f.at: set(f.instrs) for f in ir.fused_cins(prog)} == regions
    # levels given back: every bootstrap_cins keeps SlotsToCoeffs' 3 levels, so the layer
    # after a CinS layer starts 3 levels above the top (its exit mask takes one of them)
    assert N14BOOT.boot is not None and N14BOOT.boot.stoc_levels == 3
    assert all(b.stoc_levels == 3 for b in boots)
    assert res.plan["summary"]["depth"] == 1 - 3
    assert claimed_levels(prog) == [6, 6, 8]  # (9 - 3, then 12 - 2 - 2 - 1 - 1, 11 - 2 - 1)


def test_cins_keys_reach_the_levels_given_back() -> None:
    """Rotations above the top residual level (the layer after a CinS layer) need keys
    generated that high: keep-all keys at top + stoc_levels (as the Lattigo client makes
    them, plan.defaultKeyLevel), scheduled keys at the level of their highest use; the
    memory model sizes them so."""
    from planner.ir.analysis import rotation_key_levels
    from planner.keys.schedule import schedule_plan

    res = cins_plan()
    assert N14BOOT.boot is not None
    top = N14BOOT.max_level + N14BOOT.boot.stoc_levels
    _, ka = schedule_plan(res.plan, None, "keep-all", key_levels=False)
    assert ka.keys and all(k.level == top for k in ka.keys.values())
    assert all(k.bytes == N14BOOT.rotation_key_bytes(top) for k in ka.keys.values())
    assert res.plan["summary"]["peak_bytes"]["keys"] >= len(ka.keys) * N14BOOT.rotation_key_bytes(top)
    sched_plan, sched = schedule_plan(res.plan, None, "keep-all", key_levels=True)
    prog = [ir.decode(r) for r in sched_plan["program"]]
    use = rotation_key_levels(sched_plan["program"], N14BOOT.max_level)
    assert max(lv for lv in use if lv is not None) == top  # the last layer's to_cins rotates above the top
    for ins, lv in zip(prog, use, strict=True):
        for k in ins.rot_keys():  # a key the block does not serve is made for its highest use
            if k not in N14BOOT.boot.key_offsets:
                assert lv is not None and sched.keys[k].level >= lv


def claimed_levels(prog: list[ir.Instr]) -> list[int]:
    """The level each bootstrap_cins reads its operand at, by the plan's depths."""
    assert N14BOOT.boot is not None
    depth: dict[str, int] = {}
    out = []
    for ins in prog:
        if isinstance(ins, ir.BootstrapCins):
            out.append(N14BOOT.boot.levels_after - depth[ins.src])
        d = ins.depth(depth) if ins.reads() else 0
        for _, r in ins.write_fields():
            depth[r] = d
    return out


def claimed_rotations(prog: list[ir.Instr], plaintexts: dict[str, Any]) -> dict[str, int]:
    """The rotations the executor makes, by kind, from the plan alone (the test's own
    count): rot instructions outside fused convolutions, to_cins factors, and a fused
    convolution's S_(N/2<-l) K (Lattigo's BSGS over all C slice diagonals, per base)."""
    regions = fused_regions(prog, plaintexts)
    absorbed = set().union(*regions.values())
    outside = sum(ins.count() for j, ins in enumerate(prog) if isinstance(ins, ir.Rot | ir.RotHoisted) and j not in absorbed)
    slots = N14BOOT.slots
    fused = 0
    for at, region in regions.items():
        b = prog[at]
        assert isinstance(b, ir.BootstrapCins)
        written = {r for j in region for r in prog[j].writes()}
        bases = {r for j in region for r in prog[j].reads() if r not in written}
        fused += len(bases) * lattigo_bsgs_rotations({k * b.l for k in range(slots // b.l)}, slots)
    return {"rotations": outside, "cins_rotations": sum(ins.count() for ins in prog if isinstance(ins, ir.ToCins)),
            "cins_fused_rotations": fused}


def test_cins_plan_simulates_and_claims_its_counts() -> None:
    """The fast version of the Lattigo run below: the same plan on the simulator against
    numpy (user data within the declared ranges), and the plan's rotation claim is what
    the executor makes (to_cins factors, fused S_(N/2<-l) K matrices, other rotations)."""
    from backends.runner import run_plan

    res = cins_plan()
    prog = [ir.decode(r) for r in res.plan["program"]]
    rng = np.random.default_rng(7)
    values = {t: rng.uniform(*spec["range"], size=spec["shape"]) for t, spec in NET["tensors"].items()}
    rep = run_plan(res.plan, res.tables, "sim", values=values)
    assert rep.ok, rep
    assert rep.max_rel_error <= 1e-9
    want = claimed_rotations(prog, res.plan["plaintexts"])
    assert res.plan["summary"]["rotations"] == sum(want.values()) == rep.rotations
    assert sum(n["rotations"] for n in res.plan["nodes"]) == res.plan["summary"]["rotations"]
    assert want == {"rotations": 0, "cins_rotations": 30, "cins_fused_rotations": 90}


@pytest.mark.skipif(os.environ.get("SLOTPLAN_SLOW") != "1", reason="slow (n14boot keys, ~1.4 GB, ~2 min): SLOTPLAN_SLOW=1")
def test_cins_plan_runs_on_lattigo(tmp_path: Path) -> None:
    res = cins_plan()
    plan_file, tables_file = tmp_path / "p.json", tmp_path / "t.npz"
    plan_file.write_text(json.dumps(res.plan))
    np.savez(tables_file, **dict(res.tables.items()))
    run = subprocess.run(
        [str(Path(sys.executable).parent / "slotplan"), "run", str(plan_file), "--tables", str(tables_file),
         "--backend", "lattigo", "--json"], capture_output=True, text=True, timeout=900,
    )
    assert run.returncode == 0, run.stderr[-2000:] + run.stdout[-2000:]
    check_run(json.loads(run.stdout), res.plan)


def check_run(rep: dict[str, Any], plan: dict[str, Any]) -> None:
    """What `slotplan run --json` reports against numpy and against the plan's claims."""
    assert rep["ok"]
    st = rep["stats"]
    prog = [ir.decode(r) for r in plan["program"]]
    # within 20 bits of numpy (max_rel_error: relative to the output's largest magnitude)
    assert rep["max_rel_error"] <= 2.0**-20, rep["max_rel_error"]
    # bootstraps: as many as the plan claims
    assert st["bootstraps"] == plan["summary"]["bootstraps"] == 3
    # levels: every bootstrap_cins reads its operand at the level the plan's depth gives
    # (the levels its predecessor's bootstrap gave back included), and EvalMod returns the
    # level the plan keeps (top + stoc_levels, or more: the executor drops the rest)
    assert st["bootstrap_input_levels"] == claimed_levels(prog)
    assert N14BOOT.boot is not None
    assert all(lv >= N14BOOT.boot.levels_after + N14BOOT.boot.stoc_levels for lv in st["cins_out_levels"])
    # rotations: the plan's claim (summary) is what the executor counts, kind by kind
    want = claimed_rotations(prog, plan["plaintexts"])
    assert {k: st[k] for k in want} == want
    assert st["rotations"] + st["cins_rotations"] + st["cins_fused_rotations"] == plan["summary"]["rotations"]
