"""Tests for dmatmul.layout: algebraic laws on generated layouts, exact
tables, error handling and its examples.

Layouts are lexicographic (row-major): the rightmost mode varies fastest.
numpy's C-order ``unravel_index`` serves as an independent oracle for that.
"""

from __future__ import annotations

import copy
import math
import pickle
import random
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dmatmul.layout as layout_module
from dmatmul.layout import (
    IntTuple,
    Layout,
    coalesce,
    complement,
    composition,
    flatten,
    groups,
    left_inverse,
    logical_divide,
    logical_product,
    make_layout,
    product,
    right_inverse,
    suffix_product,
)

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

# ---------------------------------------------------------------------------
# Test-local helpers (independent of the module's internals)
# ---------------------------------------------------------------------------


def leaves(t: IntTuple) -> list[int]:
    if isinstance(t, int):
        return [t]
    out: list[int] = []
    for x in t:
        out.extend(leaves(x))
    return out


def rebuild(flat: list[int], profile: IntTuple) -> IntTuple:
    it = iter(flat)

    def rec(p: IntTuple) -> IntTuple:
        if isinstance(p, int):
            return next(it)
        return tuple(rec(x) for x in p)

    return rec(profile)


def offsets(L: Layout) -> list[int]:
    return [L(i) for i in range(L.size)]


def oracle_offsets(L: Layout) -> list[int]:
    """Offsets by numpy: C-order (row-major) unravel of the flattened shape."""
    shp = leaves(L.shape)
    strd = leaves(L.stride)
    n = math.prod(shp)
    coords = np.unravel_index(np.arange(n), shp, order="C")
    total = np.zeros(n, dtype=np.int64)
    for c, d in zip(coords, strd):
        total += c * d
    return [int(x) for x in total]


def injective(L: Layout) -> bool:
    o = offsets(L)
    return len(set(o)) == len(o)


def extent(L: Layout) -> int:
    """Largest shape*stride over the modes of size > 1 (1 if none)."""
    return max(
        [s * d for s, d in zip(leaves(L.shape), leaves(L.stride)) if s > 1], default=1
    )


def prime_factors(n: int) -> list[int]:
    out = []
    p = 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


# ---------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------

SIZES = st.integers(1, 6)


@st.composite
def shapes(draw: st.DrawFn, max_leaves: int = 4) -> IntTuple:
    """1-4 modes of size 1-6, sometimes nested, sometimes a bare int."""
    if draw(st.integers(0, 6)) == 0:
        return draw(SIZES)
    n_modes = draw(st.integers(1, max_leaves))
    budget = max_leaves
    modes: list[IntTuple] = []
    for k in range(n_modes):
        left_for_others = n_modes - k - 1
        room = budget - left_for_others
        if room >= 2 and draw(st.integers(0, 3)) == 0:
            width = draw(st.integers(1, min(3, room)))
            modes.append(tuple(draw(SIZES) for _ in range(width)))
            budget -= width
        else:
            modes.append(draw(SIZES))
            budget -= 1
    return tuple(modes)


KINDS = ("row", "col", "perm", "gappy", "broadcast", "random")
INJECTIVE_KINDS = ("row", "col", "perm", "gappy")
COMPACT_KINDS = ("row", "col", "perm")


def strides_for(draw: st.DrawFn, shape: IntTuple, kind: str) -> IntTuple:
    flat = leaves(shape)
    n = len(flat)
    strides = [0] * n
    if kind == "row":
        acc = 1
        for k in reversed(range(n)):
            strides[k] = acc
            acc *= flat[k]
    elif kind == "col":
        acc = 1
        for k in range(n):
            strides[k] = acc
            acc *= flat[k]
    elif kind in ("perm", "gappy", "broadcast"):
        order = draw(st.permutations(range(n)))
        acc = 1
        for k in order:
            if kind == "gappy":
                acc *= draw(st.integers(1, 3))
            strides[k] = acc
            acc *= flat[k]
        if kind == "broadcast":
            zero = draw(st.lists(st.booleans(), min_size=n, max_size=n))
            if not any(zero):
                zero[draw(st.integers(0, n - 1))] = True
            strides = [0 if z else d for z, d in zip(zero, strides)]
    elif kind == "random":
        strides = [draw(st.integers(0, 12)) for _ in range(n)]
    else:  # pragma: no cover - test bug
        raise AssertionError(kind)
    return rebuild(strides, shape)


