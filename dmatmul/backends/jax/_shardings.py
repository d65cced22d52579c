"""Shardings and distributions, each way: the distribution a jax.Array's
sharding expresses, the sharding that lays out a distribution, and the result
placed back on the user's mesh."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from ... import _layouts
from ..._distribution import BlockCyclic, BlockNonCyclic, Distribution, ProcessGrid, Replicated, Slab
from ..._problem import Spec
from ..._spec import Operands, check_fit
from ..._mesh import ProcessMesh
from ..._split import MeshSplit, split_product
from . import _layout, _mesh
from ._mesh import (
    _explicit, _mesh_axes, _spec_axes, _staging, _traced, depending_on, mesh_of, plan_devices, trace_mesh,
    user_mesh,
)


def _infer_distribution(x: Any, devices: tuple[jax.Device, ...], name: str = "a") -> Distribution | None:
    """The dmatmul distribution a jax.Array's NamedSharding expresses over
    ``devices`` (rank r = ``devices[r]``), None where the operand has no layout
    over them (one device, another sharding type: the cost model picks).

    Over a mesh whose devices in mesh order are ``devices``: nothing split is
    ``Replicated()``; one dimension split over every mesh axis in mesh order
    is a Slab; rows over the leading axes and columns over the trailing ones
    (or the other way round) is ``BlockNonCyclic`` on a row-major (or
    column-major) grid. Anything else (an axis that replicates, a split that
    is uneven, as JAX and nvmath split uneven sizes differently) raises a
    ValueError naming the operand and its sharding.
    """
    laid = _layout_of(x, devices)
    if laid is None:
        return None
    spec, mesh = laid
    parts = tuple(spec) + (None,) * (2 - len(spec))
    rows, cols = _spec_axes(parts[0], mesh), _spec_axes(parts[1], mesh)
    every = _mesh_axes(mesh)
    size = lambda axes: int(np.prod([mesh.shape[n] for n in axes]))  # noqa: E731
    dist: Distribution | None = None
    if not rows and not cols:
        return Replicated()
    if rows + cols == every or cols + rows == every:
        if not cols:
            dist = Slab.X
        elif not rows:
            dist = Slab.Y
        else:
            layout = "row" if rows + cols == every else "col"
            dist = BlockNonCyclic(ProcessGrid((size(rows), size(cols)), layout=layout))  # type: ignore[arg-type]
    why = ""
    if dist is None:
        left = [n for n in every if n not in rows + cols]
        why = (f"it replicates over mesh axis {', '.join(map(repr, left))}" if left else
               "its axes are not in mesh order")
    elif x.shape[0] % size(rows) or x.shape[1] % size(cols):
        why = (f"shape {tuple(x.shape)} does not divide evenly (JAX and nvmath split uneven sizes "
               "differently)")
    if why:
        raise ValueError(
            f"{name}: its sharding {spec} on mesh {dict(mesh.shape)} is not one of dmatmul's "
            f"distributions: {why}; pass distribution= explicitly (dmatmul then re-lays {name}), or "
            f"shard {name} over every mesh axis in mesh order: PartitionSpec(mesh.axis_names, None) is Slab.X "
            "(rows), PartitionSpec(None, mesh.axis_names) Slab.Y (columns), PartitionSpec() Replicated()"
        )
    return dist


@dataclasses.dataclass(frozen=True)
class Split:
    """A product on a user's mesh cut along its independent axes."""

    mesh: Mesh | AbstractMesh  # the user's
    cut: MeshSplit
    specs: tuple[PartitionSpec, PartitionSpec, PartitionSpec]  # a, b, result on the user's mesh

    def parts(self, axes: tuple[str, ...]) -> int:
        return math.prod(self.mesh.shape[n] for n in axes)

    @property
    def process_mesh(self) -> ProcessMesh:
        return ProcessMesh(tuple(self.mesh.shape.values()), tuple(self.mesh.axis_names))


