"""The JAX backend: plan (roles, padding, kernel) and execute (jit over shard_map)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from ... import _cost, _memory, _plan, _runtime
from ...algorithms import ALGORITHMS
from ..._distribution import BlockCyclic, BlockNonCyclic, Distribution, ProcessGrid, Replicated, Slab
from ..._lru import LRU
from ..._spec import Operands, Spec, check_fit
from ._arrays import context_mesh, in_program
from ._arrays import in_trace as in_jax_trace
from . import _exchange, _kernels, _layout, _start
from . import _redistribute as _moves

__all__ = ["JaxBackend", "JaxPlan"]

def _x64(dtype: str) -> contextlib.AbstractContextManager[Any]:
    """64-bit dtypes need JAX's x64 mode: enable it for dmatmul's own calls only."""
    # jax.config sets its options as attributes at run time: its class declares none of them
    if dtype in ("float64", "complex128") and not jax.config.jax_enable_x64:  # type: ignore[attr-defined]
        return jax.enable_x64(True)
    return contextlib.nullcontext()


_PRECISIONS = {
    None: None,  # jax.default_matmul_precision, as jnp.dot
    "default": jax.lax.Precision.DEFAULT,
    "high": jax.lax.Precision.HIGH,
    "highest": jax.lax.Precision.HIGHEST,
}


_OPERANDS = ("a", "b", "d", "bias")  # the compiled function's arguments: a, b, C (as "d": D's layout), bias


def _product_grid(dists: tuple[Distribution, ...]) -> ProcessGrid | None:
    """The process grid a product runs on: the one most of its operands use
    (ties: the result's, then a's, then b's); None when none uses a grid.

    >>> from dmatmul import BlockCyclic
    >>> g, h = ProcessGrid((2, 2)), ProcessGrid((2, 2), layout="col")
    >>> _product_grid((BlockCyclic(h, (2, 2)), Slab.X, BlockNonCyclic(g))) == g
    True
    """
    grids = [d.grid for d in dists if d.grid is not None and d.grid.ndim == 2]
    if not grids:
        return None
    order = [dists[2].grid, dists[0].grid, dists[1].grid]
    return max(grids, key=lambda g: (grids.count(g), -order.index(g)))


def _inside_shard_map(manual: Sequence[str]) -> str:
    return (
        f"dm.matmul was called inside jax.shard_map (manual mesh axes {tuple(manual)}), where a, b and c are "
        "each device's blocks, not global matrices: inside shard_map use dmatmul.jax.allgather_matmul(x, y, "
        "axis_name=...) or dmatmul.jax.matmul_reduce_scatter(...), the ring kernels as building blocks, or call "
        "dm.matmul outside the shard_map on the global arrays"
    )


def _split_vmap(operands: Operands) -> str | None:
    """Why a product inside ``jax.vmap`` whose batch axis is split over Explicit
    mesh axes cannot run (None where it is not): JAX takes those axes out of
    the body's mesh, and a product on a mesh of dmatmul's (whatever its devices)
    meets their names there (JAX's KeyError). JAX says which vmap it is only
    privately: without that answer, None."""
    try:
        from jax._src.core import trace_ctx
    except ImportError:  # pragma: no cover - a JAX without it
        return None
    trace = trace_ctx.trace
    while trace is not None:
        axes = getattr(getattr(trace, "axis_data", None), "explicit_mesh_axis", None)
        if axes:
            break
        trace = getattr(trace, "parent_trace", None)
    else:
        return None

    def batched(x: Any) -> bool:  # a value of that vmap, or (under grad or jvp inside it) one's primal
        while isinstance(x, jax.core.Tracer):
            if getattr(x, "_trace", None) is trace:
                return True
            x = getattr(x, "primal", None)
        return False

    names = [n for n, x in zip(("a", "b", "c"), (operands.a, operands.b, operands.c)) if batched(x)]
    names = names or ["a batched operand"]
    return (
        f"{', '.join(names)}: dm.matmul was called inside jax.vmap over a batch axis split over Explicit mesh "
        f"axis {', '.join(map(repr, axes))}; dmatmul lays each matrix of a batch out as its distribution says, "
        "over the whole mesh, the batch axis not split. Reshard the batched operand with its batch axis "
        "unsplit before jax.vmap (jax.sharding.reshard(x, PartitionSpec(None, ...))), or use Auto mesh axes"
    )


def depending_on(d: jax.Array, *unused: Any) -> jax.Array:
    """``d`` as it is, made to depend on each of the operands ``unused`` that are
    a trace's values (None: none), with a zero derivative.

    An operand that a result does not use (C with beta = 0; A and B of an
    empty product) gets from eager ``vjp`` a symbolic zero cotangent, which JAX
    then makes from its type alone; on a mesh with Explicit axes outside
    ``jax.set_mesh`` it cannot (JAX raises about lowering platforms, as it does
    for ``jax.vjp(lambda x, y: 2 * x, x, y)``). A select on a constant False
    keeps each one, as ``jnp.dot``'s users' ``beta * c`` would, without reading
    its values (NaN or Inf in C stay out of the result, as BLAS has it) and
    without changing any of ``d``'s bits. (A cotangent left on one device,
    uncommitted, still fails there: JAX cannot broadcast its sum onto an
    Explicit type, as ``jax.vjp(lambda x: x - x.sum(), x)`` shows.)"""
    for x in unused:
        if not isinstance(x, jax.core.Tracer):
            continue
        s = jnp.sum(x)
        s = jnp.real(s) if jnp.iscomplexobj(s) and not jnp.iscomplexobj(d) else s
        d = d - jnp.where(False, s.astype(d.dtype), 0)  # x - (+0.0) is x, bit for bit (-0.0, NaN, Inf too)
    return d


def _same(x: Any) -> Any:
    return x


def _traced(operands: Operands) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in (operands.a, operands.b, operands.c, operands.bias))


def _tracing(operands: Operands) -> bool:
    """Whether the product runs inside a user's trace: on its values, or on constants of it."""
    return in_jax_trace(operands.a, operands.b, operands.c, operands.bias)


def _staging(operands: Operands) -> bool:
    """Whether the product is staged into one computation with others: a
    ``jit`` (or ``scan``, ``checkpoint``...) traces now, under any eager
    ``grad``, ``jvp`` or ``vmap`` (without JAX's answer, whether any
    transformation traces)."""
    found = _tracing_with("partial_eval", "DynamicJaxprTrace")
    return _tracing(operands) if found is None else found


def _in_vmap() -> bool:
    """Whether a ``jax.vmap`` is tracing now: its values carry a batch axis that
    the product's shardings do not name, and JAX's ``device_put`` applies a
    sharding to the batched value as given (splitting the batch axis, or
    refusing where its length does not divide), unlike ``with_sharding_constraint``
    and ``jit``'s shardings, which skip it. Without JAX's answer, False."""
    return bool(_tracing_with("batching", "BatchTrace"))


def _tracing_with(module: str, kind: str) -> bool | None:
    """Whether a trace of ``jax._src.interpreters.<module>.<kind>`` is among the
    traces now active (innermost to outermost); None where JAX does not say
    (it says so only privately)."""
    try:
        from importlib import import_module

        from jax._src.core import trace_ctx
        cls = getattr(import_module(f"jax._src.interpreters.{module}"), kind)
    except (ImportError, AttributeError):  # pragma: no cover - a JAX without them
        return None
    trace = trace_ctx.trace
    while trace is not None:
        if isinstance(trace, cls):
            return True
        trace = getattr(trace, "parent_trace", None)
    return False


def _concrete(x: Any) -> Any:
    """``x``, or the concrete array a tracer stands for where JAX has one (the
    primal of ``jvp``/``vjp`` around a constant of a trace, or an eager value),
    else None."""
    if not isinstance(x, jax.core.Tracer):
        return x
    try:
        from jax._src.core import to_concrete_value
    except ImportError:  # pragma: no cover - a JAX without it
        return None
    return to_concrete_value(x)


def _type_mesh(x: Any) -> AbstractMesh | None:
    """The mesh in a traced value's type (a committed array's, Explicit axes
    or Auto), None where its type names none."""
    if not isinstance(x, jax.core.Tracer):
        return None
    mesh = jax.typeof(x).sharding.mesh
    return mesh if isinstance(mesh, AbstractMesh) and not mesh.empty else None


def _context_mesh() -> Mesh | None:
    mesh = context_mesh()
    return mesh if isinstance(mesh, Mesh) else None


def user_mesh(operands: Operands) -> Mesh | AbstractMesh | None:
    """The mesh a user placed the ``jax.Array`` operands on (one process), or
    the mesh of ``jax.set_mesh``; None when there is none. A mesh of one
    device is the user's too: the product runs there, and the result comes
    back there (it was spread over every local device, and inside ``jit``
    JAX refused the operands' one device, or the context's, and those).

    Inside a trace (``jit``, ``grad``...) the operands' types or the context
    may name only an *abstract* mesh (no devices): the traced computation's
    own devices, in its own order, then stand for the ranks
    (:meth:`JaxPlan._traced_function`). The arrays behind ``jvp``'s and
    ``vjp``'s tracers (eager values, constants of a ``jit``) name their mesh
    as the arrays themselves do: a ``jit`` of constants has no devices of its
    own to stand for the ranks."""
    for x in map(_concrete, (operands.a, operands.b, operands.c)):
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
            sharding = x.sharding
            if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh) and not sharding.mesh.empty:
                return sharding.mesh
    if _tracing(operands):
        typed = next((m for m in map(_type_mesh, (operands.a, operands.b, operands.c)) if m is not None), None)
        context = jax.sharding.get_abstract_mesh()
        mesh = typed if typed is not None else context if not context.empty else None
        concrete = _context_mesh()
        if mesh is not None and concrete is not None and concrete.shape_tuple == mesh.shape_tuple:
            if concrete.axis_types != mesh.axis_types:  # inside jax.sharding.explicit_axes or auto_axes: its types
                return Mesh(concrete.devices, concrete.axis_names, axis_types=mesh.axis_types)
            return concrete
        return mesh
    try:
        context_mesh = jax.sharding.get_mesh()
    except ValueError:  # no concrete mesh to read
        return None
    if isinstance(context_mesh, Mesh) and not context_mesh.empty:
        return context_mesh
    return None


