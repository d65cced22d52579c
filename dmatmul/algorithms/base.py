"""What an algorithm is, for the planner: the operand roles it takes (its
kernels, one per schedule), whether it runs on a 2-D process grid, and its
numbers: whole collectives, bytes and messages, local GEMM calls, and the
memory it holds in flight.

The planner (:mod:`dmatmul._plan`) and the memory model
(:func:`dmatmul._cost.extra_memory_bytes`) ask these of the
:data:`dmatmul.algorithms.ALGORITHMS` registry by the algorithm's name; a
backend runs a kernel it registers under that name. This module imports
nothing of the package's, so every other can import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Literal

__all__ = [
    "Role", "Schedule", "SCHEDULES", "Operand", "OPERANDS", "Kernel", "Problem1D", "GemmShape", "Algorithm",
    "ring_schedules", "leads",
]

Role = Literal["M", "K", "N", "R", "G"]  # "G": a 2-D block layout on the process grid
#: How a kernel communicates: "ring", P - 1 point-to-point steps, each beside a GEMM of one block;
#: "one_shot", whole collectives (the moving operand all-gathered, then one GEMM; or one GEMM of the whole
#: partial product, then one reduce-scatter; SUMMA: both panels all-gathered, then one GEMM); "bidirectional", two rings side by side in opposite directions,
#: half of each block each way (P - 1 steps of two messages: for links that carry both directions at once,
#: :func:`dmatmul._cost.bidirectional_pays`). The algorithm (its name, its operand roles) is the same.
Schedule = Literal["ring", "one_shot", "bidirectional"]
SCHEDULES: tuple[Schedule, ...] = ("ring", "one_shot", "bidirectional")
Operand = Literal["a", "b", "d"]
#: The operands in order: a, b and the result.
OPERANDS: tuple[Operand, Operand, Operand] = ("a", "b", "d")

#: One local GEMM call of a kernel: (count, m, n, k of one call, whether it accumulates into its output)
GemmShape = tuple[int, float, float, float, bool]


@dataclasses.dataclass(frozen=True)
class Kernel:
    """An algorithm on fixed operand roles. ``moving`` names the operand whose
    blocks travel the ring (AllGather+GEMM); ``schedule`` how it communicates
    (:data:`Schedule`: allgather, reduce_scatter and summa have a "one_shot"
    one; allgather and reduce_scatter a "bidirectional" one)."""

    algorithm: str
    a: Role
    b: Role
    d: Role
    moving: Operand | None = None
    schedule: Schedule = "ring"

    def role(self, operand: Operand) -> Role:
        return {"a": self.a, "b": self.b, "d": self.d}[operand]


def leads(operand: Operand, dim: Role, transposed: bool) -> bool:
    """Whether ``dim`` is the leading axis of ``operand`` as stored (a: M x K, b: K x N; or transposed).

    >>> leads("a", "K", False), leads("a", "K", True), leads("b", "K", False)
    (False, True, True)
    """
    stored = {"a": "MK", "b": "KN", "d": "MN"}[operand]
    return dim == (stored[1] if transposed else stored[0])


def ring_schedules(rings: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
    """A ring algorithm's kernels under each schedule: ring, one-shot, bidirectional."""
    return (*rings, *(dataclasses.replace(kern, schedule="one_shot") for kern in rings),
            *(dataclasses.replace(kern, schedule="bidirectional") for kern in rings))


