"""Distributions of a global matrix over ranks: pure Python, no GPU, MPI or JAX.

Semantics follow ``nvmath.distributed.distribution`` (nvmath-python 1.0), so a
``Slab.X`` means the same on every backend. Conventions used throughout:

* Matrices are 2-D; dimension 0 is rows, dimension 1 is columns.
* Ranks are numbered ``0 .. nranks-1``. A :class:`ProcessGrid` maps grid
  coordinates ``(r, c)`` to ranks in ``"row"`` order (``rank = r*cols + c``) or
  ``"col"`` order (``rank = r + c*rows``), through :mod:`dmatmul.layout`.
* A rank's local block holds the global rows and columns that
  :meth:`Distribution.global_indices` lists, in that (increasing) order.
* A distribution describes the *stored* matrix: with ``transpose_a=True`` the
  distribution of ``a`` is that of the stored ``(K, M)`` matrix.

Worked examples (read off nvmath 1.0)::

    >>> [Slab.X.shape(r, (10, 6), nranks=4) for r in range(4)]
    [(3, 6), (3, 6), (2, 6), (2, 6)]
    >>> g = ProcessGrid((2, 2), layout="col")
    >>> [BlockCyclic(g, (3, 2)).shape(r, (10, 7)) for r in range(4)]
    [(6, 4), (4, 4), (6, 3), (4, 3)]
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from . import _world
from ._args import MAX_RANKS, as_int, as_pair, one_of, to_numpy
from ._errors import DistributionError
from ._grid import ProcessGrid

__all__ = [
    "Distribution",
    "ProcessGrid",
    "Slab",
    "BlockNonCyclic",
    "BlockCyclic",
    "Replicated",
    "split",
    "join",
    # the argument checks the callers of this module use too
    "one_of",
    "to_numpy",
]


def _global_shape(global_shape: Any) -> tuple[int, int]:
    return as_pair(global_shape, "global_shape", minimum=0)


# --------------------------------------------------------------------------- #
# one-dimensional partitions (the per-dimension building blocks)
# --------------------------------------------------------------------------- #
def slab_extent(size: int, parts: int, index: int) -> tuple[int, int]:
    """``(start, length)`` of part ``index`` when ``size`` items split in ``parts``.

    nvmath's rule: every part gets ``size // parts`` and the first
    ``size % parts`` parts one more.

    >>> [slab_extent(10, 4, p) for p in range(4)]
    [(0, 3), (3, 3), (6, 2), (8, 2)]
    """
    base, extra = divmod(size, parts)
    return index * base + min(index, extra), base + (index < extra)


def numroc(n: int, nb: int, iproc: int, isrcproc: int, nprocs: int) -> int:
    """ScaLAPACK's NUMROC: how many of ``n`` items, dealt in blocks of ``nb``
    round-robin over ``nprocs`` processes starting at ``isrcproc``, land on
    process ``iproc``.

    >>> [numroc(10, 3, p, 0, 2) for p in range(2)]
    [6, 4]
    """
    mydist = (nprocs + iproc - isrcproc) % nprocs
    nblocks, rest = divmod(n, nb)
    count = (nblocks // nprocs) * nb
    extra = nblocks % nprocs
    if mydist < extra:
        count += nb
    elif mydist == extra:
        count += rest
    return count


def _cyclic_indices(n: int, nb: int, iproc: int, isrcproc: int, nprocs: int) -> np.ndarray:
    """Global ids held by ``iproc`` under a 1-D block-cyclic deal (local order)."""
    mydist = (nprocs + iproc - isrcproc) % nprocs
    nb = min(nb, max(n, 1))  # a block longer than n holds all n, as a block of n does (and the ids stay int64)
    starts = np.arange(mydist * nb, n, nprocs * nb)
    ids = (starts[:, None] + np.arange(nb)[None, :]).ravel()
    return ids[ids < n]


# --------------------------------------------------------------------------- #
# distributions
# --------------------------------------------------------------------------- #
class Distribution:
    """Base class: how a global 2-D matrix is laid out over ranks.

    Subclasses are immutable values: equal distributions compare and hash
    equal. Subclasses define :meth:`_dim_indices` (the global ids along one
    matrix dimension that a rank holds), :meth:`_dim_length` (how many, without
    listing them) and, if gridded, :attr:`grid`.
    """

    grid: ProcessGrid | None = None

    @property
    def ndim(self) -> int:
        """The number of dimensions of the arrays it lays out (2: matrices)."""
        return 2

    def _span(self) -> tuple[int, str, str] | None:
        """``(ranks, "its grid (2, 4)", "grid")`` where the distribution fixes
        its own rank count, else None."""
        return None if self.grid is None else (self.grid.size, f"its grid {self.grid.shape}", "grid")

    def _parse_shape(self, global_shape: Any) -> tuple[int, ...]:
        """``global_shape`` checked: one size >= 0 per dimension."""
        return _global_shape(global_shape)

    def _replica_groups(self, nranks: int) -> list[list[int]]:
        """The groups of (more than one) ranks that hold the same block."""
        return []

    def nranks(self, nranks: int | None = None) -> int:
        """The number of ranks this distribution spans.

        A grid's (or mesh's) own size wins; ``nranks`` must then agree with it.
        Without one, ``nranks`` is used, else the size of an active
        multi-process run.
        """
        span = self._span()
        if span is not None:
            size, its, kind = span
            if nranks is not None and as_int(nranks, "nranks", minimum=1) != size:
                raise DistributionError(
                    f"{self!r} spans {size} ranks ({its}) but nranks={nranks}: use a {kind} of {nranks} ranks"
                )
            return size
        if nranks is not None:
            return as_int(nranks, "nranks", minimum=1, maximum=MAX_RANKS)
        world = _world.world_size()
        if world is None:
            raise DistributionError(
                f"{self!r} has no process grid and no multi-process run is active: "
                "pass nranks=<number of ranks>"
            )
        return world

    def _check(self, rank: Any, global_shape: Any, nranks: int | None) -> tuple[int, tuple[int, int], int]:
        shape = _global_shape(global_shape)
        p = self.nranks(nranks)
        rank = as_int(rank, "rank", minimum=0)
        if rank >= p:
            raise DistributionError(f"rank must be in [0, {p}) for {self!r}, got {rank}")
        return rank, shape, p

    def global_indices(
        self, rank: int, global_shape: Sequence[int], nranks: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, cols)``: the global row and column ids held by ``rank``, in
        local order (``local[i, j] == global[rows[i], cols[j]]``)."""
        rank, shape, p = self._check(rank, global_shape, nranks)
        return self._dim_indices(0, rank, shape[0], p), self._dim_indices(1, rank, shape[1], p)

    def shape(self, rank: int, global_shape: Sequence[int], nranks: int | None = None) -> tuple[int, int]:
        """The local shape of ``rank``'s block (counted, not listed: any global shape)."""
        rank, shape, p = self._check(rank, global_shape, nranks)
        return self._dim_length(0, rank, shape[0], p), self._dim_length(1, rank, shape[1], p)

    def _dim_indices(self, dim: int, rank: int, size: int, nranks: int) -> np.ndarray:
        raise NotImplementedError

    def _dim_length(self, dim: int, rank: int, size: int, nranks: int) -> int:
        """``len(self._dim_indices(...))``, without making the list."""
        raise NotImplementedError

    def global_shape(self, local_shapes: Sequence[tuple[int, int]]) -> tuple[int, int]:
        """The global shape whose blocks have ``local_shapes`` (``local_shapes[r]``
        is rank ``r``'s), as nvmath infers it from one allgather of local shapes.

        Raises :class:`DistributionError` naming the first rank whose block does
        not fit the inferred shape (and, where another global shape blames as
        few ranks, other ones, that one's first too: the blocks cannot tell
        which rank is wrong).

        >>> Slab.X.global_shape([(3, 6), (3, 6), (2, 6), (2, 6)])
        (10, 6)
        >>> Slab.X.global_shape([(2, 6), (3, 6)])
        Traceback (most recent call last):
        ...
        dmatmul._errors.DistributionError: the block of rank 1 has shape (3, 6) but Slab.X over 2 ranks gives it (2, 6) for the global shape (4, 6) implied by the other blocks; or the block of rank 0 has shape (2, 6) but Slab.X over 2 ranks gives it (3, 6) for the global shape (6, 6) (the blocks cannot tell which)
        """
        shapes = [tuple(int(x) for x in s) for s in local_shapes]
        p = self.nranks(len(shapes))
        guess = self._infer_extents(shapes)
        if not self._misfits(shapes, guess, p):
            return guess
        # blame the fewest ranks: the global shape that fits the most blocks, near the first guess
        extents = [self._best_extents(dim, shapes, guess[dim], p) for dim in (0, 1)]
        best = (extents[0][0], extents[1][0])
        bad = self._misfits(shapes, best, p) or self._misfits(shapes, guess, p)
        error = self._misfit_error(shapes, best, bad, "implied by the other blocks")
        for other in itertools.product(extents[0], extents[1]):  # as few misfits elsewhere: name those too
            blamed = self._misfits(shapes, other, p)
            if blamed and len(blamed) == len(bad) and blamed != bad:
                raise DistributionError(
                    f"{error}; or {self._misfit_error(shapes, other, blamed, '(the blocks cannot tell which)')}"
                )
        raise error

    def check_blocks(self, local_shapes: Sequence[Sequence[int]], global_shape: tuple[int, ...], why: str) -> None:
        """Raise :class:`DistributionError` naming the first rank whose block
        (``local_shapes[r]``) does not fit a global shape known otherwise (``why``
        says how).

        >>> Slab.X.check_blocks([(3, 7), (2, 7), (3, 7), (2, 7)], (11, 7), "from a")
        Traceback (most recent call last):
        ...
        dmatmul._errors.DistributionError: the block of rank 1 has shape (2, 7) but Slab.X over 4 ranks gives it (3, 7) for the global shape (11, 7) from a
        """
        shapes = [tuple(int(x) for x in s) for s in local_shapes]
        bad = self._misfits(shapes, global_shape, self.nranks(len(shapes)))
        if bad:
            raise self._misfit_error(shapes, global_shape, bad, why)

    def _misfit_error(
        self, shapes: list[tuple[int, ...]], global_shape: tuple[int, ...], bad: list[int], why: str
    ) -> DistributionError:
        rank, p = bad[0], len(shapes)
        want = self.shape(rank, global_shape, p)
        others = f" (ranks {', '.join(map(str, bad))} do not fit)" if len(bad) > 1 else ""
        return DistributionError(
            f"the block of rank {rank} has shape {shapes[rank]} but {self!r} over {p} ranks gives it {want} "
            f"for the global shape {global_shape} {why}{others}"
        )

    def _misfits(self, shapes: list[tuple[int, ...]], global_shape: tuple[int, ...], p: int) -> list[int]:
        return [r for r, got in enumerate(shapes) if got != self.shape(r, global_shape, p)]

    def _best_extents(self, dim: int, shapes: list[tuple[int, ...]], guess: int, p: int) -> list[int]:
        """The extents of ``dim`` whose local sizes match the most ranks, nearest ``guess`` first."""
        blocks = getattr(self, "block_sizes", (1, 1))
        window = min(max(2, blocks[dim]), guess + 2) + 2  # (a block longer than the matrix: not beyond twice it)
        misses = {size: sum(self._dim_length(dim, r, size, p) != s[dim] for r, s in enumerate(shapes))
                  for size in range(max(0, guess - window), guess + window + 1)}
        fewest = min(misses.values())
        return sorted((size for size, n in misses.items() if n == fewest), key=lambda size: abs(size - guess))

    def _infer_extents(self, shapes: list[tuple[int, ...]]) -> tuple[int, int]:
        return shapes[0][0], shapes[0][1]


