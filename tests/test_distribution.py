"""Distributions: nvmath 1.0 semantics, split/join, ownership, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dmatmul as dm
from dmatmul._distribution import numroc, slab_extent


# --------------------------------------------------------------------------- #
# independent owners: which rank holds a global index, computed by dealing
# --------------------------------------------------------------------------- #
def owner_cyclic(g: int, nb: int, nprocs: int, src: int) -> int:
    return (g // nb + src) % nprocs


def owner_slab(g: int, size: int, parts: int) -> int:
    base, extra = divmod(size, parts)
    big = extra * (base + 1)
    return g // (base + 1) if g < big else extra + (g - big) // base


def owners_2d(d: dm.Distribution, shape: tuple[int, int]) -> dict[tuple[int, int], list[int]]:
    """For every rank, the set of global (row, col) pairs it should own, by brute force."""
    g = d.grid
    out: dict[int, tuple[list[int], list[int]]] = {}
    for rank in range(g.size):
        coords = g.coords(rank)
        dims = []
        for dim in range(2):
            p, fp = g.shape[dim], d.first_process[dim]
            if isinstance(d, dm.BlockCyclic):
                own = [x for x in range(shape[dim]) if owner_cyclic(x, d.block_sizes[dim], p, fp) == coords[dim]]
            else:
                own = [x for x in range(shape[dim]) if (owner_slab(x, shape[dim], p) + fp) % p == coords[dim]]
            dims.append(own)
        out[rank] = (dims[0], dims[1])
    return out


# --------------------------------------------------------------------------- #
# exact tables read off nvmath 1.0
# --------------------------------------------------------------------------- #
def test_slab_x_nvmath_example():
    assert [dm.Slab.X.shape(r, (10, 6), nranks=4) for r in range(4)] == [(3, 6), (3, 6), (2, 6), (2, 6)]


def test_slab_y_splits_columns():
    assert [dm.Slab.Y.shape(r, (10, 6), nranks=4) for r in range(4)] == [(10, 2), (10, 2), (10, 1), (10, 1)]
    rows, cols = dm.Slab.Y.global_indices(2, (10, 6), nranks=4)
    assert rows.tolist() == list(range(10)) and cols.tolist() == [4]


def test_block_cyclic_nvmath_example_col_and_row():
    col = dm.BlockCyclic(dm.ProcessGrid((2, 2), layout="col"), (3, 2))
    row = dm.BlockCyclic(dm.ProcessGrid((2, 2), layout="row"), (3, 2))
    assert [col.shape(r, (10, 7)) for r in range(4)] == [(6, 4), (4, 4), (6, 3), (4, 3)]
    assert [row.shape(r, (10, 7)) for r in range(4)] == [(6, 4), (6, 3), (4, 4), (4, 3)]


def test_slab_extent_rule():
    assert [slab_extent(10, 4, p) for p in range(4)] == [(0, 3), (3, 3), (6, 2), (8, 2)]
    assert [slab_extent(3, 5, p)[1] for p in range(5)] == [1, 1, 1, 0, 0]


@given(
    n=st.integers(0, 60), nb=st.integers(1, 9), nprocs=st.integers(1, 6), data=st.data()
)
@settings(max_examples=200, deadline=None)
def test_numroc_against_dealing(n, nb, nprocs, data):
    src = data.draw(st.integers(0, nprocs - 1))
    for p in range(nprocs):
        expected = sum(owner_cyclic(g, nb, nprocs, src) == p for g in range(n))
        assert numroc(n, nb, p, src, nprocs) == expected


@given(size=st.integers(0, 50), parts=st.integers(1, 9))
@settings(max_examples=100, deadline=None)
def test_slab_against_dealing(size, parts):
    for p in range(parts):
        rows, _ = dm.Slab.X.global_indices(p, (size, 1), nranks=parts)
        assert rows.tolist() == [g for g in range(size) if owner_slab(g, size, parts) == p]


# --------------------------------------------------------------------------- #
# generated distributions: ownership, split/join
# --------------------------------------------------------------------------- #
@st.composite
def distributions(draw, max_ranks: int = 8):
    kind = draw(st.sampled_from(["slabx", "slaby", "rep", "bnc", "bc"]))
    if kind in ("slabx", "slaby", "rep"):
        d = {"slabx": dm.Slab.X, "slaby": dm.Slab.Y, "rep": dm.Replicated()}[kind]
        return d, draw(st.integers(1, max_ranks))
    rows = draw(st.integers(1, 4))
    cols = draw(st.integers(1, max(1, max_ranks // rows)))
    grid = dm.ProcessGrid((rows, cols), layout=draw(st.sampled_from(["row", "col"])))
    fp = (draw(st.integers(0, rows - 1)), draw(st.integers(0, cols - 1)))
    if kind == "bnc":
        return dm.BlockNonCyclic(grid, first_process=fp), grid.size
    blocks = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    return dm.BlockCyclic(grid, blocks, first_process=fp), grid.size


@given(dist=distributions(), m=st.integers(0, 23), n=st.integers(0, 23))
@settings(max_examples=150, deadline=None)
def test_every_element_owned_exactly_once(dist, m, n):
    d, p = dist
    count = np.zeros((m, n), dtype=int)
    for rank in range(p):
        rows, cols = d.global_indices(rank, (m, n), nranks=p)
        assert d.shape(rank, (m, n), nranks=p) == (len(rows), len(cols))
        assert np.all(np.diff(rows) > 0) and np.all(np.diff(cols) > 0), "local order is increasing global order"
        count[np.ix_(rows, cols)] += 1
    expected = p if isinstance(d, dm.Replicated) else 1
    assert np.all(count == expected)


@given(dist=distributions(), m=st.integers(1, 17), n=st.integers(1, 17))
@settings(max_examples=60, deadline=None)
def test_grid_distributions_match_brute_force(dist, m, n):
    d, p = dist
    if d.grid is None:
        return
    want = owners_2d(d, (m, n))
    for rank in range(p):
        rows, cols = d.global_indices(rank, (m, n))
        assert (rows.tolist(), cols.tolist()) == want[rank]


@given(dist=distributions(), m=st.integers(1, 19), n=st.integers(1, 19))
@settings(max_examples=80, deadline=None)
def test_split_join_round_trip(dist, m, n):
    d, p = dist
    a = np.arange(m * n, dtype=np.float64).reshape(m, n)
    blocks = dm.split(a, d, nranks=p)
    assert len(blocks) == p
    for rank, blk in enumerate(blocks):
        assert blk.shape == d.shape(rank, (m, n), nranks=p)
    np.testing.assert_array_equal(dm.join(blocks, d, (m, n)), a)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "complex64", "int32"])
def test_join_of_replicated_blocks_with_nan(dtype):
    """Replicated blocks that agree, NaN included, join (bfloat16's NaN was
    'rank 0 differs from rank 0'); a block that differs is named."""
    import ml_dtypes

    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    x = np.array([[1, np.nan if dtype != "int32" else 2]]).astype(dt)
    got = dm.join([x, x.copy(), x.copy()], dm.Replicated(), (1, 2))
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got.astype(np.complex64), x.astype(np.complex64))  # NaN-aware in any dtype
    y = x.copy()
    y[0, 0] = 3
    with pytest.raises(ValueError, match="rank 2's differs from rank 0's"):
        dm.join([x, x, y], dm.Replicated(), (1, 2))


def test_first_process_moves_the_first_block():
    g = dm.ProcessGrid((2, 3))
    d = dm.BlockCyclic(g, (2, 2), first_process=(1, 2))
    # global block (0, 0) lands on grid coords (1, 2) = rank 5
    rows, cols = d.global_indices(g.rank((1, 2)), (8, 9))
    assert rows[:2].tolist() == [0, 1] and cols[:2].tolist() == [0, 1]
    bnc = dm.BlockNonCyclic(dm.ProcessGrid((2, 1)), first_process=(1, 0))
    assert bnc.global_indices(1, (5, 2))[0].tolist() == [0, 1, 2]
    assert bnc.global_indices(0, (5, 2))[0].tolist() == [3, 4]


def test_block_non_cyclic_uneven_goes_beyond_nvmath():
    d = dm.BlockNonCyclic(dm.ProcessGrid((2, 2)))
    assert [d.shape(r, (5, 3)) for r in range(4)] == [(3, 2), (3, 1), (2, 2), (2, 1)]


# --------------------------------------------------------------------------- #
# process grids
# --------------------------------------------------------------------------- #
def test_grid_groups_tables():
    row, col = dm.ProcessGrid((2, 4)), dm.ProcessGrid((2, 4), layout="col")
    assert row.groups(0) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert row.groups(1) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert col.groups(0) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert col.groups(1) == [[0, 2, 4, 6], [1, 3, 5, 7]]


@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("shape", [(1, 1), (2, 4), (4, 2), (3, 5), (1, 6), (6, 1)])
def test_grid_coords_rank_round_trip(shape, layout):
    g = dm.ProcessGrid(shape, layout=layout)
    seen = set()
    for rank in range(g.size):
        r, c = g.coords(rank)
        expected = r * shape[1] + c if layout == "row" else r + c * shape[0]
        assert expected == rank
        assert g.rank((r, c)) == rank
        seen.add((r, c))
    assert len(seen) == g.size
    for axis in range(2):
        groups = g.groups(axis)
        assert sorted(x for grp in groups for x in grp) == list(range(g.size))
        for grp in groups:
            coords = [g.coords(x) for x in grp]
            assert [c[axis] for c in coords] == list(range(shape[axis]))
            assert len({c[1 - axis] for c in coords}) == 1


@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("shape", [(3,), (2, 3, 4), (3, 1, 2), (2, 2, 2, 2)])
def test_grid_coords_rank_groups_any_rank_against_numpy(shape, layout):
    """Grids of any number of axes: coordinates, ranks and groups are numpy's
    row-major ('C') or column-major ('F') numbering of the grid."""
    g = dm.ProcessGrid(shape, layout=layout)
    ranks = np.arange(g.size).reshape(shape, order="C" if layout == "row" else "F")
    for rank in range(g.size):
        coords = tuple(int(x) for x in np.argwhere(ranks == rank)[0])
        assert g.coords(rank) == coords
        assert g.rank(coords) == rank
    for axis in range(len(shape)):
        lines = np.moveaxis(ranks, axis, -1).reshape(-1, shape[axis])
        assert g.groups(axis) == sorted(lines.tolist())



# --------------------------------------------------------------------------- #
# values: equality, hashing, repr
# --------------------------------------------------------------------------- #
def test_equal_distributions_hash_equal():
    g1, g2 = dm.ProcessGrid((2, 2)), dm.ProcessGrid([2, 2], layout="row")
    pairs = [
        (dm.Slab(0), dm.Slab.X),
        (dm.Slab(1), dm.Slab.Y),
        (dm.Replicated(), dm.Replicated()),
        (dm.BlockCyclic(g1, (2, 3)), dm.BlockCyclic(g2, [2, 3], first_process=(0, 0))),
        (dm.BlockNonCyclic(g1), dm.BlockNonCyclic(g2, (0, 0))),
        (dm.ProcessGrid((4,)), dm.ProcessGrid(4, layout="col")),
    ]
    for x, y in pairs:
        assert x == y and hash(x) == hash(y)
    assert len({dm.Slab.X, dm.Slab.Y, dm.Replicated(), dm.BlockCyclic(g1, (2, 2)), dm.BlockCyclic(g1, (2, 1))}) == 5
    assert dm.BlockCyclic(g1, (2, 2)) != dm.BlockCyclic(g1, (2, 2), first_process=(1, 0))
    assert dm.ProcessGrid((2, 2)) != dm.ProcessGrid((2, 2), layout="col")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3))
def test_grids_are_equal_exactly_when_they_number_ranks_alike(shape):
    # (4, 1) row and (4, 1) col put every rank at the same coordinates: they
    # are one grid, and so are the distributions on them (plan-cache keys and
    # the ranks' agreement check compare them)
    row, col = dm.ProcessGrid(shape), dm.ProcessGrid(shape, layout="col")
    alike = all(row.coords(r) == col.coords(r) for r in range(row.size))
    assert (row == col) == alike
    if alike:
        assert hash(row) == hash(col) and repr(row) == repr(col)
    if len(shape) == 2:
        on = [dm.BlockCyclic(g, (2, 3), first_process=(shape[0] - 1, 0)) for g in (row, col)]
        assert (on[0] == on[1]) == alike and (hash(on[0]) == hash(on[1])) == alike


def test_distributions_are_immutable():
    with pytest.raises(AttributeError):
        dm.Slab.X.dim = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        dm.ProcessGrid((2, 2)).shape = (4, 1)  # type: ignore[misc]


def test_reprs_are_readable():
    g = dm.ProcessGrid((2, 2), layout="col")
    assert repr(dm.Slab.X) == "Slab.X" and repr(dm.Slab(1)) == "Slab.Y"
    assert repr(dm.BlockCyclic(g, (3, 2), (1, 0))) == (
        "BlockCyclic(ProcessGrid((2, 2), layout='col'), (3, 2), first_process=(1, 0))"
    )
    assert repr(dm.BlockNonCyclic(dm.ProcessGrid((1, 2)))) == "BlockNonCyclic(ProcessGrid((1, 2), layout='row'))"


def test_a_grid_counts_its_ranks_exactly():
    """Python's ints, not int64: a product over 2**64 ranks does not wrap to 0
    (it is refused, counted exactly: MPI numbers at most 2**31 - 1 ranks)."""
    with pytest.raises(dm.DistributionError, match=r"spans 18446744073709551616 ranks"):
        dm.ProcessGrid((2**32, 2**32))
    assert dm.ProcessGrid((2**31 - 1, 1)).size == 2**31 - 1 and dm.ProcessGrid((3, 5, 7)).size == 105


# --------------------------------------------------------------------------- #
# bad arguments
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize(
    "make, exc, words",
    [
        (lambda: dm.ProcessGrid((2, 2), layout="rows"), ValueError, ["'row'", "'col'", "rows"]),
        (lambda: dm.ProcessGrid((0, 2)), ValueError, ["shape[0]", ">= 1", "0"]),
        (lambda: dm.ProcessGrid((2, -1)), ValueError, ["shape[1]", "-1"]),
        (lambda: dm.ProcessGrid((2.0, 2)), TypeError, ["int", "2.0"]),
        (lambda: dm.ProcessGrid("22"), TypeError, ["tuple"]),
        (lambda: dm.Slab(2), ValueError, ["Slab dim", "2"]),
        (lambda: dm.Slab(1.0), TypeError, ["Slab dim", "int", "1.0"]),
        (lambda: dm.Slab(np.float32(0)), TypeError, ["Slab dim", "int"]),
        (lambda: dm.Slab(True), TypeError, ["Slab dim", "int", "True"]),
        (lambda: dm.BlockCyclic(dm.ProcessGrid((2, 2)), (0, 2)), ValueError, ["block_sizes[0]", "0"]),
        (lambda: dm.BlockCyclic(dm.ProcessGrid((2, 2)), (2, -3)), ValueError, ["block_sizes[1]", "-3"]),
        (lambda: dm.BlockCyclic(dm.ProcessGrid((2, 2)), 2), TypeError, ["block_sizes", "pair"]),
        (lambda: dm.BlockCyclic((2, 2), (2, 2)), TypeError, ["ProcessGrid", "(2, 2)"]),
        (lambda: dm.BlockCyclic(dm.ProcessGrid((4,)), (2, 2)), ValueError, ["2-D", "(4,)"]),
        (lambda: dm.BlockNonCyclic(dm.ProcessGrid((2, 2)), (2, 0)), ValueError, ["first_process[0]", "[0, 2)"]),
        (lambda: dm.Slab.X.shape(4, (10, 6), nranks=4), ValueError, ["rank", "[0, 4)", "4"]),
        (lambda: dm.Slab.X.shape(-1, (10, 6), nranks=4), ValueError, ["rank", "-1"]),
        (lambda: dm.Slab.X.shape(0, (10, 6)), ValueError, ["nranks"]),
        (lambda: dm.Slab.X.shape(0, (10, -6), nranks=2), ValueError, ["global_shape[1]", "-6"]),
        (lambda: dm.Slab.X.shape(0, (10, 6, 2), nranks=2), TypeError, ["global_shape", "pair"]),
        (
            lambda: dm.BlockCyclic(dm.ProcessGrid((2, 2)), (2, 2)).shape(0, (8, 8), nranks=8),
            ValueError,
            ["4 ranks", "nranks=8"],
        ),
        (lambda: dm.ProcessGrid((2, 2)).coords(4), ValueError, ["rank", "[0, 4)"]),
        (lambda: dm.ProcessGrid((2, 2)).rank((0, 2)), ValueError, ["coords[1]", "[0, 2)"]),
        (lambda: dm.ProcessGrid((2, 2)).groups(2), ValueError, ["axis", "[0, 2)"]),
        (lambda: dm.split(np.ones(3), dm.Slab.X, nranks=2), ValueError, ["2-D", "(3,)"]),
        (lambda: dm.split(np.ones((3, 3)), "Slab.X", nranks=2), TypeError, ["distribution", "'Slab.X'"]),
        (lambda: dm.join([np.ones((2, 3)), np.ones((2, 3))], dm.Slab.X, (3, 3)), ValueError, ["rank 1", "(1, 3)", "(2, 3)"]),
        # a block missing on a grid: named as blocks (join takes no nranks, which the message named)
        (lambda: dm.join([np.ones((1, 1))] * 3, dm.BlockNonCyclic(dm.ProcessGrid((2, 2))), (2, 2)), ValueError,
         ["join: blocks holds 3 blocks", "spans 4 ranks", "(2, 2)", "one block per rank"]),
        # more ranks than MPI can number: split looped over 2**70 ranks
        (lambda: dm.split(np.ones((4, 4)), dm.Slab.X, nranks=2**70), ValueError, ["nranks", "<= 2147483647", "C int"]),
        (lambda: dm.Slab.Y.shape(0, (4, 4), nranks=2**31), ValueError, ["nranks", "2147483648"]),
        (lambda: dm.ProcessGrid((2**20, 2**12)), ValueError, ["(1048576, 4096)", "4294967296 ranks", "C int"]),
        # ragged lists (found by tests/test_bad_inputs.py: numpy's "inhomogeneous shape", naming nothing)
        (lambda: dm.split([[1.0], [2.0, 3.0]], dm.Slab.X, nranks=2), ValueError, ["split: a cannot be read", "list"]),
        (lambda: dm.join([np.ones((1, 2)), [[1.0], [2.0, 3.0]]], dm.Slab.X, (2, 2)), ValueError,
         ["join: the block of rank 1 cannot be read as an array (list)"]),
    ],
)
def test_bad_arguments_raise_clear_errors(make, exc, words):
    with pytest.raises(exc) as info:
        make()
    for w in words:
        assert w in str(info.value), f"{w!r} not in {info.value}"


def test_distribution_error_is_value_error():
    assert issubclass(dm.DistributionError, ValueError)
    with pytest.raises(dm.DistributionError):
        dm.Slab(3)


@given(dist=distributions(), m=st.integers(0, 23), n=st.integers(0, 23))
@settings(max_examples=100, deadline=None)
def test_global_shape_inferred_from_local_shapes(dist, m, n):
    d, p = dist
    local = [d.shape(r, (m, n), nranks=p) for r in range(p)]
    assert d.global_shape(local) == (m, n)


def test_global_shape_names_the_rank_that_does_not_fit():
    with pytest.raises(dm.DistributionError, match=r"rank 1 has shape \(3, 5\).*\(3, 6\)"):
        dm.Slab.X.global_shape([(3, 6), (3, 5), (2, 6), (2, 6)])
    # blame the fewest ranks: 10 rows (3,3,2,2) misfit rank 2 alone, 9 rows (3,2,2,2) ranks 1 and 2
    with pytest.raises(dm.DistributionError, match=r"rank 2 has shape \(1, 6\).*\(2, 6\).*\(10, 6\)"):
        dm.Slab.X.global_shape([(3, 6), (3, 6), (1, 6), (2, 6)])
    # one extra row on rank 1 is rank 1's fault, not rank 0's
    with pytest.raises(dm.DistributionError, match=r"rank 1 has shape \(4, 6\).*\(3, 6\)"):
        dm.Slab.X.global_shape([(3, 6), (4, 6), (3, 6), (3, 6)])
    bc = dm.BlockCyclic(dm.ProcessGrid((2, 2), layout="col"), (2, 3))
    shapes = [bc.shape(r, (11, 13)) for r in range(4)]
    shapes[3] = (shapes[3][0], shapes[3][1] + 1)
    with pytest.raises(dm.DistributionError, match=r"rank 3 has shape"):
        bc.global_shape(shapes)


@pytest.mark.parametrize("dist, shape, rank", [
    (dm.Slab.X, (12, 6), 0),  # rank 0 one row short: 11 rows (the blocks' sum) over 2 ranks blame rank 1 instead
    (dm.BlockNonCyclic(dm.ProcessGrid((2, 2), layout="col"), first_process=(1, 0)), (6, 21), 1),  # one row more
])
def test_global_shape_names_every_rank_that_may_be_wrong(dist, shape, rank):
    """Found by hunting under mpiexec: one rank's block a row off, with two ranks
    along that axis, fits one global shape that blames it and another as near that
    blames the other rank; the error named only the second, an innocent rank."""
    p = dist.grid.size if dist.grid is not None else 2
    shapes = [dist.shape(r, shape, p) for r in range(p)]
    shapes[rank] = (shapes[rank][0] + (1 if rank else -1), shapes[rank][1])
    with pytest.raises(dm.DistributionError) as info:
        dist.global_shape(shapes)
    text = str(info.value)
    assert f"the block of rank {rank} has shape {shapes[rank]}" in text and f"global shape {shape}" in text, text
    assert "the blocks cannot tell which" in text, text


def test_a_misfit_block_under_a_huge_block_size_is_found_at_once(monkeypatch):
    """Found by hunting under mpiexec: the search for the global shape that blames
    the fewest ranks tried every extent within one block size of the guess, each
    rank's grid coordinates computed anew for each: one row off under
    BlockCyclic(grid, (65536, 2)) on 16 ranks took 90 s on every rank before the
    error, and a block of 2**31 rows never ended."""
    from dmatmul import _distribution

    d = dm.BlockCyclic(dm.ProcessGrid((2, 1)), (2**31, 2))
    shapes = [d.shape(r, (5, 7)) for r in range(2)]  # [(5, 7), (0, 7)]
    shapes[1] = (1, 7)
    calls = 0
    numroc = _distribution.numroc

    def counted(*args):
        nonlocal calls
        calls += 1
        assert calls < 10_000, "the search for the global shape does not end"
        return numroc(*args)

    monkeypatch.setattr(_distribution, "numroc", counted)
    with pytest.raises(dm.DistributionError, match=r"rank 1 has shape \(1, 7\) .* gives it \(0, 7\)"):
        d.global_shape(shapes)


def test_a_block_longer_than_the_matrix_costs_nothing():
    """numroc allows any block size: one of 2**31 over 5 rows holds them all on the
    first process, without building an index per position of the block."""
    d = dm.BlockCyclic(dm.ProcessGrid((2, 1)), (2**31, 2**31))
    assert d.shape(0, (5, 7)) == (5, 7) and d.shape(1, (5, 7)) == (0, 7)
    rows, cols = d.global_indices(0, (5, 7))
    assert rows.tolist() == list(range(5)) and cols.tolist() == list(range(7))


@pytest.mark.parametrize("nb", [2**63, 2**70])
def test_a_block_beyond_int64_splits_and_joins(nb):
    """Found by tests/test_bad_inputs.py: a block size past int64 made the other
    ranks' (empty) index lists float, and dm.split raised IndexError ("arrays
    used as indices must be of integer type") while dm.matmul took the layout."""
    d = dm.BlockCyclic(dm.ProcessGrid((2, 2)), (nb, 2))
    x = np.arange(40.0).reshape(5, 8)
    blocks = dm.split(x, d)
    assert [b.shape for b in blocks] == [d.shape(r, x.shape) for r in range(4)] == [(5, 4), (5, 4), (0, 4), (0, 4)]
    rows, _ = d.global_indices(2, x.shape)
    assert rows.dtype.kind == "i" and rows.size == 0
    np.testing.assert_array_equal(dm.join(blocks, d, x.shape), x)


