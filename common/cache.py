"""A bounded, least-recently-used mapping for values that are pure functions of their key
(the planner's shared candidate costs: planner.kernels.base, planner.assign.fold)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class BoundedCache(Generic[V]):
    """At most ``limit`` entries; the least recently used one goes first. ``limit`` 0
    keeps nothing (every lookup misses)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._data: OrderedDict[Hashable, V] = OrderedDict()

    def get(self, key: Hashable) -> V | None:
        hit = self._data.get(key)
        if hit is not None:
            self._data.move_to_end(key)
        return hit

    def put(self, key: Hashable, value: V) -> None:
        if self.limit <= 0:
            return
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.limit:
            self._data.popitem(last=False)

    def clear(self) -> None:
        self._data.clear()

    def __len__(self) -> int:
        return len(self._data)
