""":func:`redistribute` moves a matrix between two placements on one mesh,
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

The placements and mesh are :mod:`._layout`'s.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec

from ._layout import DimMap, Geometry, Placement

__all__ = ["redistribute", "bits_of", "moved_as_bits"]


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


def _in_words(block: jax.Array) -> jax.Array:
    """A block of 16-bit elements with an even number of columns as 32-bit
    words, two neighbours each (:func:`_from_words` undoes it): XLA's CPU
    all-gather moves 16-bit elements at about half the speed of 32-bit ones
    (2048x2048 rows gathered onto 8 simulated devices: 33 ms as bfloat16 or
    uint16, 13 ms as words, 15 ms in float32)."""
    return lax.bitcast_convert_type(block.reshape(block.shape[0], -1, 2), jnp.uint32)


def _from_words(words: jax.Array, dtype: Any) -> jax.Array:
    """:func:`_in_words` undone."""
    out = lax.bitcast_convert_type(words, dtype)  # (..., columns / 2, 2)
    return out.reshape(*out.shape[:-2], -1)


def _gathered(block: jax.Array, axis: Any, *, tiled: bool, words: bool) -> jax.Array:
    """``lax.all_gather`` of ``block`` along its leading axis, as 32-bit words where ``words``."""
    if not words:
        return lax.all_gather(block, axis, axis=0, tiled=tiled)
    return _from_words(lax.all_gather(_in_words(block), axis, axis=0, tiled=tiled), block.dtype)


def _gather_columns(x: jax.Array, src: Placement, geom: Geometry) -> jax.Array:
    """Traceable: a matrix split by columns only, gathered whole onto every device.

    XLA gathers a minor dimension through a transposed copy of the whole
    matrix before and after the collective; the blocks gathered stacked along a
    new leading axis, then put side by side in one copy, take half the time on
    CPU (2048x2048 float32 over 8 simulated devices: 129 against 261 ms, where
    a gather of rows takes 23 ms; ``python benchmarks/gathers.py``). 16-bit
    elements go as words where :func:`_moves_in_words`."""
    axis = src.axes[1]
    words = _moves_in_words(x, src.block[1], geom)

    def gather(block: jax.Array) -> jax.Array:
        stacked = _gathered(block, axis, tiled=False, words=words)  # (parts, rows, block columns)
        return jnp.transpose(stacked, (1, 0, 2)).reshape(block.shape[0], -1)

    return jax.shard_map(gather, mesh=geom.mesh, in_specs=src.spec, out_specs=PartitionSpec(), check_vma=False)(x)


def _gather_rows_in_words(x: jax.Array, src: Placement, geom: Geometry) -> jax.Array:
    """Traceable: a matrix of 16-bit elements split by rows only, gathered whole
    onto every device as 32-bit words (:func:`_in_words`); in any other dtype
    XLA's own all-gather of rows (a sharding constraint) is as fast."""
    axis = src.axes[0]

    def gather(block: jax.Array) -> jax.Array:
        return _gathered(block, axis, tiled=True, words=True)

    return jax.shard_map(gather, mesh=geom.mesh, in_specs=src.spec, out_specs=PartitionSpec(), check_vma=False)(x)


def _moves_in_words(x: jax.Array, columns: int, geom: Geometry) -> bool:
    """Whether blocks of ``x`` with ``columns`` columns are gathered as 32-bit
    words (:func:`_in_words`): 16-bit elements in blocks of an even number of
    columns, on CPU devices."""
    return jnp.dtype(x.dtype).itemsize == 2 and columns % 2 == 0 and _on_cpu(geom)


