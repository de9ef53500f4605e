"""Plan-diff reports: what changed between two plans, two batch results or goldens.

Everything is compared through a *digest*: the part of a plan that describes its quality
and its choices, without timings (plans, batch result lines and golden files all reduce
to the same shape)::

    {"schema": "slotplan.digest/1", "graph": {"name", "sha256"}, "params": "n16",
     "options": {...}, "status": "ok" | "error" | "timeout" | "crash", "error": null,
     "summary": {... summary without solver.seconds / plan_seconds ...},
     "nodes": [{"id", "op", "kernel", "params", "rotations", "in_layouts"?, "out_layout"?}]}

:func:`diff_digests` returns a typed :class:`DiffReport` (pydantic); :func:`render_markdown`
turns it into a CI comment.  A report *regresses* when, for some graph, rotations, key
loads or the modelled peak memory grow, or a graph that planned in the base fails in head.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from common.errors import SlotplanError
from planner.ir import PLAN_SCHEMA

DIGEST_SCHEMA = "slotplan.digest/1"
DIFF_SCHEMA = "slotplan.diff/1"

# Metrics compared for every graph (dotted paths into the summary), in report order.
METRICS: tuple[str, ...] = (
    "rotations",
    "rotation_keys",
    "key_loads",
    "pmul",
    "cmul",
    "add",
    "rescale",
    "poly",
    "depth",
    "plaintexts",
    "instructions",
    "peak_bytes.keys",
    "peak_bytes.plaintexts",
    "peak_bytes.ciphertexts",
    "peak_bytes.total",
    "solver.objective",
)
# Plans of several samples (SPEC section 8): compared when either side has them.
BATCH_METRICS: tuple[str, ...] = ("batch", "per_sample.seconds", "per_sample.rotations")
# Growth of any of these is a regression (``--fail-on-regression``).
REGRESSION_METRICS: tuple[str, ...] = ("rotations", "key_loads", "peak_bytes.total")
# Node fields compared (besides rotations, which is a metric).
NODE_FIELDS: tuple[str, ...] = ("op", "kernel", "in_layouts", "out_layout")

Number = int | float


class DiffInputError(SlotplanError):
    """A file given to ``slotplan diff`` is neither a plan, a digest nor batch results."""


# --------------------------------------------------------------------------------------
# Digests
# --------------------------------------------------------------------------------------


def strip_timings(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The summary without wall-clock fields (``plan_seconds``, ``solver.seconds``)."""
    out = {k: v for k, v in summary.items() if k != "plan_seconds"}
    solver = out.get("solver")
    if isinstance(solver, Mapping):
        out["solver"] = {k: v for k, v in solver.items() if k != "seconds"}
    return json.loads(json.dumps(out))  # deep copy, JSON types only


def node_digest(node: Mapping[str, Any], layouts: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": node.get("id"),
        "op": node.get("op"),
        "kernel": node.get("kernel"),
        "params": dict(node.get("params") or {}),
        "rotations": node.get("rotations"),
    }
    if "boot_variant" in node:  # issue 36: the variant of the node's bootstrap (plans that offered variants)
        out["boot_variant"] = node["boot_variant"]
    if layouts:
        if "in_layouts" in node:
            out["in_layouts"] = list(node["in_layouts"])
        if "out_layout" in node:
            out["out_layout"] = node["out_layout"]
    return out


def plan_digest(plan: Mapping[str, Any], layouts: bool = True) -> dict[str, Any]:
    """Digest of a plan document (``PLAN_SCHEMA``)."""
    params = plan.get("params") or {}
    graph = plan.get("graph") or {}
    return {
        "schema": DIGEST_SCHEMA,
        "graph": {"name": graph.get("name"), "sha256": graph.get("sha256")},
        "params": params.get("name") if isinstance(params, Mapping) else params,
        "options": dict(plan.get("options") or {}),
        "status": "ok",
        "error": None,
        "summary": strip_timings(plan.get("summary") or {}),
        "nodes": [node_digest(n, layouts) for n in plan.get("nodes") or []],
    }


