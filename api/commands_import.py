"""``slotplan import MODEL.onnx``: an ONNX model -> graph + weights (docs/import.md), and the
import step of ``slotplan plan MODEL.onnx``.

Exit statuses follow ``api.common``: 0 success; 2 bad input (an unsupported op, a malformed
model, bad calibration data: one line on stderr naming the ONNX node, nothing written).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from api.common import err, fail, out
from common.errors import SlotplanError

__all__ = ["import_for_plan", "is_onnx", "register"]


def is_onnx(path: Path) -> bool:
    """A model file (by its suffix) rather than a graph file."""
    return path.suffix.lower() == ".onnx"


def _options(degree: int | None, max_error: float | None, margin: float, newton: int,
             cut: list[str] | None = None, allow_error: bool = False, relu: str = "auto") -> Any:
    from planner.frontend.importers.onnx_import import ImportOptions

    if degree is not None and max_error is not None:
        raise SlotplanError("give --degree or --max-error, not both")
    if not 0 <= margin <= 10:
        raise SlotplanError(f"--margin must be in 0..10, got {margin}")
    if not 0 <= newton <= 4:
        raise SlotplanError(f"--newton must be in 0..4, got {newton}")
    return ImportOptions(degree=degree, max_error=max_error, margin=margin, newton=newton,
                         outputs=tuple(dict.fromkeys(cut or ())), allow_error=allow_error, relu=relu)


def stderr_lines(res: Any, margin: float, console: Console) -> None:
    """What a user must not miss, on stderr: the calibration margin (the ranges ``run``
    enforces), what ran the model in float, and every warning."""
    if res.calibrated:
        console.print(
            f"note: calibrated ranges (inputs, nodes, activation domains) widened by {margin:g} x their width on "
            f"each side (--margin); run and encrypt refuse inputs outside the inputs' ranges; "
            f"float runs by {res.calibrator}", markup=False, highlight=False, soft_wrap=True)
    for w in res.warnings:
        console.print(f"warning: {w}", markup=False, highlight=False, soft_wrap=True)


def write_weights(path: Path, weights: dict[str, np.ndarray]) -> None:
    """The weights as an .npz named as the graph's weight tensors (written atomically, the
    exact path given: numpy would otherwise append '.npz')."""
    buf = io.BytesIO()
    arrays: dict[str, Any] = {k: np.asarray(v, dtype=np.float64) for k, v in sorted(weights.items())}
    np.savez(buf, **arrays)
    _atomic_write(path, buf.getvalue())


def _atomic_write(path: Path, data: bytes) -> None:
    try:
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=str(path.parent or Path(".")))
    except OSError as exc:
        raise SlotplanError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise SlotplanError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None


def report_lines(res: Any, console: Console) -> None:
    """The calibration table (activation, range, degree, depth, max error) and the notes."""
    from planner.frontend.importers import approx

    if res.calibrated:
        console.print(f"calibrated on {res.calibrated} sample(s) with {escape(str(res.calibrator))}; ranges widened "
                      "by the margin on each side")
    elif res.approximations:
        lo, hi = approx.DEFAULT_DOMAIN
        console.print(
            f"uncalibrated: activations fitted on the default domain [{lo:g}, {hi:g}] with degree "
            f"{approx.DEFAULT_DEGREE} unless --degree/--max-error (errors below are on the domain); "
            "pass --calibrate C.npz to fit on measured ranges"
        )
    if res.approximations:
        t = Table(title="approximated activations")
        where = " (samples)" if res.calibrated else " (domain)"
        for col in ("activation", "onnx node", "measured range", "domain", "degree", "newton", "depth",
                    "max error" + where):
            t.add_column(col)
        for r in res.approximations:
            measured = f"[{r.measured[0]:.4g}, {r.measured[1]:.4g}]" if r.measured else "-"
            t.add_row(escape(r.function), escape(r.onnx_node), measured,
                      f"[{r.domain[0]:.4g}, {r.domain[1]:.4g}]", str(r.degree), str(r.newton), str(r.depth),
                      f"{r.max_error:.3e}")
        console.print(t)
        if res.calibrated and any(not r.on_samples for r in res.approximations):
            console.print("relu, leaky_relu, abs and max rows chosen by --relu: max error on the widened domain "
                          "and the samples")
    else:
        console.print("no approximated activations (the model is polynomial)")
    for note in res.notes[:5]:
        console.print(f"note: {escape(note)}", soft_wrap=True)
    if len(res.notes) > 5:
        folded = sum("folded into" in n for n in res.notes)
        console.print(f"note: ... {len(res.notes) - 5} more ({folded} BatchNormalization folded in all; "
                      "--json lists every note)")
    if res.end_to_end_error is not None:
        console.print(f"end-to-end max |graph reference - model in float| on the samples: "
                      f"{res.end_to_end_error:.3e}")


def _run_import(model: Path, calibrate: Path | None, degree: int | None, max_error: float | None,
                margin: float, newton: int, cut: list[str] | None = None, allow_error: bool = False,
                relu: str = "auto") -> Any:
    from planner.frontend.importers.onnx_import import import_model

    opts = _options(degree, max_error, margin, newton, cut, allow_error, relu)
    return import_model(model, opts, calibrate)


def import_for_plan(model: Path, calibrate: Path | None, degree: int | None, max_error: float | None,
                    weights_out: Path | None, graph_out: Path | None, console: Console,
                    cut: list[str] | None = None, allow_error: bool = False) -> Any:
    """``plan MODEL.onnx``: import (report on ``console``), write what was asked, return the graph."""
    from planner.frontend.importers.onnx_import import DEFAULT_MARGIN

    res = _run_import(model, calibrate, degree, max_error, DEFAULT_MARGIN, 1, cut, allow_error)
    stderr_lines(res, DEFAULT_MARGIN, console)
    if graph_out is not None:
        _atomic_write(graph_out, (json.dumps(res.graph_json, indent=1) + "\n").encode())
    if weights_out is not None:
        write_weights(weights_out, res.weights)
    report_lines(res, console)
    return res.graph


def import_(
    model: Annotated[Path, typer.Argument(metavar="MODEL.onnx", help="ONNX model file")],
    output: Annotated[Path, typer.Option("-o", "--graph-out", help="graph file to write (slotplan.graph/1)")],
    weights_out: Annotated[Path, typer.Option("--weights-out", help="weights .npz to write (BatchNorm folded), named as the graph's weight tensors")],
    calibrate: Annotated[Path | None, typer.Option("--calibrate", help="calibration samples .npz named as the model's inputs (stacked along the batch dimension when it is 1, else along a new leading one)")] = None,
    degree: Annotated[int | None, typer.Option("--degree", help="degree of every activation polynomial (default 15)")] = None,
    max_error: Annotated[float | None, typer.Option("--max-error", help="choose each activation's degree (3, 7, 15, 31, 63, 127) for this max error on the samples")] = None,
    margin: Annotated[float, typer.Option("--margin", help="widen each measured range by this fraction of its width on each side")] = 0.1,
    newton: Annotated[int, typer.Option("--newton", help="Newton steps after the reciprocal / inverse square root polynomials (softmax, layer norm)")] = 1,
    cut: Annotated[list[str] | None, typer.Option("--output", help="cut the model at this value (e.g. the logits before ArgMax/Softmax); repeat for several outputs. Without it a classifier head (ArgMax, ZipMap, ai.onnx.ml ops) is stripped")] = None,
    allow_error: Annotated[bool, typer.Option("--allow-error", help="write the files with a warning when an approximation misses its error target (--max-error, else 10 percent of the function's largest value) instead of refusing")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the import report as JSON")] = False,
    relu: Annotated[str, typer.Option("--relu", help="Relu/LeakyRelu: auto (the shallowest of the direct fit and the composite sign polynomial that meets the error target), direct, composite")] = "auto",
) -> None:
    """Import an ONNX model: graph + weights, activations as Chebyshev polynomials."""
    try:
        res = _run_import(model, calibrate, degree, max_error, margin, newton, cut, allow_error, relu)
        _atomic_write(output, (json.dumps(res.graph_json, indent=1) + "\n").encode())
        write_weights(weights_out, res.weights)
    except SlotplanError as e:
        raise fail(e) from None
    stderr_lines(res, margin, err)
    if as_json:
        doc = {
            "graph": str(output), "weights": str(weights_out), "nodes": len(res.graph.nodes),
            "inputs": res.input_map, "outputs": res.output_map, "calibrated": res.calibrated,
            "approximations": [r.to_json() for r in res.approximations],
            "ranges": {k: list(v) for k, v in res.ranges.items()}, "notes": res.notes,
            "end_to_end_error": res.end_to_end_error, "warnings": res.warnings, "calibrator": res.calibrator,
            "margin": margin,
        }
        out.print_json(json.dumps(doc))
        return
    report_lines(res, out)
    shapes = ", ".join(f"{escape(k)} {list(res.graph.shape(k))}" for k in res.graph.inputs)
    out.print(f"wrote {escape(str(output))}: {len(res.graph.nodes)} nodes, inputs {shapes}, outputs "
              f"{', '.join(escape(o) for o in res.graph.outputs)}; weights {escape(str(weights_out))}: "
              f"{len(res.weights)} tensors")


def register(app: typer.Typer) -> None:
    app.command("import")(import_)
