"""``slotplan model-bench``: whole models planned, priced and encrypted on Lattigo in one
job (small rings here), the published figures' file, the Orion watchdog, and bad input.

Orion itself (``make orion``, ~6 GB) is not installed by ``make test``: its test is skipped
without ``.venv-orion``, as ``orion-bench``'s is."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from backends.lattigo_backend import available

needs_lattigo = pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)")
REPO = Path(__file__).resolve().parents[2]
ORION_PYTHON = REPO / ".venv-orion" / "bin" / "python"

Cli = Callable[..., tuple[int, str, str]]


def _tiny_mlp(tmp_path: Path, name: str = "tiny_mlp") -> Path:
    """64 -> 32 -> x*x -> 10: three levels (fits n12 and n13)."""
    g = {
        "schema": "slotplan.graph/1", "name": name,
        "tensors": {"x": {"shape": [64], "role": "input", "range": [-1, 1]},
                    "W1": {"shape": [32, 64], "role": "weight"}, "W2": {"shape": [10, 32], "role": "weight"}},
        "nodes": [{"id": "h", "op": "matvec", "inputs": ["W1", "x"]},
                  {"id": "a", "op": "mul", "inputs": ["h", "h"]},
                  {"id": "y", "op": "matvec", "inputs": ["W2", "a"]}],
        "outputs": ["y"],
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(g))
    return path


def _deep_chain(tmp_path: Path) -> Path:
    """Six degree-2 polynomials (12 levels) on 64 values: needs a bootstrap at n16boot."""
    nodes, src = [], "x"
    for i in range(6):
        nodes.append({"id": f"p{i}", "op": "poly", "inputs": [src], "coeffs": [0.1, 0.5, 0.25]})
        src = f"p{i}"
    g = {"schema": "slotplan.graph/1", "name": "deep_chain",
         "tensors": {"x": {"shape": [64], "role": "input", "range": [-1, 1]}}, "nodes": nodes, "outputs": [src]}
    path = tmp_path / "deep_chain.json"
    path.write_text(json.dumps(g))
    return path


@needs_lattigo
def test_small_model_modelled_and_measured_on_lattigo(cli: Cli, tmp_path: Path) -> None:
    """n13 (secure): plan, price and run encrypted; the JSON row has the modelled and
    measured columns, the error is within CKKS precision and the outputs were compared."""
    out = tmp_path / "row.json"
    code, stdout, err = cli("model-bench", _tiny_mlp(tmp_path), "--params", "n13", "--seed", "5", "--repeat", "2",
                            "--json", "--out", out)
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc == json.loads(out.read_text())
    assert doc["schema"] == "slotplan.model-bench/1"
    (row,) = doc["rows"]
    assert row["graph"] == "tiny_mlp" and row["params"] == "n13" and row["security"]["secure"]
    md, m = row["modelled"], row["measured"]
    for k in ("bootstrap_seconds", "bootstraps", "fused_seconds", "key_load_seconds", "other_seconds"):
        assert k in md and k in m
    assert md["total_seconds"] > 0 and m["eval_seconds"] > 0
    assert row["model_over_measured"] == pytest.approx(md["total_seconds"] / m["eval_seconds"], rel=1e-2)
    # no bootstrap: no DFT matrices on either side
    assert md["matrix_seconds"] == 0 and row["model_over_measured_without_matrices"] == pytest.approx(
        row["model_over_measured"], rel=1e-2)
    assert len(m["eval_seconds_runs"]) == 2 and m["ok"]
    assert 0 < m["max_rel_error"] < 1e-4 and m["bits"] > 13
    assert m["keygen_seconds"] > 0 and m["peak_rss_bytes"] > 0 and m["process_model_bytes"] > 0
    # (rounded to 4 and 3 decimals)
    assert m["per_sample_seconds"] == pytest.approx(m["eval_seconds"], rel=1e-3, abs=1e-3)
    # no bootstrapping: no DFT matrices, each repeat one evaluation
    assert [e["run"] for e in m["evaluations"]] == [0, 1] and not any(e["matrices_built"] for e in m["evaluations"])
    assert m["per_sample_seconds_with_matrices"] == pytest.approx(m["per_sample_seconds"])
    assert row["published"] == [] and row["network"] is None  # no published figures for this graph
    # where the time went: no bootstrap to split into phases; the process's CPU over the run
    assert m["bootstrap_phases"] is None
    assert m["eval_cpu"]["user_seconds"] > 0 and m["eval_cpu"]["gc_cycles"] >= 0


@needs_lattigo
@needs_lattigo
def test_plaintext_store_runs_after_the_first_read_every_plaintext_back(cli: Cli, tmp_path: Path) -> None:
    """--plaintext-store: the first run encodes the streamed plaintexts and spills them, the
    second reads each one back (no encoding), stays correct and is the reported run; the
    model prices that run with the store's reads; the store leaves no file behind."""
    store = tmp_path / "store"
    store.mkdir()
    code, stdout, err = cli("model-bench", _tiny_mlp(tmp_path), "--params", "n13", "--seed", "3", "--repeat", "2",
                            "--plaintext-store", store, "--json")
    assert code == 0, err
    (row,) = json.loads(stdout)["rows"]
    m = row["measured"]
    first, second = m["plaintext_store"]["runs"]
    assert first["added"] == first["entries"] > 0 and first["hits"] == 0 and first["write_bytes"] == first["file_bytes"]
    assert second["hits"] == first["entries"] and second["added"] == 0 and second["misses"] == 0
    assert second["read_bytes"] == first["file_bytes"]
    assert m["plaintext_store"]["median_run"] == 1 and m["ok"] and 0 < m["max_rel_error"] < 1e-4
    assert row["modelled"]["conditions"]["plaintext_store"] is True
    assert list(store.iterdir()) == []


