"""Small graph builders and a plan-and-simulate check shared by the tests."""

from __future__ import annotations

import importlib.util
import io
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.sim import simulate
from planner.frontend.graph import Graph, parse_graph
from planner.frontend.params import Params
from planner.frontend.reference import random_values, reference
from planner.pipeline import PlanOptions, PlanResult, plan_graph
from solver import SOLVERS, create
from solver.model import ChoiceModel, Edge, Group, Solution, Status

# the repository root (tests live at any depth under tests/)
REPO_ROOT = Path(__file__).resolve().parent.parent


def needs(*modules: str) -> pytest.MarkDecorator:
    """Skip unless every module is installed, without importing any: a module-level
    `pytest.importorskip` imports at collection in every pytest worker (scikit-learn with
    skl2onnx: ~4 s each), where only the worker that runs the tests needs them."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed (pip install '.[dev]')")


def small_params(log_n: int = 10, levels: int = 4) -> Params:
    """A test-size ring (log_n 10 = 512 slots) so small tensors span several ciphertexts."""
    return Params(log_n=log_n, log_q=(50,) + (40,) * levels, log_p=(50,), log_scale=40, name=f"test{log_n}")


def q_mode_forms(base: str) -> list[dict[str, Any]]:
    """Two giantless forms on ``base`` over one baby offset: y1 = a*rot(base,1) + b*base,
    y2 = c*rot(base,1) (2 blocks > 1 distinct baby: Q mode, planner.ir.fusion), and the outputs."""
    return [
        {"op": "rot_hoisted", "dsts": ["r1"], "src": base, "ks": [1]},
        {"op": "pmul", "dst": "a", "src": "r1", "pt": "pa"},
        {"op": "pmul", "dst": "b", "src": base, "pt": "pb"},
        {"op": "add", "dst": "y1", "a": "a", "b": "b"},
        {"op": "pmul", "dst": "y2", "src": "r1", "pt": "pc"},
        {"op": "output", "src": "y1", "tensor": "y1", "table": "y1"},
        {"op": "output", "src": "y2", "tensor": "y2", "table": "y2"},
    ]


def qp_block_program() -> list[dict[str, Any]]:
    """One giantless block on the input x over two babies: y = a*rot(x,1) + b*rot(x,2)
    (QP: more babies than blocks, planner.ir.fusion)."""
    return [
        {"op": "input", "dst": "x", "tensor": "x", "table": "x"},
        {"op": "rot_hoisted", "dsts": ["r1", "r2"], "src": "x", "ks": [1, 2]},
        {"op": "pmul", "dst": "a", "src": "r1", "pt": "pa"},
        {"op": "pmul", "dst": "b", "src": "r2", "pt": "pb"},
        {"op": "add", "dst": "y", "a": "a", "b": "b"},
        {"op": "output", "src": "y", "tensor": "y", "table": "y"},
    ]


def matvec_graph(n: int, k: int) -> Graph:
    return parse_graph({
        "schema": "slotplan.graph/1", "name": f"mv{n}x{k}",
        "tensors": {"W": {"shape": [n, k], "role": "weight"}, "x": {"shape": [k], "role": "input"}},
        "nodes": [{"id": "y", "op": "matvec", "inputs": ["W", "x"]}], "outputs": ["y"],
    })


def conv_graph(c: int, h: int, w: int, co: int, k1: int, k2: int, stride: tuple[int, int],
               padding: tuple[int, int], groups: int) -> Graph:
    return parse_graph({
        "schema": "slotplan.graph/1", "name": "conv",
        "tensors": {"x": {"shape": [c, h, w], "role": "input"},
                    "w": {"shape": [co, c // groups, k1, k2], "role": "weight"}},
        "nodes": [{"id": "y", "op": "conv2d", "inputs": ["x", "w"], "stride": list(stride),
                   "padding": list(padding), "groups": groups}],
        "outputs": ["y"],
    })


def check_plan(res: PlanResult, graph: Graph, seed: int = 0, rtol: float = 1e-9) -> dict[str, Any]:
    from backends.layout_check import check_claims, claimed_registers
    from planner import ir

    # the plan is one its own validator (and so the executor's) accepts, field by field
    ir.validate_plan(json.loads(json.dumps(res.plan)), "planned plan")
    vals = random_values(graph, seed)
    ref = reference(graph, vals)
    out = simulate(res.plan, res.tables, vals, keep=claimed_registers(res))
    for t in graph.outputs:
        want = ref[t]
        got = out.outputs[t]
        scale = max(1.0, float(np.max(np.abs(want))))
        err = float(np.max(np.abs(got - want))) / scale
        assert err < rtol, f"{t}: relative error {err:.3e}"
    # the summary is the program's own count
    assert out.rotations == res.plan["summary"]["rotations"]
    # every layout the lowering claims (node outputs, conversions) holds on the registers
    if res.claims:
        bad = check_claims(res, vals, out)
        assert not bad, "\n".join(map(str, bad))
    return {"rotations": out.rotations}


def plan_and_check(graph: Graph, params: Params, **opts: Any) -> PlanResult:
    opts.setdefault("allow_insecure", True)  # the test-size rings are below 128 bits
    res = plan_graph(graph, params, PlanOptions(**opts))
    check_plan(res, graph)
    return res


def graph_of(name: str, tensors: dict[str, Any], nodes: list[dict[str, Any]], outputs: list[str]) -> Graph:
    """A graph from its parts (schema slotplan.graph/1)."""
    return parse_graph({"schema": "slotplan.graph/1", "name": name, "tensors": tensors, "nodes": nodes,
                        "outputs": outputs})


def plan_small(g: Graph, levels: int = 8, **opts: Any) -> PlanResult:
    """``g`` planned at log N 10 with ``levels`` levels (insecure, raw outputs unless told),
    checked against numpy with its layout claims."""
    opts.setdefault("clean_outputs", False)
    return plan_and_check(g, small_params(10, levels), **opts)


def plan_node(res: PlanResult, nid: str) -> dict[str, Any]:
    """The plan's entry for node ``nid``."""
    return next(n for n in res.plan["nodes"] if n["id"] == nid)


