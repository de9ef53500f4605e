"""Bootstrap variants in plans (issue 36): random small graphs at n14boot with params that
offer sparse bootstraps and a cost table that prices them (test stand-ins,
tests/helpers.py): the plans simulate equal to numpy, the simulator's variant checks pass,
CP-SAT and z3 agree on objective, bootstrap count and variants, the key block and the
reports count what the plan uses, and ``boot_variants`` off gives the full-slot plan."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.sim import SimulationError, simulate
from planner.assign import boot_variants
from planner.frontend.graph import Graph, parse_graph
from planner.frontend.params import PRESETS, Params
from planner.frontend.reference import random_values
from planner.ir import boot_block
from planner.ir.analysis import memory_profile
from planner.pipeline import PlanOptions, plan_graph
from solver import SOLVERS
from tests.helpers import check_plan, placeholder_prices, variant_costs, with_boot_variants

KS = (5, 6, 10, 12)
PARAMS = with_boot_variants(PRESETS["n14boot"], KS)
FULL_MS = 3462.05346  # n14boot-lattigo's measured full bootstrap (weights.bootstrap)


@pytest.fixture(scope="module")
def costs(tmp_path_factory: pytest.TempPathFactory) -> str:
    return variant_costs(tmp_path_factory.mktemp("costs"), "n14boot-lattigo", placeholder_prices(FULL_MS, KS, PARAMS.slots))


def random_graph(seed: int) -> tuple[Graph, dict[str, str]]:
    """A random chain deep enough to bootstrap (> 9 levels): element-wise products and sums
    with weights, small polynomials, matvecs with weights scaled to keep the range; vector
    sizes 16..256, sometimes two rows pinned one per ciphertext (pairs can apply)."""
    rng = np.random.default_rng(seed)
    two = seed % 3 == 0
    n = int(rng.choice([16, 32, 64, 200, 256])) if not two else int(rng.choice([16, 50, 64]))
    shape = [2, n] if two else [n]
    tensors: dict[str, Any] = {"x": {"shape": shape, "role": "input", "range": [-1, 1]}}
    nodes: list[dict[str, Any]] = []
    prev, depth, i, mv = "x", 0, 0, 0
    target = int(rng.integers(11, 22))  # one or two bootstraps
    while depth < target:
        i += 1
        # (at most two matvecs, on the smaller vectors: z3 proves these models optimal in seconds)
        ops = ["mul", "add", "poly"] + (["matvec"] if not two and n <= 64 and mv < 2 else [])
        op = str(rng.choice(ops))
        mv += op == "matvec"
        nid = f"n{i}"
        if op in ("mul", "add"):
            tensors[f"w{i}"] = {"shape": shape, "role": "weight", "range": [-0.5, 0.5] if op == "add" else [-1, 1]}
            nodes.append({"id": nid, "op": op, "inputs": [prev, f"w{i}"]})
            depth += op == "mul"
        elif op == "poly":
            # (concave: two levels, no fold)
            nodes.append({"id": nid, "op": "poly", "inputs": [prev], "coeffs": [0.1, 0.5, -0.4]})
            depth += 2
        else:
            tensors[f"w{i}"] = {"shape": [n, n], "role": "weight", "range": [-1.0 / n, 1.0 / n]}
            nodes.append({"id": nid, "op": "matvec", "inputs": [f"w{i}", prev]})
            depth += 1
        prev = nid
    g = parse_graph({"schema": "slotplan.graph/1", "name": f"variants{seed}", "tensors": tensors,
                     "nodes": nodes, "outputs": [prev]})
    return g, ({"x": f"[0:2];[1:{n}]"} if two else {})


def plan(g: Graph, costs: str, pinned: dict[str, str], **opts: Any) -> Any:
    # a limit no test reaches: the solvers prove every plan here optimal (z3 in seconds)
    opts.setdefault("time_limit_s", 120.0)
    return plan_graph(g, PARAMS, PlanOptions(costs=costs, allow_insecure=True,
                                             input_layouts=tuple(sorted(pinned.items())), **opts))


def boot_ops(res: Any) -> list[tuple[str, int | None, bool | None]]:
    """(op, log_slots, kind flag: True for halves, "r" for replicas) per bootstrap."""
    return [(i["op"], i.get("log_slots"), "r" if i.get("replicas") else i.get("halves")) for i in res.plan["program"]
            if i["op"] in ("bootstrap", "bootstrap2")]


def with_replicas(prices: dict[str, float], factor: float) -> dict[str, float]:
    """``prices`` with ``r<k>`` priced at ``factor`` times ``s<k>`` (a table of its own)."""
    return prices | {"r" + k[1:]: round(v * factor, 3) for k, v in prices.items() if k[0] == "s"}


def random_prices(seed: int) -> dict[str, float]:
    """Placeholder prices with each kind scaled by a random factor in [0.5, 1.6] (a kind
    then wins on some graphs, and the full bootstrap on others); replicas at 0.85 (seeds
    1, 4, 7, ...) or 1.15 times the sparse price, so that where they apply (a dirty result read
    by kernels that ignore free slots) they win on some graphs and lose on others."""
    rng = np.random.default_rng(500 + seed)
    f = {k: float(rng.uniform(0.5, 1.6)) for k in "shp"}
    prices = {k: round(v * f[k[0]], 3) for k, v in placeholder_prices(FULL_MS, KS, PARAMS.slots).items()}
    return with_replicas(prices, 0.85 if seed % 3 == 1 else 1.15)


@pytest.mark.parametrize("seed", range(16))
def test_random_graphs_plan_with_variants_and_simulate(seed: int, tmp_path: Path) -> None:
    g, pinned = random_graph(seed)
    costs = variant_costs(tmp_path, "n14boot-lattigo", random_prices(seed))
    got = {}
    for solver in SOLVERS:
        res = plan(g, costs, pinned, solver=solver)
        check_plan(res, g)  # numpy reference, layout claims, the simulator's variant checks
        s = res.plan["summary"]
        assert s["bootstraps"] >= 1 and s["solver"]["status"] == "optimal"
        # (counts as sorted items: two equal Counters print in their insertion order)
        got[solver] = (s["solver"]["objective"], s["bootstraps"], sorted(Counter(boot_ops(res)).items(), key=repr),
                       sorted(Counter(b["variant"] for b in s["bootstrapping"]["per_bootstrap"]).items()))
    assert len(set(map(repr, got.values()))) == 1, got


def test_variants_are_chosen_and_save_against_full(tmp_path: Path) -> None:
    """Over the random graphs every kind of variant appears (and the full bootstrap where
    the variants are dear), and each plan's report gives the modelled saving against the
    full-slot bootstrap of the same plan."""
    kinds: set[str] = set()
    for seed in range(16):
        g, pinned = random_graph(seed)
        res = plan(g, variant_costs(tmp_path, "n14boot-lattigo", random_prices(seed), name=f"r{seed}"), pinned)
        bt = res.plan["summary"]["bootstrapping"]
        for b in bt["per_bootstrap"]:
            kinds.add(b["variant"][0])
            assert b["saving_seconds"] == pytest.approx(b["full_seconds"] - b["seconds"], abs=1e-3)
            assert b["seconds"] > 0 and (b["variant"] == "full") == (b["saving_seconds"] == 0)
        assert bt["variant_saving_seconds"] == pytest.approx(sum(b["saving_seconds"] for b in bt["per_bootstrap"]), abs=1e-3)
    assert {"s", "h", "p", "r", "f"} <= kinds


@pytest.mark.parametrize("kind", ["s", "h", "p", "r"])
def test_each_kind_where_cheapest(kind: str, tmp_path: Path) -> None:
    """Two rows pinned one per ciphertext: with one kind priced at half, the plan uses it
    (pairs: one bootstrap2 per two ciphertexts); CP-SAT and z3 give the same plan cost."""
    prices = {k: (v * 0.5 if k[0] == kind else v)
              for k, v in with_replicas(placeholder_prices(FULL_MS, KS, PARAMS.slots), 1.0).items()}
    c = variant_costs(tmp_path, "n14boot-lattigo", prices, name=f"half-{kind}")
    g, pinned = random_graph(0)  # shape [2, n], pinned
    objs = set()
    for solver in SOLVERS:
        res = plan(g, c, pinned, solver=solver)
        check_plan(res, g)
        ops = boot_ops(res)
        if kind == "p":
            assert ops and all(op == "bootstrap2" for op, _, _ in ops)
        else:
            flag = {"s": None, "h": True, "r": "r"}[kind]
            assert ops and all(op == "bootstrap" and ls is not None and h == flag for op, ls, h in ops), ops
        objs.add(res.plan["summary"]["solver"]["objective"])
    assert len(objs) == 1


def test_off_gives_the_full_slot_plan_and_the_block_counts_the_variants(costs: str) -> None:
    g, pinned = random_graph(1)
    on = plan(g, costs, pinned)
    off = plan(g, costs, pinned, boot_variants=False)
    assert all(op == "bootstrap" and ls is None for op, ls, _ in boot_ops(off))
    assert any(ls is not None for _, ls, _ in boot_ops(on))
    assert off.plan["options"]["boot_variants"] is False and "boot_variants" not in on.plan["options"]
    # the modelled objective with variants is no higher than without
    assert on.plan["summary"]["solver"]["objective"] <= off.plan["summary"]["solver"]["objective"]
    # the key block of the plan with variants holds their extra keys and matrices
    used = boot_block.variants_used(on.plan["program"], PARAMS)
    assert used
    extra = boot_block.block_bytes(PARAMS, used) - PARAMS.boot_block_bytes()
    assert extra == boot_block.added_bytes(PARAMS, used) > 0
    assert memory_profile(on.plan["program"], PARAMS)["keys"] - memory_profile(off.plan["program"], PARAMS)["keys"] \
        == pytest.approx(extra, abs=8 * PARAMS.rotation_key_bytes())


def test_simulator_refuses_a_variant_the_params_do_not_offer(costs: str) -> None:
    g, pinned = random_graph(1)
    res = plan(g, costs, pinned)
    bad = dict(res.plan)
    bad["params"] = _without_variants(PRESETS["n14boot"]).to_json()
    with pytest.raises(SimulationError, match="offers no sparse bootstrap"):
        simulate(bad, res.tables, random_values(g, 0))


def _without_variants(p: Params) -> Params:
    assert p.boot is not None and p.boot.variants  # the real presets offer variants (issue 36)
    return dataclasses.replace(p, boot=dataclasses.replace(p.boot, variants=()))


def test_presets_without_variants_plan_as_before(costs: str) -> None:
    """Params without variants offer none, whatever the table prices: the plan is the
    full-slot one, byte for byte as with the option off on the real preset."""
    g, pinned = random_graph(1)
    a = plan_graph(g, _without_variants(PRESETS["n14boot"]), PlanOptions(costs=costs, allow_insecure=True))
    b = plan_graph(g, PRESETS["n14boot"], PlanOptions(costs=costs, allow_insecure=True, boot_variants=False))
    assert a.plan["program"] == b.plan["program"]
    assert all(ls is None for _, ls, _ in boot_ops(a))


def test_cli_reports_variants_and_diff_explains_the_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``slotplan plan`` prints each bootstrap's variant and saving, ``--boot-variants off``
    plans the full-slot bootstrap, a bad value is one line and exit 2, and ``slotplan diff``
    names the node whose variant changed."""
    import json

    from tests.helpers import run_cli

    g, _ = random_graph(2)
    gp, pp = tmp_path / "g.json", tmp_path / "params.json"
    gp.write_text(json.dumps(g.to_json()))
    pp.write_text(json.dumps(PARAMS.to_json()))
    c = variant_costs(tmp_path, "n14boot-lattigo", placeholder_prices(FULL_MS, KS, PARAMS.slots))
    base = ["plan", str(gp), "--params", str(pp), "--costs", c, "--allow-insecure"]
    code, out, _ = run_cli([*base, "-o", str(tmp_path / "on.json")], capsys)
    assert code == 0
    assert "bootstrap variants (offered:" in out and "saving" in out and "against full-slot" in out
    code, out, _ = run_cli([*base, "--boot-variants", "off", "-o", str(tmp_path / "off.json")], capsys)
    assert code == 0 and "bootstrap variants" not in out
    code, _, err = run_cli([*base, "--boot-variants", "maybe"], capsys)
    assert code == 2 and "--boot-variants: expected on or off" in err and "Traceback" not in err
    code, out, _ = run_cli(["diff", str(tmp_path / "off.json"), str(tmp_path / "on.json"), "--format", "json"], capsys)
    rep = json.loads(out)
    changes = [f for e in rep["entries"] for n in e["nodes"] for f in n["fields"] if f["field"] == "boot_variant"]
    assert changes and all(f["base"] is None and f["head"] not in (None, "full") for f in changes)
    code, js, _ = run_cli([*base, "--json"], capsys)
    rows = json.loads(js)["summary"]["bootstrapping"]["per_bootstrap"]
    assert rows and all({"node", "variant", "ciphertexts", "seconds", "saving_seconds"} <= set(r) for r in rows)


