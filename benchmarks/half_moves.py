"""Half-precision products on CPU devices: operands widened before they move, against moved in their own dtype.

On CPU XLA carries a 2-byte float through its copies and collectives by way
of float32: an exchange converted its whole destination again at each update
(a bfloat16 move took 1.7-3.5x a float32 one), and XLA's all-gather of a
2-byte type runs at about half a float32 one's speed. An exchange now moves a
half precision as its 16-bit patterns (``_exchange.moved_as_bits``), and a
product widens its half-precision operands to float32 before anything moves
(``_kernels.widens``). This runs each product both ways side by side,
interleaved in one run, on simulated CPU devices: as dmatmul runs it, and
with the operands moved in their own dtype and widened for the GEMM only (the
same plan, its program compiled again with the plan's ``widened`` switch
off), on operands already in place, and checks both results are the same bits.

    python benchmarks/half_moves.py --reps 9 --redistribute

With ``--redistribute`` it also times ``dm.redistribute`` of one matrix in the
half precision against float32.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import numpy as np

#: (m, n, k, layout, kernel): the sweep's shapes (``dmatmul bench --sweep``), auto's route (kernel None) or the one
#: forced, where operands move before the kernel (exchanged: grids onto rows; all-gathered: rows onto every device)
#: or do not
CASES = [(8192, 256, 512, "GGG", None), (8192, 256, 512, "GGG", ("local", "M", "R", "M")),
         (8192, 256, 512, "YXY", None), (1024, 1024, 1024, "XYX", None), (1024, 1024, 1024, "XYX", ("local", "R", "N", "N")),
         (1024, 1024, 1024, "GGX", None), (2048, 2048, 64, "XXX", None), (256, 8192, 512, "YYY", None)]


def _run(fn, plan, operands):
    import jax

    with plan._own_context():
        return jax.block_until_ready(fn(*operands, None, None))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--redistribute", action="store_true",
                    help="also time dm.redistribute of a 2048 x 2048 matrix in the half precision against float32")
    args = ap.parse_args()

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    import dmatmul as dm
    from dmatmul import _plan
    from dmatmul._matmul import plan_of
    from dmatmul.cli.bench import time_interleaved
    from dmatmul.cli.bench.problem import as_dtype, parse_layout

    p = args.devices
    rng = np.random.default_rng(0)
    runners, plans = {}, {}
    for m, n, k, layout, kernel in CASES:
        a = as_dtype(rng.standard_normal((m, k), dtype=np.float32), args.dtype)
        b = as_dtype(rng.standard_normal((k, n), dtype=np.float32), args.dtype)
        name = f"{m}x{n}x{k} {layout}" + (" forced" if kernel else "")
        with _plan.schedule(_plan.Kernel(*kernel) if kernel else None):
            mm = dm.Matmul(a, b, distribution=parse_layout(layout, p), backend="jax", devices=p)
            plan = plan_of(mm)  # the JAX backend's plan: its program, and where each operand lives
        placed = jax.block_until_ready((jax.device_put(a, plan.sharding("a")), jax.device_put(b, plan.sharding("b"))))
        as_is = copy.copy(plan)  # the same plan, its program compiled again with the operands widened for the GEMM only
        as_is._compiled, as_is.widened = {}, False
        plans[name] = plan.plan
        for who, pl in (("widened", plan), ("as-is", as_is)):
            with pl._own_context():
                fn = pl._function("jax")
            runners[f"{name} {who}"] = lambda fn=fn, pl=pl, x=placed: _run(fn, pl, x)
    for name in plans:
        one, other = (np.asarray(runners[f"{name} {w}"](), np.float32) for w in ("widened", "as-is"))
        if not np.array_equal(one, other):
            print(f"{name}: the two programs disagree", file=sys.stderr)
            return 1
    times, _ = time_interleaved(runners, args.reps, 1)
    t = {key: np.array(v) for key, v in times.items()}
    print(f"{args.dtype} on {p} simulated CPU devices, {args.reps} interleaved repetitions, {os.cpu_count()} cores")
    print(f"{'product':29s} {'plan':34s} {'widened ms':>10s} {'own dtype ms':>12s} {'own / widened':>14s}")
    for name, plan in plans.items():
        w, s = t[f"{name} widened"], t[f"{name} as-is"]
        label = f"{plan.algorithm}/{plan.kernel.schedule} {plan.kernel.a},{plan.kernel.b}->{plan.kernel.d}"
        print(f"{name:29s} {label:34s} {np.median(w) * 1e3:10.1f} {np.median(s) * 1e3:12.1f} "
              f"{np.median(s / w):13.2f}x")
    if args.redistribute:
        redistributions(args, p)
    return 0


def redistributions(args: argparse.Namespace, p: int) -> None:
    """``dm.redistribute`` of one matrix in the half precision and in float32, side by side."""
    import jax

    import dmatmul as dm
    from dmatmul.cli.bench import time_interleaved
    from dmatmul.cli.bench.problem import as_dtype, grid_shape

    grid = dm.BlockNonCyclic(dm.ProcessGrid(grid_shape(p)))
    pairs = {"grid -> rows": (grid, dm.Slab.X), "columns -> rows": (dm.Slab.Y, dm.Slab.X),
             "rows -> columns": (dm.Slab.X, dm.Slab.Y), "columns -> all": (dm.Slab.Y, dm.Replicated()),
             "rows -> all": (dm.Slab.X, dm.Replicated())}
    x = np.random.default_rng(1).standard_normal((2048, 2048), dtype=np.float32)
    runners = {}
    for name, (src, dst) in pairs.items():
        for dtype in (args.dtype, "float32"):
            placed = dm.redistribute(jax.numpy.asarray(as_dtype(x, dtype)), dm.Replicated(), src, devices=p)
            runners[f"{name} {dtype}"] = lambda v=placed, s=src, d=dst: jax.block_until_ready(
                dm.redistribute(v, s, d, devices=p))
    times, _ = time_interleaved(runners, args.reps, 1)
    print(f"\ndm.redistribute of 2048 x 2048, {p} simulated CPU devices, {args.reps} interleaved repetitions")
    print(f"{'move':16s} {args.dtype + ' ms':>13s} {'float32 ms':>11s} {'ratio':>6s}")
    for name in pairs:
        half, single = np.array(times[f"{name} {args.dtype}"]), np.array(times[f"{name} float32"])
        print(f"{name:16s} {np.median(half) * 1e3:13.1f} {np.median(single) * 1e3:11.1f} "
              f"{np.median(half / single):5.2f}x")


if __name__ == "__main__":
    sys.exit(main())
