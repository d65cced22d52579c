"""A batched product run as ONE matrix product (dmatmul/_fold.py) where only
a or only b holds a batch: on the nvmath backend (the fake) in one process,
one nvmath call for the batch, against numpy; the fold under distributions
over several ranks checked rank by rank on every rank's blocks (the ranks
simulated here; tests/mpi/folded.py runs them under mpiexec)."""

from __future__ import annotations

import numpy as np
import pytest

import dmatmul as dm
from dmatmul._fold import Fold, fold_of
from dmatmul._matmul import plan_of
from dmatmul._problem import Spec
from dmatmul._spec import Operands
from dmatmul.testing import assert_close, reference

RNG = np.random.default_rng(361)
M, K, N = 7, 6, 5  # M uneven


def _operands(a_batch, b_batch, ta, tb, with_c, bias_shape, *, m=M, k=K, n=N, dtype="float32"):
    a = RNG.standard_normal((*a_batch, *((k, m) if ta else (m, k)))).astype(dtype)
    b = RNG.standard_normal((*b_batch, *((n, k) if tb else (k, n)))).astype(dtype)
    batch = np.broadcast_shapes(a_batch, b_batch)
    c = RNG.standard_normal((*batch, m, n)).astype(dtype) if with_c else None
    bias = None if bias_shape is None else RNG.standard_normal(bias_shape).astype(dtype)
    return a, b, c, bias


def _executes(fake) -> int:
    return sum(name in ("execute", "host execute") for name, _ in fake.CALLS)


# (a's batch, b's batch, transpose_a, transpose_b, c given, epilog, bias shape)
FOLDED = [
    ((3,), (), False, False, True, None, None),
    ((2, 3), (1,), True, True, True, "relu_bias", (M,)),  # a row bias every item's, tiled along the folded M
    ((4,), (1, 1), False, True, False, "gelu_bias", (1, 4, M, 1)),  # one row bias per item: stacked
    ((3,), (), True, False, True, "bias", (1, N)),  # a column bias: every folded row's
    ((), (4,), False, False, True, "bias", (1, N)),  # b's batch folded into N: a column bias tiled
    ((1,), (2, 2), True, True, True, "silu_bias", (2, 2, 1, N)),  # one column bias per item: stacked
    ((), (3,), False, True, False, "relu_bias", (M, 1)),  # a row bias with N folded: every column's
    ((1,), (1,), False, False, True, "gelu", None),  # one item
]


@pytest.mark.parametrize("a_batch, b_batch, ta, tb, with_c, epilog, bias_shape", FOLDED)
def test_a_batch_folds_into_one_nvmath_call(fake_nvmath, a_batch, b_batch, ta, tb, with_c, epilog, bias_shape):
    a, b, c, bias = _operands(a_batch, b_batch, ta, tb, with_c, bias_shape)
    kw = dict(alpha=0.75, beta=0.5 if with_c else 0.0, transpose_a=ta, transpose_b=tb, epilog=epilog, bias=bias)
    count = int(np.prod(np.broadcast_shapes(a_batch, b_batch)))
    m, n = (M * count, N) if np.prod(b_batch) == 1 else (M, N * count)
    with dm.Matmul(a, b, c, backend="nvmath", **kw) as mm:
        assert f"folded into one {m} x {K} @ {K} x {n} product" in mm.explain(), mm.explain()
        fake_nvmath.CALLS.clear()
        d = mm.execute()
        assert _executes(fake_nvmath) == 1, fake_nvmath.CALLS  # one GEMM for the batch, not one per item
        assert d.shape == reference(a, b, c, **kw).shape and d.flags.c_contiguous
        assert_close(d, reference(a, b, c, **kw), "float32")
        a2 = RNG.standard_normal(a.shape).astype(np.float32)
        mm.reset_operands(a=a2)
        assert_close(mm.execute(), reference(a2, b, c, **kw), "float32")
        assert _executes(fake_nvmath) == 2


# (a's batch, b's batch, epilog, bias shape, why not folded)
LOOPED = [
    ((3,), (3,), None, None, "a and b both hold a batch"),
    ((2, 1), (3,), None, None, "a and b both hold a batch"),
    ((3,), (), "bias", (3, 1, N), "one column vector per item, and the items are stacked along their rows"),
    ((), (3,), "relu_bias", (3, M, 1), "one row vector per item, and the items are stacked along their columns"),
]