def test_key_schedule_under_a_cap_holds_the_variants_block(tmp_path: Path) -> None:
    """Under a memory cap the key schedule loads the block 'boot' with the variants' keys
    and matrices (whole or streamed): the modelled peak counts them and stays under the cap, the plan's
    rotations by the block's offsets need no key of their own, and the plan simulates."""
    g, pinned = random_graph(1)  # matvecs: rotations
    c = variant_costs(tmp_path, "n14boot-lattigo", placeholder_prices(FULL_MS, KS, PARAMS.slots))
    free = plan(g, c, pinned)
    used = boot_block.variants_used(free.plan["program"], PARAMS)
    assert used
    cap = int(free.plan["summary"]["peak_bytes"]["total"] * 0.98)
    res = plan(g, c, pinned, memory_cap_bytes=cap)
    s = res.plan["summary"]
    assert s["peak_bytes"]["total"] <= cap
    (load,) = [i for i in res.plan["program"] if i["op"] == "load_key" and i.get("block") == "boot"]
    # the block as loaded: whole, or its Galois keys streamed (at least one of them resident
    # beside its matrices and the variants': planner.ir.analysis.memory_profile)
    used_now = boot_block.variants_used(res.plan["program"], PARAMS)
    least = boot_block.block_bytes(PARAMS, used_now) if load.get("stream") is None else \
        boot_block.stream_bytes(PARAMS, used_now, 1)
    assert s["peak_bytes"]["keys"] >= least
    check_plan(res, g)


