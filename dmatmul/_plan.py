"""Backend-neutral planning: which algorithm runs, and what moves first.

Every operand is described by its *role* (:mod:`dmatmul._roles`): which
logical dimension of the product its distribution splits over the ranks, or
``"R"`` when every rank holds it whole.

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
from collections.abc import Iterator, Sequence

from . import _cost
from ._moves import Move, move
from ._roles import dist_for_role, on_grid_roles
from .algorithms import ALGORITHMS, kernels as registered_kernels
from .algorithms.base import OPERANDS, SCHEDULES, Kernel, Operand, Problem1D, Role, Schedule

__all__ = [
    "Role", "Operand", "OPERANDS", "Kernel", "KERNELS", "Plan", "Problem1D", "kernel_cost", "gemm_calls",
    "model_time", "plans", "choose", "needs", "needs_message", "ALGORITHMS", "Schedule", "SCHEDULES",
    "forced_schedule", "schedule", "kernel_collectives", "costed_plan", "grid_kernels", "TERMS", "time_terms", "kernel_copied",
]


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
    #: what the modelled time multiplies each constant of :data:`TERMS` by, in that order (:func:`time_terms`)
    terms: tuple[float, ...] = dataclasses.field(default=(), compare=False)
    #: the bytes the kernel itself copies in memory (:meth:`dmatmul.algorithms.base.Algorithm.copied`)
    kernel_copied: float = 0.0

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


def kernel_copied(problem: Problem1D, kernel: Kernel, transposes: tuple[bool, bool] = (False, False)) -> float:
    """Bytes the kernel copies in a rank's memory besides its GEMMs
    (:meth:`dmatmul.algorithms.base.Algorithm.copied`), and the outputs of
    GEMMs that XLA's CPU dot transposes
    (:meth:`~dmatmul.algorithms.base.Algorithm.dot_transposed`); none on one
    rank, or where every operand is whole.

    >>> kernel_copied(Problem1D(1024, 1024, 1024, 8, 4, 4), Kernel("allgather", "K", "N", "N", moving="a", schedule="one_shot"))
    4194304.0
    """
    if problem.p <= 1 or (kernel.a, kernel.b, kernel.d) == ("R", "R", "R"):
        return 0.0
    alg = ALGORITHMS[kernel.algorithm]
    copied = alg.copied(problem, kernel, transposes)
    if alg.dot_transposed(kernel, transposes):  # its GEMMs' outputs, through a transposing copy
        count, mc, nc, _, _ = alg.gemm_shape(problem, kernel)
        copied += count * mc * nc * problem.acc_itemsize
    return copied


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


#: The constants of :class:`dmatmul._cost.MachineModel` a plan's modelled time is linear in, by the name of
#: the attribute that reads each (:func:`time_terms`)
TERMS: tuple[str, ...] = ("alpha", "calpha", "beta", "cbeta", "gamma", "mem_beta", "step_gamma")


def time_terms(problem: Problem1D, kernel: Kernel, model: _cost.MachineModel, *, messages: float,
               nbytes: float, collectives: float = 0.0, collective_bytes: float = 0.0,
               overlapped_bytes: float = 0.0, copied: float = 0.0) -> dict[str, float]:
    """What :func:`model_time` multiplies each constant of :data:`TERMS` by:
    messages, whole collectives, bytes received point to point and in whole
    collectives, the flops of the GEMMs bound by compute and the bytes of
    those bound by memory plus the bytes copied (which side of the roofline
    each GEMM is on is ``model``'s), and the flops of GEMMs cut into steps
    (``step_gamma``: more calls than one). Where the model does not overlap
    transfers with GEMMs, the time is ``sum(getattr(model, t) * terms[t])``,
    so a calibration can fit the constants to measured plans
    (:func:`dmatmul._cost.fit_terms`).

    >>> pr, kern = Problem1D(1024, 1024, 1024, 8, 4, 4), Kernel("allgather", "M", "N", "M", moving="b")
    >>> m = _cost.model_for("cpu", 8, calibrated=False)
    >>> t = time_terms(pr, kern, m, messages=7, nbytes=3.5 * 2**20)
    >>> t["alpha"], t["gamma"] == 2 * 1024**3 / 8
    (7.0, True)
    >>> abs(sum(getattr(m, k) * v for k, v in t.items()) - model_time(pr, kern, m, messages=7, nbytes=3.5 * 2**20)) < 1e-12
    True
    """
    calls = gemm_calls(problem, kernel)
    flops = sum(count * f for count, f, touched in calls if model.gamma * f >= model.mem_beta * touched)
    touched = sum(count * t for count, f, t in calls if model.gamma * f < model.mem_beta * t)
    # the ring's own bytes, at half the rate each way where two rings run on full-duplex links
    ring = model.ring_beta(problem.p, both_ways=kernel.schedule == "bidirectional") / model.beta \
        if model.beta else 1.0
    stepped = sum(count * f for count, f, _ in calls if count > 1)
    return {"alpha": float(messages), "calpha": float(collectives),
            "beta": float(nbytes - overlapped_bytes + ring * overlapped_bytes), "cbeta": float(collective_bytes),
            "gamma": float(flops), "mem_beta": float(touched + copied), "step_gamma": float(stepped)}


def model_time(problem: Problem1D, kernel: Kernel, model: _cost.MachineModel, *, messages: float,
               nbytes: float, collectives: float = 0.0, collective_bytes: float = 0.0,
               overlapped_bytes: float = 0.0, copied: float = 0.0) -> float:
    """A plan's modelled time: latency and bytes received (``messages``
    point-to-point steps and ``nbytes`` in them, ``collectives`` whole ones
    receiving ``collective_bytes``), the bytes its moves and kernel copy in
    memory besides (``copied``: :attr:`Move.copied`), plus its local GEMMs on
    the roofline (:func:`gemm_calls`): each constant times its
    :func:`time_terms`. Where the model overlaps a ring's transfers with its
    GEMMs, the ``overlapped_bytes`` of ``nbytes`` (the ring's own) take the
    longer of the two, plus one step of the shorter, not their sum."""
    return _timed(problem, kernel, model, messages=messages, nbytes=nbytes, collectives=collectives,
                  collective_bytes=collective_bytes, overlapped_bytes=overlapped_bytes, copied=copied)[0]


def _timed(problem: Problem1D, kernel: Kernel, model: _cost.MachineModel, *, overlapped_bytes: float,
           **counts: float) -> tuple[float, dict[str, float]]:
    """:func:`model_time` and the :func:`time_terms` it sums, computed once."""
    terms = time_terms(problem, kernel, model, overlapped_bytes=overlapped_bytes, **counts)
    time = sum(getattr(model, name) * terms[name] for name in TERMS)
    if model.overlap and overlapped_bytes and kernel.schedule != "one_shot":
        calls = gemm_calls(problem, kernel)
        both_ways = kernel.schedule == "bidirectional"
        ring = model.ring_beta(problem.p, both_ways=both_ways) * overlapped_bytes
        local = sum(count * model.gemm(flops, touched) for count, flops, touched in calls)
        local += model.step_gamma * terms["step_gamma"]
        steps = max(calls[0][0] // (2 if both_ways else 1), 1)  # (both ways: two GEMMs a step)
        time += max(ring, local) + min(ring, local) / steps - ring - local
    return time, terms


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
        out.append(costed_plan(sized, kernel, moves, kb, km, kc, flops, model, kernel_copied(sized, kernel, transposes)))
    order = {name: i for i, name in enumerate(ALGORITHMS)}
    out.sort(key=lambda pl: (pl.time, len(pl.moves), order[pl.algorithm]))
    return out


def costed_plan(problem: Problem1D, kernel: Kernel, moves: tuple[Move, ...], kb: float, km: float, kc: float,
                flops: float, model: _cost.MachineModel, copied: float = 0.0) -> Plan:
    """The plan of ``kernel`` (its bytes ``kb``, messages ``km``, collectives
    ``kc``: :func:`kernel_cost`, :func:`kernel_collectives`; the bytes it copies
    in memory, ``copied``) and ``moves``, with its modelled time: the bytes of
    whole collectives (``kc``, a move's ``collectives``) at their own cost, the
    ring's own beside its GEMMs."""
    ring_bytes = sum(mv.nbytes for mv in moves if not mv.collectives) + (0.0 if kc else kb)
    coll_bytes = sum(mv.nbytes for mv in moves if mv.collectives) + (kb if kc else 0.0)
    counts = dict(messages=km + sum(mv.messages for mv in moves), nbytes=ring_bytes,
                  collectives=kc + sum(mv.collectives for mv in moves), collective_bytes=coll_bytes,
                  overlapped_bytes=0.0 if kc else kb, copied=copied + sum(mv.copied for mv in moves))
    time, terms = _timed(problem, kernel, model, **counts)
    return Plan(kernel, moves, kb, km, flops, time, kc, tuple(terms[t] for t in TERMS), copied)


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
