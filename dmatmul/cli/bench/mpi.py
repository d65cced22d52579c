"""Several processes under ``mpiexec``: each rank passes its own blocks.

dmatmul runs on this rank's blocks, ``xla`` is JAX's multi-process
``jit(jnp.dot)`` on global arrays with the same shardings, and ``numpy`` runs
in a worker process of rank 0 (:class:`NumpyHelper`, started with
``python -c``) with the whole machine while the other ranks sleep in
barriers that do not busy-poll. A collective's time is its slowest rank's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .peers import compiled_peak_bytes, dmatmul_plans, memory_facts, named_algorithms, plan_facts, shardings, xla_dot
from .problem import TOL, as_dtype, numpy_dtype, numpy_note, operands, parse_layout, rel_err
from .report import show_group
from .timing import IdleWaiter, Progress, Result, Runner, blocking, time_interleaved

_NUMPY_HELPER = r"""
import os, sys, time
try:
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
except (AttributeError, OSError):
    pass
import numpy as np
cache = {}
for line in sys.stdin:
    n, dtype = int(line.split()[0]), line.split()[1]
    if (n, dtype) not in cache:  # the bench's operands (problem.operands), in numpy's element type
        cache.clear()
        rng = np.random.default_rng(n)
        cache[n, dtype] = tuple(rng.standard_normal((n, n), dtype=np.float32).astype(dtype) for _ in "ab")
    a, b = cache[n, dtype]
    t0 = time.perf_counter()
    d = a @ b
    print(time.perf_counter() - t0, d.dtype.name, flush=True)
"""


class NumpyHelper:
    """A process of its own for numpy's GEMM, with the whole machine: every
    CPU in its affinity mask and numpy's default thread count."""

    def __init__(self) -> None:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
            and not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_"))
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _NUMPY_HELPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )

    def gemm(self, n: int, dtype: str) -> tuple[float, str]:
        """Seconds of one GEMM of the bench's ``n x n`` operands in ``dtype``
        (numpy's: :func:`.problem.numpy_dtype`), and the product's element type."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{n} {dtype}\n")
        self.proc.stdin.flush()
        seconds, got = self.proc.stdout.readline().split()
        return float(seconds), got

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _quiet_barrier(comm: Any) -> None:
    """A barrier that sleeps while it waits (MPICH's blocking calls busy-poll,
    stealing the cores of the ranks still computing)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(5e-4)


