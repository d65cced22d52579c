"""Named process meshes and N-D Sharded distributions, against numpy brute force."""

from __future__ import annotations

import dataclasses
import math
import pickle
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dmatmul as dm

NAMES = ("a", "b", "c", "d")


# --------------------------------------------------------------------------- #
# brute force: the ranks as a numpy array of the mesh's shape (row-major)
# --------------------------------------------------------------------------- #
def rank_array(shape: tuple[int, ...]) -> np.ndarray:
    return np.arange(math.prod(shape)).reshape(shape)


def brute_groups(shape: tuple[int, ...], names: tuple[str, ...], axes: tuple[str, ...]) -> list[list[int]]:
    """Move ``axes`` last, in their order, and read off one group per row."""
    idx = [names.index(a) for a in axes]
    rest = [i for i in range(len(shape)) if i not in idx]
    n = math.prod(shape[i] for i in idx)
    rows = np.transpose(rank_array(shape), rest + idx).reshape(-1, n).tolist()
    return sorted(rows, key=lambda g: g[0])


def brute_block(a: np.ndarray, mesh: dm.ProcessMesh, spec: tuple, rank: int) -> np.ndarray:
    """Rank ``rank``'s block by slicing: its position along each dimension's
    axes (numpy's ravel of its coordinates) picks nvmath's uneven part."""
    coords = np.unravel_index(rank, mesh.shape)
    slices = []
    for size, entry in zip(a.shape, spec):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        dims = [mesh.axis_names.index(x) for x in axes]
        parts = [mesh.shape[i] for i in dims]
        n = math.prod(parts)
        pos = int(np.ravel_multi_index([coords[i] for i in dims], parts)) if dims else 0
        lengths = [size // n + (k < size % n) for k in range(n)]
        start = sum(lengths[:pos])
        slices.append(slice(start, start + lengths[pos]))
    return a[tuple(slices)]


@st.composite
def meshes(draw, max_axes: int = 4, max_size: int = 24):
    ndim = draw(st.integers(1, max_axes))
    shape: list[int] = []
    for _ in range(ndim):
        room = max(1, max_size // max(1, math.prod(shape)))
        shape.append(draw(st.integers(1, min(4, room))))
    return dm.ProcessMesh(tuple(shape), NAMES[:ndim])


@st.composite
def axis_tuples(draw, mesh: dm.ProcessMesh):
    return tuple(draw(st.permutations(mesh.axis_names))[: draw(st.integers(0, mesh.ndim))])


@st.composite
def specs(draw, mesh: dm.ProcessMesh, ndim: int):
    order = draw(st.permutations(mesh.axis_names))
    # each axis goes to one dimension or to none (replicated), in the drawn order
    where = [draw(st.integers(-1, ndim - 1)) for _ in order]
    spec: list = []
    for d in range(ndim):
        axes = tuple(a for a, w in zip(order, where) if w == d)
        style = draw(st.sampled_from(["tuple", "short"]))
        spec.append(axes if style == "tuple" else None if not axes else axes[0] if len(axes) == 1 else axes)
    return tuple(spec)


@st.composite
def shardeds(draw, max_dims: int = 4):
    mesh = draw(meshes())
    return dm.Sharded(mesh, draw(specs(mesh, draw(st.integers(1, max_dims)))))


@st.composite
def meshes_of_size(draw, size: int):
    """A mesh of ``size`` ranks: its prime factors, shuffled, grouped into axes."""
    primes, n, f = [], size, 2
    while n > 1:
        while n % f == 0:
            primes.append(f)
            n //= f
        f += 1
    primes = draw(st.permutations(primes))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(primes) - 1)), max_size=2))) if len(primes) > 1 else []
    shape = [math.prod(primes[i:j]) for i, j in zip([0, *cuts], [*cuts, len(primes)])] or [1]
    shape += [1] * draw(st.integers(0, 1))
    return dm.ProcessMesh(tuple(shape), NAMES[: len(shape)])


