"""``dmatmul demo``: every algorithm on simulated CPU devices (JAX), each result
checked against numpy; exit status 1 on any mismatch."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _runtime
from .common import require_backend, require_cost_model, start_jax_cpu

if TYPE_CHECKING:
    from .._spec import AlgorithmName

__all__ = ["cmd_demo"]


# the demo's cases: (algorithm, distributions of a, b, result, transpose_a, transpose_b, dtype)
def _demo_cases(dm: Any, nranks: int) -> list[tuple[AlgorithmName, tuple[Any, Any, Any], bool, bool, str]]:
    X, Y, R = dm.Slab.X, dm.Slab.Y, dm.Replicated()
    rows = max(r for r in range(1, int(nranks**0.5) + 1) if nranks % r == 0)
    col = dm.ProcessGrid((rows, nranks // rows), layout="col")
    row = dm.ProcessGrid((nranks // rows, rows))
    bc = dm.BlockCyclic(col, (64, 64))
    return [
        ("allgather", (X, Y, X), False, False, "float32"),
        ("allgather", (X, Y, Y), False, False, "float32"),
        ("allgather", (X, X, X), False, True, "float32"),
        ("reduce_scatter", (Y, X, Y), False, False, "float32"),
        ("reduce_scatter", (X, Y, Y), True, True, "float32"),
        ("allreduce", (Y, X, R), False, False, "float32"),
        ("local", (X, R, X), False, False, "float32"),
        ("auto", (Y, Y, X), False, False, "float32"),
        ("auto", (Y, Y, X), True, False, "float32"),
        ("summa", (bc, bc, bc), False, False, "float32"),  # 2-D block-cyclic on a column-major grid
        ("auto", (bc, X, Y), False, False, "float32"),  # mixed: a grid operand with slabs
        ("auto", (dm.BlockNonCyclic(row), bc, X), False, True, "float32"),  # operands on two grids
        ("auto", (X, Y, X), False, False, "float64"),
        ("auto", (Y, X, Y), True, False, "complex64"),
    ]


_DEMO_TOLERANCE = {"float32": 1e-5, "complex64": 1e-5, "float64": 1e-12}


def _short(d: Any) -> str:
    """A distribution in a table cell: ``BC(2x4 col, 64x64)`` (BlockCyclic), ``BNC(4x2)`` (BlockNonCyclic)."""
    grid = getattr(d, "grid", None)
    if grid is None:
        return repr(d)
    g = "x".join(map(str, grid.shape)) + (" col" if grid.layout == "col" else "")
    blocks = getattr(d, "block_sizes", None)
    return ("BC(" if blocks else "BNC(") + g + (f", {blocks[0]}x{blocks[1]})" if blocks else ")")


def cmd_demo(args: argparse.Namespace) -> int:
    """Every algorithm, 2-D grids, a redistribution, checked against numpy. In
    one process: global matrices on simulated CPU devices; under ``mpiexec -n
    P``: each rank its blocks."""
    require_backend("demo")
    require_cost_model("demo")
    spmd = _runtime.launched_size() > 1
    if not spmd:
        start_jax_cpu(args.devices)
    import dmatmul as dm

    rt = dm.init() if spmd else None
    rank, nranks = (rt.rank, rt.size) if rt else (0, args.devices)
    say = print if rank == 0 else (lambda *a, **k: None)
    rng = np.random.default_rng(0)  # the same global data on every rank
    m, n, k = args.m, args.n, args.k
    where = f"{nranks} processes (mpiexec)" if spmd else f"{nranks} simulated CPU devices"
    say(f"dmatmul demo: D = 0.5 * op(A) @ op(B) + 2 * C, M={m} N={n} K={k}, JAX backend on {where}")
    header = (f"{'algorithm':15s} {'ran':15s} {'a':18s} {'b':18s} {'result':18s} {'op':3s} {'dtype':9s} "
              f"{'max rel err':>11s} {'ms':>8s}")
    say(header)
    say("-" * len(header))
    failed = total = 0

    def report(algorithm: str, ran: str, dists: Any, op: str, dtype: str, err: float, ms: float) -> None:
        nonlocal failed, total
        if rt:
            err = max(rt.comm.allgather(err))
        ok = err < _DEMO_TOLERANCE[dtype]
        failed, total = failed + (not ok), total + 1
        cells = " ".join(f"{_short(d):18s}" for d in dists) + " " * 19 * (3 - len(dists))
        say(f"{algorithm:15s} {ran:15s} {cells} {op:3s} {dtype:9s} {err:11.2e} {ms:8.2f}{'' if ok else '  MISMATCH'}")

    def draw(shape: tuple[int, int], dtype: str) -> np.ndarray:
        x = rng.standard_normal(shape)
        if dtype.startswith("complex"):
            x = x + 1j * rng.standard_normal(shape)
        return x.astype(dtype)

    for algorithm, dists, ta, tb, dtype in _demo_cases(dm, nranks):
        a = draw((k, m) if ta else (m, k), dtype)
        b = draw((n, k) if tb else (k, n), dtype)
        c = draw((m, n), dtype)
        wide = np.complex128 if dtype.startswith("complex") else np.float64
        ref = 0.5 * (a.T if ta else a).astype(wide) @ (b.T if tb else b).astype(wide) + 2.0 * c
        if spmd:  # this rank's blocks in, this rank's block out
            a, b, c = (dm.split(x, d)[rank] for x, d in zip((a, b, c), dists))
            want = dm.split(ref, dists[2])[rank]
        else:
            want = ref
        with dm.Matmul(
            a, b, c, distribution=dists, alpha=0.5, beta=2.0, transpose_a=ta, transpose_b=tb,
            algorithm=algorithm, devices=None if spmd else args.devices, backend="jax",
        ) as mm:
            mm.execute()  # compile
            t0 = time.perf_counter()
            d = mm.execute()
            ms = (time.perf_counter() - t0) * 1e3
            ran = mm.algorithm
        err = float(np.abs(d - want).max() / np.abs(ref).max()) if d.size else 0.0
        report(algorithm, ran, dists, ("T" if ta else "N") + ("T" if tb else "N"), dtype, err, ms)

    # a redistribution: the last result's layout (block-cyclic) to Slab.Y, every element moved once
    src, dst = _demo_cases(dm, nranks)[9][1][0], dm.Slab.Y
    x = draw((m, n), "float32")
    given = dm.split(x, src)[rank] if spmd else x
    t0 = time.perf_counter()
    y = dm.redistribute(given, src, dst, **({} if spmd else {"devices": args.devices}))
    ms = (time.perf_counter() - t0) * 1e3
    want = dm.split(x, dst)[rank] if spmd else x
    err = float(np.abs(np.asarray(y) - want).max()) if want.size else 0.0
    report("redistribute", "exchange", (src, dst), "", "float32", err, ms)
    say(f"{total - failed} passed, {failed} failed")
    if rt:
        dm.finalize()
    return 1 if failed else 0
