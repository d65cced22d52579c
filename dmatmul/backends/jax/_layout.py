"""dmatmul distributions as JAX meshes, PartitionSpecs and padded arrays.

Three ideas, each one small value:

* :class:`DimMap` (:mod:`dmatmul._dimmap`, shared with the nvmath backend) --
  the *padded index space* of one matrix dimension: the dimension is cut into
  ``nparts`` lists of global indices (a Slab's contiguous ranges, a
  block-cyclic deal, or one list holding everything), each list padded with
  zeros to a common ``block`` length. Position ``p*block + i`` holds global
  index ``parts[p][i]``. A block-cyclic layout is thereby a plain block layout
  of a row- and column-permuted matrix, and each rank's local storage is the
  same under both views.
* :class:`Geometry` -- the mesh: 1-D ``("x",)`` for Slab/Replicated
  products, 2-D for a :class:`~dmatmul.ProcessGrid`, the device at
  ``"r"`` = i, ``"c"`` = j being the rank at grid coordinates ``(i, j)``:
  ``("r", "c")`` for "row" grids, ``("c", "r")`` (the transpose) for "col"
  grids, so every mesh lists its devices in rank order. The *rank axis*
  (``"x"``, or the mesh's own axis tuple) enumerates them, so a Slab can
  split over all ranks of a 2-D mesh.
* :class:`Placement` -- a matrix on the mesh: a DimMap per stored dimension
  and the mesh axes (or none) that split it. ``Slab.X`` over P ranks is
  ``(slab map, whole map), (rank axis, None)``; a BlockCyclic matrix is
  ``(grid-row map, grid-column map), ("r", "c")``.

:func:`._exchange.redistribute` moves a matrix between two placements on one
mesh, moving every element once.

Uneven splits follow nvmath's rule (the first ``S % P`` ranks hold one more
item) and are zero-padded to the common block; when nothing needs padding or
permuting the maps are the identity and nothing is copied.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import numbers
from typing import Any, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from ..._dimmap import DimMap
from ._arrays import in_trace as in_jax_trace
from ..._distribution import Distribution, ProcessGrid, Replicated, Slab

__all__ = [
    "DimMap",
    "Geometry",
    "Placement",
    "resolve_devices",
    "process_devices",
    "placement_of",
    "host_to_device",
    "device_to_host",
    "pad",
    "unpad",
    "local_to_global",
    "global_to_local",
]

AxisName = Union[str, tuple[str, ...], None]


# --------------------------------------------------------------------------- #
# devices
# --------------------------------------------------------------------------- #
def resolve_devices(devices: Any) -> tuple[jax.Device, ...]:
    """``None``: every local device; an int N: the first N; else the list given."""
    local = jax.local_devices()
    if devices is None:
        return tuple(local)
    if isinstance(devices, numbers.Integral):  # numpy integers too
        devices = int(devices)
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
    """Several processes: one device per process, in the order of the runtime
    communicator's ranks (which a user's ``jax.distributed`` may number as
    other process indices)."""
    from ..._runtime import ensure
    from ._start import rank_devices

    ensure("jax")
    devices = jax.devices()
    if len(devices) != nprocs or len({d.process_index for d in devices}) != nprocs:
        raise RuntimeError(
            f"dmatmul needs one JAX device per process, but JAX sees {len(devices)} device(s) "
            f"over {jax.process_count()} process(es) for {nprocs} ranks: start JAX through dmatmul.init() "
            "(or jax.distributed.initialize with one local device per process)"
        )
    return rank_devices()


# --------------------------------------------------------------------------- #
# meshes
# --------------------------------------------------------------------------- #
@dataclasses.dataclass(frozen=True)
class Geometry:
    """The mesh of one product and the axis that enumerates ranks."""

    mesh: Mesh | AbstractMesh
    rank_axis: str | tuple[str, ...]
    grid: ProcessGrid | None

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def create(devices: tuple[jax.Device, ...], grid: ProcessGrid | None = None) -> Geometry:
        """``devices[r]`` is rank ``r``, and every mesh lists the devices in rank
        order (one computation lists its devices in one order, so products and
        moves on grids of either order meet in one ``jit``). With a grid, the
        device at grid coordinates ``(i, j)`` is at ``"r"`` = i and ``"c"`` = j:
        on a ``("r", "c")`` mesh for a grid of row order, on a ``("c", "r")``
        mesh (its transpose) for one of column order.

        >>> import jax
        >>> g = Geometry.create(tuple(jax.devices()[:8]), ProcessGrid((2, 4), layout="col"))
        >>> dict(g.mesh.shape), g.rank_axis
        ({'c': 4, 'r': 2}, ('c', 'r'))
        """
        if grid is None or grid.ndim != 2:
            mesh = Mesh(np.array(devices, dtype=object), ("x",), axis_types=(AxisType.Auto,))
            return Geometry(mesh, "x", None)
        rows, cols = grid.shape
        row = grid.layout == "row"
        arr = np.array(devices, dtype=object).reshape((rows, cols) if row else (cols, rows))
        names = ("r", "c") if row else ("c", "r")
        return Geometry(Mesh(arr, names, axis_types=(AxisType.Auto, AxisType.Auto)), names, grid)

    @staticmethod
    @functools.lru_cache(maxsize=16)
    def layered(devices: tuple[jax.Device, ...], q: int, c: int) -> Geometry:
        """2.5-D SUMMA's mesh: ``("r", "c", "l")`` of shape ``(q, q, c)``, c layers
        of a q x q grid, the devices in rank order (rank ``(i*q + j)*c + l`` at
        grid row ``i``, column ``j``, layer ``l``); no 2-D process grid.

        >>> import jax
        >>> g = Geometry.layered(tuple(jax.devices()[:8]), 2, 2)
        >>> dict(g.mesh.shape), g.rank_axis, g.coord(5, "c"), g.coord(5, ("c", "l"))
        ({'r': 2, 'c': 2, 'l': 2}, ('r', 'c', 'l'), 0, 1)
        """
        arr = np.array(devices, dtype=object).reshape((q, q, c))
        names = ("r", "c", "l")
        return Geometry(Mesh(arr, names, axis_types=(AxisType.Auto,) * 3), names, None)

    def onto(self, x: jax.Array, sharding: Any) -> jax.Array:
        """A concrete jax.Array on this mesh: as it is where it already lies on
        its devices (on this mesh, or on a sharding of no mesh), else moved
        device to device to ``sharding`` (from other devices, or from another
        mesh, a user's, whose axis names and order mean nothing here)."""
        return x if self.holds(x) else jax.device_put(x, sharding)

    def holds(self, x: jax.Array) -> bool:
        """``x`` already lies on this mesh's devices, as :meth:`onto` takes it:
        on this mesh, or on a sharding of no mesh over the same devices."""
        s = x.sharding
        mesh = getattr(s, "mesh", None)
        return s.device_set == self._device_set and (mesh is None or mesh == self.mesh)

    @functools.cached_property
    def _device_set(self) -> frozenset[jax.Device]:
        """The mesh's devices (a concrete mesh's), made once: :meth:`onto` asks at every call."""
        assert isinstance(self.mesh, Mesh)
        return frozenset(self.mesh.devices.flat)

    def context(self) -> contextlib.AbstractContextManager[Any]:
        """This mesh as JAX's context for dmatmul's own computations on it, also
        under a user's ``jax.set_mesh`` (whose mesh would clash with it); inside a
        user's trace, where ``set_mesh`` is refused, as an abstract mesh."""
        mesh = self.mesh
        if not isinstance(mesh, Mesh):
            return contextlib.nullcontext()
        return jax.sharding.use_abstract_mesh(mesh.abstract_mesh) if in_jax_trace() else jax.set_mesh(mesh)

    def abstract(self) -> Geometry:
        """The same mesh without its devices: inside a user's ``jit`` (or
        ``grad``) the devices, and their order, are the traced computation's."""
        return dataclasses.replace(self, mesh=self.mesh.abstract_mesh) if isinstance(self.mesh, Mesh) else self

    @property
    def mesh_ranks(self) -> list[int]:
        """The rank of each device of the mesh, in mesh (row-major) order: rank order."""
        return list(range(self.nranks))

    @property
    def nranks(self) -> int:
        """The ranks of the product: the devices along the rank axis (every
        device of the mesh, but on :meth:`within` a user's mesh, one group's)."""
        return self.axis_size(self.rank_axis)

    @property
    def rank_axes(self) -> tuple[str, ...]:
        """The rank axis as a tuple of mesh axes, in mesh order: where
        ``lax.axis_index`` and ``ppermute`` number the ranks alike."""
        return (self.rank_axis,) if isinstance(self.rank_axis, str) else tuple(self.rank_axis)

    @staticmethod
    def within(mesh: Mesh | AbstractMesh, axes: tuple[str, ...]) -> Geometry:
        """A user's ``mesh`` (made Auto) whose ``axes`` (in mesh order) are the
        product's ranks: the other axes run independent products (each group of
        ranks along ``axes`` its own, :mod:`._independent`), so nothing of the
        kernel crosses them. No axis: one rank per group."""
        names = tuple(mesh.axis_names)
        if isinstance(mesh, Mesh):
            auto = Mesh(mesh.devices, names, axis_types=(AxisType.Auto,) * len(names))
        else:
            auto = mesh.update_axis_types({n: AxisType.Auto for n in names})
        return Geometry(auto, axes[0] if len(axes) == 1 else axes, None)

    def coord(self, rank: int, axis: AxisName) -> int:
        """The index along mesh ``axis`` of the device of ``rank``."""
        if axis == self.rank_axis or axis == "x":
            return rank
        if self.grid is None:  # a mesh of several axes in rank order (2.5-D SUMMA's): row-major coordinates
            shape = dict(self.mesh.shape)
            at = dict(zip(shape, np.unravel_index(rank, tuple(shape.values()))))
            out = 0
            for name in (axis,) if isinstance(axis, str) else axis:  # type: ignore[union-attr]
                out = out * shape[name] + int(at[name])
            return out
        return self.grid.coords(rank)[{"r": 0, "c": 1}[axis]]  # type: ignore[index]

    def axis_size(self, axis: AxisName) -> int:
        if axis is None:
            return 1
        names = (axis,) if isinstance(axis, str) else axis
        return int(np.prod([self.mesh.shape[n] for n in names]))

    def sharding(self, placement: Placement) -> NamedSharding:
        return NamedSharding(self.mesh, placement.spec)

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())


