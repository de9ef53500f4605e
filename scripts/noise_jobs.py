"""Lattigo runs of the error model's calibration and measurements, prepared here and run by
``backends/lattigo/cmd/slotrun`` (a Go binary around slotlattigo.Run) on another machine, or
here: ``prepare`` packs each plan's vectors exactly as backends/lattigo_backend.run_plan
does; ``collect`` reads the decrypted results back, writes data/noise/<preset>.json (the
same fit as ``slotplan noise-calibrate``) and prints the measurements.

    PYTHONPATH=. .venv/bin/python scripts/noise_jobs.py prepare DIR LOCAL [--cnn PLAN TABLES W X Y]
    backends/lattigo/build/slotrun DIR/*/ DIR/cnn/img_*/         # anywhere
    PYTHONPATH=. .venv/bin/python scripts/noise_jobs.py collect RESULTS LOCAL
"""

from __future__ import annotations

import base64
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from noise_table import chain12, squarings12, values_for  # noqa: E402

from backends import noise, sim  # noqa: E402
from backends.lattigo_backend import OutputVector, _json_default, _scatter, pack_vectors  # noqa: E402
from backends.noise_calibrate import _fit, calibration_plan  # noqa: E402
from planner.frontend.params import load_params  # noqa: E402
from planner.pipeline import PlanOptions, plan_graph  # noqa: E402

CAL = ["n13", "n14", "data/params/orion-n13.json", "n15", "n14boot", "n16"]


def _write(job: Path, plan: dict[str, Any], inputs: bytes, pts: bytes | None) -> None:
    job.mkdir(parents=True, exist_ok=True)
    if plan:
        (job / "plan.json").write_text(json.dumps(plan, default=_json_default))
    (job / "inputs.bin").write_bytes(inputs)
    if pts is not None:
        (job / "plaintexts.bin").write_bytes(pts)


def _probed(plan: dict[str, Any], tables: dict[str, np.ndarray], S: int) -> dict[str, Any]:
    plan = json.loads(json.dumps(plan, default=_json_default))
    tables["probe.idx"] = np.arange(S, dtype=np.int64)
    prog = []
    for d in plan["program"]:
        prog.append(d)
        if d["op"] in ("cmul", "pmul", "rescale", "bootstrap", "input", "poly"):
            prog.append({"op": "output", "src": d["dst"], "tensor": f"probe_{d['dst']}", "table": "probe"})
    plan["program"] = prog
    return plan


def prepare(out: Path, local: Path, cnn: list[str] | None, only: list[str] | None = None) -> None:
    rng = np.random.default_rng(0)
    meta: dict[str, Any] = {}
    for spec in only or CAL:
        p = load_params(spec)
        plan, tables, values = calibration_plan(p, rng)
        ins, pts = pack_vectors(plan, values, {}, tables)
        _write(out / f"cal_{p.name}", plan, ins, pts)
        meta[f"cal_{p.name}"] = {"kind": "cal", "spec": spec, "plan": plan, "tables": tables, "values": values}
    p = load_params("n14boot")
    for name, g, init in [] if only else (("chain12", chain12(p.slots), "ones"), ("squarings12", squarings12(p.slots), "near1"),
                          ("squarings12const", squarings12(p.slots), "const")):
        res = plan_graph(g, p, PlanOptions(allow_insecure=True))
        tables = dict(res.tables.items())
        vals = values_for(g, init, 0) if init != "const" else {"x": np.ones(p.slots)}
        assert vals is not None
        plan = _probed(res.plan, tables, p.slots)
        ins, pts = pack_vectors(plan, {k: vals[k] for k in g.inputs}, {k: vals[k] for k in g.weights}, tables)
        _write(out / f"boot_{name}", plan, ins, pts)
        meta[f"boot_{name}"] = {"kind": "probe", "plan": plan, "tables": tables, "values": vals,
                                "graph_output": g.outputs[0], "shape": g.shape(g.outputs[0])}
    if cnn:
        from planner.frontend.graph import parse_graph
        from planner.ir.io import load_plan, load_tables, read_arrays

        plan_p, tab_p, w_p, x_p, y_p = cnn
        plan = load_plan(Path(plan_p))
        tables = dict(load_tables(Path(tab_p), plan).items())
        g = parse_graph(plan["graph"]["spec"])
        w = {k: np.asarray(v, dtype=np.float64).reshape(g.shape(k)) for k, v in read_arrays(w_p, "w").items()}
        X = np.asarray(read_arrays(x_p, "x")["x"], dtype=np.float64)
        n = 50
        _, pts = pack_vectors({**plan, "program": []}, {}, w, tables)
        _write(out / "cnn", plan, b"", pts)
        for s in range(n):
            ins, _ = pack_vectors({**plan, "plaintexts": {}}, {"x": X[s].reshape(g.shape("x"))}, w, tables)
            _write(out / "cnn" / f"img_{s:03d}", {}, ins, None)
        meta["cnn"] = {"kind": "cnn", "plan": plan, "tables": tables, "weights": w, "X": X[:n],
                       "y": np.load(y_p)[:n]}
    local.mkdir(parents=True, exist_ok=True)
    with open(local / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)


def _outputs(result_path: Path, tables: Any, slots: int, shapes: Any = None) -> dict[str, np.ndarray]:
    r = json.loads(result_path.read_text())
    vecs = [OutputVector(o["tensor"], o["table"], int(o["level"]), float(o["log2_scale"]),
                         np.frombuffer(base64.b64decode(o["data"]), dtype="<f8").astype(np.float64))
            for o in r["outputs"]]
    return _scatter(vecs, tables, slots, shapes)


