"""Products on any :class:`~dmatmul.Sharded` distribution (backend-neutral).

The backends' plans take the 2-D distributions (``Slab``, ``Replicated``,
grids), each rank holding the whole batch of its blocks. A ``Sharded`` that
has no such form (replicated over some mesh axes only, axes cut out of rank
order, a batch dimension split) is planned here (:class:`ShardedProduct`,
standing in for the backend as :class:`dmatmul._batched.BatchedProduct`
does):

* each such operand is taken by the plan in a 2-D layout and re-laid into
  it, the result out of it into the result's Sharded: its own 2-D form where
  only the batch is split; else the one the cost model prices lowest
  (:func:`choose`: ``Slab.X``, ``Slab.Y`` or ``Replicated()``, or next to a
  2-D grid that grid or ``Replicated()``), counting its re-lay's bytes and
  the 2-D plan that then runs (:func:`taken_as`'s kind-of-split rule breaks
  ties). Under ``mpiexec`` the ranks exchange exactly the elements each
  lacks (:func:`exchange`, from ``global_indices``: nothing is gathered
  whole); in one process the operands are the global arrays, so nothing
  moves but what placing them on the devices moves (a ``jax.Array`` result
  is laid out as the result's Sharded says, or replicated where no
  ``NamedSharding`` expresses it, as the backend has it);
* a batch dimension split alike for a, b and the result, with the matrices
  split nowhere, is independent products: under ``mpiexec`` each rank
  multiplies its own items, and nothing moves (:class:`LocalPlan`).

``explain()`` states each move, its bytes per rank and why; the plan's
``cost`` counts them as the backends count their own moves.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from . import _runtime
from . import backends as _backends
from ._distribution import BlockNonCyclic, Distribution, Replicated, Slab
from ._epilogue import apply as epilogue_apply
from ._epilogue import work_dtype
from ._layouts import cheapest
from ._errors import DistributionError
from ._plan import Move, Plan, _fmt_bytes
from ._plans import PLANS
from ._problem import Spec
from ._sharded import Sharded
from ._args import to_numpy
from ._batched import route
from ._spec import Operands, array_module, family, numpy_dtype, precise

__all__ = ["Choice", "ShardedProduct", "as_given", "check_mesh", "choose", "exchange", "needs_relay", "taken_as"]

_NAMES = ("a", "b", "result")


def needs_relay(spec: Spec) -> bool:
    """Whether ``spec`` names a Sharded that the backends do not take as it is."""
    dists = spec.distributions
    return dists is not None and any(isinstance(d, Sharded) for d in dists)


def _ndims(spec: Spec) -> tuple[int, int, int]:
    return len(spec.a_shape), len(spec.b_shape), len(spec.result_shape)


def _shapes(spec: Spec) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    return spec.a_shape, spec.b_shape, spec.result_shape


def check_ndims(dists: Sequence[Distribution], ndims: Sequence[int], shapes: Sequence[str]) -> None:
    """A Sharded lays out arrays of as many dimensions as the operand has (or
    2: its matrices, every rank holding the whole batch), else a
    DistributionError naming the operand."""
    for name, d, ndim, shape in zip(_NAMES, dists, ndims, shapes):
        if isinstance(d, Sharded) and d.ndim not in (ndim, 2):
            raise DistributionError(
                f"distribution of {name}: {d!r} has {d.ndim} spec entries but {name} has {ndim} dimensions "
                f"({shape}): give one entry per dimension of {name} (None where it is not split), "
                "or 2 for its matrices, every rank then holding the whole batch"
            )


def check_mesh(dists: Sequence[Distribution], nranks: int, where: str, fix: str) -> None:
    """A Sharded's mesh spans exactly the ``nranks`` ranks in use, else a
    DistributionError naming the operand (``where``: "4 processes"...)."""
    for name, d in zip(_NAMES, dists):
        if isinstance(d, Sharded) and d.mesh.size != nranks:
            raise DistributionError(
                f"distribution of {name}: {d!r} spans {d.mesh.size} ranks (its mesh {d.mesh.shape}) but there "
                f"are {where}: use a ProcessMesh of {nranks} ranks{fix}"
            )


def as_given(distribution: Any) -> tuple[Any, ...]:
    """The distributions of a, b and the result as the call gave them (its
    ``distribution=``, checked by :class:`~dmatmul._problem.Options`): a
    Sharded whose 2-D form stands in for it there (``Slab.X``, which carries
    no rank count) keeps its mesh here, for :func:`check_mesh`."""
    if distribution is None:
        return ()
    return (distribution,) * 3 if isinstance(distribution, Distribution) else tuple(distribution)


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


def as_nd(d: Distribution, ndim: int, nranks: int) -> Sharded | Distribution:
    """``d`` laying out arrays of ``ndim`` dimensions: a Sharded of 2 entries (or
    a 2-D distribution) with the batch dimensions not split, where it has a
    Sharded form; else ``d`` (a 2-D distribution, every rank the whole batch)."""
    s = d if isinstance(d, Sharded) else Sharded.from_2d(d, nranks)
    if s is None:
        return d
    return s if s.ndim == ndim else Sharded(s.mesh, (None,) * (ndim - s.ndim) + s.spec)


def _indices(d: Distribution, rank: int, shape: tuple[int, ...], nranks: int) -> tuple[np.ndarray, ...]:
    """``rank``'s global ids per dimension of an array of ``shape`` laid out as
    ``d`` (a 2-D one: every batch index, then its matrix's)."""
    if d.ndim == len(shape):
        return tuple(d.global_indices(rank, shape, nranks))
    return (*(np.arange(s) for s in shape[:-2]), *d.global_indices(rank, shape[-2:], nranks))


def _key(ids: tuple[np.ndarray, ...]) -> tuple[bytes, ...]:
    return tuple(np.ascontiguousarray(i, dtype=np.int64).tobytes() for i in ids)


@dataclasses.dataclass(frozen=True)
class Route:
    """Which rank sends which part to which (the same tables on every rank):
    ``parts[s]``: ``(sender, ids per dimension)`` of the parts rank ``s`` gets."""

    src: tuple[tuple[np.ndarray, ...], ...]
    dst: tuple[tuple[np.ndarray, ...], ...]
    parts: tuple[tuple[tuple[int, tuple[np.ndarray, ...]], ...], ...]

    @classmethod
    def of(cls, src: Distribution, dst: Distribution, shape: tuple[int, ...], nranks: int) -> Route:
        s_ids = tuple(_indices(src, r, shape, nranks) for r in range(nranks))
        d_ids = tuple(_indices(dst, r, shape, nranks) for r in range(nranks))
        holders: dict[tuple[bytes, ...], list[int]] = {}  # the ranks that hold one same block
        for r, ids in enumerate(s_ids):
            holders.setdefault(_key(ids), []).append(r)
        parts = []
        for s in range(nranks):
            got = []
            for group in holders.values():
                sender = s if s in group else group[s % len(group)]  # spread the replicas' sends
                common = tuple(np.intersect1d(a, b, assume_unique=True) for a, b in zip(s_ids[group[0]], d_ids[s]))
                if all(len(c) for c in common):
                    got.append((sender, common))
            parts.append(tuple(got))
        return cls(s_ids, d_ids, tuple(parts))

    def received(self, rank: int) -> int:
        """The elements ``rank`` gets from other ranks."""
        return sum(int(np.prod([len(c) for c in ids])) for sender, ids in self.parts[rank] if sender != rank)

    @functools.cached_property
    def moves(self) -> bool:
        """Whether any rank gets any element from another (the same answer on
        every rank: where none does, the ranks skip the collective alike)."""
        return any(self.received(r) for r in range(len(self.parts)))


def _positions(held: tuple[np.ndarray, ...], ids: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    return tuple(np.searchsorted(h, i) for h, i in zip(held, ids))


def _size(ids: tuple[np.ndarray, ...]) -> int:
    return int(np.prod([len(i) for i in ids]))


def _displacements(counts: np.ndarray) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(counts)[:-1])).astype(counts.dtype)