def _auto_typed(x: jax.Array) -> jax.Array:
    """``x`` typed with Auto axes on its own mesh where its type has Explicit
    ones (as ``jax.sharding.auto_axes`` does, without needing ``jax.set_mesh``):
    a change of type only, its layout stays."""
    mesh = jax.typeof(x).sharding.mesh
    if mesh.empty or not mesh.explicit_axes:
        return x
    with jax.sharding.use_abstract_mesh(mesh.update_axis_types({n: AxisType.Auto for n in mesh.explicit_axes})):
        return jax.sharding.reshard(x, PartitionSpec(*[None] * x.ndim))


def mesh_of(spec: Spec, operands: Operands) -> Mesh | AbstractMesh | None:
    """The user's mesh a one-process product on jax.Arrays runs on (:func:`user_mesh`),
    unless ``devices=`` says otherwise; None under mpiexec and for other arrays."""
    if not in_program(spec):
        return None
    mesh = user_mesh(operands) if spec.devices is None else None
    if mesh is not None or not _tracing(operands):
        return mesh
    devices = _layout.resolve_devices(spec.devices)
    context = jax.sharding.get_abstract_mesh()
    if spec.devices is not None and not context.empty and context.size > 1:
        # a trace under jax.set_mesh runs on that mesh: devices= may name it, in mesh order
        concrete = _context_mesh()
        if concrete is not None and tuple(concrete.devices.flat) == devices:
            return concrete
        raise ValueError(_devices_in_context(spec.devices, devices, concrete or context))
    return trace_mesh(devices) if len(devices) > 1 and _staging(operands) else None


def _devices_in_context(given: Any, devices: tuple[jax.Device, ...], mesh: Mesh | AbstractMesh) -> str:
    ids = [d.id for d in devices]
    on = f"devices {[d.id for d in mesh.devices.flat]}" if isinstance(mesh, Mesh) else f"{mesh.size} devices"
    return (
        f"devices={given!r} (device ids {ids}) inside a JAX transformation under jax.set_mesh, whose mesh "
        f"{dict(mesh.shape)} spans {on}: a traced product runs on the context mesh. Leave devices= out "
        "(the ranks are then the mesh's devices in mesh order), pass that mesh's devices in mesh order, or "
        "call dm.matmul outside jax.set_mesh"
    )


@functools.lru_cache(maxsize=16)
def trace_mesh(devices: tuple[jax.Device, ...]) -> Mesh:
    """Inside a trace that names no mesh (operands on no mesh, no ``jax.set_mesh``):
    the one mesh every product of that trace over ``devices`` is typed on, its
    devices in rank order, one axis per prime factor of their number, smallest
    first (``dm0``, ``dm1``, ...).

    One computation lists its devices in one order, and JAX names a jitted
    output's sharding by the mesh of the computation's first sharding: on
    meshes of their own (a grid's, a Slab's), two products in one ``jit``
    clashed, or their result could not be named. On this mesh a grid's blocks
    are rows over its leading axes and columns over the others (or the other
    way round for a grid of column order): every grid of 2**k devices, and a
    result no sharding of it lays out comes back replicated, as for a user's mesh.

    >>> import jax
    >>> m = trace_mesh(tuple(jax.devices()[:4]))
    >>> dict(m.shape)
    {'dm0': 2, 'dm1': 2}
    """
    factors, n, f = [], len(devices), 2
    while n > 1:
        while n % f:
            f += 1
        factors.append(f)
        n //= f
    names = tuple(f"dm{i}" for i in range(len(factors)))
    return Mesh(np.array(devices, dtype=object).reshape(factors), names, axis_types=(AxisType.Auto,) * len(factors))


def _explicit(mesh: Mesh | AbstractMesh) -> bool:
    """Whether the mesh has an Explicit axis (JAX then types shardings on it; on
    one of size 1 too, so that a value typed there must be resharded onto it,
    and a sharding constraint may not name that axis)."""
    return bool(mesh.abstract_mesh.explicit_axes)


def plan_devices(spec: Spec, mesh: Mesh | AbstractMesh | None) -> tuple[jax.Device, ...]:
    """The ranks of a one-process product: a user mesh's devices in mesh order;
    for an abstract (traced) mesh the first as many local devices, which stand
    for the trace's own (only their number and platform are used)."""
    if isinstance(mesh, Mesh):
        return tuple(mesh.devices.flat)
    if mesh is not None:
        return _layout.resolve_devices(mesh.size)
    return _layout.resolve_devices(spec.devices)


def _mesh_axes(mesh: Any) -> tuple[str, ...]:
    """The mesh axes that split anything (size > 1), in mesh order."""
    return tuple(name for name, size in mesh.shape.items() if size > 1)


def _spec_axes(part: Any, mesh: Any) -> tuple[str, ...]:
    names = () if part is None else (part,) if isinstance(part, str) else tuple(part)
    return tuple(n for n in names if mesh.shape[n] > 1)


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


