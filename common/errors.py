"""Error types of slotplan.

Every error that bad user input can cause is a :class:`SlotplanError`; the CLI and the
REST layer turn it into one clear line (exit status 2 / HTTP 422) instead of a traceback.
The message always names *where* (node / tensor / field) and *which rule* was broken, e.g.::

    node 'y': field 'inputs': conv2d expects 2 inputs, got 3
"""

from __future__ import annotations


class SlotplanError(Exception):
    """Base class of all errors slotplan reports to users."""

    def __setstate__(self, state: dict[str, object] | None) -> None:
        if state:
            self.__dict__.update(state)
        self.args = (str(self),)


def _location(node: str | None, tensor: str | None, field: str | None) -> list[str]:
    parts: list[str] = []
    if node is not None:
        parts.append(f"node {node!r}")
    if tensor is not None:
        parts.append(f"tensor {tensor!r}")
    if field is not None:
        parts.append(f"field {field!r}")
    return parts


class GraphError(SlotplanError):
    """An invalid graph file.

    Attributes:
        node: id of the offending node (``None`` when the error is not about one node).
        field: the JSON field at fault (``"inputs"``, ``"stride"``, ``"shape[0]"``, ``"outputs"``...).
        rule: the rule that was broken, in words.
        tensor: name of the offending declared tensor, when the error is about one.
    """

    def __init__(
        self,
        rule: str,
        *,
        node: str | None = None,
        field: str | None = None,
        tensor: str | None = None,
    ) -> None:
        self.node = node
        self.field = field
        self.rule = rule
        self.tensor = tensor
        super().__init__(str(self))

    def __str__(self) -> str:
        return ": ".join([*_location(self.node, self.tensor, self.field), self.rule])

    def __reduce__(self) -> tuple[type[GraphError], tuple[str], dict[str, str | None]]:
        # keep node/field/tensor when pickled (e.g. across a process pool)
        return (type(self), (self.rule,), {"node": self.node, "field": self.field, "tensor": self.tensor})

    def to_json(self) -> dict[str, str | None]:
        """Machine-readable form (used by the REST layer's 422 body)."""
        return {
            "error": "graph",
            "node": self.node,
            "tensor": self.tensor,
            "field": self.field,
            "rule": self.rule,
            "message": str(self),
        }


class ParamsError(SlotplanError):
    """Invalid CKKS parameters (or an unknown preset name).

    Attributes:
        field: the parameter at fault (``"log_n"``, ``"log_q[2]"``, ``"level"``...), or ``None``.
        rule: the rule that was broken, in words.
    """

    def __init__(self, rule: str, *, field: str | None = None) -> None:
        self.field = field
        self.rule = rule
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.field is None:
            return f"params: {self.rule}"
        return f"params: field {self.field!r}: {self.rule}"

    def __reduce__(self) -> tuple[type[ParamsError], tuple[str], dict[str, str | None]]:
        return (type(self), (self.rule,), {"field": self.field})

    def to_json(self) -> dict[str, str | None]:
        return {"error": "params", "field": self.field, "rule": self.rule, "message": str(self)}


class ValuesError(SlotplanError, ValueError):
    """Tensor values handed to the numpy reference do not fit the graph (missing / wrong shape)."""

    def __init__(self, rule: str, *, tensor: str | None = None) -> None:
        self.tensor = tensor
        self.rule = rule
        super().__init__(str(self))

    def __reduce__(self) -> tuple[type[ValuesError], tuple[str], dict[str, str | None]]:
        return (type(self), (self.rule,), {"tensor": self.tensor})

    def __str__(self) -> str:
        if self.tensor is None:
            return self.rule
        return f"tensor {self.tensor!r}: {self.rule}"


class PlanFileError(SlotplanError):
    """An invalid plan or tables file (the message names the field and the rule)."""


class ModelError(SlotplanError):
    """An ONNX model that cannot be imported (``slotplan import``): unreadable or malformed,
    an unsupported op or attribute, a shape that cannot be resolved, bad calibration data.

    Attributes:
        node: the ONNX node at fault (its name, or its op and first output when unnamed).
        op: its op type.
        rule: what is wrong, in words.
        hint: what to do instead, or ``None``.
    """

    def __init__(self, rule: str, *, node: str | None = None, op: str | None = None, hint: str | None = None):
        self.node = node
        self.op = op
        self.rule = rule
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.node is not None:
            where = f"onnx node {self.node!r}" + (f" ({self.op})" if self.op else "") + ": "
        return where + self.rule + (f"; hint: {self.hint}" if self.hint else "")

    def __reduce__(self) -> tuple[type[ModelError], tuple[str], dict[str, str | None]]:
        return (type(self), (self.rule,), {"node": self.node, "op": self.op, "hint": self.hint})
