"""CKKS parameters (SPEC section 3): presets, JSON form, validation and the memory model.

A :class:`Params` is a validated, immutable, hashable parameter set: ring degree
``N = 2**log_n`` (``slots = N/2``), the bit sizes of the ciphertext primes ``log_q``
(``q_0`` first; ``max_level = len(log_q) - 1``), of the key-switching primes ``log_p``
and the default scale ``2**log_scale``. These are exactly the inputs of Lattigo v6's
``ckks.ParametersLiteral{LogN, LogQ, LogP, LogDefaultScale}``.

Memory model (bytes), matching Lattigo v6 ``BinarySize()`` (which stores every residue
coefficient as one ``uint64`` word, whatever the prime's bit size):

* ciphertext at level l:  ``2 * (l+1) * N * 8``
* plaintext at level l:   ``(l+1) * N * 8``
* one rotation (Galois) key generated at level l:
  ``dnum * 2 * (#Q + #P) * N * 8 + KEY_OVERHEAD_BYTES`` with ``#Q = l + 1``,
  ``#P = len(log_p)`` and ``dnum = ceil(#Q / #P)`` (Lattigo's
  ``BaseRNSDecompositionVectorSize(levelQ, levelP)``). A key generated at a lower level
  (``rlwe.EvaluationKeyParameters{LevelQ: l}``) only has the first ``l+1`` Q primes, so
  both its width ``#Q + #P`` and its gadget length ``dnum`` shrink; it can only serve
  ciphertexts at level <= l (Lattigo silently computes garbage otherwise).
* the relinearisation key has the same shape as a Galois key.

Measured in Lattigo v6.1.1 (shared notes): LogN 13 [45,40,40,40]/[50] -> 2.5 MiB per key,
LogN 14 N14QP438 ([45]+[34]*9 / [43,43]) -> 15 MiB, LogN 16 [60]+[45]*12 / [61]*3 -> 80 MiB,
LogN 16 QP1761 (34 Q / 4 P primes) -> 342 MiB: all reproduced by the formula (tests).

Relation to FAME's memory model (Eq. 17-18 of the FAME paper): with
``B_limb = N * B_coeff``, Eq. 17 ``B_Ct^l = 2 (l+1) B_limb`` and Eq. 18
``B_evk^l = 2 beta (l + k + 1) B_limb`` are the same formulas as ours once
``B_coeff = 8`` bytes (Lattigo's uint64 words), ``k = #P`` and ``beta = dnum`` (FAME's
digits have ``alpha = (l+1)/beta`` limbs; in Lattigo ``alpha = #P``, hence
``beta = ceil((l+1)/#P)``; FAME's Set-B/Set-C (k = 8, beta = 2, L+1 = 16; k = 12, beta = 3,
L+1 = 32) follow this rule). FAME's *second* form of Eq. 17, ``2 N log Q_l / 8``, counts
bit-packed residues: that is the information content, not what Lattigo allocates, and it is
smaller by the factor ``64 / (average prime bits)`` (FAME's "0.43 MB" Set-A ciphertext is
``2 * 2^13 * 218 / 8`` bytes, while Lattigo would hold 5 limbs of 64-bit words: 640 KiB).
slotplan models what Lattigo reports, i.e. the word form.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from common.errors import ParamsError

__all__ = [
    "AUTO",
    "Boot",
    "BootLiteral",
    "BootVariant",
    "BootVariantLiteral",
    "KEY_OVERHEAD_BYTES",
    "LOG_N_RANGE",
    "PRESETS",
    "check_security",
    "insecure_line",
    "is_preset",
    "PRIME_BITS_RANGE",
    "SECURE_LOG_QP",
    "WORD_BYTES",
    "Params",
    "ParamsLiteral",
    "load_params",
    "preset",
]

# Bytes per residue coefficient in Lattigo's polynomials (uint64).
WORD_BYTES = 8
# Fixed part of a serialised Galois key besides its polynomials (Galois element, NthRoot,
# structure headers), as measured against Lattigo v6 BinarySize (shared notes: "+~544").
KEY_OVERHEAD_BYTES = 544

# Largest log2(QP) with 128-bit classical security for a uniform ternary secret
# (HomomorphicEncryption.org standard for N <= 2^15; Lattigo's table for 2^16).
# There is no published bound for N = 2^17 here: such sets are reported as not secure.
SECURE_LOG_QP: Mapping[int, int] = MappingProxyType(
    {10: 27, 11: 54, 12: 109, 13: 218, 14: 438, 15: 881, 16: 1761}
)
LOG_N_RANGE = range(10, 18)  # 10..17
PRIME_BITS_RANGE = range(20, 62)  # 20..61: Lattigo generates NTT primes of at most 61 bits
MAX_PRIMES = 128  # an absurd chain is a mistake, not a parameter set


# Lattigo's LogBSGSRatio of its bootstrapping parameters' DFT matrices; a preset's variant
# may choose another (BootVariant.log_bsgs_ratio, docs/lattigo.md "The DFTs' baby-step
# giant-step ratio"); MAX_LOG_BSGS_RATIO bounds it against mistakes (measured: 1 to 4)
DEFAULT_LOG_BSGS_RATIO = 1
MAX_LOG_BSGS_RATIO = 6


class BootVariantLiteral(BaseModel):
    """One sparse bootstrap a bootstrapping preset offers (issue 36, docs/formats.md): the
    bootstrapping parameters at ``log_slots`` (2^log_slots < slots), the slot rotation
    offsets of their Galois keys (besides the conjugation key, which every variant has), and
    the bytes of their DFT matrices, measured from Lattigo."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    log_slots: StrictInt
    key_offsets: list[StrictInt]
    matrix_bytes: StrictInt
    # log2 of the baby-to-giant step ratio of the variant's DFT matrices (CoeffsToSlots and
    # SlotsToCoeffs; Lattigo's LogBSGSRatio); 1 is Lattigo's default and may be left out
    log_bsgs_ratio: StrictInt = DEFAULT_LOG_BSGS_RATIO


