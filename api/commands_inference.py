"""``slotplan keygen | encrypt | evaluate | decrypt``: private inference with the client and
the evaluator apart (shared/SPEC.md section 7, docs/inference.md).

keygen, encrypt and decrypt are the client's (they read ``K/secret.key``); evaluate is the
evaluator's: it reads the evaluation keys directory, the weights and a ciphertext file, and
never opens a secret key. Bad input: one line on stderr, exit 2, nothing written.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from api.common import ExitError, fail, out
from common.errors import SlotplanError

PlanArg = Annotated[Path, typer.Argument(metavar="PLAN", help="plan file")]
TablesOpt = Annotated[Path | None, typer.Option("--tables", help="npz tables (regenerated from the plan if absent)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the report as JSON")]


def _load(plan_file: Path, tables: Path | None) -> tuple[dict[str, Any], Any]:
    from planner.ir.io import load_plan, load_tables

    pl = load_plan(plan_file)
    return pl, (load_tables(tables, pl) if tables is not None else None)


def _check_out(path: Path, flag: str) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir() or not parent.is_dir():
        raise SlotplanError(f"cannot write {flag} {path}: not a file in an existing directory")


def _write_atomic(path: Path, data: bytes) -> None:
    """Write data to path through a temporary file in the same directory (never half-written)."""
    parent = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_ct(path: Path, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise SlotplanError(f"{flag} {path}: not found") from None
    except IsADirectoryError:
        raise SlotplanError(f"{flag} {path}: is a directory") from None
    except OSError as e:
        raise SlotplanError(f"{flag} {path}: cannot read ({e.strerror})") from None


def _client_server_step(plan_file: Path, tables: Path | None, output: Path, flag: str,
                        step: Callable[[dict[str, Any], Any, dict[str, Any]], Any]) -> Any:
    """encrypt/evaluate/decrypt's common frame: the output path checked, the plan and tables
    loaded, ``step(plan, tables, stats)`` run, bad input (or a Lattigo failure) turned into
    one line and its exit status. Returns what ``step`` returned."""
    from backends.lattigo_backend import LattigoError

    try:
        _check_out(output, flag)
        pl, tb = _load(plan_file, tables)
        return step(pl, tb, {})
    except (SlotplanError, LattigoError) as e:
        raise _fail_on(e) from None


def _fail_on(e: Exception) -> ExitError:
    from backends.lattigo_backend import LattigoError

    if isinstance(e, LattigoError):  # the extension is missing or failed: not the user's input
        return fail(LattigoError(f"lattigo: {e}"), 1)
    return fail(e)


def _secs(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{sum(xs) / len(xs):.3f} s/sample (min {min(xs):.3f}, max {max(xs):.3f})"


def keygen(
    plan_file: PlanArg,
    key_dir: Annotated[Path, typer.Option("--key-dir", help="directory for secret.key (0600) and eval/ (created)")],
    tables: TablesOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Client: generate the plan's keys once: KEY_DIR/secret.key and KEY_DIR/eval/ (every
    evaluation key the plan needs, manifest.json), the directory to copy to the evaluator."""
    from backends import inference
    from backends.lattigo_backend import LattigoError

    try:
        pl, tb = _load(plan_file, tables)
        rep = inference.keygen(pl, key_dir, tables=tb)
    except (SlotplanError, LattigoError) as e:
        raise _fail_on(e) from None
    if as_json:
        out.print_json(json.dumps(rep.to_json()))
        return
    out.print(escape(
        f"wrote {rep.bytes_written} bytes ({rep.bytes_written / 2**20:.1f} MiB) in {rep.files} files in {rep.seconds:.2f} s: "
        f"{rep.secret_key_file} ({rep.secret_key_bytes} bytes, mode 0600, keep it) and {rep.eval_dir}/ "
        f"({rep.eval_bytes} bytes: {rep.rotation_keys} rotation keys"
        f"{', relinearisation key' if rep.relin_key else ''}"
        f"{f', bootstrapping keys {rep.boot_key_bytes} bytes' if rep.boot_key_bytes else ''}; copy it to the evaluator); "
        f"key generation {rep.keygen_seconds:.2f} s, writing {rep.key_write_seconds:.2f} s"))


