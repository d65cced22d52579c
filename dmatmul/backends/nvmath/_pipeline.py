"""The array work around the nvmath call, for one rank: generic over numpy and cupy.

A :class:`~._translate.Translation` says what to hand over; this module does
it on the arrays of one rank, with ``xp`` the array module of the operands
(numpy for host operands, which nvmath copies to the GPU and back; cupy for
device operands). Nothing here imports nvmath, so the whole pipeline runs on
CPU against a simulated cuBLASMp in the tests.

* :func:`prepare` -- the local blocks nvmath receives: a view where the
  translation promises one (a Fortran-order block as it is, a C-order block as
  its transposed view), else a copy (padding, cutting a Replicated operand,
  memory order).
* :func:`finish` -- from nvmath's local result to dmatmul's: un-transpose
  (swapped frame), strip padding, apply the epilogue dmatmul owns.
* :func:`assemble` -- the allgathered result blocks as one replicated matrix.

Index bookkeeping uses only dmatmul's own distributions: every block's rows
and columns are global ids (``Distribution.global_indices``), nvmath's padded
layout is an :class:`~._translate.NvDistribution` over the padded extents, and
a :class:`~._translate.DimPlan` (a :class:`dmatmul._dimmap.DimMap`) maps padded positions back to real ids.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ... import _epilogue
from ..._epilogue import has_bias
from ..._distribution import join
from ._translate import Handover, Translation, as_dense, dense

__all__ = ["Prepared", "prepare", "localize", "fused_bias", "finish", "post_epilogue", "assemble", "Selection", "Program"]

Selection = Any  # a slice or an integer index array


def _selection(ids: np.ndarray, size: int | None = None) -> Selection:
    """A slice when ``ids`` is a contiguous increasing range, else the array itself."""
    if len(ids) == 0:
        return slice(0, 0)
    if ids[-1] - ids[0] == len(ids) - 1 and np.all(np.diff(ids) == 1):
        return slice(int(ids[0]), int(ids[-1]) + 1)
    return ids


def _is_full(sel: Selection, size: int) -> bool:
    return isinstance(sel, slice) and sel.start in (0, None) and sel.stop == size


def _locate(held: np.ndarray, wanted: np.ndarray, what: str) -> np.ndarray:
    """Local positions in ``held`` (sorted global ids) of the global ids ``wanted``."""
    wanted = np.asarray(wanted)
    if wanted.size == 0:
        return np.zeros(0, dtype=np.int64)
    pos = np.searchsorted(held, wanted)
    if len(held) == 0 or np.any(pos >= len(held)) or np.any(held[np.minimum(pos, len(held) - 1)] != wanted):
        raise RuntimeError(f"dmatmul internal error: {what} does not hold the global ids it must hand over")
    return pos


def _index(xp: Any, sel: Selection) -> Any:
    return sel if isinstance(sel, slice) else xp.asarray(sel)


def _take(xp: Any, x: Any, rows: Selection, cols: Selection) -> Any:
    if isinstance(rows, slice) or isinstance(cols, slice):
        return x[_index(xp, rows), _index(xp, cols)]
    return x[xp.ix_(xp.asarray(rows), xp.asarray(cols))]


def _put(xp: Any, y: Any, rows: Selection, cols: Selection, value: Any) -> None:
    if isinstance(rows, slice) or isinstance(cols, slice):
        y[_index(xp, rows), _index(xp, cols)] = value
    else:
        y[xp.ix_(xp.asarray(rows), xp.asarray(cols))] = value


@dataclasses.dataclass(frozen=True)
class AxisMap:
    """Which source rows (or columns) go to which destination rows."""

    src: Selection
    dst: Selection
    size: int  # destination extent

    def full(self, src_size: int) -> bool:
        """Destination = source, nothing moved."""
        return self.size == src_size and _is_full(self.src, src_size) and _is_full(self.dst, self.size)


def _axis_map(src_ids: np.ndarray, dst_padded: np.ndarray, real_of_padded: np.ndarray | None, what: str) -> AxisMap:
    real = dst_padded if real_of_padded is None else real_of_padded[dst_padded]
    keep = np.nonzero(real >= 0)[0]
    src = _locate(src_ids, real[keep], what)
    return AxisMap(_selection(src), _selection(keep), len(dst_padded))


def localize(h: Handover, tr: Translation, rank: int, x: Any, xp: Any) -> tuple[Any, bool]:
    """The block of ``x`` (this rank's block of user operand ``h.operand``)
    that nvmath receives, and whether it is a copy.

    Returns the array in nvmath's orientation: ``y`` itself for a Fortran-order
    handover, ``y.T`` for a transposed one (an F-order view of C-order ``y``).
    """
    rmap, cmap, target = _handover_maps(tr, h, rank)
    copied = False
    if rmap.full(x.shape[0]) and cmap.full(x.shape[1]):
        y = x
    elif _is_full(rmap.dst, rmap.size) and _is_full(cmap.dst, cmap.size) and isinstance(rmap.src, slice) \
            and isinstance(cmap.src, slice):
        y = x[rmap.src, cmap.src]  # a contiguous part: a view
    else:
        order = "C" if h.transposed or (target is None and dense(x, "C")) else "F"
        y = xp.zeros((rmap.size, cmap.size), dtype=x.dtype, order=order)
        _put(xp, y, rmap.dst, cmap.dst, _take(xp, x, rmap.src, cmap.src))
        copied = True
    if target is None:  # cuBLASLt takes either order
        if not (dense(y, "C") or dense(y, "F")):
            y, copied = as_dense(xp, y, "C")[0], True
        return y, copied
    y, again = as_dense(xp, y, "C" if h.transposed else "F")
    return (y.T if h.transposed else y), copied or again


@dataclasses.dataclass
class Prepared:
    """What one rank hands to the engine: nvmath slots A, B, C and the fused
    epilog's bias (all in nvmath's orientation), and which were copied."""

    A: Any
    B: Any
    C: Any = None
    bias: Any = None
    copied: dict[str, bool] = dataclasses.field(default_factory=dict)


def _fused_bias_sources(tr: Translation, rank: int) -> np.ndarray:
    """For each local row of nvmath's result, the index in the user's bias of
    its value (-1: a padded row). nvmath's result is D, or D.T in the swapped
    frame, whose rows are D's columns: a bias per column of D (shape (1, N))
    is fused only there (:func:`._translate._epilog.epilogs`)."""
    p = tr.problem
    if tr.engine == "cublaslt":
        assert not p.bias_columns
        rows, _ = tr.computed.global_indices(rank, (p.m, p.n), p.nranks)
        return np.asarray(rows)
    assert tr.result is not None and tr.swapped == p.bias_columns
    dim = tr.dim("N" if tr.swapped else "M")
    padded_rows, _ = tr.result.as_dmatmul().global_indices(rank, tr.result_shape)
    return dim.sources[padded_rows] if dim.padding else padded_rows


def _post_bias(tr: Translation, rows: np.ndarray, cols: np.ndarray) -> Any:
    """Where this rank's post-epilogue bias values are in the user's bias: at
    its result block's rows, or columns for a bias per column."""
    return _selection(cols if tr.problem.bias_columns else rows)


