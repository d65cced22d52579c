"""``dm.redistribute`` on the JAX backend: one process or several."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..._distribution import Distribution, Slab
from . import _exchange, _layout


def _steps(
    src: Distribution, dst: Distribution, devices: tuple[jax.Device, ...], shape: tuple[int, int]
) -> list[tuple[_layout.Geometry, _layout.Placement, _layout.Placement]]:
    """One move on one mesh; two (through Slab.X) when the two use different grids."""
    grids = [d.grid for d in (src, dst) if d.grid is not None and d.grid.ndim == 2]
    if len(grids) == 2 and grids[0] != grids[1]:
        first, second = _layout.Geometry.create(devices, grids[0]), _layout.Geometry.create(devices, grids[1])
        via = (None, None)
        return [
            (first, _layout.placement_of(src, first, shape, via), _layout.placement_of(Slab.X, first, shape, via)),
            (second, _layout.placement_of(Slab.X, second, shape, via), _layout.placement_of(dst, second, shape, via)),
        ]
    geom = _layout.Geometry.create(devices, grids[0] if grids else None)
    return [(geom, _layout.placement_of(src, geom, shape, (None, None)), _layout.placement_of(dst, geom, shape, (None, None)))]


@functools.lru_cache(maxsize=64)
def _jitted(
    geom: _layout.Geometry, src: _layout.Placement, dst: _layout.Placement, *, pad: bool = False, unpad: bool = False
) -> Any:
    """One step's move, compiled once per (mesh, placements): with ``pad``, from
    the global matrix (padded into ``src`` first); with ``unpad``, to the global
    matrix (out of ``dst`` after), so the whole move is one program."""

    out = geom.replicated() if unpad and not _layout.expressible(dst) else geom.sharding(dst)

    # XLA re-lays a matrix padded or cut in the program (uneven or cyclic blocks) through all-reduces of
    # zero-filled parts, and on CPU a sum of floats is not exact (a subnormal comes back 0, -0.0 as 0, a
    # signaling NaN quiet): such a move runs on the float's bits (_exchange.bits_of), a complex matrix's two
    # parts each; an exchange alone places every value as it was given
    exact = (pad and not src.identity) or (unpad and not dst.identity)

    def move(v: jax.Array) -> jax.Array:
        if exact and jnp.issubdtype(v.dtype, jnp.complexfloating):
            return lax.complex(move(lax.real(v)), move(lax.imag(v)))
        dtype, bits = v.dtype, _exchange.bits_of(v.dtype) if exact else None
        if bits is not None:
            v = lax.bitcast_convert_type(v, bits)
        v = _exchange.redistribute(_layout.pad(v, src) if pad else v, src, dst, geom)
        v = lax.with_sharding_constraint(_layout.unpad(v, dst) if unpad else v, out)
        return v if bits is None else lax.bitcast_convert_type(v, dtype)

    return jax.jit(move, out_shardings=out)


def redistribute(
    x: Any, src: Distribution, dst: Distribution, *, shape: tuple[int, int], family: str,
    devices: tuple[jax.Device, ...], rank: int | None,
) -> Any:
    """``x`` laid out as ``src`` -> laid out as ``dst``.

    ``rank`` None: one process, ``x`` is the global matrix (numpy or jax); else
    ``x`` is this rank's block and this rank's block of ``dst`` comes back.
    """
    if 0 in shape:  # nothing to move: the empty block (or matrix) dst gives, in x's family and dtype
        return _empty(x, dst, shape=shape, family=family, devices=devices, rank=rank)
    steps = _steps(src, dst, devices, shape)
    geom, first, _ = steps[0]
    global_jax = rank is None and family != "numpy"  # a jax.Array in and out: padded and unpadded in the moves
    if rank is not None:
        arr = _layout.local_to_global(np.asarray(x), first, geom, rank)
    elif family == "numpy":
        arr = _layout.host_to_device(np.asarray(x), first, geom)
    else:  # on the mesh first (a jax.Array on other devices, or on a mesh of its own, is moved there)
        arr = geom.onto(x, geom.sharding(first) if _layout.expressible(first) else geom.replicated())
    for i, (geom, a, b) in enumerate(steps):
        if i:  # the same per-device blocks (Slab.X in rank order) seen on the next grid's mesh
            arr = jax.make_array_from_single_device_arrays(
                a.shape, geom.sharding(a), [s.data for s in arr.addressable_shards]
            )
        with geom.context():  # each step on its own mesh, also under a user's jax.set_mesh
            arr = _jitted(geom, a, b, pad=global_jax and i == 0, unpad=global_jax and i == len(steps) - 1)(arr)
    geom, _, last = steps[-1]
    if rank is not None:
        block = _layout.global_to_local(arr, last, dst.shape(rank, shape, len(devices)))
        return block if family == "jax" else np.array(block)
    if family == "numpy":
        return _layout.device_to_host(arr, last)
    return arr


def _empty(
    x: Any, dst: Distribution, *, shape: tuple[int, int], family: str, devices: tuple[jax.Device, ...],
    rank: int | None,
) -> Any:
    """:func:`redistribute` of a matrix with no elements."""
    dtype = x.dtype
    if rank is not None:
        block = np.zeros(dst.shape(rank, shape, len(devices)), dtype)
        return jax.device_put(block, devices[rank]) if family == "jax" else block
    if family == "numpy":
        return np.zeros(shape, dtype)
    geom = _layout.Geometry.create(devices, dst.grid if dst.grid is not None and dst.grid.ndim == 2 else None)
    placement = _layout.placement_of(dst, geom, shape, (None, None))
    sharding = geom.sharding(placement) if _layout.expressible(placement) else geom.replicated()
    return jax.device_put(np.zeros(shape, dtype), sharding)