@st.composite
def layouts(draw: st.DrawFn, kinds: tuple[str, ...] = KINDS, max_leaves: int = 4) -> Layout:
    shape = draw(shapes(max_leaves))
    kind = draw(st.sampled_from(kinds))
    return Layout(shape, strides_for(draw, shape, kind))


@st.composite
def tilers_of(draw: st.DrawFn, n: int) -> Layout:
    """An injective layout whose extent divides n (so it tiles range(n)).

    The prime factors of n are dealt out to 1-3 modes, to gaps between them
    and to an unused outer part; the modes are then listed in random order.
    """
    factors = draw(st.permutations(prime_factors(n)))
    r = draw(st.integers(1, 3))
    # slots: gap0, mode0, gap1, mode1, ..., outer
    slots = [1] * (2 * r + 1)
    for f in factors:
        slots[draw(st.integers(0, 2 * r))] *= f
    shp: list[int] = []
    strd: list[int] = []
    acc = 1
    for j in range(r):
        acc *= slots[2 * j]
        shp.append(slots[2 * j + 1])
        strd.append(acc)
        acc *= slots[2 * j + 1]
    order = draw(st.permutations(range(r)))
    shp = [shp[k] for k in order]
    strd = [strd[k] for k in order]
    if r == 1 and draw(st.booleans()):
        return Layout(shp[0], strd[0])
    return Layout(tuple(shp), tuple(strd))


@st.composite
def factor_layouts(draw: st.DrawFn, n: int) -> Layout:
    """A layout whose shape factors n and whose offsets stay below n."""
    factors = draw(st.permutations(prime_factors(n)))
    r = draw(st.integers(1, 3))
    shp = [1] * r
    for f in factors:
        shp[draw(st.integers(0, r - 1))] *= f
    kind = draw(st.sampled_from(("row", "col", "perm")))
    shape: IntTuple = tuple(shp)
    return Layout(shape, strides_for(draw, shape, kind))


@st.composite
def composable_pairs(draw: st.DrawFn) -> tuple[Layout, Layout]:
    a = draw(layouts())
    how = draw(st.integers(0, 2))
    if how == 0:
        b = draw(factor_layouts(a.size))
    elif how == 1:
        b = draw(tilers_of(a.size))
    else:
        b = draw(layouts(max_leaves=3).filter(lambda x: x.cosize <= a.size))
    return a, b


# ---------------------------------------------------------------------------
# Construction, evaluation, equality
# ---------------------------------------------------------------------------


@SETTINGS
@given(shapes())
def test_default_stride_is_row_major_suffix_product(shape: IntTuple) -> None:
    L = Layout(shape)
    flat = leaves(shape)
    expect = [math.prod(flat[k + 1 :]) for k in range(len(flat))]
    assert leaves(L.stride) == expect
    assert L.stride == rebuild(expect, shape)  # nesting kept
    assert L.stride == suffix_product(shape)
    assert offsets(L) == list(range(L.size))
    assert L == Layout(shape, L.stride)


@SETTINGS
@given(layouts())
def test_call_matches_numpy_row_major_oracle(L: Layout) -> None:
    assert offsets(L) == oracle_offsets(L)
    assert L.size == math.prod(leaves(L.shape)) == product(L.shape)
    assert L.cosize == max(offsets(L)) + 1
    assert L.rank == len(L) == len(list(L))
    # per-mode coordinates: entry k is a flat index within mode k
    mode_sizes = [m.size for m in L]
    for i in range(L.size):
        if L.rank == 1:
            assert L((i,) if isinstance(L.shape, tuple) else i) == L(i)
            continue
        crd = tuple(int(c) for c in np.unravel_index(i, mode_sizes))
        assert L(crd) == L(*crd) == L(i)
        assert L(crd) == sum(m(c) for m, c in zip(L, crd))


def test_nested_coordinates() -> None:
    L = Layout((2, (3, 4)))
    assert L.stride == (12, (4, 1))
    assert L(1, (2, 3)) == 12 + 8 + 3
    assert L((1, 11)) == L((1, (2, 3))) == L(23) == 23
    assert L[1]((2, 3)) == 11
    assert L[-1] == L[1] == Layout((3, 4), (4, 1))
    assert Layout(6)[0] == Layout(6)[-1] == Layout(6)


def test_index_decomposition_is_lexicographic() -> None:
    L = Layout((2, 4), (10, 1))
    assert L(5) == 11  # index 5 is coordinate (1, 1)
    col = Layout((2, 4), (1, 2))
    assert offsets(col) == [0, 2, 4, 6, 1, 3, 5, 7]
    assert Layout((2, 3)).stride == (3, 1)
    assert Layout(((2, 3), 4)).stride == ((12, 4), 1)
    assert Layout(5).stride == 1


