"""Backend-neutral planning: which algorithm runs, and what moves first.

Every operand is described by its *role*: which logical dimension of the
product ``D[M, N] = op(A)[M, K] @ op(B)[K, N]`` its distribution splits over
the ranks, or ``"R"`` when every rank holds it whole. Roles are read off the
distribution of the *stored* matrix and its transpose flag.

An algorithm ("kernel") takes operands in fixed roles. A plan is a kernel plus
the redistributions that bring each operand from its given role to the
kernel's (free when the given role is ``R``: a rank just slices what it
holds), and the result from the kernel's role to the requested one. Among all
plans the cheapest under the alpha-beta-gamma model of :mod:`dmatmul._cost`
is chosen; a named algorithm only admits plans that move nothing beyond the
algorithm's own collective.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterable, Iterator, Sequence

from . import _cost
from ._distribution import BlockNonCyclic, Distribution, Replicated, Slab
from .algorithms import ALGORITHMS, kernels as registered_kernels
from .algorithms.base import OPERANDS, SCHEDULES, Kernel, Operand, Problem1D, Role, Schedule

__all__ = [
    "Role", "Operand", "OPERANDS", "Kernel", "KERNELS", "Move", "Plan", "Problem1D", "role_of", "roles_of",
    "role_dist", "kernel_cost", "gemm_calls", "model_time", "on_grid_roles", "plans", "choose", "needs", "needs_message",
    "dist_for_role", "stored_dims", "ALGORITHMS", "Schedule", "SCHEDULES", "forced_schedule", "schedule",
    "kernel_collectives", "costed_plan", "exchange_cost", "grid_kernels",
]

_LOGICAL: dict[str, tuple[str, str]] = {"a": ("M", "K"), "b": ("K", "N"), "d": ("M", "N")}


def stored_dims(operand: Operand, transposed: bool) -> tuple[str, str]:
    """Logical dimension names of the stored matrix's (rows, cols).

    >>> stored_dims("a", False), stored_dims("a", True), stored_dims("b", True)
    (('M', 'K'), ('K', 'M'), ('N', 'K'))
    """
    dims = _LOGICAL[operand]
    return (dims[1], dims[0]) if transposed else dims


def role_of(dist: Distribution, operand: Operand, transposed: bool, nranks: int) -> Role | None:
    """The 1-D role of a distribution, or None when it needs a 2-D grid.

    ``BlockNonCyclic`` on a ``(P, 1)`` or ``(1, P)`` grid with
    ``first_process=(0, 0)`` splits exactly as a Slab does, so it gets the
    Slab's role. On one rank every distribution is ``R``.

    >>> role_of(Slab.X, "a", True, 4)
    'K'
    """
    if nranks == 1 or isinstance(dist, Replicated):
        return "R"
    dims = stored_dims(operand, transposed)
    if isinstance(dist, Slab):
        return dims[dist.dim]  # type: ignore[return-value]
    if isinstance(dist, BlockNonCyclic) and dist.first_process == (0, 0):
        split = [i for i, s in enumerate(dist.grid.shape) if s > 1]
        if len(split) == 1:
            return dims[split[0]]  # type: ignore[return-value]
    return None


def roles_of(
    dists: Sequence[Distribution], transposes: tuple[bool, bool], nranks: int
) -> dict[str, Role]:
    """The roles of ``(a, b, result)``; a grid layout that is not 1-D is ``"G"``.

    >>> roles_of((Slab.X, Slab.Y, Slab.X), (False, False), 4)
    {'a': 'M', 'b': 'N', 'd': 'M'}
    """
    ts = (transposes[0], transposes[1], False)
    return {op: role_of(d, op, t, nranks) or "G" for op, d, t in zip(OPERANDS, dists, ts)}


def role_dist(operand: Operand, role: Role, transposed: bool) -> Distribution:
    """The 1-D distribution of the stored operand that gives it ``role``.

    >>> role_dist("a", "K", True)
    Slab.X
    """
    if role == "R":
        return Replicated()
    return Slab(stored_dims(operand, transposed).index(role))


def dist_for_role(operand: Operand, role: Role, transposed: bool) -> str:
    """How a user writes a role as a distribution of the stored operand."""
    if role == "R":
        return "Replicated()"
    if role == "G":
        return "a 2-D grid distribution"
    return "Slab.X" if stored_dims(operand, transposed).index(role) == 0 else "Slab.Y"


#: The built-in kernels (:func:`dmatmul.algorithms.kernels`): each schedule's in turn (rings, "one_shot" whole
#: collectives, "bidirectional" rings half each way). A backend that runs only some leaves the others out.
KERNELS: tuple[Kernel, ...] = registered_kernels()


_FORCED: contextvars.ContextVar[Schedule | Kernel | None] = contextvars.ContextVar("dmatmul_schedule", default=None)


def forced_schedule() -> Schedule | Kernel | None:
    """The schedule (or the one kernel) :func:`schedule` forces now, or None (the model picks)."""
    return _FORCED.get()


@contextlib.contextmanager
def schedule(name: Schedule | Kernel | None) -> Iterator[None]:
    """Plan every kernel of schedule ``name`` with it alone (None: the model picks; a :class:`Kernel`: it alone,
    with its moves: ``dmatmul bench --sweep``), for the checker and benchmarks; cached apart by the backends.

    >>> pr = Problem1D(64, 64, 64, 8, 4, 4)
    >>> roles = {"a": "M", "b": "N", "d": "M"}
    >>> with schedule("ring"):
    ...     plans(pr, roles, _cost.model_for("cpu"))[0].kernel.schedule
    'ring'
    """
    if name is not None and not isinstance(name, Kernel) and name not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES} or None, got {name!r}")
    token = _FORCED.set(name)
    try:
        yield
    finally:
        _FORCED.reset(token)


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


@dataclasses.dataclass(frozen=True)
class Plan:
    """A kernel with the moves around it and its modelled cost per rank."""

    kernel: Kernel
    moves: tuple[Move, ...]
    kernel_bytes: float
    kernel_messages: float
    flops: float
    time: float
    #: whole collectives of the kernel (:func:`kernel_collectives`; its bytes then travel in them)
    kernel_collectives: float = 0.0

    @property
    def algorithm(self) -> str:
        return self.kernel.algorithm

    @property
    def nbytes(self) -> float:
        return self.kernel_bytes + sum(m.nbytes for m in self.moves)

    @property
    def messages(self) -> float:
        """Point-to-point steps (each one collective call of its own)."""
        return self.kernel_messages + sum(m.messages for m in self.moves)

    @property
    def collectives(self) -> float:
        """Whole collectives (one call each, however many steps inside)."""
        return self.kernel_collectives + sum(m.collectives for m in self.moves)

    def describe_messages(self) -> str:
        """``7 messages``, ``1 collective``, ``7 messages and 2 collectives``."""
        def n(count: float, what: str) -> str:
            return f"{count:.0f} {what}{'' if round(count) == 1 else 's'}"
        parts = [n(self.messages, "message")] if self.messages or not self.collectives else []
        if self.collectives:
            parts.append(n(self.collectives, "collective"))
        return " and ".join(parts)

    @property
    def communication_free_moves(self) -> bool:
        return all(m.nbytes == 0 for m in self.moves)


def kernel_collectives(kernel: Kernel, p: int) -> float:
    """Whole collectives the kernel runs on ``p`` ranks: one for a one-shot
    schedule and for ``allreduce`` (one ``psum``), none for the rings.

    >>> kernel_collectives(Kernel("allreduce", "K", "K", "R"), 8), kernel_collectives(KERNELS[3], 8)
    (1.0, 0.0)
    """
    if p <= 1:
        return 0.0
    return ALGORITHMS[kernel.algorithm].collectives(kernel, p)


def kernel_cost(problem: Problem1D, kernel: Kernel) -> tuple[float, float, float]:
    """(bytes received, messages, flops) per rank of the kernel itself. A
    kernel of :func:`kernel_collectives` receives its bytes in those whole
    collectives and sends no point-to-point messages."""
    m, n, k, p = problem.m, problem.n, problem.k, problem.p
    roles = (kernel.a, kernel.b, kernel.d)
    # a rank computes its share of the product, or all of it when nothing splits it
    flops = 2.0 * m * n * k / (1 if roles == ("R", "R", "R") else p)
    steps = 0 if kernel_collectives(kernel, p) else (p - 1) * (2 if kernel.schedule == "bidirectional" else 1)
    nbytes, messages = ALGORITHMS[kernel.algorithm].cost(problem, kernel, steps)
    return nbytes, messages, flops


def gemm_calls(problem: Problem1D, kernel: Kernel) -> tuple[tuple[int, float, float], ...]:
    """``(count, flops, bytes)`` of the local GEMMs a rank runs in ``kernel``:
    ``bytes`` are the memory one call touches (its operands read, its output
    written; an output accumulated into, step after step, read and written).
    Their flops add up to :func:`kernel_cost`'s.

    A ring whose travelling operand is split along K accumulates ``P`` GEMMs
    of inner dimension K/P into the whole local result: for a thin K each is
    bound by memory, not flops (:meth:`dmatmul._cost.MachineModel.gemm`).

    >>> pr = Problem1D(4096, 4096, 32, 8, 4, 4)
    >>> gemm_calls(pr, Kernel("allgather", "M", "K", "M", moving="b"))  # 8 steps of (512 x 4) @ (4 x 4096)
    ((8, 16777216.0, 16850944.0),)
    >>> gemm_calls(pr, Kernel("local", "M", "R", "M"))  # one (512 x 32) @ (32 x 4096)
    ((1, 134217728.0, 8978432.0),)
    """
    m, n, k = problem.m, problem.n, problem.k
    roles = (kernel.a, kernel.b, kernel.d)
    alg = ALGORITHMS[kernel.algorithm]
    shape = (1, m, n, k, False) if roles == ("R", "R", "R") else alg.gemm_shape(problem, kernel)
    count, mc, nc, kc, accumulate = shape
    if kernel.schedule == "bidirectional" and roles != ("R", "R", "R"):
        # each step's GEMM twice, on half of the travelling block (allgather) or of the result block summed
        half = alg.bidirectional_half(kernel)
        count = 2 * count
        mc, nc, kc = (x / 2 if dim == half else x for x, dim in ((mc, "M"), (nc, "N"), (kc, "K")))
    nbytes = (mc * kc + kc * nc) * problem.itemsize + mc * nc * problem.acc_itemsize * (2 if accumulate else 1)
    return ((count, 2.0 * mc * nc * kc, nbytes),)


def model_time(problem: Problem1D, kernel: Kernel, model: _cost.MachineModel, *, messages: float,
               nbytes: float, collectives: float = 0.0, collective_bytes: float = 0.0,
               overlapped_bytes: float = 0.0, copied: float = 0.0) -> float:
    """A plan's modelled time: latency and bytes received (``messages``
    point-to-point steps and ``nbytes`` in them, ``collectives`` whole ones
    receiving ``collective_bytes``), the bytes its moves copy in memory
    besides (``copied``: :attr:`Move.copied`), plus its local GEMMs on the roofline
    (:func:`gemm_calls`). Where the model overlaps a ring's transfers with
    its GEMMs, the ``overlapped_bytes`` of ``nbytes`` (the ring's own) take
    the longer of the two, plus one step of the shorter, not their sum."""
    calls = gemm_calls(problem, kernel)
    local = sum(count * model.gemm(flops, touched) for count, flops, touched in calls)
    # the ring's own bytes, half each way where two rings run on full-duplex links
    both_ways = kernel.schedule == "bidirectional"
    ring = model.ring_beta(problem.p, both_ways=both_ways) * overlapped_bytes
    comm = model.beta * (nbytes - overlapped_bytes) + ring
    if model.overlap and overlapped_bytes and kernel.schedule != "one_shot":
        steps = max(calls[0][0] // (2 if both_ways else 1), 1)  # (both ways: two GEMMs a step)
        comm -= ring
        local = max(ring, local) + min(ring, local) / steps
    return (model.alpha * messages + model.calpha * collectives + comm + model.cbeta * collective_bytes + local
            + model.mem_beta * copied)


def on_grid_roles(roles: dict[str, Role], grid_ops: Iterable[str]) -> dict[str, Role]:
    """The roles SUMMA sees: an operand laid out on the product's process grid
    (``grid_ops``) is ``"G"`` there, whatever 1-D role it has for the other
    kernels (a ``BlockNonCyclic`` on a ``(P, 1)`` grid splits as ``Slab.X``
    does, and is a grid layout all the same); a replicated one stays ``"R"``.

    >>> on_grid_roles({"a": "M", "b": "R", "d": "M"}, {"a", "b", "d"})
    {'a': 'G', 'b': 'R', 'd': 'G'}
    """
    ops = set(grid_ops)
    return {op: "G" if op in ops and role != "R" else role for op, role in roles.items()}


def grid_kernels(kernels: Sequence[Kernel]) -> list[Kernel]:
    """The ``kernels`` a product whose operands lie on a 2-D process grid runs:
    it runs on that grid's mesh, which is not 2.5-D SUMMA's mesh of layers
    (that one only runs named there, its operands first re-laid as Slab.X).

    >>> sorted({k.algorithm for k in grid_kernels(KERNELS)}) == sorted(set(ALGORITHMS) - {"summa25d"})
    True
    """
    return [kern for kern in kernels if not ALGORITHMS[kern.algorithm].relays]


def plans(
    problem: Problem1D, roles: dict[str, Role], model: _cost.MachineModel, native: frozenset[str] = frozenset(),
    kernels: Sequence[Kernel] | None = None, grid_ops: frozenset[str] = frozenset(),
    transposes: tuple[bool, bool] = (False, False),
) -> list[Plan]:
    """Every plan for operands in ``roles`` (keys "a", "b", "d"), cheapest first.

    ``kernels``: what the backend can run (a subset of the registered ones,
    :func:`dmatmul.algorithms.kernels`; None: all of them). SUMMA is a candidate only on a process grid; ``grid_ops`` names the
    operands laid out on that grid (SUMMA takes them from there even where
    their role is a 1-D one: :func:`on_grid_roles`), ``native`` those whose
    grid layout is already the one SUMMA uses (no move). ``transposes``: how a
    and b are stored, which decides how each move runs (:func:`move`).
    """
    out = []
    kernels = registered_kernels() if kernels is None else kernels
    grid_roles = on_grid_roles(roles, grid_ops)
    forced = forced_schedule()
    if isinstance(forced, Kernel):
        kernels = [kern for kern in kernels if kern == forced]
    elif forced is not None:  # the kernels with a schedule of that name run only it
        both = {kern.algorithm for kern in kernels if kern.schedule == forced}
        kernels = [kern for kern in kernels if kern.algorithm not in both or kern.schedule == forced]
    for kernel in kernels:
        on_grid = ALGORITHMS[kernel.algorithm].grid
        if (on_grid and problem.grid is None) or not ALGORITHMS[kernel.algorithm].runs_on(problem):
            continue
        given = grid_roles if on_grid else roles
        sized = problem.padded((*given.values(), kernel.a, kernel.b, kernel.d))
        mine = native if on_grid else frozenset()
        candidates = [
            move(sized, "a", given["a"], kernel.a, native="a" in mine, transposed=transposes[0]),
            move(sized, "b", given["b"], kernel.b, native="b" in mine, transposed=transposes[1]),
            # the epilogue (alpha, beta*C, bias) runs after the result's move, where C lies
            move(sized, "d", kernel.d, given["d"], native="d" in mine),
        ]
        kb, km, flops = kernel_cost(sized, kernel)
        kc = kernel_collectives(kernel, sized.p)
        moves = tuple(mv for mv in candidates if mv.collective != "none")
        out.append(costed_plan(sized, kernel, moves, kb, km, kc, flops, model))
    order = {name: i for i, name in enumerate(ALGORITHMS)}
    out.sort(key=lambda pl: (pl.time, len(pl.moves), order[pl.algorithm]))
    return out


def costed_plan(problem: Problem1D, kernel: Kernel, moves: tuple[Move, ...], kb: float, km: float, kc: float,
            flops: float, model: _cost.MachineModel) -> Plan:
    """The plan of ``kernel`` (its bytes ``kb``, messages ``km``, collectives
    ``kc``: :func:`kernel_cost`, :func:`kernel_collectives`) and ``moves``, with
    its modelled time: the bytes of whole collectives (``kc``, a move's
    ``collectives``) at their own cost, the ring's own beside its GEMMs."""
    ring_bytes = sum(mv.nbytes for mv in moves if not mv.collectives) + (0.0 if kc else kb)
    coll_bytes = sum(mv.nbytes for mv in moves if mv.collectives) + (kb if kc else 0.0)
    time = model_time(problem, kernel, model, messages=km + sum(mv.messages for mv in moves), nbytes=ring_bytes,
                      collectives=kc + sum(mv.collectives for mv in moves), collective_bytes=coll_bytes,
                      overlapped_bytes=0.0 if kc else kb, copied=sum(mv.copied for mv in moves))
    return Plan(kernel, moves, kb, km, flops, time, kc)


def choose(
    problem: Problem1D,
    roles: dict[str, Role],
    *,
    algorithm: str,
    model: _cost.MachineModel,
    transposes: tuple[bool, bool],
    native: frozenset[str] = frozenset(),
    kernels: Sequence[Kernel] | None = None, backend: str = "",
    fit_roles: dict[str, Role] | None = None,
    grid_ops: frozenset[str] = frozenset(),
    given: str | None = None,
) -> Plan:
    """The cheapest plan, or the cheapest of a named algorithm that fits as given.

    ``fit_roles``: the roles a named algorithm must fit, where they differ from
    the ``roles`` plans are costed to (a result delivered otherwise than its
    distribution says, e.g. replicated); default ``roles``. ``grid_ops``: the
    operands on the product's process grid (see :func:`plans`).

    Raises ValueError naming the distributions the algorithm needs when it
    does not fit (``backend``: named in that message; ``given``: the given
    triple as the user wrote it, named there instead of its roles).
    """
    if algorithm != "auto" and ALGORITHMS[algorithm].refusal(problem):
        raise ValueError(ALGORITHMS[algorithm].refusal(problem))
    candidates = plans(problem, roles, model, native, kernels, grid_ops, transposes)
    if not candidates:  # (only where schedule() forces a kernel that runs nowhere here)
        raise ValueError(f"no kernel runs these distributions as forced ({forced_schedule()})")
    if algorithm == "auto":
        return candidates[0]
    fit_roles = roles if fit_roles is None else fit_roles
    as_given = candidates if fit_roles == roles else plans(
        problem, fit_roles, model, native, kernels, grid_ops, transposes)
    # a grid algorithm also takes grid operands whose blocking or orientation it must first adjust
    # (transposes, other block sizes on the same grid); every other named algorithm runs on its operands as given
    on_grid, relays = ALGORITHMS[algorithm].grid, ALGORITHMS[algorithm].relays
    fits = {pl.kernel for pl in as_given if pl.algorithm == algorithm and (
        relays or pl.communication_free_moves or (on_grid and all(m.src == m.dst == "G" for m in pl.moves)))}
    fitting = [pl for pl in candidates if pl.kernel in fits]
    if fitting:
        return fitting[0]
    raise ValueError(needs_message(algorithm, fit_roles if given is None else given, transposes, kernels, backend))


def needs(algorithm: str, transposes: tuple[bool, bool], kernels: Sequence[Kernel] | None = None) -> list[str]:
    """The distribution triples (a, b, result) an algorithm accepts as given.

    >>> needs("reduce_scatter", (False, False))
    ['(a=Slab.Y, b=Slab.X, result=Slab.X)', '(a=Slab.Y, b=Slab.X, result=Slab.Y)']
    """
    ta, tb = transposes
    out = []
    for kernel in registered_kernels() if kernels is None else kernels:
        if kernel.algorithm == algorithm:
            out.append(
                f"(a={dist_for_role('a', kernel.a, ta)}, b={dist_for_role('b', kernel.b, tb)}, "
                f"result={dist_for_role('d', kernel.d, False)})"
            )
    return list(dict.fromkeys(out))  # a ring and its one-shot schedule take the same triple


def needs_message(
    algorithm: str, roles: dict[str, Role] | str, transposes: tuple[bool, bool],
    kernels: Sequence[Kernel] | None = None, backend: str = "",
) -> str:
    """Why a named algorithm does not fit, and the triples it needs.

    ``roles``: the given operands' roles, or the given triple already written out.
    """
    ta, tb = transposes
    given = roles if isinstance(roles, str) else (
        f"(a={dist_for_role('a', roles['a'], ta)}, b={dist_for_role('b', roles['b'], tb)}, "
        f"result={dist_for_role('d', roles['d'], False)})"
    )
    on = f" on the {backend} backend" if backend else ""
    kernels = registered_kernels() if kernels is None else kernels
    options = needs(algorithm, transposes, kernels)
    if not options or all(k.a == k.b == k.d == "G" for k in kernels if k.algorithm == algorithm):
        return (
            f"algorithm={algorithm!r} does not fit the distributions {given}{on}: it needs a, b and "
            "the result on one shared 2-D ProcessGrid (BlockCyclic or BlockNonCyclic); or use algorithm='auto'"
        )
    slab_ab = any(k.algorithm == algorithm and "G" not in (k.a, k.b) for k in kernels)
    also = " (Replicated() also fits wherever a Slab is needed for a or b)" if slab_ab else ""
    return (
        f"algorithm={algorithm!r} does not fit the distributions {given} "
        f"(transpose_a={ta}, transpose_b={tb}){on}; it needs one of: {', '.join(options)}{also}; "
        "or use algorithm='auto'"
    )


def versus_bound(nbytes: float, bound: float, replicated: Sequence[str]) -> str:
    """The modelled bytes against the lower bound, as ``explain()`` says it. The
    bound assumes every rank starts with an equal share of each matrix: an
    operand in ``replicated`` (held whole by every rank) breaks that, and the
    bound says nothing then.

    >>> versus_bound(2048, 1024, []), versus_bound(0, 1024, ["b"])
    ('2.00x the bound', 'the bound does not apply: b is replicated (held whole by every rank)')
    """
    if bound <= 0:  # one rank (or nothing to receive): nothing to measure against
        return "bound is 0"
    if replicated:
        what = " and ".join(replicated)
        return f"the bound does not apply: {what} {'is' if len(replicated) == 1 else 'are'} replicated " \
               "(held whole by every rank)"
    return f"{nbytes / bound:.2f}x the bound"


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"
