"""Process grids: which rank sits at which grid coordinate, and the rank groups
that communicate along a grid axis, computed with :mod:`dmatmul.layout` (as
PyTorch's DeviceMesh computes its groups with ``_MeshLayout``).

A grid of shape ``S`` numbered ``"row"`` is the layout ``S`` with the
row-major (suffix product) strides, ``"col"`` the layout with the
column-major (prefix product) ones:

* ``grid.rank(coords)`` is the layout applied to ``coords``;
* ``grid.coords(rank)`` is the layout's left inverse applied to ``rank`` (a
  flat row-major index), cut into digits by the suffix product of ``S``;
* ``grid.groups(axis)`` is :func:`dmatmul.layout.groups`: the layout's mode
  ``axis`` (the ranks of one group, less its first), offset by each offset of
  its complement (the first rank of each group).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from ._args import MAX_RANKS, as_int, one_of
from ._errors import DistributionError
from .layout import Layout, flatten, groups as _layout_groups, left_inverse, suffix_product

__all__ = ["GridLayout", "ProcessGrid"]

GridLayout = Literal["row", "col"]

_left_inverse = functools.lru_cache(maxsize=64)(left_inverse)  # grid.coords() per rank, many times a product


@dataclasses.dataclass(frozen=True, init=False)
class ProcessGrid:
    """A grid of ranks, e.g. ``ProcessGrid((2, 4))``.

    ``layout="row"`` numbers the ranks row-major (``rank = r*cols + c``, the
    last grid axis fastest); ``"col"`` column-major (``rank = r + c*rows``), as
    ScaLAPACK's ``'C'`` order and nvmath's ``ProcessGrid.Layout.COL_MAJOR``.
    The default is ``"row"``; where at most one axis is longer than 1 (a 1-D
    grid too) the two orders agree, and such grids compare equal.

    >>> g = ProcessGrid((2, 4))
    >>> g.coords(6), g.rank((1, 2))
    ((1, 2), 6)
    >>> g.groups(0)
    [[0, 4], [1, 5], [2, 6], [3, 7]]
    >>> ProcessGrid((2, 4), layout="col").groups(1)
    [[0, 2, 4, 6], [1, 3, 5, 7]]
    """

    shape: tuple[int, ...]
    layout: GridLayout

    def __init__(self, shape: int | Sequence[int], layout: GridLayout = "row") -> None:
        if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
            shape = (int(shape),)
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or not shape:
            raise TypeError(f"ProcessGrid shape must be a tuple of positive ints, got {shape!r}")
        dims = tuple(as_int(s, f"ProcessGrid shape[{i}]", minimum=1) for i, s in enumerate(shape))
        if not one_of(layout, ("row", "col")):
            raise DistributionError(
                f"ProcessGrid layout must be 'row' (rank = r*cols + c) or 'col' "
                f"(rank = r + c*rows), got {layout!r}"
            )
        if math.prod(dims) > MAX_RANKS:
            raise DistributionError(
                f"ProcessGrid shape {dims} spans {math.prod(dims)} ranks, more than {MAX_RANKS} "
                "(MPI numbers ranks with a C int)"
            )
        if sum(d > 1 for d in dims) <= 1:
            # the two orders number the ranks alike where at most one axis is
            # longer than 1 (a 1-D grid, (4, 1), (1, 4)): keep one value, so
            # that equal grids compare and hash equal (as nvmath's do)
            layout = "row"
        object.__setattr__(self, "shape", dims)
        object.__setattr__(self, "layout", layout)

    @property
    def size(self) -> int:
        """Number of ranks in the grid."""
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def rank_layout(self) -> Layout:
        """The CuTe layout mapping grid coordinates to ranks.

        >>> ProcessGrid((2, 4)).rank_layout
        Layout((2, 4), (4, 1))
        >>> ProcessGrid((2, 4), layout="col").rank_layout
        Layout((2, 4), (1, 2))
        """
        if self.layout == "row":
            return Layout(self.shape)
        # column-major: the row-major strides of the reversed shape, reversed
        return Layout(self.shape, tuple(reversed(flatten(suffix_product(self.shape[::-1])))))

    def _check_rank(self, rank: Any) -> int:
        rank = as_int(rank, "rank", minimum=0)
        if rank >= self.size:
            raise DistributionError(f"rank must be in [0, {self.size}) for grid {self!r}, got {rank}")
        return rank

    def coords(self, rank: int) -> tuple[int, ...]:
        """Grid coordinates of ``rank``."""
        # the left inverse gives the row-major index of the coordinates,
        # whose digits (weights: the suffix product of the shape) they are
        flat = _left_inverse(self.rank_layout)(self._check_rank(rank))
        return tuple(flat // w % s for s, w in zip(self.shape, flatten(suffix_product(self.shape))))

    def rank(self, coords: Sequence[int] | int) -> int:
        """Rank at grid coordinates ``coords`` (an int on a 1-D grid)."""
        if isinstance(coords, (int, np.integer)) and self.ndim == 1:
            coords = (int(coords),) if isinstance(coords, np.integer) else (coords,)
        if not isinstance(coords, Sequence) or len(coords) != self.ndim:
            raise TypeError(f"coords must be a tuple of {self.ndim} ints for grid {self!r}, got {coords!r}")
        for i, (c, s) in enumerate(zip(coords, self.shape)):
            if as_int(c, f"coords[{i}]", minimum=0) >= s:
                raise DistributionError(f"coords[{i}] must be in [0, {s}) for grid {self!r}, got {c}")
        return int(self.rank_layout(tuple(int(c) for c in coords)))

    def groups(self, axis: int) -> list[list[int]]:
        """The rank groups that communicate along grid axis ``axis``.

        Each group holds the ranks that differ only in coordinate ``axis``,
        ordered by that coordinate; groups are ordered by their first rank.
        """
        axis = as_int(axis, "axis", minimum=0)
        if axis >= self.ndim:
            raise DistributionError(f"axis must be in [0, {self.ndim}) for grid {self!r}, got {axis}")
        return _layout_groups(self.rank_layout, axis)

    def __repr__(self) -> str:
        if self.ndim == 1:
            return f"ProcessGrid({self.shape})"
        return f"ProcessGrid({self.shape}, layout={self.layout!r})"
