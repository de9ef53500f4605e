"""The plan document (``slotplan.plan/1``, shared/SPEC.md section 4): its schema name and
the one validator every plan from outside goes through before anything executes it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common.errors import PlanFileError
from planner.ir.instructions import Bootstrap, Instr, Output, Poly, _is_int

PLAN_SCHEMA = "slotplan.plan/1"
# Instructions a plan may hold (the largest golden plan has ~60k).
MAX_PROGRAM_LENGTH = 2_000_000

_SECTIONS: tuple[tuple[str, type], ...] = (
    ("graph", dict), ("params", dict), ("summary", dict), ("nodes", list), ("plaintexts", dict), ("program", list),
)


def _bad(where: str, field: str, rule: str) -> PlanFileError:
    return PlanFileError(f"{where}: field {field!r}: {rule}")


@dataclass(frozen=True)
class Plan:
    """A checked plan: the document as read and its program as typed instructions."""

    doc: dict[str, Any]
    program: tuple[Instr, ...]

    @classmethod
    def from_json(cls, doc: object, where: str = "plan") -> Plan:
        """Check a decoded plan document (SPEC section 4).  Raises :class:`PlanFileError`
        naming the field and the rule."""
        if not isinstance(doc, dict):
            raise PlanFileError(f"{where}: a plan must be a JSON object, got {type(doc).__name__}")
        if doc.get("schema") != PLAN_SCHEMA:
            raise _bad(where, "schema", f"must be {PLAN_SCHEMA!r}")
        for key, typ in _SECTIONS:
            if key not in doc:
                raise _bad(where, key, "is missing")
            if not isinstance(doc[key], typ):
                raise _bad(where, key, f"must be a JSON {'object' if typ is dict else 'array'}")
        slots = _check_header(doc, where)
        return cls(doc, tuple(_check_program(doc, where, slots)))


def _check_header(plan: Mapping[str, Any], where: str) -> int:
    """Params, graph, outputs and plaintexts; returns the slot count."""
    from common.errors import ParamsError
    from planner.frontend.params import Params

    try:
        params = Params.from_json(plan["params"])
    except ParamsError as e:
        raise _bad(where, f"params.{e.field}" if e.field else "params", e.rule) from None
    graph = plan["graph"]
    if not isinstance(graph.get("sha256"), str):
        raise _bad(where, "graph.sha256", "must be a string")
    if "spec" in graph and not isinstance(graph["spec"], dict):
        raise _bad(where, "graph.spec", "must be a graph object")
    if "outputs" in plan:
        outs = plan["outputs"]
        if not isinstance(outs, dict) or not all(
            isinstance(v, list) and v and all(_is_int(d) and d > 0 for d in v) for v in outs.values()
        ):
            raise _bad(where, "outputs", "must map tensor names to shapes (lists of positive integers)")
    for name, pt in plan["plaintexts"].items():
        if not isinstance(pt, dict) or not isinstance(pt.get("source"), str) or not isinstance(pt.get("table"), str):
            raise _bad(where, f"plaintexts.{name}", "must be {\"source\": string, \"table\": string}")
        if "l" in pt:
            lv = pt["l"]
            if not _is_int(lv) or lv < 1 or lv & (lv - 1) or params.slots % lv:
                raise _bad(where, f"plaintexts.{name}.l", "a cins plaintext's l is a power of two dividing the slots")
        if "imag_table" in pt:  # a complex plaintext (complex packing, docs/formats.md)
            if not isinstance(pt["imag_table"], str):
                raise _bad(where, f"plaintexts.{name}.imag_table", "must be a table name (string)")
            if "l" in pt:
                raise _bad(where, f"plaintexts.{name}.imag_table", "a cins plaintext (with 'l') cannot be complex")
    return params.slots


def _check_program(plan: Mapping[str, Any], where: str, slots: int) -> list[Instr]:
    """Every instruction well formed, offsets in range, plaintexts known, SSA, and at least
    one output."""
    prog = plan["program"]
    if not prog:
        raise _bad(where, "program", "is empty: a plan has at least one input and one output")
    if len(prog) > MAX_PROGRAM_LENGTH:
        raise _bad(where, "program", f"has {len(prog)} instructions, over the limit of {MAX_PROGRAM_LENGTH}")
    written: set[str] = set()
    writer: dict[str, Instr] = {}
    out: list[Instr] = []
    for i, raw in enumerate(prog):
        at = f"program[{i}]"
        ins = Instr.from_json(raw, where=where, path=at, slots=slots)
        for pt in ins.plaintexts():
            if pt not in plan["plaintexts"]:
                raise _bad(where, f"{at}.pt", f"unknown plaintext {pt!r}")
        if isinstance(ins, Bootstrap) and ins.premasked:
            w = writer.get(ins.src)
            if w is not None and not (isinstance(w, Poly) and w.mask is not None
                                      and "imag_table" in plan["plaintexts"][w.mask]):
                raise _bad(where, f"{at}.premasked", f"register {ins.src!r} must be written by a poly with a "
                                                     f"complex mask (the halves packing), not by {w.op}")
        for key in ins.read_fields:
            reg = getattr(ins, key)
            if reg is None and key not in ins.string_fields:
                continue  # an optional operand left out
            if reg not in written:
                raise _bad(where, f"{at}.{key}", f"register {reg!r} is read before it is written")
        for key, reg in ins.write_fields():
            if reg in written:
                raise _bad(where, f"{at}.{key}", f"register {reg!r} is written twice (the program is SSA)")
            written.add(reg)
            writer[reg] = ins
        out.append(ins)
    if not any(isinstance(ins, Output) for ins in out):
        raise _bad(where, "program", "has no output instruction")
    return out


def validate_plan(plan: object, where: str = "plan") -> dict[str, Any]:
    """Check a decoded plan document before anything executes it (SPEC section 4).  Raises
    :class:`PlanFileError` naming the field and the rule; returns the plan."""
    return Plan.from_json(plan, where).doc
