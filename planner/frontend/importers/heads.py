"""Where an imported model ends: cutting it at a value (``--output NAME``), stripping
classifier heads (skl2onnx's ``ArgMax`` / ``ZipMap`` / ``ai.onnx.ml`` label ops), and
finding outputs that are probabilities (a ``Softmax`` at the end).

An encrypted model should end at its scores: the arg max of the decrypted scores is the
client's business (a max is not a polynomial), and a final softmax costs a reciprocal of
the row sum (a polynomial over a range that spans orders of magnitude) without changing
which class wins.  docs/import.md describes the rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.errors import ModelError
from planner.frontend.importers.onnx_model import node_label

__all__ = ["HEAD_OPS", "Probability", "cut_model", "probability_outputs", "strip_heads"]

# Standard ops that only a classifier head uses on scores (class indices, not values).
HEAD_OPS = frozenset({"ArgMax", "ArgMin"})
# Ops that pass a value through unchanged (looking for a Softmax behind an output).
PASS_THROUGH = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast", "Dropout"})
# Ops that normalise a row into probabilities.
NORMALISERS = frozenset({"Softmax", "LogSoftmax"})


def _is_head(node: Any) -> bool:
    return node.domain not in ("", "ai.onnx") or node.op_type in HEAD_OPS


def _producers(model: Any) -> dict[str, Any]:
    return {o: n for n in model.graph.node for o in n.output if o}


def _value_names(model: Any) -> list[str]:
    g = model.graph
    return [*(i.name for i in g.input), *(o for n in g.node for o in n.output if o)]


def cut_model(model: Any, outputs: Sequence[str]) -> Any:
    """``model`` ending at the values ``outputs`` (the nodes they need, the graph inputs
    and initializers those use), as ``onnx.utils.extract_model`` with the model's inputs
    kept; an unknown value is refused naming some known ones."""
    import onnx
    from onnx import helper

    g = model.graph
    known = _value_names(model)
    inits = {i.name for i in g.initializer}
    for name in outputs:
        if name not in known or name in inits:
            near = [k for k in known if name.lower() in k.lower()][:5] or known[-8:]
            raise ModelError(f"--output {name!r}: the model has no value of that name (values: "
                             f"{', '.join(near)}{', ...' if len(known) > len(near) else ''})")
    need = set(outputs)
    keep: list[Any] = []
    for node in reversed(list(g.node)):
        if any(o in need for o in node.output):
            keep.append(node)
            need.update(i for i in node.input if i)
            for a in node.attribute:  # subgraphs (If/Loop) read outer values
                if a.type == onnx.AttributeProto.GRAPH:
                    need.update(x for n in a.g.node for x in n.input)
    keep.reverse()
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
        infos = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input)}
    except Exception:  # shape inference is a nicety here (the importer infers its own shapes)
        infos = {}
    outs = []
    for name in outputs:
        if name in infos:
            outs.append(infos[name])
        else:  # a value shape inference does not reach (after a custom op): float, shape unknown
            outs.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    graph = helper.make_graph(
        keep, g.name, [i for i in g.input if i.name in need or i.name in outputs],
        outs, [i for i in g.initializer if i.name in need],
        value_info=[v for v in g.value_info if v.name in need],
    )
    cut = helper.make_model(graph, opset_imports=list(model.opset_import), producer_name=model.producer_name)
    cut.ir_version = model.ir_version
    if not cut.graph.input:
        raise ModelError(f"--output {', '.join(outputs)}: does not depend on the model's inputs (a constant)")
    return cut


def _float_output(model: Any, name: str) -> bool:
    import onnx

    for o in model.graph.output:
        if o.name == name:
            tt = o.type.tensor_type
            return o.type.HasField("tensor_type") and tt.elem_type in (
                onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)
    return False


def _behind(prod: dict[str, Any], name: str, ops: frozenset[str]) -> Any:
    """The node of ``ops`` that computes ``name`` through pass-through ops, or None."""
    seen = 0
    while name in prod and seen < 64:
        n = prod[name]
        if n.op_type in ops:
            return n
        if n.op_type not in PASS_THROUGH or not n.input:
            return None
        name = n.input[0]
        seen += 1
    return None


def strip_heads(model: Any) -> tuple[Any, list[str]]:
    """Drop a classifier head: every output whose computation meets a head op (ArgMax,
    ArgMin, any op outside the standard domain: ZipMap, ArrayFeatureExtractor,
    LabelEncoder...) or is not a float tensor (labels) is removed, and the float values
    the head ops read become outputs instead; a Softmax/LogSoftmax right before them is
    dropped too (its arg max is its input's), so the model ends at the scores (logits).
    Returns the model (unchanged when there is no head) and one note per change."""
    g = model.graph
    prod = _producers(model)

    def cone(name: str) -> list[Any]:
        out, todo, seen = [], [name], set()
        while todo:
            v = todo.pop()
            n = prod.get(v)
            if n is None or id(n) in seen:
                continue
            seen.add(id(n))
            out.append(n)
            todo.extend(i for i in n.input if i)
        return out

    heads: dict[int, Any] = {}
    label_outputs: list[str] = []
    for o in g.output:
        c = cone(o.name)
        hs = [n for n in c if _is_head(n)]
        if hs or not _float_output(model, o.name):
            label_outputs.append(o.name)
            heads.update((id(n), n) for n in hs)
    if not heads:
        if label_outputs and len(label_outputs) < len(g.output):  # e.g. a label computed without a head op
            keep = [o.name for o in g.output if o.name not in label_outputs]
            return cut_model(model, keep), [f"dropped output(s) {', '.join(label_outputs)}: not float tensors"]
        return model, []
    head_ids = set(heads)
    # the float values the head reads that no head op computes: the scores
    scores: list[str] = []
    for n in heads.values():
        for i in n.input:
            p = prod.get(i)
            if i and p is not None and id(p) not in head_ids and i not in scores:
                scores.append(i)
    keep = [o.name for o in g.output if o.name not in label_outputs]
    if not keep and not scores:  # nothing computed to end at (a head on an input): the importer refuses it
        return model, []
    notes = []
    stripped = sorted({f"{n.op_type}" + (f" ({n.domain})" if n.domain not in ("", "ai.onnx") else "")
                       for n in heads.values()})
    notes.append(f"stripped the classifier head ({', '.join(stripped)}) and its output(s) "
                 f"{', '.join(repr(x) for x in label_outputs)}: take the arg max of the decrypted scores on the client")
    ends = list(dict.fromkeys([*keep, *scores]))
    logits: list[str] = []
    for name in ends:
        sm = _behind(prod, name, NORMALISERS)
        if sm is not None:
            logits.append(sm.input[0])
            notes.append(f"dropped {sm.op_type} {node_label(sm)!r} before the head: output {name!r} becomes its input "
                         f"{sm.input[0]!r} (the logits; the arg max is unchanged)")
        else:
            logits.append(name)
    logits = list(dict.fromkeys(logits))
    return cut_model(model, logits), notes


@dataclass(frozen=True)
class Probability:
    output: str
    node: str  # the Softmax (or LogSoftmax) node's label
    op: str
    logits: str  # the value to cut at instead


def _through(prod: dict[str, Any], name: str) -> str:
    """``name`` followed back through pass-through ops to the value they pass on."""
    for _ in range(64):
        n = prod.get(name)
        if n is None or n.op_type not in PASS_THROUGH or not n.input:
            return name
        name = n.input[0]
    return name


def probability_outputs(model: Any) -> list[Probability]:
    """Model outputs that are probabilities: computed by a Softmax/LogSoftmax, or by a row
    normalisation ``Div(e, ReduceSum(e))`` (through pass-through ops only)."""
    prod = _producers(model)
    found = []
    for o in model.graph.output:
        sm = _behind(prod, o.name, NORMALISERS)
        if sm is not None:
            found.append(Probability(o.name, node_label(sm), sm.op_type, sm.input[0]))
            continue
        div = _behind(prod, o.name, frozenset({"Div"}))
        if div is None or len(div.input) != 2:
            continue
        total = prod.get(_through(prod, div.input[1]))
        if total is not None and total.op_type == "ReduceSum" and total.input and \
                _through(prod, total.input[0]) == _through(prod, div.input[0]):
            e = prod.get(_through(prod, div.input[0]))
            # exp(z) / sum(exp(z)): the logits are z; else the normalised values themselves
            logits = e.input[0] if e is not None and e.op_type == "Exp" and e.input else div.input[0]
            found.append(Probability(o.name, node_label(div), "Div by its ReduceSum", logits))
    return found
