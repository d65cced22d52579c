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

:func:`redistribute` moves a matrix between two placements on one mesh,
moving every element once: each rank sends every other rank exactly the
elements both hold, computed from the index lists, never by gathering
everything anywhere: as few rounds of ``ppermute`` as the busiest device has
partners (each device sends to one and receives from one per round). A chunk
that is one run of rows and columns on both sides (slabs, BlockNonCyclic) is
cut and placed by slices, so such a move holds little beside the result; a
scattered one (block-cyclic) by a gather and a scatter whose index arrays are
twice the chunk. The padded ``all_to_all`` this replaced sent every pair a
chunk of the largest pair's size: up to 16 blocks of temporaries (now at most
1.5 between runs, 3.1 otherwise), 5.3x the kernel's ideal memory for a
transposed SUMMA (now 1.44x, the kernel's own), and 2-16x the time (n = 4096
on 8 simulated CPU devices: Slab.X -> Slab.Y 165 -> 26 ms, BlockNonCyclic
across grid orders 300 -> 18 ms, BlockCyclic(1, 1) -> BlockNonCyclic 168 -> 72 ms).

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
    "redistribute",
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
    rank_axis: str | tuple[str, str]
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
        return int(self.mesh.size)

    def coord(self, rank: int, axis: AxisName) -> int:
        """The index along mesh ``axis`` of the device of ``rank``."""
        if axis == self.rank_axis or axis == "x":
            return rank
        assert self.grid is not None
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
# redistribution: every element moves once
# --------------------------------------------------------------------------- #
@dataclasses.dataclass(frozen=True)
class Exchange:
    """The moves of one redistribution, in *mesh order* (device ``f`` at flat
    position ``f`` of the mesh, the numbering in which ``lax.axis_index`` and
    ``lax.ppermute`` of the mesh's own axis tuple agree).

    Each ``(send_r, send_c, recv_r, recv_c)`` table holds per device ``f`` the
    positions (-1: none) in its source block of the rows and columns it sends,
    and in its destination block of those it receives; ``keep`` is the copy a
    device makes of its own elements, each of ``rounds`` one ``ppermute`` whose
    ``perm`` pairs every device with at most one receiver and one sender
    (:func:`_colour` of the pairs that share elements).
    """

    keep: tuple[np.ndarray, ...] | None
    rounds: tuple[tuple[tuple[tuple[int, int], ...], tuple[np.ndarray, ...]], ...]


