"""Write the ResNet-20 (CIFAR-10) workloads of issue 11.

    python scripts/make_resnet20.py            # data/workloads/resnet20_cifar10*.json

ResNet-20 (He et al. 2016, CIFAR variant): a 3x3 stem conv to 16 channels, three stages
of three basic blocks (16, 32, 64 channels at 32x32, 16x16, 8x8; the first block of
stages 2 and 3 downsamples with a stride-2 3x3 conv and a stride-2 1x1 shortcut conv),
global average pooling and a 64x10 fully connected layer: 19 3x3 convs + 2 shortcut
convs. BatchNorm is folded into the convs (weights only; no bias: the graph keeps
slotplan's plain ops), activations are polynomials, the pooling is a reshape + sum over
the 64 pixels (its 1/64 folded into the FC weight), the FC a matvec.

Ranges: the input promises [-1, 1]; every activation input and block output carries
the range measured with slotplan's seeded fan-in initialisation (seeds 0..7, the
largest |value| times 2), so the plan can scale its bootstraps without worst-case
interval blow-up (a promise that `slotplan run` checks against the reference values).
The degree-15 variant replaces x -> 0.5 x + 0.125 x^2 by a least-squares degree-15
polynomial fit of ReLU on [2 lo, 2 hi] (lo, hi: the smallest and largest activation
input measured in the degree-2 network), in the monomial basis (depth 4 per activation).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.frontend.graph import parse_graph  # noqa: E402
from planner.frontend.reference import random_values, reference  # noqa: E402

DEG2 = [0.0, 0.5, 0.125]
SEEDS = range(8)
MARGIN = 2.0


def build(act: list[float], name: str, ranges: dict[str, float] | None = None) -> dict[str, Any]:
    tensors: dict[str, Any] = {"x": {"shape": [3, 32, 32], "role": "input", "range": [-1.0, 1.0]}}
    nodes: list[dict[str, Any]] = []

    def conv(nid: str, src: str, cin: int, cout: int, k: int, stride: int) -> str:
        w = f"{nid}_w"
        tensors[w] = {"shape": [cout, cin, k, k], "role": "weight"}
        nodes.append({"id": nid, "op": "conv2d", "inputs": [src, w], "stride": [stride, stride],
                      "padding": [k // 2, k // 2]})
        return nid

    def poly(nid: str, src: str) -> str:
        nodes.append({"id": nid, "op": "poly", "inputs": [src], "coeffs": list(act)})
        return nid

    h = poly("act0", conv("conv0", "x", 3, 16, 3, 1))
    cin = 16
    for stage, cout in enumerate((16, 32, 64), start=1):
        for blk in range(1, 4):
            p = f"s{stage}b{blk}"
            stride = 2 if stage > 1 and blk == 1 else 1
            a = poly(f"{p}_aa", conv(f"{p}_ca", h, cin, cout, 3, stride))
            b = conv(f"{p}_cb", a, cout, cout, 3, 1)
            sc = conv(f"{p}_sc", h, cin, cout, 1, stride) if stride == 2 else h
            nodes.append({"id": f"{p}_add", "op": "add", "inputs": [b, sc]})
            h = poly(f"{p}_out", f"{p}_add")
            cin = cout
    nodes.append({"id": "pool_flat", "op": "reshape", "inputs": [h], "shape": [64, 64]})
    nodes.append({"id": "pool", "op": "sum", "inputs": ["pool_flat"], "axis": 1})
    tensors["fc_w"] = {"shape": [10, 64], "role": "weight"}
    nodes.append({"id": "fc", "op": "matvec", "inputs": ["fc_w", "pool"]})
    if ranges:
        for n in nodes:
            if n["id"] in ranges:
                b_ = ranges[n["id"]]
                n["range"] = [-b_, b_]
    return {"schema": "slotplan.graph/1", "name": name, "tensors": tensors, "nodes": nodes, "outputs": ["fc"]}


def measure(g: dict[str, Any]) -> dict[str, float]:
    """Largest |value| of every node over the seeds, times MARGIN, rounded up to 2 digits."""
    graph = parse_graph(g)
    peak: dict[str, float] = {}
    for seed in SEEDS:
        ref = reference(graph, random_values(graph, seed, "fan-in"))
        for n in graph.nodes:
            peak[n.id] = max(peak.get(n.id, 0.0), float(np.max(np.abs(ref[n.id]))))
    out = {}
    for k, v in peak.items():
        b = v * MARGIN
        e = math.floor(math.log10(b)) - 1
        out[k] = round(math.ceil(b / 10**e) * 10**e, 12)
    return out


def relu_fit(lo: float, hi: float, degree: int = 15) -> list[float]:
    """Least-squares fit of ReLU on [lo, hi] (Chebyshev nodes), monomial coefficients."""
    mid, half = (lo + hi) / 2, (hi - lo) / 2
    xs = mid + half * np.cos(np.pi * (np.arange(400) + 0.5) / 400)
    cheb = np.polynomial.chebyshev.Chebyshev.fit(xs, np.maximum(xs, 0.0), degree, domain=[lo, hi])
    mono = cheb.convert(kind=np.polynomial.Polynomial, domain=[lo, hi], window=[lo, hi])
    return [float(c) for c in mono.coef]


def ranged(g: dict[str, Any], act: list[float], name: str) -> dict[str, Any]:
    r = measure(g)
    keep = {k: v for k, v in r.items() if k.endswith(("_ca", "_cb", "_add", "_out", "_aa", "_sc")) or k in ("conv0", "act0")}
    return build(act, name, keep)


def main() -> None:
    out = ROOT / "data" / "workloads"
    g2 = build(DEG2, "resnet20_cifar10")
    (out / "resnet20_cifar10.json").write_text(json.dumps(ranged(g2, DEG2, "resnet20_cifar10"), indent=1) + "\n")
    # degree 15: ReLU fitted on the measured activation inputs of the degree-2 network
    graph = parse_graph(g2)
    lo = hi = 0.0
    for seed in SEEDS:
        ref = reference(graph, random_values(graph, seed, "fan-in"))
        for n in graph.nodes:
            if n.op == "poly":
                lo = min(lo, float(np.min(ref[n.inputs[0]])))
                hi = max(hi, float(np.max(ref[n.inputs[0]])))
    act15 = relu_fit(round(lo * MARGIN, 1), round(hi * MARGIN, 1))
    g15 = build(act15, "resnet20_cifar10_deg15")
    (out / "resnet20_cifar10_deg15.json").write_text(
        json.dumps(ranged(g15, act15, "resnet20_cifar10_deg15"), indent=1) + "\n")


if __name__ == "__main__":
    main()