@dataclasses.dataclass(frozen=True)
class Slab(Distribution):
    """A 1-D split of dimension ``dim`` (``Slab.X``: rows, ``Slab.Y``: columns).

    Rank ``p`` of ``P`` holds the contiguous part ``slab_extent(S, P, p)`` of
    that dimension (``S//P`` items, one more for the first ``S%P`` ranks) and
    all of the other dimension.

    >>> Slab.Y.global_indices(1, (2, 5), nranks=2)
    (array([0, 1]), array([3, 4]))
    """

    dim: int
    X: ClassVar[Slab]
    Y: ClassVar[Slab]

    def __post_init__(self) -> None:
        dim = as_int(self.dim, "Slab dim", minimum=0)
        if dim not in (0, 1):
            raise DistributionError(f"Slab dim must be 0 (rows, Slab.X) or 1 (columns, Slab.Y), got {dim!r}")
        object.__setattr__(self, "dim", dim)

    def _dim_indices(self, dim: int, rank: int, size: int, nranks: int) -> np.ndarray:
        if dim != self.dim:
            return np.arange(size)
        start, length = slab_extent(size, nranks, rank)
        return np.arange(start, start + length)

    def _dim_length(self, dim: int, rank: int, size: int, nranks: int) -> int:
        return slab_extent(size, nranks, rank)[1] if dim == self.dim else size

    def _infer_extents(self, shapes: list[tuple[int, ...]]) -> tuple[int, int]:
        split = sum(s[self.dim] for s in shapes)
        return (split, shapes[0][1]) if self.dim == 0 else (shapes[0][0], split)

    def __repr__(self) -> str:
        return "Slab.X" if self.dim == 0 else "Slab.Y"