def test_variants_that_do_not_fit_the_cap_give_the_full_slot_plan(tmp_path: Path) -> None:
    """Variants whose DFT matrices alone exceed what the cap leaves: the plan falls back to
    the full-slot bootstrap (its options say so) with a warning naming why."""
    from planner.frontend.params import Params

    raw = PARAMS.to_json()
    raw["boot"]["variants"] = [dict(v, matrix_bytes=8 * 2**30) for v in raw["boot"]["variants"]]  # type: ignore[index]
    big = Params.from_json(raw)
    g, pinned = random_graph(1)
    c = variant_costs(tmp_path, "n14boot-lattigo", placeholder_prices(FULL_MS, KS, PARAMS.slots))
    off = plan_graph(g, big, PlanOptions(costs=c, allow_insecure=True, boot_variants=False, time_limit_s=60.0))
    cap = off.plan["summary"]["peak_bytes"]["total"]
    res = plan_graph(g, big, PlanOptions(costs=c, allow_insecure=True, memory_cap_bytes=cap, time_limit_s=60.0))
    s = res.plan["summary"]
    assert res.plan["options"]["boot_variants"] is False and s["peak_bytes"]["total"] <= cap
    assert any("bootstrap variants not used" in w for w in s["bootstrapping"]["warnings"])
    assert all(ls is None for _, ls, _ in boot_ops(res))
    check_plan(res, g)


