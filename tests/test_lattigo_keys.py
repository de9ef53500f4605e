"""``slotplan keymeasure`` (backends/lattigo_keys.py) on a small graph: keep-all against a
cap on Lattigo, outputs against numpy, the measured key peak against the model and the cap.
No timing asserts."""
from __future__ import annotations

import sys

import pytest

from api.cli import main
from backends.lattigo_backend import available
from backends.lattigo_bench import mvm_graph
from backends.lattigo_keys import measure_graph
from planner.params import load_params

needs_lattigo = pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)")


@needs_lattigo
def test_keymeasure_keep_all_and_a_cap() -> None:
    r = measure_graph(mvm_graph(48, 80), load_params("n13"), fractions=(0.5,), repeat=1, workers=1)
    keep, capped = r["runs"]
    assert keep["strategy"] == "keep-all" and keep["cap"] is None
    assert capped["strategy"] == "joint" and capped["cap"] == int(keep["model_peak_bytes"] * 0.5)
    for run in (keep, capped):
        assert run["max_rel_error"] < 1e-4, run
        assert run["workers"] == 1
        # the key store's measured peak is the plan's modelled one
        assert run["key_bytes_vs_model"] == pytest.approx(1.0, abs=0.05), run
        assert run["rotations"] == run["rotations_planned"] and run["key_loads"] == run["key_loads_planned"]
    assert capped["model_peak_bytes"] <= capped["cap"]
    assert capped["peak_key_bytes"] < keep["peak_key_bytes"] and capped["key_peak_reduction"] > 1


def test_keymeasure_refuses_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    for args, field in ((["--workers", "0"], "--workers"), (["--fractions", "0,2"], "--fractions"),
                        (["--repeat", "0"], "--repeat")):
        old, code = sys.argv, 0
        sys.argv = ["slotplan", "keymeasure", "data/suites/keymemrt.json", *args]
        try:
            main()
        except SystemExit as e:
            code = int(e.code or 0)
        finally:
            sys.argv = old
        out, err = capsys.readouterr()
        assert code == 2, (args, out, err)
        assert field in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
