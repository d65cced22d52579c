"""2.5-D SUMMA's body on the ("r", "c", "l") mesh: SUMMA of each layer's K
slice on its q x q grid, then the layers' partial results reduce-scattered."""

from __future__ import annotations

import jax
from jax import lax

from .common import LocalProblem
from .grid import summa, summa_one_shot


def summa25d(lp: LocalProblem, a: jax.Array, b: jax.Array) -> jax.Array:
    """``summa25d``: layer ``l`` holds op(A)'s K blocks ``j*c + l`` on grid column
    ``j`` and op(B)'s ``i*c + l`` on grid row ``i`` (:func:`_layered.placements`),
    so within the layer grid column ``j`` of op(A) and grid row ``j`` of op(B)
    hold the same k: SUMMA on the layer's ("r", "c") grid (its collectives run
    along "r" or "c" alone, inside the layer), ring or one-shot as the kernel
    says. The partial results ((m/q) x (n/q), each layer's K slice) are summed
    over "l" and scattered along the result's rows, the leading axis (XLA's
    CPU collectives copy a second axis strided): layer ``l`` keeps row block
    ``l`` of its grid row's block."""
    inner = summa_one_shot(lp, a, b) if lp.kernel.schedule == "one_shot" else summa(lp, a, b)
    return lax.psum_scatter(inner, "l", scatter_dimension=0, tiled=True)
