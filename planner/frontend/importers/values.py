"""The values an importer passes between its converters and the composite activations:
a :class:`Dyn` (a value computed on encrypted data, as a graph tensor) and an
:class:`ApproxRow` (one fitted function, a row of the calibration table)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def graph_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """The graph shape of an ONNX shape: the leading batch dimension of 1 dropped (rank >= 2)."""
    s = tuple(int(d) for d in shape)
    if len(s) >= 2 and s[0] == 1:
        return s[1:]
    return s or (1,)


@dataclass(frozen=True)
class ApproxRow:
    """One approximated function (a row of the calibration table)."""

    node: str  # graph node id of the poly
    onnx_node: str
    function: str
    measured: tuple[float, float] | None  # calibrated range of the input (None: default)
    domain: tuple[float, float]
    degree: int
    depth: int
    max_error: float  # on the samples (or the domain when uncalibrated)
    on_samples: bool
    newton: int = 0
    scale: float = 0.0  # the largest |function value| where max_error was measured

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node, "onnx_node": self.onnx_node, "function": self.function,
            "measured": list(self.measured) if self.measured else None, "domain": list(self.domain),
            "degree": self.degree, "depth": self.depth, "newton": self.newton,
            "max_error": self.max_error, "on_samples": self.on_samples, "output_scale": self.scale,
        }


@dataclass
class Dyn:
    """A value computed on encrypted data: its graph tensor, its ONNX shape, and the graph
    tensor's shape when it is not ``graph_shape(shape)`` (a value kept with its batch axis;
    :meth:`Importer.convert` views every ONNX value back to its graph shape)."""

    name: str
    shape: tuple[int, ...]
    g: tuple[int, ...] | None = None

    @property
    def gshape(self) -> tuple[int, ...]:
        return self.g if self.g is not None else graph_shape(self.shape)
