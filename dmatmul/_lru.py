"""A small thread-safe cache that forgets what was unused longest: the
backends' plans and ``dm.matmul``'s recent runners.

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

Values that hold resources are handed to ``on_evict`` as they go (after
the lock is let go), so their owner can free them:

>>> gone = []
>>> cache.add("d", 4, bound=1, on_evict=gone.append), gone, cache.values()
(4, [3], [4])
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
        with self._lock:  # (a move to the end while another thread lists the values would break its loop)
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def add(self, key: Hashable, value: V, *, bound: int, on_evict: Callable[[V], object] | None = None) -> V:
        """The value held for ``key``: one already there, else ``value``, added
        after the values unused longest went to make room (at least one stays);
        each that went is then passed to ``on_evict`` (outside the lock, which
        ``on_evict`` may need: it may use this cache)."""
        gone: list[V] = []
        with self._lock:
            held = self._items.get(key)
            if held is not None:
                self._items.move_to_end(key)
                return held
            while len(self._items) >= max(bound, 1):
                gone.append(self._items.popitem(last=False)[1])
            self._items[key] = value
        if on_evict is not None:
            for old in gone:
                on_evict(old)
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

    def values(self) -> list[V]:
        """The values, the one unused longest first."""
        with self._lock:
            return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)