def _given_distributions(spec: Spec, operands: Operands, devices: tuple[jax.Device, ...]) -> _plan.Fixed:
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
    None where nothing says (one device, Auto axes in a trace, another sharding)."""
    if isinstance(x, jax.core.Tracer):
        sharding = jax.typeof(x).sharding
        mesh = sharding.mesh
        split = [n for n, size in mesh.shape.items() if size > 1]
        if mesh.empty or mesh.size != len(devices) or any(n not in mesh.explicit_axes for n in split):
            return None
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
    if spec.distributions is not None:
        dist = spec.distributions[2]
    else:
        dist = _given_distributions(spec, operands, plan_devices(spec, mesh))[2] or Replicated()
    shape = (spec.m, spec.n)
    if 0 in shape:
        dist = Replicated()
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
            x = _auto_typed(x)  # on another mesh than its type's: a change of type only, then placed
        return _typed_on(x, _on_mesh(Replicated() if 0 in shape else dst, mesh, shape))
    geom = _layout.Geometry.create(devs, dst.grid if dst.grid is not None and dst.grid.ndim == 2 else None)
    placement = _layout.placement_of(dst, geom, shape, (None, None))
    sharding = geom.sharding(placement) if 0 not in shape and _layout.expressible(placement) else geom.replicated()
    if _in_vmap():  # each matrix of the batch laid out (a device_put would split the batch axis)
        return jax.jit(lambda v: jax.lax.with_sharding_constraint(v, sharding))(x)
    return jax.device_put(x, sharding)


def summa_schedule(k_a: _layout.DimMap, k_b: _layout.DimMap) -> _kernels.SummaSchedule:
    """SUMMA's panels from op(A)'s K map (over grid columns) and op(B)'s (over
    grid rows): runs of consecutive k held by one grid column of A and one grid
    row of B at consecutive local positions, cut to their greatest common
    length. A shorter last run (K not a multiple of the block) is read with
    zero padding after it rather than shrinking every panel.

    >>> s = summa_schedule(_layout.DimMap.slab(8, 2), _layout.DimMap.slab(8, 4))
    >>> s.width, s.owner_col, s.owner_row, s.offset_a, s.offset_b
    (2, (0, 0, 1, 1), (0, 1, 2, 3), (0, 2, 0, 2), (0, 0, 0, 0))
    >>> cyc = lambda n, nb, p: _layout.DimMap.of_parts(n, [[g for g in range(n) if g // nb % p == q] for q in range(p)])
    >>> s = summa_schedule(cyc(9, 4, 2), cyc(9, 4, 2))  # blocks of 4, a last block of 1
    >>> s.width, s.offset_a, s.extent_a
    (4, (0, 0, 4), 8)
    """
    size = k_a.size
    owner, pos = np.empty((2, size), np.int64), np.empty((2, size), np.int64)
    for which, m in enumerate((k_a, k_b)):
        for part, ids in enumerate(m.parts):
            owner[which, list(ids)] = part
            pos[which, list(ids)] = np.arange(len(ids))
    cut = np.ones(size, bool)
    cut[1:] = np.any(owner[:, 1:] != owner[:, :-1], axis=0) | np.any(pos[:, 1:] != pos[:, :-1] + 1, axis=0)
    starts = np.nonzero(cut)[0]
    lengths = np.diff(np.append(starts, size))
    # every run but the last (which ends both owners' local K) must be a whole number of panels
    width = int(np.gcd.reduce(lengths[:-1])) if len(lengths) > 1 else int(lengths[0])
    steps = np.concatenate([np.arange(s, s + n, width) for s, n in zip(starts, lengths)])
    return _kernels.SummaSchedule(
        width=width,
        owner_col=tuple(int(x) for x in owner[0, steps]),
        offset_a=tuple(int(x) for x in pos[0, steps]),
        owner_row=tuple(int(x) for x in owner[1, steps]),
        offset_b=tuple(int(x) for x in pos[1, steps]),
        extent_a=int(max(pos[0, steps]) + width),
        extent_b=int(max(pos[1, steps]) + width),
    )


#: SUMMA's placements of a, b and the result, and its schedule of K panels
_SummaLayout = tuple[dict[str, _layout.Placement], _kernels.SummaSchedule]


class JaxPlan:
    """A compiled product on a set of JAX devices (one or several processes).

    ``given`` holds where each operand is (its distribution's placement),
    ``kernel`` where the chosen algorithm needs it; the jitted function moves
    operands from one to the other (:func:`_exchange.redistribute`), runs the
    ``shard_map`` kernel, and moves the result back.
    """

    plan: _plan.Plan  # the chosen algorithm and its cost (:meth:`_choose`)

    def __init__(self, spec: Spec, operands: Operands) -> None:
        self.spec = spec
        # the user's mesh (jax.Array operands placed on one, or jax.set_mesh): its devices in mesh order are
        # the ranks, and the result goes back onto it
        self.user_mesh = mesh_of(spec, operands)
        # inside a user's trace on a mesh: the trace's devices, in its order, are the ranks, and the result is
        # typed on the user's mesh (:meth:`_traced_function`)
        self.traced = self.user_mesh is not None and _tracing(operands)
        self._twin: JaxPlan | None = None  # this plan's traced form, for a call inside a trace on constants
        self.devices = _layout.process_devices(spec.nprocs) if spec.spmd else plan_devices(spec, self.user_mesh)
        self.nranks = p = len(self.devices)
        self.model = _cost.model_for(self.devices[0].platform, p)
        info = spec.dtype_info
        acc_dtype = jnp.dtype(info.accumulator)
        # XLA's CPU compiler carries bfloat16 through its collectives as float32 (and contract() widens it for
        # the GEMM): on CPU devices a bfloat16 element moves as 4 bytes, which the plan's bytes then count
        itemsize = 4 if spec.dtype == "bfloat16" and self.devices[0].platform == "cpu" else info.itemsize
        self.problem = _plan.Problem1D(spec.m, spec.n, spec.k, p, itemsize, info.acc_itemsize, pads=True)
        grid, laid = self._lay_out(operands)
        kern, summa, shared = self._choose(grid, laid)
        schedule = self._place(kern, summa, shared)
        self.local = self._local_problem(kern, shared, schedule, acc_dtype)
        self.epilogue = _kernels.Epilogue(
            alpha=spec.alpha,
            beta=spec.beta,
            epilog=spec.epilog,
            use_c=spec.use_c,
            has_bias=spec.has_bias,
            out_dtype=jnp.dtype(spec.dtype),
            bias_columns=spec.bias_columns,
        )
        if ALGORITHMS[kern.algorithm].grid and p > 1:
            self.plan = self._summa_cost(self.plan)
        self.algorithm = self.plan.algorithm
        self._compiled: dict[str, Any] = {}
        self._needs: tuple[list[_memory.Need], dict[str, _memory.Probe]] | None = None
        self._targets: dict[str, NamedSharding] = {}  # where each jax.Array operand goes (_device_operand)

    def _lay_out(
        self, operands: Operands
    ) -> tuple[ProcessGrid | None, tuple[Distribution, Distribution, Distribution]]:
        """The distributions, the product's grid and mesh, and what each operand is
        taken as (``planned``); the grid, and the triple before operands taken
        replicated are substituted."""
        spec, p = self.spec, self.nranks
        self.distributions, self.chosen_by_model = self._distributions(operands)
        check_fit(self.distributions, p, spmd=self.spec.spmd, available=len(jax.local_devices()))
        grid = _product_grid(self.distributions)  # a 1x1 grid on one rank too: SUMMA is named there as well
        # a jax.Array result whose layout no sharding expresses (uneven, cyclic, another grid) comes back
        # replicated: the plan then targets Replicated() itself, so the gather is a planned, explained move
        self.replicated_result = self._replicated_result(grid)
        if self.replicated_result is not None:
            grid = _product_grid((*self.distributions[:2], Replicated()))
        # operands on another grid than the product's are re-laid as Slab.X first (and the result
        # from Slab.X after): in one process the global matrices need no move at all. A result returned
        # replicated is not re-laid onto its grid.
        self.foreign = {
            op: d for op, d in zip("abd", self.distributions)
            if d.grid is not None and d.grid.ndim == 2 and grid is not None and d.grid != grid
            and not (op == "d" and self.replicated_result is not None)
        }
        # an operand on another grid that splits as a Slab does (a BlockNonCyclic on a (P, 1) or (1, P) grid)
        # is that Slab, whose blocks are the same on any mesh: taken as it, with nothing to re-lay (re-laid as
        # Slab.X it would lose its role, and a named algorithm that fits it would be refused)
        as_slab: dict[str, Distribution] = {}
        for op in _plan.OPERANDS:
            role = _plan.role_of(self.foreign[op], op, spec.transposes[op], p) if op in self.foreign else None
            if role is not None:
                as_slab[op] = _plan.role_dist(op, role, spec.transposes[op])
                del self.foreign[op]
        pa, pb, pd = (Slab.X if op in self.foreign else as_slab.get(op, d) for op, d in zip("abd", self.distributions))
        if self.replicated_result is not None:
            pd = Replicated()
        self.planned = (pa, pb, pd)
        self.geom = _layout.Geometry.create(self.devices, grid)
        # a jax.Array a or b whose layout no sharding on the mesh expresses (cyclic, uneven) is placed
        # replicated (:meth:`_device_operand`): the plan takes it as what it then is, Replicated(), and slices
        # it into the kernel's layout, rather than re-laying it on the grid to move it back
        self.taken_replicated = self._taken_replicated()
        self.planned = (
            Replicated() if "a" in self.taken_replicated else pa, Replicated() if "b" in self.taken_replicated else pb,
            pd,
        )
        if grid is not None:
            rows, cols = grid.shape  # the product's grid is 2-D
            self.problem = dataclasses.replace(self.problem, grid=(rows, cols))
        return grid, (pa, pb, pd)

    def _choose(
        self, grid: ProcessGrid | None, laid: tuple[Distribution, Distribution, Distribution]
    ) -> tuple[_plan.Kernel, _SummaLayout | None, dict[str, _layout.DimMap | None]]:
        """Choose the algorithm (``self.plan``); its kernel, SUMMA's placements
        (on a grid) and the padded map each logical dim shares."""
        spec, p = self.spec, self.nranks
        pa, pb, pd = laid
        roles = self._roles(self.planned)
        shapes = spec.shapes

        # the operands laid out on the product's grid, which SUMMA takes as they are. A named SUMMA takes
        # also those a 1-D role describes for the other kernels (BlockNonCyclic on a (P, 1) or (1, P) grid
        # splits as a Slab does); "auto" costs SUMMA's candidate as moving those, so that for such operands it
        # favours the 1-D kernels, which take that split as it is
        named = spec.algorithm != "auto" and ALGORITHMS[spec.algorithm].grid
        on_grid = self._on_grid(self.planned, grid, roles, named)
        summa = self._summa_placements(on_grid, roles, shapes) if grid is not None else None
        native = frozenset(
            op for op in on_grid if summa is not None and self._given_grid(op, shapes[op]) == summa[0][op]
        )
        # a named algorithm must fit the distributions as given, not the replicated operands or delivery
        fit = (pa, pb, self.distributions[2] if self.replicated_result is not None else pd)
        fit_roles = None if fit == self.planned else self._roles(fit)
        fit_grid = self._on_grid(fit, grid, fit_roles or roles, named)
        given_dists = ", ".join(f"{name}={d!r}" for name, d in zip(("a", "b", "result"), self.distributions))
        self.plan = _plan.choose(
            self.problem, roles, algorithm=spec.algorithm, model=self.model,
            transposes=(spec.transpose_a, spec.transpose_b), native=native, backend="jax", fit_roles=fit_roles,
            grid_ops=on_grid | fit_grid, given=f"({given_dists})",
        )
        kern = self.plan.kernel
        split = {r for r in (*roles.values(), kern.a, kern.b, kern.d) if r not in ("R", "G")}
        shared = {
            dim: _layout.DimMap.slab(size, p) if dim in split else None
            for dim, size in (("M", spec.m), ("K", spec.k), ("N", spec.n))
        }

        return kern, summa, shared

    def _place(
        self, kern: _plan.Kernel, summa: _SummaLayout | None,
        shared: dict[str, _layout.DimMap | None],
    ) -> _kernels.SummaSchedule | None:
        """Where each operand is (``given``, ``unpadded``) and where the kernel
        takes it (``kernel``); SUMMA's schedule, or None."""
        spec = self.spec
        transposes, shapes = spec.transposes, spec.shapes

        def placement(op: str, dist: Distribution) -> _layout.Placement:
            dims = _plan.stored_dims(op, transposes[op])  # type: ignore[arg-type]
            return _layout.placement_of(dist, self.geom, shapes[op], (shared[dims[0]], shared[dims[1]]))

        self.given = {op: placement(op, d) for op, d in zip("abd", self.planned)}
        # the same layouts on the matrices as they are (no padding shared with the other operands): what a
        # jax.Array in or out carries as its sharding, where one expresses it
        self.unpadded = {op: _layout.placement_of(d, self.geom, shapes[op], (None, None))
                         for op, d in zip("abd", self.planned)}
        if ALGORITHMS[kern.algorithm].grid:
            assert summa is not None
            self.kernel, schedule = summa
        else:
            self.kernel = {
                op: placement(op, _plan.role_dist(op, kern.role(op), transposes[op])) for op in _plan.OPERANDS
            }
            schedule = None
        return schedule

    def _local_problem(
        self, kern: _plan.Kernel, shared: dict[str, _layout.DimMap | None],
        schedule: _kernels.SummaSchedule | None, acc_dtype: Any,
    ) -> _kernels.LocalProblem:
        """What the kernel body of each rank needs to know."""
        spec, p = self.spec, self.nranks
        # the bias runs along the result's rows, or its columns (a bias of shape (1, N))
        along = 1 if spec.bias_columns else 0
        d_kernel = self.kernel["d"]
        return _kernels.LocalProblem(
            kernel=kern,
            nranks=p,
            axis=self.geom.rank_axis,
            transpose_a=spec.transpose_a,
            transpose_b=spec.transpose_b,
            block={dim: (m.block if m is not None else size)
                   for (dim, m), size in zip(shared.items(), (spec.m, spec.k, spec.n))},
            acc_dtype=acc_dtype,
            precision=_PRECISIONS[spec.precision],
            bias_axis=d_kernel.axes[along],
            bias_block=d_kernel.maps[along].block,
            summa=schedule,
            overlap=self.devices[0].platform != "cpu",
        )

    # -- planning -------------------------------------------------------------
    def _replicated_result(self, grid: ProcessGrid | None) -> str | None:
        """Why a ``jax.Array`` result cannot carry its distribution as a sharding
        (one process), or None when it can: JAX shards only in even blocks, in
        order, on one mesh. Such a result comes back replicated on every device."""
        if self.spec.family != "jax" or self.spec.spmd or self.nranks == 1:
            return None
        return self._undeliverable(self.distributions[2], grid)

    def _undeliverable(self, dist: Distribution, grid: ProcessGrid | None) -> str | None:
        """Why no ``jax.Array`` sharding lays a result out as ``dist`` says, or None."""
        mesh = self.user_mesh  # (0, 0): the layout alone; whether it splits evenly is judged below
        if mesh is not None and _sharding_of(_plain(dist, (self.spec.m, self.spec.n)), mesh, (0, 0)) is None:
            if isinstance(mesh, Mesh) and mesh == trace_mesh(tuple(mesh.devices.flat)):
                return (f"inside jit, with no mesh of yours, every product is typed on dmatmul's mesh "
                        f"{dict(mesh.shape)}, and no sharding of it lays it out")
            return f"no sharding of the operands' mesh {dict(mesh.shape)} lays it out"
        return _unexpressed(dist, self._result_geometry(grid, dist), (self.spec.m, self.spec.n))

    def _taken_replicated(self) -> dict[str, str]:
        """The operands a and b taken as ``Replicated()``, each with why: in one
        process, a jax.Array whose planned layout no sharding on the plan's mesh
        expresses, which :meth:`_device_operand` places replicated (each device
        then holds it whole). Numpy operands are placed as their layout says, and
        under mpiexec each rank holds its own block: none there."""
        if self.spec.family != "jax" or self.spec.spmd or self.nranks == 1:
            return {}
        found = {op: _unexpressed(d, self.geom, self.spec.shapes[op]) for op, d in zip("ab", self.planned)}
        return {op: f"on another grid than the product's, and as Slab.X {why}" if op in self.foreign else why
                for op, why in found.items() if why is not None}

    def _result_geometry(self, grid: ProcessGrid | None, dist: Distribution | None = None) -> _layout.Geometry:
        """The geometry whose mesh lays out the result as its distribution (or
        ``dist``) says: the product's, or the result's own grid where it is on
        another one (the result is then computed as Slab.X and re-laid onto that
        grid: :meth:`_to_result_grid`)."""
        own = (dist or self.distributions[2]).grid
        return _layout.Geometry.create(self.devices, own if own is not None and own.ndim == 2 else grid)

    def _to_result_grid(self, d: jax.Array) -> jax.Array:
        """One process, no user mesh: a result on another grid than the product's,
        computed as Slab.X, re-laid onto its own grid's mesh (the same devices)."""
        if "d" not in self.foreign:
            return d
        dist, shape = self.distributions[2], (self.spec.m, self.spec.n)
        geom = self._result_geometry(None)
        sharding = geom.sharding(_layout.placement_of(dist, geom, shape, (None, None)))
        if _in_vmap():  # each matrix of the batch re-laid (the result is on these devices already)
            return jax.lax.with_sharding_constraint(d, sharding)
        return jax.device_put(d, sharding)

    def _summa_route(self) -> _kernels.SummaRoute:
        """How this plan's SUMMA ring runs (:func:`_kernels.summa_route`)."""
        sched = self.local.summa
        assert sched is not None
        ta, tb = self.spec.transpose_a, self.spec.transpose_b
        return _kernels.summa_route(sched, self.geom.mesh.shape["r"], self.geom.mesh.shape["c"],
                                    self.kernel["a"].block[0 if ta else 1], self.kernel["b"].block[1 if tb else 0])

    def _summa_cost(self, plan: _plan.Plan) -> _plan.Plan:
        """``plan`` (SUMMA) with the bytes and transfers its kernel here really
        has, from the blocks it moves: the planner's backend-neutral count has
        each panel's byte received once, as a broadcast delivers it, and K
        unpadded. The ring (:meth:`_kernels.SummaRoute.traffic`) broadcasts in
        ppermute rounds that every rank receives; both schedules move op(A)'s
        and op(B)'s local K as the panels read it (padded to whole panels:
        :func:`_kernels._pad_to_extents`), and the one-shot one gathers them
        whole along the grid row and column (``cols - 1`` and ``rows - 1``
        blocks), block-cyclic padding included."""
        sched = self.local.summa
        assert sched is not None
        ta, tb = self.spec.transpose_a, self.spec.transpose_b
        m_loc, n_loc = self.kernel["a"].block[1 if ta else 0], self.kernel["b"].block[0 if tb else 1]
        if plan.kernel.schedule == "one_shot":
            rows, cols = self.geom.mesh.shape["r"], self.geom.mesh.shape["c"]
            k_a = max(self.kernel["a"].block[0 if ta else 1], sched.extent_a)
            k_b = max(self.kernel["b"].block[1 if tb else 0], sched.extent_b)
            elements, transfers = (cols - 1) * k_a * m_loc + (rows - 1) * k_b * n_loc, 0
        else:
            route = self._summa_route()
            elements, transfers = route.traffic(*((m_loc, n_loc) if route.ring == "a" else (n_loc, m_loc)))
        sized = self.problem.padded(("G",))
        return _plan.costed_plan(sized, plan.kernel, plan.moves, elements * sized.itemsize, transfers,
                                 plan.kernel_collectives, plan.flops, self.model)

    def _roles(self, dists: tuple[Distribution, Distribution, Distribution]) -> dict[str, _plan.Role]:
        """Each operand's role; every grid operand of ``dists`` is on the product's grid."""
        return _plan.roles_of(dists, (self.spec.transpose_a, self.spec.transpose_b), self.nranks)

    def _on_grid(
        self, dists: tuple[Distribution, Distribution, Distribution], grid: ProcessGrid | None,
        roles: dict[str, _plan.Role], one_d: bool,
    ) -> frozenset[str]:
        """The operands of ``dists`` laid out on the product's ``grid``: those
        with a 2-D layout (role "G") and, with ``one_d``, those whose layout
        there is a 1-D split (not replicated: on one rank nothing is split,
        and every layout is "R")."""
        return frozenset(
            op for op, d in zip("abd", dists)
            if grid is not None and d.grid == grid and (roles[op] == "G" or (one_d and roles[op] != "R"))
        )

    def _given_grid(self, op: str, shape: tuple[int, int]) -> _layout.Placement:
        dist = self.planned["abd".index(op)]
        return _layout.placement_of(dist, self.geom, shape, (None, None))

    def _summa_placements(
        self, on_grid: frozenset[str], roles: dict[str, _plan.Role], shapes: dict[str, tuple[int, int]]
    ) -> tuple[dict[str, _layout.Placement], _kernels.SummaSchedule]:
        """SUMMA's own layouts on the grid: op(A) rows over "r" and K over "c",
        op(B) K over "r" and columns over "c", the result rows over "r" and
        columns over "c". Maps are taken from the operands already on the grid
        (``on_grid``): M's from op(A) or else the result, N's from op(B) or else
        the result, those with a 2-D layout (role "G") before those whose
        layout is a 1-D split (a BlockNonCyclic on a (P, 1) grid), which then
        move to the others' rather than the other way round."""
        spec = self.spec
        rows, cols = self.geom.mesh.shape["r"], self.geom.mesh.shape["c"]
        grid_maps = {
            op: self._given_grid(op, shapes[op]).maps
            for op in "abd"
            if op in on_grid and not (op == "a" and spec.transpose_a) and not (op == "b" and spec.transpose_b)
        }
        Map = _layout.DimMap

        def from_grid(sources: tuple[tuple[str, int], ...], default: _layout.DimMap) -> _layout.DimMap:
            found = [(roles[op] != "G", i) for i, (op, _) in enumerate(sources) if op in grid_maps]
            if not found:
                return default
            op, axis = sources[min(found)[1]]
            return grid_maps[op][axis]

        m_map = from_grid((("a", 0), ("d", 0)), Map.slab(spec.m, rows))
        ka_map = from_grid((("a", 1),), Map.slab(spec.k, cols))
        kb_map = from_grid((("b", 0),), Map.slab(spec.k, rows))
        n_map = from_grid((("b", 1), ("d", 1)), Map.slab(spec.n, cols))
        P = _layout.Placement
        a = P((ka_map, m_map), ("c", "r")) if spec.transpose_a else P((m_map, ka_map), ("r", "c"))
        b = P((n_map, kb_map), ("c", "r")) if spec.transpose_b else P((kb_map, n_map), ("r", "c"))
        return {"a": a, "b": b, "d": P((m_map, n_map), ("r", "c"))}, summa_schedule(ka_map, kb_map)

    def _distributions(
        self, operands: Operands
    ) -> tuple[tuple[Distribution, Distribution, Distribution], bool]:
        """The given triple, or (one process, none given) the planner's choice:
        jax.Arrays keep the 1-D layout their sharding expresses."""
        if self.spec.distributions is not None:
            return self.spec.distributions, False
        fixed = _given_distributions(self.spec, operands, self.devices)
        # a jax.Array result that no sharding expresses would come back replicated: not a candidate
        deliverable = None if self.spec.family != "jax" or self.spec.spmd else (
            lambda d: self._undeliverable(d, None) is None)
        chosen = _plan.choose_distributions(
            self.problem, self.model, transposes=(self.spec.transpose_a, self.spec.transpose_b), fixed=fixed,
            deliverable=deliverable, algorithm=self.spec.algorithm,
        )
        return chosen, True

    @property
    def cost(self) -> _plan.Plan:
        """The planner's plan: modelled bytes, messages, flops and time per rank."""
        return self.plan

    # -- memory ---------------------------------------------------------------------
    def ideal_memory_bytes(self) -> float:
        """The least a rank can hold for this product: its blocks of a, b and the
        result (the largest over ranks, unpadded) plus one buffer of what travels:
        for ``summa`` one op(A) panel and one op(B) panel (as wide as the longest
        run of k one owner of each holds, :meth:`~._kernels.SummaSchedule.longest_run`:
        with uneven blocks the ring's block, not the common panel width, which may
        be 1), for ``allgather`` one block of the moving operand, for
        ``reduce_scatter`` and ``allreduce`` one partial result (accumulation
        dtype), for ``local`` nothing."""
        spec, p = self.spec, self.nranks
        info = spec.dtype_info
        shapes = {"a": spec.a_shape, "b": spec.b_shape, "d": (spec.m, spec.n)}
        blocks = 0
        for op, dist in zip("abd", self.distributions):
            blocks += max(int(np.prod(dist.shape(r, shapes[op], p))) for r in range(p))
        kern = self.plan.kernel
        in_flight = ALGORITHMS[kern.algorithm].in_flight(kern)
        if ALGORITHMS[kern.algorithm].grid:
            sched = self.local.summa
            assert sched is not None
            m_loc = self.kernel["a"].block[1 if spec.transpose_a else 0]
            n_loc = self.kernel["b"].block[0 if spec.transpose_b else 1]
            travel = sched.longest_run() * (m_loc + n_loc) * info.itemsize
        elif in_flight == ("d",):  # partial results
            travel = int(np.prod(self.kernel["d"].block)) * info.acc_itemsize
        elif in_flight:  # blocks of the travelling operand
            travel = int(np.prod(self.kernel[in_flight[0]].block)) * info.itemsize
        else:
            travel = 0
        return float(blocks * info.itemsize + travel)

    def memory_needs(self) -> tuple[list[_memory.Need], dict[str, _memory.Probe]]:
        """What this product takes, per place (:mod:`dmatmul._memory`), with no
        allocation nor compile: on each device its padded blocks of a, b and
        the result as given, their copies in the kernel's layouts where those
        differ (a replicated operand whole), c's block where it is read, and
        what the kernel holds in flight (the cost model's extra memory); for a
        numpy result, the result (this rank's block of it) on the host too.
        CPU devices use the host's memory: theirs is counted there, all of
        them together. Made once per plan."""
        if self._needs is not None:
            return self._needs
        spec, p, kern = self.spec, self.nranks, self.plan.kernel
        info, platform = spec.dtype_info, self.devices[0].platform
        cpu = platform == "cpu"
        count = 1 if spec.spmd else p  # the devices this process drives
        if cpu:
            place, on = _memory.HOST, f"on {count} cpu device{'s' if count > 1 else ''}"
        else:
            place = f"each of the {count} {platform} devices" if count > 1 else f"this process's {platform} device"
            on = ""
        times = count if cpu else 1  # (one device's bytes, or all of them where they share the host's memory)
        per: list[tuple[str, str, float]] = []
        names = {"a": "a", "b": "b", "d": "the result"}
        for op in "abd":
            per.append((op, f"{names[op]}'s blocks", float(np.prod(self.given[op].block)) * info.itemsize))
            if self.kernel[op] != self.given[op]:
                laid = "whole on every device" if self.kernel[op].replicated else "re-laid for the kernel"
                per.append((op, f"{names[op]} {laid}", float(np.prod(self.kernel[op].block)) * info.itemsize))
        if spec.use_c:
            per.append(("c", "c's blocks", float(np.prod(self.given["d"].block)) * info.itemsize))
        pr = self.problem.padded((kern.a, kern.b, kern.d))
        one_shot = kern.schedule == "one_shot"
        travel = _cost.extra_memory_bytes(kern.algorithm, pr.m, pr.n, pr.k, p, info.itemsize, info.acc_itemsize,
                                          moving=kern.moving, one_shot=one_shot)
        if travel:
            in_flight = ALGORITHMS[kern.algorithm].in_flight(kern)
            if len(in_flight) > 1:
                op, what = in_flight[0], f"the panels of {' and '.join(in_flight)} in flight"
            elif in_flight and in_flight[0] != "d":
                op = in_flight[0]
                what = f"{op} gathered whole" if one_shot else f"{op}'s blocks in flight"
            else:
                op, what = "d", "the partial results in flight"
            per.append((op, what, travel))
        needs = [_memory.Need(place, op, f"{what} {on}".strip(), int(nbytes * times)) for op, what, nbytes in per]
        if spec.family == "numpy" and not in_jax_trace():
            shape = (spec.m, spec.n)
            if spec.spmd:
                shape = max((self.distributions[2].shape(r, shape, p) for r in range(p)), key=lambda s: s[0] * s[1])
            needs.insert(0, _memory.Need(_memory.HOST, "d", "the result as a numpy array" if not spec.spmd else
                                         "the result's block as a numpy array", shape[0] * shape[1] * info.itemsize))
        devices = self.devices if not spec.spmd else (_layout.my_device(self.geom),)
        probes: dict[str, _memory.Probe] = {} if cpu else {place: functools.partial(_device_room, devices)}
        self._needs = (needs, probes)
        return needs, probes

    def compiled_memory(self) -> dict[str, float]:
        """Bytes per rank of the compiled product, from XLA's memory analysis of the
        jitted program on padded operands (what runs under mpiexec, and for numpy
        operands): ``arguments``, ``outputs``, ``temporaries``, ``aliased`` and
        ``peak`` = arguments + outputs + temporaries - aliased (no c, no bias)."""
        fn = self._function("padded")
        args = [jax.ShapeDtypeStruct(self.given[op].shape, jnp.dtype(self.spec.dtype), sharding=self.sharding(op))
                for op in "ab"]
        with self._own_context():
            stats = fn.lower(*args, None, None).compile().memory_analysis()
        out = {
            "arguments": float(stats.argument_size_in_bytes),
            "outputs": float(stats.output_size_in_bytes),
            "temporaries": float(stats.temp_size_in_bytes),
            "aliased": float(stats.alias_size_in_bytes),
        }
        out["peak"] = out["arguments"] + out["outputs"] + out["temporaries"] - out["aliased"]
        return out

    # -- the jitted function ------------------------------------------------------
    def sharding(self, operand: str) -> NamedSharding:
        """Where ``operand`` ("a", "b", "d") lives as given (padded space)."""
        return self.geom.sharding(self.given[operand])

    def _core(self, geom: _layout.Geometry) -> Any:
        """``(a, b, c, bias) -> d`` on padded global arrays in their given placements
        on ``geom`` (the plan's, or the same made abstract inside a user's trace)."""
        given, kern_pl, ep = self.given, self.kernel, self.epilogue
        fused = kern_pl["d"] == given["d"]
        body = _kernels.body(self.local, ep if fused else None)
        redistribute = _exchange.redistribute

        def core(a: jax.Array, b: jax.Array, c: jax.Array | None, bias: jax.Array | None) -> jax.Array:
            args = [redistribute(a, given["a"], kern_pl["a"], geom), redistribute(b, given["b"], kern_pl["b"], geom)]
            specs = [kern_pl["a"].spec, kern_pl["b"].spec]
            if fused and ep.use_c:
                assert c is not None  # use_c: c was given
                args.append(c)
                specs.append(given["d"].spec)
            if fused and ep.has_bias:
                assert bias is not None  # an epilog with a bias has one (checked in matmul)
                args.append(bias)
                specs.append(PartitionSpec())
            d = jax.shard_map(body, mesh=geom.mesh, in_specs=tuple(specs), out_specs=kern_pl["d"].spec)(*args)
            if not fused:
                d = redistribute(d, kern_pl["d"], given["d"], geom)
                d = _kernels.finish(ep, d, c, bias)
            return d

        return core

    def _padded_bias(self, bias: Any) -> Any:
        """The bias as a vector in the result's padded row space (its padded
        column space for a bias of shape (1, N))."""
        m = self.given["d"].maps[1 if self.spec.bias_columns else 0]
        bias = bias.reshape(-1)
        if m.identity:
            return bias
        if isinstance(bias, np.ndarray):
            out = np.zeros(m.padded_size, bias.dtype)
            out[m.positions] = bias
            return out
        # zeros_like keeps a 64-bit bias's dtype where x64 is off (a float64 jax.Array inside jit), as numpy's
        # path does: jnp.zeros(n, float64) would warn that it truncates it to float32
        return jnp.zeros_like(bias, shape=(m.padded_size,)).at[jnp.asarray(m.positions)].set(bias)

    def _function(self, kind: str) -> Any:
        """The jitted function for padded operands ("padded") or global jax.Arrays ("jax")."""
        if kind in self._compiled:
            return self._compiled[kind]
        core, given = self._core(self.geom), self.given
        if kind == "padded":
            fn = jax.jit(core, out_shardings=self.sharding("d"))
        elif kind == "traced":
            fn = self._traced_function()
        else:
            out = self.sharding("d") if _layout.expressible(self.unpadded["d"]) else self.geom.replicated()
            wsc = jax.lax.with_sharding_constraint

            def device(a: jax.Array, b: jax.Array, c: jax.Array | None, bias: jax.Array | None) -> jax.Array:
                a = wsc(_layout.pad(a, given["a"]), self.sharding("a"))
                b = wsc(_layout.pad(b, given["b"]), self.sharding("b"))
                if c is not None:
                    c = wsc(_layout.pad(c, given["d"]), self.sharding("d"))
                if bias is not None:
                    bias = self._padded_bias(bias)
                return _layout.unpad(core(a, b, c, bias), given["d"])

            fn = jax.jit(device, out_shardings=out)
        self._compiled[kind] = fn
        return fn

    def _traced_function(self) -> Any:
        """Global operands inside a user's trace on ``self.user_mesh``: the
        product on this plan's mesh (made abstract where the trace names no
        devices: the trace's own devices, in its order, are then the ranks, and
        no device list of dmatmul's clashes with the trace's), under that mesh
        as the context (not the user's ``jax.set_mesh``, whose axis names the
        kernels do not use), and the result typed on the user's mesh with the
        sharding its distribution implies (a result ``_replicated_result`` names:
        replicated there). Operands typed with Explicit axes are first retyped
        as Auto on their own mesh (no data moves): the layouts are then XLA's to
        match, as for any Auto operand."""
        user = self.user_mesh
        assert user is not None
        geom, given = (self.geom if isinstance(user, Mesh) else self.geom.abstract()), self.given
        core, wsc = self._core(geom), jax.lax.with_sharding_constraint
        spec = self.spec
        on_user = {
            op: _on_mesh(dist, user, shape)
            for op, dist, shape in zip("abd", self.planned, (spec.a_shape, spec.b_shape, (spec.m, spec.n)))
        }
        # the result as its distribution says (one on another grid than the product's is computed as Slab.X)
        result = _on_mesh(Replicated() if self.replicated_result is not None else self.distributions[2], user,
                          (spec.m, spec.n))
        explicit = _explicit(user)

        def enter(x: jax.Array, op: str) -> jax.Array:
            """An operand typed on the user's mesh with Auto axes: pinned there as its
            distribution says (so its cotangent is too: JAX names a gradient by the mesh
            of its type); with Explicit ones: retyped Auto."""
            if jax.typeof(x).sharding.mesh.explicit_axes:
                return _auto_typed(x)
            return x if explicit else wsc(x, on_user[op])

        def traced(a: jax.Array, b: jax.Array, c: jax.Array | None, bias: jax.Array | None) -> jax.Array:
            a, b, c = enter(a, "a"), enter(b, "b"), None if c is None else enter(c, "d")
            bias = None if bias is None else _auto_typed(bias)
            with jax.sharding.use_abstract_mesh(geom.mesh.abstract_mesh):
                a = wsc(_layout.pad(a, given["a"]), geom.sharding(given["a"]))
                b = wsc(_layout.pad(b, given["b"]), geom.sharding(given["b"]))
                if c is not None:
                    c = wsc(_layout.pad(c, given["d"]), geom.sharding(given["d"]))
                if bias is not None:
                    bias = self._padded_bias(bias)
                d = _layout.unpad(core(a, b, c, bias), given["d"])
            return _typed_on(d, result)

        return jax.jit(traced)

    # -- execution ---------------------------------------------------------------
    def _device_operand(self, x: Any, operand: str) -> jax.Array:
        """A jax.Array operand on this plan's devices (moved there only if it
        lives on other devices; an operand already laid out is used as it is)."""
        if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
            x = jnp.asarray(x)  # (a concrete jax.Array it returns as it is, at some cost per call)
        target = self._target(operand)
        if isinstance(x, jax.core.Tracer):
            # where it is is not known here: under jit a placement (its devices the trace's), under eager
            # grad or vjp a move of its value (committed to one device, say) onto the plan's devices; under
            # vmap onto them whole (a sharding of the matrix would split the batch axis): the jitted
            # product lays out each matrix of the batch
            to = self.geom.replicated() if _in_vmap() else target
            value = _concrete(x)
            if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer) and not value.committed:
                # an uncommitted value (jnp.asarray's) is where dmatmul puts it: its cotangent stays on the
                # plan's devices too (JAX would put it back on the value's one device, and jax.jit of the
                # pullback then met the product's devices and that one device: 'incompatible devices')
                return jax.device_put(x, to, src=to)
            return jax.device_put(x, to)
        return self.geom.onto(x, target)

    def _target(self, operand: str) -> NamedSharding:
        """Where a jax.Array ``operand`` ("a", "b", "d" for C, "bias") goes: made once per plan and operand."""
        target = self._targets.get(operand)
        if target is None:
            expressible = operand != "bias" and _layout.expressible(self.unpadded[operand])
            target = self._targets[operand] = self.sharding(operand) if expressible else self.geom.replicated()
        return target

    def execute(self, operands: Operands) -> Any:
        with _x64(self.spec.dtype):
            d = self._execute_where(operands)
            if self.spec.use_c or not _traced(operands):
                return d
            return depending_on(d, operands.c)  # C given with beta = 0

    def _execute_where(self, operands: Operands) -> Any:
        """The result on the mesh (or host) it goes to, as :meth:`execute` says.
        A plan made on the other side of a trace's edge than it now runs runs its
        twin, planned on this side (under this execute()'s _x64 and C anchor)."""
        if self.traced and not _tracing(operands):
            # planned inside a trace (a Matmul of constants first executed inside jit), now run outside one
            if self._twin is None:
                self._twin = JaxPlan(self.spec, operands)
            return self._twin._execute_where(operands)
        if self.traced:
            return self._execute_traced(operands)
        if in_jax_trace() and (self.user_mesh is not None or mesh_of(self.spec, operands) is not None):
            # planned outside the trace it now runs in (a Matmul executed inside jit): its traced form
            if self._twin is None:
                self._twin = JaxPlan(self.spec, operands)
            return self._twin._execute_where(operands)
        with contextlib.nullcontext() if _traced(operands) else self._own_context():
            d = self._execute(operands)
        return self._delivery()(d)

    def _delivery(self) -> Callable[[Any], Any]:
        """What takes the computed result to where the caller gets it: onto the
        user's mesh, or (one process, jax.Arrays) onto the result's own grid."""
        if self.user_mesh is not None:
            return self._to_user_mesh
        if self.spec.family == "jax" and not self.spec.spmd and "d" in self.foreign:
            return self._to_result_grid
        return _same

    def repeat(self, operands: Operands) -> Callable[[Operands], Any] | None:
        """A runner of :meth:`execute` for operands laid out as these are, without
        the front end's checks (the backend protocol's optional shortcut): for
        :meth:`dmatmul.Matmul.execute` on the operands it checked the first time,
        and for :func:`dmatmul.matmul` on operands of the shapes, dtypes and
        placements of a call that passed its checks. One process, concrete
        jax.Arrays, outside any trace; None here where there is no such shortcut.
        What moves onto the plan's devices is decided here, once, from these
        operands' placements; the runner returns None (the caller then takes the
        full path, which raises what it must) where an operand was deleted, or a
        trace is running now."""
        xs = self._repeated(operands)
        mesh = self.geom.mesh
        if (self.spec.spmd or self.traced or operands.family != "jax" or in_jax_trace(*xs)
                or not isinstance(mesh, Mesh) or not all(x is None or isinstance(x, jax.Array) for x in xs)):
            return None
        geom, targets = self.geom, {i: self._target(op) for i, op in enumerate(_OPERANDS) if xs[i] is not None}
        # an operand not where the plan keeps it moves at every call
        moves = tuple((i, t) for i, t in targets.items() if not geom.holds(xs[i]))
        fn, onto, dtype, after, repeated = self._function("jax"), geom.onto, self.spec.dtype, self._delivery(), self._repeated
        wide = dtype in ("float64", "complex128")  # (x64 may be switched between calls: asked at each)

        def run(ops: Operands) -> Any:
            if in_jax_trace():
                return None
            now: Sequence[Any] = repeated(ops)
            for x in now:
                if x is not None and x.is_deleted():
                    return None
            if moves:
                moved = list(now)
                for i, target in moves:
                    moved[i] = onto(moved[i], target)
                now = moved
            # as _execute_where runs it: on the plan's devices, in its mesh (the jitted function's cache key)
            with jax.set_mesh(mesh):
                if wide:
                    with _x64(dtype):
                        d = fn(*now)
                else:
                    d = fn(*now)
            return after(d)

        return run

    def _repeated(self, ops: Operands) -> tuple[Any, Any, Any, Any]:
        """The arrays the compiled function takes, in :data:`_OPERANDS`' order (C only where it is used)."""
        return (ops.a, ops.b, ops.c if self.spec.use_c else None, ops.bias if self.spec.has_bias else None)

    def _own_context(self) -> contextlib.AbstractContextManager[Any]:
        """One process: dmatmul's own mesh as the context of its computations
        (:meth:`_layout.Geometry.context`). Across processes the context is set
        around each jitted step (:meth:`_execute_local_blocks`), since the local
        steps around them use this rank's device.

        Constant operands inside a user's trace (closed-over arrays, a plan
        executed in ``jit``, eager ``grad`` around constants) are staged into
        that trace as the jax.Array path stages traced ones, under this mesh's
        abstract mesh (``set_mesh`` is refused there)."""
        return contextlib.nullcontext() if self.spec.spmd else self.geom.context()

    def _execute_traced(self, operands: Operands) -> Any:
        """Inside a user's trace on a mesh (:meth:`_traced_function`)."""
        spec = self.spec
        c = jnp.asarray(operands.c) if spec.use_c else None
        bias = jnp.asarray(operands.bias) if spec.has_bias else None
        return self._function("traced")(jnp.asarray(operands.a), jnp.asarray(operands.b), c, bias)

    def _execute(self, operands: Operands) -> Any:
        spec, given, geom = self.spec, self.given, self.geom
        c = operands.c if spec.use_c else None
        bias = operands.bias if spec.has_bias else None
        if spec.spmd:
            return self._execute_local_blocks(operands, c, bias)
        if operands.family == "numpy" and not in_jax_trace():  # (in a trace: staged there, as jax.Arrays are)
            fn = self._function("padded")
            a = _layout.host_to_device(operands.a, given["a"], geom)
            b = _layout.host_to_device(operands.b, given["b"], geom)
            if c is not None:
                c = _layout.host_to_device(c, given["d"], geom)
            if bias is not None:
                bias = jax.device_put(self._padded_bias(np.asarray(bias)), geom.replicated())
            return _layout.device_to_host(fn(a, b, c, bias), given["d"])
        fn = self._function("jax")
        a = self._device_operand(operands.a, "a")
        b = self._device_operand(operands.b, "b")
        c = None if c is None else self._device_operand(c, "d")
        bias = None if bias is None else self._device_operand(bias, "bias")
        return fn(a, b, c, bias)

    def _to_user_mesh(self, d: jax.Array) -> jax.Array:
        """The result on the user's mesh: the NamedSharding its distribution implies
        (the same blocks on the same devices), else replicated there."""
        assert self.user_mesh is not None
        return jax.device_put(d, _on_mesh(self.distributions[2], self.user_mesh, (self.spec.m, self.spec.n)))

    def _execute_local_blocks(self, operands: Operands, c: Any, bias: Any) -> Any:
        """Several processes: this rank's blocks in, this rank's result block out."""
        given, geom = self.given, self.geom
        rank = self.devices.index(_layout.my_device(geom))

        def place(x: Any, operand: str) -> jax.Array:
            return _layout.local_to_global(np.asarray(x), given[operand], geom, rank)

        a, b = operands.a, operands.b
        if self.foreign:  # operands on another grid: this rank's block as Slab.X first
            a, b = self._to_planned(a, "a", rank), self._to_planned(b, "b", rank)
            c = None if c is None else self._to_planned(c, "d", rank)
        a, b = place(a, "a"), place(b, "b")
        c = None if c is None else place(c, "d")
        if bias is not None:
            full = self._padded_bias(np.asarray(bias))
            bias = jax.make_array_from_single_device_arrays(
                full.shape, geom.replicated(), [jax.device_put(full, _layout.my_device(geom))]
            )
        with geom.context():
            d = self._function("padded")(a, b, c, bias)
        shape = (self.spec.m, self.spec.n)
        block = _layout.global_to_local(d, given["d"], self.planned[2].shape(rank, shape, self.nranks))
        if "d" in self.foreign:
            block = _moves.redistribute(
                block, self.planned[2], self.foreign["d"], shape=shape, family="jax", devices=self.devices, rank=rank
            )
        return block if operands.family == "jax" else np.array(block)

    def _to_planned(self, x: Any, op: str, rank: int) -> Any:
        """This rank's block of ``op`` as the plan lays it out (from another grid's layout)."""
        if op not in self.foreign:
            return x
        shape = {"a": self.spec.a_shape, "b": self.spec.b_shape, "d": (self.spec.m, self.spec.n)}[op]
        return _moves.redistribute(
            x, self.foreign[op], self.planned["abd".index(op)], shape=shape, family="numpy",
            devices=self.devices, rank=rank,
        )

    def _foreign_moves(self) -> list[_plan.Move]:
        """The all-to-alls that bring operands on another grid to Slab.X (and the result back)."""
        pr = self.problem
        out = []
        for op in self.foreign:
            size = pr.elements(op) * pr.itemsize
            out.append(_plan.Move(op, "G", "M" if op != "b" else "K", "all-to-all (another grid)",
                                  (pr.p - 1) / pr.p**2 * size, pr.p - 1))
        return out

    # -- reporting ------------------------------------------------------------------
    def explain(self) -> list[str]:
        plan, pr, geom = self.plan, self.problem, self.geom
        names = {"M": "M", "K": "K", "N": "N", "R": "nothing (replicated)", "G": "rows and columns (2-D grid)"}
        roles = {op: self._role_name(op) for op in "abd"}
        mesh = " x ".join(f"{n}={s}" for n, s in geom.mesh.shape.items())
        lines = [
            f"devices:    {self.nranks} x {self.devices[0].platform}, mesh ({mesh})"
            + (f" of {geom.grid!r}" if geom.grid is not None else ""),
            "distributions" + (" (chosen by the cost model):" if self.chosen_by_model else ":"),
        ]
        for op, name, d in zip("abd", ("a", "b", "result"), self.distributions):
            if op == "d" and self.replicated_result is not None:
                lines.append(f"  {name:7s} {d!r:16s} returned replicated on every device: no jax.Array sharding "
                             f"expresses it ({self.replicated_result})")
            elif op in self.taken_replicated:
                lines.append(f"  {name:7s} {d!r:16s} taken as Replicated(): no jax.Array sharding expresses it "
                             f"({self.taken_replicated[op]}), so every device holds it whole")
            elif op in self.foreign:
                verb = "from" if op == "d" else "to"
                lines.append(f"  {name:7s} {d!r:16s} on another grid: re-laid {verb} Slab.X (all-to-all)")
            else:
                lines.append(f"  {name:7s} {d!r:16s} splits {names[roles[op]]}")
        kern = plan.kernel
        on_grid = ALGORITHMS[kern.algorithm].grid
        if on_grid and kern.schedule == "one_shot":
            rows, cols = geom.mesh.shape["r"], geom.mesh.shape["c"]
            what = (f"one-shot SUMMA on the {rows}x{cols} grid: op(A)'s row panel all-gathered along grid rows "
                    "and op(B)'s column panel along grid columns, in 2 collectives, then one GEMM")
        elif on_grid:
            sched = self.local.summa
            assert sched is not None
            rows, cols = geom.mesh.shape["r"], geom.mesh.shape["c"]
            route = self._summa_route()
            ring, gathered = route.ring, route.gathered
            moving, along, steps, other, down = (
                ("op(A)", "grid rows", cols, "op(B)", "grid columns") if ring == "a"
                else ("op(B)", "grid columns", rows, "op(A)", "grid rows")
            )
            what = (
                f"SUMMA on the {rows}x{cols} grid ({len(sched.owner_col)} K panels of width {sched.width}): "
                f"{moving} blocks ride a ppermute ring along {along} ({steps} steps), "
                + (f"{other} all-gathered once along {down}" if gathered
                   else f"{other}'s matching panel broadcast along {down} at each step"
                   + ("" if self.local.overlap else ", each transfer after the step's GEMM (CPU: one block less)"))
            )
        else:
            one_shot = kern.schedule == "one_shot" and self.nranks > 1
            both = " both ways (half of each block each way: two rings)" if kern.schedule == "bidirectional" else ""
            what = {
                "local": "local GEMM, no communication",
                "allgather": f"one-shot AllGather+GEMM: {kern.moving} all-gathered in one collective, then one GEMM"
                if one_shot else f"ring AllGather+GEMM{both}: {kern.moving} travels {self.nranks - 1} ppermute steps",
                "reduce_scatter": "one-shot GEMM+ReduceScatter: one GEMM of the whole partial product, then one "
                "psum_scatter" if one_shot else
                f"ring GEMM+ReduceScatter{both}: partial sums travel {self.nranks - 1} ppermute steps",
                "allreduce": "GEMM + psum (AllReduce, one collective)",
            }.get(kern.algorithm) or f"{kern.algorithm}: {ALGORITHMS[kern.algorithm].summary}"
            what += f"; roles a:{kern.a} b:{kern.b} result:{kern.d}"
        lines.append(f"kernel:     {what}")
        # one process: global operands, nothing moves, but a jax.Array result on another grid is re-laid onto it
        foreign = [mv for mv in self._foreign_moves()
                   if self.spec.spmd or (mv.operand == "d" and self.spec.family == "jax")]
        for mv in (*plan.moves, *foreign):
            lines.append(f"moves:      {mv.describe()}")
        padded = sorted(
            {f"{m.size}->{m.padded_size}" for pl in self.given.values() for m in pl.maps if m.padded_size != m.size}
        )
        if padded:
            lines.append(f"padding:    {', '.join(padded)} (uneven splits, zeros inside the kernel only)")
        lb = _cost.lower_bound_words(pr.m, pr.n, pr.k, pr.p) * pr.itemsize
        nbytes = plan.nbytes + sum(m.nbytes for m in foreign)
        counted = dataclasses.replace(plan, moves=(*plan.moves, *foreign))
        replicated = [op for op, d in zip("ab", self.planned) if isinstance(d, Replicated)]
        ratio = _plan.versus_bound(nbytes, lb, replicated)
        lines += [
            f"modelled:   {_plan._fmt_bytes(nbytes)} received per rank in {counted.describe_messages()}, "
            f"{plan.flops / 1e9:.3g} GFLOP per rank",
            f"lower bound: {_plan._fmt_bytes(lb)} per rank (memory-independent); {ratio}",
            f"predicted:  {plan.time * 1e3:.3g} ms ({self.model.source} {self.devices[0].platform} model)",
        ]
        return lines

    def _role_name(self, op: str) -> _plan.Role:
        t = {"a": self.spec.transpose_a, "b": self.spec.transpose_b, "d": False}[op]
        return _plan.role_of(self.planned["abd".index(op)], op, t, self.nranks) or "G"  # type: ignore[arg-type]

    def free(self) -> None:
        """Nothing to release: compiled functions live in the backend's plan cache."""


def _device_room(devices: Sequence[jax.Device]) -> int | None:
    """The least any of ``devices`` has free (its allocator's limit less what it
    holds), or None where one does not say (CPU devices report nothing)."""
    room = None
    for device in devices:
        stats = device.memory_stats() or {}
        if "bytes_limit" not in stats:
            return None
        free = int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
        room = free if room is None else min(room, free)
    return room


class JaxBackend:
    """Plans are cached per (Spec, layouts of the jax.Array operands): repeated
    ``dm.matmul`` calls on the same problem compile once. Past ``cache_size``
    plans, the one unused longest goes."""

    name = "jax"
    cache_size = 128

    def __init__(self) -> None:
        self._plans: LRU[JaxPlan] = LRU()  # threads may plan at once (the cache is shared)

    def place(self, result: Any, spec: Spec, operands: Operands) -> Any:
        """An empty product's result, one process (:func:`place_result`): a
        jax.Array for jax operands, and for any operands inside a trace (as a
        product with elements returns there)."""
        return place_result(result, spec, operands) if operands.family == "jax" or in_jax_trace() else result

    def fits(self, spec: Spec, operands: Operands) -> None:
        """The refusal of ``spec``'s named algorithm, where it does not fit, as
        :meth:`plan` gives it (a plan is laid out, not cached or compiled)."""
        JaxPlan(spec, operands)

    def ranks(self, spec: Spec, operands: Operands) -> int:
        """One device per process under mpiexec; else the devices of the operands'
        mesh, or those ``devices=`` picks (as :class:`JaxPlan` takes them). With
        ``distribution=None``, jax.Array operands whose sharding is none of
        dmatmul's distributions are refused here as :meth:`plan` refuses them
        (an empty product asks only this)."""
        if spec.spmd:
            return spec.nprocs
        devices = plan_devices(spec, mesh_of(spec, operands))
        if spec.distributions is None and spec.family == "jax":
            _given_distributions(spec, operands, devices)
        return len(devices)

    def memory(self, spec: Spec, operands: Operands) -> tuple[list[_memory.Need], dict[str, _memory.Probe]]:
        """What the product takes, per place, and how to ask each device what it
        has free (:meth:`JaxPlan.memory_needs`; the plan is laid out and kept,
        not compiled)."""
        return self.plan(spec, operands).memory_needs()

    def start(self, runtime: _runtime.Runtime) -> _runtime.Runtime:
        """``jax.distributed`` over the runtime's processes (see :mod:`._start`)."""
        return _start.start(runtime)

    def stop(self) -> None:
        """Shut the process group down; plans made on it go with it (a product
        after ``dm.finalize()`` plans anew, and the start says why it cannot)."""
        _start.stop()
        self._plans.keep_only(lambda plan: not plan.spec.spmd)

    def redistribute(
        self, x: Any, src: Distribution, dst: Distribution, *, shape: tuple[int, int], family: str,
        devices: Any, rank: int | None,
    ) -> Any:
        """:func:`dmatmul.redistribute` on JAX devices: ``devices`` (one process, ``rank``
        None) or one device per process (``rank``: this process's). In one process a
        jax.Array on a mesh of the user's (or under ``jax.set_mesh``), with no
        ``devices=``, is re-laid over that mesh's devices (its ranks in mesh order)
        and comes back on that mesh, as a product's result does; inside a trace
        see :func:`_redistribute_traced`."""
        with _x64(str(x.dtype)):
            if rank is None and isinstance(x, jax.core.Tracer):
                return _redistribute_traced(x, src, dst, shape=shape, devices=devices)
            mesh = user_mesh(Operands(x, None)) if rank is None and family == "jax" and devices is None else None
            if rank is not None:
                rt = _runtime.active()
                assert rt is not None
                devs = _layout.process_devices(rt.size)
            elif isinstance(mesh, Mesh):
                devs = tuple(mesh.devices.flat)
            else:
                devs = _layout.resolve_devices(devices)
            _fit_devices(src, dst, len(devs), spmd=rank is not None)
            out = _moves.redistribute(x, src, dst, shape=shape, family=family, devices=devs, rank=rank)
            if isinstance(mesh, Mesh):  # the same blocks on the same devices, named on the user's mesh
                return jax.device_put(out, _on_mesh(Replicated() if 0 in shape else dst, mesh, shape))
            return out

    def plan(self, spec: Spec, operands: Operands) -> JaxPlan:
        manual = jax.sharding.get_abstract_mesh().manual_axes
        if manual:
            raise ValueError(_inside_shard_map(manual))
        split = _split_vmap(operands) if in_program(spec) and _tracing(operands) else None
        if split is not None:
            raise ValueError(split)
        key: Any = (spec, _plan.forced_schedule())  # a schedule forced by the checker is planned apart
        if in_program(spec):
            mesh = mesh_of(spec, operands)
            devices = plan_devices(spec, mesh)
            key = (*key, mesh, mesh is not None and _tracing(operands))
            if spec.distributions is None and spec.family == "jax":
                key += _given_distributions(spec, operands, devices)
        plan = self._plans.get(key)
        if plan is None:  # made outside the cache's lock: threads plan different problems at once
            plan = self._plans.add(key, JaxPlan(spec, operands), bound=self.cache_size)
        return plan
