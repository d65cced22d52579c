"""The plan cache: one for :func:`dmatmul.matmul` and :class:`dmatmul.Matmul`,
on every backend.

A backend's plan is made once per key: the backend's ``key(spec, operands)``,
the :class:`dmatmul._problem.Spec` and whatever else its plan depends on (the
JAX backend: the operands' mesh and shardings; nvmath: the local blocks'
memory orders and where they live). Each backend has its shelf, bounded by
its ``cache_size``; past it the plan unused longest leaves.

Ownership: the cache owns every plan. What a Matmul (or one ``dm.matmul``
call) holds is a :class:`Borrowed` plan; returning it never frees the plan
(another Matmul, or the next call, may use it). A plan is freed when it has
left the cache and no borrow is left: at once where it leaves unborrowed,
else when its last borrow returns, and at :meth:`Plans.clear` (exit,
``dm.finalize()``).

Under several processes, where making and freeing a plan are collective (a
backend whose ``plans_collectively``: cuBLASMp's), every lookup gathers each
rank's key and the plans it no longer borrows, in one small allgather: the
ranks hit, miss and evict alike, and a plan that left is freed at the first
lookup after no rank borrows it (a Matmul may be freed on some ranks only,
its ``with`` block left by an exception there).

``dm.matmul``'s shortcut for a call like a recent one (:meth:`Plans.runner`)
keeps its runners with their plan: a plan that leaves takes them along.
A route :meth:`dmatmul.Matmul.autotune` kept is planned for its key from then
on (:meth:`Plans.tune`: the plan made with that kernel forced), until the
cache is cleared.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

from . import _runtime
from ._lru import LRU
from . import backends as _backends

__all__ = ["Plans", "Borrowed", "PLANS"]


class _Held:
    """A plan on its shelf, with its borrows and the runners made for it."""

    def __init__(self, plan: _backends.BackendPlan, serial: int, collective: bool) -> None:
        self.plan = plan
        self.serial = serial  # its shelf's count of plans made before it: one plan's number on every rank
        self.collective = collective  # freeing it is collective (several processes): all ranks free it together
        self.borrows = 0
        self.gone = False  # it left the cache
        self.freed = False

    def free(self) -> None:
        if not self.freed:
            self.freed = True
            self.plan.free()


class _Shelf:
    """One backend's plans."""

    def __init__(self) -> None:
        self.plans: LRU[_Held] = LRU()
        self.left: list[_Held] = []  # plans that left the cache while borrowed (on some rank)
        self.made = 0


