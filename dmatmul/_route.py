"""Moving an array's elements between two layouts (backend-neutral, numpy).

:class:`Route` tells, from each layout's ``global_indices``, which rank sends
which part to which (the same tables on every rank); under ``mpiexec``
:func:`exchange` runs it: one MPI ``Alltoallv`` of exactly the elements each
rank lacks, nothing gathered whole. The re-lay (:mod:`dmatmul._relay`) counts
its moves with it (:mod:`dmatmul._relay_choice`) and runs them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from ._args import to_numpy
from ._distribution import Distribution
from ._sharded import Sharded
from ._spec import family

__all__ = ["Route", "as_nd", "exchange"]


def as_nd(d: Distribution, ndim: int, nranks: int) -> Sharded | Distribution:
    """``d`` laying out arrays of ``ndim`` dimensions: a Sharded of 2 entries (or
    a 2-D distribution) with the batch dimensions not split, where it has a
    Sharded form; else ``d`` (a 2-D distribution, every rank the whole batch)."""
    s = d if isinstance(d, Sharded) else Sharded.from_2d(d, nranks)
    if s is None:
        return d
    return s if s.ndim == ndim else Sharded(s.mesh, (None,) * (ndim - s.ndim) + s.spec)


def _indices(d: Distribution, rank: int, shape: tuple[int, ...], nranks: int) -> tuple[np.ndarray, ...]:
    """``rank``'s global ids per dimension of an array of ``shape`` laid out as
    ``d`` (a 2-D one: every batch index, then its matrix's)."""
    if d.ndim == len(shape):
        return tuple(d.global_indices(rank, shape, nranks))
    return (*(np.arange(s) for s in shape[:-2]), *d.global_indices(rank, shape[-2:], nranks))


def _key(ids: tuple[np.ndarray, ...]) -> tuple[bytes, ...]:
    return tuple(np.ascontiguousarray(i, dtype=np.int64).tobytes() for i in ids)


@dataclasses.dataclass(frozen=True)
class Route:
    """Which rank sends which part to which (the same tables on every rank):
    ``parts[s]``: ``(sender, ids per dimension)`` of the parts rank ``s`` gets."""

    src: tuple[tuple[np.ndarray, ...], ...]
    dst: tuple[tuple[np.ndarray, ...], ...]
    parts: tuple[tuple[tuple[int, tuple[np.ndarray, ...]], ...], ...]

    @classmethod
    def of(cls, src: Distribution, dst: Distribution, shape: tuple[int, ...], nranks: int) -> Route:
        s_ids = tuple(_indices(src, r, shape, nranks) for r in range(nranks))
        d_ids = tuple(_indices(dst, r, shape, nranks) for r in range(nranks))
        holders: dict[tuple[bytes, ...], list[int]] = {}  # the ranks that hold one same block
        for r, ids in enumerate(s_ids):
            holders.setdefault(_key(ids), []).append(r)
        parts = []
        for s in range(nranks):
            got = []
            for group in holders.values():
                sender = s if s in group else group[s % len(group)]  # spread the replicas' sends
                common = tuple(np.intersect1d(a, b, assume_unique=True) for a, b in zip(s_ids[group[0]], d_ids[s]))
                if all(len(c) for c in common):
                    got.append((sender, common))
            parts.append(tuple(got))
        return cls(s_ids, d_ids, tuple(parts))

    def received(self, rank: int) -> int:
        """The elements ``rank`` gets from other ranks."""
        return sum(int(np.prod([len(c) for c in ids])) for sender, ids in self.parts[rank] if sender != rank)

    @functools.cached_property
    def moves(self) -> bool:
        """Whether any rank gets any element from another (the same answer on
        every rank: where none does, the ranks skip the collective alike)."""
        return any(self.received(r) for r in range(len(self.parts)))


def _positions(held: tuple[np.ndarray, ...], ids: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    return tuple(np.searchsorted(h, i) for h, i in zip(held, ids))


def _size(ids: tuple[np.ndarray, ...]) -> int:
    return int(np.prod([len(i) for i in ids]))


def _displacements(counts: np.ndarray) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(counts)[:-1])).astype(counts.dtype)


def exchange(x: Any, route: Route, rank: int, comm: Any, dtype: Any) -> np.ndarray:
    """This rank's block ``x`` under ``route``'s source layout -> its block under
    the destination's: one ``Alltoallv`` of exactly the parts each rank lacks
    (its own parts copied here), packed into one contiguous buffer per side.

    The buffers go as bytes (counts scaled by the itemsize): exact for every
    dtype, those MPI has no type for (bfloat16, FP8, complex in some MPIs)
    included, and nothing is pickled."""
    # a CuPy block goes through the host: the MPI under mpi4py is not assumed CUDA-aware
    x = x.get() if family(x) == "cupy" else to_numpy(x, "x")
    dt = np.dtype(dtype)
    x = x.astype(dt, copy=False)
    size = len(route.parts)
    out = np.empty(tuple(len(i) for i in route.dst[rank]), dtype=dt)
    for sender, ids in route.parts[rank]:
        if sender == rank:
            out[np.ix_(*_positions(route.dst[rank], ids))] = x[np.ix_(*_positions(route.src[rank], ids))]
    if size == 1 or not route.moves:
        return out
    # the parts rank s gets from this rank, in route.parts[s]'s order (the order s unpacks them in)
    outgoing = [[ids for sender, ids in route.parts[s] if sender == rank] for s in range(size)]
    outgoing[rank] = []
    incoming = [[ids for sender, ids in route.parts[rank] if sender == s] for s in range(size)]
    incoming[rank] = []
    send_n = np.array([sum(_size(ids) for ids in parts) for parts in outgoing], dtype=np.int64)
    recv_n = np.array([sum(_size(ids) for ids in parts) for parts in incoming], dtype=np.int64)
    send = np.empty(int(send_n.sum()), dtype=dt)
    at = 0
    for parts in outgoing:
        for ids in parts:
            n = _size(ids)
            send[at:at + n] = x[np.ix_(*_positions(route.src[rank], ids))].reshape(-1)
            at += n
    recv = np.empty(int(recv_n.sum()), dtype=dt)
    item = dt.itemsize
    send_b, recv_b = send_n * item, recv_n * item
    comm.Alltoallv([send.view(np.uint8), (send_b, _displacements(send_b))],
                   [recv.view(np.uint8), (recv_b, _displacements(recv_b))])
    at = 0
    for parts in incoming:
        for ids in parts:
            n = _size(ids)
            out[np.ix_(*_positions(route.dst[rank], ids))] = recv[at:at + n].reshape(tuple(len(i) for i in ids))
            at += n
    return out
