"""SUMMA on a 2-D grid: the K panels' schedule and route, the ring of panels
and the one-shot variant."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .common import LocalProblem, SummaSchedule, varying_zeros
from .ring import ring_allgather


def _pad_to_extents(lp: LocalProblem, a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Zero-pad the local K extents to what the panels read (only when K's last
    block is short: room to read a full panel)."""
    sched, ax = lp.summa, lp.axes
    assert sched is not None
    out = []
    for x, axis, extent in ((a, ax["aK"], sched.extent_a), (b, ax["bK"], sched.extent_b)):
        if x.shape[axis] < extent:
            widths = [(0, 0), (0, 0)]
            widths[axis] = (0, extent - x.shape[axis])
            x = jnp.pad(x, widths)
        out.append(x)
    return out[0], out[1]


def summa_tables(
    sched: SummaSchedule, travel: str, n_own: int, n_other: int, len_travel: int, len_other: int
) -> tuple[np.ndarray, bool]:
    """Where the rows of the gathered operand that meet each travelling block are.

    ``travel`` is the operand that rides a ring (``"a"`` along the grid row,
    ``"b"`` along the grid column); the other one is all-gathered (tiled) along
    the other grid axis, so its local K position ``j`` of owner ``q'`` is row
    ``q' * len_other + j`` of the gathered K axis. ``table[q, i]`` is the
    gathered row that local K position ``i`` of owner ``q`` of the travelling
    operand meets (padding positions that meet nothing: ``n_other * len_other``,
    one past the end, read as zeros). The second value says whether every owner's
    rows are one contiguous run (``table[q] = table[q, 0] + arange``), so a
    slice can stand for a gather.
    """
    own, off_t, other, off_o = (
        (sched.owner_col, sched.offset_a, sched.owner_row, sched.offset_b) if travel == "a"
        else (sched.owner_row, sched.offset_b, sched.owner_col, sched.offset_a)
    )
    fill = n_other * len_other  # past the end: zeros
    table = np.full((n_own, len_travel), fill, np.int64)
    u = np.arange(sched.width)
    for q, i0, q2, j0 in zip(own, off_t, other, off_o):
        table[q, i0 + u] = q2 * len_other + j0 + u
    contiguous = bool(np.all(table == table[:, :1] + np.arange(len_travel))) and bool(
        np.all(table[:, 0] + len_travel <= fill)
    )
    return table, contiguous


