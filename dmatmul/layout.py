"""Lexicographic (row-major) CuTe-style layout algebra.

A :class:`Layout` is a function from integer coordinates to integer offsets,
described by a ``shape`` and a ``stride`` of the same (possibly nested)
profile: the offset of a coordinate is the dot product of the coordinate with
the stride.  ``dmatmul`` uses layouts to describe process grids (which rank
sits at which grid coordinate) and to derive communication groups from them.

Conventions
-----------
* **Lexicographic, i.e. row-major.**  The RIGHTMOST mode varies fastest.  A
  flat index ``i`` is decomposed into a coordinate with the last mode as the
  least significant digit (index 5 in shape ``(2, 4)`` is coordinate
  ``(1, 1)``), and the default stride is the suffix product of the shape
  (over the flattened shape, keeping the nesting):

  >>> Layout((2, 4))
  Layout((2, 4), (4, 1))
  >>> Layout((2, 4))(5)
  5
  >>> Layout(((2, 3), 4))
  Layout(((2, 3), 4), ((12, 4), 1))

* **Relation to CuTe.**  NVIDIA CuTe (and pycute) is *colexicographic*: the
  LEFTMOST mode varies fastest and the default stride is the prefix product.
  A lexicographic layout is the same function as the CuTe layout whose modes
  are reversed (at every nesting level), and every result here is the CuTe
  result with its modes reversed.  Concretely:

  - :func:`complement` lists its modes from the largest stride (left, outer)
    to the smallest (right, inner), so it enumerates its offsets in
    increasing order, and ``make_layout(complement(L, n), L)`` (complement
    OUTER, ``L`` inner) is a bijection onto ``range(n)``.
  - :func:`logical_divide` returns ``(rest, tile)``: the tile is the LAST
    mode (CuTe: ``(tile, rest)``).
  - :func:`logical_product` returns ``(repetition, layout)``: the layout is
    the LAST mode (CuTe: ``(layout, repetition)``).

* **Values.**  Shape entries are positive ints, stride entries are
  non-negative ints (0 broadcasts; negative strides are refused).  ``bool``
  is not accepted as an int; objects with ``__index__`` (e.g. numpy integers)
  are converted to plain ``int``; lists are converted to tuples; empty tuples
  are refused.

* **Normalization and equality.**  A layout is stored exactly as given after
  the conversions above: an int shape stays an int (a single mode), a tuple
  stays a tuple (a 1-tuple is kept, so ``Layout(4) != Layout((4,))``), and
  strides are not rewritten.  Equality and hashing are *structural*: two
  layouts are equal iff their shapes and strides are equal.  To compare two
  layouts as functions, compare their :func:`coalesce` forms.  Layouts are
  immutable; setting or deleting an attribute raises ``AttributeError``.

* **Errors.**  Mistakes in arguments raise ``TypeError`` (wrong kind of
  value) or ``ValueError`` (right kind, wrong value, or an operation that is
  not defined for these arguments); out-of-range indices raise
  ``IndexError``.  Nothing relies on ``assert``.

Example: the rank groups of a 2x4 process grid, row-major (rank = 4r + c):

>>> grid = Layout((2, 4))
>>> groups(grid, 0)
[[0, 4], [1, 5], [2, 6], [3, 7]]
>>> groups(grid, 1)
[[0, 1, 2, 3], [4, 5, 6, 7]]
"""

from __future__ import annotations

from ._layout.algebra import (
    IntTuple,
    Layout,
    Tiler,
    coalesce,
    flatten,
    make_layout,
    product,
    suffix_product,
)
from ._layout.ops import (
    complement,
    composition,
    groups,
    left_inverse,
    logical_divide,
    logical_product,
    right_inverse,
)

__all__ = [
    "IntTuple",
    "Tiler",
    "Layout",
    "flatten",
    "product",
    "suffix_product",
    "make_layout",
    "coalesce",
    "composition",
    "complement",
    "left_inverse",
    "right_inverse",
    "logical_divide",
    "logical_product",
    "groups",
]
