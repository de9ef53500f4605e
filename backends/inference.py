"""Private inference with the client and the evaluator apart (shared/SPEC.md section 7;
docs/inference.md).

Four functions, each usable in its own process; they share only files:

* :func:`keygen` (client): ``K/secret.key`` (mode 0600, the only file with secret
  material) and ``K/eval/`` (every evaluation key the plan needs and ``manifest.json``);
* :func:`encrypt` (client): input tensors -> ciphertext file bytes (a leading sample
  dimension N gives N samples, each its own ciphertext set);
* :func:`evaluate` (evaluator): ciphertext file bytes + ``K/eval`` + the weights ->
  output ciphertext file bytes; it never opens ``secret.key`` and its Go state cannot
  reach a secret key (backends/lattigo/inference.go);
* :func:`decrypt` (client): output ciphertext file bytes -> the graph's output tensors.

The Go side (``Keygen``, ``Encrypt``, ``Evaluate``, ``Decrypt`` of the Lattigo extension)
does the cryptography; this module packs tensors into slot vectors with the plan's tables,
writes and checks the self-describing ciphertext files (headers validated with pydantic)
and checks that files belong together: the plan digest, the parameters digest and the key
set id are in the secret key's header, the evaluation manifest and every ciphertext file.

Ciphertext file: ``SLOTPLAN-CT\\n``, a 4-byte little-endian header length, the JSON header
(:class:`CiphertextHeader`), then the payload: per ciphertext an 8-byte little-endian
length and Lattigo's ``MarshalBinary`` bytes, sample-major.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.errors import SlotplanError
from planner.frontend.ranges import check_input_ranges, check_values

__all__ = [
    "CT_FORMAT",
    "CiphertextHeader",
    "EvalManifest",
    "InferenceError",
    "KeygenReport",
    "SecretKeyHeader",
    "ciphertext_header",
    "decrypt",
    "encrypt",
    "evaluate",
    "inference_plan_digest",
    "keygen",
    "params_digest",
    "read_manifest",
    "weights_digest",
]

CT_MAGIC = b"SLOTPLAN-CT\n"
SK_MAGIC = b"SLOTPLAN-SK\n"
CT_FORMAT: Final = "slotplan.ciphertexts"
SK_FORMAT = "slotplan.secret-key"
EVAL_FORMAT = "slotplan.eval-keys"
FORMAT_VERSION: Final = 1
SECRET_KEY_NAME = "secret.key"
EVAL_DIR_NAME = "eval"
MANIFEST_NAME = "manifest.json"
# A directory for the serving process's plaintext store (backends/lattigo/ptstore.go): the
# weights' encodings the plaintext cache cannot keep are spilled there once and read back by
# later requests (docs/lattigo.md, "The plaintext store").
PLAINTEXT_STORE_ENV = "SLOTPLAN_PLAINTEXT_STORE"


class InferenceError(SlotplanError):
    """Bad input to keygen/encrypt/evaluate/decrypt: a file of another plan, other keys or
    other parameters, a corrupt or truncated file, inputs or weights that do not fit."""


# --------------------------------------------------------------------------------------
# File headers (pydantic)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CiphertextEntry(_Strict):
    sample: int = Field(ge=0)
    tensor: str
    table: str
    level: int = Field(ge=0)
    log2_scale: float
    bytes: int = Field(gt=0)


class CiphertextHeader(_Strict):
    """Header of a ciphertext file (inputs written by ``encrypt``, outputs by ``evaluate``)."""

    format: Literal["slotplan.ciphertexts"]
    version: Literal[1]
    kind: Literal["inputs", "outputs"]
    plan_digest: str = Field(min_length=64, max_length=64)
    params_digest: str = Field(min_length=64, max_length=64)
    key_set_id: str = Field(min_length=1, max_length=64)
    samples: int = Field(ge=1)
    batched: bool  # the inputs had a leading sample dimension (the outputs get one)
    # a plan of batch B (SPEC section 8): the N samples the ``samples`` ciphertext sets hold
    # (ceil(N / B) sets, the last padded); absent for plans of one sample
    sample_count: int | None = Field(default=None, ge=1)
    ciphertexts: list[CiphertextEntry]
    payload_bytes: int = Field(ge=0)
    payload_sha256: str = Field(min_length=64, max_length=64)


class SecretKeyHeader(_Strict):
    """Header of ``secret.key`` (written by the Go side; no secret material)."""

    format: Literal["slotplan.secret-key"]
    version: Literal[1]
    key_set_id: str = Field(min_length=1)
    plan_digest: str
    params_digest: str
    log_n: int
    level_q: int
    bytes: int = Field(gt=0)


class ManifestKey(_Strict):
    k: int
    galois_element: int
    file: str
    bytes: int = Field(gt=0)
    level_q: int = Field(ge=0)
    level_p: int = Field(ge=0)
    conjugation: bool = False
    kind: Literal["rotation", "conjugation", "boot_galois"]


class BootManifest(_Strict):
    literal: str
    galois: list[ManifestKey]
    relin: str
    dense_to_sparse: str
    sparse_to_dense: str
    bytes: int
    evaluation_keys_binary_size: int


class EvalManifest(_Strict):
    """``K/eval/manifest.json``: the key set, what it was generated for, and every key."""

    format: Literal["slotplan.eval-keys"]
    version: Literal[1]
    key_set_id: str = Field(min_length=1)
    plan_digest: str
    params_digest: str
    log_n: int
    q: list[int]
    p: list[int]
    relin: str | None = None
    relin_bytes: int | None = None
    relin_level_q: int | None = None
    rotations: list[ManifestKey]
    boot: BootManifest | None = None


def _one_line(e: Exception | str) -> str:
    return " ".join(str(e).split())


def _validation(what: str, e: ValidationError) -> InferenceError:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ()))
    return InferenceError(f"{what}: {loc or 'header'}: {err.get('msg', 'invalid')}")


# --------------------------------------------------------------------------------------
# Digests


def _canonical(obj: Any) -> bytes:
    from backends.lattigo_backend import _json_default

    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default).encode()


def inference_plan_digest(plan: Mapping[str, Any]) -> str:
    """sha256 of the plan's canonical JSON: keys and ciphertexts belong to exactly this plan
    (its program decides the inputs, the rotation keys and their levels). The ``fused``
    annotation is left out: it is derived from the program, changes no key, input or
    level, and a plan written before it existed keeps its digest (and its keys)."""
    return hashlib.sha256(_canonical({k: v for k, v in plan.items() if k != "fused"})).hexdigest()


def params_digest(plan: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of the plan's ``params``."""
    return hashlib.sha256(_canonical(plan.get("params"))).hexdigest()


