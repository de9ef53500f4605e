"""Issue 38, smaller things: the smallest feasible cap under a depth limit, malformed plans
on Lattigo exit 2, plan poly bounded, key directories swept after SIGKILL, bodies without
Content-Type, exact memory sizes, params auto in batch and REST, batch of an .onnx, and
insecure parameters flagged in plan / show / diff."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from api.rest import RestLimits, create_app
from common.errors import PlanFileError
from planner.ir.io import parse_size
from planner.ir.plan import validate_plan
from tests.api.test_rest import matvec, small_body
from tests.helpers import REPO_ROOT, cli_in_process

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

ROOT = REPO_ROOT
REPRO = Path("/work/shared/repro/matvec_square_matvec.json")


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``slotplan ARGS`` in this process (tests/api/test_cli.py runs the real process)."""
    return cli_in_process(args, cwd=cwd or ROOT)


def mvsq() -> dict[str, Any]:
    """matvec -> square -> matvec (3 levels at n13; the attack's shape, smaller)."""
    return {"schema": "slotplan.graph/1", "name": "t3",
            "tensors": {"x": {"shape": [64], "role": "input"}, "W1": {"shape": [64, 64], "role": "weight"},
                        "W2": {"shape": [64, 64], "role": "weight"}},
            "nodes": [{"id": "fc1", "op": "matvec", "inputs": ["W1", "x"]},
                      {"id": "act1", "op": "mul", "inputs": ["fc1", "fc1"]},
                      {"id": "fc2", "op": "matvec", "inputs": ["W2", "act1"]}], "outputs": ["fc2"]}


def test_caps_below_the_smallest_feasible_name_it(tmp_path: Path) -> None:
    g = tmp_path / "g.json"
    g.write_text(json.dumps(mvsq()))
    for cap in ("1MiB", "3MiB"):
        r = cli("plan", str(g), "--params", "n13", "--memory-cap", cap)
        assert r.returncode == 2 and "smallest feasible cap is" in r.stderr, r.stderr
        assert "no assignment of layouts" not in r.stderr
    r = cli("plan", str(g), "--params", "n13", "--memory-cap", "64MiB", "--json")
    assert r.returncode == 0, r.stderr


def _malformed(tmp_path: Path) -> dict[str, Path]:
    g = tmp_path / "mv.json"
    g.write_text(json.dumps(matvec(64, 64)))
    plan = tmp_path / "p.json"
    # a cap between the smallest feasible process cap (9.1 MB) and the keep-all process model
    # (15.9 MB): a key schedule with loads
    assert cli("plan", str(g), "--params", "n12", "--memory-cap", "12MiB", "-o", str(plan)).returncode == 0
    p = json.loads(plan.read_text())
    prog = p["program"]
    out: dict[str, Path] = {}
    i = next(i for i, x in enumerate(prog) if x["op"] == "load_key")
    j = next(i for i, x in enumerate(prog) if x["op"] == "output")
    src = prog[j]["src"]
    pt = next(iter(p["plaintexts"]))
    chain = [{"op": "pmul", "dst": f"d{k}", "src": src if k == 0 else f"d{k - 1}", "pt": pt} for k in range(5)]
    for name, program in (
        ("nokey", prog[:i] + prog[i + 1:]),
        ("boot", prog[:j] + [{"op": "bootstrap", "dst": "b0", "src": src}, {**prog[j], "src": "b0"}] + prog[j + 1:]),
        ("depth", prog[:j] + chain + [{**prog[j], "src": "d4"}] + prog[j + 1:]),
    ):
        f = tmp_path / f"{name}.json"
        # an edited program: the planner's fused annotation no longer describes it
        f.write_text(json.dumps({**{k: v for k, v in p.items() if k != "fused"}, "program": program}))
        out[name] = f
    return out


def test_malformed_plans_exit_2_before_lattigo(tmp_path: Path) -> None:
    from backends.lattigo_backend import check_executable

    files = _malformed(tmp_path)
    want = {"nokey": "no key for k=", "boot": "no 'boot' object", "depth": "exceeds the 3 levels"}
    for name, f in files.items():
        with pytest.raises(PlanFileError, match=want[name]):
            check_executable(json.loads(f.read_text()))
    from backends.lattigo_backend import available

    if not available():
        pytest.skip("Lattigo extension not built")
    for name, f in files.items():
        r = cli("run", str(f), "--backend", "lattigo")
        assert r.returncode == 2 and want[name] in r.stderr, (name, r.stderr)


