"""The padded split of one matrix dimension, shared by every backend.

A :class:`DimMap` is the *padded index space* of one dimension of ``size``
items: the dimension is cut into ``nparts`` lists of global indices (a Slab's
contiguous ranges, a block-cyclic deal, or one list holding everything), each
list padded with zeros to a common ``block`` length, so position
``p*block + i`` holds global index ``parts[p][i]``. An uneven Slab (the first
``size % nparts`` parts one longer, as nvmath splits) thereby becomes a
uniform block layout of a slightly larger, zero-padded matrix; a block-cyclic
layout becomes a plain block layout of a permuted one. The JAX backend places
matrices on meshes with it; the nvmath backend pads uneven Slabs with it.
Backend-neutral: imports numpy only.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Sequence

import numpy as np

from ._distribution import slab_extent

__all__ = ["DimMap"]


@dataclasses.dataclass(frozen=True)
class DimMap:
    """One dimension of ``size`` items cut into index lists padded to ``block``.

    >>> d = DimMap.slab(5, 2)
    >>> d.padded_size, d.positions.tolist(), d.sources.tolist()
    (6, [0, 1, 2, 3, 4], [0, 1, 2, 3, 4, -1])
    >>> DimMap.slab(7, 3).sources.tolist()
    [0, 1, 2, 3, 4, -1, 5, 6, -1]
    >>> DimMap.of_parts(6, [[0, 1, 4, 5], [2, 3]]).sources.tolist()  # block-cyclic, blocks of 2
    [0, 1, 4, 5, 2, 3, -1, -1]
    >>> DimMap.slab(8, 4).identity, DimMap.whole(3).identity
    (True, True)
    """

    size: int
    parts: tuple[tuple[int, ...], ...]
    block: int

    @classmethod
    def whole(cls, size: int) -> DimMap:
        """The dimension as it is: one part, no padding."""
        return cls(size, (tuple(range(size)),), size)

    @classmethod
    def slab(cls, size: int, nparts: int) -> DimMap:
        """nvmath's Slab split: contiguous, the first ``size % nparts`` parts one longer."""
        if nparts == 1:
            return cls.whole(size)
        parts = []
        for p in range(nparts):
            start, length = slab_extent(size, nparts, p)
            parts.append(tuple(range(start, start + length)))
        return cls.of_parts(size, parts)

    @classmethod
    def of_parts(cls, size: int, parts: Sequence[Iterable[int]]) -> DimMap:
        """Explicit index lists (each in local order); block = the longest."""
        parts_t = tuple(tuple(int(i) for i in p) for p in parts)
        return cls(size, parts_t, max(1, max(len(p) for p in parts_t)))

    @property
    def nparts(self) -> int:
        return len(self.parts)

    @property
    def padded_size(self) -> int:
        return self.block * self.nparts

    @functools.cached_property
    def sources(self) -> np.ndarray:
        """Global index at each padded position, -1 for padding."""
        out = np.full(self.padded_size, -1, dtype=np.int64)
        for p, idx in enumerate(self.parts):
            out[p * self.block : p * self.block + len(idx)] = idx
        return out

    @functools.cached_property
    def positions(self) -> np.ndarray:
        """Padded position of each global index."""
        out = np.empty(self.size, dtype=np.int64)
        valid = self.sources >= 0
        out[self.sources[valid]] = np.nonzero(valid)[0]
        return out

    @functools.cached_property
    def identity(self) -> bool:
        """True when the padded space is the dimension itself (nothing to copy)."""
        return self.padded_size == self.size and bool(np.all(self.sources == np.arange(self.size)))

    def part_sources(self, part: int) -> np.ndarray:
        return self.sources[part * self.block : (part + 1) * self.block]
