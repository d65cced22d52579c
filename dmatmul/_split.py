"""Products whose operands' layouts on a named mesh leave mesh axes independent
(backend-neutral, pure Python).

With ``distribution=None`` a ``jax.Array``'s sharding is a :class:`~dmatmul.Sharded`
on the user's mesh. A mesh axis that splits neither operand's contracted
dimension, and that splits only a's rows (M), only b's columns (N), or
nothing, is *independent*: the product is one product per position along it
(on a's rows there, on b's columns there, or the same product repeated), and
no data crosses it. What remains is one product per group of ranks along the
other axes (``ProcessMesh.groups``), a 2-D product over that group that the
planner plans once.

The result is sharded as ``jnp.matmul`` shards it on an Auto mesh: rows over
the independent axes of a's rows, then over the group's axes of a's rows
that b's columns do not use; columns over b's column axes; partial sums over
the contracted axes summed, so replicated over them (on an Explicit mesh,
where ``jnp.matmul`` asks for an ``out_sharding``, this is dmatmul's choice).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ._distribution import Distribution
from ._mesh import ProcessMesh
from ._sharded import Sharded

__all__ = ["MeshSplit", "split_product"]

Axes = tuple[str, ...]


def _entry(axes: Axes) -> str | Axes | None:
    return None if not axes else axes[0] if len(axes) == 1 else axes


def _logical(entries: tuple[Axes, Axes], k_first: bool) -> tuple[Axes, Axes]:
    """(outer, contracted) axes of a stored operand's (rows, columns) axes:
    ``k_first`` where its rows are contracted (b, or a transposed a)."""
    return (entries[1], entries[0]) if k_first else entries


def _stored(outer: Axes, inner: Axes, k_first: bool) -> tuple[Axes, Axes]:
    """The inverse of :func:`_logical`: (rows, columns) axes."""
    return (inner, outer) if k_first else (outer, inner)


@dataclasses.dataclass(frozen=True)
class MeshSplit:
    """A product on a named mesh cut along its independent axes."""

    group: Axes  # the axes of one group's product (its ranks), in mesh order
    m_axes: Axes  # independent axes that split a's rows (they lead a's row entry)
    n_axes: Axes  # independent axes that split b's columns (they lead b's column entry)
    free: Axes  # independent axes that split neither: the product repeated along them
    sub: tuple[Distribution, Distribution, Distribution]  # a, b and the result over one group
    result: tuple[str | Axes | None, str | Axes | None]  # the result's spec on the mesh


def split_product(
    mesh: Mapping[str, int], a: tuple[Axes, Axes], b: tuple[Axes, Axes], transpose_a: bool, transpose_b: bool
) -> MeshSplit | None:
    """The split of a product whose stored a and b are split over the mesh
    axes ``a`` and ``b`` (rows' axes, columns' axes; axes of size 1 left out)
    on a mesh of ``mesh`` (axis -> size, in mesh order), or None where no axis
    is independent, where a cut would not hold whole rows of a (columns of b:
    its axes must lead the entry), or where a group's product is on a 2-D grid.

    >>> s = split_product({"data": 2, "model": 4}, (("data",), ()), ((), ("model",)), False, False)
    >>> s.group, s.m_axes, s.n_axes, s.sub, s.result
    ((), ('data',), ('model',), (Replicated(), Replicated(), Replicated()), ('data', 'model'))
    >>> s = split_product({"data": 2, "model": 4}, ((), ("model",)), (("model",), ()), False, False)
    >>> s.group, s.free, s.sub, s.result
    (('model',), ('data',), (Slab.Y, Slab.X, Replicated()), (None, None))
    """
    a_m, a_k = _logical(a, transpose_a)
    b_n, b_k = _logical(b, not transpose_b)
    split = [n for n, size in mesh.items() if size > 1]
    independent = [n for n in split if n not in a_k + b_k and not (n in a_m and n in b_n)]
    m_axes = tuple(n for n in a_m if n in independent)
    n_axes = tuple(n for n in b_n if n in independent)
    if not independent or a_m[: len(m_axes)] != m_axes or b_n[: len(n_axes)] != n_axes:
        return None
    group = tuple(n for n in split if n not in independent)
    sub_mesh = ProcessMesh(tuple(mesh[n] for n in group) or (1,), group or ("_",))
    a_sub, b_sub = a_m[len(m_axes):], b_n[len(n_axes):]
    d_sub = tuple(n for n in a_sub if n not in b_n + a_k + b_k), tuple(n for n in b_sub if n not in a_k + b_k)

    def two_d(outer: Axes, inner: Axes, k_first: bool) -> Distribution | None:
        return Sharded(sub_mesh, tuple(map(_entry, _stored(outer, inner, k_first)))).as_2d()

    sub = (two_d(a_sub, a_k, transpose_a), two_d(b_sub, b_k, not transpose_b), two_d(*d_sub, False))
    if any(d is None or (d.grid is not None and d.grid.ndim == 2) for d in sub):
        return None  # a group's product on a 2-D grid: the 1-D kernels only, for now
    result = _entry(m_axes + d_sub[0]), _entry(n_axes + d_sub[1])
    return MeshSplit(group, m_axes, n_axes, tuple(n for n in independent if n not in m_axes + n_axes),
                     sub, result)  # type: ignore[arg-type]
