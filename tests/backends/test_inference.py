"""Private inference with the client and the evaluator apart (backends/inference.py, the Go
split in backends/lattigo/inference.go, the four commands): round trips against numpy on
several samples with keys generated once, ``evaluate`` in a separate process that cannot
read the secret key (and has none in its directories), refusals of files that do not
belong together, and a bootstrapping plan at n14boot through the split (slow, heavy)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.lattigo_backend import available
from tests.helpers import REPO_ROOT, mem_available, tiny_mlp_graph, tiny_mlp_reference

pytestmark = pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)")

ROOT = REPO_ROOT

GRAPH: dict[str, Any] = tiny_mlp_graph("tiny-split")


_ref = tiny_mlp_reference


@pytest.fixture(scope="module")
def planned() -> tuple[dict[str, Any], Any]:
    from planner.frontend.graph import parse_graph
    from planner.frontend.params import preset
    from planner.pipeline import PlanOptions, plan_graph

    res = plan_graph(parse_graph(GRAPH), preset("n13"), PlanOptions(clean_outputs=False))
    return res.plan, dict(res.tables.items())


@pytest.fixture(scope="module")
def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {"W": rng.uniform(-1, 1, (16, 32)) / np.sqrt(32), "b": rng.uniform(-0.5, 0.5, 16)}


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert float(np.max(np.abs(got - want))) <= 1e-4 * max(1.0, float(np.max(np.abs(want))))


def test_round_trip_samples_keys_once(tmp_path: Path, planned: tuple[dict[str, Any], Any],
                                      weights: dict[str, np.ndarray]) -> None:
    from backends import inference as inf

    plan, tables = planned
    rep = inf.keygen(plan, tmp_path / "K")
    sk = tmp_path / "K" / "secret.key"
    assert (sk.stat().st_mode & 0o777) == 0o600
    manifest = inf.read_manifest(tmp_path / "K" / "eval")
    assert manifest.key_set_id == rep.key_set_id and manifest.plan_digest == inf.inference_plan_digest(plan)
    assert rep.eval_bytes == sum(f.stat().st_size for f in (tmp_path / "K" / "eval").iterdir())
    assert {k.kind for k in manifest.rotations} == {"rotation"} and manifest.relin is not None

    rng = np.random.default_rng(0)
    for n in (3, None, 2):  # three calls on one key set: N=3, one sample without N, N=2
        x = rng.uniform(-1, 1, (n, 32) if n else (32,))
        st: dict[str, Any] = {}
        ct = inf.encrypt(plan, tmp_path / "K", {"x": x}, tables=tables, stats=st)
        assert len(st["sample_seconds"]) == (n or 1)
        est: dict[str, Any] = {}
        out = inf.evaluate(plan, tmp_path / "K" / "eval", weights, ct, tables=tables, stats=est)
        assert len(est["sample_seconds"]) == (n or 1)
        h, _ = inf.ciphertext_header(out)
        assert h.kind == "outputs" and h.samples == (n or 1) and h.batched == (n is not None)
        y = inf.decrypt(plan, tmp_path / "K", out, tables=tables)
        _close(y["y"], _ref(x, weights))
    # the weights were encoded once for the process: later calls found them in the Go cache
    assert est["go"]["cache_hit"] is True


def test_plaintext_store_directory_is_checked_and_reported(tmp_path: Path, planned: tuple[dict[str, Any], Any],
                                                           weights: dict[str, np.ndarray],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """SLOTPLAN_PLAINTEXT_STORE: a missing directory is one line naming the variable; an
    existing one is passed to the Go side, which reports its store (empty here: the 1 GiB
    plaintext cache keeps this model's encodings; the Go test TestPlaintextStoreServing
    runs a cache that keeps none)."""
    from backends import inference as inf

    plan, tables = planned
    inf.keygen(plan, tmp_path / "K")
    ct = inf.encrypt(plan, tmp_path / "K", {"x": np.linspace(-1, 1, 32)}, tables=tables)
    monkeypatch.setenv(inf.PLAINTEXT_STORE_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(inf.InferenceError, match="SLOTPLAN_PLAINTEXT_STORE=.*no such directory"):
        inf.evaluate(plan, tmp_path / "K" / "eval", weights, ct, tables=tables)
    (tmp_path / "store").mkdir()
    monkeypatch.setenv(inf.PLAINTEXT_STORE_ENV, str(tmp_path / "store"))
    est: dict[str, Any] = {}
    out = inf.evaluate(plan, tmp_path / "K" / "eval", weights, ct, tables=tables, stats=est)
    assert est["go"]["plaintext_store"]["dir"] == str(tmp_path / "store")
    _close(inf.decrypt(plan, tmp_path / "K", out, tables=tables)["y"], _ref(np.linspace(-1, 1, 32), weights))
    assert list((tmp_path / "store").iterdir()) == []
    # the argument names the directory too (and wins over the environment)
    with pytest.raises(inf.InferenceError, match="plaintext_store=.*no such directory"):
        inf.evaluate(plan, tmp_path / "K" / "eval", weights, ct, tables=tables, plaintext_store=tmp_path / "none")


def test_a_serving_process_keeps_its_keys(tmp_path: Path, planned: tuple[dict[str, Any], Any],
                                          weights: dict[str, np.ndarray]) -> None:
    """Evaluations in one process on one key directory read the keys once (the Go side
    keeps the last directory's key store, inference.go servingKeyStore); another directory
    is read again, and every answer stays right."""
    from backends import inference as inf

    plan, tables = planned
    inf.keygen(plan, tmp_path / "K")
    inf.keygen(plan, tmp_path / "K2")
    rng = np.random.default_rng(5)
    read: list[int] = []
    for kd in ("K", "K", "K", "K2", "K"):
        x = rng.uniform(-1, 1, 32)
        ct = inf.encrypt(plan, tmp_path / kd, {"x": x}, tables=tables)
        est: dict[str, Any] = {}
        out = inf.evaluate(plan, tmp_path / kd / "eval", weights, ct, tables=tables, stats=est)
        read.append(int(est["go"]["key_load_bytes"]))
        _close(inf.decrypt(plan, tmp_path / kd, out, tables=tables)["y"], _ref(x, weights))
    assert read[0] > 0 and read[1] == 0 and read[2] == 0, read
    assert read[3] > 0 and read[4] > 0, read  # another directory replaces the kept store


def _run_evaluator(args: list[str], env_tmp: Path) -> subprocess.CompletedProcess[str]:
    """``slotplan evaluate`` in a separate Python process whose audit hook aborts on any
    attempt to open a file named secret.key, with its own empty TMPDIR."""
    code = textwrap.dedent(
        """
        import os, sys
        def hook(event, args):
            if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
                if os.path.basename(os.fsdecode(args[0])) == "secret.key":
                    os.write(2, b"OPENED secret.key\\n"); os._exit(99)
        sys.addaudithook(hook)
        from api.cli import main
        sys.argv = ["slotplan"] + sys.argv[1:]
        main()
        """
    )
    env = {**os.environ, "TMPDIR": str(env_tmp), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          cwd=str(env_tmp), timeout=300)


def test_evaluate_in_another_process_without_the_secret_key(
        tmp_path: Path, planned: tuple[dict[str, Any], Any], weights: dict[str, np.ndarray]) -> None:
    from backends import inference as inf
    from planner.ir.io import write_arrays

    plan, tables = planned
    client, server, server_tmp = tmp_path / "client", tmp_path / "server", tmp_path / "server_tmp"
    for d in (client, server, server_tmp):
        d.mkdir()
    inf.keygen(plan, client / "K")
    x = np.random.default_rng(5).uniform(-1, 1, (3, 32))
    ct = inf.encrypt(plan, client / "K", {"x": x}, tables=tables)
    # the evaluator's machine: a copy of eval/, the plan, its tables, the weights, the ciphertexts
    shutil.copytree(client / "K" / "eval", server / "eval")
    (server / "plan.json").write_text(json.dumps(plan))
    np.savez(server / "tables.npz", **tables)
    write_arrays(server / "w.npz", weights)
    (server / "in.ct").write_bytes(ct)
    sk = client / "K" / "secret.key"
    sk.chmod(0)
    try:
        proc = _run_evaluator(["evaluate", str(server / "plan.json"), "--eval-keys", str(server / "eval"),
                               "--weights", str(server / "w.npz"), "--in", str(server / "in.ct"),
                               "-o", str(server / "out.ct"), "--tables", str(server / "tables.npz"), "--json"],
                              server_tmp)
    finally:
        sk.chmod(0o600)
    assert proc.returncode == 0, proc.stderr
    assert "OPENED" not in proc.stderr
    # nothing in the evaluator's directories is a secret key
    for d in (server, server_tmp):
        for f in d.rglob("*"):
            assert f.name != "secret.key"
            if f.is_file():
                with open(f, "rb") as fh:
                    assert fh.read(len(inf.SK_MAGIC)) != inf.SK_MAGIC, f
    report = json.loads(proc.stdout)
    assert report["samples"] == 3 and len(report["sample_seconds"]) == 3
    y = inf.decrypt(plan, client / "K", (server / "out.ct").read_bytes(), tables=tables)
    _close(y["y"], _ref(x, weights))


def test_the_audit_hook_catches_an_open(tmp_path: Path, planned: tuple[dict[str, Any], Any]) -> None:
    """The evaluator test's hook is not vacuous: a command that opens secret.key is stopped."""
    (tmp_path / "p.json").write_text(json.dumps(planned[0]))
    (tmp_path / "K").mkdir()
    (tmp_path / "K" / "secret.key").write_bytes(b"x")
    proc = _run_evaluator(["decrypt", str(tmp_path / "p.json"), "--key-dir", str(tmp_path / "K"), "--in",
                           str(tmp_path / "K" / "secret.key"), "--out", str(tmp_path / "y.npz")], tmp_path)
    assert proc.returncode == 99 and "OPENED secret.key" in proc.stderr


def test_files_that_do_not_belong_together_are_refused(
        tmp_path: Path, planned: tuple[dict[str, Any], Any], weights: dict[str, np.ndarray],
        cli: Callable[..., tuple[int, str, str]]) -> None:
    from backends import inference as inf
    from common.errors import SlotplanError

    plan, tables = planned
    inf.keygen(plan, tmp_path / "A")
    inf.keygen(plan, tmp_path / "B")
    x = np.random.default_rng(1).uniform(-1, 1, 32)
    ct = inf.encrypt(plan, tmp_path / "A", {"x": x}, tables=tables)
    out = inf.evaluate(plan, tmp_path / "A" / "eval", weights, ct, tables=tables)

    def refused(match: str, fn: Callable[[], object]) -> None:
        with pytest.raises(SlotplanError, match=match):
            fn()

    refused("other keys", lambda: inf.evaluate(plan, tmp_path / "B" / "eval", weights, ct, tables=tables))
    refused("other keys", lambda: inf.decrypt(plan, tmp_path / "B", out, tables=tables))
    other_plan = {**plan, "options": {**plan.get("options", {}), "note": "another plan"}}
    refused("another plan", lambda: inf.evaluate(other_plan, tmp_path / "A" / "eval", weights, ct, tables=tables))
    other_params = {**plan, "params": {**plan["params"], "log_scale": plan["params"]["log_scale"] - 1}}
    refused("other parameters", lambda: inf.decrypt(other_params, tmp_path / "A", out, tables=tables))
    refused("truncated", lambda: inf.decrypt(plan, tmp_path / "A", out[:-1000], tables=tables))
    bad = bytearray(out)
    bad[-50] ^= 1
    refused("corrupt", lambda: inf.decrypt(plan, tmp_path / "A", bytes(bad), tables=tables))
    refused("holds inputs", lambda: inf.decrypt(plan, tmp_path / "A", ct, tables=tables))
    refused("not a slotplan ciphertext", lambda: inf.evaluate(plan, tmp_path / "A" / "eval", weights, b"junk",
                                                              tables=tables))
    refused("outside its declared range", lambda: inf.encrypt(plan, tmp_path / "A", {"x": x * 3}, tables=tables))
    refused("never overwrites", lambda: inf.keygen(plan, tmp_path / "A"))
    # the commands: one line, exit 2, nothing written
    (tmp_path / "p.json").write_text(json.dumps(plan))
    (tmp_path / "in.ct").write_bytes(ct)
    np.savez(tmp_path / "w.npz", **weights)
    np.savez(tmp_path / "t.npz", **tables)
    code, _, err = cli("evaluate", tmp_path / "p.json", "--eval-keys", tmp_path / "B" / "eval", "--weights",
                       tmp_path / "w.npz", "--in", tmp_path / "in.ct", "-o", tmp_path / "o.ct", "--tables", tmp_path / "t.npz")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "other keys" in err, err
    assert not (tmp_path / "o.ct").exists()


def test_commands_round_trip(tmp_path: Path, planned: tuple[dict[str, Any], Any], weights: dict[str, np.ndarray],
                             cli: Callable[..., tuple[int, str, str]]) -> None:
    plan, tables = planned
    (tmp_path / "p.json").write_text(json.dumps(plan))
    np.savez(tmp_path / "t.npz", **tables)
    np.savez(tmp_path / "w.npz", **weights)
    x = np.random.default_rng(2).uniform(-1, 1, (2, 32))
    np.savez(tmp_path / "x.npz", x=x)
    p, t, k = tmp_path / "p.json", tmp_path / "t.npz", tmp_path / "K"
    code, so, err = cli("keygen", p, "--key-dir", k, "--json")
    assert code == 0, err
    assert json.loads(so)["eval_bytes"] > 0
    assert cli("encrypt", p, "--key-dir", k, "--inputs", tmp_path / "x.npz", "-o", tmp_path / "in.ct",
               "--tables", t)[0] == 0
    code, so, err = cli("evaluate", p, "--eval-keys", k / "eval", "--weights", tmp_path / "w.npz", "--in",
                        tmp_path / "in.ct", "-o", tmp_path / "out.ct", "--tables", t, "--json")
    assert code == 0, err
    assert len(json.loads(so)["sample_seconds"]) == 2
    code, so, err = cli("decrypt", p, "--key-dir", k, "--in", tmp_path / "out.ct", "--out", tmp_path / "y.npz",
                        "--tables", t)
    assert code == 0, err
    _close(np.load(tmp_path / "y.npz")["y"], _ref(x, weights))




@pytest.mark.skipif(mem_available() < 5 << 30, reason="a bootstrap at log N 14 needs ~3 GB of memory")
@pytest.mark.skipif(os.environ.get("SLOTPLAN_SLOW") != "1", reason="slow (n14boot keys, ~1.4 GB): SLOTPLAN_SLOW=1")
def test_bootstrapping_plan_through_the_split(tmp_path: Path) -> None:
    """n14boot: the bootstrapping keys generated once by keygen, two samples evaluated in
    one call (the block loaded and its evaluator kept for the second), within CKKS precision."""
    from backends import inference as inf
    from planner.frontend.graph import parse_graph
    from planner.frontend.params import preset
    from planner.pipeline import PlanOptions, plan_graph

    params = preset("n14boot")
    n = 64
    tensors: dict[str, Any] = {"x": {"shape": [n], "role": "input", "range": [-1.0, 1.0]}}
    nodes, prev = [], "x"
    for i in range(12):
        tensors[f"w{i}"] = {"shape": [n], "role": "weight", "range": [-1.0, 1.0]}
        nodes.append({"id": f"m{i}", "op": "mul", "inputs": [prev, f"w{i}"]})
        prev = f"m{i}"
    g = parse_graph({"schema": "slotplan.graph/1", "name": "chain12", "tensors": tensors, "nodes": nodes,
                     "outputs": [prev]})
    res = plan_graph(g, params, PlanOptions(allow_insecure=True))
    plan, tables = res.plan, dict(res.tables.items())
    assert plan["summary"]["bootstraps"] == 1
    rng = np.random.default_rng(9)
    w = {f"w{i}": rng.uniform(0.8, 1.0, n) for i in range(12)}
    x = rng.uniform(-1, 1, (2, n))
    rep = inf.keygen(plan, tmp_path / "K")
    assert rep.boot_key_bytes > 0
    manifest = inf.read_manifest(tmp_path / "K" / "eval")
    assert manifest.boot is not None and all(k.kind == "boot_galois" for k in manifest.boot.galois)
    ct = inf.encrypt(plan, tmp_path / "K", {"x": x}, tables=tables)
    st: dict[str, Any] = {}
    out = inf.evaluate(plan, tmp_path / "K" / "eval", w, ct, tables=tables, stats=st)
    assert [s["bootstraps"] for s in st["go"]["samples"]] == [1, 1]
    y = inf.decrypt(plan, tmp_path / "K", out, tables=tables)[prev]
    want = x * np.prod(np.stack(list(w.values())), axis=0)
    assert float(np.max(np.abs(y - want))) <= 1e-5, float(np.max(np.abs(y - want)))
