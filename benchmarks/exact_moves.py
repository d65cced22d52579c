"""``dm.redistribute`` moving floats as their bits, against moving them as floats.

XLA's CPU programs treat subnormals as zero: moved as floats, a float32
subnormal came back 0 and a signaling NaN quiet. ``dm.redistribute`` moves a
float as its bit patterns (``_exchange.bits_of``) and a complex one as its two
parts. This times each move both ways side by side, interleaved in one run,
on simulated CPU devices: as dmatmul runs it, and the same steps (pad, the
exchange, cut, laid out) compiled on the floats themselves, and checks that
both return the matrix (it holds no subnormal or NaN).

    python benchmarks/exact_moves.py --reps 9
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--size", type=int, default=2047, help="rows and columns (uneven over 8 devices by default)")
    args = ap.parse_args()

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    from jax import lax

    jax.config.update("jax_num_cpu_devices", args.devices)
    import dmatmul as dm
    from dmatmul.backends.jax import _exchange, _layout, _redistribute
    from dmatmul.cli.bench import time_interleaved
    from dmatmul.cli.bench.problem import grid_shape

    p, n = args.devices, args.size
    devices = tuple(jax.devices()[:p])
    grid = dm.BlockNonCyclic(dm.ProcessGrid(grid_shape(p)))
    pairs = {"grid -> rows": (grid, dm.Slab.X), "columns -> rows": (dm.Slab.Y, dm.Slab.X),
             "rows -> columns": (dm.Slab.X, dm.Slab.Y), "columns -> all": (dm.Slab.Y, dm.Replicated()),
             "rows -> all": (dm.Slab.X, dm.Replicated()), "rows -> cyclic": (dm.Slab.X, dm.BlockCyclic(grid.grid, (16, 16)))}
    rng = np.random.default_rng(1)
    matrices = {"float32": rng.standard_normal((n, n), dtype=np.float32)}
    matrices["complex64"] = (matrices["float32"] + 1j * rng.standard_normal((n, n), dtype=np.float32)).astype(np.complex64)

    def programs(src: object, dst: object) -> tuple[object, object]:
        """The move's one step as ``dm.redistribute`` compiles it (a jax.Array in and out: padded and cut in the
        program), and the same steps compiled on the floats themselves."""
        (geom, a, b), = _redistribute._steps(src, dst, devices, (n, n))
        out = geom.replicated() if not _layout.expressible(b) else geom.sharding(b)

        def move(v: jax.Array) -> jax.Array:
            v = _exchange.redistribute(_layout.pad(v, a), a, b, geom)
            return lax.with_sharding_constraint(_layout.unpad(v, b), out)

        def on(step: object) -> object:
            def run(v: jax.Array) -> jax.Array:
                with geom.context():
                    return step(v)
            return run

        return on(_redistribute._jitted(geom, a, b, pad=True, unpad=True)), on(jax.jit(move, out_shardings=out))

    runners, checks = {}, []
    for name, (src, dst) in pairs.items():
        for dtype, x in matrices.items():
            placed = dm.redistribute(jax.numpy.asarray(x), dm.Replicated(), src, devices=p)
            bits, floats = programs(src, dst)
            runners[f"{name} {dtype} bits"] = lambda v=placed, f=bits: jax.block_until_ready(f(v))
            runners[f"{name} {dtype} floats"] = lambda v=placed, f=floats: jax.block_until_ready(f(v))
            checks.append((f"{name} {dtype}", x))
    for key, x in checks:
        for how in ("bits", "floats"):
            if not np.array_equal(np.asarray(runners[f"{key} {how}"]()), x):
                print(f"{key} as {how}: not the matrix", file=sys.stderr)
                return 1
    times, _ = time_interleaved(runners, args.reps, 1)
    t = {key: np.array(v) for key, v in times.items()}
    print(f"dm.redistribute of {n} x {n}, {p} simulated CPU devices, {args.reps} interleaved repetitions, "
          f"{os.cpu_count()} cores")
    print(f"{'move':16s} {'dtype':10s} {'as bits ms':>10s} {'as floats ms':>12s} {'bits / floats':>14s}")
    for name in pairs:
        for dtype in matrices:
            bits, floats = t[f"{name} {dtype} bits"], t[f"{name} {dtype} floats"]
            print(f"{name:16s} {dtype:10s} {np.median(bits) * 1e3:10.1f} {np.median(floats) * 1e3:12.1f} "
                  f"{np.median(bits / floats):13.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