def summa_owners(table: np.ndarray, n_other: int, len_o: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Where every travelling owner's rows (``table``, :func:`summa_tables`) all
    lie in one rank's block of the other operand (``BlockNonCyclic``;
    ``BlockCyclic`` where the longer grid axis is a multiple of the shorter and
    the K blocks match): that rank per owner and the positions in its block
    (-1: padding, read as zeros); else None."""
    owners, local = [], np.full(table.shape, -1, np.int64)
    for q, row in enumerate(table):
        valid = row < n_other * len_o  # past the end: padding
        ranks = np.unique(row[valid] // len_o)
        if len(ranks) > 1:
            return None
        owners.append(int(ranks[0]) if len(ranks) else 0)
        local[q, valid] = row[valid] % len_o
    return np.array(owners, np.int64), local


@dataclasses.dataclass(frozen=True, eq=False)
class SummaRoute:
    """How :func:`summa` runs (:func:`summa_route`): ``ring`` "a" (op(A)'s blocks
    ride the grid row, ``n_ring`` = columns) or "b" (op(B)'s ride the grid column);
    the other operand's ``n_other`` owners along the other axis; the local K
    lengths of the travelling (``len_t``) and the other (``len_o``) operand;
    :func:`summa_tables`' ``table`` and ``contiguous``; and ``owners``
    (:func:`summa_owners`), None where the other operand is all-gathered once."""

    ring: str
    n_ring: int
    n_other: int
    len_t: int
    len_o: int
    table: np.ndarray
    contiguous: bool
    owners: tuple[np.ndarray, np.ndarray] | None

    @property
    def gathered(self) -> bool:
        return self.owners is None

    def traffic(self, free_t: int, free_o: int) -> tuple[int, int]:
        """(elements received, transfers) per rank in :func:`summa`, whose
        travelling blocks are ``len_t x free_t`` and the other operand's local
        block ``len_o x free_o``: ``n_ring - 1`` ring steps, plus the other
        operand all-gathered once (``n_other - 1`` blocks, one transfer) or its
        panel (``len_t x free_o``) broadcast at each of the ``n_ring`` steps in
        ``ceil(log2 n_other)`` rounds of a ``ppermute`` that every rank sends
        and receives (:func:`rooted_broadcast`: the root and the ranks that
        have the panel already receive too, so on two ranks a step swaps
        panels, twice what a broadcast that delivers each byte once moves).
        On a ring of two the two steps' first rounds send the same panel where
        both read the same positions, and XLA sends it once.

        >>> s = SummaSchedule(16, (0, 1, 2, 3), (0, 0, 0, 0), (0, 0, 1, 1), (0, 16, 0, 16))
        >>> summa_route(s, 2, 4, 16, 32).traffic(32, 16)  # a 2x4 grid: 3 ring steps, 4 swapped panels
        (2560, 7)
        """
        ring = (self.n_ring - 1) * self.len_t * free_t
        if self.n_other == 1:
            return ring, self.n_ring - 1
        if self.owners is None:
            return ring + (self.n_other - 1) * self.len_o * free_o, self.n_ring
        rounds = (self.n_other - 1).bit_length()
        panels = self.n_ring * rounds
        if self.n_ring == 2 and np.array_equal(self.owners[1][0], self.owners[1][1]):
            panels -= 1
        return ring + panels * self.len_t * free_o, self.n_ring - 1 + panels


def summa_route(
    sched: SummaSchedule, rows: int, cols: int, len_ka: int, len_kb: int, ring: str | None = None
) -> SummaRoute:
    """Which operand rides the ring (``"a"`` along the grid row, ``"b"`` along the
    grid column: the longer grid axis unless ``ring`` says) and whether the other
    operand is all-gathered once or its matching panel broadcast at each step
    (where every travelling block meets rows of one owner, :func:`summa_owners`).
    ``len_ka`` and ``len_kb`` are the local K lengths of op(A) and op(B) (their
    blocks; the kernel pads them to what the panels read, ``sched.extent_*``, as
    here)."""
    len_ka, len_kb = max(len_ka, sched.extent_a), max(len_kb, sched.extent_b)
    if ring is None:
        ring = "a" if cols >= rows else "b"
    n_ring = cols if ring == "a" else rows
    len_t, len_o = (len_ka, len_kb) if ring == "a" else (len_kb, len_ka)
    n_other = rows * cols // n_ring
    table, contiguous = summa_tables(sched, ring, n_ring, n_other, len_t, len_o)
    return SummaRoute(ring, n_ring, n_other, len_t, len_o, table, contiguous, summa_owners(table, n_other, len_o))


def _gathered_panels(
    other: jax.Array, k_other: int, gather_axis: str, table: np.ndarray, contiguous: bool, len_t: int, len_o: int
) -> tuple[jax.Array, jax.Array]:
    """The other operand all-gathered as panels on a leading axis, and which panel
    meets each owner of the travelling operand: ``panels[index[q]]`` holds (K
    along ``k_other``, as ``other`` stores it) the ``len_t`` positions of K that
    owner ``q``'s block meets, so each ring step reads one contiguous panel (a
    strided slice of the K columns of a row-major block is copied every step).

    Where each owner's positions are a run starting on a multiple of ``len_t``
    inside one rank's block, the local block is cut into panels *before* the
    all-gather (a free reshape when K is its leading axis); else the gathered
    positions are laid out per owner by one ``take`` (zeros where a position
    meets nothing)."""
    n_own = table.shape[0]
    if contiguous and len_o % len_t == 0 and not np.any(table[:, 0] % len_t):
        split = other.reshape((len_o // len_t, len_t, -1) if k_other == 0 else (-1, len_o // len_t, len_t))
        if k_other == 1:
            split = jnp.transpose(split, (1, 0, 2))
        panels = lax.all_gather(split, gather_axis, axis=0, tiled=True)
        return panels, jnp.asarray(table[:, 0] // len_t, dtype=jnp.int32)
    gathered = lax.all_gather(other, gather_axis, axis=k_other, tiled=True)
    laid = jnp.take(gathered, jnp.asarray(table.reshape(-1)), axis=k_other, mode="fill", fill_value=0)
    if k_other == 0:
        panels = laid.reshape(n_own, len_t, -1)
    else:
        panels = jnp.transpose(laid.reshape(-1, n_own, len_t), (1, 0, 2))
    return panels, jnp.arange(n_own, dtype=jnp.int32)


def rooted_broadcast(x: jax.Array, axis: str, n: int, root: jax.Array) -> jax.Array:
    """``x`` of position ``root`` (traced: it may differ between the groups of the
    other mesh axis) on every rank of mesh axis ``axis`` (``n`` ranks):
    ``ceil(log2 n)`` rounds of one ``ppermute`` (round ``d``: every rank sends
    ``d`` ahead and the ranks ``d .. 2d - 1`` after the root keep what came).
    Unlike a masked ``psum`` nothing is added and no zeros travel; for ``n = 2``
    it is one swap."""
    if n == 1:
        return x
    rel = (lax.axis_index(axis) - root) % n
    d = 1
    while d < n:
        got = lax.ppermute(x, axis, [(i, (i + d) % n) for i in range(n)])
        x = jnp.where((rel >= d) & (rel < 2 * d), got, x)
        d *= 2
    return x


def summa(lp: LocalProblem, a: jax.Array, b: jax.Array, ring: str | None = None, gather: bool = False) -> jax.Array:
    """SUMMA on the ("r", "c") mesh as a ring: the operand split along the longer
    grid axis travels (op(A)'s K blocks around the grid row "c", or op(B)'s around
    the grid column "r"; ``ring`` "a" or "b" to choose), one ``ppermute`` per
    step, and each travelling block meets the rows (columns) of the other operand
    that hold the same k:

    * by default, where they all lie in one owner's block (:func:`summa_owners`:
      ``BlockNonCyclic``, and ``BlockCyclic`` on 2x4 or 4x2 grids and the like),
      that panel (a slice of a contiguous run, else a gather of the owner's
      rows: 2.04x the ideal memory against 3.14x gathered, 3-6% slower, for
      64-blocks at n=2048) is broadcast along the other grid axis
      at each step (:func:`rooted_broadcast`) in a rolled loop: the memory of
      one travelling block and one panel beyond the local blocks. Where
      ``lp.overlap`` (GPU, TPU) the next block's ``ppermute`` is issued before
      the step's GEMM, which does not need it; on CPU, whose collectives are
      synchronous, each step receives its block and then multiplies it, so the
      block sent and the step's product never coexist (peak memory 1.44x the
      ideal on 2x4 and 4x2 grids against 1.56x);
    * else (or ``gather=True``) the other operand is all-gathered once, laid
      out as contiguous panels (:func:`_gathered_panels`), and the ring is
      unrolled (``ring_allgather``).

    Against the textbook SUMMA (one masked ``psum`` per K panel, an all-reduce
    of mostly zeros: twice the bytes of a broadcast, and the reduction's reads)
    this moves each byte once: measured on 8 simulated CPU devices
    (``benchmarks/summa.py``, paired) 1.02-1.13x the psum kernel at n=2048 and
    1.09-1.11x at n=4096; the gathered route was 7-14% faster at n=2048, 2-8%
    slower at n=4096, and holds R (or C) times a local block (peak memory 2.0x
    the ideal against 1.44x).
    """
    sched, ax = lp.summa, lp.axes
    assert sched is not None
    a, b = _pad_to_extents(lp, a, b)
    rows, cols = lax.axis_size("r"), lax.axis_size("c")
    route = summa_route(sched, rows, cols, a.shape[ax["aK"]], b.shape[ax["bK"]], ring)
    ring, n_ring, n_other, len_t, len_o = route.ring, route.n_ring, route.n_other, route.len_t, route.len_o
    if ring == "a":  # a's blocks ride the grid row; b's panels come down the grid column
        moving, m_axis, other, k_other, o_axis = a, "c", b, ax["bK"], "r"
    else:
        moving, m_axis, other, k_other, o_axis = b, "r", a, ax["aK"], "c"

    def meet(blk: jax.Array, panel: jax.Array) -> jax.Array:
        return lp.mm(blk, panel) if ring == "a" else lp.mm(panel, blk)

    if route.owners is None or gather:  # the per-step panel needs one owner per travelling block
        panels, index = _gathered_panels(other, k_other, o_axis, route.table, route.contiguous, len_t, len_o)

        def step(acc: jax.Array, blk: jax.Array, q: jax.Array) -> jax.Array:
            return acc + meet(blk, lax.dynamic_index_in_dim(panels, index[q], 0, keepdims=False))

        acc = varying_zeros((a.shape[ax["aM"]], b.shape[ax["bN"]]), lp.acc_dtype, ("r", "c"))
        return ring_allgather(moving, acc, step, n_ring, m_axis)

    owner_np, local_np = route.owners
    owner = jnp.asarray(owner_np, dtype=jnp.int32)
    idx = lax.axis_index(m_axis)
    perm = [(i, (i - 1) % n_ring) for i in range(n_ring)]  # rank r holds block (r + s) mod n at step s
    # a slice where every travelling block meets one contiguous run of its owner's block; an owner holding
    # only padding (-1, K shorter than the grid) must read zeros, which a clamped slice would not
    runs = bool(np.all(local_np >= 0) and np.all(local_np == local_np[:, :1] + np.arange(len_t))
                and np.all(local_np[:, 0] + len_t <= len_o))
    if runs:  # one contiguous run of the owner's block per travelling block: a slice
        offset = jnp.asarray(local_np[:, 0], dtype=jnp.int32)

        def panel_of(q: jax.Array) -> jax.Array:
            return lax.dynamic_slice_in_dim(other, offset[q], len_t, axis=k_other)
    else:  # rows spread through the owner's block (block-cyclic K): a gather, zeros for padding
        local = jnp.asarray(np.where(local_np >= 0, local_np, len_o), dtype=jnp.int32)

        def panel_of(q: jax.Array) -> jax.Array:
            return jnp.take(other, local[q], axis=k_other, mode="fill", fill_value=0)

    def product(blk: jax.Array, q: jax.Array) -> jax.Array:
        return meet(blk, rooted_broadcast(panel_of(q), o_axis, n_other, owner[q]))

    acc = product(moving, idx)
    if n_ring == 1:
        return acc

    if not lp.overlap:
        def after(s: jax.Array, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
            # the step's GEMM needs what arrives, so the block sent dies before the product is made
            acc, blk = carry
            blk = lax.ppermute(blk, m_axis, perm)
            return acc + product(blk, (idx + s) % n_ring), blk

        return lax.fori_loop(1, n_ring, after, (acc, moving))[0]

    def one(s: jax.Array, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        acc, blk = carry
        nxt = lax.ppermute(blk, m_axis, perm)  # issued before this step's GEMM, which does not need it
        return acc + product(blk, (idx + s) % n_ring), nxt

    # rolled: unrolled, XLA hoists every transfer to the start and keeps every step's product alive
    acc, blk = lax.fori_loop(1, n_ring - 1, one, (acc, lax.ppermute(moving, m_axis, perm)))
    return acc + product(blk, (idx + n_ring - 1) % n_ring)


def summa_one_shot(lp: LocalProblem, a: jax.Array, b: jax.Array) -> jax.Array:
    """SUMMA as two whole collectives and one GEMM (small products on a grid,
    where each ring step's rendezvous dominates): op(A)'s K blocks all-gathered
    along the grid row "c", op(B)'s along the grid column "r", each laid out in
    the order of the panels (:class:`SummaSchedule`: the same k at the same
    position in both; a shorter last panel reads zeros in both), then one
    GEMM. Holds op(A)'s whole row panel and op(B)'s whole column panel."""
    sched, ax = lp.summa, lp.axes
    assert sched is not None
    a, b = _pad_to_extents(lp, a, b)

    def gathered(x: jax.Array, axis: int, over: str, owners: tuple[int, ...], offsets: tuple[int, ...]) -> jax.Array:
        length = x.shape[axis]
        if axis == 0:
            whole = lax.all_gather(x, over, axis=0, tiled=True)
        else:  # gathered along the leading axis, then laid side by side (the one-shot notes in :mod:`.bodies`:
            # along the second axis XLA's CPU collectives copy strided, 2-4x slower on a tall operand's K)
            blocks = lax.all_gather(x, over, axis=0, tiled=False)
            whole = jnp.moveaxis(blocks, 0, 1).reshape(x.shape[0], -1)
        index = np.concatenate([q * length + o + np.arange(sched.width) for q, o in zip(owners, offsets)])
        if index.size == whole.shape[axis] and np.array_equal(index, np.arange(index.size)):
            return whole  # the panels in the order the owners hold them
        return jnp.take(whole, jnp.asarray(index, dtype=jnp.int32), axis=axis)

    return lp.mm(gathered(a, ax["aK"], "c", sched.owner_col, sched.offset_a),
                 gathered(b, ax["bK"], "r", sched.owner_row, sched.offset_b))


def _summa(lp: LocalProblem, a: jax.Array, b: jax.Array) -> jax.Array:
    """``summa``: the ring of K panels on the grid (:func:`summa`), or both panels gathered (:func:`summa_one_shot`)."""
    return summa_one_shot(lp, a, b) if lp.kernel.schedule == "one_shot" else summa(lp, a, b)
