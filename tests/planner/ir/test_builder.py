"""planner.ir.builder: programs the ProgramBuilder emits, simulated slot by slot, equal the
numpy evaluation of the same calls on random data; the builder's depth bookkeeping equals
the program's own (planner.ir.analysis.register_depths); plaintext and table bookkeeping
(shared constants, scaled copies, weight blocks, dropping) and the lazy tables mapping."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from backends.sim import simulate
from planner.ir.analysis import register_depths
from planner.ir.builder import LazyTables, ProgramBuilder, poly_depth

S = 32


def _identity(n: int, offset: int = 0) -> Any:
    def gen() -> tuple[np.ndarray, None]:
        idx = np.full(S, -1, dtype=np.int64)
        idx[:n] = np.arange(n) + offset
        return idx, None

    return gen


def _run(b: ProgramBuilder, outs: dict[str, str], values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Simulate the builder's program with each register in ``outs`` written to a tensor of
    S elements (slot s -> element s)."""
    for tensor, reg in outs.items():
        b.output(reg, tensor, f"out/{tensor}", lambda: (np.arange(S, dtype=np.int64), None))
    plan = {"params": {"slots": S, "log_q": [50] + [40] * 8}, "program": b.instrs,
            "plaintexts": {n: p.to_json() for n, p in b.plaintexts.items()},
            "outputs": {t: [S] for t in outs}}
    return simulate(plan, LazyTables(b.tables), values).outputs


@pytest.mark.parametrize("seed", range(6))
def test_random_programs_simulate_to_their_numpy_values(seed: int) -> None:
    """A random sequence of builder calls over two inputs and a weight: every register the
    builder returns holds what numpy computes for the same calls."""
    rng = np.random.default_rng(seed)
    x, y, w = rng.uniform(-1, 1, S), rng.uniform(-1, 1, S), rng.uniform(-1, 1, S)
    b = ProgramBuilder(S)
    want: dict[str, np.ndarray] = {b.input("x", "in/x", _identity(S)): x, b.input("y", "in/y", _identity(S)): y}
    pw = b.plaintext("w", "pt/w", _identity(S))
    for step in range(14):
        regs = sorted(want)
        a, c = (regs[int(i)] for i in rng.integers(0, len(regs), 2))
        op = int(rng.integers(0, 10))
        if op == 0:
            k = int(rng.integers(-S, 2 * S))
            r = b.rot(a, k)
            want[r] = np.roll(want[a], -k)
        elif op == 1:
            ks = [int(v) for v in rng.integers(-S, S, int(rng.integers(1, 5)))]
            got = b.rot_many(a, ks)
            assert set(got) == set(ks)
            for k, r in got.items():
                want[r] = np.roll(want[a], -k)
        elif op == 2:
            want[b.add(a, c)] = want[a] + want[c]
        elif op == 3:
            want[b.sub(a, c)] = want[a] - want[c]
        elif op == 4 and b.depth[a] + b.depth[c] < 4:
            want[b.rescale(b.cmul(a, c))] = want[a] * want[c]
        elif op == 5:
            want[b.rescale(b.pmul(a, pw))] = want[a] * w
        elif op == 6:
            want[b.padd(a, pw)] = want[a] + w
        elif op == 7:
            want[b.psub(a, pw)] = want[a] - w
        elif op == 8 and b.depth[a] < 4:
            coeffs = [float(v) for v in rng.uniform(-1, 1, 4)]
            want[b.poly(a, coeffs, poly_depth(coeffs))] = np.polynomial.polynomial.polyval(want[a], coeffs)
        elif op == 9:
            terms = [regs[int(i)] for i in rng.integers(0, len(regs), int(rng.integers(1, 6)))]
            want[b.add_many(terms)] = np.sum([want[t] for t in terms], axis=0)
        del step
    assert register_depths(b.instrs) == b.depth
    outs = {f"t{i}": r for i, r in enumerate(sorted(want))}
    got = _run(b, outs, {"x": x, "y": y, "w": w})
    for t, r in outs.items():
        np.testing.assert_allclose(got[t], want[r], rtol=1e-12, atol=1e-12, err_msg=r)


def test_rot_many_is_one_hoisted_instruction_and_maps_every_requested_offset() -> None:
    b = ProgramBuilder(S)
    x = b.input("x", "in/x", _identity(S))
    got = b.rot_many(x, [3, S + 3, 0, -1, 5])
    hoisted = [i for i in b.instrs if i["op"] == "rot_hoisted"]
    assert len(hoisted) == 1 and hoisted[0]["ks"] == [3, 5, S - 1]  # distinct, normalised, sorted
    assert got[0] == x and got[3] == got[S + 3]
    assert b.rot_many(x, [7])[7] != x and b.instrs[-1]["op"] == "rot"  # one offset: a plain rot
    assert b.rot(x, S) == x and b.rot_many(x, [0, S]) == {0: x, S: x}  # no instruction for 0
    assert b.instrs[-1]["op"] == "rot"


