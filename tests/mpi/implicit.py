"""Run under ``mpiexec -n P``: no dm.init() call (implicit start), or init on the caller's communicator.

Usage: implicit.py implicit|comm
"""

from __future__ import annotations

import sys

import numpy as np

import dmatmul as dm

if sys.argv[1] == "comm":
    from mpi4py import MPI

    mine = MPI.COMM_WORLD.Dup()
    rt = dm.init(mine)
    assert rt.comm is mine
    rank, size = mine.Get_rank(), mine.Get_size()
else:
    from mpi4py import MPI  # only to know our rank for the test's own bookkeeping

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    assert dm.runtime() is None
    # before anything starts, a distribution without a grid already spans the
    # launched ranks (the same answer as after the first product), and asking
    # starts nothing
    before = dm.Slab.X.shape(rank, (11, 7)), [blk.shape for blk in dm.split(np.zeros((11, 7)), dm.Slab.Y)]
    assert dm.runtime() is None

a = np.arange(77, dtype=np.float64).reshape(11, 7)
b = np.arange(35, dtype=np.float64).reshape(7, 5) / 10
dists = (dm.Slab.X, dm.Slab.Y, dm.Slab.X)
la, lb = dm.split(a, dists[0], nranks=size)[rank], dm.split(b, dists[1], nranks=size)[rank]
# the first product: rank 0 alone asks what will run before its first execute(), before (implicit) the JAX
# backend's process group started, which every rank must start together (rank 0 alone in the start waited
# for the others, and the job aborted on garbled data)
mm = dm.Matmul(la, lb, distribution=dists)
told = mm.explain() if rank == 0 else None
first = mm.execute()
told_ok = told is None or f"algorithm:  {mm.algorithm}" in told
d = dm.matmul(la, lb, distribution=dists)
rt = dm.runtime()
assert rt is not None and rt.size == size and rt.rank == rank, rt
ok = told_ok and np.allclose(d, dm.split(a @ b, dists[2])[rank]) and np.allclose(first, d)
if sys.argv[1] == "implicit":
    after = dm.Slab.X.shape(rank, (11, 7)), [blk.shape for blk in dm.split(np.zeros((11, 7)), dm.Slab.Y)]
    ok = ok and before == after == ((11 // size + (rank < 11 % size), 7), [(11, 7 // size + (r < 7 % size)) for r in range(size)])
never = dm.Matmul(la, lb, distribution=dists)  # never planned
dm.finalize()
# after dm.finalize() rank 0 alone reads the account of a plan it still holds (a report at the end of a job):
# nothing starts again (asking the runtime started a new one there alone, collectively: the job hung)
if rank == 0:
    ok = ok and f"algorithm:  {mm.algorithm}" in mm.explain()
    try:  # a plan never made cannot be made now: said on this rank, which alone asked
        never.explain()
        ok = False
    except RuntimeError as e:
        ok = ok and "dm.finalize()" in str(e)
ok = all(rt.comm.allgather(ok))  # (MPI stays up)
if rank == 0:
    print(f"{sys.argv[1]}: {size} ranks, matches numpy: {ok}", flush=True)
sys.exit(0 if ok else 1)
