"""Composite minimax sign / ReLU (planner/frontend/importers/composite.py) and the importer's choice."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from backends.sim import simulate
from common.errors import ModelError
from planner.frontend.importers import approx, composite
from planner.frontend.importers.onnx_import import ImportOptions, import_model
from planner.frontend.params import preset
from planner.frontend.reference import reference
from planner.pipeline import plan_graph
from tests import onnx_models as M


def test_stored_ladders_meet_their_error_on_random_points() -> None:
    rng = np.random.default_rng(0)
    lads = composite.ladders()
    assert [lad.alpha for lad in lads] == list(composite.ALPHAS)
    for lad in lads:
        x = np.concatenate([rng.uniform(lad.eps, 1.0, 100_000),
                            np.exp(rng.uniform(math.log(lad.eps), 0.0, 100_000))])
        s = lad.sign(x)
        assert np.max(np.abs(s - 1.0)) <= lad.error * (1 + 1e-6) + 1e-12, lad.degrees
        assert np.allclose(lad.sign(-x), -s, atol=1e-12)  # odd
        # each stage's argument stays inside its Chebyshev domain on all of [-1, 1]
        v = rng.uniform(-1.0, 1.0, 200_000)
        for st in lad.stages:
            assert np.max(np.abs(v)) <= st.scale
            v = st(v)
        assert lad.error <= 2.0 ** -lad.alpha * 1.02  # alpha bits, within 2% (measured error)


def test_regenerating_a_ladder_gives_the_stored_coefficients() -> None:
    stored = composite.ladders()[0]
    again = composite.compose(stored.alpha, stored.degrees)
    for a, b in zip(stored.stages, again.stages, strict=True):
        np.testing.assert_allclose(a.coeffs, b.coeffs, rtol=1e-7, atol=1e-9)


def test_remez_is_minimax() -> None:
    """Equioscillation at degree 7 on [0.1, 1]: no random perturbation of the coefficients
    lowers the largest error."""
    c, err = composite.remez_odd_sign(0.1, 1.0, 7, 1.0)
    x = np.linspace(0.1, 1.0, 200_001)

    def worst(coeffs: np.ndarray) -> float:
        full = np.zeros(8)
        full[1::2] = coeffs
        return float(np.max(np.abs(np.polynomial.chebyshev.chebval(x, full) - 1.0)))

    assert worst(c) == pytest.approx(err, rel=1e-6)
    rng = np.random.default_rng(1)
    for _ in range(200):
        assert worst(c + rng.normal(scale=1e-3 * err, size=c.shape)) >= err * (1 - 1e-9)


@pytest.mark.parametrize(("domain", "degree", "slope"), [
    ((-2.4, 2.4), 15, 0.0), ((-0.65, 2.18), 7, 0.0), ((-0.1, 5.0), 3, 0.0), ((-8.0, 8.0), 31, 0.0),
    ((-3.0, 1.0), 15, 0.1), ((-1.0, 1.0), 16, -1.0), ((-0.2, 0.1), 7, 0.0)])
def test_minimax_fit_of_relu_is_minimax(domain: tuple[float, float], degree: int, slope: float) -> None:
    """approx.minimax on ReLU-like kinks: degree + 2 alternating extrema of equal size
    (Chebyshev's equioscillation theorem: the fit is the best of its degree), no random
    perturbation lowers the largest error, and it beats the Chebyshev interpolant."""
    from numpy.polynomial import chebyshev as C

    from planner.frontend.importers import approx

    def f(v: np.ndarray) -> np.ndarray:
        return np.where(v >= 0, v, slope * v)

    a, b = domain
    t = np.concatenate([np.linspace(-1.0, 1.0, 400_001), [-(a + b) / (b - a)]])
    x = 0.5 * (b - a) * t + 0.5 * (a + b)

    def worst(c: np.ndarray) -> float:
        return float(np.max(np.abs(C.chebval(t, c) - f(x))))

    c = np.asarray(approx.minimax(f, degree, domain, kinks=(0.0,)))
    err = worst(c)
    assert err < worst(np.asarray(approx._interpolate(f, degree, domain)))
    e = C.chebval(t[:-1], c) - f(x[:-1])
    ext = approx._alternating(e, degree + 2)
    assert ext is not None
    assert min(abs(e[i]) for i in ext) >= err * (1 - 2e-3)  # equal ripple
    rng = np.random.default_rng(degree)
    for _ in range(100):
        assert worst(c + rng.normal(scale=1e-2 * err, size=c.shape)) >= err * (1 - 1e-6)


@pytest.mark.parametrize("slope", [0.0, 0.1, -1.0])
def test_composite_relu_error_bound(slope: float) -> None:
    """|x (a + b s(x/B)) - relu(x)| <= (1 - slope) max(eps B, B d / 2) on random points."""
    rng = np.random.default_rng(2)
    domain = (-7.0, 13.0)
    for lad in composite.ladders():
        r = composite.ReluApprox(domain, slope, lad.depth + 1, 0.0, ladder=lad)
        x = np.concatenate([rng.uniform(*domain, 100_000), rng.uniform(-1e-3, 1e-3, 10_000)])
        err = np.abs(r(x) - np.where(x >= 0, x, slope * x))
        bound = (1 - slope) * max(lad.eps * 13.0, 13.0 * lad.error / 2)
        assert np.max(err) <= bound * (1 + 1e-6), lad.degrees


def _relu_model(tmp_path: Path, seed: int = 3) -> tuple[Path, dict[str, np.ndarray]]:
    model = M.mlp("Relu", sizes=(16, 8, 4), seed=seed)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return path, {"input": np.random.default_rng(0).normal(size=(32, 16)).astype(np.float32)}


def test_importer_choice(tmp_path: Path) -> None:
    path, calib = _relu_model(tmp_path)
    # auto, default target (B / 64): the direct fit is enough and far shallower
    auto = import_model(path, ImportOptions(), calib)
    assert all(r.function == "relu" and r.degree in (7, 15, 31) for r in auto.approximations)
    for r in auto.approximations:
        b = max(abs(r.domain[0]), abs(r.domain[1]))
        assert r.max_error <= composite.DEFAULT_RELU_TARGET * b
        # the direct candidates are minimax fits: the one below the chosen degree misses the
        # target, and the Chebyshev interpolant of the chosen degree is no better
        cands = {c.degree: c for c in composite.candidates(r.domain, None) if c.ladder is None}
        lower = approx.DEGREES[approx.DEGREES.index(r.degree) - 1]
        assert cands[lower].max_error > composite.DEFAULT_RELU_TARGET * b
        interp = approx.fit(lambda v: np.maximum(v, 0.0), r.domain, degree=r.degree, samples=None)
        pts = np.linspace(*r.domain, 20001)
        assert cands[r.degree].max_error < float(np.max(np.abs(interp(pts) - np.maximum(pts, 0.0))))
    # a tight target: only the composite reaches it
    tight = import_model(path, ImportOptions(max_error=1e-3), calib)
    for r in tight.approximations:
        assert r.function.startswith("relu (composite") and r.max_error <= 1e-3
        chain = [n for n in tight.graph.nodes if n.id.startswith(r.node + ".sgn")]
        assert chain and all(n.op == "poly" and n.basis == "chebyshev" for n in chain)
        assert r.depth == sum(math.ceil(math.log2(len(n.coeffs or ()))) for n in chain) + 1
        assert tight.graph.node(r.node).op == "mul"
    forced = import_model(path, ImportOptions(relu="composite"), calib)
    assert all("composite" in r.function for r in forced.approximations)
    direct = import_model(path, ImportOptions(relu="direct"), calib)
    assert direct.approximations and all(r.degree == 15 for r in direct.approximations)
    with pytest.raises(ModelError, match="--relu must be one of auto, direct, composite"):
        import_model(path, ImportOptions(relu="exact"), calib)


def test_composite_graph_matches_float_and_simulator(tmp_path: Path) -> None:
    """The composite graph's numpy reference against onnx in float (within the reported
    errors, propagated), every poly argument inside its domain, and the simulator at n15."""
    path, calib = _relu_model(tmp_path)
    res = import_model(path, ImportOptions(relu="composite", max_error=1e-2), calib)
    (row,) = res.approximations
    assert row.max_error <= 1e-2
    # the output error is at most the last layer's largest absolute row sum times the ReLU's
    (w,) = [v for v in res.weights.values() if v.shape == (4, 8)]
    bound = float(np.max(np.abs(w).sum(axis=1))) * row.max_error
    ev = ReferenceEvaluator(onnx.load(str(path)))
    rng = np.random.default_rng(9)
    xs = rng.normal(scale=0.8, size=(20, 16))
    worst = 0.0
    for x in xs:
        want = ev.run(None, {"input": x[None].astype(np.float32)})[0].reshape(-1)
        got = reference(res.graph, {**res.weights, "input": x})
        worst = max(worst, float(np.max(np.abs(got["logits"].reshape(-1) - want))))
        for n in res.graph.nodes:
            if n.op == "poly" and n.domain is not None:
                v = got[n.inputs[0]]
                assert n.domain[0] <= v.min() and v.max() <= n.domain[1], n.id
    assert worst <= bound + 1e-6  # float32 in onnx
    plan = plan_graph(res.graph, preset("n15"))
    assert plan.plan["summary"]["depth"] >= sum(r.depth for r in res.approximations)
    for x in xs[:3]:
        values = {**res.weights, "input": x}
        got = simulate(plan.plan, plan.tables, values).outputs["logits"].reshape(-1)
        ref = reference(res.graph, values)["logits"].reshape(-1)
        np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9)


def test_cli_relu_option(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    path, calib = _relu_model(tmp_path)
    c = tmp_path / "c.npz"
    np.savez(c, **calib)
    code, out, _ = cli("import", path, "-o", tmp_path / "g.json", "--weights-out", tmp_path / "w.npz",
                       "--calibrate", c, "--relu", "composite")
    assert code == 0 and "composite" in out
    code, _, err = cli("import", path, "-o", tmp_path / "g2.json", "--weights-out", tmp_path / "w2.npz",
                       "--relu", "exact")
    assert code == 2 and "--relu must be one of" in err and not (tmp_path / "g2.json").exists()


def _pool_model(op: str, shape: list[int], **attrs: object) -> onnx.ModelProto:
    b = M.Builder(dtype=np.float64)
    c = b.op("Conv", ["x", b.rand("w", [3, shape[1], 3, 3]), b.rand("bias", [3])], pads=[1, 1, 1, 1],
             kernel_shape=[3, 3])
    b.op(op, [c], out="y", **attrs)
    return b.model({"x": shape}, {"y": None})


@pytest.mark.parametrize(("op", "attrs"), [
    ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2]}),
    ("GlobalMaxPool", {}),
])
@pytest.mark.parametrize("relu", ["composite", "direct"])
def test_maxpool_against_float(tmp_path: Path, op: str, attrs: dict[str, object], relu: str) -> None:
    """max(a, b) = b + relu(a - b) over each window: the graph's reference against onnx within
    the reductions' summed ReLU errors (each level adds one), every poly inside its domain."""
    model = _pool_model(op, [1, 2, 6, 6], **attrs)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    rng = np.random.default_rng(4)
    calib = {"x": rng.normal(size=(16, 2, 6, 6))}
    opts = ImportOptions(relu=relu, max_error=1e-2) if relu == "composite" else ImportOptions(relu="direct")
    res = import_model(path, opts, calib)
    assert res.approximations and all(r.function.startswith("max") for r in res.approximations)
    k = 36 if op == "GlobalMaxPool" else int(np.prod(attrs["kernel_shape"]))  # type: ignore[arg-type]
    assert len(res.approximations) == k - 1  # a pairwise reduction: k - 1 maxima
    levels = math.ceil(math.log2(k))
    bound = levels * max(r.max_error for r in res.approximations)
    ev = ReferenceEvaluator(model)
    for i in range(4):
        x = calib["x"][i]
        want = ev.run(None, {"x": x[None]})[0].reshape(-1)
        got = reference(res.graph, {**res.weights, "x": x})
        assert np.max(np.abs(got["y"].reshape(-1) - want)) <= bound + 1e-9
        for n in res.graph.nodes:
            if n.op == "poly" and n.domain is not None:
                v = got[n.inputs[0]]
                assert n.domain[0] <= v.min() and v.max() <= n.domain[1], n.id
    if relu == "composite":
        assert res.end_to_end_error is not None and res.end_to_end_error <= bound + 1e-9


