"""Packaging: a wheel built from a clean copy of the sources carries the Lattigo extension
and the data files, and imports from a fresh virtual environment with no .pth pointing back
into the source tree; ``slotplan --version``; optional dependencies refused with one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT
# what a clean checkout has (build outputs and environments are not copied)
SMALL_GRAPH = {"schema": "slotplan.graph/1", "name": "g",
               "tensors": {"W": {"shape": [4, 8], "role": "weight"}, "x": {"shape": [8], "role": "input"}},
               "nodes": [{"id": "y", "op": "matvec", "inputs": ["W", "x"]}], "outputs": ["y"]}
_SKIP = {".git", ".venv", ".venv-orion", "build", "_gen", "_genpkg", "_gen.new", "_gen.old", "_genpkg.new",
         "_genpkg.old", "__pycache__", ".mypy_cache",
         ".pytest_cache", ".ruff_cache", ".hypothesis", "out"}


def _clean_copy(dest: Path) -> Path:
    def ignore(_dir: str, names: list[str]) -> set[str]:
        return {n for n in names if n in _SKIP or n.endswith(".egg-info")}

    src = dest / "src"
    shutil.copytree(ROOT, src, ignore=ignore, symlinks=True)
    return src


@pytest.mark.slow
def test_wheel_carries_the_extension(tmp_path: Path) -> None:
    """`pip wheel .` (no isolation: the dev venv has setuptools and pybindgen) builds the
    extension in build_py; the wheel, installed with --no-deps into a bare venv, imports
    slotlattigo from its own site-packages and finds the cost tables."""
    if shutil.which("go") is None and not os.access("/usr/local/go/bin/go", os.X_OK):
        pytest.skip("no Go toolchain")
    src = _clean_copy(tmp_path)
    wheels = tmp_path / "wheels"
    env = {k: v for k, v in os.environ.items() if k != "SLOTPLAN_NO_LATTIGO"}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(src)],
        capture_output=True, text=True, env=env, timeout=840,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (whl,) = wheels.glob("slotplan-*.whl")
    assert "linux" in whl.name or "macosx" in whl.name, whl.name  # platform wheel, not py3-none-any
    names = zipfile.ZipFile(whl).namelist()
    assert any(n.startswith("slotlattigo/_slotlattigo") and n.endswith(".so") for n in names), names[:50]
    assert "slotplan/data/costs/n13-lattigo.json" in names
    assert not any(n.endswith(".pth") for n in names)

    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(target)
    py = target / "bin" / "python"
    inst = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(whl)],
                          capture_output=True, text=True, timeout=300)
    assert inst.returncode == 0, inst.stderr[-3000:]
    site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    # nothing in the new venv points into the source tree (no slotplan_lattigo.pth)
    assert not [p for p in site.glob("*.pth") if "backends/lattigo" in p.read_text() or str(ROOT) in p.read_text()]
    # its dependencies (installed with --no-deps: none) from this venv's site-packages, added
    # as a plain path: the .pth files there (our editable finder, the extension's .pth) stay
    # unprocessed, so slotplan, planner and slotlattigo can only come from the wheel
    (site / "zz_deps.pth").write_text(sysconfig_purelib() + "\n")
    probe = (
        "import slotlattigo.slotlattigo as m, importlib.metadata as md, planner.cost.tables as c, slotplan\n"
        "print(m.Version()); print(m.__file__); print(md.version('slotplan')); print(c.DATA_DIR)\n"
        "print(slotplan.__file__)\n"
        "assert (c.DATA_DIR / 'costs' / 'n13-lattigo.json').is_file()\n"
        f"p = slotplan.plan({SMALL_GRAPH!r}, params='n12')\n"
        "print(sorted(p.simulate()))\n"
    )
    got = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")})
    assert got.returncode == 0, got.stderr[-3000:]
    version, where, dist_version, data_dir, facade, outputs = got.stdout.split("\n")[:6]
    assert "lattigo v6" in version
    for path in (where, data_dir, facade):
        assert Path(path).is_relative_to(target), path
    assert dist_version == _project_version()
    assert outputs == "['y']"
    cli = subprocess.run([str(target / "bin" / "slotplan"), "--version"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert cli.stdout.splitlines() == [f"slotplan {_project_version()}", version]


def sysconfig_purelib() -> str:
    import sysconfig

    return str(sysconfig.get_paths()["purelib"])


@pytest.mark.slow
def test_build_without_go_names_the_tool_and_the_switch(tmp_path: Path) -> None:
    """With no Go toolchain (GO pointing nowhere) the build stops at once with one line naming
    the missing tool and the switch; with the switch the wheel builds, without the extension."""
    src = _clean_copy(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "SLOTPLAN_NO_LATTIGO"}
    env["GO"] = "/nonexistent/go"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src)]
    done = subprocess.run([*cmd, "-w", str(tmp_path / "w1")], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "slotplan: cannot build the Lattigo extension: the Go toolchain (go >= 1.24) is not on PATH" in said
    assert "SLOTPLAN_NO_LATTIGO=1" in said
    assert "Traceback" not in said
    env["SLOTPLAN_NO_LATTIGO"] = "1"
    done = subprocess.run([*cmd, "-w", str(tmp_path / "w2")], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (whl,) = (tmp_path / "w2").glob("slotplan-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert whl.name.endswith("-py3-none-any.whl")
    assert not any(n.startswith("slotlattigo/") for n in names)
    assert "slotplan/__init__.py" in names and "slotplan/data/costs/n13-lattigo.json" in names
    # installed, slotplan works and says the extension is not built
    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(target)
    py = target / "bin" / "python"
    inst = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(whl)],
                          capture_output=True, text=True, timeout=300)
    assert inst.returncode == 0, inst.stderr[-3000:]
    site = subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   text=True).strip()
    (Path(site) / "zz_deps.pth").write_text(sysconfig_purelib() + "\n")
    cli = subprocess.run([str(target / "bin" / "slotplan"), "--version"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert cli.stdout.splitlines()[0] == f"slotplan {_project_version()}"
    assert "Lattigo extension: not built" in cli.stdout.splitlines()[1]
    probe = ("import slotplan\n"
             f"p = slotplan.plan({SMALL_GRAPH!r}, params='n12')\n"
             "try:\n    slotplan.Client(p, 'k').keygen()\nexcept slotplan.InferenceError as e:\n    print(e)\n")
    got = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    assert got.stdout.startswith("the Lattigo extension is not built"), got.stdout


def _project_version() -> str:
    import tomllib

    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def test_version_names_slotplan_and_lattigo() -> None:
    import slotplan
    from backends import lattigo_backend

    assert slotplan.__version__ == _project_version()
    done = subprocess.run([str(Path(sys.executable).parent / "slotplan"), "--version"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"slotplan {_project_version()}"
    if lattigo_backend.available():
        assert "lattigo v6." in lines[1]
    else:
        assert "not built" in lines[1]


def test_missing_optional_dependencies_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib ([viz]) and ray ([ray]) missing: one SlotplanError line naming the extra; the
    plan page renders with a note instead of its pictures."""
    import slotplan
    from api import plan_page, show
    from api.commands_ops import run_batch_items_ray
    from planner.pipeline import PlanOptions

    plan = slotplan.plan(SMALL_GRAPH, params="n12")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(slotplan.SlotplanError, match=r"needs matplotlib, an optional dependency: pip install 'slotplan\[viz\]'"):
        show.render_png(plan.document, "/tmp/never-written.png")
    assert not Path("/tmp/never-written.png").exists()
    page = plan_page.render_page("0" * 64, plan.document)
    assert "charts not available: the server needs matplotlib" in page and "<img" not in page
    with pytest.raises(slotplan.SlotplanError, match=r"--engine ray needs ray, an optional dependency: pip install 'slotplan\[ray\]'"):
        next(iter(run_batch_items_ray([], plan.document["params"], PlanOptions(), 1)))
