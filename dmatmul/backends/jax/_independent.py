"""Products on a user's mesh whose shardings leave mesh axes independent
(:mod:`dmatmul._split` decides which): one group's product, planned once
over a group (:class:`~._planning.PlannedProduct` with ``within=``), run on
every group at once: a ``shard_map`` over the whole mesh whose collectives
name the group's axes only, ``vmap``-ed with ``spmd_axis_name`` over the
independent axes that split M or N (each cut on its own devices).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding

from ... import _plan
from .. import BackendPlan
from ..._problem import Spec
from ..._sharded import Sharded
from ..._spec import Operands
from . import _kernels, _layout, _mesh
from ._execute import concrete_runner
from ._explain import ExplainedProduct
from ._planning import _x64
from ._shardings import Split, _typed_on, find

__all__ = ["Split", "find", "IndependentPlan"]  # (Split and find: read off the shardings, in ._shardings)

_Axes = tuple[str, ...]


def _entry(axes: _Axes) -> Any:
    return None if not axes else axes[0] if len(axes) == 1 else axes


def _cut(x: jax.Array, dim: int, parts: int) -> jax.Array:
    """``x`` with dimension ``dim`` cut into ``parts`` (a new leading axis)."""
    shape = x.shape[:dim] + (parts, x.shape[dim] // parts) + x.shape[dim + 1:]
    return jnp.moveaxis(x.reshape(shape), dim, 0)


class IndependentPlan(BackendPlan):
    """A product whose mesh axes are partly independent (:func:`find`): one
    group's plan, run on every group."""

    def __init__(self, spec: Spec, operands: Operands, split: Split) -> None:
        self.spec, self.split = spec, split
        pm, pn = split.parts(split.cut.m_axes), split.parts(split.cut.n_axes)
        m, n = spec.m // pm, spec.n // pn
        a_shape = (spec.k, m) if spec.transpose_a else (m, spec.k)
        b_shape = (n, spec.k) if spec.transpose_b else (spec.k, n)
        options = dataclasses.replace(spec.options, distribution=split.cut.sub)
        if spec.has_bias:
            # the bias is added to the whole result, cut as the result is (a bias inside a vmapped kernel would
            # be sliced along axes the vmap also splits): the groups' product is alpha-free and epilogue-free
            options = dataclasses.replace(options, epilog=None, alpha=1.0)
        sub_spec = dataclasses.replace(spec, a_shape=a_shape, b_shape=b_shape, bias_shape=None, options=options)
        self.group = ExplainedProduct(sub_spec, operands, within=_layout.Geometry.within(split.mesh, split.cut.group))
        self.algorithm = self.group.algorithm
        self._fn: Any = None

    @property
    def cost(self) -> _plan.Plan:
        """One group's plan: every group runs it at once, so it is each rank's cost."""
        return self.group.plan

    def free(self) -> None:
        """Nothing to release: the compiled function lives in the backend's plan cache."""

    def repeat(self, operands: Operands) -> Callable[[Operands], Any] | None:
        return concrete_runner(self.spec, operands, self.execute)

    def memory_needs(self) -> Any:
        """One group's needs: each device holds its blocks of one group's product."""
        return self.group.memory_needs()

    def execute(self, operands: Operands) -> jax.Array:
        if self._fn is None:
            self._fn = self._function()
        spec = self.spec
        bias = jnp.asarray(operands.bias) if spec.has_bias else None
        with _x64(spec.dtype):
            return self._fn(operands.a, operands.b, bias)

    def _function(self) -> Any:
        """``(a, b, bias) -> d`` on global arrays on the user's mesh: a and b retyped
        Auto (no data moves), cut along the independent axes that split M and N,
        one group's product vmapped over the cuts (``spmd_axis_name``: each cut on
        its own devices), the cuts put back, and the result typed on the user's
        mesh as jnp.matmul types it."""
        split, spec, group = self.split, self.spec, self.group
        geom = group.geom if isinstance(split.mesh, Mesh) else group.geom.abstract()
        given = group.given
        core, wsc = group._core(geom), jax.lax.with_sharding_constraint
        pm, pn = split.parts(split.cut.m_axes), split.parts(split.cut.n_axes)
        m_dim, n_dim = (1 if spec.transpose_a else 0), (0 if spec.transpose_b else 1)
        result = NamedSharding(split.mesh, split.specs[2])

        def one(a: jax.Array, b: jax.Array) -> jax.Array:
            a = wsc(_layout.pad(a, given["a"]), geom.sharding(given["a"]))
            b = wsc(_layout.pad(b, given["b"]), geom.sharding(given["b"]))
            return _layout.unpad(core(a, b, None, None), given["d"])

        f = one
        if pn > 1:
            f = jax.vmap(f, in_axes=(None, 0), spmd_axis_name=_entry(split.cut.n_axes))
        if pm > 1:
            f = jax.vmap(f, in_axes=(0, None), spmd_axis_name=_entry(split.cut.m_axes))
        epilogue = _kernels.Epilogue(spec)

        def run(a: jax.Array, b: jax.Array, bias: jax.Array | None) -> jax.Array:
            a, b = _mesh._auto_typed(a), _mesh._auto_typed(b)
            with jax.sharding.use_abstract_mesh(geom.mesh.abstract_mesh):
                d = f(_cut(a, m_dim, pm) if pm > 1 else a, _cut(b, n_dim, pn) if pn > 1 else b)
                # (pm,)? (pn,)? rows, columns: the cuts put back beside the rows and columns they cut
                if pn > 1:
                    d = jnp.moveaxis(d, -3, -2)
                    d = d.reshape(d.shape[:-2] + (-1,))
                if pm > 1:
                    d = d.reshape((-1, d.shape[-1]))
                if bias is not None:
                    d = _kernels.common.finish(epilogue, d, None, _mesh._auto_typed(bias))
            return _typed_on(d, result)

        return jax.jit(run)

    def explain(self) -> list[str]:
        split, group = self.split, self.group
        shape = " x ".join(f"{n}={s}" for n, s in split.mesh.shape.items())
        pm = split.process_mesh
        lines = [
            f"devices:    {pm.size} x {group.devices[0].platform}, your mesh ({shape})",
            "distributions (read off the shardings):",
        ]
        for name, s in zip(("a", "b", "result"), split.specs):
            how = "" if name != "result" else "  as jnp.matmul shards it on an Auto mesh"
            lines.append(f"  {name:7s} {Sharded(pm, tuple(s) + (None,) * (2 - len(s)))!r}{how}")
        for axes, what in ((split.cut.m_axes, "a's rows (M) only"), (split.cut.n_axes, "b's columns (N) only"),
                           (split.cut.free, "neither operand: every group along it computes the same product")):
            for n in axes:
                lines.append(f"independent: mesh axis {n!r} ({split.mesh.shape[n]}) splits {what}; "
                             "nothing crosses it")
        where = ", ".join(split.cut.group) or "none: one device"
        lines.append(f"per group (ranks along {where}; {group.nranks} rank{'s' * (group.nranks > 1)}), "
                     "all groups at once:")
        lines += ["  " + line for line in group.explain()[1:]]  # (but its devices line)
        return lines


