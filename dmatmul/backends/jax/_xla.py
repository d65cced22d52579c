"""Products left to XLA's partitioner: inside ``jax.jit`` on an Auto mesh.

There a traced operand's type names the mesh but not how the operand is laid
out on it (XLA decides that when it compiles the whole program), so no
distribution can be read off it, and a layout dmatmul picked would be imposed
on values XLA may have laid out otherwise, and would give the result a
sharding ``jnp.matmul`` would not. With ``distribution=None`` and
``algorithm="auto"`` the product is therefore written as ``jnp.matmul`` writes
it (one ``dot_general``, batch dimensions included, and the epilogue) and XLA
lays it out with the rest of the program: the result is sharded as
``jnp.matmul``'s, and what moves is XLA's choice. ``explain()`` says so, and
``distribution=`` or a named ``algorithm=`` still runs dmatmul's kernels there.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ... import _memory
from ..._problem import Spec
from ..._spec import Operands
from .. import BackendPlan
from ._arrays import in_program
from ._kernels.common import item_product
from ._mesh import _explicit, _staging, user_mesh
from ._planning import _x64
from ._shardings import _layout_of

__all__ = ["left_to_xla", "XlaPlan"]


def left_to_xla(spec: Spec, operands: Operands) -> bool:
    """Whether the product is left to XLA (see the module): one process, inside
    ``jit``, ``distribution=None``, ``algorithm="auto"``, no ``devices=``, on a
    user's mesh of several devices and Auto axes only, and a or b a traced
    value whose type does not say how it is laid out."""
    if spec.distributions is not None or spec.algorithm != "auto" or spec.devices is not None:
        return False
    if not in_program(spec) or not _staging(operands):
        return False
    mesh = user_mesh(operands)
    if mesh is None or mesh.size < 2 or _explicit(mesh):
        return False
    devices = tuple(range(mesh.size))  # (only their number matters to a traced value's type)
    return any(isinstance(x, jax.core.Tracer) and _layout_of(x, devices) is None for x in (operands.a, operands.b))


def _product(spec: Spec) -> Any:
    """``epilog(alpha * op(a) @ op(b) + beta * c + bias)`` over the broadcast
    batch, as ``jnp.matmul`` computes it: each batch dimension a batch
    dimension of one ``dot_general`` (``jax.vmap``), none flattened, so that
    XLA keeps a split batch dimension where it is."""
    one, batch = item_product(spec.item()), spec.batch_shape

    def run(a: jax.Array, b: jax.Array, c: jax.Array | None, bias: jax.Array | None) -> jax.Array:
        xs = [None if x is None else jnp.asarray(x) for x in (a, b, c, bias)]
        xs = [x if x is None or x.ndim <= 2 else jnp.broadcast_to(x, batch + x.shape[-2:]) for x in xs]
        f: Any = one
        for _ in batch:
            f = jax.vmap(f, in_axes=tuple(None if x is None or x.ndim <= 2 else 0 for x in xs))
        return f(*xs)

    return run


class XlaPlan(BackendPlan):
    """The product as ``jnp.matmul`` writes it, laid out by XLA (see the module)."""

    algorithm = "xla"

    def __init__(self, spec: Spec, operands: Operands) -> None:
        self.spec = spec
        self._run = _product(spec)
        self.nranks = user_mesh(operands).size  # type: ignore[union-attr]

    def execute(self, operands: Operands) -> Any:
        spec = self.spec
        with _x64(spec.dtype):
            return self._run(operands.a, operands.b, operands.c if spec.use_c else None,
                             operands.bias if spec.has_bias else None)

    def memory_needs(self) -> tuple[list[_memory.Need], dict[str, _memory.Probe]]:
        """Nothing judged here: XLA lays the product out when it compiles the
        program, and judges its memory then."""
        return [], {}

    def explain(self) -> list[str]:
        s, p = self.spec, self.nranks
        flops = 2 * s.batch_size * s.m * s.n * s.k
        return [
            f"layouts:    left to XLA: inside jax.jit on an Auto mesh of {p} devices the operands' types do not say "
            "how they are laid out (XLA decides that when it compiles the program)",
            "kernel:     the product as jnp.matmul writes it (one dot_general and the epilogue), laid out by XLA's "
            "partitioner with the rest of the program: the result is sharded as jnp.matmul's, and what moves is "
            "XLA's choice; pass distribution= (or a named algorithm=) for dmatmul's kernels",
            f"modelled:   {flops / 1e9:.3g} GFLOP in all; bytes moved not modelled (XLA's layouts)",
        ]
