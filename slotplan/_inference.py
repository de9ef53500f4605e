"""``slotplan.Client`` / ``slotplan.Server``: private inference with the client and the
server apart (shared/SPEC.md section 7), over :mod:`backends.inference`.

The client holds the secret key (``key_dir/secret.key``) and the data; the server holds the
weights and the evaluation keys; what travels between them is bytes: :class:`EvalKeys`
(once) and :class:`Ciphertext` (per request).
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import tarfile
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from backends import inference as inf
from common.errors import SlotplanError
from slotplan._plan import Plan

# an uploaded key set is refused above this many bytes (n16boot key sets are ~10 GB; the
# bound is for a corrupt or hostile header, not a size policy)
MAX_EVAL_KEYS_BYTES = 64 << 30
MAX_EVAL_KEY_FILES = 100_000


def _plan_of(plan: Plan | str | Path) -> Plan:
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, str | Path):
        return Plan.load(plan)
    raise SlotplanError(f"plan: expected a slotplan.Plan or a plan file path, got {type(plan).__name__}")


def _lattigo(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a backends.inference function; a missing extension becomes one InferenceError line."""
    from backends.lattigo_backend import LattigoError

    try:
        return fn(*args, **kwargs)
    except LattigoError as e:
        raise inf.InferenceError(str(e).split("\n")[0]) from None


class Ciphertext:
    """A ciphertext file's bytes (inputs from :meth:`Client.encrypt`, outputs from
    :meth:`Server.evaluate`): self-describing and versioned (format, plan and parameters
    digests, key set, sample count, per ciphertext its level and scale)."""

    __slots__ = ("_data", "header")

    def __init__(self, data: bytes) -> None:
        self.header: inf.CiphertextHeader = inf.ciphertext_header(bytes(data))[0]
        self._data = bytes(data)

    @classmethod
    def from_bytes(cls, data: bytes) -> Ciphertext:
        """Read a ciphertext file's bytes (checked: format, version, length, checksum)."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise inf.InferenceError(f"ciphertext: expected bytes, got {type(data).__name__}")
        return cls(bytes(data))

    def to_bytes(self) -> bytes:
        """The ciphertext file's bytes (what ``slotplan encrypt`` / ``evaluate`` write)."""
        return self._data

    @classmethod
    def load(cls, path: str | Path) -> Ciphertext:
        try:
            return cls(Path(path).read_bytes())
        except OSError as e:
            raise inf.InferenceError(f"{path}: cannot read the ciphertext file ({e.strerror or e})") from None

    def save(self, path: str | Path) -> None:
        """Write the bytes atomically."""
        _atomic_write(Path(path), self._data)

    @property
    def kind(self) -> str:
        """``inputs`` or ``outputs``."""
        return str(self.header.kind)

    @property
    def samples(self) -> int:
        return int(self.header.samples)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Ciphertext({self.kind}, samples={self.samples}, {len(self._data)} bytes)"


