"""Private inference of a digits classifier, end to end (what `make demo` runs).

    python examples/digits/demo.py [--out DIR] [--model mlp|cnn] [--params P] [--images N] [--degree D]

1. train: a small model on scikit-learn's digits (examples/digits/train.py; numpy, seconds);
2. plan: ``slotplan.plan(model.onnx)``: ONNX import (ReLU as Chebyshev polynomials fitted on
   calibration images), then the layout plan at the given CKKS parameters;
3. client: ``Client.keygen()`` once (secret key 0600 in DIR/client/, evaluation keys in
   DIR/client/eval/), then ``Client.encrypt`` of N test images in one ciphertext file;
4. server: the evaluation keys are copied into DIR/server/ (the files ``EvalKeys.to_bytes()``
   would upload as a tar), and ``slotplan evaluate`` runs there in a separate process that has
   the plan, the weights, the evaluation keys and the ciphertext file, and no secret key;
5. client: ``Client.decrypt`` of the server's answer; the predictions against the labels, the
   float model and the plaintext graph (the same polynomials, in numpy).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
# the MLP (depth 6) fits n14 (~1 GB of evaluation keys); the CNN (two degree-15 ReLU fits,
# depth 14) needs n15 (~3.6 GB of evaluation keys)
DEFAULT_PARAMS = {"cnn": "n15", "mlp": "n14"}


def _train_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("digits_train", HERE / "train.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _slotplan_cmd() -> list[str]:
    script = Path(sys.executable).parent / "slotplan"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "api.cli"]


def _say(msg: str, end: str = "\n") -> None:
    print(msg, end=end, flush=True)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _trained(out: Path, model: str, epochs: int, train_limit: int | None, calib: int,
             numbers: dict[str, Any]) -> tuple[ModuleType, Path]:
    """Step 1: train (kept when the same options trained it before: the script is deterministic)."""
    train = _train_module()
    mdir = out / f"model-{model}"
    argv = [str(mdir), "--model", model, "--epochs", str(epochs), "--calib", str(calib)]
    if train_limit is not None:
        argv += ["--train-limit", str(train_limit)]
    stamp = mdir / "demo-argv.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == argv:
        _say(f"1. model: {mdir}/model.onnx (trained before with the same options)")
        return train, mdir
    t0 = time.perf_counter()
    _say("1. ", end="")
    if train.main(argv) != 0:
        raise SystemExit("demo: training failed")
    stamp.write_text(json.dumps(argv))
    numbers["train_seconds"] = time.perf_counter() - t0
    return train, mdir


def _planned(mdir: Path, model: str, params: str, degree: int | None, server: Path, numbers: dict[str, Any]) -> Any:
    """Step 2: import + plan; the server's files (plan, tables, weights)."""
    import slotplan
    from planner.ir.io import write_arrays

    t0 = time.perf_counter()
    plan = slotplan.plan(mdir / "model.onnx", params=params, calibrate=mdir / "calib.npz", degree=degree,
                         allow_error=degree is not None)  # a degree asked for is kept, with a warning
    numbers["plan_seconds"] = time.perf_counter() - t0
    s = plan.summary
    _say(f"2. plan: {model} at {params}: {s['rotations']} rotations, {s['rotation_keys']} rotation keys, depth "
         f"{s['depth']}, {len(plan.document['program'])} instructions ({numbers['plan_seconds']:.1f} s, import included)")
    plan.save(server / "plan.json", server / "tables.npz")
    assert plan.weights is not None
    write_arrays(server / "weights.npz", plan.weights)
    return plan


def _client_side(plan: Any, client_dir: Path, xs: np.ndarray, numbers: dict[str, Any]) -> tuple[Any, Any]:
    """Step 3: keygen once, then every image in one ciphertext file."""
    import slotplan

    client = slotplan.Client(plan, client_dir)
    t0 = time.perf_counter()
    eval_keys = client.keygen()
    numbers["keygen_seconds"] = time.perf_counter() - t0
    numbers["eval_key_bytes"] = eval_keys.nbytes()
    mode = oct(os.stat(client_dir / "secret.key").st_mode & 0o777)
    _say(f"3. client: keygen {numbers['keygen_seconds']:.1f} s: {client_dir}/secret.key (mode {mode}), evaluation "
         f"keys {_mib(numbers['eval_key_bytes'])} in {len(eval_keys.files())} files")
    t0 = time.perf_counter()
    ct_in = client.encrypt({plan.inputs[0]: xs})
    numbers["encrypt_seconds"] = time.perf_counter() - t0
    numbers["input_ciphertext_bytes"] = len(ct_in)
    _say(f"   encrypt {len(xs)} images: {numbers['encrypt_seconds']:.2f} s "
         f"({numbers['encrypt_seconds'] / len(xs):.3f} s/image), one ciphertext file of {_mib(len(ct_in))}")
    return client, ct_in