Slab.X = Slab(0)
Slab.Y = Slab(1)


@dataclasses.dataclass(frozen=True)
class Replicated(Distribution):
    """Every rank holds the whole matrix."""

    def _dim_indices(self, dim: int, rank: int, size: int, nranks: int) -> np.ndarray:
        return np.arange(size)

    def _dim_length(self, dim: int, rank: int, size: int, nranks: int) -> int:
        return size

    def _replica_groups(self, nranks: int) -> list[list[int]]:
        return [list(range(nranks))] if nranks > 1 else []

    def __repr__(self) -> str:
        return "Replicated()"


class _GridDistribution(Distribution):
    grid: ProcessGrid
    first_process: tuple[int, int]

    def _init_grid(self, grid: Any, first_process: Any) -> None:
        if not isinstance(grid, ProcessGrid):
            raise TypeError(f"{type(self).__name__} grid must be a dm.ProcessGrid, got {grid!r}")
        if grid.ndim != 2:
            raise DistributionError(
                f"{type(self).__name__} needs a 2-D ProcessGrid, got shape {grid.shape}: "
                f"use ProcessGrid(({grid.size}, 1)) or ProcessGrid({(1, grid.size)}) for a 1-D split"
            )
        fp = as_pair(first_process, "first_process", minimum=0)
        for i in range(2):
            if fp[i] >= grid.shape[i]:
                raise DistributionError(
                    f"first_process[{i}] must be in [0, {grid.shape[i]}) for grid {grid.shape}, got {fp[i]}"
                )
        object.__setattr__(self, "grid", grid)
        object.__setattr__(self, "first_process", fp)

    def _infer_extents(self, shapes: list[tuple[int, ...]]) -> tuple[int, int]:
        # rows: down the first grid column; columns: along the first grid row
        first_col, first_row = self.grid.groups(0)[0], self.grid.groups(1)[0]
        return sum(shapes[r][0] for r in first_col), sum(shapes[r][1] for r in first_row)


