"""A tensor-parallel MLP block: dmatmul.jax rings in shard_map against XLA's partitioner.

The block is ``gelu(x @ w1) @ w2``, sequence parallel on a ``('data', 'model')``
mesh: ``x``'s rows (tokens) split over all devices, ``w1``'s columns and
``w2``'s rows over ``'model'`` (replicated over ``'data'``), the result split
like ``x``.

  dmatmul   ``jax.shard_map`` of ``allgather_matmul(x, w1, axis_name='model')``,
            gelu, ``matmul_reduce_scatter(h, w2, axis_name='model')`` (rings of
            ``ppermute``; their backward passes are rings too)
  xla       the same math under ``jax.jit`` with the same in/out shardings,
            left to XLA's SPMD partitioner

Both forward and forward+backward (``value_and_grad`` of a scalar loss with
respect to ``x``, ``w1`` and ``w2``), jitted, inputs already placed,
interleaved repetitions; prints medians and the paired ratio (median over
repetitions of xla's time / dmatmul's in the same repetition; > 1: dmatmul
faster), and each compiled block's peak memory per device (XLA's memory
analysis, as ``dmatmul bench`` reports it).

    python benchmarks/mlp.py --tokens 4096 --d-model 1024 --d-ff 4096 --meshes 2x4,1x8 --reps 7
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np


def build(mesh: Any, precision: Any = None) -> dict[str, Any]:
    """The jitted blocks on ``mesh`` (axes 'data', 'model'): ``{"dmatmul"|"xla": (fwd, fwd_bwd)}``,
    and ``"shardings"``: the NamedShardings of ``(x, w1, w2)``.

    ``fwd(x, w1, w2)`` is the block's output; ``fwd_bwd(x, w1, w2)`` is
    ``(loss, (dx, dw1, dw2))`` of ``loss = sum(out * cos(out))`` (a loss whose
    gradient depends on every output element)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import dmatmul.jax as dmj

    specs = (P(("data", "model"), None), P(None, "model"), P("model", None))
    out_spec = specs[0]
    shardings = tuple(NamedSharding(mesh, s) for s in specs)

    def local(x: Any, w1: Any, w2: Any) -> Any:
        h = dmj.allgather_matmul(x, w1, axis_name="model", precision=precision)  # this data row's tokens
        return dmj.matmul_reduce_scatter(jax.nn.gelu(h), w2, axis_name="model", precision=precision)

    ring_block = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=out_spec)

    def xla_block(x: Any, w1: Any, w2: Any) -> Any:
        h = jnp.dot(x, w1, precision=precision)
        return jnp.dot(jax.nn.gelu(h), w2, precision=precision)

    def loss_of(block: Any) -> Any:
        def loss(x: Any, w1: Any, w2: Any) -> Any:
            out = block(x, w1, w2)
            return jnp.sum(out * jnp.cos(out))

        return loss

    out_sh = NamedSharding(mesh, out_spec)
    grads_sh = (jax.sharding.NamedSharding(mesh, P()), shardings)
    result = {"shardings": shardings}
    for name, block in (("dmatmul", ring_block), ("xla", xla_block)):
        fwd = jax.jit(block, in_shardings=shardings, out_shardings=out_sh)
        fwd_bwd = jax.jit(jax.value_and_grad(loss_of(block), argnums=(0, 1, 2)),
                          in_shardings=shardings, out_shardings=grads_sh)
        result[name] = (fwd, fwd_bwd)
    return result


def peaks(blocks: dict[str, Any], args: Any) -> dict[tuple[str, str], float]:
    """Peak bytes per device of each compiled block, ``{(impl, pass): bytes}``
    (XLA's memory analysis: arguments + outputs + temporaries - aliased), as
    ``dmatmul bench`` reports its products' (impl "dmatmul" or "xla", pass
    "fwd" or "fwd+bwd")."""
    from dmatmul.cli.bench.peers import compiled_peak_bytes

    return {(impl, pass_): compiled_peak_bytes(blocks[impl][i], *args)
            for impl in ("dmatmul", "xla") for i, pass_ in enumerate(("fwd", "fwd+bwd"))}


def make_mesh(shape: tuple[int, int]) -> Any:
    import jax
    from jax.sharding import AxisType, Mesh

    devices = np.array(jax.devices()[: shape[0] * shape[1]]).reshape(shape)
    return Mesh(devices, ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


def operands(tokens: int, d_model: int, d_ff: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, d_model), dtype=np.float32)
    w1 = rng.standard_normal((d_model, d_ff), dtype=np.float32) / np.sqrt(d_model)
    w2 = rng.standard_normal((d_ff, d_model), dtype=np.float32) / np.sqrt(d_ff)
    return x, w1, w2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--d-ff", type=int, default=4096)
    ap.add_argument("--meshes", default="2x4,1x8", help="comma-separated DATAxMODEL")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--precision", default="highest", choices=("default", "highest"))
    ap.add_argument("--wait-idle", type=float, default=None, metavar="FRACTION")
    args = ap.parse_args()

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    from dmatmul.cli.bench import IdleWaiter, time_interleaved

    waiter = IdleWaiter(args.wait_idle) if args.wait_idle is not None else None
    precision = None if args.precision == "default" else jax.lax.Precision.HIGHEST
    host = operands(args.tokens, args.d_model, args.d_ff)
    flops_fwd = 2 * 2 * args.tokens * args.d_model * args.d_ff
    print(f"MLP block gelu(x @ w1) @ w2: tokens={args.tokens} d_model={args.d_model} d_ff={args.d_ff} float32, "
          f"precision={args.precision}, 8 simulated CPU devices, {os.cpu_count()} cores, {args.reps} interleaved reps")
    print(f"{'mesh':5s} {'pass':9s} {'dmatmul ms':>10s} {'xla ms':>8s} {'x xla':>6s} {'paired':>7s} {'GFLOP/s':>8s}"
          f" {'peak MiB dmatmul':>16s} {'xla':>7s}")
    for mesh_s in args.meshes.split(","):
        shape = tuple(int(v) for v in mesh_s.split("x"))
        mesh = make_mesh(shape)
        blocks = build(mesh, precision)
        args_dev = [jax.device_put(a, s) for a, s in zip(host, blocks["shardings"])]
        runners = {}
        for impl in ("dmatmul", "xla"):
            for i, pass_ in enumerate(("fwd", "fwd+bwd")):
                f = blocks[impl][i]
                runners[(impl, pass_)] = lambda f=f: jax.block_until_ready(f(*args_dev))
        for fn in runners.values():  # compile, warm up
            fn()
            fn()
        peak = peaks(blocks, args_dev)
        times, _ = time_interleaved(runners, args.reps, 0, before=waiter)
        for pass_, mult in (("fwd", 1), ("fwd+bwd", 3)):
            d, x = np.array(times[("dmatmul", pass_)]), np.array(times[("xla", pass_)])
            md, mx = float(np.median(d)), float(np.median(x))
            print(f"{mesh_s:5s} {pass_:9s} {md * 1e3:10.1f} {mx * 1e3:8.1f} {mx / md:5.2f}x "
                  f"{float(np.median(x / d)):6.2f}x {mult * flops_fwd / md / 1e9:8.1f} "
                  f"{peak[('dmatmul', pass_)] / 2**20:16.2f} {peak[('xla', pass_)] / 2**20:7.2f}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
