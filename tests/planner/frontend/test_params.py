"""CKKS parameters: presets, validation, JSON and the memory model (SPEC section 3)."""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
from pathlib import Path
from typing import Any

import pytest

from common.errors import ParamsError, SlotplanError
from planner.frontend.params import (
    KEY_OVERHEAD_BYTES,
    PRESETS,
    SECURE_LOG_QP,
    Params,
    load_params,
    preset,
)

MiB = 2**20


def within(actual: float, expected: float, tol: float = 0.05) -> bool:
    return abs(actual - expected) <= tol * expected


# ---------------------------------------------------------------------------------------
# presets
# ---------------------------------------------------------------------------------------


def test_required_presets_exist() -> None:
    assert set(PRESETS) >= {"n12", "n13", "n14", "n15", "n16"}
    for name, p in PRESETS.items():
        assert p.name == name
        assert p.slots == 2 ** (p.log_n - 1) == p.n // 2
        assert load_params(name) is p
        assert preset(name) is p


@pytest.mark.parametrize(
    "name, log_n, log_qp, secure, max_level, log_scale",
    [
        ("n12", 12, 220, False, 3, 40),
        ("n13", 13, 218, True, 3, 40),
        ("n14", 14, 430, True, 8, 40),
        ("n15", 15, 857, True, 15, 45),
        ("n16", 16, 1719, True, 22, 56),
    ],
)
def test_preset_values(
    name: str, log_n: int, log_qp: int, secure: bool, max_level: int, log_scale: int
) -> None:
    p = PRESETS[name]
    assert (p.log_n, p.log_qp, p.secure, p.max_level, p.log_scale) == (
        log_n,
        log_qp,
        secure,
        max_level,
        log_scale,
    )
    assert p.log_qp == sum(p.log_q) + sum(p.log_p)
    limit = SECURE_LOG_QP[log_n]
    assert (p.log_qp <= limit) == secure
    assert p.note
    if not secure:
        assert "insecure" in p.note


def test_n16_is_metakernel_setting() -> None:
    p = PRESETS["n16"]
    assert p.slots == 32768
    assert p.log_q[0] == 60 and p.log_scale == 56
    assert all(b == 56 for b in p.log_q[1:])


def test_security_table() -> None:
    assert [SECURE_LOG_QP[k] for k in range(12, 17)] == [109, 218, 438, 881, 1761]
    assert Params(13, (60, 60, 60), (38,), 40).secure  # log QP 218 <= 218
    assert not Params(13, (60, 60, 60), (39,), 40).secure  # 219 > 218
    assert not Params(17, (60,), (60,), 40).secure  # no published bound: reported as not secure


def test_unknown_preset_lists_presets() -> None:
    with pytest.raises(ParamsError) as info:
        load_params("n99")
    assert "unknown preset 'n99'" in str(info.value)
    for name in ("n12", "n13", "n14", "n15", "n16"):
        assert name in str(info.value)
    with pytest.raises(ParamsError, match="presets: n12"):
        preset("big")


# ---------------------------------------------------------------------------------------
# loading and JSON
# ---------------------------------------------------------------------------------------


def test_load_from_dict_file_and_text(tmp_path: Path) -> None:
    raw = {"log_n": 13, "log_q": [45, 40, 40, 40], "log_p": [50], "log_scale": 40, "name": "mine"}
    p = load_params(raw)
    assert (p.name, p.log_n, p.log_q, p.log_p, p.log_scale) == ("mine", 13, (45, 40, 40, 40), (50,), 40)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    assert load_params(path) == p == load_params(str(path)) == load_params(json.dumps(raw))
    assert load_params(p) is p
    anonymous = load_params({k: v for k, v in raw.items() if k != "name"})
    assert anonymous.name == "custom"


def test_to_json_has_all_fields_and_round_trips() -> None:
    for p in PRESETS.values():
        j = p.to_json()
        for key in (
            "name",
            "log_n",
            "n",
            "slots",
            "log_q",
            "log_p",
            "log_scale",
            "max_level",
            "log_qp",
            "secure",
        ):
            assert key in j
        assert j["slots"] == p.slots and j["secure"] == p.secure
        assert json.loads(json.dumps(j)) == j
        assert load_params(j) == p


