"""One dmatmul product as one nvmath-python call, described as plain data.

Nothing here imports nvmath-python, CuPy or MPI: :func:`translate` turns a
:class:`Problem` (global sizes, transposes, dmatmul distributions, the memory
order of each local block, epilog, requested algorithm) into a
:class:`Translation`, a frozen value that says exactly what the execution
layer hands to ``nvmath.distributed.linalg.advanced.Matmul``:

* per operand a :class:`Handover`: which nvmath slot it fills (A, B or C),
  whether it is handed over as it is or as the transposed view of a C-order
  block, the ``is_transpose`` qualifier, the nvmath distribution as data
  (:class:`NvDistribution`: grid shape and layout, block sizes,
  first_process), the nvmath-side global shape and whether (and why) a copy
  is made;
* per logical dimension M, K, N a :class:`DimPlan`: the block size nvmath
  uses and the zero padding that makes an uneven Slab expressible;
* the cuBLASMp path the rules predict (``path``) and the contract name
  (``algorithm``), what is fused into cuBLASMp's epilogue and what dmatmul
  applies afterwards, whether the result is allgathered by dmatmul.

The rules (nvmath-python 1.0 and cuBLASMp < 0.10)
-------------------------------------------------
*Fortran order.* cuBLASMp takes column-major local blocks. A C-order block of
``X`` is the Fortran-order block of ``X.T``, whose distribution is the
transposed one (``Slab.X <-> Slab.Y``; a grid ``(r, c)`` in row-major order
becomes ``(c, r)`` in column-major order, block sizes and first_process
swap). So a C-order ``a`` or ``b`` is handed over as ``a.T`` (a view) with its
``is_transpose`` qualifier flipped. ``c`` cannot be flagged transposed, so
the product is computed in one of two *frames*:

* ``D = op(A) op(B)`` (not swapped): nvmath A/B/C are a/b/c; the result comes
  back in Fortran order; a C-order ``c`` must be copied.
* ``D.T = op(B).T op(A).T`` (swapped): nvmath A is ``b``, nvmath B is ``a``,
  nvmath C is ``c.T``; a C-order ``c`` is a free view and the result comes
  back as ``D.T`` in Fortran order, i.e. ``D`` in C order.

*Copies* (the decision table, see :func:`._orient.orient`): a local block is handed
over without a copy when it is F-contiguous (as it is) or C-contiguous (as
its transposed view), judged by its strides as nvmath reads them (a vector
is in the order it was made in: :func:`._orient.dense`). A copy happens when (1) the dimension is padded (uneven
Slab), (2) a Replicated operand is cut to a split that is not a contiguous
range of its memory order, (3) the block is neither C- nor F-contiguous, (4)
``c`` is in the wrong order for the frame the fast path needs, or (5)
GEMM+AllReduce needs the TN layout and the memory order gives the other
qualifier. Among the frames a path allows, the one with fewer copied elements
wins; ties go to the frame that can fuse a bias, then to the swapped frame
(its result is C-order).

*Fast paths* (1-D, non-cyclic, uniform, first_process (0, 0)), in nvmath's
frame: AllGather+GEMM when D is split on M, op(A) on M and op(B) on N;
GEMM+ReduceScatter when D is split on N and op(A), op(B) on K; GEMM+AllReduce
with ``epilog=ALLREDUCE`` (TN only); SUMMA on one shared 2-D grid; a local GEMM
on one rank. Because the swapped frame exchanges M and N, dmatmul reaches the
mirrored triples too: ``(a: M, b: N, d: N)`` is AllGather+GEMM and
``(a: K, b: K, d: M)`` GEMM+ReduceScatter. Replicated ``a``/``b`` are cut to
whatever split the path needs (free); a Replicated result comes from the
AllReduce epilog, or is computed split and allgathered by dmatmul.

*Uneven splits.* nvmath turns every distribution into a BlockCyclic one; a
Slab of 10 rows on 4 ranks (3, 3, 2, 2) has no block size that numroc deals
the same way (block 3 gives 3, 3, 3, 1). dmatmul pads every such dimension
to ``P * ceil(S / P)`` with zeros at the end of each rank's part, so the
padded matrix is uniform (3, 3, 3, 3), and strips the padding from the
result: zero rows/columns of K add nothing, those of M and N are dropped.

>>> from dmatmul import Slab
>>> t = translate(Problem.of(m=10, n=8, k=6, nranks=4, transpose_a=False, transpose_b=False,
...                       distributions=(Slab.X, Slab.Y, Slab.X), orders=("C", "C", None)))
>>> t.algorithm, t.path, t.swapped, t.qualifiers
('allgather', 'AG+GEMM', False, (True, True, False))
>>> t.dim("M").padded_size, t.dim("M").nv_block
(12, 3)
>>> t.handover("a").distribution
NvDistribution(grid_shape=(1, 4), grid_layout='ROW_MAJOR', block_sizes=(6, 3), first_process=(0, 0))
>>> t.handover("a").copy
'padding M 10->12 (uneven split over 4 ranks)'
"""

from __future__ import annotations

import dataclasses

