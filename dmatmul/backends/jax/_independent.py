"""Products on a user's mesh whose shardings leave mesh axes independent.

With ``distribution=None``, ``a`` and ``b`` are read as :class:`~dmatmul.Sharded`
on the user's mesh, as they are sharded. A mesh axis that splits neither
operand's contracted dimension, and that splits only a's rows (M), only b's
columns (N), or nothing, is *independent*: the product is one product per
position along it (each on a's rows there, or b's columns there, or the same
product repeated), and no data crosses it. What remains is one product per
group of ranks along the other axes (``ProcessMesh.groups``), planned once by
the 2-D planner over one group (:class:`~._planning.PlannedProduct` with
``within=``) and run on every group at once: a ``shard_map`` over the whole
mesh whose collectives name the group's axes only, ``vmap``-ed with
``spmd_axis_name`` over the independent axes that split M or N.

The result is sharded as ``jnp.matmul`` shards it on an Auto mesh: rows as
a's rows are over the independent axes, then over the group's axes that a's
rows use and b's columns do not; columns as b's columns are; partial sums
over contracted axes are summed (replicated over them: on an Explicit mesh,
where ``jnp.matmul`` asks for an ``out_sharding``, this is dmatmul's choice).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from ... import _plan
from ..._distribution import Distribution
from ..._mesh import ProcessMesh
from ..._problem import Spec
from ..._sharded import Sharded
from ..._spec import Operands
from . import _layout, _mesh
from ._explain import ExplainedProduct
from ._mesh import _spec_axes
from ._planning import _x64
from ._shardings import _layout_of, _typed_on

__all__ = ["Split", "find", "IndependentPlan"]

_Axes = tuple[str, ...]


def _entry(axes: _Axes) -> Any:
    return None if not axes else axes[0] if len(axes) == 1 else axes


@dataclasses.dataclass(frozen=True)
class Split:
    """A product on a user's mesh cut along its independent axes."""

    mesh: Mesh | AbstractMesh  # the user's
    group: _Axes  # the axes of one group's product (its ranks), mesh order
    m_axes: _Axes  # independent axes that split a's rows (major in a's row entry)
    n_axes: _Axes  # independent axes that split b's columns
    free: _Axes  # independent axes that split neither: the product repeated along them
    sub: tuple[Distribution, Distribution, Distribution]  # a, b, result over one group
    specs: tuple[PartitionSpec, PartitionSpec, PartitionSpec]  # a, b, result on the user's mesh

    def parts(self, axes: _Axes) -> int:
        return math.prod(self.mesh.shape[n] for n in axes)

    @property
    def process_mesh(self) -> ProcessMesh:
        return ProcessMesh(tuple(self.mesh.shape.values()), tuple(self.mesh.axis_names))


def _logical(entries: tuple[_Axes, _Axes], k_first: bool) -> tuple[_Axes, _Axes]:
    """(outer, contracted) axes of a stored operand's (rows, columns) entries:
    ``k_first`` where its rows are contracted (b, or a transposed)."""
    return (entries[1], entries[0]) if k_first else entries


def _stored(outer: _Axes, inner: _Axes, k_first: bool) -> tuple[_Axes, _Axes]:
    """The inverse of :func:`_logical`: (rows, columns) axes."""
    return (inner, outer) if k_first else (outer, inner)


def find(spec: Spec, operands: Operands, mesh: Mesh | AbstractMesh | None,
         devices: tuple[jax.Device, ...]) -> Split | None:
    """The split of a one-process product on jax.Arrays with ``distribution=None``
    whose shardings leave a mesh axis independent, or None where none does (the
    product is then planned over every device, as its shardings read as 2-D
    distributions: :func:`._shardings._given_distributions`). C read (``beta``)
    is not split: its sharding says the result's."""
    if spec.distributions is not None or spec.family != "jax" or spec.spmd or mesh is None or spec.use_c:
        return None
    la, lb = _layout_of(operands.a, devices), _layout_of(operands.b, devices)
    if la is None or lb is None:
        return None
    user = la[1]

    def axes(s: PartitionSpec) -> tuple[_Axes, _Axes]:
        parts = tuple(s) + (None,) * (2 - len(s))
        return _spec_axes(parts[0], user), _spec_axes(parts[1], user)

    a_m, a_k = _logical(axes(la[0]), spec.transpose_a)
    b_n, b_k = _logical(axes(lb[0]), not spec.transpose_b)
    split = [n for n, size in user.shape.items() if size > 1]
    independent = [n for n in split if n not in a_k + b_k and not (n in a_m and n in b_n)]
    m_axes = tuple(n for n in a_m if n in independent)
    n_axes = tuple(n for n in b_n if n in independent)
    # a cut must hold whole rows of a (columns of b): its axes lead the entry
    if not independent or a_m[: len(m_axes)] != m_axes or b_n[: len(n_axes)] != n_axes:
        return None
    group = tuple(n for n in split if n not in independent)
    free = tuple(n for n in independent if n not in m_axes + n_axes)
    sub_mesh = ProcessMesh(tuple(user.shape[n] for n in group) or (1,), group or ("_",))
    rest = lambda xs, drop: tuple(n for n in xs if n not in drop)  # noqa: E731
    a_sub = rest(a_m, m_axes), a_k
    b_sub = rest(b_n, n_axes), b_k
    # the result as jnp.matmul has it: partial sums over contracted axes summed; rows over a's row axes that
    # b's columns leave free, columns over b's
    d_sub = rest(a_sub[0], b_n + a_k + b_k), rest(b_sub[0], a_k + b_k)

    def two_d(outer: _Axes, inner: _Axes, k_first: bool) -> Distribution | None:
        return Sharded(sub_mesh, tuple(map(_entry, _stored(outer, inner, k_first)))).as_2d()

    sub = (two_d(*a_sub, spec.transpose_a), two_d(*b_sub, not spec.transpose_b), two_d(*d_sub, False))
    if any(d is None or (d.grid is not None and d.grid.ndim == 2) for d in sub):
        return None  # a group's product on a 2-D grid: the 1-D kernels only, for now
    d_spec = PartitionSpec(_entry(m_axes + d_sub[0]), _entry(n_axes + d_sub[1]))
    return Split(user if isinstance(mesh, AbstractMesh) else mesh, group, m_axes, n_axes, free,
                 sub, (la[0], lb[0], d_spec))  # type: ignore[arg-type]


