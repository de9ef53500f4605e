"""``slotplan show``: a plan at a glance (text, or a PNG drawn with matplotlib's Agg).

The PNG has three panels:

1. cost per node: rotations and plaintext multiplications (two bars per node);
2. key residency: for every rotation key (offset), when it is resident over the program
   steps (between ``load_key`` and ``drop_key``; a plan without a key schedule keeps all
   keys resident for the whole program), with a tick where a rotation uses it;
3. modelled memory over the program (keys + plaintexts + ciphertexts, stacked) against
   ``summary.memory_cap_bytes`` when a cap is set.

The memory series follows the same model as :func:`planner.ir.analysis.memory_profile`
(its maximum is ``summary.peak_bytes.total``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.errors import SlotplanError
from planner import ir
from planner.frontend.params import Params, insecure_line
from planner.ir.analysis import lifetimes, memory_series, plan_key_bytes

MiB = 2**20


@dataclass
class KeyTimeline:
    """Resident intervals and use steps of every rotation key of a program."""

    keys: list[int]
    intervals: dict[int, list[tuple[int, int]]]  # [start, end) program steps
    uses: dict[int, list[int]]
    scheduled: bool
    steps: int


def key_timeline(program: Sequence[Mapping[str, Any] | ir.Instr]) -> KeyTimeline:
    n = len(program)
    prog = ir.decode_program(program)
    uses: dict[int, list[int]] = {}
    for i, ins in enumerate(prog):
        for k in ins.rot_keys():
            uses.setdefault(k, []).append(i)
    scheduled = ir.has_key_schedule(prog)
    intervals: dict[int, list[tuple[int, int]]] = {}
    if scheduled:
        open_at: dict[int, int] = {}
        for i, ins in enumerate(prog):
            if isinstance(ins, ir.LoadKey) and ins.k is not None:
                open_at.setdefault(int(ins.k), i)
            elif isinstance(ins, ir.DropKey) and ins.k is not None:
                k = int(ins.k)
                if k in open_at:
                    intervals.setdefault(k, []).append((open_at.pop(k), i + 1))
        for k, start in open_at.items():
            intervals.setdefault(k, []).append((start, n))
    else:
        intervals = {k: [(0, n)] for k in uses}
    keys = sorted(set(uses) | set(intervals))
    return KeyTimeline(keys, intervals, uses, scheduled, n)


def memory_timeline(
    program: Sequence[Mapping[str, Any]], params: Params, key_bytes: Mapping[int, int] | None = None
) -> dict[str, np.ndarray]:
    """Modelled resident bytes at every program step: ``keys``, ``plaintexts``,
    ``ciphertexts`` -- the series behind the plan's peak (planner.ir.analysis.memory_series),
    with each key at its recorded size."""
    ser = memory_series(program, params, key_bytes=key_bytes)
    return {k: v.astype(np.float64) for k, v in ser.items()}


LEGEND = """\
Layout notation (the "out layout" column and the titles of the layout pictures):
  A;B          dimensions before ';' pick the ciphertext, those after it the slot within it
  [d:n:s]      a traversal dimension, outermost first: n indices along tensor dimension d.
               slotplan's channel layouts name d as c/h/w (channel, row, column of a (C,H,W)
               view) or a tensor axis, and s is the slot distance ([c:16:1024]: 16 channels
               1024 slots apart); Rotom layouts name d by axis and s is the tensor stride
               ([0:64:1]), slots then follow the dimensions in mixed radix
  ct[c/k:n]    n ciphertexts, k channels in each
  [R:n:p<m]    n replicated copies p slots apart (cut at slot m); [R:n] Rotom's repeat
  [G:n]        gap: n slots of which only the first holds data
  +b           the data starts at slot b
  roll(i,j)    dimension i's index is shifted by dimension j's (Rotom's rolls: diagonal layouts)
  name[shape]xNct  an arbitrary slot map (e.g. a reshape or transpose), N ciphertexts
  ~            dirty: slots that hold no element may hold garbage (left there by rotations and
               sums), not zeros; a consumer that needs zeros there pays a mask (one pmul per
               ciphertext, one level) -- the "conversions" of a node
  (no ~)       clean: every slot that holds no element is zero"""


def node_numbers(node: Mapping[str, Any]) -> dict[str, int]:
    """The numbers a plan's ``nodes`` entry reports for itself: a top-level field where the
    entry has one, else its ``cost`` object's (fields absent in both are left out)."""
    out: dict[str, int] = {}
    cost = node.get("cost", {}) or {}
    for f in NODE_FIELDS:
        v = node.get(f, cost.get(f))
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[f] = int(v)
    return out


NODE_FIELDS = ("rotations", "pmul", "cmul", "add", "rescale", "poly", "depth")


@dataclass
class PeakBreakdown:
    """What is resident at the program step where the modelled memory peaks."""

    step: int
    op: str
    total: int
    keys: list[tuple[str, int, int]]  # (level label, count, bytes each)
    ciphertexts: list[tuple[int, int, int]]  # (level, count, bytes each)
    plaintexts: list[tuple[int, int, int]]
    scheduled: bool

    def part(self, rows: Sequence[tuple[Any, int, int]]) -> int:
        return sum(n * b for _, n, b in rows)


def peak_breakdown(plan: Mapping[str, Any]) -> PeakBreakdown:
    """Keys, ciphertexts and plaintexts resident at the peak of :func:`memory_series`
    (grouped by level), walking the program with the same rules."""
    from planner.ir.analysis import register_depths

    program = ir.decode_program(plan["program"])
    params = Params.from_json(plan["params"])
    kbytes = plan_key_bytes(plan)
    klevel = {int(k): v.get("level") for k, v in (plan.get("keys") or {}).items()}
    ser = memory_series(program, params, key_bytes=kbytes)
    total = ser["keys"] + ser["plaintexts"] + ser["ciphertexts"]
    if not len(program):
        return PeakBreakdown(0, "-", 0, [], [], [], False)
    peak = int(np.argmax(total))
    depth = register_depths(program)
    L = params.max_level
    life = lifetimes(program, depth, L)
    last_use, pt_first, pt_last, pt_level = life.last_use, life.pt_first, life.pt_last, life.pt_level
    used_keys = ir.rot_keys_of(program)
    scheduled = ir.has_key_schedule(program)
    resident: set[int] = set() if scheduled else set(used_keys)
    live: set[str] = set()
    for i, ins in enumerate(program[: peak + 1]):
        if isinstance(ins, ir.LoadKey) and ins.k is not None:
            resident.add(int(ins.k))
        for r in ins.writes():
            live.add(r)
        if i == peak:
            break
        for r in set(ins.reads()) | set(ins.writes()):
            if last_use.get(r, -1) <= i:
                live.discard(r)
        if isinstance(ins, ir.DropKey) and ins.k is not None:
            resident.discard(int(ins.k))
    top = params.rotation_key_bytes()
    kgroups: dict[tuple[str, int], int] = {}
    for k in resident:
        b = kbytes.get(k, top) if kbytes else top
        lv = klevel.get(k)
        label = f"level {lv}" if lv is not None else f"level {L} (top)"
        kgroups[(label, b)] = kgroups.get((label, b), 0) + 1
    if ir.uses_conjugation(program):  # complex packing: resident throughout (docs/formats.md)
        b = max(kbytes.values(), default=top) if kbytes else top
        kgroups[("conjugation", b)] = 1
    cgroups: dict[int, int] = {}
    for r in live:
        lv = max(0, L - depth[r])
        cgroups[lv] = cgroups.get(lv, 0) + 1
    pgroups: dict[int, int] = {}
    for p, a in pt_first.items():
        if a <= peak <= pt_last[p]:
            pgroups[pt_level[p]] = pgroups.get(pt_level[p], 0) + 1
    return PeakBreakdown(
        peak, program[peak].op, int(total[peak]),
        sorted(((lab, n, b) for (lab, b), n in kgroups.items()), key=lambda t: (-t[2], t[0])),
        sorted(((lv, n, params.ciphertext_bytes(lv)) for lv, n in cgroups.items()), reverse=True),
        sorted(((lv, n, params.plaintext_bytes(lv)) for lv, n in pgroups.items()), reverse=True),
        scheduled,
    )


@dataclass
class TableGroup:
    tensor: str
    role: str  # "input" | "output" | "weight" | "constant"
    tables: int
    bytes: int


def table_sizes(plan: Mapping[str, Any], tables: Mapping[str, np.ndarray] | None = None) -> list[TableGroup]:
    """Bytes of the tables file by tensor: every table is an int64 index per slot, plus a
    float64 coefficient per slot where the table has one (known from ``tables``; without
    them only the indices are counted, as ``slotplan plan`` estimates)."""
    slots = int(plan["params"]["slots"])
    groups: dict[tuple[str, str], list[int]] = {}

    def add(tensor: str, role: str, name: str) -> None:
        b = slots * 8
        if tables is not None and f"{name}.coef" in tables:
            b += slots * 8
        g = groups.setdefault((tensor, role), [0, 0])
        g[0] += 1
        g[1] += b

    seen: set[str] = set()
    for ins in ir.decode_program(plan["program"]):
        if isinstance(ins, ir.Input | ir.Output) and ins.table not in seen:
            seen.add(ins.table)
            add(ins.tensor, "input" if isinstance(ins, ir.Input) else "output", ins.table)
    for p in plan["plaintexts"].values():
        if p["table"] not in seen:
            seen.add(p["table"])
            src = p.get("source", "const")
            add(src if src != "const" else "(constants, masks)", "weight" if src != "const" else "constant", p["table"])
    return sorted((TableGroup(t, r, n, b) for (t, r), (n, b) in groups.items()), key=lambda g: (-g.bytes, g.tensor))


def _fmt_bytes(b: float) -> str:
    if b >= 2**30:
        return f"{b / 2**30:.2f} GiB"
    if b >= 2**20:
        return f"{b / MiB:.1f} MiB"
    if b >= 2**10:
        return f"{b / 2**10:.1f} KiB"
    return f"{int(b)} B"


def memory_lines(plan: Mapping[str, Any]) -> list[str]:
    bd = peak_breakdown(plan)
    s = plan["summary"]
    lines = [f"Memory at the modelled peak: {_fmt_bytes(bd.total)} at program step {bd.step} ({bd.op})"]
    for label, n, b in bd.keys:
        lines.append(f"  rotation keys   {n:>6} x {_fmt_bytes(b):>10} ({label})  = {_fmt_bytes(n * b)}")
    for lv, n, b in bd.ciphertexts:
        lines.append(f"  ciphertexts     {n:>6} x {_fmt_bytes(b):>10} (level {lv})  = {_fmt_bytes(n * b)}")
    for lv, n, b in bd.plaintexts:
        lines.append(f"  plaintexts      {n:>6} x {_fmt_bytes(b):>10} (level {lv})  = {_fmt_bytes(n * b)}")
    kb = bd.part(bd.keys)
    if not bd.scheduled and bd.total and kb >= bd.total / 2:
        lines.append(
            f"  keys are {kb / bd.total:.0%} of the peak: without a key schedule every one of the "
            f"{s['rotation_keys']} keys the program uses stays resident from start to end; "
            "`slotplan plan --memory-cap` or `slotplan keys --memory-cap` loads and drops them"
        )
    parts = {"plaintexts": bd.part(bd.plaintexts), "ciphertexts": bd.part(bd.ciphertexts)}
    for what, b in parts.items():
        n = sum(c for _, c, _ in (bd.plaintexts if what == "plaintexts" else bd.ciphertexts))
        if bd.total and b >= bd.total / 2:
            why = ("a plaintext is resident from its first use to its last (encoded once, at the level of the "
                   "ciphertext it meets)" if what == "plaintexts" else
                   "a ciphertext is resident from the instruction that writes it to its last read")
            lines.append(f"  {what} are {b / bd.total:.0%} of the peak: {n} live at once; {why}")
    return lines


def table_lines(plan: Mapping[str, Any], tables: Mapping[str, np.ndarray] | None = None) -> list[str]:
    groups = table_sizes(plan, tables)
    total = sum(g.bytes for g in groups)
    n = sum(g.tables for g in groups)
    slots = int(plan["params"]["slots"])
    exact = "" if tables is not None else " (indices only; coefficients add 8 B per slot where present)"
    lines = [f"Tables file (slotplan plan --tables; not part of the resident memory): {n} tables x {slots} slots"
             f" x 8 B = {_fmt_bytes(total)}{exact}"]
    for g in groups:
        lines.append(f"  {g.tensor:<24} {g.role:<8} {g.tables:>6} tables  {_fmt_bytes(g.bytes):>10}")
    if groups and groups[0].role == "weight" and groups[0].bytes >= total / 2:
        lines.append("  most of it is plaintext tables: one per plaintext the kernels multiply by (the weight "
                     "diagonals / blocks), each a full slot vector")
    return lines


def _rich_table_text(table: Any, width: int = 160) -> str:
    import io

    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, emoji=False, highlight=False).print(table)
    return buf.getvalue()