def test_maxpool_simulated(tmp_path: Path) -> None:
    """A 2x2 MaxPool (direct ReLU fits) planned at n15 and simulated: equals the reference."""
    model = _pool_model("MaxPool", [1, 1, 4, 4], kernel_shape=[2, 2], strides=[2, 2])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    calib = {"x": np.random.default_rng(5).normal(size=(8, 1, 4, 4))}
    res = import_model(path, ImportOptions(relu="direct"), calib)
    plan = plan_graph(res.graph, preset("n15"))
    x = calib["x"][0]
    got = simulate(plan.plan, plan.tables, {**res.weights, "x": x}).outputs["y"]
    ref = reference(res.graph, {**res.weights, "x": x})["y"]
    np.testing.assert_allclose(got.reshape(-1), ref.reshape(-1), rtol=1e-9, atol=1e-9)


def test_composite_depth_is_priced_in_bootstraps(tmp_path: Path) -> None:
    """The composite's chain is planned as any poly/mul chain: deeper than a bootstrap's
    levels, it costs bootstraps on n14boot where the direct fit needs none."""
    path, calib = _relu_model(tmp_path)
    deep = import_model(path, ImportOptions(relu="composite", max_error=1e-3), calib)
    flat = import_model(path, ImportOptions(relu="direct"), calib)
    assert sum(r.depth for r in deep.approximations) > 9  # more than n14boot's 9 levels
    boots = [plan_graph(r.graph, preset("n14boot")).plan["summary"]["bootstraps"] for r in (deep, flat)]
    assert boots[0] >= 1 and boots[1] == 0
