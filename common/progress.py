"""Progress of long planning steps, reported to whoever listens (the CLI draws it with rich),
and the wall-clock deadline of a whole planning request, checked at the same points.

It sits in the lowest layer (``solver/``, imported by the planner and the API) because the
solver back ends report their improving solutions through it.

The planner and the solver back ends call :func:`stage`, :func:`advance` and :func:`note`;
without a listener (the default, and always in worker processes) these cost one context
variable lookup and do nothing, so plans are byte-for-byte the same with and without
progress.  A listener is installed for a block of code with :func:`reporting`.

:func:`deadline` bounds a block in wall time: every :func:`begin`/:func:`advance` inside it
(candidate generation and pricing per node, the solve, lowering per node, the key
schedule) raises :class:`DeadlineExceeded` once the time is up, naming the step, and
:func:`remaining` caps the solver's own limit.  Without a deadline nothing changes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

from common.errors import SlotplanError


class DeadlineExceeded(SlotplanError):
    """The wall-clock limit of a planning request ran out (at ``stage``, after ``seconds``)."""

    def __init__(self, stage: str, detail: str, seconds: float):
        where = f"{stage} ({detail})" if detail else stage
        super().__init__(f"planning stopped at {where}: the wall limit of {seconds:g} s ran out")
        self.stage = stage
        self.seconds = seconds

    def __reduce__(self) -> tuple[type[DeadlineExceeded], tuple[str, str, float]]:
        return (DeadlineExceeded, (self.stage, "", self.seconds))


# (monotonic end time, seconds allowed) of the innermost deadline, or None
_DEADLINE: ContextVar[tuple[float, float] | None] = ContextVar("slotplan_deadline", default=None)


@contextmanager
def deadline(seconds: float | None, started: float | None = None) -> Iterator[None]:
    """Bound the enclosed planning work to ``seconds`` of wall time (None: unbounded),
    counted from ``started`` (a ``time.monotonic()`` reading; default: now), so a caller
    can include work done before the block (reading the graph) in the same limit."""
    if seconds is None:
        yield
        return
    begin = time.monotonic() if started is None else started
    token = _DEADLINE.set((begin + seconds, seconds))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def check(name: str, detail: str = "") -> None:
    d = _DEADLINE.get()
    if d is not None and time.monotonic() > d[0]:
        raise DeadlineExceeded(name, detail, d[1])


def limit_seconds() -> float | None:
    """The seconds the innermost deadline allows (None: no deadline)."""
    d = _DEADLINE.get()
    return None if d is None else d[1]


def remaining() -> float | None:
    """Seconds left before the deadline (None: no deadline)."""
    d = _DEADLINE.get()
    return None if d is None else max(0.0, d[0] - time.monotonic())


class Reporter(Protocol):
    def start(self, stage: str, total: int | None) -> None: ...

    def advance(self, stage: str, detail: str) -> None: ...

    def note(self, stage: str, text: str) -> None: ...

    def finish(self, stage: str) -> None: ...


_REPORTER: ContextVar[Reporter | None] = ContextVar("slotplan_progress", default=None)


def active() -> bool:
    return _REPORTER.get() is not None


@contextmanager
def reporting(reporter: Reporter | None) -> Iterator[None]:
    """Send the progress of the enclosed code to ``reporter`` (None: nowhere)."""
    token = _REPORTER.set(reporter)
    try:
        yield
    finally:
        _REPORTER.reset(token)


@contextmanager
def stage(name: str, total: int | None = None) -> Iterator[None]:
    """A named step (``total``: number of :func:`advance` calls expected, None: unknown)."""
    check(name)
    r = _REPORTER.get()
    if r is None:
        yield
        return
    r.start(name, total)
    try:
        yield
    finally:
        r.finish(name)


def begin(name: str, total: int | None = None) -> None:
    """Start a step without a ``with`` block (end it with :func:`end`)."""
    check(name)
    r = _REPORTER.get()
    if r is not None:
        r.start(name, total)


def end(name: str) -> None:
    r = _REPORTER.get()
    if r is not None:
        r.finish(name)


def advance(name: str, detail: str = "") -> None:
    check(name, detail)
    r = _REPORTER.get()
    if r is not None:
        r.advance(name, detail)


def note(name: str, text: str) -> None:
    """Current state of a step, e.g. the solver's objective and bound."""
    r = _REPORTER.get()
    if r is not None:
        r.note(name, text)
