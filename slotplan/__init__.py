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

from planner.errors import GraphError, ModelError, ParamsError, PlanFileError, SlotplanError, ValuesError
from slotplan._plan import Plan, plan
from slotplan._version import __version__

__all__ = [
    "GraphError",
    "ModelError",
    "ParamsError",
    "Plan",
    "PlanFileError",
    "SlotplanError",
    "ValuesError",
    "__version__",
    "plan",
]
