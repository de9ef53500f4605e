"""Build hook: ``pip install .`` (and ``pip wheel .``) build the Lattigo extension.

Everything else about the package lives in pyproject.toml.  This file only adds one step
to setuptools' ``build_py``: run ``backends/lattigo/build.sh --package BUILD_LIB`` (gopy
wraps the Go package; the generated ``slotlattigo`` package, one shared library plus its
Python glue, lands next to ``planner/``, ``api/``... in the wheel), copy ``data/`` into the
wheel as ``slotplan/data`` (cost tables, parameter files, workloads), and mark the wheel as
platform-specific.  Needs Go >= 1.24 and a C compiler; ``GO=/path/to/go`` picks the toolchain;
``SLOTPLAN_NO_LATTIGO=1`` installs
without the extension (the ``lattigo`` backend then says it is not built).

The editable install (``pip install -e .``, what ``make install`` does) skips this step:
``make lattigo`` builds the extension in the source tree and points the venv at it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
SKIP_ENV = "SLOTPLAN_NO_LATTIGO"


def _skipped() -> bool:
    return os.environ.get(SKIP_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _go() -> str | None:
    """The go binary: $GO, else go on PATH, else /usr/local/go/bin/go (as build.sh)."""
    if os.environ.get("GO"):
        return os.environ["GO"]
    return shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)


def _missing_tool() -> str | None:
    """One line naming the first missing tool, or None."""
    go = _go()
    if go is None or not os.access(go, os.X_OK):
        return f"the Go toolchain (go >= 1.24) is not on PATH{f' (GO={go})' if go else ''}"
    cc = os.environ.get("CC", "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc}) for cgo"
    return None


class build_py(_build_py):  # noqa: N801 (setuptools' command name)
    """setuptools' build_py, then the Lattigo extension into the build tree."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # `make lattigo` builds it in the tree for the editable install
        # data/ (cost tables, parameter files, workloads, goldens: common.paths.DATA_DIR)
        data = Path(self.build_lib) / "slotplan" / "data"
        shutil.rmtree(data, ignore_errors=True)
        shutil.copytree(ROOT / "data", data)
        if _skipped():
            print(f"slotplan: {SKIP_ENV} is set: installing without the Lattigo extension", file=sys.stderr)
            return
        missing = _missing_tool()
        if missing is not None:
            raise SystemExit(f"slotplan: cannot build the Lattigo extension: {missing} "
                             f"(install it, or set {SKIP_ENV}=1 to install without the extension)")
        dest = Path(self.build_lib).resolve()
        go_dir = str(Path(str(_go())).parent)
        env = {**os.environ, "PYTHON": sys.executable, "PATH": go_dir + os.pathsep + os.environ.get("PATH", "")}
        script = ROOT / "backends" / "lattigo" / "build.sh"
        done = subprocess.run(["bash", str(script), "--package", str(dest)], env=env, check=False)
        if done.returncode != 0:
            raise SystemExit("slotplan: building the Lattigo extension failed (messages above; "
                             f"{SKIP_ENV}=1 installs without it)")


class BinaryDistribution(Distribution):
    """The wheel carries a shared library (unless the extension is skipped)."""

    def has_ext_modules(self) -> bool:
        return not _skipped()


setup(cmdclass={"build_py": build_py}, distclass=BinaryDistribution)