def _cut(x: jax.Array, dim: int, parts: int) -> jax.Array:
    """``x`` with dimension ``dim`` cut into ``parts`` (a new leading axis)."""
    shape = x.shape[:dim] + (parts, x.shape[dim] // parts) + x.shape[dim + 1:]
    return jnp.moveaxis(x.reshape(shape), dim, 0)


class IndependentPlan:
    """A product whose mesh axes are partly independent (:func:`find`): one
    group's plan, run on every group."""

    def __init__(self, spec: Spec, operands: Operands, split: Split) -> None:
        self.spec, self.split = spec, split
        pm, pn = split.parts(split.m_axes), split.parts(split.n_axes)
        m, n = spec.m // pm, spec.n // pn
        a_shape = (spec.k, m) if spec.transpose_a else (m, spec.k)
        b_shape = (n, spec.k) if spec.transpose_b else (spec.k, n)
        bias_shape = spec.bias_shape
        if bias_shape is not None:
            bias_shape = (1, n) if spec.bias_columns else (m,) + bias_shape[1:]
        options = dataclasses.replace(spec.options, distribution=split.sub)
        sub_spec = dataclasses.replace(spec, a_shape=a_shape, b_shape=b_shape, bias_shape=bias_shape, options=options)
        self.group = ExplainedProduct(sub_spec, operands, within=_layout.Geometry.within(split.mesh, split.group))
        self.algorithm = self.group.algorithm
        self._fn: Any = None

    @property
    def cost(self) -> _plan.Plan:
        """One group's plan: every group runs it at once, so it is each rank's cost."""
        return self.group.plan

    def free(self) -> None:
        """Nothing to release: the compiled function lives in the backend's plan cache."""

    def repeat(self, operands: Operands) -> None:
        return None

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
        pm, pn = split.parts(split.m_axes), split.parts(split.n_axes)
        m_dim, n_dim = (1 if spec.transpose_a else 0), (0 if spec.transpose_b else 1)
        bias_on = None if not spec.has_bias else "n" if spec.bias_columns else "m"
        result = NamedSharding(split.mesh, split.specs[2])

        def one(a: jax.Array, b: jax.Array, bias: jax.Array | None) -> jax.Array:
            a = wsc(_layout.pad(a, given["a"]), geom.sharding(given["a"]))
            b = wsc(_layout.pad(b, given["b"]), geom.sharding(given["b"]))
            if bias is not None:
                bias = group._padded_bias(bias)
            return _layout.unpad(core(a, b, None, bias), given["d"])

        f = one
        if pn > 1:
            f = jax.vmap(f, in_axes=(None, 0, 0 if bias_on == "n" else None), spmd_axis_name=_entry(split.n_axes))
        if pm > 1:
            f = jax.vmap(f, in_axes=(0, None, 0 if bias_on == "m" else None), spmd_axis_name=_entry(split.m_axes))

        def run(a: jax.Array, b: jax.Array, bias: jax.Array | None) -> jax.Array:
            a, b = _mesh._auto_typed(a), _mesh._auto_typed(b)
            if bias is not None:
                bias = _mesh._auto_typed(bias)
            with jax.sharding.use_abstract_mesh(geom.mesh.abstract_mesh):
                if pm > 1:
                    a = _cut(a, m_dim, pm)
                    bias = _cut(bias, 0, pm) if bias_on == "m" else bias
                if pn > 1:
                    b = _cut(b, n_dim, pn)
                    bias = _cut(bias, 1, pn) if bias_on == "n" else bias
                d = f(a, b, bias)  # (pm,)? (pn,)? rows, columns
                if pn > 1:
                    d = jnp.moveaxis(d, -3, -2)  # the columns' cut beside the columns
                    d = d.reshape(d.shape[:-2] + (-1,))
                if pm > 1:
                    d = d.reshape((-1, d.shape[-1]))
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
        for axes, what in ((split.m_axes, "a's rows (M) only"), (split.n_axes, "b's columns (N) only"),
                           (split.free, "neither operand: every group along it computes the same product")):
            for n in axes:
                lines.append(f"independent: mesh axis {n!r} ({split.mesh.shape[n]}) splits {what}; "
                             "nothing crosses it")
        where = ", ".join(split.group) or "none: one device"
        lines.append(f"per group (ranks along {where}; {group.nranks} rank{'s' * (group.nranks > 1)}), "
                     "all groups at once:")
        lines += ["  " + line for line in group.explain()[1:]]  # (but its devices line)
        return lines


