"""Run under ``mpiexec -n P``: how the JAX backend's process group starts.

Usage: start.py user-reversed|used-first|used-on-one-rank|after-finalize

* ``user-reversed``: the user starts ``jax.distributed`` (process index = world
  rank), then ``dm.init(comm)`` on a communicator whose ranks run the other way
  round; 1-D and 2-D products must match numpy on every rank (rank r is the
  communicator's, not JAX's process r).
* ``used-first``: JAX is used on every rank before the first product, so
  ``jax.distributed`` can no longer start: every rank raises a RuntimeError
  that says to call ``dm.init()`` first.
* ``used-on-one-rank``: the same on rank 1 only: every rank still raises (no
  rank waits in the start the others never reach).
* ``after-finalize``: a product after ``dm.finalize()`` (a problem planned
  before, a new one, and a ``Matmul`` planned and run before) raises on every
  rank: JAX cannot start its process group twice in one process, and no plan
  runs on the one shut down.
"""

from __future__ import annotations

import sys

import numpy as np

mode = sys.argv[1]
if mode == "user-reversed":
    import jax

    jax.config.update("jax_num_cpu_devices", 1)
    jax.config.update("jax_enable_preemption_service", False)
    jax.distributed.initialize(cluster_detection_method="mpi4py")

from mpi4py import MPI  # noqa: E402

import dmatmul as dm  # noqa: E402

world = MPI.COMM_WORLD
size = world.Get_size()
rng = np.random.default_rng(7)
a, b = rng.standard_normal((13, 7)), rng.standard_normal((7, 11))

if mode == "user-reversed":
    comm = world.Split(0, size - 1 - world.Get_rank())
    rt = dm.init(comm)
    rank = rt.rank
    assert rank == size - 1 - world.Get_rank()
    grid = dm.ProcessGrid((2, size // 2)) if size % 2 == 0 else dm.ProcessGrid((size,))
    cases = [(dm.Slab.X, dm.Slab.Y, dm.Slab.X), (dm.Slab.Y, dm.Slab.X, dm.Slab.Y)]
    if grid.ndim == 2:
        cases.append((dm.BlockCyclic(grid, (2, 3)), dm.BlockNonCyclic(grid), dm.BlockCyclic(grid, (3, 2))))
    ok = True
    for dists in cases:
        la, lb = dm.split(a, dists[0])[rank], dm.split(b, dists[1])[rank]
        d = dm.matmul(la, lb, distribution=dists)
        good = d.shape == dm.split(a @ b, dists[2])[rank].shape and np.allclose(d, dm.split(a @ b, dists[2])[rank])
        if not good:
            print(f"MISMATCH rank {rank} {dists}", flush=True)
        ok = ok and good
    ok = all(comm.allgather(ok))
    dm.finalize()
elif mode == "after-finalize":
    rt = dm.init()
    rank = rt.rank
    la, lb = dm.split(a, dm.Slab.X)[rank], dm.split(b, dm.Slab.Y)[rank]
    d = dm.matmul(la, lb, distribution=(dm.Slab.X, dm.Slab.Y, dm.Slab.X))
    ok = np.allclose(d, dm.split(a @ b, dm.Slab.X)[rank])
    live = dm.Matmul(la, lb, distribution=(dm.Slab.X, dm.Slab.Y, dm.Slab.Y))  # a plan kept past dm.finalize()
    ok = ok and np.allclose(live.execute(), dm.split(a @ b, dm.Slab.Y)[rank])
    dm.finalize()
    calls = [lambda m=m: dm.matmul(dm.split(a[:m], dm.Slab.X)[rank], lb,  # the problem planned before, a new one
                                   distribution=(dm.Slab.X, dm.Slab.Y, dm.Slab.X)) for m in (13, 12)]
    for call in calls + [live.execute]:
        try:
            call()
            ok = False
            print(f"rank {rank}: no error after dm.finalize()", flush=True)
        except RuntimeError as e:
            ok = ok and "dm.finalize()" in str(e) and "end of the job" in str(e)
    ok = all(world.allgather(ok))
else:
    import jax.numpy as jnp

    rank = world.Get_rank()
    if mode == "used-first" or rank == 1:
        jnp.ones(3).block_until_ready()  # JAX starts its backends on this rank
    try:
        dm.matmul(dm.split(a, dm.Slab.X)[rank], dm.split(b, dm.Slab.Y)[rank],
                  distribution=(dm.Slab.X, dm.Slab.Y, dm.Slab.X))
        ok = False
    except RuntimeError as e:
        ok = "dm.init()" in str(e) and "rank" in str(e) and "before" in str(e)
        if not ok:
            print(f"rank {rank}: unexpected message: {e}", flush=True)
    ok = all(world.allgather(ok))
if world.Get_rank() == 0:
    print(f"{'ok' if ok else 'FAILED'} {mode} on {size} ranks", flush=True)
sys.exit(0 if ok else 1)
