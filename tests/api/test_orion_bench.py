"""``slotplan orion-bench``: our side on given weights (Lattigo), and its bad input.

Orion itself (orion-fhe with torch, ~6 GB) is not installed by ``make test``; the
same-job comparison is run by ``make orion-bench`` (docs/cli.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from backends.lattigo_backend import available

needs_lattigo = pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)")


def test_orion_bench_without_orion_says_how_to_install(cli: Callable[..., tuple[int, str, str]], tmp_path: Path) -> None:
    code, _, err = cli("orion-bench", "--orion-python", tmp_path / "missing" / "python")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "make orion" in err


def test_orion_bench_refuses_a_bad_repeat(cli: Callable[..., tuple[int, str, str]]) -> None:
    code, _, err = cli("orion-bench", "--repeat", "0")
    assert code == 2 and "--repeat" in err


@needs_lattigo
@pytest.mark.parametrize("seed", [3, 11])
def test_our_side_runs_the_given_weights_on_orions_chain(seed: int) -> None:
    """What orion-bench gives our plan (Orion's folded weights and input) is what it
    computes: decrypted outputs against a numpy forward pass, at Orion's 2^26 scale."""
    from api.orion_bench import run_ours

    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {"x": rng.uniform(-0.4, 2.8, 784)}
    for i, (n, k) in enumerate([(128, 784), (128, 128), (10, 128)], 1):
        arrays[f"W{i}"] = rng.uniform(-1, 1, (n, k)) / k
        arrays[f"b{i}"] = rng.uniform(-0.3, 0.3, n)
    h = (arrays["W1"] @ arrays["x"] + arrays["b1"]) ** 2
    h = (arrays["W2"] @ h + arrays["b2"]) ** 2
    want = arrays["W3"] @ h + arrays["b3"]
    row = run_ours(arrays, repeat=1)
    got = np.asarray(row["outputs"]["y"])
    assert row["status"] == "ok" and row["depth"] <= 5
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-2
    assert row["max_rel_error"] < 1e-2


@needs_lattigo
def test_our_side_batched_holds_orions_input_in_every_sample() -> None:
    """``orion-bench --batch B``: our plan of B samples, each fed Orion's input, decrypts to
    the numpy forward pass in every sample (B = 3: a padded batch, P = 4)."""
    from api.orion_bench import run_ours

    rng = np.random.default_rng(5)
    arrays: dict[str, np.ndarray] = {"x": rng.uniform(-0.4, 2.8, 784)}
    for i, (n, k) in enumerate([(128, 784), (128, 128), (10, 128)], 1):
        arrays[f"W{i}"] = rng.uniform(-1, 1, (n, k)) / k
        arrays[f"b{i}"] = rng.uniform(-0.3, 0.3, n)
    h = (arrays["W1"] @ arrays["x"] + arrays["b1"]) ** 2
    h = (arrays["W2"] @ h + arrays["b2"]) ** 2
    want = arrays["W3"] @ h + arrays["b3"]
    row = run_ours(arrays, repeat=1, batch=3)
    got = np.asarray(row["outputs"]["y"])
    assert row["status"] == "ok" and got.shape == (3, 10)
    for b in range(3):
        assert np.max(np.abs(got[b] - want)) / np.max(np.abs(want)) < 1e-2