def exchange(x: Any, route: Route, rank: int, comm: Any, dtype: Any) -> np.ndarray:
    """This rank's block ``x`` under ``route``'s source layout -> its block under
    the destination's: one ``Alltoallv`` of exactly the parts each rank lacks
    (its own parts copied here), packed into one contiguous buffer per side.

    The buffers go as bytes (counts scaled by the itemsize): exact for every
    dtype, those MPI has no type for (bfloat16, FP8, complex in some MPIs)
    included, and nothing is pickled."""
    # a CuPy block goes through the host: the MPI under mpi4py is not assumed CUDA-aware
    x = x.get() if family(x) == "cupy" else to_numpy(x, "x")
    dt = np.dtype(dtype)
    x = x.astype(dt, copy=False)
    size = len(route.parts)
    out = np.empty(tuple(len(i) for i in route.dst[rank]), dtype=dt)
    for sender, ids in route.parts[rank]:
        if sender == rank:
            out[np.ix_(*_positions(route.dst[rank], ids))] = x[np.ix_(*_positions(route.src[rank], ids))]
    if size == 1 or not route.moves:
        return out
    # the parts rank s gets from this rank, in route.parts[s]'s order (the order s unpacks them in)
    outgoing = [[ids for sender, ids in route.parts[s] if sender == rank] for s in range(size)]
    outgoing[rank] = []
    incoming = [[ids for sender, ids in route.parts[rank] if sender == s] for s in range(size)]
    incoming[rank] = []
    send_n = np.array([sum(_size(ids) for ids in parts) for parts in outgoing], dtype=np.int64)
    recv_n = np.array([sum(_size(ids) for ids in parts) for parts in incoming], dtype=np.int64)
    send = np.empty(int(send_n.sum()), dtype=dt)
    at = 0
    for parts in outgoing:
        for ids in parts:
            n = _size(ids)
            send[at:at + n] = x[np.ix_(*_positions(route.src[rank], ids))].reshape(-1)
            at += n
    recv = np.empty(int(recv_n.sum()), dtype=dt)
    item = dt.itemsize
    send_b, recv_b = send_n * item, recv_n * item
    comm.Alltoallv([send.view(np.uint8), (send_b, _displacements(send_b))],
                   [recv.view(np.uint8), (recv_b, _displacements(recv_b))])
    at = 0
    for parts in incoming:
        for ids in parts:
            n = _size(ids)
            out[np.ix_(*_positions(route.dst[rank], ids))] = recv[at:at + n].reshape(tuple(len(i) for i in ids))
            at += n
    return out


