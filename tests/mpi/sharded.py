"""Run under ``mpiexec -n 4`` (``fake``: the nvmath backend on
tests/gpu/_fake_nvmath.py, else JAX): products on ``dm.Sharded`` layouts of a
(2, 2) mesh that no 2-D distribution expresses (replicated over an axis, axes
out of rank order, uneven sizes, batch dimensions split), each rank passing
its blocks (``Sharded.global_indices``) and checking its result block against
numpy; a mesh of another size raises a DistributionError on every rank.
Prints ``sharded checks on 4 processes: N failures`` on rank 0; exits 1 on a
failure.
"""

from __future__ import annotations

import sys

import _expect

backend, fake = _expect.backend_from_argv()

import numpy as np  # noqa: E402

import dmatmul as dm  # noqa: E402

rt = dm.init()
me = rt.rank
mesh = dm.ProcessMesh((2, 2), ("x", "y"))
failures: list[str] = []


def block(x: np.ndarray, d: dm.Sharded) -> np.ndarray:
    return x[np.ix_(*d.global_indices(me, x.shape))]


def check(name: str, a_shape, b_shape, specs, **kw) -> None:
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    da, db, dd = (dm.Sharded(mesh, s) for s in specs)
    try:
        with dm.Matmul(block(a, da), block(b, db), distribution=(da, db, dd), backend=backend, **kw) as mm:
            got = mm.execute()
            told = mm.explain()
    except Exception as e:  # (raised on every rank alike)
        failures.append(f"{name}: rank {me}: {type(e).__name__}: {e}")
        return
    want = block(np.matmul(a.swapaxes(-1, -2) if kw.get("transpose_a") else a, b), dd)
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-10, atol=1e-10):
        failures.append(f"{name}: rank {me} got {got.shape}, want {want.shape}")
    elif name.startswith("independent") and "each rank multiplies its own items; nothing moves" not in told:
        failures.append(f"{name}: explain() does not say each rank multiplies its own items:\n{told}")


check("rows over x", (11, 7), (7, 9), [("x", None), (None, "y"), (("y", "x"), None)])
# (where a Sharded is a 2-D grid's layout, the sizes are even: nvmath pads uneven splits of 1-D layouts only)
check("replicated a", (6, 4), (4, 8), [(None, None), ("y", "x"), (None, "x")])
check("transposed a", (8, 12), (8, 10), [(None, ("y", "x")), ("x", None), ("y", "x")], transpose_a=True)
check("batch over x", (3, 5, 6), (3, 6, 4), [("x", None, "y"), ("x", None, None), (None, "y", None)])
check("independent batch", (5, 4, 6), (5, 6, 3), [(("x", "y"), None, None)] * 3)
check("independent batch over x", (3, 4, 6), (3, 6, 3), [("x", None, None)] * 3)

try:
    dm.matmul(np.ones((2, 3)), np.ones((3, 2)), distribution=dm.Sharded(dm.ProcessMesh((2, 4), ("x", "y")), ("x", None)),
              backend=backend)
    failures.append("a mesh of 8 ranks on 4 processes was taken")
except dm.DistributionError as e:
    if "spans 8 ranks" not in str(e) or "4 processes" not in str(e):
        failures.append(f"the mesh-size error says: {e}")

count = rt.comm.allreduce(len(failures))
for f in failures:
    print(f, flush=True)
if me == 0:
    print(f"sharded checks on {rt.size} processes: {count} failures", flush=True)
dm.finalize()
sys.exit(1 if count else 0)