class BootLiteral(BaseModel):
    """JSON form of a preset's ``boot`` object (SPEC section 3). ``log_q``/``log_p`` are the
    bootstrapping chain (residual primes first), on which every key of a bootstrapping plan
    lives; ``log_qp`` is derived (optional; must agree when given)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    literal: StrictStr
    levels_after: StrictInt
    max_abs: StrictFloat
    key_offsets: list[StrictInt]
    conjugation: StrictBool
    key_bytes: StrictInt
    matrix_bytes: StrictInt
    log_q: list[StrictInt]
    log_p: list[StrictInt]
    log_qp: StrictInt | None = None
    variants: list[BootVariantLiteral] | None = None


class ParamsLiteral(BaseModel):
    """JSON form of a parameter set. Derived fields (``n``, ``slots``, ``max_level``,
    ``log_qp``, ``secure``) are optional; when present they must agree with the rest, so
    the output of :meth:`Params.to_json` loads back unchanged."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    log_n: StrictInt
    log_q: list[StrictInt]
    log_p: list[StrictInt]
    log_scale: StrictInt
    name: StrictStr | None = None
    note: StrictStr | None = None
    n: StrictInt | None = None
    slots: StrictInt | None = None
    max_level: StrictInt | None = None
    log_qp: StrictInt | None = None
    secure: StrictBool | None = None
    boot: BootLiteral | None = None


# SlotsToCoeffs levels of a Lattigo bootstrapping literal (its
# SlotsToCoeffsFactorizationDepthAndLogScales: N16QP1546H192H32 has three 39-bit levels,
# the primes 10..12 of _BOOT_LOG_Q; the executor measures EvalMod's output at level 12 =
# levels_after + 3 at n14boot)
STOC_LEVELS: Mapping[str, int] = MappingProxyType({"N16QP1546H192H32": 3})


@dataclass(frozen=True)
class BootVariant:
    """A sparse bootstrap a preset offers (:class:`BootVariantLiteral`): its bootstrapping
    parameters run at 2^log_slots slots; the Galois keys of its rotation offsets (and the
    conjugation key) and its DFT matrices join the key block ``boot`` of a plan that uses it."""

    log_slots: int
    key_offsets: tuple[int, ...]
    matrix_bytes: int
    # the DFT matrices' baby-to-giant step ratio (log2); the key offsets and matrix bytes are
    # those of the matrices at this ratio
    log_bsgs_ratio: int = DEFAULT_LOG_BSGS_RATIO

    def to_json(self) -> dict[str, object]:
        return {"log_slots": self.log_slots, "key_offsets": list(self.key_offsets), "matrix_bytes": self.matrix_bytes,
                **({"log_bsgs_ratio": self.log_bsgs_ratio} if self.log_bsgs_ratio != DEFAULT_LOG_BSGS_RATIO else {})}


