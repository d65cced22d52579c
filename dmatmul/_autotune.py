"""``Matmul.autotune()``: the cost model's cheapest routes timed on this machine, the fastest kept.

The model ranks every route (a kernel with the moves that bring the operands
to it) and picks the cheapest; where two routes are close, or the model's
form misses what the machine pays (an operand laid out of cache, small GEMM
calls, a loaded host), the one it picks may be the slower. As nvmath-python's
``Matmul.autotune()`` does for its GEMM algorithms, ``autotune`` then plans
the ``candidates`` cheapest routes, one per (algorithm, schedule), runs each
once (compiling it), times them ``iterations`` times interleaved (one after
the other in each round, so that a burst of load falls on all alike), and
keeps the route of least median time. Under several processes every rank
times them alike and the slowest rank's time counts, so that every rank
keeps the same route. :meth:`dmatmul.Matmul.explain` then lists the timings.

Only backends whose plans the planner's kernels make can be tuned (the JAX
backend): cuBLASMp runs one algorithm per layout of its own.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import _plan, _runtime
from ._plans import PLANS
from .algorithms import kernels as registered_kernels

__all__ = ["Tuning", "Timed", "autotune", "candidates", "measure", "tune", "label"]


def label(kernel: _plan.Kernel) -> str:
    """``allgather/one_shot M,N->M``: a route's kernel, as ``dmatmul bench --sweep`` names it."""
    return f"{kernel.algorithm}/{kernel.schedule} {kernel.a},{kernel.b}->{kernel.d}"


@dataclasses.dataclass(frozen=True)
class Timed:
    """One route tuned: its kernel, the model's time for it, its median time here (s)."""

    kernel: _plan.Kernel
    predicted: float
    measured: float


@dataclasses.dataclass(frozen=True)
class Tuning:
    """What :func:`tune` timed, fastest first, and how many rounds."""

    routes: tuple[Timed, ...]
    iterations: int
    ranks: int = 1

    @property
    def chosen(self) -> Timed:
        return self.routes[0]

    def explain(self, modelled: _plan.Kernel) -> list[str]:
        """The lines :meth:`dmatmul.Matmul.explain` adds: each route timed, the model's pick marked."""
        slowest = " (the slowest rank's)" if self.ranks > 1 else ""
        count = f"{len(self.routes)} route{'s' if len(self.routes) > 1 else ''}"
        lines = [f"autotuned:  {count} timed, median of {self.iterations}{slowest}; kept the fastest"]
        for t in self.routes:
            mark = ", the model's pick" if t.kernel == modelled else ""
            lines.append(f"  {label(t.kernel):36s} {t.measured * 1e3:9.3f} ms measured, "
                         f"{t.predicted * 1e3:9.3f} ms predicted{mark}")
        return lines


def candidates(make: Callable[[_plan.Kernel | None], Any], count: int) -> list[tuple[_plan.Kernel, Any]]:
    """The ``count`` routes the model prices cheapest, one per (algorithm,
    schedule), the model's own pick first: ``(kernel, plan)``, each plan made
    by ``make(kernel)`` (None: the model's pick) with that kernel forced;
    ``make`` returns None where the kernel does not run on the product."""
    chosen = make(None)
    best: dict[tuple[str, str], tuple[float, _plan.Kernel, Any]] = {}
    own = chosen.cost.kernel
    best[(own.algorithm, own.schedule)] = (chosen.cost.time, own, chosen)
    for kernel in registered_kernels():
        if kernel == own:
            continue
        plan = make(kernel)
        if plan is None:
            continue
        key = (kernel.algorithm, kernel.schedule)
        held = best.get(key)
        if held is None or (plan.cost.time < held[0] and held[1] != own):
            if held is not None:
                held[2].free()
            best[key] = (plan.cost.time, kernel, plan)
        else:
            plan.free()
    ranked = sorted(best.values(), key=lambda t: (t[1] != own, t[0]))
    for _, _, plan in ranked[count:]:
        plan.free()
    return [(kernel, plan) for _, kernel, plan in ranked[:count]]


def measure(routes: Sequence[tuple[_plan.Kernel, Any]], run: Callable[[Any], Any], iterations: int) -> list[float]:
    """Each route's median time (s): ``run(plan)`` once untimed (compiling it),
    then ``iterations`` rounds, the routes one after the other in each."""
    for _, plan in routes:
        run(plan)
    times: list[list[float]] = [[] for _ in routes]
    for _ in range(iterations):
        for i, (_, plan) in enumerate(routes):
            t0 = time.perf_counter()
            run(plan)
            times[i].append(time.perf_counter() - t0)
    return [float(np.median(ts)) for ts in times]


def tune(routes: Sequence[tuple[_plan.Kernel, Any]], run: Callable[[Any], Any], iterations: int,
         what: str = "Matmul.autotune") -> Tuning:
    """Time ``run(plan)`` (blocking until its result is ready) for each route
    (:func:`measure`); under several processes each rank's medians are gathered
    and the slowest rank's counts. The routes fastest first."""
    medians = measure(routes, run, iterations)
    rt = _runtime.active()
    ranks = 1
    if rt is not None and rt.size > 1:
        _, shared = _runtime.agree_and_share(lambda: None, lambda _: medians, what)
        ranks = len(shared)
        medians = [max(rank[i] for rank in shared) for i in range(len(routes))]
    timed = [Timed(kernel, float(plan.cost.time), m) for (kernel, plan), m in zip(routes, medians)]
    order = sorted(range(len(timed)), key=lambda i: timed[i].measured)
    return Tuning(tuple(timed[i] for i in order), iterations, ranks)


def autotune(plan: Any, backend: Any, spec: Any, operands: Any, iterations: int, count: int) -> tuple[Any, Tuning]:
    """The route to keep among ``count`` candidates of ``backend``'s ``plan`` of
    ``spec`` on ``operands`` (a plan borrowed from the plan cache, each
    candidate's made there with its kernel forced), and the timings; every
    candidate but the one kept is returned to the cache, and the plan cache
    plans the product with the route kept from now on (:meth:`dmatmul._plans.Plans.tune`).
    The plan kept tells its timings (its ``tuning``: the timings and the model's pick)."""

    def make(kernel: _plan.Kernel | None) -> Any:
        if kernel is None:
            return plan
        try:
            with _plan.schedule(kernel):
                return PLANS.borrow(backend, spec, operands)
        except (ValueError, NotImplementedError):  # (the kernel does not run on this product)
            return None

    def run(p: Any) -> Any:
        d = p.execute(operands)
        return d.block_until_ready() if hasattr(d, "block_until_ready") else d

    routes = candidates(make, count)
    tuning = tune(routes, run, iterations)
    kept = next(p for kernel, p in routes if kernel == tuning.chosen.kernel)
    for _, p in routes:
        if p is not kept:
            p.free()
    told = (tuning, routes[0][0])
    # later plans of this product (another Matmul, dm.matmul) take the route kept
    PLANS.tune(backend, spec, operands, tuning.chosen.kernel, told, modelled=kept is plan)
    kept.tuning = told
    return kept, tuning
