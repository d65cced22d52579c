"""``allreduce``: GEMM+AllReduce. Each rank multiplies its K slice and one
``psum`` sums the partial products into the replicated result."""

from __future__ import annotations

from .base import Algorithm, GemmShape, Kernel, Operand, Problem1D


class AllReduce(Algorithm):
    name = "allreduce"
    summary = "GEMM+AllReduce: the partial products summed in one collective, the result replicated"
    kernels = (Kernel("allreduce", "K", "K", "R"),)

    def collectives(self, kernel: Kernel, p: int) -> float:
        return 1.0  # one psum

    def cost(self, problem: Problem1D, kernel: Kernel, steps: float) -> tuple[float, float]:
        # one psum: a whole collective (its engine's steps are inside it)
        p = problem.p
        return 2 * (p - 1) / p * problem.m * problem.n * problem.acc_itemsize, 0

    def gemm_shape(self, problem: Problem1D, kernel: Kernel) -> GemmShape:
        return (1, problem.m, problem.n, problem.k / problem.p, False)

    def in_flight(self, kernel: Kernel) -> tuple[Operand, ...]:
        return ("d",)  # partial results

    def extra_memory_bytes(self, m: int, n: int, k: int, p: int, itemsize: int, acc: int, *,
                           moving: str | None, one_shot: bool) -> float:
        return float(m * n * acc)  # the full partial product (the result itself is replicated)


ALGORITHM = AllReduce()
