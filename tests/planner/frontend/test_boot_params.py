"""Bootstrapping presets (SPEC section 3) and the graph's tensor ``range`` (SPEC section 2)."""

from __future__ import annotations

import copy

import pytest

from common.errors import GraphError, ParamsError
from planner.frontend.graph import parse_graph
from planner.frontend.params import PRESETS, Params, load_params

# Measured with Lattigo v6.1.1 (shared/notes/lattigo-bootstrapping.md)
MEASURED = {
    "n16boot": {"galois_key": 157_289_072, "ct9": 10_486_222, "ct0": 1_048_894, "galois": 48},
    "n14boot": {"galois_key": 39_324_272, "ct9": 2_621_902, "ct0": 262_462, "galois": 35},
}


def within(model: int, measured: int, rel: float = 0.05) -> bool:
    return abs(model - measured) <= rel * measured


@pytest.mark.parametrize("name", ["n14boot", "n16boot"])
def test_boot_presets_memory_model_on_bootstrapping_chain(name: str) -> None:
    p = PRESETS[name]
    m = MEASURED[name]
    assert p.boot is not None
    assert p.max_level == p.boot.levels_after == 9
    assert p.boot.log_qp == 1546 and len(p.boot.log_q) == 25 and len(p.boot.log_p) == 5
    assert p.key_max_level == 24
    # every key of a bootstrapping plan lives on the bootstrapping chain
    assert within(p.rotation_key_bytes(24), m["galois_key"])
    # a plan's own keys: generated at level 9 on the bootstrapping chain (measured at n14:
    # 7,864,928 B, what the Lattigo executor writes)
    if name == "n14boot":
        assert within(p.rotation_key_bytes(), 7_864_928)
    assert within(p.ciphertext_bytes(9), m["ct9"]) and within(p.ciphertext_bytes(0), m["ct0"])
    assert len(p.boot.key_offsets) + int(p.boot.conjugation) == m["galois"]
    assert p.slots == (32768 if name == "n16boot" else 8192)
    # the block: keys and DFT matrices as measured
    assert p.boot.block_bytes == p.boot.key_bytes + p.boot.matrix_bytes


def test_boot_presets_security_labels() -> None:
    assert PRESETS["n16boot"].secure  # bootstrapping chain 1546 <= 1761
    assert not PRESETS["n14boot"].secure and "insecure" in (PRESETS["n14boot"].note or "")
    assert PRESETS["n16boot"].boot.key_bytes == 7_866_551_213  # type: ignore[union-attr]
    assert PRESETS["n16boot"].boot.matrix_bytes == 2_953_887_680  # type: ignore[union-attr]
    assert PRESETS["n14boot"].boot.key_bytes == 1_455_522_709  # type: ignore[union-attr]
    assert PRESETS["n14boot"].boot.matrix_bytes == 461_666_240  # type: ignore[union-attr]


def test_boot_offsets_follow_lattigos_trace_rule() -> None:
    # trace keys 1 << i for LogSlots <= i < LogN - 1 are absent (full slots), and the
    # C2S/S2C keys include the powers of two below the slots
    for name in ("n14boot", "n16boot"):
        p = PRESETS[name]
        offs = set(p.boot.key_offsets)  # type: ignore[union-attr]
        assert {1 << i for i in range(p.log_n - 1)} <= offs


@pytest.mark.parametrize("name", ["n14boot", "n16boot"])
def test_boot_params_json_round_trip(name: str) -> None:
    p = PRESETS[name]
    j = p.to_json()
    assert j["boot"]["literal"] == "N16QP1546H192H32"  # type: ignore[index]
    assert set(j["boot"]) >= {"literal", "levels_after", "max_abs", "key_offsets", "conjugation",  # type: ignore[arg-type]
                              "key_bytes", "matrix_bytes"}
    assert Params.from_json(j) == p
    assert load_params(name) is p
    # a variant's DFT ratio travels only where it is not Lattigo's 1 (plans of presets that
    # keep 1 are byte for byte what they were before the field existed)
    for v, vj in zip(p.boot.variants, j["boot"]["variants"], strict=True):  # type: ignore[union-attr,index]
        assert ("log_bsgs_ratio" in vj) == (v.log_bsgs_ratio != 1)
    j2 = copy.deepcopy(j)
    j2["boot"]["variants"][0]["log_bsgs_ratio"] = 1  # type: ignore[index]
    assert Params.from_json(j2) == p if p.boot.variants[0].log_bsgs_ratio == 1 else Params.from_json(j2) != p  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b.update(levels_after=8), "boot.levels_after"),
        (lambda b: b.update(max_abs=-1.0), "boot.max_abs"),
        (lambda b: b.update(key_offsets=[3, 1]), "boot.key_offsets"),
        (lambda b: b.update(key_bytes=0), "boot.key_bytes"),
        (lambda b: b.update(log_q=[50, 40], log_qp=None), "boot.log_q"),
        (lambda b: b.update(log_qp=12), "boot.log_qp"),
        (lambda b: b["variants"][1].update(log_bsgs_ratio=7), "boot.variants[1].log_bsgs_ratio"),
        (lambda b: b["variants"][0].update(log_bsgs_ratio=-1), "boot.variants[0].log_bsgs_ratio"),
    ],
)
def test_boot_object_rejected_naming_field(mutate, field) -> None:  # type: ignore[no-untyped-def]
    j = copy.deepcopy(PRESETS["n14boot"].to_json())
    mutate(j["boot"])
    with pytest.raises(ParamsError) as ei:
        Params.from_json(j)
    assert ei.value.field == field


def _graph(rng: object) -> dict[str, object]:
    return {
        "schema": "slotplan.graph/1", "name": "r",
        "tensors": {"x": {"shape": [4], "role": "input", "range": rng}},
        "nodes": [{"id": "y", "op": "poly", "inputs": ["x"], "coeffs": [0.0, 1.0]}], "outputs": ["y"],
    }


def test_tensor_range_parsed_and_hashed() -> None:
    g = parse_graph(_graph([-1, 2.5]))
    assert g.tensor("x").range == (-1.0, 2.5)
    assert g.to_json()["tensors"]["x"]["range"] == [-1.0, 2.5]  # type: ignore[index]
    plain = _graph(None)
    del plain["tensors"]["x"]["range"]  # type: ignore[index]
    g0 = parse_graph(plain)
    assert g0.tensor("x").range is None and "range" not in g0.to_json()["tensors"]["x"]  # type: ignore[operator,index]
    assert g0.sha256 != g.sha256


@pytest.mark.parametrize(("rng", "rule"), [([1.0], "two numbers"), ([2.0, 1.0], "lo <= hi"), ("a", "list")])
def test_tensor_range_rejected(rng: object, rule: str) -> None:
    with pytest.raises(GraphError) as ei:
        parse_graph(_graph(rng))
    assert ei.value.tensor == "x" and ei.value.field == "range" and rule in ei.value.rule