def fused_bias(tr: Translation, rank: int, bias: Any, xp: Any, dtype: Any) -> Any:
    """The bias vector of the fused epilog on this rank: one value per local
    row of nvmath's result (cuBLASMp's bias is local), zero on padded rows."""
    bias = xp.asarray(bias).reshape(-1)
    real = _fused_bias_sources(tr, rank)
    if tr.engine == "cublaslt":
        return xp.ascontiguousarray(bias[_index(xp, _selection(real))].astype(dtype))
    keep = np.nonzero(real >= 0)[0]
    if len(keep) == len(real) and isinstance(_selection(real), slice):
        return xp.ascontiguousarray(bias[_index(xp, _selection(real))].astype(dtype))
    out = xp.zeros(len(real), dtype=dtype)
    out[xp.asarray(keep)] = bias[xp.asarray(real[keep])].astype(dtype)
    return out


def prepare(tr: Translation, rank: int, a: Any, b: Any, c: Any, bias: Any, xp: Any) -> Prepared:
    """This rank's nvmath operands for ``tr`` (user operands ``a``, ``b``, ``c``, ``bias``)."""
    arrays = {"a": a, "b": b, "c": c}
    slots: dict[str, Any] = {}
    copied: dict[str, bool] = {}
    for h in tr.handovers:
        y, was_copied = localize(h, tr, rank, arrays[h.operand], xp)
        slots[h.slot] = y
        copied[h.operand] = was_copied
    fb = None
    if tr.fused_epilog not in (None, "ALLREDUCE") and has_bias(tr.problem.epilog):
        fb = fused_bias(tr, rank, bias, xp, a.dtype)
    return Prepared(slots["A"], slots["B"], slots.get("C"), fb, copied)


