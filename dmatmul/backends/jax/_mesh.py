"""Which devices a product runs on: the user's mesh (of the operands, the
context, a trace) or the devices asked for, and whether it runs inside a
trace (jit, vmap, shard_map)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from ..._problem import Spec
from ..._spec import Operands
from ._arrays import context_mesh, in_program
from ._arrays import in_trace as in_jax_trace
from . import _layout


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