# --------------------------------------------------------------------------- #
# ProcessMesh
# --------------------------------------------------------------------------- #
@given(mesh=meshes(), data=st.data())
@settings(max_examples=80, deadline=None)
def test_mesh_coords_rank_groups_against_numpy(mesh, data):
    ranks = rank_array(mesh.shape)
    assert mesh.size == ranks.size
    for r in range(mesh.size):
        coords = tuple(int(c) for c in np.unravel_index(r, mesh.shape))
        assert mesh.coords(r) == coords
        assert mesh.rank(coords) == r
    axes = data.draw(axis_tuples(mesh))
    assert mesh.groups(axes) == brute_groups(mesh.shape, mesh.axis_names, axes)
    name = data.draw(st.sampled_from(mesh.axis_names))
    assert mesh.groups(name) == mesh.groups((name,)) == brute_groups(mesh.shape, mesh.axis_names, (name,))


@given(mesh=meshes(), data=st.data())
@settings(max_examples=60, deadline=None)
def test_mesh_position_inverts_the_sublayout(mesh, data):
    axes = data.draw(axis_tuples(mesh))
    sub = mesh.sublayout(axes)
    for group in mesh.groups(axes):
        assert [mesh.position(r, axes) for r in group] == list(range(sub.size))
        assert [r - group[0] for r in group] == [sub(i) for i in range(sub.size)]


