"""Run under ``mpiexec -n 4`` (``fake``: the nvmath backend on
tests/gpu/_fake_nvmath.py, else JAX): products on ``dm.Sharded`` layouts of a
(2, 2) mesh that no 2-D distribution expresses (replicated over an axis, axes
out of rank order, uneven sizes, batch dimensions split), each rank passing
its blocks (``Sharded.global_indices``) and checking its result block against
numpy (bfloat16 and complex64 too, moved as bytes; a rank that gets
nothing; an operand taken in the layout the cost model chooses); a mesh of
another size raises a DistributionError on every rank.
Prints ``sharded checks on 4 processes: N failures`` on rank 0; exits 1 on a
failure.
"""

from __future__ import annotations


import _expect

backend, fake = _expect.backend_from_argv()

import numpy as np  # noqa: E402

import dmatmul as dm  # noqa: E402
from dmatmul.testing.reference import assert_close, random_matrix  # noqa: E402

rt = dm.init()
me = rt.rank
mesh = dm.ProcessMesh((2, 2), ("x", "y"))
failures: list[str] = []


def block(x: np.ndarray, d: dm.Sharded) -> np.ndarray:
    return x[np.ix_(*d.global_indices(me, x.shape))]


def check(name: str, a_shape, b_shape, specs, dtype: str = "float64", told_has: str = "", **kw) -> None:
    rng = np.random.default_rng(7)
    a, b = random_matrix(rng, a_shape, dtype), random_matrix(rng, b_shape, dtype)
    da, db, dd = (s if isinstance(s, dm.Distribution) else dm.Sharded(mesh, s) for s in specs)
    try:
        with dm.Matmul(block(a, da), block(b, db), distribution=(da, db, dd), backend=backend, **kw) as mm:
            got = mm.execute()
            told = mm.explain()
    except Exception as e:  # (raised on every rank alike)
        failures.append(f"{name}: rank {me}: {type(e).__name__}: {e}")
        return
    wide = np.complex128 if np.dtype(a.dtype).kind == "c" else np.float64
    a, b = a.astype(wide), b.astype(wide)
    want = block(np.matmul(a.swapaxes(-1, -2) if kw.get("transpose_a") else a, b), dd)
    try:
        assert_close(got, want, dtype)
    except AssertionError as e:
        failures.append(f"{name}: rank {me} got {got.shape}, want {want.shape}: {e}")
        return
    if told_has and told_has not in told:
        failures.append(f"{name}: explain() does not say {told_has!r}:\n{told}")
    if name.startswith("independent") and "each rank multiplies its own items; nothing moves" not in told:
        failures.append(f"{name}: explain() does not say each rank multiplies its own items:\n{told}")


check("rows over x", (11, 7), (7, 9), [("x", None), (None, "y"), (("y", "x"), None)])
# (where a Sharded is a 2-D grid's layout, the sizes are even: nvmath pads uneven splits of 1-D layouts only)
check("replicated a", (6, 4), (4, 8), [(None, None), ("y", "x"), (None, "x")])
check("transposed a", (8, 12), (8, 10), [(None, ("y", "x")), ("x", None), ("y", "x")], transpose_a=True)
check("batch over x", (3, 5, 6), (3, 6, 4), [("x", None, "y"), ("x", None, None), (None, "y", None)])
check("independent batch", (5, 4, 6), (5, 6, 3), [(("x", "y"), None, None)] * 3)
# dtypes MPI has no type for, moved as bytes; 3 rows over 4 ranks: a rank that gets (and holds) nothing
check("bfloat16, 3 rows", (3, 8), (8, 6), [("y", None), (None, ("y", "x")), (("x", "y"), None)], dtype="bfloat16")
check("complex64, 3 columns", (5, 6), (6, 3), [(None, ("y", "x")), ("x", None), (None, ("y", "x"))], dtype="complex64")
check("independent batch over x", (3, 4, 6), (3, 6, 3), [("x", None, None)] * 3)
# a's rows over y only: the cost model takes it as Slab.Y (the rule's Slab.X leaves the plan to move a again)
check("a's layout chosen", (128, 4096), (4096, 8), [("y", None), dm.Slab.X, dm.Slab.Y],
      told_has="the plan takes a as Slab.Y (")

try:
    dm.matmul(np.ones((2, 3)), np.ones((3, 2)), distribution=dm.Sharded(dm.ProcessMesh((2, 4), ("x", "y")), ("x", None)),
              backend=backend)
    failures.append("a mesh of 8 ranks on 4 processes was taken")
except dm.DistributionError as e:
    if "spans 8 ranks" not in str(e) or "4 processes" not in str(e):
        failures.append(f"the mesh-size error says: {e}")

# a Sharded whose 2-D form is a Slab keeps its mesh: refused as well, naming the operand
try:
    slab = dm.Sharded(dm.ProcessMesh(8, "x"), (None, "x"))
    dm.matmul(np.ones((2, 3)), np.ones((3, 2)), distribution=(dm.Slab.X, slab, dm.Slab.X), backend=backend)
    failures.append("a Slab's mesh of 8 ranks on 4 processes was taken")
except dm.DistributionError as e:
    if "distribution of b: Sharded(" not in str(e) or "spans 8 ranks" not in str(e) or "4 processes" not in str(e):
        failures.append(f"the Slab's mesh-size error says: {e}")

_expect.tally(rt, failures, "sharded")
