"""The layout algebra's operations: composition, complement, the inverses,
logical divide and product, and the rank groups of a grid (the conventions
are in :mod:`dmatmul.layout`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from .algebra import (
    IntTuple,
    Layout,
    Tiler,
    _check_layout,
    _check_world,
    _to_int,
    _type_name,
    coalesce,
    flatten,
    make_layout,
    suffix_product,
)


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
