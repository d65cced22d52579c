"""Plan once, execute many: a few steps of x <- relu(W @ x + bias) with one Matmul plan.

    mpiexec -n 4 python mpi_examples/plan_reuse.py

W is split by rows and stays put; the activations x are split by columns; the
plan compiles once and each step swaps in the new x with reset_operands.
"""

import numpy as np

import dmatmul as dm

rt = dm.init()
width, batch, steps = 384, 256, 5
dists = (dm.Slab.X, dm.Slab.Y, dm.Slab.X)  # W rows, x columns, result rows

rng = np.random.default_rng(3)
w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
bias = rng.standard_normal(width).astype(np.float32)
x = rng.standard_normal((width, batch)).astype(np.float32)

w_local = dm.split(w, dists[0])[rt.rank]
x_local = dm.split(x, dists[1])[rt.rank]
reference = x.astype(np.float64)
ok = True
with dm.Matmul(w_local, x_local, distribution=dists, epilog="relu_bias", bias=bias) as mm:
    for step in range(steps):
        y_local = mm.execute()  # this rank's rows of relu(W @ x + bias)
        reference = np.maximum(w.astype(np.float64) @ reference + bias[:, None], 0)
        ok &= np.allclose(y_local, dm.split(reference, dists[2])[rt.rank], rtol=1e-4, atol=1e-4)
        # the next x, split by columns: gather this step's rows and re-split (small, for the example)
        y = dm.join(rt.comm.allgather(y_local), dists[2], (width, batch))
        mm.reset_operands(b=dm.split(y, dists[1])[rt.rank])
    algorithm = mm.algorithm

ok = all(rt.comm.allgather(ok))
if rt.rank == 0:
    print(f"plan reuse: {steps} steps of {algorithm} on {rt.size} ranks with one plan; matches numpy: {ok}")
dm.finalize()
raise SystemExit(0 if ok else 1)