def test_a_variant_the_cap_cannot_hold_gives_way_to_one_it_can(tmp_path: Path) -> None:
    """The variants the free plan uses get DFT matrices no cap here holds; the cap is what
    the plan with the other variants needs. The capped plan leaves the big ones out
    (``options.boot_variant_slots``, recorded in the plan), still uses a variant, says which
    slot counts it dropped and why, stays under the cap and simulates; the option given
    directly plans the same, and a slot count the params do not offer is refused."""
    from planner.assign.candidates import PlanError
    from planner.frontend.params import Params

    g, pinned = random_graph(1)
    c = variant_costs(tmp_path, "n14boot-lattigo", placeholder_prices(FULL_MS, KS, PARAMS.slots))
    free = plan(g, c, pinned)
    big_ks = {v.log_slots for v in boot_block.variants_used(free.plan["program"], PARAMS)}
    assert big_ks and set(KS) - big_ks
    raw = PARAMS.to_json()
    for v in raw["boot"]["variants"]:  # type: ignore[index]
        if v["log_slots"] in big_ks:
            v["matrix_bytes"] = 8 * 2**30
    big = Params.from_json(raw)
    rest = tuple(sorted(set(KS) - big_ks))

    def at(params: Params, **opts: Any) -> Any:
        return plan_graph(g, params, PlanOptions(costs=c, allow_insecure=True, time_limit_s=120.0,
                                                 input_layouts=tuple(sorted(pinned.items())), **opts))

    slim = at(big, boot_variant_slots=rest)
    slim_used = {v.log_slots for v in boot_block.variants_used(slim.plan["program"], big)}
    assert slim_used and slim_used <= set(rest) and slim.plan["options"]["boot_variant_slots"] == list(rest)
    cap = slim.plan["summary"]["peak_bytes"]["total"]
    res = at(big, memory_cap_bytes=cap)
    s = res.plan["summary"]
    assert res.plan["options"]["boot_variant_slots"] == list(rest) and "boot_variants" not in res.plan["options"]
    used = {v.log_slots for v in boot_block.variants_used(res.plan["program"], big)}
    assert used and not used & big_ks and s["peak_bytes"]["total"] <= cap
    dropped = ", ".join(f"2^{k}" for k in sorted(big_ks))
    assert any(w.startswith(f"bootstrap variants at {dropped} slots not used") for w in s["bootstrapping"]["warnings"])
    check_plan(res, g)
    # a batched plan (planned without the cap, then scheduled under it) leaves them out the
    # same way: 4 GiB hold the process with the other variants, not with an 8 GiB one
    bat = at(big, memory_cap_bytes=4 * 2**30, batch=1)
    assert bat.plan["options"]["boot_variant_slots"] == list(rest) and bat.plan["summary"]["batch"] == 1
    assert {v.log_slots for v in boot_block.variants_used(bat.plan["program"], big)} <= set(rest)
    assert bat.plan["summary"]["process_peak_bytes"]["total"] <= 4 * 2**30
    assert any(w.startswith(f"bootstrap variants at {dropped} slots not used")
               for w in bat.plan["summary"]["bootstrapping"]["warnings"])
    with pytest.raises(PlanError, match=r"options.boot_variant_slots: 3 is not .* \(offered: 5, 6, 10, 12\)"):
        at(big, boot_variant_slots=(3, 5))


