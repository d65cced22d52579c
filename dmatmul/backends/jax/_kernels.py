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

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import _epilogue
from ..._plan import Kernel

__all__ = [
    "BODIES",
    "Epilogue",
    "LocalProblem",
    "SummaSchedule",
    "body",
    "contract",
    "finish",
    "one_shot",
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
    "varying_zeros",
]


def traced_platform() -> str:
    """The platform of the devices being traced for: the abstract mesh's
    (inside ``shard_map`` or under ``jax.set_mesh``), else JAX's default."""
    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    return getattr(device, "platform", None) or jax.default_backend()


def contract(a: jax.Array, b: jax.Array, ka: int, kb: int, precision: Any, dtype: Any) -> jax.Array:
    """The 2-D product contracting axis ``ka`` of ``a`` with axis ``kb`` of ``b``
    (``a.T @ b`` is ``contract(a, b, 0, 0, ...)``), no transpose materialized;
    ``precision`` and ``dtype`` (``preferred_element_type``) as ``lax.dot_general``.

    On CPU, half-precision operands accumulated in float32 are widened first:
    XLA's CPU dot thunk refuses some BF16 x BF16 = F32 dots at run time
    ("UNIMPLEMENTED: Unsupported element type for DotThunk"), and the CPU has
    no half-precision GEMM to lose. The platform is the one the product runs
    on (the mesh being traced), not JAX's default backend: CPU devices of a
    GPU machine widen too."""
    if (dtype is not None and jnp.dtype(dtype) == jnp.float32 and traced_platform() == "cpu"
            and jnp.dtype(a.dtype).itemsize == 2 and jnp.dtype(b.dtype).itemsize == 2):
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return lax.dot_general(a, b, (((ka,), (kb,)), ((), ())), precision=precision, preferred_element_type=dtype)


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """``epilog(alpha * acc + beta * C + bias)``, cast to ``out_dtype``."""

    alpha: complex
    beta: complex
    epilog: str | None
    use_c: bool
    has_bias: bool
    out_dtype: Any
    bias_columns: bool = False  # one bias value per result column (a bias of shape (1, N)), not per row


def finish(ep: Epilogue, acc: jax.Array, c: jax.Array | None, bias: jax.Array | None) -> jax.Array:
    """Apply the epilogue to an accumulator (a local block or a global matrix)."""
    return _epilogue.apply(
        jnp, acc, alpha=ep.alpha, beta=ep.beta, c=c if ep.use_c else None, bias=bias if ep.has_bias else None,
        epilog=ep.epilog, out_dtype=ep.out_dtype, bias_columns=ep.bias_columns,
    )


@dataclasses.dataclass(frozen=True)
class SummaSchedule:
    """SUMMA's K panels: step ``t`` multiplies the ``width`` columns of op(A)
    held by grid column ``owner_col[t]`` at local offset ``offset_a[t]`` with the
    ``width`` rows of op(B) held by grid row ``owner_row[t]`` at ``offset_b[t]``."""

    width: int
    owner_col: tuple[int, ...]
    offset_a: tuple[int, ...]
    owner_row: tuple[int, ...]
    offset_b: tuple[int, ...]
    extent_a: int = 0  # local K extent the panels read (a shorter last panel reads zeros after it)
    extent_b: int = 0

    def longest_run(self) -> int:
        """The most k one grid column of op(A) and one grid row of op(B) hold at
        consecutive local positions: the widest textbook panel (``width``, their
        greatest common length, is 1 where uneven blocks cut K into runs such as
        18, 17, 1, 17, 17).

        >>> SummaSchedule(2, (0, 0, 1, 1, 1), (0, 2, 0, 2, 4), (0, 1, 1, 1, 1), (0, 0, 0, 2, 4)).longest_run()
        6
        """
        longest = run = 1
        for t in range(1, len(self.owner_col)):
            same = (self.owner_col[t], self.owner_row[t]) == (self.owner_col[t - 1], self.owner_row[t - 1])
            follows = (self.offset_a[t], self.offset_b[t]) == (self.offset_a[t - 1] + self.width,
                                                               self.offset_b[t - 1] + self.width)
            run = run + 1 if same and follows else 1
            longest = max(longest, run)
        return longest * self.width


