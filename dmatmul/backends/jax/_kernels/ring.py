"""The rings: a block passed around the ranks (all-gather) or partial sums
passed and added (reduce-scatter), one or both ways."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def ring_order(axis: Any) -> tuple[Any, jax.Array | None]:
    """The ring's axis and, where it differs, its numbering of the ranks.

    ``lax.ppermute`` over a tuple of mesh axes numbers devices in the *mesh's*
    axis order, whatever the tuple's order, while ``lax.axis_index``,
    ``all_gather`` and ``psum_scatter`` number them in the tuple's order
    (JAX 0.10). On a tuple not in mesh order (``("model", "data")`` of a
    user's ``("data", "model")`` mesh in :mod:`dmatmul.jax`; once, dmatmul's
    own column-order grids) a ring built from ``axis_index`` and ``ppermute``
    of that tuple sends blocks to the wrong ranks. A ring therefore runs over
    the tuple sorted into mesh order (where both primitives agree) and
    ``table[q]`` is the tuple-order index of ring position ``q``; ``table`` is
    None when the two orders agree.
    """
    if isinstance(axis, str) or len(axis) == 1:
        return axis, None
    names = tuple(axis)
    mesh_names = tuple(jax.sharding.get_abstract_mesh().axis_names)
    if not all(n in mesh_names for n in names):  # not under a mesh we can read: keep the given order
        return names, None
    ring = tuple(sorted(names, key=mesh_names.index))
    if ring == names:
        return names, None
    sizes = {n: lax.axis_size(n) for n in names}
    # ring position q -> coordinates (row-major over ``ring``) -> index row-major over ``names``
    table = []
    for q in range(int(np.prod([sizes[n] for n in ring]))):
        coords, rest = {}, q
        for n in reversed(ring):
            coords[n], rest = rest % sizes[n], rest // sizes[n]
        idx = 0
        for n in names:
            idx = idx * sizes[n] + coords[n]
        table.append(idx)
    return ring, jnp.asarray(table, dtype=jnp.int32)


def _index_of(table: jax.Array | None, q: jax.Array) -> jax.Array:
    return q if table is None else table[q]


def ring_parts(m: int, both_ways: bool) -> tuple[tuple[int, int, int], ...]:
    """How a block of ``m`` positions travels a ring: ``(start, stop, shift)``
    per part, ``shift`` the direction an all-gather sends it (``-1``: left).
    The whole block leftwards, or with ``both_ways`` its first half (the
    larger, for odd ``m``) left and the rest right: two rings side by side
    (:func:`ring_allgathers`). A reduce-scatter, the transpose, sends each
    part the other way (``-shift``, :func:`ring_reduce_scatters`).

    >>> ring_parts(5, False), ring_parts(5, True), ring_parts(1, True)
    (((0, 5, -1),), ((0, 3, -1), (3, 5, 1)), ((0, 1, -1),))
    """
    if not both_ways or m < 2:
        return ((0, m, -1),)
    h = (m + 1) // 2
    return ((0, h, -1), (h, m, 1))


def ring_pieces(x: jax.Array, axis: int, both_ways: bool) -> tuple[tuple[jax.Array, int, int], ...]:
    """What travels of block ``x``, cut along ``axis`` as :func:`ring_parts`
    says: ``(piece, shift, start)``."""
    m = x.shape[axis]
    return tuple((x if (start, stop) == (0, m) else lax.slice_in_dim(x, start, stop, axis=axis), shift, start)
                 for start, stop, shift in ring_parts(m, both_ways))


def ring_allgather(
    block: jax.Array,
    acc: Any,
    step: Callable[[Any, jax.Array, jax.Array], Any],
    p: int,
    axis: Any,
    *,
    python_loop: bool = False,
) -> Any:
    """``step(acc, block_j, j)`` over every block ``j`` of the ring, sending left.

    ``j`` is the block's index in ``axis``'s own numbering (``lax.axis_index``);
    ``acc`` may be any pytree (several products can ride one ring).
    """
    return ring_allgathers(((block, -1),), acc, lambda acc, _, blk, j: step(acc, blk, j), p, axis,
                           python_loop=python_loop)


def ring_allgathers(
    blocks: tuple[tuple[jax.Array, int], ...],
    acc: Any,
    step: Callable[[Any, int, jax.Array, jax.Array], Any],
    p: int,
    axis: Any,
    *,
    python_loop: bool = False,
) -> Any:
    """AllGather rings run side by side: ``(block, shift)`` travels to rank
    ``r + shift`` (``-1``: left, ``+1``: right) each step, so at step ``s`` rank
    ``r`` holds ring ``i``'s block ``j = (r - shift * s) mod P``, which meets
    ``step(acc, i, block, j)``. Two halves of a block sent opposite ways use
    both directions of a bidirectional link. ``python_loop``: the steps as
    straight-line code (up to 17 ranks), for :mod:`dmatmul.jax`'s blocks in a
    user's shard_map, which a ``jax.vmap`` with ``spmd_axis_name`` may batch."""
    ring, table = ring_order(axis)
    idx = lax.axis_index(ring)
    shifts = tuple(shift for _, shift in blocks)
    perms = [[(i, (i + shift) % p) for i in range(p)] for shift in shifts]

    def visit(acc: Any, s: int | jax.Array, held: tuple[jax.Array, ...]) -> Any:
        for i, (blk, shift) in enumerate(zip(held, shifts)):
            acc = step(acc, i, blk, _index_of(table, (idx - shift * s) % p))
        return acc

    def one(s: int | jax.Array, carry: tuple[Any, tuple[jax.Array, ...]]) -> tuple[Any, tuple[jax.Array, ...]]:
        acc, held = carry
        nxt = tuple(lax.ppermute(blk, ring, perm) for blk, perm in zip(held, perms))
        return visit(acc, s, held), nxt

    held = tuple(blk for blk, _ in blocks)
    # Unrolled: the rolled loop copies the travelling block every step (measured: +10% at n=2048, P=8);
    # capped so that many ranks do not blow up compile time. With python_loop, up to 17 ranks a Python
    # loop: a loop's carry must keep its type, and under jax.vmap with spmd_axis_name over the user's
    # shard_map the batched ppermute does not ("Scan carry input and output got mismatched varying manual
    # axes"). dmatmul's own kernels keep the loop they were measured with.
    if python_loop and p - 1 <= 16:
        carry = (acc, held)
        for s in range(p - 1):
            carry = one(s, carry)
        acc, held = carry
    else:
        acc, held = lax.fori_loop(0, p - 1, one, (acc, held), unroll=min(max(p - 1, 1), 16))
    return visit(acc, p - 1, held)


