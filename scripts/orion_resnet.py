"""Orion's ResNet-20 (CIFAR-10) encrypted with Orion itself, for ``slotplan model-bench --orion``.

Runs under Orion's own interpreter (``make orion`` installs orion-fhe from PyPI into
``.venv-orion``); it imports nothing from slotplan. It follows Orion's
``examples/run_resnet.py`` with Orion's ``configs/resnet.yml`` parameters (LogN 16, LogQ
[55, 40 x10], LogP [61 x3], scale 2^40, H 192, bootstrapping LogP [61 x8], hybrid
embedding) and ``orion.models.ResNet20`` (composite-polynomial ReLU), with two changes
this machine forces: there is no internet here, so the weights are torch's seeded
initialisation (BatchNorm statistics measured on random CIFAR-like images, as training
leaves them) and the input is a seeded random CIFAR-like image instead of a CIFAR-10 test
image; and keys and diagonals are not written to disk (``io_mode: none``).

After every phase (init_scheme: keys; fit; compile: diagonals, bootstrap placement and
bootstrappers; encrypt; inference; decrypt) it rewrites ``OUT.json`` with the seconds of the
phases done so far, the phase under way and the peak RSS, so that a run stopped by the
caller's watchdog (memory or time) still says how far it got. The finished file adds the
errors against the cleartext forward pass (max absolute, max relative to max |y|, mean
absolute and Orion's own "precision" -log2(MAE)) and whether the argmax agrees.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import resource
import time

import numpy as np

CONFIG = {
    "ckks_params": {
        "LogN": 16,
        "LogQ": [55, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40],
        "LogP": [61, 61, 61],
        "LogScale": 40,
        "H": 192,
        "RingType": "standard",
    },
    "boot_params": {"LogP": [61, 61, 61, 61, 61, 61, 61, 61]},
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
# CIFAR-10's per-channel mean and standard deviation (torchvision's usual normalisation)
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


class Progress:
    """``OUT.json`` rewritten after every phase."""

    def __init__(self, path: str, info: dict[str, object]) -> None:
        self.path = path
        self.info = info
        self.phases: dict[str, float] = {}
        self.info["phase_seconds"] = self.phases

    def start(self, phase: str) -> float:
        self.info["phase"] = phase
        self.write()
        return time.perf_counter()

    def done(self, phase: str, t0: float) -> None:
        self.phases[phase] = round(time.perf_counter() - t0, 3)
        self.write()

    def write(self) -> None:
        self.info["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.info, f, indent=1)
        os.replace(tmp, self.path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output prefix (writes OUT.json)")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()

    import orion
    import orion.models as models
    import torch

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    prog = Progress(args.out + ".json", {
        "orion_version": importlib.metadata.version("orion-fhe"),
        "torch_version": torch.__version__,
        "config": CONFIG,
        "seed": args.seed,
        "gomaxprocs": os.environ.get("GOMAXPROCS", ""),
        "finished": False,
    })
    net = models.ResNet20()
    gen = torch.Generator().manual_seed(args.seed + 1)
    mean = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    img = (torch.rand(1, 3, 32, 32, generator=gen) - mean) / std
    # BatchNorm statistics as training leaves them: the running mean and variance of each
    # BatchNorm's input over a batch of such images (values then stay within the ranges a
    # bootstrap accepts), with random affine parameters
    batch = (torch.rand(64, 3, 32, 32, generator=gen) - mean) / std
    import orion.nn as on

    bns = [m for m in net.modules() if isinstance(m, on.BatchNorm2d)]

    def measure(mod: object, inputs: tuple[object, ...]) -> None:
        x = inputs[0]
        mod.running_mean.copy_(x.mean((0, 2, 3)))  # type: ignore[attr-defined]
        mod.running_var.copy_(x.var((0, 2, 3)))  # type: ignore[attr-defined]

    net.eval()
    with torch.no_grad():
        for bn in bns:
            bn.weight.uniform_(0.5, 1.0, generator=gen)
            bn.bias.uniform_(-0.1, 0.1, generator=gen)
        hooks = [bn.register_forward_pre_hook(measure) for bn in bns]
        net(batch)  # each BatchNorm's statistics set from its input before it normalises it
        for h in hooks:
            h.remove()
    net.eval()
    with torch.no_grad():
        y_clear = net(img).double().numpy().ravel()

    t0 = prog.start("init_scheme")
    orion.init_scheme(CONFIG)
    prog.done("init_scheme", t0)
    t0 = prog.start("fit")
    orion.fit(net, img)  # as examples/run_resnet.py: the one input
    prog.done("fit", t0)
    t0 = prog.start("compile")
    input_level = orion.compile(net)
    prog.done("compile", t0)
    prog.info["input_level"] = int(input_level)
    t0 = prog.start("encrypt")
    ct = orion.encrypt(orion.encode(img, input_level))
    prog.done("encrypt", t0)
    net.he()
    t0 = prog.start("inference")
    out = net(ct)
    prog.done("inference", t0)
    t0 = prog.start("decrypt")
    y_fhe = np.asarray(out.decrypt().decode(), dtype=np.float64).ravel()[: y_clear.size]
    prog.done("decrypt", t0)

    err = np.abs(y_fhe - y_clear)
    mae = float(np.mean(err))
    prog.info.update({
        "phase": None,
        "finished": True,
        "eval_seconds": prog.phases["inference"],
        "y_clear": [float(v) for v in y_clear],
        "y_orion": [float(v) for v in y_fhe],
        "max_abs_error": float(np.max(err)),
        "max_rel_error": float(np.max(err)) / max(float(np.max(np.abs(y_clear))), 1e-300),
        "mean_abs_error": mae,
        "precision_bits": -math.log2(mae) if mae > 0 else None,
        "argmax_agrees": int(np.argmax(y_fhe)) == int(np.argmax(y_clear)),
    })
    prog.write()
    print(json.dumps({k: v for k, v in prog.info.items() if k not in ("y_clear", "y_orion", "config")}))


if __name__ == "__main__":
    main()
