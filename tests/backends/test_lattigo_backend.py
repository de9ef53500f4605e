"""Lattigo backend: hand-written plans run encrypted and compared with a numpy execution of
the same instruction semantics (SPEC section 4), plus key schedules, errors and sizes.

Test-size parameters (log_n 12, insecure) keep the file fast; one test uses the 128-bit
secure log_n 13 set. Skipped only when the gopy extension is not built (`make lattigo`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from backends.lattigo_backend import LattigoError, available, run_plan, run_raw, sizes, version

pytestmark = pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)")

P12: dict[str, Any] = {"log_n": 12, "slots": 2048, "log_q": [50, 40, 40, 40], "log_p": [50], "log_scale": 40}
P13: dict[str, Any] = {"log_n": 13, "slots": 4096, "log_q": [50, 40, 40, 40], "log_p": [48], "log_scale": 40}
MAX_REL = 1e-4


# --------------------------------------------------------------------------- numpy reference
def _pt_value(
    plan: Mapping[str, Any], name: str, weights: Mapping[str, np.ndarray], tables: Mapping[str, np.ndarray]
) -> np.ndarray:
    spec = plan["plaintexts"][name]
    idx = tables[spec["table"] + ".idx"]
    coef = tables.get(spec["table"] + ".coef", np.ones(idx.shape))
    if spec["source"] == "const":
        return np.asarray(coef, dtype=np.float64)
    flat = weights[spec["source"]].ravel()
    return coef * np.where(idx >= 0, flat[np.maximum(idx, 0)], 0.0)


def simulate(
    plan: Mapping[str, Any],
    inputs: Mapping[str, np.ndarray],
    weights: Mapping[str, np.ndarray],
    tables: Mapping[str, np.ndarray],
    output_shapes: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, np.ndarray]:
    """A tiny interpreter of SPEC section 4 on plain vectors."""
    regs: dict[str, np.ndarray] = {}
    writes: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for ins in plan["program"]:
        op = ins["op"]
        if op == "input":
            idx = tables[ins["table"] + ".idx"]
            flat = inputs[ins["tensor"]].ravel()
            regs[ins["dst"]] = np.where(idx >= 0, flat[np.maximum(idx, 0)], 0.0)
        elif op == "rot":
            regs[ins["dst"]] = np.roll(regs[ins["src"]], -ins["k"])
        elif op == "rot_hoisted":
            for dst, k in zip(ins["dsts"], ins["ks"], strict=True):
                regs[dst] = np.roll(regs[ins["src"]], -k)
        elif op in ("add", "sub", "cmul"):
            a, b = regs[ins["a"]], regs[ins["b"]]
            regs[ins["dst"]] = a + b if op == "add" else a - b if op == "sub" else a * b
        elif op in ("pmul", "padd", "psub"):
            x, p = regs[ins["src"]], _pt_value(plan, ins["pt"], weights, tables)
            regs[ins["dst"]] = x * p if op == "pmul" else x + p if op == "padd" else x - p
        elif op == "poly" and ins.get("basis") == "chebyshev":
            a, b = ins["domain"]
            t = (2 * regs[ins["src"]] - a - b) / (b - a)
            regs[ins["dst"]] = np.polynomial.chebyshev.chebval(t, ins["coeffs"]) + 0 * t
        elif op == "poly":
            x = regs[ins["src"]]
            regs[ins["dst"]] = sum(c * x**i for i, c in enumerate(ins["coeffs"])) + 0 * x
        elif op == "rescale":
            regs[ins["dst"]] = regs[ins["src"]].copy()
        elif op in ("load_key", "drop_key"):
            pass
        elif op == "output":
            writes.setdefault(ins["tensor"], []).append((tables[ins["table"] + ".idx"], regs[ins["src"]]))
        else:
            raise AssertionError(f"unknown op {op}")
    out = {}
    for tensor, parts in writes.items():
        shape = tuple(output_shapes[tensor]) if output_shapes and tensor in output_shapes else None
        size = int(np.prod(shape)) if shape else max(int(i.max()) + 1 for i, _ in parts)
        y = np.full(size, np.nan)
        for idx, v in parts:
            y[idx[idx >= 0]] = v[idx >= 0]
        out[tensor] = y.reshape(shape or (size,))
    return out


# --------------------------------------------------------------------------- helpers
def make_plan(
    program: Sequence[Any], plaintexts: dict[str, Any] | None = None, params: dict[str, Any] = P12
) -> dict[str, Any]:
    return {
        "schema": "slotplan.plan/1",
        "graph": {"name": "handwritten", "sha256": "0" * 64},
        "params": params,
        "plaintexts": plaintexts or {},
        "program": list(program),
    }


def scattered_idx(rng: np.random.Generator, slots: int, n: int) -> np.ndarray:
    """A layout with holes: the n elements land in random slots, the rest are -1."""
    idx = np.full(slots, -1, dtype=np.int64)
    idx[rng.choice(slots, size=n, replace=False)] = rng.permutation(n)
    return idx


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-12))


def check(
    plan: dict[str, Any],
    inputs: dict[str, np.ndarray],
    weights: dict[str, np.ndarray],
    tables: dict[str, np.ndarray],
    **kw: Any,
) -> Any:
    res = run_plan(plan, inputs, weights, tables, **kw)
    want = simulate(plan, inputs, weights, tables, kw.get("output_shapes"))
    assert set(res.outputs) == set(want)
    for name, w in want.items():
        assert res.outputs[name].shape == w.shape, name
        err = rel_err(res.outputs[name], w)
        assert err < MAX_REL, f"output {name}: relative error {err:.3g}"
    return res


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240611)


def base_tables(rng: np.random.Generator, slots: int = 2048, n: int = 2000) -> dict[str, np.ndarray]:
    return {
        "in/x.idx": scattered_idx(rng, slots, n),
        "in/z.idx": scattered_idx(rng, slots, n),
        "out/all.idx": np.arange(slots, dtype=np.int64),
    }


def outputs_all(regs: Sequence[str]) -> list[dict[str, Any]]:
    """One full-vector output tensor per register (tensor name = register name)."""
    return [{"op": "output", "src": r, "tensor": r, "table": "out/all"} for r in regs]


# --------------------------------------------------------------------------- tests
def test_available_and_version() -> None:
    assert available()
    assert "v6.1.1" in version()


def test_rotations_hoisting_add_sub(rng: np.random.Generator) -> None:
    tables = base_tables(rng)
    inputs = {"x": rng.uniform(-1, 1, (40, 50)), "z": rng.uniform(-1, 1, (40, 50))}
    program = [
        {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
        {"op": "input", "dst": "c1", "tensor": "z", "table": "in/z"},
        {"op": "rot", "dst": "c2", "src": "c0", "k": 1},
        {"op": "rot", "dst": "c3", "src": "c0", "k": 7},
        {"op": "rot", "dst": "c4", "src": "c0", "k": 1024},
        {"op": "rot", "dst": "c5", "src": "c0", "k": 2047},
        {"op": "rot_hoisted", "dsts": ["c6", "c7", "c8"], "src": "c1", "ks": [3, 64, 2047]},
        {"op": "add", "dst": "c9", "a": "c2", "b": "c6"},
        {"op": "sub", "dst": "c10", "a": "c3", "b": "c8"},
        {"op": "rot", "dst": "c11", "src": "c9", "k": 3},
    ]
    program += outputs_all(["c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9", "c10", "c11"])
    res = check(make_plan(program), inputs, {}, tables)
    st = res.stats
    assert st["rotations"] == 8
    assert st["rotation_keys"] == 6  # {1, 7, 1024, 2047, 3, 64}
    assert st["op_counts"]["rot"] == 5 and st["op_counts"]["rot_hoisted"] == 1
    assert st["key_mode"] == "keep_all" and st["key_loads"] == 6
    assert st["peak_resident_keys"] == 6
    assert st["peak_key_bytes"] == 6 * st["galois_key_bytes"]
    assert st["relin_key_bytes"] == 0  # no ciphertext multiplication: no relinearisation key
    assert all(v.level == 3 for v in res.vectors)
    for key in ("keygen_seconds", "eval_seconds", "total_seconds"):
        assert st[key] > 0
    assert set(st["op_seconds"]) == set(st["op_counts"])


def test_plaintext_ops_and_rescale_chain(rng: np.random.Generator) -> None:
    tables = base_tables(rng)
    tables.update(
        {
            "pt/w.idx": scattered_idx(rng, 2048, 2000),
            "pt/w.coef": rng.uniform(-2, 2, 2048),
            "pt/w2.idx": scattered_idx(rng, 2048, 2000),
            "pt/mask.idx": np.full(2048, -1, dtype=np.int64),
            "pt/mask.coef": (rng.uniform(size=2048) < 0.5).astype(np.float64),
        }
    )
    plaintexts = {
        "p0": {"source": "w", "table": "pt/w"},
        "p1": {"source": "const", "table": "pt/mask"},
        "p2": {"source": "w", "table": "pt/w2"},
    }
    inputs = {"x": rng.uniform(-1, 1, 2000)}
    weights = {"w": rng.uniform(-1, 1, 2000)}
    program = [
        {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
        {"op": "pmul", "dst": "c1", "src": "c0", "pt": "p0"},
        {"op": "rescale", "dst": "c2", "src": "c1"},
        {"op": "rot", "dst": "c3", "src": "c2", "k": 5},
        {"op": "pmul", "dst": "c4", "src": "c3", "pt": "p1"},
        {"op": "rescale", "dst": "c5", "src": "c4"},
        {"op": "padd", "dst": "c6", "src": "c5", "pt": "p2"},
        {"op": "psub", "dst": "c7", "src": "c6", "pt": "p0"},
        {"op": "pmul", "dst": "c8", "src": "c7", "pt": "p2"},
        {"op": "rescale", "dst": "c9", "src": "c8"},
        {"op": "add", "dst": "c10", "a": "c9", "b": "c0"},  # level 0 + level 3
    ]
    program += outputs_all(["c2", "c6", "c9", "c10"])
    res = check(make_plan(program, plaintexts), inputs, weights, tables)
    assert [v.level for v in res.vectors] == [2, 1, 0, 0]
    # pmul plaintexts are encoded at scale q_level, so each rescale restores 2^40 exactly.
    assert all(v.log2_scale == 40.0 for v in res.vectors)
    assert res.stats["op_counts"].get("auto_rescale", 0) == 0
    assert res.stats["skipped_rescales"] == 0


def test_lazy_and_missing_rescales(rng: np.random.Generator) -> None:
    """Products summed before one rescale; and a plan with no rescale at all."""
    tables = base_tables(rng)
    tables.update({"pt/a.idx": scattered_idx(rng, 2048, 2000), "pt/b.idx": scattered_idx(rng, 2048, 2000)})
    plaintexts = {"pa": {"source": "w", "table": "pt/a"}, "pb": {"source": "w", "table": "pt/b"}}
    inputs = {"x": rng.uniform(-1, 1, 2000)}
    weights = {"w": rng.uniform(-1, 1, 2000)}
    program = [
        {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
        {"op": "rot", "dst": "c1", "src": "c0", "k": 9},
        {"op": "pmul", "dst": "c2", "src": "c0", "pt": "pa"},
        {"op": "pmul", "dst": "c3", "src": "c1", "pt": "pb"},
        {"op": "add", "dst": "c4", "a": "c2", "b": "c3"},  # equal scales: no rescale yet
        {"op": "rescale", "dst": "c5", "src": "c4"},
        # No rescale from here on: the backend rescales before the next multiplication
        # and before adding an unrescaled product to a fresh ciphertext.
        {"op": "pmul", "dst": "c6", "src": "c5", "pt": "pa"},
        {"op": "pmul", "dst": "c7", "src": "c6", "pt": "pb"},
        {"op": "add", "dst": "c8", "a": "c7", "b": "c0"},
        {"op": "padd", "dst": "c9", "src": "c6", "pt": "pb"},
        {"op": "rescale", "dst": "c10", "src": "c0"},  # nothing to rescale: value passes through
    ]
    program += outputs_all(["c5", "c8", "c9", "c10"])
    res = check(make_plan(program, plaintexts), inputs, weights, tables)
    st = res.stats
    assert st["op_counts"]["auto_rescale"] == 2  # c6 before pmul c7; c7 before add c8
    assert st["skipped_rescales"] == 1
    assert [v.level for v in res.vectors] == [2, 0, 1, 3]


def test_cmul_and_poly(rng: np.random.Generator) -> None:
    tables = base_tables(rng)
    inputs = {"x": rng.uniform(-1, 1, 2000), "z": rng.uniform(-1, 1, 2000)}
    program = [
        {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
        {"op": "input", "dst": "c1", "tensor": "z", "table": "in/z"},
        {"op": "cmul", "dst": "c2", "a": "c0", "b": "c1"},
        {"op": "rescale", "dst": "c3", "src": "c2"},
        {"op": "poly", "dst": "c4", "src": "c3", "coeffs": [0.1, -0.5, 0.3]},  # degree 2: 2 levels
        {"op": "poly", "dst": "c5", "src": "c0", "coeffs": [0.2, 1.0, -0.4, 0.25]},  # degree 3: 2 levels
        {"op": "cmul", "dst": "c6", "a": "c5", "b": "c1"},  # levels 1 and 3
        {"op": "rescale", "dst": "c7", "src": "c6"},
        {"op": "poly", "dst": "c8", "src": "c1", "coeffs": [0.5]},  # constant
        {"op": "poly", "dst": "c9", "src": "c1", "coeffs": [0.1, 2.0, 0.0]},  # degree 1 after trimming
        {"op": "add", "dst": "c10", "a": "c4", "b": "c7"},
        {"op": "cmul", "dst": "c11", "a": "c1", "b": "c1"},  # square, never rescaled explicitly
        {"op": "sub", "dst": "c12", "a": "c11", "b": "c9"},
    ]
    program += outputs_all(["c3", "c4", "c5", "c7", "c8", "c9", "c10", "c12"])
    res = check(make_plan(program), inputs, {}, tables)
    levels = {v.tensor: v.level for v in res.vectors}
    assert levels == {"c3": 2, "c4": 0, "c5": 1, "c7": 0, "c8": 3, "c9": 2, "c10": 0, "c12": 2}
    assert res.stats["relin_key_bytes"] > 0
    assert res.stats["op_counts"]["poly"] == 4 and res.stats["op_counts"]["cmul"] == 3


def test_square_activation_meets_its_shortcut_at_an_exact_scale(rng: np.random.Generator) -> None:
    """A folded quadratic activation (planner/assign/candidates.py quadratic_scale): y = s x by
    a plaintext product, y (y + b) + c in one level, added to the shortcut x two levels up.
    The square's scale is 2^80 / q (up to 2^-16 from 2^40); the executor brings the
    shortcut to that scale exactly (scale_sets) instead of relabelling (max_scale_fix)."""
    tables = base_tables(rng)
    tables.update({"pt/s.idx": np.full(2048, -1, dtype=np.int64), "pt/s.coef": np.full(2048, 0.125**0.5),
                   "pt/b.idx": np.full(2048, -1, dtype=np.int64), "pt/b.coef": np.full(2048, 0.5 / 0.125**0.5),
                   "pt/c.idx": np.full(2048, -1, dtype=np.int64), "pt/c.coef": np.full(2048, 0.1)})
    plaintexts = {n: {"source": "const", "table": f"pt/{n}"} for n in ("s", "b", "c")}
    inputs = {"x": rng.uniform(-2, 2, 2000)}
    program = [
        {"op": "input", "dst": "x", "tensor": "x", "table": "in/x"},
        {"op": "pmul", "dst": "y0", "src": "x", "pt": "s"},
        {"op": "rescale", "dst": "y", "src": "y0"},
        {"op": "padd", "dst": "t", "src": "y", "pt": "b"},
        {"op": "cmul", "dst": "q0", "a": "y", "b": "t"},
        {"op": "rescale", "dst": "q1", "src": "q0"},
        {"op": "padd", "dst": "q", "src": "q1", "pt": "c"},
        {"op": "add", "dst": "r", "a": "q", "b": "x"},
    ]
    program += outputs_all(["q", "r"])
    res = check(make_plan(program, plaintexts), inputs, {}, tables)
    x = np.full(2048, np.nan)
    idx = tables["in/x.idx"]
    x = np.where(idx >= 0, inputs["x"][np.maximum(idx, 0)], 0.0)
    want = 0.125 * x * x + 0.5 * x + 0.1
    assert rel_err(res.outputs["q"], want) < 1e-7
    assert rel_err(res.outputs["r"], want + x) < 1e-7
    assert res.stats["scale_sets"] == 1 and res.stats["max_scale_fix"] == 0.0
    assert [v.level for v in res.vectors] == [1, 1]


def test_chebyshev_poly(rng: np.random.Generator) -> None:
    """Chebyshev series through Lattigo's evaluator in the Chebyshev basis: over [-1, 1]
    ceil(log2(d + 1)) levels; over another domain one more (the change of variable)."""
    tables = base_tables(rng)
    inputs = {"x": rng.uniform(-1, 1, 2000), "z": rng.uniform(-3, 2, 2000)}
    cheb7 = [0.1, 0.9, -0.3, 0.2, 0.05, -0.1, 0.03, 0.02]
    program = [
        {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
        {"op": "input", "dst": "c1", "tensor": "z", "table": "in/z"},
        {"op": "poly", "dst": "c2", "src": "c0", "coeffs": cheb7, "basis": "chebyshev", "domain": [-1.0, 1.0]},
        {"op": "poly", "dst": "c3", "src": "c1", "coeffs": [0.5, -1.0, 0.25, 0.125], "basis": "chebyshev",
         "domain": [-3.0, 2.0]},
        {"op": "poly", "dst": "c4", "src": "c1", "coeffs": [0.75], "basis": "chebyshev", "domain": [-3.0, 2.0]},
    ]
    program += outputs_all(["c2", "c3", "c4"])
    res = check(make_plan(program), inputs, {}, tables)
    levels = {v.tensor: v.level for v in res.vectors}
    assert levels == {"c2": 0, "c3": 0, "c4": 3}
    # a domain that needs more levels than there are is refused, naming the register
    deep = [*program[:2], {"op": "poly", "dst": "c5", "src": "c1", "coeffs": cheb7, "basis": "chebyshev",
                           "domain": [-3.0, 2.0]}, *outputs_all(["c5"])]
    with pytest.raises(LattigoError, match="c1"):
        run_plan(make_plan(deep), inputs, {}, tables)


def test_key_schedule(rng: np.random.Generator, tmp_path: Any) -> None:
    tables = base_tables(rng)
    inputs = {"x": rng.uniform(-1, 1, 2000)}
    program = [
        {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
        {"op": "load_key", "k": 1},
        {"op": "load_key", "k": 5},
        {"op": "rot", "dst": "c1", "src": "c0", "k": 1},
        {"op": "drop_key", "k": 1},
        {"op": "rot", "dst": "c2", "src": "c0", "k": 5},
        {"op": "load_key", "k": 9},
        {"op": "rot_hoisted", "dsts": ["c3", "c4"], "src": "c1", "ks": [5, 9]},
        {"op": "drop_key", "k": 5},
        {"op": "drop_key", "k": 9},
        {"op": "load_key", "k": 1},
        {"op": "rot", "dst": "c5", "src": "c4", "k": 1},
        {"op": "drop_key", "k": 1},
        {"op": "add", "dst": "c6", "a": "c2", "b": "c5"},
    ]
    program += outputs_all(["c3", "c6"])
    key_dir = tmp_path / "keys"
    res = check(make_plan(program), inputs, {}, tables, key_dir=str(key_dir))
    st = res.stats
    assert st["key_mode"] == "scheduled"
    assert st["key_loads"] == 4 and st["op_counts"]["load_key"] == 4
    assert st["rotation_keys"] == 3
    assert st["peak_resident_keys"] == 2
    assert st["peak_key_bytes"] == 2 * st["galois_key_bytes"]
    assert st["galois_key_bytes"] == sizes(P12)["galois_key_bytes"][3]
    # The client wrote only the plan's rotation keys (no secret key, no relinearisation key).
    assert sorted(os.listdir(key_dir)) == ["manifest.json", "rot_1.key", "rot_5.key", "rot_9.key"]
    manifest = json.loads((key_dir / "manifest.json").read_text())
    assert {r["k"] for r in manifest["rotations"]} == {1, 5, 9}


def test_rotation_without_resident_key(rng: np.random.Generator) -> None:
    tables = base_tables(rng)
    program = [
        {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
        {"op": "load_key", "k": 32},
        {"op": "rot", "dst": "c1", "src": "c0", "k": 32},
        {"op": "drop_key", "k": 32},
        {"op": "rot", "dst": "c2", "src": "c1", "k": 32},
        {"op": "output", "src": "c2", "tensor": "y", "table": "out/all"},
    ]
    # refused before Lattigo as bad input (issue 38: exit 2, a PlanFileError), same message
    from common.errors import PlanFileError

    with pytest.raises(PlanFileError, match=r"instruction 4 \(rot\): no key for k=32 resident"):
        run_plan(make_plan(program), {"x": np.ones(2000)}, {}, tables)


def test_key_level_below_ciphertext(rng: np.random.Generator) -> None:
    tables = base_tables(rng)
    tables.update({"pt/one.idx": np.full(2048, -1, dtype=np.int64)})  # const, coef defaults to 1
    plaintexts = {"one": {"source": "const", "table": "pt/one"}}
    inputs = {"x": rng.uniform(-1, 1, 2000)}
    top = [
        {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
        {"op": "rot", "dst": "c1", "src": "c0", "k": 3},
        {"op": "output", "src": "c1", "tensor": "y", "table": "out/all"},
    ]
    msg = r"instruction 1 \(rot\): rotation key k=3 was generated at level 1, below the ciphertext's level 3"
    with pytest.raises(LattigoError, match=msg):
        run_plan(make_plan(top, plaintexts), inputs, {}, tables, key_level=1)
    low = [
        {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
        {"op": "pmul", "dst": "c1", "src": "c0", "pt": "one"},
        {"op": "rescale", "dst": "c2", "src": "c1"},
        {"op": "pmul", "dst": "c3", "src": "c2", "pt": "one"},
        {"op": "rescale", "dst": "c4", "src": "c3"},
        {"op": "rot", "dst": "c5", "src": "c4", "k": 3},
        {"op": "output", "src": "c5", "tensor": "y", "table": "out/all"},
    ]
    res = check(make_plan(low, plaintexts), inputs, {}, tables, key_level=1)
    table = sizes(P12)["galois_key_bytes"]
    assert res.stats["galois_key_bytes"] == table[1] < table[3]


def test_output_scatter_across_ciphertexts(rng: np.random.Generator) -> None:
    """A (3, 1000) tensor spans two ciphertexts; one part is written twice (duplicates agree)."""
    idx0 = np.arange(2048, dtype=np.int64)
    idx1 = np.full(2048, -1, dtype=np.int64)
    idx1[:952] = np.arange(2048, 3000)
    tables: dict[str, np.ndarray] = {
        "in/x/0.idx": idx0,
        "in/x/1.idx": idx1,
        "out/y/0.idx": idx0,
        "out/y/1.idx": idx1,
    }
    tables["pt/c.idx"] = np.full(2048, -1, dtype=np.int64)
    tables["pt/c.coef"] = rng.uniform(-1, 1, 2048)
    plaintexts = {"c": {"source": "const", "table": "pt/c"}}
    inputs = {"x": rng.uniform(-1, 1, (3, 1000))}
    program = [
        {"op": "input", "dst": "a", "tensor": "x", "table": "in/x/0"},
        {"op": "input", "dst": "b", "tensor": "x", "table": "in/x/1"},
        {"op": "padd", "dst": "a1", "src": "a", "pt": "c"},
        {"op": "padd", "dst": "b1", "src": "b", "pt": "c"},
        {"op": "output", "src": "a1", "tensor": "y", "table": "out/y/0"},
        {"op": "output", "src": "b1", "tensor": "y", "table": "out/y/1"},
        {"op": "output", "src": "a1", "tensor": "y", "table": "out/y/0"},
    ]
    res = check(make_plan(program, plaintexts), inputs, {}, tables, output_shapes={"y": (3, 1000)})
    assert res.outputs["y"].shape == (3, 1000)
    assert len(res.vectors) == 3
    with pytest.raises(LattigoError, match="elements are written by no output instruction"):
        run_plan(make_plan(program[:5], plaintexts), inputs, {}, tables, output_shapes={"y": (3, 1000)})


def test_secure_log_n_13(rng: np.random.Generator) -> None:
    tables = base_tables(rng, slots=4096, n=4000)
    tables.update({"pt/w.idx": scattered_idx(rng, 4096, 4000)})
    plaintexts = {"p": {"source": "w", "table": "pt/w"}}
    inputs = {"x": rng.uniform(-1, 1, (4, 1000))}
    weights = {"w": rng.uniform(-1, 1, 4000)}
    program = [
        {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
        {"op": "rot_hoisted", "dsts": ["c1", "c2"], "src": "c0", "ks": [1, 4095]},
        {"op": "add", "dst": "c3", "a": "c1", "b": "c2"},
        {"op": "pmul", "dst": "c4", "src": "c3", "pt": "p"},
        {"op": "rescale", "dst": "c5", "src": "c4"},
        {"op": "poly", "dst": "c6", "src": "c5", "coeffs": [0.0, 1.0, 0.5]},
    ]
    program += outputs_all(["c6"])
    res = check(make_plan(program, plaintexts, P13), inputs, weights, tables)
    st = res.stats
    assert st["slots"] == 4096 and res.vectors[0].level == 0
    assert st["galois_key_bytes"] == sizes(P13)["galois_key_bytes"][3]


def test_sizes_match_formulas() -> None:
    s = sizes(P13)
    n, n_q, n_p = 1 << 13, 4, 1
    assert s["slots"] == 4096 and s["max_level"] == 3 and len(s["q"]) == n_q
    for level in range(4):
        assert (
            abs(s["ciphertext_bytes"][level] - 2 * (level + 1) * n * 8) < 0.01 * s["ciphertext_bytes"][level]
        )
    dnum = -(-n_q // n_p)
    key = dnum * 2 * (n_q + n_p) * n * 8
    assert abs(s["galois_key_bytes"][3] - key) < 0.01 * key


def test_errors_are_lattigo_errors(rng: np.random.Generator) -> None:
    tables = base_tables(rng)
    x = {"x": np.ones(2000)}
    # Malformed plan JSON and a Go panic both come back as LattigoError (and the process lives on).
    with pytest.raises(LattigoError, match="not valid JSON"):
        run_raw('{"schema": "slotplan.plan/1", "params": ', b"", b"")
    with pytest.raises(LattigoError, match="Go panic"):
        run_raw("{}", b"", b"", {"debug_panic": True})
    bad: list[tuple[list[dict[str, Any]], str]] = [
        (
            [
                {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
                {"op": "frobnicate", "dst": "c1", "src": "c0"},
            ],
            r"instruction 1 \(frobnicate\): unknown op",
        ),
        (
            [
                {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
                {"op": "rot", "dst": "c1", "src": "c9", "k": 1},
            ],
            r"instruction 1 \(rot\): reads register \"c9\" before it is written",
        ),
        (
            [
                {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
                {"op": "rot", "dst": "c1", "src": "c0", "k": 0},
            ],
            r"instruction 1 \(rot\): rotation offset k=0 outside 1\.\.2047",
        ),
        (
            [{"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"}]
            + [{"op": "cmul", "dst": f"c{i + 1}", "a": f"c{i}", "b": f"c{i}"} for i in range(4)],
            r"instruction 4 \(cmul\): register \"c3\" is at level 0 but this multiplication needs 1 level",
        ),
    ]
    for program, msg in bad:
        with pytest.raises(LattigoError, match=msg):
            run_plan(make_plan(program), x, {}, tables)
    with pytest.raises(LattigoError, match="weight tensor 'w' was not given"):
        run_plan(make_plan([], {"p": {"source": "w", "table": "in/x"}}), x, {}, tables)
    with pytest.raises(LattigoError, match="Lattigo rejects"):
        run_plan(make_plan([], params={**P12, "log_q": [50, 70]}), x, {}, tables)
    with pytest.raises(LattigoError, match="schema"):
        run_plan({**make_plan([]), "schema": "slotplan.plan/0"}, x, {}, tables)


def test_capped_schedule_keys_by_level_measured_within_model() -> None:
    """A memory-capped plan records each key's level; the client generates keys at those
    levels, the store's measured peak key bytes match the model within 5% and stay under
    the cap, and the result equals numpy to CKKS precision."""
    from backends.runner import run_plan as run_and_compare
    from planner.frontend.graph import parse_graph
    from planner.frontend.params import load_params
    from planner.keys.schedule import schedule_plan
    from planner.pipeline import PlanOptions, plan_graph

    # two layers: the second one's rotations run a level (or more) below the top
    g = parse_graph({
        "schema": "slotplan.graph/1", "name": "mlp2",
        "tensors": {"x": {"shape": [200], "role": "input"}, "W1": {"shape": [96, 200], "role": "weight"},
                    "W2": {"shape": [40, 96], "role": "weight"}},
        "nodes": [{"id": "h", "op": "matvec", "inputs": ["W1", "x"]},
                  {"id": "a", "op": "poly", "inputs": ["h"], "coeffs": [0.1, 0.5, 0.25]},
                  {"id": "y", "op": "matvec", "inputs": ["W2", "a"]}],
        "outputs": ["y"],
    })
    res = plan_graph(g, load_params("n14"), PlanOptions(kernels=("imra", "elementwise")))
    _, sched = schedule_plan(res.plan, None, "belady")
    cap = sched.min_cap_bytes + (res.plan["summary"]["peak_bytes"]["total"] - sched.min_cap_bytes) // 4
    plan, _ = schedule_plan(res.plan, cap, "exact", time_limit_s=10.0)
    levels = {int(k): v["level"] for k, v in plan["keys"].items()}
    assert len(set(levels.values())) > 1  # some keys live below the top level
    rep = run_and_compare(plan, res.tables, "lattigo", seed=2)
    assert rep.ok, rep.max_rel_error
    model = plan["summary"]["peak_bytes"]["keys"]
    measured = rep.stats["peak_key_bytes"]
    assert abs(measured - model) <= 0.05 * model, (measured, model)
    assert measured <= cap and plan["summary"]["peak_bytes"]["total"] <= cap


def test_plaintexts_through_a_file(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above PLAINTEXT_INLINE_BYTES the plaintext vectors go to Go through a file, read one
    at a time: same results as packed in memory."""
    import backends.lattigo_backend as lb

    tables = base_tables(rng)
    program = [
        {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
        {"op": "pmul", "dst": "c1", "src": "c0", "pt": "p0"},
        {"op": "padd", "dst": "c2", "src": "c1", "pt": "p1"},
        {"op": "output", "src": "c2", "tensor": "y", "table": "out/all"},
    ]
    plan = make_plan(program, {"p0": {"source": "w", "table": "pt/w"}, "p1": {"source": "const", "table": "pt/c"}})
    tables = dict(tables) | {"pt/w.idx": np.arange(2048), "pt/c.idx": np.full(2048, -1), "pt/c.coef": rng.normal(size=2048)}
    inputs, weights = {"x": rng.uniform(-1, 1, 2000)}, {"w": rng.uniform(-1, 1, 4096)}
    inline = run_plan(plan, inputs, weights, tables)
    monkeypatch.setattr(lb, "PLAINTEXT_INLINE_BYTES", 0)
    filed = run_plan(plan, inputs, weights, tables)
    np.testing.assert_allclose(filed.outputs["y"], inline.outputs["y"], atol=1e-6)
    want = simulate(plan, inputs, weights, tables)["y"]
    np.testing.assert_allclose(filed.outputs["y"].ravel()[: want.size], want.ravel(), atol=1e-5)