def post_epilogue(
    xp: Any, d: Any, *, beta: complex, c: Any, bias: Any, epilog: str | None, dtype: Any, bias_columns: bool = False
) -> Any:
    """``epilog(d + beta*c + bias)`` on a local block (half precisions in float32); ``bias`` one value per row,
    or per column with ``bias_columns``."""
    return _epilogue.apply(xp, d, beta=beta, c=c, bias=bias, epilog=epilog, out_dtype=dtype, bias_columns=bias_columns)


def _handover_maps(tr: Translation, h: Handover, rank: int) -> tuple[Any, Any, Any]:
    """Where this rank's block of ``h.operand`` goes in what nvmath receives:
    the row and column maps, and the padded target (None for the cuBLASLt
    engine, which takes the target split of the real matrix)."""
    p = tr.problem
    shape = p.global_shape(h.operand)
    src_rows, src_cols = h.source.global_indices(rank, shape, p.nranks)
    target = h.target_padded()
    what = f"the block of {h.operand}"
    if target is None:
        dst_rows, dst_cols = h.target.global_indices(rank, shape, p.nranks)
        return _axis_map(src_rows, dst_rows, None, what), _axis_map(src_cols, dst_cols, None, what), None
    dr, dc = tr.dim(h.dims[0]), tr.dim(h.dims[1])
    dst_rows, dst_cols = target.as_dmatmul().global_indices(rank, (dr.padded_size, dc.padded_size))
    rmap = _axis_map(src_rows, dst_rows, dr.sources if dr.padding else None, what)
    cmap = _axis_map(src_cols, dst_cols, dc.sources if dc.padding else None, what)
    return rmap, cmap, target


def _result_selection(tr: Translation, rank: int, rows: np.ndarray, cols: np.ndarray) -> tuple[Any, Any, tuple[int, int]]:
    """Where this rank's result block (global ``rows`` x ``cols``) lies in the
    block nvmath returns (user orientation): row and column selections, and
    that block's shape."""
    dm, dn = tr.dim("M"), tr.dim("N")
    if tr.path == "GEMM+AR":
        prow, pcol = np.arange(dm.padded_size), np.arange(dn.padded_size)
    else:
        res = tr.result_padded_user()
        assert res is not None
        prow, pcol = res.as_dmatmul().global_indices(rank, (dm.padded_size, dn.padded_size))
    rsel = _selection(_locate(prow, dm.positions[rows] if dm.padding else rows, "the result block"))
    csel = _selection(_locate(pcol, dn.positions[cols] if dn.padding else cols, "the result block"))
    return rsel, csel, (len(prow), len(pcol))


def finish(tr: Translation, rank: int, d_nv: Any, c: Any, bias: Any, xp: Any) -> Any:
    """dmatmul's local result block (of ``tr.computed``) from nvmath's result.

    ``c`` and ``bias`` are the user's (this rank's block of c, the whole bias);
    they are read only for the epilogue dmatmul applies itself.
    """
    p = tr.problem
    rows, cols = tr.computed.global_indices(rank, (p.m, p.n), p.nranks)
    if tr.engine == "cublaslt":
        d = d_nv
    else:
        d_user = d_nv.T if tr.swapped else d_nv
        rsel, csel, _ = _result_selection(tr, rank, rows, cols)
        if _is_full(rsel, d_user.shape[0]) and _is_full(csel, d_user.shape[1]):
            d = d_user
        else:
            d = _take(xp, d_user, rsel, csel).copy()  # compact: do not keep the padded buffer alive
    if tr.post_beta_c or tr.post_epilog:
        c_block = None
        if tr.post_beta_c and c is not None:
            crows, ccols = p.distributions[2].global_indices(rank, (p.m, p.n), p.nranks)
            c_block = _take(xp, c, _selection(_locate(crows, rows, "c")), _selection(_locate(ccols, cols, "c")))
        b_block = None
        if has_bias(tr.post_epilog):
            b_block = xp.asarray(bias).reshape(-1)[_index(xp, _post_bias(tr, rows, cols))]
        d = post_epilogue(xp, d, beta=p.beta, c=c_block, bias=b_block, epilog=tr.post_epilog, dtype=d.dtype,
                          bias_columns=p.bias_columns)
    return d