def weights_digest(weights: Mapping[str, np.ndarray]) -> str:
    """sha256 over the weights' names, shapes and float64 values."""
    h = hashlib.sha256()
    for name in sorted(weights):
        a = np.ascontiguousarray(weights[name], dtype="<f8")
        h.update(name.encode() + b"\0" + repr(a.shape).encode() + b"\0")
        h.update(a.tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------------------
# Plan helpers


_TABLES: dict[str, Mapping[str, np.ndarray]] = {}


def _plan_tables(plan: Mapping[str, Any], tables: Mapping[str, np.ndarray] | None) -> Mapping[str, np.ndarray]:
    if tables is not None:
        return tables
    d = inference_plan_digest(plan)
    if d not in _TABLES:
        from backends.runner import regenerate_tables

        _TABLES.clear()
        _TABLES[d] = regenerate_tables(plan)
    return _TABLES[d]


def _graph(plan: Mapping[str, Any]) -> Any:
    from planner.frontend.graph import parse_graph

    spec = (plan.get("graph") or {}).get("spec") if isinstance(plan.get("graph"), Mapping) else None
    if spec is None:
        raise InferenceError("the plan does not embed its graph (graph.spec): cannot read tensors by name")
    return parse_graph(spec)


def _program_ops(plan: Mapping[str, Any], op: str) -> list[Mapping[str, Any]]:
    return [i for i in plan.get("program", []) if isinstance(i, Mapping) and i.get("op") == op]


def _plan_json(plan: Mapping[str, Any]) -> str:
    from backends.lattigo_backend import go_plan_json

    return go_plan_json(plan)


def _go() -> tuple[Any, Any]:
    from backends.lattigo_backend import _ext

    return _ext()


def _call(fn: Any, *args: Any) -> dict[str, Any]:
    try:
        raw = str(fn(*args))
    except RuntimeError as e:  # gopy turns a Go error into RuntimeError
        raise InferenceError(_one_line(str(e).split("\n")[0])) from None
    out: dict[str, Any] = json.loads(raw)
    return out


# --------------------------------------------------------------------------------------
# Input ranges


def _check_input_ranges(graph: Any, plan: Mapping[str, Any], inputs: Mapping[str, np.ndarray]) -> None:
    """Refuse inputs outside the ranges the graph declares (``planner.frontend.ranges.check_input_ranges``,
    SPEC section 9) or a bootstrapping plan assumed (``summary.bootstrapping.assumed_ranges``),
    with one line naming the tensor."""
    check_input_ranges(graph, inputs)
    assumed = plan.get("summary", {}).get("bootstrapping", {}).get("assumed_ranges") or {}
    check_values({k: (float(v[0]), float(v[1])) for k, v in assumed.items() if k in graph.inputs}, inputs)


def _plan_batch(plan: Mapping[str, Any]) -> int | None:
    """B of a plan of several samples per ciphertext set (SPEC section 8), else None."""
    b = (plan.get("summary") or {}).get("batch")
    return None if b is None else int(b)


def _samples(graph: Any, inputs: Mapping[str, np.ndarray]) -> tuple[int, bool, list[dict[str, np.ndarray]]]:
    """Split the inputs into samples: an array of the tensor's size is one sample; one with a
    leading dimension N and the tensor's size per row is N samples (every input must agree)."""
    extra = sorted(set(inputs) - set(graph.inputs))
    if extra:
        raise InferenceError(f"input {extra[0]!r}: not a graph input (its inputs: {', '.join(graph.inputs)})")
    per: dict[str, np.ndarray] = {}
    counts: dict[str, int | None] = {}
    for name in graph.inputs:
        if name not in inputs:
            raise InferenceError(f"input {name!r}: not given (one array per graph input)")
        a = np.asarray(inputs[name])
        shape = tuple(int(d) for d in graph.shape(name))
        size = int(np.prod(shape, dtype=np.int64))
        if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
            raise InferenceError(f"input {name!r}: dtype {a.dtype} is not numeric")
        if a.ndim == len(shape) + 1 and tuple(a.shape[1:]) == shape and a.shape[0] >= 1:
            counts[name], per[name] = int(a.shape[0]), a.astype(np.float64)
        elif a.size == size:
            counts[name], per[name] = None, a.astype(np.float64).reshape((1, *shape))
        elif a.ndim >= 2 and a.shape[0] >= 1 and a.size == a.shape[0] * size:
            counts[name], per[name] = int(a.shape[0]), a.astype(np.float64).reshape((a.shape[0], *shape))
        else:
            raise InferenceError(
                f"input {name!r}: shape {tuple(a.shape)} is neither the graph's {shape} ({size} elements) "
                f"nor N x {size} elements")
        if not np.all(np.isfinite(per[name])):
            raise InferenceError(f"input {name!r}: holds NaN or infinite values")
    batched = any(c is not None for c in counts.values())
    ns = {per[n].shape[0] for n in graph.inputs}
    if len(ns) > 1:
        raise InferenceError(f"inputs: sample counts differ ({', '.join(f'{n}: {per[n].shape[0]}' for n in graph.inputs)})")
    n = ns.pop() if ns else 1
    return n, batched, [{k: per[k][s] for k in graph.inputs} for s in range(n)]


def _weights(graph: Any, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for key in weights:
        if key not in graph.weights:
            raise InferenceError(f"weight {key!r}: not a graph weight (its weights: {', '.join(graph.weights[:8])})")
    for name in graph.weights:
        if name not in weights:
            raise InferenceError(f"weight {name!r}: not given (one array per graph weight)")
        a = np.asarray(weights[name])
        shape = tuple(int(d) for d in graph.shape(name))
        if a.size != int(np.prod(shape, dtype=np.int64)):
            raise InferenceError(f"weight {name!r}: {a.size} elements, the graph declares {shape}")
        v = a.astype(np.float64).reshape(shape)
        if not np.all(np.isfinite(v)):
            raise InferenceError(f"weight {name!r}: holds NaN or infinite values")
        out[name] = v
    return out


# --------------------------------------------------------------------------------------
# Files


def _frame(magic: bytes, header: BaseModel, payload: bytes) -> bytes:
    head = header.model_dump_json(exclude_none=True).encode()
    return magic + struct.pack("<I", len(head)) + head + payload


def _unframe(data: bytes, magic: bytes, what: str) -> tuple[dict[str, Any], int]:
    if len(data) < len(magic) + 4 or data[: len(magic)] != magic:
        raise InferenceError(f"{what}: not a slotplan {'ciphertext' if magic == CT_MAGIC else 'secret key'} file")
    (hl,) = struct.unpack_from("<I", data, len(magic))
    start = len(magic) + 4
    if hl > len(data) - start:
        raise InferenceError(f"{what}: truncated (header)")
    try:
        head = json.loads(data[start : start + hl])
    except (ValueError, UnicodeDecodeError):
        raise InferenceError(f"{what}: the header is not valid JSON") from None
    if not isinstance(head, dict):
        raise InferenceError(f"{what}: the header is not a JSON object")
    return head, start + hl


def ciphertext_header(data: bytes, what: str = "ciphertext file") -> tuple[CiphertextHeader, int]:
    """Validate a ciphertext file (header, payload length and checksum); returns its header
    and the payload's offset."""
    head, at = _unframe(data, CT_MAGIC, what)
    if head.get("format") != CT_FORMAT:
        raise InferenceError(f"{what}: format {head.get('format')!r}, expected {CT_FORMAT!r}")
    if head.get("version") != FORMAT_VERSION:
        raise InferenceError(f"{what}: format version {head.get('version')!r}, this slotplan reads {FORMAT_VERSION}")
    try:
        h = CiphertextHeader.model_validate(head)
    except ValidationError as e:
        raise _validation(what, e) from None
    payload = memoryview(data)[at:]
    if len(payload) != h.payload_bytes:
        raise InferenceError(f"{what}: truncated or padded ({len(payload)} payload bytes, the header says {h.payload_bytes})")
    if sum(c.bytes + 8 for c in h.ciphertexts) != h.payload_bytes:
        raise InferenceError(f"{what}: the ciphertext sizes do not add up to the payload")
    if hashlib.sha256(payload).hexdigest() != h.payload_sha256:
        raise InferenceError(f"{what}: corrupt (payload checksum mismatch)")
    return h, at


def _check_ct(h: CiphertextHeader, plan: Mapping[str, Any], kind: str, what: str) -> None:
    if h.kind != kind:
        raise InferenceError(f"{what}: holds {h.kind}, expected {kind} (encrypt writes inputs, evaluate outputs)")
    if h.params_digest != params_digest(plan):
        raise InferenceError(f"{what}: made for other parameters (params digest {h.params_digest[:12]}...)")
    if h.plan_digest != inference_plan_digest(plan):
        raise InferenceError(f"{what}: made for another plan (plan digest {h.plan_digest[:12]}..., "
                             f"this plan's {inference_plan_digest(plan)[:12]}...)")
    per = len(_program_ops(plan, "input" if kind == "inputs" else "output"))
    if len(h.ciphertexts) != h.samples * per:
        raise InferenceError(f"{what}: {len(h.ciphertexts)} ciphertexts for {h.samples} samples of {per}")


def read_secret_header(key_dir: str | Path) -> SecretKeyHeader:
    """The header of ``key_dir/secret.key`` (client side)."""
    path = Path(key_dir) / SECRET_KEY_NAME
    try:
        with open(path, "rb") as f:
            data = f.read(len(SK_MAGIC) + 4)
            if len(data) == len(SK_MAGIC) + 4 and data[: len(SK_MAGIC)] == SK_MAGIC:
                data += f.read(struct.unpack_from("<I", data, len(SK_MAGIC))[0])
    except FileNotFoundError:
        raise InferenceError(f"{path}: no secret key (run keygen first)") from None
    except OSError as e:
        raise InferenceError(f"{path}: cannot read the secret key ({e.strerror})") from None
    head, _ = _unframe(data, SK_MAGIC, str(path))
    try:
        return SecretKeyHeader.model_validate(head)
    except ValidationError as e:
        raise _validation(str(path), e) from None


def read_manifest(eval_dir: str | Path) -> EvalManifest:
    """``eval_dir/manifest.json`` validated (evaluator side)."""
    path = Path(eval_dir) / MANIFEST_NAME
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise InferenceError(f"{eval_dir}: no {MANIFEST_NAME} (not an evaluation key directory written by keygen)") from None
    except (OSError, ValueError) as e:
        raise InferenceError(f"{path}: not readable JSON ({_one_line(e)})") from None
    try:
        return EvalManifest.model_validate(raw)
    except ValidationError as e:
        raise _validation(str(path), e) from None


def _check_keys_for(plan: Mapping[str, Any], what: str, plan_d: str, params_d: str) -> None:
    if params_d != params_digest(plan):
        raise InferenceError(f"{what}: generated for other parameters (params digest {params_d[:12]}...)")
    if plan_d != inference_plan_digest(plan):
        raise InferenceError(f"{what}: generated for another plan (plan digest {plan_d[:12]}..., "
                             f"this plan's {inference_plan_digest(plan)[:12]}...)")


# --------------------------------------------------------------------------------------
# The four roles


@dataclass
class KeygenReport:
    """What :func:`keygen` wrote and how long it took."""

    key_dir: str
    secret_key_file: str
    eval_dir: str
    key_set_id: str
    secret_key_bytes: int
    eval_bytes: int  # the upload: every file of eval/, manifest included
    bytes_written: int
    files: int
    rotation_keys: int
    relin_key: bool
    boot_key_bytes: int
    keygen_seconds: float
    key_write_seconds: float
    seconds: float
    stats: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def keygen(plan: Mapping[str, Any], key_dir: str | Path, *, tables: Mapping[str, np.ndarray] | None = None) -> KeygenReport:
    """Generate a plan's key set once (client): ``key_dir/secret.key`` (mode 0600, created
    exclusively: an existing key set is never overwritten) and ``key_dir/eval/`` (rotation
    keys at the levels of the plan's key schedule, the relinearisation key when the plan
    multiplies ciphertexts, the bootstrapping keys of a boot preset, ``manifest.json``).
    ``tables`` is accepted for symmetry and not needed (keys depend on the plan only)."""
    del tables
    t0 = time.perf_counter()
    mod, _ = _go()
    key_set_id = uuid.uuid4().hex
    opts = {"key_set_id": key_set_id, "plan_digest": inference_plan_digest(plan), "params_digest": params_digest(plan)}
    kd = Path(key_dir)
    if kd.exists() and not kd.is_dir():
        raise InferenceError(f"--key-dir {kd}: exists and is not a directory")
    if (kd / SECRET_KEY_NAME).exists() or (kd / SECRET_KEY_NAME).is_symlink():
        raise InferenceError(f"{kd / SECRET_KEY_NAME} exists: keygen never overwrites keys (use a new key directory)")
    res = _call(mod.Keygen, _plan_json(plan), str(kd), json.dumps(opts))
    return KeygenReport(
        key_dir=str(kd), secret_key_file=res["secret_key_file"], eval_dir=res["eval_dir"], key_set_id=key_set_id,
        secret_key_bytes=int(res["secret_key_bytes"]), eval_bytes=int(res["eval_bytes"]),
        bytes_written=int(res["bytes_written"]), files=int(res["files"]), rotation_keys=int(res["rotation_keys"]),
        relin_key=bool(res["relin_key"]), boot_key_bytes=int(res["boot_key_bytes"]),
        keygen_seconds=float(res["keygen_seconds"]), key_write_seconds=float(res["key_write_seconds"]),
        seconds=time.perf_counter() - t0, stats=res,
    )


def encrypt(
    plan: Mapping[str, Any], key_dir: str | Path, inputs: Mapping[str, np.ndarray], *,
    tables: Mapping[str, np.ndarray] | None = None, stats: dict[str, Any] | None = None,
) -> bytes:
    """Pack and encrypt the inputs (client) into ciphertext file bytes. An array of the
    tensor's size is one sample; an array with a leading dimension N gives N samples, each
    its own ciphertext set. Inputs outside the graph's declared ranges are refused.
    ``stats``, when given, receives ``sample_seconds`` (encryption per sample) and more."""
    from backends.lattigo_backend import LattigoError, pack_vectors

    t0 = time.perf_counter()
    graph = _graph(plan)
    n, batched, samples = _samples(graph, inputs)
    for s in samples:
        _check_input_ranges(graph, plan, s)
    hdr = read_secret_header(key_dir)
    _check_keys_for(plan, str(Path(key_dir) / SECRET_KEY_NAME), hdr.plan_digest, hdr.params_digest)
    tb = _plan_tables(plan, tables)
    empty_pts = {**plan, "plaintexts": {}}
    count: int | None = None
    batch = _plan_batch(plan)
    if batch is not None:  # B samples per ciphertext set, the last set padded with zero samples
        count = n
        samples = [
            {t: np.stack([s[t] for s in samples[i:i + batch]]
                         + [np.zeros_like(samples[0][t])] * (batch - len(samples[i:i + batch]))) for t in graph.inputs}
            for i in range(0, n, batch)
        ]
        n = len(samples)
    try:
        packed = b"".join(pack_vectors(empty_pts, s, {}, tb)[0] for s in samples)
    except LattigoError as e:
        raise InferenceError(_one_line(e)) from None
    t_pack = time.perf_counter() - t0
    mod, go = _go()
    ins = _program_ops(plan, "input")
    with tempfile.TemporaryDirectory(prefix="slotplan-enc-") as tmp:
        out = Path(tmp) / "inputs.ct"
        res = _call(mod.Encrypt, _plan_json(plan), str(Path(key_dir) / SECRET_KEY_NAME),
                    go.Slice_byte.from_bytes(packed), n, str(out), "")
        payload = out.read_bytes()
    if res["key_set_id"] != hdr.key_set_id:
        raise InferenceError(f"{key_dir}: secret.key changed while encrypting")
    entries = [
        CiphertextEntry(sample=i // len(ins), tensor=str(ins[i % len(ins)].get("tensor")),
                        table=str(ins[i % len(ins)].get("table")), level=int(m["level"]),
                        log2_scale=float(m["log2_scale"]), bytes=int(m["bytes"]))
        for i, m in enumerate(res["ciphertexts"])
    ]
    header = CiphertextHeader(
        format=CT_FORMAT, version=FORMAT_VERSION, kind="inputs", plan_digest=inference_plan_digest(plan),
        params_digest=params_digest(plan), key_set_id=hdr.key_set_id, samples=n, batched=batched,
        sample_count=count, ciphertexts=entries, payload_bytes=len(payload), payload_sha256=hashlib.sha256(payload).hexdigest(),
    )
    data = _frame(CT_MAGIC, header, payload)
    if stats is not None:
        stats.update(samples=n, sample_seconds=[float(x) for x in res["sample_seconds"]], pack_seconds=t_pack,
                     bytes=len(data), seconds=time.perf_counter() - t0)
    return data


# (plan digest, weights digest) -> packed plaintext vectors (or a file of them): the
# weights are packed once per process (the Go side keeps their encodings likewise).
_PACKED: dict[tuple[str, str], tuple[bytes, str | None]] = {}
_PACKED_DIR: tempfile.TemporaryDirectory[str] | None = None


def _packed_plaintexts(plan: Mapping[str, Any], weights: Mapping[str, np.ndarray],
                       tables: Mapping[str, np.ndarray], key: tuple[str, str]) -> tuple[bytes, str | None]:
    global _PACKED_DIR
    from backends.lattigo_backend import (
        PLAINTEXT_INLINE_BYTES,
        LattigoError,
        _pack,
        _plaintext_vectors,
        _slots,
        write_plaintexts,
    )

    if key in _PACKED:
        return _PACKED[key]
    try:
        if len(plan.get("plaintexts") or {}) * _slots(plan) * 8 > PLAINTEXT_INLINE_BYTES:
            if _PACKED_DIR is None:
                _PACKED_DIR = tempfile.TemporaryDirectory(prefix="slotplan-weights-")
            path = os.path.join(_PACKED_DIR.name, f"{key[0][:16]}-{key[1][:16]}.f64")
            write_plaintexts(plan, weights, tables, path)
            entry: tuple[bytes, str | None] = (b"", path)
        else:
            entry = (_pack(list(_plaintext_vectors(plan, weights, tables))), None)
    except LattigoError as e:
        raise InferenceError(_one_line(e)) from None
    if len(_PACKED) >= 2:
        _PACKED.pop(next(iter(_PACKED)))
    _PACKED[key] = entry
    return entry


def evaluate(
    plan: Mapping[str, Any], eval_dir: str | Path, weights: Mapping[str, np.ndarray], ct: bytes, *,
    tables: Mapping[str, np.ndarray] | None = None, stats: dict[str, Any] | None = None,
    plaintext_store: str | Path | None = None,
) -> bytes:
    """Evaluate the plan on a ciphertext file's samples (evaluator): reads only ``eval_dir``
    (never a secret key), returns the output ciphertext file bytes. The weights' plaintext
    encodings are kept in this process per (plan digest, weights digest): the samples of
    one call and later calls with the same plan and weights encode them once; those the
    cache cannot keep go to the process's plaintext store where one is named
    (``plaintext_store``, else the environment's ``SLOTPLAN_PLAINTEXT_STORE``; a directory).
    ``stats``, when given, receives per-sample ``sample_seconds`` and the Go side's
    statistics."""
    t0 = time.perf_counter()
    h, offset = ciphertext_header(ct, "input ciphertext file")
    _check_ct(h, plan, "inputs", "input ciphertext file")
    manifest = read_manifest(eval_dir)
    _check_keys_for(plan, f"evaluation keys {eval_dir}", manifest.plan_digest, manifest.params_digest)
    if manifest.key_set_id != h.key_set_id:
        raise InferenceError(f"input ciphertext file: encrypted under other keys (key set {h.key_set_id[:12]}..., "
                             f"the evaluation keys' {manifest.key_set_id[:12]}...)")
    graph = _graph(plan)
    w = _weights(graph, weights)
    tb = _plan_tables(plan, tables)
    pd, wd = inference_plan_digest(plan), weights_digest(w)
    packed, pt_file = _packed_plaintexts(plan, w, tb, (pd, wd))
    opts: dict[str, Any] = {"payload_offset": offset, "cache_key": f"{pd}/{wd}", "key_set_id": manifest.key_set_id,
                            "plan_digest": pd, "params_digest": params_digest(plan)}
    if pt_file is not None:
        opts["plaintext_file"] = pt_file
    store = str(plaintext_store) if plaintext_store is not None else os.environ.get(PLAINTEXT_STORE_ENV, "").strip()
    if store:  # the serving process's plaintext store (backends/lattigo/ptstore.go)
        if not Path(store).is_dir():
            what = "plaintext_store" if plaintext_store is not None else PLAINTEXT_STORE_ENV
            raise InferenceError(f"{what}={store!r}: no such directory")
        opts["plaintext_store"] = store
    t_prep = time.perf_counter() - t0
    mod, go = _go()
    outs = _program_ops(plan, "output")
    with tempfile.TemporaryDirectory(prefix="slotplan-eval-") as tmp:
        src, dst = Path(tmp) / "inputs.ct", Path(tmp) / "outputs.ct"
        src.write_bytes(ct)
        res = _call(mod.Evaluate, _plan_json(plan), str(eval_dir), str(src), h.samples,
                    go.Slice_byte.from_bytes(packed), str(dst), json.dumps(opts))
        payload = dst.read_bytes()
    entries = [
        CiphertextEntry(sample=i // len(outs), tensor=str(outs[i % len(outs)].get("tensor")),
                        table=str(outs[i % len(outs)].get("table")), level=int(m["level"]),
                        log2_scale=float(m["log2_scale"]), bytes=int(m["bytes"]))
        for i, m in enumerate(res["outputs"])
    ]
    header = CiphertextHeader(
        format=CT_FORMAT, version=FORMAT_VERSION, kind="outputs", plan_digest=pd, params_digest=params_digest(plan),
        key_set_id=h.key_set_id, samples=h.samples, batched=h.batched, sample_count=h.sample_count,
        ciphertexts=entries,
        payload_bytes=len(payload), payload_sha256=hashlib.sha256(payload).hexdigest(),
    )
    data = _frame(CT_MAGIC, header, payload)
    if stats is not None:
        stats.update(samples=h.samples, sample_seconds=[float(s["eval_seconds"]) for s in res["samples"]],
                     prepare_seconds=t_prep, bytes=len(data), seconds=time.perf_counter() - t0, go=res)
    return data


def decrypt(
    plan: Mapping[str, Any], key_dir: str | Path, ct: bytes, *,
    tables: Mapping[str, np.ndarray] | None = None, stats: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """Decrypt and unpack an output ciphertext file (client): the graph's outputs, shaped as
    declared, with a leading sample dimension N when the inputs had one."""
    from backends.lattigo_backend import LattigoError, OutputVector, _scatter, _slots

    t0 = time.perf_counter()
    h, offset = ciphertext_header(ct, "output ciphertext file")
    _check_ct(h, plan, "outputs", "output ciphertext file")
    hdr = read_secret_header(key_dir)
    _check_keys_for(plan, str(Path(key_dir) / SECRET_KEY_NAME), hdr.plan_digest, hdr.params_digest)
    if hdr.key_set_id != h.key_set_id:
        raise InferenceError(f"output ciphertext file: encrypted under other keys (key set {h.key_set_id[:12]}..., "
                             f"this secret key's {hdr.key_set_id[:12]}...)")
    graph = _graph(plan)
    tb = _plan_tables(plan, tables)
    mod, _ = _go()
    with tempfile.TemporaryDirectory(prefix="slotplan-dec-") as tmp:
        src = Path(tmp) / "outputs.ct"
        src.write_bytes(ct)
        res = _call(mod.Decrypt, _plan_json(plan), str(Path(key_dir) / SECRET_KEY_NAME), str(src), offset,
                    h.samples, "")
    import base64

    batch = _plan_batch(plan)
    shapes = {t: tuple(plan["outputs"][t]) if batch is not None else graph.shape(t) for t in graph.outputs}
    per_sample: list[dict[str, np.ndarray]] = []
    try:
        for recs in res["samples"]:
            vecs = [OutputVector(tensor=o["tensor"], table=o["table"], level=int(o["level"]),
                                 log2_scale=float(o["log2_scale"]),
                                 values=np.frombuffer(base64.b64decode(o["data"]), dtype="<f8").astype(np.float64))
                    for o in recs]
            per_sample.append(_scatter(vecs, tb, _slots(plan), shapes))
    except LattigoError as e:
        raise InferenceError(_one_line(e)) from None
    names = list(graph.outputs)
    if batch is not None:  # sets of B samples: concatenated, the padding dropped
        count = h.sample_count if h.sample_count is not None else h.samples * batch
        per_sample = [{t: s[t][b] for t in names} for s in per_sample for b in range(batch)][:count]
    if h.batched:
        out = {t: np.stack([s[t] for s in per_sample]) for t in names}
    else:
        out = {t: per_sample[0][t] for t in names}
    if stats is not None:
        stats.update(samples=h.samples, sample_seconds=[float(x) for x in res["sample_seconds"]],
                     seconds=time.perf_counter() - t0)
    return out
