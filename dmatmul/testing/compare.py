"""Comparing what a case returned with the reference: values, shape, dtype,
array family, and (one process, jax) where each block lies."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._distribution import Distribution, ProcessGrid, Replicated, Slab
from .._spec import normalize_precision
from .case import Case, _dm_repr
from .reference import TOLERANCE


def _in_order_blocks(dist: Distribution, shape: tuple[int, int], p: int) -> bool:
    """Whether ``dist`` deals every rank one even block, in rank order (rank r
    of a grid the block at ``grid.coords(r)``): what a NamedSharding of the
    distribution's grid expresses (JAX shards only in even blocks, in order)."""
    if isinstance(dist, Replicated) or (dist.grid is not None and dist.grid.size != p):
        return False
    grid = dist.grid if dist.grid is not None else ProcessGrid((p, 1) if dist == Slab.X else (1, p))
    pr, pc = grid.shape
    if shape[0] % pr or shape[1] % pc:
        return False
    br, bc = shape[0] // pr, shape[1] // pc
    for r in range(p):
        i, j = grid.coords(r)
        rows, cols = dist.global_indices(r, shape, p)
        if not (np.array_equal(rows, np.arange(i * br, (i + 1) * br))
                and np.array_equal(cols, np.arange(j * bc, (j + 1) * bc))):
            return False
    return True


def _on_trace_mesh(dist: Distribution, p: int) -> bool:
    """Whether the mesh dmatmul types a jitted product on where the user gave
    none (its devices in rank order, one axis per prime factor of P, smallest
    first) says ``dist``'s even blocks: a grid whose leading side (its rows in
    row order, its columns in column order) is a product of P's smallest prime
    factors. (So every grid of 2**k ranks; not a 3x2 row grid of 6.)"""
    if dist.grid is None:
        return True
    factors, n, f = [], p, 2
    while n > 1:
        while n % f:
            f += 1
        factors.append(f)
        n //= f
    rows, cols = dist.grid.shape
    return (rows if dist.grid.layout == "row" else cols) in {int(np.prod(factors[:i])) for i in range(len(factors) + 1)}


def _sharding_problems(d: Any, case: Case, want: np.ndarray, ranks: Sequence[Any], close: Any,
                       lead: int = 0) -> list[str]:
    """One process, a jax result: it lies on the ranks' devices, and (where the
    result's distribution is known) each rank's device holds that rank's block
    (``dist.global_indices``), or every device the whole result where no
    NamedSharding says the distribution (contract section 1). Where the
    distribution deals even blocks in rank order and no mesh of the user's
    fixes the devices' places, the blocks are required (inside ``jax.jit``:
    where dmatmul's mesh of that trace says them, :func:`_on_trace_mesh`).
    Inside a trace on a mesh of both Explicit and Auto axes any sharding
    (a type names the Explicit ones only: ``jax.jit(lambda x: x * 2)`` turns
    P(("data", "model")) with "data" Auto into P("model"), in halves). A
    result of ``lead`` batch dimensions first (``jax.vmap``'s axis, a batched product's) holds each matrix so,
    the batch not split: each device the whole batch of its blocks. A Sharded result is read as its 2-D form
    (a result of one that has none is not checked here)."""
    shards = {s.device: s for s in d.addressable_shards}
    if set(shards) != set(ranks):
        return [f"result on devices {sorted(x.id for x in shards)}, expected the ranks' {[x.id for x in ranks]}"]
    if case.distributions is None or not want.size:
        return []
    dd = (case.matrix_distributions or (None,) * 3)[2]
    if dd is None:
        return []
    p = len(ranks)
    batch, shape = want.shape[:lead], want.shape[lead:]
    every = tuple(np.arange(s) for s in batch)
    blocks = [dd.global_indices(r, shape, p) for r in range(p)]
    datas = [np.asarray(shards[dev].data) for dev in ranks]
    if all(x.shape == batch + (len(rows), len(cols)) and close(x, want[np.ix_(*every, rows, cols)])
           for x, (rows, cols) in zip(datas, blocks)):
        return []
    traced = case.jit or case.transform is not None or (case.on_mesh is not None and case.on_mesh.call != "eager")
    if traced and case.on_mesh is not None and case.on_mesh.mixed:
        return []  # a type names the Explicit axes only; the Auto ones are XLA's, as for any jitted function
    replicated = all(x.shape == want.shape and close(x, want) for x in datas)
    required = case.on_mesh is None and _in_order_blocks(dd, shape, p) and (not case.jit or _on_trace_mesh(dd, p))
    if replicated and not required:
        return []
    where = [f"rank {r}: {x.shape}" for r, x in enumerate(datas)][:4]
    wanted = "its block" if replicated else "its block, or all the whole result"
    return [f"result sharded as {d.sharding.spec if hasattr(d.sharding, 'spec') else d.sharding} "
            f"({', '.join(where)}), not as {_dm_repr(dd)} says: each rank's device must hold {wanted}"]


@dataclasses.dataclass(frozen=True)
class _Result:
    """One array a case returns and what it is checked against."""

    what: str  # how the report names it ("" for the only result)
    value: Any
    ref: np.ndarray  # the global reference
    shape: tuple[int, ...] | None = None  # None: the case's result (this rank's block under mpiexec)
    dtype: str | None = None  # None: the case's
    tolerance: str | None = None  # the dtype whose tolerance applies (None: ``dtype``)
    kind: str = "result"  # laid out as the result, "batched" (a batch axis first) or a "gradient" (not checked)


def _looser(*dtypes: str) -> str:
    """The dtype of the largest tolerance among ``dtypes``: a gradient is computed
    in the case's dtype and returned in its operand's."""
    return max(dtypes, key=lambda d: TOLERANCE[d])


def _reduced_precision_slack(case: Case, backend: str) -> float:
    """How much more error a precision below "highest" may bring: TF32 or
    bf16 passes for float32 on GPUs and TPUs; nothing on CPUs, which compute
    float32 in float32 whatever is asked. ``precision=None`` on the JAX
    backend is the case's ``jax.default_matmul_precision``."""
    precision = case.precision
    if precision is None and backend != "nvmath" and case.matmul_precision is not None:
        precision = normalize_precision(case.matmul_precision)
    if precision == "highest" or case.dtype not in ("float32", "complex64"):
        return 1.0
    if backend == "nvmath":
        return 1.0 if precision is None or precision == "default" else 500.0  # "high": TF32
    jax = sys.modules.get("jax")
    on_cpu = jax is None or jax.default_backend() == "cpu"
    return 1.0 if on_cpu else 1000.0  # 2e-5 x 1000: bf16 passes (DEFAULT) on an accelerator