@pytest.mark.parametrize("a_batch, b_batch, epilog, bias_shape, why", LOOPED)
def test_a_batch_that_does_not_fold_runs_each_item_and_says_why(fake_nvmath, a_batch, b_batch, epilog, bias_shape,
                                                                 why):
    a, b, c, bias = _operands(a_batch, b_batch, False, False, True, bias_shape)
    kw = dict(beta=0.5, epilog=epilog, bias=bias)
    with dm.Matmul(a, b, c, backend="nvmath", **kw) as mm:
        assert "run on each item in turn" in mm.explain() and why in mm.explain(), mm.explain()
        fake_nvmath.CALLS.clear()
        assert_close(mm.execute(), reference(a, b, c, **kw), "float32")
        assert _executes(fake_nvmath) == int(np.prod(np.broadcast_shapes(a_batch, b_batch)))


def test_the_cost_is_one_gemm_of_the_folded_size(fake_nvmath):
    a, b = RNG.standard_normal((4, M, K)), RNG.standard_normal((K, N))
    with dm.Matmul(a, b, backend="nvmath") as mm, dm.Matmul(a.reshape(4 * M, K), b, backend="nvmath") as one:
        assert plan_of(mm).cost == plan_of(one).cost
        assert plan_of(mm).cost.flops == pytest.approx(2 * 4 * M * K * N)
        assert mm.algorithm == one.algorithm


def test_the_cost_of_a_batch_run_item_by_item_is_the_batch_times_one_items(fake_nvmath):
    a, b = RNG.standard_normal((3, M, K)), RNG.standard_normal((3, K, N))
    with dm.Matmul(a, b, backend="nvmath") as mm, dm.Matmul(a[0], b[0], backend="nvmath") as one:
        assert "run on each item in turn" in mm.explain()
        loop, item = plan_of(mm).cost, plan_of(one).cost
    assert loop.flops == pytest.approx(3 * item.flops) == pytest.approx(2 * 3 * M * K * N)
    assert loop.time == pytest.approx(3 * item.time) and item.time > 0
    assert loop.nbytes == pytest.approx(3 * item.nbytes) and loop.messages == pytest.approx(3 * item.messages)
    assert loop.kernel == item.kernel


# --------------------------------------------------------------------------- #
# under distributions: every rank's blocks (the ranks simulated)
# --------------------------------------------------------------------------- #
X, Y, R = dm.Slab.X, dm.Slab.Y, dm.Replicated()
CYCLIC = dm.BlockCyclic(dm.ProcessGrid((2, 1)), (2, 3))
# (nranks, dists, a's batch, b's batch, ta, tb, m, n, epilog, bias shape): each rank's blocks fold
FOLDS = [
    (2, (X, Y, X), (3,), (), False, False, 8, N, "relu_bias", (8,)),  # rows split evenly: the folded Slab.X permutes
    (4, (X, R, X), (2, 2), (), False, False, 8, N, "bias", (2, 2, 8, 1)),
    (4, (Y, R, X), (3,), (), True, False, 8, N, "gelu_bias", (1, N)),  # a stored (K, M): its columns split
    (2, (Y, X, Y), (3,), (), False, False, 7, N, "bias", (7, 1)),  # a's rows whole on every rank: as stacked
    (2, (R, R, R), (3,), (1,), True, True, 7, N, None, None),
    (2, (CYCLIC, CYCLIC, CYCLIC), (3,), (), False, False, 8, 6, "bias", (8,)),  # 8 rows a whole number of cycles
    (2, (X, Y, Y), (), (3,), False, False, M, 6, "bias", (1, 6)),  # b's columns split evenly: N folded
    (4, (X, X, Y), (), (2,), False, True, M, 8, "bias", (2, 1, 8)),  # b stored (N, K): its rows split
]
# uneven Slabs along the folded dimension (4 + 3 rows fold to 12 + 9, not a Slab's 11 + 10): each rank's part of
# an item padded to the longest, the padding's results dropped
PADDED = [
    (2, (X, Y, X), (3,), (), False, False, 7, N, "relu_bias", (7,)),
    (4, (X, R, X), (2, 2), (), False, False, 6, N, "bias", (2, 2, 6, 1)),  # 2 + 2 + 1 + 1 rows, a bias per item
    (4, (Y, R, X), (3,), (), True, False, 3, N, "gelu_bias", (3, 1)),  # a stored (K, M); M < P: a rank holds none
    (2, (X, Y, Y), (), (3,), False, False, M, 5, "bias", (1, 5)),  # N uneven, folded
    (4, (X, X, Y), (), (2,), False, True, M, 7, "bias", (2, 1, 7)),  # b stored (N, K), a bias per item
]