@SETTINGS
@given(layouts())
def test_equal_layouts_hash_equal(L: Layout) -> None:
    as_lists = Layout(
        rebuild(leaves(L.shape), L.shape), rebuild(leaves(L.stride), L.stride)
    )
    with_numpy = Layout(
        rebuild([np.int64(x) for x in leaves(L.shape)], L.shape),  # type: ignore[misc]
        rebuild([np.int32(x) for x in leaves(L.stride)], L.stride),  # type: ignore[misc]
    )
    for other in (as_lists, with_numpy, pickle.loads(pickle.dumps(L)), copy.deepcopy(L)):
        assert other == L
        assert hash(other) == hash(L)
        assert not (other != L)
    assert type(leaves(with_numpy.shape)[0]) is int
    assert len({L, as_lists, with_numpy}) == 1


def test_equality_is_structural() -> None:
    assert Layout((2, 4)) == Layout((2, 4), (4, 1))
    assert Layout([2, 4], [4, 1]) == Layout((2, 4))  # lists become tuples
    assert Layout((2, 4)).shape == (2, 4)
    assert Layout(4) != Layout((4,))
    assert Layout((2, 4)) != Layout((2, 4), (1, 2))
    assert Layout(1, 0) != Layout(1, 1)
    assert coalesce(Layout(1, 1)) == coalesce(Layout((1, 1), (0, 3)))
    assert Layout(3) != (3, 1)
    assert repr(Layout((2, 4))) == "Layout((2, 4), (4, 1))"
    assert str(Layout((2, (3, 4)), (12, (4, 1)))) == "(2,(3,4)):(12,(4,1))"
    assert str(Layout(4, 2)) == "4:2"
    assert str(Layout((4,))) == "(4):(1)"
    for L in (Layout((2, (3, 4))), Layout((4,), (0,)), Layout(3, 7)):
        assert eval(repr(L), {"Layout": Layout}) == L


def test_layout_is_immutable() -> None:
    L = Layout((2, 4))
    for name, value in (("shape", (8,)), ("stride", (1, 2)), ("_shape", 3), ("x", 1)):
        with pytest.raises(AttributeError):
            setattr(L, name, value)
    with pytest.raises(AttributeError):
        del L.shape
    with pytest.raises(AttributeError):
        del L._stride
    assert L == Layout((2, 4), (4, 1))
    assert not hasattr(L, "__dict__")


def test_int_tuple_helpers() -> None:
    assert flatten(((2, 3), (4, (5,)))) == (2, 3, 4, 5)
    assert flatten(7) == (7,)
    assert product(((2, 3), 4)) == 24
    assert suffix_product((2, (3, 4))) == (12, (4, 1))


# ---------------------------------------------------------------------------
# make_layout and coalesce
# ---------------------------------------------------------------------------


@SETTINGS
@given(st.lists(layouts(max_leaves=2), min_size=1, max_size=3))
def test_make_layout_concatenates_modes(parts: list[Layout]) -> None:
    M = make_layout(*parts)
    assert M.rank == len(parts)
    assert list(M) == parts
    assert M.size == math.prod(p.size for p in parts)
    i = M.size - 1
    # the last index is the last index of every part
    assert M(i) == sum(p(p.size - 1) for p in parts)


@SETTINGS
@given(layouts())
def test_coalesce_keeps_function_and_never_adds_modes(L: Layout) -> None:
    C = coalesce(L)
    assert C.size == L.size
    assert offsets(C) == offsets(L)
    assert len(leaves(C.shape)) <= len(leaves(L.shape))
    if all(isinstance(x, int) for x in (L.shape if isinstance(L.shape, tuple) else (L.shape,))):
        assert C.rank <= L.rank
    # flat, no size-1 modes (unless the whole thing is 1:0), idempotent
    assert all(isinstance(x, int) for x in (C.shape if isinstance(C.shape, tuple) else (C.shape,)))
    if C.size == 1:
        assert C == Layout(1, 0)
    else:
        assert 1 not in leaves(C.shape)
    assert coalesce(C) == C
    # no two adjacent modes could still merge
    s, d = leaves(C.shape), leaves(C.stride)
    assert all(d[k] != s[k + 1] * d[k + 1] for k in range(len(s) - 1))


