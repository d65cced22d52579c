"""Where the differential check puts jax.Array operands: on a user's mesh
(:class:`OnMesh`), each operand in one of the :data:`PLACEMENTS`, the call
made as one of the :data:`CALLS`. Needs numpy only (JAX when a case runs).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["OnMesh", "PLACEMENTS", "CALLS"]

#: how a jax.Array operand is placed on a user's mesh (:class:`OnMesh`), simplest first; on a 2-D
#: mesh the last four are no 2-D distribution of dmatmul's (rows over one axis, replicated over the
#: other; rows over both axes, not in mesh order; Megatron's weights: columns, or rows, over the last
#: axis): distribution=None takes them where they leave a mesh axis independent (dmatmul._split), else
#: must refuse them
PLACEMENTS = ("none", "rows", "cols", "grid", "first axis", "reversed axes", "last axis cols", "last axis rows")
#: how dm.matmul is called on such operands
CALLS = ("eager", "jit", "jit under set_mesh", "jit on constants")


@dataclasses.dataclass(frozen=True)
class OnMesh:
    """jax.Array operands placed on a mesh of the user's (one process), and how
    ``dm.matmul`` is called on them: eagerly, inside ``jax.jit``, or inside
    ``jax.jit`` under ``jax.set_mesh``, or inside ``jax.jit`` on closed-over
    operands (constants of the trace). The mesh has ``shape`` (axes "data",
    "model"), Explicit axes (``jax.make_mesh``'s default) or Auto ones
    (``mixed``: the first axis of one kind, the others of the other), its
    devices in id order or reversed; ``placements`` say how a, b and c are
    placed (:data:`PLACEMENTS`: unsplit, rows or columns over every axis, rows
    over the first and columns over the rest, rows over the first axis only,
    rows over every axis in reverse order; unsplit where it would not
    split evenly). The result must come back on that mesh."""

    shape: tuple[int, ...]
    explicit: bool
    reversed: bool
    call: str
    placements: tuple[str, str, str]
    mixed: bool = False

    def describe(self) -> str:
        kind = "Explicit" if self.explicit else "Auto"
        if self.mixed:
            kind += f"-then-{'Auto' if self.explicit else 'Explicit'}"
        order = ", devices reversed" if self.reversed else ""
        mesh = "x".join(map(str, self.shape))
        return f"{self.call}: a, b, c on an {kind} {mesh} mesh{order}, placed {'/'.join(self.placements)}"

    def build(self, devices: Sequence[Any]) -> Any:
        """The mesh, on ``devices`` (JAX's, at least ``prod(shape)``)."""
        from jax.sharding import AxisType, Mesh

        devs = list(devices)[: math.prod(self.shape)]
        devs = devs[::-1] if self.reversed else devs
        first, other = (AxisType.Explicit, AxisType.Auto) if self.explicit else (AxisType.Auto, AxisType.Explicit)
        names = ("data", "model")[: len(self.shape)]
        types = (first,) + ((other if self.mixed else first),) * (len(names) - 1)
        return Mesh(np.array(devs, dtype=object).reshape(self.shape), names, axis_types=types)

    def spec(self, placement: str, shape: Sequence[int]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The mesh axes that split the rows and the columns of a matrix of
        ``shape`` placed as ``placement`` says (none where it would not split evenly)."""
        names = ("data", "model")[: len(self.shape)]
        sizes = dict(zip(names, self.shape))
        spec = {
            "none": ((), ()), "rows": (names, ()), "cols": ((), names),
            "grid": (names[:1], names[1:]) if len(names) > 1 else (names, ()),
            "first axis": (names[:1], ()), "reversed axes": (names[::-1], ()),
            "last axis cols": ((), names[-1:]), "last axis rows": (names[-1:], ()),
        }[placement]
        if any(size % math.prod(sizes[a] for a in axes) for axes, size in zip(spec, shape)):
            return ((), ())
        return spec

    def is_dmatmuls(self, placement: str, shape: Sequence[int]) -> bool:
        """Whether the placement is one of dmatmul's distributions (docs/jax.md, "Your
        mesh in, your mesh out"): nothing split, or rows or columns over every
        mesh axis in mesh order, or rows over the leading axes and columns over
        the trailing ones (or the other way round)."""
        rows, cols = self.spec(placement, shape)
        names = ("data", "model")[: len(self.shape)]
        return not rows + cols or rows + cols == names or cols + rows == names

    def splits(self, a: tuple[str, Sequence[int]], b: tuple[str, Sequence[int]], transposes: tuple[bool, bool]) -> bool:
        """Whether a and b, each (placement, stored shape), leave a mesh axis
        independent, so that ``distribution=None`` runs one product per group of
        ranks (:func:`dmatmul._split.split_product`) rather than refusing them."""
        from .._split import split_product

        def axes(placement: str, shape: Sequence[int]) -> tuple[tuple[str, ...], tuple[str, ...]]:
            sizes = dict(zip(("data", "model"), self.shape))
            rows, cols = self.spec(placement, shape)
            return tuple(n for n in rows if sizes[n] > 1), tuple(n for n in cols if sizes[n] > 1)

        mesh = dict(zip(("data", "model"), self.shape))
        return split_product(mesh, axes(*a), axes(*b), *transposes) is not None

    def put(self, x: Any, mesh: Any, placement: str, batch_axis: int | None = None) -> Any:
        """``x`` on ``mesh`` (this mesh, built) as ``placement`` says (unsplit where that would not split evenly);
        a stack of matrices (its leading batch dimensions, or one along ``batch_axis``) with each matrix so
        placed, the batch dimensions not split."""
        import jax
        from jax.sharding import NamedSharding, PartitionSpec

        shape = list(x.shape)
        if batch_axis is not None:
            del shape[batch_axis]
        spec: list[Any] = [None] * (len(shape) - 2) + [axes or None for axes in self.spec(placement, shape[-2:])]
        if batch_axis is not None:
            spec.insert(batch_axis, None)
        return jax.device_put(x, NamedSharding(mesh, PartitionSpec(*spec)))
