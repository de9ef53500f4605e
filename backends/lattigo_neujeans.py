"""NeuJeans CinS layers encrypted on Lattigo (Go ``NeujeansLayers``,
``backends/lattigo/neujeans_api.go``): the bootstrapping driver in NeuJeans' order with the
convolution folded into SlotsToCoeffs (docs/cins.md, "What the Lattigo executor holds").

A layer runs on one ciphertext of a bootstrapping preset (``n14boot``): optionally
``to_cins`` (S_(l<-1) on the Re/Im pair), the CinS convolution (BSGS over the slices; fused
with S_(N/2<-l) or followed by it), then ScaleDown, ModUp, CoeffsToSlots and EvalMod; the
result is the decrypted Re/Im pair of the output cins(l) value (``planner.layout.cins.bootstrap_cins``
order).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from backends.lattigo_backend import LattigoError, _call, _ext
from planner.frontend.params import Params

__all__ = ["NeujeansLayer", "NeujeansResult", "run_neujeans_layers"]


@dataclass
class NeujeansLayer:
    """One layer.  ``pair`` (with ``to_cins_levels > 0``): the Re/Im registers of the input
    cins(l) value (two length-``slots`` vectors); ``cins_slots`` (with ``to_cins_levels = 0``):
    the complex CinS slots the client encrypts (``planner.layout.cins.cins_slot_vector``).
    ``kernel``: ``C = slots / l`` kernel diagonals as cins(l) values (shape ``(C, N)``), or
    None (no convolution: the bootstrap of a cins register alone)."""

    l: int  # noqa: E741
    pair: tuple[np.ndarray, np.ndarray] | None = None
    cins_slots: np.ndarray | None = None
    kernel: np.ndarray | None = None
    fused: bool = False
    to_cins_levels: int = 0
    stoc_levels: int = 1
    log_bsgs_ratio: int = 1
    boot_log_gain: int | None = None
    """None: the Go default (``DefaultBootLogGain``, 6)."""


@dataclass
class NeujeansResult:
    pairs: list[tuple[np.ndarray, np.ndarray]]
    """Per layer, the decrypted (re, im) registers of the result."""
    stats: list[dict[str, Any]]
    keys: dict[str, Any]
    raw: dict[str, Any] = field(repr=False)


def _f64(b64: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype="<f8").astype(np.float64)


def run_neujeans_layers(params: Params, layers: Sequence[NeujeansLayer], key_dir: str | None = None) -> NeujeansResult:
    if params.boot is None:
        raise LattigoError(f"params {params.name!r}: NeuJeans layers need a bootstrapping preset (e.g. n14boot)")
    S = params.slots
    specs: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for i, ly in enumerate(layers):
        if ly.to_cins_levels > 0:
            if ly.pair is None:
                raise LattigoError(f"layers[{i}]: to_cins_levels > 0 needs the Re/Im pair")
            vec = np.concatenate([np.asarray(ly.pair[0], dtype=float), np.asarray(ly.pair[1], dtype=float)])
        else:
            if ly.cins_slots is None:
                raise LattigoError(f"layers[{i}]: to_cins_levels = 0 needs the CinS slots")
            z = np.asarray(ly.cins_slots, dtype=complex)
            vec = np.concatenate([z.real, z.imag])
        if vec.shape != (2 * S,):
            raise LattigoError(f"layers[{i}]: input of {vec.size} values, want {2 * S}")
        chunks.append(np.ascontiguousarray(vec, dtype="<f8").tobytes())
        C = 0
        if ly.kernel is not None:
            k = np.asarray(ly.kernel, dtype="<f8")
            C = k.shape[0]
            if k.shape != (S // ly.l, 2 * S):
                raise LattigoError(f"layers[{i}]: kernel of shape {k.shape}, want ({S // ly.l}, {2 * S})")
            chunks.append(np.ascontiguousarray(k).tobytes())
        spec: dict[str, Any] = {
            "l": ly.l, "fused": ly.fused, "to_cins_levels": ly.to_cins_levels, "stoc_levels": ly.stoc_levels,
            "log_bsgs_ratio": ly.log_bsgs_ratio, "channels": C,
        }
        if ly.boot_log_gain is not None:
            spec["boot_log_gain"] = ly.boot_log_gain
        specs.append(spec)
    mod, go = _ext()
    opts = {"key_dir": key_dir} if key_dir else {}
    raw = json.loads(_call(
        mod.NeujeansLayers, json.dumps(params.to_json()), json.dumps(specs),
        go.Slice_byte.from_bytes(b"".join(chunks)), json.dumps(opts),
    ))
    pairs = [(_f64(r["re"]), _f64(r["im"])) for r in raw["layers"]]
    return NeujeansResult(pairs=pairs, stats=[r["stats"] for r in raw["layers"]], keys=raw["keys"], raw=raw)
