"""Why a plan is what it is: the runner-up of every node choice, and every layout's slot map.

Everything here is derived from a :class:`~planner.pipeline.PlanProblem` and the solver's
:class:`~solver.model.Solution` (what the solver saw), either right after planning
(``slotplan plan --explain``) or by re-planning the graph a plan embeds
(:func:`replan`: candidate generation and the solve are deterministic, and the result is
checked against the plan's nodes before anything is shown).

Runner-up of a node: the best alternative option of its group with every other choice
fixed (a free client input read only by this node follows it, as the model allows),
preferring a different kernel over different parameters of the same kernel.  Its cost is
the node's kernel plus the conversions on its incoming and outgoing edges, so "rotations"
compares like with like; the objective difference is the solver's own number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from common.errors import SlotplanError
from planner.cost.tables import OBJECTIVE_SCALE
from planner.cost.timing import TimeModel
from planner.kernels.base import Candidate, CostVector
from planner.kernels.convert import plan_conversion
from planner.lower.boot_report import variant_report
from planner.pipeline import PlanOptions, PlanOptionsLiteral, PlanProblem, build_problem, solve_problem
from solver.model import Solution, Status

EXPLAIN_SCHEMA = "slotplan.explain/1"
# the per-option fields shown and compared (CostVector names)
FIELDS = ("rotations", "pmul", "cmul", "add", "depth")


class ExplainError(SlotplanError):
    pass


# --------------------------------------------------------------------------------------
# re-planning a plan's embedded graph
# --------------------------------------------------------------------------------------


def replan(plan: Mapping[str, Any]) -> tuple[PlanProblem, Solution]:
    """The problem and solution behind ``plan``, by planning its embedded graph again with
    its recorded params and options; refused when the result differs from the plan."""
    from planner.frontend.graph import parse_graph
    from planner.frontend.params import Params

    spec = plan.get("graph", {}).get("spec")
    opts = plan.get("options")
    if spec is None or opts is None:
        raise ExplainError("the plan embeds no graph or options (an older plan file); plan the graph again "
                           "with `slotplan plan --explain`")
    graph = parse_graph(spec)
    if plan["graph"].get("sha256") not in (None, graph.sha256):
        raise ExplainError("the plan's embedded graph does not match its sha256")
    params = Params.from_json(plan["params"])
    options = PlanOptions.from_literal(PlanOptionsLiteral(**opts))
    problem = build_problem(graph, params, options)
    sol = solve_problem(problem)
    if sol.status not in (Status.OPTIMAL, Status.FEASIBLE):
        raise ExplainError(f"re-planning {graph.name} found no plan ({sol.status.value})")
    check_reproduces(plan, problem, sol)
    return problem, sol


def check_reproduces(plan: Mapping[str, Any], problem: PlanProblem, sol: Solution) -> None:
    choice = dict(sol.choice)
    by_id = {n["id"]: n for n in plan["nodes"]}
    for node in problem.graph.nodes:
        n = by_id.get(node.id)
        c = problem.candidates[node.id][choice[node.id]]
        ins = [c.in_layouts[t].notation() if t in c.in_layouts else "plaintext" for t in node.inputs]
        if n is None or (n["kernel"], n["out_layout"], list(n["in_layouts"])) != (c.kernel, c.out_layout.notation(), ins):
            raise ExplainError(
                f"re-planning did not reproduce node {node.id!r} of the plan (the solver stopped at its time "
                "limit, or the plan comes from another slotplan version); plan again with --explain"
            )


# --------------------------------------------------------------------------------------
# layouts
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayoutInfo:
    name: str  # tensor name, node id, or conv/<node>/<operand>
    kind: str  # "input" | "node output" | "conversion (<kind>)"
    tensor: str  # the tensor whose elements the slots hold
    shape: tuple[int, ...]
    layout: Any  # ChannelLayout | RotomLayout | MappedLayout: .index_map(q), .n_ct, .clean, .notation()


def plan_layouts(problem: PlanProblem, sol: Solution) -> dict[str, LayoutInfo]:
    """Every ciphertext layout of the plan, in program order: encrypted inputs as packed,
    node outputs, and conversion results (named ``conv/<node>/<operand>`` as the
    lowering names them)."""
    graph = problem.graph
    choice = dict(sol.choice)
    out: dict[str, LayoutInfo] = {}
    layout_of: dict[str, Any] = {}
    for t, opts in problem.input_options.items():
        lay = opts[choice[f"input:{t}"]]
        layout_of[t] = lay
        out[t] = LayoutInfo(t, "input", t, tuple(graph.shape(t)), lay)
    for node in graph.nodes:
        cand = problem.candidates[node.id][choice[node.id]]
        for t in dict.fromkeys(node.inputs):
            if not graph.encrypted(t):
                continue
            conv = plan_conversion(layout_of[t], cand.in_layouts[t])
            if conv.kind != "none":
                name = f"conv/{node.id}/{t}"
                out[name] = LayoutInfo(name, f"conversion ({conv.kind})", t, tuple(graph.shape(t)),
                                       cand.in_layouts[t])
        layout_of[node.id] = cand.out_layout
        out[node.id] = LayoutInfo(node.id, "node output", node.id, tuple(graph.shape(node.id)), cand.out_layout)
    return out


# --------------------------------------------------------------------------------------
# runner-up per node
# --------------------------------------------------------------------------------------


def _src_layout(problem: PlanProblem, ch: Mapping[str, int], src: str) -> Any:
    if src.startswith("input:"):
        t = src[len("input:"):]
        return problem.input_options[t][ch[src]]
    return problem.candidates[src][ch[src]].out_layout


def _local_cost(problem: PlanProblem, ch: Mapping[str, int], node_id: str, cand: Candidate) -> dict[str, Any]:
    """Kernel cost of ``cand`` for the node plus the conversions on its edges when every
    other group takes its option in ``ch``; ``objective`` in solver units (no memory-cap
    penalty), ``None`` when a conversion does not exist."""
    S = problem.params.slots
    vecs: list[CostVector] = [cand.cost(S, problem.costs.weights.fused)]
    conv_depth = 0
    possible = True
    for e in problem.model.edges:
        try:
            if e.dst == node_id:
                cv = plan_conversion(_src_layout(problem, ch, e.src), cand.in_layouts[e.operand]).cost()
                conv_depth = max(conv_depth, cv.depth)
                vecs.append(cv)
            elif e.src == node_id:
                dst = problem.candidates[e.dst][ch[e.dst]].in_layouts[e.operand]
                vecs.append(plan_conversion(cand.out_layout, dst).cost())
        except (ValueError, KeyError):  # no conversion between these layouts (an infeasible pair)
            possible = False
    keys: set[int] = set()
    for v in vecs:
        keys |= set(v.rot_keys)
    res: dict[str, Any] = {f: sum(getattr(v, f) for v in vecs) for f in FIELDS if f != "depth"}
    res["depth"] = cand.cost(S).depth + conv_depth
    res["rotation_keys"] = len(keys)
    res["key_bytes"] = len(keys) * problem.params.rotation_key_bytes()
    tm = TimeModel(problem.costs)
    res["objective"] = sum(tm.units(v) for v in vecs) if possible else None
    return res


def _option_json(problem: PlanProblem, ch: Mapping[str, int], node_id: str, cand: Candidate) -> dict[str, Any]:
    params = {k: v for k, v in cand.params.items() if isinstance(v, int | float | str | bool)}
    cost = _local_cost(problem, ch, node_id, cand)
    cost.pop("objective")
    return {"kernel": cand.kernel, "label": cand.label, "params": params,
            "out_layout": cand.out_layout.notation(), "cost": cost}


def _fmt_delta(v: int) -> str:
    return f"{v:+d}"


def _reason(problem: PlanProblem, chosen: dict[str, Any], ru: dict[str, Any]) -> str:
    w = problem.costs.weights
    weight = {"rotations": w.rotation, "pmul": w.pmul, "cmul": w.cmul, "add": w.add, "depth": w.depth}
    if not ru["feasible"]:
        why = ru["infeasible"]
        return f"runner-up {ru['label']} is not possible here: {why}"
    a, b = chosen["cost"], ru["cost"]
    diffs = {f: b[f] - a[f] for f in FIELDS}
    parts = [f"{_fmt_delta(d)} {f}" for f, d in diffs.items() if d]
    dk = b["rotation_keys"] - a["rotation_keys"]
    if dk:
        parts.append(f"{_fmt_delta(dk)} keys ({(b['key_bytes'] - a['key_bytes']) / 2**20:+,.0f} MiB)")
    weighted = {f: d * weight[f] for f, d in diffs.items()}
    penalty = ru["objective_delta"] - sum(weighted.values())
    if problem.options.memory_cap_bytes is not None and abs(penalty) > 1e-9:
        weighted["memory (key loads under the cap)"] = penalty
    main = max(weighted, key=lambda f: (weighted[f], f)) if weighted else None
    delta = ru["objective_delta"]
    if delta == 0:
        verdict = "ties on the objective (kept by the deterministic tie-break)"
    elif main is not None and weighted[main] > 0:
        verdict = f"lost on {main}"
    else:
        verdict = "lost"
    what = ", ".join(parts) if parts else "same operation counts"
    pruned = " (pruned before the solve: dominated)" if ru.get("dominated") else ""
    label = ru["label"] if ru["label"] != chosen["label"] else f"{ru['label']} -> {ru['out_layout']}"
    return (f"runner-up {label}{pruned} would cost {what}: objective {delta:+,.3f} "
            f"{problem.costs.unit}s; {verdict}")


def explain_choices(problem: PlanProblem, sol: Solution) -> dict[str, Any]:
    """Per node: the chosen option, the runner-up with its cost, and a one-line reason.

    The runner-up is, in this order of preference: the best option of another kernel the
    solver could pick; the best option of another kernel pruned before the solve as
    dominated (never better, whatever the other choices); the best other option of the
    same kernel (kept, then pruned)."""
    model = problem.model
    choice = dict(sol.choice)
    base = model.evaluate(choice)
    relaxed = replace(model, max_depth=None)
    incoming = model.incoming()
    nodes: list[dict[str, Any]] = []
    for node in problem.graph.nodes:
        cands = problem.candidates[node.id]
        o0 = choice[node.id]
        mine = cands[o0]
        chosen = _option_json(problem, choice, node.id, mine)
        mine_obj = _local_cost(problem, choice, node.id, mine)["objective"]
        trials: list[tuple[tuple[Any, ...], Candidate, dict[str, int], int | None, bool]] = []
        for o, c in enumerate(cands):
            if o == o0:
                continue
            ch = dict(choice)
            ch[node.id] = o
            for e in incoming.get(node.id, []):
                if e.adapts:  # a free input read only here is packed as this option reads it
                    opts = [(x, a) for a, row in enumerate(e.costs) if (x := row[o]) is not None]
                    if opts:
                        ch[e.src] = min(opts)[1]
            tot = model.evaluate(ch)
            delta = None if tot is None or base is None else tot - base
            trials.append(((c.kernel == mine.kernel, 0, tot is None, delta or 0, c.label), c, ch, delta, False))
        kept = {id(c) for c in cands}
        for c in problem.all_candidates.get(node.id, []):
            if id(c) in kept:
                continue
            obj = _local_cost(problem, choice, node.id, c)["objective"]
            delta = None if obj is None or mine_obj is None else obj - mine_obj
            trials.append(((c.kernel == mine.kernel, 1, delta is None, delta or 0, c.label), c, choice, delta, True))
        n_alt = len(trials)
        entry: dict[str, Any] = {"id": node.id, "chosen": chosen, "alternatives": n_alt, "runner_up": None}
        if not trials:
            entry["reason"] = f"{mine.label}: the only candidate for this node (no other kernel or layout applies)"
            nodes.append(entry)
            continue
        _, c, ch, delta, dominated = min(trials, key=lambda t: t[0])
        ru = _option_json(problem, ch, node.id, c)
        ru["dominated"] = dominated
        ru["feasible"] = delta is not None
        ru["objective_delta"] = None if delta is None else round(delta / OBJECTIVE_SCALE, 6)
        if delta is None:
            if not dominated and relaxed.evaluate(ch) is not None:
                ru["infeasible"] = (f"the plan would need more than the {model.max_depth} levels of "
                                    f"{problem.params.name} (depth)")
            else:
                ru["infeasible"] = "no conversion joins its layouts to those its neighbours chose"
        entry["runner_up"] = ru
        entry["reason"] = _reason(problem, chosen, ru)
        nodes.append(entry)
    boots = variant_report(problem, sol)
    return {
        "schema": EXPLAIN_SCHEMA,
        "costs": problem.costs.name,
        "unit": problem.costs.unit,
        "objective": None if base is None else round(base / OBJECTIVE_SCALE, 6),
        "nodes": nodes,
        # issue 36: each bootstrap's variant against the full-slot bootstrap (when offered)
        **({"bootstraps": boots["per_bootstrap"], "variants_offered": boots["variants_offered"]} if boots else {}),
    }


def boot_variant_lines(bootstrapping: Mapping[str, Any]) -> list[str]:
    """Per bootstrap of a plan's ``summary.bootstrapping`` (when variants were offered):
    node, variant, ciphertexts, instructions, modelled seconds and the saving against the
    full-slot bootstrap of the same ciphertexts; then the plan's total."""
    rows = bootstrapping.get("per_bootstrap")
    if not rows:
        return []
    lines = [f"bootstrap variants (offered: {', '.join(bootstrapping.get('variants_offered', [])) or 'none'}):"]
    for r in rows:
        what = r["variant"] if r["variant"] == "full" else f"{r['variant']} ({r['kind']}, 2^{r['log_slots']} slots)"
        lines.append(f"  {r['node']}: {what}, {r['ciphertexts']} ciphertext(s) in {r['instructions']} instruction(s), "
                     f"{r['seconds']:.3f} s modelled, saving {r['saving_seconds']:.3f} s against full-slot "
                     f"({r['full_seconds']:.3f} s)")
    lines.append(f"  total {bootstrapping['seconds']:.3f} s modelled against {bootstrapping['full_slot_seconds']:.3f} s "
                 f"full-slot: saving {bootstrapping['variant_saving_seconds']:.3f} s")
    return lines
