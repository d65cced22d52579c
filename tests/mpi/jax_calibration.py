"""Run under ``mpiexec -n 3``: dmatmul.jax's blocks, ``bidirectional=None``, where one process's calibration differs.

Rank 1's ``DMATMUL_COST_MODEL`` names a calibration whose CPU links are full
duplex (two rings pay there), then a file that is no calibration at all; the
other ranks read none. Every process traces its own rings of the same
``jax.shard_map`` on a mesh of all processes' devices: they must choose alike
(one ring each way or not, whatever each one's file says), else one ring's
blocks arrive in another's (gloo: "Received data size doesn't match expected
size", the job aborts) or rank 1 raises while the others wait in the ring.
Forward and gradients of both blocks are checked against numpy on every rank.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile

import numpy as np

import dmatmul as dm

rt = dm.init()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import dmatmul.jax as dmj  # noqa: E402

ndev = jax.device_count()
mesh = jax.make_mesh((ndev,), ("model",))
where = pathlib.Path(tempfile.mkdtemp())
duplex = {"version": 1, "models": {"cpu": {"alpha": 1e-9, "beta": 1e-9, "gamma": 1e-11, "duplex": True}}}


def place(v, spec):
    return jax.make_array_from_callback(v.shape, NamedSharding(mesh, spec), lambda index: v[index])


def gathered(v):
    return np.asarray(multihost_utils.process_allgather(v, tiled=True), dtype=np.float64)


def check(label: str, m: int) -> bool:
    """allgather_matmul then matmul_reduce_scatter over every process (x: m rows per rank), forward and grads."""
    def body(x, w1, w2):
        return dmj.matmul_reduce_scatter(dmj.allgather_matmul(x, w1, axis_name="model"), w2, axis_name="model")

    specs = (P("model"), P(None, "model"), P("model", None))
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P("model")))
    rng = np.random.default_rng(m)
    x, w1, w2, g = (rng.standard_normal(s).astype(np.float32)
                    for s in ((m * ndev, 6), (6, 4 * ndev), (4 * ndev, 5), (m * ndev, 5)))
    args = [place(v, s) for v, s in zip((x, w1, w2), specs)]
    try:
        with jax.set_mesh(mesh):
            out = f(*args)
            grads = jax.grad(lambda *a: jnp.sum(f(*a[:3]) * a[3]), argnums=(0, 1, 2))(*args, place(g, P("model")))
        x64, h = x.astype(np.float64), x.astype(np.float64) @ w1
        want = (h @ w2, g @ w2.T @ w1.T, x64.T @ (g @ w2.T), h.T @ g)
        got = (gathered(out), *map(gathered, grads))
        ok = all(np.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in zip(got, want))
    except Exception as e:  # noqa: BLE001 - any error on one rank is this test's failure, reported by every rank
        print(f"rank {rt.rank}: {label}: {type(e).__name__}: {e}", flush=True)
        ok = False
    ok = all(rt.comm.allgather(ok))
    if rt.rank == 0:
        print(f"{label} on {rt.size} processes: matches numpy: {ok}", flush=True)
    return ok


if rt.rank == 1:
    (where / "duplex.json").write_text(json.dumps(duplex))
    os.environ["DMATMUL_COST_MODEL"] = str(where / "duplex.json")
ok = check("rank 1 calibrated for two rings", 4)
if rt.rank == 1:
    (where / "broken.json").write_text("not json")
    os.environ["DMATMUL_COST_MODEL"] = str(where / "broken.json")
ok = check("rank 1's calibration unreadable", 5) and ok  # new shapes: traced again
for p in where.iterdir():
    p.unlink()
where.rmdir()
dm.finalize()
raise SystemExit(0 if ok else 1)