def _server_side(eval_keys: Any, ct_in: Any, server: Path, numbers: dict[str, Any]) -> None:
    """Step 4: another process, in a directory with no secret key.  The evaluation keys are
    copied as files (what ``EvalKeys.to_bytes()`` would upload as a tar)."""
    import shutil

    shutil.copytree(eval_keys.path, server / "eval")
    ct_in.save(server / "inputs.ct")
    assert not any(p.name == "secret.key" for p in server.rglob("*"))
    cmd = [*_slotplan_cmd(), "evaluate", str(server / "plan.json"), "--tables", str(server / "tables.npz"),
           "--eval-keys", str(server / "eval"), "--weights", str(server / "weights.npz"),
           "--in", str(server / "inputs.ct"), "-o", str(server / "outputs.ct"), "--json"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=server, capture_output=True, text=True, check=False)
    numbers["evaluate_process_seconds"] = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"demo: the server's `slotplan evaluate` failed: {done.stderr.strip()[-2000:]}")
    report = _last_json(done.stdout)
    per = [float(x) for x in report.get("sample_seconds", [])] if isinstance(report, dict) else []
    numbers["evaluate_seconds_per_image"] = per
    each = f", {np.mean(per):.2f} s/image evaluating" if per else ""
    _say(f"4. server: `slotplan evaluate` in {server} (plan, weights, evaluation keys; no secret key): "
         f"{numbers['evaluate_process_seconds']:.1f} s for the process{each}")


def run_demo(out: Path, model: str = "mlp", params: str | None = None, images: int = 10, degree: int | None = None,
             epochs: int = 40, train_limit: int | None = None, calib: int = 256) -> dict[str, Any]:
    """Run the whole demo into ``out`` (client/ and server/ made fresh; the trained model
    kept when its training options are unchanged); print its steps and table; return the
    numbers (also written to ``out/demo.json``)."""
    import shutil

    import onnx

    import slotplan
    from planner.frontend.reference import reference

    params = params or DEFAULT_PARAMS[model]
    out = out.resolve()  # the server process runs in out/server
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    numbers: dict[str, Any] = {"model": model, "params": params, "images": images}
    train, mdir = _trained(out, model, epochs, train_limit, calib, numbers)
    test_x, test_y = np.load(mdir / "test_x.npz")["x"], np.load(mdir / "test_y.npy")
    if not 1 <= images <= len(test_x):
        raise SystemExit(f"demo: --images must be in 1..{len(test_x)}")
    xs, ys = test_x[:images], test_y[:images]
    for d in ("client", "server"):
        shutil.rmtree(out / d, ignore_errors=True)
    (out / "server").mkdir()
    plan = _planned(mdir, model, params, degree, out / "server", numbers)
    client, ct_in = _client_side(plan, out / "client", xs, numbers)
    _server_side(client.eval_keys, ct_in, out / "server", numbers)

    # 5. client: decrypt, compare
    ct_out = slotplan.Ciphertext.load(out / "server" / "outputs.ct")
    t0 = time.perf_counter()
    (gin,), (gout,) = plan.inputs, plan.outputs
    logits = client.decrypt(ct_out)[gout].reshape(images, -1)
    numbers["decrypt_seconds"] = time.perf_counter() - t0
    graph = plan.graph
    plain = np.stack([reference(graph, {**plan.weights, gin: x.reshape(graph.shape(gin))})[gout].reshape(-1)
                      for x in xs])
    flt = train.float_logits(onnx.load(mdir / "model.onnx"), xs).reshape(images, -1)
    enc_p, plain_p, flt_p = logits.argmax(1), plain.argmax(1), flt.argmax(1)
    _say(f"5. client: decrypt {numbers['decrypt_seconds']:.2f} s ({numbers['decrypt_seconds'] / images:.3f} s/image)\n")
    _say(" image  label  float  plaintext  encrypted  max |encrypted - plaintext|")
    for i in range(images):
        mark = "" if enc_p[i] == ys[i] else "  (wrong)"
        _say(f" {i:5d}  {ys[i]:5d}  {flt_p[i]:5d}  {plain_p[i]:9d}  {enc_p[i]:9d}  "
             f"{np.max(np.abs(logits[i] - plain[i])):.2e}{mark}")
    numbers.update(
        encrypted_correct=int(np.sum(enc_p == ys)), float_correct=int(np.sum(flt_p == ys)),
        encrypted_equals_plaintext=int(np.sum(enc_p == plain_p)), encrypted_equals_float=int(np.sum(enc_p == flt_p)),
        max_abs_error=float(np.max(np.abs(logits - plain))), total_seconds=time.perf_counter() - t_all,
    )
    _say(f"\nencrypted: {numbers['encrypted_correct']}/{images} correct (float model {numbers['float_correct']}/{images});"
         f" argmax equal to the plaintext graph's on {numbers['encrypted_equals_plaintext']}/{images}, to the float "
         f"model's on {numbers['encrypted_equals_float']}/{images}; demo {numbers['total_seconds']:.0f} s in all")
    (out / "demo.json").write_text(json.dumps(numbers, indent=1) + "\n")
    return numbers


def _last_json(text: str) -> Any:
    """The JSON report `slotplan evaluate --json` printed (its last JSON object)."""
    start = text.find("{")
    if start < 0:
        return {}
    try:
        return json.loads(text[start:])
    except ValueError:
        return {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/demo-digits"), help="working directory")
    ap.add_argument("--model", choices=("cnn", "mlp"), default="mlp")
    ap.add_argument("--params", default=None, help="CKKS preset (default n14 for the MLP, n15 for the CNN)")
    ap.add_argument("--images", type=int, default=10, help="test images to classify privately")
    ap.add_argument("--degree", type=int, default=None, help="degree of the ReLU polynomials (default: the importer's)")
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--train-limit", type=int, default=None)
    ap.add_argument("--calib", type=int, default=256)
    a = ap.parse_args(argv)
    from common.errors import SlotplanError

    try:
        run_demo(a.out, a.model, a.params, a.images, a.degree, a.epochs, a.train_limit, a.calib)
    except SlotplanError as e:
        print(f"demo: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