def _simulate(nranks, dists, a, b, c, bias, **kw):
    """Each rank's result blocks through the fold: its blocks folded, the folded
    product computed from every rank's folded blocks, each rank's block of its
    result unfolded; and the Fold."""
    spec = Spec.of(a.shape, b.shape, str(a.dtype), c=c is not None, bias_shape=None if bias is None else bias.shape,
                   nprocs=nranks, distribution=dists, **kw)
    fold = fold_of(spec)
    if not isinstance(fold, Fold):
        return fold, None

    def blocks(x, d):
        return [_block_of(x, d, r, nranks) for r in range(nranks)]

    da, db, dd = dists
    given = [Operands(xa, xb, xc, bias) for xa, xb, xc in
             zip(blocks(a, da), blocks(b, db), blocks(c, dd) if c is not None else [None] * nranks)]
    ops = [fold.operands(o) for o in given]
    f = fold.spec
    ga = dm.join([o.a for o in ops], da, f.a_shape)
    gb = dm.join([o.b for o in ops], db, f.b_shape)
    gc = None if c is None else dm.join([o.c for o in ops], dd, f.c_shape)
    d = reference(ga, gb, gc, bias=ops[0].bias, **kw)
    return fold, [fold.result(blk, o) for blk, o in zip(dm.split(d, dd, nranks), given)]


def _block_of(x, d, rank, nranks):
    """``rank``'s block of every matrix of ``x`` (batch dims first)."""
    if x.ndim == 2:
        return dm.split(x, d, nranks)[rank]
    items = [dm.split(x[idx], d, nranks)[rank] for idx in np.ndindex(*x.shape[:-2])]
    return np.stack(items).reshape(*x.shape[:-2], *items[0].shape)


@pytest.mark.parametrize("nranks, dists, a_batch, b_batch, ta, tb, m, n, epilog, bias_shape, padded",
                         [(*f, False) for f in FOLDS] + [(*f, True) for f in PADDED])
def test_each_ranks_blocks_fold_where_the_distributions_allow(nranks, dists, a_batch, b_batch, ta, tb, m, n, epilog,
                                                              bias_shape, padded):
    a, b, c, bias = _operands(a_batch, b_batch, ta, tb, True, bias_shape, m=m, n=n, dtype="float64")
    kw = dict(beta=0.5, transpose_a=ta, transpose_b=tb, epilog=epilog)
    fold, got = _simulate(nranks, dists, a, b, c, bias, **kw)
    assert isinstance(fold, Fold), fold
    assert (fold.pad is not None) == padded and ("padded with zeros" in fold.line()) == padded, fold.line()
    want = reference(a, b, c, bias=bias, **kw)
    for rank in range(nranks):
        assert_close(got[rank], _block_of(want, dists[2], rank, nranks), "float64")


# (nranks, dists, a's batch, b's batch, m, n, why not)
REFUSED = [
    (2, (X, X, Y), (3,), (), 7, N, "does not give each rank 3 times its rows"),  # uneven, the result not a Slab.X
    (2, (CYCLIC, CYCLIC, CYCLIC), (3,), (), 6, 6, "does not give each rank 3 times its rows"),  # 6 = 1.5 cycles
    (2, (Y, X, X), (3,), (), 8, N, "place the rows of the folded product on different ranks"),
    (2, (X, Y, Y), (3,), (), 8, N, "place the rows of the folded product on different ranks"),
    (2, (X, Y, R), (), (3,), M, 5, "does not give each rank 3 times its columns"),  # uneven, the result not a Slab
    (2, (X, Y, X), (), (2,), M, 6, "place the columns of the folded product on different ranks"),
]


@pytest.mark.parametrize("nranks, dists, a_batch, b_batch, m, n, why", REFUSED)
def test_distributions_that_place_the_folded_rows_elsewhere_do_not_fold(nranks, dists, a_batch, b_batch, m, n, why):
    spec = Spec.of((*a_batch, m, K), (*b_batch, K, n), nprocs=nranks, distribution=dists)
    fold = fold_of(spec)
    assert isinstance(fold, str) and why in fold, fold


def test_a_backend_that_batches_itself_is_not_asked_to_fold_in_one_process():
    """JAX in one process runs a batch in a program of its own: its memory needs and explain() do not go
    through the fold, whose rank-by-rank check counts the processes (one), not the devices (it raised
    DistributionError for a grid of 6 devices; found by the differential matrix)."""
    pytest.importorskip("jax")
    a, b, _, _ = _operands((3, 1), (), True, False, False, None, m=33, k=8, n=31)
    dist = (dm.Replicated(), dm.Slab.Y, dm.BlockCyclic(dm.ProcessGrid((2, 3), layout="col"), (2, 5)))
    with dm.Matmul(a, b, distribution=dist, transpose_a=True, backend="jax", devices=6) as mm:
        assert "batch" in mm.explain()
        d = mm.execute()
    assert_close(d, reference(a, b, None, transpose_a=True), "float32")
