"""Run under ``mpiexec -n P`` (P >= 2): an error on one rank raises on every rank.

Prints one ``ok <scenario>`` line per scenario on rank 0; exits 1 if any rank
saw something else. No rank may hang: the launcher's timeout catches that.
"""

from __future__ import annotations


import _expect
import numpy as np

import dmatmul as dm

rt = dm.init()
P, me = rt.size, rt.rank
X, Y = dm.Slab.X, dm.Slab.Y
M, N, K = 10, 6, 7
a = np.arange(M * K, dtype=np.float32).reshape(M, K)
b = np.ones((K, N), np.float32)
la, lb = dm.split(a, X)[me], dm.split(b, Y)[me]
problems = []


def expect(scenario, exc_type, words, call):
    _expect.expect(rt, problems, scenario, exc_type, words(me), call)


# 1. one rank's block has the wrong shape: every rank names rank 1, a and the shapes
bad_a = la[:, :-1] if me == 1 else la
expect(
    "bad-shape-on-one-rank",
    dm.DistributionError,
    lambda r: ["a:", "rank 1", f"{tuple(bad_a.shape) if r == 1 else ''}"],
    lambda: dm.matmul(bad_a, lb, distribution=(X, Y, X)),
)

# 2. one rank's dtype differs (a local check): rank 0 raises its own error, others name rank 0
odd_b = lb.astype(np.float64) if me == 0 else lb
expect(
    "bad-dtype-on-one-rank",
    TypeError,
    lambda r: ["float64"] + ([] if r == 0 else ["rank 0", f"this is rank {r}"]),
    lambda: dm.matmul(la, odd_b, distribution=(X, Y, X)),
)

# 3. no distribution under several processes
expect("missing-distribution", ValueError, lambda r: ["distribution is required"], lambda: dm.matmul(la, lb))

# 4. a named algorithm that does not fit: refused on every rank
expect(
    "algorithm-does-not-fit",
    ValueError,
    lambda r: ["reduce_scatter", "needs one of"],
    lambda: dm.matmul(la, lb, distribution=(X, Y, X), algorithm="reduce_scatter"),
)

# 5. dm.redistribute from a grid of another size: every rank names src (not x, whose blocks fit)
expect(
    "redistribute-src-grid-does-not-fit",
    dm.DistributionError,
    lambda r: ["src:", f"spans {P + 1} ranks", f"{P} processes"],
    lambda: dm.redistribute(la, dm.BlockNonCyclic(dm.ProcessGrid((P + 1, 1))), Y),
)

# 6. a result block no rank's host can hold: refused on every rank before anything is allocated
from dmatmul import _memory  # noqa: E402

R = dm.Replicated()
have = max(rt.comm.allgather(_memory.host_available() or 10**12))  # (one figure: every rank passes the same b)
big_m = 100_000 * P
big_n = max(100_000, 2 * have // (4 * 100_000) + 1)  # each rank's block of the result: twice the host's memory
expect(
    "result-too-large-for-every-rank",
    MemoryError,
    lambda r: ["d (the result, ", f"{big_m} x {big_n} float32", "on the host", "is available"],
    lambda: dm.matmul(np.ones((100_000, 1), np.float32), np.ones((1, big_n), np.float32), distribution=(X, R, X)),
)

# 7. one rank's host cannot hold its block (as it says): every rank raises, naming rank 1
if me == 1:
    _memory._host = (float("inf"), 10)  # (read as just now: 10 bytes free, until the scenario restores it)
expect(
    "memory-short-on-one-rank",
    MemoryError,
    lambda r: ["needs", "on the host", "10 B is available"] + ([] if r == 1 else ["rank 1"]),
    lambda: dm.matmul(la * 3, lb, distribution=(X, Y, X)),
)
_memory._host = (float("-inf"), None)

# 8. beta != 0 without c: every rank raises naming c; where one rank alone gives it, the others name that rank
expect("beta-without-c", ValueError, lambda r: ["beta=1.0 needs c", "pass c"],
       lambda: dm.matmul(la, lb, distribution=(X, Y, X), beta=1.0))
expect("beta-without-c-on-one-rank", ValueError,
       lambda r: ["beta=2.0 needs c"] + ([] if r == 1 else ["rank 1", f"this is rank {r}"]),
       lambda: dm.matmul(la, lb, distribution=(X, Y, X), beta=2.0 if me == 1 else 0.0))

# 9. after all that, the ranks still work together
d = dm.matmul(la, lb, distribution=(X, Y, X))
if not np.allclose(d, dm.split(a @ b, X)[me]):
    problems.append(f"rank {me}: wrong result after the errors")
_expect.finish(rt, problems)
