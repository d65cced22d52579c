"""Half-precision products on CPU devices: operands widened before they move, against widened only for the GEMM.

On CPU XLA carries a 2-byte float through its copies and collectives by way
of float32, converting the whole destination again at each update of an
exchange, so a bfloat16 move takes 1.5-3.5x a float32 one. dmatmul widens
half-precision operands to float32 before they move (``_kernels.widens``);
this runs each product both ways side by side, interleaved in one run, on
simulated CPU devices, the same plan each way (its program compiled again
with the plan's ``widened`` switch off), on operands already in place, and
checks both results are the same bits.

    python benchmarks/half_moves.py --reps 9
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import numpy as np

#: (m, n, k, layout): the sweep's shapes (``dmatmul bench --sweep``) where operands move before the kernel (grids
#: onto rows, columns onto rows) or do not
CASES = [(8192, 256, 512, "GGG"), (8192, 256, 512, "GGX"), (8192, 256, 512, "YXY"), (1024, 1024, 1024, "XYX"),
         (1024, 1024, 1024, "YYY"), (1024, 1024, 1024, "GGX"), (2048, 2048, 64, "XXX"), (256, 8192, 512, "YYY")]


def _run(fn, plan, operands):
    import jax

    with plan._own_context():
        return jax.block_until_ready(fn(*operands, None, None))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    args = ap.parse_args()

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    import dmatmul as dm
    from dmatmul._matmul import plan_of
    from dmatmul.cli.bench import time_interleaved
    from dmatmul.cli.bench.problem import as_dtype, parse_layout

    p = args.devices
    rng = np.random.default_rng(0)
    runners, plans = {}, {}
    for m, n, k, layout in CASES:
        a = as_dtype(rng.standard_normal((m, k), dtype=np.float32), args.dtype)
        b = as_dtype(rng.standard_normal((k, n), dtype=np.float32), args.dtype)
        name = f"{m}x{n}x{k} {layout}"
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
    print(f"{'product':22s} {'plan':34s} {'widened ms':>10s} {'as-is ms':>9s} {'as-is / widened':>16s}")
    for name, plan in plans.items():
        w, s = t[f"{name} widened"], t[f"{name} as-is"]
        label = f"{plan.algorithm}/{plan.kernel.schedule} {plan.kernel.a},{plan.kernel.b}->{plan.kernel.d}"
        print(f"{name:22s} {label:34s} {np.median(w) * 1e3:10.1f} {np.median(s) * 1e3:9.1f} "
              f"{np.median(s / w):15.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
