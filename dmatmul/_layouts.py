"""The layouts the planner picks where the call gave none (``distribution=None``,
one process): the 1-D triple, or the 2-D grid, whose cheapest plan under the
model of :mod:`dmatmul._cost` (placing the operands there included) is
fastest, keeping what the operands' own layouts fix. Pure: sizes and a model
in, distributions out (:mod:`dmatmul._plan` costs each candidate).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence

from . import _cost
from ._distribution import BlockNonCyclic, Distribution, ProcessGrid, Replicated, Slab
from ._plan import ALGORITHMS, OPERANDS, Kernel, Plan, Problem1D, grid_kernels, plans
from ._roles import role_dist, role_of, roles_of
from .algorithms import kernels as registered_kernels

__all__ = ["Fixed", "Weighed", "cheapest", "choose_distributions", "choose_grid", "grid_shapes", "weigh"]


#: a's, b's and the result's distribution where one is given by the operand's own layout, else None
Fixed = tuple[Distribution | None, Distribution | None, Distribution | None]


def choose_distributions(
    problem: Problem1D,
    model: _cost.MachineModel,
    *,
    transposes: tuple[bool, bool],
    fixed: Fixed = (None, None, None),
    kernels: Sequence[Kernel] | None = None,
    deliverable: Callable[[Distribution], bool] | None = None,
    algorithm: str = "auto",
) -> tuple[Distribution, Distribution, Distribution]:
    """``distribution=None`` (one process): the layouts whose cheapest plan,
    plus placing the operands there, the model says is fastest (a triple of
    1-D distributions, or a and b ``BlockNonCyclic`` on a 2-D grid:
    :func:`weigh`); with a named ``algorithm``, the cheapest it runs (for
    SUMMA a ``BlockNonCyclic`` on the cheapest grid: :func:`choose_grid`).

    ``fixed``: a's, b's and the result's distribution where the operand
    already has one (a ``jax.Array`` laid out on the devices; the result's:
    ``c``'s where it is read); the others are free. Where one
    is a 2-D grid's, the product runs on that grid and the result may stay
    on it too (SUMMA's own layout: no move). On one rank
    nothing is split: everything is ``Replicated()``. ``deliverable``: whether
    the backend can hand the result back in a distribution as it is (a
    ``jax.Array`` result shards only evenly); one it cannot is no candidate,
    since it would come back replicated at the ``Replicated()`` candidate's
    cost plus a gather.

    >>> pr = Problem1D(64, 64, 4096, 4, 4, 4)
    >>> choose_distributions(pr, _cost.model_for("cpu"), transposes=(False, False))
    (Slab.Y, Slab.X, Slab.X)
    >>> choose_distributions(pr, _cost.model_for("cpu"), transposes=(False, False), algorithm="allgather")
    (Slab.X, Slab.X, Slab.X)
    """
    if algorithm != "auto" and ALGORITHMS[algorithm].grid:
        return choose_grid(problem, model, fixed=fixed, deliverable=deliverable, algorithm=algorithm)
    if algorithm != "auto" and ALGORITHMS[algorithm].relays:  # the 1-D layouts its plan, moves included, likes best
        own = [kern for kern in registered_kernels() if kern.algorithm == algorithm]  # (refused later, if it must)
        kernels, algorithm = own if ALGORITHMS[algorithm].runs_on(problem) else kernels, "auto"
    if algorithm != "auto":
        return _choose_named(problem, model, algorithm, transposes, fixed, kernels, deliverable)
    if problem.p == 1:
        return (fixed[0] or Replicated(), fixed[1] or Replicated(), fixed[2] or Replicated())
    weighed = weigh(problem, model, transposes=transposes, fixed=fixed, kernels=kernels, deliverable=deliverable)
    if not weighed:
        raise ValueError("no kernel of the backend runs any layout: pass distribution= explicitly")
    return min(weighed, key=lambda w: w.cost).dists  # (the first of equals: 1-D before a grid)


@dataclasses.dataclass(frozen=True)
class Weighed:
    """One candidate layout of :func:`weigh`: its plans, cheapest first, and
    the time placing its free operands a and b there takes."""

    dists: tuple[Distribution, Distribution, Distribution]
    #: the problem its plans are costed on (``grid``: the candidate's process grid, where it has one)
    problem: Problem1D
    plans: tuple[Plan, ...]
    placement: float

    @property
    def cost(self) -> float:
        """What the free choice ranks it by: its cheapest plan plus placing a and b."""
        return self.plans[0].time + self.placement


def grid_shapes(p: int, proper: bool = False) -> list[ProcessGrid]:
    """The row-order grids of ``p`` ranks, fewest rows first; ``proper``: only
    those with more than one row and column (a ``(p, 1)`` or ``(1, p)`` grid
    splits as a Slab does, already a 1-D candidate).

    >>> [g.shape for g in grid_shapes(8)], [g.shape for g in grid_shapes(8, proper=True)]
    ([(1, 8), (2, 4), (4, 2), (8, 1)], [(2, 4), (4, 2)])
    """
    low, high = (2, p - 1) if proper else (1, p)
    return [ProcessGrid((r, p // r)) for r in range(low, high + 1) if p % r == 0]


def weigh(
    problem: Problem1D,
    model: _cost.MachineModel,
    *,
    transposes: tuple[bool, bool],
    fixed: Fixed = (None, None, None),
    kernels: Sequence[Kernel] | None = None,
    deliverable: Callable[[Distribution], bool] | None = None,
) -> list[Weighed]:
    """Every layout :func:`choose_distributions` weighs with ``algorithm="auto"``
    on ``problem.p > 1`` ranks (``dmatmul plan`` ranks the same), each with its
    plans: the triples of 1-D distributions (Slab.X, Slab.Y, Replicated()) for
    the free operands, and the free a and b ``BlockNonCyclic`` on a 2-D grid,
    the result there too or 1-D. The grid is that of an operand already on one
    (``fixed``), else each row-order grid of :func:`grid_shapes` with more than
    one row and column, where the backend runs a grid algorithm (SUMMA). On a
    grid the kernels are :func:`dmatmul._plan.grid_kernels`'. A result
    ``deliverable`` refuses is no candidate.

    Placing a free operand costs its bytes at the model's ``beta``: a
    replicated one its whole bytes, a split one (1-D or on the grid) its share.

    >>> pr = Problem1D(16384, 16384, 16384, 64, 2, 4)  # SUMMA on a 2-D grid wins over 64 ranks
    >>> best = min(weigh(pr, _cost.model_for("gpu"), transposes=(False, False)), key=lambda w: w.cost)
    >>> best.dists[0], best.plans[0].algorithm
    (BlockNonCyclic(ProcessGrid((8, 8), layout='row')), 'summa')
    """
    options = (Slab.X, Slab.Y, Replicated())
    p = problem.p
    # an operand laid out on a 2-D grid puts the product on that grid (SUMMA a candidate), and the
    # grid's own layout is one for the result too: SUMMA leaves it there with no move
    given = _grid_of((fixed[0] or Replicated(), fixed[1] or Replicated(), fixed[2] or Replicated()), p)
    on_grid = grid_kernels(registered_kernels() if kernels is None else kernels)
    runs_grid = any(ALGORITHMS[kern.algorithm].grid for kern in on_grid)
    grids = [given] if given is not None else grid_shapes(p, proper=True) if runs_grid else []

    def ok(d: Distribution) -> bool:
        return deliverable is None or isinstance(d, Replicated) or deliverable(d)

    def pick(i: int, opts: Sequence[Distribution]) -> list[Distribution]:
        given_dist = fixed[i]
        return [given_dist] if given_dist is not None else list(opts)

    def on(shape: ProcessGrid | None) -> list[Distribution]:  # the result on the grid, where it is free
        return [] if shape is None or fixed[2] or not ok(BlockNonCyclic(shape)) else [BlockNonCyclic(shape)]

    results = pick(2, [d for d in options if ok(d)])
    layouts = list(itertools.product(pick(0, options), pick(1, options), results + on(given)))
    for shape in grids:
        dist = BlockNonCyclic(shape)
        layouts += list(itertools.product(pick(0, [dist]), pick(1, [dist]), results + on(shape)))
    out: list[Weighed] = []
    for triple in dict.fromkeys(layouts):
        kerns = kernels if _grid_of(triple, p) is None else on_grid
        sized, found = _plans_on(problem, model, triple, transposes=transposes, kernels=kerns)
        if not found:
            continue
        roles = roles_of(triple, transposes, p)
        placement = sum(
            model.beta * sized.padded([roles[op]]).elements(op) * sized.itemsize / (1 if roles[op] == "R" else p)
            for op, given_dist in (("a", fixed[0]), ("b", fixed[1]))
            if given_dist is None
        )
        out.append(Weighed(triple, sized, tuple(found), placement))
    return out


def cheapest(
    problem: Problem1D, model: _cost.MachineModel, triple: tuple[Distribution, Distribution, Distribution], *,
    transposes: tuple[bool, bool], kernels: Sequence[Kernel] | None = None,
) -> Plan | None:
    """The cheapest plan of the product on ``triple`` (a's, b's and the result's
    distributions) as given, or None where no kernel of ``kernels`` runs it. An
    operand on a 2-D grid puts the product on that grid: SUMMA takes the
    operands on it as they lie (a transposed one: re-laid).

    >>> pr = Problem1D(64, 64, 4096, 4, 4, 4)
    >>> cheapest(pr, _cost.model_for("cpu"), (Slab.Y, Slab.X, Slab.X), transposes=(False, False)).algorithm
    'reduce_scatter'
    """
    found = _plans_on(problem, model, triple, transposes=transposes, kernels=kernels)[1]
    return found[0] if found else None


def _plans_on(
    problem: Problem1D, model: _cost.MachineModel, triple: tuple[Distribution, Distribution, Distribution], *,
    transposes: tuple[bool, bool], kernels: Sequence[Kernel] | None,
) -> tuple[Problem1D, list[Plan]]:
    """The problem the plans of the product on ``triple`` are costed on (on the
    grid of an operand on a 2-D grid), and those plans, cheapest first. On a
    grid the kernels are :func:`dmatmul._plan.grid_kernels`', and SUMMA takes
    the operands on it as they lie (a transposed one: re-laid; a result: always)."""
    grid = _grid_of(triple, problem.p)
    if grid is not None:
        problem = dataclasses.replace(problem, grid=(grid.shape[0], grid.shape[1]))
    roles = roles_of(triple, transposes, problem.p)
    grid_ops = frozenset(op for op, d in zip(OPERANDS, triple) if grid is not None and d.grid == grid
                         and roles[op] == "G")
    native = frozenset(op for op in grid_ops if (op, True) not in (("a", transposes[0]), ("b", transposes[1])))
    return problem, plans(problem, roles, model, native, kernels, grid_ops, transposes)


def _grid_of(triple: tuple[Distribution, Distribution, Distribution], p: int) -> ProcessGrid | None:
    """The 2-D grid an operand of ``triple`` lies on (the product runs there), or None."""
    return next((d.grid for d in triple if d.grid is not None and d.grid.ndim == 2
                 and role_of(d, "d", False, p) is None), None)


def _choose_named(
    problem: Problem1D, model: _cost.MachineModel, algorithm: str, transposes: tuple[bool, bool],
    fixed: Fixed, kernels: Sequence[Kernel] | None, deliverable: Callable[[Distribution], bool] | None,
) -> tuple[Distribution, Distribution, Distribution]:
    """:func:`choose_distributions` for a named 1-D ``algorithm``: the layouts
    of one of its kernels as they are (a named algorithm runs on the layouts
    given, with no move), the cheapest; a fixed operand keeps its layout (a
    replicated one fits where a slab is needed). A result ``deliverable``
    refuses is taken only where no other is. None fits: the given layouts
    with Slab.X for the rest (the named algorithm then says what it needs)."""
    if problem.p == 1:
        return (fixed[0] or Replicated(), fixed[1] or Replicated(), fixed[2] or Replicated())
    ta, tb = transposes
    options: list[tuple[bool, float, tuple[Distribution, Distribution, Distribution]]] = []
    for kern in registered_kernels() if kernels is None else kernels:
        if kern.algorithm != algorithm:
            continue
        triple = (fixed[0] or role_dist("a", kern.a, ta), fixed[1] or role_dist("b", kern.b, tb),
                  fixed[2] or role_dist("d", kern.d, False))
        found = plans(problem, roles_of(triple, transposes, problem.p), model, kernels=[kern], transposes=transposes)
        if found and found[0].communication_free_moves:  # it fits as given, as choose() requires
            options.append((deliverable is not None and not deliverable(triple[2]), found[0].time, triple))
    if not options:
        return (fixed[0] or Slab.X, fixed[1] or Slab.X, fixed[2] or Slab.X)
    return min(options, key=lambda o: (o[0], o[1]))[2]


def choose_grid(
    problem: Problem1D,
    model: _cost.MachineModel,
    *,
    fixed: Fixed = (None, None, None),
    deliverable: Callable[[Distribution], bool] | None = None,
    algorithm: str = "summa",
) -> tuple[Distribution, Distribution, Distribution]:
    """A named grid ``algorithm`` (SUMMA) with ``distribution=None``: a, b and the result
    ``BlockNonCyclic`` on the row-order grid whose SUMMA the model says is
    fastest (a jax.Array operand keeps the layout its sharding says: its grid
    then decides; ``deliverable`` as in :func:`choose_distributions`, waived
    where no grid is).

    >>> choose_grid(Problem1D(4096, 4096, 4096, 8, 4, 4), _cost.model_for("cpu"))[2]
    BlockNonCyclic(ProcessGrid((2, 4), layout='row'))
    >>> choose_grid(Problem1D(8192, 64, 4096, 8, 4, 4), _cost.model_for("cpu"))[2]  # tall: rows split more
    BlockNonCyclic(ProcessGrid((8, 1), layout='row'))
    """
    p = problem.p
    given = next((d.grid for d in fixed if d is not None and d.grid is not None and d.grid.ndim == 2), None)
    grids = [given] if given is not None else grid_shapes(p)
    on_grid = [kern for kern in registered_kernels() if kern.algorithm == algorithm]
    options: list[tuple[bool, float, tuple[Distribution, Distribution, Distribution]]] = []
    for grid in grids:
        dist = BlockNonCyclic(grid)
        triple = (fixed[0] or dist, fixed[1] or dist, fixed[2] or dist)
        sized = dataclasses.replace(problem, grid=(grid.shape[0], grid.shape[1]))
        found = plans(sized, {"a": "G", "b": "G", "d": "G"}, model, kernels=on_grid, grid_ops=frozenset("abd"))
        time = found[0].time if found else float("inf")
        options.append((deliverable is not None and not deliverable(dist), time, triple))
    return min(options, key=lambda o: (o[0], o[1]))[2]