@dataclass(frozen=True)
class Boot:
    """What a bootstrapping preset adds (SPEC section 3): Lattigo's bootstrapping parameter
    literal, the levels left for computation after a bootstrap, the largest |value| a
    bootstrap accepts, the slot rotation offsets of the bootstrapping Galois keys (plus the
    conjugation key), the bytes of all bootstrapping evaluation keys (Galois, relinearisation,
    encapsulation; Lattigo's ``EvaluationKeys.BinarySize``) and of the DFT matrices, and the
    bootstrapping chain ``log_q``/``log_p`` (residual Q primes first, then SlotsToCoeffs,
    EvalMod and CoeffsToSlots primes; its own P primes)."""

    literal: str
    levels_after: int
    max_abs: float
    key_offsets: tuple[int, ...]
    conjugation: bool
    key_bytes: int
    matrix_bytes: int
    log_q: tuple[int, ...]
    log_p: tuple[int, ...]
    # the sparse bootstraps offered (issue 36; empty: the full-slot bootstrap only)
    variants: tuple[BootVariant, ...] = ()

    def __post_init__(self) -> None:
        for key in ("key_offsets", "log_q", "log_p", "variants"):
            object.__setattr__(self, key, tuple(getattr(self, key)))

    def variant(self, log_slots: int) -> BootVariant | None:
        """The sparse bootstrap at 2^log_slots slots, if offered."""
        return next((v for v in self.variants if v.log_slots == log_slots), None)

    @property
    def log_qp(self) -> int:
        return sum(self.log_q) + sum(self.log_p)

    @property
    def stoc_levels(self) -> int:
        """Levels of the literal's SlotsToCoeffs (the primes above the residual ones): a
        bootstrap in NeuJeans' order (``bootstrap_cins``) skips it, so its outputs have
        these levels above ``levels_after`` (docs/cins.md). 0 for a literal not listed."""
        return STOC_LEVELS.get(self.literal, 0)

    @property
    def block_bytes(self) -> int:
        """The resident block ``boot``: every bootstrapping key and the DFT matrices."""
        return self.key_bytes + self.matrix_bytes

    @property
    def galois_keys(self) -> int:
        """The block's Galois keys: one per rotation offset, and the conjugation key."""
        return len(self.key_offsets) + (1 if self.conjugation else 0)

    def to_json(self) -> dict[str, object]:
        return {
            "literal": self.literal,
            "levels_after": self.levels_after,
            "max_abs": self.max_abs,
            "key_offsets": list(self.key_offsets),
            "conjugation": self.conjugation,
            "key_bytes": self.key_bytes,
            "matrix_bytes": self.matrix_bytes,
            "log_q": list(self.log_q),
            "log_p": list(self.log_p),
            "log_qp": self.log_qp,
            **({"variants": [v.to_json() for v in self.variants]} if self.variants else {}),
        }

    @classmethod
    def from_literal(cls, lit: BootLiteral) -> Boot:
        boot = cls(
            literal=lit.literal,
            levels_after=lit.levels_after,
            max_abs=float(lit.max_abs),
            key_offsets=tuple(lit.key_offsets),
            conjugation=lit.conjugation,
            key_bytes=lit.key_bytes,
            matrix_bytes=lit.matrix_bytes,
            log_q=tuple(lit.log_q),
            log_p=tuple(lit.log_p),
            variants=tuple(BootVariant(v.log_slots, tuple(v.key_offsets), v.matrix_bytes, v.log_bsgs_ratio)
                           for v in (lit.variants or ())),
        )
        seen: set[int] = set()
        for j, v in enumerate(boot.variants):
            if v.log_slots in seen or v.log_slots < 1:
                raise ParamsError(f"log_slots {v.log_slots} repeated or below 1", field=f"boot.variants[{j}].log_slots")
            seen.add(v.log_slots)
        if lit.log_qp is not None and lit.log_qp != boot.log_qp:
            raise ParamsError(
                f"given log_qp = {lit.log_qp} disagrees with the bootstrapping chain, which gives {boot.log_qp}",
                field="boot.log_qp",
            )
        return boot