def test_coalesce_tables() -> None:
    assert coalesce(Layout((2, 4))) == Layout(8, 1)
    assert coalesce(Layout((2, 4), (1, 2))) == Layout((2, 4), (1, 2))
    assert coalesce(Layout(((2, 3), 4))) == Layout(24, 1)
    assert coalesce(Layout((2, 1, 3), (0, 5, 0))) == Layout(6, 0)
    assert coalesce(Layout((3, 2), (2, 1))) == Layout(6, 1)
    assert coalesce(Layout((3, 2), (4, 1))) == Layout((3, 2), (4, 1))
    assert coalesce(Layout(1, 7)) == Layout(1, 0)
    assert coalesce(Layout((4, 1), (1, 9))) == Layout(4, 1)


# ---------------------------------------------------------------------------
# composition
# ---------------------------------------------------------------------------


@settings(SETTINGS, max_examples=150)
@given(composable_pairs())
def test_composition_is_function_composition_where_defined(
    pair: tuple[Layout, Layout],
) -> None:
    a, b = pair
    try:
        R = composition(a, b)
    except ValueError:
        return
    assert R.size == b.size
    assert offsets(R) == [a(b(i)) for i in range(b.size)]
    if isinstance(b.shape, tuple):  # R keeps b's modes (each maybe refined)
        assert R.rank == b.rank
        for k in range(b.rank):
            assert offsets(R[k]) == [a(b[k](j)) for j in range(b[k].size)]
    # (an int-shaped b may come back split into several modes)


@SETTINGS
@given(st.data())
def test_composition_with_a_contiguous_layout_is_always_defined(data: st.DataObject) -> None:
    shape = data.draw(shapes())
    a = Layout(shape)  # row-major: the identity on range(size)
    b = data.draw(layouts(max_leaves=3).filter(lambda x: x.cosize <= a.size))
    R = composition(a, b)
    assert offsets(R) == offsets(b)


@SETTINGS
@given(layouts(kinds=INJECTIVE_KINDS))
def test_composition_with_inverses(L: Layout) -> None:
    # L o right_inverse(L) is the identity on its domain
    R = right_inverse(L)
    assert offsets(composition(L, R)) == list(range(R.size))
    # compact layouts: left_inverse o L is the identity
    if L.cosize == L.size:
        inv = left_inverse(L)
        assert offsets(composition(inv, L)) == list(range(L.size))


@SETTINGS
@given(st.data())
def test_composition_by_mode_tiler(data: st.DataObject) -> None:
    a = data.draw(layouts(kinds=("row", "col", "perm"), max_leaves=3))
    tiler: list[Layout | int | None] = []
    for m in list(a)[: data.draw(st.integers(1, a.rank))]:
        choice = data.draw(st.integers(0, 2))
        if choice == 0:
            tiler.append(None)
        elif choice == 1:
            tiler.append(data.draw(st.integers(1, m.size)))
        else:
            tiler.append(data.draw(factor_layouts(m.size)))
    try:
        R = composition(a, tuple(tiler))
    except ValueError:
        return
    assert R.rank == a.rank
    for k in range(a.rank):
        t = tiler[k] if k < len(tiler) else None
        if t is None:
            assert R[k] == a[k]
        else:
            tl = t if isinstance(t, Layout) else Layout(t)
            assert offsets(R[k]) == [a[k](tl(j)) for j in range(tl.size)]


def test_composition_tables() -> None:
    assert composition(Layout((6, 2), (2, 1)), Layout(3, 2)) == Layout(3, 2)
    col = Layout((4, 3), (1, 4))  # offset = r + 4c
    assert composition(col, Layout((3, 4), (1, 3))) == Layout((3, 4), (4, 1))
    # an int-shaped b is refined where it crosses a's modes
    assert composition(col, Layout(12, 1)) == Layout((4, 3), (1, 4))
    assert composition(Layout((2, 4), (1, 2)), Layout(4, 2)) == Layout((2, 2), (1, 4))
    assert composition(Layout(8), Layout((2, 2), (1, 4))) == Layout((2, 2), (1, 4))
    assert composition(Layout((4, 6)), 24) == Layout(24, 1)
    assert composition(Layout((2, 3), (0, 1)), Layout(6, 1)) == Layout((2, 3), (0, 1))
    assert composition(Layout(8), Layout(3, 0)) == Layout(3, 0)
    assert composition(Layout(1, 0), Layout((1, 4), (5, 0))) == Layout((1, 4), (0, 0))
    assert composition(Layout((4, 6)), (2, Layout(3, 2))) == Layout((2, 3), (6, 2))
    assert composition(Layout((4, 6)), (None, 3)) == Layout((4, 3), (6, 1))


