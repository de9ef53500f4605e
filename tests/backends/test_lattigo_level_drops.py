"""Level drops on Lattigo (planner.ir.analysis.level_drops, executor.dropLevel): a
bootstrapping plan at ``n14boot`` whose input and first bootstrap output keep more levels
than their segments use runs with them dropped, bootstraps at level 0, and gives numpy's
result (the simulator's too). ~3 GB and ~1 min: skipped without the extension or memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.lattigo_backend import available, go_plan_json, run_plan
from backends.sim import simulate
from planner import ir
from planner.frontend.params import preset
from tests.helpers import mem_available, pmul_chain

pytestmark = [
    pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)"),
    pytest.mark.skipif(mem_available() < 4 << 30, reason="a bootstrap at log N 14 needs ~3 GB of memory"),
]

P = preset("n14boot")
S = P.slots


def test_level_drops_n14boot(tmp_path: Path) -> None:
    import json

    a, xa = pmul_chain("x", 2, "a")  # the input's segment: 2 levels of 9
    b, xb = pmul_chain("b", 3, "b")  # the first bootstrap's: 3
    c, xc = pmul_chain("c", 1, "c")  # the last reaches the output: keeps its 9 levels
    prog: list[ir.Instr] = [ir.Input(dst="x", tensor="x", table="in/x"), *a, ir.LoadKey(block="boot"),
                            ir.Bootstrap(dst="b", src=xa), *b, ir.Bootstrap(dst="c", src=xb),
                            ir.DropKey(block="boot"), *c, ir.Output(src=xc, tensor="y", table="out/y")]
    plan: dict[str, Any] = {
        "schema": ir.PLAN_SCHEMA,
        "graph": {"name": "level-drops", "sha256": "0" * 64},
        "params": P.to_json(),
        "plaintexts": {"w": {"source": "w", "table": "pt/w"}},
        "program": ir.to_json_program(prog),
    }
    assert json.loads(go_plan_json(plan))["level_drops"] == {"0": 2, str(1 + len(a) + 1): 3}
    rng = np.random.default_rng(5)
    assert P.boot is not None
    x = rng.uniform(-1, 1, S) * P.boot.max_abs
    w = rng.uniform(0.7, 1.0, S)
    ident = np.arange(S, dtype=np.int64)
    tables = {"in/x.idx": ident, "pt/w.idx": ident, "out/y.idx": ident}
    want = x * w**6
    sim = simulate(plan, tables, {"x": x, "w": w})
    np.testing.assert_allclose(sim.outputs["y"].ravel(), want, rtol=1e-12, atol=1e-12)

    res = run_plan(plan, {"x": x}, {"w": w}, tables, key_dir=str(tmp_path / "keys"))
    err = float(np.max(np.abs(res.outputs["y"].ravel() - want)))
    assert err <= 1e-5 * max(1.0, float(np.max(np.abs(want)))), err
    st = res.stats
    assert st["level_drops"] == (P.max_level - 2) + (P.max_level - 3)
    assert st["bootstrap_input_levels"] == [0, 0]  # (without the drops: 7 and 6)
    assert [v.level for v in res.vectors] == [P.max_level - 1]
