"""One process, simulated devices: the bench on ``jax.Array`` operands.

Starts JAX with enough (on CPU simulated) devices, lays the operands out as
each layout says, and times dmatmul and its peers on ``p`` of them for every
size, device count and layout, printing each group's table as it finishes.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from .peers import compiled_peak_bytes, dmatmul_plans, memory_facts, named_algorithms, plan_facts, shardings, xla_dot
from .problem import TOL, as_dtype, check_rows, numpy_dtype, numpy_note, operands, parse_layout, rel_err
from .report import show_group
from .timing import IdleWaiter, Progress, Result, Runner, blocking, time_interleaved


def start_jax(ndevices: int) -> Any:
    """Import JAX with at least ``ndevices`` CPU devices (simulated when on CPU)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    current = getattr(jax.config, "jax_num_cpu_devices")  # a flag JAX's type stubs do not declare
    if current is None or current < ndevices:  # never lower what the caller configured
        try:
            jax.config.update("jax_num_cpu_devices", ndevices)
        except RuntimeError:  # JAX already started by the caller
            pass
    if len(jax.devices()) < ndevices:
        raise SystemExit(
            f"dmatmul bench: {ndevices} devices requested but JAX has {len(jax.devices())} "
            f"({jax.devices()[0].platform}); start JAX with jax_num_cpu_devices={ndevices} or use fewer --devices"
        )
    return jax


def _bench_group_devices(
    n: int, p: int, layout: str, args: argparse.Namespace, host: tuple[np.ndarray, np.ndarray],
    ref: tuple[np.ndarray, np.ndarray], progress: Progress,
) -> list[Result]:
    import jax

    import dmatmul as dm

    dists = parse_layout(layout, p)
    dtype = args.dtype
    a32, b32 = host
    a, b = as_dtype(a32, dtype), as_dtype(b32, dtype)
    devices = jax.devices()[:p]
    platform_name = devices[0].platform
    # the plan's own shardings where the backend exposes them (the same layout)
    probe = None
    try:
        probe = dm.Matmul(a, b, distribution=dists, devices=p, backend="jax")
        probe.plan()
    except (ValueError, NotImplementedError):
        probe = None
    shard = shardings(dists, devices, probe)
    if probe is not None:
        probe.free()
    ja = jax.device_put(a, shard["a"])
    jb = jax.device_put(b, shard["b"])
    jax.block_until_ready((ja, jb))

    runners: dict[str, Runner] = {}
    results: dict[str, Result] = {}
    itemsize = np.dtype(a.dtype).itemsize

    def new(impl: str, **kw: Any) -> Result:
        r = Result(impl=impl, n=n, ranks=p, layout=layout, dtype=dtype, mode="devices", **kw)
        results[impl] = r
        return r

    plans = dmatmul_plans(ja, jb, dists, args, devices=p)
    for algorithm, mm in plans.items():
        res = new(f"dmatmul:{algorithm}", **plan_facts(mm, n, p, itemsize, platform_name), **memory_facts(mm))
        if algorithm == "auto" and args.explain:
            progress.note(mm.explain())
        runners[res.impl] = blocking(mm.execute)

    if "xla" in args.peers:
        f = jax.jit(xla_dot(dtype), in_shardings=(shard["a"], shard["b"]), out_shardings=shard["d"])
        # its memory against the ideal of dmatmul auto's plan for the same layout
        auto = results.get("dmatmul:auto")
        new("xla", ideal_bytes=auto.ideal_bytes if auto else None)  # peak_bytes: after timing
        runners["xla"] = blocking(f, ja, jb)
    if "xla-1dev" in args.peers:
        d0 = devices[0]
        a1, b1 = jax.device_put(a, d0), jax.device_put(b, d0)
        f1 = jax.jit(xla_dot(dtype))
        new("xla-1dev")
        runners["xla-1dev"] = blocking(f1, a1, b1)
    if "numpy" in args.peers:
        new("numpy", note=numpy_note(dtype))
        an, bn = (x.astype(numpy_dtype(dtype), copy=False) for x in (a32, b32))
        runners["numpy"] = lambda: an @ bn

    def check(impl: str, got: Any) -> None:
        """Correctness, once: the first call's result (outside the timing)."""
        if impl == "numpy":
            return
        tol = TOL.get(dtype, 1e-2)
        rows, want = ref
        err = rel_err(np.asarray(got)[rows], want)
        results[impl].max_rel_err = err
        if err > tol:
            results[impl].note = f"MISMATCH: max rel err {err:.2e} > {tol:.0e}"

    weight = float(n) ** 3
    label = f"n={n} P={p} {layout}"
    waiter = IdleWaiter(args.wait_idle) if args.wait_idle is not None else None
    times, first = time_interleaved(
        runners, args.reps, args.warmup, before=waiter, check=check,
        on_step=lambda impl: progress.step(weight, f"{label} {impl}"),
    )
    if "xla" in runners:  # compiled ahead of time only now: its first call above compiled it
        results["xla"].peak_bytes = compiled_peak_bytes(f, ja, jb)
    if waiter is not None:
        for r in results.values():
            r.waited_s = waiter.waited
            if waiter.gave_up:
                r.note = (r.note + "; " if r.note else "") + f"machine busy: {waiter.gave_up} samples taken anyway"
    for impl, ts in times.items():
        results[impl].times = ts
        results[impl].first_call_s = first[impl]
    for mm in plans.values():
        mm.free()
    return list(results.values())


def run_devices(args: argparse.Namespace, out: list[Result], flush: Callable[[], None]) -> None:
    jax = start_jax(max(args.devices))
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    calls_per_group = (len(named_algorithms(args)) + len(args.peers)) * (1 + args.warmup + args.reps)
    total = sum(float(n) ** 3 * calls_per_group for n in args.sizes) * len(args.devices) * len(args.layouts)
    progress = Progress(total, enabled=not args.no_progress)
    try:
        for n in args.sizes:
            host = operands(n, args.dtype)
            rows = check_rows(n)  # the reference in float64 (only the check; never timed)
            ref = (rows, as_dtype(host[0][rows], args.dtype).astype(np.float64)
                   @ as_dtype(host[1], args.dtype).astype(np.float64))
            for p in args.devices:
                for layout in args.layouts:
                    if n % p:
                        progress.note(f"skipping n={n} on {p} devices (not a multiple)")
                        continue
                    show_group(_bench_group_devices(n, p, layout, args, host, ref, progress), out, progress, flush)
    finally:
        progress.close()