class Borrowed(_backends.BackendPlan):
    """A borrow of a cached plan: what a :class:`dmatmul.Matmul` holds. Its
    ``free()`` returns the borrow; the plan's own attributes read through."""

    #: where Matmul.autotune kept this plan: (its timings, the model's pick), which explain() lists
    tuning: Any = None

    def __init__(self, held: _Held, plans: Plans, backend: str) -> None:
        self._held: _Held | None = held
        self._plans = plans
        self._backend = backend
        held.borrows += 1

    def _live(self) -> _backends.BackendPlan:
        if self._held is None:
            raise RuntimeError("dmatmul internal error: a returned plan borrow was used")
        return self._held.plan

    @property
    def backend_plan(self) -> _backends.BackendPlan:
        """The backend's plan borrowed (the one every borrow of it shares)."""
        return self._live()

    @property
    def algorithm(self) -> str:  # type: ignore[override]
        return self._live().algorithm

    @property
    def cost(self) -> Any:
        return self._live().cost

    def execute(self, operands: Any) -> Any:
        return self._live().execute(operands)

    def explain(self) -> list[str]:
        return self._live().explain()

    def repeat(self, operands: Any) -> Callable[[Any], Any] | None:
        return self._live().repeat(operands)

    def free(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._plans._give_back(held, self._backend)

    def __getattr__(self, name: str) -> Any:  # a backend's own attributes (spec, translation, local, ...)
        return getattr(self._live(), name)


class Plans:
    """The shelves of every backend (see the module's docstring)."""

    def __init__(self) -> None:
        self._shelves: dict[str, _Shelf] = {}
        self._lock = threading.RLock()  # a lookup, its make (collective ones) and evictions are one step
        self._runners: LRU[tuple[_Held, Callable[[Any], Any]]] = LRU()
        #: the route :meth:`dmatmul.Matmul.autotune` kept for a plan's key, where it is not the model's pick:
        #: (the kernel, what explain() says of the timings)
        self._tuned: LRU[tuple[Any, Any]] = LRU()

    def _shelf(self, name: str) -> _Shelf:
        with self._lock:
            return self._shelves.setdefault(name, _Shelf())

    def borrow(self, backend: _backends.Backend, spec: Any, operands: Any) -> Borrowed:
        """A borrow of ``backend``'s plan of ``spec`` on ``operands``, made now
        where the cache holds none."""
        if backend.cache_size <= 0 and not (backend.plans_collectively and spec.spmd):
            plan = backend.plan(spec, operands)
            if isinstance(plan, Borrowed):  # a plan the cache holds already (a backend's own, borrowed): this
                return plan                 # borrow is of it, and lives as long as it stays in the cache
            with self._lock:
                return Borrowed(self._keep(self._shelf(backend.name), backend, spec, None, plan, None), self,
                                backend.name)
        key = backend.key(spec, operands)
        tuned = self._tuned.get((backend.name, key))
        if tuned is not None and tuned[0] is not None:  # the route autotune kept: planned with its kernel forced
            from . import _plan

            with _plan.schedule(tuned[0]):
                borrowed = self.borrow(backend, spec, operands)
            borrowed.tuning = tuned[1]
            return borrowed
        shelf = self._shelf(backend.name)
        if not backend.plans_collectively:  # made outside the lock: threads plan different problems at once
            held = shelf.plans.get(key)
            if held is None:
                held = self._keep(shelf, backend, spec, key, backend.plan(spec, operands), None)
            with self._lock:
                return Borrowed(held, self, backend.name)
        with self._lock:
            idle: set[int] | None = None
            if spec.spmd:
                key, idle = self._agree(shelf, backend, key)
            held = shelf.plans.get(key)
            if held is None:
                held = self._keep(shelf, backend, spec, key, backend.plan(spec, operands), idle)
            return Borrowed(held, self, backend.name)

    def _agree(self, shelf: _Shelf, backend: _backends.Backend, key: Hashable) -> tuple[Hashable, set[int] | None]:
        """Several processes, collective plans: every rank's key (the same tuple
        on every rank, so the ranks hit, miss and evict alike), and the plans no
        rank borrows any more, which are freed now where they left the cache."""
        rt = _runtime.active()
        if rt is None or rt.size == 1:
            return key, None
        idle_here = [h.serial for h in (*shelf.plans.values(), *shelf.left) if h.borrows == 0]
        gathered = rt.comm.allgather((key, idle_here))
        keys = tuple(k for k, _ in gathered)
        backend.agree_keys(keys, rt.rank)
        idle = set.intersection(*(set(serials) for _, serials in gathered))
        for done in [h for h in shelf.left if h.serial in idle]:
            shelf.left.remove(done)
            done.free()
        return keys, idle

    def _keep(self, shelf: _Shelf, backend: _backends.Backend, spec: Any, key: Hashable, plan: _backends.BackendPlan,
              idle: set[int] | None) -> _Held:
        with self._lock:
            held = _Held(plan, shelf.made, backend.plans_collectively and spec.spmd)
            shelf.made += 1
        if backend.cache_size <= 0:  # no cache: the plan leaves at once, freed when its borrow returns
            held.gone = True
            shelf.left.append(held)
            return held
        kept = shelf.plans.add(key, held, bound=backend.cache_size,
                               on_evict=lambda old: self._leave(shelf, old, idle))
        if kept is not held:  # another thread made the same plan first: theirs is the one kept
            plan.free()
        return kept

    def _leave(self, shelf: _Shelf, held: _Held, idle: set[int] | None) -> None:
        held.gone = True
        if held.borrows == 0 if idle is None else held.serial in idle:
            held.free()
        else:
            with self._lock:
                shelf.left.append(held)

    def _give_back(self, held: _Held, backend: str) -> None:
        with self._lock:
            held.borrows -= 1
            shelf = self._shelves.get(backend)  # (none: cleared, and its plans with it)
            # (a collective one is freed by the next lookup, once no rank borrows it)
            if shelf is not None and held.borrows == 0 and held in shelf.left and not held.collective:
                shelf.left.remove(held)
                held.free()

    # -- dm.matmul's recent calls ---------------------------------------------------------------------------
    def keep_runner(self, key: Hashable, plan: Borrowed, run: Callable[[Any], Any], *, bound: int = 32) -> None:
        """Keep ``run`` (the ``repeat`` runner of ``plan``) for calls whose checks read ``key``."""
        held = plan._held
        if held is not None:
            self._runners.add(key, (held, run), bound=bound)

    def runner(self, key: Hashable) -> Callable[[Any], Any] | None:
        """The runner kept for ``key``, while its plan is in the cache."""
        found = self._runners.get(key)
        return None if found is None or found[0].gone else found[1]

    def tune(self, backend: _backends.Backend, spec: Any, operands: Any, kernel: Any, told: Any, *,
             modelled: bool, bound: int = 256) -> None:
        """Plan ``spec`` on operands keyed as ``operands`` with ``kernel`` from now on
        (:meth:`dmatmul.Matmul.autotune` kept it; ``told``: its timings, for
        explain()), or as the model picks where it kept the model's pick
        (``modelled``). Runners of recent calls are dropped: they hold the plan
        made before."""
        key = (backend.name, backend.key(spec, operands))
        with self._lock:
            self._tuned.add(key, (None if modelled else kernel, told), bound=bound)
            self._runners = LRU()

    # -- housekeeping -----------------------------------------------------------------------------------------
    def clear(self, backend: str | None = None) -> None:
        """Free every plan of ``backend`` (of every backend: None), cached or
        left while borrowed: at exit, ``dm.finalize()``, or on request."""
        with self._lock:
            self._tuned.clear()  # (what autotune kept is planned again as the model picks)
            names = list(self._shelves) if backend is None else [backend]
            held = []
            for name in names:
                shelf = self._shelves.pop(name, None)
                if shelf is not None:
                    held += [*shelf.plans.values(), *shelf.left]
        for h in held:
            h.gone = True
            try:
                h.free()
            except Exception:  # noqa: BLE001 - at exit a backend's library may already be gone
                pass

    def drop(self, backend: str, which: Callable[[_backends.BackendPlan], bool]) -> None:
        """Forget the plans of ``backend`` that ``which`` picks (their library's state went: nothing to free)."""
        shelf = self._shelf(backend)
        for h in shelf.plans.values():
            if which(h.plan):
                h.gone = True
        shelf.plans.keep_only(lambda h: not h.gone)

    def held(self, backend: str) -> list[_backends.BackendPlan]:
        """The plans of ``backend`` in the cache, the one unused longest first."""
        return [h.plan for h in self._shelf(backend).plans.values()]

    def left(self, backend: str) -> list[_backends.BackendPlan]:
        """The plans of ``backend`` that left the cache and wait for their borrows (not freed yet)."""
        return [h.plan for h in self._shelf(backend).left]


#: The one plan cache.
PLANS = Plans()