def test_depths_follow_the_instruction_rules() -> None:
    b = ProgramBuilder(S)
    x = b.input("x", "in/x", _identity(S))
    p = b.plaintext("w", "pt/w", _identity(S))
    m = b.pmul(x, p)
    assert b.depth[m] == 1 and b.depth[b.rescale(m)] == 1
    c = b.cmul(m, x)
    assert b.depth[c] == 2 and b.depth[b.add(c, x)] == 2 and b.depth[b.padd(x, p)] == 0
    assert b.depth[b.poly(x, [0.0, 1.0, 0.0, 1.0], 2)] == 2
    assert b.depth[b.bootstrap(c)] == 0
    assert b.depth[b.zero_like(c)] == 3
    assert register_depths(b.instrs) == b.depth


@pytest.mark.parametrize(("coeffs", "depth"), [
    ([1.0], 0), ([0.0, 1.0], 1), ([0.0, 0.0, 1.0], 2), ([1.0, 0.0, 0.0, 2.0], 2),
    ([0.0] * 4 + [1.0], 3), ([0.0] * 7 + [1.0], 3), ([0.0] * 8 + [1.0], 4), ([1.0, 2.0, 0.0, 0.0], 1),
])
def test_poly_depth_is_ceil_log2_of_degree_plus_one(coeffs: list[float], depth: int) -> None:
    assert poly_depth(coeffs) == depth


def test_zero_like_and_accumulate() -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, S)
    b = ProgramBuilder(S)
    r = b.input("x", "in/x", _identity(S))
    z = b.zero_like(r)
    assert b.accumulate(None, r) == r
    s = b.accumulate(r, b.rot(r, 1))
    got = _run(b, {"z": z, "s": s}, {"x": x})
    assert np.array_equal(got["z"], np.zeros(S))
    np.testing.assert_allclose(got["s"], x + np.roll(x, -1), rtol=1e-15)
    with pytest.raises(ValueError, match="add_many of nothing"):
        b.add_many([])


def test_plaintexts_constants_scaled_copies_and_blocks() -> None:
    """Identical constant keys share a plaintext; a scaled copy is made once per (plaintext,
    factor) and holds factor * values; a weight block reads its offset slice and is reused;
    dropping forgets the plaintexts, their tables and cache entries."""
    rng = np.random.default_rng(2)
    w = rng.uniform(-1, 1, 4 * S)
    b = ProgramBuilder(S, weight_blocks={"w": S})
    x = b.input("x", "in/x", _identity(S))
    c1 = b.const_plaintext(("half",), "pt/half", lambda: np.full(S, 0.5))
    assert b.const_plaintext(("half",), "pt/other", lambda: np.full(S, 9.0)) == c1
    pw = b.plaintext("w", "pt/w", _identity(S))
    assert b.plaintext("w", "pt/w", _identity(S)) == pw  # the same block: one plaintext
    assert b.plaintexts[pw].table == f"pt/w@{S}"

    def scale(s: float) -> Any:
        def wrap(gen: Any) -> Any:
            def scaled() -> tuple[np.ndarray, np.ndarray]:
                idx, coef = gen()
                return idx, (np.ones(S) if coef is None else coef) * s
            return scaled
        return wrap

    s3 = b.scaled_plaintext(pw, 3.0, scale(3.0))
    assert b.scaled_plaintext(pw, 3.0, scale(3.0)) == s3 and b.scaled_plaintext(pw, 2.0, scale(2.0)) != s3
    outs = {"half": b.pmul(x, c1), "block": b.pmul(x, pw), "scaled": b.pmul(x, s3)}
    xv = rng.uniform(-1, 1, S)
    got = _run(b, outs, {"x": xv, "w": w})
    np.testing.assert_allclose(got["half"], 0.5 * xv, rtol=1e-15)
    np.testing.assert_allclose(got["block"], w[S:2 * S] * xv, rtol=1e-15)
    np.testing.assert_allclose(got["scaled"], 3.0 * w[S:2 * S] * xv, rtol=1e-15)
    table = b.plaintexts[s3].table
    b.drop_plaintexts([s3, c1])
    assert s3 not in b.plaintexts and table not in b.tables and "pt/half" not in b.tables
    assert b.const_plaintext(("half",), "pt/half2", lambda: np.full(S, 0.5)) != c1  # cache forgotten
    with pytest.raises(ValueError, match="defined twice"):
        b.table("in/x", _identity(S))


def test_lazy_tables_mapping() -> None:
    calls: list[str] = []

    def gen(name: str, coef: bool) -> Any:
        def g() -> tuple[np.ndarray, np.ndarray | None]:
            calls.append(name)
            return np.arange(S, dtype=np.int64), (np.full(S, 2.0) if coef else None)
        return g

    b = ProgramBuilder(S)
    b.table("a", gen("a", False))
    b.table("b", gen("b", True))
    t = LazyTables(b.tables)
    assert not calls  # nothing materialised until read
    assert list(t) == ["a.idx", "b.idx", "b.coef"] and len(t) == 3
    assert "a.idx" in t and "a.coef" not in t and "b.coef" in t and "c.idx" not in t and 3 not in t
    assert np.array_equal(t["b.coef"], np.full(S, 2.0))
    n = len(calls)
    t["b.idx"]  # the most recent table is cached
    assert len(calls) == n
    for bad in ("a.coef", "c.idx", "a.foo"):
        with pytest.raises(KeyError):
            t[bad]
    assert t.table_names() == ["a", "b"]