class EvalKeys:
    """An evaluation key set: a directory with ``manifest.json`` and the key files (rotation,
    relinearisation, bootstrapping) written by :meth:`Client.keygen`.  No secret material.

    ``to_bytes()`` is an uncompressed tar of the directory (members ``eval/...``), the body
    of SPEC section 7's key upload; ``from_bytes()`` unpacks one into a directory (a private
    temporary one by default, removed with the object)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.manifest: inf.EvalManifest = inf.read_manifest(self.path)
        self._tmp: Any = None

    @property
    def key_set_id(self) -> str:
        return str(self.manifest.key_set_id)

    def files(self) -> list[Path]:
        """The directory's files, sorted (manifest included)."""
        return sorted(p for p in self.path.rglob("*") if p.is_file())

    def nbytes(self) -> int:
        """Bytes on disk (what an upload carries, less the tar headers)."""
        return sum(p.stat().st_size for p in self.files())

    def to_bytes(self) -> bytes:
        """An uncompressed tar of the directory, deterministic (sorted, mtime 0, owner 0)."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for p in self.files():
                info = tarfile.TarInfo(f"{inf.EVAL_DIR_NAME}/{p.relative_to(self.path).as_posix()}")
                info.size = p.stat().st_size
                info.mode = 0o644
                info.mtime = 0
                with open(p, "rb") as fh:
                    tar.addfile(info, fh)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, dest: str | Path | None = None) -> EvalKeys:
        """Unpack a tar written by :meth:`to_bytes` (or ``tar -cf - -C K eval``) into ``dest``
        (created; must be empty), or a private temporary directory removed with the object.
        Only regular files with relative names inside the directory are accepted; the
        manifest is validated."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise inf.InferenceError(f"evaluation keys: expected bytes (a tar), got {type(data).__name__}")
        owned = dest is None
        target = Path(tempfile.mkdtemp(prefix="slotplan-evalkeys-")) if dest is None else Path(dest)
        try:
            if not owned:
                if target.exists() and (not target.is_dir() or any(target.iterdir())):
                    raise inf.InferenceError(f"{target}: exists and is not an empty directory")
                target.mkdir(parents=True, exist_ok=True)
            _untar(bytes(data), target)
            keys = cls(target)
        except BaseException:
            if owned:
                shutil.rmtree(target, ignore_errors=True)
            raise
        if owned:
            keys._tmp = weakref.finalize(keys, shutil.rmtree, str(target), True)
        return keys

    def __repr__(self) -> str:
        return f"EvalKeys({str(self.path)!r}, key_set={self.key_set_id[:12]}..., {len(self.manifest.rotations)} rotation keys)"


def _untar(data: bytes, target: Path) -> None:
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:")  # noqa: SIM115 (closed by the with below)
    except tarfile.TarError as e:
        raise inf.InferenceError(f"evaluation keys: not an uncompressed tar ({e})") from None
    with tar:
        members = tar.getmembers()
        if len(members) > MAX_EVAL_KEY_FILES:
            raise inf.InferenceError(f"evaluation keys: {len(members)} tar members (at most {MAX_EVAL_KEY_FILES})")
        names = [m.name for m in members if not m.isdir()]
        # `tar -cf - -C K eval` and to_bytes() put everything under eval/; `-C K/eval .` does not
        strip = f"{inf.EVAL_DIR_NAME}/" if names and all(n.startswith(f"{inf.EVAL_DIR_NAME}/") for n in names) else ""
        total = 0
        for m in members:
            if m.isdir():
                continue
            rel = m.name[len(strip):] if strip else m.name
            rel = rel[2:] if rel.startswith("./") else rel
            parts = Path(rel).parts
            if not m.isfile() or not rel or Path(rel).is_absolute() or ".." in parts:
                raise inf.InferenceError(f"evaluation keys: tar member {m.name!r}: only regular files with "
                                         "relative names inside the key directory are accepted")
            total += m.size
            if total > MAX_EVAL_KEYS_BYTES:
                raise inf.InferenceError(f"evaluation keys: more than {MAX_EVAL_KEYS_BYTES} bytes")
            out = target.joinpath(*parts)
            out.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            assert src is not None
            with src, open(out, "xb") as fh:
                shutil.copyfileobj(src, fh)
            os.chmod(out, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)


