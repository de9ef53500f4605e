"""The fused-block decision (planner.ir.fusion) and the plan's ``fused`` annotation
(planner.ir.fused_plan): which instructions form a block, what each block computes, the giant-
key rule, lone QP blocks under a key schedule, Q mode, the annotation's checks, and that the
Lattigo executor runs exactly the planner's blocks. Everything but the last tests runs
without Lattigo."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from backends.lattigo_backend import available
from common.errors import PlanFileError
from planner.frontend.graph import load_graph
from planner.frontend.params import load_params
from planner.ir.fused_plan import Block, annotate, fused_annotation, plan_key_levels, read_fused, with_fused
from planner.ir.fusion import fused_blocks, fused_counts
from planner.pipeline import PlanOptions, plan_graph
from tests.helpers import REPO_ROOT

SLOTS = 2048
WORKLOADS = REPO_ROOT / "data" / "workloads"


def inp(d: str = "x") -> dict[str, Any]:
    return {"op": "input", "dst": d, "tensor": d, "table": f"in/{d}"}


def out(s: str, t: str = "y") -> dict[str, Any]:
    return {"op": "output", "src": s, "tensor": t, "table": f"out/{t}"}


def rh(dsts: list[str], src: str, ks: list[int]) -> dict[str, Any]:
    return {"op": "rot_hoisted", "dsts": dsts, "src": src, "ks": ks}


def rot(d: str, s: str, k: int) -> dict[str, Any]:
    return {"op": "rot", "dst": d, "src": s, "k": k}


def pm(d: str, s: str, pt: str) -> dict[str, Any]:
    return {"op": "pmul", "dst": d, "src": s, "pt": pt}


def add(d: str, a: str, b: str) -> dict[str, Any]:
    return {"op": "add", "dst": d, "a": a, "b": b}


def rs(d: str, s: str) -> dict[str, Any]:
    return {"op": "rescale", "dst": d, "src": s}


def lk(k: int) -> dict[str, Any]:
    return {"op": "load_key", "k": k}


def dk(k: int | None = None, block: str | None = None) -> dict[str, Any]:
    return {"op": "drop_key", "block": block} if block else {"op": "drop_key", "k": k}


def plan_of(program: list[dict[str, Any]], fused: Any = None, keys: dict[str, Any] | None = None) -> dict[str, Any]:
    p: dict[str, Any] = {"schema": "slotplan.plan/1", "params": {"slots": SLOTS}, "program": program}
    if keys is not None:
        p["keys"] = keys
    if fused is not None:
        p["fused"] = fused
    return p


def blocks_of(program: list[dict[str, Any]], keys: dict[str, Any] | None = None) -> tuple[list[Block], list[int]]:
    """The planner's annotation of ``program``, read back as the executor reads it."""
    p = plan_of(program, keys=keys)
    annotate(p)
    return read_fused(p)


def terms(b: Block) -> list[tuple[str, int, int]]:
    return sorted((p.base, p.beta, p.giant) for p in b.products)


# --------------------------------------------------------------------------------------
# Which instructions form a block, and the forms


def bsgs() -> list[dict[str, Any]]:
    """y = rot_4(p0 x + p1 rot_1 x) + (p2 x + p3 rot_1 x)  (rescaled once per giant step... as one
    rescale at the end)."""
    return [inp(), rh(["b1"], "x", [1]),                                   # 0, 1
            pm("m0", "x", "p0"), pm("m1", "b1", "p1"), add("s0", "m0", "m1"),  # 2-4
            rot("g", "s0", 4),                                            # 5
            pm("m2", "x", "p2"), pm("m3", "b1", "p3"), add("s1", "m2", "m3"),  # 6-8
            add("s", "g", "s1"), rs("y", "s"), out("y")]                  # 9-11


def test_bsgs_block_is_one_block_with_its_giant_step_and_rescale() -> None:
    ann = fused_annotation(bsgs(), SLOTS)
    assert ann == {"blocks": [{"instrs": [2, 3, 4, 5, 6, 7, 8, 9, 10], "mode": "qp"}], "babies": [1]}
    (b,), babies = read_fused(plan_of(bsgs(), ann))
    assert babies == [1] and b.root == 10 and b.dst == "y" and b.rescaled and not b.qmode
    assert terms(b) == [("x", 0, 0), ("x", 0, 4), ("x", 1, 0), ("x", 1, 4)]
    assert b.giants == (4,)
    # the counts the time model prices are those of the same decision
    fc = fused_counts(bsgs(), SLOTS)
    assert (fc.blocks, fc.products, fc.giants, fc.babies, fc.block_rescales) == (1, 4, 1, 1, 1)


