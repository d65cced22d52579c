"""Named process meshes: ranks laid out row-major over named axes, with the
coordinates, positions and rank groups computed by :mod:`dmatmul.layout` (as
PyTorch's DeviceMesh computes its groups with ``_MeshLayout``).

A mesh of shape ``S`` is the layout ``S`` with the row-major (suffix product)
strides: its flat index *is* the rank. For a tuple of axes ``A``:

* ``mesh.sublayout(A)`` is the layout made of the modes of ``A``, in ``A``'s
  order: it maps a position along ``A`` (row-major over ``A``, the first
  axis major) to the rank offset of that position;
* its complement in ``range(size)`` lists the first rank of every group of
  ranks that differ only along ``A``, so the groups are the sublayout offset
  by each offset of the complement (:func:`dmatmul.layout.groups`);
* ``mesh.position_layout(A)`` maps a rank back to its position along ``A``:
  the mesh's shape with the strides of ``A``'s own row-major numbering on the
  axes of ``A`` and 0 on the others (it reads a rank's digits along ``A`` and
  ignores the rest).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._args import MAX_RANKS, as_int
from ._errors import DistributionError
from .layout import Layout, complement, flatten, groups as _layout_groups, make_layout, suffix_product

__all__ = ["ProcessMesh", "Axes"]

Axes = str | Sequence[str]
"""A mesh axis name, or a tuple of them (major to minor)."""


def _shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or not shape:
        raise TypeError(f"ProcessMesh shape must be a non-empty tuple of positive ints, got {shape!r}")
    dims = tuple(as_int(s, f"ProcessMesh shape[{i}]", minimum=1) for i, s in enumerate(shape))
    if math.prod(dims) > MAX_RANKS:
        raise DistributionError(
            f"ProcessMesh shape {dims} spans {math.prod(dims)} ranks, more than {MAX_RANKS} "
            "(MPI numbers ranks with a C int)"
        )
    return dims


def _names(names: Any, shape: tuple[int, ...]) -> tuple[str, ...]:
    if isinstance(names, str):
        names = (names,)
    if not isinstance(names, Sequence) or isinstance(names, bytes):
        raise TypeError(f"ProcessMesh axis_names must be a tuple of strings, one per axis, got {names!r}")
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise TypeError(f"ProcessMesh axis_names[{i}] must be a non-empty string, got {name!r}")
    if len(names) != len(shape):
        raise DistributionError(
            f"ProcessMesh axis_names must name each of the {len(shape)} axes of shape {shape}, "
            f"got {len(names)} names {tuple(names)!r}"
        )
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise DistributionError(f"ProcessMesh axis_names must be distinct, got {twice!r} twice in {tuple(names)!r}")
    return tuple(names)


@dataclasses.dataclass(frozen=True, init=False)
class ProcessMesh:
    """Named axes over ``prod(shape)`` ranks, numbered row-major (the last
    axis varies fastest), like a JAX ``Mesh`` or a PyTorch ``DeviceMesh``.

    >>> mesh = ProcessMesh((2, 3), ("data", "model"))
    >>> mesh.size, mesh.coords(4), mesh.rank((1, 1))
    (6, (1, 1), 4)
    >>> mesh.groups("data")
    [[0, 3], [1, 4], [2, 5]]
    >>> mesh.groups("model")
    [[0, 1, 2], [3, 4, 5]]

    A tuple of axes gives the ranks that differ along all of them, in the
    tuple's order (its first axis major):

    >>> ProcessMesh((2, 2, 2), ("a", "b", "c")).groups(("c", "a"))
    [[0, 4, 1, 5], [2, 6, 3, 7]]
    >>> mesh.position(5, "model"), mesh.position(5, ("model", "data"))
    (2, 5)
    """

    shape: tuple[int, ...]
    axis_names: tuple[str, ...]

    def __init__(self, shape: int | Sequence[int], axis_names: Axes) -> None:
        dims = _shape(shape)
        object.__setattr__(self, "shape", dims)
        object.__setattr__(self, "axis_names", _names(axis_names, dims))

    @property
    def size(self) -> int:
        """The number of ranks."""
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self.shape)

    @property
    def layout(self) -> Layout:
        """The layout mapping mesh coordinates to ranks (row-major).

        >>> ProcessMesh((2, 4), ("x", "y")).layout
        Layout((2, 4), (4, 1))
        """
        return Layout(self.shape)

    def axes(self, axes: Axes, what: str = "axes") -> tuple[str, ...]:
        """``axes`` as a tuple of this mesh's axis names (a name: a 1-tuple);
        a DistributionError naming ``what`` for a name that is not one, or one
        named twice."""
        names = (axes,) if isinstance(axes, str) else axes
        if not isinstance(names, Sequence) or isinstance(names, bytes):
            raise TypeError(f"{what} must be a mesh axis name or a tuple of them, got {axes!r}")
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"{what} must be a mesh axis name or a tuple of them, got {axes!r}")
            if name not in self.axis_names:
                raise DistributionError(
                    f"{what}: {name!r} is not an axis of {self!r}; expected one of {self.axis_names}, got {axes!r}"
                )
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice is not None:
            raise DistributionError(f"{what} must name each mesh axis at most once, got {twice!r} twice in {axes!r}")
        return tuple(names)

    def sublayout(self, axes: Axes) -> Layout:
        """The modes of ``axes`` (in that order) of :attr:`layout`: position
        along ``axes`` -> rank offset. No axes: ``Layout(1, 0)``.

        >>> ProcessMesh((2, 3), ("x", "y")).sublayout(("y", "x"))
        Layout((3, 2), (1, 3))
        """
        names = self.axes(axes)
        if not names:
            return Layout(1, 0)
        return make_layout(*(self.layout[self.axis_names.index(n)] for n in names))

    def position_layout(self, axes: Axes) -> Layout:
        """The layout mapping a rank to its position along ``axes`` (row-major
        over them): ``position_layout(A)(sublayout(A)(i) + c) == i`` for every
        offset ``c`` of the complement of ``sublayout(A)``.

        >>> ProcessMesh((2, 3), ("x", "y")).position_layout(("y", "x"))
        Layout((2, 3), (1, 2))
        """
        names = self.axes(axes)
        weights = flatten(suffix_product(tuple(self.shape[self.axis_names.index(n)] for n in names) or 1))
        stride = [0] * self.ndim
        for name, weight in zip(names, weights):
            stride[self.axis_names.index(name)] = weight
        return Layout(self.shape, tuple(stride))

    def _check_rank(self, rank: Any) -> int:
        rank = as_int(rank, "rank", minimum=0)
        if rank >= self.size:
            raise DistributionError(f"rank must be in [0, {self.size}) for {self!r}, got {rank}")
        return rank

    def position(self, rank: int, axes: Axes) -> int:
        """The position of ``rank`` along ``axes`` (row-major over them, the
        first major): which part a dimension split over ``axes`` gives it."""
        return self.position_layout(axes)(self._check_rank(rank))

    def coords(self, rank: int) -> tuple[int, ...]:
        """The mesh coordinates of ``rank``: its position along each axis."""
        rank = self._check_rank(rank)
        return tuple(self.position_layout(name)(rank) for name in self.axis_names)

    def rank(self, coords: Sequence[int] | int) -> int:
        """The rank at mesh coordinates ``coords`` (an int on a 1-D mesh)."""
        if isinstance(coords, (int, np.integer)) and not isinstance(coords, bool) and self.ndim == 1:
            coords = (int(coords),)
        if isinstance(coords, (str, bytes)) or not isinstance(coords, Sequence) or len(coords) != self.ndim:
            raise TypeError(f"coords must be a tuple of {self.ndim} ints for {self!r}, got {coords!r}")
        for i, (c, s) in enumerate(zip(coords, self.shape)):
            if as_int(c, f"coords[{i}]", minimum=0) >= s:
                raise DistributionError(f"coords[{i}] must be in [0, {s}) for {self!r}, got {c}")
        return self.layout(tuple(int(c) for c in coords))

    def groups(self, axes: Axes) -> list[list[int]]:
        """The ranks that differ only along ``axes`` (a name or a tuple of
        names), one list per group: groups in order of their first rank,
        members in order of their position along ``axes`` (the first axis
        major). No axes: every rank alone."""
        sub = self.sublayout(axes)
        # the complement (outer) and the sublayout (inner) tile the ranks;
        # groups() offsets the inner mode by each offset of the outer one
        return _layout_groups(make_layout(complement(sub, self.size), sub), 1)

    def __repr__(self) -> str:
        return f"ProcessMesh({self.shape}, {self.axis_names})"
