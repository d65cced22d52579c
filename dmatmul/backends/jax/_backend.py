"""The JAX backend: plan (roles, padding, kernel) and execute (jit over shard_map)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ... import _memory, _plan, _runtime
from ..._distribution import Distribution, Replicated
from ..._plans import PLANS
from .. import Backend, BackendPlan
from ..._problem import Spec
from ..._spec import Operands
from ._arrays import in_program
from ._arrays import in_trace as in_jax_trace
from . import _independent, _layout, _start
from . import _redistribute as _moves

from ._explain import ExplainedProduct
from ._mesh import _inside_shard_map, _split_vmap, _tracing, mesh_of, plan_devices, user_mesh
from ._shardings import _fit_devices, _given_distributions, _on_mesh, _redistribute_traced, place_result
from ._planning import _x64, sized
from ._xla import XlaPlan, left_to_xla

__all__ = ["JaxBackend", "JaxPlan"]

class JaxPlan(ExplainedProduct, BackendPlan):
    """A compiled product on a set of JAX devices (one or several processes).

    ``given`` holds where each operand is (its distribution's placement),
    ``kernel`` where the chosen algorithm needs it; the jitted function moves
    operands from one to the other (:func:`_exchange.redistribute`), runs the
    ``shard_map`` kernel, and moves the result back.

    Its layers, one module each: planned (:mod:`._planning`), compiled
    (:mod:`._compile`), executed (:mod:`._execute`), explained (:mod:`._explain`).
    """

    def free(self) -> None:
        """Nothing to release: compiled functions live in the backend's plan cache."""


class JaxBackend(Backend):
    """Its plans are kept (:mod:`dmatmul._plans`) per Spec and layouts of the
    jax.Array operands (:meth:`key`): repeated ``dm.matmul`` calls on the same
    problem compile once. Past ``cache_size`` plans, the one unused longest goes."""

    name = "jax"
    cache_size = 128

    def place(self, result: Any, spec: Spec, operands: Operands) -> Any:
        """An empty product's result, one process (:func:`place_result`): a
        jax.Array for jax operands, and for any operands inside a trace (as a
        product with elements returns there)."""
        return place_result(result, spec, operands) if operands.family == "jax" or in_jax_trace() else result

    def fits(self, spec: Spec, operands: Operands) -> None:
        """The refusal of ``spec``'s named algorithm, where it does not fit, as
        :meth:`plan` gives it (a plan is laid out, not cached or compiled): on the mesh axes
        the shardings leave independent, one group's."""
        self.plan(spec, operands)

    def ranks(self, spec: Spec, operands: Operands) -> int:
        """One device per process under mpiexec; else the devices of the operands'
        mesh, or those ``devices=`` picks (as :class:`JaxPlan` takes them). With
        ``distribution=None``, jax.Array operands whose sharding is none of
        dmatmul's distributions are refused here as :meth:`plan` refuses them
        (an empty product asks only this)."""
        if spec.spmd:
            return spec.nprocs
        mesh = mesh_of(spec, operands)
        devices = plan_devices(spec, mesh)
        if spec.distributions is None and spec.family == "jax" and _independent.find(spec, operands, mesh, devices) is None:
            _given_distributions(spec, operands, devices)
        return len(devices)

    def planner(self, spec: Spec, operands: Operands, nranks: int) -> tuple[Any, Any, None]:
        """The sizes (padded: JAX shards evenly) and the model of the devices the
        product runs on (as :class:`JaxPlan` takes them), every kernel."""
        devices = _layout.process_devices(spec.nprocs) if spec.spmd else plan_devices(spec, mesh_of(spec, operands))
        problem, model = sized(spec, devices[0], nranks)
        return problem, model, None

    def memory(self, spec: Spec, operands: Operands) -> tuple[list[_memory.Need], dict[str, _memory.Probe]]:
        """What the product takes, per place, and how to ask each device what it
        has free (:meth:`JaxPlan.memory_needs`; the plan is laid out and kept,
        not compiled)."""
        plan = PLANS.borrow(self, spec, operands)  # (kept: the product's own plan, next, is this one)
        try:
            return plan.memory_needs()
        finally:
            plan.free()

    def start(self, runtime: _runtime.Runtime) -> _runtime.Runtime:
        """``jax.distributed`` over the runtime's processes (see :mod:`._start`)."""
        return _start.start(runtime)

    def stop(self) -> None:
        """Shut the process group down; plans made on it go with it (a product
        after ``dm.finalize()`` plans anew, and the start says why it cannot)."""
        _start.stop()
        PLANS.drop(self.name, lambda plan: plan.spec.spmd)  # type: ignore[attr-defined]

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

    def lay_out(self, d: Any, dist: Any, operands: Operands) -> Any:
        """One process: a result laid out as the :class:`~dmatmul.Sharded` ``dist``
        (of every dimension) says, on the devices it is on (in rank order), with
        the NamedSharding of ``dist``'s mesh and spec where every split is even
        (JAX shards only evenly), else replicated there. Operands on a user's
        mesh get it back on that mesh: ``dist``'s spec there where the mesh has
        ``dist``'s shape (its axes taken in order for ``dist``'s), else
        replicated there. A numpy result, or one inside a trace (where XLA
        places it), stays as it is."""
        if not isinstance(d, jax.Array) or isinstance(d, jax.core.Tracer):
            return d
        sharding: Any = d.sharding
        devices = list(sharding.mesh.devices.flat) if isinstance(sharding, NamedSharding) else \
            sorted(sharding.device_set, key=lambda dev: dev.id)
        if len(devices) != dist.mesh.size:  # (the rank counts were checked: a result on one device)
            return d
        even = all(size % max(1, int(np.prod([dist.mesh.shape[dist.mesh.axis_names.index(n)]
                                                  for n in dist.axes(i)]))) == 0
                   for i, size in enumerate(d.shape))
        spec = dist.spec if even else ()
        mesh = user_mesh(operands)
        if isinstance(mesh, Mesh):
            if tuple(mesh.devices.shape) != tuple(dist.mesh.shape):
                spec = ()
            names = dict(zip(dist.mesh.axis_names, mesh.axis_names))
            spec = tuple(None if e is None else names[e] if isinstance(e, str) else tuple(names[n] for n in e)
                         for e in spec)
        else:
            mesh = Mesh(np.array(devices, dtype=object).reshape(dist.mesh.shape), dist.mesh.axis_names)
        return jax.device_put(d, NamedSharding(mesh, PartitionSpec(*spec)))

    def batched(self, spec: Spec, operands: Operands) -> BackendPlan | None:
        """A batched product in one compiled call (:mod:`._batched`): the batch split
        over the devices, or the matrix plan under ``jax.vmap``."""
        from ._batched import batched_plan

        return batched_plan(self, spec, operands)

    def batches(self, spec: Spec) -> bool:
        """In one process (under mpiexec each rank's blocks are folded or looped)."""
        return not spec.spmd

    def key(self, spec: Spec, operands: Operands) -> Any:
        """The spec, a schedule the checker forces, and (one process) the mesh the
        operands are on, the mesh axes their shardings leave independent, or
        else the distributions their shardings say; refused inside
        ``shard_map`` and under a ``vmap`` that splits the operands."""
        manual = jax.sharding.get_abstract_mesh().manual_axes
        if manual:
            raise ValueError(_inside_shard_map(manual))
        split = _split_vmap(operands) if in_program(spec) and _tracing(operands) else None
        if split is not None:
            raise ValueError(split)
        if left_to_xla(spec, operands):
            return (spec, "xla", user_mesh(operands))
        key: Any = (spec, _plan.forced_schedule())  # a schedule forced by the checker is planned apart
        cut = None
        if in_program(spec):
            mesh = mesh_of(spec, operands)
            devices = plan_devices(spec, mesh)
            key = (*key, mesh, mesh is not None and _tracing(operands))
            # mesh axes that the shardings leave independent run independent products
            cut = _independent.find(spec, operands, mesh, devices)
            if cut is not None:
                key += (cut,)
            elif spec.distributions is None and spec.family == "jax":
                key += _given_distributions(spec, operands, devices)
        return key

    def plan(self, spec: Spec, operands: Operands) -> JaxPlan | _independent.IndependentPlan | XlaPlan:
        if left_to_xla(spec, operands):  # (as key() found it)
            return XlaPlan(spec, operands)
        cut = None
        if in_program(spec):  # (as key() found it)
            mesh = mesh_of(spec, operands)
            cut = _independent.find(spec, operands, mesh, plan_devices(spec, mesh))
        return JaxPlan(spec, operands) if cut is None else _independent.IndependentPlan(spec, operands, cut)