def test_plan_poly_has_a_coefficient_limit() -> None:
    base = {
        "schema": "slotplan.plan/1", "graph": {"name": "p", "sha256": "0" * 64},
        "params": {"name": "n12", "log_n": 12, "n": 4096, "slots": 2048, "log_q": [50, 40, 40, 40], "log_p": [50],
                   "log_scale": 40, "max_level": 3},
        "summary": {"rotations": 0, "rotation_keys": 0, "pmul": 0, "cmul": 0, "add": 0, "rescale": 0, "depth": 0,
                    "key_loads": 0, "peak_bytes": {"keys": 0, "plaintexts": 0, "ciphertexts": 0, "total": 0},
                    "memory_cap_bytes": None},
        "nodes": [], "plaintexts": {},
        "program": [{"op": "input", "dst": "c0", "tensor": "x", "table": "in/x/0"},
                    {"op": "poly", "dst": "c1", "src": "c0", "coeffs": [0.0, 1.0]},
                    {"op": "output", "src": "c1", "tensor": "y", "table": "out/y/0"}]}
    ok = json.loads(json.dumps(base))
    ok["program"][1]["coeffs"] = [0.0] * 4095 + [1e-3]
    try:
        validate_plan(ok)
    except PlanFileError as e:  # whatever else this hand-made plan lacks, not the poly's size
        assert "coefficients" not in str(e)
    big = json.loads(json.dumps(base))
    big["program"][1]["coeffs"] = [0.0] * 5000
    with pytest.raises(PlanFileError, match="at most 4096 coefficients"):
        validate_plan(big)


def test_key_directories_of_killed_runs_are_swept(tmp_path: Path) -> None:
    from backends.lattigo_backend import KEY_DIR_PREFIX, sweep_key_dirs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{KEY_DIR_PREFIX}{dead.pid}-abc"
    stale.mkdir()
    (stale / "rot_1.key").write_bytes(b"k" * 100)
    live = tmp_path / f"{KEY_DIR_PREFIX}{os.getpid()}-def"
    live.mkdir()
    other = tmp_path / "unrelated-dir"
    other.mkdir()
    assert sweep_key_dirs(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and live.exists() and other.exists()


def test_memory_sizes_are_exact_integers() -> None:
    assert parse_size(str(10**30)) == 10**30
    assert parse_size("1.5GiB") == 3 * 2**29 and parse_size("64MiB") == 2**26 and parse_size("7") == 7
    with pytest.raises(PlanFileError):
        parse_size("0.1")


def test_body_without_content_type_is_json(tmp_path: Path) -> None:
    with TestClient(create_app(tmp_path / "db.sqlite3", RestLimits(executor="thread")),
                    raise_server_exceptions=False) as c:
        r = c.post("/v1/plans", content=json.dumps(small_body()).encode())
        assert r.status_code == 200, r.text
        r = c.post("/v1/plans", content=b"graph=1", headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 415 and r.json()["field"] == "Content-Type"


def test_params_auto_in_rest_and_batch(tmp_path: Path) -> None:
    with TestClient(create_app(tmp_path / "db.sqlite3", RestLimits(executor="thread")),
                    raise_server_exceptions=False) as c:
        r = c.post("/v1/plans", json={"graph": matvec(), "params": "auto", "options": {"time_limit_s": 5}})
        assert r.status_code == 200, r.text
        assert r.json()["plan"]["params"]["name"] == "n13"  # the smallest secure preset that fits
        again = c.post("/v1/plans", json={"graph": matvec(), "params": "auto", "options": {"time_limit_s": 5}})
        assert again.json()["id"] == r.json()["id"]
    g = tmp_path / "mv.json"
    g.write_text(json.dumps(matvec()))
    out = tmp_path / "res.jsonl"
    r = cli("batch", str(g), "--params", "auto", "--out", str(out), "--jobs", "1")
    assert r.returncode == 0, r.stderr
    line = json.loads(out.read_text().splitlines()[0])
    assert line["status"] == "ok" and line["params"] == "auto" and line["params_chosen"] == "n13"


def test_batch_of_an_onnx_model_says_so(tmp_path: Path) -> None:
    m = tmp_path / "model.onnx"
    m.write_bytes(b"\x08\x07\x12\x04\xff\xfe\x00\x01")
    out = tmp_path / "res.jsonl"
    r = cli("batch", str(m), "--params", "n13", "--out", str(out), "--jobs", "1")
    text = r.stderr + (out.read_text() if out.exists() else "")
    assert "ONNX model" in text and "slotplan import" in text and "UTF-8" not in text


def test_insecure_flagged_in_plan_show_and_diff(tmp_path: Path) -> None:
    g = tmp_path / "mv.json"
    g.write_text(json.dumps(matvec()))
    r12 = cli("plan", str(g), "--params", "n12", "-o", str(tmp_path / "a.json"))
    r13 = cli("plan", str(g), "--params", "n13", "-o", str(tmp_path / "b.json"))
    assert "below 128-bit security" in r12.stderr and "insecure" not in r13.stderr
    assert json.loads((tmp_path / "a.json").read_text())["summary"]["insecure"] is True
    assert "insecure" not in json.loads((tmp_path / "b.json").read_text())["summary"]
    show = cli("show", str(tmp_path / "a.json"))
    assert show.stdout.startswith("WARNING: insecure: parameters n12")
    d = cli("diff", str(tmp_path / "b.json"), str(tmp_path / "a.json"), "--fail-on-regression")
    assert d.returncode == 1 and "insecure" in d.stdout + d.stderr
    assert cli("diff", str(tmp_path / "b.json"), str(tmp_path / "b.json"), "--fail-on-regression").returncode == 0
    with TestClient(create_app(tmp_path / "db.sqlite3", RestLimits(executor="thread")),
                    raise_server_exceptions=False) as c:
        pid = c.post("/v1/plans", json=small_body()).json()["id"]
        assert 'id="insecure"' in c.get(f"/v1/plans/{pid}/view").text
