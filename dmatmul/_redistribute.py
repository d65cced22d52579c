"""``dm.redistribute``: a matrix from one distribution to another."""

from __future__ import annotations

from typing import Any

from . import _runtime
from . import backends as _backends
from ._distribution import Distribution
from ._errors import DistributionError
from ._spec import as_matrix, check_devices, check_distribution, check_fit, family, refuse_spanning

__all__ = ["redistribute"]


@_runtime.agreed_arguments("dm.redistribute")
def redistribute(x: Any, src: Distribution, dst: Distribution, *, devices: Any = None) -> Any:
    """``x``, laid out as ``src``, laid out as ``dst``; each element moves once.

    * One process: ``x`` is the global matrix. A ``jax.Array`` comes back laid
      out on ``devices`` (default: the mesh ``x`` is on, or of ``jax.set_mesh``,
      its devices in mesh order, and back on that mesh; else all local devices)
      as ``dst`` says, with a NamedSharding where one can express it (else
      replicated); numpy comes back as numpy (the same values). Inside a JAX
      trace (``jit``, ``grad``, ``vmap``) it lays ``x`` out on the mesh a
      product of that trace runs on.
    * Several processes (``mpiexec``): ``x`` is this rank's block under
      ``src``; this rank's block under ``dst`` comes back, in ``x``'s array
      family. Ranks exchange exactly the elements they need (pairwise rounds
      computed from ``global_indices``), nothing is gathered anywhere.

    Any two of Slab, Replicated, BlockNonCyclic and BlockCyclic (any grid,
    block sizes and first process) are accepted.
    """
    rt = _runtime.active()
    spmd = rt is not None and rt.size > 1

    def check() -> Any:
        check_distribution(src, "src")
        check_distribution(dst, "dst")
        if spmd:  # a grid of another size is src's (or dst's) fault, not that of x's block shapes
            assert rt is not None
            check_fit((src, dst), rt.size, spmd=True, names=("src", "dst"))
        check_devices(devices, spmd=spmd)
        xm = as_matrix(x, "x")
        if spmd:
            refuse_spanning(xm, "x", "src")
        return xm

    if not spmd:
        xm = check()
        shape = (int(xm.shape[0]), int(xm.shape[1]))
        rank = None
    else:
        assert rt is not None
        # one allgather carries every rank's verdict, its call and its block's shape: a mistake or a
        # difference on one rank raises on every rank before any rank sends a byte
        xm, shared = _runtime.agree_and_share(
            check, lambda xm: ((("src", src), ("dst", dst), ("dtype", str(xm.dtype))), tuple(xm.shape)),
            "dm.redistribute",
        )
        _runtime.require_same_call([call for call, _ in shared], "dm.redistribute")
        try:
            shape = src.global_shape([s for _, s in shared])
        except DistributionError as e:
            raise DistributionError(f"x: {e} (this is rank {rt.rank})") from None
        rank = rt.rank

    backend = _backends.for_redistribute()
    return backend.redistribute(xm, src, dst, shape=shape, family=family(xm), devices=devices, rank=rank)
