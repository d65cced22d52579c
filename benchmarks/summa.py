"""SUMMA kernel variants on 2-D grids, side by side with XLA's partitioned dot and numpy.

Layout (a, b, result) = BlockNonCyclic on one ProcessGrid (2x4 and 4x2, row-
and column-major), float32, 8 simulated CPU devices, inputs already sharded on
the devices in the plan's shardings, each variant compiled on a plan of its own
with the ring schedule forced (the model picks one whole gather for small products,
where no variant would run):

  psum            textbook SUMMA: one masked ``psum`` per K panel (an all-reduce of
                  mostly zeros), ``lax.fori_loop`` (dmatmul's kernel until issue 14
                  item 4; kept here as the baseline, :func:`psum_summa`)
  psum-unrolled   the same, ``fori_loop(unroll=True)``
  gathered        ``_kernels.summa(gather=True)``: the longer grid axis's operand
                  rides a ``ppermute`` ring (unrolled), the other one is all-gathered
                  once as contiguous panels
  dmatmul         the planned Matmul as shipped (``_kernels.summa``: the same ring,
                  the other operand's matching panel broadcast at each step, rolled)
  gather-both     all-gather both operands, one GEMM (what a partitioner may do)
  gemms-only      the shipped kernel's GEMMs and sums with no communication at all
                  (each rank's own blocks, wrong numbers, not checked): the ceiling
                  of any kernel with this schedule of GEMMs on this machine
  one-gemm-only   each rank's whole share of the flops as one GEMM, nothing sent:
                  its row panel of a and column panel of b placed there beforehand
                  (``P("r", None)``, ``P(None, "c")``; right numbers): the ceiling of
                  any schedule on this machine, at the memory of whole panels
  xla             ``jit(jnp.dot)`` with the same in/out shardings
  numpy           ``a @ b`` in this process (all cores)

Each line: the median, ratios to xla and numpy (of medians), and the paired
ratio to ``psum`` and to ``xla`` (median over repetitions of their time /
this time in the same repetition: steadier on a shared machine), and the
compiled program's peak memory per device (XLA's memory analysis) over the
ideal (the blocks of a, b and the result plus one A and one B panel).

    python benchmarks/summa.py --n 2048 --reps 7
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import numpy as np


def psum_summa(lp, a, b, unroll=1):
    """Textbook SUMMA on the ("r", "c") mesh: op(A) panels are broadcast along grid
    rows, op(B) panels along grid columns by a masked ``psum`` over the axis (an
    all-reduce of mostly zeros), each step's broadcast issued before the previous
    panel's GEMM. A drop-in for ``_kernels.summa`` (the same LocalProblem)."""
    import jax.numpy as jnp
    from jax import lax

    from dmatmul.backends.jax import _kernels

    sched, ax = lp.summa, lp.axes
    width = sched.width
    owner_col, offset_a, owner_row, offset_b = (
        jnp.asarray(t, dtype=jnp.int32) for t in (sched.owner_col, sched.offset_a, sched.owner_row, sched.offset_b)
    )
    col, row = lax.axis_index("c"), lax.axis_index("r")
    zero = jnp.zeros((), a.dtype)
    a, b = _kernels.grid._pad_to_extents(lp, a, b)

    def panels(t):
        pa = lax.dynamic_slice_in_dim(a, offset_a[t], width, axis=ax["aK"])
        pb = lax.dynamic_slice_in_dim(b, offset_b[t], width, axis=ax["bK"])
        return (
            lax.psum(jnp.where(col == owner_col[t], pa, zero), "c"),
            lax.psum(jnp.where(row == owner_row[t], pb, zero), "r"),
        )

    def one(t, carry):
        acc, (pa, pb) = carry
        nxt = panels(t + 1)
        return acc + lp.mm(pa, pb), nxt

    acc = _kernels.varying_zeros((a.shape[ax["aM"]], b.shape[ax["bN"]]), lp.acc_dtype, ("r", "c"))
    acc, (pa, pb) = lax.fori_loop(0, len(sched.owner_col) - 1, one, (acc, panels(0)), unroll=unroll)
    return acc + lp.mm(pa, pb)


