"""A Megatron MLP block written with plain ``dm.matmul(a, b)`` against the same block left to XLA.

The block is ``gelu(x @ w1) @ w2`` on a ``('data', 'model')`` mesh (Explicit
axes, ``jax.make_mesh``'s default) with Megatron's shardings: ``x``
``P('data', None)``, ``w1`` ``P(None, 'model')``, ``w2`` ``P('model', None)``.

  dmatmul   ``dm.matmul(x, w1)`` (each device its block, no communication),
            gelu, ``dm.matmul(h, w2)`` (one all-reduce over 'model'): the
            distributions read off the shardings, ``distribution=None``
  xla       ``jnp.dot`` for both (the second with ``out_sharding=P('data', None)``,
            which an Explicit mesh asks for where the contracted dimension is split)

Both forward and forward+backward (``value_and_grad`` of ``sum(out * cos(out))``
with respect to x, w1 and w2), jitted, inputs placed, interleaved
repetitions; prints the medians and the paired ratio side by side (median over
repetitions of xla's time / dmatmul's in the same repetition; >= 1: dmatmul
as fast or faster).

    python benchmarks/megatron.py --tokens 1024 --d-model 2048 --d-ff 8192 --reps 5
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np


def build(mesh: Any, precision: Any = None) -> dict[str, Any]:
    """``{"dmatmul"|"xla": (fwd, fwd_bwd)}`` and ``"shardings"`` of (x, w1, w2)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    import dmatmul as dm

    specs = (P("data", None), P(None, "model"), P("model", None))

    def dm_block(x: Any, w1: Any, w2: Any) -> Any:
        return dm.matmul(jax.nn.gelu(dm.matmul(x, w1, precision=precision)), w2, precision=precision)

    def xla_block(x: Any, w1: Any, w2: Any) -> Any:
        h = jax.nn.gelu(jnp.dot(x, w1, precision=precision))
        return jnp.dot(h, w2, precision=precision, out_sharding=NamedSharding(mesh, P("data", None)))

    def loss_of(block: Any) -> Any:
        def loss(x: Any, w1: Any, w2: Any) -> Any:
            out = block(x, w1, w2)
            return jnp.sum(out * jnp.cos(out))

        return loss

    result: dict[str, Any] = {"shardings": tuple(NamedSharding(mesh, s) for s in specs)}
    for name, block in (("dmatmul", dm_block), ("xla", xla_block)):
        result[name] = (jax.jit(block), jax.jit(jax.value_and_grad(loss_of(block), argnums=(0, 1, 2))))
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--d-ff", type=int, default=8192)
    ap.add_argument("--mesh", default="2x4", help="DATAxMODEL")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--precision", default="default", choices=("default", "highest"))
    args = ap.parse_args()

    import jax

    jax.config.update("jax_num_cpu_devices", 8)  # (8 simulated devices where the platform is the CPU)
    from dmatmul.cli.bench import time_interleaved

    sys.path.insert(0, os.path.dirname(__file__))
    from mlp import operands

    precision = None if args.precision == "default" else "highest"
    shape = tuple(int(v) for v in args.mesh.split("x"))
    mesh = jax.make_mesh(shape, ("data", "model"), devices=jax.devices()[: shape[0] * shape[1]])
    blocks = build(mesh, precision)
    host = operands(args.tokens, args.d_model, args.d_ff)
    placed = [jax.device_put(a, s) for a, s in zip(host, blocks["shardings"])]
    runners = {(impl, pass_): (lambda f=blocks[impl][i]: jax.block_until_ready(f(*placed)))
               for impl in ("dmatmul", "xla") for i, pass_ in enumerate(("fwd", "fwd+bwd"))}
    for fn in runners.values():  # compile, warm up
        fn()
        fn()
    ref, got = np.asarray(blocks["xla"][0](*placed)), np.asarray(blocks["dmatmul"][0](*placed))
    err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    times, _ = time_interleaved(runners, args.reps, 0)
    flops_fwd = 2 * 2 * args.tokens * args.d_model * args.d_ff
    device = jax.devices()[0]
    print(f"Megatron MLP gelu(x @ w1) @ w2, x P('data', None), w1 P(None, 'model'), w2 P('model', None), "
          f"mesh {args.mesh}: tokens={args.tokens} d_model={args.d_model} d_ff={args.d_ff} float32, "
          f"precision={args.precision}, {device.platform} ({getattr(device, 'device_kind', '')}), "
          f"{args.reps} interleaved reps; dmatmul vs xla relative difference {err:.1e}")
    print(f"{'pass':9s} {'dmatmul ms':>10s} {'xla ms':>8s} {'xla/dm':>7s} {'paired':>7s} {'GFLOP/s':>8s}")
    for pass_, mult in (("fwd", 1), ("fwd+bwd", 3)):
        d, x = np.array(times[("dmatmul", pass_)]), np.array(times[("xla", pass_)])
        md, mx = float(np.median(d)), float(np.median(x))
        print(f"{pass_:9s} {md * 1e3:10.2f} {mx * 1e3:8.2f} {mx / md:6.2f}x {float(np.median(x / d)):6.2f}x "
              f"{mult * flops_fwd / md / 1e9:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
