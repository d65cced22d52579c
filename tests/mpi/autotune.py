"""Run under ``mpiexec -n 2`` (the JAX backend): ``Matmul.autotune()`` with
each rank's blocks, where the ranks' own timings (made up, per rank) disagree
on which route is fastest: the slowest rank's time decides, every rank keeps
the same route, and each rank's result block matches numpy, before and after
``reset_operands``. Prints ``autotune checks on 2 processes: N failures`` on
rank 0; exits 1 on a failure."""

from __future__ import annotations

import _expect  # noqa: F401  (the repository on the path)

import numpy as np  # noqa: E402

import dmatmul as dm  # noqa: E402
from dmatmul import _autotune  # noqa: E402
from dmatmul._matmul import plan_of  # noqa: E402
from dmatmul.testing.reference import assert_close, random_matrix  # noqa: E402

rt = dm.init()
me, P = rt.rank, rt.size
failures: list[str] = []
real = _autotune.measure
timed: list = []
#: each rank's own medians (s) of the four routes it times: rank 0 finds the second fastest, rank 1 the
#: fourth; the slowest rank's times put the third first
OWN = {0: [0.5, 0.1, 0.3, 0.6], 1: [0.5, 0.6, 0.3, 0.1]}


def measure(routes, run, iterations):
    timed[:] = [kernel for kernel, _ in routes]
    real(routes, run, iterations)  # (every route runs, collectively, as it would)
    return OWN[me][:len(routes)]


_autotune.measure = measure
rng = np.random.default_rng(5)
a, b = random_matrix(rng, (64, 48), "float64"), random_matrix(rng, (48, 40), "float64")
dists = (dm.Slab.X, dm.Slab.Y, dm.Slab.X)


def block(x, d):
    return x[np.ix_(*d.global_indices(me, x.shape, P))]


try:
    with dm.Matmul(block(a, dists[0]), block(b, dists[1]), distribution=dists, backend="jax") as mm:
        mm.autotune(iterations=2, candidates=4)
        kept = plan_of(mm).cost.kernel
        everyone = rt.comm.allgather(_autotune.label(kept))
        if len(set(everyone)) != 1:
            failures.append(f"rank {me}: the ranks kept different routes: {everyone}")
        if len(timed) != 4 or kept != timed[2]:
            failures.append(f"rank {me}: kept {_autotune.label(kept)}, not the third route timed: {timed}")
        if "(the slowest rank's)" not in mm.explain():
            failures.append(f"rank {me}: explain() does not say the slowest rank's times count:\n{mm.explain()}")
        assert_close(mm.execute(), block(a @ b, dists[2]), "float64")
        a2 = random_matrix(rng, a.shape, "float64")
        mm.reset_operands(a=block(a2, dists[0]))
        assert_close(mm.execute(), block(a2 @ b, dists[2]), "float64")
except Exception as e:  # (raised on every rank alike)
    failures.append(f"rank {me}: {type(e).__name__}: {e}")

_expect.tally(rt, failures, "autotune")
