"""Orion's MLP (784-128-128-10, BatchNorm, x^2) encrypted with Orion itself, for
``slotplan orion-bench``.

Runs under Orion's own interpreter (``make orion`` installs orion-fhe from PyPI into
``.venv-orion``); it imports nothing from slotplan. It builds ``orion.models.MLP`` with
seeded weights and BatchNorm statistics, fits and compiles it with Orion's
``configs/mlp.yml`` parameters (LogN 13, conjugate-invariant ring, LogQ [29, 26 x5], LogP
[29, 29], scale 2^26, hybrid embedding), and times ``net(ciphertext)`` as Orion's
``examples/run_mlp.py`` does, ``--repeat`` times on a fresh encryption each.

It writes ``OUT.npz``: the input ``x`` (784), the eval-mode network as the weights of
slotplan's ``data/models/orion_mlp.json`` (BatchNorm folded into the preceding Linear, in
float64: ``W1 b1 W2 b2 W3 b3``), the float64 cleartext output ``y_clear`` and Orion's
decrypted outputs ``y_orion`` (one row per run); and ``OUT.json``: times and sizes.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import resource
import time

import numpy as np

CONFIG = {
    "ckks_params": {
        "LogN": 13,
        "LogQ": [29, 26, 26, 26, 26, 26],
        "LogP": [29, 29],
        "LogScale": 26,
        "H": 8192,
        "RingType": "ConjugateInvariant",
    },
    "orion": {
        "margin": 2,
        "embedding_method": "hybrid",
        "backend": "lattigo",
        "fuse_modules": True,
        "debug": False,
        "diags_path": "",
        "keys_path": "",
        "io_mode": "none",
    },
}


def _folded(net: object) -> dict[str, np.ndarray]:
    """The eval-mode network as three affine maps (BatchNorm folded), float64."""
    out: dict[str, np.ndarray] = {}
    for i, (fc, bn) in enumerate([(net.fc1, net.bn1), (net.fc2, net.bn2), (net.fc3, None)], 1):  # type: ignore[attr-defined]
        w = fc.weight.detach().double().numpy()
        b = fc.bias.detach().double().numpy()
        if bn is not None:
            g = bn.weight.detach().double().numpy() / np.sqrt(bn.running_var.double().numpy() + bn.eps)
            w = w * g[:, None]
            b = (b - bn.running_mean.double().numpy()) * g + bn.bias.detach().double().numpy()
        out[f"W{i}"], out[f"b{i}"] = w, b
    return out


def _clear(p: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    h = (p["W1"] @ x + p["b1"]) ** 2
    h = (p["W2"] @ h + p["b2"]) ** 2
    return p["W3"] @ h + p["b3"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output prefix (writes OUT.npz and OUT.json)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import orion
    import orion.models as models
    import torch

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    net = models.MLP()
    # An MNIST-like input: pixels in [0, 1], normalised as torchvision's MNIST transform.
    gen = torch.Generator().manual_seed(args.seed + 1)
    img = (torch.rand(1, 1, 28, 28, generator=gen) - 0.1307) / 0.3081
    # BatchNorm statistics as training leaves them: the running mean and variance of each
    # layer's input over a batch of such images (so values stay within the few units a
    # 2^26 scale over a 29-bit q0 allows), with random affine parameters.
    batch = ((torch.rand(256, 1, 28, 28, generator=gen) - 0.1307) / 0.3081).flatten(1)
    with torch.no_grad():
        h = batch
        for fc, bn in ((net.fc1, net.bn1), (net.fc2, net.bn2)):
            h = fc(h)
            bn.running_mean.copy_(h.mean(0))
            bn.running_var.copy_(h.var(0))
            bn.weight.uniform_(0.5, 1.0, generator=gen)
            bn.bias.uniform_(-0.3, 0.3, generator=gen)
            h = ((h - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * bn.weight + bn.bias) ** 2
    net.eval()

    t0 = time.perf_counter()
    orion.init_scheme(CONFIG)
    init_s = time.perf_counter() - t0
    with torch.no_grad():
        y_torch = net(img).double().numpy().ravel()
    t0 = time.perf_counter()
    # As examples/run_mlp.py: fit on the one input (a tensor's batch size becomes the
    # packed batch; x^2 needs no range fit).
    orion.fit(net, img)
    input_level = orion.compile(net)
    compile_s = time.perf_counter() - t0

    runs, outs = [], []
    for _ in range(max(1, args.repeat)):
        ct = orion.encrypt(orion.encode(img, input_level))
        net.he()
        t0 = time.perf_counter()
        out = net(ct)
        runs.append(time.perf_counter() - t0)
        outs.append(np.asarray(out.decrypt().decode(), dtype=np.float64).ravel()[:10])
        net.eval()

    weights = _folded(net)
    x = img.double().numpy().ravel()
    y_clear = _clear(weights, x)
    np.savez(args.out + ".npz", x=x, y_clear=y_clear, y_torch=y_torch, y_orion=np.stack(outs), **weights)
    info = {
        # the installed distribution (orion-fhe 1.0.2 says __version__ = "1.0.1")
        "orion_version": importlib.metadata.version("orion-fhe"),
        "torch_version": torch.__version__,
        "config": CONFIG,
        "input_level": int(input_level),
        "eval_seconds_runs": [round(r, 4) for r in runs],
        "eval_seconds": round(float(np.median(runs)), 4),
        "init_seconds": round(init_s, 3),
        "fit_compile_seconds": round(compile_s, 3),
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "gomaxprocs": os.environ.get("GOMAXPROCS", ""),
        "fold_vs_torch_max_abs": float(np.max(np.abs(y_clear - y_torch))),
    }
    with open(args.out + ".json", "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
