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
from jax import lax

from ..._plan import Kernel
from ._layout import AXIS

__all__ = ["Epilogue", "LocalProblem", "body", "finish"]


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """``epilog(alpha * acc + beta * C + bias)``, cast to ``out_dtype``."""

    alpha: complex
    beta: complex
    epilog: str | None
    use_c: bool
    has_bias: bool
    out_dtype: Any


def finish(ep: Epilogue, acc: jax.Array, c: jax.Array | None, bias: jax.Array | None) -> jax.Array:
    """Apply the epilogue to an accumulator (a local block or a global matrix)."""
    x = acc if ep.alpha == 1 else acc * jnp.asarray(ep.alpha, acc.dtype)
    if ep.use_c and c is not None:
        x = x + jnp.asarray(ep.beta, acc.dtype) * c.astype(acc.dtype)
    if ep.has_bias and bias is not None:
        x = x + bias.astype(acc.dtype)[:, None]
    if ep.epilog in ("relu", "relu_bias"):
        x = jnp.maximum(x, jnp.zeros((), x.dtype))
    elif ep.epilog in ("gelu", "gelu_bias"):
        x = jax.nn.gelu(x, approximate=True)
    return x.astype(ep.out_dtype)


@dataclasses.dataclass(frozen=True)
class LocalProblem:
    """What a body needs to know: ranks, transposes, padded block sizes."""

    kernel: Kernel
    nranks: int
    transpose_a: bool
    transpose_b: bool
    block: dict[str, int]  # padded block length of each split logical dim ("M", "K", "N")
    acc_dtype: Any
    precision: Any

    @property
    def axes(self) -> dict[str, int]:
        """Axis of each logical dim in the stored local blocks."""
        ka = 0 if self.transpose_a else 1
        kb = 1 if self.transpose_b else 0
        return {"aK": ka, "aM": 1 - ka, "bK": kb, "bN": 1 - kb}

    def mm(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """op(a) @ op(b) in the accumulation dtype."""
        ax = self.axes
        return lax.dot_general(
            a,
            b,
            (((ax["aK"],), (ax["bK"],)), ((), ())),
            precision=self.precision,
            preferred_element_type=self.acc_dtype,
        )

    def take(self, x: jax.Array, axis: int, dim: str, j: jax.Array) -> jax.Array:
        """Block ``j`` of logical dim ``dim`` (stored axis ``axis``) of a local array."""
        size = self.block[dim]
        return lax.dynamic_slice_in_dim(x, j * size, size, axis=axis)


def ring_allgather(
    block: jax.Array,
    acc: jax.Array,
    step: Callable[[jax.Array, jax.Array, jax.Array], jax.Array],
    p: int,
) -> jax.Array:
    """``step(acc, block_j, j)`` over every block ``j`` of the ring, sending left."""
    idx = lax.axis_index(AXIS)
    perm = [(i, (i - 1) % p) for i in range(p)]

    def one(s: int | jax.Array, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        acc, blk = carry
        nxt = lax.ppermute(blk, AXIS, perm)
        return step(acc, blk, (idx + s) % p), nxt

    acc, block = lax.fori_loop(0, p - 1, one, (acc, block))
    return step(acc, block, (idx + p - 1) % p)


def ring_reduce_scatter(partial: Callable[[jax.Array], jax.Array], p: int) -> jax.Array:
    """Sum over ranks of ``partial(j)``, rank ``r`` keeping block ``j = r``; sends right."""
    idx = lax.axis_index(AXIS)
    perm = [(i, (i + 1) % p) for i in range(p)]

    def one(s: int | jax.Array, acc: jax.Array) -> jax.Array:
        contribution = partial((idx - s - 1) % p)
        return lax.ppermute(acc, AXIS, perm) + contribution

    return lax.fori_loop(1, p, one, partial((idx - 1) % p))


def _varying_zeros(shape: tuple[int, ...], dtype: Any) -> jax.Array:
    return lax.pcast(jnp.zeros(shape, dtype), AXIS, to="varying")


def body(lp: LocalProblem, ep: Epilogue | None) -> Callable[..., jax.Array]:
    """The shard_map body ``f(a, b[, c][, bias])`` for ``lp.kernel``.

    With ``ep`` the epilogue is fused (C and the result share a role); without,
    the body returns the accumulator and the caller finishes after moving it.
    """
    kern, p, ax = lp.kernel, lp.nranks, lp.axes

    def product(a: jax.Array, b: jax.Array) -> jax.Array:
        if kern.algorithm == "local":
            return lp.mm(a, b)
        if kern.algorithm == "allreduce":
            return lax.psum(lp.mm(a, b), AXIS)
        if kern.algorithm == "reduce_scatter":
            if kern.d == "N":
                return ring_reduce_scatter(lambda j: lp.mm(a, lp.take(b, ax["bN"], "N", j)), p)
            return ring_reduce_scatter(lambda j: lp.mm(lp.take(a, ax["aM"], "M", j), b), p)
        if kern.algorithm == "allgather":
            m_loc, n_loc = a.shape[ax["aM"]], b.shape[ax["bN"]]
            if kern.moving == "b" and kern.b == "N":  # write column block j of D's rows
                return ring_allgather(
                    b,
                    _varying_zeros((m_loc, n_loc * p), lp.acc_dtype),
                    lambda acc, blk, j: lax.dynamic_update_slice_in_dim(acc, lp.mm(a, blk), j * n_loc, axis=1),
                    p,
                )
            if kern.moving == "b":  # K blocks of b meet the matching K slice of a
                return ring_allgather(
                    b,
                    _varying_zeros((m_loc, n_loc), lp.acc_dtype),
                    lambda acc, blk, j: acc + lp.mm(lp.take(a, ax["aK"], "K", j), blk),
                    p,
                )
            m_blk = a.shape[ax["aM"]]
            if kern.a == "M":  # write row block j of D's columns
                return ring_allgather(
                    a,
                    _varying_zeros((m_blk * p, n_loc), lp.acc_dtype),
                    lambda acc, blk, j: lax.dynamic_update_slice_in_dim(acc, lp.mm(blk, b), j * m_blk, axis=0),
                    p,
                )
            return ring_allgather(
                a,
                _varying_zeros((m_blk, n_loc), lp.acc_dtype),
                lambda acc, blk, j: acc + lp.mm(blk, lp.take(b, ax["bK"], "K", j)),
                p,
            )
        raise ValueError(f"no JAX body for algorithm {kern.algorithm!r}")

    def run(a: jax.Array, b: jax.Array, *rest: jax.Array) -> jax.Array:
        acc = product(a, b)
        if ep is None:
            return acc
        rest_list = list(rest)
        c = rest_list.pop(0) if ep.use_c else None
        bias = rest_list.pop(0) if ep.has_bias else None
        if bias is not None and kern.d == "M":
            bias = lp.take(bias, 0, "M", lax.axis_index(AXIS))
        return finish(ep, acc, c, bias)

    return run
