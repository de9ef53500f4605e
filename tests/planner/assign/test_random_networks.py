"""Property test: random small networks (tests/random_networks.py) plan, and every plan

- equals the numpy reference in the simulator (float64, 1e-9),
- keeps every layout claim its lowering makes (backends.layout_check: each node output and
  each conversion result holds its tensor where the layout says, and zeros elsewhere when
  the layout says clean) -- the claims are derived from the program, not trusted,
- leaks nothing: with clean outputs (the default) every output ciphertext is zero outside
  its tensor, and the summary says so,
- has per-node counts that add up to the summary.

``make test`` runs ``DEFAULT_GRAPHS`` graphs with fixed seeds; ``SLOTPLAN_RANDOM_GRAPHS=N``
(and ``SLOTPLAN_RANDOM_SEED0=S``) runs a larger sweep.
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest

from backends.layout_check import check_claims, claimed_registers
from backends.sim import simulate
from planner.assign.candidates import ELEMENTWISE_KERNELS, KERNELS
from planner.frontend.graph import parse_graph
from planner.frontend.reference import random_values, reference
from planner.ir.analysis import NODE_COUNT_FIELDS
from planner.pipeline import PlanOptions, plan_graph
from tests.helpers import small_params
from tests.random_networks import describe, random_network

DEFAULT_GRAPHS = 220
N_GRAPHS = int(os.environ.get("SLOTPLAN_RANDOM_GRAPHS", DEFAULT_GRAPHS))
SEED0 = int(os.environ.get("SLOTPLAN_RANDOM_SEED0", 0))
BATCH = 20
# levels of the test ring: the generated chains use at most 6, masks and conversions more
LEVELS = 16
# Every linear kernel family gets chains of its own (the solver alone would pick IMRA
# almost everywhere): bsgs applies to every matvec and conv, so each set is complete.
KERNEL_SETS: tuple[tuple[str, ...], ...] = (
    KERNELS, ("bsgs", *ELEMENTWISE_KERNELS), ("hs-diagonal", "bsgs", *ELEMENTWISE_KERNELS),
    ("fhelipe", "bsgs", *ELEMENTWISE_KERNELS), KERNELS,
)
COMPLEX_SET = ("hybrid-complex", "bsgs", *ELEMENTWISE_KERNELS)


def check_network(seed: int, packing: str = "real") -> list[str]:
    """Plan random network ``seed`` and return what is wrong with its plan (empty: nothing).
    ``packing="complex"``: the complex-packed hybrid matvec wherever it applies, bsgs
    elsewhere (the convs)."""
    spec, log_n = random_network(seed)
    g = parse_graph(spec)
    opts = PlanOptions(
        input_layout="row-major" if seed % 3 == 0 else "free",
        clean_outputs=seed % 5 != 0,
        allow_insecure=True,  # the 512-slot test ring
        kernels=KERNEL_SETS[seed % len(KERNEL_SETS)] if packing == "real" else COMPLEX_SET,
        packing=packing,
    )
    res = plan_graph(g, small_params(log_n, levels=LEVELS), opts)
    vals = random_values(g, seed)
    ref = reference(g, vals)
    sim = simulate(res.plan, res.tables, vals, keep=claimed_registers(res))
    where = f"graph {seed} ({describe(spec)}, log_n {log_n}, {opts.input_layout}, clean={opts.clean_outputs})"
    problems: list[str] = []
    for t in g.outputs:
        scale = max(1.0, float(np.max(np.abs(ref[t]))))
        err = float(np.max(np.abs(sim.outputs[t] - ref[t]))) / scale
        if not err < 1e-9:
            problems.append(f"{where}: output {t}: relative error {err:.2e}")
    problems += [f"{where}: {v}" for v in check_claims(res, vals, sim)]
    s = res.plan["summary"]
    if opts.clean_outputs:
        if not s["clean_outputs"]:
            problems.append(f"{where}: summary says outputs are not clean")
        leaks = {t: n for t, n in sim.leaked_slots.items() if n}
        if leaks:
            problems.append(f"{where}: outputs leak non-zero slots {leaks}")
    elif s["clean_outputs"] and any(sim.leaked_slots.values()):
        problems.append(f"{where}: summary claims clean outputs but {sim.leaked_slots} slots leak")
    for f in NODE_COUNT_FIELDS:
        total = sum(n[f] for n in res.plan["nodes"])
        if total != s[f]:
            problems.append(f"{where}: nodes' {f} sum to {total}, summary says {s[f]}")
    return problems


@pytest.mark.parametrize("start", range(SEED0, SEED0 + N_GRAPHS, BATCH))
def test_random_networks(start: int) -> None:
    problems: list[str] = []
    for seed in range(start, min(start + BATCH, SEED0 + N_GRAPHS)):
        problems += check_network(seed)
    assert not problems, "\n".join(problems)


# complex packing (docs/formats.md) over the first graphs of the sweep
COMPLEX_GRAPHS = int(os.environ.get("SLOTPLAN_RANDOM_COMPLEX_GRAPHS", 60))


@pytest.mark.parametrize("start", range(SEED0, SEED0 + COMPLEX_GRAPHS, BATCH))
def test_random_networks_complex_packing(start: int) -> None:
    problems: list[str] = []
    for seed in range(start, min(start + BATCH, SEED0 + COMPLEX_GRAPHS)):
        problems += check_network(seed, "complex")
    assert not problems, "\n".join(problems)


def _nominal_depth(spec: dict) -> int:  # type: ignore[type-arg]
    g = parse_graph(spec)
    depth: dict[str, int] = dict.fromkeys(g.inputs, 0)
    for n in g.nodes:
        d = max((depth.get(i, 0) for i in n.inputs), default=0)
        if n.op in ("matvec", "conv2d", "mul", "matmul"):
            d += 1
        elif n.op == "poly":
            d += (len(n.coeffs or ()) - 1).bit_length()
            d += 1 if n.basis == "chebyshev" and n.domain != (-1.0, 1.0) else 0
        depth[n.id] = d
    return max(depth.values())


def test_generator_covers_the_shapes() -> None:
    """The default sweep holds every op the issue names, strides, padding, groups,
    residuals, reshapes both ways, tensors larger than a ciphertext and chains 6 levels deep,
    and the ops of whole models (broadcasts of weights and ciphertexts, keepdims sums,
    slices, concatenations with weights, matmuls over a batch, Chebyshev series)."""
    seen: Counter[str] = Counter()
    max_depth = 0
    for seed in range(SEED0, SEED0 + N_GRAPHS):
        spec, log_n = random_network(seed)
        seen.update(op.split("/")[0] for op in describe(spec).split(" -> "))
        nodes = spec["nodes"]
        seen.update("stride2" for n in nodes if n.get("stride", [1])[0] == 2)
        seen.update("padded" for n in nodes if any(n.get("padding", [0, 0])))
        seen.update("residual" for n in nodes if n["op"] in ("add", "sub") and not set(n["inputs"]) & set(spec["tensors"]))
        seen[f"input{len(spec['tensors']['x']['shape'])}d"] += 1
        g = parse_graph(spec)
        for n in g.nodes:
            if n.op in ("add", "sub", "mul") and len({g.shape(t) for t in n.inputs}) > 1:
                seen["broadcast-ct" if all(g.encrypted(t) for t in n.inputs) else "broadcast-pt"] += 1
            if n.op == "matmul" and len(g.shape(n.id)) == 3:
                seen["matmul3d-ct" if all(g.encrypted(t) for t in n.inputs) else "matmul3d-pt"] += 1
            if n.op == "sum" and n.keepdims:
                seen["keepdims"] += 1
            if n.op == "concat" and not all(g.encrypted(t) for t in n.inputs):
                seen["concat-weight"] += 1
        if int(np.prod(spec["tensors"]["x"]["shape"])) > 2 ** (log_n - 1):
            seen["multi-ct"] += 1
        max_depth = max(max_depth, _nominal_depth(spec))
    for what in ("matvec", "conv", "conv-dw", "square", "poly", "mul", "add", "sub", "reshape",
                 "stride2", "padded", "residual", "input1d", "input3d", "multi-ct",
                 "chebyshev", "slice", "concat", "concat-weight", "broadcast-pt", "broadcast-ct", "keepdims",
                 "matmul3d-pt", "matmul3d-ct", "transpose"):
        assert seen[what] > 0, f"the generator never made {what}: {dict(seen)}"
    assert max_depth == 6


# ----------------------------------------------------------------------------- batches
BATCH_GRAPHS = int(os.environ.get("SLOTPLAN_RANDOM_BATCH_GRAPHS", 48))


def check_batched_network(seed: int) -> list[str]:
    """Plan random network ``seed`` for ``random_batch(seed)`` samples (planner/batch.py) and
    return what is wrong: every sample must equal its own numpy reference, every layout
    claim must hold over all the samples (padding included), clean outputs leak nothing."""
    from planner.batch import batched_reference
    from tests.random_networks import random_batch

    spec, log_n = random_network(seed)
    g = parse_graph(spec)
    B = random_batch(seed)
    opts = PlanOptions(
        input_layout="row-major" if seed % 3 == 0 else "free",
        clean_outputs=seed % 5 != 0,
        allow_insecure=True,
        kernels=KERNEL_SETS[seed % len(KERNEL_SETS)],
        batch=B,
    )
    res = plan_graph(g, small_params(log_n, levels=LEVELS), opts)
    vals = random_values(g, seed)
    rng = np.random.default_rng(seed)
    for x in g.inputs:  # B different samples
        vals[x] = rng.uniform(-1.0, 1.0, (B, *g.shape(x)))
    ref = batched_reference(g, vals, B)
    sim = simulate(res.plan, res.tables, vals, keep=claimed_registers(res))
    P = 1 << (B - 1).bit_length()
    where = f"graph {seed} B={B} ({describe(spec)}, {opts.input_layout}, clean={opts.clean_outputs})"
    problems: list[str] = []
    s = res.plan["summary"]
    if s["batch"] != B or res.plan["outputs"] != {t: [B, *g.shape(t)] for t in g.outputs}:
        problems.append(f"{where}: summary.batch {s['batch']} / outputs {res.plan['outputs']}")
    for t in g.outputs:
        for b in range(B):
            scale = max(1.0, float(np.max(np.abs(ref[t][b]))))
            err = float(np.max(np.abs(sim.outputs[t][b] - ref[t][b]))) / scale
            if not err < 1e-9:
                problems.append(f"{where}: output {t} sample {b}: relative error {err:.2e}")
    problems += [f"{where}: {v}" for v in check_claims(res, vals, sim)]
    if opts.clean_outputs:  # padded batches (B < P) too: the padding samples' slots are masked
        if not s["clean_outputs"]:
            problems.append(f"{where}: summary says outputs are not clean")
        leaks = {t: n for t, n in sim.leaked_slots.items() if n}
        if leaks:
            problems.append(f"{where}: outputs leak non-zero slots {leaks}")
    elif B != P and s["clean_outputs"]:
        problems.append(f"{where}: padded raw batch claims clean outputs")
    for f in NODE_COUNT_FIELDS:
        total = sum(n[f] for n in res.plan["nodes"])
        if total != s[f]:
            problems.append(f"{where}: nodes' {f} sum to {total}, summary says {s[f]}")
    if abs(s["per_sample"]["rotations"] * B - s["rotations"]) > 1e-3:
        problems.append(f"{where}: per_sample.rotations {s['per_sample']['rotations']} x {B} != {s['rotations']}")
    return problems


@pytest.mark.parametrize("start", range(SEED0, SEED0 + BATCH_GRAPHS, 12))
def test_random_batched_networks(start: int) -> None:
    problems: list[str] = []
    for seed in range(start, min(start + 12, SEED0 + BATCH_GRAPHS)):
        problems += check_batched_network(seed)
    assert not problems, "\n".join(problems)


def test_random_batches_cover_1_to_8() -> None:
    from tests.random_networks import random_batch

    assert {random_batch(s) for s in range(SEED0, SEED0 + BATCH_GRAPHS)} == set(range(1, 9))


def test_batch_of_one_keeps_the_program() -> None:
    """B = 1 is the one-sample plan read with a batch dimension of 1: the same program."""
    spec, log_n = random_network(3)
    g = parse_graph(spec)
    params = small_params(log_n, levels=LEVELS)
    one = plan_graph(g, params, PlanOptions(allow_insecure=True))
    b1 = plan_graph(g, params, PlanOptions(allow_insecure=True, batch=1))
    assert b1.plan["program"] == one.plan["program"]
    assert "batch" not in one.plan["summary"] and "batch" not in one.plan["options"]
    assert b1.plan["summary"]["batch"] == 1 and b1.plan["options"]["batch"] == 1
