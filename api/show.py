"""``slotplan show``: a plan at a glance (text, or a PNG drawn with matplotlib's Agg).

The PNG has three panels:

1. cost per node: rotations and plaintext multiplications (two bars per node);
2. key residency: for every rotation key (offset), when it is resident over the program
   steps (between ``load_key`` and ``drop_key``; a plan without a key schedule keeps all
   keys resident for the whole program), with a tick where a rotation uses it;
3. modelled memory over the program (keys + plaintexts + ciphertexts, stacked) against
   ``summary.memory_cap_bytes`` when a cap is set.

The memory series follows the same model as :func:`planner.summary.memory_profile`
(its maximum is ``summary.peak_bytes.total``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from planner.params import Params
from planner.summary import memory_series, plan_key_bytes

MiB = 2**20


@dataclass
class KeyTimeline:
    """Resident intervals and use steps of every rotation key of a program."""

    keys: list[int]
    intervals: dict[int, list[tuple[int, int]]]  # [start, end) program steps
    uses: dict[int, list[int]]
    scheduled: bool
    steps: int


def key_timeline(program: Sequence[Mapping[str, Any]]) -> KeyTimeline:
    n = len(program)
    uses: dict[int, list[int]] = {}
    for i, ins in enumerate(program):
        if ins["op"] == "rot":
            uses.setdefault(int(ins["k"]), []).append(i)
        elif ins["op"] == "rot_hoisted":
            for k in ins["ks"]:
                uses.setdefault(int(k), []).append(i)
    scheduled = any(ins["op"] in ("load_key", "drop_key") for ins in program)
    intervals: dict[int, list[tuple[int, int]]] = {}
    if scheduled:
        open_at: dict[int, int] = {}
        for i, ins in enumerate(program):
            if ins["op"] == "load_key":
                open_at.setdefault(int(ins["k"]), i)
            elif ins["op"] == "drop_key":
                k = int(ins["k"])
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
    ``ciphertexts`` -- the series behind the plan's peak (planner.summary.memory_series),
    with each key at its recorded size."""
    ser = memory_series(program, params, key_bytes=key_bytes)
    return {k: v.astype(np.float64) for k, v in ser.items()}


def text_report(plan: Mapping[str, Any]) -> str:
    """A plain-text overview (what ``slotplan show PLAN`` prints without ``--png``)."""
    s = plan["summary"]
    tl = key_timeline(plan["program"])
    pk = s["peak_bytes"]
    cap = s.get("memory_cap_bytes")
    lines = [
        f"{plan['graph']['name']} @ {plan['params'].get('name', '?')} ({plan['params']['slots']} slots): "
        f"{len(plan['nodes'])} nodes, {len(plan['program'])} instructions",
        f"rotations {s['rotations']}  rotation keys {s['rotation_keys']}  key loads {s['key_loads']}  "
        f"pmul {s['pmul']}  depth {s['depth']}",
        f"peak {pk['total'] / MiB:.1f} MiB (keys {pk['keys'] / MiB:.1f}, plaintexts {pk['plaintexts'] / MiB:.1f}, "
        f"ciphertexts {pk['ciphertexts'] / MiB:.1f})"
        + (f"  cap {cap / MiB:.1f} MiB" if cap else "  no memory cap"),
        "key schedule: " + ("load/drop" if tl.scheduled else "none (all keys resident for the whole program)"),
        "",
        f"{'node':<20} {'kernel':<12} {'rotations':>9} {'pmul':>7}  params",
    ]
    for n in plan["nodes"]:
        params = ", ".join(f"{k}={v}" for k, v in n.get("params", {}).items() if not isinstance(v, list | dict))
        lines.append(
            f"{str(n['id'])[:20]:<20} {str(n['kernel'])[:12]:<12} {n['rotations']:>9} "
            f"{n.get('pmul', n.get('cost', {}).get('pmul', 0)):>7}  {params}"
        )
    return "\n".join(lines) + "\n"


def render_png(plan: Mapping[str, Any], path: str | Path, title: str | None = None) -> Path:
    """Draw the three panels into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

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

    # 1. cost per node
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

    # 2. key residency
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

    # 3. memory
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

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    plt.close(fig)
    return out
