"""Run under ``mpiexec -n 4`` (``fake``: the nvmath backend on
tests/gpu/_fake_nvmath.py, else JAX): 2-D layouts that cuBLASMp cannot take
as given (an uneven split next to a 2-D grid, block sizes that differ along
K, a process row left without a part, a named SUMMA on an uneven grid, a
batch), each rank passing its blocks and checking its result block against
numpy. On nvmath each is re-laid around the 2-D plan (``explain()`` says so,
naming cuBLASMp's limit); JAX takes them as given.
Prints ``relaid checks on 4 processes: N failures`` on rank 0; exits 1 on a
failure.
"""

from __future__ import annotations


import _expect

backend, fake = _expect.backend_from_argv()

import numpy as np  # noqa: E402

import dmatmul as dm  # noqa: E402
from dmatmul.testing.reference import assert_close, random_matrix  # noqa: E402

rt = dm.init()
me, P = rt.rank, rt.size
failures: list[str] = []
grid = dm.ProcessGrid((2, 2))


def block(x: np.ndarray, d: dm.Distribution) -> np.ndarray:
    if x.ndim == 2:
        return x[np.ix_(*d.global_indices(me, x.shape, P))]
    rows, cols = d.global_indices(me, x.shape[-2:], P)
    return x[..., rows[:, None], cols[None, :]]


def check(name: str, a_shape, b_shape, dists, told_has: tuple[str, ...] = (), c: bool = False, **kw) -> None:
    rng = np.random.default_rng(11)
    a, b = random_matrix(rng, a_shape, "float64"), random_matrix(rng, b_shape, "float64")
    da, db, dd = dists
    want = np.matmul(a.swapaxes(-1, -2) if kw.get("transpose_a") else a, b.swapaxes(-1, -2) if kw.get("transpose_b") else b)
    cc = random_matrix(rng, want.shape, "float64") if c else None
    if c:
        kw = {**kw, "beta": 0.5}
        want = want + 0.5 * cc
    try:
        with dm.Matmul(block(a, da), block(b, db), None if cc is None else block(cc, dd), distribution=(da, db, dd),
                       backend=backend, **kw) as mm:
            got = mm.execute()
            told = mm.explain()
    except Exception as e:  # (raised on every rank alike)
        failures.append(f"{name}: rank {me}: {type(e).__name__}: {e}")
        return
    try:
        assert_close(got, block(want, dd), "float64")
    except AssertionError as e:
        failures.append(f"{name}: rank {me}: {e}")
        return
    missing = [w for w in (told_has if fake is not None else ()) if w not in told]
    if missing:
        failures.append(f"{name}: explain() does not say {missing}:\n{told}")


uneven = ("re-laid:", "cuBLASMp takes a grid's operands only block-cyclic")
# a Slab splitting K=21 unevenly next to a 2-D grid (the first of `dmatmul check --seed 1`'s refusals)
check("uneven slab next to a grid", (15, 21), (25, 21),
      (dm.Slab.Y, dm.BlockNonCyclic(grid, first_process=(1, 1)), dm.BlockNonCyclic(grid, first_process=(1, 0))),
      told_has=uneven, transpose_b=True)
# the grid's own split uneven (M = 33 over 2 process rows), c read
check("uneven grid", (33, 8), (8, 12), (dm.BlockNonCyclic(grid),) * 3, told_has=uneven, c=True)
# block sizes of K differ: a's 2, b's 3
check("block sizes differ", (8, 12), (12, 8),
      (dm.BlockCyclic(grid, (2, 2)), dm.BlockCyclic(grid, (3, 2)), dm.BlockCyclic(grid, (2, 2))),
      told_has=("re-laid:", "the block sizes of K differ", "cuBLASMp needs one block size per dimension"))
# blocks of 4 over M = 4 leave process row 1 without a part
check("a process row without a part", (4, 8), (8, 8), (dm.BlockCyclic(grid, (4, 4)),) * 3,
      told_has=("re-laid:", "cuBLASMp needs a part of every operand on every process"))
# SUMMA named on an uneven grid: re-laid onto the same grid block-cyclic (no 1-D layout runs SUMMA)
check("summa on an uneven grid", (20, 65), (20, 109), (dm.BlockNonCyclic(dm.ProcessGrid((2, 2), layout="col")),) * 3,
      told_has=(*uneven, "as BlockCyclic("), transpose_a=True, algorithm="summa")
# a batch: every item re-laid alike
check("batched, uneven grid", (2, 9, 6), (2, 6, 10), (dm.BlockNonCyclic(grid),) * 3, told_has=uneven)

_expect.tally(rt, failures, "relaid")
