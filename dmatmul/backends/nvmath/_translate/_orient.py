"""Memory order and orientation: which order a local block has
(:func:`order_of`, :func:`combine_orders` over all ranks), and how each
operand is handed to nvmath in a frame -- as it is or as the transposed view
of a C-order block, with which ``is_transpose`` qualifier, and whether (and
why) it must be copied (:func:`orient`, the decision table;
:func:`build_frame` for a, b and c together). The rules themselves are in the
package docstring (*Fortran order*, *Copies*).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal


from ...._distribution import Distribution
from ._types import DimPlan, Handover, NvDistribution, Order, Problem

__all__ = ["AxisOp", "dense", "as_dense", "order_of", "combine_orders", "orient", "why_ops", "Frame", "build_frame", "copy_weights"]

AxisOp = Literal["keep", "slice", "pad", "gather"]


def dense(x: Any, order: Literal["C", "F"]) -> bool:
    """Whether 2-D ``x`` has the strides a fresh ``order`` array of its shape
    has: what cuBLASMp reads, with the leading dimension equal to the extent
    (nvmath passes ``strides[1]`` of a Fortran block as its leading dimension).
    numpy's and CuPy's ``flags`` ignore the stride of a length-1 dimension, so
    a C-order row ``(1, n)`` is "F-contiguous" to them, but not to nvmath (its
    strides ``(n, 1)`` are not ascending), and a C-order column ``(m, 1)`` has
    the leading dimension 1 < m.

    >>> import numpy as np
    >>> dense(np.zeros((1, 3)), "F"), dense(np.zeros((1, 3), order="F"), "F"), dense(np.zeros((3, 1)), "F")
    (False, True, False)
    """
    if x.size == 0:
        return True
    item = x.dtype.itemsize
    s0, s1 = x.strides
    if s0 % item or s1 % item:
        return False
    rows, cols = x.shape
    return (s0 // item, s1 // item) == ((cols, 1) if order == "C" else (1, rows))


def order_of(x: Any) -> Order:
    """The memory order of a 2-D array (numpy, cupy, or anything with ``strides``),
    as nvmath reads it (:func:`dense`).

    "CF" for a block that is both (1 x 1, or empty), "X" for neither.
    Arrays without ``strides`` (jax) count as C-order.

    >>> import numpy as np
    >>> order_of(np.zeros((2, 3))), order_of(np.zeros((2, 3), order="F")), order_of(np.zeros((1, 1)))
    ('C', 'F', 'CF')
    >>> order_of(np.zeros((4, 4))[:, :2]), order_of(np.zeros((1, 3))), order_of(np.zeros((3, 1), order="F"))
    ('X', 'C', 'F')
    """
    if getattr(x, "strides", None) is None:
        return "C"
    c, f = dense(x, "C"), dense(x, "F")
    return "CF" if c and f else "C" if c else "F" if f else "X"


def as_dense(xp: Any, x: Any, order: Literal["C", "F"]) -> tuple[Any, bool]:
    """``x`` laid out as :func:`dense` says (a copy where it is not), and
    whether it is a copy. ``ascontiguousarray`` would keep a vector whose
    flags already say yes."""
    if dense(x, order):
        return x, False
    return xp.array(x, order=order, copy=True), True


def combine_orders(orders: Sequence[Order | None]) -> Order | None:
    """The order every rank's block has (what the whole job can rely on).

    >>> combine_orders(["C", "CF", "C"]), combine_orders(["C", "F"]), combine_orders([None, None])
    ('C', 'X', None)
    """
    present = [o for o in orders if o is not None]
    if not present:
        return None
    c = all(o in ("C", "CF") for o in present)
    f = all(o in ("F", "CF") for o in present)
    return "CF" if c and f else "C" if c else "F" if f else "X"


def _view_order(order: Order, ops: tuple[AxisOp, AxisOp]) -> Order | None:
    """The memory order after taking the handed-over part as a view (None: not
    a view, a copy is needed)."""
    if "pad" in ops or "gather" in ops:
        return None
    if order in ("CF", "X"):
        return order
    sliced = [i for i, op in enumerate(ops) if op == "slice"]
    if not sliced:
        return order
    if sliced == [0]:
        return "C" if order == "C" else "X"  # a range of rows of a C-order block stays C-order
    if sliced == [1]:
        return "F" if order == "F" else "X"
    return "X"


def orient(
    operand: str,
    order: Order,
    ops: tuple[AxisOp, AxisOp],
    *,
    base: bool,
    need: bool | None,
    force: bool | None,
    why_ops: str | None,
    why_need: str,
    prefer: bool | None = None,
) -> tuple[bool, bool, str | None]:
    """Choose how a block is handed over: ``(transposed, is_transpose, copy reason)``.

    ``base`` is the qualifier when handed as it is (as_is); handing the
    transposed view flips it. ``need`` fixes the qualifier (GEMM+AllReduce's
    TN), ``force`` fixes the orientation (``c``, which cannot be flagged);
    ``prefer`` breaks ties (2-D grids: the orientation that keeps one shared
    grid in nvmath's frame).

    ========================  =====================  ======================
    block (after cutting)      handed over            copy
    ========================  =====================  ======================
    F-contiguous               as it is               none
    C-contiguous               transposed view        none
    both (a vector)            as it is               none
    neither                    as it is (F copy)      "not contiguous"
    padded / gathered          per memory order       padding / gather
    qualifier or frame fixed   as required            when the order differs
    ========================  =====================  ======================
    """
    view = _view_order(order, ops)
    free = {False: view in ("F", "CF"), True: view in ("C", "CF")}
    if force is not None:
        transposed = force
    elif need is not None:
        transposed = base != need  # the orientation whose qualifier is `need`
    elif free[False] and free[True]:
        transposed = bool(prefer)
    elif free[False]:
        transposed = False
    elif free[True]:
        transposed = True
    elif prefer is not None:
        transposed = prefer
    else:
        transposed = order == "C"  # copy into the block's own order, hand the matching view
    copy = None
    if not free[transposed]:
        if view is None:
            copy = why_ops
        elif view == "X":
            copy = f"{operand} is neither C- nor Fortran-contiguous" + (
                "" if order == "X" else " after cutting its part"
            )
        else:
            copy = why_need
    return transposed, base ^ transposed, copy


def why_ops(operand: str, ops: tuple[AxisOp, AxisOp], dims_of: tuple[str, str], dims: dict[str, DimPlan],
             target: Distribution) -> str | None:
    if "pad" in ops:
        padded = [d for d, op in zip(dims_of, ops) if op == "pad"]
        return "padding " + ", ".join(
            f"{d} {dims[d].size}->{dims[d].padded_size} (uneven split over {dims[d].nparts} ranks)"
            if dims[d].nparts > 1 else f"{d} {dims[d].size}->{dims[d].padded_size}" for d in padded
        )
    if "gather" in ops:
        return f"cutting the replicated {operand} to {target!r} (not a contiguous range)"
    return None


@dataclasses.dataclass(frozen=True)
class Frame:
    swapped: bool
    handovers: tuple[Handover, ...]
    weight: float


def build_frame(
    p: Problem,
    swapped: bool,
    *,
    targets: dict[str, Distribution],
    nv_user: dict[str, NvDistribution | None],
    ops: dict[str, tuple[AxisOp, AxisOp]],
    dims: dict[str, DimPlan],
    need_tn: bool,
    pass_c: bool,
    engine: str,
    weights: dict[str, float],
    prefer: bool | None = None,
) -> Frame:
    """Handovers of a, b (and c) in one frame."""
    ta, tb = p.transposes
    out = []
    weight = 0.0
    for operand in ("a", "b", "c"):
        if operand == "c" and not pass_c:
            continue
        order = p.orders[{"a": 0, "b": 1, "c": 2}[operand]] or "C"
        source = p.distributions[{"a": 0, "b": 1, "c": 2}[operand]]
        stored = p.stored(operand)
        if engine == "cublaslt":
            view = _view_order(order, ops[operand])
            copy = None if view in ("C", "F", "CF") else (
                why_ops(operand, ops[operand], stored, dims, targets[operand])
                or f"{operand} is neither C- nor Fortran-contiguous"
            )
            t = {"a": ta, "b": tb, "c": False}[operand]
            out.append(Handover(operand, operand.upper(), False, t, source, targets[operand], None,
                                p.global_shape(operand), stored, copy))
            weight += weights[operand] if copy else 0.0
            continue
        if operand == "a":
            slot, base = ("B", not ta) if swapped else ("A", ta)
        elif operand == "b":
            slot, base = ("A", not tb) if swapped else ("B", tb)
        else:
            slot, base = "C", False
        need = None
        if need_tn and operand != "c":
            need = slot == "A"  # GEMM+AllReduce runs TN: A transposed, B not
        force = swapped if operand == "c" else None
        why_need = (
            f"c must be handed to nvmath in {'C' if swapped else 'Fortran'} order for the "
            f"{'D.T = op(B).T op(A).T' if swapped else 'D = op(A) op(B)'} frame (nvmath cannot flag C transposed)"
            if operand == "c" else
            f"GEMM+AllReduce runs only TN (is_transpose A=True, B=False): {operand} must be copied to the "
            "other memory order"
        )
        transposed, qual, copy = orient(
            operand, order, ops[operand], base=base, need=need, force=force,
            why_ops=why_ops(operand, ops[operand], stored, dims, targets[operand]), why_need=why_need,
            prefer=prefer,
        )
        nvu = nv_user[operand]
        assert nvu is not None
        nvd = nvu.transposed() if transposed else nvu
        shape = (dims[stored[0]].padded_size, dims[stored[1]].padded_size)
        if transposed:
            shape = (shape[1], shape[0])
        out.append(Handover(operand, slot, transposed, qual if operand != "c" else False, source,
                            targets[operand], nvd, shape, stored, copy))
        weight += weights[operand] if copy else 0.0
    return Frame(swapped, tuple(out), weight)


def copy_weights(p: Problem, split: dict[str, bool]) -> dict[str, float]:
    out = {}
    for operand in ("a", "b", "c"):
        r, c = p.global_shape(operand)
        out[operand] = r * c / (p.nranks if split.get(operand, False) else 1)
    return out
