"""Roles: how a distribution splits an operand, in the product's terms.

Every operand is described by its *role*: which logical dimension of the
product ``D[M, N] = op(A)[M, K] @ op(B)[K, N]`` its distribution splits over
the ranks, or ``"R"`` when every rank holds it whole. Roles are read off the
distribution of the *stored* matrix and its transpose flag. The planner
(:mod:`dmatmul._plan`) costs kernels that take operands in fixed roles, and
the moves between roles (:mod:`dmatmul._moves`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ._distribution import BlockNonCyclic, Distribution, Replicated, Slab
from .algorithms.base import OPERANDS, Operand, Role

__all__ = ["stored_dims", "role_of", "roles_of", "role_dist", "dist_for_role", "on_grid_roles"]

_LOGICAL: dict[str, tuple[str, str]] = {"a": ("M", "K"), "b": ("K", "N"), "d": ("M", "N")}


def stored_dims(operand: Operand, transposed: bool) -> tuple[str, str]:
    """Logical dimension names of the stored matrix's (rows, cols).

    >>> stored_dims("a", False), stored_dims("a", True), stored_dims("b", True)
    (('M', 'K'), ('K', 'M'), ('N', 'K'))
    """
    dims = _LOGICAL[operand]
    return (dims[1], dims[0]) if transposed else dims


def role_of(dist: Distribution, operand: Operand, transposed: bool, nranks: int) -> Role | None:
    """The 1-D role of a distribution, or None when it needs a 2-D grid.

    ``BlockNonCyclic`` on a ``(P, 1)`` or ``(1, P)`` grid with
    ``first_process=(0, 0)`` splits exactly as a Slab does, so it gets the
    Slab's role. On one rank every distribution is ``R``.

    >>> role_of(Slab.X, "a", True, 4)
    'K'
    """
    if nranks == 1 or isinstance(dist, Replicated):
        return "R"
    dims = stored_dims(operand, transposed)
    if isinstance(dist, Slab):
        return dims[dist.dim]  # type: ignore[return-value]
    if isinstance(dist, BlockNonCyclic) and dist.first_process == (0, 0):
        split = [i for i, s in enumerate(dist.grid.shape) if s > 1]
        if len(split) == 1:
            return dims[split[0]]  # type: ignore[return-value]
    return None


def roles_of(
    dists: Sequence[Distribution], transposes: tuple[bool, bool], nranks: int
) -> dict[str, Role]:
    """The roles of ``(a, b, result)``; a grid layout that is not 1-D is ``"G"``.

    >>> roles_of((Slab.X, Slab.Y, Slab.X), (False, False), 4)
    {'a': 'M', 'b': 'N', 'd': 'M'}
    """
    ts = (transposes[0], transposes[1], False)
    return {op: role_of(d, op, t, nranks) or "G" for op, d, t in zip(OPERANDS, dists, ts)}


def role_dist(operand: Operand, role: Role, transposed: bool) -> Distribution:
    """The 1-D distribution of the stored operand that gives it ``role``.

    >>> role_dist("a", "K", True)
    Slab.X
    """
    if role == "R":
        return Replicated()
    return Slab(stored_dims(operand, transposed).index(role))


def dist_for_role(operand: Operand, role: Role, transposed: bool) -> str:
    """How a user writes a role as a distribution of the stored operand."""
    if role == "R":
        return "Replicated()"
    if role == "G":
        return "a 2-D grid distribution"
    return "Slab.X" if stored_dims(operand, transposed).index(role) == 0 else "Slab.Y"


def on_grid_roles(roles: dict[str, Role], grid_ops: Iterable[str]) -> dict[str, Role]:
    """The roles SUMMA sees: an operand laid out on the product's process grid
    (``grid_ops``) is ``"G"`` there, whatever 1-D role it has for the other
    kernels (a ``BlockNonCyclic`` on a ``(P, 1)`` grid splits as ``Slab.X``
    does, and is a grid layout all the same); a replicated one stays ``"R"``.

    >>> on_grid_roles({"a": "M", "b": "R", "d": "M"}, {"a", "b", "d"})
    {'a': 'G', 'b': 'R', 'd': 'G'}
    """
    ops = set(grid_ops)
    return {op: "G" if op in ops and role != "R" else role for op, role in roles.items()}
