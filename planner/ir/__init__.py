"""Typed plan IR: the instructions of shared/SPEC.md section 4 (:mod:`planner.ir.instructions`)
and the plan document's schema and validator (:mod:`planner.ir.plan`).

Plans are stored and written as JSON dicts; code that needs to know what an instruction
does decodes it here (:func:`decode`) instead of looking at its ``"op"``."""

from planner.ir.instructions import (
    BOOTSTRAP_OPS,
    MAX_POLY_COEFF_ABS,
    MAX_POLY_MASK_VALUES,
    OPS,
    Add,
    Bootstrap,
    Bootstrap2,
    BootstrapCins,
    CMul,
    Conj,
    DropKey,
    FusedCins,
    Input,
    Instr,
    KeyOp,
    LoadKey,
    MulI,
    Output,
    PAdd,
    PMul,
    Poly,
    PSub,
    Rescale,
    Rot,
    RotHoisted,
    Sub,
    ToCins,
    UnknownOpError,
    decode,
    decode_program,
    executed_rotations,
    fused_cins,
    fused_rotation_delta,
    galois_key_count,
    has_key_schedule,
    instruction,
    is_bootstrap,
    op_name,
    rot_keys_of,
    to_json_program,
    try_decode,
    uses_conjugation,
)
from planner.ir.plan import MAX_PROGRAM_LENGTH, PLAN_SCHEMA, Plan, validate_plan

__all__ = [
    "BOOTSTRAP_OPS", "MAX_POLY_COEFF_ABS", "MAX_POLY_MASK_VALUES", "MAX_PROGRAM_LENGTH", "OPS", "PLAN_SCHEMA", "Add", "Bootstrap", "Bootstrap2", "BootstrapCins",
    "CMul", "Conj", "DropKey", "FusedCins", "executed_rotations", "fused_cins", "fused_rotation_delta", "Input", "Instr", "KeyOp", "LoadKey", "MulI", "Output", "PAdd", "PMul", "PSub", "Plan", "Poly", "Rescale", "Rot",
    "RotHoisted", "Sub", "ToCins", "UnknownOpError", "decode", "decode_program", "galois_key_count", "has_key_schedule", "instruction",
    "is_bootstrap", "op_name", "rot_keys_of", "to_json_program", "try_decode", "uses_conjugation", "validate_plan",
]