def ring_reduce_scatters(
    partials: tuple[tuple[Callable[[jax.Array], jax.Array], int], ...], p: int, axis: Any
) -> tuple[jax.Array, ...]:
    """ReduceScatter rings run side by side, the transposes of
    :func:`ring_allgathers`' rings: ring ``i``'s ``(partial, shift)`` sends its
    partial sum to rank ``r + shift`` each step, and at step ``s`` rank ``r``
    adds ``partial(j)`` for ``j = (r - shift * (s + 1)) mod P``, so after
    ``P - 1`` steps it holds the sum over ranks of its own ``partial(r)``.
    Two parts of each block summed opposite ways use both directions of a
    bidirectional link."""
    ring, table = ring_order(axis)
    idx = lax.axis_index(ring)
    shifts = tuple(shift for _, shift in partials)
    perms = [[(i, (i + shift) % p) for i in range(p)] for shift in shifts]

    def contribution(i: int, s: int | jax.Array) -> jax.Array:
        return partials[i][0](_index_of(table, (idx - shifts[i] * (s + 1)) % p))

    def one(s: int | jax.Array, accs: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        sent = tuple(lax.ppermute(acc, ring, perm) for acc, perm in zip(accs, perms))  # issued before the GEMMs
        return tuple(got + contribution(i, s) for i, got in enumerate(sent))

    return lax.fori_loop(1, p, one, tuple(contribution(i, 0) for i in range(len(partials))))