@dataclasses.dataclass(frozen=True, init=False, repr=False)
class BlockNonCyclic(_GridDistribution):
    """One contiguous block per rank on a 2-D :class:`ProcessGrid`.

    Each matrix dimension is split over the matching grid axis as
    :class:`Slab` splits it; the grid coordinate ``p`` holds part
    ``(p - first_process) mod P`` of that axis. nvmath 1.0 accepts only
    uniform splits here; dmatmul goes beyond it and accepts any size.

    >>> d = BlockNonCyclic(ProcessGrid((2, 2)))
    >>> [d.shape(r, (5, 3)) for r in range(4)]
    [(3, 2), (3, 1), (2, 2), (2, 1)]
    """

    grid: ProcessGrid
    first_process: tuple[int, int]

    def __init__(self, grid: ProcessGrid, first_process: Sequence[int] = (0, 0)) -> None:
        self._init_grid(grid, first_process)

    def _dim_indices(self, dim: int, rank: int, size: int, nranks: int) -> np.ndarray:
        start, length = self._extent(dim, rank, size)
        return np.arange(start, start + length)

    def _dim_length(self, dim: int, rank: int, size: int, nranks: int) -> int:
        return self._extent(dim, rank, size)[1]

    def _extent(self, dim: int, rank: int, size: int) -> tuple[int, int]:
        parts = self.grid.shape[dim]
        return slab_extent(size, parts, (self.grid.coords(rank)[dim] - self.first_process[dim]) % parts)

    def __repr__(self) -> str:
        fp = "" if self.first_process == (0, 0) else f", first_process={self.first_process}"
        return f"BlockNonCyclic({self.grid!r}{fp})"


