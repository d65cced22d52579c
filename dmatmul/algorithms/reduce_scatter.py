"""``reduce_scatter``: GEMM+ReduceScatter. Each rank multiplies its K slice and
the partial sums of the result's blocks travel a ring of P - 1 steps (or,
one-shot, one GEMM of the whole partial product and one reduce-scatter)."""

from __future__ import annotations

from .base import Algorithm, GemmShape, Kernel, Operand, Problem1D, ring_schedules

_RINGS = (
    Kernel("reduce_scatter", "K", "K", "M"),
    Kernel("reduce_scatter", "K", "K", "N"),
)


class ReduceScatter(Algorithm):
    name = "reduce_scatter"
    summary = "GEMM+ReduceScatter: partial sums of the result's blocks travel a ring"
    kernels = ring_schedules(_RINGS)

    def cost(self, problem: Problem1D, kernel: Kernel, steps: float) -> tuple[float, float]:
        p = problem.p
        return (p - 1) / p * problem.m * problem.n * problem.acc_itemsize, steps

    def copied(self, problem: Problem1D, kernel: Kernel, transposes: tuple[bool, bool]) -> float:
        # one-shot onto columns: the partial product is computed transposed, and the block scattered to a rank
        # transposed back
        if kernel.schedule != "one_shot" or kernel.d != "N":
            return 0.0
        return problem.m * problem.n / problem.p * problem.acc_itemsize

    def dot_transposed(self, kernel: Kernel, transposes: tuple[bool, bool]) -> bool:
        # one-shot onto columns: op(B)^T op(A)^T, b the dot's lhs (its K leading as given) and a its rhs
        if kernel.schedule == "one_shot" and kernel.d == "N":
            return transposes == (False, False)
        return super().dot_transposed(kernel, transposes)

    def gemm_shape(self, problem: Problem1D, kernel: Kernel) -> GemmShape:
        m, n, k, p = problem.m, problem.n, problem.k, problem.p
        if kernel.schedule == "one_shot":
            return (1, m, n, k / p, False)  # the whole partial product, then one reduce-scatter
        return (p, m / p, n, k / p, True) if kernel.d == "M" else (p, m, n / p, k / p, True)

    def in_flight(self, kernel: Kernel) -> tuple[Operand, ...]:
        return ("d",)  # partial results

    def extra_memory_bytes(self, m: int, n: int, k: int, p: int, itemsize: int, acc: int, *,
                           moving: str | None, one_shot: bool) -> float:
        # the partial sum in flight and the one being added to; one-shot: the full partial product
        if one_shot:
            return float(m * n * acc)
        return 2 * m * n / p * acc


ALGORITHM = ReduceScatter()
