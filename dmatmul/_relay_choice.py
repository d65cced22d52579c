"""The 2-D layouts a re-laid product is taken in (backend-neutral).

A product on layouts its backend does not take as they are
(:mod:`dmatmul._relay`) runs a 2-D plan on a, b and the result re-laid: each
operand that has a 2-D form of its own is taken in it (:func:`taken_as`, the
rule); else the candidates (:func:`_options`: ``Slab.X``, ``Slab.Y``,
``Replicated()``, or next to a 2-D grid that grid; only those the backend
takes, :func:`refusal`) are priced, each operand's re-lay (the bytes the
busiest rank gets, :class:`dmatmul._route.Route`) plus the planner's cheapest
2-D plan on them, and the cheapest is taken (:func:`choose`; :class:`Choice`
says why in ``explain()``). Pure: the same on every rank.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from ._distribution import BlockNonCyclic, Distribution, Replicated, Slab
from ._layouts import cheapest
from ._moves import Move, _fmt_bytes
from ._problem import Spec
from ._route import Route, as_nd
from ._sharded import Sharded
from ._spec import numpy_dtype

__all__ = ["Choice", "choose", "move_time", "refusal", "relay_move", "taken_as"]

_NAMES = ("a", "b", "result")


def refusal(backend: Any, spec: Spec, nranks: int) -> str | None:
    """Why ``backend`` cannot take ``spec``'s 2-D layouts as given on ``nranks``
    ranks (:meth:`dmatmul.backends.Backend.refuses`), or None where it takes
    them or refuses the product for another reason (its plan raises that, as
    without a re-lay). Pure: the same on every rank."""
    try:
        return backend.refuses(spec, nranks)
    except (ValueError, TypeError):
        return None


def _taken(backend: Any, spec: Spec, triple: tuple[Distribution, ...], nranks: int) -> bool:
    """Whether ``backend`` runs ``spec``'s product on ``triple`` as it is (no refusal of any kind)."""
    try:
        return backend.refuses(_on(spec, triple), nranks) is None
    except (ValueError, TypeError):
        return False


def _on(spec: Spec, triple: tuple[Distribution, ...]) -> Spec:
    """``spec`` with a, b and the result laid out as ``triple``."""
    dists = cast(tuple[Distribution, Distribution, Distribution], triple)
    return dataclasses.replace(spec, options=dataclasses.replace(spec.options, distribution=dists))


def _matrix(d: Sharded) -> Sharded:
    return d if d.ndim == 2 else Sharded(d.mesh, d.spec[-2:])


def taken_as(d: Distribution) -> Distribution:
    """The 2-D distribution a plan takes an operand laid out as ``d`` in: ``d``
    itself where it is one; a Sharded's own 2-D form where only its batch is
    split; else the 1-D layout of its kind (rows split: ``Slab.X``, columns
    only: ``Slab.Y``, neither: ``Replicated()``).

    >>> from dmatmul import ProcessMesh
    >>> mesh = ProcessMesh((2, 2), ("x", "y"))
    >>> taken_as(Sharded(mesh, ("x", None))), taken_as(Sharded(mesh, (None, None, "y")))
    (Slab.X, Slab.Y)
    >>> taken_as(Sharded(mesh, ("x", "y", None)))  # the batch over x, the rows over y
    Slab.X
    """
    if not isinstance(d, Sharded):
        return d
    m = _matrix(d)
    two = m.as_2d()
    if two is not None:
        return two
    split = [bool(m.axes(i)) and m.mesh.sublayout(m.axes(i)).size > 1 for i in range(2)]
    return Slab.X if split[0] else Slab.Y if split[1] else Replicated()


def _free(d: Distribution) -> bool:
    """Whether the layout the plan takes ``d`` in is a choice: a Sharded whose
    matrices have no 2-D form (one that has is taken in it: only its batch moves)."""
    return isinstance(d, Sharded) and _matrix(d).as_2d() is None