# scaled_by / input_scaled_by: a factor folded into the producer (a Chebyshev change of variable, or sqrt(c2) of a
# quadratic: planner/assign/fold.py)
SHOWN_PARAMS = ("Pb", "Ps", "bs_opt", "search_space", "P_I", "P_O", "n1", "diagonals", "op", "kk", "J", "scaled_by",
                "input_scaled_by")


def node_table_text(plan: Mapping[str, Any]) -> str:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="cost per node (as the plan's nodes report it)", title_justify="left")
    for col in ("node", "op", "kernel", "params", *NODE_FIELDS[:4], "depth", "conversions", "out layout"):
        t.add_column(col, justify="right" if col in NODE_FIELDS else "left")
    for n in plan["nodes"]:
        nums = node_numbers(n)
        params = ", ".join(f"{k}={v}" for k, v in n.get("params", {}).items()
                           if k in SHOWN_PARAMS and not isinstance(v, list | dict))
        conv = ", ".join(f"{c['operand']}:{c['kind']}" for c in n.get("conversions", []))
        t.add_row(escape(str(n["id"])), escape(str(n.get("op", ""))), escape(str(n["kernel"])), escape(params[:60]),
                  *[str(nums.get(f, "-")) for f in NODE_FIELDS[:4]], str(nums.get("depth", "-")),
                  escape(conv or "-"), escape(str(n.get("out_layout", ""))))
    return _rich_table_text(t)