def _atomic_write(path: Path, data: bytes) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise inf.InferenceError(f"cannot write {path}: directory {parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class Client:
    """The data owner: generates the key set once, encrypts inputs, decrypts outputs.

    ``key_dir`` holds ``secret.key`` (mode 0600, never sent anywhere) and ``eval/`` (sent
    to the server once, as :class:`EvalKeys`).  ``last_stats`` holds the timings of the
    last call (``sample_seconds`` per sample, ``seconds`` in all, ...)."""

    def __init__(self, plan: Plan | str | Path, key_dir: str | Path) -> None:
        self.plan = _plan_of(plan)
        self.key_dir = Path(key_dir)
        self.last_stats: dict[str, Any] = {}
        self.keygen_report: inf.KeygenReport | None = None

    def keygen(self) -> EvalKeys:
        """Generate the plan's key set (once: an existing ``secret.key`` is never overwritten)
        and return the evaluation keys to hand to the server."""
        self.keygen_report = _lattigo(inf.keygen, self.plan.document, self.key_dir)
        self.last_stats = self.keygen_report.to_json() if self.keygen_report is not None else {}
        return self.eval_keys

    @property
    def eval_keys(self) -> EvalKeys:
        """The evaluation keys of this key directory (``key_dir/eval``)."""
        return EvalKeys(self.key_dir / inf.EVAL_DIR_NAME)

    def encrypt(self, inputs: Mapping[str, npt.ArrayLike]) -> Ciphertext:
        """Pack and encrypt the graph's inputs, by name.  An array of the tensor's size is one
        sample; a leading dimension N gives N samples (decrypt then returns N outputs)."""
        arrays = _arrays(inputs, "inputs")
        stats: dict[str, Any] = {}
        data = _lattigo(inf.encrypt, self.plan.document, self.key_dir, arrays, tables=self.plan.tables, stats=stats)
        self.last_stats = stats
        return Ciphertext(data)

    def decrypt(self, ct: Ciphertext | bytes) -> dict[str, np.ndarray]:
        """Decrypt and unpack an output ciphertext: the graph's outputs by name, shaped as
        declared (with the leading sample dimension when the inputs had one)."""
        data = ct.to_bytes() if isinstance(ct, Ciphertext) else Ciphertext.from_bytes(ct).to_bytes()
        stats: dict[str, Any] = {}
        out: dict[str, np.ndarray] = _lattigo(inf.decrypt, self.plan.document, self.key_dir, data,
                                              tables=self.plan.tables, stats=stats)
        self.last_stats = stats
        return out


class Server:
    """The model owner: evaluates the plan on ciphertexts with the weights and the
    evaluation keys.  It never sees a secret key (there is none in :class:`EvalKeys`).

    ``weights``: arrays by tensor name, a weights ``.npz`` path, or None for the weights an
    ONNX import put in ``plan.weights``.  The weights' plaintext encodings are made once per
    (plan, weights) and reused by every later :meth:`evaluate`; ``plaintext_store`` (a
    directory) spills those the process's 1 GiB plaintext cache cannot keep to a file there and
    reads them back (docs/lattigo.md, "The plaintext store")."""

    def __init__(self, plan: Plan | str | Path, eval_keys: EvalKeys | str | Path,
                 weights: Mapping[str, npt.ArrayLike] | str | Path | None = None, *,
                 plaintext_store: str | Path | None = None) -> None:
        self.plan = _plan_of(plan)
        self.plaintext_store = plaintext_store
        self.eval_keys = eval_keys if isinstance(eval_keys, EvalKeys) else EvalKeys(eval_keys)
        if weights is None:
            if self.plan.weights is None:
                raise SlotplanError("weights: none given and the plan has none (only an ONNX import carries them)")
            weights = self.plan.weights
        if isinstance(weights, str | Path):
            from planner.ir.io import read_arrays

            weights = read_arrays(weights, "weights")
        self.weights = _arrays(weights, "weights")
        self.last_stats: dict[str, Any] = {}

    def evaluate(self, ct: Ciphertext | bytes) -> Ciphertext:
        """Evaluate the plan on every sample of an input ciphertext; returns the outputs."""
        data = ct.to_bytes() if isinstance(ct, Ciphertext) else Ciphertext.from_bytes(ct).to_bytes()
        stats: dict[str, Any] = {}
        out = _lattigo(inf.evaluate, self.plan.document, self.eval_keys.path, self.weights, data,
                       tables=self.plan.tables, stats=stats, plaintext_store=self.plaintext_store)
        self.last_stats = stats
        return Ciphertext(out)


def _arrays(values: Mapping[str, npt.ArrayLike], what: str) -> dict[str, np.ndarray]:
    if not isinstance(values, Mapping):
        raise SlotplanError(f"{what}: expected a mapping of tensor name to array, got {type(values).__name__}")
    out: dict[str, np.ndarray] = {}
    for name, v in values.items():
        try:
            out[str(name)] = np.asarray(v, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise SlotplanError(f"{what}: tensor {name!r}: not numeric ({e})") from None
    return out
