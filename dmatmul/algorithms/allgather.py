"""``allgather``: AllGather+GEMM. The moving operand's blocks travel a ring of
P - 1 steps, each beside the GEMM of the block that arrived (or, one-shot, one
all-gather and one GEMM; bidirectional, two rings, half of each block each way)."""

from __future__ import annotations

from .base import Algorithm, GemmShape, Kernel, Operand, Problem1D, Role, leads, ring_schedules

_RINGS = (
    Kernel("allgather", "M", "N", "M", moving="b"),
    Kernel("allgather", "M", "K", "M", moving="b"),
    Kernel("allgather", "M", "N", "N", moving="a"),
    Kernel("allgather", "K", "N", "N", moving="a"),
)


class AllGather(Algorithm):
    name = "allgather"
    summary = "AllGather+GEMM: the moving operand's blocks travel a ring, each beside a GEMM"
    kernels = ring_schedules(_RINGS)

    def cost(self, problem: Problem1D, kernel: Kernel, steps: float) -> tuple[float, float]:
        p = problem.p
        return (p - 1) / p * problem.elements(kernel.moving or "b") * problem.itemsize, steps

    def copied(self, problem: Problem1D, kernel: Kernel, transposes: tuple[bool, bool]) -> float:
        # one-shot: the moving operand gathered along an axis that does not lead is laid out whole once
        x = kernel.moving or "b"
        if kernel.schedule != "one_shot" or leads(x, kernel.role(x), transposes[x == "b"]):
            return 0.0
        return float(problem.elements(x) * problem.itemsize)

    def dot_transposed(self, kernel: Kernel, transposes: tuple[bool, bool]) -> bool:
        # one-shot, a free dimension gathered along an axis that does not lead: one 3-D dot of the blocks
        x = kernel.moving or "b"
        if kernel.schedule == "one_shot" and kernel.role(x) != "K" and not leads(x, kernel.role(x), transposes[x == "b"]):
            return False
        return super().dot_transposed(kernel, transposes)

    def gemm_shape(self, problem: Problem1D, kernel: Kernel) -> GemmShape:
        m, n, k, p = problem.m, problem.n, problem.k, problem.p
        if kernel.schedule == "one_shot":
            # the moving operand gathered whole: one GEMM of the whole K, or of the gathered free dimension
            return (1, m if kernel.a == "K" or kernel.moving == "a" else m / p,
                    n if kernel.b == "K" or kernel.moving == "b" else n / p, k, False)
        split_k = "K" in (kernel.a, kernel.b, kernel.d)
        return (p, m if kernel.a == "K" else m / p, n if kernel.b == "K" else n / p, k / p if split_k else k, split_k)

    def bidirectional_half(self, kernel: Kernel) -> Role:
        return kernel.role(kernel.moving or "b")  # half of the travelling block each way

    def in_flight(self, kernel: Kernel) -> tuple[Operand, ...]:
        return (kernel.moving or "b",)

    def extra_memory_bytes(self, m: int, n: int, k: int, p: int, itemsize: int, acc: int, *,
                           moving: str | None, one_shot: bool) -> float:
        # the block of the moving operand in flight plus one GEMM tile of the result; one-shot: the whole
        # gathered operand
        vol = (m * k) if moving == "a" else (k * n)
        if one_shot:
            return float(vol * itemsize)
        return vol / p * itemsize + (m / p) * (n / p) * acc


ALGORITHM = AllGather()