def encrypt(
    plan_file: PlanArg,
    key_dir: Annotated[Path, typer.Option("--key-dir", help="the key directory written by keygen")],
    inputs: Annotated[Path, typer.Option("--inputs", help=".npz, one array per graph input; a leading dimension N gives N samples")],
    output: Annotated[Path, typer.Option("-o", "--output", help="ciphertext file to write")],
    tables: TablesOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Client: pack and encrypt the inputs under KEY_DIR/secret.key into a ciphertext file."""
    from backends import inference
    from planner.ir.io import read_arrays

    def step(pl: dict[str, Any], tb: Any, st: dict[str, Any]) -> dict[str, Any]:
        _write_atomic(output, inference.encrypt(pl, key_dir, read_arrays(inputs, "inputs"), tables=tb, stats=st))
        return st

    st = _client_server_step(plan_file, tables, output, "-o", step)
    if as_json:
        out.print_json(json.dumps({"output": str(output), **st}))
        return
    out.print(escape(f"wrote {output}: {st['samples']} sample(s), {st['bytes']} bytes; "
                     f"encrypt {_secs(st['sample_seconds'])}; total {st['seconds']:.3f} s"))


def evaluate(
    plan_file: PlanArg,
    eval_keys: Annotated[Path, typer.Option("--eval-keys", help="the evaluation key directory (K/eval, copied from the client)")],
    weights: Annotated[Path, typer.Option("--weights", help=".npz, one array per graph weight")],
    in_file: Annotated[Path, typer.Option("--in", help="input ciphertext file (from encrypt)")],
    output: Annotated[Path, typer.Option("-o", "--output", help="output ciphertext file to write")],
    tables: TablesOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluator: evaluate the plan on the ciphertexts with the evaluation keys; no secret key
    is read or needed."""
    from backends import inference
    from planner.ir.io import read_arrays

    def step(pl: dict[str, Any], tb: Any, st: dict[str, Any]) -> dict[str, Any]:
        ct = _read_ct(in_file, "--in")
        w = read_arrays(weights, "weights")
        _write_atomic(output, inference.evaluate(pl, eval_keys, w, ct, tables=tb, stats=st))
        return st

    st = _client_server_step(plan_file, tables, output, "-o", step)
    if as_json:
        out.print_json(json.dumps({"output": str(output), **st}))
        return
    go = st["go"]
    out.print(escape(f"wrote {output}: {st['samples']} sample(s), {st['bytes']} bytes; evaluate "
                     f"{_secs(st['sample_seconds'])}; key setup {go['setup_seconds']:.3f} s, key reads "
                     f"{go['key_load_seconds']:.3f} s; total {st['seconds']:.3f} s"))


def decrypt(
    plan_file: PlanArg,
    key_dir: Annotated[Path, typer.Option("--key-dir", help="the key directory written by keygen")],
    in_file: Annotated[Path, typer.Option("--in", help="output ciphertext file (from evaluate)")],
    out_file: Annotated[Path, typer.Option("--out", help=".npz to write: the graph's outputs (leading N when the inputs had one)")],
    tables: TablesOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Client: decrypt and unpack an output ciphertext file into the graph's output tensors."""
    from backends import inference
    from planner.ir.io import write_arrays

    st: dict[str, Any] = {}

    def step(pl: dict[str, Any], tb: Any, _: dict[str, Any]) -> dict[str, Any]:
        ys = inference.decrypt(pl, key_dir, _read_ct(in_file, "--in"), tables=tb, stats=st)
        write_arrays(out_file, ys)
        return ys

    ys = _client_server_step(plan_file, tables, out_file, "--out", step)
    if as_json:
        out.print_json(json.dumps({"output": str(out_file), "outputs": {k: list(v.shape) for k, v in ys.items()}, **st}))
        return
    shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in ys.items())
    out.print(escape(f"wrote {out_file}: {shapes}; decrypt {_secs(st['sample_seconds'])}"))


def register(app: typer.Typer) -> None:
    app.command(name="keygen")(keygen)
    app.command(name="encrypt")(encrypt)
    app.command(name="evaluate")(evaluate)
    app.command(name="decrypt")(decrypt)


__all__ = ["decrypt", "encrypt", "evaluate", "keygen", "register"]
