"""Drawing cases: :func:`draw_case` through a *chooser* (a numpy generator, or hypothesis).

A chooser is any object with ``choice(seq)``, ``integer(lo, hi)`` (both ends
included) and ``boolean()``. Choices are ordered simplest first, so a
shrinking chooser shrinks towards float32, Slab.X, small sizes, no
transposes, "auto". Needs numpy only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from .. import _plan
from .._distribution import BlockCyclic, BlockNonCyclic, Distribution, ProcessGrid, Replicated, Slab
from .._epilogue import EPILOGS, has_bias
from .._mesh import ProcessMesh
from .._sharded import Sharded, SpecEntry
from .._spec import ALGORITHMS, FP8_DTYPES, PRECISIONS, RESULT_TYPES, AlgorithmName
from .case import (
    _BLOCK_SIZES, _DTYPES, _KINDS, _LARGE_DIM, _MAX_DIM, _SCALES, _VECTOR_LAYOUTS, BIAS_KINDS, CALLS, LAYOUTS,
    MATMUL_PRECISIONS, NRANKS, PLACEMENTS, SCALE_FAMILIES, TRANSFORMS, Case, OnMesh, Reset, Transform,
    _factorizations, _fitting_algorithms,
)

__all__ = ["Chooser", "NumpyChooser", "draw_case"]


class Chooser(Protocol):
    """What :func:`draw_case` asks of its source of randomness."""

    def choice(self, seq: Sequence[Any]) -> Any: ...

    def integer(self, lo: int, hi: int) -> int: ...  # lo <= x <= hi

    def boolean(self) -> bool: ...


class NumpyChooser:
    """A :class:`Chooser` on a numpy ``Generator`` (``dmatmul check``)."""

    def __init__(self, rng: np.random.Generator | int | Sequence[int]) -> None:
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)

    def choice(self, seq: Sequence[Any]) -> Any:
        return seq[int(self.rng.integers(len(seq)))]

    def integer(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def boolean(self) -> bool:
        return bool(self.rng.integers(2))


def _rarely(draw: Chooser, one_in: int) -> bool:
    """True about once in ``one_in`` draws (False is the simple side when shrinking)."""
    return draw.integer(0, one_in - 1) == one_in - 1


def _draw_grid(draw: Chooser, nranks: int, earlier: list[ProcessGrid]) -> ProcessGrid:
    """A grid of ``nranks`` ranks: the grid of an earlier operand (3 times in
    4), or a fresh shape and layout (rarely of another size: to be refused)."""
    if earlier and not _rarely(draw, 4):
        return draw.choice(earlier)
    size = nranks
    if _rarely(draw, 25):
        size = draw.choice([s for s in (1, 2, 3, 4, 6, 8, 9) if s != nranks])
    shapes = _factorizations(size)
    proper = [s for s in shapes if min(s) > 1]  # both grid axes split: where rings and SUMMA differ by layout
    shape = draw.choice(proper) if proper and not _rarely(draw, 3) else draw.choice(shapes)
    return ProcessGrid(shape, layout=draw.choice(("row", "col")))


def _draw_distribution(draw: Chooser, nranks: int, earlier: list[ProcessGrid],
                       cyclic: list[BlockCyclic] | None = None, kinds: Sequence[str] = _KINDS) -> Distribution:
    """One operand's distribution, of one of ``kinds``; a block-cyclic one takes
    the block sizes of an earlier block-cyclic operand (in ``cyclic``) half the
    time, as ScaLAPACK codes use one block size for every matrix (the K blocks
    of A and B then match, as SUMMA's per-step panel needs)."""
    kind = draw.choice(kinds)
    if kind == "Slab.X":
        return Slab.X
    if kind == "Slab.Y":
        return Slab.Y
    if kind == "Replicated":
        return Replicated()
    grid = _draw_grid(draw, nranks, earlier)
    earlier.append(grid)
    first = (0, 0)
    if draw.boolean():
        first = (draw.integer(0, grid.shape[0] - 1), draw.integer(0, grid.shape[1] - 1))
    if kind == "BlockNonCyclic":
        return BlockNonCyclic(grid, first)
    if cyclic and draw.boolean():
        blocks = draw.choice(cyclic).block_sizes
    else:
        blocks = (draw.choice(_BLOCK_SIZES), draw.choice(_BLOCK_SIZES))
    d = BlockCyclic(grid, blocks, first)
    if cyclic is not None:
        cyclic.append(d)
    return d


def _draw_dim(draw: Chooser, zero_one_in: int) -> int:
    return 0 if _rarely(draw, zero_one_in) else draw.integer(1, _MAX_DIM)


def _draw_reset(draw: Chooser, case: Case, alphas: Sequence[complex], betas: Sequence[complex],
                mpi: bool) -> Reset:
    """What the stateful form of ``case`` plans, resets and runs again."""
    plan = draw.boolean()
    given = ("a", "b") + ("c",) * case.use_c + ("bias",) * case.has_bias
    operands = [name for name in given if draw.boolean()]
    alpha = draw.choice(alphas) if _rarely(draw, 3) else None
    # without c, a beta that is not 0 is refused (one such reset in four)
    beta = draw.choice(betas if case.use_c or _rarely(draw, 4) else (0.0,)) if _rarely(draw, 3) else None
    if case.use_c and case.beta == 0 and beta not in (None, 0) and "c" not in operands:
        operands.append("c")  # the planned c is NaN (it was not to be read): one that now is read
    told = draw.integer(-1, case.nranks - 1) if mpi else -1  # (drawn last: one-process draws are unchanged)
    return Reset(plan=plan, operands=tuple(name for name in given if name in operands), alpha=alpha, beta=beta,
                 told=told if told >= 0 else None)


def draw_case(draw: Chooser, nranks: int, *, families: Sequence[str] = ("numpy", "jax"), mpi: bool = False,
              ndevices: int = max(NRANKS)) -> Case:
    """One random product on ``nranks`` ranks over the whole layout space.

    a, b and the result each get a distribution of any kind, drawn
    independently (one case in four, of the grid kinds only); grid
    distributions get row- or column-major grids of any
    2-D factorization of ``nranks``, an operand's grid being another's or its
    own; block sizes from 1 to larger than the matrix, any first process.
    One case in ten passes one Distribution (one of the three) for all, one
    in ten (in one process) ``distribution=None`` (dmatmul picks, or reads it
    off the operands' shardings).
    Sizes 1..40 (uneven, prime, smaller than the rank count; one case in 16
    has dimensions up to 180), K = 0 about once
    in 12 cases, M or N = 0 about once in 40; every dtype, transposes,
    alpha (0 and complex too; a complex alpha or beta on real operands one
    real case in 40: it must be refused), beta with or without C (C full of NaN where
    beta = 0: it must not be read; a beta that is not 0 without C one case in
    20 of those without C: it must be refused). One case in ten is BLAS's
    quick return, alpha = 0 and beta = 1 with C, on a result of one row or
    one column (cuBLASMp left such a D unwritten), A and B not to be read
    (half of the real cases with alpha = 0 have inf/NaN in them). Every epilog
    (relu/gelu/silu on complex rarely: it must be refused), a bias of shape
    (M,), (M, 1) or (one in three) (1, N), of the operands' dtype or another,
    numpy, jax or a list; "auto" or (one case in four) a named algorithm,
    mostly one that fits the layouts, numpy or jax operands (one case in
    eight, a, b and c each of its own family); numpy operands (one case in
    five) strided, Fortran-ordered, read-only... (:data:`LAYOUTS`). One real case
    in eight (one in two where alpha = 0; no relu/gelu/silu, whose NaN and -inf
    conventions differ between libraries) has a few inf/NaN entries in a, b
    and a C that is read: the result must hold the same non-finite values
    where numpy's does (none from A and B where alpha = 0), and padding must
    never meet them (0 * inf = NaN). One case in eight is
    the stateful form (:class:`Reset`). In one process (not ``mpi``): one case
    in six passes ``devices=`` a list (some of the ``ndevices`` devices, in
    any order), one plain jax case in four calls ``dm.matmul`` inside
    ``jax.jit``, one jax case in three (two in three with
    ``distribution=None``) puts its operands on a user's mesh, and one jax
    case in four (a or b a jax.Array; not the stateful form, no inf/NaN, not
    a jit of closed-over operands) puts a JAX transformation around
    ``dm.matmul`` (:class:`Transform`):
    ``jax.vjp`` or ``jax.jvp`` over its jax operands (bias too, where it is
    one), or ``jax.vmap`` over a stack of 2 or 3 a's or b's (leading or
    trailing batch axis), itself eager or inside the case's ``jax.jit`` or
    mesh call, with everything else the case draws. One case in three of
    "auto", allgather, reduce_scatter or summa forces a schedule ("ring",
    "one_shot" or "bidirectional": :func:`dmatmul._plan.schedule`), whatever
    the cost model would pick for its sizes. One case in eight (JAX present)
    runs inside ``jax.default_matmul_precision`` (:data:`MATMUL_PRECISIONS`),
    which ``precision=None`` follows on the JAX backend: under "highest" a
    float32 product must then be float32-accurate on any platform.
    Drawn last (:func:`_draw_nd`): batch dimensions on a and b (one case in
    five), and Sharded distributions over meshes of 1 to 3 axes (one case in
    four of those that pass distributions); then MXFP8 block scales on one FP8
    case in three (:func:`_draw_mxfp8`); last, ``mm.autotune()`` in one
    stateful case in eight (:attr:`Reset.tune`).
    """
    case, alphas, betas = _draw_product(draw, nranks, mpi)
    case = _draw_arrays(draw, case, families)
    case = _draw_call(draw, case, alphas, betas, families=families, mpi=mpi, ndevices=ndevices)
    case = _draw_mxfp8(draw, _draw_nd(draw, case))
    # the stateful form autotuned, drawn last (every other draw as before); never where one rank was told the
    # algorithm alone, which autotune may change
    if case.reset is not None and case.reset.told is None and _rarely(draw, 8):
        case = dataclasses.replace(case, reset=dataclasses.replace(case.reset, tune=True))
    return case


_Scalars = tuple[complex, ...]


def _draw_product(draw: Chooser, nranks: int, mpi: bool) -> tuple[Case, _Scalars, _Scalars]:
    """The product of a case (dtype, sizes, transposes, distributions,
    scalars, c, inf/NaN, epilog, algorithm), and the alphas and betas it draws from."""
    dtype = draw.choice(_DTYPES)
    is_complex = dtype.startswith("complex")
    m, n, k = _draw_dim(draw, 40), _draw_dim(draw, 40), _draw_dim(draw, 12)
    if _rarely(draw, 16):  # large: one, two or three dimensions of 41.._LARGE_DIM
        large = [draw.boolean() for _ in range(3)]
        m, n, k = (draw.integer(_MAX_DIM + 1, _LARGE_DIM) if big or (i == 0 and not any(large)) else dim
                   for i, (big, dim) in enumerate(zip(large, (m, n, k))))
    ta, tb = draw.boolean(), draw.boolean()
    earlier: list[ProcessGrid] = []
    cyclic: list[BlockCyclic] = []
    # one case in four: every operand on a grid, as a ScaLAPACK code has them (else 2-D-only
    # products are rare among three independent draws)
    kinds = ("BlockNonCyclic", "BlockCyclic") if _rarely(draw, 4) else _KINDS
    da, db, dd = (_draw_distribution(draw, nranks, earlier, cyclic, kinds) for _ in range(3))  # a, b, result
    dists: tuple[Distribution, Distribution, Distribution] | None = (da, db, dd)
    single = False
    if _rarely(draw, 5):  # one Distribution for all, or (one process) none: dmatmul picks
        form = draw.choice(("single",) if mpi else ("single", "none"))
        if form == "single":
            d = draw.choice((da, db, dd))
            dists, single = (d, d, d), True
        else:
            dists = None
    alphas = (1.0, 0.5, -1.5, 0.0) + ((0.5 - 0.25j, 1j) if is_complex else (2.25,))
    betas = (0.0, 1.0, -0.5, 2.0) + ((0.5 + 1j,) if is_complex else ())
    alpha, beta = draw.choice(alphas), draw.choice(betas)
    use_c = draw.boolean()
    if not use_c and beta != 0 and not _rarely(draw, 20):  # (the rest must be refused: beta needs c)
        beta = 0.0
    if _rarely(draw, 10):  # BLAS's quick return (alpha = 0, beta = 1) on a result of one row or one column
        alpha, beta, use_c = 0.0, 1.0, True
        m, n = (1, n) if draw.boolean() else (m, 1)
    # complex inf arithmetic is the library's own (C99 Annex G or not); where alpha = 0, A and B are not read
    specials = not is_complex and _rarely(draw, 8 if alpha != 0 else 2)
    if specials or (is_complex and not _rarely(draw, 8)):
        epilog = draw.choice((None, "bias"))
    else:
        epilog = draw.choice(EPILOGS)
    algorithm: AlgorithmName = "auto"
    if _rarely(draw, 4):  # a named algorithm: mostly one that fits the layouts (so that it runs), else any one
        fitting = _fitting_algorithms(nranks, (da, db, dd) if dists is None else dists, ta, tb)
        if fitting and not _rarely(draw, 3):
            algorithm = draw.choice(fitting)
        elif _rarely(draw, 2):
            algorithm = draw.choice(ALGORITHMS)
    case = Case(nranks=nranks, m=m, n=n, k=k, dtype=dtype, transpose_a=ta, transpose_b=tb,
                distributions=dists, alpha=alpha, beta=beta, use_c=use_c, epilog=epilog,
                algorithm=algorithm, specials=specials, single=single)
    return case, alphas, betas


def _draw_arrays(draw: Chooser, case: Case, families: Sequence[str]) -> Case:
    """``case`` with its operands' array families, precision, bias (shape,
    dtype, kind) and numpy memory layouts drawn."""
    dtype, use_c, epilog = case.dtype, case.use_c, case.epilog
    has_jax = "jax" in families
    family = draw.choice(tuple(families))
    fams: tuple[str, str, str] | None = None
    if len(families) > 1 and _rarely(draw, 8):  # a, b and c each of its own family
        fa, fb, fc = (draw.choice(tuple(families)) for _ in range(3))
        fc = fc if use_c else fa
        if len({fa, fb, fc}) > 1:
            fams = (fa, fb, fc)
            family = "jax" if "jax" in fams else "numpy"
        else:
            family = fa
    precision = draw.choice(PRECISIONS)
    bias_column, bias_dtype, bias_kind = False, None, "numpy"
    if has_bias(epilog):
        bias_column = _rarely(draw, 4)
        if _rarely(draw, 4):  # another dtype (a complex one on real operands is refused)
            bias_dtype = draw.choice([d for d in _DTYPES if d != dtype])
        if _rarely(draw, 3):
            bias_kind = draw.choice(BIAS_KINDS[1:] if has_jax else ("list",))
    layouts = ("C", "C", "C", "C")
    if _rarely(draw, 5):  # numpy operands laid out otherwise in memory
        abc = fams or (family, family, family)
        numpy_ = (abc[0] == "numpy", abc[1] == "numpy", abc[2] == "numpy" and use_c,
                  bias_kind == "numpy" and has_bias(epilog))
        dtypes = (dtype, dtype, dtype, bias_dtype or dtype)
        picked = (draw.choice([x for x in (_VECTOR_LAYOUTS if i == 3 else LAYOUTS)
                               if x != "byte-swapped" or dtypes[i] != "bfloat16"]) for i in range(4))
        la, lb, lc, lbias = (x if there else "C" for x, there in zip(picked, numpy_))
        layouts = (la, lb, lc, lbias)
    return dataclasses.replace(case, family=family, precision=precision, families=fams, layouts=layouts,
                               bias_column=bias_column, bias_dtype=bias_dtype, bias_kind=bias_kind)


def _draw_call(draw: Chooser, case: Case, alphas: _Scalars, betas: _Scalars, *, families: Sequence[str],
               mpi: bool, ndevices: int) -> Case:
    """``case`` with how ``dm.matmul`` is called drawn: a forced schedule,
    the stateful form, a user's mesh, ``devices=`` a list, ``jax.jit``, a
    JAX transformation, a default matmul precision; now and then a complex
    scalar on real operands and a bias of one value per column."""
    nranks, algorithm, family, fams = case.nranks, case.algorithm, case.family, case.families
    has_jax, is_complex, specials = "jax" in families, case.dtype.startswith("complex"), case.specials
    alpha, beta, dists = case.alpha, case.beta, case.distributions
    if algorithm in ("auto", "allgather", "reduce_scatter", "summa") and _rarely(draw, 3):
        # each schedule of the kernels that have several, whatever the cost model would pick for these sizes
        case = dataclasses.replace(case, schedule=draw.choice(_plan.SCHEDULES))
    reset = _draw_reset(draw, case, alphas, betas, mpi) if _rarely(draw, 8) else None
    on_mesh = None
    # the user's own mesh, eager or traced: one jax case in three, two in three with distribution=None (the
    # shardings then say the layout: a, b, c placed on the mesh, or not all, each its own way)
    if family == "jax" and nranks > 1 and (_rarely(draw, 3) if dists is not None else draw.integer(0, 2) > 0):
        shapes = [(nranks,)] + [s for s in _factorizations(nranks) if min(s) > 1]
        shape = draw.choice(shapes)
        on_mesh = OnMesh(
            shape=shape, explicit=not draw.boolean(), reversed=draw.boolean(),
            call="eager" if reset is not None else draw.choice(CALLS),  # a Matmul plans outside jit
            placements=(draw.choice(PLACEMENTS), draw.choice(PLACEMENTS), draw.choice(PLACEMENTS)),
            mixed=len(shape) > 1 and _rarely(draw, 3),
        )
    device_ids = None
    jit = False
    if not mpi and on_mesh is None:  # (a mesh's devices are the ranks, and it has its own calls)
        if has_jax and nranks <= ndevices and _rarely(draw, 6):  # devices= a list: some devices, in any order
            left = list(range(ndevices))
            device_ids = tuple(left.pop(left.index(draw.choice(left))) for _ in range(nranks))
        jit = family == "jax" and reset is None and _rarely(draw, 4)
    transform = None
    # one eligible case in four: a JAX transformation around dm.matmul (dm.matmul refuses traces under mpiexec;
    # a Matmul plans outside them; the gradients of inf/NaN operands are NaN by any rule), over the jax operands
    # (a or b among them: what vmap batches)
    # Not inside a jit of closed-over operands: such a jit names no devices of its own (JAX refuses even plain
    # jax.numpy code on Explicit axes there); dmatmul finds the mesh behind vjp's and jvp's tracers
    # (tests/test_user_mesh.py), not yet behind vmap's nor for an empty product
    jax_ab = [name for name, fam in zip("ab", fams or (family, family)) if fam == "jax"]
    constants = on_mesh is not None and on_mesh.call == "jit on constants"
    if not mpi and jax_ab and reset is None and not specials and not constants and _rarely(draw, 4):
        kind = draw.choice(TRANSFORMS)
        if kind == "vmap":
            transform = Transform(kind, batched=draw.choice(jax_ab), size=draw.integer(2, 3),
                                  axis=draw.choice((0, 2)))
        else:
            transform = Transform(kind)
    matmul_precision = draw.choice(MATMUL_PRECISIONS) if has_jax and _rarely(draw, 8) else None
    if not is_complex and _rarely(draw, 40):  # a complex scalar on real operands: refused, naming it
        alpha, beta = (0.5 - 0.25j, beta) if draw.boolean() else (alpha, 0.5 + 1j)
    # one bias in three of shape (1, N), one value per result column (drawn last: the draws above stay those
    # of the cases before it was drawn)
    per_column = case.has_bias and not case.bias_column and _rarely(draw, 3)
    case = dataclasses.replace(case, reset=reset, device_ids=device_ids, on_mesh=on_mesh, jit=jit,
                               transform=transform, matmul_precision=matmul_precision, alpha=alpha, beta=beta,
                               bias_per_column=per_column)
    return _draw_fp8(draw, case)


def _draw_fp8(draw: Chooser, case: Case) -> Case:
    """One case in six of a dtype FP8 results take (bfloat16, float16, float32):
    FP8 a and b with that dtype as result_type (c, and the bias's default, keep
    it), per-tensor scales or none. Not with inf/NaN (float8_e4m3fn has no inf)
    nor a JAX transformation (an FP8 cotangent holds too little to compare).
    Drawn last, so that the draws above stay those of the cases before FP8."""
    if case.dtype not in RESULT_TYPES or case.specials or case.transform is not None or not _rarely(draw, 6):
        return case
    dtype = draw.choice(FP8_DTYPES)
    scales = draw.choice(_SCALES)
    result_type = None if case.dtype == "bfloat16" and draw.boolean() else case.dtype
    la, lb, lc, lbias = case.layouts
    layouts = ("C" if la == "byte-swapped" else la, "C" if lb == "byte-swapped" else lb, lc, lbias)  # (1 byte)
    return dataclasses.replace(case, dtype=dtype, scales=scales, result_type=result_type,
                               bias_dtype=case.bias_dtype or case.dtype, layouts=layouts)


def _draw_mxfp8(draw: Chooser, case: Case) -> Case:
    """One FP8 case in three block-scaled (MXFP8): uint8 UE8M0 scales of a and
    b (random in :data:`~dmatmul.testing.case.MX_SCALES` when the case runs),
    numpy or each of its operand's family, in place of the per-tensor ones;
    half of them (K not 0) with K of several blocks (a multiple of 32, or not:
    a last shorter block). A stateful case's reset of a or b is kept one time
    in four (it must be refused: the scales were applied with the plan), else
    left to c, bias and the scalars. Drawn after everything else, so that the
    draws above stay those of the cases before MXFP8."""
    if case.dtype not in FP8_DTYPES or not _rarely(draw, 3):
        return case
    fams = ("numpy",) if "jax" not in (case.family_of("a"), case.family_of("b")) else SCALE_FAMILIES
    k = case.k
    if k and draw.boolean():
        k = draw.integer(33, 100) if draw.boolean() else 32 * draw.integer(1, 3)
    reset = case.reset
    if reset is not None and {"a", "b"} & set(reset.operands) and not _rarely(draw, 4):
        reset = dataclasses.replace(reset, operands=tuple(x for x in reset.operands if x not in ("a", "b")))
    return dataclasses.replace(case, block_scales=draw.choice(fams), scales=None, k=k, reset=reset)


#: the names a drawn ProcessMesh gives its axes (one set per mesh; JAX users' and plain ones)
_AXIS_NAMES = (("x", "y", "z"), ("data", "model", "pipe"), ("dp", "tp", "sp"))


def _draw_nd(draw: Chooser, case: Case) -> Case:
    """Batch dimensions and N-D meshes (drawn last, so that the draws above stay those of
    the cases before them).

    One case in five has leading batch dimensions on a, b or both
    (:func:`_draw_batches`), whatever else it draws: inside a JAX transformation
    (a vjp's cotangent and a jvp's tangents of the result's and the operands'
    batched shapes; a vmap's stack of batched operands), and on a user's mesh
    (each matrix placed as the case says, the batch dimensions not split). One
    case in four that passes distributions has :class:`~dmatmul.Sharded` ones: each of a, b and the result (or the one
    Distribution for all) is, two times in three, a Sharded over a
    :class:`~dmatmul.ProcessMesh` of 1 to 3 axes whose sizes multiply to the
    rank count (one mesh for the three, three times in four), its spec a 2-D
    form half the time (rows and columns over the axes in rank order, a tuple of
    them, replicated) and any spec otherwise (axes left out: replicated over
    them; tuples in any order), of the matrix dimensions or (one in four, on a
    batched operand) of every dimension. Dimensions split unevenly wherever the
    sizes drawn do not divide."""
    if _rarely(draw, 5):
        a_batch, b_batch = _draw_batches(draw, large=max(case.m, case.n, case.k) > _MAX_DIM)
        case = dataclasses.replace(case, a_batch=a_batch, b_batch=b_batch)
    if case.distributions is None or not _rarely(draw, 4):
        return case
    meshes = [_draw_mesh(draw, case.nranks)]
    ndims = (len(case.a_shape), len(case.b_shape), len(case.result_shape))
    if case.single:
        # (a spec of another number of dimensions than an operand's, but 2, is refused, as a misfit)
        ndim = ndims[0] if len(set(ndims)) == 1 else 2
        d = _draw_sharded(draw, meshes[0], ndim if ndim > 2 and _rarely(draw, 4) else 2)
        return dataclasses.replace(case, distributions=(d, d, d))
    dists = list(case.distributions)
    for i, ndim in enumerate(ndims):
        if draw.integer(0, 2) == 0:
            continue
        if _rarely(draw, 4):
            meshes.append(_draw_mesh(draw, case.nranks))
        mesh = meshes[-1] if draw.boolean() else meshes[0]
        dists[i] = _draw_sharded(draw, mesh, ndim if ndim > 2 and _rarely(draw, 4) else 2)
    a, b, r = dists
    return dataclasses.replace(case, distributions=(a, b, r))


def _draw_batches(draw: Chooser, large: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """a's and b's batch dimensions: 0 to 2 each (not both 0), broadcast as
    ``numpy.matmul`` does: the result's of sizes 1 to 3 (one case in eight, one of
    size 0), each operand's the trailing ones of it, each a 1 one time in three
    (broadcast), every dimension of the result an operand's. At most 2 items where a
    matrix is large."""
    na, nb = draw.integer(0, 2), draw.integer(0, 2)
    if na == nb == 0:
        na, nb = (1, 0) if draw.boolean() else (0, 1)
    full = [draw.integer(1, 2 if large else 3) for _ in range(max(na, nb))]
    if large and len(full) == 2:
        full[0] = 1
    if _rarely(draw, 8):
        full[draw.integer(0, len(full) - 1)] = 0
    own = [tuple(1 if _rarely(draw, 3) else s for s in full[len(full) - n:]) for n in (na, nb)]
    # every dimension of the result comes from a or b (an operand with no such dimension broadcasts)
    for i, size in enumerate(full):
        at = [ops[i - len(full) + len(ops)] if i >= len(full) - len(ops) else 1 for ops in own]
        if size not in at:
            j = 0 if i >= len(full) - na else 1
            ops = list(own[j])
            ops[i - len(full) + len(ops)] = size
            own[j] = tuple(ops)
    return own[0], own[1]


def _draw_mesh(draw: Chooser, nranks: int) -> ProcessMesh:
    """A mesh of 1 to 3 axes over ``nranks`` ranks (any ordered factorization, axes of size 1 too)."""
    naxes = draw.integer(1, 3)
    shapes = [s for s in _ordered_factorizations(nranks, naxes)]
    shape = draw.choice(shapes)
    return ProcessMesh(shape, draw.choice(_AXIS_NAMES)[:naxes])


def _ordered_factorizations(p: int, n: int) -> list[tuple[int, ...]]:
    if n == 1:
        return [(p,)]
    return [(f,) + rest for f in range(1, p + 1) if p % f == 0 for rest in _ordered_factorizations(p // f, n - 1)]


def _draw_sharded(draw: Chooser, mesh: ProcessMesh, ndim: int) -> Sharded:
    """A Sharded over ``mesh`` of ``ndim`` dimensions (the matrix is the last two).

    Half the time a 2-D form: the mesh's axes in rank order split the rows,
    the columns, both (a leading run of them the rows, the rest the columns:
    a row-major grid; or the other way round: a column-major one), or
    none (replicated); otherwise each axis splits a dimension or none (replicated
    over it), a dimension's axes in any order."""
    names = list(mesh.axis_names)
    spec: list[SpecEntry] = [None] * ndim
    if ndim == 2 and draw.boolean():
        form = draw.choice(("rows", "cols", "grid", "col grid", "replicated"))
        cut = draw.integer(0, len(names))
        if form in ("rows", "cols"):
            spec[0 if form == "rows" else 1] = _spelled(draw, names)
        elif form == "grid":
            spec = [_spelled(draw, names[:cut]), _spelled(draw, names[cut:])]
        elif form == "col grid":
            spec = [_spelled(draw, names[cut:]), _spelled(draw, names[:cut])]
        return Sharded(mesh, tuple(spec))
    order = list(names)
    for i in range(len(order) - 1, 0, -1):  # a drawn permutation (hypothesis shrinks towards mesh order)
        j = draw.integer(0, i)
        order[i], order[j] = order[j], order[i]
    parts: list[list[str]] = [[] for _ in range(ndim)]
    for name in order:
        where = draw.integer(-1, ndim - 1)
        if where >= 0:
            parts[where].append(name)
    return Sharded(mesh, tuple(_spelled(draw, part) for part in parts))


def _spelled(draw: Chooser, names: Sequence[str]) -> SpecEntry:
    """A spec entry of ``names``: None, a name, or a tuple (one name as a 1-tuple now and then)."""
    if not names:
        return None
    if len(names) == 1 and not _rarely(draw, 4):
        return names[0]
    return tuple(names)
