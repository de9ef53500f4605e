"""Write the ResNet-18 ImageNet-shaped workload of issue 13 (planning only, n16boot).

    python scripts/make_resnet18.py            # data/workloads/resnet18_imagenet.json

ResNet-18 (He et al. 2016) on a 3x224x224 image, NeuJeans' setting (Sec. 5, 6.2): a 7x7
stride-2 stem conv to 64 channels (112x112), a 3x3 stride-2 average pool (the max pool
replaced by an average: a depthwise conv with 1/9 weights, 56x56), four stages of two
basic blocks (64, 128, 256, 512 channels at 56, 28, 14, 7 pixels; the first block of
stages 2-4 downsamples with a stride-2 3x3 conv and a stride-2 1x1 shortcut conv),
global average pooling (reshape + sum over the 49 pixels, its 1/49 folded into the FC
weight) and a 1000x512 fully connected layer: 17 convs + 3 shortcut convs + the pool.
BatchNorm is folded into the convs (weights only, no bias), activations are the degree-2
polynomial x -> 0.5 x + 0.125 x^2 (as slotplan's ResNet-20).

Ranges: the input promises [-1, 1]; the average pool's weight is [0, 1/9]; every conv,
activation and block output carries the range measured with slotplan's seeded fan-in
initialisation (seeds 0..1, largest |value| times 2, two digits), as for ResNet-20.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import make_resnet20 as r20  # noqa: E402

ACT = [0.0, 0.5, 0.125]


def build(ranges: dict[str, float] | None = None) -> dict[str, Any]:
    tensors: dict[str, Any] = {"x": {"shape": [3, 224, 224], "role": "input", "range": [-1.0, 1.0]}}
    nodes: list[dict[str, Any]] = []

    def conv(nid: str, src: str, cin: int, cout: int, k: int, stride: int, pad: int) -> str:
        w = f"{nid}_w"
        tensors[w] = {"shape": [cout, cin, k, k], "role": "weight"}
        nodes.append({"id": nid, "op": "conv2d", "inputs": [src, w], "stride": [stride, stride],
                      "padding": [pad, pad]})
        return nid

    def poly(nid: str, src: str) -> str:
        nodes.append({"id": nid, "op": "poly", "inputs": [src], "coeffs": list(ACT)})
        return nid

    h = poly("act0", conv("conv0", "x", 3, 64, 7, 2, 3))
    # 3x3 stride-2 average pool: a depthwise conv with weights 1/9
    tensors["pool0_w"] = {"shape": [64, 1, 3, 3], "role": "weight", "range": [0.0, 1.0 / 9.0]}
    nodes.append({"id": "pool0", "op": "conv2d", "inputs": [h, "pool0_w"], "stride": [2, 2], "padding": [1, 1],
                  "groups": 64})
    h = "pool0"
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512), start=1):
        for blk in range(1, 3):
            p = f"s{stage}b{blk}"
            stride = 2 if stage > 1 and blk == 1 else 1
            a = poly(f"{p}_aa", conv(f"{p}_ca", h, cin, cout, 3, stride, 1))
            b = conv(f"{p}_cb", a, cout, cout, 3, 1, 1)
            sc = conv(f"{p}_sc", h, cin, cout, 1, stride, 0) if stride == 2 else h
            nodes.append({"id": f"{p}_add", "op": "add", "inputs": [b, sc]})
            h = poly(f"{p}_out", f"{p}_add")
            cin = cout
    nodes.append({"id": "pool_flat", "op": "reshape", "inputs": [h], "shape": [512, 49]})
    nodes.append({"id": "pool", "op": "sum", "inputs": ["pool_flat"], "axis": 1})
    tensors["fc_w"] = {"shape": [1000, 512], "role": "weight"}
    nodes.append({"id": "fc", "op": "matvec", "inputs": ["fc_w", "pool"]})
    if ranges:
        for n in nodes:
            if n["id"] in ranges:
                b_ = ranges[n["id"]]
                n["range"] = [-b_, b_]
    return {"schema": "slotplan.graph/1", "name": "resnet18_imagenet", "tensors": tensors, "nodes": nodes,
            "outputs": ["fc"]}


def main() -> None:
    g = build()
    r20.SEEDS = range(2)  # two seeds: one reference run of ResNet-18 at 224x224 takes a while
    r = r20.measure(g)
    keep = {k: v for k, v in r.items() if k.endswith(("_ca", "_cb", "_add", "_out", "_aa", "_sc"))
            or k in ("conv0", "act0", "pool0")}
    out = ROOT / "data" / "workloads" / "resnet18_imagenet.json"
    out.write_text(json.dumps(build(keep), indent=1) + "\n")


if __name__ == "__main__":
    main()