def gemms_only(lp, a, b):
    """The GEMMs and sums of ``_kernels.summa``'s per-step route, with nothing
    sent: step ``s`` multiplies the rank's own travelling block by the rows of
    its own other block at the offset of block ``(r + s) mod n`` (the same
    shapes, none of the numbers)."""
    import jax.numpy as jnp
    from jax import lax

    from dmatmul.backends.jax import _kernels

    sched, ax = lp.summa, lp.axes
    a, b = _kernels.grid._pad_to_extents(lp, a, b)
    rows, cols = lax.axis_size("r"), lax.axis_size("c")
    route = _kernels.summa_route(sched, rows, cols, a.shape[ax["aK"]], b.shape[ax["bK"]])
    ring, n_ring, len_t, len_o = route.ring, route.n_ring, route.len_t, route.len_o
    moving, m_axis, other, k_o = (a, "c", b, ax["bK"]) if ring == "a" else (b, "r", a, ax["aK"])
    offsets = jnp.asarray(route.owners[1][:, 0] if route.owners else np.zeros(n_ring, int), dtype=jnp.int32)
    idx = lax.axis_index(m_axis)
    acc = None
    for s in range(n_ring):
        panel = lax.dynamic_slice_in_dim(other, jnp.minimum(offsets[(idx + s) % n_ring], len_o - len_t), len_t, axis=k_o)
        p = lp.mm(moving, panel) if ring == "a" else lp.mm(panel, moving)
        acc = p if acc is None else acc + p
    return acc