def test_mesh_groups_of_the_contract_match_the_grid_and_numpy():
    mesh, grid = dm.ProcessMesh((2, 4), ("x", "y")), dm.ProcessGrid((2, 4))
    for axis, name in enumerate(mesh.axis_names):
        assert mesh.groups(name) == grid.groups(axis) == brute_groups((2, 4), ("x", "y"), (name,))
    assert mesh.groups("x") == [[0, 4], [1, 5], [2, 6], [3, 7]]  # CONTRACT.md section 4
    assert mesh.groups(()) == [[r] for r in range(8)]
    assert mesh.groups(("y", "x")) == [sorted(range(8), key=lambda r: (r % 4, r // 4))]


def test_mesh_is_a_frozen_hashable_value():
    m = dm.ProcessMesh([2, 3], ["x", "y"])
    assert m == dm.ProcessMesh((2, 3), ("x", "y")) and hash(m) == hash(dm.ProcessMesh((2, 3), ("x", "y")))
    assert m != dm.ProcessMesh((2, 3), ("x", "z")) and m != dm.ProcessMesh((3, 2), ("x", "y"))
    assert dm.ProcessMesh(4, "x") == dm.ProcessMesh((4,), ("x",)) and dm.ProcessMesh(4, "x").rank(2) == 2
    assert pickle.loads(pickle.dumps(m)) == m and m.ndim == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.shape = (6,)  # type: ignore[misc]


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: dm.ProcessMesh((2, 2), ("x", "x")), ValueError, r"axis_names must be distinct, got 'x' twice in \('x', 'x'\)"),
    (lambda: dm.ProcessMesh((2, 2), ("x",)), ValueError, r"axis_names must name each of the 2 axes of shape \(2, 2\), got 1 names \('x',\)"),
    (lambda: dm.ProcessMesh((2, 0), ("x", "y")), ValueError, r"shape\[1\] must be >= 1, got 0"),
    (lambda: dm.ProcessMesh((2, -3), ("x", "y")), ValueError, r"shape\[1\] must be >= 1, got -3"),
    (lambda: dm.ProcessMesh((), ()), TypeError, r"shape must be a non-empty tuple of positive ints, got \(\)"),
    (lambda: dm.ProcessMesh((2, 2.0), ("x", "y")), TypeError, r"shape\[1\] must be an int, got 2.0"),
    (lambda: dm.ProcessMesh((2,), (3,)), TypeError, r"axis_names\[0\] must be a non-empty string, got 3"),
    (lambda: dm.ProcessMesh((2**16, 2**16), ("x", "y")), ValueError, r"spans 4294967296 ranks, more than 2147483647"),
    (lambda: dm.ProcessMesh((2, 2), ("x", "y")).groups("z"), ValueError, r"axes: 'z' is not an axis of ProcessMesh\(\(2, 2\), \('x', 'y'\)\); expected one of \('x', 'y'\), got 'z'"),
    (lambda: dm.ProcessMesh((2, 2), ("x", "y")).groups(("x", "x")), ValueError, r"axes must name each mesh axis at most once, got 'x' twice"),
    (lambda: dm.ProcessMesh((2, 2), ("x", "y")).groups(0), TypeError, r"axes must be a mesh axis name or a tuple of them, got 0"),
    (lambda: dm.ProcessMesh((2, 2), ("x", "y")).coords(4), ValueError, r"rank must be in \[0, 4\) for ProcessMesh.*got 4"),
    (lambda: dm.ProcessMesh((2, 2), ("x", "y")).rank((0, 2)), ValueError, r"coords\[1\] must be in \[0, 2\) for ProcessMesh.*got 2"),
    (lambda: dm.ProcessMesh((2, 2), ("x", "y")).rank((0,)), TypeError, r"coords must be a tuple of 2 ints .*got \(0,\)"),
])
def test_mesh_errors_name_the_argument_expected_and_given(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_mesh_value_errors_are_distribution_errors():
    with pytest.raises(dm.DistributionError):
        dm.ProcessMesh((2, 2), ("x", "x"))
    with pytest.raises(dm.DistributionError):
        dm.ProcessMesh((2, 2), ("x", "y")).groups("z")


# --------------------------------------------------------------------------- #
# Sharded: shapes, indices, split and join against numpy slicing
# --------------------------------------------------------------------------- #
SIZES = st.sampled_from([0, 1, 2, 3, 5, 7, 11, 13])


@given(d=shardeds(), data=st.data())
@settings(max_examples=80, deadline=None)
def test_split_join_against_numpy_slicing(d, data):
    shape = tuple(data.draw(SIZES) for _ in range(d.ndim))
    a = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    blocks = dm.split(a, d)
    assert len(blocks) == d.mesh.size == d.nranks()
    for rank, block in enumerate(blocks):
        want = brute_block(a, d.mesh, d.spec, rank)
        np.testing.assert_array_equal(block, want)
        assert d.shape(rank, shape) == want.shape
        ids = d.global_indices(rank, shape)
        assert len(ids) == d.ndim
        np.testing.assert_array_equal(a[np.ix_(*ids)], want)  # local order is the ids' order
    np.testing.assert_array_equal(dm.join(blocks, d, shape), a)


@given(d=shardeds(), data=st.data())
@settings(max_examples=60, deadline=None)
def test_every_element_held_once_per_replica(d, data):
    shape = tuple(data.draw(SIZES) for _ in range(d.ndim))
    count = np.zeros(shape, dtype=int)
    for rank in range(d.mesh.size):
        count[np.ix_(*d.global_indices(rank, shape))] += 1
    replicas = math.prod(d.mesh.shape[d.mesh.axis_names.index(x)] for x in d.replicated_axes)
    assert np.all(count == replicas)


@given(d=shardeds(), data=st.data())
@settings(max_examples=40, deadline=None)
def test_global_shape_from_the_blocks(d, data):
    shape = tuple(data.draw(SIZES) for _ in range(d.ndim))
    shapes = [d.shape(r, shape) for r in range(d.mesh.size)]
    got = d.global_shape(shapes)
    assert all(d.shape(r, got) == s for r, s in enumerate(shapes))
    assert got == shape or any(s == 0 for s in shape)  # (zero-size parts leave other sizes unseen only by 0s)


def test_global_shape_names_a_misfit():
    d = dm.Sharded(dm.ProcessMesh((2,), ("x",)), ("x", None, None))
    with pytest.raises(dm.DistributionError, match=r"the block of rank 1 has shape \(3, 2, 4\) but .* gives it \(3, 2, 3\) "
                       r"for the global shape \(6, 2, 3\) implied by"):
        d.global_shape([(3, 2, 3), (3, 2, 4)])
    with pytest.raises(dm.DistributionError, match=r"rank 1 has shape \(3, 2\) but .* lays out arrays of 3 dimensions"):
        d.global_shape([(3, 2, 3), (3, 2)])


def test_join_checks_the_replicas_and_keeps_the_first():
    mesh = dm.ProcessMesh((2, 2), ("x", "y"))
    d = dm.Sharded(mesh, ("x", None))
    a = np.zeros((4, 3))
    blocks = dm.split(a, d)
    blocks[1] = -blocks[1]  # -0.0: equal to rank 0's copy, which join returns
    assert not np.signbit(dm.join(blocks, d, a.shape)).any()
    blocks[3] = blocks[3] + 1
    with pytest.raises(ValueError, match=re.escape(f"join: {d!r} blocks must agree, but rank 3's differs from rank 2's")):
        dm.join(blocks, d, a.shape)


# --------------------------------------------------------------------------- #
# the 2-D distributions as special cases
# --------------------------------------------------------------------------- #
GRID_SHAPES = [(1, 1), (1, 3), (3, 1), (2, 2), (2, 3), (3, 2), (2, 4), (4, 2)]


def two_d_distributions():
    for p in (1, 2, 3, 5, 8):
        for d in (dm.Slab.X, dm.Slab.Y, dm.Replicated()):
            yield d, p
    for shape in GRID_SHAPES:
        for layout in ("row", "col"):
            g = dm.ProcessGrid(shape, layout=layout)
            yield dm.BlockNonCyclic(g), g.size


def same_indices(d1, d2, p, shape) -> bool:
    for rank in range(p):
        i1, i2 = d1.global_indices(rank, shape, p), d2.global_indices(rank, shape, p)
        if len(i1) != len(i2) or any(not np.array_equal(x, y) for x, y in zip(i1, i2)):
            return False
    return True


@pytest.mark.parametrize("d, p", list(two_d_distributions()), ids=repr)
def test_two_d_distributions_are_shardeds(d, p):
    s = dm.Sharded.from_2d(d, nranks=p)
    assert s is not None and s.mesh.size == p
    for shape in [(0, 4), (7, 5), (13, 11), (p, 2 * p + 1)]:
        assert same_indices(s, d, p, shape)
        assert [s.shape(r, shape, p) for r in range(p)] == [d.shape(r, shape, p) for r in range(p)]
    assert s == d and d == s and hash(s) == hash(d) and not (s != d)
    assert s.as_2d() == d and type(s.as_2d()) is type(d)
    assert {d: 1}[s] == 1 and {s: 1}[d] == 1  # plan-cache keys


def test_the_contract_examples_by_hand():
    for p in (1, 4, 7):
        s = dm.Sharded(dm.ProcessMesh((p,), ("x",)), ("x", None))
        assert s == dm.Slab.X and hash(s) == hash(dm.Slab.X) and same_indices(s, dm.Slab.X, p, (9, 4))
    # column-major (2, 4): rank = r + 2c, a row-major mesh (cols, rows), rows split over its second axis
    col = dm.BlockNonCyclic(dm.ProcessGrid((2, 4), layout="col"))
    s = dm.Sharded(dm.ProcessMesh((4, 2), ("c", "r")), ("r", "c"))
    assert s == col and col == s and hash(s) == hash(col) and same_indices(s, col, 8, (5, 9))
    row = dm.BlockNonCyclic(dm.ProcessGrid((2, 4)))
    assert s != row and dm.Sharded(dm.ProcessMesh((2, 4), ("r", "c")), ("r", "c")) == row


def test_shardeds_without_a_2d_form():
    g = dm.ProcessGrid((2, 2))
    assert dm.Sharded.from_2d(dm.BlockCyclic(g, (2, 3))) is None
    assert dm.Sharded.from_2d(dm.BlockNonCyclic(g, first_process=(1, 0))) is None
    mesh = dm.ProcessMesh((2, 2, 2), ("a", "b", "c"))
    for spec in [("a", None), ("a", "b"), (("b", "a", "c"), None), (("a", "c"), "b"), ("a", None, "b")]:
        s = dm.Sharded(mesh, spec)
        assert s.as_2d() is None
        for d, _ in two_d_distributions():
            assert s != d and d != s


@given(d1=shardeds(max_dims=3), data=st.data())
@settings(max_examples=60, deadline=None)
def test_equal_shardeds_lay_out_alike(d1, data):
    """Renamed axes give an equal value that hashes equal; two on as many ranks
    are equal where they give every rank the same parts (but for the 2-D
    forms, which tell what the 2-D distributions tell apart)."""
    rename = dict(zip(d1.mesh.axis_names, data.draw(st.permutations(["p", "q", "r", "s"]))))
    mesh = dm.ProcessMesh(d1.mesh.shape, tuple(rename[n] for n in d1.mesh.axis_names))
    d2 = dm.Sharded(mesh, tuple(None if e is None else tuple(rename[n] for n in d1.axes(i)) for i, e in enumerate(d1.spec)))
    assert d1 == d2 and hash(d1) == hash(d2)
    mesh3 = data.draw(meshes_of_size(d1.mesh.size))
    d3 = dm.Sharded(mesh3, data.draw(specs(mesh3, d1.ndim)))
    shape = tuple(2 * d1.mesh.size + 1 for _ in range(d1.ndim))
    same = same_indices(d1, d3, d1.mesh.size, shape)  # (2P+1: every part of every split differs)
    if d1 == d3:
        assert hash(d1) == hash(d3) and same
    elif d1.as_2d() is None and d3.as_2d() is None:  # (2-D forms tell Slab.X on 1 rank from Replicated())
        assert not same


@pytest.mark.parametrize("spec, equal", [
    ((("x", "y"), None, None), True), ((("y", "x"), None, None), False), (("x", None, "y"), False),
])
def test_an_axis_cut_in_two_is_equal_where_it_numbers_alike(spec, equal):
    one = dm.Sharded(dm.ProcessMesh((6,), ("p",)), ("p", None, None))
    two = dm.Sharded(dm.ProcessMesh((2, 3), ("x", "y")), spec)
    assert (one == two) == equal == same_indices(one, two, 6, (13, 7, 5))
    assert (hash(one) == hash(two)) or not equal


# --------------------------------------------------------------------------- #
# Sharded errors
# --------------------------------------------------------------------------- #
MESH = dm.ProcessMesh((2, 3), ("x", "y"))


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: dm.Sharded(MESH, ("x", "x")), ValueError, r"spec names mesh axis 'x' twice \(spec\[0\] and spec\[1\]\)"),
    (lambda: dm.Sharded(MESH, (("x", "x"), None)), ValueError, r"spec\[0\] must name each mesh axis at most once, got 'x' twice"),
    (lambda: dm.Sharded(MESH, (("y", "x"), "y")), ValueError, r"spec names mesh axis 'y' twice \(spec\[0\] and spec\[1\]\)"),
    (lambda: dm.Sharded(MESH, ("z", None)), ValueError, r"spec\[0\]: 'z' is not an axis of ProcessMesh\(\(2, 3\), \('x', 'y'\)\); expected one of \('x', 'y'\), got 'z'"),
    (lambda: dm.Sharded(MESH, (None, 1)), TypeError, r"spec\[1\] must be None, a mesh axis name or a tuple of them, got 1"),
    (lambda: dm.Sharded(MESH, "x"), TypeError, r"spec must be a tuple with one entry per dimension .*got 'x'"),
    (lambda: dm.Sharded(MESH, ()), ValueError, r"spec must have one entry per dimension of the stored array, got \(\)"),
    (lambda: dm.Sharded((2, 3), ("x",)), TypeError, r"mesh must be a dm.ProcessMesh\(shape, axis_names\), got \(2, 3\)"),
    (lambda: dm.Sharded(MESH, ("x", None)).shape(0, (4, 4, 4)), ValueError, r"global_shape must have one size per dimension of Sharded.* \(2\), got 3: \(4, 4, 4\)"),
    (lambda: dm.Sharded(MESH, ("x", None)).shape(0, (4, -1)), ValueError, r"global_shape\[1\] must be >= 0, got -1"),
    (lambda: dm.Sharded(MESH, ("x", None)).shape(6, (4, 4)), ValueError, r"rank must be in \[0, 6\) for Sharded.*got 6"),
    (lambda: dm.Sharded(MESH, ("x", None)).shape(0, (4, 4), nranks=4), ValueError, r"spans 6 ranks \(its mesh \(2, 3\)\) but nranks=4: use a mesh of 4 ranks"),
    (lambda: dm.split(np.zeros((2, 2)), dm.Sharded(MESH, ("x", None, "y"))), ValueError, r"split: a must be an array of 3 dimensions for Sharded.*got shape \(2, 2\)"),
    (lambda: dm.join([np.zeros((1, 1))] * 4, dm.Sharded(MESH, ("x", None)), (2, 1)), ValueError, r"join: blocks holds 4 blocks but Sharded.* spans 6 ranks \(its mesh \(2, 3\)\): pass one block per rank"),
    (lambda: dm.Sharded.from_2d(dm.Slab.X), ValueError, r"pass nranks="),
    (lambda: dm.Sharded.from_2d(dm.BlockNonCyclic(dm.ProcessGrid((2, 2))), nranks=3), ValueError, r"spans 4 ranks .* but nranks=3"),
    (lambda: dm.Sharded.from_2d("Slab.X", nranks=2), TypeError, r"d must be a dmatmul distribution, got 'Slab.X'"),
])
def test_sharded_errors_name_the_argument_expected_and_given(call, error, pattern):
    with pytest.raises(error, match=pattern) as info:
        call()
    if error is ValueError:
        assert isinstance(info.value, dm.DistributionError) or str(info.value).startswith("split:")


