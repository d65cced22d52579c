"""Batched products: ``(..., M, K) @ (..., K, N)``, the batch dimensions
broadcast as ``numpy.matmul`` does, on the 2-D machinery of every backend.

A batched :class:`Spec` is planned here (:class:`BatchedProduct`, standing in
for the backend as :class:`dmatmul._empty.EmptyProduct` does): a backend that
runs a batch in one program of its own says so by its ``batched`` (the JAX
backend: the batch split over the devices, or the matrix plan under
``jax.vmap`` in one compiled call); any other (nvmath, whose cuBLASMp has no
batched GEMM; JAX under mpiexec) runs the batch as ONE matrix product where
only a or only b holds a batch and the distributions allow it
(:class:`FoldPlan`, :mod:`dmatmul._fold`), else one plan of the matrix
product (:meth:`Spec.item`), made once, on each item in turn
(:class:`LoopPlan`). The distributions of a batched product describe the
last two dimensions: every rank holds the whole batch of its blocks, so the
ranks fold or loop alike and each item's collectives meet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import _runtime
from . import backends as _backends
from ._empty import EmptyProduct
from ._fold import Fold, fold_of
from ._plans import PLANS
from ._problem import Spec
from ._spec import Operands, array_module, family, numpy_dtype, precise

__all__ = ["BatchedProduct", "FoldPlan", "LoopPlan", "route"]


def route(backend: Any, spec: Spec) -> Any:
    """What plans ``spec``: :class:`BatchedProduct` for a batch, else the backend,
    or :class:`EmptyProduct` where A and B are not read (a Sharded the backends
    do not take as it is: :class:`dmatmul._relay.ShardedProduct` first, the
    front end's :meth:`Matmul._routed`)."""
    if spec.batch_shape:
        return BatchedProduct(backend)
    return backend if spec.reads_ab else EmptyProduct(backend)


def _items(spec: Spec) -> Iterator[tuple[int, ...]]:
    return iter(np.ndindex(*spec.batch_shape))


class BatchedProduct(_backends.Backend):
    """The "backend" of a batched product, standing in for ``backend``. Its plans
    are made at every call (a loop, or the backend's batched program, around
    plans the cache holds), so the cache keeps none of its own."""

    cache_size = 0

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.name = backend.name
        self.plans_collectively = backend.plans_collectively

    def _item_backend(self, item: Spec) -> Any:
        return self.backend if item.reads_ab else EmptyProduct(self.backend)

    def plan(self, spec: Spec, operands: Operands) -> _backends.BackendPlan:
        if spec.batch_size == 0:
            # refused as an empty matrix product is (a grid of another rank count, an algorithm that does not fit)
            EmptyProduct(self.backend).plan(spec.item(), operands)
            return NoItems(spec, operands, self.backend.place)
        own = self.backend.batched(spec, operands) if self._own(spec) else None
        if own is not None:
            return own
        fold = self._fold(spec)
        if isinstance(fold, Fold):
            return FoldPlan(fold, self.backend, operands)
        return LoopPlan(spec, self._item_backend(spec.item()), operands, fold)

    def _own(self, spec: Spec) -> bool:
        """Whether the backend runs the batch in a program of its own."""
        return spec.reads_ab and self.backend.batches(spec)

    @staticmethod
    def _fold(spec: Spec) -> Fold | str:
        """How the batch runs as one matrix product, or why it does not."""
        return fold_of(spec) if spec.reads_ab else "A and B are not read (alpha = 0, or an empty product)"

    def ranks(self, spec: Spec, operands: Operands) -> int:
        # (an empty batch has no first item: its operands as they are, as its plan asks them)
        return self.backend.ranks(spec.item(), operands if spec.batch_size == 0 else _first(spec, operands))

    def lay_out(self, d: Any, dist: Any, operands: Operands) -> Any:
        return self.backend.lay_out(d, dist, operands)

    def place(self, result: Any, spec: Spec, operands: Operands) -> Any:
        return result

    def memory(self, spec: Spec, operands: Operands) -> tuple[list[Any], dict[str, Any]]:
        """The needs of one item's plan, the result's times the batch (the items
        run one after another; their results are all kept)."""
        if spec.batch_size == 0:
            return [], {}
        # (a backend that batches itself is not asked to fold: fold_of's rank-by-rank check counts processes)
        fold = None if self._own(spec) else self._fold(spec)
        if isinstance(fold, Fold):
            return self.backend.memory(fold.spec, fold.operands(operands))
        needs, probes = self._item_backend(spec.item()).memory(spec.item(), _first(spec, operands))
        return [_times(need, spec.batch_size) if need.operand == "d" else need for need in needs], probes

    def preview(self, spec: Spec, operands: Operands) -> tuple[str, list[str]]:
        if spec.batch_size == 0:
            return "local", NoItems(spec, operands).explain()
        fold = None if self._own(spec) else self._fold(spec)
        if isinstance(fold, Fold):
            algorithm, lines = self.backend.preview(fold.spec, fold.operands(operands))
            return algorithm, [fold.line(), *lines]
        algorithm, lines = self._item_backend(spec.item()).preview(spec.item(), _first(spec, operands))
        if fold is None:
            return algorithm, [_own_line(spec), *lines]
        return algorithm, [_loop_line(spec, fold), *lines]


def _times(need: Any, count: int) -> Any:
    return dataclasses.replace(need, nbytes=need.nbytes * count)


def _first(spec: Spec, operands: Operands) -> Operands:
    return spec.item_operands(operands, (0,) * len(spec.batch_shape))


def _own_line(spec: Spec) -> str:
    return (f"batch:      {spec.batch_shape} ({spec.batch_size} items of the matrix product below): run by the "
            f"backend's own batched program")


def _loop_line(spec: Spec, why: Fold | str) -> str:
    return (f"batch:      {spec.batch_shape} ({spec.batch_size} items of the matrix product below): one plan, "
            f"run on each item in turn (this backend has no batched kernel, and the batch does not fold into one "
            f"product: {why}); the batch is not split over ranks")


class LoopPlan(_backends.BackendPlan):
    """One plan of the matrix product, run on each item of the batch."""

    def __init__(self, spec: Spec, backend: Any, operands: Operands, why: Fold | str) -> None:
        self.spec = spec
        self.why = why
        self.plan = PLANS.borrow(backend, spec.item(), _first(spec, operands))  # (one matrix plan, cached)
        self.algorithm = self.plan.algorithm

    @property
    def cost(self) -> Any:
        """The matrix plan's cost times the batch size: it runs once per item."""
        one = self.plan.cost
        count = self.spec.batch_size
        if one is None or count == 1:
            return one
        moves = tuple(dataclasses.replace(m, nbytes=m.nbytes * count, messages=m.messages * count,
                                          collectives=m.collectives * count) for m in one.moves)
        return dataclasses.replace(
            one, moves=moves, kernel_bytes=one.kernel_bytes * count, kernel_messages=one.kernel_messages * count,
            flops=one.flops * count, time=one.time * count, kernel_collectives=one.kernel_collectives * count)

    def execute(self, operands: Operands) -> Any:
        spec = self.spec
        results = [self.plan.execute(spec.item_operands(operands, idx)) for idx in _items(spec)]
        xp = array_module(operands.family if not spec.spmd else family(results[0]))
        with precise(spec.dtype):
            return xp.stack(results).reshape(spec.batch_shape + tuple(results[0].shape))

    def explain(self) -> list[str]:
        return [_loop_line(self.spec, self.why), *self.plan.explain()]

    def free(self) -> None:
        self.plan.free()


class FoldPlan(_backends.BackendPlan):
    """A batch run as one matrix product (:class:`dmatmul._fold.Fold`): one plan
    of the folded product, run once on the folded operands; its cost is the
    folded GEMM's."""

    def __init__(self, fold: Fold, backend: Any, operands: Operands) -> None:
        self.fold = fold
        self.spec = fold.batched
        self.plan = PLANS.borrow(backend, fold.spec, fold.operands(operands))  # (cached, as any matrix plan)
        self.algorithm = self.plan.algorithm

    @property
    def cost(self) -> Any:
        return self.plan.cost

    def execute(self, operands: Operands) -> Any:
        with precise(self.spec.dtype):
            return self.fold.result(self.plan.execute(self.fold.operands(operands)), operands)

    def explain(self) -> list[str]:
        return [self.fold.line(), *self.plan.explain()]

    def free(self) -> None:
        self.plan.free()


class NoItems(_backends.BackendPlan):
    """A batch of no items: an empty result of the batch's shape (this rank's
    block of each matrix under several processes), in one process where the
    backend puts a result (``place``: a jax.Array on the devices in use)."""

    def __init__(self, spec: Spec, operands: Operands, place: Any = None) -> None:
        self.spec = spec
        self.place = place

    def execute(self, operands: Operands) -> Any:
        spec = self.spec
        shape: tuple[int, ...] = (spec.m, spec.n)
        rt = _runtime.active() if spec.spmd else None
        if rt is not None and spec.distributions is not None:
            shape = spec.distributions[2].shape(rt.rank, shape, rt.size)
        xp = array_module(operands.family)
        with precise(spec.result_dtype):  # (FP8 a and b: the result type)
            d = xp.zeros(spec.batch_shape + tuple(shape), dtype=numpy_dtype(spec.result_dtype))
            return d if rt is not None or self.place is None else self.place(d, spec, operands)

    def explain(self) -> list[str]:
        return [f"kernel:     none: the batch {self.spec.batch_shape} holds no item; nothing moves"]