def explain_lines(explain: Mapping[str, Any] | None, note: str = "") -> list[str]:
    if explain is None:
        return [f"Why these kernels: not available ({note})" if note else "Why these kernels: not available"]
    head = (f"Why these kernels (objective {explain.get('objective')} {explain.get('unit')}s under cost table "
            f"{explain.get('costs')!r}; costs include the conversions on each node's edges){note}")
    lines = [head]
    for n in explain["nodes"]:
        ch = n["chosen"]
        c = ch["cost"]
        lines.append(f"  {n['id']}: {ch['label']} ({c['rotations']} rotations, {c['pmul']} pmul, depth {c['depth']}, "
                     f"{c['rotation_keys']} keys)")
        lines.append(f"      {n['reason']}")
    return lines


def text_report(plan: Mapping[str, Any], explain: Mapping[str, Any] | None = None,
                tables: Mapping[str, np.ndarray] | None = None, explain_note: str = "") -> str:
    """A plain-text overview (what ``slotplan show PLAN`` prints): summary, cost per node,
    why each kernel won, what makes the memory peak, the tables by tensor, and a legend
    of the layout notation.  ``explain``: the plan's ``explain`` object (or one re-derived)."""
    s = plan["summary"]
    tl = key_timeline(plan["program"])
    pk = s["peak_bytes"]
    cap = s.get("memory_cap_bytes")
    warning = (insecure_line(plan["params"]) or "parameters below the 128-bit bound") if s.get("insecure") else None
    lines = [*([f"WARNING: insecure: {warning}"] if warning else []),
        f"{plan['graph']['name']} @ {plan['params'].get('name', '?')} ({plan['params']['slots']} slots): "
        f"{len(plan['nodes'])} nodes, {len(plan['program'])} instructions",
        f"rotations {s['rotations']}  rotation keys {s['rotation_keys']}  key loads {s['key_loads']}  "
        f"pmul {s['pmul']}  depth {s['depth']}",
        f"peak {pk['total'] / MiB:.1f} MiB (keys {pk['keys'] / MiB:.1f}, plaintexts {pk['plaintexts'] / MiB:.1f}, "
        f"ciphertexts {pk['ciphertexts'] / MiB:.1f})"
        + (f"  cap {cap / MiB:.1f} MiB" if cap else "  no memory cap"),
        *([f"process peak {pp['total'] / MiB:.1f} MiB (plan {pp['plan'] / MiB:.1f}, executor {pp['executor'] / MiB:.1f}, "
           f"bootstrap garbage {pp['bootstrap'] / MiB:.1f}; the cap bounds this) + baseline {pp['baseline'] / MiB:.1f} MiB"]
          if isinstance(pp := s.get("process_peak_bytes"), dict) else []),
        "key schedule: " + ("load/drop" if tl.scheduled else "none (all keys resident for the whole program)"),
        "",
    ]
    text = "\n".join(lines) + "\n" + node_table_text(plan) + "\n"
    rest = [*explain_lines(explain or plan.get("explain"), explain_note), "", *memory_lines(plan), "",
            *table_lines(plan, tables), "", LEGEND]
    return text + "\n".join(rest) + "\n"


