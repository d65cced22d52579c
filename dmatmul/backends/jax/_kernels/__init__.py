"""The per-device bodies of the ``shard_map`` kernels (collective matmul).

Every body sees its rank's padded local blocks in *stored* orientation
(``a`` is ``(K, M)``-shaped locally when ``transpose_a``) and contracts them
with ``lax.dot_general`` dimension numbers, so no transpose is materialized.

Ring direction (the classic source of silently wrong results):

* AllGather+GEMM: rank ``r`` starts with block ``r`` of the moving operand and
  sends to ``r - 1``, so at step ``s`` it holds block ``(r + s) mod P``.
* GEMM+ReduceScatter: rank ``r`` sends its partial sum to ``r + 1``; at step
  ``s`` it adds its contribution to block ``(r - s - 1) mod P``, so after
  ``P - 1`` steps it holds the full sum of block ``r``.

Each step's ``ppermute`` is issued before that step's GEMM, which does not
depend on it, so the transfer overlaps the multiply.
"""

from __future__ import annotations

from .bodies import BODIES, body
from .common import Epilogue, LocalProblem, SummaSchedule, contract, finish, traced_platform, varying_zeros, widens
from .ring import ring_allgather, ring_allgathers, ring_order, ring_parts, ring_pieces, ring_reduce_scatters
from .grid import SummaRoute, rooted_broadcast, summa, summa_one_shot, summa_owners, summa_route, summa_tables

__all__ = [
    "BODIES",
    "Epilogue",
    "LocalProblem",
    "SummaSchedule",
    "body",
    "contract",
    "finish",
    "ring_allgather",
    "ring_allgathers",
    "ring_order",
    "ring_parts",
    "ring_pieces",
    "ring_reduce_scatters",
    "rooted_broadcast",
    "summa",
    "summa_one_shot",
    "SummaRoute",
    "summa_owners",
    "summa_route",
    "summa_tables",
    "traced_platform",
    "widens",
    "varying_zeros",
]