def _as_digest(obj: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Digest of a plan, a digest or a batch results line (validated enough to diff)."""
    if obj.get("schema") == PLAN_SCHEMA:
        for key, kind in (("graph", Mapping), ("params", Mapping), ("summary", Mapping), ("nodes", list)):
            if not isinstance(obj.get(key), kind):
                raise DiffInputError(f"{where}: a plan needs {key!r} ({'list' if kind is list else 'object'})")
        if not all(isinstance(n, Mapping) for n in obj["nodes"]):
            raise DiffInputError(f"{where}: plan nodes must be objects")
        return plan_digest(obj)
    graph = obj.get("graph")
    if not isinstance(graph, Mapping) or "status" not in obj:
        raise DiffInputError(f"{where}: not a plan, a digest or a batch results line (needs graph and status)")
    status = obj.get("status")
    summary = obj.get("summary")
    if status == "ok" and not isinstance(summary, Mapping):
        raise DiffInputError(f"{where}: status ok but no summary")
    return {
        "schema": DIGEST_SCHEMA,
        "graph": {"name": graph.get("name"), "sha256": graph.get("sha256")},
        "params": obj.get("params"),
        "options": dict(obj.get("options") or {}),
        "status": str(status),
        "error": obj.get("error"),
        "summary": strip_timings(summary) if isinstance(summary, Mapping) else None,
        "nodes": [node_digest(n) for n in obj.get("nodes") or [] if isinstance(n, Mapping)],
    }


def load_digests(path: str | Path) -> tuple[Literal["plan", "batch"], list[dict[str, Any]]]:
    """Read a plan file, a digest (golden) file or a batch results file (JSON lines)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DiffInputError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise DiffInputError(f"{p}: is a directory, expected a plan or a batch results file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DiffInputError(f"{p}: cannot read ({e})") from None
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    except RecursionError:
        raise DiffInputError(f"{p}: JSON nested too deeply") from None
    if isinstance(whole, dict):
        return "plan", [_as_digest(whole, str(p))]
    if whole is not None and not isinstance(whole, dict):
        raise DiffInputError(f"{p}: expected a JSON object (plan) or JSON lines (batch results)")
    digests: list[dict[str, Any]] = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            raise DiffInputError(f"{p}:{i}: not JSON (expected a plan or one JSON object per line)") from None
        if not isinstance(obj, dict):
            raise DiffInputError(f"{p}:{i}: expected a JSON object")
        digests.append(_as_digest(obj, f"{p}:{i}"))
    if not digests:
        raise DiffInputError(f"{p}: empty (no plan and no batch results)")
    return "batch", digests


# --------------------------------------------------------------------------------------
# Report model
# --------------------------------------------------------------------------------------


class Metric(BaseModel):
    """One number in base and head; ``ratio`` is head / base (None when base is 0 or absent)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    base: Number | None
    head: Number | None
    delta: Number | None
    ratio: float | None
    regression: bool = False


class FieldChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    field: str
    base: Any = None
    head: Any = None


class NodeDiff(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    change: Literal["added", "removed", "changed"]
    fields: list[FieldChange] = Field(default_factory=list)
    params: list[FieldChange] = Field(default_factory=list)
    rotations: Metric | None = None


class EntryDiff(BaseModel):
    """The diff of one graph (at one parameter set)."""

    model_config = ConfigDict(extra="forbid")
    key: str
    graph: str
    params: str | None
    base_status: str
    head_status: str
    base_error: str | None = None
    head_error: str | None = None
    graph_changed: bool = False
    fields: list[FieldChange] = Field(default_factory=list)
    metrics: list[Metric] = Field(default_factory=list)
    nodes: list[NodeDiff] = Field(default_factory=list)
    regressions: list[str] = Field(default_factory=list)
    changed: bool = False

    def metric(self, name: str) -> Metric | None:
        return next((m for m in self.metrics if m.name == name), None)


class DiffReport(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    schema_: Literal["slotplan.diff/1"] = Field(default="slotplan.diff/1", alias="schema")
    kind: Literal["plan", "batch"]
    base: str
    head: str
    entries: list[EntryDiff]
    added: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    regressions: list[str] = Field(default_factory=list)
    regressed: bool = False
    changed: bool = False

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


# --------------------------------------------------------------------------------------
# Diffing
# --------------------------------------------------------------------------------------


def _get(summary: Mapping[str, Any] | None, dotted: str) -> Number | None:
    cur: Any = summary
    for part in dotted.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    if isinstance(cur, bool) or not isinstance(cur, int | float):
        return None
    return cur


def _metric(name: str, base: Number | None, head: Number | None) -> Metric:
    delta: Number | None = None
    ratio: float | None = None
    if base is not None and head is not None:
        delta = head - base
        ratio = round(head / base, 6) if base != 0 else None
    regression = name in REGRESSION_METRICS and delta is not None and delta > 0
    return Metric(name=name, base=base, head=head, delta=delta, ratio=ratio, regression=regression)


def _fmt_value(v: Any) -> str:
    return json.dumps(v, sort_keys=True) if not isinstance(v, str) else v


def _diff_nodes(base: Sequence[Mapping[str, Any]], head: Sequence[Mapping[str, Any]]) -> list[NodeDiff]:
    b = {str(n.get("id")): n for n in base}
    h = {str(n.get("id")): n for n in head}
    out: list[NodeDiff] = []
    order = list(dict.fromkeys([*b, *h]))
    for nid in order:
        bn, hn = b.get(nid), h.get(nid)
        if bn is None:
            assert hn is not None
            out.append(
                NodeDiff(
                    id=nid,
                    change="added",
                    fields=[FieldChange(field="kernel", base=None, head=hn.get("kernel"))],
                    rotations=_metric("rotations", None, hn.get("rotations")),
                )
            )
            continue
        if hn is None:
            out.append(
                NodeDiff(
                    id=nid,
                    change="removed",
                    fields=[FieldChange(field="kernel", base=bn.get("kernel"), head=None)],
                    rotations=_metric("rotations", bn.get("rotations"), None),
                )
            )
            continue
        fields = [
            FieldChange(field=f, base=bn.get(f), head=hn.get(f))
            for f in NODE_FIELDS
            if f in bn and f in hn and bn.get(f) != hn.get(f)
        ]
        if bn.get("boot_variant") != hn.get("boot_variant"):  # e.g. "full" -> "s12"; absent: no variant offered
            fields.append(FieldChange(field="boot_variant", base=bn.get("boot_variant"), head=hn.get("boot_variant")))
        bp, hp = bn.get("params") or {}, hn.get("params") or {}
        params = [
            FieldChange(field=k, base=bp.get(k), head=hp.get(k))
            for k in dict.fromkeys([*bp, *hp])
            if bp.get(k) != hp.get(k)
        ]
        rot = _metric("rotations", bn.get("rotations"), hn.get("rotations"))
        if fields or params or rot.delta:
            out.append(NodeDiff(id=nid, change="changed", fields=fields, params=params, rotations=rot))
    return out


def diff_entry(key: str, base: Mapping[str, Any] | None, head: Mapping[str, Any] | None) -> EntryDiff:
    """Diff of one graph's digests (either may be missing: added / removed graphs)."""
    ref = head if head is not None else base
    assert ref is not None
    name = str((ref.get("graph") or {}).get("name"))
    params = ref.get("params")
    bs = "missing" if base is None else str(base.get("status"))
    hs = "missing" if head is None else str(head.get("status"))
    e = EntryDiff(
        key=key,
        graph=name,
        params=None if params is None else str(params),
        base_status=bs,
        head_status=hs,
        base_error=None if base is None else base.get("error"),
        head_error=None if head is None else head.get("error"),
    )
    if base is not None and head is not None:
        e.graph_changed = (base.get("graph") or {}).get("sha256") != (head.get("graph") or {}).get("sha256")
        if base.get("params") != head.get("params"):
            e.fields.append(FieldChange(field="params", base=base.get("params"), head=head.get("params")))
        bo, ho = base.get("options") or {}, head.get("options") or {}
        for k in dict.fromkeys([*bo, *ho]):
            if bo.get(k) != ho.get(k):
                e.fields.append(FieldChange(field=f"options.{k}", base=bo.get(k), head=ho.get(k)))
        bsum, hsum = base.get("summary"), head.get("summary")
        for f in ("solver.status", "solver.name", "memory_cap_bytes", "clean_outputs", "insecure"):
            bv, hv = _lookup(bsum, f), _lookup(hsum, f)
            if bv != hv and (bsum is not None and hsum is not None):
                e.fields.append(FieldChange(field=f, base=bv, head=hv))
        if bsum is not None and hsum is not None:
            # privacy and security are part of correctness: outputs that start leaking partial
            # sums of the weights, or parameters below 128 bits, are regressions
            if _lookup(bsum, "clean_outputs") is True and _lookup(hsum, "clean_outputs") is False:
                e.regressions.append(f"{key}: outputs no longer clean (output ciphertexts may hold partial "
                                     "sums of the weights)")
            if not _lookup(bsum, "insecure") and _lookup(hsum, "insecure"):
                e.regressions.append(f"{key}: parameters below the 128-bit bound (insecure)")
        if bsum is not None or hsum is not None:
            batched = any(isinstance(x, Mapping) and "per_sample" in x for x in (bsum, hsum))
            e.metrics = [_metric(m, _get(bsum, m), _get(hsum, m))
                         for m in (METRICS + BATCH_METRICS if batched else METRICS)]
        e.nodes = _diff_nodes(base.get("nodes") or [], head.get("nodes") or [])
    if bs == "ok" and hs not in ("ok", "missing"):
        e.regressions.append(f"{key}: planned in base, {hs} in head ({e.head_error or 'no message'})")
    for m in e.metrics:
        if m.regression:
            e.regressions.append(f"{key}: {m.name} {_num(m.name, m.base)} -> {_num(m.name, m.head)} "
                                 f"({_delta_txt(m)}{_ratio_txt(m.ratio)})")
    e.changed = bool(
        bs != hs
        or e.graph_changed
        or e.fields
        or e.nodes
        or any(m.delta for m in e.metrics)
        or (base is not None and head is not None and base.get("error") != head.get("error"))
    )
    return e


def _lookup(summary: Mapping[str, Any] | None, dotted: str) -> Any:
    cur: Any = summary
    for part in dotted.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def _entry_key(d: Mapping[str, Any]) -> str:
    name = str((d.get("graph") or {}).get("name"))
    params = d.get("params")
    return f"{name}@{params}" if params is not None else name


def diff_digests(
    base: Sequence[Mapping[str, Any]],
    head: Sequence[Mapping[str, Any]],
    kind: Literal["plan", "batch"] = "batch",
    base_label: str = "base",
    head_label: str = "head",
) -> DiffReport:
    """Diff two lists of digests, matched by graph name and params (the last record wins
    when a results file holds several for one key, as a resumed batch can)."""
    if kind == "plan" and len(base) == 1 and len(head) == 1:
        b, h = base[0], head[0]
        bk, hk = _entry_key(b), _entry_key(h)
        key = bk if bk == hk else f"{bk} -> {hk}"
        entries = [diff_entry(key, b, h)]
        added: list[str] = []
        removed: list[str] = []
    else:
        bm = {_entry_key(d): d for d in base}
        hm = {_entry_key(d): d for d in head}
        keys = sorted(set(bm) | set(hm))
        entries = [diff_entry(k, bm.get(k), hm.get(k)) for k in keys]
        added = [k for k in keys if k not in bm]
        removed = [k for k in keys if k not in hm]
    regressions = [r for e in entries for r in e.regressions]
    return DiffReport(
        kind=kind,
        base=base_label,
        head=head_label,
        entries=entries,
        added=added,
        removed=removed,
        regressions=regressions,
        regressed=bool(regressions),
        changed=any(e.changed for e in entries),
    )


def diff_plans(
    base: Mapping[str, Any], head: Mapping[str, Any], base_label: str = "base", head_label: str = "head"
) -> DiffReport:
    """Diff two plans (or two digests / batch records)."""
    return diff_digests(
        [_as_digest(base, base_label)], [_as_digest(head, head_label)], "plan", base_label, head_label
    )


def diff_files(base: str | Path, head: str | Path) -> DiffReport:
    bk, bd = load_digests(base)
    hk, hd = load_digests(head)
    kind: Literal["plan", "batch"] = "plan" if bk == hk == "plan" else "batch"
    return diff_digests(bd, hd, kind, str(base), str(head))


# --------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------

_BYTES_METRICS = {"peak_bytes.keys", "peak_bytes.plaintexts", "peak_bytes.ciphertexts", "peak_bytes.total"}


def _signed(v: Number | None) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:+.3g}"
    return f"{int(v):+d}"


def _ratio_txt(r: float | None) -> str:
    return f", x{r:.3f}" if r is not None else ""


def _num(name: str, v: Number | None) -> str:
    if v is None:
        return "-"
    if name in _BYTES_METRICS:
        return f"{v / 2**20:.1f} MiB"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.4g}"
    return str(int(v))


