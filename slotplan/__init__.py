"""slotplan's Python API: plan a model, then run it privately (docs/python.md).

    import slotplan

    plan = slotplan.plan("model.onnx", params="n13")          # or a graph dict / graph file
    client = slotplan.Client(plan, "keys/")
    eval_keys = client.keygen()                                # once; the secret key stays in keys/
    ct = client.encrypt({"x": images})                         # leading sample dimension allowed
    out = slotplan.Server(plan, eval_keys, plan.weights).evaluate(ct)   # no secret key here
    logits = client.decrypt(out)["logits"]

A thin facade over ``planner`` (planning), ``backends`` (simulator and Lattigo) and
``api``; every error it raises for bad input is a :class:`SlotplanError` (one line naming
the field and the rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from backends.inference import InferenceError
from common.errors import GraphError, ModelError, ParamsError, PlanFileError, SlotplanError, ValuesError
from slotplan._inference import Ciphertext, Client, EvalKeys, Server
from slotplan._plan import Plan, plan
from slotplan._remote import RemoteError, RemoteServer
from slotplan._version import __version__


def run(plan: Plan, inputs: Mapping[str, Any] | None = None, weights: Mapping[str, Any] | None = None, *,
        backend: str = "sim", seed: int = 0) -> dict[str, np.ndarray]:
    """Run a plan in one process (``sim``: the numpy slot simulator; ``lattigo``: encrypted)
    and return its outputs, checked against the graph's numpy reference: :meth:`Plan.simulate`."""
    return plan.simulate(inputs, weights, seed=seed, backend=backend)


__all__ = [
    "Ciphertext",
    "Client",
    "EvalKeys",
    "GraphError",
    "InferenceError",
    "ModelError",
    "ParamsError",
    "Plan",
    "PlanFileError",
    "RemoteError",
    "RemoteServer",
    "SlotplanError",
    "Server",
    "ValuesError",
    "__version__",
    "plan",
    "run",
]
