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

import math
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeAlias, Union, cast

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

IntTuple: TypeAlias = Union[int, tuple["IntTuple", ...]]
"""An int or an arbitrarily nested tuple of ints."""

Tiler: TypeAlias = Union["Layout", int, tuple[Union["Layout", int, None], ...]]
"""A layout, an int ``n`` (meaning ``Layout(n)``), or a tuple of those (or
``None`` for "leave this mode alone") applied mode by mode."""


# ---------------------------------------------------------------------------
# IntTuple helpers
# ---------------------------------------------------------------------------


def _type_name(value: object) -> str:
    return type(value).__name__


def _to_int(value: object, what: str) -> int:
    """Convert an int-like (not bool) to int, or raise TypeError naming *what*."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got the bool {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{what} must be an int, got {value!r} ({_type_name(value)})"
        ) from None


def _normalize(value: object, name: str, minimum: int) -> IntTuple:
    """Validate and normalize a shape or stride (lists become tuples)."""

    def rec(v: object) -> IntTuple:
        if isinstance(v, (tuple, list)):
            if len(v) == 0:
                raise ValueError(
                    f"{name} must not contain an empty tuple, got {value!r}"
                )
            return tuple(rec(x) for x in v)
        try:
            if isinstance(v, bool):
                raise TypeError
            i = operator.index(v)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"{name} must be an int or a (nested) tuple of ints, got "
                f"{value!r} (containing {v!r} of type {_type_name(v)})"
            ) from None
        if i < minimum:
            kind = "positive" if minimum == 1 else "non-negative"
            raise ValueError(
                f"{name} entries must be {kind} ints, got {i} in {name} {value!r}"
            )
        return i

    return rec(value)


def _congruent(a: IntTuple, b: IntTuple) -> bool:
    if isinstance(a, int):
        return isinstance(b, int)
    return (
        isinstance(b, tuple)
        and len(a) == len(b)
        and all(_congruent(x, y) for x, y in zip(a, b))
    )


def _fmt(t: IntTuple) -> str:
    """CuTe-style text of an IntTuple: ``(2,(3,4))``."""
    if isinstance(t, int):
        return str(t)
    return "(" + ",".join(_fmt(x) for x in t) + ")"


def flatten(t: IntTuple) -> tuple[int, ...]:
    """The ints of a (nested) IntTuple, left to right, as a flat tuple.

    >>> flatten(((2, 3), 4))
    (2, 3, 4)
    >>> flatten(5)
    (5,)
    """
    if isinstance(t, tuple):
        out: list[int] = []
        for x in t:
            out.extend(flatten(x))
        return tuple(out)
    return (_to_int(t, "flatten(t): t"),)


def product(t: IntTuple) -> int:
    """The product of all ints of a (nested) IntTuple.

    >>> product(((2, 3), 4))
    24
    >>> product(7)
    7
    """
    return math.prod(flatten(t))


def _unflatten(flat: list[int] | tuple[int, ...], profile: IntTuple) -> IntTuple:
    """Rebuild the nesting of *profile* from the flat values *flat*."""
    it = iter(flat)

    def rec(p: IntTuple) -> IntTuple:
        if isinstance(p, tuple):
            return tuple(rec(x) for x in p)
        return next(it)

    return rec(profile)


def suffix_product(shape: IntTuple) -> IntTuple:
    """The lexicographic (row-major) compact strides of *shape*.

    Entry k is the product of all entries to the right of k in the flattened
    shape; the nesting of *shape* is kept.

    >>> suffix_product((2, 3, 4))
    (12, 4, 1)
    >>> suffix_product(((2, 3), 4))
    ((12, 4), 1)
    >>> suffix_product(5)
    1
    """
    flat = flatten(shape)
    out = [1] * len(flat)
    acc = 1
    for k in range(len(flat) - 1, -1, -1):
        out[k] = acc
        acc *= flat[k]
    return _unflatten(out, shape)


# ---------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------


class Layout:
    """An immutable shape:stride layout, evaluated lexicographically.

    ``Layout(shape, stride=None)``: *shape* is a positive int or a nested
    tuple of positive ints; *stride* has the same profile (non-negative
    ints) and defaults to the row-major :func:`suffix_product` of *shape*.

    >>> L = Layout((2, 4))
    >>> L
    Layout((2, 4), (4, 1))
    >>> print(L)
    (2,4):(4,1)
    >>> L.size, L.cosize, L.rank, len(L)
    (8, 8, 2, 2)
    >>> L(5), L(1, 1), L((1, 1))
    (5, 5, 5)
    >>> L[0], L[1]
    (Layout(2, 4), Layout(4, 1))
    >>> col = Layout((2, 4), (1, 2))  # column-major: offset = r + 2c
    >>> [col(i) for i in range(col.size)]
    [0, 2, 4, 6, 1, 3, 5, 7]
    >>> Layout((2, 4)) == Layout((2, 4), (4, 1))
    True

    A coordinate entry may be a flat index into a nested mode:

    >>> N = Layout((2, (3, 4)))
    >>> N((1, 5)) == N((1, (1, 1))) == N(17) == 17
    True
    """

    __slots__ = ("_shape", "_stride", "_flat_shape", "_flat_stride", "_hash")

    _shape: IntTuple
    _stride: IntTuple
    _flat_shape: tuple[int, ...]
    _flat_stride: tuple[int, ...]
    _hash: int

    def __init__(self, shape: IntTuple, stride: IntTuple | None = None) -> None:
        s = _normalize(shape, "shape", 1)
        if stride is None:
            d = suffix_product(s)
        else:
            d = _normalize(stride, "stride", 0)
            if not _congruent(s, d):
                raise ValueError(
                    f"stride {stride!r} does not have the same profile as "
                    f"shape {shape!r} (expected the nesting of {_fmt(s)})"
                )
        object.__setattr__(self, "_shape", s)
        object.__setattr__(self, "_stride", d)
        object.__setattr__(self, "_flat_shape", flatten(s))
        object.__setattr__(self, "_flat_stride", flatten(d))
        object.__setattr__(self, "_hash", hash(("Layout", s, d)))

    # -- immutability -------------------------------------------------------

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Layout is immutable: cannot set attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Layout is immutable: cannot delete attribute {name!r}")

    def __reduce__(self) -> tuple[type[Layout], tuple[IntTuple, IntTuple]]:
        return (Layout, (self._shape, self._stride))

    # -- properties ---------------------------------------------------------

    @property
    def shape(self) -> IntTuple:
        """The shape (int or nested tuple of ints)."""
        return self._shape

    @property
    def stride(self) -> IntTuple:
        """The stride (same profile as :attr:`shape`)."""
        return self._stride

    @property
    def size(self) -> int:
        """Size of the domain: the product of the shape.

        >>> Layout((2, (3, 4))).size
        24
        """
        return math.prod(self._flat_shape)

    @property
    def cosize(self) -> int:
        """1 + the largest offset: ``1 + sum((s - 1) * d)`` over all modes.

        >>> Layout((2, 4), (1, 2)).cosize
        8
        >>> Layout((2, 2), (1, 4)).cosize
        6
        """
        return 1 + sum((s - 1) * d for s, d in zip(self._flat_shape, self._flat_stride))

    @property
    def rank(self) -> int:
        """Number of top-level modes: 1 for an int shape, else ``len(shape)``.

        >>> Layout(6).rank, Layout((6,)).rank, Layout((2, (3, 4))).rank
        (1, 1, 2)
        """
        return len(self._shape) if isinstance(self._shape, tuple) else 1

    # -- modes --------------------------------------------------------------

    def __len__(self) -> int:
        return self.rank

    def __getitem__(self, i: int) -> Layout:
        """The i-th top-level mode as a Layout (negative i counts from the end).

        >>> Layout((2, (3, 4)))[1]
        Layout((3, 4), (4, 1))
        >>> Layout(6)[0]
        Layout(6, 1)
        """
        idx = _to_int(i, "Layout mode index")
        r = self.rank
        if not -r <= idx < r:
            raise IndexError(
                f"mode index {idx} is out of range for layout {self} of rank {r} "
                f"(valid: {-r}..{r - 1})"
            )
        if isinstance(self._shape, int):
            return self
        return Layout(self._shape[idx], cast(tuple[IntTuple, ...], self._stride)[idx])

    def __iter__(self) -> Iterator[Layout]:
        for i in range(self.rank):
            yield self[i]

    # -- evaluation ---------------------------------------------------------

    def __call__(self, *coord: IntTuple) -> int:
        """The offset of a coordinate.

        ``L(i)`` with an int is a flat index into the whole layout, decomposed
        lexicographically.  ``L(i, j)`` or ``L((i, j))`` give one entry per
        top-level mode; each entry is an int (a flat index within that mode)
        or a nested tuple matching that mode.

        >>> L = Layout((2, 3), (1, 2))
        >>> L(4), L(1, 1), L((1, 1))
        (3, 3, 3)
        """
        if not coord:
            raise TypeError(
                f"calling layout {self} needs a coordinate: an int or a tuple "
                "with one entry per mode"
            )
        c: object = coord[0] if len(coord) == 1 else coord
        if not isinstance(c, (tuple, list)):
            i = _to_int(c, f"coordinate for layout {self}")
            n = self.size
            if not 0 <= i < n:
                raise IndexError(
                    f"index {i} is out of range for layout {self} of size {n} "
                    f"(valid: 0..{n - 1})"
                )
            total = 0
            for s, d in zip(reversed(self._flat_shape), reversed(self._flat_stride)):
                i, r = divmod(i, s)
                total += r * d
            return total
        return _crd2idx(c, self._shape, self._stride, self)

    # -- comparison and text ------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Layout):
            return NotImplemented
        return self._shape == other._shape and self._stride == other._stride

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Layout({self._shape!r}, {self._stride!r})"

    def __str__(self) -> str:
        return f"{_fmt(self._shape)}:{_fmt(self._stride)}"


def _crd2idx(c: object, shape: IntTuple, stride: IntTuple, layout: Layout) -> int:
    """Offset of coordinate *c* in the (sub)mode shape:stride of *layout*."""
    if isinstance(c, (tuple, list)):
        if not isinstance(shape, tuple) or not isinstance(stride, tuple):
            raise ValueError(
                f"coordinate {c!r} is a tuple but it indexes a mode of int shape "
                f"{shape} in layout {layout}; give an int there"
            )
        if len(c) != len(shape):
            raise ValueError(
                f"coordinate {c!r} has {len(c)} entries but the mode of shape "
                f"{_fmt(shape)} in layout {layout} has {len(shape)} modes"
            )
        return sum(_crd2idx(x, s, d, layout) for x, s, d in zip(c, shape, stride))
    i = _to_int(c, f"coordinate entry for layout {layout}")
    n = product(shape)
    if not 0 <= i < n:
        raise IndexError(
            f"coordinate entry {i} is out of range for the mode of shape "
            f"{_fmt(shape)} (size {n}, valid: 0..{n - 1}) in layout {layout}"
        )
    if isinstance(shape, int):
        return i * cast(int, stride)
    total = 0
    for s, d in zip(reversed(shape), reversed(cast(tuple[IntTuple, ...], stride))):
        i, r = divmod(i, product(s))
        total += _crd2idx(r, s, d, layout)
    return total


def _check_layout(value: object, name: str) -> Layout:
    if not isinstance(value, Layout):
        raise TypeError(f"{name} must be a Layout, got {value!r} ({_type_name(value)})")
    return value


def _check_world(value: object, name: str) -> int:
    n = _to_int(value, name)
    if n < 1:
        raise ValueError(f"{name} must be a positive int, got {n}")
    return n


# ---------------------------------------------------------------------------
# Algebra
# ---------------------------------------------------------------------------


def make_layout(*layouts: Layout) -> Layout:
    """Concatenate layouts: each argument becomes one top-level mode.

    >>> make_layout(Layout(2, 4), Layout(4, 1))
    Layout((2, 4), (4, 1))
    >>> make_layout(Layout((2, 3)), Layout(5, 0))
    Layout(((2, 3), 5), ((3, 1), 0))
    >>> make_layout(Layout(3))
    Layout((3,), (1,))
    """
    if not layouts:
        raise ValueError("make_layout() needs at least one Layout, got none")
    for k, x in enumerate(layouts):
        _check_layout(x, f"make_layout argument {k}")
    return Layout(tuple(x.shape for x in layouts), tuple(x.stride for x in layouts))


def coalesce(layout: Layout) -> Layout:
    """Flatten and merge modes, keeping the function on ``range(size)``.

    Size-1 modes are dropped; an outer mode i and the inner mode i+1 to its
    right merge when ``stride[i] == shape[i+1] * stride[i+1]``.  The result is
    flat: an int shape if one mode remains, ``Layout(1, 0)`` if none.

    >>> coalesce(Layout((2, (1, 4)), (4, (7, 1))))
    Layout(8, 1)
    >>> coalesce(Layout((2, 4), (1, 2)))
    Layout((2, 4), (1, 2))
    >>> coalesce(Layout((3, 1), (0, 5)))
    Layout(3, 0)
    >>> coalesce(Layout((1, 1)))
    Layout(1, 0)
    """
    _check_layout(layout, "coalesce(layout): layout")
    shapes: list[int] = []  # innermost (rightmost) first
    strides: list[int] = []
    for s, d in zip(reversed(layout._flat_shape), reversed(layout._flat_stride)):
        if s == 1:
            continue
        if shapes and d == shapes[-1] * strides[-1]:
            shapes[-1] *= s
        else:
            shapes.append(s)
            strides.append(d)
    if not shapes:
        return Layout(1, 0)
    if len(shapes) == 1:
        return Layout(shapes[0], strides[0])
    return Layout(tuple(reversed(shapes)), tuple(reversed(strides)))


def _compose(a: Layout, b: Layout) -> Layout:
    """``a o b`` for a Layout *b*, with b's shape (refined where needed)."""
    if b.cosize > a.size:
        raise ValueError(
            f"composition(a, b) is undefined: b reaches offset {b.cosize - 1} but "
            f"a is only defined on range({a.size}); a = {a}, b = {b}"
        )
    ca = coalesce(a)
    S = ca._flat_shape
    D = ca._flat_stride
    m = len(S)
    used = [0] * m  # largest digit value b can put into each mode of ca

    def leaf(s: int, d: int) -> tuple[IntTuple, IntTuple]:
        if s == 1:
            return 1, 0
        if d == 0:
            return s, 0
        shapes: list[int] = []  # fastest (a's innermost mode) first
        strides: list[int] = []
        rest_shape, rest_stride = s, d
        for k in range(m - 1, -1, -1):
            if rest_shape == 1:
                break
            if k == 0:
                n = rest_shape  # the outermost mode takes the rest
            elif rest_stride >= S[k]:
                if rest_stride % S[k]:
                    raise ValueError(
                        f"composition(a, b) is undefined: the stride {d} of b's mode "
                        f"{s}:{d} does not divide evenly into a's coalesced layout "
                        f"{ca} (stride divisibility); a = {a}, b = {b}"
                    )
                rest_stride //= S[k]
                continue
            else:
                if S[k] % rest_stride:
                    raise ValueError(
                        f"composition(a, b) is undefined: the stride {d} of b's mode "
                        f"{s}:{d} does not divide evenly into a's coalesced layout "
                        f"{ca} (stride divisibility); a = {a}, b = {b}"
                    )
                avail = S[k] // rest_stride
                if rest_shape <= avail:
                    n = rest_shape
                elif rest_shape % avail:
                    raise ValueError(
                        f"composition(a, b) is undefined: the size {s} of b's mode "
                        f"{s}:{d} does not split evenly over a's coalesced layout "
                        f"{ca} (shape divisibility); a = {a}, b = {b}"
                    )
                else:
                    n = avail
            used[k] += (n - 1) * rest_stride
            shapes.append(n)
            strides.append(rest_stride * D[k])
            rest_shape //= n
            rest_stride = 1
        if len(shapes) == 1:
            return shapes[0], strides[0]
        return tuple(reversed(shapes)), tuple(reversed(strides))

    def walk(shape: IntTuple, stride: IntTuple) -> tuple[IntTuple, IntTuple]:
        if isinstance(shape, int):
            return leaf(shape, cast(int, stride))
        pairs = [walk(x, y) for x, y in zip(shape, cast(tuple[IntTuple, ...], stride))]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)

    r_shape, r_stride = walk(b.shape, b.stride)
    for k in range(m):
        if used[k] > S[k] - 1:
            raise ValueError(
                f"composition(a, b) is undefined: b's modes overlap inside mode "
                f"{S[k]}:{D[k]} of a's coalesced layout {ca} (their offsets add up "
                f"past it), so a o b is not a layout of b's shape; a = {a}, b = {b}"
            )
    return Layout(r_shape, r_stride)