@dataclass(frozen=True)
class Params:
    """A validated CKKS parameter set (immutable, hashable). Construction validates and
    raises :class:`ParamsError` naming the field at fault."""

    log_n: int
    log_q: tuple[int, ...]
    log_p: tuple[int, ...]
    log_scale: int
    name: str = "custom"
    note: str | None = None
    boot: Boot | None = None

    def __post_init__(self) -> None:
        for key in ("log_q", "log_p"):
            value = getattr(self, key)
            if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
                raise ParamsError(f"must be a list of prime bit sizes, got {value!r}", field=key)
            object.__setattr__(self, key, tuple(value))
        _validate(self)

    # -- derived quantities ----------------------------------------------------------------
    @property
    def n(self) -> int:
        """Ring degree N."""
        return 1 << self.log_n

    @property
    def slots(self) -> int:
        """Complex slots of a ciphertext: N/2 (slotplan packs real vectors of this length)."""
        return self.n // 2

    @property
    def variant_shift(self) -> int:
        """How many doublings of slots separate ``boot.variants``' log_slots from the cost
        table's variant labels: 0 here; a batch's block ring (planner.batch.BlockParams)
        sees the real ring's variant at 2^(k + shift) slots as one at 2^k."""
        return 0

    @property
    def max_level(self) -> int:
        return len(self.log_q) - 1

    @property
    def log_qp(self) -> int:
        """Total modulus bits log2(Q*P) (sum of the prime sizes)."""
        return sum(self.log_q) + sum(self.log_p)

    @property
    def security_limit(self) -> int | None:
        """Largest log2(QP) that is 128-bit secure at this ring degree (None: unknown)."""
        return SECURE_LOG_QP.get(self.log_n)

    @property
    def secure(self) -> bool:
        """128-bit secure (log_qp within the standard's bound for this N)."""
        limit = self.security_limit
        return limit is not None and self.log_qp <= limit and (self.boot is None or self.boot.log_qp <= limit)

    @property
    def key_max_level(self) -> int:
        """Top level of the chain the evaluation keys live on: the bootstrapping chain's
        when the params bootstrap (every key of a bootstrapping plan is generated on the
        bootstrapping parameters), else ``max_level``."""
        return len(self.boot.log_q) - 1 if self.boot is not None else self.max_level

    @property
    def key_p_primes(self) -> int:
        """Number of key-switching (P) primes of the chain the keys live on."""
        return len(self.boot.log_p) if self.boot is not None else len(self.log_p)

    # -- memory model ------------------------------------------------------------------------
    @property
    def ct_max_level(self) -> int:
        """The highest level a ciphertext of a plan reaches: ``max_level``, plus the
        SlotsToCoeffs levels a ``bootstrap_cins`` gives back (bootstrapping presets)."""
        return self.max_level + (self.boot.stoc_levels if self.boot is not None else 0)

    def _level(self, level: int | None) -> int:
        if level is None:
            return self.max_level
        top = self.ct_max_level
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= top:
            raise ParamsError(
                f"level must be an integer in 0..{top}, got {level!r}", field="level"
            )
        return level

    def _key_level(self, level: int | None) -> int:
        top = self.key_max_level
        if level is None:
            # a plan's own keys are generated at the plan's top level (the executor does so
            # on the bootstrapping chain too: level 9, a fifth of a level-24 key)
            return self.max_level
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= top:
            raise ParamsError(f"key level must be an integer in 0..{top}, got {level!r}", field="level")
        return level

    def dnum(self, level: int | None = None) -> int:
        """Gadget length (number of RNS digits) of a key generated at ``level`` (default:
        the top of the key chain): ``ceil((level+1) / #P)``."""
        lv = self._key_level(level)
        return -(-(lv + 1) // self.key_p_primes)

    def ciphertext_bytes(self, level: int | None = None) -> int:
        """Bytes of one ciphertext (degree 1) at ``level`` (default: max level)."""
        return 2 * (self._level(level) + 1) * self.n * WORD_BYTES

    def plaintext_bytes(self, level: int | None = None) -> int:
        """Bytes of one encoded plaintext at ``level`` (default: max level)."""
        return (self._level(level) + 1) * self.n * WORD_BYTES

    def rotation_key_bytes(self, level: int | None = None) -> int:
        """Bytes of one Galois (rotation) key generated at ``level`` (default: ``max_level``,
        the level a plan's own keys are generated at; up to ``key_max_level``, the
        bootstrapping chain's top level 24 for a bootstrapping preset, where the block's
        keys live); such a key serves ciphertexts at levels <= ``level``. For a
        bootstrapping preset the key lives on the bootstrapping chain (its own P primes)."""
        lv = self._key_level(level)
        return self.dnum(lv) * 2 * (lv + 1 + self.key_p_primes) * self.n * WORD_BYTES + KEY_OVERHEAD_BYTES

    def boot_block_bytes(self, stream: int | None = None) -> int:
        """The resident block ``boot`` (0 without one): whole (``stream`` None), or streamed
        with ``stream`` keys read ahead (``load_key {"block": "boot", "stream": D}``): the
        DFT matrices, the relinearisation and encapsulation keys and D + 1 of its Galois
        keys (backends/lattigo/bootstream.go). The Galois keys left out are counted at
        this model's key size, a few KB under Lattigo's (39,322,144 against 39,324,272 B
        at log N 14), so the model stays above the measurement."""
        if self.boot is None:
            return 0
        if stream is None:
            return self.boot.block_bytes
        return self.boot_stream_bytes(stream + 1)

    def boot_stream_bytes(self, keys: int) -> int:
        """A streamed block ``boot`` holding ``keys`` of its Galois keys (its DFT matrices,
        relinearisation and encapsulation keys always): what it holds at a given moment
        (planner.ir.analysis.memory_series), at most :meth:`boot_block_bytes`."""
        if self.boot is None:
            return 0
        absent = max(0, self.boot.galois_keys - keys)
        return self.boot.block_bytes - absent * self.rotation_key_bytes(self.key_max_level)

    def relin_key_bytes(self, level: int | None = None) -> int:
        """Bytes of the relinearisation key generated at ``level`` (same shape as a Galois key)."""
        return self.rotation_key_bytes(level)

    # -- JSON ----------------------------------------------------------------------------------
    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "log_n": self.log_n,
            "n": self.n,
            "slots": self.slots,
            "log_q": list(self.log_q),
            "log_p": list(self.log_p),
            "log_scale": self.log_scale,
            "max_level": self.max_level,
            "log_qp": self.log_qp,
            "secure": self.secure,
            "note": self.note,
            **({"boot": self.boot.to_json()} if self.boot is not None else {}),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> Params:
        """Validate a JSON object (see :class:`ParamsLiteral`). Raises :class:`ParamsError`."""
        if not isinstance(raw, Mapping):
            raise ParamsError(f"params must be a JSON object, got {type(raw).__name__}")
        try:
            lit = ParamsLiteral.model_validate(dict(raw))
        except ValidationError as exc:
            raise _params_error_from_pydantic(exc) from None
        params = cls(
            log_n=lit.log_n,
            log_q=tuple(lit.log_q),
            log_p=tuple(lit.log_p),
            log_scale=lit.log_scale,
            name="custom" if lit.name is None else lit.name,
            note=lit.note,
            boot=None if lit.boot is None else Boot.from_literal(lit.boot),
        )
        derived: dict[str, int | bool] = {
            "n": params.n,
            "slots": params.slots,
            "max_level": params.max_level,
            "log_qp": params.log_qp,
            "secure": params.secure,
        }
        for key, expected in derived.items():
            given = getattr(lit, key)
            if given is not None and given != expected:
                raise ParamsError(
                    f"given {key} = {json.dumps(given)} disagrees with the moduli chain, which gives "
                    f"{json.dumps(expected)}",
                    field=key,
                )
        return params


def is_preset(params: Params) -> bool:
    """A built-in preset, unchanged (presets carry their own security label)."""
    return PRESETS.get(params.name) == params


def insecure_line(params_json: Mapping[str, Any]) -> str | None:
    """One line saying why a plan's parameters (its ``params`` object) are below 128-bit
    security, or None when they are secure (SPEC section 9: shown by plan, show, the page)."""
    if params_json.get("secure", True):
        return None
    log_n = params_json.get("log_n")
    limit = SECURE_LOG_QP.get(log_n) if isinstance(log_n, int) else None
    boot = params_json.get("boot")
    qp = params_json.get("log_qp")
    if isinstance(boot, Mapping) and isinstance(boot.get("log_qp"), int) and (qp is None or boot["log_qp"] > qp):
        qp = boot["log_qp"]
    bound = f"the 128-bit bound is log QP <= {limit} at log N {log_n}" if limit is not None else (
        f"no 128-bit bound is known at log N {log_n}")
    return (f"parameters {params_json.get('name', '?')} are below 128-bit security (log QP {qp}; {bound}): "
            "for tests only")


def check_security(params: Params, allow_insecure: bool = False) -> bool:
    """Refuse custom parameters above the 128-bit bound for their ring (HE standard: log QP
    at most 27/54/109/218/438/881/1761 for log N 10..16) unless ``allow_insecure``.  The
    built-in presets keep working (the test sizes say they are insecure in their note).
    Returns True when the plan must be labelled insecure (``summary.insecure``): presets
    below the bound (n12, n14boot) included."""
    if params.secure:
        return False
    if allow_insecure or is_preset(params):
        return True
    limit = params.security_limit
    bound = f"the 128-bit bound is log QP <= {limit} at log N {params.log_n}" if limit is not None else (
        f"no 128-bit bound is known at log N {params.log_n}")
    raise ParamsError(
        f"log QP = {params.log_qp} is not 128-bit secure ({bound}); pass --allow-insecure "
        "(REST: options.allow_insecure) to plan anyway",
        field="log_qp",
    )


def _validate(p: Params) -> None:
    if not isinstance(p.name, str) or not p.name.strip():
        raise ParamsError("name must be a non-empty string", field="name")
    if p.note is not None and not isinstance(p.note, str):
        raise ParamsError("note must be a string", field="note")
    for key in ("log_n", "log_scale"):
        value = getattr(p, key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamsError(f"must be an integer, got {value!r}", field=key)
    if p.log_n not in LOG_N_RANGE:
        raise ParamsError(f"log_n must be in 10..17, got {p.log_n}", field="log_n")
    for key, chain in (("log_q", p.log_q), ("log_p", p.log_p)):
        if not chain:
            raise ParamsError(f"{key} needs at least one prime", field=key)
        if len(chain) > MAX_PRIMES:
            raise ParamsError(f"{key} has {len(chain)} primes, over the limit {MAX_PRIMES}", field=key)
        for i, bits in enumerate(chain):
            if isinstance(bits, bool) or not isinstance(bits, int):
                raise ParamsError(f"prime sizes must be integers, got {bits!r}", field=f"{key}[{i}]")
            if bits not in PRIME_BITS_RANGE:
                raise ParamsError(f"prime sizes must be 20..61 bits, got {bits}", field=f"{key}[{i}]")
    if not 1 <= p.log_scale < p.log_q[0]:
        raise ParamsError(
            f"log_scale must be in 1..log_q[0]-1 = {p.log_q[0] - 1} (the scale must stay below q0), "
            f"got {p.log_scale}",
            field="log_scale",
        )
    if p.boot is not None:
        _validate_boot(p, p.boot)


def _validate_boot(p: Params, b: Boot) -> None:
    if not isinstance(b, Boot):
        raise ParamsError(f"boot must be a bootstrapping object, got {type(b).__name__}", field="boot")
    if not b.literal.strip():
        raise ParamsError("must be a non-empty string (Lattigo's bootstrapping parameter name)", field="boot.literal")
    if b.levels_after != p.max_level:
        raise ParamsError(
            f"levels_after = {b.levels_after} must equal the residual chain's max_level {p.max_level} "
            "(a bootstrap returns a ciphertext at the top residual level)",
            field="boot.levels_after",
        )
    if not (math.isfinite(b.max_abs) and b.max_abs > 0):
        raise ParamsError(f"max_abs must be a positive finite number, got {b.max_abs}", field="boot.max_abs")
    offs = b.key_offsets
    if list(offs) != sorted(set(offs)) or any(not 1 <= k < p.slots for k in offs):
        raise ParamsError(
            f"key_offsets must be sorted distinct rotation offsets in 1..{p.slots - 1}", field="boot.key_offsets"
        )
    for j, v in enumerate(b.variants):
        if not 1 <= v.log_slots < p.log_n - 1:
            raise ParamsError(f"a sparse bootstrap has 2^1..2^{p.log_n - 2} slots, got 2^{v.log_slots}",
                              field=f"boot.variants[{j}].log_slots")
        if list(v.key_offsets) != sorted(set(v.key_offsets)) or any(not 1 <= k < p.slots for k in v.key_offsets):
            raise ParamsError(f"key_offsets must be sorted distinct rotation offsets in 1..{p.slots - 1}",
                              field=f"boot.variants[{j}].key_offsets")
        if v.matrix_bytes <= 0:
            raise ParamsError(f"must be a positive number of bytes, got {v.matrix_bytes}",
                              field=f"boot.variants[{j}].matrix_bytes")
        if not 0 <= v.log_bsgs_ratio <= MAX_LOG_BSGS_RATIO:
            raise ParamsError(f"must be in 0..{MAX_LOG_BSGS_RATIO}, got {v.log_bsgs_ratio}",
                              field=f"boot.variants[{j}].log_bsgs_ratio")
    for key in ("key_bytes", "matrix_bytes"):
        if getattr(b, key) <= 0:
            raise ParamsError(f"must be a positive number of bytes, got {getattr(b, key)}", field=f"boot.{key}")
    for key, chain in (("log_q", b.log_q), ("log_p", b.log_p)):
        if not chain or len(chain) > MAX_PRIMES or any(bits not in PRIME_BITS_RANGE for bits in chain):
            raise ParamsError(f"must be a list of 1..{MAX_PRIMES} prime sizes of 20..61 bits", field=f"boot.{key}")
    if tuple(b.log_q[: len(p.log_q)]) != tuple(p.log_q) or len(b.log_q) <= len(p.log_q):
        raise ParamsError(
            "the bootstrapping chain must start with the residual primes log_q and add the bootstrap's own",
            field="boot.log_q",
        )


def _params_error_from_pydantic(exc: ValidationError) -> ParamsError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = first["loc"]
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    kind = first["type"]
    value = first.get("input")
    if kind == "missing":
        rule = "required field is missing"
    elif kind == "extra_forbidden":
        rule = f"unknown field (allowed: {', '.join(ParamsLiteral.model_fields)})"
    elif kind == "int_type":
        rule = f"must be an integer, got {value!r}"
    elif kind == "list_type":
        rule = f"must be a list of integers, got {type(value).__name__}"
    else:
        rule = str(first["msg"])
    if len(errors) > 1:
        rule += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return ParamsError(rule, field=path or None)


# --------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------

# Bootstrapping presets (SPEC section 3): Lattigo v6.1.1's N16QP1546H192H32
# (circuits/ckks/bootstrapping/default_parameters.go). Residual chain LogQ [60, 40 x 9],
# LogP [61 x 5], scale 2^40, H = 192; the bootstrapping chain adds SlotsToCoeffs [39 x 3],
# EvalMod [60 x 8] and CoeffsToSlots [56 x 4] Q primes (25 Q + 5 P, LogQP 1546).
_BOOT_LOG_Q = (60, *[40] * 9, *[39] * 3, *[60] * 8, *[56] * 4)
_BOOT_LOG_P = (61,) * 5
# Slot rotation offsets of the bootstrapping Galois keys (the conjugation key besides).
# Data, obtained once from Lattigo v6.1.1 by a Go program that called
# bootstrapping.NewParametersFromLiteral(residual, ParametersLiteral{LogN: &logN}) and
# Parameters.GaloisElements(BootstrappingParameters) (= trace keys 1 << i for
# LogSlots <= i < LogN-1, CoeffsToSlots and SlotsToCoeffs keys, conjugation), mapping each
# Galois element back to its offset with SolveDiscreteLogGaloisElement: 47 rotations + the
# conjugation = 48 Galois keys at LogN 16 (C2S alone 32, S2C alone 38), 34 + 1 = 35 at LogN 14.
_BOOT_OFFSETS_N16 = (
    1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32, 64, 96, 128, 160, 192, 224, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 20480, 24576, 28672, 30720, 31232, 31744, 32000,
    32256, 32512, 32640, 32672, 32704, 32736, 32744, 32752, 32760, 32764,
)
_BOOT_OFFSETS_N14 = (
    1, 2, 3, 4, 8, 12, 16, 24, 32, 48, 64, 128, 192, 256, 512, 768, 1024, 1536, 2048, 3072, 4096,
    5120, 6144, 7168, 7680, 7936, 8000, 8064, 8128, 8160, 8176, 8180, 8184, 8188,
)
# Largest |value| a bootstrap accepts (EvalMod approximates x mod 1 for small |m|/ratio;
# out-of-range values fail silently). EvalMod works on the plaintext's *coefficients*, and a
# slot vector bounded by A has coefficients bounded by A, reached by a constant vector (all
# its energy in one coefficient); uniform random slots spread it (coefficients ~A/sqrt(N)),
# so they under-state the error by about a factor 100 at log N 14. Measured at log N 14
# (backends/lattigo TestBootstrapRange with SLOTLATTIGO_BOOT_RANGE_CONST=1, the worst case):
# max abs error 9.9e-9 at A=1/32, 3.2e-8 at 1/16 (20.9 bits relative to A), 2.0e-7 at 1/8
# (19.2), 1.6e-6 at 1/4, 1.0e-4 at 1 (13.3), 6.4e-3 at 4 (9.3 bits): the error grows like
# 1e-4 A^3 over a floor of ~1e-8. A scaled value's bound lies in (max_abs/2, max_abs], so
# 1/16 keeps at least ~21 bits relative to its bound (4, the value before, kept 9).
BOOT_MAX_ABS = 0.0625

# Sparse bootstrap variants (issue 36): per log_slots k, the slot rotation offsets of the
# Galois keys of Lattigo's bootstrapping parameters at 2^k slots (LogSlots = k on the same
# literal: the same chain; trace keys 1 << i for k <= i < LogN-1, CoeffsToSlots and
# SlotsToCoeffs keys; the conjugation key besides) and the bytes of their encoded DFT
# matrices. Data, measured from Lattigo v6.1.1 by backends/lattigo/bootvariant_test.go
# TestMeasureBootVariants (SLOTLATTIGO_MEASURE_VARIANTS=14:12,11,10,9 and 16:14,13,12,11; the latter
# pinned, under the heavy lock: 52 s, peak RSS 5.7 GB).
# n14boot offers k = 9..12 (8192 slots: the sizes of the n16boot range scaled down, and the
# test size of every variant); n16boot offers k = 11..14: ResNet-20's stages hold 2^14,
# 2^13 and 2^12 values per image, and a halves bootstrap at k carries 2^(k+1) of them.
# n16boot's k = 12..14 split their DFT matrices at log_bsgs_ratio 3 (Lattigo's is 1): on the
# Zen 4, one core, keys resident (TestMeasureDFTRatio, 2026-11-28), CoeffsToSlots +
# SlotsToCoeffs took 9.04 s against 10.92 s at 2^14 (ratio 2: 10.74), 6.41 s against 8.26 s
# at 2^13 and 6.07 s against 7.83 s at 2^12 (ratio 4: 10.82 s, 75 keys), for 11-12 Galois
# keys more per variant (offsets: SLOTLATTIGO_MEASURE_VARIANTS=16:14@3,13@3,12@3; the
# matrices' bytes do not change). k = 11 keeps ratio 1 (not measured).
_BOOT_VARIANTS_N14 = (
    BootVariant(9, (1, 2, 3, 4, 8, 16, 24, 32, 64, 128, 256, 384, 448, 480, 496, 504, 508, 510, 512, 516, 1016, 1020,
                    1024, 2048, 4096), 239_091_232),
    BootVariant(10, (1, 2, 3, 4, 8, 16, 24, 32, 48, 64, 128, 192, 256, 512, 768, 896, 960, 992, 1008, 1016, 1020,
                     1022, 1024, 1028, 2040, 2044, 2048, 4096), 289_426_208),
    BootVariant(11, (1, 2, 3, 4, 8, 12, 16, 24, 32, 64, 96, 128, 256, 384, 512, 1024, 1536, 1792, 1920, 1952, 1984,
                     2016, 2032, 2040, 2044, 2046, 2048, 2052, 4088, 4092, 4096), 358_636_832),
    BootVariant(12, (1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32, 48, 64, 128, 192, 256, 512, 768, 1024, 2048, 3072, 3584,
                     3840, 3904, 3968, 4032, 4064, 4080, 4088, 4092, 4096, 4104, 8176, 8184), 465_598_752),
)

_BOOT_VARIANTS_N16 = (
    BootVariant(11, (1, 2, 3, 4, 8, 12, 16, 24, 32, 64, 96, 128, 256, 384, 512, 1024, 1536, 1792, 1920, 1952, 1984,
                    2016, 2032, 2040, 2044, 2046, 2048, 2052, 4088, 4092, 4096, 8192, 16384), 1_434_475_808),
    BootVariant(12, (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128,
                    192, 256, 320, 384, 448, 512, 768, 1024, 1280, 1536, 1792, 2048, 3584, 3840, 3968, 4032, 4080,
                    4088, 4096, 8176, 8192, 16384), 1_862_301_984, log_bsgs_ratio=3),
    BootVariant(13, (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128,
                    192, 256, 320, 384, 448, 512, 768, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 6144,
                    7680, 7936, 8064, 8128, 8176, 8184, 8192, 16368, 16384), 2_139_130_656, log_bsgs_ratio=3),
    BootVariant(14, (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128,
                    144, 160, 176, 192, 208, 224, 240, 256, 320, 384, 448, 512, 1024, 1536, 2048, 2560, 3072, 3584,
                    4096, 5120, 6144, 7168, 8192, 12288, 15360, 15872, 16128, 16320, 16368, 16376, 16384, 32752),
                2_692_788_000, log_bsgs_ratio=3),
)


def _boot_preset(log_n: int, name: str, note: str, offsets: tuple[int, ...], key_bytes: int, matrix_bytes: int,
                 variants: tuple[BootVariant, ...] = ()) -> Params:
    return Params(
        log_n,
        (60, *[40] * 9),
        (61,) * 5,
        40,
        name=name,
        note=note,
        boot=Boot(
            literal="N16QP1546H192H32",
            levels_after=9,
            max_abs=BOOT_MAX_ABS,
            key_offsets=offsets,
            conjugation=True,
            key_bytes=key_bytes,
            matrix_bytes=matrix_bytes,
            log_q=_BOOT_LOG_Q,
            log_p=_BOOT_LOG_P,
            variants=variants,
        ),
    )


PRESETS: Mapping[str, Params] = MappingProxyType(
    {
        # log QP = 170 + 50 = 220 > 109: NOT secure; for fast tests only.
        "n12": Params(
            12,
            (50, 40, 40, 40),
            (50,),
            40,
            name="n12",
            note="test size: log QP = 220 exceeds the 128-bit bound 109 for N = 2^12; insecure",
        ),
        # 170 + 48 = 218 <= 218
        "n13": Params(13, (50, 40, 40, 40), (48,), 40, name="n13", note="128-bit secure (log QP 218 <= 218)"),
        # 55 + 8*40 + 55 = 430 <= 438
        "n14": Params(14, (55, *[40] * 8), (55,), 40, name="n14", note="128-bit secure (log QP 430 <= 438)"),
        # 60 + 15*45 + 2*61 = 857 <= 881
        "n15": Params(
            15, (60, *[45] * 15), (61, 61), 45, name="n15", note="128-bit secure (log QP 857 <= 881)"
        ),
        # 60 + 22*56 + 7*61 = 1719 <= 1761; the MetaKernel setting (Delta = 2^56, q0 = 2^60)
        "n16": Params(
            16,
            (60, *[56] * 22),
            (61,) * 7,
            56,
            name="n16",
            note="128-bit secure (log QP 1719 <= 1761); MetaKernel's setting: scale 2^56, q0 ~ 2^60",
        ),
        # measured (Lattigo v6.1.1, shared notes): EvaluationKeys.BinarySize 7,866,551,213 B
        # (48 Galois keys + relin + 2 encapsulation keys), DFT matrices 2,953,887,680 B
        "n16boot": _boot_preset(
            16,
            "n16boot",
            "128-bit secure bootstrapping set (Lattigo N16QP1546H192H32, bootstrapping chain log QP 1546 <= 1761); "
            "9 levels after a bootstrap",
            _BOOT_OFFSETS_N16,
            7_866_551_213,
            2_953_887_680,
            _BOOT_VARIANTS_N16,
        ),
        # the same chain at log N 14 (measured: keys 1,455,522,709 B, matrices 461,666,240 B)
        "n14boot": _boot_preset(
            14,
            "n14boot",
            "test size: Lattigo N16QP1546H192H32's chain at log N 14 (log QP 1546 exceeds the 128-bit bound "
            "438 for N = 2^14); insecure; 9 levels after a bootstrap",
            _BOOT_OFFSETS_N14,
            1_455_522_709,
            461_666_240,
            _BOOT_VARIANTS_N14,
        ),
    }
)

# ``--params auto``: the smallest secure preset whose levels fit the graph, else n16boot.
AUTO = "auto"
SECURE_PRESETS_BY_SIZE = ("n13", "n14", "n15", "n16")


def preset(name: str) -> Params:
    """The preset called ``name`` (``n12`` .. ``n16``, ``n14boot``, ``n16boot``)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ParamsError(
            f"unknown preset {name!r} (presets: {', '.join(PRESETS)}; or give a JSON file)"
        ) from None


def load_params(spec: str | Path | Mapping[str, object] | Params) -> Params:
    """Params from a preset name, a JSON file path, a JSON text, a dict, or a Params."""
    if isinstance(spec, Params):
        return spec
    if isinstance(spec, Mapping):
        return Params.from_json(spec)
    if isinstance(spec, str):
        if spec in PRESETS:
            return PRESETS[spec]
        if spec.lstrip().startswith("{"):
            return Params.from_json(_decode(spec, "params JSON"))
        path = Path(spec)
        if not path.exists() and path.suffix.lower() != ".json":
            raise ParamsError(
                f"unknown preset {spec!r} and no such file (presets: {', '.join(PRESETS)}; or give a JSON file)"
            )
    elif isinstance(spec, Path):
        path = spec
    else:
        raise ParamsError(f"params must be a preset name, a path or a dict, got {type(spec).__name__}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ParamsError(f"params file {str(path)!r} is not UTF-8 text") from None
    except OSError as exc:
        raise ParamsError(f"cannot read params file {str(path)!r}: {exc.strerror or exc}") from None
    return Params.from_json(_decode(text, f"params file {str(path)!r}"))


def _decode(text: str, what: str) -> Mapping[str, object]:
    try:
        obj: object = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParamsError(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise ParamsError(f"{what} is nested too deeply") from None
    if not isinstance(obj, dict):
        raise ParamsError(f"params must be a JSON object, got {type(obj).__name__}")
    return cast(dict[str, object], obj)
