"""``slotplan run PLAN --inputs X.npz --weights W.npz --out Y.npz`` (SPEC section 5): the
user's tensors by name (any shape with the tensor's number of elements), outputs written
by name, the reference still compared; bad files refused with one line naming the tensor
(exit 2)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from planner.frontend.graph import parse_graph
from planner.frontend.reference import reference

Cli = Callable[..., tuple[int, str, str]]

GRAPH = {
    "schema": "slotplan.graph/1", "name": "mlp-bias",
    "tensors": {"x": {"shape": [8], "role": "input"}, "W": {"shape": [4, 8], "role": "weight"},
                "b": {"shape": [4], "role": "weight"}, "s": {"shape": [1], "role": "weight"}},
    "nodes": [{"id": "h", "op": "matvec", "inputs": ["W", "x"]},
              {"id": "z", "op": "add", "inputs": ["h", "b"]},
              {"id": "y", "op": "poly", "inputs": ["z"], "coeffs": [0.0, 0.5, 0.125],
               "basis": "chebyshev", "domain": [-4.0, 4.0]},
              {"id": "t", "op": "mul", "inputs": ["y", "s"]}],
    "outputs": ["t", "z"],
}


def _save(path: Path, **arrays: np.ndarray) -> Path:
    with path.open("wb") as fh:
        np.savez(fh, **arrays)
    return path


@pytest.fixture
def planned(tmp_path: Path, cli: Cli) -> tuple[Path, Path]:
    g = tmp_path / "g.json"
    g.write_text(json.dumps(GRAPH))
    plan, tables = tmp_path / "p.json", tmp_path / "t.npz"
    code, _, err = cli("plan", g, "--params", "n14", "-o", plan, "--tables", tables)
    assert code == 0, err
    return plan, tables


def test_user_data_in_and_out(tmp_path: Path, cli: Cli, planned: tuple[Path, Path]) -> None:
    plan, tables = planned
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, (1, 8))  # a leading batch dimension of 1
    W, b, s = rng.uniform(-0.5, 0.5, (4, 8)), rng.uniform(-1, 1, 4), np.array([2.5])
    X = _save(tmp_path / "x.npz", x=x)
    Wf = _save(tmp_path / "w.npz", W=W.reshape(2, 16), b=b, s=s)  # any shape with the right count
    Y = tmp_path / "y.npz"
    code, out, err = cli("run", plan, "--tables", tables, "--inputs", X, "--weights", Wf, "--out", Y, "--json")
    assert code == 0, err
    assert json.loads(out)["ok"] is True
    got = dict(np.load(Y))
    assert sorted(got) == ["t", "z"]
    want = reference(parse_graph(GRAPH), {"x": x.reshape(8), "W": W, "b": b, "s": s})
    for k in ("t", "z"):
        assert got[k].shape == want[k].shape
        np.testing.assert_allclose(got[k], want[k], rtol=1e-9, atol=1e-12)
    # the user's data, not random: another x gives another answer
    X2 = _save(tmp_path / "x2.npz", x=x + 1.0)
    code, _, err = cli("run", plan, "--inputs", X2, "--weights", Wf, "--out", Y)
    assert code == 0, err
    assert not np.allclose(np.load(Y)["z"], got["z"])


@pytest.mark.parametrize(
    ("inputs", "weights", "needle"),
    [
        ({}, {"W": (4, 8), "b": (4,), "s": (1,)}, "tensor 'x': no array named 'x'"),
        ({"x": (8,)}, {"W": (4, 8), "b": (4,)}, "tensor 's': no array named 's'"),
        ({"x": (8,), "extra": (3,)}, {"W": (4, 8), "b": (4,), "s": (1,)}, "tensor 'extra': array in"),
        ({"x": (8,), "W": (4, 8)}, {"W": (4, 8), "b": (4,), "s": (1,)}, "tensor 'W': array in"),
        ({"x": (9,)}, {"W": (4, 8), "b": (4,), "s": (1,)}, "tensor 'x': array in"),
        ({"x": (8,)}, {"W": (4, 7), "b": (4,), "s": (1,)}, "tensor 'W': array in"),
        ({"x": (8,)}, {"W": (4, 8), "b": (4,), "s": (1,), "h": (4,)}, "tensor 'h': array in"),
        ({"x": (8,)}, None, "give them with --weights"),
    ],
)
def test_bad_user_data_one_line(
    tmp_path: Path, cli: Cli, planned: tuple[Path, Path], inputs: dict[str, tuple[int, ...]],
    weights: dict[str, tuple[int, ...]] | None, needle: str,
) -> None:
    plan, tables = planned
    X = _save(tmp_path / "x.npz", **{k: np.ones(v) for k, v in inputs.items()})
    args: list[object] = ["run", plan, "--tables", tables, "--inputs", X, "--out", tmp_path / "y.npz"]
    if weights is not None:
        args += ["--weights", _save(tmp_path / "w.npz", **{k: np.ones(v) for k, v in weights.items()})]
    code, _, err = cli(*args)
    assert code == 2, err
    assert needle in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert not (tmp_path / "y.npz").exists()


def test_bad_files(tmp_path: Path, cli: Cli, planned: tuple[Path, Path]) -> None:
    plan, _ = planned
    bad = tmp_path / "bad.npz"
    bad.write_text("not a zip")
    for f in (bad, tmp_path / "missing.npz", tmp_path):
        code, _, err = cli("run", plan, "--inputs", f)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    nan = _save(tmp_path / "nan.npz", x=np.full(8, np.nan))
    code, _, err = cli("run", plan, "--inputs", nan, "--weights", _save(tmp_path / "w.npz", W=np.ones((4, 8)),
                                                                         b=np.ones(4), s=np.ones(1)))
    assert code == 2 and "tensor 'x'" in err and "NaN" in err, err
    strs = _save(tmp_path / "s.npz", x=np.array(["a"] * 8))
    code, _, err = cli("run", plan, "--inputs", strs)
    assert code == 2 and "real numbers" in err, err


def _lattigo_available() -> bool:
    from backends.lattigo_backend import available

    return available()


@pytest.mark.skipif(not _lattigo_available(), reason="Lattigo extension not built (make lattigo)")
def test_user_data_on_lattigo(tmp_path: Path, cli: Cli) -> None:
    """The same on Lattigo (log N 12, 6 levels, test size): outputs to CKKS precision."""
    g = tmp_path / "g.json"
    g.write_text(json.dumps(GRAPH))
    params = tmp_path / "params.json"
    params.write_text(json.dumps({"log_n": 12, "log_q": [50] + [40] * 6, "log_p": [50], "log_scale": 40}))
    plan = tmp_path / "p.json"
    code, _, err = cli("plan", g, "--params", params, "--allow-insecure", "-o", plan)
    assert code == 0, err
    rng = np.random.default_rng(8)
    x, W, b = rng.uniform(-1, 1, 8), rng.uniform(-0.5, 0.5, (4, 8)), rng.uniform(-1, 1, 4)
    X = _save(tmp_path / "x.npz", x=x.reshape(1, 8))
    Wf = _save(tmp_path / "w.npz", W=W, b=b, s=np.array([0.75]))
    Y = tmp_path / "y.npz"
    code, out, err = cli("run", plan, "--backend", "lattigo", "--inputs", X, "--weights", Wf, "--out", Y, "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["ok"] and rep["max_rel_error"] < 1e-4, rep
    want = reference(parse_graph(GRAPH), {"x": x, "W": W, "b": b, "s": np.array([0.75])})
    got = dict(np.load(Y))
    for k in ("t", "z"):
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-4 * max(1.0, float(np.abs(want[k]).max())))
