"""What a planning request asks for: the options of ``slotplan plan`` (literal, as the CLI
and REST receive them, and validated), and how an unset objective is resolved."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.assign.candidates import (
    CINS_KERNELS,
    COMPLEX_KERNELS,
    ELEMENTWISE_KERNELS,
    KERNELS,
    PlanError,
)
from planner.cost.tables import COST_TABLES, load_costs
from planner.frontend.params import Params
from solver import SOLVER_BACKENDS

# The CinS families offered by default at bootstrapping presets: cins-hs (one rotation per
# slice diagonal) has the layouts of cins-bsgs and never fewer rotations, so it only adds
# options to price and prune; name it in `kernels` to have it.
DEFAULT_CINS_KERNELS = ("cins-bsgs", "cins-dw")

# Default solver time limit: the models of single kernels and small graphs prove optimal
# in milliseconds; 10 s bounds a large graph without making a CLI user wait long.
DEFAULT_TIME_LIMIT_S = 10.0
# the longest solver limit a request may ask for (an hour)
MAX_TIME_LIMIT_S = 3600.0


if TYPE_CHECKING:
    SolverName = str
else:  # the registered solver back ends, as an enum of the JSON schema (REST, OpenAPI)
    SolverName = Literal[SOLVER_BACKENDS.names()]


class PlanOptionsLiteral(BaseModel):
    """Unchecked JSON/CLI form of the planning options."""

    model_config = ConfigDict(extra="forbid")
    solver: SolverName = "cpsat"
    time_limit_s: float = Field(default=DEFAULT_TIME_LIMIT_S, gt=0, le=MAX_TIME_LIMIT_S)
    memory_cap_bytes: int | None = Field(default=None, gt=0)
    kernels: list[str] | None = None
    input_layout: Literal["free", "row-major"] = "free"
    input_layouts: dict[str, str] | None = None
    costs: str = "default"
    # what the solver minimises: "time" (modelled seconds of the calibrated table
    # data/costs/<preset>-lattigo.json) or "rotations" (the default table, rotations first);
    # unset: time where the preset has a calibrated table, else rotations. An explicit
    # non-default --costs table wins.
    objective: Literal["time", "rotations"] | None = None
    # graph outputs hold zeros outside their tensor (a mask where the kernel leaves
    # partial sums): what the client decrypts is the output and nothing of the weights
    clean_outputs: bool = True
    allow_insecure: bool = Field(default=False, description="accept parameters above the 128-bit bound")
    # NeuJeans CinS conv layers (docs/cins.md) join the default kernels at bootstrapping
    # presets; false keeps the slot kernels only (a `kernels` list is taken as given)
    cins: bool = True
    # strided CinS convs also in NeuJeans' decomposed form (Alg. 2: polyphase input, a
    # quarter of the bootstraps at stride 2); false: only the densify-first form
    cins_decompose: bool = True
    # "complex": the complex-packing extension of the plan format (docs/formats.md): the
    # hybrid matvec also in its complex form (two inputs per slot, half the diagonals);
    # "real" plans keep SPEC section 4 exactly (real registers)
    packing: Literal["real", "complex"] = "real"
    # samples per ciphertext set (SPEC section 8, planner/batch.py); unset: one sample, the
    # plan keeps SPEC section 4's shapes (and its bytes)
    batch: int | None = Field(default=None, ge=1)
    # issue 36: bootstrap variants (sparse, halves, pairs) as options of the choice model
    # where the params offer them and the cost table prices them; false: the full-slot
    # bootstrap only
    boot_variants: bool = True
    # the variants' slot counts (log2) the choice model may use; unset: every one the
    # params offer. A capped plan whose variants' keys and DFT matrices do not fit sets it
    # itself, dropping variants until they do (planner/single.py), and records it here
    boot_variant_slots: list[int] | None = None


@dataclass(frozen=True)
class PlanOptions:
    solver: str = "cpsat"
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    memory_cap_bytes: int | None = None
    kernels: tuple[str, ...] = KERNELS
    input_layout: str = "free"
    input_layouts: tuple[tuple[str, str], ...] = ()
    costs: str = "default"
    clean_outputs: bool = True
    allow_insecure: bool = False
    objective: str | None = None
    cins: bool = True
    cins_decompose: bool = True
    packing: str = "real"
    batch: int | None = None
    # strided outputs whose gaps cost ciphertexts may also be packed densely
    # (planner/assign/densify.py; never in the plan's options): offered to every plan, one
    # sample or a batch; false only to compare against the gapped plans
    densify: bool = True
    # batched plans (planner/batch.py): the dense route also where it gains room for copies
    densify_room: bool = False
    boot_variants: bool = True
    boot_variant_slots: tuple[int, ...] | None = None

    @staticmethod
    def from_literal(lit: PlanOptionsLiteral) -> PlanOptions:
        kernels = tuple(lit.kernels) if lit.kernels else KERNELS
        known = KERNELS + CINS_KERNELS + COMPLEX_KERNELS
        unknown = [k for k in kernels if k not in known]
        if unknown:
            raise PlanError(
                f"unknown kernel(s) {', '.join(unknown)}; known kernels: {', '.join(known)}"
            )
        if not any(k in kernels for k in ELEMENTWISE_KERNELS):
            kernels = kernels + ELEMENTWISE_KERNELS
        return PlanOptions(
            solver=lit.solver, time_limit_s=lit.time_limit_s, memory_cap_bytes=lit.memory_cap_bytes,
            kernels=kernels, input_layout=lit.input_layout,
            input_layouts=tuple(sorted((lit.input_layouts or {}).items())), costs=lit.costs,
            clean_outputs=lit.clean_outputs,
            allow_insecure=lit.allow_insecure, objective=lit.objective,
            cins=lit.cins,
            cins_decompose=lit.cins_decompose,
            packing=lit.packing,
            batch=lit.batch,
            boot_variants=lit.boot_variants,
            boot_variant_slots=None if lit.boot_variant_slots is None else tuple(sorted(set(lit.boot_variant_slots))),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "solver": self.solver,
            "time_limit_s": self.time_limit_s,
            "memory_cap_bytes": self.memory_cap_bytes,
            "kernels": list(self.kernels),
            "input_layout": self.input_layout,
            "input_layouts": dict(self.input_layouts) or None,
            "costs": self.costs,
            "clean_outputs": self.clean_outputs,
        }
        if self.allow_insecure:  # only when given: existing plans stay byte-identical
            out["allow_insecure"] = True
        if self.objective is not None:
            out["objective"] = self.objective
        if not self.cins:
            out["cins"] = False
        if not self.cins_decompose:
            out["cins_decompose"] = False
        if self.packing != "real":  # only when complex: real plans stay byte-identical
            out["packing"] = self.packing
        if self.batch is not None:  # only when given: plans of one sample stay byte-identical
            out["batch"] = self.batch
        if not self.boot_variants:  # only when off: other plans stay byte-identical
            out["boot_variants"] = False
        if self.boot_variant_slots is not None:  # only when restricted (the same)
            out["boot_variant_slots"] = list(self.boot_variant_slots)
        return out

    def with_packing(self) -> PlanOptions:
        """Checked packing: "complex" adds the complex kernel families next to "hybrid"
        (unless some are named) and refuses a memory cap (the key schedules do not place
        the conjugation key)."""
        if self.packing not in ("real", "complex"):
            raise PlanError(f"options.packing must be 'real' or 'complex', got {self.packing!r}")
        named = [k for k in self.kernels if k in COMPLEX_KERNELS]
        if self.packing == "real":
            if named:
                raise PlanError(f"kernel(s) {', '.join(named)} need options.packing 'complex' (--packing complex)")
            return self
        if self.memory_cap_bytes is not None:
            raise PlanError("packing 'complex' cannot be combined with a memory cap: the key schedules do not "
                            "place the conjugation key (plan without a cap, or with packing 'real')")
        if "hybrid" in self.kernels and not named:
            return replace(self, kernels=self.kernels + COMPLEX_KERNELS)
        return self

    def cins_kernels(self, params: Params) -> tuple[str, ...]:
        """The CinS families offered: those ``kernels`` names, else (the default kernel
        list) ``DEFAULT_CINS_KERNELS`` at a bootstrapping preset unless ``cins`` is off."""
        named = tuple(k for k in self.kernels if k in CINS_KERNELS)
        if named:
            if params.boot is None:
                raise PlanError(
                    f"the CinS kernels ({', '.join(named)}) bootstrap every layer: they need a bootstrapping "
                    f"preset (n14boot, n16boot), not {params.name}"
                )
            return named
        if self.cins and params.boot is not None and self.kernels == KERNELS:
            return DEFAULT_CINS_KERNELS
        return ()


def resolve_objective(options: PlanOptions, params: Params) -> PlanOptions:
    """The options with the objective made explicit: ``costs`` the table the solver uses,
    ``objective`` "time" (a calibrated table, modelled milliseconds) or "rotations"."""
    if options.costs != "default":
        return replace(options, objective="time" if load_costs(options.costs).is_time else "rotations")
    if options.objective == "rotations":
        return options
    name = f"{params.name}-lattigo"
    if name in COST_TABLES and load_costs(name).is_time:
        return replace(options, costs=name, objective="time")
    if options.objective == "time":
        raise PlanError(
            f"--objective time needs a calibrated cost table for params {params.name!r} "
            f"(data/costs/{name}.json): run `slotplan calibrate --params {params.name}`, "
            "or plan with --objective rotations"
        )
    return replace(options, objective="rotations")
