"""A small thread-safe cache that forgets what was unused longest: the JAX
backend's plans and ``dm.matmul``'s recent runners.

>>> cache = LRU()
>>> cache.add("a", 1, bound=2), cache.add("b", 2, bound=2), cache.get("a")
(1, 2, 1)
>>> cache.add("c", 3, bound=2)  # "b" was unused longest: it goes
3
>>> cache.get("b"), sorted(cache.keys())
(None, ['a', 'c'])
>>> cache.add("a", 10, bound=2)  # a key already held keeps its value: the first added wins
1
>>> cache.keep_only(lambda v: v > 1); cache.keys(), len(cache)
(['c'], 1)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")

__all__ = ["LRU"]


class LRU(Generic[V]):
    """Values by key, the last used last. :meth:`get` and :meth:`add` count
    as a use; past the ``bound`` given to :meth:`add` the values unused
    longest go (read at each add: a bound may change). Values are not None.
    Threads may share one: what makes a value runs outside the lock (the
    caller's), and of threads that made one value for the same key the
    first to add it wins."""

    def __init__(self) -> None:
        self._items: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def add(self, key: Hashable, value: V, *, bound: int) -> V:
        """The value held for ``key``: one already there, else ``value``, added
        after the values unused longest went to make room (at least one stays)."""
        with self._lock:
            held = self._items.get(key)
            if held is not None:
                self._items.move_to_end(key)
                return held
            while len(self._items) >= max(bound, 1):
                self._items.popitem(last=False)
            self._items[key] = value
            return value

    def keep_only(self, keep: Callable[[V], bool]) -> None:
        """Forget the values ``keep`` refuses."""
        with self._lock:
            self._items = OrderedDict((k, v) for k, v in self._items.items() if keep(v))

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        return len(self._items)