@dataclasses.dataclass(frozen=True, init=False, repr=False)
class BlockCyclic(_GridDistribution):
    """ScaLAPACK's 2-D block-cyclic distribution.

    Blocks of ``block_sizes = (mb, nb)`` are dealt round-robin over the grid's
    rows and columns, starting at grid coordinates ``first_process``; the
    local size per dimension is ScaLAPACK's :func:`numroc`.

    >>> g = ProcessGrid((2, 2), layout="row")
    >>> [BlockCyclic(g, (3, 2)).shape(r, (10, 7)) for r in range(4)]
    [(6, 4), (6, 3), (4, 4), (4, 3)]
    """

    grid: ProcessGrid
    block_sizes: tuple[int, int]
    first_process: tuple[int, int]

    def __init__(
        self, grid: ProcessGrid, block_sizes: Sequence[int], first_process: Sequence[int] = (0, 0)
    ) -> None:
        self._init_grid(grid, first_process)
        object.__setattr__(self, "block_sizes", as_pair(block_sizes, "block_sizes", minimum=1))

    def _dim_indices(self, dim: int, rank: int, size: int, nranks: int) -> np.ndarray:
        return _cyclic_indices(size, *self._deal(dim, rank))

    def _dim_length(self, dim: int, rank: int, size: int, nranks: int) -> int:
        return numroc(size, *self._deal(dim, rank))

    def _deal(self, dim: int, rank: int) -> tuple[int, int, int, int]:
        """``(nb, iproc, isrcproc, nprocs)`` of ``rank`` along ``dim``, as NUMROC takes them."""
        return self.block_sizes[dim], self.grid.coords(rank)[dim], self.first_process[dim], self.grid.shape[dim]

    def __repr__(self) -> str:
        fp = "" if self.first_process == (0, 0) else f", first_process={self.first_process}"
        return f"BlockCyclic({self.grid!r}, {self.block_sizes}{fp})"


