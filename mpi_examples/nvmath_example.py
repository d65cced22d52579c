"""The distributed matmul example of the nvmath-python documentation, on dmatmul.

    mpiexec -n 4 python mpi_examples/nvmath_example.py

A is stored transposed (K x M) and split by columns (Slab.Y), so op(A) = A.T is
split by rows; B (K x N) is split by columns; C and the result by rows.
D = 0.45 * A.T @ B + 0.67 * C. On NVIDIA GPUs with nvmath-python this runs
cuBLASMp's AllGather+GEMM; elsewhere the JAX backend's (at this size one
all-gather and one GEMM).
"""

import numpy as np

import dmatmul as dm

rt = dm.init()
m, n, k = 128, 512, 1024
dist_a, dist_b, dist_c = dm.Slab.Y, dm.Slab.Y, dm.Slab.X

rng = np.random.default_rng(0)
a = rng.random((k, m), dtype=np.float32)  # stored transposed
b = rng.random((k, n), dtype=np.float32)
c = rng.random((m, n), dtype=np.float32)
a_local, b_local, c_local = (dm.split(x, d)[rt.rank] for x, d in ((a, dist_a), (b, dist_b), (c, dist_c)))

with dm.Matmul(a_local, b_local, c_local, distribution=(dist_a, dist_b, dist_c), alpha=0.45, beta=0.67,
               transpose_a=True) as mm:
    d_local = mm.execute()
    algorithm = mm.algorithm

reference = 0.45 * a.T.astype(np.float64) @ b + 0.67 * c
ok = all(rt.comm.allgather(np.allclose(d_local, dm.split(reference, dist_c)[rt.rank], rtol=1e-5, atol=1e-4)))
assert np.array_equal(c_local, dm.split(c, dist_c)[rt.rank]), "c must not be modified"
if rt.rank == 0:
    print(f"nvmath example: {algorithm} on {rt.size} ranks, local result {d_local.shape}; matches numpy: {ok}")
dm.finalize()
raise SystemExit(0 if ok else 1)
