"""The installed distribution's version (pyproject.toml's ``version``)."""

from __future__ import annotations

from importlib import metadata


def _installed_version() -> str:
    try:
        return metadata.version("slotplan")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


__version__ = _installed_version()


def version_lines() -> list[str]:
    """What ``slotplan --version`` prints: slotplan's version, then the Lattigo extension's
    (its own version string, which names Lattigo's) or that it is not built."""
    from backends import lattigo_backend as lb

    lines = [f"slotplan {__version__}"]
    try:
        lines.append(lb.version())
    except lb.LattigoError:
        lines.append("Lattigo extension: not built (make lattigo, or pip install . with Go and a C compiler)")
    return lines