def _options(dists: Sequence[Distribution], wide: Spec | None = None) -> list[list[Distribution]]:
    """The 2-D layouts the plan may take a, b and the result in, the rule's
    (:func:`taken_as`) first. Next to a 2-D grid (a given 2-D distribution's, or a
    Sharded's 2-D form) the product runs on it: a Sharded is taken on that grid
    (cuBLASMp takes one block size per dimension), or, one of no 2-D form,
    replicated. Else one of no 2-D form is taken as ``Slab.X``, ``Slab.Y`` or
    ``Replicated()``. ``wide`` (the spec, where the backend takes none of
    those): every operand but a Replicated one may be taken next to a grid on
    it block-cyclic (:func:`_on_grid`: one block size per dimension, every
    process a part), and as ``Slab.X``, ``Slab.Y`` or ``Replicated()``, which
    the backends' 1-D paths run whatever the sizes.

    >>> from dmatmul import BlockNonCyclic, ProcessGrid
    >>> grid = BlockNonCyclic(ProcessGrid((2, 2)))
    >>> spec = Spec.of((5, 6), (6, 7), "float64")
    >>> _options([grid, Slab.Y, Replicated()], wide=spec)  # doctest: +NORMALIZE_WHITESPACE
    [[BlockNonCyclic(ProcessGrid((2, 2), layout='row')), BlockCyclic(ProcessGrid((2, 2), layout='row'), (2, 3)),
      Slab.X, Slab.Y, Replicated()],
     [Slab.Y, BlockCyclic(ProcessGrid((2, 2), layout='row'), (3, 3)), Slab.X, Replicated()], [Replicated()]]
    """
    taken = [taken_as(d) for d in dists]
    grid = next((t.grid for d, t in zip(dists, taken) if not _free(d) and t.grid is not None and t.grid.ndim == 2),
                None)
    out: list[list[Distribution]] = []
    for d, t in zip(dists, taken):
        if grid is not None and isinstance(d, Sharded) and (_free(d) or t.grid != grid):
            out.append([BlockNonCyclic(grid), Replicated()] if _free(d) else [BlockNonCyclic(grid)])
        elif _free(d):
            out.append([t, *(o for o in (Slab.X, Slab.Y, Replicated()) if o != t)])
        else:
            out.append([t])
    if wide is not None:
        blocks = _on_grid(wide, grid) if grid is not None else None
        out = [o if isinstance(d, Replicated) else
               [*o, *(x for x in (*([] if blocks is None else [blocks[i]]), *_ONE_D) if x not in o)]
               for i, (d, o) in enumerate(zip(dists, out))]
    return out


