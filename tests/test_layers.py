"""Layering: solver/ < planner/ < backends/ < api/ (each may import only what is below it).

* ``solver/`` imports nothing of ``planner`` except ``planner.errors``;
* ``planner/`` imports neither ``backends`` nor ``api``;
* ``backends/`` does not import ``api``.

Every ``import`` and ``from ... import`` of every module counts, wherever it stands
(module level, inside a function, under ``TYPE_CHECKING``)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("solver", "planner", "backends", "api")

# package -> (forbidden top-level packages, allowed exceptions (module names))
RULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "solver": (("planner", "backends", "api"), ("planner.errors",)),
    "planner": (("backends", "api"), ()),
    "backends": (("api",), ()),
    "api": ((), ()),
}


def imported_modules(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """(line, module) of every import in a file; relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            for alias in node.names:  # "from planner import ir" imports planner.ir
                yield node.lineno, f"{mod}.{alias.name}"


def violations(package: str, root: Path = ROOT) -> list[str]:
    forbidden, allowed = RULES[package]
    out: list[str] = []
    for path in sorted((root / package).rglob("*.py")):
        if any(part in ("build", "_gen") for part in path.relative_to(root).parts):
            continue
        for line, mod in imported_modules(path, root):
            top = mod.split(".")[0]
            if top not in forbidden:
                continue
            if any(mod == a or mod.startswith(a + ".") for a in allowed):
                continue  # "from planner.errors import X" reads as planner.errors.X
            out.append(f"{path.relative_to(root)}:{line}: {package}/ imports {mod}")
    return sorted(set(out))


@pytest.mark.parametrize("package", PACKAGES)
def test_layers(package: str) -> None:
    found = violations(package)
    assert not found, "wrong-way imports:\n" + "\n".join(found)


def test_the_walk_sees_every_kind_of_import(tmp_path: Path) -> None:
    pkg = tmp_path / "planner"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "import backends.sim\n"
        "from api import cli\n"
        "def f():\n    from backends.runner import x\n"
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import api.rest\n"
    )
    (pkg / "ok.py").write_text("import solver\nfrom planner import ir\n")
    found = violations("planner", tmp_path)
    assert found == [
        "planner/m.py:1: planner/ imports backends.sim",
        "planner/m.py:2: planner/ imports api.cli",
        "planner/m.py:4: planner/ imports backends.runner.x",
        "planner/m.py:7: planner/ imports api.rest",
    ]
    (tmp_path / "solver").mkdir()
    (tmp_path / "solver" / "s.py").write_text(
        "from planner.errors import SlotplanError\nfrom planner import errors\nfrom planner import ir\n"
    )
    assert violations("solver", tmp_path) == ["solver/s.py:3: solver/ imports planner.ir"]