@functools.lru_cache(maxsize=256)
def _exchange(src: Placement, dst: Placement, geom: Geometry) -> Exchange:
    """The elements each pair of devices shares between ``src`` and ``dst``, as
    the rounds of ``ppermute`` of :func:`redistribute`."""
    p = geom.nranks
    rank = geom.mesh_ranks  # rank of the device at mesh position f
    src_idx = [src.local_sources(geom, rank[f]) for f in range(p)]
    dst_idx = [dst.local_sources(geom, rank[f]) for f in range(p)]

    def shared(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        _, ia, ib = np.intersect1d(a[a >= 0], b[b >= 0], assume_unique=True, return_indices=True)
        return np.nonzero(a >= 0)[0][ia], np.nonzero(b >= 0)[0][ib]  # positions in the padded blocks

    pairs = {}
    for s in range(p):
        for t in range(p):
            (sr, tr), (sc, tc) = (shared(src_idx[s][d], dst_idx[t][d]) for d in range(2))
            if len(sr) and len(sc):
                pairs[s, t] = (sr, sc, tr, tc)

    def tables(group: list[tuple[int, int]]) -> tuple[np.ndarray, ...]:
        lr = max(len(pairs[e][0]) for e in group)
        lc = max(len(pairs[e][1]) for e in group)
        out = [np.full((p, n), -1, dtype=np.int32) for n in (lr, lc, lr, lc)]
        for s, t in group:
            sr, sc, tr, tc = pairs[s, t]
            out[0][s, : len(sr)], out[1][s, : len(sc)] = sr, sc
            out[2][t, : len(tr)], out[3][t, : len(tc)] = tr, tc
        return tuple(out)

    own = [(f, f) for f in range(p) if (f, f) in pairs]
    rounds = _colour([e for e in pairs if e[0] != e[1]])
    return Exchange(tables(own) if own else None, tuple((tuple(g), tables(g)) for g in rounds))


def _colour(edges: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """The (sender, receiver) pairs in as few rounds as a device sends to or
    receives from others (König: a bipartite graph's edges take as many colours
    as its largest degree), no device twice on one side of a round.

    Each pair takes a colour ``a`` free at its sender; where ``a`` is taken at
    the receiver, the path of colours ``a``/``b`` from the receiver (``b`` free
    there) swaps its colours first, which frees ``a`` there and, the graph being
    bipartite, never reaches the sender.

    >>> _colour([(0, 1), (1, 0), (0, 2), (2, 1)])  # device 0 sends twice: two rounds
    [[(0, 2), (1, 0), (2, 1)], [(0, 1)]]
    """
    at: dict[tuple[str, int], dict[int, int]] = {}  # (side, device) -> colour -> the other end

    def free(node: tuple[str, int]) -> int:
        used = at.setdefault(node, {})
        return next(c for c in range(len(used) + 1) if c not in used)

    for s, t in edges:
        snd, rcv = ("s", s), ("t", t)
        a, b = free(snd), free(rcv)
        if a in at[rcv]:  # swap a and b along the path that starts at the receiver with colour a
            path, node, c = [], rcv, a
            while c in at[node]:
                nxt = ("s" if node[0] == "t" else "t", at[node][c])
                path.append((node, nxt, c))
                node, c = nxt, b if c == a else a
            for u, v, c in path:
                del at[u][c], at[v][c]
            for u, v, c in path:
                swapped = b if c == a else a
                at[u][swapped], at[v][swapped] = v[1], u[1]
        at[snd][a], at[rcv][a] = t, s
    rounds: dict[int, list[tuple[int, int]]] = {}
    for (side, s), colours in at.items():
        if side == "s":
            for c, t in colours.items():
                rounds.setdefault(c, []).append((s, t))
    return [sorted(rounds[c]) for c in sorted(rounds)]


def _runs(rows: np.ndarray, cols: np.ndarray) -> tuple[jax.Array, jax.Array] | None:
    """Where, for every device that takes part (a row of ``rows`` not all -1),
    the positions are one run each way (``start + arange``, no padding): the
    starts per device (0 for the others), so a slice can stand for a gather;
    else None."""
    part = rows[:, 0] >= 0
    if not part.any():
        return None
    starts = []
    for t in (rows, cols):
        run = t[part] == t[part][:, :1] + np.arange(t.shape[1])
        if not run.all():
            return None
        starts.append(jnp.asarray(np.where(part, t[:, 0], 0), dtype=jnp.int32))
    return starts[0], starts[1]


@functools.lru_cache(maxsize=256)
def _slice_tables(src: Placement, dst: Placement, geom: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """From a replicated ``src``: per rank, the positions in ``src``'s padded
    matrix of each row and column of its ``dst`` block (-1: padding)."""
    tables = []
    for dim in range(2):
        pos = src.maps[dim].positions
        per_rank = []
        for t in range(geom.nranks):
            ids = dst.local_sources(geom, t)[dim]
            per_rank.append(np.where(ids >= 0, pos[np.maximum(ids, 0)], -1))
        tables.append(np.stack(per_rank).astype(np.int32))
    return tables[0], tables[1]


def _take2(x: jax.Array, rows: jax.Array, cols: jax.Array) -> jax.Array:
    """``x[rows][:, cols]`` (one gather), zeros where an index is -1."""
    out = x[jnp.maximum(rows, 0)[:, None], jnp.maximum(cols, 0)[None, :]]
    return jnp.where((rows >= 0)[:, None] & (cols >= 0)[None, :], out, jnp.zeros((), x.dtype))


def _same_space(src: Placement, dst: Placement) -> bool:
    """Whether ``src`` and ``dst`` place the same padded matrix, only split
    otherwise (e.g. an even Slab and Replicated(): both the matrix itself)."""
    return all(
        s.padded_size == d.padded_size and np.array_equal(s.sources, d.sources) for s, d in zip(src.maps, dst.maps)
    )


def _gather_columns(x: jax.Array, src: Placement, geom: Geometry) -> jax.Array:
    """Traceable: a matrix split by columns only, gathered whole onto every device.

    XLA gathers a minor dimension through a transposed copy of the whole
    matrix before and after the collective; the blocks gathered stacked along a
    new leading axis, then put side by side in one copy, take half the time on
    CPU (2048x2048 float32 over 8 simulated devices: 129 against 261 ms, where
    a gather of rows takes 23 ms; ``python benchmarks/gathers.py``)."""
    axis = src.axes[1]

    def gather(block: jax.Array) -> jax.Array:
        stacked = lax.all_gather(block, axis, axis=0, tiled=False)  # (parts, rows, block columns)
        return jnp.transpose(stacked, (1, 0, 2)).reshape(block.shape[0], -1)

    return jax.shard_map(gather, mesh=geom.mesh, in_specs=src.spec, out_specs=PartitionSpec(), check_vma=False)(x)


def redistribute(x: jax.Array, src: Placement, dst: Placement, geom: Geometry) -> jax.Array:
    """Traceable: ``x`` (laid out as ``src``) laid out as ``dst`` on the same mesh."""
    if src == dst:
        return x
    if src.maps == dst.maps or (dst.replicated and _same_space(src, dst)):
        # only the split changes: XLA's own collective (slice/all-gather/all-to-all)
        if dst.replicated and src.axes[0] is None:
            return _gather_columns(x, src, geom)
        return lax.with_sharding_constraint(x, geom.sharding(dst))
    rank_axis = geom.rank_axis
    if src.replicated:  # every rank holds everything: each keeps its part, nothing moves
        rows_t, cols_t = (jnp.asarray(t) for t in _slice_tables(src, dst, geom))

        def keep(local: jax.Array) -> jax.Array:
            me = lax.axis_index(rank_axis)
            return _take2(local, rows_t[me], cols_t[me])

        return jax.shard_map(keep, mesh=geom.mesh, in_specs=src.spec, out_specs=dst.spec, check_vma=False)(x)

    plan = _exchange(src, dst, geom)
    axes = tuple(geom.mesh.axis_names)  # mesh order: where axis_index and ppermute agree
    out_rows, out_cols = dst.block

    def take(local: jax.Array, me: jax.Array, rows: np.ndarray, cols: np.ndarray) -> jax.Array:
        """The chunk at ``rows`` x ``cols`` (tables per device) of ``local``: a
        slice where every device's positions are one run, else a gather."""
        starts = _runs(rows, cols)
        if starts is not None:
            return lax.dynamic_slice(local, (starts[0][me], starts[1][me]), (rows.shape[1], cols.shape[1]))
        return _take2(local, jnp.asarray(rows)[me], jnp.asarray(cols)[me])

    def put(out: jax.Array, got: jax.Array, me: jax.Array, rows: np.ndarray, cols: np.ndarray) -> jax.Array:
        """``got`` into ``out`` at ``rows`` x ``cols`` (-1: dropped): an update of one
        slice where every receiving device's positions are one run (a device that
        receives nothing writes back what is there), else a scatter."""
        starts = _runs(rows, cols)
        if starts is not None:
            at = (starts[0][me], starts[1][me])
            mine = jnp.asarray(rows[:, 0] >= 0)[me]
            here = lax.dynamic_slice(out, at, got.shape)
            return lax.dynamic_update_slice(out, jnp.where(mine, got, here), at)
        r, c = jnp.asarray(rows)[me], jnp.asarray(cols)[me]
        r = jnp.where(r >= 0, r, out_rows)  # padding goes out of bounds: dropped
        c = jnp.where(c >= 0, c, out_cols)
        return out.at[r[:, None], c[None, :]].set(got, mode="drop")

    def exchange(local: jax.Array) -> jax.Array:
        me = lax.axis_index(axes)
        out = jnp.zeros((out_rows, out_cols), x.dtype)
        if plan.keep is not None:
            sr, sc, tr, tc = plan.keep
            out = put(out, take(local, me, sr, sc), me, tr, tc)
        for perm, (sr, sc, tr, tc) in plan.rounds:
            got = lax.ppermute(take(local, me, sr, sc), axes, list(perm))
            out = put(out, got, me, tr, tc)
        return out

    return jax.shard_map(exchange, mesh=geom.mesh, in_specs=src.spec, out_specs=dst.spec, check_vma=False)(x)


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