@pytest.mark.parametrize("shape", [(2**40, 4), (0, 2**62)])
def test_join_checks_the_blocks_before_making_a_huge_result(shape):
    """Found by tests/test_bad_inputs.py: a global_shape far larger than the blocks
    allocated the result (MemoryError) or listed its indices (ValueError "array is too
    big") before finding that no block fits it."""
    blocks = dm.split(np.ones((4, 4)), dm.Slab.X, nranks=2)
    with pytest.raises(dm.DistributionError, match=r"join: block of rank 0 must have shape .* got \(2, 4\)"):
        dm.join(blocks, dm.Slab.X, shape)


@pytest.mark.parametrize("kind", [dm.BlockNonCyclic, lambda g: dm.BlockCyclic(g, (2, 2))])
def test_a_1d_grid_error_suggests_two_grids_that_work(kind):
    """The fix the error names is code: both suggested grids make the distribution,
    and it splits a matrix as Slab.X (or Slab.Y) over the same ranks (numpy's split)."""
    import re

    with pytest.raises(dm.DistributionError, match="needs a 2-D ProcessGrid") as info:
        kind(dm.ProcessGrid(4))
    suggested = re.findall(r"ProcessGrid\(\(\d+, \d+\)\)", str(info.value))
    assert suggested == ["ProcessGrid((4, 1))", "ProcessGrid((1, 4))"], str(info.value)
    a = np.arange(8 * 12.0).reshape(8, 12)
    for code, slab in zip(suggested, (dm.Slab.X, dm.Slab.Y)):
        d = dm.BlockNonCyclic(eval(code, {"ProcessGrid": dm.ProcessGrid}))
        for got, want in zip(dm.split(a, d), np.array_split(a, 4, axis=slab.dim)):
            np.testing.assert_array_equal(got, want)
