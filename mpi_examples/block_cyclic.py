"""ScaLAPACK-style 2-D block-cyclic matrices multiplied with SUMMA.

    mpiexec -n 4 python mpi_examples/block_cyclic.py

Four ranks form a 2x2 process grid; A, B and the result are dealt in 64x64
blocks round-robin over its rows and columns (ScaLAPACK's numroc sizes). The
product runs SUMMA: at this size op(A)'s row panel is gathered along grid rows
and op(B)'s column panel along grid columns, two collectives, then one GEMM; a
larger product runs it as a ring, K panels of A travelling along grid rows and
panels of B along grid columns (the explain() printed says which). The result
is then redistributed to row slabs, every element moving once.
"""

import sys

import numpy as np

import dmatmul as dm

rt = dm.init()
if rt.size != 4:  # the 2x2 grid spans exactly four ranks
    if rt.rank == 0:
        print(f"block_cyclic.py: a 2x2 process grid needs 4 ranks, not {rt.size}: run with mpiexec -n 4",
              file=sys.stderr)
    dm.finalize()
    raise SystemExit(1)
grid = dm.ProcessGrid((2, 2), layout="col")  # as ScaLAPACK's default 'C' order
bc = dm.BlockCyclic(grid, (64, 64))
m, n, k = 1000, 700, 900

rng = np.random.default_rng(11)
a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
a_local, b_local = dm.split(a, bc)[rt.rank], dm.split(b, bc)[rt.rank]

with dm.Matmul(a_local, b_local, distribution=bc) as mm:
    d_local = mm.execute()
    algorithm = mm.algorithm
    if rt.rank == 0:
        print(mm.explain())

d_rows = dm.redistribute(d_local, bc, dm.Slab.X)  # the same result, as row slabs
reference = a @ b
ok = np.allclose(d_local, dm.split(reference, bc)[rt.rank]) and np.allclose(d_rows, dm.split(reference, dm.Slab.X)[rt.rank])
ok = all(rt.comm.allgather(ok))
if rt.rank == 0:
    print(f"block-cyclic {algorithm} on a 2x2 grid: rank 0 holds {d_local.shape} of {(m, n)}; matches numpy: {ok}")
dm.finalize()
raise SystemExit(0 if ok else 1)
