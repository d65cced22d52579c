"""Products on layouts a backend does not take as they are, re-laid around a
2-D plan (backend-neutral).

The backends' plans take the 2-D distributions (``Slab``, ``Replicated``,
grids), each rank holding the whole batch of its blocks. A ``Sharded`` that
has no such form (replicated over some mesh axes only, axes cut out of rank
order, a batch dimension split), and 2-D layouts whose product the backend's
library cannot run as given (:meth:`dmatmul.backends.Backend.refuses`: cuBLASMp's
limits, an uneven split next to a 2-D grid, block sizes that differ), are
planned here (:class:`RelayProduct`, standing in for the backend as
:class:`dmatmul._batched.BatchedProduct` does):

* each such operand is taken by the plan in a 2-D layout and re-laid into
  it, the result out of it into the result's Sharded: its own 2-D form where
  only the batch is split; else the one the cost model prices lowest
  (:func:`dmatmul._relay_choice.choose`: ``Slab.X``, ``Slab.Y`` or ``Replicated()``, or next to a
  2-D grid that grid or ``Replicated()``), counting its re-lay's bytes and
  the 2-D plan that then runs (:func:`~dmatmul._relay_choice.taken_as`'s kind-of-split rule breaks
  ties). Only the layouts the backend takes are candidates; where it takes
  none of those, every operand but a Replicated one may be taken as
  ``Slab.X``, ``Slab.Y`` or ``Replicated()`` too (:func:`~dmatmul._relay_choice._options`'s
  ``wide``: 1-D layouts run whatever the sizes). Under ``mpiexec`` the ranks exchange exactly the elements each
  lacks (:func:`dmatmul._route.exchange`, from ``global_indices``: nothing is gathered
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
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from . import _runtime
from . import backends as _backends
from ._distribution import Distribution
from ._epilogue import apply as epilogue_apply
from ._epilogue import work_dtype
from ._errors import DistributionError
from ._moves import _fmt_bytes
from ._plan import Plan
from ._plans import PLANS
from ._problem import Spec
from ._relay_choice import _NAMES, Choice, _on, _options, _taken, choose, refusal, relay_move
from ._route import Route, as_nd, exchange
from ._sharded import Sharded
from ._batched import route
from ._spec import Operands, array_module, family, numpy_dtype, precise

__all__ = ["RelayProduct", "as_given", "check_mesh", "needs_relay"]


def needs_relay(spec: Spec, backend: Any = None) -> bool:
    """Whether ``spec`` names a Sharded that the backends do not take as it is,
    or (A and B read, under mpiexec) 2-D layouts ``backend`` refuses
    (:func:`refusal`). In one process no backend refuses a layout (JAX takes
    any; nvmath runs one rank)."""
    dists = spec.distributions
    if dists is None:
        return False
    if any(isinstance(d, Sharded) for d in dists):
        return True
    return backend is not None and spec.spmd and spec.reads_ab and refusal(backend, spec, spec.nprocs) is not None


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


class RelayProduct(_backends.Backend):
    """The "backend" of a product on layouts ``backend`` does not take as they
    are (Shardeds of no 2-D form, 2-D layouts its library refuses), standing
    in for it. Its plans are made at every call around a plan of the 2-D
    product that the cache holds."""

    cache_size = 0

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.name = backend.name
        self.plans_collectively = backend.plans_collectively

    def _inner(self, spec: Spec, operands: Operands) -> tuple[Spec, Choice]:
        """The 2-D product the plan runs, and why it takes each operand as it does."""
        choice = self._choose(spec, operands)
        return _on(spec, choice.triple), choice

    def _choose(self, spec: Spec, operands: Operands) -> Choice:
        dists = spec.distributions
        assert dists is not None
        sharded = [d for d in dists if isinstance(d, Sharded)]
        p = spec.nprocs if spec.spmd else sharded[0].mesh.size if sharded else self.backend.ranks(spec, operands)
        options = _options(dists)
        rule = cast(tuple[Distribution, Distribution, Distribution], tuple(o[0] for o in options))
        if p == 1 or any(d.mesh.size != p for d in sharded) or (
                all(len(o) == 1 for o in options) and _taken(self.backend, spec, rule, p)):
            # one rank (where every layout is the whole matrix), meshes of other sizes (refused by
            # check_mesh), or one layout each that the backend takes: nothing to choose
            return Choice(rule)
        problem, model, kernels = self.backend.planner(spec, operands, p)
        return choose(spec, p, problem, model, None if kernels is None else tuple(kernels), self.backend)

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
        return algorithm, [*_relay_header(spec, inner, choice), *choice.explain(), *lines]


def _relay_header(spec: Spec, inner: Spec, choice: Choice) -> list[str]:
    assert spec.distributions is not None and inner.distributions is not None
    moved = [(n, d, o) for n, d, o in zip(_NAMES, inner.distributions, spec.distributions)
             if isinstance(o, Sharded) or d != o]
    taken = ", ".join(f"{n} as {d!r}" for n, d, _ in moved)
    lines = []
    if any(isinstance(o, Sharded) for _, _, o in moved):
        lines.append(f"sharded:    the plan takes {taken} (no 2-D distribution it runs lays them out as given)")
    if choice.refused is not None:
        lines.append(f"re-laid:    the plan takes {taken}: the backend cannot run the product on them as given "
                     f"({choice.refused})")
    return lines


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
        sharded = next((d for d in dists if isinstance(d, Sharded)), None)
        p = spec.nprocs if spec.spmd else sharded.mesh.size if spec.family == "jax" and sharded is not None else None
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
            if src == dst:  # (a Sharded is never its 2-D form: its batch may move)
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
        lines = [*_relay_header(self.spec, self.inner, self.choice), *self.choice.explain()]
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
