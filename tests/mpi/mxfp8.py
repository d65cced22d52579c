"""Run under ``mpiexec -n 3`` with the fake nvmath (tests/gpu/_fake_nvmath.py):
block-scaled FP8 (MXFP8) with each rank's scales split along with its blocks,
on the JAX backend and on nvmath, uneven splits (M = 13, N = 11 over 3 ranks;
K = 96, 32 per rank where K is split, so the local blocks' scales are the
global ones split), against numpy in float64 on the dequantized operands.
Prints "MISMATCH" and exits 1 on any difference; a bad scale shape on one
rank raises on every rank."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "gpu"))
import _fake_nvmath  # noqa: E402

_fake_nvmath.install()

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import dmatmul as dm  # noqa: E402

rt = dm.init()
X, Y = dm.Slab.X, dm.Slab.Y
rng = np.random.default_rng(7)
m, k, n = 13, 96, 11
a = rng.standard_normal((m, k)).astype(ml_dtypes.float8_e4m3fn)
b = rng.standard_normal((n, k)).astype(ml_dtypes.float8_e4m3fn)  # transpose_b: b stored (N, K)
sa = rng.integers(121, 134, (m, k // 32)).astype(np.uint8)
sb = rng.integers(121, 134, (n, k // 32)).astype(np.uint8)
deq = lambda x, s: x.astype(np.float64) * np.exp2(np.repeat(s.astype(np.float64), 32, axis=1) - 127)  # noqa: E731
want = deq(a, sa) @ deq(b, sb).T
bad = 0
for backend in ("jax", "nvmath"):
    for dists in ((X, X, X), (Y, Y, X)):  # a split by rows (K whole), or a and b split along K
        da, db, dd = dists
        la, lb = dm.split(a, da)[rt.rank], dm.split(b, db)[rt.rank]
        # the scales split with their operand: one per 32 of the local block's K
        lsa = dm.split(sa, da)[rt.rank] if da == X else sa[:, rt.rank : rt.rank + 1]
        lsb = dm.split(sb, db)[rt.rank] if db == X else sb[:, rt.rank : rt.rank + 1]
        d = dm.matmul(la, lb, distribution=dists, transpose_b=True, backend=backend,
                      quantization_scales={"a": lsa, "b": lsb}, result_type="float32")
        mine = dm.split(want, dd)[rt.rank]
        if d.shape != mine.shape or not np.allclose(d, mine, rtol=0, atol=1e-5 * np.abs(want).max()):
            print(f"MISMATCH rank {rt.rank} {backend} {dists}", flush=True)
            bad = 1
# a scale of the wrong shape on one rank: every rank raises
try:
    lsa = sa[: (1 if rt.rank == 1 else None)]
    dm.matmul(dm.split(a, X)[rt.rank], dm.split(b, X)[rt.rank], distribution=(X, X, X), transpose_b=True,
              backend="jax", quantization_scales={"a": dm.split(sa, X)[rt.rank] if rt.rank != 1 else lsa, "b":
                                                  dm.split(sb, X)[rt.rank]})
    print(f"MISMATCH rank {rt.rank}: no error", flush=True)
    bad = 1
except ValueError as e:
    if rt.rank == 0:
        print("refused:", str(e)[:200], flush=True)

print(f"rank {rt.rank} done on {rt.size} processes", flush=True)
sys.exit(1 if bad else 0)
