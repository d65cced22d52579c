"""A matrix split over the devices, gathered whole onto every device, side by side.

The move behind a replicated result (and a replicated operand) of a plan whose
kernel leaves it split: ``dm.redistribute(x, src, Replicated())`` against XLA's
own ``jit(with_sharding_constraint(x, replicated))`` on the same array, for a
split of rows (Slab.X), of columns (Slab.Y) and over a 2-D grid, interleaved
in seeded random order on simulated CPU devices (inputs already placed).

XLA gathers a split of columns through a transposed copy of the whole matrix
before and after its all-gather, about 5x the time of a split of rows on CPU;
dmatmul gathers the column blocks stacked and puts them side by side in one
copy (``_exchange._gather_columns``).

    python benchmarks/gathers.py --n 2048 --reps 15
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--wait-idle", type=float, default=None, metavar="FRACTION",
                    help="before every timed call wait until others keep < FRACTION of the CPUs busy")
    args = ap.parse_args()

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    from jax import lax

    import dmatmul as dm
    from dmatmul.cli.bench import IdleWaiter, time_interleaved
    from dmatmul.cli.bench.problem import grid_shape

    n, p = args.n, args.devices
    x = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    grid = dm.ProcessGrid(grid_shape(p))
    layouts = {"rows": dm.Slab.X, "columns": dm.Slab.Y, f"grid {grid.shape[0]}x{grid.shape[1]}": dm.BlockNonCyclic(grid)}
    runners = {}
    for name, dist in layouts.items():
        placed = dm.redistribute(jax.numpy.asarray(x), dm.Replicated(), dist, devices=p)  # a jax.Array laid out as dist
        rep = placed.sharding.update(spec=jax.sharding.PartitionSpec())
        xla = jax.jit(lambda v, rep=rep: lax.with_sharding_constraint(v, rep), out_shardings=rep)
        runners[f"{name:12s} dmatmul"] = lambda v=placed, d=dist: dm.redistribute(v, d, dm.Replicated(), devices=p)
        runners[f"{name:12s} xla"] = lambda v=placed, f=xla: f(v)
    for key, fn in runners.items():
        got = np.asarray(fn())
        if not np.array_equal(got, x):
            print(f"{key}: wrong result", file=sys.stderr)
            return 1
    runners = {k: (lambda fn=fn: jax.block_until_ready(fn())) for k, fn in runners.items()}
    waiter = IdleWaiter(args.wait_idle) if args.wait_idle is not None else None
    times, _ = time_interleaved(runners, args.reps, 1, before=waiter)
    t = {k: np.array(v) for k, v in times.items()}
    print(f"n={n} float32, {p} simulated CPU devices, {args.reps} interleaved repetitions, {os.cpu_count()} cores")
    print(f"{'gather of':12s} {'by':8s} {'median ms':>9s} {'paired x xla':>13s}")
    for k in t:
        name, who = k.rsplit(" ", 1)
        paired = np.median(t[f"{name} xla"] / t[k])
        print(f"{name} {who:8s} {np.median(t[k]) * 1e3:9.1f} {paired:12.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