def _delta_txt(m: Metric) -> str:
    if m.name in _BYTES_METRICS and m.delta is not None:
        return f"{m.delta / 2**20:+.1f} MiB"
    return _signed(m.delta)


def _cell(m: Metric | None) -> str:
    if m is None:
        return "-"
    if m.delta in (None, 0):
        return _num(m.name, m.head if m.head is not None else m.base)
    flag = " :warning:" if m.regression else ""
    return f"{_num(m.name, m.base)} → {_num(m.name, m.head)} ({_delta_txt(m)}{_ratio_txt(m.ratio)}){flag}"


def _md_escape(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(report: DiffReport, details: bool = True) -> str:
    """A Markdown report for a CI comment: headline, one row per graph, details of changes."""
    lines: list[str] = []
    if report.regressed:
        head = f"## slotplan plan diff: :x: {len(report.regressions)} regression(s)"
    elif report.changed:
        head = "## slotplan plan diff: changed, no regression"
    else:
        head = "## slotplan plan diff: no changes"
    lines += [head, "", f"base `{report.base}` → head `{report.head}`", ""]
    if report.regressions:
        lines += ["**Regressions**", ""]
        lines += [f"- {_md_escape(r)}" for r in report.regressions]
        lines.append("")
    lines += [
        "| graph | status | rotations | rotation keys | key loads | peak memory | solver |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in report.entries:
        status = e.head_status if e.base_status == e.head_status else f"{e.base_status} → {e.head_status}"
        solver = next((f for f in e.fields if f.field == "solver.status"), None)
        solver_txt = f"{solver.base} → {solver.head}" if solver else ""
        lines.append(
            f"| {_md_escape(e.key)} | {status} | {_cell(e.metric('rotations'))} | "
            f"{_cell(e.metric('rotation_keys'))} | {_cell(e.metric('key_loads'))} | "
            f"{_cell(e.metric('peak_bytes.total'))} | {_md_escape(solver_txt)} |"
        )
    if report.added:
        lines += ["", "Added: " + ", ".join(f"`{k}`" for k in report.added)]
    if report.removed:
        lines += ["", "Removed: " + ", ".join(f"`{k}`" for k in report.removed)]
    if details:
        for e in report.entries:
            if not e.changed or e.base_status == "missing" or e.head_status == "missing":
                continue
            lines += ["", f"### {_md_escape(e.key)}", ""]
            if e.graph_changed:
                lines.append("- the graph itself changed (different sha256)")
            if e.base_error != e.head_error:
                lines.append(f"- error: `{_md_escape(e.base_error)}` → `{_md_escape(e.head_error)}`")
            for f in e.fields:
                lines.append(f"- {f.field}: `{_md_escape(_fmt_value(f.base))}` → `{_md_escape(_fmt_value(f.head))}`")
            changed_metrics = [m for m in e.metrics if m.delta]
            if changed_metrics:
                lines += ["", "| metric | base | head | delta | ratio |", "|---|---|---|---|---|"]
                for m in changed_metrics:
                    flag = " :warning:" if m.regression else ""
                    delta = _delta_txt(m)
                    ratio = f"{m.ratio:.3f}" if m.ratio is not None else "-"
                    lines.append(
                        f"| {m.name}{flag} | {_num(m.name, m.base)} | {_num(m.name, m.head)} | {delta} | {ratio} |"
                    )
            if e.nodes:
                lines += ["", "| node | change | kernel | params | rotations | other |", "|---|---|---|---|---|---|"]
                for n in e.nodes:
                    kern = next((f for f in n.fields if f.field == "kernel"), None)
                    ktxt = f"{kern.base} → {kern.head}" if kern else ""
                    ptxt = ", ".join(f"{p.field}: {_fmt_value(p.base)} → {_fmt_value(p.head)}" for p in n.params)
                    other = "; ".join(
                        f"{f.field}: {_fmt_value(f.base)} → {_fmt_value(f.head)}" for f in n.fields if f.field != "kernel"
                    )
                    lines.append(
                        f"| {_md_escape(n.id)} | {n.change} | {_md_escape(ktxt)} | {_md_escape(ptxt)} | "
                        f"{_cell(n.rotations)} | {_md_escape(other)} |"
                    )
    return "\n".join(lines) + "\n"
