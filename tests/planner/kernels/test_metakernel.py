"""MetaKernel acceptance: Table 8 parameters and Tables 4-6 rotation counts at n16."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from planner.frontend.graph import load_graph
from planner.frontend.params import load_params
from planner.pipeline import PlanOptions, PlanResult, plan_graph
from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT
SUITE = json.loads((ROOT / "data/suites/metakernel.json").read_text())


_IMRA: dict[str, PlanResult] = {}


def imra_plan(name: str) -> PlanResult:
    """The IMRA-only row-major n16 plan of a suite workload, made once per test process (the
    Table 8 test and the default-plan test below read the same plan)."""
    if name not in _IMRA:
        g = load_graph(ROOT / f"data/workloads/{name}.json")
        _IMRA[name] = plan_graph(g, load_params("n16"), PlanOptions(kernels=("imra",), input_layout="row-major"))
    return _IMRA[name]


def _workload(w: dict) -> Any:
    name = Path(w["graph"]).stem
    assert (ROOT / "data/suites" / w["graph"]).resolve() == (ROOT / f"data/workloads/{name}.json").resolve()
    return pytest.param(w, id=name, marks=pytest.mark.xdist_group(f"metakernel-{name}"))


@pytest.mark.parametrize("w", [_workload(w) for w in SUITE["workloads"]])
def test_imra_matches_table8_and_paper_rotations(w: dict) -> None:
    res = imra_plan(Path(w["graph"]).stem)
    (node,) = res.plan["nodes"]
    t8 = w["paper"]["table8"]
    assert node["kernel"] == "imra"
    for key in ("Pb", "Ps", "bs_opt", "search_space"):
        assert node["params"][key] == t8[key], key
    for key in ("P_I", "P_O"):
        if t8[key] is not None:
            assert node["params"][key] == t8[key], key
    assert res.plan["summary"]["rotations"] <= w["paper"]["MKR"]
    assert res.plan["summary"]["solver"]["status"] == "optimal"


@pytest.mark.parametrize(("name", "want"), [("mvm1", 6658), ("mvm2", 65535)])
def test_fhelipe_baseline_reproduces_paper_counts(name: str, want: int) -> None:
    """Table 6: FHELIPE needs 6658 (MVM1) and 65535 (MVM2) rotations; ours lowers the same."""
    g = load_graph(ROOT / f"data/workloads/{name}.json")
    res = plan_graph(g, load_params("n16"), PlanOptions(kernels=("fhelipe",), input_layout="row-major"))
    assert res.plan["summary"]["rotations"] == want


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xdist_group(f"metakernel-{n}"))
                                  for n in ("conv4", "conv4_large")])
def test_default_plan_never_worse_than_imra(name: str) -> None:
    g = load_graph(ROOT / f"data/workloads/{name}.json")
    best = plan_graph(g, load_params("n16"), PlanOptions(input_layout="row-major"))
    assert best.plan["summary"]["rotations"] <= imra_plan(name).plan["summary"]["rotations"]
