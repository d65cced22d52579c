"""The shard_map body of each algorithm (:data:`BODIES`) and :func:`body`,
which wraps one with the epilogue."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from . import common
from .common import Epilogue, LocalProblem, _rounds_in_the_gemm, varying_zeros
from .ring import ring_allgathers, ring_parts, ring_pieces, ring_reduce_scatters
from .grid import _summa
from .layered import summa25d


# One-shot schedules: AllGather+GEMM or GEMM+ReduceScatter as one whole collective and one GEMM: the moving
# operand all-gathered, then multiplied; or the whole partial product, then reduce-scattered (``psum_scatter``).
# What each rank ends with is what the ring leaves there (the collectives number the ranks as ``lax.axis_index``
# of ``lp.axis`` does, as the ring's blocks are numbered). Small products: one collective call instead of the
# ring's P - 1 (see :mod:`dmatmul._cost`).
#
# Every collective runs along the leading axis of what it moves: along the second one XLA's CPU collectives copy
# strided, 4-10x slower at n = 1024 (8 simulated devices). A block split along its stored second axis is gathered
# untiled, as a leading axis of blocks: a gathered free dimension (op(B)'s columns, op(A)'s rows) then lands in
# the GEMM's result as a reshape, a gathered K is laid out by a local transpose first; a result scattered over its
# columns is computed transposed (``op(B)^T op(A)^T``), scattered over its rows, and transposed back (one local
# block). What these copy is priced by each algorithm's ``copied`` and ``dot_transposed``.
def _reduce_scatter_one_shot(lp: LocalProblem, a: jax.Array, b: jax.Array) -> jax.Array:
    """GEMM+ReduceScatter as one GEMM of the whole partial product and one ``psum_scatter`` (one-shot, above)."""
    kern, ax, axis = lp.kernel, lp.axes, lp.axis
    if kern.d == "M":
        return lax.psum_scatter(lp.mm(a, b), axis, scatter_dimension=0, tiled=True)
    dt = common.contract(b, a, ax["bK"], ax["aK"], lp.precision, lp.acc_dtype)  # (N, M): the product transposed
    return lax.psum_scatter(dt, axis, scatter_dimension=0, tiled=True).T


def _allgather_one_shot(lp: LocalProblem, a: jax.Array, b: jax.Array) -> jax.Array:
    """AllGather+GEMM as one ``all_gather`` of the moving operand and one GEMM (one-shot, above)."""
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
            d = common.contract(a, g, ax["aK"], 1, lp.precision, lp.acc_dtype)
            return d.reshape(d.shape[0], -1)
        return lp.mm(a, laid(g))  # b stored (N, k): K blocks side by side
    stored = ax["aK"] if kern.a == "K" else ax["aM"]
    g = gathered(a, stored)
    if stored == 0:
        return lp.mm(g, b)
    if kern.a == "M":  # op(A) stored (K, m): blocks (P, K, m) -> (P, m, n), the result's row blocks in order
        d = common.contract(g, b, 1, ax["bK"], lp.precision, lp.acc_dtype)
        return d.reshape(-1, d.shape[-1])
    return lp.mm(laid(g), b)  # a stored (M, k): K blocks side by side


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
            return common.contract(a, b, ax["aK"], ax["bK"], lp.precision, ep.out_dtype)
        acc = product(lp, a, b)
        if ep is None:
            return acc
        rest_list = list(rest)
        c = rest_list.pop(0) if ep.use_c else None
        bias = rest_list.pop(0) if ep.has_bias else None
        if bias is not None and lp.bias_axis is not None:
            bias = lax.dynamic_slice_in_dim(bias, lax.axis_index(lp.bias_axis) * lp.bias_block, lp.bias_block)
        return common.finish(ep, acc, c, bias)

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


#: The shard_map body of each algorithm (:data:`dmatmul.algorithms.ALGORITHMS`) on more than one rank, by
#: name: ``f(lp, a, b)``, the accumulator of this rank's block of the result in the kernel's layout
#: (``lp.kernel``: its roles and schedule). A new algorithm registers its body here.
BODIES: dict[str, Callable[[LocalProblem, jax.Array, jax.Array], jax.Array]] = {
    "local": local,
    "allgather": allgather,
    "reduce_scatter": reduce_scatter,
    "allreduce": allreduce,
    "summa": _summa,
    "summa25d": summa25d,
}