def find(spec: Spec, operands: Operands, mesh: Mesh | AbstractMesh | None,
         devices: tuple[jax.Device, ...]) -> Split | None:
    """The split of a one-process product on jax.Arrays with ``distribution=None``
    whose shardings are not both 2-D distributions and leave a mesh axis independent (:func:`dmatmul._split.split_product`),
    or None where none does (the product is then planned over every device, as
    its shardings read as 2-D distributions: :func:`._shardings._given_distributions`).
    Not where C is read (``beta``): its sharding says the result's."""
    if spec.distributions is not None or spec.family != "jax" or spec.spmd or mesh is None or spec.use_c:
        return None
    la, lb = _layout_of(operands.a, devices), _layout_of(operands.b, devices)
    # an operand of no placement of its own (numpy) is whole on the other's mesh, as jnp.matmul takes it
    if la is None and lb is not None and not isinstance(operands.a, jax.Array):
        la = (PartitionSpec(), lb[1])
    if lb is None and la is not None and not isinstance(operands.b, jax.Array):
        lb = (PartitionSpec(), la[1])
    if la is None or lb is None or la[1].abstract_mesh != lb[1].abstract_mesh:  # (a constant's is concrete)
        return None
    user = la[1]

    def axes(s: PartitionSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
        parts = tuple(s) + (None,) * (2 - len(s))
        return _spec_axes(parts[0], user), _spec_axes(parts[1], user)

    try:  # shardings that are 2-D distributions over every device: the planner's, as they are
        _infer_distribution(operands.a, devices, "a"), _infer_distribution(operands.b, devices, "b")
        return None
    except ValueError:
        pass
    cut = split_product(dict(user.shape), axes(la[0]), axes(lb[0]), spec.transpose_a, spec.transpose_b)
    if cut is None:
        return None
    return Split(user if isinstance(mesh, AbstractMesh) else mesh, cut,
                 (la[0], lb[0], PartitionSpec(*cut.result)))


def _given_distributions(spec: Spec, operands: Operands, devices: tuple[jax.Device, ...]) -> _layouts.Fixed:
    """With ``distribution=None``: the distributions a's, b's and (where it is
    read) c's shardings express over ``devices`` (:func:`_infer_distribution`;
    ``c`` says the result's), None where one says nothing."""
    c = operands.c if spec.use_c else None
    return (_infer_distribution(operands.a, devices, "a"), _infer_distribution(operands.b, devices, "b"),
            None if c is None else _infer_distribution(c, devices, "c"))


def _layout_of(x: Any, devices: tuple[jax.Device, ...]) -> tuple[PartitionSpec, Mesh | AbstractMesh] | None:
    """The PartitionSpec and mesh that place ``x`` over ``devices`` (rank r =
    ``devices[r]``): a jax.Array's NamedSharding on a mesh whose devices in mesh
    order are ``devices``, or the sharding in a traced value's type where every
    axis that splits is Explicit (its positions in mesh order are the ranks);
    None where nothing says (one device, Auto axes in a trace, another sharding).
    A tracer with a concrete value behind it (an eager ``jax.vjp``'s or
    ``jax.jvp``'s primal) is laid out as that value is, Auto axes too."""
    if isinstance(x, jax.core.Tracer):
        sharding = jax.typeof(x).sharding
        mesh = sharding.mesh
        split = [n for n, size in mesh.shape.items() if size > 1]
        if mesh.empty or mesh.size != len(devices) or any(n not in mesh.explicit_axes for n in split):
            behind = _mesh._concrete(x)
            return None if behind is None or isinstance(behind, jax.core.Tracer) else _layout_of(behind, devices)
        return sharding.spec, mesh
    if not isinstance(x, jax.Array):
        return None
    sharding = x.sharding
    if not isinstance(sharding, NamedSharding) or tuple(sharding.mesh.devices.flat) != devices:
        return None
    return sharding.spec, sharding.mesh


def _plain(dist: Distribution, shape: tuple[int, int]) -> Distribution:
    """``dist`` as the BlockNonCyclic it is on a ``shape`` matrix where it is a
    BlockCyclic dealing each grid process one block, its whole even share (or
    every block, along a grid dimension of one); else ``dist`` itself.

    >>> g = ProcessGrid((2, 2))
    >>> _plain(BlockCyclic(g, (8, 4)), (16, 8)) == BlockNonCyclic(g), _plain(BlockCyclic(g, (4, 4)), (16, 8))
    (True, BlockCyclic(ProcessGrid((2, 2), layout='row'), (4, 4)))
    """
    if isinstance(dist, BlockCyclic) and all(
        procs == 1 or block * procs == size for procs, block, size in zip(dist.grid.shape, dist.block_sizes, shape)
    ):
        return BlockNonCyclic(dist.grid, first_process=dist.first_process)
    return dist


def _sharding_of(dist: Distribution, mesh: Mesh | AbstractMesh, shape: tuple[int, int]) -> NamedSharding | None:
    """The inverse of :func:`_infer_distribution`: ``dist`` as a NamedSharding on
    ``mesh`` (ranks in mesh order), or None where no NamedSharding says it.

    Every mesh axis is named, those of size 1 too: a Slab is
    ``P(mesh.axis_names, None)``, as a user writes it, and a grid's rows and
    columns each name an axis where they can (``P("data", "model")`` on a 1x8
    mesh). JAX types ``P(("data", "model"))`` and ``P("model")`` apart even
    where "data" has size 1, and refuses ``x + y`` of the two on Explicit axes."""
    dist = _plain(dist, shape)
    every = tuple(mesh.axis_names)
    size = lambda axes: int(np.prod([mesh.shape[n] for n in axes]))  # noqa: E731
    p = size(every)
    if isinstance(dist, Replicated) or p == 1:
        return NamedSharding(mesh, PartitionSpec())
    if isinstance(dist, Slab):
        if shape[dist.dim] % p:
            return None
        return NamedSharding(mesh, PartitionSpec(every, None) if dist.dim == 0 else PartitionSpec(None, every))
    if isinstance(dist, BlockNonCyclic) and dist.first_process == (0, 0):
        rows, cols = dist.grid.shape
        if shape[0] % rows or shape[1] % cols:
            return None
        major, minor = (rows, cols) if dist.grid.layout == "row" else (cols, rows)
        splits = [i for i in range(len(every) + 1) if (size(every[:i]), size(every[i:])) == (major, minor)]
        if not splits:
            return None
        i = next((i for i in splits if 0 < i < len(every)), splits[0])  # both sides named where they can be
        head, tail = every[:i] or None, every[i:] or None
        return NamedSharding(mesh, PartitionSpec(head, tail) if dist.grid.layout == "row" else PartitionSpec(tail, head))
    return None


def _unexpressed(dist: Distribution, geom: _layout.Geometry, shape: tuple[int, int]) -> str | None:
    """Why no sharding on ``geom``'s mesh lays a ``shape`` matrix out as ``dist``
    says (JAX shards only in even blocks, in order), or None where one does."""
    dist = _plain(dist, shape)
    if _layout.placement_of(dist, geom, shape, (None, None)).identity:
        return None
    if isinstance(dist, Slab):
        what = ("rows", "columns")[dist.dim]
        return f"{shape[dist.dim]} {what} do not split evenly over {geom.nranks} devices"
    assert isinstance(dist, (BlockNonCyclic, BlockCyclic))  # Replicated() is always expressed
    rows, cols = dist.grid.shape
    mb, nb = dist.block_sizes if isinstance(dist, BlockCyclic) else shape
    if mb * rows < shape[0] or nb * cols < shape[1]:
        return f"its {mb}x{nb} blocks are dealt cyclically over the {rows}x{cols} grid"
    if dist.first_process != (0, 0):
        return f"its first block is on grid process {dist.first_process}, not (0, 0)"
    return f"{shape[0]}x{shape[1]} does not split evenly over the {rows}x{cols} grid"


def _on_mesh(dist: Distribution, mesh: Mesh | AbstractMesh, shape: tuple[int, int]) -> NamedSharding:
    """Where a ``shape`` result laid out as ``dist`` goes on ``mesh``: the
    NamedSharding ``dist`` implies (:func:`_sharding_of`), else replicated."""
    found = _sharding_of(dist, mesh, shape)
    return found if found is not None else NamedSharding(mesh, PartitionSpec())


def _typed_on(d: jax.Array, sharding: NamedSharding) -> jax.Array:
    """Traceable: ``d`` typed on ``sharding`` (a reshard on Explicit axes, a
    sharding constraint on Auto ones). On a mesh of both kinds the type names
    the Explicit axes only (as JAX types such an array), and the Auto ones are
    left to XLA, as for any value there."""
    mesh = sharding.mesh
    if not _explicit(mesh):
        return jax.lax.with_sharding_constraint(d, sharding)
    explicit = set(mesh.abstract_mesh.explicit_axes)

    def typed(entry: Any) -> Any:
        names = tuple(n for n in (entry if isinstance(entry, tuple) else (entry,)) if n in explicit)
        return None if not names else names[0] if len(names) == 1 else names

    return jax.sharding.reshard(d, NamedSharding(mesh, PartitionSpec(*map(typed, sharding.spec))))


def place_result(d: jax.Array, spec: Spec, operands: Operands) -> jax.Array:
    """One process: an empty product's result (computed on the default device)
    where a product with elements would put it: on the user's mesh (or the
    devices asked for) with the NamedSharding its distribution implies, else
    replicated there (also when it has no elements at all: nothing to split, and
    JAX misreads zero-size shards); inside a trace, typed so on the trace's mesh.
    With no distribution given, c's sharding (where c is read) says the
    result's, as it does for a product with elements."""
    mesh = mesh_of(spec, operands)
    cut = find(spec, operands, mesh, plan_devices(spec, mesh))
    shape = (spec.m, spec.n)
    if d.size == 0 and not isinstance(d, jax.core.Tracer):
        # no values to move: placed anew from the host (JAX moves a zero-size array split over devices, as an
        # empty C's blocks on Explicit axes leave it, as if each device held it whole, and raises)
        d = jax.numpy.zeros(d.shape, d.dtype)  # (on the default device, whole)
    if spec.distributions is not None:
        dist = spec.distributions[2]
    elif cut is None:
        dist = _given_distributions(spec, operands, plan_devices(spec, mesh))[2] or Replicated()
    if 0 in shape or 0 in spec.batch_shape:
        dist, cut = Replicated(), None
    if cut is not None:  # mesh axes the shardings leave independent: the result as a product's (:mod:`._independent`)
        sharding = NamedSharding(cut.mesh, cut.specs[2])
        if _traced(operands):
            return _typed_on(depending_on(d, operands.a, operands.b), sharding)
        return jax.device_put(d, sharding)
    if _traced(operands) and mesh is not None:
        # a and b are otherwise unused, and a jit drops unused arguments: with them the only names of its
        # devices (an abstract mesh's); and under jvp a result that depends on neither gets a tangent JAX makes
        # from its type alone (on its default device; on Explicit axes outside set_mesh, none)
        d = depending_on(d, operands.a, operands.b, None if spec.use_c else operands.c)
        return _typed_on(d, _on_mesh(dist, mesh, shape))
    if isinstance(mesh, Mesh):
        return jax.device_put(d, _on_mesh(dist, mesh, shape))
    devices = _layout.resolve_devices(spec.devices)
    geom = _layout.Geometry.create(devices, dist.grid if dist.grid is not None and dist.grid.ndim == 2 else None)
    placement = _layout.placement_of(dist, geom, shape, (None, None))
    sharding = geom.sharding(placement) if _layout.expressible(placement) else geom.replicated()
    if _traced(operands):  # a value of the trace (a constant's placement would not reach its output)
        return jax.jit(lambda x: x, out_shardings=sharding)(d)
    return jax.device_put(d, sharding)


def _fit_devices(src: Distribution, dst: Distribution, p: int, *, spmd: bool = False) -> None:
    """``dm.redistribute``'s ``src`` and ``dst`` span the ``p`` devices in use,
    else a DistributionError naming the one that does not (as a product's
    operands are named: with the ``devices=`` that would fit, in one process)."""
    check_fit((src, dst), p, spmd=spmd, available=len(jax.local_devices()), names=("src", "dst"))


def _redistribute_traced(
    x: jax.Array, src: Distribution, dst: Distribution, *, shape: tuple[int, int], devices: Any
) -> jax.Array:
    """One process, ``x`` a value of a trace (``jit``, ``grad``, ``vmap``...): the
    global matrix, its values unchanged, laid out as ``dst`` says on the mesh a
    product of the same trace runs on (:func:`mesh_of`): the user's (the one in
    ``x``'s type, or of ``jax.set_mesh``) unless ``devices=`` says otherwise, else
    inside ``jit`` dmatmul's one mesh of the trace (:func:`trace_mesh`), else (an
    eager ``grad``, ``jvp`` or ``vmap``) dmatmul's own mesh, as outside any trace.
    A layout no sharding of it expresses comes back replicated, as a product's
    result does. (The moves of :mod:`._redistribute` read the concrete shards,
    which a trace does not have: inside one, XLA moves the blocks.)"""
    operands = Operands(x, None)
    mesh = user_mesh(operands) if devices is None else None
    devs = tuple(mesh.devices.flat) if isinstance(mesh, Mesh) else (
        _layout.resolve_devices(mesh.size) if mesh is not None else _layout.resolve_devices(devices))
    _fit_devices(src, dst, len(devs))
    if mesh is None and _staging(operands) and len(devs) > 1:
        mesh = trace_mesh(devs)
    if mesh is not None:
        if jax.typeof(x).sharding.mesh.explicit_axes and jax.typeof(x).sharding.mesh != mesh.abstract_mesh:
            x = _mesh._auto_typed(x)  # on another mesh than its type's: a change of type only, then placed
        return _typed_on(x, _on_mesh(Replicated() if 0 in shape else dst, mesh, shape))
    geom = _layout.Geometry.create(devs, dst.grid if dst.grid is not None and dst.grid.ndim == 2 else None)
    placement = _layout.placement_of(dst, geom, shape, (None, None))
    sharding = geom.sharding(placement) if 0 not in shape and _layout.expressible(placement) else geom.replicated()
    if _mesh._in_vmap():  # each matrix of the batch laid out (a device_put would split the batch axis)
        return jax.jit(lambda v: jax.lax.with_sharding_constraint(v, sharding))(x)
    return jax.device_put(x, sharding)
