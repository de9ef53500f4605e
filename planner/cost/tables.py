"""Objective weights of the planner, loaded strictly from data/costs/*.json.

Each table gives the weight of one operation of a cost vector in a common unit.  The
default table is the MetaKernel policy (rotations first); ``slotplan calibrate`` writes
tables measured on Lattigo for a parameter set.  What the weights price (a candidate, a
program level by level, fused blocks, bootstraps, key loads) is the time model,
:mod:`planner.cost.timing`; this module only loads and validates the tables.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.errors import SlotplanError
from common.paths import DATA_DIR
from common.registry import Registry

COSTS_DIR = DATA_DIR / "costs"
# Costs are scaled to integers for the solvers; 1000 keeps 0.001-unit weights exact.
OBJECTIVE_SCALE = 1000


class Weights(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    rotation: float = Field(ge=0)
    hoisted_rotation: float = Field(ge=0)
    pmul: float = Field(ge=0)
    cmul: float = Field(ge=0)
    add: float = Field(ge=0)
    rescale: float = Field(ge=0)
    poly: float = Field(ge=0)
    depth: float = Field(ge=0)
    # one bootstrap of one ciphertext (bootstrapping presets); tables without it price a
    # bootstrap at planner.cost.timing.BOOTSTRAP_ROTATIONS rotations
    bootstrap: float | None = Field(default=None, ge=0)

    # the Lattigo executor's fused blocks (planner/ir/fusion.py); tables without them price
    # every instruction as written
    block: float | None = Field(default=None, ge=0)
    block_baby: float | None = Field(default=None, ge=0)
    block_giant: float | None = Field(default=None, ge=0)
    block_product: float | None = Field(default=None, ge=0)
    # the decomposition of a fused block's base (c1) and P*c0, P*c1, once per base ciphertext
    # with baby rotations; None (older tables): ``block`` includes it for every block
    block_base: float | None = Field(default=None, ge=0)
    # Q-mode blocks (planner/ir/fusion.py): one product accumulated in Q, the two ModDowns
    # that bring one baby rotation down to Q, and a block's own output and final reduction;
    # None (older tables): priced as a QP product, as ``block`` (the same two ModDowns) and
    # as an ``add`` (one ciphertext written)
    block_product_q: float | None = Field(default=None, ge=0)
    block_baby_q: float | None = Field(default=None, ge=0)
    block_q: float | None = Field(default=None, ge=0)
    # sums of ct-ct products relinearised once (planner/ir/fusion.py product sums): a tensor
    # product accumulated in degree 2, and the one relinearisation of a sum; None (older
    # tables): a term priced as a ``cmul`` and no relinearisation apart
    cmul_tensor: float | None = Field(default=None, ge=0)
    relin: float | None = Field(default=None, ge=0)

    @property
    def fused(self) -> bool:
        return None not in (self.block, self.block_baby, self.block_giant, self.block_product)


class CostTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_: str = Field(alias="schema", pattern=r"^slotplan\.costs/1$")
    name: str
    source: str
    unit: str
    weights: Weights
    params: dict[str, object] | None = None
    measurements: dict[str, object] | None = None
    # issue 36: measured time of each sparse bootstrap variant of one instruction, level 0
    # in, unpacking included, in ``unit``; keys "s<k>" (bootstrap log_slots=k), "h<k>"
    # (bootstrap log_slots=k, halves) and "p<k>" (bootstrap2 log_slots=k). A variant the
    # table does not price is not offered to the choice model.
    boot_variants: dict[str, float] | None = None

    @property
    def is_time(self) -> bool:
        """A calibrated table (a time unit), what ``--objective time`` uses."""
        return self.unit in ("millisecond", "second", "microsecond")


class CostTableError(SlotplanError):
    pass


def _load_file(p: Path, name: str | Path) -> CostTable:
    try:
        raw = json.loads(p.read_text())
        return CostTable.model_validate(raw)
    except FileNotFoundError as e:
        raise CostTableError(f"cost table {str(name)!r} not found; known: {', '.join(COST_TABLES.names())}") from e
    except (ValidationError, json.JSONDecodeError) as e:
        raise CostTableError(f"cost table {p}: {e}") from e


def _discover() -> dict[str, Callable[[], CostTable]]:
    """The tables in data/costs/ now (``slotplan calibrate`` adds tables while running)."""
    return {q.stem: partial(_load_file, q, q.stem) for q in sorted(COSTS_DIR.glob("*.json")) if q.is_file()}


# Cost tables by name: the files data/costs/<name>.json.
COST_TABLES: Registry[CostTable] = Registry("cost table", "known", CostTableError, discover=_discover)


def load_costs(name_or_path: str | Path = "default") -> CostTable:
    """A cost table by name (``COST_TABLES``) or from a path (a name with a suffix)."""
    p = Path(name_or_path)
    if p.suffix:
        return _load_file(p, name_or_path)
    if str(name_or_path) in COST_TABLES:
        return COST_TABLES.create(str(name_or_path))
    # not a table of the folder: the error names the known tables
    return _load_file(COSTS_DIR / f"{name_or_path}.json", name_or_path)