def composition(a: Layout, b: Tiler) -> Layout:
    """Function composition ``R(i) == a(b(i))`` for ``i in range(b.size)``.

    *b* is a Layout (R has b's shape, with a mode split into sub-modes where
    it crosses a mode of *a*), an int ``n`` (``Layout(n)``), or a tuple tiler
    that composes mode by mode: ``R[i] = composition(a[i], b[i])`` (``None``
    keeps ``a[i]``; modes of *a* past ``len(b)`` are kept).

    Raises ValueError when the result is not a layout of b's shape, i.e. when
    CuTe's conditions fail: b's image must lie in ``range(a.size)``, b's
    strides and sizes must divide evenly through a's coalesced modes, and
    b's modes must not overlap inside a mode of *a* (this check is
    conservative: a few exotic compositions that happen to be layouts are
    refused too).

    >>> composition(Layout((6, 2), (2, 1)), Layout(3, 2))
    Layout(3, 2)
    >>> a = Layout((4, 3), (1, 4))  # column-major 4x3: offset = r + 4c
    >>> composition(a, Layout((3, 4), (1, 3)))  # read it column by column
    Layout((3, 4), (4, 1))
    >>> composition(Layout((2, 4), (1, 2)), Layout(4, 2))  # 4:2 crosses a's modes
    Layout((2, 2), (1, 4))
    >>> composition(Layout((4, 6)), (2, Layout(3, 2)))  # by-mode tiler
    Layout((2, 3), (6, 2))
    """
    _check_layout(a, "composition(a, b): a")
    if isinstance(b, Layout):
        return _compose(a, b)
    if isinstance(b, (tuple, list)):
        return _by_mode(composition, a, b, "composition(a, b): the tiler b")
    if isinstance(b, bool) or not hasattr(b, "__index__"):
        raise TypeError(
            "composition(a, b): b must be a Layout, an int or a tuple tiler, got "
            f"{b!r} ({_type_name(b)})"
        )
    return _compose(a, Layout(_check_world(b, "composition(a, b): b")))