@dataclasses.dataclass(frozen=True)
class Problem1D:
    """Sizes of one product, for costing."""

    m: int
    n: int
    k: int
    p: int
    itemsize: int
    acc_itemsize: int
    grid: tuple[int, int] | None = None  # (rows, cols) of the process grid, when one is in use
    #: the grid's rank order (``ProcessGrid.layout``): "row" (rank = r*cols + c) or "col" (rank = r + c*rows); which
    #: ranks keep a part of their own block in a move between the grid and a 1-D split (:func:`dmatmul._moves.move`)
    grid_order: str = "row"
    #: the backend pads every dimension it splits to a whole number of equal blocks (JAX shards evenly), so
    #: padding travels and is multiplied like data: a plan is costed on the padded sizes (:meth:`padded`)
    pads: bool = False
    #: the bytes a rank may hold for this product (its blocks and its working buffers), or None: not limited.
    #: A backend sets it from its devices' memory (:func:`dmatmul._memory.plan_budget`); an algorithm whose
    #: memory is a choice (2.5-D SUMMA's layers) chooses within it
    memory: float | None = None

    def elements(self, operand: str) -> int:
        return {"a": self.m * self.k, "b": self.k * self.n, "c": self.m * self.n, "d": self.m * self.n}[operand]

    def padded(self, roles: Iterable[Role]) -> Problem1D:
        """The sizes a padding backend works on when the operands take ``roles``:
        each dimension a role splits over the ranks rounded up to a multiple of
        them; on the grid ("G") M up to its rows and N up to its columns (SUMMA
        cuts K in panels that need no padding). Without ``pads``: unchanged.

        >>> pr = Problem1D(1001, 1, 64, 8, 4, 4, pads=True).padded(["M", "N", "R"])
        >>> pr.m, pr.n, pr.k
        (1008, 8, 64)
        >>> pr = Problem1D(1001, 1, 64, 8, 4, 4, pads=True, grid=(2, 4)).padded(["G"])
        >>> pr.m, pr.n, pr.k
        (1002, 4, 64)
        """
        if not self.pads:
            return self
        roles = set(roles)
        up = lambda size, parts: -(-size // parts) * parts  # noqa: E731
        sizes = {"M": self.m, "N": self.n, "K": self.k}
        for dim in sizes:
            if dim in roles:
                sizes[dim] = up(sizes[dim], self.p)
        if "G" in roles and self.grid is not None:
            rows, cols = self.grid
            sizes["M"], sizes["N"] = max(sizes["M"], up(self.m, rows)), max(sizes["N"], up(self.n, cols))
        return dataclasses.replace(self, m=sizes["M"], n=sizes["N"], k=sizes["K"])


class Algorithm:
    """One algorithm of the planner. A subclass (one module each, registered in
    :data:`dmatmul.algorithms.ALGORITHMS`) sets :attr:`name`, :attr:`kernels`
    and :attr:`grid`, and overrides the numbers that differ from these
    defaults (those of a kernel that moves nothing: the local GEMM).

    The planner adds what every algorithm shares: nothing moves on one rank,
    a kernel on replicated operands ("R", "R", "R") runs the whole GEMM once,
    and a bidirectional schedule halves each step's GEMM along
    :meth:`bidirectional_half`.
    """

    #: the name a user passes as ``algorithm=``
    name: str = ""
    #: the operand roles it takes, one kernel per (roles, schedule); their order breaks cost ties
    kernels: tuple[Kernel, ...] = ()
    #: whether it runs on a 2-D process grid (its operands' role "G"), and only there
    grid: bool = False
    #: one line on what it does, for the documentation of the registry
    summary: str = ""
    #: whether, named, it takes operands in any layout and re-lays them into its own (the planner's moves),
    #: its layouts being none a user can give (2.5-D SUMMA's layers)
    relays: bool = False

    def runs_on(self, problem: Problem1D) -> bool:
        """Whether it runs on ``problem``'s rank count (2.5-D SUMMA: only on q*q*c ranks)."""
        return True

    def refusal(self, problem: Problem1D) -> str | None:
        """Why it does not run on ``problem`` (named, a ValueError says it), or None."""
        return None

    def collectives(self, kernel: Kernel, p: int) -> float:
        """Whole collectives the kernel runs on ``p > 1`` ranks: one for a
        one-shot schedule, none for a ring (its P - 1 steps are messages)."""
        return 1.0 if kernel.schedule == "one_shot" else 0.0

    def cost(self, problem: Problem1D, kernel: Kernel, steps: float) -> tuple[float, float]:
        """(bytes received, messages) per rank of the kernel itself; ``steps``:
        the ring's point-to-point steps (0 where the kernel runs whole collectives)."""
        return 0.0, 0.0

    def copied(self, problem: Problem1D, kernel: Kernel, transposes: tuple[bool, bool]) -> float:
        """Bytes the kernel copies within a rank's memory besides its GEMMs, as XLA
        compiles the JAX kernel (``transposes``: whether a and b are stored
        transposed). An operand gathered along a stored axis that does not lead
        arrives as blocks side by side and is laid out once before its GEMM (a
        collective along the second axis copies strided and is slower still:
        the one-shot notes in :mod:`dmatmul.backends.jax._kernels.bodies`)."""
        return 0.0

    def dot_transposed(self, kernel: Kernel, transposes: tuple[bool, bool]) -> bool:
        """Whether the kernel's GEMMs contract their lhs's leading stored axis and
        their rhs's trailing one (``x^T y^T``): op(A) op(B) with both stored
        transposed. XLA's CPU dot runs such a dot as the plain GEMM plus a
        transposing copy, priced as a copy of its output (:func:`dmatmul._plan.kernel_copied`;
        one core, 8192 x 256 x 64 float32: plain 1.2 ms, so 3.9 ms, plain then
        its output transposed 4.2 ms; where an operand is the larger it may be
        transposed instead, and the copy is then dearer than priced)."""
        return transposes == (True, True)

    def gemm_shape(self, problem: Problem1D, kernel: Kernel) -> GemmShape:
        """The local GEMM calls a rank runs, on operands that are not all replicated."""
        m, n, k, p = problem.m, problem.n, problem.k, problem.p
        return (1, m / p if kernel.a == "M" else m, n / p if kernel.b == "N" else n, k, False)

    def bidirectional_half(self, kernel: Kernel) -> Role:
        """The dimension a bidirectional schedule halves in each step's GEMM: the result block summed."""
        return kernel.d

    def in_flight(self, kernel: Kernel) -> tuple[Operand, ...]:
        """The operands whose blocks the kernel holds in flight (what :meth:`extra_memory_bytes` counts;
        "d": partial results)."""
        return ()

    def extra_memory_bytes(self, m: int, n: int, k: int, p: int, itemsize: int, acc: int, *,
                           moving: str | None, one_shot: bool) -> float:
        """Memory a rank holds beyond its blocks of A, B and the result, ``p > 1`` (bytes)."""
        return 0.0

    def extra_bytes(self, problem: Problem1D, kernel: Kernel) -> float:
        """:meth:`extra_memory_bytes` of ``kernel`` on ``problem``; an algorithm whose
        memory is a choice (2.5-D SUMMA's layers) chooses within ``problem.memory``."""
        return self.extra_memory_bytes(problem.m, problem.n, problem.k, problem.p, problem.itemsize,
                                       problem.acc_itemsize, moving=kernel.moving,
                                       one_shot=kernel.schedule == "one_shot")

    def __repr__(self) -> str:
        return f"<algorithm {self.name!r}>"