def test_insecure_ring_is_flagged_and_the_table_prints(cli: Cli, tmp_path: Path) -> None:
    """n12 is below 128 bits: the table says so, with a warning line naming the bound."""
    code, stdout, err = cli("model-bench", _tiny_mlp(tmp_path), "--params", "n12")
    assert code == 0, err
    assert "BELOW 128" in stdout and "below 128-bit security" in stdout
    assert "by component" in stdout and "tiny_mlp measured" in stdout


@needs_lattigo
def test_onnx_model_runs_with_its_own_weights(cli: Cli, tmp_path: Path) -> None:
    """An ONNX model is imported as ``slotplan plan`` does; the run uses the imported
    weights (not random ones), so the decrypted output matches the ONNX graph's reference."""
    from tests.onnx_models import mlp, save

    model = save(mlp("square", (64, 32, 10), seed=1), tmp_path / "mlp.onnx")
    code, stdout, err = cli("model-bench", model, "--params", "n13", "--json")
    assert code == 0, err
    (row,) = json.loads(stdout)["rows"]
    assert row["measured"]["ok"] and row["measured"]["max_rel_error"] < 1e-4
    reads = row["measured"]["storage_read_bytes"]  # the page cache's misses in the run
    assert reads is None or reads >= 0
    # the user's input with the model's own weights (no --weights: the import's)
    x = tmp_path / "x.npz"
    np.savez(x, input=np.random.default_rng(2).uniform(-1, 1, (1, 64)))
    code, stdout, err = cli("model-bench", model, "--params", "n13", "--inputs", x, "--json")
    assert code == 0, err
    (row,) = json.loads(stdout)["rows"]
    assert row["measured"]["ok"] and row["measured"]["max_rel_error"] < 1e-4
    # a wrong input file is refused before planning, naming the array
    np.savez(x, image=np.zeros(64))
    code, stdout, err = cli("model-bench", model, "--params", "n13", "--inputs", x)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "image" in err, err