def bench_encrypted(res: PlanResult, graph: Graph, options: dict[str, Any], seed: int = 3
                    ) -> tuple[dict[str, Any], dict[str, float]]:
    """Run a plan with Lattigo's ``BenchPlan`` on seeded random values: (stats, relative
    error per output against numpy)."""
    import json

    from backends.lattigo_backend import _call, _ext, go_plan_json, pack_vectors
    from backends.lattigo_bench import _scatter

    vals = random_values(graph, seed)
    pin, ppt = pack_vectors(res.plan, {t: vals[t] for t in graph.inputs}, {t: vals[t] for t in graph.weights},
                            res.tables)
    mod, go = _ext()
    raw = json.loads(_call(mod.BenchPlan, go_plan_json(res.plan), go.Slice_byte.from_bytes(pin),
                           go.Slice_byte.from_bytes(ppt), json.dumps(options)))
    outs = _scatter(raw["outputs"], res.tables, {t: graph.shape(t) for t in graph.outputs})
    ref = reference(graph, vals)
    errs = {t: float(np.max(np.abs(np.asarray(outs[t]).reshape(ref[t].shape) - ref[t]))
                     / max(1e-12, float(np.max(np.abs(ref[t]))))) for t in graph.outputs}
    return raw["stats"], errs


def _main_status(args: Sequence[str]) -> int:
    """Run ``api.cli.main`` on ``slotplan ARGS`` in this process; its exit status (a string
    ``sys.exit`` message goes to stderr with status 1, as the interpreter does)."""
    from api.cli import main

    old = sys.argv
    sys.argv = ["slotplan", *args]
    try:
        main()
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    finally:
        sys.argv = old
    return 0


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``slotplan ARGS`` in this process -> (exit status, stdout, stderr), the output read
    from ``capsys``."""
    code = _main_status(args)
    out, err = capsys.readouterr()
    return code, out, err


def cli_in_process(args: Sequence[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``slotplan ARGS`` through ``api.cli.main`` in this process, as the CompletedProcess a
    subprocess would give: the same entry point, exit status, stdout and stderr, without a
    new interpreter's imports (~1 s each).  The tests of the process itself keep a real
    subprocess (byte-identical plans across processes, usage errors without a traceback,
    ``serve``)."""
    out, err = io.StringIO(), io.StringIO()
    old_cwd = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with redirect_stdout(out), redirect_stderr(err):
            code = _main_status(args)
    finally:
        os.chdir(old_cwd)
    return subprocess.CompletedProcess(["slotplan", *args], code, out.getvalue(), err.getvalue())


