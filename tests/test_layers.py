"""Layering: common/ < solver/ < planner/ < backends/ < api/ (each may import only what is
below it), the planner's stages in pipeline order, and no import cycle between modules.

* ``common/`` (errors, registry, progress, paths) imports none of the others;
* ``solver/`` imports nothing of ``planner``, ``backends`` or ``api``;
* ``planner/`` imports neither ``backends`` nor ``api``, and a module of one stage imports
  only modules of its own stage or of earlier ones (:data:`STAGES`);
* ``backends/`` does not import ``api``;
* no two modules import each other, directly or through others.

Every ``import`` and ``from ... import`` of every module counts, wherever it stands
(module level, inside a function, under ``TYPE_CHECKING``)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import pytest

from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT
PACKAGES = ("common", "solver", "planner", "backends", "api", "slotplan")

# package -> forbidden top-level packages
RULES: dict[str, tuple[str, ...]] = {
    "common": ("solver", "planner", "backends", "api", "slotplan"),
    "solver": ("planner", "backends", "api", "slotplan"),
    "planner": ("backends", "api", "slotplan"),
    "backends": ("api", "slotplan"),
    "api": (),  # api/ and slotplan/ are the top: the CLI and REST, and the Python facade
    "slotplan": (),
}

# The planner's stages in the order a request walks them (docs/architecture.md): a module
# may import its own stage and the stages before it.  ``single`` (one sample), ``batch`` (B
# samples on top of it) and ``pipeline`` (the entry point) are modules directly in
# planner/; ``report`` reads finished plans.
STAGES: tuple[str, ...] = (
    "frontend", "ir", "layout", "kernels", "cost", "assign", "lower", "keys", "single", "batch", "pipeline", "report",
)
# At most this many modules directly in planner/ (besides __init__), each at most this long.
MAX_TOP_MODULES = 8
MAX_TOP_LINES = 500


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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


def source_files(package: str, root: Path = ROOT) -> list[Path]:
    return [p for p in sorted((root / package).rglob("*.py"))
            if not any(part in ("build", "_gen") for part in p.relative_to(root).parts)]


def violations(package: str, root: Path = ROOT) -> list[str]:
    forbidden = RULES[package]
    out: list[str] = []
    for path in source_files(package, root):
        for line, mod in imported_modules(path, root):
            if mod.split(".")[0] in forbidden:
                out.append(f"{path.relative_to(root)}:{line}: {package}/ imports {mod}")
    return sorted(set(out))


def stage_of(module: str) -> int | None:
    """The stage index of a planner module (None outside planner/, or planner itself)."""
    parts = module.split(".")
    if parts[0] != "planner" or len(parts) < 2:
        return None
    return STAGES.index(parts[1]) if parts[1] in STAGES else None


def stage_violations(root: Path = ROOT) -> list[str]:
    out: list[str] = []
    for path in source_files("planner", root):
        me = module_name(path, root)
        mine = stage_of(me)
        if mine is None:
            if me != "planner":
                out.append(f"{path.relative_to(root)}: not in a stage of {STAGES}")
            continue
        for line, mod in imported_modules(path, root):
            theirs = stage_of(mod)
            if theirs is not None and theirs > mine:
                out.append(f"{path.relative_to(root)}:{line}: stage {STAGES[mine]!r} imports {mod} "
                           f"(stage {STAGES[theirs]!r} comes later)")
    return sorted(set(out))


def import_graph(root: Path = ROOT) -> nx.DiGraph:
    """Module -> module edges of the project (an import of a name inside a module counts as
    an import of that module)."""
    modules = {module_name(p, root): p for pkg in PACKAGES if (root / pkg).is_dir() for p in source_files(pkg, root)}
    g = nx.DiGraph()
    g.add_nodes_from(modules)
    for me, path in modules.items():
        for _, mod in imported_modules(path, root):
            target = mod if mod in modules else mod.rpartition(".")[0]
            # a package's __init__ importing its own submodules is how a package is built
            if target in modules and target != me and not (path.name == "__init__.py" and target.startswith(me + ".")):
                g.add_edge(me, target)
    return g


def cycles(root: Path = ROOT) -> list[list[str]]:
    return sorted(sorted(c) for c in nx.strongly_connected_components(import_graph(root)) if len(c) > 1)


@pytest.mark.parametrize("package", PACKAGES)
def test_layers(package: str) -> None:
    found = violations(package)
    assert not found, "wrong-way imports:\n" + "\n".join(found)


def test_planner_stages_in_pipeline_order() -> None:
    found = stage_violations()
    assert not found, "stage order broken:\n" + "\n".join(found)


def test_no_import_cycles() -> None:
    found = cycles()
    assert not found, "import cycles (function-level imports included):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_planner_top_is_small() -> None:
    top = [p for p in sorted((ROOT / "planner").glob("*.py")) if p.name != "__init__.py"]
    assert len(top) <= MAX_TOP_MODULES, [p.name for p in top]
    long = {p.name: n for p in top if (n := len(p.read_text().splitlines())) > MAX_TOP_LINES}
    assert not long, f"modules directly in planner/ over {MAX_TOP_LINES} lines: {long}"


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
    (tmp_path / "solver" / "s.py").write_text("from common.errors import SlotplanError\nfrom planner import ir\n")
    assert violations("solver", tmp_path) == ["solver/s.py:2: solver/ imports planner.ir"]


def test_the_checks_catch_a_late_stage_and_a_lazy_cycle(tmp_path: Path) -> None:
    for d in ("planner/ir", "planner/keys", "planner/cost"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "__init__.py").write_text("")
    (tmp_path / "planner" / "__init__.py").write_text("")
    (tmp_path / "planner" / "ir" / "a.py").write_text("def f():\n    from planner.keys.b import g\n")
    (tmp_path / "planner" / "keys" / "b.py").write_text("from planner.ir import a\n")
    (tmp_path / "planner" / "cost" / "c.py").write_text("from planner.ir.a import f\n")
    assert stage_violations(tmp_path) == [
        "planner/ir/a.py:2: stage 'ir' imports planner.keys.b.g (stage 'keys' comes later)",
    ]
    assert cycles(tmp_path) == [["planner.ir.a", "planner.keys.b"]]
