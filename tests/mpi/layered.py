"""Run under ``mpiexec -n 8`` with the fake nvmath (tests/gpu/_fake_nvmath.py):
``algorithm="summa25d"`` on the nvmath backend.

nvmath-python 1.0 runs cuBLASMp on the communicator of
``nvmath.distributed.initialize`` only (the fake's ProcessGrid, like nvmath's,
must span all of its ranks, and its Matmul takes no communicator), so 2.5-D
SUMMA's per-layer SUMMA has no nvmath path: every rank must raise the same
ValueError naming the limitation, promptly, with a distribution given or
chosen; then a SUMMA product on a 2 x 4 grid still runs right on every rank.
Prints ``ok <scenario>`` per scenario on rank 0; exits 1 if any rank saw
something else.
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "gpu"))
import _fake_nvmath  # noqa: E402

_fake_nvmath.install()

import _expect  # noqa: E402
import numpy as np  # noqa: E402

import dmatmul as dm  # noqa: E402

rt = dm.init(start=())
P, me = rt.size, rt.rank
X, Y = dm.Slab.X, dm.Slab.Y
rng = np.random.default_rng(5)
a, b = rng.standard_normal((16, 12)), rng.standard_normal((12, 8))
problems: list[str] = []
words = ["algorithm='summa25d'", "sub-communicator", "nvmath.distributed.initialize()", "backend='jax'"]

_expect.expect(rt, problems, "summa25d-given", ValueError, words, lambda: dm.matmul(
    dm.split(a, X)[me], dm.split(b, Y)[me], distribution=(X, Y, X), algorithm="summa25d", backend="nvmath"))
_expect.expect(rt, problems, "summa25d-planned", ValueError, words, lambda: dm.Matmul(
    dm.split(a, X)[me], dm.split(b, Y)[me], distribution=(X, Y, X), algorithm="summa25d", backend="nvmath").plan())

grid = dm.BlockCyclic(dm.ProcessGrid((2, 4)), (2, 2))
d = dm.matmul(dm.split(a, grid)[me], dm.split(b, grid)[me], distribution=grid, algorithm="summa", backend="nvmath")
if not np.allclose(d, dm.split(a @ b, grid)[me]):
    problems.append(f"rank {me}: summa after the refusals: wrong result")
_expect.finish(rt, problems)