def _complement(
    layout: Layout, world_size: int | None, exact: bool, caller: str
) -> Layout:
    items = sorted(
        (d, s) for s, d in zip(layout._flat_shape, layout._flat_stride) if s != 1
    )
    modes: list[tuple[int, int]] = []  # (shape, stride), smallest stride first
    current = 1  # everything below `current` is covered by layout + modes
    for d, s in items:
        if d == 0:
            raise ValueError(
                f"{caller}: layout {layout} is not injective: its mode of size {s} "
                "has stride 0"
            )
        if d % current:
            raise ValueError(
                f"{caller}: layout {layout} is not complementable: the stride {d} of "
                f"its mode {s}:{d} is not a multiple of {current}, the extent of its "
                "modes with smaller strides (the modes overlap or interleave)"
            )
        if d > current:
            modes.append((d // current, current))
        current = s * d
    if world_size is None:
        outer = 1
    elif exact:
        if world_size % current:
            raise ValueError(
                f"{caller}: world_size must be a multiple of {current} (the extent "
                f"of layout {layout}), got {world_size}"
            )
        outer = world_size // current
    else:
        outer = -(-world_size // current)
    modes.append((outer, current))
    return coalesce(
        Layout(tuple(s for s, _ in reversed(modes)), tuple(d for _, d in reversed(modes)))
    )


def complement(layout: Layout, world_size: int | None = None) -> Layout:
    """The layout C that, with *layout*, tiles ``range(world_size)``.

    For every ``i in range(layout.size)`` and ``j in range(C.size)`` the
    offsets ``layout(i) + C(j)`` are distinct and cover ``range(world_size)``
    exactly; equivalently ``make_layout(C, layout)`` (C outer, layout inner)
    is a bijection onto ``range(world_size)``.  C's modes are ordered from the
    largest stride (left) to the smallest (right), so ``C(0), C(1), ...`` is
    increasing.  *world_size* defaults to the smallest valid one (the extent
    of *layout*: the largest ``shape * stride`` of its modes).

    Raises ValueError when *layout* is not injective, its modes overlap or
    interleave, or *world_size* is not a multiple of its extent.

    >>> complement(Layout(4, 1), 8)
    Layout(2, 4)
    >>> complement(Layout(2, 4), 8)
    Layout(4, 1)
    >>> complement(Layout(2, 2), 8)
    Layout((2, 2), (4, 1))
    >>> C = complement(Layout((2, 2), (1, 8)), 32)
    >>> C
    Layout((2, 4), (16, 2))
    >>> sorted(C(j) + Layout((2, 2), (1, 8))(i) for j in range(8) for i in range(4)) == list(range(32))
    True
    """
    _check_layout(layout, "complement(layout, world_size): layout")
    world = None
    if world_size is not None:
        world = _check_world(world_size, "complement(layout, world_size): world_size")
    return _complement(layout, world, True, "complement(layout, world_size)")


def right_inverse(layout: Layout) -> Layout:
    """A layout R with ``layout(R(i)) == i`` for all ``i in range(R.size)``.

    R covers the longest prefix ``range(n)`` of offsets that *layout* reaches
    through modes whose strides chain contiguously (1, then shape*stride, ...;
    a mode that overlaps the ones already chained is skipped).

    >>> right_inverse(Layout((2, 4), (1, 2)))  # inverse of a permutation
    Layout((4, 2), (1, 4))
    >>> right_inverse(Layout((2, 2), (1, 4)))  # only 0 and 1 are contiguous
    Layout(2, 2)
    >>> right_inverse(Layout(3, 2))
    Layout(1, 0)
    >>> right_inverse(Layout((2, 2, 2), (1, 1, 2)))  # skips the repeated 2:1
    Layout((2, 2), (1, 2))
    """
    _check_layout(layout, "right_inverse(layout): layout")
    weights = flatten(suffix_product(layout._flat_shape))
    items = sorted(
        (d, s, w)
        for s, d, w in zip(layout._flat_shape, layout._flat_stride, weights)
        if s != 1 and d != 0
    )
    modes: list[tuple[int, int]] = []  # smallest stride first
    current = 1
    for d, s, w in items:
        if d < current:
            continue  # overlaps the modes already taken: not needed
        if d > current:
            break  # offset `current` is never reached by a single mode
        modes.append((s, w))
        current = s * d
    if not modes:
        return Layout(1, 0)
    return coalesce(
        Layout(tuple(s for s, _ in reversed(modes)), tuple(w for _, w in reversed(modes)))
    )


def left_inverse(layout: Layout) -> Layout:
    """A layout L with ``L(layout(i)) == i`` for all ``i in range(layout.size)``.

    Needs an injective, complementable *layout* (ValueError otherwise).  L is
    defined on ``range(extent)``, where extent is the largest
    ``shape * stride`` of *layout*'s modes.

    >>> left_inverse(Layout((2, 4), (1, 2)))
    Layout((4, 2), (1, 4))
    >>> L = Layout((2, 3), (1, 4))  # offsets 0 4 8 1 5 9
    >>> inv = left_inverse(L)
    >>> [inv(L(i)) for i in range(L.size)]
    [0, 1, 2, 3, 4, 5]
    """
    _check_layout(layout, "left_inverse(layout): layout")
    c = _complement(layout, None, True, "left_inverse(layout)")
    return right_inverse(make_layout(c, layout))


def _tiler_layout(tiler: object, name: str) -> Layout:
    if isinstance(tiler, Layout):
        return tiler
    if isinstance(tiler, bool) or not hasattr(tiler, "__index__"):
        raise TypeError(
            f"{name} must be a Layout, an int or a tuple tiler, got {tiler!r} "
            f"({_type_name(tiler)})"
        )
    return Layout(_check_world(tiler, name))


def logical_divide(layout: Layout, tiler: Tiler) -> Layout:
    """Split *layout* into tiles: the result is ``(rest, tile)``.

    Lexicographic mirror of CuTe's ``logical_divide``:
    ``composition(layout, make_layout(complement(tiler, layout.size), tiler))``.
    The LAST mode is the tile (``layout`` composed with *tiler*), the first
    mode enumerates the tiles.  Same size and same offsets as *layout*.  A
    tuple *tiler* divides mode by mode.  Raises ValueError when *tiler* does
    not tile ``range(layout.size)`` or the composition is undefined.

    >>> logical_divide(Layout(8), Layout(2))  # 4 tiles of 2 consecutive
    Layout((4, 2), (2, 1))
    >>> logical_divide(Layout(8), Layout(2, 4))  # 4 tiles {i, i+4}
    Layout((4, 2), (1, 4))
    >>> logical_divide(Layout((4, 6)), (2, 3))  # by-mode: rows in 2s, cols in 3s
    Layout(((2, 2), (2, 3)), ((12, 6), (3, 1)))
    """
    _check_layout(layout, "logical_divide(layout, tiler): layout")
    if isinstance(tiler, (tuple, list)):
        return _by_mode(logical_divide, layout, tiler)
    b = _tiler_layout(tiler, "logical_divide(layout, tiler): tiler")
    rest = _complement(b, layout.size, True, "logical_divide(layout, tiler)")
    return composition(layout, make_layout(rest, b))


def _by_mode(op: Callable[[Layout, Any], Layout], layout: Layout, tiler: Sequence[Any], what: str = "") -> Layout:
    """``op`` (composition, logical_divide or logical_product) mode by mode:
    mode i by ``tiler[i]`` (None: kept), the modes past the tiler's kept;
    ``what`` names the tiler in the error (default: ``op(layout, tiler): the tiler``)."""
    if len(tiler) > layout.rank:
        what = what or f"{op.__name__}(layout, tiler): the tiler"
        raise ValueError(f"{what} has {len(tiler)} modes but layout {layout} has only {layout.rank}")
    modes = [layout[i] if t is None else op(layout[i], t) for i, t in enumerate(tiler)]
    modes.extend(layout[i] for i in range(len(tiler), layout.rank))
    return make_layout(*modes)


def logical_product(layout: Layout, tiler: Tiler) -> Layout:
    """Repeat *layout* as arranged by *tiler*: the result is ``(repetition, layout)``.

    Lexicographic mirror of CuTe's ``logical_product``: with
    ``C = complement(layout, layout.size * tiler.cosize)`` (rounded up to a
    multiple of layout's extent where needed, as CuTe does), the result is
    ``make_layout(composition(C, tiler), layout)``: the LAST mode is *layout*
    itself, the first places the copies.  Its size is
    ``layout.size * tiler.size``.  A tuple *tiler* works mode by mode.

    >>> logical_product(Layout(2), Layout(3))  # 3 copies of a 2-tile
    Layout((3, 2), (2, 1))
    >>> logical_product(Layout(2, 3), Layout(2))  # fill the gaps of 2:3 first
    Layout((2, 2), (1, 3))
    >>> logical_product(Layout(2), Layout((2, 3)))  # a 2x3 grid of 2-tiles
    Layout(((2, 3), 2), ((6, 2), 1))
    """
    _check_layout(layout, "logical_product(layout, tiler): layout")
    if isinstance(tiler, (tuple, list)):
        return _by_mode(logical_product, layout, tiler)
    b = _tiler_layout(tiler, "logical_product(layout, tiler): tiler")
    c = _complement(
        layout, layout.size * b.cosize, False, "logical_product(layout, tiler)"
    )
    return make_layout(composition(c, b), layout)


def groups(layout: Layout, axis: int) -> list[list[int]]:
    """The rank groups that communicate along *axis* of a process grid.

    *layout* maps grid coordinates to ranks and must be a bijection onto
    ``range(layout.size)``.  The mode ``M = layout[axis]`` lists the rank
    offsets along that axis; ``C = complement(M, layout.size)`` lists the
    first rank of each group.  The result is
    ``[[C(j) + M(i) for i in range(M.size)] for j in range(C.size)]``:
    groups sorted by their first rank, members in coordinate order.
    A negative *axis* counts from the end; an out-of-range one raises
    IndexError.

    >>> groups(Layout((2, 4), (1, 2)), 0)  # column-major: rank = r + 2c
    [[0, 1], [2, 3], [4, 5], [6, 7]]
    >>> groups(Layout((2, 4), (1, 2)), 1)
    [[0, 2, 4, 6], [1, 3, 5, 7]]
    """
    _check_layout(layout, "groups(layout, axis): layout")
    ax = _to_int(axis, "groups(layout, axis): axis")
    if not -layout.rank <= ax < layout.rank:
        raise IndexError(
            f"groups(layout, axis): axis {ax} is out of range for layout {layout} "
            f"of rank {layout.rank} (valid: {-layout.rank}..{layout.rank - 1})"
        )
    n = layout.size
    try:
        _complement(layout, n, True, "groups(layout, axis)")
    except ValueError:
        raise ValueError(
            f"groups(layout, axis): layout {layout} must be a bijection onto "
            f"range({n}) (a compact, possibly permuted rank layout)"
        ) from None
    mode = layout[ax]
    offsets = complement(mode, n)
    members = [mode(i) for i in range(mode.size)]
    return [[offsets(j) + r for r in members] for j in range(offsets.size)]