def plan_variant(xa, xb, dist, kern):
    """A planned and compiled ``Matmul`` of ``xa @ xb`` (SUMMA on ``dist``, 8
    devices) whose ring runs ``kern`` in place of ``_kernels.summa`` (None: the
    shipped one), and its compiled program's peak bytes per device.

    The plan is made under ``_plan.schedule("ring")``: where the cost model
    picks SUMMA's one-shot schedule (small products) the ring, and so the
    variant, would not run at all, and every variant would time the same
    program. It is a plan of its own: the backend's plan cache would hand
    every variant the plan (and the jitted function) compiled with the first
    kernel."""
    import jax

    import dmatmul as dm
    from dmatmul import _plan
    from dmatmul._matmul import plan_of
    from dmatmul._plans import PLANS
    from dmatmul.backends.jax import _kernels

    PLANS.clear("jax")
    with _plan.schedule("ring"):  # at the xla peer's precision (None may mean TF32 on a GPU)
        mm = dm.Matmul(xa, xb, distribution=dist, algorithm="summa", devices=8, precision="highest")
        mm.plan()
    shipped = _kernels.summa
    _kernels.grid.summa = kern if kern is not None else shipped  # where the summa body looks it up
    try:
        jax.block_until_ready(mm.execute())  # traced and compiled with this kernel
        peak = plan_of(mm).compiled_memory()["peak"]
    finally:
        _kernels.grid.summa = shipped
    return mm, peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[2048])
    ap.add_argument("--grids", default="2x4,4x2", help="comma-separated RxC")
    ap.add_argument("--layouts", default="row,col")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--only", default="", help="comma-separated variants (xla, numpy and psum always run)")
    ap.add_argument("--wait-idle", type=float, default=None, metavar="FRACTION")
    args = ap.parse_args()

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import dmatmul as dm
    from dmatmul import _plan
    from dmatmul.cli.bench import IdleWaiter, time_interleaved
    from dmatmul.cli.bench.peers import compiled_peak_bytes
    from dmatmul._matmul import plan_of
    from dmatmul.backends.jax import _kernels

    hi = lax.Precision.HIGHEST
    variants = {
        "psum": psum_summa,
        "psum-unrolled": functools.partial(psum_summa, unroll=True),
        "gathered": functools.partial(_kernels.summa, gather=True),
        "dmatmul": None,
        "gemms-only": gemms_only,
    }
    only = set(filter(None, args.only.split(",")))
    waiter = IdleWaiter(args.wait_idle) if args.wait_idle is not None else None
    summary = []
    for n in args.n:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        for grid_s in args.grids.split(","):
            shape = tuple(int(x) for x in grid_s.split("x"))
            for layout in args.layouts.split(","):
                grid = dm.ProcessGrid(shape, layout=layout)
                dist = dm.BlockNonCyclic(grid)
                runners = {}
                # device-resident operands in the plan's own shardings (numpy operands would time the
                # host-to-device copies of every call too)
                with _plan.schedule("ring"):  # the variants' schedule (plan_variant)
                    probe = plan_of(dm.Matmul(a, b, distribution=dist, algorithm="summa", devices=8))
                mesh = probe.geom.mesh
                sa, sb, sd = (probe.sharding(op) for op in "abd")
                xa, xb = jax.device_put(a, sa), jax.device_put(b, sb)
                ideal = probe.ideal_memory_bytes()
                peak = {}
                for name, kern in variants.items():
                    if only and name not in only and name != "psum":
                        continue
                    mm, peak[name] = plan_variant(xa, xb, dist, kern)
                    runners[name] = (lambda mm=mm: jax.block_until_ready(mm.execute()))
                f = jax.jit(lambda x, y: jnp.dot(x, y, precision=hi), in_shardings=(sa, sb), out_shardings=sd)
                runners["xla"] = lambda f=f, xa=xa, xb=xb: jax.block_until_ready(f(xa, xb))
                peak["xla"] = compiled_peak_bytes(f, xa, xb)

                def gather_both(x, y):
                    return jnp.dot(lax.all_gather(x, "c", axis=1, tiled=True),
                                   lax.all_gather(y, "r", axis=0, tiled=True), precision=hi)

                if not only or "gather-both" in only:
                    g = jax.jit(jax.shard_map(gather_both, mesh=mesh, in_specs=(P("r", "c"),) * 2, out_specs=P("r", "c")))
                    runners["gather-both"] = lambda g=g, xa=xa, xb=xb: jax.block_until_ready(g(xa, xb))
                    peak["gather-both"] = compiled_peak_bytes(g, xa, xb)
                if not only or "one-gemm-only" in only:
                    whole = (P("r", None), P(None, "c"))  # a's row panel, b's column panel
                    o = jax.jit(jax.shard_map(lambda x, y: jnp.dot(x, y, precision=hi), mesh=mesh,
                                              in_specs=whole, out_specs=P("r", "c")))
                    pa, pb = (jax.device_put(x, NamedSharding(mesh, spec)) for x, spec in zip((a, b), whole))
                    runners["one-gemm-only"] = lambda o=o, pa=pa, pb=pb: jax.block_until_ready(o(pa, pb))
                    peak["one-gemm-only"] = compiled_peak_bytes(o, pa, pb)
                for key, fn in runners.items():
                    if key == "gemms-only":
                        continue  # the ceiling: no numbers to check
                    err = float(np.abs(np.asarray(fn()) - ref).max() / np.abs(ref).max())
                    assert err < 1e-4, (key, err)
                runners = {"numpy": lambda: a @ b, **runners}
                for fn in runners.values():
                    fn()
                names = list(runners)
                times, _ = time_interleaved(runners, args.reps, 0, before=waiter)
                t = {k: np.array(v) for k, v in times.items()}
                med = {k: float(np.median(v)) for k, v in t.items()}
                print(f"\nn={n} float32, grid {shape[0]}x{shape[1]} {layout}, BlockNonCyclic (a, b, result), "
                      f"8 simulated devices, {args.reps} interleaved reps, {os.cpu_count()} cores")
                print(f"{'variant':14s} {'median ms':>9s} {'GFLOP/s':>8s} {'x xla':>6s} {'x numpy':>7s} "
                      f"{'paired x psum':>13s} {'paired x xla':>12s} {'paired x numpy':>14s} {'peak MiB':>8s} {'/ideal':>6s}")
                for k in names:
                    print(f"{k:14s} {med[k] * 1e3:9.1f} {2.0 * n**3 / med[k] / 1e9:8.1f} {med['xla'] / med[k]:5.2f}x "
                          f"{med['numpy'] / med[k]:6.2f}x {np.median(t['psum'] / t[k]):13.3f} "
                          f"{np.median(t['xla'] / t[k]):12.3f} {np.median(t['numpy'] / t[k]):14.3f}"
                          + (f" {peak[k] / 2**20:8.1f} {peak[k] / ideal:6.2f}" if k in peak else ""))
                sys.stdout.flush()
                summary.append((n, f"{shape[0]}x{shape[1]} {layout}", t))
    print("\nsummary: paired ratios of dmatmul's shipped SUMMA (> 1: dmatmul faster); the GEMMs alone "
          "(gemms-only) and one GEMM a rank (one-gemm-only) against numpy, and dmatmul against the GEMMs alone")
    print(f"{'n':>5s} {'grid':10s} {'x psum':>7s} {'x xla':>7s} {'x numpy':>8s} {'gemms x numpy':>13s} {'x gemms':>8s}"
          f" {'one-gemm x numpy':>16s}")
    for n, g, t in summary:
        if "dmatmul" in t:
            d = t["dmatmul"]
            ceiling = (f" {np.median(t['numpy'] / t['gemms-only']):12.2f}x {np.median(t['gemms-only'] / d):7.2f}x"
                       if "gemms-only" in t else f" {'-':>13s} {'-':>8s}")
            if "one-gemm-only" in t:
                ceiling += f" {np.median(t['numpy'] / t['one-gemm-only']):15.2f}x"
            print(f"{n:5d} {g:10s} {np.median(t['psum'] / d):6.2f}x {np.median(t['xla'] / d):6.2f}x "
                  f"{np.median(t['numpy'] / d):7.2f}x" + ceiling)
    return 0


if __name__ == "__main__":
    sys.exit(main())
