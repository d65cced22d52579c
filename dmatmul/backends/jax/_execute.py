"""Executing a compiled product: operands onto the plan's devices, the call
(here, inside a trace, or as SPMD local blocks), the result delivered
(:class:`ExecutingProduct`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from ..._moves import Move
from ..._problem import Spec
from ..._spec import Operands
from ._arrays import in_trace as in_jax_trace
from . import _layout, _mesh
from . import _redistribute as _moves
from ._mesh import _concrete, _same, _traced, _tracing, depending_on, mesh_of
from ._shardings import _on_mesh
from ._planning import _OPERANDS, _x64
from ._compile import CompiledProduct


def concrete_runner(spec: Spec, operands: Operands, call: Callable[[Operands], Any]) -> Callable[[Operands], Any] | None:
    """A plan's ``repeat`` runner (:meth:`dmatmul.backends.BackendPlan.repeat`):
    ``call`` on operands laid out as ``operands`` are, which must be one
    process's concrete jax.Arrays outside any trace (else None: no shortcut).
    The runner returns None (the caller then takes the full path, which raises
    what it must) where a trace runs now or an operand was deleted."""
    use_c, has_bias = spec.use_c, spec.has_bias

    def used(ops: Operands) -> tuple[Any, Any, Any, Any]:
        return ops.a, ops.b, ops.c if use_c else None, ops.bias if has_bias else None

    xs = used(operands)
    if (spec.spmd or operands.family != "jax" or in_jax_trace(*xs)
            or not all(x is None or isinstance(x, jax.Array) for x in xs)):
        return None

    def run(ops: Operands) -> Any:
        if in_jax_trace():
            return None
        for x in used(ops):
            if x is not None and x.is_deleted():
                return None
        return call(ops)

    return run


class ExecutingProduct(CompiledProduct):
    """A compiled product that runs on operands."""

    _twin: ExecutingProduct | None = None  # this plan's traced form, for a call inside a trace on constants

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
            to = self.geom.replicated() if _mesh._in_vmap() else target
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
                self._twin = type(self)(self.spec, operands)
            return self._twin._execute_where(operands)
        if self.traced:
            return self._execute_traced(operands)
        if in_jax_trace() and (self.user_mesh is not None or mesh_of(self.spec, operands) is not None):
            # planned outside the trace it now runs in (a Matmul executed inside jit): its traced form
            if self._twin is None:
                self._twin = type(self)(self.spec, operands)
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
        placements of a call that passed its checks (:func:`concrete_runner`).
        What moves onto the plan's devices is decided here, once, from these
        operands' placements."""
        xs = self._repeated(operands)
        mesh = self.geom.mesh
        if self.traced or not isinstance(mesh, Mesh):
            return None
        geom, targets = self.geom, {i: self._target(op) for i, op in enumerate(_OPERANDS) if xs[i] is not None}
        # an operand not where the plan keeps it moves at every call
        moves = tuple((i, t) for i, t in targets.items() if isinstance(xs[i], jax.Array) and not geom.holds(xs[i]))
        fn, onto, dtype, after, repeated = self._function("jax"), geom.onto, self.spec.dtype, self._delivery(), self._repeated
        wide = dtype in ("float64", "complex128")  # (x64 may be switched between calls: asked at each)

        def call(ops: Operands) -> Any:
            now: Sequence[Any] = repeated(ops)
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

        return concrete_runner(self.spec, operands, call)

    def _repeated(self, ops: Operands) -> tuple[Any, Any, Any, Any]:
        """The arrays the compiled function takes, in :data:`_OPERANDS`' order (C only where it is used)."""
        return (ops.a, ops.b, ops.c if self.spec.use_c else None, ops.bias if self.spec.has_bias else None)

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
        shape = self.spec.shapes[op]
        return _moves.redistribute(
            x, self.foreign[op], self.planned["abd".index(op)], shape=shape, family="numpy",
            devices=self.devices, rank=rank,
        )

    def _foreign_moves(self) -> list[Move]:
        """The all-to-alls that bring operands on another grid to Slab.X (and the result back)."""
        pr = self.problem
        out = []
        for op in self.foreign:
            size = pr.elements(op) * pr.itemsize
            # an element exchange from a grid to a 1-D split, as dmatmul._moves.move prices one
            out.append(Move(op, "G", "M" if op != "b" else "K", "all-to-all (another grid)",
                            size / pr.p, pr.p - 1, copied=3 * size / pr.p))
        return out