def test_inconsistent_derived_fields_rejected() -> None:
    j = PRESETS["n12"].to_json()
    j["slots"] = 4096
    with pytest.raises(ParamsError) as info:
        load_params(j)
    assert info.value.field == "slots"
    j = PRESETS["n12"].to_json()
    j["secure"] = True
    with pytest.raises(ParamsError, match="secure"):
        load_params(j)


BASE: dict[str, Any] = {"log_n": 13, "log_q": [50, 40], "log_p": [50], "log_scale": 40}


@pytest.mark.parametrize(
    "change, field, rule",
    [
        ({"log_n": 9}, "log_n", "10..17"),
        ({"log_n": 18}, "log_n", "10..17"),
        ({"log_n": 13.5}, "log_n", "must be an integer"),
        ({"log_n": True}, "log_n", "must be an integer"),
        ({"log_n": "13"}, "log_n", "must be an integer"),
        ({"log_q": []}, "log_q", "at least one prime"),
        ({"log_p": []}, "log_p", "at least one prime"),
        ({"log_q": [50, 19]}, "log_q[1]", "20..61 bits"),
        ({"log_q": [62]}, "log_q[0]", "20..61 bits"),
        ({"log_p": [70]}, "log_p[0]", "20..61 bits"),
        ({"log_q": [50, 40.0]}, "log_q[1]", "must be an integer"),
        ({"log_scale": 50}, "log_scale", "below q0"),
        ({"log_scale": 0}, "log_scale", "log_scale must be in"),
        ({"log_q": [40] * 200}, "log_q", "over the limit"),
        ({"log_q": "50"}, "log_q", "must be a list"),
        ({"bogus": 1}, "bogus", "unknown field"),
        ({"name": ""}, "name", "non-empty"),
    ],
)
def test_validation_names_the_field(change: dict[str, Any], field: str, rule: str) -> None:
    raw = {**BASE, **change}
    with pytest.raises(ParamsError) as info:
        load_params(raw)
    err = info.value
    assert err.field == field, str(err)
    assert rule in err.rule, str(err)
    assert f"field {field!r}" in str(err)
    assert isinstance(err, SlotplanError)


def test_missing_field() -> None:
    with pytest.raises(ParamsError) as info:
        load_params({"log_n": 13, "log_q": [50], "log_p": [50]})
    assert info.value.field == "log_scale" and "missing" in info.value.rule


@pytest.mark.parametrize("text, rule", [("{bad", "not valid JSON"), ("[1]", "JSON object")])
def test_bad_files(tmp_path: Path, text: str, rule: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ParamsError, match=rule):
        load_params(path)
    with pytest.raises(ParamsError, match="cannot read params file"):
        load_params(tmp_path / "none.json")


def test_direct_construction_validates_and_is_hashable() -> None:
    with pytest.raises(ParamsError):
        Params(13, (), (50,), 40)
    with pytest.raises(ParamsError, match="list of prime bit sizes"):
        Params(13, 50, (50,), 40)  # type: ignore[arg-type]
    p = Params(13, (50, 40), (50,), 40)
    q = Params(13, (50, 40), (50,), 40)
    assert p == q and hash(p) == hash(q) and len({p, q, PRESETS["n13"]}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.log_n = 14  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(p)) == p
    err = pickle.loads(pickle.dumps(ParamsError("x", field="log_n")))
    assert err.field == "log_n"


# ---------------------------------------------------------------------------------------
# memory model
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "log_n, log_q, log_p, measured_mib",
    [
        # measured with Lattigo v6.1.1 BinarySize (shared notes)
        (13, [45, 40, 40, 40], [50], 2.5),
        # the N14QP438 example set: one 45-bit + nine 34-bit Q primes, two 43-bit P primes
        (14, [45] + [34] * 9, [43, 43], 15.0),
        (16, [60] + [45] * 12, [61] * 3, 80.0),
        # the QP1761 set: 34 Q primes, 4 P primes
        (16, [55] + [45] * 33, [59] * 4, 342.0),
    ],
)
def test_rotation_key_matches_lattigo(
    log_n: int, log_q: list[int], log_p: list[int], measured_mib: float
) -> None:
    p = Params(log_n, tuple(log_q), tuple(log_p), log_q[1] if len(log_q) > 1 else 30)
    assert within(p.rotation_key_bytes(), measured_mib * MiB)
    assert within(p.relin_key_bytes(), measured_mib * MiB)


