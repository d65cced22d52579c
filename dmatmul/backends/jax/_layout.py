"""dmatmul distributions as JAX meshes, PartitionSpecs and padded arrays.

A 1-D distribution over ``P`` devices becomes a 1-D mesh with axis ``"x"``
(device ``r`` of the mesh is rank ``r``) and a PartitionSpec on the stored
matrix: ``Slab.X -> P("x", None)``, ``Slab.Y -> P(None, "x")``,
``Replicated() -> P()``.

Uneven splits. nvmath's Slab gives the first ``S % P`` ranks one more item;
``shard_map`` needs equal blocks. So a split dimension of size ``S`` lives in
a *padded space* of ``P * L`` positions, ``L = ceil(S / P)``: rank ``r``'s
items sit at ``r*L .. r*L + len_r - 1`` and the rest of its block is zeros.
:class:`DimMap` holds both directions of that map; when ``S % P == 0`` it is
the identity and nothing is copied.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from ..._distribution import slab_extent

AXIS = "x"

__all__ = ["AXIS", "DimMap", "resolve_devices", "mesh_1d", "spec", "host_to_device", "device_to_host", "pad", "unpad"]


def resolve_devices(devices: Any) -> tuple[jax.Device, ...]:
    """``None``: every local device; an int N: the first N; else the list given."""
    local = jax.local_devices()
    if devices is None:
        return tuple(local)
    if isinstance(devices, int):
        if devices > len(local):
            hint = (
                f"; on CPU start JAX with jax.config.update('jax_num_cpu_devices', {devices}) "
                f"or XLA_FLAGS=--xla_force_host_platform_device_count={devices}"
                if local[0].platform == "cpu"
                else ""
            )
            raise ValueError(
                f"devices={devices} but this process has only {len(local)} JAX device(s) "
                f"({local[0].platform}){hint}"
            )
        return tuple(local[:devices])
    for d in devices:
        if not isinstance(d, jax.Device):
            raise TypeError(f"devices must hold jax.Device objects, got {d!r}")
    if len(set(devices)) != len(devices):
        raise ValueError(f"devices must not repeat a device, got {list(devices)}")
    return tuple(devices)


def process_devices(nprocs: int) -> tuple[jax.Device, ...]:
    """Several processes: one device per process, in rank (process index) order."""
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    if len(devices) != nprocs or len({d.process_index for d in devices}) != nprocs:
        raise RuntimeError(
            f"dmatmul needs one JAX device per process, but JAX sees {len(devices)} device(s) "
            f"over {jax.process_count()} process(es) for {nprocs} ranks: start JAX through dmatmul.init() "
            "(or jax.distributed.initialize with one local device per process)"
        )
    return tuple(devices)


def my_device(devices: tuple[jax.Device, ...]) -> jax.Device:
    """This process's device among ``devices``."""
    mine = [d for d in devices if d.process_index == jax.process_index()]
    return mine[0]


def local_to_global(
    x: np.ndarray, maps: tuple[DimMap, DimMap], split_axis: int | None, sharding: NamedSharding
) -> jax.Array:
    """Several processes: the global padded array whose block on this process is ``x``
    (this rank's local block, padded to the common block size)."""
    sources = []
    for axis, m in enumerate(maps):
        if axis == split_axis:
            src = np.arange(m.block) if m.padded else np.arange(x.shape[axis])
            src[x.shape[axis]:] = -1
        else:
            src = m.sources
        sources.append(src)
    identity = all(len(s) == n and (s >= 0).all() for s, n in zip(sources, x.shape))
    block = x if identity else _host_block(x, sources[0], sources[1])
    shape = (maps[0].padded_size, maps[1].padded_size)
    device = my_device(tuple(sharding.mesh.devices.flat))
    return jax.make_array_from_single_device_arrays(shape, sharding, [jax.device_put(block, device)])


