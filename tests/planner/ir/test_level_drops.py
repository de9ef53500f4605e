"""planner.ir.analysis.level_drops: the levels a bootstrapping plan's fresh values keep
unused, dropped by the Lattigo executor (docs/lattigo.md, "Level drops")."""

from __future__ import annotations

from planner import ir
from planner.ir.analysis import level_drops, register_depths
from tests.helpers import pmul_chain

TOP = 9


def test_fresh_values_drop_to_what_their_segment_needs() -> None:
    a, x1 = pmul_chain("x", 2, "a")  # 2 levels, then a bootstrap: the input keeps 2 of 9
    b, x2 = pmul_chain("b", 3, "b")  # 3 levels, then a bootstrap: b keeps 3
    c, x3 = pmul_chain("c", 1, "c")  # the last segment reaches the output: keeps its levels
    prog: list[ir.Instr] = [ir.Input(dst="x", tensor="x", table="in/x"), *a,
                            ir.Bootstrap(dst="b", src=x1), *b,
                            ir.Bootstrap(dst="c", src=x2), *c,
                            ir.Output(src=x3, tensor="y", table="out/y")]
    drops = level_drops(prog, TOP)
    assert drops == {0: 2, 1 + len(a): 3}
    depth = register_depths(prog, drops, TOP)
    assert TOP - depth[x1] == 0 and TOP - depth[x2] == 0  # bootstraps now take level 0
    assert TOP - depth[x3] == TOP - 1  # the output's level as written


def test_a_branch_to_the_output_keeps_its_levels() -> None:
    a, x1 = pmul_chain("x", 2, "a")
    prog: list[ir.Instr] = [ir.Input(dst="x", tensor="x", table="in/x"), *a,
                            ir.Bootstrap(dst="b", src=x1),
                            ir.Add(dst="y", a="b", b=x1),  # x's chain also reaches the output
                            ir.Output(src="y", tensor="y", table="out/y")]
    assert level_drops(prog, TOP) == {}


def test_the_deepest_consumer_decides() -> None:
    a, xa = pmul_chain("x", 1, "a")
    b, xb = pmul_chain("x", 4, "b")  # two consumers of x: 1 and 4 levels before their bootstraps
    prog: list[ir.Instr] = [ir.Input(dst="x", tensor="x", table="in/x"), *a, *b,
                            ir.Bootstrap(dst="p", src=xa), ir.Bootstrap(dst="q", src=xb),
                            ir.Add(dst="y", a="p", b="q"), ir.Output(src="y", tensor="y", table="out/y")]
    assert level_drops(prog, TOP) == {0: 4}


def test_no_bootstrap_no_drop() -> None:
    a, x1 = pmul_chain("x", 2, "a")
    prog: list[ir.Instr] = [ir.Input(dst="x", tensor="x", table="in/x"), *a,
                            ir.Output(src=x1, tensor="y", table="out/y")]
    assert level_drops(prog, TOP) == {}


def test_a_halves_bootstrap_keeps_one_level_for_its_mask() -> None:
    """A halves bootstrap multiplies its source by a complex mask first (one level), so the
    segment before it keeps one more level than its products use; a plain sparse or
    full-slot bootstrap takes its source at level 0."""
    a, x1 = pmul_chain("x", 2, "a")
    b, x2 = pmul_chain("b", 3, "b")
    c, x3 = pmul_chain("c", 1, "c")
    prog: list[ir.Instr] = [ir.Input(dst="x", tensor="x", table="in/x"), *a,
                            ir.Bootstrap(dst="b", src=x1, log_slots=3, halves=True), *b,
                            ir.Bootstrap(dst="c", src=x2, log_slots=3), *c,
                            ir.Output(src=x3, tensor="y", table="out/y")]
    drops = level_drops(prog, TOP)
    assert drops == {0: 3}  # the input keeps 2 + 1 levels; sparse outputs are not dropped
    depth = register_depths(prog, drops, TOP)
    assert TOP - depth[x1] == 1