def test_dry_run_prices_a_bootstrapping_plan_at_n16boot(cli: Cli, tmp_path: Path) -> None:
    """The n16boot path, planned and priced only: bootstraps by kind, modelled components
    adding up, the secure ring, nothing measured."""
    code, stdout, err = cli("model-bench", _deep_chain(tmp_path), "--dry-run", "--json")
    assert code == 0, err
    (row,) = json.loads(stdout)["rows"]
    assert row["params"] == "n16boot" and row["security"]["secure"] and "measured" not in row
    assert row["solver"]["status"] in ("optimal", "feasible") and row["solver"]["name"] == "cpsat"
    md = row["modelled"]
    assert row["bootstraps_planned"] >= 1
    assert sum(k["count"] for k in md["bootstraps"].values()) == row["bootstraps_planned"]
    assert md["bootstrap_seconds"] > 1  # an n16boot bootstrap costs seconds
    parts = md["bootstrap_seconds"] + md["fused_seconds"] + md["key_load_seconds"] + md["other_seconds"]
    assert parts + md["stall_seconds"] == pytest.approx(md["total_seconds"], abs=0.01)
    if available():
        assert row["process_model"]["growth"] > 7e9  # the bootstrapping keys alone are 7.9 GB
    # the table's CPU is reported, and a table from another CPU (or one that does not say) warned
    from api.model_bench import table_cpu_warning
    from backends.calibrate import cpu_identity

    assert "table_cpu" in md and md["table_cpu_matches"] in (True, False, None)
    assert (table_cpu_warning(md) is None) == bool(md["table_cpu_matches"])
    here = cpu_identity() | {"date": "2026-11-27T00:00:00Z"}
    assert table_cpu_warning({"table_cpu": here, "table_cpu_matches": True}) is None
    other = here | {"cpu_model_number": -1}
    line = table_cpu_warning({"time_model": "cost table x", "table_cpu": other, "table_cpu_matches": False})
    assert line and "model -1" in line and "another CPU" in line and "slotplan calibrate" in line


def test_costs_plans_and_prices_with_a_calibrated_table(cli: Cli, tmp_path: Path) -> None:
    """--costs: the plan is made and priced with the user's table (here the committed n16boot
    table with every bootstrap price doubled), named in the row."""
    from common.paths import DATA_DIR

    table = json.loads((DATA_DIR / "costs" / "n16boot-lattigo.json").read_text())
    table["name"] = "n16boot-doubled"
    table["weights"]["bootstrap"] *= 2
    # (the replicas a plan may use, priced from s<k> by the time model, doubled as well)
    from planner.cost.tables import load_costs
    from planner.cost.timing import TimeModel

    tm = TimeModel(load_costs("n16boot-lattigo"))
    derived = {f"r{k[1:]}": tm.variant_units(f"r{k[1:]}") for k in table["boot_variants"] if k[0] == "s"}
    table["boot_variants"] = {k: 2 * v for k, v in {**derived, **table["boot_variants"]}.items()}
    for v in table["measurements"]["boot_variants"].values():  # each kind as the executor runs it
        if "median_ms" in v:
            v["median_ms"] *= 2
    path = tmp_path / "doubled.json"
    path.write_text(json.dumps(table))
    g = _deep_chain(tmp_path)
    rows = []
    for extra in ([], ["--costs", str(path)]):
        code, stdout, err = cli("model-bench", g, "--dry-run", "--json", *extra)
        assert code == 0, err
        rows.append(json.loads(stdout)["rows"][0])
    base, doubled = rows
    assert "n16boot-doubled" in doubled["modelled"]["time_model"] and "n16boot-doubled" not in base["modelled"]["time_model"]
    assert doubled["bootstraps_planned"] == base["bootstraps_planned"] >= 1
    assert doubled["modelled"]["bootstrap_seconds"] == pytest.approx(2 * base["modelled"]["bootstrap_seconds"], rel=1e-3)