def collect(results: Path, local: Path) -> None:
    with open(local / "meta.pkl", "rb") as f:
        meta = pickle.load(f)
    for job, m in meta.items():
        if m["kind"] != "cal" or not (results / job / "result.json").exists():
            continue
        p = load_params(m["spec"])
        got = _outputs(results / job / "result.json", m["tables"], p.slots)
        want = sim.simulate(m["plan"], m["tables"], m["values"]).outputs
        errs = {t: got[t].ravel() - want[t].ravel() for t in want}
        fit = _fit(p, m["plan"], m["values"], errs)
        st = json.loads((results / job / "result.json").read_text())["stats"]
        doc = {"schema": noise.SCHEMA, "preset": p.name, "sigma": fit["sigma"],
               "calibrated": {"at": (results / "AT").read_text().strip() if (results / "AT").exists() else "",
                              "command": "scripts/noise_jobs.py prepare/collect (seed 0; run by "
                                         "backends/lattigo/cmd/slotrun)",
                              "machine": (results / "MACHINE").read_text().strip() if (results / "MACHINE").exists()
                              else "", "backend": "slotlattigo 1 (lattigo v6.1.1)",
                              "samples_per_op": p.slots, "lattigo_seconds": round(float(st.get("total_seconds", 0)), 2)},
               "detail": fit["detail"]}
        path = noise.NOISE_DIR / f"{p.name}.json"
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path}: " + ", ".join(f"{k}={v:.3e}" for k, v in fit["sigma"].items()))
    rows = {}
    for job, m in meta.items():
        if m["kind"] != "probe" or not (results / job / "result.json").exists():
            continue
        plan, tables, vals = m["plan"], m["tables"], m["values"]
        S = int(plan["params"]["slots"])
        got = _outputs(results / job / "result.json", tables, S)
        exact = sim.simulate(plan, tables, vals).outputs
        model = noise.load_model(plan["params"])
        nr = noise.simulate_noisy(plan, tables, vals, model, np.random.default_rng(0))
        out_t = m["graph_output"]
        e_out = float(np.max(np.abs(got[out_t].ravel() - exact[out_t].ravel())))
        pred = noise.predicted_max_error({out_t: nr.variances[out_t]})
        rows[job] = {"measured": e_out, "predicted": pred, "ratio": pred / e_out if e_out else None,
                     "measured_rel": e_out / float(np.max(np.abs(exact[out_t])))}
        print(f"\n{job}: output measured {e_out:.3e} predicted {pred:.3e} ratio {pred / e_out:.2f}")
        print(f"{'op':10s} {'register':10s} {'max|v|':>9s} {'meas max':>9s} {'meas rms':>9s} {'rel bits':>8s} "
              f"{'pred sigma':>10s} {'pred max':>9s}")
        for d in plan["program"]:
            if d["op"] != "output" or not d["tensor"].startswith("probe_"):
                continue
            t = d["tensor"]
            ins = next(x for x in plan["program"] if x.get("dst") == d["src"])
            e = np.abs(got[t].ravel() - exact[t].ravel())
            mx = float(np.max(np.abs(exact[t])))
            rel = float(e.max()) / mx if mx else float("nan")
            var = nr.variances[t]
            print(f"{ins['op']:10s} {d['src']:10s} {mx:9.2e} {e.max():9.2e} {np.sqrt(np.mean(e**2)):9.2e} "
                  f"{-np.log2(rel) if rel > 0 else 0:8.1f} {np.sqrt(np.max(var)):10.2e} "
                  f"{noise.predicted_max_error({t: var}):9.2e}")
    if "cnn" in meta and (results / "cnn").exists():
        m = meta["cnn"]
        plan, tables, w = m["plan"], m["tables"], m["weights"]
        from planner.frontend.graph import parse_graph

        g = parse_graph(plan["graph"]["spec"])
        out_t = g.outputs[0]
        model = noise.load_model(plan["params"])
        rng = np.random.default_rng(0)
        agree = n = correct = 0
        errs = []
        for s in range(len(m["X"])):
            rp = results / "cnn" / f"img_{s:03d}" / "result.json"
            if not rp.exists():
                continue
            vals = {**w, "x": m["X"][s].reshape(g.shape("x"))}
            lat = _outputs(rp, tables, int(plan["params"]["slots"]), {out_t: g.shape(out_t)})[out_t].ravel()
            nz = noise.simulate_noisy(plan, tables, vals, model, rng).result.outputs[out_t].ravel()
            ref = sim.simulate(plan, tables, vals).outputs[out_t].ravel()
            n += 1
            agree += int(np.argmax(lat) == np.argmax(nz))
            correct += int(np.argmax(lat) == int(m["y"][s]))
            errs.append(float(np.max(np.abs(lat - ref))))
        print(f"\ncnn: Lattigo on {n} images: argmax agrees with the noisy simulator on {agree}; "
              f"Lattigo top-1 {correct}/{n}; max |Lattigo - reference| {max(errs) if errs else 0:.3e}")
    (local / "rows.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "prepare-cal":  # calibration jobs only: DIR LOCAL PRESET...
        prepare(Path(sys.argv[2]), Path(sys.argv[3]), None, sys.argv[4:])
    elif sys.argv[1] == "prepare":
        prepare(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[5:10] if len(sys.argv) > 4 and sys.argv[4] == "--cnn"
                else None)
    else:
        collect(Path(sys.argv[2]), Path(sys.argv[3]))
