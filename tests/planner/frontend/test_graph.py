"""Graph file parsing and validation (SPEC section 2)."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.errors import GraphError, SlotplanError
from planner.frontend.graph import (
    MAX_ELEMENTS,
    MAX_RANK,
    OPS,
    SCHEMA,
    Graph,
    GraphFile,
    canonical_json,
    load_graph,
    parse_graph,
)

SPEC_EXAMPLE: dict[str, Any] = {
    "schema": "slotplan.graph/1",
    "name": "conv2",
    "tensors": {
        "x": {"shape": [16, 32, 32], "role": "input"},
        "w": {"shape": [16, 16, 3, 3], "role": "weight"},
    },
    "nodes": [{"id": "y", "op": "conv2d", "inputs": ["x", "w"], "stride": [1, 1], "padding": [1, 1]}],
    "outputs": ["y"],
}


def doc(
    tensors: dict[str, tuple[list[int], str]],
    nodes: list[dict[str, Any]],
    outputs: list[str] | None = None,
    name: str = "g",
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "name": name,
        "tensors": {k: {"shape": s, "role": r} for k, (s, r) in tensors.items()},
        "nodes": nodes,
        "outputs": outputs if outputs is not None else [nodes[-1]["id"]] if nodes else [],
    }


def reject(d: Any) -> GraphError:
    with pytest.raises(GraphError) as info:
        parse_graph(d)
    return info.value


# ---------------------------------------------------------------------------------------
# valid graphs
# ---------------------------------------------------------------------------------------


def test_spec_example_parses() -> None:
    g = parse_graph(SPEC_EXAMPLE)
    assert g.name == "conv2"
    assert g.shape("y") == (16, 32, 32)
    assert g.tensor("x").encrypted and not g.tensor("w").encrypted and g.tensor("y").encrypted
    assert g.tensor("y").role == "node"
    assert g.inputs == ("x",) and g.weights == ("w",) and g.outputs == ("y",)
    y = g.node("y")
    assert (y.op, y.inputs, y.stride, y.padding, y.groups) == ("conv2d", ("x", "w"), (1, 1), (1, 1), 1)
    assert y.coeffs is None and y.axis is None and y.perm is None and y.shape is None
    assert [n.id for n in g.consumers("x")] == ["y"]
    assert g.consumers("y") == ()
    assert g.producer("y") is y and g.producer("x") is None
    assert g.warnings == ()
    assert len(g.sha256) == 64


def test_literal_model_reads_spec_example() -> None:
    lit = GraphFile.model_validate(SPEC_EXAMPLE)
    assert lit.schema_ == SCHEMA and lit.nodes[0].stride == [1, 1]


def test_load_from_file_and_json_text(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    path.write_text(json.dumps(SPEC_EXAMPLE))
    g1 = load_graph(path)
    g2 = load_graph(str(path))
    g3 = load_graph(json.dumps(SPEC_EXAMPLE))
    g4 = load_graph(SPEC_EXAMPLE)
    assert g1 == g2 == g3 == g4
    assert g1.sha256 == g4.sha256


@pytest.mark.parametrize(
    "text, rule",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"schema": "slotplan.graph/1", "name": "a", "name": "b"}', "duplicate key 'name'"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_bad_json_files(tmp_path: Path, text: str, rule: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(GraphError, match=rule):
        load_graph(path)


def test_missing_file_is_graph_error(tmp_path: Path) -> None:
    with pytest.raises(GraphError, match="cannot read graph file"):
        load_graph(tmp_path / "nope.json")


def test_not_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "bin.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(GraphError, match="not UTF-8"):
        load_graph(path)


def test_shapes_of_every_op() -> None:
    d = doc(
        {
            "W": ([6, 4], "weight"),
            "v": ([4], "input"),
            "A": ([3, 4], "input"),
            "B": ([4, 5], "weight"),
            "img": ([4, 9, 7], "input"),
            "k": ([6, 2, 3, 2], "weight"),
        },
        [
            {"id": "mv", "op": "matvec", "inputs": ["W", "v"]},
            {"id": "mm", "op": "matmul", "inputs": ["A", "B"]},
            {
                "id": "cv",
                "op": "conv2d",
                "inputs": ["img", "k"],
                "stride": [2, 1],
                "padding": [1, 0],
                "groups": 2,
            },
            {"id": "ad", "op": "add", "inputs": ["mm", "mm"]},
            {"id": "sb", "op": "sub", "inputs": ["ad", "mm"]},
            {"id": "ml", "op": "mul", "inputs": ["sb", "ad"]},
            {"id": "pl", "op": "poly", "inputs": ["ml"], "coeffs": [1, 0.5, -2]},
            {"id": "s0", "op": "sum", "inputs": ["pl"], "axis": -1},
            {"id": "s1", "op": "sum", "inputs": ["s0"], "axis": 0},
            {"id": "tr", "op": "transpose", "inputs": ["cv"]},
            {"id": "tp", "op": "transpose", "inputs": ["cv"], "perm": [1, 0, 2]},
            {"id": "rs", "op": "reshape", "inputs": ["cv"], "shape": [-1, 6]},
            {"id": "sl", "op": "slice", "inputs": ["cv"], "axis": 1, "start": 1, "stop": -1},
            {"id": "cc", "op": "concat", "inputs": ["sl", "cv"], "axis": -2},
        ],
        outputs=["mv", "s1", "tr", "tp", "rs", "cc"],
    )
    g = parse_graph(d)
    # conv: Ho = (9 + 2 - 3)//2 + 1 = 5, Wo = (7 + 0 - 2)//1 + 1 = 6
    expected = {
        "mv": (6,),
        "mm": (3, 5),
        "cv": (6, 5, 6),
        "ad": (3, 5),
        "sb": (3, 5),
        "ml": (3, 5),
        "pl": (3, 5),
        "s0": (3,),
        "s1": (1,),  # sum of a rank-1 tensor keeps shape (1,)
        "tr": (6, 5, 6),
        "tp": (5, 6, 6),
        "rs": (30, 6),
        "sl": (6, 3, 6),
        "cc": (6, 8, 6),
    }
    assert {k: g.shape(k) for k in expected} == expected
    assert g.node("s0").axis == 1  # negative axis normalised
    assert g.node("tr").perm == (2, 1, 0)  # default perm: reverse
    assert g.node("rs").shape == (30, 6)  # -1 resolved
    assert (g.node("sl").start, g.node("sl").stop) == (1, 4)  # negative stop normalised
    assert g.node("cc").axis == 1
    assert g.node("pl").coeffs == (1.0, 0.5, -2.0)
    assert g.node("cv").stride == (2, 1) and g.node("cv").groups == 2
    assert g.node("mv").stride is None and g.node("mm").groups is None
    assert set(OPS) == {n.op for n in g.nodes}


def test_encryption_flags_and_plaintext_nodes() -> None:
    d = doc(
        {"x": ([4], "input"), "w1": ([4], "weight"), "w2": ([4], "weight")},
        [
            {"id": "pp", "op": "add", "inputs": ["w1", "w2"]},  # plaintext only
            {"id": "cp", "op": "mul", "inputs": ["pp", "x"]},  # ct x pt
            {"id": "q", "op": "poly", "inputs": ["pp"], "coeffs": [0, 1]},
        ],
        outputs=["cp", "q"],
    )
    g = parse_graph(d)
    assert not g.encrypted("pp") and not g.encrypted("q")
    assert g.encrypted("cp") and g.encrypted("x")


def test_ct_ct_matmul_allowed() -> None:
    d = doc(
        {"a": ([2, 3], "input"), "b": ([3, 2], "input")},
        [{"id": "c", "op": "matmul", "inputs": ["a", "b"]}],
    )
    assert parse_graph(d).encrypted("c")


def test_unused_tensors_and_dead_nodes_only_warn() -> None:
    d = doc(
        {"x": ([4], "input"), "unused": ([3], "weight")},
        [
            {"id": "dead", "op": "poly", "inputs": ["x"], "coeffs": [1]},
            {"id": "y", "op": "add", "inputs": ["x", "x"]},
        ],
        outputs=["y"],
    )
    g = parse_graph(d)
    assert any("'unused'" in w and "never used" in w for w in g.warnings)
    assert any("'dead'" in w for w in g.warnings)


def test_no_input_graph_warns() -> None:
    g = parse_graph(doc({"w": ([2], "weight")}, [{"id": "y", "op": "add", "inputs": ["w", "w"]}]))
    assert not g.encrypted("y")
    assert any("no encrypted input" in w for w in g.warnings)


# ---------------------------------------------------------------------------------------
# topological order and hashing
# ---------------------------------------------------------------------------------------

CHAIN = doc(
    {"x": ([4], "input")},
    [
        {"id": "d", "op": "add", "inputs": ["b", "c"]},
        {"id": "c", "op": "poly", "inputs": ["a"], "coeffs": [0, 2]},
        {"id": "b", "op": "poly", "inputs": ["a"], "coeffs": [1, 1]},
        {"id": "a", "op": "poly", "inputs": ["x"], "coeffs": [0, 1]},
        {"id": "e", "op": "poly", "inputs": ["x"], "coeffs": [3]},
    ],
    outputs=["d", "e"],
)


def test_topological_order_is_stable_file_order() -> None:
    g = parse_graph(CHAIN)
    # ready at start: a (file index 3), e (4) -> a; then c (1) and b (2) are ready before e;
    # after b, d (0) is ready and comes before e (4)
    assert [n.id for n in g.nodes] == ["a", "c", "b", "d", "e"]
    assert [n.id for n in parse_graph(copy.deepcopy(CHAIN)).nodes] == ["a", "c", "b", "d", "e"]
    # consumers come in topological order
    assert [n.id for n in g.consumers("a")] == ["c", "b"]


def test_to_json_round_trip_and_canonical_form() -> None:
    g = parse_graph(CHAIN)
    j = g.to_json()
    j_nodes: Any = j["nodes"]
    assert [n["id"] for n in j_nodes] == ["a", "c", "b", "d", "e"]
    again = parse_graph(j)
    assert again == g and again.to_json() == j
    assert [n.id for n in again.nodes] == [n.id for n in g.nodes]
    spec = parse_graph(SPEC_EXAMPLE).to_json()
    spec_nodes: Any = spec["nodes"]
    assert spec_nodes[0]["groups"] == 1  # defaults filled
    assert json.loads(canonical_json(spec)) == spec
    assert b" " not in canonical_json(spec)


def _shuffled(obj: Any, rnd: random.Random) -> Any:
    if isinstance(obj, dict):
        items = list(obj.items())
        rnd.shuffle(items)
        return {k: _shuffled(v, rnd) for k, v in items}
    if isinstance(obj, list):
        return [_shuffled(v, rnd) for v in obj]
    return obj


def test_sha256_stable_across_key_order() -> None:
    base = parse_graph(SPEC_EXAMPLE).sha256
    rnd = random.Random(7)
    for _ in range(20):
        assert parse_graph(_shuffled(SPEC_EXAMPLE, rnd)).sha256 == base
    text = json.dumps(_shuffled(SPEC_EXAMPLE, rnd), indent=3)
    assert load_graph(text).sha256 == base


def test_sha256_defaults_filled_and_content_sensitive() -> None:
    base = parse_graph(SPEC_EXAMPLE).sha256
    explicit = copy.deepcopy(SPEC_EXAMPLE)
    explicit["nodes"][0]["groups"] = 1
    assert parse_graph(explicit).sha256 == base
    changed = copy.deepcopy(SPEC_EXAMPLE)
    changed["nodes"][0]["padding"] = [0, 0]
    assert parse_graph(changed).sha256 != base
    renamed = copy.deepcopy(SPEC_EXAMPLE)
    renamed["name"] = "other"
    assert parse_graph(renamed).sha256 != base
    # equivalent spellings of the same graph hash alike
    a = doc({"x": ([2, 3], "input")}, [{"id": "y", "op": "reshape", "inputs": ["x"], "shape": [-1]}])
    b = doc({"x": ([2, 3], "input")}, [{"id": "y", "op": "reshape", "inputs": ["x"], "shape": [6]}])
    assert parse_graph(a).sha256 == parse_graph(b).sha256
    c = doc({"x": ([2, 3], "input")}, [{"id": "y", "op": "sum", "inputs": ["x"], "axis": -1}])
    e = doc({"x": ([2, 3], "input")}, [{"id": "y", "op": "sum", "inputs": ["x"], "axis": 1}])
    assert parse_graph(c).sha256 == parse_graph(e).sha256


def test_graph_is_immutable_and_hashable() -> None:
    g = parse_graph(SPEC_EXAMPLE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        g.tensors["z"] = g.tensors["x"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.nodes[0].op = "add"  # type: ignore[misc]
    assert len({g, parse_graph(SPEC_EXAMPLE)}) == 1
    assert isinstance(g, Graph)


def test_lookup_errors() -> None:
    g = parse_graph(SPEC_EXAMPLE)
    with pytest.raises(KeyError):
        g.shape("nope")
    with pytest.raises(KeyError):
        g.node("x")
    with pytest.raises(KeyError):
        g.consumers("nope")


# ---------------------------------------------------------------------------------------
# validation rules: each names the node (or tensor) and the rule
# ---------------------------------------------------------------------------------------


def one(op: str, shapes: dict[str, list[int]], inputs: list[str], **attrs: Any) -> dict[str, Any]:
    tensors = {k: (v, "input" if i == 0 else "weight") for i, (k, v) in enumerate(shapes.items())}
    return doc(tensors, [{"id": "n1", "op": op, "inputs": inputs, **attrs}])


CASES: list[tuple[str, dict[str, Any], str | None, str | None, str]] = [
    (
        "unknown op",
        one("conv3d", {"x": [4]}, ["x"]),
        "n1",
        "op",
        "unknown op 'conv3d' (known ops: matvec, matmul",
    ),
    (
        "arity",
        one("conv2d", {"x": [1, 4, 4], "w": [1, 1, 2, 2]}, ["x", "w", "w"]),
        "n1",
        "inputs",
        "conv2d expects 2 inputs, got 3",
    ),
    (
        "arity poly",
        one("poly", {"x": [4]}, ["x", "x"], coeffs=[1]),
        "n1",
        "inputs",
        "poly expects 1 input, got 2",
    ),
    ("arity zero", one("add", {"x": [4]}, []), "n1", "inputs", "add expects 2 inputs, got 0"),
    ("unknown ref", one("add", {"x": [4]}, ["x", "zz"]), "n1", "inputs[1]", "unknown tensor or node 'zz'"),
    (
        "matvec mismatch",
        one("matvec", {"v": [5], "W": [4, 6]}, ["W", "v"]),
        "n1",
        "inputs",
        "shape mismatch: matvec needs W (n,k) and x (k,), got W 'W' (4, 6) and x 'v' (5,)",
    ),
    ("matvec rank", one("matvec", {"v": [5], "W": [4, 5, 1]}, ["W", "v"]), "n1", "inputs[0]", "rank 2"),
    (
        "matmul mismatch",
        one("matmul", {"a": [2, 3], "b": [4, 5]}, ["a", "b"]),
        "n1",
        "inputs",
        "got A 'a' (2, 3) and B 'b' (4, 5)",
    ),
    ("matmul rank", one("matmul", {"a": [2, 3], "b": [3]}, ["a", "b"]), "n1", "inputs[1]", "B of rank 2"),
    (
        "add mismatch",
        one("add", {"a": [2, 3], "b": [3, 2]}, ["a", "b"]),
        "n1",
        "inputs",
        "shape mismatch: add broadcasts as numpy (trailing dimensions equal or 1), got 'a' (2, 3) and 'b' (3, 2)",
    ),
    ("mul mismatch", one("mul", {"a": [3], "b": [2]}, ["a", "b"]), "n1", "inputs", "shape mismatch: mul"),
    (
        "conv groups divide C",
        one("conv2d", {"x": [4, 5, 5], "w": [6, 1, 3, 3]}, ["x", "w"], groups=3),
        "n1",
        "groups",
        "groups 3 does not divide the input channels C = 4",
    ),
    (
        "conv groups divide Co",
        one("conv2d", {"x": [4, 5, 5], "w": [3, 2, 3, 3]}, ["x", "w"], groups=2),
        "n1",
        "groups",
        "groups 2 does not divide the output channels Co = 3",
    ),
    (
        "conv weight channels",
        one("conv2d", {"x": [4, 5, 5], "w": [4, 4, 3, 3]}, ["x", "w"], groups=2),
        "n1",
        "inputs",
        "shape mismatch: conv2d weight must be (Co, C/groups = 2, K1, K2)",
    ),
    (
        "conv groups zero",
        one("conv2d", {"x": [4, 5, 5], "w": [4, 4, 3, 3]}, ["x", "w"], groups=0),
        "n1",
        "groups",
        ">= 1",
    ),
    (
        "conv stride 0",
        one("conv2d", {"x": [1, 5, 5], "w": [1, 1, 3, 3]}, ["x", "w"], stride=[1, 0]),
        "n1",
        "stride[1]",
        "stride must be >= 1, got 0",
    ),
    (
        "conv stride len",
        one("conv2d", {"x": [1, 5, 5], "w": [1, 1, 3, 3]}, ["x", "w"], stride=[1]),
        "n1",
        "stride",
        "2 entries",
    ),
    (
        "conv padding neg",
        one("conv2d", {"x": [1, 5, 5], "w": [1, 1, 3, 3]}, ["x", "w"], padding=[-1, 0]),
        "n1",
        "padding[0]",
        "padding must be >= 0, got -1",
    ),
    (
        "conv kernel too big",
        one("conv2d", {"x": [1, 2, 5], "w": [1, 1, 3, 3]}, ["x", "w"]),
        "n1",
        "inputs",
        "kernel 3x3 of 'w' is larger than the padded input 2x5",
    ),
    (
        "conv x rank",
        one("conv2d", {"x": [5, 5], "w": [1, 1, 3, 3]}, ["x", "w"]),
        "n1",
        "inputs[0]",
        "x of rank 3",
    ),
    (
        "conv w rank",
        one("conv2d", {"x": [1, 5, 5], "w": [1, 3, 3]}, ["x", "w"]),
        "n1",
        "inputs[1]",
        "w of rank 4",
    ),
    (
        "conv absurd padding",
        one(
            "conv2d",
            {"x": [1, 1, 1], "w": [1, 1, 1, 1]},
            ["x", "w"],
            padding=[10**6, 10**6],
            stride=[10**6, 10**6],
        ),
        "n1",
        "padding",
        "absurd size",
    ),
    ("poly no coeffs", one("poly", {"x": [4]}, ["x"]), "n1", "coeffs", "requires attribute 'coeffs'"),
    ("poly empty", one("poly", {"x": [4]}, ["x"], coeffs=[]), "n1", "coeffs", "non-empty"),
    ("poly nan", one("poly", {"x": [4]}, ["x"], coeffs=[1.0, float("nan")]), "n1", "coeffs[1]", "finite"),
    ("poly inf", one("poly", {"x": [4]}, ["x"], coeffs=[float("inf")]), "n1", "coeffs[0]", "finite"),
    ("poly string", one("poly", {"x": [4]}, ["x"], coeffs=["1"]), "n1", "coeffs[0]", "must be a number"),
    ("sum no axis", one("sum", {"x": [4]}, ["x"]), "n1", "axis", "requires attribute 'axis'"),
    ("sum axis range", one("sum", {"x": [4, 2]}, ["x"], axis=2), "n1", "axis", "axis 2 out of range"),
    ("sum axis neg range", one("sum", {"x": [4, 2]}, ["x"], axis=-3), "n1", "axis", "allowed -2..1"),
    (
        "transpose perm",
        one("transpose", {"x": [4, 2]}, ["x"], perm=[0, 0]),
        "n1",
        "perm",
        "not a permutation",
    ),
    (
        "transpose perm len",
        one("transpose", {"x": [4, 2]}, ["x"], perm=[0, 1, 2]),
        "n1",
        "perm",
        "not a permutation",
    ),
    (
        "reshape count",
        one("reshape", {"x": [4, 2]}, ["x"], shape=[3, 3]),
        "n1",
        "shape",
        "element counts differ",
    ),
    ("reshape two -1", one("reshape", {"x": [4, 2]}, ["x"], shape=[-1, -1]), "n1", "shape", "at most one -1"),
    (
        "reshape -1 indivisible",
        one("reshape", {"x": [4, 2]}, ["x"], shape=[3, -1]),
        "n1",
        "shape",
        "not divisible",
    ),
    ("reshape zero", one("reshape", {"x": [4, 2]}, ["x"], shape=[0, 8]), "n1", "shape[0]", "positive"),
    ("reshape empty", one("reshape", {"x": [1]}, ["x"], shape=[]), "n1", "shape", "rank"),
    ("reshape rank", one("reshape", {"x": [1]}, ["x"], shape=[1] * 7), "n1", "shape", "MAX_RANK"),
    (
        "attr not for op",
        one("add", {"x": [4]}, ["x", "x"], stride=[1, 1]),
        "n1",
        "stride",
        "not allowed for op add",
    ),
    (
        "attr not for op 2",
        one("conv2d", {"x": [1, 4, 4], "w": [1, 1, 1, 1]}, ["x", "w"], axis=0),
        "n1",
        "axis",
        "allowed attributes: stride, padding, groups",
    ),
    (
        "unknown field",
        one("add", {"x": [4]}, ["x", "x"], strides=[1, 1]),
        "n1",
        "strides",
        "unknown field (allowed: id, op, inputs",
    ),
    (
        "stride float",
        one("conv2d", {"x": [1, 4, 4], "w": [1, 1, 1, 1]}, ["x", "w"], stride=[1.5, 1]),
        "n1",
        "stride[0]",
        "must be an integer",
    ),
    (
        "groups bool",
        one("conv2d", {"x": [1, 4, 4], "w": [1, 1, 1, 1]}, ["x", "w"], groups=True),
        "n1",
        "groups",
        "must be an integer",
    ),
    ("op not string", one(7, {"x": [4]}, ["x"]), "n1", "op", "must be a string"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("what, d, node, field, rule", CASES, ids=[c[0] for c in CASES])
def test_node_rule_errors(
    what: str, d: dict[str, Any], node: str | None, field: str | None, rule: str
) -> None:
    err = reject(d)
    assert err.node == node, str(err)
    assert err.field == field, str(err)
    assert rule in err.rule, str(err)
    assert str(err).startswith(f"node {node!r}: field {field!r}: ")
    assert isinstance(err, SlotplanError)


def test_error_message_format_exactly() -> None:
    err = reject(one("conv2d", {"x": [1, 4, 4], "w": [1, 1, 2, 2]}, ["x", "w", "w"]))
    assert str(err).startswith("node 'n1': field 'inputs': conv2d expects 2 inputs, got 3")


def test_duplicate_node_ids() -> None:
    d = doc(
        {"x": ([4], "input")},
        [
            {"id": "a", "op": "poly", "inputs": ["x"], "coeffs": [1]},
            {"id": "a", "op": "poly", "inputs": ["x"], "coeffs": [2]},
        ],
    )
    err = reject(d)
    assert (err.node, err.field) == ("a", "id") and "duplicate node id" in err.rule


def test_node_id_equal_to_tensor_name() -> None:
    err = reject(doc({"x": ([4], "input")}, [{"id": "x", "op": "poly", "inputs": ["x"], "coeffs": [1]}]))
    assert (err.node, err.field) == ("x", "id") and "already a declared tensor name" in err.rule


@pytest.mark.parametrize("bad_id", ["", "  ", "a\nb", "z" * 1000])
def test_bad_node_ids(bad_id: str) -> None:
    err = reject(doc({"x": ([4], "input")}, [{"id": bad_id, "op": "poly", "inputs": ["x"], "coeffs": [1]}]))
    assert err.field == "id" and "node id" in err.rule


def test_cycle_names_the_nodes() -> None:
    d = doc(
        {"x": ([4], "input")},
        [
            {"id": "pre", "op": "poly", "inputs": ["x"], "coeffs": [1]},
            {"id": "a", "op": "add", "inputs": ["pre", "c"]},
            {"id": "b", "op": "poly", "inputs": ["a"], "coeffs": [1]},
            {"id": "c", "op": "poly", "inputs": ["b"], "coeffs": [1]},
            {"id": "after", "op": "poly", "inputs": ["c"], "coeffs": [1]},
        ],
    )
    err = reject(d)
    assert err.node == "a" and err.field == "inputs"
    assert "cycle: a -> b -> c -> a" in err.rule


def test_self_loop_is_a_cycle() -> None:
    err = reject(doc({"x": ([4], "input")}, [{"id": "a", "op": "add", "inputs": ["x", "a"]}]))
    assert err.node == "a" and "cycle: a -> a" in err.rule


@pytest.mark.parametrize(
    "shape, field, rule",
    [
        ([4, 0], "shape[1]", "dims must be positive integers, got 0"),
        ([-3], "shape[0]", "dims must be positive integers, got -3"),
        ([2.5], "shape[0]", "dims must be positive integers, got 2.5"),
        (["4"], "shape[0]", "dims must be positive integers"),
        ([True], "shape[0]", "dims must be positive integers"),
        ([], "shape", "rank 1..6"),
        ([1] * (MAX_RANK + 1), "shape", "MAX_RANK"),
        ([2**15, 2**14], "shape", "absurd size"),
        ("4", "shape", "must be a list"),
    ],
)
def test_tensor_shape_rules(shape: Any, field: str, rule: str) -> None:
    d = doc({"x": ([4], "input")}, [{"id": "y", "op": "add", "inputs": ["x", "x"]}])
    d["tensors"]["big"] = {"shape": shape, "role": "weight"}
    err = reject(d)
    assert (err.node, err.tensor, err.field) == (None, "big", field), str(err)
    assert rule in err.rule
    assert str(err).startswith(f"tensor 'big': field {field!r}: ")


def test_max_elements_boundary() -> None:
    ok = doc({"x": ([2**14, 2**14], "input")}, [{"id": "y", "op": "poly", "inputs": ["x"], "coeffs": [1]}])
    assert parse_graph(ok).tensor("x").size == MAX_ELEMENTS


def test_absurd_node_result() -> None:
    d = one("matmul", {"a": [2**15, 1], "b": [1, 2**14]}, ["a", "b"])
    err = reject(d)
    assert err.node == "n1" and "absurd size" in err.rule


def test_bad_role() -> None:
    d = doc({"x": ([4], "secret")}, [{"id": "y", "op": "add", "inputs": ["x", "x"]}])
    err = reject(d)
    assert (err.tensor, err.field) == ("x", "role") and "'input' or 'weight'" in err.rule


@pytest.mark.parametrize(
    "outputs, rule",
    [
        (["nope"], "unknown tensor 'nope' in outputs"),
        ([], "at least one output"),
        (["y", "y"], "duplicate output 'y'"),
        (["x"], "not a node result"),
    ],
)
def test_output_rules(outputs: list[str], rule: str) -> None:
    err = reject(
        doc({"x": ([4], "input")}, [{"id": "y", "op": "add", "inputs": ["x", "x"]}], outputs=outputs)
    )
    assert err.field is not None and err.field.startswith("outputs")
    assert rule in err.rule


def test_empty_nodes() -> None:
    err = reject(doc({"x": ([4], "input")}, [], outputs=["x"]))
    assert err.field == "nodes" and "at least one node" in err.rule


@pytest.mark.parametrize(
    "mutate, field, rule",
    [
        (lambda d: d.update(schema="slotplan.graph/2"), "schema", "must be 'slotplan.graph/1'"),
        (lambda d: d.pop("schema"), "schema", "required field is missing"),
        (lambda d: d.pop("outputs"), "outputs", "required field is missing"),
        (
            lambda d: d.update(extra=1),
            "extra",
            "unknown field (allowed: schema, name, tensors, nodes, outputs)",
        ),
        (lambda d: d.update(name=""), None, "graph name must be a non-empty string"),
        (lambda d: d.update(nodes={}), "nodes", "must be a list"),
        (lambda d: d.update(tensors=[]), "tensors", "must be an object"),
        (lambda d: d["tensors"]["x"].update(dtype="f32"), "dtype", "unknown field (allowed: shape, role, range)"),
    ],
)
def test_document_rules(mutate: Any, field: str | None, rule: str) -> None:
    d = copy.deepcopy(SPEC_EXAMPLE)
    mutate(d)
    err = reject(d)
    assert err.field == field and rule in err.rule, str(err)


def test_node_without_id_is_located_by_index() -> None:
    d = copy.deepcopy(SPEC_EXAMPLE)
    del d["nodes"][0]["id"]
    err = reject(d)
    assert err.node is None and err.field == "nodes[0].id" and "missing" in err.rule


def test_not_an_object() -> None:
    assert "JSON object" in reject([1, 2]).rule
    with pytest.raises(GraphError, match="graph source"):
        load_graph(42)  # type: ignore[arg-type]


def test_multiple_problems_are_counted() -> None:
    d = copy.deepcopy(SPEC_EXAMPLE)
    d["tensors"]["x"]["shape"] = [1.5, 2.5]
    err = reject(d)
    assert "and 1 more problem" in err.rule


def test_error_pickles_with_location() -> None:
    err = reject(one("poly", {"x": [4]}, ["x"], coeffs=[]))
    back = pickle.loads(pickle.dumps(err))
    assert (back.node, back.field, back.rule, str(back)) == (err.node, err.field, err.rule, str(err))
    assert err.to_json()["node"] == "n1"


# ---------------------------------------------------------------------------------------
# robustness: arbitrary mutations give a Graph or a GraphError, never anything else
# ---------------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=10,
)

_PATHS: list[tuple[Any, ...]] = [
    ("schema",),
    ("name",),
    ("tensors",),
    ("tensors", "x"),
    ("tensors", "x", "shape"),
    ("tensors", "x", "shape", 0),
    ("tensors", "x", "role"),
    ("tensors", "w", "shape"),
    ("tensors", "w", "shape", 1),
    ("tensors", "w", "shape", 2),
    ("nodes",),
    ("nodes", 0),
    ("nodes", 0, "id"),
    ("nodes", 0, "op"),
    ("nodes", 0, "inputs"),
    ("nodes", 0, "inputs", 1),
    ("nodes", 0, "stride"),
    ("nodes", 0, "padding"),
    ("nodes", 0, "padding", 0),
    ("nodes", 0, "groups"),
    ("nodes", 0, "coeffs"),
    ("nodes", 0, "axis"),
    ("nodes", 0, "perm"),
    ("nodes", 0, "shape"),
    ("outputs",),
    ("outputs", 0),
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_PATHS), json_values), min_size=1, max_size=3))
def test_fuzzed_documents_never_crash(edits: list[tuple[tuple[Any, ...], Any]]) -> None:
    d: Any = copy.deepcopy(SPEC_EXAMPLE)
    for path, value in edits:
        target = d
        try:
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    try:
        g = parse_graph(d)
    except GraphError as exc:
        assert str(exc)
        return
    assert parse_graph(g.to_json()) == g


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["add", "poly", "mul"]), st.integers(0, 30), st.integers(0, 30)),
        min_size=1,
        max_size=12,
    ),
    st.randoms(use_true_random=False),
)
def test_random_dags_topological(spec: list[tuple[str, int, int]], rnd: random.Random) -> None:
    """Random DAGs in shuffled file order: order respects dependencies, and is reproducible."""
    names = ["x"]
    nodes: list[dict[str, Any]] = []
    for i, (op, a, b) in enumerate(spec):
        nid = f"n{i}"
        ia, ib = names[a % len(names)], names[b % len(names)]
        if op == "poly":
            nodes.append({"id": nid, "op": op, "inputs": [ia], "coeffs": [0.0, 1.0]})
        else:
            nodes.append({"id": nid, "op": op, "inputs": [ia, ib]})
        names.append(nid)
    rnd.shuffle(nodes)
    d = doc({"x": ([3], "input")}, nodes, outputs=[nodes[0]["id"]])
    g = parse_graph(d)
    pos = {n.id: i for i, n in enumerate(g.nodes)}
    for n in g.nodes:
        for r in n.inputs:
            if r in pos:
                assert pos[r] < pos[n.id]
    assert [n.id for n in parse_graph(copy.deepcopy(d)).nodes] == [n.id for n in g.nodes]
    # stable: the first ready node in file order goes first
    file_order = [n["id"] for n in nodes]
    first_ready = next(n["id"] for n in nodes if all(r == "x" for r in n["inputs"]))
    assert g.nodes[0].id == first_ready
    assert sorted(file_order) == sorted(pos)
