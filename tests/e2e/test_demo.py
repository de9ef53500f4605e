"""`make demo`'s script (examples/digits/demo.py) on two images at n13: train (a subset, a
few epochs), plan, keygen, encrypt, `slotplan evaluate` in another process in a directory
without the secret key, decrypt; the encrypted logits against the plaintext graph's."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from backends import lattigo_backend
from tests.helpers import REPO_ROOT, needs

pytestmark = needs("sklearn")
DEMO = REPO_ROOT / "examples" / "digits" / "demo.py"


@pytest.mark.skipif(not lattigo_backend.available(), reason="the Lattigo extension is not built")
def test_demo_two_images_n13(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("digits_demo", DEMO)
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    monkeypatch.chdir(tmp_path)  # a relative --out, as `make demo` gives (the server runs in out/server)
    out = tmp_path / "d"
    # degree 1 keeps the MLP within n13's 3 levels: the demo's steps, not its accuracy, on trial here
    n = demo.run_demo(Path("d"), model="mlp", params="n13", images=2, degree=1, epochs=3, train_limit=300, calib=32)
    said = capsys.readouterr().out
    assert n["images"] == 2 and n["encrypted_equals_plaintext"] == 2
    assert n["max_abs_error"] < 1e-3
    assert n["eval_key_bytes"] > 0 and len(n["evaluate_seconds_per_image"]) == 2
    assert json.loads((out / "demo.json").read_text()) == json.loads(json.dumps(n))
    assert not [p for p in (out / "server").rglob("*") if p.name == "secret.key"]
    assert (out / "client" / "secret.key").stat().st_mode & 0o777 == 0o600
    assert (out / "server" / "outputs.ct").is_file()
    rows = [ln for ln in said.splitlines() if ln.strip() and ln.split()[0].isdigit() and len(ln.split()) >= 6]
    assert len(rows) == 2, said
    labels = np.load(out / "model-mlp" / "test_y.npy")[:2]
    assert [int(r.split()[1]) for r in rows] == [int(v) for v in labels]
    # a second run keeps the trained model and makes fresh keys
    again = demo.run_demo(Path("d"), model="mlp", params="n13", images=2, degree=1, epochs=3, train_limit=300, calib=32)
    assert "train_seconds" not in again and again["encrypted_equals_plaintext"] == 2