def _row_slab(src: Placement, dst: Placement, geom: Geometry) -> Placement | None:
    """Where ``src`` splits columns (a column slab, a grid) and ``dst`` is
    replicated: the row slab of ``dst``'s space that the move goes through, or
    None. XLA gathers a split of columns (a minor dimension) with a
    transposing copy of what it gathers (of the whole matrix, or for a grid of
    its block and of every gathered row of blocks, element by element), where
    an exchange into row blocks (:func:`_exchange`) and one all-gather of rows
    copy in runs: 2048x2048 float32 on 8 simulated CPU devices, Slab.Y -> R
    62 -> 38 ms and a 2x4 grid -> R 102 -> 39 ms (measured paired, under load;
    an all-gather of rows alone: 25 ms)."""
    rows = dst.maps[0]
    if not dst.replicated or src.axes[1] is None or not rows.identity or rows.size % geom.nranks:
        return None
    return Placement((DimMap.slab(rows.size, geom.nranks), dst.maps[1]), (geom.rank_axis, None))


def bits_of(dtype: Any) -> Any:
    """The unsigned integer type whose bit patterns a real float of ``dtype``
    moves as where a move must not go through float arithmetic (that of its
    width), or None (any other dtype). XLA's CPU programs treat subnormals as
    zero: a sum of floats (XLA's all-reduce of zero-filled parts, which re-lays
    a padded or cut matrix) returns a subnormal as 0, -0.0 as 0.0 and a
    signaling NaN quiet; a sum of integers returns every pattern."""
    dt = jnp.dtype(dtype)
    if not jnp.issubdtype(dt, jnp.floating):
        return None
    return {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}.get(dt.itemsize)


def moved_as_bits(dtype: Any, geom: Geometry) -> bool:
    """Whether an exchange moves a matrix of ``dtype`` as its bit patterns
    (:func:`bits_of`): a 2-byte float on CPU devices, for speed. An exchange
    that updates its destination chunk by chunk converts a half precision's
    whole destination by way of float32 again at each update: 2048 x 2048
    bfloat16 on 8 simulated devices, columns -> rows 26 ms, as uint16 7 ms
    (float32: 7 ms). Other floats move as they are: an exchange places each
    value as it was given."""
    dt = jnp.dtype(dtype)
    return dt.itemsize == 2 and bits_of(dt) is not None and _on_cpu(geom)


def _on_cpu(geom: Geometry) -> bool:
    """Whether ``geom``'s mesh is of CPU devices (an abstract mesh's, inside a trace, or JAX's default)."""
    mesh = geom.mesh
    device = mesh.devices.flat[0] if isinstance(mesh, Mesh) else getattr(mesh, "abstract_device", None)
    return (getattr(device, "platform", None) or jax.default_backend()) == "cpu"


def redistribute(x: jax.Array, src: Placement, dst: Placement, geom: Geometry) -> jax.Array:
    """Traceable: ``x`` (laid out as ``src``) laid out as ``dst`` on the same mesh."""
    if src == dst:
        return x
    if moved_as_bits(x.dtype, geom):
        bits = redistribute(lax.bitcast_convert_type(x, jnp.uint16), src, dst, geom)
        return lax.bitcast_convert_type(bits, x.dtype)
    via = _row_slab(src, dst, geom)
    if via is not None:
        return redistribute(redistribute(x, src, via, geom), via, dst, geom)
    if src.maps == dst.maps or (dst.replicated and _same_space(src, dst)):
        # only the split changes: XLA's own collective (slice/all-gather/all-to-all)
        if dst.replicated and src.axes[0] is None:
            return _gather_columns(x, src, geom)
        if dst.replicated and src.axes[1] is None and _moves_in_words(x, src.block[1], geom):
            return _gather_rows_in_words(x, src, geom)
        return lax.with_sharding_constraint(x, geom.sharding(dst))
    rank_axis = geom.rank_axis
    if src.replicated:  # every rank holds everything: each keeps its part, nothing moves
        rows_t, cols_t = (jnp.asarray(t) for t in _slice_tables(src, dst, geom))

        def keep(local: jax.Array) -> jax.Array:
            me = lax.axis_index(rank_axis)
            return _take2(local, rows_t[me], cols_t[me])

        return jax.shard_map(keep, mesh=geom.mesh, in_specs=src.spec, out_specs=dst.spec, check_vma=False)(x)

    plan = _exchange(src, dst, geom)
    axes = geom.rank_axes  # mesh order: where axis_index and ppermute agree
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
