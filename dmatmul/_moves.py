"""Moves: an operand brought from one role to another, priced as it runs.

A plan (:mod:`dmatmul._plan`) is a kernel plus the redistributions that bring
each operand from its given role (:mod:`dmatmul._roles`) to the kernel's, and
the result from the kernel's role to the requested one. :func:`move` prices
each one per rank as the JAX backend runs it (bytes received, point-to-point
rounds, whole collectives, bytes copied in memory).
"""

from __future__ import annotations

import dataclasses

from ._roles import stored_dims
from .algorithms.base import Problem1D, Role

__all__ = ["Move", "move", "exchange_cost"]


@dataclasses.dataclass(frozen=True)
class Move:
    """One redistribution of an operand between roles."""

    operand: str
    src: Role
    dst: Role
    collective: str
    nbytes: float
    messages: float
    #: whole collectives (1: one all-gather or all-to-all call; its bytes then cost ``collective_beta``)
    collectives: float = 0.0
    #: bytes a rank copies within its own memory besides: an element exchange (:func:`move`) cuts each part it
    #: sends out of its block and writes each part it receives into its new block, at the memory rate
    #: (:attr:`dmatmul._cost.MachineModel.mem_beta`)
    copied: float = 0.0

    def describe(self) -> str:
        return f"{self.operand}: {self.src} -> {self.dst} by {self.collective} ({_fmt_bytes(self.nbytes)}/rank)"


