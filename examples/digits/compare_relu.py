"""Direct against composite ReLU on a trained digits model: per import mode, the graph's depth,
the bootstraps of its plans, and the polynomial graph's top-1 on the 450 test images and its
argmax agreement with the float model.

    python examples/digits/compare_relu.py OUT [--params n15,n14boot] [--sim N]

OUT is train.py's output directory (model.onnx, calib.npz, test_x.npz, test_y.npy). The
polynomial graph is evaluated with the graph's numpy reference (planner.frontend.reference), which the
simulator matches to 1e-9; ``--sim N`` also runs the first N test images through the
simulator on each plan and reports the largest |simulator - reference|.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from backends.sim import simulate
from common.errors import SlotplanError
from planner.frontend.importers.onnx_import import ImportOptions, import_model
from planner.frontend.params import preset
from planner.frontend.reference import reference
from planner.pipeline import plan_graph

MODES: dict[str, ImportOptions] = {
    "direct-15": ImportOptions(relu="direct"),  # the importer's fit before --relu
    "direct-63": ImportOptions(relu="direct", degree=63),
    "auto": ImportOptions(relu="auto"),  # the default: target B / 64
    "composite": ImportOptions(relu="composite"),  # the shallowest composite for B / 64
    "auto-0.1": ImportOptions(relu="auto", max_error=0.1),
    "auto-0.01": ImportOptions(relu="auto", max_error=0.01),
    "composite-0.01": ImportOptions(relu="composite", max_error=0.01),
    "auto-0.001": ImportOptions(relu="auto", max_error=0.001),
}


def _logits(res: Any, xs: np.ndarray) -> np.ndarray:
    gin, gout = res.input_map["x"], res.output_map["logits"]
    return np.stack([reference(res.graph, {**res.weights, gin: x.reshape(res.graph.shape(gin))})[gout].reshape(-1)
                     for x in xs])


def _plan(res: Any, name: str, xs: np.ndarray, sim: int) -> dict[str, Any]:
    try:
        pr = plan_graph(res.graph, preset(name))
    except SlotplanError as exc:
        return {"params": name, "error": str(exc).splitlines()[0][:120]}
    s = pr.plan["summary"]
    out: dict[str, Any] = {"params": name, "depth": s.get("depth"),
                           "bootstraps": int(s.get("bootstraps", {}).get("count", 0))
                           if isinstance(s.get("bootstraps"), dict) else s.get("bootstraps", 0)}
    if sim:
        gin, gout = res.input_map["x"], res.output_map["logits"]
        worst = 0.0
        for x in xs[:sim]:
            values = {**res.weights, gin: x.reshape(res.graph.shape(gin))}
            got = simulate(pr.plan, pr.tables, values).outputs[gout].reshape(-1)
            worst = max(worst, float(np.max(np.abs(got - reference(res.graph, values)[gout].reshape(-1)))))
        out["sim_max_abs_vs_reference"] = worst
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--params", default="n15,n14boot")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--sim", type=int, default=0)
    args = ap.parse_args(argv)
    model = onnx.load(args.out / "model.onnx")
    xs = np.load(args.out / "test_x.npz")["x"]
    ys = np.load(args.out / "test_y.npy")
    ev = ReferenceEvaluator(model)
    flt = np.stack([ev.run(None, {"x": x[None].astype(np.float32)})[0].reshape(-1) for x in xs])
    f_pred = np.argmax(flt, axis=1)
    rows = []
    print(f"float model: top-1 {np.mean(f_pred == ys):.4f} on {len(ys)} test images")
    for mode in args.modes.split(","):
        t0 = time.perf_counter()
        res = import_model(args.out / "model.onnx", MODES[mode], calibrate=args.out / "calib.npz")
        logits = _logits(res, xs)
        pred = np.argmax(logits, axis=1)
        row = {"mode": mode,
               "relus": [{"node": r.onnx_node, "function": r.function, "domain": list(r.domain),
                          "depth": r.depth, "max_error": r.max_error} for r in res.approximations],
               "graph_top1": float(np.mean(pred == ys)), "float_top1": float(np.mean(f_pred == ys)),
               "argmax_agreement": float(np.mean(pred == f_pred)),
               "max_abs_logit_error": float(np.max(np.abs(logits - flt))),
               "plans": [_plan(res, p, xs, args.sim) for p in args.params.split(",")],
               "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