@dataclasses.dataclass(frozen=True)
class LocalProblem:
    """What a body needs to know: ranks, transposes, padded block sizes."""

    kernel: Kernel
    nranks: int
    axis: Any  # the mesh axis (or axes) that enumerates the ranks
    transpose_a: bool
    transpose_b: bool
    block: dict[str, int]  # padded block length of each split logical dim ("M", "K", "N")
    acc_dtype: Any
    precision: Any
    bias_axis: Any = None  # the mesh axis splitting the result's dimension the bias runs along (sliced along it)
    bias_block: int = 0
    summa: SummaSchedule | None = None
    # whether a ring's next transfer may be issued beside the GEMM it does not feed (GPU, TPU:
    # XLA overlaps them). False on CPU, where XLA's collectives are synchronous, so nothing
    # overlaps anyway: each SUMMA step then receives its block and multiplies it, so the block
    # sent and the step's product never coexist (peak one block lower)
    overlap: bool = True

    @property
    def axes(self) -> dict[str, int]:
        """Axis of each logical dim in the stored local blocks."""
        ka = 0 if self.transpose_a else 1
        kb = 1 if self.transpose_b else 0
        return {"aK": ka, "aM": 1 - ka, "bK": kb, "bN": 1 - kb}

    def mm(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """op(a) @ op(b) in the accumulation dtype."""
        ax = self.axes
        return contract(a, b, ax["aK"], ax["bK"], self.precision, self.acc_dtype)

    def take(self, x: jax.Array, axis: int, dim: str, j: jax.Array, part: tuple[int, int] | None = None) -> jax.Array:
        """Block ``j`` of logical dim ``dim`` (stored axis ``axis``) of a local
        array; its positions ``start:stop`` only, given ``part``."""
        size = self.block[dim]
        start, stop = part or (0, size)
        return lax.dynamic_slice_in_dim(x, j * size + start, stop - start, axis=axis)

    @property
    def both_ways(self) -> bool:
        """Whether the ring runs both ways (:func:`ring_parts`)."""
        return self.kernel.schedule == "bidirectional"


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
        whole = lax.all_gather(x, over, axis=axis, tiled=True)
        index = np.concatenate([q * length + o + np.arange(sched.width) for q, o in zip(owners, offsets)])
        if index.size == whole.shape[axis] and np.array_equal(index, np.arange(index.size)):
            return whole  # the panels in the order the owners hold them
        return jnp.take(whole, jnp.asarray(index, dtype=jnp.int32), axis=axis)

    return lp.mm(gathered(a, ax["aK"], "c", sched.owner_col, sched.offset_a),
                 gathered(b, ax["bK"], "r", sched.owner_row, sched.offset_b))


def one_shot(lp: LocalProblem, a: jax.Array, b: jax.Array) -> jax.Array:
    """AllGather+GEMM or GEMM+ReduceScatter (``lp.kernel``) as one whole
    collective and one GEMM: the moving operand all-gathered, then multiplied;
    or the whole partial product, then reduce-scattered (``psum_scatter``).
    What each rank ends with is what the ring leaves there (the collectives
    number the ranks as ``lax.axis_index`` of ``lp.axis`` does, as the ring's
    blocks are numbered). Small products: one collective call instead of the
    ring's P - 1 (see :mod:`dmatmul._cost`).

    Every collective runs along the leading axis of what it moves: along the
    second one XLA's CPU collectives copy strided, 4-10x slower at n = 1024
    (8 simulated devices). A block split along its stored second axis is
    gathered untiled, as a leading axis of blocks: a gathered free dimension
    (op(B)'s columns, op(A)'s rows) then lands in the GEMM's result as a
    reshape, a gathered K is laid out by a local transpose first; a result
    scattered over its columns is computed transposed (``op(B)^T op(A)^T``),
    scattered over its rows, and transposed back (one local block)."""
    return (_reduce_scatter_one_shot if lp.kernel.moving is None else _allgather_one_shot)(lp, a, b)


def _reduce_scatter_one_shot(lp: LocalProblem, a: jax.Array, b: jax.Array) -> jax.Array:
    """GEMM+ReduceScatter as one GEMM of the whole partial product and one ``psum_scatter`` (:func:`one_shot`)."""
    kern, ax, axis = lp.kernel, lp.axes, lp.axis
    if kern.d == "M":
        return lax.psum_scatter(lp.mm(a, b), axis, scatter_dimension=0, tiled=True)
    dt = contract(b, a, ax["bK"], ax["aK"], lp.precision, lp.acc_dtype)  # (N, M): the product transposed
    return lax.psum_scatter(dt, axis, scatter_dimension=0, tiled=True).T


def _allgather_one_shot(lp: LocalProblem, a: jax.Array, b: jax.Array) -> jax.Array:
    """AllGather+GEMM as one ``all_gather`` of the moving operand and one GEMM (:func:`one_shot`)."""
    kern, ax, axis = lp.kernel, lp.axes, lp.axis

    def gathered(x: jax.Array, stored: int) -> jax.Array:
        """``x`` all-gathered along its stored axis ``stored``: tiled where that axis
        leads, else as blocks on a new leading axis."""
        return lax.all_gather(x, axis, axis=0, tiled=stored == 0)

    def laid(g: jax.Array) -> jax.Array:
        """Blocks ``(P, r, c)`` side by side: ``(r, P * c)``."""
        return jnp.moveaxis(g, 0, 1).reshape(g.shape[1], -1)

    if kern.moving == "b":
        stored = ax["bK"] if kern.b == "K" else ax["bN"]
        g = gathered(b, stored)
        if stored == 0:
            return lp.mm(a, g)
        if kern.b == "N":  # b (K, n): blocks (P, K, n) meet a -> (m, P, n), the result's column blocks in order
            d = contract(a, g, ax["aK"], 1, lp.precision, lp.acc_dtype)
            return d.reshape(d.shape[0], -1)
        return lp.mm(a, laid(g))  # b stored (N, k): K blocks side by side
    stored = ax["aK"] if kern.a == "K" else ax["aM"]
    g = gathered(a, stored)
    if stored == 0:
        return lp.mm(g, b)
    if kern.a == "M":  # op(A) stored (K, m): blocks (P, K, m) -> (P, m, n), the result's row blocks in order
        d = contract(g, b, 1, ax["bK"], lp.precision, lp.acc_dtype)
        return d.reshape(-1, d.shape[-1])
    return lp.mm(laid(g), b)  # a stored (M, k): K blocks side by side


def varying_zeros(shape: tuple[int, ...], dtype: Any, axis: Any) -> jax.Array:
    """Zeros typed as varying over ``axis`` (a name or tuple; ``()``: plain zeros),
    as a ``fori_loop`` carry that will hold varying values must be."""
    return lax.pcast(jnp.zeros(shape, dtype), axis, to="varying")


def _rounds_in_the_gemm(ep: Epilogue, acc_dtype: Any) -> bool:
    """Whether a local GEMM may write ``ep``'s result dtype itself: a plain
    product (alpha 1, no C, bias or activation) of a half precision accumulated
    in float32, on an accelerator (whose GEMMs accumulate half precisions in
    float32 and round once; on CPU :func:`contract` widens instead)."""
    out = jnp.dtype(ep.out_dtype)
    return (ep.alpha == 1 and not ep.use_c and not ep.has_bias and ep.epilog is None and out.itemsize == 2
            and out != jnp.dtype(acc_dtype) and traced_platform() != "cpu")


def body(lp: LocalProblem, ep: Epilogue | None) -> Callable[..., jax.Array]:
    """The shard_map body ``f(a, b[, c][, bias])`` for ``lp.kernel``.

    With ``ep`` the epilogue is fused (C and the result share a role); without,
    the body returns the accumulator and the caller finishes after moving it.
    """
    kern, p = lp.kernel, lp.nranks
    if kern.algorithm not in BODIES:
        raise ValueError(f"no JAX body for algorithm {kern.algorithm!r}: register one in _kernels.BODIES")
    # one rank: every algorithm is the local GEMM
    product = local if p == 1 else BODIES[kern.algorithm]

    def run(a: jax.Array, b: jax.Array, *rest: jax.Array) -> jax.Array:
        if ep is not None and product is local and _rounds_in_the_gemm(ep, lp.acc_dtype):
            # a plain half-precision GEMM: the GEMM writes the result's dtype (the library still accumulates in
            # float32, and rounds once, as the cast would), as jnp.dot does; a float32 result and a separate
            # cast cost 5-8% at n = 8192 on an H200
            ax = lp.axes
            return contract(a, b, ax["aK"], ax["bK"], lp.precision, ep.out_dtype)
        acc = product(lp, a, b)
        if ep is None:
            return acc
        rest_list = list(rest)
        c = rest_list.pop(0) if ep.use_c else None
        bias = rest_list.pop(0) if ep.has_bias else None
        if bias is not None and lp.bias_axis is not None:
            bias = lax.dynamic_slice_in_dim(bias, lax.axis_index(lp.bias_axis) * lp.bias_block, lp.bias_block)
        return finish(ep, acc, c, bias)

    return run


def local(lp: LocalProblem, a: jax.Array, b: jax.Array) -> jax.Array:
    """``local``: the GEMM of the blocks each rank holds."""
    return lp.mm(a, b)


def allreduce(lp: LocalProblem, a: jax.Array, b: jax.Array) -> jax.Array:
    """``allreduce``: the partial product of each rank's K slice, summed by one ``psum``."""
    return lax.psum(lp.mm(a, b), lp.axis)


def reduce_scatter(lp: LocalProblem, a: jax.Array, b: jax.Array) -> jax.Array:
    """``reduce_scatter``: each part of the result block summed around its own ring (or one-shot)."""
    kern, p, ax, axis = lp.kernel, lp.nranks, lp.axes, lp.axis
    if kern.schedule == "one_shot":
        return _reduce_scatter_one_shot(lp, a, b)
    if kern.d == "N":
        def partial(part: tuple[int, int]) -> Callable[[jax.Array], jax.Array]:
            return lambda j: lp.mm(a, lp.take(b, ax["bN"], "N", j, part))
    else:
        def partial(part: tuple[int, int]) -> Callable[[jax.Array], jax.Array]:
            return lambda j: lp.mm(lp.take(a, ax["aM"], "M", j, part), b)
    d_axis = 1 if kern.d == "N" else 0
    sums = ring_reduce_scatters(tuple((partial((start, stop)), -shift) for start, stop, shift
                                      in ring_parts(lp.block[kern.d], lp.both_ways)), p, axis)
    return sums[0] if len(sums) == 1 else lax.concatenate(sums, d_axis)


def allgather(lp: LocalProblem, a: jax.Array, b: jax.Array) -> jax.Array:
    """``allgather``: each part of the travelling block around its own ring (or one-shot)."""
    kern, p, ax, axis = lp.kernel, lp.nranks, lp.axes, lp.axis
    if kern.schedule == "one_shot":
        return _allgather_one_shot(lp, a, b)
    m_loc, n_loc = a.shape[ax["aM"]], b.shape[ax["bN"]]
    if kern.moving == "b" and kern.b == "N":  # write column block j of D's rows
        pieces = ring_pieces(b, ax["bN"], lp.both_ways)
        acc = varying_zeros((m_loc, n_loc * p), lp.acc_dtype, axis)

        def step(acc: jax.Array, i: int, blk: jax.Array, j: jax.Array) -> jax.Array:
            return lax.dynamic_update_slice_in_dim(acc, lp.mm(a, blk), j * n_loc + pieces[i][2], axis=1)
    elif kern.moving == "b":  # K blocks of b meet the matching K slice of a
        pieces = ring_pieces(b, ax["bK"], lp.both_ways)
        acc = varying_zeros((m_loc, n_loc), lp.acc_dtype, axis)

        def step(acc: jax.Array, i: int, blk: jax.Array, j: jax.Array) -> jax.Array:
            part = (pieces[i][2], pieces[i][2] + blk.shape[ax["bK"]])
            return acc + lp.mm(lp.take(a, ax["aK"], "K", j, part), blk)
    elif kern.a == "M":  # write row block j of D's columns
        pieces = ring_pieces(a, ax["aM"], lp.both_ways)
        acc = varying_zeros((m_loc * p, n_loc), lp.acc_dtype, axis)

        def step(acc: jax.Array, i: int, blk: jax.Array, j: jax.Array) -> jax.Array:
            return lax.dynamic_update_slice_in_dim(acc, lp.mm(blk, b), j * m_loc + pieces[i][2], axis=0)
    else:  # K blocks of a meet the matching K slice of b
        pieces = ring_pieces(a, ax["aK"], lp.both_ways)
        acc = varying_zeros((m_loc, n_loc), lp.acc_dtype, axis)

        def step(acc: jax.Array, i: int, blk: jax.Array, j: jax.Array) -> jax.Array:
            part = (pieces[i][2], pieces[i][2] + blk.shape[ax["aK"]])
            return acc + lp.mm(blk, lp.take(b, ax["bK"], "K", j, part))
    return ring_allgathers(tuple((pc, shift) for pc, shift, _ in pieces), acc, step, p, axis)


def _summa(lp: LocalProblem, a: jax.Array, b: jax.Array) -> jax.Array:
    """``summa``: the ring of K panels on the grid (:func:`summa`), or both panels gathered (:func:`summa_one_shot`)."""
    return summa_one_shot(lp, a, b) if lp.kernel.schedule == "one_shot" else summa(lp, a, b)


#: The shard_map body of each algorithm (:data:`dmatmul.algorithms.ALGORITHMS`) on more than one rank, by
#: name: ``f(lp, a, b)``, the accumulator of this rank's block of the result in the kernel's layout
#: (``lp.kernel``: its roles and schedule). A new algorithm registers its body here.
BODIES: dict[str, Callable[[LocalProblem, jax.Array, jax.Array], jax.Array]] = {
    "local": local,
    "allgather": allgather,
    "reduce_scatter": reduce_scatter,
    "allreduce": allreduce,
    "summa": _summa,
}
