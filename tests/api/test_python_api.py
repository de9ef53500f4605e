"""The Python API (`import slotplan`, docs/python.md): plan, Plan round trips, Client/Server
over bytes on small rings against numpy, refusals as SlotplanError, the README's example."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest

import slotplan
from backends import lattigo_backend
from planner.frontend.params import preset
from planner.ir.io import dumps_plan
from planner.pipeline import plan_graph
from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT
GRAPH = {"schema": "slotplan.graph/1", "name": "tiny",
         "tensors": {"W": {"shape": [4, 8], "role": "weight"}, "x": {"shape": [8], "role": "input"},
                     "b": {"shape": [4], "role": "weight"}},
         "nodes": [{"id": "h", "op": "matvec", "inputs": ["W", "x"]}, {"id": "y", "op": "add", "inputs": ["h", "b"]}],
         "outputs": ["y"]}
needs_lattigo = pytest.mark.skipif(not lattigo_backend.available(), reason="the Lattigo extension is not built")


def test_plan_is_the_pipelines_plan(tmp_path: Path) -> None:
    from planner.frontend.graph import load_graph

    p = slotplan.plan(GRAPH, params="n12")
    want = plan_graph(load_graph(GRAPH), preset("n12"))
    assert p.to_json() == dumps_plan(want.plan)  # byte for byte
    assert p.inputs == ["x"] and p.outputs == ["y"] and p.summary["rotations"] == want.plan["summary"]["rotations"]
    # a graph file gives the same plan; save/load round trip keeps the bytes and the digest
    (tmp_path / "g.json").write_text(json.dumps(GRAPH))
    assert slotplan.plan(tmp_path / "g.json", params="n12").to_json() == p.to_json()
    p.save(tmp_path / "p.json", tmp_path / "t.npz")
    q = slotplan.Plan.load(tmp_path / "p.json", tmp_path / "t.npz")
    assert q.to_json() == p.to_json() and q.digest == p.digest
    assert set(q.tables) == set(p.tables)
    q.save(tmp_path / "p2.json", tmp_path / "t2.npz")  # tables read from a file are written again
    assert (tmp_path / "p2.json").read_bytes() == (tmp_path / "p.json").read_bytes()


def test_bootstrap_variant_options_are_plan_options() -> None:
    """``boot_variants`` and ``boot_variant_slots`` reach the planner as in REST and the plan
    file (docs/python.md), recorded in the plan's options."""
    p = slotplan.plan(GRAPH, params="n12", boot_variants=False)
    assert json.loads(p.to_json())["options"]["boot_variants"] is False