def _blocks(
    problem: Problem1D, operand: str, role: Role, transposed: bool = False, kernel: bool = False
) -> tuple[int, int, list[tuple[int, int]]] | None:
    """How ``role`` cuts the *stored* ``operand`` (transposed or not: a move
    acts on the array as stored) into blocks: the blocks each way and each
    rank's ``(row block, column block)``; None for ``R`` and for a grid role
    without a grid. A grid role is the grid layout of the stored array
    (``BlockNonCyclic`` on the product's grid), or, ``kernel``, SUMMA's layout
    of op(X): for a transposed operand that grid transposed on the stored
    array (its rows cut by the grid's columns, rank (i, j) holding block (j, i)).

    >>> _blocks(Problem1D(8, 8, 8, 8, 4, 4), "b", "K", transposed=True)[:2]  # K: the stored columns
    (1, 8)
    >>> _blocks(Problem1D(8, 8, 8, 8, 4, 4, grid=(2, 4)), "a", "G", True, kernel=True)[2][:3]
    [(0, 0), (1, 0), (2, 0)]
    """
    p = problem.p
    if role == "G":
        if problem.grid is None:
            return None
        rows, cols = problem.grid
        if problem.grid_order == "col":
            at = [(r % rows, r // rows) for r in range(p)]
        else:
            at = [(r // cols, r % cols) for r in range(p)]
        if transposed and kernel:
            return cols, rows, [(j, i) for i, j in at]
        return rows, cols, at
    if role == "R":
        return None
    if stored_dims(operand, transposed)[0] == role:  # type: ignore[arg-type]
        return p, 1, [(r, 0) for r in range(p)]
    return 1, p, [(0, r) for r in range(p)]


def exchange_cost(
    problem: Problem1D, operand: str, src: Role, dst: Role, transposed: bool = False
) -> tuple[float, float] | None:
    """The rounds of ``ppermute`` and the bytes the busiest rank receives in an
    element exchange (the JAX backend's ``_exchange.redistribute``) of
    ``operand`` (stored ``transposed`` or not) from ``src``'s blocks to
    ``dst``'s, or None where either is no block split (``R``, a grid role
    without a grid). A grid ``src`` is the stored array's grid layout, a grid
    ``dst`` SUMMA's (:func:`_blocks`): for a and b the kernel's side.

    Each rank sends every other rank the part of its block that rank's new
    block holds, one partner a round: as many rounds as a rank has partners
    (its block meets that many blocks of the other split), one fewer where
    every rank keeps a part of its own (a row slab to a column slab: 7 rounds
    of 1/64 of the matrix on 8 ranks; a row slab to a row-ordered 2x4 grid: 3
    rounds of a quarter of a block, column-ordered: 4, where some rank's new
    block comes whole from others).

    >>> pr = Problem1D(64, 64, 64, 8, 4, 4, grid=(2, 4))
    >>> exchange_cost(pr, "d", "M", "N"), exchange_cost(pr, "d", "M", "G"), exchange_cost(pr, "d", "N", "G")
    ((7.0, 1792.0), (3.0, 1536.0), (2.0, 2048.0))
    """
    one, two = _blocks(problem, operand, src, transposed), _blocks(problem, operand, dst, transposed, kernel=True)
    if one is None or two is None:
        return None
    (r1, c1, at1), (r2, c2, at2) = one, two
    rows, cols = max(r1, r2), max(c1, c2)  # the blocks of both (the counts divide each other: P and the grid's)
    chunk = problem.elements(operand) * problem.itemsize / (rows * cols)
    sends, gets = (rows // r1) * (cols // c1), (rows // r2) * (cols // c2)

    def meet(i1: int, n1: int, i2: int, n2: int, n: int) -> bool:
        return i1 * (n // n1) < (i2 + 1) * (n // n2) and i2 * (n // n2) < (i1 + 1) * (n // n1)

    keep = all(meet(a[0], r1, b[0], r2, rows) and meet(a[1], c1, b[1], c2, cols) for a, b in zip(at1, at2))
    return float(max(sends, gets) - keep), chunk * (gets - keep)


def move(
    problem: Problem1D, operand: str, src: Role, dst: Role, *, native: bool = False, transposed: bool = False
) -> Move:
    """Cost of bringing ``operand`` from role ``src`` to ``dst`` (per rank), as
    the JAX backend runs it (``_exchange.redistribute``; its compiled HLO:
    tests/test_grid.py::test_each_move_is_priced_as_it_compiles):

    * from ``R``: a local slice, a copy of the rank's block;
    * a split of the stored rows (``d``: ``M``; a transposed ``b``: ``N``)
      to ``R``: one all-gather (a whole collective), no copy;
    * any other split (columns, a grid) to ``R``: an element exchange into
      row blocks (below), then that all-gather (XLA gathers columns through
      copies that transpose what it gathers, slower than the two);
    * between two splits: an element exchange, the rounds of ``ppermute`` of
      :func:`exchange_cost`. A rank fills its new block with zeros, cuts each
      part it sends out of its block, writes each part it receives into its
      new block and copies its own part across: ``copied`` = two blocks and
      the bytes it receives (one block of zeros, and each byte of the new
      block written once and read once from where it was).

    Two "G" roles agree only when the operand's grid layout already is the
    one the kernel needs (``native``); otherwise a general redistribution
    moves it, in as many rounds as a rank has partners (P - 1). On one rank
    the 1x1 grid's layout is the whole matrix, as ``R`` is: nothing moves
    between them.

    ``transposed``: the operand is stored transposed; what runs depends on how
    the stored array is split (a transposed ``b`` on ``Slab.Y``, role ``K``,
    splits stored columns: to ``R`` an exchange and an all-gather, where an
    untransposed ``b`` in role ``K`` takes the all-gather alone).

    >>> move(Problem1D(8, 8, 8, 1, 4, 4, grid=(1, 1)), "d", "G", "R").collective
    'none'
    >>> mv = move(Problem1D(64, 64, 64, 8, 4, 4, grid=(2, 4)), "d", "G", "R")
    >>> mv.collective, mv.messages, mv.collectives, mv.nbytes
    ('exchange + all-gather', 3.0, 1.0, 15872.0)
    >>> pr = Problem1D(64, 64, 64, 8, 4, 4)
    >>> move(pr, "b", "K", "R").collective, move(pr, "b", "K", "R", transposed=True).collective
    ('all-gather', 'exchange + all-gather')
    """
    p = problem.p
    size = problem.elements(operand) * problem.itemsize
    if p == 1 and {src, dst} <= {"R", "G"}:
        return Move(operand, src, dst, "none", 0.0, 0.0)
    block = size / p
    if src == "G" and dst == "G" and not native:
        exchanged = (p - 1) / p**2 * size
        return Move(operand, src, dst, "all-to-all", exchanged, p - 1, copied=2 * block + exchanged)
    if src == dst:
        return Move(operand, src, dst, "none", 0.0, 0.0)
    if src == "R":
        return Move(operand, src, dst, "local slice", 0.0, 0.0, copied=block)
    rows: Role = stored_dims(operand, transposed)[0]  # type: ignore[arg-type, assignment]
    if dst == "R":
        gathered = (p - 1) / p * size
        if src == rows:
            return Move(operand, src, dst, "all-gather", gathered, 0.0, 1.0)
        ex = exchange_cost(problem, operand, src, rows, transposed)
        if ex is None:  # a grid role without its grid: priced as the busiest grid order's exchange
            ex = (p - 1.0, block)
        # the exchange's bytes are priced with the gather's, at a whole collective's rate
        return Move(operand, src, dst, "exchange + all-gather", ex[1] + gathered, ex[0], 1.0,
                    copied=2 * block + ex[1])
    ex = exchange_cost(problem, operand, src, dst, transposed)
    if ex is None:
        ex = (p - 1.0, block)
    return Move(operand, src, dst, "exchange", ex[1], ex[0], copied=2 * block + ex[1])



def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"