def assemble(tr: Translation, blocks: list[np.ndarray]) -> np.ndarray:
    """The replicated result from every rank's block of ``tr.computed`` (host arrays)."""
    p = tr.problem
    return join(blocks, tr.computed, (p.m, p.n)).astype(blocks[0].dtype, copy=False)


# --------------------------------------------------------------------------- #
# the same work decided once: a per-rank hand-over program
# --------------------------------------------------------------------------- #
class _Slot:
    """One handover decided at plan time: the user's block as it is, a view
    of it, or a staging buffer (allocated once; its padding stays zero) that
    each call fills with precomputed selections."""

    def __init__(self, h: Handover, tr: Translation, rank: int, x: Any, xp: Any) -> None:
        self.operand, self.slot, self.h, self.tr, self.rank, self.xp = h.operand, h.slot, h, tr, rank, xp
        rmap, cmap, target = _handover_maps(tr, h, rank)
        self.local = target is None  # cuBLASLt: either order
        self.transpose = target is not None and h.transposed
        self.need = "CF" if self.local else ("C" if h.transposed else "F")
        self.view: tuple[Any, Any] | None = None
        if rmap.full(x.shape[0]) and cmap.full(x.shape[1]):
            self.view = (slice(None), slice(None))
        elif _is_full(rmap.dst, rmap.size) and _is_full(cmap.dst, cmap.size) and isinstance(rmap.src, slice) \
                and isinstance(cmap.src, slice):
            self.view = (rmap.src, cmap.src)
        if self.view is not None and not self._fits(x[self.view]):
            self.view = None
        self.whole = self.view == (slice(None), slice(None))
        self.staging: Any = None
        if self.view is None:
            order = "C" if h.transposed or (target is None and dense(x, "C")) else "F"
            self.staging = xp.zeros((rmap.size, cmap.size), dtype=x.dtype, order=order)
            self.out = self.staging.T if self.transpose else self.staging
            full_dst = _is_full(rmap.dst, rmap.size) and _is_full(cmap.dst, cmap.size)
            self.dst = Ellipsis if full_dst else (
                (_index(xp, rmap.dst), _index(xp, cmap.dst)) if isinstance(rmap.dst, slice) or isinstance(cmap.dst, slice)
                else xp.ix_(xp.asarray(rmap.dst), xp.asarray(cmap.dst)))
            self.src = (_index(xp, rmap.src), _index(xp, cmap.src)) \
                if isinstance(rmap.src, slice) or isinstance(cmap.src, slice) \
                else xp.ix_(xp.asarray(rmap.src), xp.asarray(cmap.src))
        self._last_x: Any = None
        self._last_y: Any = None

    def _fits(self, y: Any) -> bool:
        if self.need == "CF":
            return dense(y, "C") or dense(y, "F")
        return dense(y, "C" if self.need == "C" else "F")

    def __call__(self, x: Any) -> tuple[Any, bool]:
        if self.staging is not None:
            self.staging[self.dst] = x[self.src]
            return self.out, True
        if x is self._last_x:
            return self._last_y, False
        y = x if self.whole else x[self.view]
        if not self._fits(y):  # another memory layout than planned: the general way (a copy)
            return localize(self.h, self.tr, self.rank, x, self.xp)
        y = y.T if self.transpose else y
        self._last_x, self._last_y = x, y
        return y, False


