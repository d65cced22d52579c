"""2.5-D SUMMA on JAX devices: its mesh, the layouts its kernel takes, and the
bytes that kernel moves (what :class:`._planning.PlannedProduct` asks where the
plan is ``summa25d``)."""

from __future__ import annotations

import numpy as np

from ... import _cost, _plan
from ...algorithms import ALGORITHMS, summa25d
from ..._problem import Spec
from . import _kernels
from ._layout import DimMap, Geometry, Placement

#: the algorithm's name, for the backend's tests of which plan it runs
NAME = "summa25d"


def layers(problem: _plan.Problem1D) -> tuple[int, int]:
    """(q, c): the layer grid's side and the number of layers the planner chose."""
    return ALGORITHMS[NAME].layers(problem)  # type: ignore[attr-defined]


def has_layers(p: int) -> bool:
    """Whether ``p`` ranks form layers (``q*q*c``): only then is the memory they may take asked."""
    return bool(summa25d.layouts(p))


def geometry(devices: tuple, problem: _plan.Problem1D) -> Geometry:
    """The ("r", "c", "l") mesh of ``devices`` for ``problem``'s layers."""
    q, c = layers(problem)
    return Geometry.layered(devices, q, c)


def grouped(size: int, q: int, c: int) -> tuple[DimMap, DimMap]:
    """A dimension split over the grid axis (``q`` parts, :meth:`DimMap.slab`),
    each part padded to ``c`` equal pieces: the map of the ``q`` parts (block
    ``c * s``) and that of the ``q * c`` pieces (block ``s``), in one padded
    space, so that a reduce-scatter over the ``c`` layers of a part's block
    leaves piece ``l`` on layer ``l``.

    >>> whole, pieces = grouped(7, 2, 2)
    >>> whole.sources.tolist() == pieces.sources.tolist(), pieces.parts
    (True, ((0, 1), (2, 3), (4, 5), (6,)))
    """
    parts = DimMap.slab(size, q).parts
    s = max(1, -(-max(len(p) for p in parts) // c))
    pieces = tuple(part[l * s:(l + 1) * s] for part in parts for l in range(c))
    return DimMap(size, parts, c * s), DimMap(size, pieces, s)


def placements(spec: Spec, q: int, c: int) -> tuple[dict[str, Placement], _kernels.SummaSchedule]:
    """The kernel's layouts: op(A) M over "r" and K over ("c", "l"); op(B) K over
    ("r", "l") and N over "c"; the result M over ("r", "l") (the pieces of
    op(A)'s row blocks) and N over "c". K is cut in ``q * c`` blocks: in layer
    ``l`` grid column ``j`` of op(A) and grid row ``j`` of op(B) both hold block
    ``j*c + l``, the layer's SUMMA panel ``j`` (one panel a grid step)."""
    m_rows, m_pieces = grouped(spec.m, q, c)
    k_map, n_map = DimMap.slab(spec.k, q * c), DimMap.slab(spec.n, q)
    kl, rl = ("c", "l"), ("r", "l")
    a = Placement((k_map, m_rows), (kl, "r")) if spec.transpose_a else Placement((m_rows, k_map), ("r", kl))
    b = Placement((n_map, k_map), ("c", rl)) if spec.transpose_b else Placement((k_map, n_map), (rl, "c"))
    d = Placement((m_pieces, n_map), (rl, "c"))
    kb, zeros = k_map.block, (0,) * q
    schedule = _kernels.SummaSchedule(kb, tuple(range(q)), zeros, tuple(range(q)), zeros, kb, kb)
    return {"a": a, "b": b, "d": d}, schedule


def recost(plan: _plan.Plan, problem: _plan.Problem1D, kernel: dict[str, Placement], lp: _kernels.LocalProblem,
           model: _cost.MachineModel, itemsize: int) -> _plan.Plan:
    """``plan`` with the bytes and transfers its kernel moves here, from its
    blocks (padded): in the layer, SUMMA's (its ring's route, whose panels
    travel in ppermute rounds, :meth:`_kernels.SummaRoute.traffic`; one-shot,
    op(A)'s ``q - 1`` blocks along the grid row and op(B)'s along the column),
    then the layer reduce-scatter: ``c - 1`` of the result's pieces."""
    sched = lp.summa
    assert sched is not None
    q, c = layers(problem)
    ta, tb = lp.transpose_a, lp.transpose_b
    m_loc, n_loc = kernel["a"].block[1 if ta else 0], kernel["b"].block[0 if tb else 1]
    piece = int(np.prod(kernel["d"].block))
    if plan.kernel.schedule == "one_shot":
        elements, transfers = (q - 1) * sched.width * (m_loc + n_loc), 0
    else:
        route = _kernels.summa_route(sched, q, q, sched.width, sched.width)
        elements, transfers = route.traffic(*((m_loc, n_loc) if route.ring == "a" else (n_loc, m_loc)))
    elements += (c - 1) * piece
    return _plan.costed_plan(problem, plan.kernel, plan.moves, elements * itemsize, transfers,
                             plan.kernel_collectives, plan.flops, model, plan.kernel_copied)