@dataclasses.dataclass(frozen=True)
class Placement:
    """A matrix on a mesh: a DimMap per stored dimension and the axes that split it."""

    maps: tuple[DimMap, DimMap]
    axes: tuple[AxisName, AxisName]

    @property
    def spec(self) -> PartitionSpec:
        return PartitionSpec(*self.axes) if any(a is not None for a in self.axes) else PartitionSpec()

    @property
    def shape(self) -> tuple[int, int]:
        return (self.maps[0].padded_size, self.maps[1].padded_size)

    @property
    def block(self) -> tuple[int, int]:
        """The local (per-device) block shape."""
        return tuple(m.block if a is not None else m.padded_size for m, a in zip(self.maps, self.axes))  # type: ignore[return-value]

    @property
    def identity(self) -> bool:
        return self.maps[0].identity and self.maps[1].identity

    @property
    def replicated(self) -> bool:
        return self.axes == (None, None)

    def local_sources(self, geom: Geometry, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """Global row and column ids at each position of ``rank``'s block (-1: padding)."""
        out = []
        for m, axis in zip(self.maps, self.axes):
            out.append(m.sources if axis is None else m.part_sources(geom.coord(rank, axis)))
        return out[0], out[1]


def placement_of(
    dist: Distribution, geom: Geometry, shape: tuple[int, int], shared: tuple[DimMap | None, DimMap | None]
) -> Placement:
    """Where ``dist`` puts a ``shape`` matrix on ``geom``'s mesh.

    ``shared`` gives, per stored dimension, the padded space that dimension
    must use when ``dist`` does not split it over a grid axis (so operands
    that meet in a kernel agree); None: the dimension as it is (or a Slab).
    """
    p = geom.nranks
    if isinstance(dist, Replicated) or p == 1:
        rows, cols = (s if s is not None else DimMap.whole(n) for s, n in zip(shared, shape))
        return Placement((rows, cols), (None, None))
    if isinstance(dist, Slab):
        maps: list[DimMap] = []
        for d in range(2):
            m = shared[d]
            if d == dist.dim:
                maps.append(m if m is not None and m.nparts == p else DimMap.slab(shape[d], p))
            else:
                maps.append(m if m is not None else DimMap.whole(shape[d]))
        axes: list[AxisName] = [None, None]
        axes[dist.dim] = geom.rank_axis
        return Placement((maps[0], maps[1]), (axes[0], axes[1]))
    grid = getattr(dist, "grid", None)
    if grid is None or grid != geom.grid:
        raise NotImplementedError(
            f"{dist!r} and the other operands' distributions use different process grids; "
            f"the JAX backend multiplies on one grid per product ({geom.grid!r})"
        )
    row_ids = [dist.global_indices(grid.rank((i, 0)), shape)[0] for i in range(grid.shape[0])]
    col_ids = [dist.global_indices(grid.rank((0, j)), shape)[1] for j in range(grid.shape[1])]
    return Placement((DimMap.of_parts(shape[0], row_ids), DimMap.of_parts(shape[1], col_ids)), ("r", "c"))


# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# host <-> device, one process
# --------------------------------------------------------------------------- #
def _host_block(x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``x[rows][:, cols]`` with zeros where an index is -1."""
    out = np.zeros((len(rows), len(cols)), dtype=x.dtype)
    vr, vc = rows >= 0, cols >= 0
    out[np.ix_(vr, vc)] = x[np.ix_(rows[vr], cols[vc])]
    return out


def host_to_device(x: np.ndarray, placement: Placement, geom: Geometry) -> jax.Array:
    """Place a global numpy matrix on the mesh in its padded space, one block per device."""
    sharding = geom.sharding(placement)
    if placement.identity:
        return jax.device_put(x, sharding)
    maps = placement.maps

    def block(index: tuple[slice, ...] | None) -> np.ndarray:
        assert index is not None  # jax passes every shard's index (its signature allows None)
        r, c = index
        return _host_block(x, maps[0].sources[r], maps[1].sources[c])

    return jax.make_array_from_callback(placement.shape, sharding, block)


def device_to_host(d: jax.Array, placement: Placement) -> np.ndarray:
    """The global numpy matrix of a padded result (each block copied once)."""
    if placement.identity:
        return np.array(d)  # a writable array the caller owns (np.asarray would be a read-only view)
    maps = placement.maps
    out = np.empty((maps[0].size, maps[1].size), dtype=d.dtype)
    for shard in d.addressable_shards:
        if shard.replica_id != 0:
            continue
        r, c = shard.index
        rows, cols = maps[0].sources[r], maps[1].sources[c]
        vr, vc = rows >= 0, cols >= 0
        out[np.ix_(rows[vr], cols[vc])] = np.asarray(shard.data)[np.ix_(vr, vc)]
    return out


def pad(x: jax.Array, placement: Placement) -> jax.Array:
    """Traceable: the padded-space matrix of ``x`` (zeros in the padding)."""
    for axis, m in enumerate(placement.maps):
        if m.identity:
            continue
        src = m.sources
        taken = jnp.take(x, jnp.asarray(np.maximum(src, 0)), axis=axis)
        mask = jnp.asarray(src >= 0).reshape((-1, 1) if axis == 0 else (1, -1))
        x = jnp.where(mask, taken, jnp.zeros((), x.dtype))
    return x


def unpad(x: jax.Array, placement: Placement) -> jax.Array:
    """Traceable: the global matrix of a padded-space one."""
    for axis, m in enumerate(placement.maps):
        if not m.identity:
            x = jnp.take(x, jnp.asarray(m.positions), axis=axis)
    return x


def expressible(placement: Placement) -> bool:
    """Whether a NamedSharding of the unpadded matrix expresses ``placement``."""
    return placement.identity


# --------------------------------------------------------------------------- #
# several processes: this rank's block <-> global arrays
# --------------------------------------------------------------------------- #
def my_device(geom: Geometry) -> jax.Device:
    mine = [d for d in geom.mesh.devices.flat if d.process_index == jax.process_index()]
    return mine[0]


def local_to_global(x: np.ndarray, placement: Placement, geom: Geometry, rank: int) -> jax.Array:
    """Several processes: the global padded array whose block on this process is
    ``x`` (this rank's local block, in its local order)."""
    sources = []
    for axis, (m, mesh_axis) in enumerate(zip(placement.maps, placement.axes)):
        if mesh_axis is None:
            sources.append(m.sources)
        else:
            src = np.full(m.block, -1, dtype=np.int64)
            src[: x.shape[axis]] = np.arange(x.shape[axis])
            sources.append(src)
    identity = all(len(s) == n and bool(np.all(s == np.arange(n))) for s, n in zip(sources, x.shape))
    block = x if identity else _host_block(x, sources[0], sources[1])
    device = my_device(geom)
    return jax.make_array_from_single_device_arrays(
        placement.shape, geom.sharding(placement), [jax.device_put(block, device)]
    )


def global_to_local(d: jax.Array, placement: Placement, local_shape: tuple[int, int]) -> jax.Array:
    """Several processes: this rank's block of a padded global result, padding stripped."""
    block = d.addressable_shards[0].data
    for axis, (m, mesh_axis) in enumerate(zip(placement.maps, placement.axes)):
        if mesh_axis is not None:
            if block.shape[axis] != local_shape[axis]:
                block = lax.slice_in_dim(block, 0, local_shape[axis], axis=axis)
        elif not m.identity:
            block = jnp.take(block, jnp.asarray(m.positions), axis=axis)
    return block
