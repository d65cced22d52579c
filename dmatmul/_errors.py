"""Exception types of dmatmul (re-exported by :mod:`dmatmul`)."""

from __future__ import annotations

__all__ = ["DistributionError", "PlanFreedError"]


class DistributionError(ValueError):
    """A distribution, a process grid or a local block does not fit the problem.

    A subclass of :class:`ValueError`, so ``except ValueError`` catches it too.
    """


class PlanFreedError(RuntimeError):
    """A :class:`dmatmul.Matmul` plan was used after :meth:`~dmatmul.Matmul.free`."""
