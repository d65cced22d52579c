"""The layout algebra's values: IntTuples, :class:`Layout`, ``make_layout``
and ``coalesce`` (the conventions are in :mod:`dmatmul.layout`)."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator
from typing import TypeAlias, Union, cast

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