# --------------------------------------------------------------------------- #
# split / join
# --------------------------------------------------------------------------- #
def _check_distribution(d: Any, what: str = "distribution") -> Distribution:
    if not isinstance(d, Distribution):
        raise TypeError(
            f"{what} must be a dmatmul distribution (Slab.X, Slab.Y, Replicated(), "
            f"BlockNonCyclic(grid), BlockCyclic(grid, blocks), Sharded(mesh, spec)), got {d!r}"
        )
    return d


def split(a: Any, d: Distribution, nranks: int | None = None) -> list[np.ndarray]:
    """Each rank's local block of the global matrix ``a`` under ``d`` (of the
    global array ``a``, of ``d.ndim`` dimensions, for a :class:`Sharded`).

    >>> [b.tolist() for b in split(np.arange(6).reshape(3, 2), Slab.X, nranks=2)]
    [[[0, 1], [2, 3]], [[4, 5]]]
    """
    d = _check_distribution(d)
    a = to_numpy(a, "split: a")
    if a.ndim != d.ndim:
        what = "a 2-D matrix" if d.ndim == 2 else f"an array of {d.ndim} dimensions"
        raise ValueError(f"split: a must be {what} for {d!r}, got shape {a.shape}")
    p = d.nranks(nranks)
    return [a[np.ix_(*d.global_indices(rank, a.shape, p))] for rank in range(p)]


def _same(x: np.ndarray, y: np.ndarray) -> bool:
    """Equal arrays, NaN equal to NaN (bfloat16's too, whose numpy kind is not "f")."""
    try:
        return bool(np.array_equal(x, y, equal_nan=True))
    except TypeError:  # no NaN in this dtype (strings, objects)
        return bool(np.array_equal(x, y))


def join(blocks: Sequence[Any], d: Distribution, global_shape: Sequence[int]) -> np.ndarray:
    """The global matrix from every rank's block (the inverse of :func:`split`).

    ``blocks[r]`` is rank ``r``'s block; ``len(blocks)`` is the number of ranks.
    Ranks that hold the same block (all of them for :class:`Replicated`; those
    that differ only along the mesh axes a :class:`Sharded` does not name)
    must agree (a ValueError names the first rank that differs); the first
    rank's copy is returned.

    >>> join([np.ones((1, 2)), np.zeros((1, 2))], Replicated(), (1, 2))
    Traceback (most recent call last):
    ...
    ValueError: join: Replicated() blocks must agree, but rank 1's differs from rank 0's
    """
    d = _check_distribution(d)
    shape = d._parse_shape(global_shape)
    if isinstance(blocks, np.ndarray) or not isinstance(blocks, Sequence) or not blocks:
        raise TypeError(f"join: blocks must be a non-empty list of per-rank blocks, got {type(blocks).__name__}")
    span = d._span()
    if span is not None and len(blocks) != span[0]:  # (d.nranks would blame an nranks join does not take)
        raise DistributionError(
            f"join: blocks holds {len(blocks)} blocks but {d!r} spans {span[0]} ranks "
            f"({span[1]}): pass one block per rank, blocks[r] being rank r's"
        )
    p = d.nranks(len(blocks))
    arrays = [to_numpy(b, f"join: the block of rank {rank}") for rank, b in enumerate(blocks)]
    for rank, block in enumerate(arrays):  # every block checked before the result is made (of any global shape)
        want = d.shape(rank, shape, p)
        if block.shape != want:
            raise DistributionError(
                f"join: block of rank {rank} must have shape {want} under {d!r} for global shape {shape}, "
                f"got {block.shape}"
            )
    for group in d._replica_groups(p):
        first = group[0]
        differs = next((r for r in group[1:] if not _same(arrays[r], arrays[first])), None)
        if differs is not None:
            raise ValueError(f"join: {d!r} blocks must agree, but rank {differs}'s differs from rank {first}'s")
    out = np.zeros(shape, dtype=np.result_type(*arrays))
    for rank in reversed(range(p)):  # (where ranks hold copies, the first rank's is written last)
        out[np.ix_(*d.global_indices(rank, shape, p))] = arrays[rank]
    return out

