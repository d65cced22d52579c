"""What dmatmul's nvmath backend costs around nvmath's own call, without a GPU.

    python benchmarks/nvmath_overhead.py                 # 1 rank in process, then 4 ranks under mpiexec -n 4
    python benchmarks/nvmath_overhead.py --ranks 1       # 1 rank only
    mpiexec -n 4 python benchmarks/nvmath_overhead.py --worker   # the 4-rank part by hand

nvmath-python and CuPy are replaced by the simulated nvmath of the tests
(``tests/gpu/_fake_nvmath.py``) in its ``NOOP`` mode: its ``execute()`` does no
work and returns a result buffer allocated once, so what is timed is
``dm.Matmul.execute()`` minus the GEMM: the hand-over of the operands
(views, staging copies, ``reset_operands``), the nvmath call and the finish
(stripping padding, dmatmul's own epilogue).

Operands are numpy arrays standing in for device arrays: the plan is told they
live on the GPU (as CuPy arrays would), so nvmath keeps pointing at them and
a plan handed the same buffers again skips ``reset_operands``.

Cases: 1 rank with even and uneven sizes (one rank never pads), and 4 ranks
with AllGather+GEMM's layout (Slab.X, Slab.Y, Slab.X) on an even size (no
padding) and an uneven one (each rank's block zero-padded for nvmath's
BlockCyclic, so a staging copy each call). Figures: median, min and max
microseconds per ``execute()`` over ``--reps`` calls. The last line printed is
``overhead_us=<median, 1 rank, no padding>``.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT))

import _fake_nvmath  # noqa: E402

_fake_nvmath.install()
_fake_nvmath.NOOP = True

import numpy as np  # noqa: E402

import dmatmul as dm  # noqa: E402
from dmatmul.backends.nvmath import _backend  # noqa: E402

_backend.on_device = lambda xp: True  # numpy stands in for device arrays (see the docstring)


def _time(mm: dm.Matmul, reps: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        mm.execute()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mm.execute()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _fmt(name: str, ranks: int, ts: list[float]) -> str:
    return f"{name:28s} ranks={ranks}  median={statistics.median(ts):9.1f} us  min={min(ts):9.1f}  max={max(ts):9.1f}"


def one_rank(reps: int, warmup: int) -> tuple[list[str], float]:
    rng = np.random.default_rng(0)
    lines, headline = [], 0.0
    for name, (m, n, k) in (("even 256^3, no padding", (256, 256, 256)), ("uneven 255x257x253", (255, 257, 253))):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        with dm.Matmul(a, b, backend="nvmath") as mm:
            mm.plan()
            ts = _time(mm, reps, warmup)
        lines.append(_fmt(name, 1, ts))
        if headline == 0.0:
            headline = statistics.median(ts)
    return lines, headline


def four_ranks(reps: int, warmup: int) -> list[str]:
    rt = dm.init(start=())
    P, rank = rt.size, rt.rank
    rng = np.random.default_rng(0)
    X, Y = dm.Slab.X, dm.Slab.Y
    lines = []
    for name, size in (("AG+GEMM even 256, no padding", 256), ("AG+GEMM uneven 254, padded", 254)):
        a = rng.standard_normal((size, size)).astype(np.float32)
        b = rng.standard_normal((size, size)).astype(np.float32)
        la, lb = dm.split(a, X, P)[rank], dm.split(b, Y, P)[rank]
        with dm.Matmul(la, lb, distribution=(X, Y, X), backend="nvmath") as mm:
            mm.plan()
            ts = _time(mm, reps, warmup)
        everyone = rt.comm.allgather(statistics.median(ts))
        lines.append(_fmt(name, P, ts) + f"  (median over ranks' medians: {statistics.median(everyone):.1f} us)")
    return lines if rank == 0 else []


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--ranks", default="1,4", help="1, 4 or 1,4")
    parser.add_argument("--worker", action="store_true", help="the 4-rank part (run under mpiexec -n 4)")
    args = parser.parse_args()
    if args.worker:
        for line in four_ranks(args.reps, args.warmup):
            print(line, flush=True)
        return
    ranks = [int(r) for r in args.ranks.split(",") if r]
    print(f"dmatmul nvmath backend: time per Matmul.execute() around a no-op simulated nvmath "
          f"({args.reps} calls after {args.warmup} warm-up calls, float32)")
    headline = None
    if 1 in ranks:
        lines, headline = one_rank(args.reps, args.warmup)
        for line in lines:
            print(line, flush=True)
    if 4 in ranks:
        mpiexec = shutil.which("mpiexec") or str(pathlib.Path(sys.executable).parent / "mpiexec")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
        out = subprocess.run([mpiexec, "-n", "4", sys.executable, __file__, "--worker", "--reps", str(args.reps),
                              "--warmup", str(args.warmup)], capture_output=True, text=True, env=env, timeout=1800)
        print(out.stdout, end="")
        if out.returncode != 0:
            print(out.stderr[-4000:], file=sys.stderr)
            sys.exit(out.returncode)
    if headline is not None:
        print(f"overhead_us={headline:.1f}")


if __name__ == "__main__":
    main()
