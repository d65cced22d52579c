"""``summa25d``: 2.5-D SUMMA. The P = q*q*c ranks form c layers of a q x q
grid; layer l multiplies the l-th 1/c of K with SUMMA on its grid (op(A)'s
panels along grid rows, op(B)'s along grid columns), then the layers' partial
results are summed and scattered along the layer axis (one reduce-scatter).

Against SUMMA on all P ranks, each SUMMA panel is c times shorter and the grid
sqrt(c) times narrower; the price is the layer reduce and the memory of a
partial result c times the size of a rank's share of D (the c copies of the
operands of the textbook algorithm: Solomonik and Demmel, "Communication-optimal
parallel 2.5D matrix multiplication and LU factorization algorithms", Euro-Par
2011). Its operand layouts (op(A) M over the grid rows, K over (grid columns,
layers); op(B) K over (grid rows, layers), N over the grid columns; the result
M over (grid rows, layers), N over the grid columns) are no distribution of
the contract's, so a product re-lays its operands into them (the planner's
moves) and its result out of them; a replicated operand is sliced there.
"""

from __future__ import annotations

import math

from .base import Algorithm, GemmShape, Kernel, Operand, Problem1D

#: the memory-dependent bound explain() compares a 2.5-D plan with: its formula and where it comes from
BOUND_FORMULA = "W >= m*n*k / (2*sqrt(2) * P * sqrt(M)) - M words, M the words a rank holds"
BOUND_SOURCE = ("Irony, Toledo and Tiskin, J. Parallel Distrib. Comput. 2004; Ballard, Demmel, Holtz and "
                "Schwartz, SIAM J. Matrix Anal. Appl. 2011")
#: the memory-independent bound it is also compared with (the larger of the two binds): the 3-D regime's
#: formula, where 2.5-D plans run (the 1-D and 2-D regimes: :func:`dmatmul._cost.lower_bound_words`)
INDEPENDENT_FORMULA = "W >= 3*(m*n*k/P)^(2/3) - (m*n + m*k + n*k)/P words (3-D regime; 1-D/2-D: _cost.lower_bound_words)"
INDEPENDENT_SOURCE = ("Ballard, Demmel, Holtz, Lipshitz and Schwartz, \"Brief announcement: strong scaling of matrix "
                      "multiplication algorithms and memory-independent communication lower bounds\", SPAA 2012; "
                      "tight constants: Al Daas, Ballard, Grigori, Kumar and Rouse, SPAA 2022")


def memory_dependent_bound(m: float, n: float, k: float, p: int, memory_words: float) -> float:
    """Words a rank must receive when it holds ``memory_words`` (:data:`BOUND_FORMULA`), at least 0: on
    few ranks with room for their share of the three matrices it is vacuous (0), as here on 8.

    >>> n = 4096
    >>> round(memory_dependent_bound(n, n, n, 4096, 3 * n * n / 4096)), memory_dependent_bound(n, n, n, 8, 3 * n * n / 8)
    (41222, 0.0)
    """
    return max(0.0, m * n * k / (2 * math.sqrt(2) * p * math.sqrt(memory_words)) - memory_words)