def test_a_value_read_twice_ends_the_form_there() -> None:
    prog = bsgs()
    prog.insert(11, out("s0", "z"))  # s0 now has a second reader: the giant step is no part of it
    (b1, b2), babies = blocks_of(prog)
    assert [b1.instrs, b2.instrs] == [(2, 3, 4), (6, 7, 8)]
    assert babies == [1] and not b1.rescaled and terms(b1) == [("x", 0, 0), ("x", 1, 0)]


def test_unrotated_single_product_is_no_block() -> None:
    assert fused_annotation([inp(), pm("y", "x", "p0"), out("y")], SLOTS) == {"blocks": [], "babies": []}
    # one product of a rotation is (rotated lazily inside it)
    ann = fused_annotation([inp(), rot("b", "x", 3), pm("y", "b", "p0"), out("y")], SLOTS)
    assert ann == {"blocks": [{"instrs": [2], "mode": "qp"}], "babies": [1]}


def test_two_hop_babies() -> None:
    """b3 = rot(b2, 1), b2 = rot(x, 2): the first hop runs (another rotation reads it), b3
    is rotated lazily from b2, b1 and b2 are multiplied as they are."""
    prog = [inp(), rh(["b1", "b2"], "x", [1, 2]), rot("b3", "b2", 1),
            pm("m0", "x", "p0"), pm("m1", "b1", "p1"), pm("m2", "b2", "p2"), pm("m3", "b3", "p3"),
            add("s0", "m0", "m1"), add("s1", "m2", "m3"), add("y", "s0", "s1"), out("y")]
    (b,), babies = blocks_of(prog)
    assert b.instrs == (3, 4, 5, 6, 7, 8, 9) and babies == [2]
    assert terms(b) == [("b1", 0, 0), ("b2", 0, 0), ("b2", 1, 0), ("x", 0, 0)]


# --------------------------------------------------------------------------------------
# Key schedules: the giant-key rule and lone QP blocks


