"""Small products: a ring of P - 1 steps, one whole collective, and XLA, side by side.

For each size, rank count and layout, in one run with interleaved repetitions
(each repetition in its own seeded random order, ``_bench.timing.rep_order``):

  ring       dmatmul's kernel with its ring schedule (P - 1 ``ppermute`` steps)
  one_shot   the same algorithm as one whole collective and one GEMM
             (``all_gather`` then the GEMM, or the GEMM then ``psum_scatter``)
  auto       what ``algorithm="auto"`` runs (the cost model's pick; named in the table)
  xla        XLA's partitioned ``jax.jit(jnp.dot, in_shardings=..., out_shardings=...)``

Layouts (a, b, result): XYX (Slab.X, Slab.Y, Slab.X: allgather, b moves), XXX
(allgather, b's K blocks move), YXY (Slab.Y, Slab.X, Slab.Y: reduce_scatter),
YXR (Slab.Y, Slab.X, Replicated(): allreduce, one psum, against reduce-scatter
and gather), GGG (BlockNonCyclic on a 2-D grid: SUMMA, whose one-shot schedule
gathers both panels with two collectives). Operands are device arrays already in the plan's
shardings. The ``ring``/``one_shot`` columns force the schedule with
``dmatmul._plan.schedule`` (the algorithm stays the layout's own).

Each line: the medians (us), the *paired* ratios (median over repetitions of
one's time / the other's in the same repetition; > 1: the second is faster)
and the model's predictions for the two schedules.

    python benchmarks/small.py --devices 8 4 --sizes 32 64 128 256 512 1024 --reps 21
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

LAYOUTS = {  # name: (a, b, result, the layout's own algorithm)
    "XYX": ("X", "Y", "X", "allgather"),
    "XXX": ("X", "X", "X", "allgather"),
    "YXY": ("Y", "X", "Y", "reduce_scatter"),
    "YXR": ("Y", "X", "R", "allreduce"),
    "GGG": ("G", "G", "G", "summa"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[8, 4])
    ap.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128, 256, 512, 1024])
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--json", default=None, help="write every time here")
    args = ap.parse_args()

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", max(args.devices))
    import jax.numpy as jnp

    import dmatmul as dm
    from dmatmul import _plan
    from dmatmul.cli.bench.peers import shardings
    from dmatmul.cli.bench.timing import blocking, time_interleaved
    from dmatmul._matmul import plan_of
    from dmatmul._plans import PLANS

    def dist_of(code: str, p: int) -> dm.Distribution:
        if code == "G":
            rows = 2
            return dm.BlockNonCyclic(dm.ProcessGrid((rows, p // rows)))
        return {"X": dm.Slab.X, "Y": dm.Slab.Y, "R": dm.Replicated()}[code]

    rng = np.random.default_rng(0)
    hi = jax.lax.Precision.HIGHEST
    rows, dump = [], []
    head = (f"{'n':>5s} {'P':>2s} {'layout':6s} {'auto runs':24s} {'ring':>8s} {'one_shot':>8s} {'auto':>8s} "
            f"{'xla':>8s} | {'ring/one':>8s} {'xla/one':>8s} {'xla/auto':>8s} {'ring/auto':>9s} | "
            f"{'pred ring':>9s} {'pred one':>8s}")
    print(f"medians in us, paired ratios (> 1: the second is faster), {args.reps} reps, {args.dtype}", flush=True)
    print(head)
    print("-" * len(head), flush=True)
    for p in args.devices:
        for layout in args.layouts:
            ca, cb, cd, algorithm = LAYOUTS[layout]
            dists = tuple(dist_of(c, p) for c in (ca, cb, cd))
            for n in args.sizes:
                a = rng.standard_normal((n, n)).astype(args.dtype)
                b = rng.standard_normal((n, n)).astype(args.dtype)
                PLANS.clear("jax")
                probe = dm.Matmul(a, b, distribution=dists, algorithm=algorithm, devices=p, precision="highest")
                probe.plan()
                sh = shardings(dists, jax.devices()[:p], probe)
                xa, xb = jax.device_put(a, sh["a"]), jax.device_put(b, sh["b"])
                runners, facts = {}, {}
                schedules = {"ring": "ring", "one_shot": "one_shot"} if algorithm in (
                    "allgather", "reduce_scatter", "summa") else {}
                for name, sched in (*schedules.items(), ("auto", None)):
                    with _plan.schedule(sched):
                        mm = dm.Matmul(xa, xb, distribution=dists, algorithm=algorithm if sched else "auto",
                                       devices=p, precision="highest")
                        mm.plan()
                    cost = plan_of(mm).cost
                    kern = cost.kernel
                    facts[name] = (f"{kern.algorithm}" + (f"/{kern.schedule}" if kern.algorithm in (
                        "allgather", "reduce_scatter", "summa") else ""), cost.time)
                    runners[name] = blocking(mm.execute)
                xla = jax.jit(lambda x, y: jnp.dot(x, y, precision=hi), in_shardings=(sh["a"], sh["b"]),
                              out_shardings=sh["d"])
                runners["xla"] = blocking(xla, xa, xb)
                want = a.astype(np.float64) @ b.astype(np.float64)
                for name, run in runners.items():
                    got = np.asarray(run())
                    assert np.allclose(got, want, rtol=1e-3, atol=1e-3 * n), (name, n, p, layout)
                times, _ = time_interleaved(runners, args.reps, warmup=2)
                med = {k: float(np.median(v)) * 1e6 for k, v in times.items()}

                def paired(num: str, den: str) -> float:
                    if num not in times or den not in times:
                        return float("nan")
                    return float(np.median(np.asarray(times[num]) / np.asarray(times[den])))

                fmt = lambda x: f"{x:8.0f}" if x == x else f"{'-':>8s}"  # noqa: E731
                pr = lambda x: f"{x:8.2f}" if x == x else f"{'-':>8s}"  # noqa: E731
                pred = {k: facts[k][1] * 1e6 if k in facts else float("nan") for k in ("ring", "one_shot")}
                line = (f"{n:5d} {p:2d} {layout:6s} {facts['auto'][0]:24s} {fmt(med.get('ring', float('nan')))} "
                        f"{fmt(med.get('one_shot', float('nan')))} {fmt(med['auto'])} {fmt(med['xla'])} | "
                        f"{pr(paired('ring', 'one_shot'))} {pr(paired('xla', 'one_shot'))} {pr(paired('xla', 'auto'))} "
                        f"{pr(paired('ring', 'auto')):>9s} | {fmt(pred['ring']):>9s} {fmt(pred['one_shot'])}")
                print(line, flush=True)
                rows.append(line)
                dump.append({"n": n, "p": p, "layout": layout, "auto": facts["auto"][0], "times": times,
                             "predicted": {k: v[1] for k, v in facts.items()}})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dump, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