def _in_family(x: np.ndarray, like: str) -> Any:
    return x if like == "numpy" else array_module(like).asarray(x)


@dataclasses.dataclass(frozen=True)
class Relay:
    """One operand's move between its Sharded and the layout the plan takes."""

    name: str  # a, b, c or result
    src: Distribution
    dst: Distribution
    shape: tuple[int, ...]
    received: int  # elements the rank that gets most gets from others
    itemsize: int

    @property
    def nbytes(self) -> int:
        return self.received * self.itemsize

    def describe(self, moved: bool) -> str:
        if not moved:
            how = "in one process the global array is placed so: nothing moves between ranks beyond placing it"
        elif self.nbytes == 0:
            how = "each rank holds its part already: nothing moves"
        else:
            how = f"{_fmt_bytes(self.nbytes)}/rank at most (each rank gets only the elements it lacks)"
        return f"  {self.name:7s} {self.src!r} -> {self.dst!r}: {how}"


class ShardedProduct(_backends.Backend):
    """The "backend" of a product with Shardeds the backends do not take as
    they are, standing in for ``backend``. Its plans are made at every call
    around a plan of the 2-D product that the cache holds."""

    cache_size = 0

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.name = backend.name
        self.plans_collectively = backend.plans_collectively

    def _inner(self, spec: Spec, operands: Operands) -> tuple[Spec, Choice]:
        """The 2-D product the plan runs, and why it takes each operand as it does."""
        choice = self._choose(spec, operands)
        options = dataclasses.replace(spec.options, distribution=choice.triple)
        return dataclasses.replace(spec, options=options), choice

    def _choose(self, spec: Spec, operands: Operands) -> Choice:
        dists = spec.distributions
        assert dists is not None
        sharded = [d for d in dists if isinstance(d, Sharded)]
        p = spec.nprocs if spec.spmd else sharded[0].mesh.size
        options = _options(dists)
        if all(len(o) == 1 for o in options) or p == 1 or any(d.mesh.size != p for d in sharded):
            # one layout each, one rank (where every layout is the whole matrix), or meshes of other sizes
            # (refused by check_mesh): nothing to choose
            return Choice(tuple(o[0] for o in options))  # type: ignore[arg-type]
        problem, model, kernels = self.backend.planner(spec, operands, p)
        return choose(spec, p, problem, model, None if kernels is None else tuple(kernels))

    def _route(self, inner: Spec) -> Any:
        return route(self.backend, inner)

    def plan(self, spec: Spec, operands: Operands) -> _backends.BackendPlan:
        assert spec.distributions is not None
        check_ndims(spec.distributions, _ndims(spec), [f"shape {s}" for s in _shapes(spec)])
        local = _independent(spec)
        if local is not None and spec.spmd:
            return LocalPlan(spec, local)
        inner, choice = self._inner(spec, operands)
        if not spec.spmd:
            ranks = self._route(inner).ranks(inner, operands)
            check_mesh(spec.distributions, ranks, f"{ranks} device{'s' if ranks > 1 else ''} in use",
                       ", or devices= that many")
        return RelayPlan(spec, inner, self._route(inner), operands, choice)

    def ranks(self, spec: Spec, operands: Operands) -> int:
        inner, _ = self._inner(spec, operands)
        return int(self._route(inner).ranks(inner, operands))

    def place(self, result: Any, spec: Spec, operands: Operands) -> Any:
        return result

    def memory(self, spec: Spec, operands: Operands) -> tuple[list[Any], dict[str, Any]]:
        if spec.spmd:  # the inner plan's blocks are not this rank's blocks: judged by the plan's run
            return [], {}
        inner, _ = self._inner(spec, operands)
        return self._route(inner).memory(inner, operands)

    def preview(self, spec: Spec, operands: Operands) -> tuple[str, list[str]]:
        local = _independent(spec)
        if local is not None and spec.spmd:
            return LocalPlan.algorithm, LocalPlan(spec, local).explain()
        inner, choice = self._inner(spec, operands)
        algorithm, lines = self._route(inner).preview(inner, operands)
        return algorithm, [*_relay_header(spec, inner), *choice.explain(), *lines]


