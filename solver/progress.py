"""Progress of long planning steps, reported to whoever listens (the CLI draws it with rich).

It sits in the lowest layer (``solver/``, imported by the planner and the API) because the
solver back ends report their improving solutions through it.

The planner and the solver back ends call :func:`stage`, :func:`advance` and :func:`note`;
without a listener (the default, and always in worker processes) these cost one context
variable lookup and do nothing, so plans are byte-for-byte the same with and without
progress.  A listener is installed for a block of code with :func:`reporting`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol


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
    r = _REPORTER.get()
    if r is not None:
        r.start(name, total)


def end(name: str) -> None:
    r = _REPORTER.get()
    if r is not None:
        r.finish(name)


def advance(name: str, detail: str = "") -> None:
    r = _REPORTER.get()
    if r is not None:
        r.advance(name, detail)


def note(name: str, text: str) -> None:
    """Current state of a step, e.g. the solver's objective and bound."""
    r = _REPORTER.get()
    if r is not None:
        r.note(name, text)
