"""``slotplan accuracy`` (shared/SPEC.md section 9) and ``slotplan noise-calibrate``.

``accuracy`` runs a plan over a labelled data set: the float model (``--model``, an ONNX
file: onnxruntime when installed, else onnx's reference evaluator), the graph's numpy
reference (the polynomial model) and a back end (``sim``, ``noisy``: the simulator with the
CKKS error model of the plan's preset, or ``lattigo``: every sample encrypted), and reports
the top-1 accuracy of each, their argmax agreement, the largest output error of the back
end against the reference and the worst samples.  Bad input exits 2 with one line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Generator, Mapping
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from api.common import ExitError, err, fail, out
from common.errors import SlotplanError, ValuesError

BACKENDS = ("sim", "noisy", "lattigo")
WORST = 5
# samples encrypted, evaluated and decrypted together by --backend lattigo (one key set for all)
LATTIGO_CHUNK = 10


def register(app: typer.Typer) -> None:
    app.command("accuracy")(accuracy)
    app.command("noise-calibrate")(noise_calibrate)


# ----------------------------------------------------------------------------- inputs
def read_data(path: Path, inputs: list[str], shapes: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, np.ndarray], int]:
    """X.npz: one array per graph input with a leading sample dimension."""
    from planner.ir.io import read_arrays

    arrays = read_arrays(path, "--data")
    for key in arrays:
        if key not in inputs:
            raise ValuesError(f"array in {path} names no graph input (inputs: {', '.join(inputs)})", tensor=key)
    data: dict[str, np.ndarray] = {}
    n: int | None = None
    for name in inputs:
        if name not in arrays:
            raise ValuesError(f"no array named {name!r} in {path} (one per graph input, samples first)", tensor=name)
        a = np.asarray(arrays[name])
        size = int(np.prod(shapes[name]))
        if a.ndim < 1 or a.shape[0] < 1 or a.size != a.shape[0] * size:
            raise ValuesError(
                f"array in {path} has shape {tuple(a.shape)}; expected (samples, {', '.join(map(str, shapes[name]))}) "
                f"({size} elements per sample)", tensor=name)
        if n is not None and a.shape[0] != n:
            raise ValuesError(f"array in {path} has {a.shape[0]} samples, another input has {n}", tensor=name)
        n = int(a.shape[0])
        v = a.astype(np.float64).reshape((n, *shapes[name]))
        if not np.all(np.isfinite(v)):
            raise ValuesError(f"array in {path} holds NaN or infinite values", tensor=name)
        data[name] = v
    assert n is not None
    return data, n


def read_labels(path: Path, n: int) -> np.ndarray:
    try:
        y = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise SlotplanError(f"--labels {path}: cannot read a .npy array ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(y, np.ndarray):
        y.close()
        raise SlotplanError(f"--labels {path}: an .npz archive; labels are one .npy array")
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise SlotplanError(f"--labels {path}: must be a 1-D integer array, got {y.dtype} {tuple(y.shape)}")
    if y.shape[0] != n:
        raise SlotplanError(f"--labels {path}: {y.shape[0]} labels for {n} samples in --data")
    return y.astype(np.int64)


def read_weights(path: Path, graph: Any) -> dict[str, np.ndarray]:
    from planner.ir.io import read_arrays

    arrays = read_arrays(path, "--weights")
    out_: dict[str, np.ndarray] = {}
    for key in arrays:
        if key not in graph.weights:
            raise ValuesError(f"array in {path} is not a graph weight (weights: {', '.join(graph.weights[:8])})",
                              tensor=key)
    for name in graph.weights:
        if name not in arrays:
            raise ValuesError(f"no array named {name!r} in {path} (one per graph weight)", tensor=name)
        shape = graph.shape(name)
        a = np.asarray(arrays[name])
        if a.size != int(np.prod(shape)):
            raise ValuesError(f"array in {path} has shape {tuple(a.shape)}; the graph declares {tuple(shape)}",
                              tensor=name)
        out_[name] = a.astype(np.float64).reshape(shape)
    return out_


def float_model(path: Path, graph: Any, n_out: int) -> Callable[[Mapping[str, np.ndarray]], np.ndarray]:
    """A function of one sample's inputs -> the float model's output vector (the first ONNX
    output with ``n_out`` values per sample)."""
    try:
        import onnx

        model = onnx.load(str(path))
    except Exception as e:  # onnx raises several kinds on a bad file
        raise SlotplanError(f"--model {path}: not an ONNX model ({' '.join(str(e).split())[:120]})") from None
    inits = {i.name for i in model.graph.initializer}
    onnx_inputs = [i for i in model.graph.input if i.name not in inits]
    if len(onnx_inputs) != len(graph.inputs):
        raise SlotplanError(f"--model {path}: {len(onnx_inputs)} inputs, the plan's graph has {len(graph.inputs)}")
    names = {i.name: i.name for i in onnx_inputs}
    by_order = {g: o.name for g, o in zip(graph.inputs, onnx_inputs, strict=True)}
    mapping = {g: (g if g in names else by_order[g]) for g in graph.inputs}
    shapes = {}
    for o in onnx_inputs:
        dims = [d.dim_value if d.HasField("dim_value") else 1 for d in o.type.tensor_type.shape.dim]
        dims = [1] + dims[1:] if dims else [1]
        shapes[o.name] = dims
    try:
        import onnxruntime as ort

        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

        def run(feeds: dict[str, np.ndarray]) -> list[Any]:
            return list(sess.run(None, feeds))
    except ImportError:
        from onnx.reference import ReferenceEvaluator

        ev = ReferenceEvaluator(model)

        def run(feeds: dict[str, np.ndarray]) -> list[Any]:
            return list(ev.run(None, feeds))

    def f(sample: Mapping[str, np.ndarray]) -> np.ndarray:
        feeds = {mapping[g]: np.asarray(sample[g], dtype=np.float32).reshape(shapes[mapping[g]]) for g in graph.inputs}
        try:
            outs = run(feeds)
        except Exception as e:
            raise SlotplanError(f"--model {path}: the float model failed ({' '.join(str(e).split())[:160]})") from None
        for o in outs:
            a = np.asarray(o)
            if a.dtype.kind == "f" and a.size == n_out:
                return a.astype(np.float64).ravel()
        raise SlotplanError(f"--model {path}: no output with {n_out} values per sample (the plan's output)")

    return f


def _lattigo_outputs(
    plan: Mapping[str, Any], tables: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
    data: Mapping[str, np.ndarray], n: int, out_t: str,
) -> Generator[np.ndarray, None, None]:
    """The decrypted output of each of the first ``n`` samples, encrypted on Lattigo: keys
    generated once (client), the samples encrypted, evaluated by one evaluator and decrypted
    in chunks of ``LATTIGO_CHUNK`` (backends/inference.py: the split a deployment runs)."""
    import tempfile

    from backends import inference

    with tempfile.TemporaryDirectory(prefix="slotplan-accuracy-") as tmp:
        key_dir = Path(tmp) / "keys"
        inference.keygen(plan, key_dir)
        for start in range(0, n, LATTIGO_CHUNK):
            stop = min(n, start + LATTIGO_CHUNK)
            ct = inference.encrypt(plan, key_dir, {k: v[start:stop] for k, v in data.items()}, tables=tables)
            out = inference.evaluate(plan, key_dir / "eval", weights, ct, tables=tables)
            ys = np.asarray(inference.decrypt(plan, key_dir, out, tables=tables)[out_t])
            for j in range(stop - start):
                yield ys[j].ravel()


# ----------------------------------------------------------------------------- the run
def evaluate(
    plan: Mapping[str, Any], tables: Mapping[str, np.ndarray] | None, weights: Mapping[str, np.ndarray],
    data: Mapping[str, np.ndarray], labels: np.ndarray, backend: str, model: Path | None, limit: int | None,
    tick: Callable[[], None] = lambda: None, seed: int = 0,
) -> dict[str, Any]:
    from backends.runner import regenerate_tables
    from backends.sim import simulate
    from planner.frontend.graph import parse_graph
    from planner.frontend.reference import reference

    graph = parse_graph(plan["graph"]["spec"])
    if len(graph.outputs) != 1:
        raise SlotplanError(f"accuracy needs a graph with one output (the logits); this one has {len(graph.outputs)}")
    out_t = graph.outputs[0]
    n_out = int(np.prod(graph.shape(out_t)))
    n = labels.shape[0] if limit is None else min(limit, labels.shape[0])
    fm = float_model(model, graph, n_out) if model is not None else None
    if tables is None:
        tables = regenerate_tables(plan)
    noisy_model = None
    rng = np.random.default_rng(seed)
    if backend == "noisy":
        from backends.noise import load_model

        noisy_model = load_model(plan["params"])
    key_levels = {int(k): int(v["level"]) for k, v in plan.get("keys", {}).items()} or None
    preds: dict[str, list[int]] = {"float": [], "reference": [], "backend": []}
    errs: list[float] = []
    predicted: list[float] = []
    margins: list[float] = []

    def _sample(s: int) -> None:
        values = {**weights, **{k: v[s] for k, v in data.items()}}
        ref = np.asarray(reference(graph, values)[out_t], dtype=np.float64).ravel()
        if backend == "sim":
            got = np.asarray(simulate(plan, tables, values, key_levels=key_levels).outputs[out_t]).ravel()
        elif backend == "noisy":
            from backends.noise import predicted_max_error, simulate_noisy

            assert noisy_model is not None
            nr = simulate_noisy(plan, tables, values, noisy_model, rng, key_levels=key_levels)
            got = np.asarray(nr.result.outputs[out_t]).ravel()
            predicted.append(predicted_max_error(nr.variances, seed=s))
        else:
            assert lattigo is not None
            got = next(lattigo)
        preds["reference"].append(int(np.argmax(ref)))
        preds["backend"].append(int(np.argmax(got)))
        if fm is not None:
            preds["float"].append(int(np.argmax(fm(values))))
        errs.append(float(np.max(np.abs(got - ref))) if np.all(np.isfinite(got)) else float("inf"))
        srt = np.sort(ref)
        margins.append(float(srt[-1] - srt[-2]) if srt.size > 1 else float("inf"))
        tick()

    t0 = time.perf_counter()
    lattigo = _lattigo_outputs(plan, tables, weights, data, n, out_t) if backend == "lattigo" else None
    try:
        for s in range(n):
            _sample(s)
    finally:
        if lattigo is not None:
            lattigo.close()
    y = labels[:n]
    rep: dict[str, Any] = {"samples": n, "backend": backend, "output": out_t, "seconds": round(time.perf_counter() - t0, 3)}
    acc = {}
    for k, p in preds.items():
        if p:
            acc[k] = float(np.mean(np.asarray(p) == y))
    rep["top1"] = acc
    agree = {}
    names = [k for k in ("float", "reference", "backend") if preds[k]]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            agree[f"{a}~{b}"] = float(np.mean(np.asarray(preds[a]) == np.asarray(preds[b])))
    rep["argmax_agreement"] = agree
    rep["predictions"] = {k: p for k, p in preds.items() if p}  # per sample: the argmax of each
    rep["max_abs_error"] = max(errs) if errs else 0.0
    if predicted:
        rep["predicted_max_abs_error"] = {"mean": float(np.mean(predicted)), "max": float(np.max(predicted))}
    order = sorted(range(n), key=lambda i: -errs[i])[:WORST]
    rep["worst"] = [
        {"sample": i, "label": int(y[i]), "reference": preds["reference"][i], "backend": preds["backend"][i],
         **({"float": preds["float"][i]} if preds["float"] else {}), "max_abs_error": errs[i],
         "reference_margin": margins[i]}
        for i in order
    ]
    return rep


def accuracy(
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN", help="plan file")],
    weights: Annotated[Path, typer.Option("--weights", help="the graph's weights (.npz, one array per weight)")],
    data: Annotated[Path, typer.Option("--data", help="the inputs (.npz, one array per graph input, samples first)")],
    labels: Annotated[Path, typer.Option("--labels", help="integer labels (.npy, one per sample)")],
    model: Annotated[Path | None, typer.Option("--model", help="the float model (ONNX) for its own top-1")] = None,
    backend: Annotated[str, typer.Option("--backend", help="sim | noisy (CKKS error model) | lattigo (encrypted)")] = "noisy",
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="only the first N samples")] = None,
    tables: Annotated[Path | None, typer.Option("--tables", help="npz tables (regenerated from the plan if absent)")] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**32 - 1, help="the noisy backend's draws")] = 0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    progress: Annotated[bool, typer.Option("--progress", help="progress bar on stderr even when it is not a terminal")] = False,
) -> None:
    """Top-1 accuracy over a labelled data set: float model, polynomial graph and back end."""
    from api.progress import wanted
    from backends.lattigo_backend import LattigoError
    from planner.frontend.graph import parse_graph
    from planner.ir.io import load_plan, load_tables

    try:
        if backend not in BACKENDS:
            raise SlotplanError(f"unknown --backend {backend!r}; known: {', '.join(BACKENDS)}")
        pl = load_plan(plan_file)
        if "spec" not in pl["graph"]:
            raise SlotplanError("the plan does not embed its graph (graph.spec)")
        graph = parse_graph(pl["graph"]["spec"])
        tb = load_tables(tables, pl) if tables is not None else None
        w = read_weights(weights, graph) if graph.weights else {}
        x, n = read_data(data, list(graph.inputs), {k: tuple(graph.shape(k)) for k in graph.inputs})
        y = read_labels(labels, n)
        if model is not None and not model.is_file():
            raise SlotplanError(f"--model {model}: no such file")
        total = n if limit is None else min(limit, n)
        show = wanted(progress, as_json)
        with Progress(TextColumn(f"accuracy [{backend}]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TimeRemainingColumn(), console=err, disable=not show, transient=False) as bar:
            task = bar.add_task("samples", total=total)
            rep = evaluate(pl, tb, w, x, y, backend, model, limit, tick=lambda: bar.advance(task), seed=seed)
    except SlotplanError as e:
        raise fail(e) from None
    except LattigoError as e:
        raise ExitError(f"lattigo: {e}", 1) from None
    if as_json:
        out.print_json(json.dumps(rep))
        return
    t = Table(title=escape(f"{plan_file.name}: {rep['samples']} samples, backend {backend}"))
    t.add_column("model")
    t.add_column("top-1")
    for k, v in rep["top1"].items():
        t.add_row(k, f"{100 * v:.2f}%")
    out.print(t)
    for k, v in rep["argmax_agreement"].items():
        out.print(f"argmax agreement {k}: {100 * v:.2f}%")
    line = f"largest output error (backend vs reference): {rep['max_abs_error']:.3e}"
    if "predicted_max_abs_error" in rep:
        line += f"  (predicted per sample: mean {rep['predicted_max_abs_error']['mean']:.3e})"
    out.print(line)
    out.print("worst samples: " + "; ".join(
        f"#{r['sample']} label {r['label']} ref {r['reference']} backend {r['backend']} err {r['max_abs_error']:.2e}"
        for r in rep["worst"]))


def noise_calibrate(
    params: Annotated[str, typer.Option("--params", help="preset to calibrate (n12..n15, orion-n13 file, n14boot)")],
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**32 - 1)] = 0,
    repeat: Annotated[int, typer.Option("--repeat", help="runs of the calibration plan (pooled)")] = 1,
    output: Annotated[Path | None, typer.Option("--out", "-o", help="[default: data/noise/<preset>.json]")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Measure the error each CKKS instruction adds on Lattigo and write the noisy simulator's
    model (data/noise/<preset>.json, docs/noise.md)."""
    from backends.lattigo_backend import LattigoError
    from backends.noise_calibrate import calibrate_noise
    from planner.frontend.params import load_params

    try:
        p = load_params(params)
        if p.name == "n16boot":
            raise SlotplanError("n16boot is not calibrated on this machine (secure bootstrapping ring); see docs/noise.md")
        doc, path = calibrate_noise(p, seed, repeat, output)
    except (SlotplanError, LattigoError) as e:
        raise fail(e) from None
    if as_json:
        out.print_json(json.dumps(doc))
        return
    out.print(f"wrote {path}")
    for k, v in doc["sigma"].items():
        out.print(f"  sigma.{k} = {v:.3e}")
