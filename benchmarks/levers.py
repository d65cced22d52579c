"""Kernel variants of AllGather+GEMM and GEMM+ReduceScatter, side by side.

The performance levers of the benchmark issue, measured in one run with
interleaved repetitions on simulated CPU devices (inputs already sharded):

AllGather+GEMM, layout (Slab.X, Slab.Y, Slab.X), B's column blocks travel:
  ring-fori       P-1 ``ppermute`` steps in ``lax.fori_loop`` (dmatmul's first kernel)
  ring-unrolled   the same ring, ``fori_loop(..., unroll=True)``: no loop-carried copy
  one-collective  one tiled ``all_gather`` of B, then one GEMM
  gather-stacked  one untiled ``all_gather`` (P, K, N/P), then P GEMMs
GEMM+ReduceScatter, layout (Slab.Y, Slab.X, Slab.Y), partial sums travel:
  ring-fori, ring-unrolled   as above (unrolled, XLA hoists all P GEMMs before the ring)
  ring-unrolled-ordered      unrolled, each GEMM after the partial sum it joins arrives
  one-collective  one GEMM of the whole partial product, then one ``psum_scatter``
  big-gemm-ring   one GEMM of the whole partial product, then the ring over its slices
Peers: dmatmul's planned Matmul, XLA's partitioned ``jit(jnp.dot)``, numpy.

Each line gives the median, the ratio to numpy and the *paired* ratio to
ring-fori: the median over repetitions of ring-fori's time / this time in the
same repetition (neighbours in time share the machine's load, so paired
ratios are steadier than ratios of medians on a shared machine).

    python benchmarks/levers.py --n 2048 --reps 15 --wait-idle 0.15
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
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    ap.add_argument("--wait-idle", type=float, default=None, metavar="FRACTION",
                    help="before every timed call wait until others keep < FRACTION of the CPUs busy")
    args = ap.parse_args()

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import AxisType, Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import dmatmul as dm

    n, p = args.n, args.devices
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    mesh = Mesh(np.array(jax.devices()[:p]), ("x",), axis_types=(AxisType.Auto,))
    hi = lax.Precision.HIGHEST

    def mm(x, y):
        return lax.dot_general(x, y, (((1,), (0,)), ((), ())), precision=hi, preferred_element_type=jnp.float32)

    def zeros(shape):
        return lax.pcast(jnp.zeros(shape, jnp.float32), "x", to="varying")

    left = [(i, (i - 1) % p) for i in range(p)]
    right = [(i, (i + 1) % p) for i in range(p)]

    # ---- AllGather+GEMM: a (M/P, K), b (K, N/P) -> d (M/P, N)
    def ag_ring(unroll):
        def body(a, b):
            idx, nl = lax.axis_index("x"), b.shape[1]

            def one(s, carry):
                acc, blk = carry
                nxt = lax.ppermute(blk, "x", left)
                return lax.dynamic_update_slice_in_dim(acc, mm(a, blk), ((idx + s) % p) * nl, axis=1), nxt

            acc, blk = lax.fori_loop(0, p - 1, one, (zeros((a.shape[0], nl * p)), b), unroll=unroll)
            return lax.dynamic_update_slice_in_dim(acc, mm(a, blk), ((idx + p - 1) % p) * nl, axis=1)

        return body

    def ag_one(a, b):
        return mm(a, lax.all_gather(b, "x", axis=1, tiled=True))

    def ag_stacked(a, b):
        g = lax.all_gather(b, "x", axis=0, tiled=False)  # (P, K, N/P): contiguous blocks
        return jnp.concatenate([mm(a, g[j]) for j in range(p)], axis=1)

    # ---- GEMM+ReduceScatter: a (M, K/P), b (K/P, N) -> d (M, N/P)
    def rs_ring(unroll):
        def body(a, b):
            idx, nl = lax.axis_index("x"), b.shape[1] // p

            def part(j):
                return mm(a, lax.dynamic_slice_in_dim(b, j * nl, nl, axis=1))

            def one(s, acc):
                return lax.ppermute(acc, "x", right) + part((idx - s - 1) % p)

            return lax.fori_loop(1, p, one, part((idx - 1) % p), unroll=unroll)

        return body

    def rs_ordered(a, b):
        # unrolled, each step's GEMM tied to the partial sum just received (an
        # optimization_barrier), so XLA cannot hoist all P GEMMs ahead of the ring
        idx, nl = lax.axis_index("x"), b.shape[1] // p

        def part(x, j):
            return mm(x, lax.dynamic_slice_in_dim(b, j * nl, nl, axis=1))

        acc = part(a, (idx - 1) % p)
        for s in range(1, p):
            recv, a_s = lax.optimization_barrier((lax.ppermute(acc, "x", right), a))
            acc = recv + part(a_s, (idx - s - 1) % p)
        return acc

    def rs_one(a, b):
        return lax.psum_scatter(mm(a, b), "x", scatter_dimension=1, tiled=True)

    def rs_big_gemm_ring(a, b):
        idx, nl = lax.axis_index("x"), b.shape[1] // p
        d = mm(a, b)
        acc = lax.dynamic_slice_in_dim(d, ((idx - 1) % p) * nl, nl, axis=1)
        for s in range(1, p):
            acc = lax.ppermute(acc, "x", right) + lax.dynamic_slice_in_dim(d, ((idx - s - 1) % p) * nl, nl, axis=1)
        return acc

    X, Y = dm.Slab.X, dm.Slab.Y
    spec = {X: P("x", None), Y: P(None, "x")}
    cases = {
        "XYX": ((X, Y, X), {"ring-fori": ag_ring(False), "ring-unrolled": ag_ring(True),
                            "one-collective": ag_one, "gather-stacked": ag_stacked}),
        "YXY": ((Y, X, Y), {"ring-fori": rs_ring(False), "ring-unrolled": rs_ring(True),
                            "ring-unrolled-ordered": rs_ordered, "one-collective": rs_one,
                            "big-gemm-ring": rs_big_gemm_ring}),
    }
    only = set(filter(None, args.only.split(",")))
    runners = {}
    for name, (dists, bodies) in cases.items():
        sa, sb, sd = (NamedSharding(mesh, spec[d]) for d in dists)
        xa, xb = jax.device_put(a, sa), jax.device_put(b, sb)
        f = jax.jit(lambda x, y: jnp.dot(x, y, precision=hi), in_shardings=(sa, sb), out_shardings=sd)
        runners[f"{name} xla"] = (lambda f=f, xa=xa, xb=xb: f(xa, xb))
        mm_plan = dm.Matmul(xa, xb, distribution=dists, devices=p)
        mm_plan.plan()
        runners[f"{name} dmatmul"] = mm_plan.execute
        for vname, body in bodies.items():
            g = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(sa.spec, sb.spec), out_specs=sd.spec))
            runners[f"{name} {vname}"] = (lambda g=g, xa=xa, xb=xb: g(xa, xb))
    if only:
        runners = {k: v for k, v in runners.items() if k.split(" ", 1)[1] in only or k.endswith("ring-fori")}
    for key, fn in runners.items():
        err = float(np.abs(np.asarray(fn()) - ref).max() / np.abs(ref).max())
        assert err < 1e-4, (key, err)
    runners = {"numpy": lambda: a @ b, **{k: (lambda fn=fn: jax.block_until_ready(fn())) for k, fn in runners.items()}}
    for fn in runners.values():
        fn()
    from dmatmul.cli.bench import IdleWaiter, time_interleaved

    waiter = IdleWaiter(args.wait_idle) if args.wait_idle is not None else None
    names = list(runners)
    times, _ = time_interleaved(runners, args.reps, 0, before=waiter)
    t = {k: np.array(v) for k, v in times.items()}
    flops = 2.0 * n**3
    print(f"n={n} float32, {p} simulated CPU devices, {args.reps} interleaved repetitions, {os.cpu_count()} cores")
    print(f"{'variant':26s} {'median ms':>9s} {'GFLOP/s':>8s} {'x numpy':>8s} {'paired x ring-fori':>19s}")
    for k in names:
        med = float(np.median(t[k]))
        base = f"{k.split(' ')[0]} ring-fori"
        paired = f"{np.median(t[base] / t[k]):.3f}" if base in t else "-"
        print(f"{k:26s} {med * 1e3:9.1f} {flops / med / 1e9:8.1f} {np.median(t['numpy']) / med:7.2f}x {paired:>19s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
