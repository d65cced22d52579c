"""Products that read no A nor B: no communication, no GEMM, on any backend.

K = 0, or ``alpha == 0`` (BLAS: A and B are not read, so NaN or Inf in them
does not reach the result): every rank's result block is
``epilog(beta*C [+ bias])`` (zeros without C), computed where C lies;
M = 0 or N = 0: an empty block. The
front end plans these here instead of on a backend; the backend the product
would run on still says how many ranks there are, so a grid that does not fit
is refused exactly as it would be there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _runtime
from . import backends as _backends
from ._epilogue import apply as epilogue_apply
from ._epilogue import work_dtype
from ._problem import Spec
from ._spec import Operands, array_module, check_fit, numpy_dtype, precise

__all__ = ["EmptyProduct", "EmptyPlan"]


class EmptyProduct(_backends.Backend):
    """The "backend" of a product that reads no A nor B (:attr:`Spec.reads_ab`),
    standing in for ``backend``."""

    name = "none (empty product)"
    cache_size = 0  # planned at every call: its plan is no more than the refusals of the backend it stands for

    def __init__(self, backend: Any) -> None:
        self.backend = backend  # the one the product would run on: it says how many ranks there are

    def plan(self, spec: Spec, operands: Operands) -> EmptyPlan:
        ranks = self.backend.ranks(spec, operands)  # (refuses operands whose layout the backend refuses)
        if spec.distributions is not None:
            check_fit(spec.distributions, ranks, spmd=spec.spmd)
        if spec.algorithm != "auto":
            # a named algorithm fits the layouts (given, or those the planner would pick) and the rank count or
            # not whatever the sizes: as for one element each
            self.backend.fits(dataclasses.replace(spec, a_shape=_at_least_1(spec.a_shape), b_shape=_at_least_1(spec.b_shape)),
                              operands)
        return EmptyPlan(spec, self.backend.place)

    def ranks(self, spec: Spec, operands: Operands) -> int:
        return int(self.backend.ranks(spec, operands))

    def lay_out(self, d: Any, dist: Any, operands: Operands) -> Any:
        return self.backend.lay_out(d, dist, operands)


def _at_least_1(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(max(d, 1) for d in shape)


class EmptyPlan(_backends.BackendPlan):
    algorithm = "local"
    cost = None  # nothing is communicated

    def __init__(self, spec: Spec, place: Callable[[Any, Spec, Operands], Any] | None = None) -> None:
        self.spec = spec
        self.place = place  # the backend's ``place``, where it has one

    def execute(self, operands: Operands) -> Any:
        spec = self.spec
        dist = spec.distributions[2] if spec.distributions is not None else None
        rt = _runtime.active() if spec.spmd else None
        if rt is not None and dist is not None:
            rows, cols = dist.global_indices(rt.rank, (spec.m, spec.n), rt.size)
        else:
            rows, cols = np.arange(spec.m), np.arange(spec.n)
        xp = array_module(operands.family)
        with precise(spec.result_dtype):  # a backend's library makes the result as it is (JAX: 64-bit under x64)
            return self._place(self._compute(xp, operands, rows, cols), operands)

    def _place(self, result: Any, operands: Operands) -> Any:
        """One process: the result where the backend would put one with elements."""
        return result if self.place is None or self.spec.spmd else self.place(result, self.spec, operands)

    def _compute(self, xp: Any, operands: Operands, rows: Any, cols: Any) -> Any:
        spec = self.spec
        acc = xp.zeros((len(rows), len(cols)), dtype=work_dtype(numpy_dtype(spec.result_dtype)))
        bias = None
        if spec.has_bias:
            at = cols if spec.bias_columns else rows  # a bias of shape (1, N) holds one value per result column
            bias = xp.asarray(operands.bias).reshape(-1)[xp.asarray(at)] if len(at) else xp.zeros((0,))
        return epilogue_apply(
            xp, acc, alpha=spec.alpha, beta=spec.beta, c=xp.asarray(operands.c) if spec.use_c else None,
            bias=bias, epilog=spec.epilog, out_dtype=numpy_dtype(spec.result_dtype), bias_columns=spec.bias_columns,
        )

    def explain(self) -> list[str]:
        s = self.spec
        if 0 in (s.m, s.n):
            what = "M or N = 0: an empty result"
        elif s.k == 0:
            what = "K = 0: the result is epilog(beta*C [+ bias])"
        else:
            what = "alpha = 0: A and B are not read (BLAS); the result is epilog(beta*C [+ bias])"
        return [f"kernel:     none: {what}; nothing moves"]

    def free(self) -> None:
        pass
