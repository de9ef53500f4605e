"""Where slotplan's data lives: ``data/`` at the repository root (a source checkout or the
editable install); a wheel (``pip install .``) carries a copy as ``slotplan/data`` (setup.py).
Every module that reads a cost table, a parameter file, a workload or a golden plan goes
through :data:`DATA_DIR`, so there is one answer to "where is the data"."""

from __future__ import annotations

from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
_REPO_DATA = _ROOT / "data"
DATA_DIR = _REPO_DATA if _REPO_DATA.is_dir() else _ROOT / "slotplan" / "data"