def test_composition_undefined_raises() -> None:
    # b's image leaves a's domain
    with pytest.raises(ValueError, match="only defined on range"):
        composition(Layout(4, 1), Layout(8, 1))
    # b's modes overlap inside a mode of a: a(b(3)) = a(2) = 10, not 1 + 1
    with pytest.raises(ValueError, match="overlap"):
        composition(Layout((2, 2), (10, 1)), Layout((2, 2), (1, 1)))
    # stride divisibility: stride 3 across a's inner mode of size 2
    with pytest.raises(ValueError, match="stride divisibility"):
        composition(Layout((3, 2), (1, 3)), Layout(2, 3))
    # shape divisibility: 6 consecutive elements across a mode of size 4
    with pytest.raises(ValueError, match="shape divisibility"):
        composition(Layout((2, 4), (1, 2)), Layout(6, 1))
    with pytest.raises(ValueError, match="tiler b has 3 modes"):
        composition(Layout((2, 4)), (1, 1, 1))
    with pytest.raises(TypeError, match="b must be a Layout"):
        composition(Layout(4), "4")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a must be a Layout"):
        composition((4, 1), Layout(4))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# complement
# ---------------------------------------------------------------------------


@SETTINGS
@given(layouts(kinds=INJECTIVE_KINDS), st.integers(1, 3))
def test_complement_tiles_the_world(L: Layout, mult: int) -> None:
    world = extent(L) * mult
    C = complement(L, world)
    assert C.size * L.size == world
    sums = [c + l for c in offsets(C) for l in offsets(L)]
    assert sorted(sums) == list(range(world))  # disjoint and covering
    # complement OUTER, layout inner: a bijection, listed in this order
    assert offsets(make_layout(C, L)) == sums
    # C's offsets are increasing, starting at 0 (groups come out sorted)
    oc = offsets(C)
    assert oc[0] == 0
    assert all(x < y for x, y in zip(oc, oc[1:]))
    # the default world is the smallest valid one
    C0 = complement(L)
    assert C0.size * L.size == extent(L)


@settings(SETTINGS, max_examples=120)
@given(layouts(kinds=("random", "broadcast", "gappy")), st.integers(1, 3))
def test_complement_is_sound_or_refuses(L: Layout, mult: int) -> None:
    # on arbitrary strides: either a ValueError or an exact tiling
    world = extent(L) * mult
    try:
        C = complement(L, world)
    except ValueError:
        return
    assert injective(L)
    assert sorted(c + l for c in offsets(C) for l in offsets(L)) == list(range(world))


@SETTINGS
@given(layouts(kinds=INJECTIVE_KINDS), st.integers(1, 3), st.data())
def test_complement_refuses_world_not_a_multiple(L: Layout, mult: int, data: st.DataObject) -> None:
    e = extent(L)
    if e == 1:
        return
    world = e * mult - data.draw(st.integers(1, e - 1))
    with pytest.raises(ValueError, match="multiple of"):
        complement(L, world)


@SETTINGS
@given(layouts(kinds=("broadcast",)))
def test_complement_refuses_non_injective(L: Layout) -> None:
    if any(s > 1 and d == 0 for s, d in zip(leaves(L.shape), leaves(L.stride))):
        with pytest.raises(ValueError, match="not injective"):
            complement(L, 10**6)
        with pytest.raises(ValueError, match="not injective"):
            left_inverse(L)


def test_complement_tables() -> None:
    assert complement(Layout(4, 1), 8) == Layout(2, 4)
    assert complement(Layout(2, 4), 8) == Layout(4, 1)
    assert complement(Layout(2, 1), 8) == Layout(4, 2)
    assert complement(Layout(4, 2), 8) == Layout(2, 1)
    assert complement(Layout(2, 2), 8) == Layout((2, 2), (4, 1))
    assert complement(Layout((2, 2), (1, 8)), 32) == Layout((2, 4), (16, 2))
    assert complement(Layout(3, 1), 12) == Layout(4, 3)
    assert complement(Layout((2, 3), (3, 1)), 6) == Layout(1, 0)
    assert complement(Layout(2, 2)) == Layout(2, 1)
    assert complement(Layout((3, 1), (2, 0)), 12) == Layout((2, 2), (6, 1))
    assert complement(Layout(1, 0), 5) == Layout(5, 1)


