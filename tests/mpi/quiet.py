"""Run under ``mpiexec -n P``: the user's output, around products whose
collectives connect gloo communicators (the JAX backend on CPU), comes out
as written, with none of gloo's ``[Gloo] Rank r is connected to ...`` lines
(unless ``DMATMUL_VERBOSE=1``). Rank 0 prints a line, a line in two
pieces (the first flushed before the products run) and ``quiet products on
P ranks: matches numpy: True``; the others print nothing.
"""

from __future__ import annotations

import sys

import numpy as np

import dmatmul as dm

rt = dm.init()
me, P = rt.rank, rt.size
X, Y = dm.Slab.X, dm.Slab.Y
rng = np.random.default_rng(5)
a, b = rng.standard_normal((12, 5)), rng.standard_normal((5, 8))
if me == 0:  # (rank 0 alone: mpiexec interleaves what several ranks write, with no regard for lines)
    print("rank 0: before the first product", flush=True)
    print("rank 0: a line in", end=" ", flush=True)  # left open while communicators connect
ok = bool(np.allclose(dm.matmul(dm.split(a, X)[me], dm.split(b, Y)[me], distribution=(X, Y, X)),
                      dm.split(a @ b, X)[me]))
if me == 0:
    print("two pieces", flush=True)
if P % 2 == 0 and P > 2:  # a grid's rows and columns: communicators of some of the ranks
    grid = dm.BlockCyclic(dm.ProcessGrid((2, P // 2)), (2, 2))
    d = dm.matmul(dm.split(a, grid)[me], dm.split(b, grid)[me], distribution=(grid, grid, grid))
    ok = ok and bool(np.allclose(d, dm.split(a @ b, grid)[me]))
ok = all(rt.comm.allgather(ok))
if me == 0:
    print(f"quiet products on {P} ranks: matches numpy: {ok}", flush=True)
dm.finalize()
sys.exit(0 if ok else 1)