def _relay_header(spec: Spec, inner: Spec) -> list[str]:
    assert spec.distributions is not None and inner.distributions is not None
    taken = ", ".join(f"{n} as {d!r}" for n, d, o in zip(_NAMES, inner.distributions, spec.distributions)
                      if isinstance(o, Sharded))
    return [f"sharded:    the plan takes {taken} (no 2-D distribution it runs lays them out as given)"]


def _free(d: Distribution) -> bool:
    """Whether the layout the plan takes ``d`` in is a choice: a Sharded whose
    matrices have no 2-D form (one that has is taken in it: only its batch moves)."""
    return isinstance(d, Sharded) and _matrix(d).as_2d() is None


def _options(dists: Sequence[Distribution]) -> list[list[Distribution]]:
    """The 2-D layouts the plan may take a, b and the result in, the rule's
    (:func:`taken_as`) first. Next to a 2-D grid (a given 2-D distribution's, or a
    Sharded's 2-D form) the product runs on it: a Sharded is taken on that grid
    (cuBLASMp takes one block size per dimension), or, one of no 2-D form,
    replicated. Else one of no 2-D form is taken as ``Slab.X``, ``Slab.Y`` or
    ``Replicated()``."""
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
    return out


def relay_move(name: str, nbytes: float) -> Move:
    """An operand's re-lay as the plan counts it: one whole collective (an
    Alltoallv, as the planner counts its own 1-D all-to-all: :func:`dmatmul._plan.move`),
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
                    best = min(r[0] for r in self.ranked if r[3][i] == d)
                    others.append(f"as {d!r} {_time(best)} at best")
            rest = f"; {', '.join(others)}" if others else ""
            lines.append(f"  {_NAMES[i]:7s} as {chosen!r}: its re-lay {_fmt_bytes(nbytes)}/rank at most, "
                         f"{_time(t)}{rest}")
        return lines


def _time(t: float) -> str:
    return f"{t * 1e3:.3f} ms" if t >= 1e-3 else f"{t * 1e6:.1f} us"


@functools.lru_cache(maxsize=64)
def choose(spec: Spec, p: int, problem: Any, model: Any, kernels: tuple[Any, ...] | None) -> Choice:
    """The layouts of :func:`_options` whose re-lays (each operand's bytes the
    busiest rank gets, :class:`Route`; the result's move back, and c's where it
    is read) plus the 2-D plan of the product on them (the planner's cheapest,
    :func:`dmatmul._layouts.cheapest`, on ``problem``, each item of a batch)
    the model prices lowest; ties go to :func:`taken_as`'s. Pure and
    deterministic: under mpiexec every rank, planning with rank 0's model,
    chooses alike."""
    dists = spec.distributions
    assert dists is not None
    options = _options(dists)
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
            if not isinstance(given, Sharded):
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
    for picks in itertools.product(*(range(len(o)) for o in options)):
        triple = cast(tuple[Distribution, Distribution, Distribution], tuple(o[j] for o, j in zip(options, picks)))
        found = cheapest(problem, model, triple, transposes=transposes, kernels=kernels)
        inner = float("inf") if found is None else found.time * max(spec.batch_size, 1)
        moves = sum(priced[i][j][1] for i, j in enumerate(picks))
        ranked.append((moves + inner, picks, moves, inner, triple))
    ranked.sort(key=lambda r: (r[0], r[1]))
    free = tuple(i for i, o in enumerate(options) if len(o) > 1)
    relays = tuple(tuple((d, *priced[i][j]) for j, d in enumerate(options[i])) for i in free)
    return Choice(ranked[0][4], tuple((r[0], r[2], r[3], r[4]) for r in ranked), free, relays)


def _independent(spec: Spec) -> tuple[str, ...] | None:
    """The mesh axes that split the batch alike for a, b and the result where
    their matrices are split nowhere (and a, b and the result have the same
    batch dimensions): independent products. Else None."""
    dists = spec.distributions
    assert dists is not None
    if not all(isinstance(d, Sharded) for d in dists) or not spec.batch_shape:
        return None
    a, b, d = cast(tuple[Sharded, Sharded, Sharded], dists)
    nb = len(spec.batch_shape)
    if spec.a_shape[:-2] != spec.batch_shape or spec.b_shape[:-2] != spec.batch_shape:
        return None
    if not (a.ndim == b.ndim == d.ndim == nb + 2) or a.mesh != b.mesh or a.mesh != d.mesh:
        return None
    if a.spec[:nb] != b.spec[:nb] or a.spec[:nb] != d.spec[:nb] or all(e is None for e in a.spec[:nb]):
        return None
    if any(e is not None for x in (a, b, d) for e in x.spec[nb:]):
        return None
    if spec.bias_shape is not None and len(spec.bias_shape) > 2:
        return None
    return tuple(n for i in range(nb) for n in a.axes(i))


class LocalPlan(_backends.BackendPlan):
    """Under ``mpiexec``: the batch split alike for a, b and the result, the
    matrices whole on each rank: each rank multiplies its own items."""

    algorithm = "local"

    def __init__(self, spec: Spec, axes: tuple[str, ...]) -> None:
        self.spec = spec
        self.axes = axes

    @property
    def cost(self) -> Plan | None:
        return None  # nothing is communicated

    def execute(self, operands: Operands) -> Any:
        spec = self.spec
        fam = operands.family
        xp = array_module(fam)
        a, b = xp.asarray(operands.a), xp.asarray(operands.b)
        if spec.transpose_a:
            a = xp.swapaxes(a, -1, -2)
        if spec.transpose_b:
            b = xp.swapaxes(b, -1, -2)
        work = work_dtype(numpy_dtype(spec.result_dtype))
        with precise(spec.result_dtype):
            acc = xp.matmul(a.astype(work), b.astype(work))
            bias = None if not spec.has_bias else xp.asarray(operands.bias)
            return epilogue_apply(
                xp, acc, alpha=spec.scaled_alpha, beta=spec.beta,
                c=xp.asarray(operands.c) if spec.use_c else None, bias=bias, epilog=spec.epilog,
                out_dtype=numpy_dtype(spec.result_dtype), bias_columns=spec.bias_columns,
            )

    def explain(self) -> list[str]:
        return [f"kernel:     local: the batch is split alike over mesh axes {self.axes} for a, b and the result, "
                "and their matrices are whole on each rank: each rank multiplies its own items; nothing moves"]

    def free(self) -> None:
        pass


class RelayPlan(_backends.BackendPlan):
    """The operands re-laid into the 2-D layouts the plan of ``inner`` takes,
    that plan run, and its result re-laid into the result's Sharded."""

    def __init__(self, spec: Spec, inner: Spec, backend: Any, operands: Operands, choice: Choice) -> None:
        self.spec = spec
        self.inner = inner
        self.backend = backend
        self.choice = choice
        dists, taken = spec.distributions, inner.distributions
        assert dists is not None and taken is not None
        # the ranks whose blocks move: under mpiexec, each rank's; in one process a jax.Array's device
        # blocks move as well (counted over the Sharded's mesh), host arrays are only placed
        sharded = next(d for d in dists if isinstance(d, Sharded))
        p = spec.nprocs if spec.spmd else sharded.mesh.size if spec.family == "jax" else None
        self.relays: list[Relay] = []
        shapes = {"a": spec.a_shape, "b": spec.b_shape, "c": spec.result_shape, "result": spec.result_shape}
        itemsize = {"a": spec.dtype_info.itemsize, "b": spec.dtype_info.itemsize}
        out_size = int(np.dtype(numpy_dtype(spec.result_dtype)).itemsize)
        self.routes: dict[str, Route] = {}  # under mpiexec: the exchanges to run
        self.counted: dict[str, int] = {}  # the moves counted: operand -> ranks
        pairs = [("a", dists[0], taken[0]), ("b", dists[1], taken[1]), ("result", taken[2], dists[2])]
        if spec.c_shape is not None and spec.use_c:
            pairs.append(("c", dists[2], taken[2]))
        for name, src, dst in pairs:
            if not (isinstance(src, Sharded) or isinstance(dst, Sharded)):
                continue
            shape, got = shapes[name], 0
            if p is not None:  # under mpiexec each rank holds its block: the elements it lacks move
                s_nd, d_nd = as_nd(src, len(shape), p), as_nd(dst, len(shape), p)
                route = Route.of(s_nd, d_nd, shape, p)
                got = max(route.received(r) for r in range(p))
                if spec.spmd and (s_nd != d_nd or got):
                    self.routes[name] = route
                self.counted[name] = len(route.parts)
            self.relays.append(Relay(name, src, dst, shape, got, itemsize.get(name, out_size)))
        self.plan = PLANS.borrow(backend, inner, self._inner_operands(operands, dry=True))
        self.algorithm = self.plan.algorithm

    @property
    def cost(self) -> Plan | None:
        base = self.plan.cost
        moves = tuple(relay_move(r.name, r.nbytes) for r in self.relays if r.nbytes)
        if base is None or not moves:
            return base
        return dataclasses.replace(base, moves=base.moves + moves)

    def _inner_operands(self, operands: Operands, dry: bool = False) -> Operands:
        if not self.spec.spmd or not self.routes:
            return operands
        rt = _runtime.active()
        assert rt is not None
        if dry:  # (blocks of the right shapes: the plan reads their shapes, orders and places only)
            a, b, c = (self._blank(name, getattr(operands, name), rt.rank) for name in ("a", "b", "c"))
        else:
            a, b, c = (self._moved(name, getattr(operands, name), rt) for name in ("a", "b", "c"))
        return Operands(a, b, c, operands.bias)

    def _blank(self, name: str, x: Any, rank: int) -> Any:
        if x is None or name not in self.routes:
            return x
        shape = tuple(len(i) for i in self.routes[name].dst[rank])
        return _in_family(np.zeros(shape, dtype=x.dtype), family(x))

    def _moved(self, name: str, x: Any, rt: Any) -> Any:
        if x is None or name not in self.routes:
            return x
        fam = family(x)
        return _in_family(exchange(x, self.routes[name], rt.rank, rt.comm, x.dtype), fam)

    def execute(self, operands: Operands) -> Any:
        d = self.plan.execute(self._inner_operands(operands))
        if self.spec.spmd:
            if "result" not in self.routes:
                return d
            rt = _runtime.active()
            assert rt is not None
            return _in_family(exchange(d, self.routes["result"], rt.rank, rt.comm, d.dtype), family(d))
        dist = self.spec.distributions[2] if self.spec.distributions is not None else None
        if isinstance(dist, Sharded):
            return self.backend.lay_out(d, as_nd(dist, len(self.spec.result_shape), dist.mesh.size), operands)
        return d

    def explain(self) -> list[str]:
        spmd, moved = self.spec.spmd, bool(self.counted)
        lines = [*_relay_header(self.spec, self.inner)[:1], *self.choice.explain()]
        how = ("under mpiexec each rank gets the elements it lacks in one all-to-all" if spmd else
               "one process: the jax.Arrays' device blocks move between devices" if moved else
               "one process: the global arrays are placed on the devices as the plan takes them")
        lines += [f"re-lay:     {how}: {_fmt_bytes(sum(r.nbytes for r in self.relays))}/rank at most in all"]
        lines += [r.describe(moved) for r in self.relays]
        if not spmd and self.spec.family == "jax":
            lines.append("  (the result is laid out as its Sharded says, replicated where no NamedSharding "
                         "expresses it: uneven)")
        return [*lines, *self.plan.explain()]

    def free(self) -> None:
        self.plan.free()
