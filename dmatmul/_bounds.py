"""The communication lower bounds a plan is compared with, and the memory a
schedule holds in flight: pure arithmetic on the product's sizes
(re-exported by :mod:`dmatmul._cost`)."""

from __future__ import annotations

import math
from typing import Any

from .algorithms import ALGORITHMS

__all__ = ["lower_bound_regime", "lower_bound_words", "ring_allgather_words", "lower_bounds", "extra_memory_bytes"]


# --------------------------------------------------------------------------- #
# lower bounds
# --------------------------------------------------------------------------- #
def lower_bound_regime(m: int, n: int, k: int, p: int) -> str:
    """Which regime of the memory-independent bound applies: "1-D", "2-D" or "3-D"
    (``"none"`` on one rank).

    >>> lower_bound_regime(4096, 64, 64, 8), lower_bound_regime(4096, 4096, 64, 8), lower_bound_regime(64, 64, 64, 8)
    ('1-D', '2-D', '3-D')
    """
    if p <= 1:
        return "none"
    d1, d2, d3 = sorted((m, n, k), reverse=True)
    if p <= d1 / d2:
        return "1-D"
    if p <= d1 * d2 / d3**2:
        return "2-D"
    return "3-D"


def lower_bound_words(m: int, n: int, k: int, p: int) -> float:
    """Memory-independent lower bound on the words a rank must receive to
    multiply an ``m x k`` by a ``k x n`` matrix on ``p`` ranks, each rank
    owning an equal share of the three matrices beforehand (Al Daas, Ballard
    et al., "Tight memory-independent parallel matrix multiplication
    communication lower bounds", SPAA 2022). With ``d1 >= d2 >= d3`` the
    sorted dimensions, the bound has three regimes::

        1-D  p <= d1/d2:             d2*d3 + (d1*d2 + d1*d3)/p
        2-D  d1/d2 <= p <= d1*d2/d3^2: 2*sqrt(d1*d2*d3^2/p) + d1*d2/p
        3-D  p >= d1*d2/d3^2:        3*(d1*d2*d3/p)**(2/3)

    minus the ``(mn + mk + nk)/p`` words the rank already holds.

    >>> lower_bound_words(1024, 1024, 1024, 1)
    0.0
    >>> round(lower_bound_words(64, 64, 64, 8))  # 3-D regime: 3*(64**3/8)**(2/3) - 3*64*64/8
    1536
    """
    if p <= 1:
        return 0.0
    d1, d2, d3 = sorted((m, n, k), reverse=True)
    regime = lower_bound_regime(m, n, k, p)
    if regime == "1-D":
        words = d2 * d3 + (d1 * d2 + d1 * d3) / p
    elif regime == "2-D":
        words = 2 * math.sqrt(d1 * d2 * d3**2 / p) + d1 * d2 / p
    else:
        words = 3 * (d1 * d2 * d3 / p) ** (2 / 3)
    return max(0.0, words - (m * n + m * k + n * k) / p)


def ring_allgather_words(volume: int, p: int) -> float:
    """Words a rank receives in a ring AllGather (or ReduceScatter) of ``volume``."""
    return (p - 1) / p * volume


def lower_bounds(m: int, n: int, k: int, p: int, itemsize: int) -> dict[str, Any]:
    """The bounds a plan is compared with, in bytes per rank.

    ``memory_independent``: :func:`lower_bound_words` (its ``regime`` named);
    ``ring_<operand>``: a ring's ``(P-1)/P * V`` for V = A, B (AllGather of an
    operand) or C (ReduceScatter of the result), the least a 1-D algorithm
    moving that matrix can receive.

    >>> lb = lower_bounds(64, 64, 64, 8, 4)
    >>> lb["regime"], round(lb["memory_independent"]), lb["ring_a"]
    ('3-D', 6144, 14336.0)
    """
    return {
        "regime": lower_bound_regime(m, n, k, p),
        "memory_independent": lower_bound_words(m, n, k, p) * itemsize,
        "ring_a": ring_allgather_words(m * k, p) * itemsize,
        "ring_b": ring_allgather_words(k * n, p) * itemsize,
        "ring_c": ring_allgather_words(m * n, p) * itemsize,
    }


# --------------------------------------------------------------------------- #
# memory
# --------------------------------------------------------------------------- #
def extra_memory_bytes(
    algorithm: str,
    m: int,
    n: int,
    k: int,
    p: int,
    itemsize: int,
    acc_itemsize: int | None = None,
    *,
    moving: str | None = None,
    one_shot: bool = False,
) -> float:
    """Memory a rank needs beyond its blocks of A, B and the result (bytes).

    * ``allgather`` (ring): the block of the moving operand in flight
      (``moving`` "a" or "b"; default "b"), plus one GEMM tile of the result;
      with ``one_shot`` (one all-gather, then one GEMM) the whole gathered
      operand instead.
    * ``reduce_scatter`` (ring): the partial sum in flight and the one being
      added to (two result blocks, accumulation dtype); ``one_shot``: the full
      ``m x n`` partial product.
    * ``allreduce``: the full ``m x n`` partial product (the result itself is
      replicated), accumulation dtype.
    * ``summa``: one panel of A and one of B, ``k/sqrt(p)`` wide (``(mk + kn)/p``);
      ``one_shot``: both panels whole, all of K (``(mk + kn)/sqrt(p)``).
    * ``local``: nothing.

    >>> extra_memory_bytes("allgather", 1024, 1024, 1024, 8, 4)  # one 1024x128 block + one 128x128 tile
    589824.0
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"no memory model for algorithm {algorithm!r}")
    if p <= 1:
        return 0.0
    return ALGORITHMS[algorithm].extra_memory_bytes(m, n, k, p, itemsize, acc_itemsize or itemsize, moving=moving,
                                                    one_shot=one_shot)