def scheduled(after_baby: list[dict[str, Any]], after_giant: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [inp(), lk(1), lk(4), rh(["b1"], "x", [1]), *after_baby,
            pm("m1", "b1", "p1"), pm("m0", "x", "p0"), add("s0", "m0", "m1"), rot("g", "s0", 4), *after_giant,
            pm("m2", "x", "p2"), add("y", "g", "m2"), out("y")]


@pytest.mark.parametrize(("after_baby", "after_giant", "instrs"), [
    ([], [], [4, 5, 6, 7, 8, 9]),                                   # keys resident throughout
    ([lk(5), dk(5)], [], [6, 7, 8, 9, 10, 11]),                     # another key dropped inside
    ([dk(1)], [], [5, 6, 7, 8, 9, 10]),                             # the baby key dropped after its rotation
    ([], [dk(4)], [4, 5, 6]),                                       # the giant key dropped before the root
    ([], [dk(block="boot")], [4, 5, 6]),                            # the boot block dropped before the root
], ids=["resident", "other-key", "baby-key-dropped", "giant-key-dropped", "boot-dropped"])
def test_giant_key_rule(after_baby: list[dict[str, Any]], after_giant: list[dict[str, Any]], instrs: list[int]) -> None:
    """A giant rotation's key must stay resident until the block's root, where the block
    rotates; otherwise the block is fused giant step by giant step (its products fused, the
    giant rotation and the additions as written)."""
    ann = fused_annotation(scheduled(after_baby, after_giant), SLOTS)
    assert ann == {"blocks": [{"instrs": instrs, "mode": "qp"}], "babies": [3]}


@pytest.mark.parametrize(("level", "instrs"), [(4, [2, 3, 4, 5, 6]), (3, [2, 3, 4, 5])])
def test_giant_key_made_below_the_base_splits_the_block(level: int, instrs: list[int]) -> None:
    """A giant rotation after the rescale, with a key made a level below the base's babies,
    cannot run at the base's level in a block: the block ends at its rescale."""
    prog = [inp(), rh(["b1"], "x", [1]), pm("m1", "b1", "p1"), pm("m0", "x", "p0"), add("s0", "m0", "m1"),
            rs("s1", "s0"), rot("g", "s1", 4), out("g")]
    keys = {"1": {"level": 4}, "4": {"level": level}}
    ann = fused_annotation(prog, SLOTS, {1: 4, 4: level})
    assert ann == {"blocks": [{"instrs": instrs, "mode": "qp"}], "babies": [1]}
    p = plan_of(prog, keys=keys)
    assert annotate(p)["fused"] == ann  # the plan's "keys" give the levels


def test_lone_qp_blocks_dropped_under_a_key_schedule() -> None:
    head = [inp(), lk(1), rh(["b1"], "x", [1]), dk(1), pm("y1", "b1", "p0")]
    # two one-product blocks over one baby: Q mode (they share the baby); the unrotated
    # product is no block
    three = [*head, pm("y2", "b1", "p1"), pm("y3", "x", "p2"), out("y1", "y1"), out("y2", "y2"), out("y3", "y3")]
    assert fused_annotation(three, SLOTS) == {
        "blocks": [{"instrs": [4], "mode": "q"}, {"instrs": [5], "mode": "q"}], "babies": [2]}
    # a lone one-product block would pay two ModDowns in QP for the plan's one: as written
    lone = [*head, out("y1", "y1")]
    assert fused_annotation(lone, SLOTS) == {"blocks": [], "babies": []}
    # without a key schedule the same lone block is fused (in QP)
    free = [inp(), rh(["b1"], "x", [1]), pm("y1", "b1", "p0"), out("y1", "y1")]
    assert fused_annotation(free, SLOTS) == {"blocks": [{"instrs": [2], "mode": "qp"}], "babies": [1]}


def test_q_mode_when_blocks_outnumber_babies() -> None:
    """A base's giantless blocks run in Q when they outnumber the distinct babies they read;
    blocks with giant steps always run in QP."""
    def conv(n_out: int, ks: list[int]) -> list[dict[str, Any]]:
        prog = [inp(), rh([f"b{k}" for k in ks], "x", ks)]
        for o in range(n_out):
            prog += [pm(f"u{o}", f"b{ks[o % len(ks)]}", f"p{o}"), pm(f"v{o}", "x", f"q{o}"),
                     add(f"y{o}", f"u{o}", f"v{o}")]
        return prog + [out(f"y{o}", f"y{o}") for o in range(n_out)]

    many = fused_annotation(conv(3, [1, 2]), SLOTS)   # 3 blocks, 2 babies: Q
    assert [b["mode"] for b in many["blocks"]] == ["q"] * 3
    few = fused_annotation(conv(2, [1, 2]), SLOTS)    # 2 blocks, 2 babies: QP
    assert [b["mode"] for b in few["blocks"]] == ["qp"] * 2
    blocks, _ = read_fused(plan_of(conv(3, [1, 2]), many))
    assert all(b.qmode and not b.giants for b in blocks)
    # the time model sees the same modes
    fb, _ = fused_blocks(conv(3, [1, 2]), SLOTS)
    assert [b.qmode for b in fb] == [True] * 3
    # a giant step keeps a base's blocks in QP, however many
    assert all(b["mode"] == "qp" for b in fused_annotation(bsgs(), SLOTS)["blocks"])


# --------------------------------------------------------------------------------------
# Malformed annotations


GOOD = {"blocks": [{"instrs": [2, 3, 4, 5, 6, 7, 8, 9, 10], "mode": "qp"}], "babies": [1]}


@pytest.mark.parametrize(("fused", "field"), [
    ([1, 2], "'fused'"),
    ({"blocks": []}, "'fused.babies'"),
    ({"blocks": [], "babies": [], "extra": 1}, "'fused'"),
    ({"blocks": [{"instrs": [2, 3, 40], "mode": "qp"}], "babies": [1]}, "'fused.blocks[0].instrs[2]'"),
    ({"blocks": [{"instrs": [2, 3, True], "mode": "qp"}], "babies": [1]}, "'fused.blocks[0].instrs[2]'"),
    ({"blocks": [{"instrs": [2, 3, 4], "mode": "fast"}], "babies": [1]}, "'fused.blocks[0].mode'"),
    ({"blocks": [{"instrs": [2, 3, 4, 5, 6, 7, 8, 9, 10], "mode": "q"}], "babies": [1]}, "'fused.blocks[0].mode'"),
    ({"blocks": [{"instrs": [3, 2, 4], "mode": "qp"}], "babies": [1]}, "'fused.blocks[0].instrs[1]'"),
    ({"blocks": [{"instrs": [], "mode": "qp"}], "babies": []}, "'fused.blocks[0].instrs'"),
    ({"blocks": [{"instrs": [0, 2], "mode": "qp"}], "babies": []}, "'fused.blocks[0].instrs[0]'"),
    ({"blocks": [{"instrs": [2, 3, 4], "mode": "qp"}, {"instrs": [4], "mode": "qp"}], "babies": [1]},
     "'fused.blocks[1].instrs[0]'"),
    ({"blocks": [{"instrs": [2, 4], "mode": "qp"}], "babies": []}, "'fused.blocks[0].instrs[1]'"),
    ({"blocks": [{"instrs": [2, 3, 4, 6, 7, 8, 9, 10], "mode": "qp"}], "babies": [1]}, "'fused.blocks[0].instrs[2]'"),
    ({"blocks": [{"instrs": [2, 3, 4, 5, 6, 7, 8, 9, 10]}], "babies": [1]}, "'fused.blocks[0].mode'"),
    ({**GOOD, "babies": [2]}, "'fused.babies[0]'"),
    ({**GOOD, "babies": [1, 1]}, "'fused.babies[1]'"),
    ({"blocks": [], "babies": [1]}, "'fused.babies[0]'"),
    ({"blocks": [{**GOOD["blocks"][0], "babies_in_q": False}], "babies": [1]}, "'fused.blocks[0].babies_in_q'"),
    ({"blocks": [{**GOOD["blocks"][0], "babies_in_q": 1}], "babies": [1]}, "'fused.blocks[0].babies_in_q'"),
    ({"blocks": [{"instrs": [2, 3, 4, 5, 6, 7, 8, 9, 10], "mode": "q", "babies_in_q": True}], "babies": [1]},
     "'fused.blocks[0].babies_in_q'"),
], ids=lambda v: None)
def test_malformed_annotation_refused_naming_the_field(fused: Any, field: str) -> None:
    read_fused(plan_of(bsgs(), GOOD))  # the well-formed one passes
    with pytest.raises(PlanFileError) as e:
        read_fused(plan_of(bsgs(), fused))
    msg = str(e.value)
    assert f"plan field {field}" in msg and "\n" not in msg, msg
    with pytest.raises(PlanFileError):
        with_fused(plan_of(bsgs(), fused))  # what the Lattigo backend hands to Go


def test_rescale_states_must_agree() -> None:
    # m0 is rescaled on its way to the root, m1 is not: no block can say "rescaled once"
    prog = [inp(), pm("m0", "x", "p0"), rs("r0", "m0"), pm("m1", "x", "p1"), add("y", "r0", "m1"), out("y")]
    with pytest.raises(PlanFileError, match=r"fused.blocks\[0\].instrs'.*rescale state"):
        read_fused(plan_of(prog, {"blocks": [{"instrs": [1, 2, 3, 4], "mode": "qp"}], "babies": []}))
    assert fused_annotation(prog, SLOTS) == {"blocks": [], "babies": []}  # nor does the planner make one


def test_cli_refuses_a_malformed_annotation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from api.cli import main

    res = plan_graph(load_graph(WORKLOADS / "rotom" / "matmul_64.json"), load_params("n13"))
    plan = dict(res.plan)
    plan["fused"] = {"blocks": [{"instrs": [len(plan["program"]) + 5], "mode": "qp"}], "babies": []}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    old = sys.argv
    sys.argv = ["slotplan", "run", str(path), "--backend", "sim"]
    try:
        with pytest.raises(SystemExit) as e:
            main()
    finally:
        sys.argv = old
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2
    assert len(err.splitlines()) == 1 and "fused.blocks[0].instrs[0]" in err and "Traceback" not in err, err


# --------------------------------------------------------------------------------------
# Plans: the planner writes the annotation; a reader that ignores it runs the same program


def test_planner_writes_the_annotation_last_and_over_the_same_program() -> None:
    graph = load_graph(WORKLOADS / "conv1.json")
    res = plan_graph(graph, load_params("n13"))
    plan = res.plan
    assert list(plan)[-1] == "fused"
    assert plan["fused"] == fused_annotation(plan["program"], plan["params"]["slots"])
    blocks, _ = read_fused(plan)
    fb, _ = fused_blocks(plan["program"], plan["params"]["slots"])
    assert len(blocks) == len(fb) >= 1
    assert sorted((len(b.products), len(b.giants), b.qmode) for b in blocks) == \
        sorted((b.products, b.giants, b.qmode) for b in fb)


def test_key_schedule_decides_the_blocks_of_its_own_program() -> None:
    graph = load_graph(WORKLOADS / "rotom" / "matmul_64.json")
    params = load_params("n13")
    free = plan_graph(graph, params).plan
    cap = free["summary"]["peak_bytes"]["total"] * 3 // 4
    res = plan_graph(graph, params, PlanOptions(memory_cap_bytes=cap))
    plan = res.plan
    assert any(i["op"] == "drop_key" for i in plan["program"])
    assert plan["fused"] == fused_annotation(plan["program"], params.slots, plan_key_levels(plan))
    assert plan["fused"] != fused_annotation(free["program"], params.slots)  # not the unscheduled program's
    read_fused(plan)



def test_batched_plan_annotates_its_own_program() -> None:
    """A batched plan rewrites the small plan's rotation offsets: its blocks are decided on
    the batched program (not copied from the small plan's)."""
    from backends.lattigo_bench import mvm_graph

    plan = plan_graph(mvm_graph(64, 64), load_params("n13"), PlanOptions(batch=4)).plan
    assert list(plan)[-1] == "fused" and plan["fused"]["blocks"]
    assert plan["fused"] == fused_annotation(plan["program"], plan["params"]["slots"], plan_key_levels(plan))
    read_fused(plan)


def test_digests_do_not_depend_on_the_annotation() -> None:
    """Keys, ciphertext files and tables made for a plan written before the annotation
    existed stay valid for the same plan with it (the inference plan digest and the tables'
    digest leave it out)."""
    from backends.inference import inference_plan_digest
    from planner.ir.io import plan_digest

    plan = plan_graph(load_graph(WORKLOADS / "conv1.json"), load_params("n13")).plan
    old = {k: v for k, v in plan.items() if k != "fused"}
    assert plan["fused"]["blocks"]
    assert inference_plan_digest(plan) == inference_plan_digest(old)
    assert plan_digest(plan) == plan_digest(old)
    assert inference_plan_digest(plan) != inference_plan_digest({**old, "program": old["program"][:-1]})

# --------------------------------------------------------------------------------------
# Lattigo: the executor runs the planner's blocks


@pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)")
def test_lattigo_runs_the_planners_blocks() -> None:
    """conv1 at n13: the executor reports as many fused blocks (and Q-mode blocks) as the
    plan's annotation names, with or without the annotation in the file (the backend then
    adds the same one), none with fusion off, and every run matches numpy."""
    from dataclasses import replace

    from tests.helpers import bench_encrypted

    graph = load_graph(WORKLOADS / "conv1.json")
    res = plan_graph(graph, load_params("n13"))
    ann = res.plan["fused"]
    n_q = sum(1 for b in ann["blocks"] if b["mode"] == "q")
    assert ann["blocks"]
    stripped = replace(res, plan={k: v for k, v in res.plan.items() if k != "fused"})
    for r, opts, blocks, q in [(res, {}, len(ann["blocks"]), n_q), (stripped, {}, len(ann["blocks"]), n_q),
                               (res, {"no_fuse": True}, 0, 0)]:
        stats, errs = bench_encrypted(r, graph, {"repeat": 1, "workers": 2, **opts})
        assert (stats["fused_blocks"], stats["fused_q_blocks"]) == (blocks, q), (opts, stats["fused_blocks"])
        assert max(errs.values()) < 1e-4, errs