class Program:
    """Everything :func:`prepare` and :func:`finish` compute from the
    Translation alone, computed once for one rank: each call only moves data
    (views, staging copies, the epilogue dmatmul applies)."""

    def __init__(self, tr: Translation, rank: int, a: Any, b: Any, c: Any, bias: Any, xp: Any) -> None:
        p = tr.problem
        self.tr, self.rank, self.xp = tr, rank, xp
        arrays = {"a": a, "b": b, "c": c}
        self.slots = [_Slot(h, tr, rank, arrays[h.operand], xp) for h in tr.handovers]
        self.index = {s.operand: i for i, s in enumerate(self.slots)}
        # the fused epilog's bias: a buffer allocated once, filled each call
        self.bias_buf: Any = None
        if tr.fused_epilog not in (None, "ALLREDUCE") and has_bias(p.epilog):
            real = _fused_bias_sources(tr, rank)
            keep = np.nonzero(real >= 0)[0]
            self.bias_buf = xp.zeros(len(real), dtype=a.dtype)
            if len(keep) == len(real):
                self.bias_dst, self.bias_src = Ellipsis, _index(xp, _selection(real))
            else:
                self.bias_dst, self.bias_src = xp.asarray(keep), xp.asarray(real[keep])
        # finish: where the result block is in nvmath's, and the post-epilogue's c and bias
        rows, cols = tr.computed.global_indices(rank, (p.m, p.n), p.nranks)
        self.result_sel: tuple[Any, Any] | None = None
        if tr.engine != "cublaslt":
            rsel, csel, shape = _result_selection(tr, rank, rows, cols)
            if not (_is_full(rsel, shape[0]) and _is_full(csel, shape[1])):
                self.result_sel = _ix(xp, rsel, csel)
        self.c_sel: Any = None
        if tr.post_beta_c and p.use_c:
            crows, ccols = p.distributions[2].global_indices(rank, (p.m, p.n), p.nranks)
            self.c_sel = _ix(xp, _selection(_locate(crows, rows, "c")), _selection(_locate(ccols, cols, "c")))
        self.bias_rows: Any = None  # (its columns, for a bias per column)
        if has_bias(tr.post_epilog):
            self.bias_rows = _index(xp, _post_bias(tr, rows, cols))

    def placement(self, slot: str) -> str | None:
        """Where nvmath's operand ``slot`` lives: ``"user"`` (the caller's
        array or a view of it, handed over without a copy) or ``"ordinary"``
        (a staging buffer of this plan); None when no such slot is handed."""
        for s in self.slots:
            if s.slot == slot:
                return "user" if s.staging is None else "ordinary"
        return None

    def prepare(self, a: Any, b: Any, c: Any, bias: Any) -> Prepared:
        arrays = {"a": a, "b": b, "c": c}
        out: dict[str, Any] = {}
        copied: dict[str, bool] = {}
        for s in self.slots:
            out[s.slot], copied[s.operand] = s(arrays[s.operand])
        fb = None
        if self.bias_buf is not None:
            self.bias_buf[self.bias_dst] = self.xp.asarray(bias).reshape(-1)[self.bias_src]
            fb = self.bias_buf
        return Prepared(out["A"], out["B"], out.get("C"), fb, copied)

    def finish(self, d_nv: Any, c: Any, bias: Any) -> Any:
        tr = self.tr
        d = d_nv
        if tr.engine != "cublaslt":
            d = d_nv.T if tr.swapped else d_nv
            if self.result_sel is not None:
                d = d[self.result_sel].copy()  # compact: do not keep the padded buffer alive
        if tr.post_beta_c or tr.post_epilog:
            c_block = c[self.c_sel] if self.c_sel is not None and c is not None else None
            b_block = self.xp.asarray(bias).reshape(-1)[self.bias_rows] if self.bias_rows is not None else None
            d = post_epilogue(self.xp, d, beta=tr.problem.beta, c=c_block, bias=b_block, epilog=tr.post_epilog,
                              dtype=d.dtype, bias_columns=tr.problem.bias_columns)
        return d


def _ix(xp: Any, rows: Selection, cols: Selection) -> Any:
    """An index for ``x[...]`` taking ``rows`` x ``cols`` (slices, or an open mesh of index arrays)."""
    if isinstance(rows, slice) or isinstance(cols, slice):
        return (_index(xp, rows), _index(xp, cols))
    return xp.ix_(xp.asarray(rows), xp.asarray(cols))
