"""Progress of long commands on stderr (rich), fed by :mod:`common.progress`.

On by default when stderr is a terminal and the command does not print JSON; ``--progress``
forces it on (a non-terminal stderr then gets one plain line per step and per solver
improvement instead of a live bar).  Stdout is never touched.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from api.common import err
from common import progress as _progress


def wanted(flag: bool, as_json: bool = False, console: Console | None = None) -> bool:
    """Show progress: forced by ``--progress``, else only on a terminal and without --json."""
    c = console or err
    return flag or (c.is_terminal and not as_json)


class RichReporter:
    """A rich live display with one line per step (terminal), or plain lines (otherwise)."""

    # plain mode: at most one note line per step every this many seconds
    NOTE_INTERVAL_S = 1.0

    def __init__(self, console: Console | None = None):
        self.console = console or err
        self.live = self.console.is_terminal
        self.tasks: dict[str, TaskID] = {}
        self.t0: dict[str, float] = {}
        self.last_note: dict[str, float] = {}
        self.pending: dict[str, str] = {}  # plain mode: the latest note not printed yet
        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.fields[stage]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=self.console,
            transient=False,
        )

    # --- common.progress.Reporter
    def start(self, stage: str, total: int | None) -> None:
        self.t0[stage] = time.perf_counter()
        if self.live:
            if stage in self.tasks:
                self.bar.reset(self.tasks[stage], total=total, description="")
            else:
                self.tasks[stage] = self.bar.add_task("", total=total, stage=stage)
        else:
            self._line(f"{stage}: started" + (f" ({total} steps)" if total else ""))

    def advance(self, stage: str, detail: str) -> None:
        if self.live and stage in self.tasks:
            self.bar.update(self.tasks[stage], advance=1, description=detail)

    def note(self, stage: str, text: str) -> None:
        if self.live:
            if stage in self.tasks:
                self.bar.update(self.tasks[stage], description=text)
            return
        now = time.perf_counter()
        if now - self.last_note.get(stage, -1e9) >= self.NOTE_INTERVAL_S:
            self.last_note[stage] = now
            self.pending.pop(stage, None)
            self._line(f"{stage}: {text}")
        else:
            self.pending[stage] = text

    def finish(self, stage: str) -> None:
        secs = time.perf_counter() - self.t0.get(stage, time.perf_counter())
        if self.live and stage in self.tasks:
            t = self.tasks[stage]
            task = next(x for x in self.bar.tasks if x.id == t)
            total = task.total if task.total is not None else 1
            self.bar.update(t, total=total, completed=total)
        elif not self.live:
            last = self.pending.pop(stage, None)
            self._line(f"{stage}: done in {secs:.2f}s" + (f" ({last})" if last else ""))

    def _line(self, text: str) -> None:
        self.console.print(f"slotplan: {text}", highlight=False, markup=False, soft_wrap=True)


@contextmanager
def shown(enabled: bool, console: Console | None = None) -> Iterator[None]:
    """Report planner progress on stderr for the enclosed block when ``enabled``."""
    if not enabled:
        with _progress.reporting(None):
            yield
        return
    rep = RichReporter(console)
    if rep.live:
        with rep.bar, _progress.reporting(rep):
            yield
    else:
        with _progress.reporting(rep):
            yield


@contextmanager
def step(name: str) -> Iterator[None]:
    """A step of a command itself (not of the planner), e.g. running a plan."""
    with _progress.stage(name):
        yield
