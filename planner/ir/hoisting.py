"""Hoisted rotation groups split and joined: a ``rot_hoisted`` of several distinct offsets
is one key-switch decomposition shared by its rotations; the key schedule may split such a
group (fewer keys resident at once) and join runs of it back (fewer decompositions).
:func:`fully_split` and :func:`collapse` are the two directions, on plain programs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner import ir


@dataclass
class Split:
    """A program with every hoisted group of >= 2 distinct offsets split into one
    instruction per offset (``groups``: their points; ``orig``: point -> instruction of the
    unsplit program)."""

    program: list[dict[str, Any]]
    groups: list[list[int]]
    orig: list[int]


def fully_split(program: Sequence[Mapping[str, Any]]) -> Split:
    out: list[dict[str, Any]] = []
    groups: list[list[int]] = []
    orig: list[int] = []
    for i, raw in enumerate(program):
        ins = ir.decode(raw)
        if isinstance(ins, ir.RotHoisted) and len(set(ins.ks)) > 1:
            by_k: dict[int, list[str]] = {}
            for d, k in zip(ins.dsts, ins.ks, strict=True):
                by_k.setdefault(int(k), []).append(d)
            pts = []
            for k, dsts in by_k.items():
                pts.append(len(out))
                orig.append(i)
                if len(dsts) == 1:
                    out.append(ir.Rot(dsts[0], ins.src, k).to_json())
                else:
                    out.append(ir.RotHoisted(tuple(dsts), ins.src, (k,) * len(dsts)).to_json())
            groups.append(pts)
        else:
            out.append(dict(raw))
            orig.append(i)
    return Split(out, groups, orig)


def collapse(split: Split, joined: Sequence[Sequence[bool]]) -> tuple[list[dict[str, Any]], list[int]]:
    """The program with each group's joined runs as one hoisted instruction, and the map
    point -> instruction index."""
    start_of: dict[int, int] = {pts[0]: g for g, pts in enumerate(split.groups)}
    out: list[dict[str, Any]] = []
    where = [0] * len(split.program)
    t = 0
    n = len(split.program)
    while t < n:
        g = start_of.get(t)
        if g is None:
            where[t] = len(out)
            out.append(split.program[t])
            t += 1
            continue
        pts = split.groups[g]
        run: list[int] = []
        for b, p in enumerate(pts):
            run.append(p)
            if b == len(pts) - 1 or not joined[g][b]:
                out.append(_merge_run([split.program[q] for q in run]))
                for q in run:
                    where[q] = len(out) - 1
                run = []
        t = pts[-1] + 1
    return out, where


def _merge_run(instrs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    if len(instrs) == 1:
        return dict(instrs[0])
    dsts: list[str] = []
    ks: list[int] = []
    src = ""
    for raw in instrs:
        ins = ir.decode(raw)
        assert isinstance(ins, ir.Rot | ir.RotHoisted)
        src = ins.src
        dsts.extend(ins.writes())
        ks.extend(ins.rot_keys() if isinstance(ins, ir.Rot) else ins.ks)
    return ir.RotHoisted(tuple(dsts), src, tuple(ks)).to_json()
