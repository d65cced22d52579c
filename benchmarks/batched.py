"""A batched product like attention scores, side by side with jnp.matmul partitioned by XLA.

``q @ k^T`` for a batch of ``--batch`` items (default 32, split over the
devices: the operands are jax.Arrays sharded ``PartitionSpec("x", None, None)``
on a mesh of ``--devices`` simulated CPU devices), ``--m x --k @ --k x --n``
per item (512 x 128 @ 128 x 512): ``dm.matmul(q, k, transpose_b=True)``
against ``jax.jit(lambda q, k: jnp.matmul(q, k.mT))`` on the same arrays,
interleaved in seeded random order (inputs already placed). It also prints
the collectives in dmatmul's compiled program (none: the items are
independent products) and in XLA's.

    python benchmarks/batched.py --reps 15
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import numpy as np

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--m", type=int, default=512)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    jax.config.update("jax_num_cpu_devices", args.devices)
    import dmatmul as dm
    from dmatmul._matmul import plan_of
    from dmatmul.cli.bench import time_interleaved
    from dmatmul.testing import assert_close, reference

    rng = np.random.default_rng(0)
    mesh = Mesh(np.array(jax.devices()[: args.devices]), ("x",))
    split = NamedSharding(mesh, PartitionSpec("x", None, None))
    q_host = rng.standard_normal((args.batch, args.m, args.k)).astype(args.dtype)
    k_host = rng.standard_normal((args.batch, args.n, args.k)).astype(args.dtype)
    q, k = jax.device_put(q_host, split), jax.device_put(k_host, split)
    xla = jax.jit(lambda q, k: jnp.matmul(q, jnp.swapaxes(k, -1, -2)))
    runners = {
        "dmatmul": lambda: jax.block_until_ready(dm.matmul(q, k, transpose_b=True)),
        "xla": lambda: jax.block_until_ready(xla(q, k)),
    }
    want = reference(q_host, k_host, transpose_b=True)
    for name, fn in runners.items():
        assert_close(np.asarray(fn()), want, args.dtype)

    with dm.Matmul(q, k, transpose_b=True) as mm:
        plan = plan_of(mm)
        ours = plan._fn.lower(q, k, None, None).compile().as_text()
        print(mm.explain())
    theirs = xla.lower(q, k).compile().as_text()

    times, _ = time_interleaved(runners, args.reps, 1)
    t = {name: np.array(v) for name, v in times.items()}
    per = f"{args.m} x {args.k} @ {args.k} x {args.n}"
    print(f"\nbatch {args.batch} split over {args.devices} simulated CPU devices, {per} per item, {args.dtype}, "
          f"{args.reps} interleaved repetitions, {os.cpu_count()} cores")
    print(f"{'':8s} {'median ms':>9s} {'collectives in the compiled program'}")
    for name, text in (("dmatmul", ours), ("xla", theirs)):
        found = {op: len(re.findall(rf"\b{op}(?:-start)?\(", text)) for op in COLLECTIVES}
        told = ", ".join(f"{op} x{n}" for op, n in found.items() if n) or "none"
        print(f"{name:8s} {np.median(t[name]) * 1e3:9.2f} {told}")
    print(f"dmatmul / xla speed (paired median): {np.median(t['xla'] / t['dmatmul']):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