def _bench_group_processes(
    n: int, layout: str, args: argparse.Namespace, rt: Any, helper: NumpyHelper | None, progress: Progress
) -> list[Result]:
    import jax

    import dmatmul as dm

    p, rank, comm = rt.size, rt.rank, rt.comm
    dtype = args.dtype
    dists = parse_layout(layout, p)
    a32, b32 = operands(n, dtype)
    a, b = as_dtype(a32, dtype), as_dtype(b32, dtype)
    me = rt.device if rt.device is not None else jax.local_devices()[0]
    by_id = {d.id: d for d in jax.devices()}
    devices = [by_id[i] for i in comm.allgather(me.id)]  # each rank's device, in rank order
    blocks = {
        op: np.ascontiguousarray(dm.split(x, d, p)[rank]) for op, x, d in (("a", a, dists[0]), ("b", b, dists[1]))
    }
    la, lb = jax.device_put(blocks["a"], me), jax.device_put(blocks["b"], me)
    itemsize = np.dtype(a.dtype).itemsize
    results: dict[str, Result] = {}
    runners: dict[str, Runner] = {}

    def new(impl: str, **kw: Any) -> Result:
        r = Result(impl=impl, n=n, ranks=p, layout=layout, dtype=dtype, mode="processes", **kw)
        results[impl] = r
        return r

    plans = dmatmul_plans(la, lb, dists, args)
    for algorithm, mm in plans.items():
        res = new(f"dmatmul:{algorithm}", **plan_facts(mm, n, p, itemsize, me.platform), **memory_facts(mm))
        if algorithm == "auto" and args.explain and rank == 0:
            progress.note(mm.explain())
        runners[res.impl] = blocking(mm.execute)
    if "xla" in args.peers:
        shard = shardings(dists, devices, plans.get("auto"))
        ga = jax.make_array_from_single_device_arrays((n, n), shard["a"], [la])
        gb = jax.make_array_from_single_device_arrays((n, n), shard["b"], [lb])
        f = jax.jit(xla_dot(dtype), in_shardings=(shard["a"], shard["b"]), out_shardings=shard["d"])
        auto = results.get("dmatmul:auto")
        new("xla", note="multi-process jit", ideal_bytes=auto.ideal_bytes if auto else None)  # peak: after timing
        runners["xla"] = blocking(f, ga, gb)
    if "numpy" in args.peers:
        new("numpy", note="; ".join(filter(None, ("1 process, all cores, other ranks asleep", numpy_note(dtype)))))
        numpy_times: list[float] = []

        def numpy_run() -> None:
            if helper is not None:
                numpy_times.append(helper.gemm(n, numpy_dtype(dtype))[0])

        runners["numpy"] = numpy_run

    rows, cols = dists[2].global_indices(rank, (n, n), p)
    ref = a.astype(np.float64)[rows] @ b.astype(np.float64)[:, cols]

    def check(impl: str, got: Any) -> None:
        """Correctness of this rank's block, once: the first call's result (outside the timing)."""
        if impl == "numpy":
            return
        tol = TOL.get(dtype, 1e-2)
        if impl == "xla":
            got = got.addressable_shards[0].data
        errs = comm.allgather(rel_err(got, ref))
        results[impl].max_rel_err = max(errs)
        if max(errs) > tol:
            results[impl].note = f"MISMATCH: max rel err {max(errs):.2e} > {tol:.0e}"

    weight = float(n) ** 3
    # rank 0 waits for an idle machine while the others sleep in the barrier
    waiter = IdleWaiter(args.wait_idle) if args.wait_idle is not None and rank == 0 else None
    times, first = time_interleaved(
        runners, args.reps, args.warmup, barrier=lambda: _quiet_barrier(comm), before=waiter, check=check,
        on_step=lambda impl: progress.step(weight, f"n={n} P={p} {layout} {impl}"),
    )
    if "xla" in runners:  # compiled ahead of time only now: its first call above compiled it
        results["xla"].peak_bytes = compiled_peak_bytes(f, ga, gb)
    if waiter is not None:
        for r in results.values():
            r.waited_s = waiter.waited
    _quiet_barrier(comm)
    # a collective's time is its slowest rank's
    all_times = comm.allgather(times)
    all_first = comm.allgather(first)
    for impl in runners:
        if impl == "numpy":
            results[impl].times = numpy_times[-args.reps :] if numpy_times else [float("nan")]
            results[impl].times = comm.bcast(results[impl].times, root=0)
            continue
        results[impl].times = [max(t[impl][i] for t in all_times) for i in range(args.reps)]
        results[impl].first_call_s = max(f[impl] for f in all_first)
    for mm in plans.values():
        mm.free()
    return list(results.values())


def run_processes(args: argparse.Namespace, out: list[Result], flush: Callable[[], None]) -> None:
    import dmatmul as dm

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    rt = dm.init()
    if args.dtype == "float64":
        import jax

        jax.config.update("jax_enable_x64", True)
    helper = NumpyHelper() if rt.rank == 0 and "numpy" in args.peers else None
    if "xla-1dev" in args.peers:
        args.peers = [x for x in args.peers if x != "xla-1dev"]  # one core per rank: not the machine's ceiling
    calls = (len(named_algorithms(args)) + len(args.peers)) * (1 + args.warmup + args.reps)
    total = sum(float(n) ** 3 * calls for n in args.sizes) * len(args.layouts)
    progress = Progress(total, enabled=rt.rank == 0 and not args.no_progress, notes=rt.rank == 0)
    try:
        for n in args.sizes:
            if n % rt.size:
                progress.note(f"note: n={n} is not a multiple of {rt.size}: uneven blocks")
            for layout in args.layouts:
                group = _bench_group_processes(n, layout, args, rt, helper, progress)
                if rt.rank == 0:
                    show_group(group, out, progress, flush)
    finally:
        progress.close()
        if helper is not None:
            helper.close()
