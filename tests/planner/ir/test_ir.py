"""planner.ir: one typed class per SPEC section 4 instruction, JSON round trips key for key,
checks name the field, and the semantics the summary, the simulator and the key pass use."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from backends.sim import _EXEC
from common.errors import PlanFileError
from planner import ir
from planner.ir.analysis import register_depths, span_counts
from planner.pipeline import plan_graph
from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT

# One instruction of every op, as a plan holds it (key order is the plan's).
EXAMPLES: list[dict[str, object]] = [
    {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x/0"},
    {"op": "rot", "dst": "c1", "src": "c0", "k": 32},
    {"op": "rot_hoisted", "dsts": ["c2", "c3"], "src": "c0", "ks": [1, 2]},
    {"op": "add", "dst": "c4", "a": "c1", "b": "c2"},
    {"op": "sub", "dst": "c5", "a": "c4", "b": "c3"},
    {"op": "pmul", "dst": "c6", "src": "c5", "pt": "p0"},
    {"op": "padd", "dst": "c7", "src": "c6", "pt": "p0"},
    {"op": "psub", "dst": "c8", "src": "c7", "pt": "p0"},
    {"op": "cmul", "dst": "c9", "a": "c8", "b": "c8"},
    {"op": "poly", "dst": "c10", "src": "c9", "coeffs": [0.0, 1.0, 0.0, 0.5]},
    {"op": "poly", "dst": "c13", "src": "c9", "coeffs": [0.0, 1.0], "basis": "chebyshev", "domain": [-1.0, 1.0]},
    {"op": "poly", "dst": "c22", "src": "c9", "coeffs": [0.5, 1.0, 0.25], "mask": "p0"},
    {"op": "rescale", "dst": "c11", "src": "c10"},
    {"op": "bootstrap", "dst": "c12", "src": "c11"},
    {"op": "to_cins", "dst": "c14", "re": "c12", "im": "c11", "l": 8, "levels": 2},
    {"op": "bootstrap_cins", "dsts": ["c15", "c16"], "src": "c14", "l": 8},
    {"op": "load_key", "k": 5},
    {"op": "drop_key", "k": 5},
    {"op": "load_key", "block": "boot"},
    {"op": "bootstrap", "dst": "c23", "src": "c12", "log_slots": 3, "scale": 4, "replicas": True},
    {"op": "mul_i", "dst": "c17", "src": "c11"},
    {"op": "conj", "dst": "c18", "src": "c17"},
    {"op": "bootstrap", "dst": "c19", "src": "c12", "log_slots": 3, "halves": True, "scale": 0.5},
    {"op": "bootstrap2", "dsts": ["c20", "c21"], "srcs": ["c12", "c19"], "log_slots": 2},
    {"op": "output", "src": "c12", "tensor": "y", "table": "out/y/0"},
]

SPEC_OPS = {"input", "rot", "rot_hoisted", "add", "sub", "pmul", "padd", "psub", "cmul", "poly", "rescale",
            "bootstrap", "load_key", "drop_key", "output"}
# CinS instructions (docs/cins.md, the same form as SPEC section 4)
CINS_OPS = {"to_cins", "bootstrap_cins"}
# complex packing (docs/formats.md: an extension, only in plans with options.packing "complex")
COMPLEX_OPS = {"mul_i", "conj"}
# sparse bootstrap variants (docs/formats.md, issue 36)
BOOT_VARIANT_OPS = {"bootstrap2"}


def test_every_spec_op_has_one_class() -> None:
    assert set(ir.OPS) == SPEC_OPS | CINS_OPS | COMPLEX_OPS | BOOT_VARIANT_OPS
    assert {d["op"] for d in EXAMPLES} == SPEC_OPS | CINS_OPS | COMPLEX_OPS | BOOT_VARIANT_OPS
    assert len(set(ir.OPS.values())) == len(ir.OPS)


def test_spec_ops_are_the_ones_the_spec_table_lists() -> None:
    spec = Path("/work/shared/SPEC.md")
    if not spec.exists():
        pytest.skip("shared SPEC.md not available")
    text = spec.read_text(encoding="utf-8")
    section = text[text.index("## 4."):text.index("## 5.")]
    named = set(re.findall(r"^\| `(\w+)`(?: / `(\w+)`)?(?: / `(\w+)`)?", section, re.MULTILINE))
    assert {op for row in named for op in row if op} == SPEC_OPS


@pytest.mark.parametrize("d", EXAMPLES, ids=lambda d: str(d["op"]))
def test_round_trip_keeps_every_key_in_order(d: dict[str, object]) -> None:
    obj = ir.Instr.from_json(d, slots=64)
    assert type(obj) is ir.OPS[str(d["op"])]
    assert json.dumps(obj.to_json()) == json.dumps(d)
    assert ir.decode(d) == obj
    assert ir.decode(obj) is obj


def test_semantics() -> None:
    prog = ir.decode_program(EXAMPLES)
    by_op = {i.op: i for i in reversed(prog)}
    assert by_op["add"].reads() == ("c1", "c2") and by_op["add"].writes() == ("c4",)
    assert by_op["rot_hoisted"].writes() == ("c2", "c3") and by_op["rot_hoisted"].rot_keys() == (1, 2)
    assert by_op["output"].writes() == () and by_op["output"].reads() == ("c12",)
    assert by_op["load_key"].reads() == by_op["load_key"].writes() == ()
    assert by_op["pmul"].plaintexts() == ("p0",)
    masked = ir.decode(next(d for d in EXAMPLES if "mask" in d))
    assert isinstance(masked, ir.Poly) and masked.plaintexts() == ("p0",) and by_op["rescale"].plaintexts() == ()
    d = register_depths(prog)
    # pmul +1, cmul +1, a degree-3 poly +2, bootstrap resets
    assert (d["c5"], d["c6"], d["c8"], d["c9"], d["c10"], d["c11"], d["c12"]) == (0, 1, 1, 2, 4, 4, 0)
    # to_cins at l=8 in 2 factors, as Lattigo's lintrans splits them (lattigo_bsgs_steps):
    # stages {1, 2} (offsets -3..3: baby 1, giants 2, -2, -4) and {4} (babies 4, -4 mod 16, giant -16)
    # conj is a key switch (a rotation), mul_i counts as an add
    assert span_counts(EXAMPLES) == {"rotations": 3 + 7 + 1, "pmul": 1, "cmul": 1, "add": 4 + 1, "rescale": 1,
                                     "poly": 3, "key_loads": 2}
    assert (d["c14"], d["c15"], d["c16"]) == (4 + 2, 0, 0)
    assert (d["c17"], d["c18"]) == (d["c11"], d["c11"])
    assert ir.rot_keys_of(prog) == {32, 1, 2}
    assert ir.uses_conjugation(prog) and ir.galois_key_count(prog) == 4
    assert not ir.uses_conjugation(prog[:-4]) and ir.galois_key_count(prog[:-5]) == 3
    assert (d["c19"], d["c20"], d["c21"]) == (1, 1, 1)  # a sparse bootstrap unpacks with one product
    assert d["c23"] == 0  # ... but not with its replicas
    assert ir.has_key_schedule(prog) and not ir.has_key_schedule(prog[:3])


@pytest.mark.parametrize(
    ("d", "field", "rule"),
    [
        ({"op": "frob"}, "program[3].op", "unknown op"),
        ({"op": "rot", "dst": "c1", "src": 3, "k": 1}, "program[3].src", "rot needs a string 'src'"),
        ({"op": "rot", "dst": "c1", "src": "c0", "k": 64}, "program[3].k", "outside 1..63"),
        ({"op": "rot", "dst": "c1", "src": "c0", "k": 1.5}, "program[3].k", "integers"),
        ({"op": "rot_hoisted", "dsts": ["c1"], "src": "c0", "ks": [1, 2]}, "program[3].ks", "equal length"),
        ({"op": "rot_hoisted", "dsts": ["c1", "c2"], "src": "c0", "ks": [1, 0]}, "program[3].ks[1]", "outside"),
        ({"op": "poly", "dst": "c1", "src": "c0", "coeffs": [1, float("inf")]}, "program[3].coeffs[1]", "finite"),
        ({"op": "poly", "dst": "c1", "src": "c0", "coeffs": [1, 2], "mask": 3}, "program[3].mask", "names a plaintext"),
        ({"op": "poly", "dst": "c1", "src": "c0", "coeffs": [1, 0], "mask": "p0"}, "program[3].mask", "degree >= 1"),
        ({"op": "load_key", "block": "dft"}, "program[3].block", "only key block"),
        ({"op": "bootstrap", "dst": "c1", "src": "c0", "replicas": True}, "program[3].replicas",
         "belongs to a sparse bootstrap"),
        ({"op": "bootstrap", "dst": "c1", "src": "c0", "log_slots": 3, "halves": True, "replicas": True},
         "program[3].replicas", "exclude each other"),
        ({"op": "bootstrap", "dst": "c1", "src": "c0", "log_slots": 3, "replicas": 1}, "program[3].replicas",
         "true or false"),
        ({"op": "bootstrap", "dst": "c1", "src": "c0", "log_slots": 3, "replicas": True, "scale": 0.5},
         "program[3].scale", "a replicas bootstrap's scale is an integer"),
        ({"op": "drop_key"}, "program[3].k", "integers"),
        (["op", "add"], "program[3]", "JSON object"),
    ],
)
def test_from_json_names_the_field(d: object, field: str, rule: str) -> None:
    with pytest.raises(PlanFileError) as e:
        ir.Instr.from_json(d, where="plan x", path="program[3]", slots=64)
    assert str(e.value).startswith(f"plan x: field {field!r}: ")
    assert rule in str(e.value)


def test_from_json_on_a_class_checks_its_op() -> None:
    assert ir.Rot.from_json({"op": "rot", "dst": "c1", "src": "c0", "k": 3}) == ir.Rot("c1", "c0", 3)
    with pytest.raises(PlanFileError, match="expected 'rot'"):
        ir.Rot.from_json({"op": "add", "dst": "c1", "a": "c0", "b": "c0"})


def test_decode_unknown_op() -> None:
    with pytest.raises(ir.UnknownOpError):
        ir.decode({"op": "frob"})
    assert ir.try_decode({"op": "frob"}) is None


def test_planned_program_round_trips_and_validates() -> None:
    from planner.frontend.graph import load_graph
    from planner.frontend.params import preset

    plan = plan_graph(load_graph(ROOT / "data" / "workloads" / "keymemrt_mlp.json"), preset("n15")).plan
    doc = json.loads(json.dumps(plan))
    checked = ir.Plan.from_json(doc)
    assert doc["schema"] == ir.PLAN_SCHEMA
    assert [i.to_json() for i in checked.program] == doc["program"]
    assert ir.validate_plan(doc) is doc


def test_masked_poly_in_the_simulator() -> None:
    """A poly's mask multiplies the polynomial slot by slot, at the poly's depth; a mask of
    more distinct nonzero values than the executor evaluates is refused, naming it."""
    import numpy as np

    from backends.sim import SimulationError, simulate

    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, 8)
    m = np.array([0.0, 0.5, 0.5, 0.0, 2.0, 0.5, 0.0, 2.0])
    plan = {
        "params": {"slots": 8, "log_q": [40, 40, 40]},
        "plaintexts": {"p0": {"source": "const", "table": "m"}},
        "program": [{"op": "input", "dst": "c0", "tensor": "x", "table": "t"},
                    {"op": "poly", "dst": "c1", "src": "c0", "coeffs": [0.5, 1.0, 0.25], "mask": "p0"},
                    {"op": "output", "src": "c1", "tensor": "y", "table": "t"}],
    }
    tables = {"t.idx": np.arange(8), "m.idx": np.full(8, -1), "m.coef": m}
    out = simulate(plan, tables, {"x": x})
    np.testing.assert_allclose(out.outputs["y"], m * (0.5 + x + 0.25 * x * x), rtol=0, atol=1e-15)
    assert register_depths(ir.decode_program(plan["program"]))["c1"] == 2  # as the poly alone
    n = ir.MAX_POLY_MASK_VALUES + 1
    wide = dict(plan, params={"slots": n, "log_q": [40, 40, 40]})
    many = {"t.idx": np.arange(n), "m.idx": np.full(n, -1), "m.coef": np.arange(1.0, n + 1.0)}
    with pytest.raises(SimulationError, match=f"the mask 'p0' holds more than {n - 1} distinct nonzero values"):
        simulate(wide, many, {"x": rng.uniform(-1, 1, n)})


def test_simulator_executes_every_op() -> None:
    # bootstrap and the key block run in the simulator (with params that carry 'boot')
    assert set(_EXEC) == set(ir.OPS.values())


@pytest.mark.parametrize(
    ("middle", "message"),
    [
        ({"op": "load_key", "block": "boot"}, "instruction 1: key block 'boot' needs params with a 'boot' object"),
        ({"op": "bootstrap", "dst": "c1", "src": "c0"}, "instruction 1 (bootstrap): the plan's params carry no 'boot'"),
        ({"op": "frob"}, "instruction 1: unknown op 'frob'"),
    ],
)
def test_simulator_refuses_what_it_cannot_execute(middle: dict[str, object], message: str) -> None:
    import numpy as np

    from backends.sim import SimulationError, simulate

    plan = {
        "params": {"slots": 8, "log_q": [40, 40]}, "plaintexts": {},
        "program": [{"op": "input", "dst": "c0", "tensor": "x", "table": "t"}, middle,
                    {"op": "output", "src": "c0", "tensor": "y", "table": "t"}],
    }
    with pytest.raises(SimulationError, match=re.escape(message)):
        simulate(plan, {"t.idx": np.arange(8)}, {"x": np.arange(8.0)})
