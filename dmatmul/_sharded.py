"""N-D distributions over a named :class:`ProcessMesh`, as JAX's
``NamedSharding(mesh, PartitionSpec(...))`` with nvmath's uneven rule.

``Sharded(mesh, spec)`` has one ``spec`` entry per dimension of the stored
array: None (not split), a mesh axis name, or a tuple of names (major to
minor). A dimension of size ``S`` split over axes ``A`` of ``n`` ranks in all
gives the rank at position ``i`` along ``A`` (``mesh.position(rank, A)``) the
contiguous part ``slab_extent(S, n, i)``: ``S//n`` items, one more for the
first ``S%n`` positions. The array is replicated over the mesh axes the spec
does not name.

The 2-D distributions are special cases (:meth:`Sharded.from_2d`,
:meth:`Sharded.as_2d`): ``Slab.X`` over ``P`` ranks is
``Sharded(ProcessMesh((P,), ("x",)), ("x", None))``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Sequence
from typing import Any, Union

import numpy as np

from ._args import as_int
from ._distribution import BlockNonCyclic, Distribution, Replicated, Slab, slab_extent
from ._errors import DistributionError
from ._grid import ProcessGrid
from ._mesh import ProcessMesh
from .layout import Layout, coalesce, make_layout

__all__ = ["Sharded", "SpecEntry"]

SpecEntry = Union[str, tuple[str, ...], None]
"""One entry of a spec: None, a mesh axis name, or a tuple of names."""


def _names(entry: SpecEntry) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else entry


def _entry(entry: Any, i: int, mesh: ProcessMesh) -> SpecEntry:
    """One spec entry checked against the mesh, in one spelling: None for no
    axis (``()`` too), a name for one axis (``("x",)`` too), else a tuple."""
    if entry is None:
        return None
    if not isinstance(entry, (str, tuple, list)):
        raise TypeError(f"Sharded spec[{i}] must be None, a mesh axis name or a tuple of them, got {entry!r}")
    names = mesh.axes(tuple(entry) if isinstance(entry, list) else entry, f"Sharded spec[{i}]")
    return None if not names else names[0] if len(names) == 1 else names


def _spec(spec: Any, mesh: ProcessMesh) -> tuple[SpecEntry, ...]:
    if isinstance(spec, (str, bytes)) or not isinstance(spec, Iterable):
        raise TypeError(
            f"Sharded spec must be a tuple with one entry per dimension (None, a mesh axis name or a tuple "
            f"of them), got {spec!r}"
        )
    entries = tuple(_entry(e, i, mesh) for i, e in enumerate(spec))
    if not entries:
        raise DistributionError("Sharded spec must have one entry per dimension of the stored array, got ()")
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        for name in _names(entry):
            if name in seen:
                raise DistributionError(
                    f"Sharded spec names mesh axis {name!r} twice (spec[{seen[name]}] and spec[{i}]) in "
                    f"{entries!r}: a mesh axis splits at most one dimension; replicate over it by leaving it out"
                )
            seen[name] = i
    return entries


@dataclasses.dataclass(frozen=True, init=False, eq=False, repr=False)
class Sharded(Distribution):
    """An array of ``len(spec)`` dimensions split over the axes of a
    :class:`ProcessMesh` (see the module's docstring for the rule).

    >>> mesh = ProcessMesh((2, 2), ("x", "y"))
    >>> d = Sharded(mesh, ("x", None, "y"))
    >>> d.shape(3, (5, 2, 3))
    (2, 2, 1)
    >>> [i.tolist() for i in d.global_indices(1, (5, 2, 3))]
    [[0, 1, 2], [0, 1], [2]]
    >>> Sharded(mesh, (("y", "x"), None)).shape(1, (7, 4))  # rank 1 is position 2 along (y, x)
    (2, 4)

    Equality is that of the layout, and a Sharded with a 2-D form *is* that
    2-D distribution: it compares and hashes as :meth:`as_2d` does. Since a
    ``Slab`` or ``Replicated()`` carries no rank count, Shardeds whose 2-D
    form is one of them compare equal whatever their mesh size (``Slab.X``
    over 4 ranks equals ``Slab.X`` over 8); a call still refuses a Sharded
    whose mesh is not the ranks it runs on, as for any other. Other Shardeds are equal where they give every rank the
    same parts (mesh axis names and how the axes are cut do not matter):

    >>> d1 = Sharded(ProcessMesh(4, "x"), ("x", None))
    >>> d1 == Slab.X, Slab.X == d1, hash(d1) == hash(Slab.X), d1.as_2d()
    (True, True, True, Slab.X)
    >>> Sharded(ProcessMesh((2, 3), ("a", "b")), (("a", "b"), None, None)) == Sharded(
    ...     ProcessMesh(6, "p"), ("p", None, None))
    True
    """

    mesh: ProcessMesh
    spec: tuple[SpecEntry, ...]

    def __init__(self, mesh: ProcessMesh, spec: Sequence[Any]) -> None:
        if not isinstance(mesh, ProcessMesh):
            raise TypeError(f"Sharded mesh must be a dm.ProcessMesh(shape, axis_names), got {mesh!r}")
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "spec", _spec(spec, mesh))

    @property
    def ndim(self) -> int:
        """The number of dimensions of the arrays it lays out: ``len(spec)``."""
        return len(self.spec)

    def axes(self, dim: int) -> tuple[str, ...]:
        """The mesh axes that split dimension ``dim`` (major to minor)."""
        return _names(self.spec[dim])

    @property
    def replicated_axes(self) -> tuple[str, ...]:
        """The mesh axes the spec does not name: the array is replicated over them."""
        named = {n for entry in self.spec for n in _names(entry)}
        return tuple(n for n in self.mesh.axis_names if n not in named)

    # -- where each rank's part is --------------------------------------------

    @functools.cached_property
    def _positions(self) -> tuple[tuple[int, Layout], ...]:
        """Per dimension: the number of parts and the rank -> part layout."""
        return tuple(
            (self.mesh.sublayout(self.axes(d)).size, self.mesh.position_layout(self.axes(d)))
            for d in range(self.ndim)
        )

    def _extent(self, dim: int, rank: int, size: int) -> tuple[int, int]:
        parts, position = self._positions[dim]
        return slab_extent(size, parts, position(rank) if parts > 1 else 0)

    def _dim_indices(self, dim: int, rank: int, size: int, nranks: int) -> np.ndarray:
        start, length = self._extent(dim, rank, size)
        return np.arange(start, start + length)

    def _dim_length(self, dim: int, rank: int, size: int, nranks: int) -> int:
        return self._extent(dim, rank, size)[1]

    def _span(self) -> tuple[int, str, str] | None:
        return self.mesh.size, f"its mesh {self.mesh.shape}", "mesh"

    def _parse_shape(self, global_shape: Any) -> tuple[int, ...]:
        if isinstance(global_shape, (str, bytes)) or not isinstance(global_shape, Sequence):
            raise TypeError(f"global_shape must be a tuple of {self.ndim} ints for {self!r}, got {global_shape!r}")
        if len(global_shape) != self.ndim:
            raise DistributionError(
                f"global_shape must have one size per dimension of {self!r} ({self.ndim}), "
                f"got {len(global_shape)}: {tuple(global_shape)!r}"
            )
        return tuple(as_int(s, f"global_shape[{i}]", minimum=0) for i, s in enumerate(global_shape))

    def _check_nd(self, rank: Any, global_shape: Any, nranks: int | None) -> tuple[int, tuple[int, ...], int]:
        shape = self._parse_shape(global_shape)
        p = self.nranks(nranks)
        rank = as_int(rank, "rank", minimum=0)
        if rank >= p:
            raise DistributionError(f"rank must be in [0, {p}) for {self!r}, got {rank}")
        return rank, shape, p

    # the 2-D distributions' methods, on any number of dimensions
    def shape(  # type: ignore[override]
        self, rank: int, global_shape: Sequence[int], nranks: int | None = None
    ) -> tuple[int, ...]:
        """The local shape of ``rank``'s block (one size per dimension)."""
        rank, shape, p = self._check_nd(rank, global_shape, nranks)
        return tuple(self._dim_length(d, rank, s, p) for d, s in enumerate(shape))

    def global_indices(  # type: ignore[override]
        self, rank: int, global_shape: Sequence[int], nranks: int | None = None
    ) -> tuple[np.ndarray, ...]:
        """One array per dimension: the global ids ``rank`` holds, in local
        order (``local[i, j, ...] == global[ids[0][i], ids[1][j], ...]``)."""
        rank, shape, p = self._check_nd(rank, global_shape, nranks)
        return tuple(self._dim_indices(d, rank, s, p) for d, s in enumerate(shape))

    def global_shape(self, local_shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:  # type: ignore[override]
        """The global shape whose blocks have ``local_shapes`` (``local_shapes[r]``
        is rank ``r``'s): each dimension's parts summed along its mesh axes
        from rank 0. A DistributionError names the first rank whose block does
        not fit.

        >>> Sharded(ProcessMesh((2, 2), ("x", "y")), (None, "y")).global_shape([(3, 2), (3, 1)] * 2)
        (3, 3)
        """
        shapes = [tuple(int(x) for x in s) for s in local_shapes]
        self.nranks(len(shapes))
        for rank, got in enumerate(shapes):
            if len(got) != self.ndim:
                raise DistributionError(
                    f"the block of rank {rank} has shape {got} but {self!r} lays out arrays of {self.ndim} dimensions"
                )
        guess = tuple(sum(shapes[r][d] for r in self.mesh.groups(self.axes(d))[0]) for d in range(self.ndim))
        self.check_blocks(shapes, guess, "implied by the blocks of the ranks along its mesh axes from rank 0")
        return guess

    def _replica_groups(self, nranks: int) -> list[list[int]]:
        groups = self.mesh.groups(self.replicated_axes)
        return groups if len(groups[0]) > 1 else []

    # -- the 2-D distributions as special cases ---------------------------------

    @functools.cached_property
    def _dim_keys(self) -> tuple[Layout | None, ...]:
        """Per dimension: None if not split, else the coalesced sublayout of
        its axes (part -> rank offset: the same function, the same value)."""
        return tuple(None if e is None else coalesce(self.mesh.sublayout(e)) for e in self.spec)

    def as_2d(self) -> Distribution | None:
        """The 2-D distribution that lays matrices out as this one does
        (``Slab.X``, ``Slab.Y``, ``Replicated()`` or a ``BlockNonCyclic`` on a
        row- or column-major grid), or None where there is none (more than 2
        dimensions, axes that cut a dimension out of the mesh's rank order,
        partial replication).

        >>> Sharded(ProcessMesh((4, 2), ("c", "r")), ("r", "c")).as_2d()
        BlockNonCyclic(ProcessGrid((2, 4), layout='col'))
        >>> print(Sharded(ProcessMesh((2, 2), ("x", "y")), ("x", None)).as_2d())  # replicated over y
        None
        """
        if self.ndim != 2:
            return None
        rows, cols = self._dim_keys
        whole = coalesce(Layout(self.mesh.size))
        if rows is None and cols is None:
            return Replicated()
        if cols is None:
            return Slab.X if rows == whole else None
        if rows is None:
            return Slab.Y if cols == whole else None
        if rows.size * cols.size != self.mesh.size:
            return None
        both = coalesce(make_layout(rows, cols))  # (row part, column part) -> rank, as a grid's rank layout
        for order in ("row", "col"):
            grid = ProcessGrid((rows.size, cols.size), layout=order)
            if coalesce(grid.rank_layout) == both:
                return BlockNonCyclic(grid)
        return None

    @classmethod
    def from_2d(cls, d: Distribution, nranks: int | None = None) -> Sharded | None:
        """The Sharded form of the 2-D distribution ``d`` over ``nranks`` ranks
        (a grid's own size where ``d`` has one), or None where there is none:
        a ``BlockCyclic`` (its parts are not contiguous) and a
        ``BlockNonCyclic`` whose ``first_process`` is not ``(0, 0)`` (it
        rotates the parts along the grid).

        A column-major grid ``(R, C)`` numbers ``rank = r + c*R``: the
        row-major mesh ``(C, R)``, rows split over its second axis.

        >>> Sharded.from_2d(Slab.Y, nranks=3)
        Sharded(ProcessMesh((3,), ('y',)), (None, 'y'))
        >>> Sharded.from_2d(BlockNonCyclic(ProcessGrid((2, 4), layout="col")))
        Sharded(ProcessMesh((4, 2), ('c', 'r')), ('r', 'c'))
        """
        if isinstance(d, Sharded):
            d.nranks(nranks)
            return d
        if isinstance(d, BlockNonCyclic):
            d.nranks(nranks)
            if d.first_process != (0, 0):
                return None
            rows, cols = d.grid.shape
            if d.grid.layout == "row":
                return cls(ProcessMesh((rows, cols), ("r", "c")), ("r", "c"))
            return cls(ProcessMesh((cols, rows), ("c", "r")), ("r", "c"))
        if isinstance(d, Replicated):
            return cls(ProcessMesh(d.nranks(nranks), "x"), (None, None))
        if isinstance(d, Slab):
            name = "x" if d.dim == 0 else "y"
            return cls(ProcessMesh(d.nranks(nranks), name), (name, None) if d.dim == 0 else (None, name))
        if isinstance(d, Distribution):
            d.nranks(nranks)
            return None
        raise TypeError(f"Sharded.from_2d: d must be a dmatmul distribution, got {d!r}")

    # -- a value ------------------------------------------------------------------

    @functools.cached_property
    def _key(self) -> object:
        """What equality and the hash compare: the 2-D form where there is one
        (so that a Sharded equals it and hashes as it does), else the rank
        count and, per dimension, the coalesced sublayout of its axes: the
        layout itself (a dimension split over axes of size 1 is not split).

        Only the 2-D forms tell a dimension split over axes of size 1 from one
        not split, as the 2-D distributions do (``Slab.X`` over 1 rank is not
        ``Replicated()``, ``BlockNonCyclic`` on a ``(P, 1)`` grid not ``Slab.X``)."""
        two = self.as_2d()
        if two is not None:
            return two
        return ("Sharded", self.mesh.size, tuple(Layout(1, 0) if k is None else k for k in self._dim_keys))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sharded):
            return bool(self._key == other._key)
        if isinstance(other, Distribution):
            return bool(self._key == other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"Sharded({self.mesh!r}, {self.spec!r})"


def matrix_distribution(d: Distribution, what: str) -> Distribution:
    """``d``, a :class:`Sharded` of 2 dimensions as its 2-D form where it has
    one (the same value, which every backend takes as it is); any other
    Sharded as it is: :mod:`dmatmul._relay` plans its product, re-laying the
    operands into a layout the plan takes. ``what`` names it in errors.

    >>> matrix_distribution(Sharded(ProcessMesh(2, "x"), ("x", None)), "distribution")
    Slab.X
    >>> matrix_distribution(Sharded(ProcessMesh((2, 2), ("x", "y")), ("x", None)), "distribution")
    Sharded(ProcessMesh((2, 2), ('x', 'y')), ('x', None))
    """
    if not isinstance(d, Sharded):
        return d
    two = d.as_2d()
    return d if two is None else two
