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
# a Blackwell GPU (compute capability 10.0): local blocks of 128 in the TN layout go to cuBLASMp's MXFP8 path,
# each rank's scales converted to the tiled layout of its own blocks (the fake reads them as cuBLAS does)
_fake_nvmath.COMPUTE_CAPABILITY = (10, 0)
for dists, (m2, k2, n2) in (((X, X, X), (384, 128, 384)), ((Y, Y, X), (384, 384, 128))):
    a2 = rng.standard_normal((m2, k2)).astype(ml_dtypes.float8_e4m3fn)
    b2 = rng.standard_normal((n2, k2)).astype(ml_dtypes.float8_e4m3fn)
    sa2 = rng.integers(121, 134, (m2, k2 // 32)).astype(np.uint8)
    sb2 = rng.integers(121, 134, (n2, k2 // 32)).astype(np.uint8)
    want2 = deq(a2, sa2) @ deq(b2, sb2).T
    da, db, dd = dists
    k_part = slice(4 * rt.rank, 4 * rt.rank + 4)  # 128 of K per rank where K is split: 4 scales
    lsa = dm.split(sa2, da)[rt.rank] if da == X else sa2[:, k_part]
    lsb = dm.split(sb2, db)[rt.rank] if db == X else sb2[:, k_part]
    _fake_nvmath.CALLS.clear()
    with dm.Matmul(dm.split(a2, da)[rt.rank], dm.split(b2, db)[rt.rank], distribution=dists, transpose_b=True,
                   backend="nvmath", quantization_scales={"a": lsa, "b": lsb}, result_type="float32") as mm:
        d = mm.execute()
        text = mm.explain()
    mine = dm.split(want2, dd)[rt.rank]
    made = [kw for name, kw in _fake_nvmath.CALLS if name == "Matmul"]
    if not (made and all(kw["block_scaling"] and kw["dtypes"][0] == "float8_e4m3fn" for kw in made)):
        print(f"MISMATCH rank {rt.rank} {dists}: not cuBLASMp's MXFP8 path: {made} {text}", flush=True)
        bad = 1
    if d.shape != mine.shape or not np.allclose(d, mine, rtol=0, atol=1e-5 * np.abs(want2).max()):
        print(f"MISMATCH rank {rt.rank} nvmath MXFP8 {dists}", flush=True)
        bad = 1
_fake_nvmath.COMPUTE_CAPABILITY = (9, 0)
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
