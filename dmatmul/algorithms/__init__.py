"""The planner's algorithms, one module each, by name.

Each module holds one :class:`~dmatmul.algorithms.base.Algorithm`: the operand
roles it takes (its kernels, one per schedule), whether it runs on a 2-D
grid, and its cost, GEMM calls and memory. The planner
(:mod:`dmatmul._plan`) and the memory model ask :data:`ALGORITHMS` by name;
each backend keeps its own table of kernels by the same names (the JAX
backend's: :data:`dmatmul.backends.jax._kernels.BODIES`). Adding an
algorithm: one module here, registered below, and one kernel per backend that
runs it (docs/architecture.md, "Adding an algorithm").

Importing it loads nothing beyond the standard library.

>>> list(ALGORITHMS)
['local', 'allgather', 'reduce_scatter', 'allreduce', 'summa', 'summa25d']
>>> ALGORITHMS["summa"].grid, len(ALGORITHMS["allgather"].kernels)
(True, 12)
"""

from __future__ import annotations

from . import allgather, allreduce, local, reduce_scatter, summa, summa25d
from .base import SCHEDULES, Algorithm, Kernel

__all__ = ["ALGORITHMS", "Algorithm", "register", "unregister", "kernels"]

#: The algorithms by name, in order of preference on ties (the contract's order).
ALGORITHMS: dict[str, Algorithm] = {
    alg.name: alg
    for alg in (local.ALGORITHM, allgather.ALGORITHM, reduce_scatter.ALGORITHM, allreduce.ALGORITHM, summa.ALGORITHM,
                summa25d.ALGORITHM)
}


def register(algorithm: Algorithm) -> None:
    """Add ``algorithm`` under its name (last on ties); a name already taken raises."""
    if algorithm.name in ALGORITHMS:
        raise ValueError(f"an algorithm named {algorithm.name!r} is registered already")
    if any(kern.algorithm != algorithm.name for kern in algorithm.kernels):
        raise ValueError(f"algorithm {algorithm.name!r}: each of its kernels must carry its name")
    ALGORITHMS[algorithm.name] = algorithm


def unregister(name: str) -> None:
    """Remove the algorithm registered as ``name``."""
    del ALGORITHMS[name]


def kernels() -> tuple[Kernel, ...]:
    """Every registered kernel: each schedule's in turn (rings, one-shot,
    bidirectional), algorithm after algorithm in the registry's order (that
    order breaks cost ties).

    >>> [k.algorithm for k in kernels()][:4]
    ['local', 'local', 'local', 'allgather']
    """
    return tuple(kern for sched in SCHEDULES for alg in ALGORITHMS.values() for kern in alg.kernels
                 if kern.schedule == sched)
