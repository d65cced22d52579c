"""The tables of docs/scale.md: dmatmul's planner projected from 8 to 1,024 GPUs
(``dmatmul plan`` on the built-in profiles), and its predictions at the
published points it is checked against. Pure Python: ``python benchmarks/scale.py``."""

from __future__ import annotations

import contextlib

from dmatmul import _machines, _plan
from dmatmul.cli.plan import project


def scaling(machine: str = "h100-nvl8", n: int = 65536, dtype: str = "bfloat16") -> str:
    """Per GPU count: the planner's choice with the layout free (distribution=None: 1-D layouts and 2-D grids), and
    SUMMA on its best grid (``--layout G,G,G``)."""
    prof = _machines.PROFILES[machine]
    lines = ["| GPUs | nodes | free layout: algorithm | time | of peak | vs bound | SUMMA grid | time | of peak "
             "| vs bound |", "|---:|---:|---|---:|---:|---:|---|---:|---:|---:|"]
    for nodes in (1, 2, 4, 8, 16, 32, 64, 128):
        p = prof.ranks(nodes)
        model = prof.model(dtype, nodes)
        pr = project(n, n, n, p, dtype, model)
        summa = next(c for c in pr.runners_up + (pr.chosen,) if c.plan.algorithm == "summa")
        cells = []
        for free, c in ((True, pr.chosen), (False, summa)):
            pl = c.plan
            sched = pl.kernel.schedule.replace("_", "-")
            grid = f"{c.grid[0]}x{c.grid[1]}" if c.grid and "G" in c.layout else None
            what = (f"{pl.algorithm} ({sched}, {grid + ' grid' if grid else c.layout})" if free
                    else f"{grid} ({sched})" if grid else "-")
            bound = "n/a (b replicated)" if "R" in c.layout else f"{pl.nbytes / pr.bound:.2f}x"
            cells.append(f"{what} | {pl.time * 1e3:.2f} ms | {pl.flops / pl.time / prof.peak_for(dtype):.0%} "
                         f"| {bound}")
        lines.append(f"| {p} | {nodes} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def published() -> str:
    h100 = _machines.PROFILES["h100-nvl8"]
    rows = ["| point | published | predicted (dmatmul's model) | error |", "|---|---:|---:|---:|"]

    def one(label: str, m: int, n: int, k: int, p: int, dtype: str, schedule: str, measured: float) -> None:
        with _plan.schedule(schedule) if schedule else contextlib.nullcontext():
            pr = project(m, n, k, p, dtype, h100.model(dtype), "XYY")
        t = pr.chosen.plan.time
        rows.append(f"| {label} | {measured * 1e6:.0f} us | {t * 1e6:.0f} us ({pr.chosen.plan.algorithm}, "
                    f"{schedule.replace('_', '-')}) | {t / measured - 1:+.0%} |")

    for p, pallas, nccl in ((2, 102e-6, 147e-6), (4, 212e-6, 290e-6), (8, 436e-6, 565e-6)):
        one(f"JAX Pallas collective matmul, {p} x H100", 1024 * p, 4096 * p, 4096, p, "float16", "ring", pallas)
        one(f"NCCL all-gather + cuBLAS, {p} x H100", 1024 * p, 4096 * p, 4096, p, "float16", "one_shot", nccl)
    one("PyTorch AG+GEMM overlapped, 8 x H100", 8192, 8 * 8192, 8192, 8, "bfloat16", "ring", 1.77e-3)
    one("PyTorch AG then GEMM, 8 x H100", 8192, 8 * 8192, 8192, 8, "bfloat16", "one_shot", 2.96e-3)
    return "\n".join(rows)


if __name__ == "__main__":
    print(published())
    print()
    for n in (16384, 65536):
        print(f"n = {n}, bfloat16, h100-nvl8")
        print(scaling(n=n))
        print()