def test_time_model_prices_each_variant_instruction(costs: str) -> None:
    """TimeModel.instr: a variant instruction at its boot_variants price, the full bootstrap
    at weights.bootstrap, a variant the table does not price at the full one's; a plan's
    modelled bootstraps add up to the report's seconds."""
    from planner import ir
    from planner.cost.tables import load_costs
    from planner.cost.timing import TimeModel

    tm = TimeModel(load_costs(costs))
    prices = placeholder_prices(FULL_MS, KS, PARAMS.slots)
    assert tm.instr(ir.Bootstrap("a", "b", 6, None, 4.0), 0) == prices["s6"]
    assert tm.instr(ir.Bootstrap("a", "b", 5, True, None), 0) == prices["h5"]
    assert tm.instr(ir.Bootstrap2(("a", "b"), ("c", "d"), 10, None), 0) == prices["p10"]
    assert tm.instr(ir.Bootstrap("a", "b"), 0) == pytest.approx(FULL_MS)
    assert tm.instr(ir.Bootstrap("a", "b", 7, None, None), 0) == pytest.approx(FULL_MS)  # not priced
    # replicas without a price of their own: s<k>'s less one product and rescale at the top
    top = max(lv for lv, _ in tm.points["pmul"])
    unpack = tm.at("pmul", top) + tm.at("rescale", top)
    assert 0 < unpack < 0.01 * prices["s6"]
    assert tm.instr(ir.Bootstrap("a", "b", 6, None, 4.0, replicas=True), 0) == pytest.approx(prices["s6"] - unpack)
    g, pinned = random_graph(0)
    res = plan(g, costs, pinned)
    boots = [ir.decode(i) for i in res.plan["program"] if i["op"] in ("bootstrap", "bootstrap2")]
    total = sum(tm.instr(i, 0) for i in boots) * tm.seconds_per_unit
    assert total == pytest.approx(res.plan["summary"]["bootstrapping"]["seconds"], abs=1e-3)


