"""The IMRA and diagonal kernels' plaintext tables (planner/kernels/imra.py, diagonal.py):
plans built on them equal numpy in the simulator on odd shapes spanning several
ciphertexts, and IMRA's two ways of finding a table's weights (a cached per-pair weight
table for small channel blocks, a per-table lookup for large ones) give the same tables."""

from __future__ import annotations

import numpy as np
import pytest

from planner.frontend.graph import Graph
from planner.kernels import imra
from planner.pipeline import PlanOptions, PlanResult, plan_graph
from tests.helpers import check_plan, conv_graph, matvec_graph, small_params

GRAPHS = {
    "conv 5->7 3x3 pad 1": lambda: conv_graph(5, 9, 7, 7, 3, 3, (1, 1), (1, 1), 1),
    "conv 6->9 stride 2": lambda: conv_graph(6, 11, 10, 9, 3, 3, (2, 2), (1, 1), 1),
    "conv grouped 6->6 g3": lambda: conv_graph(6, 8, 9, 6, 3, 3, (1, 1), (1, 1), 3),
    # two input parts of 6 channels in a block of 8 (IMRA pads the block): the pad rows
    # must not read the next part's weights
    "conv 12->13 two input parts": lambda: conv_graph(12, 8, 8, 13, 3, 3, (1, 1), (1, 1), 1),
    "matvec 37x300": lambda: matvec_graph(37, 300),
    "matvec 700x45": lambda: matvec_graph(700, 45),
}


def _plan(graph: Graph, kernels: tuple[str, ...]) -> PlanResult:
    # log N 10: 512 slots, so these tensors take several ciphertexts and parts
    return plan_graph(graph, small_params(10, levels=4), PlanOptions(kernels=kernels, allow_insecure=True))


def _tables(res: PlanResult) -> dict[str, np.ndarray]:
    t = res.tables
    return {k: np.array(t[k]) for k in t if k.endswith(".idx") and k.startswith("pt/")}


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("kernel", ["imra", "bsgs", "hs-diagonal"])
def test_kernel_tables_match_numpy(name: str, kernel: str) -> None:
    g = GRAPHS[name]()
    res = _plan(g, (kernel,))
    assert any(n["kernel"] == kernel for n in res.plan["nodes"])
    check_plan(res, g, seed=3)


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_imra_large_block_lookup_gives_the_same_tables(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    g = GRAPHS[name]()
    cached = _tables(_plan(g, ("imra",)))
    monkeypatch.setattr(imra, "PAIR_TABLE_MAX_ENTRIES", 0)  # every block "large"
    res = _plan(g, ("imra",))
    looked_up = _tables(res)
    assert cached and cached.keys() == looked_up.keys()
    for k in cached:
        assert np.array_equal(cached[k], looked_up[k]), k
    check_plan(res, g, seed=4)
