"""A batched product run as ONE matrix product, where that is exact.

Where only a holds a batch (b shared by every item), the items' rows are
rows of one product: ``(B, M, K) @ (K, N)`` is ``(B*M, K) @ (K, N)``, the
batch folded into M; where only b does, the items' columns are columns of
one, the batch folded into N. One distributed GEMM of the folded size then
runs in place of B (:class:`dmatmul._batched.LoopPlan`), for backends with no
batched program of their own (nvmath: cuBLASMp has no batched GEMM; JAX
under mpiexec).

Under several processes every rank holds the whole batch of its blocks
(contract 3a): rank r's local a block ``(B, m_r, K)`` reshaped to
``(B*m_r, K)`` is its block of a folded matrix whose rows are the items'
rows in *some* order. The fold is exact when the distributions, applied to
the folded shapes, give every rank exactly ``B`` times its rows (so its
reshaped block is its block of the folded matrix) and place each folded row
alike for a, c and the result (so each rank's result block, reshaped back,
is its block of each item's result): :func:`_order` checks that rank by
rank, on the distributions' own indices (nvmath's uneven rule included). The
permutation it finds places the global bias (the one input every rank passes
whole).

An uneven Slab along the folded dimension (a's and the result's: M = 7 over
2 ranks, 4 + 3 rows) gives ranks ``B*m_r`` rows (12 + 9) that the folded
Slab does not (11 + 10). It folds padded (:class:`Pad`): each rank's part of
every item is padded with zero rows (columns) to the longest, ``ceil(M/P)``,
so the items are ``P*ceil(M/P)`` long and split evenly; the folded product
then computes at most ``P - 1`` rows per item more, and each rank drops its
padding's rows from its result block. Exact: a zero row of A (and of C)
makes a result row of its own, which nothing else reads.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np

from ._distribution import Slab, slab_extent
from ._problem import Spec
from ._spec import Operands, array_module, family

__all__ = ["Fold", "fold_of"]


@dataclasses.dataclass(frozen=True, eq=False)
class Fold:
    """How a batched ``spec`` runs as one matrix product :attr:`spec`: its
    ``count`` items stacked along ``axis`` ("m": a's rows, b shared; "n": b's
    columns, a shared); ``order[j]``: the item row (column) ``item*S + i``
    that folded row (column) j holds, None where it is ``j`` itself."""

    batched: Spec
    spec: Spec
    axis: str
    count: int
    order: np.ndarray | None
    pad: Pad | None = None

    @property
    def copies(self) -> tuple[str, ...]:
        """The operands that fold by a local copy (their batch moved next to the
        folded dimension) rather than a reshape."""
        s = self.batched
        if self.axis == "m":
            return tuple(n for n, copied in (("a", s.transpose_a),) if copied)
        return tuple(n for n, copied in (("b", not s.transpose_b), ("c", s.use_c), ("the result", True)) if copied)

    def line(self) -> str:
        s, f = self.batched, self.spec
        stacked = "a's items stacked along M, b shared" if self.axis == "m" else "b's items stacked along N, a shared"
        copies = f"; {', '.join(self.copies)} copied to fold" if self.copies else ""
        order = "" if self.order is None else "; each rank's blocks keep their rows, in the folded order"
        if self.pad is not None:
            what = "rows" if self.axis == "m" else "columns"
            order += (f"; each rank's {what} of an item padded with zeros to {self.pad.local} (the {self.pad.size} "
                      f"split unevenly: {self.pad.padded} per item folded, the padding's results dropped)")
        return (f"batch:      {s.batch_shape} ({s.batch_size} items of {s.m} x {s.k} @ {s.k} x {s.n}): folded into "
                f"one {f.m} x {f.k} @ {f.k} x {f.n} product ({stacked}{copies}{order}); the batch is not split "
                "over ranks")

    # -- the operands -------------------------------------------------------------------------------------------
    def operands(self, ops: Operands) -> Operands:
        """The folded product's operands: this call's (local blocks under mpiexec)."""
        s, count, pad = self.batched, self.count, self.pad
        a, b, c = ops.a, ops.b, ops.c if s.use_c else None
        if pad is not None:  # (each rank's part of every item made as long as the longest: an even split)
            if self.axis == "m":
                a = _padded(a, -1 if s.transpose_a else -2, pad.local)
            else:
                b = _padded(b, -2 if s.transpose_b else -1, pad.local)
            c = None if c is None else _padded(c, -2 if self.axis == "m" else -1, pad.local)
        if self.axis == "m":
            a, b = _stack(a, count, 1 if s.transpose_a else 0), _matrix(b)
        else:
            a, b = _matrix(a), _stack(b, count, 0 if s.transpose_b else 1)
        c = None if c is None else _stack(c, count, 0 if self.axis == "m" else 1)
        return Operands(a, b, c, self._bias(ops.bias) if s.has_bias else ops.bias)

    def _bias(self, bias: Any) -> Any:
        """The folded bias: a bias along the folded dimension (every item's,
        tiled, or one per item, stacked) in the folded order; one along the
        other dimension is every item's as it is."""
        s, count = self.batched, self.count
        if s.bias_columns != (self.axis == "n"):
            return bias if bias.ndim <= 2 else _matrix(bias)
        xp = array_module(family(bias))
        along = 0 if self.axis == "m" else 1
        if self.pad is not None:  # every item's vector in the padded item's places (the padding's: dropped)
            at = 0 if bias.ndim == 1 else along - 2
            bias = xp.take(bias, xp.asarray(self.pad.source), axis=at)
        if bias.ndim > 2:  # one per item: (..., M, 1) or (..., 1, N)
            bias = _stack(bias, count, along)
        elif bias.ndim == 1:
            bias = xp.tile(bias, count)
        else:
            bias = xp.tile(bias, (count, 1) if along == 0 else (1, count))
        return bias if self.order is None else xp.take(bias, xp.asarray(self.order), axis=along)

    def result(self, d: Any, ops: Operands | None = None) -> Any:
        """The folded product's result (block) as the batch's; ``ops``: the
        batch's operands (this rank's blocks), where the fold pads (the
        padding's rows or columns are dropped)."""
        s, count = self.batched, self.count
        xp = array_module(family(d))
        rows, cols = d.shape
        held = None
        if self.pad is not None:
            assert ops is not None
            held = ops.a.shape[-1 if s.transpose_a else -2] if self.axis == "m" else \
                ops.b.shape[-2 if s.transpose_b else -1]
        if self.axis == "m":
            d = d.reshape(count, rows // count, cols)
            d = d if held is None else d[:, :held]
        else:
            d = xp.moveaxis(d.reshape(rows, count, cols // count), 1, 0)
            d = d if held is None else d[:, :, :held]
        contiguous = getattr(xp, "ascontiguousarray", None)  # (jax.Arrays have no strides to fix)
        d = d if contiguous is None else contiguous(d)
        return d.reshape(s.batch_shape + tuple(d.shape[1:]))


@dataclasses.dataclass(frozen=True, eq=False)
class Pad:
    """An uneven Slab along the folded dimension made even: each rank's part
    of an item (``S//P`` or one more) padded with zeros to ``local`` (the
    longest), the item then ``padded = P*local`` long; ``source[j]``: the item
    index that padded index j holds (a padding's: any, its result dropped)."""

    size: int
    padded: int
    local: int
    source: np.ndarray


def _padded(x: Any, axis: int, to: int) -> Any:
    """``x`` with zeros appended along ``axis`` up to ``to``."""
    short = to - x.shape[axis]
    if short == 0:
        return x
    xp = array_module(family(x))
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, short)
    return xp.pad(x, widths)


def _matrix(x: Any) -> Any:
    """A shared operand (its batch dimensions all of size 1, or none) as its matrix."""
    return x if x.ndim == 2 else x.reshape(x.shape[-2:])


def _stack(x: Any, count: int, dim: int) -> Any:
    """``x``'s ``count`` matrices as one, stacked along matrix dimension ``dim``
    in item order (a view along the rows where ``x`` is contiguous; a copy
    along the columns)."""
    r0, r1 = x.shape[-2:]
    x = x.reshape((count, r0, r1))
    if dim == 0:
        return x.reshape(count * r0, r1)
    xp = array_module(family(x))
    return xp.moveaxis(x, 0, 1).reshape(r0, count * r1)


# --------------------------------------------------------------------------- #
# whether a batched product folds
# --------------------------------------------------------------------------- #
@functools.lru_cache(maxsize=64)  # (a batched product is planned at every call: the ranks' indices once)
def fold_of(spec: Spec) -> Fold | str:
    """The :class:`Fold` of a batched ``spec`` (A and B read), or why it does
    not fold (said in explain())."""
    items_a = math.prod(spec.a_shape[:-2])
    items_b = math.prod(spec.b_shape[:-2])
    if items_b == 1:
        axis = "m"
    elif items_a == 1:
        axis = "n"
    else:
        return "a and b both hold a batch: their items share no operand"
    count = spec.batch_size
    if spec.has_bias and spec.bias_shape is not None and len(spec.bias_shape) > 2 \
            and spec.bias_columns != (axis == "n"):
        per = "column" if spec.bias_columns else "row"
        along = "rows" if axis == "m" else "columns"
        return f"the bias holds one {per} vector per item, and the items are stacked along their {along}"
    dists = spec.distributions
    if dists is not None and any(d.ndim != 2 for d in dists):
        return "a distribution lays out more than the matrices"
    folded = _folded_spec(spec, axis, count)
    order: np.ndarray | None = None
    pad: Pad | None = None
    if dists is not None and count > 1:
        found = _agreed_order(spec, folded, axis, count)
        if isinstance(found, str):
            pad = _pad(spec, axis)
            if pad is None:
                return found
            even = _resized(spec, axis, pad.padded)
            folded = _folded_spec(even, axis, count)
            found = _agreed_order(even, folded, axis, count)
            if isinstance(found, str):
                return found
        order = None if np.array_equal(found, np.arange(found.size)) else found
    return Fold(spec, folded, axis, count, order, pad)


def _pad(spec: Spec, axis: str) -> Pad | None:
    """Where the operand along the folded dimension (a's M, b's N) and the
    result are an uneven Slab along it (nvmath's rule: the first ``S%P``
    ranks one more), the padding that makes it even; else None. (Each rank
    then holds ``B*local`` rows of an even folded Slab: the fold is exact.)"""
    assert spec.distributions is not None
    dist_a, dist_b, dist_d = spec.distributions
    if axis == "m":
        dist, dim, size = dist_a, (1 if spec.transpose_a else 0), spec.m
    else:
        dist, dim, size = dist_b, (0 if spec.transpose_b else 1), spec.n
    along = 0 if axis == "m" else 1
    if not (isinstance(dist, Slab) and dist.dim == dim and isinstance(dist_d, Slab) and dist_d.dim == along):
        return None
    p = spec.nprocs
    local = -(-size // p)
    if local * p == size:
        return None
    source = np.zeros(local * p, dtype=np.int64)
    for rank in range(p):
        start, length = slab_extent(size, p, rank)
        source[rank * local:rank * local + length] = np.arange(start, start + length)
    return Pad(size, local * p, local, source)


def _resized(spec: Spec, axis: str, size: int) -> Spec:
    """``spec`` with M (axis "m") or N ("n") ``size`` long, in every operand."""
    def put(shape: tuple[int, ...], at: int) -> tuple[int, ...]:
        out = list(shape)
        out[at] = size
        return tuple(out)

    a, b, c, bias = spec.a_shape, spec.b_shape, spec.c_shape, spec.bias_shape
    if axis == "m":
        a = put(a, -1 if spec.transpose_a else -2)
    else:
        b = put(b, -2 if spec.transpose_b else -1)
    c = None if c is None else put(c, -2 if axis == "m" else -1)
    if bias is not None and spec.bias_columns == (axis == "n"):
        bias = put(bias, -1 if len(bias) == 1 or axis == "n" else -2)
    return dataclasses.replace(spec, a_shape=a, b_shape=b, c_shape=c, bias_shape=bias)


def _folded_spec(spec: Spec, axis: str, count: int) -> Spec:
    item = spec.item()
    (a0, a1), (b0, b1) = item.a_shape, item.b_shape
    if axis == "m":
        a_shape, b_shape = ((a0, a1 * count) if spec.transpose_a else (a0 * count, a1)), (b0, b1)
        m, n = spec.m * count, spec.n
    else:
        a_shape, b_shape = (a0, a1), ((b0 * count, b1) if spec.transpose_b else (b0, b1 * count))
        m, n = spec.m, spec.n * count
    bias = item.bias_shape
    if bias is not None and spec.bias_columns == (axis == "n"):
        bias = (m,) if len(bias) == 1 else (m, 1) if axis == "m" else (1, n)
    return dataclasses.replace(item, a_shape=a_shape, b_shape=b_shape,
                               c_shape=None if spec.c_shape is None else (m, n), bias_shape=bias)


def _agreed_order(spec: Spec, folded: Spec, axis: str, count: int) -> np.ndarray | str:
    """The folded order that every operand along the folded dimension (a's M
    or b's N, and the result's, c's with it) gives alike, or why there is none."""
    assert spec.distributions is not None
    dist_a, dist_b, dist_d = spec.distributions
    if axis == "m":
        name, dist, dim = "a", dist_a, (1 if spec.transpose_a else 0)
    else:
        name, dist, dim = "b", dist_b, (0 if spec.transpose_b else 1)
    shape = spec.shapes[name]
    ours = _order(dist, shape, dim, count, spec.nprocs)
    theirs = _order(dist_d, (spec.m, spec.n), 0 if axis == "m" else 1, count, spec.nprocs)
    what = "rows" if axis == "m" else "columns"
    for who, found, d in ((name, ours, dist), ("the result", theirs, dist_d)):
        if found is None:
            return (f"{who}'s distribution {d!r}, over {count} times the {what}, does not give each rank "
                    f"{count} times its {what} of one item")
    assert ours is not None and theirs is not None
    if not np.array_equal(ours, theirs):
        return (f"{name}'s distribution {dist!r} and the result's {dist_d!r} place the {what} of the folded "
                "product on different ranks")
    return ours


def _order(dist: Any, shape: tuple[int, int], dim: int, count: int, nranks: int) -> np.ndarray | None:
    """Where ``dist``, applied to ``shape`` with dimension ``dim`` ``count``
    times longer, makes every rank's block the stack of its ``count`` item
    blocks (its indices along ``dim`` ``count`` times as many, the others the
    same): ``order[j]``, the item index ``item*S + i`` that folded index j
    holds, alike on every rank holding it. Else None."""
    size = shape[dim]
    big = list(shape)
    big[dim] = size * count
    order = np.full(size * count, -1, dtype=np.int64)
    stack = np.arange(count, dtype=np.int64)[:, None] * size
    for rank in range(nranks):
        ids = np.asarray(dist.global_indices(rank, shape, nranks)[dim], dtype=np.int64)
        fold = np.asarray(dist.global_indices(rank, tuple(big), nranks)[dim], dtype=np.int64)
        if fold.size != count * ids.size:
            return None
        want = (stack + ids[None, :]).reshape(-1)
        seen = order[fold]
        if np.any((seen >= 0) & (seen != want)):
            return None
        order[fold] = want
    if np.any(order < 0) or np.unique(order).size != order.size:
        return None
    return order
