"""The alpha-beta-gamma cost model and the communication lower bounds.

A plan's modelled time per rank is ``alpha * messages + beta * bytes +
gamma * flops``: ``alpha`` the latency of one message (s), ``beta`` the time
per byte a rank receives (s/B), ``gamma`` the time per flop of a rank's local
GEMM (s/flop). Defaults per platform live in :data:`DEFAULT_MODELS`.
"""

from __future__ import annotations

import dataclasses
import math

__all__ = ["MachineModel", "DEFAULT_MODELS", "model_for", "lower_bound_words", "ring_allgather_words"]


@dataclasses.dataclass(frozen=True)
class MachineModel:
    """Latency (s/message), inverse bandwidth (s/byte) and inverse speed (s/flop) per rank."""

    alpha: float
    beta: float
    gamma: float
    source: str = "default"

    def time(self, *, messages: float, nbytes: float, flops: float) -> float:
        return self.alpha * messages + self.beta * nbytes + self.gamma * flops


#: Defaults per JAX platform / backend. "cpu" is this project's reference
#: machine: simulated devices sharing 2 cores, where "communication" is a
#: memory copy (a few GB/s) and a rank's GEMM gets a share of ~150 GFLOP/s.
DEFAULT_MODELS: dict[str, MachineModel] = {
    "cpu": MachineModel(alpha=2e-5, beta=1 / 4e9, gamma=1 / 20e9),
    "gpu": MachineModel(alpha=1e-5, beta=1 / 100e9, gamma=1 / 300e12),
    "tpu": MachineModel(alpha=1e-5, beta=1 / 100e9, gamma=1 / 300e12),
}


def model_for(platform: str) -> MachineModel:
    """The model for a platform name ("cpu", "gpu"/"cuda"/"rocm", "tpu")."""
    platform = {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)
    return DEFAULT_MODELS.get(platform, DEFAULT_MODELS["cpu"])


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
    if p <= d1 / d2:
        words = d2 * d3 + (d1 * d2 + d1 * d3) / p
    elif p <= d1 * d2 / d3**2:
        words = 2 * math.sqrt(d1 * d2 * d3**2 / p) + d1 * d2 / p
    else:
        words = 3 * (d1 * d2 * d3 / p) ** (2 / 3)
    return max(0.0, words - (m * n + m * k + n * k) / p)


def ring_allgather_words(volume: int, p: int) -> float:
    """Words a rank receives in a ring AllGather (or ReduceScatter) of ``volume``."""
    return (p - 1) / p * volume
