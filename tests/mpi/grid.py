"""Run under ``mpiexec -n 4``: 2x2 block-cyclic products (SUMMA), mixed layouts and
dm.redistribute between every pair of layouts, each rank checking its own block."""

from __future__ import annotations

import itertools

import _expect
import numpy as np

import dmatmul as dm

from dmatmul.testing.reference import assert_close, reference

rt = dm.init()
me = rt.rank
row, col = dm.ProcessGrid((2, 2)), dm.ProcessGrid((2, 2), layout="col")
failures = []


def product(m, n, k, dists, *, ta=False, tb=False, algorithm="auto", alpha=1.0, beta=0.0, epilog=None):
    rng = np.random.default_rng(m + 7 * n + 31 * k)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    c = rng.standard_normal((m, n)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32) if epilog else None
    blocks = [dm.split(x, d)[me] for x, d in zip((a, b, c), dists)]
    with dm.Matmul(*blocks, distribution=dists, transpose_a=ta, transpose_b=tb, algorithm=algorithm,
                   alpha=alpha, beta=beta, epilog=epilog, bias=bias) as mm:
        got, ran = mm.execute(), mm.algorithm
    ref = reference(a, b, c, alpha=alpha, beta=beta, transpose_a=ta, transpose_b=tb, epilog=epilog, bias=bias)
    try:
        assert_close(got, dm.split(ref, dists[2])[me], "float32")
    except AssertionError as e:
        failures.append(f"rank {me}: {dists} ta={ta} tb={tb} {ran}: {e}")
    return ran


bc = dm.BlockCyclic(row, (2, 3))
ran = product(13, 11, 9, (bc, bc, bc), algorithm="summa", alpha=0.5, beta=2.0, epilog="relu_bias")
assert ran == "summa", ran
product(16, 16, 16, (bc, bc, bc))
for ta, tb in itertools.product((False, True), repeat=2):
    product(10, 7, 12, (dm.BlockCyclic(row, (3, 2), first_process=(1, 0)), bc, dm.BlockNonCyclic(row)), ta=ta, tb=tb)
product(13, 9, 11, (bc, dm.Slab.X, dm.Slab.Y))  # mixed: A block-cyclic, B Slab.X, result Slab.Y

layouts = [dm.Slab.X, dm.Slab.Y, dm.Replicated(), dm.BlockNonCyclic(row), dm.BlockCyclic(col, (1, 2), (1, 1)), bc]  # two grids
x = np.arange(13 * 10, dtype=np.float64).reshape(13, 10)
for src, dst in itertools.product(layouts, layouts):
    got = dm.redistribute(dm.split(x, src)[me], src, dst)
    if not np.array_equal(got, dm.split(x, dst)[me]):
        failures.append(f"rank {me}: redistribute {src} -> {dst}")
for shape in ((0, 10), (13, 0)):  # nothing to move: each rank gets its empty block, in x's dtype
    x = np.zeros(shape, np.float64)
    for src, dst in itertools.product(layouts, layouts):
        got = dm.redistribute(dm.split(x, src)[me], src, dst)
        want = dm.split(x, dst)[me]
        if not isinstance(got, np.ndarray) or got.shape != want.shape or got.dtype != want.dtype:
            failures.append(f"rank {me}: redistribute {shape} {src} -> {dst}: got {got!r}, want {want.shape}")

_expect.tally(rt, failures, "grid")
