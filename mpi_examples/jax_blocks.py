"""dmatmul.jax's blocks on a mesh that spans processes: a tensor-parallel MLP in your own shard_map.

    mpiexec -n 4 python mpi_examples/jax_blocks.py [--bidirectional]

``dm.init()`` starts ``jax.distributed`` (here one CPU device per process, on a
GPU cluster one GPU each), so the mesh spans every process's devices. Each
process places its own shards of the global arrays; inside ``jax.shard_map``
the rings of ``allgather_matmul`` and ``matmul_reduce_scatter`` run over the
``model`` axis, each ``data`` row of the mesh on its own. The forward pass and
the gradients are checked against numpy on every process. ``--bidirectional``
sends half of each block each way round the rings (the default leaves it to
the cost model: one way on CPU).
"""

import sys

import numpy as np

import dmatmul as dm

rt = dm.init()  # before JAX is first used: it starts jax.distributed

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import dmatmul.jax as dmj  # noqa: E402

ndev = jax.device_count()  # every process's devices
rows = 2 if ndev % 2 == 0 and ndev >= 4 else 1
mesh = jax.make_mesh((rows, ndev // rows), ("data", "model"))
tokens, d_model, d_ff = 8 * ndev, 24, 12 * ndev
both = True if "--bidirectional" in sys.argv[1:] else None


def mlp(x, w1, w2):  # local blocks: x (tokens / ndev, d_model), w1 (d_model, d_ff / model), w2 (d_ff / model, d_model)
    h = dmj.allgather_matmul(x, w1, axis_name="model", bidirectional=both)  # its data row's tokens, its d_ff columns
    return dmj.matmul_reduce_scatter(jax.nn.relu(h), w2, axis_name="model", bidirectional=both)


tok = P(("data", "model"))
specs = (tok, P(None, "model"), P("model", None))
f = jax.jit(jax.shard_map(mlp, mesh=mesh, in_specs=specs, out_specs=tok))

rng = np.random.default_rng(11)  # the same global arrays on every process; each places its own shards
x, w1, w2, g = (rng.standard_normal(s).astype(np.float32)
                for s in ((tokens, d_model), (d_model, d_ff), (d_ff, d_model), (tokens, d_model)))


def place(v, spec):
    return jax.make_array_from_callback(v.shape, NamedSharding(mesh, spec), lambda index: v[index])


args = [place(v, s) for v, s in zip((x, w1, w2), specs)]
with jax.set_mesh(mesh):
    out = f(*args)
    grads = jax.grad(lambda *a: jnp.sum(f(*a[:3]) * a[3]), argnums=(0, 1, 2))(*args, place(g, tok))


def gathered(v):
    return np.asarray(multihost_utils.process_allgather(v, tiled=True), dtype=np.float64)


# numpy: out = relu(x w1) w2; for loss = sum(out * g): dw2 = r^T g, dh = (g w2^T) * (h > 0), dw1 = x^T dh, dx = dh w1^T
h = x.astype(np.float64) @ w1
r = np.maximum(h, 0)
dh = (g @ w2.T.astype(np.float64)) * (h > 0)
want = {"out": r @ w2, "dx": dh @ w1.T, "dw1": x.T.astype(np.float64) @ dh, "dw2": r.T @ g}
got = {"out": gathered(out), **{name: gathered(v) for name, v in zip(("dx", "dw1", "dw2"), grads)}}
close = {name: bool(np.allclose(got[name], want[name], rtol=1e-4, atol=1e-3)) for name in want}
ok = all(rt.comm.allgather(all(close.values())))
if rt.rank == 0:
    print(f"dmatmul.jax MLP on a {rows}x{ndev // rows} mesh of {rt.size} processes (bidirectional={both}): out {got['out'].shape}, "
          f"gradients {[got[k].shape for k in ('dx', 'dw1', 'dw2')]}; {close}; matches numpy: {ok}")
dm.finalize()
raise SystemExit(0 if ok else 1)