from .... import _plan, _roles
from ...._errors import DistributionError
from ._epilog import FP8Refused, refused_epilog, upcast
from ._one_d import one_d, one_rank
from ._orient import as_dense, combine_orders, dense, order_of
from ._overlap import Memory, overlap
from ._two_d import LayoutRefused, two_d
from ._types import KERNELS, PATHS, DimPlan, Handover, NvDistribution, Order, Path, Problem, Translation

__all__ = [
    "Memory",
    "overlap",
    "Order",
    "Path",
    "Problem",
    "DimPlan",
    "NvDistribution",
    "Handover",
    "Translation",
    "KERNELS",
    "PATHS",
    "translate",
    "order_of",
    "dense",
    "as_dense",
    "combine_orders",
    "refused_epilog",
    "refuse_layered",
    "LAYERED_LIMITATION",
    "LayoutRefused",
]


def _check_fit(p: Problem) -> None:
    for name, d in zip(("a", "b", "result"), p.distributions):
        try:
            d.nranks(p.nranks)
        except DistributionError as e:
            raise DistributionError(
                f"distribution of {name}: {d!r} does not fit the {p.nranks} rank(s) of this run: {e}"
                + (
                    "; the nvmath backend runs one rank per process (one GPU each): launch "
                    f"with mpiexec -n {d.grid.size}, or span one process's devices with backend='jax', "
                    f"devices={d.grid.size}" if d.grid is not None and p.nranks == 1 else ""
                )
            ) from None


#: why 2.5-D SUMMA has no nvmath path (see :func:`refuse_layered`)
LAYERED_LIMITATION = (
    "nvmath-python 1.0's distributed Matmul runs cuBLASMp on the one communicator nvmath.distributed.initialize() "
    "was given (its ProcessGrid must span all of its ranks) and takes no communicator per operation, so the layers "
    "cannot each run their own SUMMA"
)


def refuse_layered(problem: Problem) -> None:
    """``algorithm="summa25d"`` has no nvmath path: a ValueError saying why.

    2.5-D SUMMA needs one cuBLASMp SUMMA per layer, each on the sub-communicator
    of that layer's q*q ranks, then a reduce over the layers. nvmath-python 1.0
    creates its cuBLASMp grids on the NCCL communicator of
    ``nvmath.distributed.initialize`` (``get_context().nccl_comm``; initialized
    once per process, a second call raises), its ``ProcessGrid`` must have as
    many elements as that communicator has ranks, and ``Matmul`` takes no
    communicator. One call on the whole communicator cannot stand in for the c
    layer products either: they are c independent products on disjoint slices of
    K summed afterwards, which one GEMM computes only as a block-diagonal operand
    (c times the flops). A rank count that is no q*q*c gets the algorithm's own
    refusal, as on every backend.
    """
    if problem.algorithm != "summa25d":
        return
    alg = _plan.ALGORITHMS["summa25d"]
    if not alg.runs_on(problem.sizes()):
        raise ValueError(alg.refusal(problem.sizes()))
    raise ValueError(
        f"algorithm='summa25d' needs one cuBLASMp SUMMA per layer on that layer's sub-communicator, but "
        f"{LAYERED_LIMITATION}; use backend='jax' (its summa25d kernel runs on {problem.nranks} devices), or "
        "algorithm='summa' or 'auto' here. An nvmath whose Matmul takes a communicator (cuBLASMp's "
        "cublasMpGridCreate already takes any NCCL communicator) would lift this"
    )


def translate(problem: Problem) -> Translation:
    """The nvmath call for ``problem``; raises ValueError when a named algorithm
    does not fit (``summa25d`` always: :func:`refuse_layered`), :class:`LayoutRefused`
    (a NotImplementedError) for 2-D layouts cuBLASMp cannot take as given (the
    front end re-lays those into layouts it takes: :mod:`dmatmul._relay`). An FP8 product that cuBLASMp's FP8 path
    refuses (its layout, sizes or formats) runs as the float32 product it equals
    (:func:`_epilog.upcast`: its translation's problem is then float32), and its
    ``explain()`` says why."""
    try:
        return _translate(problem)
    except FP8Refused as e:
        t = _translate(upcast(problem))
        why = (f"fp8: cuBLASMp's FP8 path refuses this product ({e}); dmatmul upcasts a and b to float32 "
               f"(exact), multiplies there with alpha*sa*sb = {problem.spec.scaled_alpha:g}, and rounds the result "
               f"to {problem.spec.result_dtype} once; cuBLASMp takes FP8 as transpose_a=False, transpose_b=True "
               "(C-order blocks) with M, N and K multiples of 16, not float8_e5m2 x float8_e5m2")
        return dataclasses.replace(t, notes=(*t.notes, why))


def _translate(problem: Problem) -> Translation:
    _check_fit(problem)
    refuse_layered(problem)
    if problem.nranks == 1:
        return one_rank(problem)
    p = problem
    roles = tuple(
        _roles.role_of(d, op, t, p.nranks)  # type: ignore[arg-type]
        for d, op, t in zip(p.distributions, ("a", "b", "d"), (p.transpose_a, p.transpose_b, False))
    )
    if None not in roles:
        return one_d(p, roles)  # type: ignore[arg-type]
    try:
        return two_d(p, roles)
    except LayoutRefused as e:  # cuBLASMp's limits, not the contract's: say where it runs as given
        raise LayoutRefused(f"{e}; or run it as given with backend='jax', which takes any layout", e.why) from None