def test_key_formula() -> None:
    p = Params(13, (45, 40, 40, 40), (50,), 40)
    n = 8192
    assert p.dnum() == 4
    assert p.rotation_key_bytes() == 4 * 2 * (4 + 1) * n * 8 + KEY_OVERHEAD_BYTES
    # a key generated at level 1: #Q = 2, dnum = 2
    assert p.dnum(1) == 2
    assert p.rotation_key_bytes(1) == 2 * 2 * (2 + 1) * n * 8 + KEY_OVERHEAD_BYTES
    q = Params(16, (60,) + (45,) * 12, (61,) * 3, 45)
    assert [q.dnum(lv) for lv in (0, 2, 3, 5, 12)] == [1, 1, 2, 2, 5]
    keys = [q.rotation_key_bytes(lv) for lv in range(q.max_level + 1)]
    assert keys == sorted(keys)  # lower-level keys are never larger


def test_ciphertext_and_plaintext_bytes() -> None:
    p = PRESETS["n16"]
    n = 2**16
    assert p.ciphertext_bytes() == 2 * 23 * n * 8
    assert p.ciphertext_bytes(0) == 2 * n * 8
    assert p.plaintext_bytes() == 23 * n * 8
    assert p.plaintext_bytes(5) == 6 * n * 8
    for lv in range(p.max_level + 1):
        assert p.ciphertext_bytes(lv) == 2 * p.plaintext_bytes(lv)
    assert PRESETS["n13"].ciphertext_bytes() == 2 * 4 * 8192 * 8  # 512 KiB


@pytest.mark.parametrize("level", [-1, 4, 1.0, True, "0"])
def test_bad_level(level: Any) -> None:
    p = PRESETS["n12"]
    for method in (p.ciphertext_bytes, p.plaintext_bytes, p.rotation_key_bytes, p.relin_key_bytes):
        with pytest.raises(ParamsError) as info:
            method(level)
        assert info.value.field == "level"


def test_fame_equations_relation() -> None:
    """FAME Eq. 17/18 with B_coeff = 8, k = #P, beta = ceil((l+1)/k) are our formulas."""
    for p in PRESETS.values():
        limb = p.n * 8
        for lv in (0, p.max_level // 2, p.max_level):
            assert p.ciphertext_bytes(lv) == 2 * (lv + 1) * limb  # Eq. 17 (word form)
            k = len(p.log_p)
            beta = math.ceil((lv + 1) / k)
            assert p.rotation_key_bytes(lv) - KEY_OVERHEAD_BYTES == 2 * beta * (lv + k + 1) * limb  # Eq. 18
    # FAME Table II: Set-B (N 2^15, L* 15, k 8 -> beta 2), Set-C (N 2^16, L* 31, k 12 -> beta 3)
    set_b = Params(15, (50,) + (50,) * 15, (50,) * 8, 40)
    set_c = Params(16, (50,) + (50,) * 31, (50,) * 12, 40)
    assert set_b.dnum() == 2 and set_c.dnum() == 3
    # FAME's second form of Eq. 17 (bit-packed, 2 N log Q / 8) is the "0.43 MB" of Set-A;
    # Lattigo's uint64 words make ours larger by 64 / (average prime bits).
    packed = 2 * 2**13 * 218 // 8
    assert within(packed, 0.43 * MiB, 0.02)
    set_a = Params(13, (44, 43, 43, 44, 44), (60,), 40)  # log Q = 218 over L + 1 = 5 limbs
    assert set_a.ciphertext_bytes() == pytest.approx(packed * 64 / (218 / 5))