def tiny_mlp_graph(name: str) -> dict[str, Any]:
    """A one-layer MLP with a quadratic activation (the client/server tests' graph):
    ``y = 0.1 + 0.5 h + 0.2 h^2`` with ``h = W x + b``; see :func:`tiny_mlp_reference`."""
    return {
        "schema": "slotplan.graph/1", "name": name,
        "tensors": {"W": {"shape": [16, 32], "role": "weight"}, "b": {"shape": [16], "role": "weight"},
                    "x": {"shape": [32], "role": "input", "range": [-1, 1]}},
        "nodes": [{"id": "h", "op": "matvec", "inputs": ["W", "x"]},
                  {"id": "h2", "op": "add", "inputs": ["h", "b"]},
                  {"id": "y", "op": "poly", "inputs": ["h2"], "coeffs": [0.1, 0.5, 0.2]}],
        "outputs": ["y"],
    }


def tiny_mlp_reference(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    h = x @ w["W"].T + w["b"]
    return 0.1 + 0.5 * h + 0.2 * h * h


def mem_available() -> int:
    """MemAvailable of /proc/meminfo in bytes (unbounded where it cannot be read): the
    bootstrapping tests skip themselves on a machine without room for their keys."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


# -- bootstrap variants (issue 36) ----------------------------------------------------------
# Test stand-ins until the measured data lands: params with sparse bootstrap variants and a
# cost table pricing them.  Their numbers are placeholders for the planner's tests (each
# variant's keys a plausible subset of the full set's offsets: those below 2^k and the trace
# rotations 2^i, k <= i < log N - 1), not measurements.


def with_boot_variants(params: Params, log_slots: tuple[int, ...]) -> Params:
    """``params`` (a bootstrapping preset) offering sparse bootstraps at these 2^k slots."""
    raw = params.to_json()
    boot = dict(raw["boot"])  # type: ignore[arg-type]
    full = boot["key_offsets"]
    boot["variants"] = [
        {"log_slots": k,
         "key_offsets": sorted({o for o in full if o < 1 << k} | {1 << i for i in range(k, params.log_n - 1)}),
         "matrix_bytes": max(1, boot["matrix_bytes"] * (k + 1) // params.log_n)}
        for k in log_slots
    ]
    raw["boot"] = boot
    return Params.from_json(raw)


def variant_costs(tmp: Path, base: str, prices: dict[str, float], name: str = "variants") -> str:
    """A copy of cost table ``base`` with ``boot_variants`` = ``prices``, written under
    ``tmp``; returns its path (what ``--costs`` takes)."""
    from planner.cost.tables import load_costs

    raw = load_costs(base).model_dump(by_alias=True, exclude_none=True)
    raw["name"] = name
    raw["boot_variants"] = prices
    p = tmp / f"{name}.json"
    p.write_text(json.dumps(raw))
    return str(p)


def placeholder_prices(full_ms: float, log_slots: tuple[int, ...], slots: int) -> dict[str, float]:
    """Placeholder variant prices from the full bootstrap's weight (not measurements):
    a sparse bootstrap at 2^k slots 0.5 + 0.4 k / log2(slots) of it, halves 10% and
    pairs 15% more."""
    top = slots.bit_length() - 1
    out: dict[str, float] = {}
    for k in log_slots:
        s = full_ms * (0.5 + 0.4 * k / top)
        out[f"s{k}"] = round(s, 3)
        if 2 << k <= slots:
            out[f"h{k}"] = round(1.1 * s, 3)
        out[f"p{k}"] = round(1.15 * s, 3)
    return out


def pmul_chain(src: str, n: int, tag: str) -> tuple[list[Any], str]:
    """n pmul + rescale pairs from register src (n levels; plaintext "w"): the program and
    its last register (the level-drop tests)."""
    from planner import ir

    prog: list[Any] = []
    for i in range(n):
        prog += [ir.PMul(dst=f"{tag}m{i}", src=src, pt="w"), ir.Rescale(dst=f"{tag}r{i}", src=f"{tag}m{i}")]
        src = f"{tag}r{i}"
    return prog, src


def random_choice_model(seed: int, depth: bool) -> ChoiceModel:
    """A small choice model (tests/solver): two inputs, four nodes, random costs, forbidden
    pairs and depths."""
    rng = np.random.default_rng(seed)
    names = ["input:a", "input:b", "n0", "n1", "n2", "n3"]
    sizes = {n: int(rng.integers(1, 4)) for n in names}
    groups = tuple(
        Group(n, tuple(0 if n.startswith("input") else int(rng.integers(0, 20)) for _ in range(sizes[n])),
              tuple(f"{n}/{o}" for o in range(sizes[n])),
              depths=tuple(0 if n.startswith("input") else int(rng.integers(0, 3)) for _ in range(sizes[n])))
        for n in names
    )
    pairs = [("input:a", "n0"), ("input:b", "n1"), ("n0", "n1"), ("n0", "n2"), ("n1", "n3"), ("n2", "n3")]
    edges = []
    for s, d in pairs:
        costs = tuple(tuple(None if rng.random() < 0.15 else int(rng.integers(0, 15)) for _ in range(sizes[d]))
                      for _ in range(sizes[s]))
        depths = tuple(tuple(int(rng.integers(0, 2)) for _ in range(sizes[d])) for _ in range(sizes[s]))
        edges.append(Edge(s, d, s, costs, depths))
    return ChoiceModel(groups, tuple(edges), int(rng.integers(2, 6)) if depth else None)


def choice_brute_force(m: ChoiceModel) -> int | None:
    """The best objective over every choice (None: none feasible)."""
    best = None
    for combo in itertools.product(*[range(len(g.costs)) for g in m.groups]):
        v = m.evaluate({g.name: o for g, o in zip(m.groups, combo, strict=True)})
        if v is not None and (best is None or v < best):
            best = v
    return best


def optimal_solutions(models: Sequence[ChoiceModel], feasible: bool) -> Iterator[tuple[ChoiceModel, Solution]]:
    """Every solver (CP-SAT, z3) on every model: each proves the model infeasible when
    ``feasible`` is false, else optimal; yields (model, solution) of the optimal solves for
    the caller's checks of the objective against its brute force."""
    for model in models:
        for name in SOLVERS:
            sol = create(name).solve(model, 30.0)
            if not feasible:
                assert sol.status is Status.INFEASIBLE, name
                continue
            assert sol.status is Status.OPTIMAL, (name, sol)
            yield model, sol


def one_key_load_program() -> list[dict[str, Any]]:
    """A square, then a rotation by 3 whose key is loaded after the square and dropped after
    the rotation, beside a plaintext product (the time model's key-load tests)."""
    return [
        {"op": "input", "dst": "x", "tensor": "x", "table": "x"},
        {"op": "cmul", "dst": "t", "a": "x", "b": "x"},
        {"op": "rescale", "dst": "x1", "src": "t"},
        {"op": "load_key", "k": 3},
        {"op": "pmul", "dst": "u", "src": "x1", "pt": "p1"},
        {"op": "rot", "dst": "y", "src": "x1", "k": 3},
        {"op": "drop_key", "k": 3},
        {"op": "output", "src": "y", "tensor": "y", "table": "y"},
        {"op": "output", "src": "u", "tensor": "u", "table": "u"},
    ]
