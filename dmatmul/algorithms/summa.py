"""``summa``: SUMMA on a 2-D process grid. K is cut in panels; at each step
op(A)'s row panel travels along grid rows and op(B)'s column panel along grid
columns (or, one-shot, both panels all-gathered whole, then one GEMM)."""

from __future__ import annotations

import math

from .base import Algorithm, GemmShape, Kernel, Operand, Problem1D, leads


class Summa(Algorithm):
    name = "summa"
    summary = "SUMMA on a 2-D grid: K panels of op(A) along grid rows, of op(B) along grid columns"
    grid = True
    kernels = (
        Kernel("summa", "G", "G", "G"),
        # two whole collectives (op(A)'s row panel gathered along the grid row, op(B)'s column panel along
        # the grid column) and one GEMM: small products on a grid
        Kernel("summa", "G", "G", "G", schedule="one_shot"),
    )

    def collectives(self, kernel: Kernel, p: int) -> float:
        # one gather of each operand's panel, along its grid axis
        return 2.0 if kernel.schedule == "one_shot" else 0.0

    def cost(self, problem: Problem1D, kernel: Kernel, steps: float) -> tuple[float, float]:
        m, n, k, p = problem.m, problem.n, problem.k, problem.p
        rows, cols = problem.grid or (1, p)
        # op(A)'s row panel travels along grid rows, op(B)'s column panel along grid columns, each byte
        # received once (cuBLASMp: broadcasts), in about one message per step of each. The JAX backend
        # re-costs its SUMMA from the blocks it moves (JaxPlan._summa_cost): K padded to whole panels, and
        # in the ring the other operand's panels broadcast in ppermute rounds that every rank receives
        a_in = (cols - 1) / cols * (m / rows) * k
        b_in = (rows - 1) / rows * k * (n / cols)
        return (a_in + b_in) * problem.itemsize, 0 if kernel.schedule == "one_shot" else rows + cols

    def copied(self, problem: Problem1D, kernel: Kernel, transposes: tuple[bool, bool]) -> float:
        # one-shot: a panel gathered along its K where K does not lead is laid out whole once (op(A)'s row
        # panel for an A stored M x K, op(B)'s column panel for a B stored N x K)
        if kernel.schedule != "one_shot":
            return 0.0
        rows, cols = problem.grid or (1, problem.p)
        a_panel = 0.0 if leads("a", "K", transposes[0]) else problem.m / rows * problem.k
        b_panel = 0.0 if leads("b", "K", transposes[1]) else problem.k * problem.n / cols
        return (a_panel + b_panel) * problem.itemsize

    def gemm_shape(self, problem: Problem1D, kernel: Kernel) -> GemmShape:
        m, n, k, p = problem.m, problem.n, problem.k, problem.p
        rows, cols = problem.grid or (1, p)
        if kernel.schedule == "one_shot":
            return (1, m / rows, n / cols, k, False)  # both panels gathered whole: one GEMM
        steps = max(rows, cols)  # a ring along the longer grid axis, one K panel a step
        return (steps, m / rows, n / cols, k / steps, True)

    def in_flight(self, kernel: Kernel) -> tuple[Operand, ...]:
        return ("a", "b")  # a panel of each

    def extra_memory_bytes(self, m: int, n: int, k: int, p: int, itemsize: int, acc: int, *,
                           moving: str | None, one_shot: bool) -> float:
        if one_shot:  # op(A)'s row panel and op(B)'s column panel, whole (a square grid of p ranks)
            return (m * k + k * n) / math.sqrt(p) * itemsize
        return (m * k + k * n) / p * itemsize  # one panel of each, k/sqrt(p) wide


ALGORITHM = Summa()