def test_a_plan_priced_under_another_cpus_table_is_priced_again_with_this_cpus(
        cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU of the committed Zen 4 table (n16boot-zen4), the preset's own table (another
    CPU's) prices the plan and the row adds ``modelled_this_cpu``: the same plan priced with
    n16boot-zen4; on the CPU of the preset's table nothing is added."""
    import backends.calibrate
    from common.paths import DATA_DIR

    def machine(name: str) -> dict[str, object]:
        m = json.loads((DATA_DIR / "costs" / f"{name}.json").read_text())["measurements"]["machine"]
        keys = ("cpu_model", "cpu_family", "cpu_model_number", "cpu_stepping", "cpu_flags")
        return {k: m[k] for k in keys if k in m}

    g = _deep_chain(tmp_path)
    rows = {}
    for name in ("n16boot-zen4", "n16boot-lattigo"):
        monkeypatch.setattr(backends.calibrate, "cpu_identity", lambda name=name: machine(name))
        code, stdout, err = cli("model-bench", g, "--dry-run", "--json")
        assert code == 0, err
        rows[name] = json.loads(stdout)["rows"][0]
    zen4, zen3 = rows["n16boot-zen4"], rows["n16boot-lattigo"]
    assert zen3["modelled"]["table_cpu_matches"] is True and "modelled_this_cpu" not in zen3
    assert zen4["modelled"]["table_cpu_matches"] is False
    mh = zen4["modelled_this_cpu"]
    assert mh["table"] == "n16boot-zen4" and mh["table_cpu_matches"] is True and "n16boot-zen4" in mh["time_model"]
    # the same plan (its bootstraps), other prices: a Zen 4 bootstrap is faster than a Zen 3 one
    assert sum(k["count"] for k in mh["bootstraps"].values()) == zen4["bootstraps_planned"]
    assert 0 < mh["bootstrap_seconds"] < zen4["modelled"]["bootstrap_seconds"]
    assert zen4["modelled"] == zen3["modelled"] | {k: zen4["modelled"][k] for k in ("table_cpu_matches",)}


def test_a_solver_stopped_far_from_its_bound_is_noted() -> None:
    """A feasible plan more than 10% above the solver's lower bound gets one note line naming
    --time-limit; an optimal one, or one close to its bound, none."""
    from api.common import solver_gap_note

    line = solver_gap_note({"status": "feasible", "objective": 568, "bound": 400})
    assert line and "42% above its lower bound" in line and "--time-limit" in line
    assert solver_gap_note({"status": "feasible", "objective": 105, "bound": 100}) is None
    assert solver_gap_note({"status": "optimal", "objective": 538, "bound": 538}) is None
    assert solver_gap_note({"status": "feasible", "objective": 5, "bound": 0}) is None
    assert solver_gap_note({}) is None


def test_published_figures_cite_their_sources() -> None:
    from api.model_bench import find_network, load_published

    nets = load_published()
    r20 = find_network(nets, "resnet20_cifar10", None)
    assert r20 is not None and r20.orion == "resnet20" and r20.figures
    for n in nets:
        for f in n.figures:
            assert f.source and f.seconds_per_image > 0
            assert "/work/shared/" in f.source  # a paper or the peers note, named
    # MetaKernel's Table 7 figure for ResNet-20 on one CPU
    assert any(f.seconds_per_image == pytest.approx(1070.37) for f in r20.figures)


def test_a_bad_published_file_is_named(tmp_path: Path) -> None:
    from api.model_bench import load_published
    from common.errors import SlotplanError

    (tmp_path / "x.json").write_text(json.dumps({"schema": "slotplan.published/1", "networks": [
        {"network": "n", "description": "d", "graphs": ["g"], "figures": [{"system": "s"}]}]}))
    with pytest.raises(SlotplanError, match="x.json: networks.0.figures.0.hardware"):
        load_published(tmp_path)


@pytest.mark.parametrize(("args", "needle"), [
    (["missing.json"], "no such file"),
    (["{g}", "--repeat", "0"], "--repeat"),
    (["{g}", "{g}", "--inputs", "x.npz"], "one MODEL"),
    (["{g}", "--boot-variants", "maybe"], "--boot-variants"),
    (["{g}", "--batch", "0"], "--batch"),
    (["{g}", "--out", "row.txt"], "--out"),
    (["{g}", "--memory-cap", "lots"], "lots"),
    (["{g}", "--params", "n99"], "n99"),
    (["{g}", "--network", "nope"], "--network"),
    (["{g}", "--degree", "3"], "only for an ONNX model"),
    (["{g}", "--time-limit", "-1"], "time_limit"),
    (["{g}", "--inputs", "{tmp}/none.npz", "--weights", "{tmp}/none.npz"], "none.npz"),
    (["{g}", "--orion", "--orion-python", "{tmp}/none/python"], "make orion"),
    (["{g}", "--plaintext-store", "{tmp}/nowhere"], "--plaintext-store"),
    (["{g}", "--params", "n13", "--costs", "default"], "not a calibrated table"),
    (["{g}", "--params", "n13", "--costs", "n14-lattigo"], "measured at params 'n14', not at --params 'n13'"),
    (["{g}", "--costs", "{tmp}/none.json"], "none.json"),
])
def test_bad_input_is_one_line_exit_2(cli: Cli, tmp_path: Path, args: list[str], needle: str) -> None:
    g = _tiny_mlp(tmp_path)
    argv = [a.format(g=g, tmp=tmp_path) for a in args]
    code, stdout, err = cli("model-bench", *argv)
    assert code == 2, (stdout, err)
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_watchdog_stops_a_process_past_its_memory_or_time(tmp_path: Path) -> None:
    """What stops Orion's ResNet-20 when it does not fit: RSS past the limit, or time."""
    from api.model_bench import watched

    grow = "import time\nx = bytearray(400 * 10**6)\nx[::4096] = b'1' * len(x[::4096])\ntime.sleep(30)"
    w = watched([sys.executable, "-c", grow], 200 * 10**6, 60, tmp_path, poll_s=0.05)
    assert w["stopped"] and "passed the limit" in w["stopped"] and w["returncode"] != 0
    assert w["peak_rss_bytes"] > 200 * 10**6 and w["wall_seconds"] < 30
    w = watched([sys.executable, "-c", "import time; time.sleep(30)"], 10**10, 1, tmp_path, poll_s=0.05)
    assert w["stopped"] == "still running after 1 s" and w["wall_seconds"] < 10
    w = watched([sys.executable, "-c", "print('fine')"], 10**10, 60, tmp_path, poll_s=0.05)
    assert w["stopped"] is None and w["returncode"] == 0 and w["log_tail"] == ["fine"]


@needs_lattigo
@pytest.mark.skipif(not ORION_PYTHON.exists(), reason="Orion not installed (make orion)")
def test_orion_mlp_runs_in_the_same_job(cli: Cli) -> None:
    """``--orion`` on Orion's MLP: Orion's own run first, then ours on Orion's input and
    folded weights (the same network); ours at n14 (Orion's own chain keeps ~10 bits, below
    ``slotplan run``'s 1e-4 tolerance: orion-bench compares on it)."""
    code, stdout, err = cli("model-bench", REPO / "data" / "models" / "orion_mlp.json", "--params", "n14",
                            "--orion", "--json")
    assert code == 0, err
    (row,) = json.loads(stdout)["rows"]
    o = row["orion"]
    assert o["status"] == "ok" and o["eval_seconds"] > 0 and o["max_rel_error"] < 1e-1
    assert row["network"] == "orion_mlp" and row["published"] == []
    assert row["measured"]["ok"] and row["measured"]["max_rel_error"] < 1e-2
    assert np.isfinite(row["modelled"]["total_seconds"])


def test_orion_resnet_row_says_where_it_stopped(tmp_path: Path) -> None:
    """run_orion_resnet reads the progress the script leaves after each phase: a run killed
    by the watchdog says the phase it was in and why; a finished one is ok with its errors.
    (A stand-in interpreter plays the script: Orion's real ResNet-20 needs > 18 GB here.)"""
    from api.model_bench import run_orion_resnet

    def fake(mode: str) -> Path:
        path = tmp_path / f"python-{mode}"
        path.write_text(f"""#!{sys.executable}
import json, sys, time
out = sys.argv[sys.argv.index("--out") + 1]
if {mode == "ok"}:
    info = {{"finished": True, "phase": None, "eval_seconds": 2.5, "max_rel_error": 0.01}}
else:
    info = {{"phase": "compile", "phase_seconds": {{"init_scheme": 1.0, "fit": 2.0}}, "finished": False}}
json.dump(info, open(out + ".json", "w"))
if {mode == "grow"}:
    x = bytearray(300 * 10**6)
    x[::4096] = b"1" * len(x[::4096])
    time.sleep(30)
""")
        path.chmod(0o755)
        return path

    row = run_orion_resnet(fake("grow"), 0, rss_limit=150 * 10**6, timeout_s=60)
    assert row["status"].startswith("stopped in phase compile: RSS") and row["phase_seconds"]["fit"] == 2.0
    assert row["peak_rss_bytes"] > 150 * 10**6 and row["wall_seconds"] < 30
    row = run_orion_resnet(fake("ok"), 0, rss_limit=150 * 10**6, timeout_s=60)
    assert row["status"] == "ok" and row["eval_seconds"] == 2.5 and row["log_tail"] == []
    row = run_orion_resnet(fake("fail"), 0, rss_limit=150 * 10**6, timeout_s=60)
    assert row["status"].startswith("failed in phase compile (exit 0)")