def test_sharded_spellings_and_value():
    s = dm.Sharded(MESH, [["x"], ()])
    assert s.spec == ("x", None) and s == dm.Sharded(MESH, ("x", None)) and s.replicated_axes == ("y",)
    assert repr(s) == "Sharded(ProcessMesh((2, 3), ('x', 'y')), ('x', None))"
    assert pickle.loads(pickle.dumps(s)) == s and s.ndim == 2 and s.axes(0) == ("x",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.spec = (None, None)  # type: ignore[misc]


# --------------------------------------------------------------------------- #
# dm.matmul takes a Sharded that has a 2-D form, as that form
# --------------------------------------------------------------------------- #
def test_options_read_a_sharded_as_its_2d_form():
    from dmatmul._options import Options

    col = dm.Sharded(dm.ProcessMesh((4, 2), ("c", "r")), ("r", "c"))
    x = dm.Sharded(dm.ProcessMesh(8, "x"), ("x", None))
    opts = Options(distribution=(x, col, dm.Slab.Y))
    assert opts.distribution == (dm.Slab.X, col.as_2d(), dm.Slab.Y)
    assert [type(d) for d in opts.distribution] == [dm.Slab, dm.BlockNonCyclic, dm.Slab]
    assert Options(distribution=x).distribution == (dm.Slab.X,) * 3
    nd = dm.Sharded(dm.ProcessMesh((2, 4), ("x", "y")), ("x", None))  # replicated over y: no 2-D form
    assert Options(distribution=(x, nd, x)).distribution == (dm.Slab.X, nd, dm.Slab.X)  # kept: re-laid (_relay)
    assert Options(distribution=nd).distribution[0] is nd


def test_matmul_with_shardeds_equal_to_2d_distributions():
    pytest.importorskip("jax")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((11, 7)), rng.standard_normal((7, 9))
    col = dm.Sharded(dm.ProcessMesh((4, 2), ("c", "r")), ("r", "c"))
    x = dm.Sharded.from_2d(dm.Slab.X, nranks=8)
    got = dm.matmul(a, b, distribution=(col, x, col), devices=8, backend="jax")
    np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12)


def test_the_guide_section_runs():
    """docs/guide.md, "Named meshes and N-D distributions": its example runs as written."""
    import pathlib

    guide = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text()
    section = guide.split("### Named meshes and N-D distributions", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)
    assert len(blocks) == 1
    exec(compile(blocks[0], "guide.md", "exec"), {})
