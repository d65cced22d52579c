"""Batched products on JAX (:meth:`JaxBackend.batched`), in one compiled call.

Two plans, one process:

* :class:`BatchSplitPlan` (algorithm "local"): the broadcast batch, flattened,
  split over the devices; each device multiplies its own items (one
  ``shard_map`` over a batched ``dot_general`` and the epilogue), so nothing
  crosses devices: the items are independent products. Chosen where the
  distributions are left to dmatmul (``distribution=None``), the algorithm is
  "auto" or "local", the batch has at least as many items as there are
  devices, and no trace runs (inside ``jit`` or ``grad`` the next plan runs,
  which JAX's transformations go through as they do for matrices).
* :class:`VmapPlan`: the matrix product's own plan (its algorithm, its
  distributions of the last two dimensions, its kernels) under ``jax.vmap``
  over the flattened batch: one compiled call, the batch not split.

Under several processes there is neither: the front end runs the matrix plan
on each item (``dmatmul._batched``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from ..._problem import Spec
from ..._spec import Operands
from ..._plans import PLANS
from .. import Backend, BackendPlan
from ._execute import concrete_runner
from ._kernels.common import item_product
from ._mesh import _tracing, mesh_of, plan_devices
from ._planning import _x64
from ._xla import XlaPlan, left_to_xla

__all__ = ["batched_plan", "BatchSplitPlan", "VmapPlan"]


def batched_plan(backend: Any, spec: Spec, operands: Operands) -> BackendPlan | None:
    """The JAX plan of a batched product (see the module), None under several processes."""
    if spec.spmd:
        return None
    if left_to_xla(spec, operands):
        return XlaPlan(spec, operands)
    mesh = mesh_of(spec, operands)
    if (spec.distributions is None and spec.algorithm in ("auto", "local") and not _tracing(operands)
            and (mesh is None or isinstance(mesh, Mesh))):
        devices = plan_devices(spec, mesh)
        if spec.batch_size >= len(devices) or spec.algorithm == "local":
            return _split_plan(spec, devices, mesh)
    item = spec.item_operands(operands, (0,) * len(spec.batch_shape))
    return VmapPlan(spec, PLANS.borrow(backend, spec.item(), item))


class _BatchSplits(Backend):
    """The batch-split plans, kept in the plan cache per (spec, devices, mesh):
    each compiled once."""

    name = "jax (batch split)"

    def key(self, spec: Spec, where: Any) -> Any:
        return (spec, *where)

    def plan(self, spec: Spec, where: Any) -> BackendPlan:
        return BatchSplitPlan(spec, *where)


_SPLITS = _BatchSplits()


def _split_plan(spec: Spec, devices: tuple[Any, ...], mesh: Mesh | None) -> BackendPlan:
    """The batch-split plan of ``spec`` on ``devices`` (on the user's ``mesh``)."""
    return PLANS.borrow(_SPLITS, spec, (devices, mesh))


def _flat(x: Any, batch: tuple[int, ...], count: int) -> Any:
    """An operand with batch dimensions as ``(count, rows, cols)`` (broadcast over
    ``batch`` where it has fewer items); one without stays a matrix (shared)."""
    if x is None or x.ndim <= 2:
        return x
    if tuple(x.shape[:-2]) != batch:
        x = jnp.broadcast_to(x, batch + tuple(x.shape[-2:]))
    return x.reshape((count, *x.shape[-2:]))


def _array(x: Any) -> Any:
    """``x`` as a jax.Array (None stays None): one already is is passed as it is
    (``jnp.asarray`` of a sharded array dispatches a copy: about 45 us a call)."""
    return x if x is None or isinstance(x, jax.Array) else jnp.asarray(x)


def _on_explicit(spec: PartitionSpec, explicit: frozenset[str]) -> PartitionSpec:
    """``spec`` naming the ``explicit`` mesh axes only (a value's type names no Auto axis)."""
    kept = [tuple(a for a in ((e,) if isinstance(e, str) else e or ()) if a in explicit) for e in spec]
    return PartitionSpec(*[k or None for k in kept])


class BatchSplitPlan(BackendPlan):
    """The batch split over the devices, every item on one device (no communication)."""

    algorithm = "local"

    def __init__(self, spec: Spec, devices: tuple[Any, ...], mesh: Mesh | None) -> None:
        self.spec = spec
        self.user_mesh = mesh
        self.mesh = mesh if mesh is not None else Mesh(np.array(devices, dtype=object), ("batch",))
        self.nranks = len(devices)
        self._fn = self._compile()

    def _compile(self) -> Any:
        spec, mesh = self.spec, self.mesh
        batch, count, p = spec.batch_shape, spec.batch_size, self.nranks
        padded = -(-count // p) * p
        axes = tuple(mesh.axis_names)
        split, whole = PartitionSpec(axes), PartitionSpec()
        explicit = frozenset(mesh.explicit_axes) if self.user_mesh is not None else frozenset()
        item = item_product(spec.item())

        def run(a: jax.Array, b: jax.Array, c: jax.Array | None, bias: jax.Array | None) -> jax.Array:
            xs = [_flat(x, batch, count) for x in (a, b, c, bias)]
            xs = [x if x is None or x.ndim <= 2 or padded == count
                  else jnp.pad(x, ((0, padded - count), (0, 0), (0, 0))) for x in xs]
            in_axes = tuple(None if x is None or x.ndim <= 2 else 0 for x in xs)
            specs = tuple(None if x is None else split if x.ndim > 2 else whole for x in xs)
            if explicit:  # shard_map takes a value typed on Explicit axes only as its in_specs name them
                xs = [x if x is None or s is None else jax.sharding.reshard(x, _on_explicit(s, explicit))
                      for x, s in zip(xs, specs)]
            body = jax.shard_map(jax.vmap(item, in_axes=in_axes), mesh=mesh, in_specs=specs, out_specs=split)
            return body(*xs)  # (padded items, M, N), split as computed: no gather inside the kernel

        return jax.jit(run)

    def execute(self, operands: Operands) -> Any:
        spec = self.spec
        c = operands.c if spec.use_c else None
        bias = operands.bias if spec.has_bias else None
        with _x64(spec.dtype), jax.set_mesh(self.mesh):
            d = self._fn(_array(operands.a), _array(operands.b), _array(c), _array(bias))
        shape = spec.batch_shape + (spec.m, spec.n)
        if operands.family == "numpy":  # (a copy: the caller owns a numpy result, writeable)
            return np.array(np.asarray(d)[:spec.batch_size]).reshape(shape)
        if self._relaid:  # (a gather: the items' blocks do not fall on the batch's dimensions as they are)
            with jax.set_mesh(self.mesh):
                if self.user_mesh is not None and self.mesh.explicit_axes:  # (typed split: gathered first)
                    d = jax.sharding.reshard(d, PartitionSpec())
                return d[:spec.batch_size].reshape(shape)
        return d

    def repeat(self, operands: Operands) -> Callable[[Operands], Any] | None:
        return concrete_runner(self.spec, operands, self.execute)

    @property
    def _relaid(self) -> bool:
        """Whether a jax.Array result is laid out anew after the kernel (padding
        taken off, or a batch of several dimensions)."""
        return len(self.spec.batch_shape) > 1 or self.spec.batch_size % self.nranks != 0

    def explain(self) -> list[str]:
        s, p = self.spec, self.nranks
        per = -(-s.batch_size // p)
        return [
            f"batch:      {s.batch_shape} ({s.batch_size} items), split over the {p} devices of mesh "
            f"{dict(self.mesh.shape)} ({per} items per device"
            + (f", padded to {per * p})" if per * p != s.batch_size else ")"),
            "kernel:     independent products: each device multiplies its own items (one batched GEMM and "
            "the epilogue); nothing is communicated",
            f"modelled:   0 B received per rank, {2 * per * s.m * s.n * s.k / 1e9:.3g} GFLOP per rank",
        ] + (["result:     a jax.Array result is gathered into the batch's shape after the kernel (padded items "
              "dropped, or several batch dimensions): a batch of one dimension, a multiple of the device count, "
              "stays where it was computed"] if self._relaid else [])


class VmapPlan(BackendPlan):
    """The matrix product's plan under ``jax.vmap`` over the flattened batch."""

    def __init__(self, spec: Spec, plan: Any) -> None:
        self.spec, self.plan = spec, plan
        self.algorithm = plan.algorithm

    @property
    def cost(self) -> Any:
        return self.plan.cost

    @functools.cached_property
    def _in_axes(self) -> tuple[int | None, ...]:
        s = self.spec
        shapes = (s.a_shape, s.b_shape, s.c_shape if s.use_c else None, s.bias_shape if s.has_bias else None)
        return tuple(None if shape is None or len(shape) <= 2 else 0 for shape in shapes)

    def execute(self, operands: Operands) -> Any:
        spec = self.spec
        batch, count = spec.batch_shape, spec.batch_size
        plan = self.plan

        def one(a: Any, b: Any, c: Any, bias: Any) -> Any:
            return plan.execute(Operands(a, b, c, bias))

        given = (operands.a, operands.b, operands.c if spec.use_c else None, operands.bias if spec.has_bias else None)
        # numpy operands beside jax.Arrays on a user's mesh go onto that mesh whole, as the matrix plan places
        # them: on the default device they would leave the vmapped items on two places, and the plan on neither
        mesh = mesh_of(spec, operands) if not _tracing(operands) else None
        put: Callable[[Any], Any] = jnp.asarray
        if isinstance(mesh, Mesh):
            whole = jax.sharding.NamedSharding(mesh, PartitionSpec())
            put = lambda x: jax.device_put(x, whole) if isinstance(x, np.ndarray) else jnp.asarray(x)  # noqa: E731
        with _x64(spec.dtype):
            xs = [None if x is None else _flat(put(x), batch, count) for x in given]
            d = jax.vmap(one, in_axes=self._in_axes)(*xs)
            d = d.reshape(batch + tuple(d.shape[-2:]))
        # (a copy: the caller owns a numpy result, writeable)
        return np.array(d) if operands.family == "numpy" and not _tracing(operands) else d

    def explain(self) -> list[str]:
        s = self.spec
        return [f"batch:      {s.batch_shape} ({s.batch_size} items): the matrix plan below under jax.vmap, one "
                "compiled call; the batch is not split over devices (each item is laid out as below)",
                *self.plan.explain()]

    def free(self) -> None:
        self.plan.free()