@pytest.mark.parametrize("rows", [1, 2], ids=["one-ct", "two-cts"])
def test_replicas_of_a_clean_value_its_readers_ignore(rows: int, tmp_path: Path) -> None:
    """A chain of products by weights (each reads its operand through a weight that is 0 on
    the free slots, so a dirty operand is as good as a clean one): with ``r<k>`` priced at
    half of ``s<k>``, the value bootstrapped is clean before and keeps the bootstrap's copies
    after it (its plan node's layout dirty), at no level, and every reader takes it without
    a mask.  The plan equals numpy with CP-SAT and z3 alike (layout claims included, the
    simulator's copies in the free slots).  Two rows pinned one per ciphertext: one
    replicas bootstrap per ciphertext."""
    n = 100 if rows == 1 else 60
    shape = [n] if rows == 1 else [rows, n]
    pinned = {} if rows == 1 else {"x": f"[0:{rows}];[1:{n}]"}
    tensors: dict[str, Any] = {"x": {"shape": shape, "role": "input", "range": [-1, 1]}}
    nodes, prev = [], "x"
    for i in range(12):  # depth 12 > the 9 levels of n14boot: one bootstrap
        tensors[f"w{i}"] = {"shape": shape, "role": "weight", "range": [0.8, 1.0]}
        nodes.append({"id": f"m{i}", "op": "mul", "inputs": [prev, f"w{i}"]})
        prev = f"m{i}"
    g = parse_graph({"schema": "slotplan.graph/1", "name": "replicas", "tensors": tensors, "nodes": nodes,
                     "outputs": [prev]})
    prices = {k: (v * 0.5 if k[0] == "r" else v)
              for k, v in with_replicas(placeholder_prices(FULL_MS, KS, PARAMS.slots), 1.0).items()}
    c = variant_costs(tmp_path, "n14boot-lattigo", prices, name="cheap-replicas")
    objs = set()
    for solver in SOLVERS:
        res = plan(g, c, pinned, solver=solver)
        check_plan(res, g)
        per = res.plan["summary"]["bootstrapping"]["per_bootstrap"]
        assert [(b["variant"][0], b["ciphertexts"]) for b in per] == [("r", rows)], per
        node = per[0]["node"]
        assert node != prev and node.startswith("m")
        nodes_by = {x["id"]: x for x in res.plan["nodes"]}
        assert nodes_by[node]["out_layout"].endswith("~")  # the copies: dirty after the bootstrap
        reader = nodes_by[f"m{int(node[1:]) + 1}"]
        assert reader["conversions"] == [] and not reader["out_layout"].endswith("~")
        # (100 or 60 values per ciphertext: the smallest offered slot count that holds them)
        k = 10 if rows == 1 else 6
        assert [(i["log_slots"], i.get("replicas")) for i in res.plan["program"] if i["op"] == "bootstrap"] == \
            [(k, True)] * rows
        objs.add(res.plan["summary"]["solver"]["objective"])
    assert len(objs) == 1