def test_complement_errors() -> None:
    with pytest.raises(ValueError, match="not injective"):
        complement(Layout((2, 2), (1, 0)), 8)
    with pytest.raises(ValueError, match="not complementable"):
        complement(Layout((2, 2), (1, 1)), 8)  # overlapping modes
    with pytest.raises(ValueError, match="not complementable"):
        complement(Layout((2, 2), (2, 3)), 12)  # offsets 0 2 3 5: interleaved
    with pytest.raises(ValueError, match="not complementable"):
        complement(Layout((2, 2), (3, 1)), 12)  # offsets 0 1 3 4: 2 can't fit
    with pytest.raises(ValueError, match="multiple of 4"):
        complement(Layout(4, 1), 6)
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        complement(Layout(4, 1), 0)
    with pytest.raises(TypeError, match="world_size must be an int"):
        complement(Layout(4, 1), True)
    with pytest.raises(TypeError, match="world_size must be an int"):
        complement(Layout(4, 1), 8.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="layout must be a Layout"):
        complement((4, 1), 8)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# inverses
# ---------------------------------------------------------------------------


@SETTINGS
@given(layouts(kinds=INJECTIVE_KINDS))
def test_left_inverse(L: Layout) -> None:
    inv = left_inverse(L)
    assert [inv(L(i)) for i in range(L.size)] == list(range(L.size))
    assert inv.size == extent(L)


@SETTINGS
@given(layouts())
def test_right_inverse(L: Layout) -> None:
    R = right_inverse(L)
    assert [L(R(i)) for i in range(R.size)] == list(range(R.size))
    if L.cosize == L.size and injective(L):  # a permutation of range(size)
        assert R.size == L.size
        assert R == left_inverse(L)


def test_inverse_tables() -> None:
    col = Layout((2, 4), (1, 2))
    assert left_inverse(col) == right_inverse(col) == Layout((4, 2), (1, 4))
    assert right_inverse(Layout((2, 2), (1, 4))) == Layout(2, 2)
    assert right_inverse(Layout(3, 2)) == Layout(1, 0)
    assert right_inverse(Layout((3, 2), (0, 1))) == Layout(2, 1)
    # an overlapping mode is skipped, the chain goes on: offsets 0..3 reached
    R = right_inverse(Layout((2, 2, 2), (1, 1, 2)))
    assert R == Layout((2, 2), (1, 2))
    assert [Layout((2, 2, 2), (1, 1, 2))(R(i)) for i in range(4)] == [0, 1, 2, 3]
    assert left_inverse(Layout(8)) == Layout(8, 1)
    assert left_inverse(Layout(4, 2)) == Layout((4, 2), (1, 4))
    with pytest.raises(ValueError, match="left_inverse"):
        left_inverse(Layout((2, 2), (1, 1)))


# ---------------------------------------------------------------------------
# logical_divide and logical_product
# ---------------------------------------------------------------------------


@settings(SETTINGS, max_examples=100)
@given(st.data())
def test_logical_divide_keeps_size_and_offsets(data: st.DataObject) -> None:
    a = data.draw(layouts())
    t = data.draw(tilers_of(a.size))
    try:
        D = logical_divide(a, t)
    except ValueError:
        assert coalesce(a).rank > 1  # a contiguous layout always divides
        return
    assert D.size == a.size
    assert sorted(offsets(D)) == sorted(offsets(a))
    assert D.rank == 2
    # the LAST mode is the tile: a composed with the tiler
    assert offsets(D[1]) == [a(t(j)) for j in range(t.size)]
    # the first mode enumerates the tiles, in the complement's order
    rest = complement(t, a.size)
    assert offsets(D[0]) == [a(rest(j)) for j in range(rest.size)]


@SETTINGS
@given(st.data())
def test_logical_divide_of_contiguous_layout_is_defined(data: st.DataObject) -> None:
    a = Layout(data.draw(shapes()))
    t = data.draw(tilers_of(a.size))
    D = logical_divide(a, t)
    assert sorted(offsets(D)) == list(range(a.size))
    assert offsets(D) == offsets(make_layout(complement(t, a.size), t))


@SETTINGS
@given(layouts(kinds=INJECTIVE_KINDS, max_leaves=3), layouts(max_leaves=2))
def test_logical_product_size_and_modes(a: Layout, b: Layout) -> None:
    try:
        P = logical_product(a, b)
    except ValueError:
        assert a.cosize != a.size  # a compact layout always multiplies
        return
    assert P.size == a.size * b.size
    assert P.rank == 2
    assert P[1] == a  # the LAST mode is the layout itself
    if injective(b):
        assert injective(P)
    # the first mode places the copies of a outside a's own offsets
    reps = set(offsets(P[0]))
    assert reps.isdisjoint(set(offsets(a)) - {0})


