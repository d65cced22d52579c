"""GEMM+ReduceScatter: A split by columns, B by rows (both on K), the result by columns.

    mpiexec -n 4 python mpi_examples/gemm_reduce_scatter.py

Each rank multiplies its K-slices; the partial sums are added up and scattered,
each rank ending with the full sum of its result columns (at this size one GEMM,
then one reduce-scatter; a larger product runs it as a ring, partial sums
travelling while the next block is multiplied: Matmul.explain() says which).
"""

import numpy as np

import dmatmul as dm

rt = dm.init()
m, n, k = 512, 768, 1001
dists = (dm.Slab.Y, dm.Slab.X, dm.Slab.Y)

rng = np.random.default_rng(7)
a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (m, n)))
blocks = [dm.split(x, d)[rt.rank] for x, d in zip((a, b, c), dists)]

# D = relu(2 * A @ B - C)
d_local = dm.matmul(*blocks, distribution=dists, alpha=2.0, beta=-1.0, epilog="relu", algorithm="reduce_scatter")

reference = np.maximum(2.0 * a.astype(np.float64) @ b - c, 0)
ok = all(rt.comm.allgather(np.allclose(d_local, dm.split(reference, dists[2])[rt.rank], rtol=1e-4, atol=1e-3)))
if rt.rank == 0:
    print(f"reduce_scatter on {rt.size} ranks: rank 0 holds {d_local.shape} of {(m, n)}; matches numpy: {ok}")
dm.finalize()
raise SystemExit(0 if ok else 1)