def poly_chain(shape: list[int], polys: int) -> Graph:
    """x (of ``shape``) through ``polys`` odd degree-3 polys (two levels each, no fold):
    every value a bootstrap may refresh is a poly's."""
    tensors: dict[str, Any] = {"x": {"shape": shape, "role": "input", "range": [-1, 1]}}
    nodes: list[dict[str, Any]] = []
    prev = "x"
    for i in range(polys):
        nodes.append({"id": f"p{i}", "op": "poly", "inputs": [prev], "coeffs": [0.0, 0.8, 0.0, -0.3]})
        prev = f"p{i}"
    return parse_graph({"schema": "slotplan.graph/1", "name": f"polychain{'x'.join(map(str, shape))}-{polys}",
                        "tensors": tensors,
                        "nodes": nodes, "outputs": [prev]})


@pytest.mark.parametrize(("shape", "pinned"), [([64], {}), ([2, 50], {"x": "[0:2];[1:50]"})],
                         ids=["64", "2x50-two-ciphertexts"])
def test_halves_packing_in_the_poly_costs_no_level(shape: list[int], pinned: dict[str, str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A poly's result bootstrapped by halves: the packing mask (the high half times i) and
    the range scaling are the poly's complex mask (``premasked``), so the bootstrap needs no
    level before it.  With halves priced cheapest, this chain of polys takes two premasked
    halves bootstraps (per ciphertext: 50 values a row, two rows pinned one per ciphertext,
    in the second case); the plan simulates equal to numpy (the simulator checks the
    packing) and CP-SAT and z3 agree.  Priced with the old rule (one level before every
    halves bootstrap) the objective is higher (one ciphertext: three bootstraps)."""
    n_ct = 2 if pinned else 1
    prices = {k: (v * 0.3 if k[0] == "h" else v)
              for k, v in with_replicas(placeholder_prices(FULL_MS, KS, PARAMS.slots), 1.0).items()}
    c = variant_costs(tmp_path, "n14boot-lattigo", prices, name="cheap-h")
    g = poly_chain(shape, 12)
    objs = set()
    for solver in SOLVERS:
        res = plan(g, c, pinned, solver=solver)
        check_plan(res, g)
        prog = res.plan["program"]
        boots = [i for i in prog if i["op"] in ("bootstrap", "bootstrap2")]
        assert boots and all(b.get("halves") for b in boots), boots
        premasked = [b for b in boots if b.get("premasked")]
        assert len(premasked) == len(boots) == 2 * n_ct, boots
        writer = {i["dst"]: i for i in prog if "dst" in i}
        for b in premasked:  # its source: a poly with the complex packing mask
            w = writer[b["src"]]
            assert w["op"] == "poly" and "imag_table" in res.plan["plaintexts"][w["mask"]]
        objs.add(res.plan["summary"]["solver"]["objective"])
    assert len(objs) == 1
    options = boot_variants.options

    def old_rule(*args: Any, **kw: Any) -> Any:
        return options(*args, **(kw | {"halves_free": False}))

    monkeypatch.setattr(boot_variants, "options", old_rule)
    before = plan(g, c, pinned)
    if n_ct == 1:  # (two ciphertexts: the old rule makes one refresh a dearer pair, bootstrap2)
        assert len([i for i in before.plan["program"] if i["op"] == "bootstrap"]) == 3
    assert before.plan["summary"]["solver"]["objective"] > objs.pop()