def layouts(p: int) -> list[tuple[int, int]]:
    """Every (q, c) with ``q * q * c == p``, ``q >= 2`` and ``c >= 2``.

    >>> layouts(8), layouts(32), layouts(4)
    ([(2, 2)], [(2, 8), (4, 2)], [])
    """
    return [(q, p // (q * q)) for q in range(2, p + 1) if q * q * 2 <= p and p % (q * q) == 0]


class Summa25D(Algorithm):
    name = "summa25d"
    summary = ("2.5-D SUMMA: c layers of a q x q grid, each running SUMMA on 1/c of K, the layers' partial "
               "results reduce-scattered along the layer axis")
    relays = True
    kernels = (
        Kernel("summa25d", "G", "G", "G"),
        # in each layer both panels gathered whole (two collectives), one GEMM, then the layer reduce
        Kernel("summa25d", "G", "G", "G", schedule="one_shot"),
    )
    #: the bytes a rank may hold beyond its blocks (the layers' partial result and panels), or None: what
    #: the product's memory allows (``Problem1D.memory``: DMATMUL_MEMORY_FRACTION of each device's memory,
    #: less the rank's blocks; not limited where the backend does not say). A setting for tools and tests
    memory_limit: float | None = None

    def runs_on(self, problem: Problem1D) -> bool:
        return bool(self._fitting(problem))

    def refusal(self, problem: Problem1D) -> str | None:
        if not layouts(problem.p):
            return (f"algorithm='summa25d' needs P = q*q*c ranks with a q x q grid (q >= 2) on c >= 2 layers "
                    f"(8 = 2*2*2, 12, 16, 18, 24, 32, ... ranks), but this product runs on {problem.p}; use "
                    "devices= with such a count, algorithm='summa' (any 2-D grid) or algorithm='auto'")
        if not self._fitting(problem):
            least = min(self._extra_of(problem, qc) for qc in layouts(problem.p))
            allowed = self._allowed(problem)
            return (f"algorithm='summa25d' needs {least / 1e6:.4g} MB per rank beyond its blocks for the layers' "
                    f"partial result and panels at the least, but {max(allowed or 0.0, 0.0) / 1e6:.4g} MB is "
                    "allowed (DMATMUL_MEMORY_FRACTION of each device's memory, default 0.8, less the rank's "
                    "blocks); raise DMATMUL_MEMORY_FRACTION, use more devices, or algorithm='summa' or 'auto'")
        return None

    def _allowed(self, problem: Problem1D) -> float | None:
        """The bytes a rank may hold beyond its blocks, None: not limited."""
        if self.memory_limit is not None:
            return self.memory_limit
        if problem.memory is None:
            return None
        blocks = (problem.m * problem.k + problem.k * problem.n + problem.m * problem.n) / problem.p
        return problem.memory - blocks * problem.itemsize

    def _extra_of(self, problem: Problem1D, qc: tuple[int, int]) -> float:
        return self._extra(problem.m, problem.n, problem.k, qc, problem.itemsize, problem.acc_itemsize, False)

    def _fitting(self, problem: Problem1D) -> list[tuple[int, int]]:
        """The (q, c) of :func:`layouts` whose extra memory fits what is allowed."""
        limit = self._allowed(problem)
        return [qc for qc in layouts(problem.p) if limit is None or self._extra_of(problem, qc) <= limit]

    def layers(self, problem: Problem1D) -> tuple[int, int]:
        """(q, c): the grid side and the number of layers, the fewest bytes
        received among those whose extra memory fits what is allowed
        (:attr:`memory_limit`, else ``problem.memory``); none fits: a
        ValueError (:meth:`refusal`)."""
        fitting = self._fitting(problem)
        if not fitting:
            raise ValueError(self.refusal(problem))
        return min(fitting, key=lambda qc: self._bytes(problem, qc))

    def extra_bytes(self, problem: Problem1D, kernel: Kernel) -> float:
        """The bytes a rank holds beyond its blocks, on the layers :meth:`layers` chooses."""
        return self._extra(problem.m, problem.n, problem.k, self.layers(problem), problem.itemsize,
                           problem.acc_itemsize, kernel.schedule == "one_shot")

    @staticmethod
    def _bytes(problem: Problem1D, qc: tuple[int, int]) -> float:
        """Elements received per rank: op(A)'s and op(B)'s panels in the layer, each
        received once, and the layer reduce-scatter of the (m/q) x (n/q) partial result."""
        q, c = qc
        m, n, k = problem.m, problem.n, problem.k
        return (q - 1) / q * (m / q) * (k / c) + (q - 1) / q * (k / c) * (n / q) + (c - 1) / c * (m / q) * (n / q)

    def collectives(self, kernel: Kernel, p: int) -> float:
        # the layer reduce-scatter; one-shot: also the two panel gathers
        return 3.0 if kernel.schedule == "one_shot" else 1.0

    def cost(self, problem: Problem1D, kernel: Kernel, steps: float) -> tuple[float, float]:
        q, c = self.layers(problem)
        nbytes = self._bytes(problem, (q, c)) * problem.itemsize
        return nbytes, 0.0 if kernel.schedule == "one_shot" else 2.0 * q

    def gemm_shape(self, problem: Problem1D, kernel: Kernel) -> GemmShape:
        q, c = self.layers(problem)
        m, n, k = problem.m, problem.n, problem.k
        if kernel.schedule == "one_shot":
            return (1, m / q, n / q, k / c, False)
        return (q, m / q, n / q, k / (c * q), True)

    def in_flight(self, kernel: Kernel) -> tuple[Operand, ...]:
        return ("a", "b", "d")  # a panel of each, and the layer's partial result

    @staticmethod
    def _extra(m: float, n: float, k: float, qc: tuple[int, int], itemsize: int, acc: int, one_shot: bool) -> float:
        q, c = qc
        panel_k = k / c if one_shot else k / (c * q)
        return (m / q) * (n / q) * acc + (m / q + n / q) * panel_k * itemsize

    def held_words(self, problem: Problem1D, one_shot: bool) -> float:
        """Words a rank holds in the kernel: its blocks of op(A), op(B) and the
        result, the layer's partial result and the panels (the bound's M)."""
        m, n, k, p = problem.m, problem.n, problem.k, problem.p
        extra = self._extra(m, n, k, self.layers(problem), problem.itemsize, problem.acc_itemsize, one_shot)
        return (m * k + k * n + m * n) / p + extra / problem.itemsize

    def extra_memory_bytes(self, m: int, n: int, k: int, p: int, itemsize: int, acc: int, *,
                           moving: str | None, one_shot: bool) -> float:
        q, c = self.layers(Problem1D(m, n, k, p, itemsize, acc))
        return self._extra(m, n, k, (q, c), itemsize, acc, one_shot)


ALGORITHM = Summa25D()