def _on_grid(spec: Spec, grid: Any) -> tuple[Distribution, Distribution, Distribution] | None:
    """a, b and the result block-cyclic on ``grid`` with one block size per
    dimension M, K, N, the largest that leaves no process of an axis holding the
    dimension without a part (``size // processes``, the most of them); None
    where a dimension has fewer elements than processes along it."""
    from ._distribution import BlockCyclic

    stored = {"a": ("K", "M") if spec.transpose_a else ("M", "K"),
              "b": ("N", "K") if spec.transpose_b else ("K", "N"), "result": ("M", "N")}
    size = {"M": spec.m, "K": spec.k, "N": spec.n}
    procs: dict[str, int] = {}
    for dims in stored.values():
        for axis, dim in enumerate(dims):
            procs[dim] = max(procs.get(dim, 1), grid.shape[axis])
    if any(size[d] < procs[d] for d in procs):
        return None
    block = {d: size[d] // procs[d] for d in procs}
    return cast(tuple[Distribution, Distribution, Distribution],
                tuple(BlockCyclic(grid, (block[r], block[c])) for r, c in stored.values()))


_ONE_D: tuple[Distribution, ...] = (Slab.X, Slab.Y, Replicated())


def relay_move(name: str, nbytes: float) -> Move:
    """An operand's re-lay as the plan counts it: one whole collective (an
    Alltoallv, as the planner counts its own 1-D all-to-all: :func:`dmatmul._moves.move`),
    ``nbytes`` received by the busiest rank."""
    return Move(name if name != "result" else "d", cast(Any, "S"), cast(Any, "S"), "exchange (re-lay)",
                float(nbytes), 0.0, 1.0)


def move_time(model: Any, mv: Move) -> float:
    """A move's modelled time, as the planner prices its own (:func:`dmatmul._plan.costed_plan`):
    latency per message and collective, the bytes at a whole collective's rate."""
    if not mv.nbytes:
        return 0.0
    return float(model.time(messages=mv.messages, nbytes=0.0, flops=0.0, collectives=mv.collectives,
                            collective_bytes=mv.nbytes) + model.mem_beta * mv.copied)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The 2-D layouts the plan takes a, b and the result in (``triple``) and,
    where some were chosen, each candidate triple's modelled time, cheapest
    first: ``(total, re-lays, the 2-D plan, triple)``; ``relays``: each chosen
    operand's ``(name, bytes, time)`` per candidate layout."""

    triple: tuple[Distribution, Distribution, Distribution]
    refused: str | None = None  # why the backend cannot take the layouts as given (its library's limit), if so
    ranked: tuple[tuple[float, float, float, tuple[Distribution, Distribution, Distribution]], ...] = ()
    free: tuple[int, ...] = ()  # which of a, b and the result were chosen
    relays: tuple[tuple[tuple[Distribution, float, float], ...], ...] = ()  # per free operand: (layout, bytes, time)

    def explain(self) -> list[str]:
        if not self.free:
            return []
        total, relays, inner, _ = self.ranked[0]
        lines = [f"layouts:    chosen by the cost model, the cheapest of {len(self.ranked)} candidates (each re-lay "
                 f"and the 2-D plan, modelled): {_time(total)} (re-lays {_time(relays)}, the 2-D plan {_time(inner)})"]
        if len(self.ranked) > 1:
            second = self.ranked[1]
            what = ", ".join(f"{_NAMES[i]} as {second[3][i]!r}" for i in self.free)
            lines[0] += f"; runner-up {what}: {_time(second[0])}"
        for i, options in zip(self.free, self.relays):
            chosen = self.triple[i]
            nbytes, t = next((b, t) for d, b, t in options if d == chosen)
            others = []
            for d, _, _ in options:
                if d != chosen:
                    times = [r[0] for r in self.ranked if r[3][i] == d]
                    others.append(f"as {d!r} {_time(min(times))} at best" if times else
                                  f"as {d!r} not taken by the backend")
            rest = f"; {', '.join(others)}" if others else ""
            lines.append(f"  {_NAMES[i]:7s} as {chosen!r}: its re-lay {_fmt_bytes(nbytes)}/rank at most, "
                         f"{_time(t)}{rest}")
        return lines


def _time(t: float) -> str:
    return f"{t * 1e3:.3f} ms" if t >= 1e-3 else f"{t * 1e6:.1f} us"


@functools.lru_cache(maxsize=64)
def choose(spec: Spec, p: int, problem: Any, model: Any, kernels: tuple[Any, ...] | None,
           backend: Any = None) -> Choice:
    """The layouts of :func:`_options` that ``backend`` takes (``wide`` where it
    takes none of the others; where it takes none at all, the rule's, which its
    plan then refuses) whose re-lays (each operand's bytes the
    busiest rank gets, :class:`Route`; the result's move back, and c's where it
    is read) plus the 2-D plan of the product on them (the planner's cheapest,
    :func:`dmatmul._layouts.cheapest`, on ``problem``, each item of a batch)
    the model prices lowest; ties go to :func:`taken_as`'s. Pure and
    deterministic: under mpiexec every rank, planning with rank 0's model,
    chooses alike."""
    dists = spec.distributions
    assert dists is not None

    def triples(options: list[list[Distribution]]) -> list[tuple[tuple[int, ...], Any]]:
        out = []
        for picks in itertools.product(*(range(len(o)) for o in options)):
            triple = tuple(o[j] for o, j in zip(options, picks))
            if backend is None or _taken(backend, spec, triple, p):
                out.append((picks, triple))
        return out

    options = _options(dists)
    candidates = triples(options)
    refused = None
    if not candidates and backend is not None:
        refused = refusal(backend, _on(spec, tuple(o[0] for o in options)), p)
        options = _options(dists, wide=spec)
        candidates = triples(options)
        if not candidates:  # nothing it takes: the rule's layouts, which its plan refuses, saying why
            return Choice(cast(tuple[Distribution, Distribution, Distribution], tuple(o[0] for o in options)))
    shapes = {"a": spec.a_shape, "b": spec.b_shape, "c": spec.result_shape, "result": spec.result_shape}
    out_size = int(np.dtype(numpy_dtype(spec.result_dtype)).itemsize)
    itemsize = {"a": spec.dtype_info.itemsize, "b": spec.dtype_info.itemsize}

    def relay(name: str, src: Distribution, dst: Distribution) -> tuple[float, float]:
        shape = shapes[name]
        route = Route.of(as_nd(src, len(shape), p), as_nd(dst, len(shape), p), shape, p)
        nbytes = max(route.received(r) for r in range(p)) * itemsize.get(name, out_size)
        return nbytes, move_time(model, relay_move(name, nbytes))

    priced: list[list[tuple[float, float]]] = []  # per operand, per option: its re-lays' (bytes, time)
    for i, (name, given) in enumerate(zip(_NAMES, dists)):
        row = []
        for d in options[i]:
            if not isinstance(given, Sharded) and d == given:
                row.append((0.0, 0.0))
                continue
            nbytes, t = relay(name, given, d) if i < 2 else relay("result", d, given)
            if i == 2 and spec.c_shape is not None and spec.use_c:
                more = relay("c", given, d)
                nbytes, t = nbytes + more[0], t + more[1]
            row.append((nbytes, t))
        priced.append(row)
    ranked = []
    transposes = (spec.transpose_a, spec.transpose_b)
    for picks, triple in candidates:
        found = cheapest(problem, model, triple, transposes=transposes, kernels=kernels)
        inner = float("inf") if found is None else found.time * max(spec.batch_size, 1)
        moves = sum(priced[i][j][1] for i, j in enumerate(picks))
        ranked.append((moves + inner, picks, moves, inner, triple))
    ranked.sort(key=lambda r: (r[0], r[1]))
    free = tuple(i for i, o in enumerate(options) if len(o) > 1)
    relays = tuple(tuple((d, *priced[i][j]) for j, d in enumerate(options[i])) for i in free)
    return Choice(ranked[0][4], refused, tuple((r[0], r[2], r[3], r[4]) for r in ranked), free, relays)
