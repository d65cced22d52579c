"""AllGather+GEMM: A split by rows, B by columns, the result by rows.

    mpiexec -n 4 python mpi_examples/allgather_gemm.py

Every rank holds only its own blocks; each rank multiplies its rows of A with
all of B's column blocks, gathered from the other ranks. On 4 CPU ranks at this size the
default cost model gathers B in one all-gather, then runs one GEMM; a larger
product (or 3 ranks here) runs it as a ring, B's blocks travelling while each
rank multiplies the block it has. The explain() printed says which ran.
"""

import numpy as np

import dmatmul as dm

rt = dm.init()  # MPI + jax.distributed, one device per process
m, n, k = 1000, 600, 800  # uneven over 3 or 7 ranks too
dists = (dm.Slab.X, dm.Slab.Y, dm.Slab.X)

rng = np.random.default_rng(42)  # every rank makes the same global data, keeps its blocks
a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
a_local, b_local = dm.split(a, dists[0])[rt.rank], dm.split(b, dists[1])[rt.rank]

with dm.Matmul(a_local, b_local, distribution=dists) as mm:
    d_local = mm.execute()
    algorithm = mm.algorithm
    if rt.rank == 0:
        print(mm.explain())

ok = np.allclose(d_local, dm.split(a @ b, dists[2])[rt.rank])
ok = all(rt.comm.allgather(ok))
if rt.rank == 0:
    print(f"{algorithm} on {rt.size} ranks: rank 0 holds {d_local.shape} of {(m, n)}; matches numpy: {ok}")
dm.finalize()
raise SystemExit(0 if ok else 1)