@pytest.mark.parametrize("op", [logical_divide, logical_product])
def test_by_mode_tilers(op: Callable[..., Layout]) -> None:
    """A tuple tiler works mode by mode: None keeps a mode, modes past it are kept."""
    a = Layout((4, 6))
    assert op(a, (None, 3)) == make_layout(a[0], op(a[1], 3))
    assert op(a, (2,)) == make_layout(op(a[0], 2), a[1])
    with pytest.raises(ValueError, match=rf"{op.__name__}\(layout, tiler\): the tiler has 3 modes but layout .* only 2"):
        op(a, (2, 3, 1))


def test_divide_and_product_tables() -> None:
    assert logical_divide(Layout(8), Layout(2)) == Layout((4, 2), (2, 1))
    assert logical_divide(Layout(8), 2) == Layout((4, 2), (2, 1))
    assert logical_divide(Layout(8), Layout(2, 4)) == Layout((4, 2), (1, 4))
    assert logical_divide(Layout((4, 6)), (2, 3)) == Layout(
        ((2, 2), (2, 3)), ((12, 6), (3, 1))
    )
    assert logical_divide(Layout((4, 6)), (None, 3)) == Layout(
        (4, (2, 3)), (6, (3, 1))
    )
    # column-major 2x4 in tiles of 4 consecutive flat indices (one row each)
    assert logical_divide(Layout((2, 4), (1, 2)), 4) == Layout((2, 4), (1, 2))
    assert logical_product(Layout(2), Layout(3)) == Layout((3, 2), (2, 1))
    assert logical_product(Layout(2), 3) == Layout((3, 2), (2, 1))
    assert logical_product(Layout(2, 3), Layout(2)) == Layout((2, 2), (1, 3))
    assert logical_product(Layout(2), Layout((2, 3))) == Layout(((2, 3), 2), ((6, 2), 1))
    assert logical_product(Layout((2, 2)), (None, Layout(3))) == Layout(
        (2, (3, 2)), (2, (2, 1))
    )
    with pytest.raises(ValueError, match="multiple of"):
        logical_divide(Layout(6), Layout(4))
    with pytest.raises(ValueError, match="tiler has 3 modes"):
        logical_divide(Layout((2, 3)), (1, 1, 1))
    with pytest.raises(TypeError, match="tiler must be a Layout"):
        logical_product(Layout(2), 2.0)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# groups: the process-grid use
# ---------------------------------------------------------------------------


def test_groups_exact_tables() -> None:
    row = Layout((2, 4))  # rank = 4r + c
    col = Layout((2, 4), (1, 2))  # rank = r + 2c
    assert row == Layout((2, 4), (4, 1))
    assert groups(row, 0) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert groups(row, 1) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert groups(col, 0) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups(col, 1) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert groups(row, -1) == groups(row, 1)
    # the recipe in the brief, spelled out
    for L, a in ((row, 0), (row, 1), (col, 0), (col, 1)):
        C = complement(L[a], 8)
        assert groups(L, a) == [
            [C(j) + L[a](i) for i in range(L[a].size)] for j in range(C.size)
        ]
    assert groups(Layout(4), 0) == [[0, 1, 2, 3]]
    assert groups(Layout((1, 3)), 0) == [[0], [1], [2]]


@SETTINGS
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data())
def test_groups_are_the_lines_of_the_rank_grid(dims: list[int], data: st.DataObject) -> None:
    shape = tuple(dims)
    L = Layout(shape, strides_for(data.draw, shape, data.draw(st.sampled_from(COMPACT_KINDS))))
    ranks = np.array(offsets(L)).reshape(shape)  # ranks[coord] = L(coord), row-major
    for axis in range(len(dims)):
        lines = np.moveaxis(ranks, axis, -1).reshape(-1, dims[axis]).tolist()
        expect = sorted(lines, key=lambda g: g[0])
        got = groups(L, axis)
        assert got == expect
        assert sorted(r for g in got for r in g) == list(range(L.size))


