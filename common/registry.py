"""Plug-in registries: one name -> factory table per kind of plug-in.

Kernel families (``planner.assign.candidates.KERNEL_FAMILIES``), solver back ends
(``solver.SOLVER_BACKENDS``), execution back ends (``backends.EXECUTION_BACKENDS``), key
strategies (``planner.keys.schedule.KEY_STRATEGIES``) and cost tables (``planner.cost.tables.COST_TABLES``)
are each one :class:`Registry`; the CLI's help and checks, the REST enums and the tests'
parametrisation read :meth:`Registry.names`, so no list of names is written twice.  It
lives in the lowest layer so that every layer can use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from common.errors import SlotplanError

T = TypeVar("T")


class UnknownNameError(SlotplanError):
    """A name no entry of a registry has."""


class Registry(Generic[T]):
    """Ordered ``name -> factory`` table; ``create(name, ...)`` calls the factory.

    ``what`` names the kind in messages (``"solver"``); ``known`` introduces the list of
    names (``"known solvers"``); ``error`` is the exception raised for an unknown name.
    ``discover`` (optional) is called on every lookup to add entries found at run time
    (cost tables in a folder)."""

    def __init__(
        self,
        what: str,
        known: str = "known",
        error: type[SlotplanError] = UnknownNameError,
        discover: Callable[[], dict[str, Callable[..., T]]] | None = None,
    ) -> None:
        self.what = what
        self.known = known
        self.error = error
        self._discover = discover
        self._entries: dict[str, Callable[..., T]] = {}

    def register(self, name: str, factory: Callable[..., T] | None = None) -> Any:
        """``reg.register("x", f)``, or ``@reg.register("x")`` on a function or class."""

        def add(f: Callable[..., T]) -> Callable[..., T]:
            if name in self._entries:
                raise ValueError(f"{self.what} {name!r} registered twice")
            self._entries[name] = f
            return f

        return add(factory) if factory is not None else add

    @contextmanager
    def temporarily(self, name: str, factory: Callable[..., T]) -> Iterator[str]:
        """Register ``name`` for the enclosed block only (test fakes)."""
        self.register(name, factory)
        try:
            yield name
        finally:
            del self._entries[name]

    def _all(self) -> dict[str, Callable[..., T]]:
        if self._discover is None:
            return self._entries
        return {**self._entries, **{k: v for k, v in self._discover().items() if k not in self._entries}}

    def names(self) -> tuple[str, ...]:
        return tuple(self._all())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._all()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def unknown(self, name: object) -> SlotplanError:
        """The error for an unknown name (``unknown solver 'x'; known solvers: cpsat, z3``)."""
        return self.error(f"unknown {self.what} {name!r}; {self.known}: {', '.join(self.names())}")

    def check(self, name: str) -> str:
        """``name`` when registered, else raise :meth:`unknown`."""
        if name not in self:
            raise self.unknown(name)
        return name

    def get(self, name: str) -> Callable[..., T]:
        entries = self._all()
        if name not in entries:
            raise self.unknown(name)
        return entries[name]

    def create(self, name: str, *args: Any, **kwargs: Any) -> T:
        return self.get(name)(*args, **kwargs)

    def help(self, sep: str = " | ") -> str:
        """The names for a ``--help`` text."""
        return sep.join(self.names())