def test_simulate_against_numpy() -> None:
    p = slotplan.plan(GRAPH, params="n12")
    rng = np.random.default_rng(3)
    W, x, b = rng.uniform(-1, 1, (4, 8)), rng.uniform(-1, 1, 8), rng.uniform(-1, 1, 4)
    got = slotplan.run(p, {"x": x}, {"W": W, "b": b})
    np.testing.assert_allclose(got["y"], W @ x + b, atol=1e-9)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: slotplan.plan(GRAPH, params="n12", solvr="z3"), "unknown option(s) solvr"),
    (lambda: slotplan.plan(GRAPH, params="n99"), "params"),
    (lambda: slotplan.plan(GRAPH, params="n12", time_limit_s=-1), "option time_limit_s"),
    (lambda: slotplan.plan(GRAPH, params="n12", degree=3), "degree: only for an ONNX model"),
    (lambda: slotplan.plan(GRAPH, params="n12", boot_variant_slots=[13]),
     "options.boot_variant_slots: 13 is not the log2 slot count of a bootstrap variant these params offer (offered: none)"),
    (lambda: slotplan.plan({**GRAPH, "outputs": ["nope"]}, params="n12"), "nope"),
    (lambda: slotplan.plan("/nonexistent/g.json"), "no such file"),
    (lambda: slotplan.plan(42), "expected a graph dict"),
    (lambda: slotplan.Ciphertext.from_bytes(b"garbage"), "not a slotplan ciphertext file"),
    (lambda: slotplan.EvalKeys.from_bytes(b"not a tar"), "not an uncompressed tar"),
    (lambda: slotplan.EvalKeys("/nonexistent"), "no manifest.json"),
])
def test_bad_input_is_one_line(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(slotplan.SlotplanError) as e:
        call()
    assert message in str(e.value) and "\n" not in str(e.value)


def _tar(members: dict[str, bytes], link: str | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link)
            info.type = tarfile.SYMTYPE
            info.linkname = "/etc/passwd"
            tar.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize("bad", [{"eval/../escape": b"x"}, {"/abs": b"x"}, {"../up": b"x"}])
def test_eval_keys_tar_refuses_escapes(tmp_path: Path, bad: dict[str, bytes]) -> None:
    with pytest.raises(slotplan.InferenceError, match="only regular files with relative names"):
        slotplan.EvalKeys.from_bytes(_tar(bad), tmp_path / "k")
    assert not (tmp_path / "escape").exists()
    with pytest.raises(slotplan.InferenceError, match="only regular files"):
        slotplan.EvalKeys.from_bytes(_tar({"eval/manifest.json": b"{}"}, link="eval/k.bin"), tmp_path / "k2")


@needs_lattigo
def test_client_server_over_bytes(tmp_path: Path) -> None:
    """keygen once, three samples in one ciphertext, everything that travels as bytes; the
    server works from an unpacked copy of the eval keys (no secret key in its directory)."""
    p = slotplan.plan(GRAPH, params="n12")
    client = slotplan.Client(p, tmp_path / "client")
    keys = client.keygen()
    assert (tmp_path / "client" / "secret.key").stat().st_mode & 0o777 == 0o600
    blob = keys.to_bytes()
    assert blob == keys.to_bytes()  # deterministic
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        names = tar.getnames()
    assert "eval/manifest.json" in names and not any("secret" in n for n in names)
    server_keys = slotplan.EvalKeys.from_bytes(blob, tmp_path / "server" / "eval")
    assert server_keys.key_set_id == keys.key_set_id and server_keys.nbytes() == keys.nbytes()
    assert not [q for q in (tmp_path / "server").rglob("*") if q.name == "secret.key"]
    # the tar tool's two spellings of the same upload (SPEC section 7's body)
    import shutil
    import subprocess

    if shutil.which("tar"):
        for i, args in enumerate((["-C", str(tmp_path / "client"), "eval"], ["-C", str(tmp_path / "client" / "eval"), "."])):
            made = subprocess.run(["tar", "-cf", "-", *args], capture_output=True, check=True).stdout
            again = slotplan.EvalKeys.from_bytes(made, tmp_path / f"tar{i}")
            assert again.key_set_id == keys.key_set_id and again.nbytes() == keys.nbytes()
            assert again.to_bytes() == blob

    rng = np.random.default_rng(7)
    W, b = rng.uniform(-1, 1, (4, 8)), rng.uniform(-1, 1, 4)
    x = rng.uniform(-1, 1, (3, 8))
    wire = client.encrypt({"x": x}).to_bytes()
    assert len(client.last_stats["sample_seconds"]) == 3
    server = slotplan.Server(p, server_keys, {"W": W, "b": b})
    answer = server.evaluate(slotplan.Ciphertext.from_bytes(wire))
    assert answer.kind == "outputs" and answer.samples == 3
    y = client.decrypt(answer.to_bytes())["y"]
    assert y.shape == (3, 4)
    np.testing.assert_allclose(y, x @ W.T + b, atol=1e-4)
    # a ciphertext of another key set is refused by the server with one line
    other = slotplan.Client(p, tmp_path / "other")
    other.keygen()
    with pytest.raises(slotplan.InferenceError, match="other keys"):
        server.evaluate(other.encrypt({"x": x[0]}))
    # keygen never overwrites a key set
    with pytest.raises(slotplan.InferenceError, match="never overwrites"):
        client.keygen()


def _readme_python() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README.md has no ```python block"
    return str(blocks[0])


@needs_lattigo
def test_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = _readme_python()
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})  # noqa: S102
    assert (tmp_path / "keys" / "secret.key").is_file()
    assert os.stat(tmp_path / "keys" / "secret.key").st_mode & 0o777 == 0o600


def test_plan_from_onnx_keeps_the_weights(tmp_path: Path) -> None:
    """An .onnx path is imported (as `slotplan import`), its weights come back in Plan.weights,
    and the simulated outputs with them equal the graph's numpy reference."""
    from tests import onnx_models as M

    path = M.save(M.mlp("square", sizes=(16, 8, 4)), tmp_path / "m.onnx")
    p = slotplan.plan(path, params="n13")
    assert p.weights and set(p.weights) <= set(p.graph.weights)
    (gin,) = p.inputs
    x = np.random.default_rng(0).uniform(-1, 1, p.graph.shape(gin))
    out = slotplan.run(p, {gin: x})
    assert set(out) == set(p.outputs)
    with pytest.raises(slotplan.SlotplanError) as e:
        slotplan.plan(path, params="n13", relu="bogus")
    assert "relu" in str(e.value).lower() and "\n" not in str(e.value)