def _cost_panel(ax_cost: Any, nodes: Sequence[Mapping[str, Any]]) -> None:
    """Panel 1: rotations and plaintext multiplications per node."""
    labels = [f"{n['id']}\n{n['kernel']}" for n in nodes]
    rot = np.array([n.get("rotations", 0) for n in nodes], dtype=float)
    pmul = np.array([n.get("pmul", n.get("cost", {}).get("pmul", 0)) for n in nodes], dtype=float)
    x = np.arange(len(nodes))
    w = 0.38
    b1 = ax_cost.bar(x - w / 2, rot, w, color="tab:blue", label="rotations")
    ax_p = ax_cost.twinx()
    b2 = ax_p.bar(x + w / 2, pmul, w, color="tab:orange", label="pmul")
    ax_cost.set_ylabel("rotations", color="tab:blue")
    ax_p.set_ylabel("plaintext multiplications", color="tab:orange")
    ax_cost.set_xticks(x)
    step = max(1, len(nodes) // 30)
    ax_cost.set_xticklabels([lab if i % step == 0 else "" for i, lab in enumerate(labels)], fontsize=8)
    ax_cost.set_title("cost per node", fontsize=10, loc="left")
    if len(nodes) <= 40:
        ax_cost.bar_label(b1, fmt="%d", fontsize=7, padding=1)
        ax_p.bar_label(b2, fmt="%d", fontsize=7, padding=1)
    ax_cost.set_ylim(0, max(1.0, float(rot.max(initial=0))) * 1.18)
    ax_p.set_ylim(0, max(1.0, float(pmul.max(initial=0))) * 1.18)
    ax_cost.set_xlim(-1.0, max(1, len(nodes)))
    ax_cost.legend(handles=[b1, b2], loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=8,
                   frameon=False)


def _key_panel(ax_keys: Any, tl: KeyTimeline, key_rows: int) -> None:
    """Panel 2: when each rotation key is resident and where it is used."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    row = {k: i for i, k in enumerate(tl.keys)}
    for k in tl.keys:
        spans = [(a, b - a) for a, b in tl.intervals.get(k, [])]
        ax_keys.broken_barh(spans, (row[k] - 0.4, 0.8), facecolors="tab:green", alpha=0.45, linewidth=0)
        us = tl.uses.get(k, [])
        if us:
            ax_keys.scatter(us, [row[k]] * len(us), marker="|", s=60, color="black", linewidths=1.2)
    ax_keys.set_ylim(-0.7, key_rows - 0.3)
    ax_keys.invert_yaxis()
    tick_step = max(1, key_rows // 40)
    ax_keys.set_yticks([row[k] for k in tl.keys][::tick_step])
    ax_keys.set_yticklabels([str(k) for k in tl.keys][::tick_step], fontsize=7)
    ax_keys.set_ylabel("rotation key (offset k)")
    mode = "load/drop schedule" if tl.scheduled else "no key schedule: every key resident for the whole program"
    ax_keys.set_title(f"key residency ({len(tl.keys)} keys; {mode})", fontsize=10, loc="left")
    ax_keys.legend(
        handles=[Patch(facecolor="tab:green", alpha=0.45, label="resident"),
                 plt.Line2D([], [], color="black", marker="|", linestyle="", label="rotation uses key")],
        loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=8, frameon=False,
    )
    ax_keys.tick_params(labelbottom=False)


def _memory_panel(
    ax_mem: Any, program: Sequence[Any], mem: Mapping[str, np.ndarray], summary: Mapping[str, Any], n_steps: int
) -> None:
    """Panel 3: modelled resident memory per program step, the cap and the peak."""
    steps = np.arange(len(program))
    stack = [mem["keys"] / MiB, mem["plaintexts"] / MiB, mem["ciphertexts"] / MiB]
    if len(program):
        ax_mem.stackplot(steps, *stack, labels=["rotation keys", "plaintexts", "ciphertexts"],
                         colors=["tab:green", "tab:orange", "tab:blue"], alpha=0.7, step="post")
    total: np.ndarray = np.sum(np.vstack(stack), axis=0) if len(program) else np.zeros(0)
    cap = summary.get("memory_cap_bytes")
    if cap:
        ax_mem.axhline(cap / MiB, color="red", linestyle="--", linewidth=1.2, label=f"memory cap {cap / MiB:.1f} MiB")
    if len(program):
        i_peak = int(np.argmax(total))
        ax_mem.annotate(f"peak {total[i_peak]:.1f} MiB", (i_peak, total[i_peak]), textcoords="offset points",
                        xytext=(6, 4), fontsize=8)
    top = max(float(np.max(total)) if len(program) else 0.0, (cap or 0) / MiB, 1e-6)
    ax_mem.set_ylim(0, top * 1.15)
    ax_mem.set_xlim(-0.01 * n_steps - 0.5, n_steps * 1.01)
    ax_mem.set_xlabel("program step (instruction index)")
    ax_mem.set_ylabel("modelled MiB")
    ax_mem.set_title("modelled resident memory", fontsize=10, loc="left")
    ax_mem.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=4, fontsize=8, frameon=False)



VIZ_HINT = "needs matplotlib, an optional dependency: pip install 'slotplan[viz]'"


def have_matplotlib() -> bool:
    """True when matplotlib (the ``viz`` extra) imports."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def need_matplotlib(what: str) -> None:
    """Refuse with one line (a :class:`SlotplanError`) when matplotlib is missing."""
    if not have_matplotlib():
        raise SlotplanError(f"{what} {VIZ_HINT}")


def save_figure(fig: Any, out: Path, fmt: str) -> Path:
    """Write a figure deterministically (SVG without a date, fixed hash salt) and close it.
    Library callers get the directory made; the CLI refuses a missing one before drawing."""
    need_matplotlib("drawing a figure")
    import matplotlib
    import matplotlib.pyplot as plt

    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "svg":
        with matplotlib.rc_context({"svg.hashsalt": "slotplan"}):
            fig.savefig(out, format="svg", metadata={"Date": None})
    else:
        fig.savefig(out, format="png")
    plt.close(fig)
    return out


def render_png(plan: Mapping[str, Any], path: str | Path, title: str | None = None) -> Path:
    """Draw the three panels into ``path`` (PNG, or SVG when the name ends in .svg)."""
    need_matplotlib("drawing a plan (--png/--svg)")
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    program = plan["program"]
    params = Params.from_json(plan["params"])
    summary = plan["summary"]
    nodes = plan["nodes"]
    tl = key_timeline(program)
    mem = memory_timeline(program, params, plan_key_bytes(plan))
    n_steps = max(1, len(program))

    key_rows = max(1, len(tl.keys))
    key_h = min(7.0, 1.6 + 0.12 * key_rows)
    fig = plt.figure(figsize=(12, 3.4 + key_h + 3.2), dpi=110, layout="constrained")
    gs = fig.add_gridspec(3, 1, height_ratios=[3.4, key_h, 3.2])
    ax_cost = fig.add_subplot(gs[0])
    ax_keys = fig.add_subplot(gs[1])
    ax_mem = fig.add_subplot(gs[2], sharex=ax_keys)
    name = plan["graph"]["name"]
    fig.suptitle(
        title
        or (
            f"{name} @ {params.name} ({params.slots} slots): {summary['rotations']} rotations, "
            f"{summary['rotation_keys']} keys, {summary['key_loads']} key loads, "
            f"peak {summary['peak_bytes']['total'] / MiB:.1f} MiB"
        ),
        fontsize=12,
    )

    _cost_panel(ax_cost, nodes)
    _key_panel(ax_keys, tl, key_rows)
    _memory_panel(ax_mem, program, mem, summary, n_steps)

    out = Path(path)
    return save_figure(fig, out, "svg" if out.suffix.lower() == ".svg" else "png")


# --------------------------------------------------------------------------------------
# layout pictures: which tensor element sits in which slot
# --------------------------------------------------------------------------------------

ZERO_RGB = (1.0, 1.0, 1.0)  # clean layout, no element: the slot is 0
GARBAGE_RGB = (0.86, 0.16, 0.16)  # dirty layout, no element: the slot holds anything
PAD_RGB = (0.55, 0.55, 0.55)  # grid cells past the last slot (slot counts that are no square)
DEFAULT_MAX_CT = 8


@dataclass
class LayoutView:
    """The slot maps of one ciphertext layout of a plan, ready to draw."""

    name: str
    kind: str  # input | node output | conversion (...) | output
    tensor: str
    shape: tuple[int, ...]
    notation: str
    clean: bool
    maps: np.ndarray  # (n_ct, slots) int64: flat tensor index per slot, -1 = no element
    source: str  # where the maps come from: tables file | re-planned

    @property
    def n_ct(self) -> int:
        return int(self.maps.shape[0])


def _table_maps(tables: Mapping[str, np.ndarray], prefix: str) -> np.ndarray | None:
    rows: list[np.ndarray] = []
    while f"{prefix}/{len(rows)}.idx" in tables:
        rows.append(np.asarray(tables[f"{prefix}/{len(rows)}.idx"], dtype=np.int64))
    return np.stack(rows) if rows else None


def layout_views(
    plan: Mapping[str, Any],
    names: Sequence[str] | None = None,
    tables: Mapping[str, np.ndarray] | None = None,
    replanned: tuple[Any, Any] | None = None,
) -> list[LayoutView]:
    """Slot maps of the named layouts (``None``: all, in program order).  A name is an
    encrypted input, a node id (its output), or ``conv/<node>/<operand>`` (a conversion
    result).  Maps of inputs and outputs come from the tables file when given (and must
    equal the layout the planner chose); the others from re-planning the plan's embedded
    graph (:func:`planner.report.explain.replan`; pass ``replanned`` to reuse one)."""
    from planner.report.explain import ExplainError, plan_layouts, replan

    infos: dict[str, Any] = {}
    why = ""
    try:
        problem, sol = replanned if replanned is not None else replan(plan)
        infos = plan_layouts(problem, sol)
    except ExplainError as e:
        why = str(e)
    graph_spec = plan["graph"].get("spec") or {}
    inputs = {t for t, v in (graph_spec.get("tensors") or {}).items() if v.get("role") == "input"}
    outputs = set(plan.get("outputs") or {}) | {ins.tensor for ins in ir.decode_program(plan["program"]) if isinstance(ins, ir.Output)}
    known = list(infos) + [t for t in sorted(inputs | outputs) if t not in infos]
    wanted = list(known) if names is None else list(names)
    by_node = {n["id"]: n for n in plan["nodes"]}
    views: list[LayoutView] = []
    for name in wanted:
        info = infos.get(name)
        tmaps = None
        if tables is not None:
            for prefix in (f"in/{name}", f"out/{name}", f"layout/{name}"):
                tmaps = _table_maps(tables, prefix)
                if tmaps is not None:
                    break
        if info is not None:
            lay = info.layout
            maps = np.stack([np.asarray(lay.index_map(q), dtype=np.int64) for q in range(lay.n_ct)])
            if tmaps is not None and (tmaps.shape != maps.shape or not np.array_equal(tmaps, maps)):
                raise SlotplanError(f"layout {name!r}: the tables file does not match the plan's layout "
                                    "(tables of another plan?)")
            kind = info.kind + (" (program output)" if name in outputs and info.kind == "node output" else "")
            views.append(LayoutView(name, kind, info.tensor, info.shape, lay.notation(), bool(lay.clean), maps,
                                    "tables file" if tmaps is not None else "re-planned from the plan's graph"))
            continue
        if tmaps is not None and (name in inputs or name in outputs):
            notation = by_node[name]["out_layout"] if name in by_node else "(as packed in the tables file)"
            clean = name in inputs or not notation.endswith("~")
            shape = tuple((plan.get("outputs") or {}).get(name) or graph_spec.get("tensors", {}).get(name, {})
                          .get("shape", ()))
            views.append(LayoutView(name, "input" if name in inputs else "program output", name, shape, notation,
                                    clean, tmaps, "tables file"))
            continue
        hint = f" ({why})" if why else ""
        raise SlotplanError(f"no layout {name!r} in this plan{hint}; known: {', '.join(known[:40])}")
    return views


def grid_shape(slots: int) -> tuple[int, int]:
    """(rows, columns) of the slot grid of one ciphertext: 32768 slots -> 128 x 256."""
    cols = 1 << (((max(2, slots) - 1).bit_length() + 1) // 2)
    return -(-slots // cols), cols


def slot_image(row: np.ndarray, size: int, clean: bool, cmap: Any) -> np.ndarray:
    """RGB image of one ciphertext: slot s at (s // cols, s % cols), coloured by the flat
    tensor index it holds; no element: white (clean: zero) or red (dirty: garbage)."""
    slots = row.shape[0]
    rows, cols = grid_shape(slots)
    img = np.empty((rows * cols, 3), dtype=np.float64)
    img[:] = PAD_RGB
    has = row >= 0
    img[:slots][has] = np.asarray(cmap(row[has] / max(1, size - 1)))[:, :3]
    img[:slots][~has] = ZERO_RGB if clean else GARBAGE_RGB
    return img.reshape(rows, cols, 3)


def cropped_rows(v: LayoutView, min_rows: int = 4) -> int:
    """Grid rows worth drawing: all of them, unless every element sits in the first half
    (then up to the last row holding an element, at least ``min_rows``)."""
    rows, cols = grid_shape(v.maps.shape[1])
    has = np.nonzero((v.maps >= 0).any(axis=0))[0]
    used = int(has[-1]) // cols + 1 if has.size else rows
    return rows if used > rows // 2 else min(rows, max(min_rows, used))


def render_layouts(views: Sequence[LayoutView], path: str | Path, fmt: str | None = None,
                   max_ct: int = DEFAULT_MAX_CT, title: str | None = None) -> Path:
    """One section per layout: its ciphertexts as slot grids coloured by tensor element
    (PNG or SVG by ``fmt`` or the file suffix).  At most ``max_ct`` ciphertexts per layout
    are drawn (said on the picture)."""
    need_matplotlib("drawing layouts (--png/--svg)")
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize
    from matplotlib.patches import Patch

    out = Path(path)
    fmt = (fmt or out.suffix.lstrip(".") or "png").lower()
    if not views:
        raise SlotplanError("no layouts to draw")
    cmap = plt.get_cmap("viridis")
    ncols = max(1, min(4, max(min(v.n_ct, max_ct) for v in views)))
    rows_per = [-(-min(v.n_ct, max_ct) // ncols) for v in views]
    crops = [cropped_rows(v) for v in views]
    _, c0 = grid_shape(views[0].maps.shape[1])
    fig_w = max(9.0, 3.4 * ncols + 1.6)
    heights = [1.5 + ((fig_w - 1.6) / ncols * max(crop, c0 / 16) / c0 + 0.45) * r
               for crop, r in zip(crops, rows_per, strict=True)]
    fig = plt.figure(figsize=(fig_w, sum(heights) + (0.5 if title else 0.1)), dpi=110)
    subfigs = fig.subfigures(len(views), 1, height_ratios=heights, squeeze=False)[:, 0]
    if title:
        fig.suptitle(title, fontsize=12)
    for sf, v, nrow, crop in zip(subfigs, views, rows_per, crops, strict=True):
        size = int(np.prod(v.shape)) if v.shape else int(v.maps.max(initial=0)) + 1
        shown = min(v.n_ct, max_ct)
        more = f"; showing {shown} of {v.n_ct} ciphertexts" if shown < v.n_ct else ""
        rows, cols = grid_shape(v.maps.shape[1])
        empty = "zero (clean)" if v.clean else "garbage (dirty ~)"
        if crop < rows:
            more += (f"; rows {crop}..{rows - 1} (slots {crop * cols}..{v.maps.shape[1] - 1}) hold no element "
                     "and are cut off")
        sf.suptitle(
            f"{v.name} [{v.kind}]: {v.notation}\n"
            f"tensor {v.tensor} {list(v.shape)}: {v.n_ct} ciphertext{'s' if v.n_ct != 1 else ''} x "
            f"{v.maps.shape[1]} slots{more}\n"
            f"grid {rows} x {cols}: slot s at row s // {cols}, column s % {cols}; colour = element; "
            f"no element = {empty}",
            fontsize=9, x=0.02, ha="left",
        )
        axs = sf.subplots(nrow, ncols, squeeze=False)
        for i, ax in enumerate(axs.ravel()):
            if i >= shown:
                ax.set_visible(False)
                continue
            row = v.maps[i]
            ax.imshow(slot_image(row, size, v.clean, cmap)[:crop], interpolation="nearest", aspect="equal")
            n_el = int((row >= 0).sum())
            ax.set_title(f"ct {i}: {n_el} element slots, {row.shape[0] - n_el} {'zero' if v.clean else 'garbage'}",
                         fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
        sm = plt.cm.ScalarMappable(norm=Normalize(0, max(1, size - 1)), cmap=cmap)
        cb = sf.colorbar(sm, ax=axs.ravel().tolist(), fraction=0.03, pad=0.01)
        cb.set_label("flat (row-major) element index", fontsize=8)
        cb.ax.tick_params(labelsize=7)
        sf.legend(handles=[Patch(facecolor=ZERO_RGB, edgecolor="black", label="zero: no element, clean layout"),
                           Patch(facecolor=GARBAGE_RGB, label="garbage: no element, dirty (~) layout")],
                  loc="lower left", ncol=2, fontsize=7, frameon=False)
    return save_figure(fig, out, fmt)
