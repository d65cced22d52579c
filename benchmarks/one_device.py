"""dmatmul's JAX backend on one device against ``jnp.dot``: what the front end costs.

On one device no algorithm communicates, so any gap to ``jax.jit(jnp.dot)``
is dmatmul's own: its per-call work in Python (checks, plan lookup, the
hand-over to the compiled program) and anything its program adds around the
GEMM (casts, copies). Meant for a GPU, where a GEMM of n = 1024 takes a few
microseconds; it runs on a CPU too.

Contenders, all on operands already on the device, at the same ``precision``:

  jnp.dot          ``jax.jit(lambda a, b: jnp.dot(a, b, precision=p))``: the reference
  Matmul.execute   a planned ``dm.Matmul(a, b, precision=p, backend="jax", devices=1)``, ``execute()``
  dm.matmul        ``dm.matmul(a, b, precision=p, backend="jax")``, the stateless call
  jit(dm.matmul)   ``dm.matmul`` inside the user's ``jax.jit``: the kernel alone

Timing: every repetition runs every contender once, in a seeded random order;
a contender's sample is ``calls`` back-to-back calls (dispatch pipelined, as a
training loop runs them) and one ``block_until_ready``, divided by ``calls``
(chosen so that a sample lasts about 5 ms). Printed: the median per call and
``x jnp.dot`` = the median over repetitions of jnp.dot's time / the
contender's in the same repetition (paired; above 1: faster). Every result is
checked against ``jnp.dot``'s and against a float64 numpy reference of 64
rows; the exit status is 1 on a mismatch.

    python benchmarks/one_device.py                                  # n = 1024..8192, f32/bf16/f16, default and highest
    python benchmarks/one_device.py --sizes 256,512 --reps 5         # quick, e.g. on a CPU
    python benchmarks/one_device.py --json one_device.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

# relative error (max |d - ref| / max |ref|) allowed against float64, per dtype and precision
_TOL = {
    ("float32", "highest"): 1e-5, ("float32", "default"): 5e-3,
    ("bfloat16", "highest"): 2e-2, ("bfloat16", "default"): 2e-2,
    ("float16", "highest"): 5e-3, ("float16", "default"): 5e-3,
}


def _rel(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(x.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def _time(fn: Callable[[], Any], calls: int) -> float:
    import jax

    t0 = time.perf_counter()
    out = None
    for _ in range(calls):
        out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / calls


def bench(n: int, dtype: str, prec: str, reps: int, rng: random.Random) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    import dmatmul as dm

    jdt = getattr(jnp, dtype)
    ka, kb = jax.random.split(jax.random.key(n))
    a = jax.random.normal(ka, (n, n), jnp.float32).astype(jdt)
    b = jax.random.normal(kb, (n, n), jnp.float32).astype(jdt)
    lax_prec = getattr(jax.lax.Precision, prec.upper())
    ref_fn = jax.jit(lambda x, y: jnp.dot(x, y, precision=lax_prec))
    mm = dm.Matmul(a, b, precision=prec, backend="jax", devices=1)
    mm.plan()
    user_jit = jax.jit(lambda x, y: dm.matmul(x, y, precision=prec, backend="jax", devices=1))
    contenders: dict[str, Callable[[], Any]] = {
        "jnp.dot": lambda: ref_fn(a, b),
        "Matmul.execute": mm.execute,
        "dm.matmul": lambda: dm.matmul(a, b, precision=prec, backend="jax", devices=1),
        "jit(dm.matmul)": lambda: user_jit(a, b),
    }
    # correctness: every contender against jnp.dot and a float64 reference of 64 spread rows
    rows = np.linspace(0, n - 1, min(n, 64)).astype(int)
    ha = np.asarray(a.astype(jnp.float32), dtype=np.float64)
    hb = np.asarray(b.astype(jnp.float32), dtype=np.float64)
    ref64 = ha[rows] @ hb
    outs = {name: np.asarray(jax.block_until_ready(fn()).astype(jnp.float32)) for name, fn in contenders.items()}
    errors = {name: _rel(o[rows], ref64) for name, o in outs.items()}
    vs_jnp = {name: _rel(o, outs["jnp.dot"].astype(np.float64)) for name, o in outs.items()}
    ok = all(e <= _TOL[(dtype, prec)] for e in errors.values())
    del outs
    # calls per sample: about 5 ms of the reference's time
    t1 = min(_time(contenders["jnp.dot"], 3) for _ in range(3))
    calls = max(1, min(200, int(5e-3 / max(t1, 1e-7))))
    for fn in contenders.values():  # warm
        _time(fn, calls)
    samples: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(reps):
        order = list(contenders)
        rng.shuffle(order)
        for name in order:
            samples[name].append(_time(contenders[name], calls))
    mm.free()
    med = {k: statistics.median(v) for k, v in samples.items()}
    paired = {
        k: statistics.median(r / t for r, t in zip(samples["jnp.dot"], v)) for k, v in samples.items()
    }
    return {
        "n": n, "dtype": dtype, "precision": prec, "calls": calls, "algorithm": mm.algorithm,
        "median_s": med, "paired_x_jnp": paired, "rel_err_f64": errors, "rel_diff_jnp": vs_jnp, "ok": ok,
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1024,2048,4096,8192")
    p.add_argument("--dtypes", default="float32,bfloat16,float16")
    p.add_argument("--precisions", default="default,highest")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="", help="write every sample here")
    args = p.parse_args(argv)
    import jax

    import dmatmul as dm

    dev = jax.devices()[0]
    print(f"# {dev.platform} {getattr(dev, 'device_kind', '')}; jax {jax.__version__}; dmatmul {dm.__version__}; "
          f"python {platform.python_version()}", flush=True)
    rng = random.Random(args.seed)
    results = []
    names = ["Matmul.execute", "dm.matmul", "jit(dm.matmul)"]
    print(f"{'dtype':9} {'prec':8} {'n':>5} {'jnp.dot us':>11} {'TFLOP/s':>8} "
          + " ".join(f"{'x ' + k:>18}" for k in names) + "  max rel err (f64)  ok", flush=True)
    for dtype in args.dtypes.split(","):
        for prec in args.precisions.split(","):
            for n in (int(s) for s in args.sizes.split(",")):
                r = bench(n, dtype, prec, args.reps, rng)
                results.append(r)
                t = r["median_s"]["jnp.dot"]
                print(f"{dtype:9} {prec:8} {n:5d} {t * 1e6:11.1f} {2 * n**3 / t / 1e12:8.1f} "
                      + " ".join(f"{r['paired_x_jnp'][k]:17.3f}x" for k in names)
                      + f"  {max(r['rel_err_f64'].values()):.1e}  {'ok' if r['ok'] else 'MISMATCH'}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(dev), "jax": jax.__version__, "results": results}, f, indent=1)
    bad = [r for r in results if not r["ok"]]
    for r in bad:
        print(f"MISMATCH {r['dtype']} {r['precision']} n={r['n']}: {r['rel_err_f64']}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
