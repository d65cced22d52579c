"""Run under ``mpiexec -n 2``: batched products whose local blocks are this
rank's blocks of each item's matrix (the distribution splits the last two
dimensions, every rank holds the whole batch), checked against numpy; ranks
whose batches differ raise on every rank."""

from __future__ import annotations


import _expect
import numpy as np

import dmatmul as dm

from dmatmul.testing.reference import assert_close, reference

rt = dm.init()
me = rt.rank
failures = []


def block(x, d):
    """This rank's block of every item of ``x`` (batch dims first), stacked."""
    if x.ndim == 2:
        return dm.split(x, d)[me]
    shape = dm.split(np.zeros(x.shape[-2:], x.dtype), d)[me].shape
    out = np.zeros(x.shape[:-2] + shape, x.dtype)
    for idx in np.ndindex(*x.shape[:-2]):
        out[idx] = dm.split(x[idx], d)[me]
    return out


def product(a_batch, b_batch, dists, *, tb=False, algorithm="auto", epilog=None, bias_batched=False):
    m, n, k = 7, 5, 6
    rng = np.random.default_rng(len(a_batch) + 3 * len(b_batch))
    a = rng.standard_normal((*a_batch, m, k)).astype(np.float32)
    b = rng.standard_normal((*b_batch, *((n, k) if tb else (k, n)))).astype(np.float32)
    batch = np.broadcast_shapes(a_batch, b_batch)
    c = rng.standard_normal((*batch, m, n)).astype(np.float32)
    bias = None
    if epilog:
        bias = rng.standard_normal((*batch, 1, n) if bias_batched else (1, n)).astype(np.float32)
    with dm.Matmul(block(a, dists[0]), block(b, dists[1]), block(c, dists[2]), distribution=dists, beta=0.5,
                   transpose_b=tb, algorithm=algorithm, epilog=epilog, bias=bias) as mm:
        got, ran = mm.execute(), mm.algorithm
    want = block(reference(a, b, c, beta=0.5, transpose_b=tb, epilog=epilog, bias=bias), dists[2])
    try:
        assert_close(got, want, "float32")
    except AssertionError as e:
        failures.append(f"rank {me}: {a_batch} {b_batch} {dists} {ran}: {e}")


X, Y = dm.Slab.X, dm.Slab.Y
product((3,), (3,), (X, Y, X))
product((2, 1), (3,), (X, X, X), tb=True, algorithm="allgather")
product((), (2,), (Y, X, X), algorithm="allreduce", epilog="relu_bias", bias_batched=True)
product((2,), (), (X, Y, X), epilog="bias")
product((0,), (), (X, Y, X))

try:  # rank 1's a holds another batch than rank 0's: every rank raises, naming a
    dm.matmul(np.ones((2 + me, 4, 3), np.float32), np.ones((3, 5), np.float32), distribution=(X, Y, X))
    failures.append(f"rank {me}: batches that differ between ranks were not refused")
except dm.DistributionError as e:
    if "a: the ranks' blocks have different batch dimensions" not in str(e):
        failures.append(f"rank {me}: {e}")

_expect.tally(rt, failures, "batched")