def replicated(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """Several processes: a replicated global array from every process's full copy."""
    device = my_device(tuple(sharding.mesh.devices.flat))
    return jax.make_array_from_single_device_arrays(x.shape, sharding, [jax.device_put(x, device)])


def global_to_local(
    d: jax.Array, maps: tuple[DimMap, DimMap], split_axis: int | None, local_shape: tuple[int, int]
) -> jax.Array:
    """Several processes: this rank's block of a padded global result, padding stripped."""
    block = d.addressable_shards[0].data
    for axis, m in enumerate(maps):
        if axis == split_axis:
            if block.shape[axis] != local_shape[axis]:
                block = jax.lax.slice_in_dim(block, 0, local_shape[axis], axis=axis)
        elif not m.identity:
            block = jnp.take(block, jnp.asarray(m.positions), axis=axis)
    return block


@functools.lru_cache(maxsize=64)
def mesh_1d(devices: tuple[jax.Device, ...]) -> Mesh:
    """The 1-D mesh ``("x",)`` whose position ``r`` is rank ``r``."""
    return Mesh(np.array(devices, dtype=object), (AXIS,), axis_types=(AxisType.Auto,))


def spec(split_axis: int | None) -> PartitionSpec:
    """PartitionSpec of a stored matrix split on ``split_axis`` (None: replicated)."""
    if split_axis is None:
        return PartitionSpec()
    return PartitionSpec(AXIS, None) if split_axis == 0 else PartitionSpec(None, AXIS)


@dataclasses.dataclass(frozen=True)
class DimMap:
    """A matrix dimension of ``size`` items in its padded space over ``parts`` ranks.

    >>> d = DimMap(5, 2, padded=True)
    >>> d.padded_size, d.positions.tolist(), d.sources.tolist()
    (6, [0, 1, 2, 3, 4], [0, 1, 2, 3, 4, -1])
    >>> DimMap(7, 3, padded=True).sources.tolist()
    [0, 1, 2, 3, 4, -1, 5, 6, -1]
    """

    size: int
    parts: int
    padded: bool

    @property
    def block(self) -> int:
        return -(-self.size // self.parts)

    @property
    def padded_size(self) -> int:
        return self.block * self.parts if self.padded else self.size

    @functools.cached_property
    def positions(self) -> np.ndarray:
        """Padded position of each real index."""
        if not self.padded:
            return np.arange(self.size)
        out = []
        for r in range(self.parts):
            start, length = slab_extent(self.size, self.parts, r)
            out.append(r * self.block + np.arange(length))
        return np.concatenate(out)

    @functools.cached_property
    def sources(self) -> np.ndarray:
        """Real index at each padded position, -1 for padding."""
        out = np.full(self.padded_size, -1, dtype=np.int64)
        out[self.positions] = np.arange(self.size)
        return out

    @property
    def identity(self) -> bool:
        return self.padded_size == self.size


def _host_block(x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``x[rows][:, cols]`` with zeros where an index is -1."""
    out = np.zeros((len(rows), len(cols)), dtype=x.dtype)
    vr, vc = rows >= 0, cols >= 0
    out[np.ix_(vr, vc)] = x[np.ix_(rows[vr], cols[vc])]
    return out


def host_to_device(x: np.ndarray, maps: tuple[DimMap, DimMap], sharding: NamedSharding) -> jax.Array:
    """Place a global numpy matrix on the mesh in its padded space, one block per device."""
    if maps[0].identity and maps[1].identity:
        return jax.device_put(x, sharding)
    shape = (maps[0].padded_size, maps[1].padded_size)

    def block(index: tuple[slice, ...]) -> np.ndarray:
        r, c = index
        return _host_block(x, maps[0].sources[r], maps[1].sources[c])

    return jax.make_array_from_callback(shape, sharding, block)


def device_to_host(d: jax.Array, maps: tuple[DimMap, DimMap]) -> np.ndarray:
    """The global numpy matrix of a padded result (each block copied once)."""
    if maps[0].identity and maps[1].identity:
        return np.asarray(d)
    out = np.empty((maps[0].size, maps[1].size), dtype=d.dtype)
    for shard in d.addressable_shards:
        if shard.replica_id != 0:
            continue
        r, c = shard.index
        rows, cols = maps[0].sources[r], maps[1].sources[c]
        vr, vc = rows >= 0, cols >= 0
        out[np.ix_(rows[vr], cols[vc])] = np.asarray(shard.data)[np.ix_(vr, vc)]
    return out


def pad(x: jax.Array, maps: tuple[DimMap, DimMap]) -> jax.Array:
    """Traceable: the padded-space matrix of ``x`` (zeros in the padding)."""
    for axis, m in enumerate(maps):
        if m.identity:
            continue
        src = m.sources
        taken = jnp.take(x, jnp.asarray(np.maximum(src, 0)), axis=axis)
        mask = jnp.asarray(src >= 0).reshape((-1, 1) if axis == 0 else (1, -1))
        x = jnp.where(mask, taken, jnp.zeros((), x.dtype))
    return x


def unpad(x: jax.Array, maps: tuple[DimMap, DimMap]) -> jax.Array:
    """Traceable: drop the padding of a padded-space matrix."""
    for axis, m in enumerate(maps):
        if not m.identity:
            x = jnp.take(x, jnp.asarray(m.positions), axis=axis)
    return x