def test_groups_errors() -> None:
    with pytest.raises(IndexError, match="axis 2 is out of range"):
        groups(Layout((2, 4)), 2)
    with pytest.raises(IndexError, match="axis -3"):
        groups(Layout((2, 4)), -3)
    with pytest.raises(TypeError, match="axis must be an int"):
        groups(Layout((2, 4)), True)
    with pytest.raises(ValueError, match="bijection"):
        groups(Layout((2, 4), (8, 1)), 0)  # gappy: ranks 0-3, 8-11
    with pytest.raises(ValueError, match="bijection"):
        groups(Layout((2, 4), (0, 1)), 0)  # broadcast
    with pytest.raises(TypeError, match="layout must be a Layout"):
        groups((2, 4), 0)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Errors in construction and evaluation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, stride, exc, pattern",
    [
        (0, None, ValueError, "shape entries must be positive"),
        ((2, 0), None, ValueError, "shape entries must be positive"),
        (-1, None, ValueError, "shape entries must be positive"),
        ((), None, ValueError, "empty tuple"),
        ((2, ()), None, ValueError, "empty tuple"),
        (True, None, TypeError, "shape must be an int"),
        ((2, True), None, TypeError, "shape must be an int"),
        ((2, np.True_), None, TypeError, "shape must be an int"),
        ("4", None, TypeError, "shape must be an int"),
        (2.0, None, TypeError, "shape must be an int"),
        (None, None, TypeError, "shape must be an int"),
        ((2, 4), (1,), ValueError, "same profile"),
        ((2, 4), 1, ValueError, "same profile"),
        (4, (1,), ValueError, "same profile"),
        ((2, (2, 2)), (1, 2, 3), ValueError, "same profile"),
        ((2, 4), (4, -1), ValueError, "stride entries must be non-negative"),
        ((2, 4), (4, False), TypeError, "stride must be an int"),
        ((2, 4), (4, 1.0), TypeError, "stride must be an int"),
    ],
)
def test_bad_layouts_are_refused(
    shape: object, stride: object, exc: type[Exception], pattern: str
) -> None:
    with pytest.raises(exc, match=pattern):
        Layout(shape, stride)  # type: ignore[arg-type]


def test_bad_coordinates_are_refused() -> None:
    L = Layout((2, 4))
    with pytest.raises(IndexError, match="out of range"):
        L(8)
    with pytest.raises(IndexError, match="out of range"):
        L(-1)
    with pytest.raises(IndexError, match="out of range"):
        L(2, 0)
    with pytest.raises(IndexError, match="out of range"):
        L((0, 4))
    with pytest.raises(IndexError, match="out of range"):
        Layout(3)(3)
    with pytest.raises(ValueError, match="has 3 entries"):
        L((0, 0, 0))
    with pytest.raises(ValueError, match="int shape"):
        L((0, (0, 1)))
    with pytest.raises(ValueError, match="int shape"):
        Layout(4)((1,))
    with pytest.raises(TypeError, match="must be an int"):
        L(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be an int"):
        L(True)
    with pytest.raises(TypeError, match="must be an int"):
        L((0, "1"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs a coordinate"):
        L()
    with pytest.raises(IndexError, match="mode index 2"):
        L[2]
    with pytest.raises(IndexError, match="mode index -3"):
        L[-3]
    with pytest.raises(IndexError, match="mode index 1"):
        Layout(4)[1]
    with pytest.raises(TypeError, match="mode index must be an int"):
        L["0"]  # type: ignore[index]
    with pytest.raises(ValueError, match="at least one Layout"):
        make_layout()
    with pytest.raises(TypeError, match="make_layout argument 1"):
        make_layout(Layout(2), (2, 1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="coalesce"):
        coalesce((2, 1))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Examples (the doctests themselves run in test_package.test_doctests)
# ---------------------------------------------------------------------------


def test_every_public_function_has_an_example() -> None:
    public: list[Callable[..., object]] = [
        getattr(layout_module, name)
        for name in layout_module.__all__
        if callable(getattr(layout_module, name)) and name not in ("IntTuple", "Tiler")
    ]
    for fn in public:
        assert fn.__doc__ and ">>>" in fn.__doc__, fn.__name__


# ---------------------------------------------------------------------------
# A brute-force cross-check of composition on many small random pairs
# ---------------------------------------------------------------------------


def test_composition_random_sweep_is_sound_and_often_defined() -> None:
    rng = random.Random(1234)
    defined = 0
    trials = 400
    for _ in range(trials):
        a_shape = tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 3)))
        a_stride = tuple(rng.choice([0, 1, 2, 3, 4, 6, 8, 12]) for _ in a_shape)
        a = Layout(a_shape, a_stride)
        b_shape = tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 3)))
        b_stride = tuple(rng.randint(0, max(1, a.size // 2)) for _ in b_shape)
        b = Layout(b_shape, b_stride)
        try:
            R = composition(a, b)
        except ValueError:
            continue
        defined += 1
        assert offsets(R) == [a(b(i)) for i in range(b.size)], (a, b, R)
    assert defined > trials // 10
