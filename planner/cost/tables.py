"""Objective weights of the planner, loaded strictly from data/costs/*.json.

Each table gives the weight of one operation of a cost vector in a common unit.  The
default table is the MetaKernel policy (rotations first); ``slotplan calibrate`` writes
tables measured on Lattigo for a parameter set.
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
from planner.kernels.base import CostVector

COSTS_DIR = DATA_DIR / "costs"
# Costs are scaled to integers for the solvers; 1000 keeps 0.001-unit weights exact.
OBJECTIVE_SCALE = 1000
# Measured with Lattigo v6.1.1 (shared notes, lattigo-bootstrapping.md): one bootstrap of
# N16QP1546H192H32 took 28.5 s, one rotation at level 9 on its evaluator 0.089 s, so a
# bootstrap costs about 319 rotations (183 at log N 14).  The weight of a table without a
# measured ``bootstrap`` weight.
BOOTSTRAP_ROTATIONS = 319.0


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
    # bootstrap at BOOTSTRAP_ROTATIONS rotations
    bootstrap: float | None = Field(default=None, ge=0)

    def bootstrap_weight(self) -> float:
        return self.bootstrap if self.bootstrap is not None else BOOTSTRAP_ROTATIONS * self.rotation

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

    @property
    def is_time(self) -> bool:
        """A calibrated table (a time unit), what ``--objective time`` uses."""
        return self.unit in ("millisecond", "second", "microsecond")

    def score(self, c: CostVector) -> float:
        w = self.weights
        f = c.fused
        if not w.fused:
            f = type(f)()
        # a hoisted group pays one full rotation, its other offsets the hoisted price
        extra_hoisted = (c.hoisted_rotations - f.hoisted_rotations) - (c.hoisted_groups - f.hoisted_groups)
        rotations = c.rotations - f.rot - f.hoisted_rotations
        base = (
            w.rotation * (rotations - extra_hoisted)
            + w.hoisted_rotation * extra_hoisted
            + w.pmul * (c.pmul - f.pmul)
            + w.cmul * (c.cmul - f.cmul)
            + _or(w.cmul_tensor, w.cmul) * f.cmul + _or(w.relin, 0.0) * f.sums
            + w.add * (c.add - f.add)
            + w.rescale * (c.rescale - f.rescale + f.block_rescales)
            + w.poly * c.poly
            + w.depth * c.depth
            + (w.bootstrap_weight() * c.bootstraps if c.bootstraps else 0.0)
        )
        if f.blocks or f.q_blocks:
            assert w.block is not None and w.block_baby is not None
            assert w.block_giant is not None and w.block_product is not None
            base += (w.block * f.blocks + w.block_baby * f.babies + w.block_giant * f.giants
                     + w.block_product * f.products + (w.block_base or 0.0) * f.bases)
        if f.q_blocks:
            assert w.block is not None and w.block_product is not None
            base += (_or(w.block_product_q, w.block_product) * f.q_products
                     + _or(w.block_baby_q, w.block) * f.q_babies + _or(w.block_q, w.add) * f.q_blocks)
        return base

    def iscore(self, c: CostVector) -> int:
        return int(round(self.score(c) * OBJECTIVE_SCALE))

    def boot_iscore(self) -> int:
        """Objective units of bootstrapping one ciphertext."""
        return int(round(self.weights.bootstrap_weight() * OBJECTIVE_SCALE))


def _or(x: float | None, default: float) -> float:
    return default if x is None else x


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
