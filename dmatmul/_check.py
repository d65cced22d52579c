"""Random products over the whole layout space, checked against numpy.

One generator, three drivers: ``dmatmul check`` (a numpy ``Generator`` makes
the choices), the hypothesis test of ``tests/test_check.py`` (hypothesis makes
them, so it shrinks a failure to the simplest case), and ``mpiexec -n P
dmatmul check`` (every rank draws the same cases and passes its own blocks).

* :func:`draw_case` draws a :class:`Case` through a *chooser*: any object with
  ``choice(seq)``, ``integer(lo, hi)`` (both ends included) and ``boolean()``.
  Choices are ordered simplest first, so a shrinking chooser shrinks towards
  float32, Slab.X, small sizes, no transposes, "auto".
* :func:`run_case` builds the operands, calls :func:`dmatmul.matmul` and
  classifies the :class:`Outcome`: ``passed``, ``refused`` (an error the case
  expects: see :meth:`Case.refusals`) or ``failed`` (wrong numbers, wrong
  shape, dtype or array family of the result, a read-only numpy result, a
  modified input, an unexpected exception of any kind, or no error where one
  is required).
* :func:`report` prints a table by layout family and the first failures,
  each with a line that reproduces it.

Importing this module needs numpy only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import re
import sys
from collections.abc import Sequence
from typing import Any, Protocol, cast

import numpy as np

from . import _plan, _runtime
from ._distribution import BlockCyclic, BlockNonCyclic, Distribution, ProcessGrid, Replicated, Slab, split
from ._epilogue import EPILOGS, EpilogName, has_bias
from ._spec import ALGORITHMS, DTYPES, PRECISIONS, AlgorithmName, BackendName, PrecisionName, family
from ._reference import add_specials, error_ratio, finite_scale, random_matrix, reference

__all__ = [
    "Chooser", "NumpyChooser", "Case", "Outcome", "Refusal", "draw_case", "run_case", "combine", "report",
    "LAYOUT_FAMILIES", "NRANKS", "OnMesh", "PLACEMENTS", "CALLS",
]

#: the rank counts the matrix covers in one process (each has its own grid shapes)
NRANKS = (1, 2, 3, 4, 6, 8)
#: the table's rows, in order
LAYOUT_FAMILIES = ("one rank", "1-D", "mixed 1-D/2-D", "2-D, one grid", "different grids", "grid != ranks")

_KINDS = ("Slab.X", "Slab.Y", "Replicated", "BlockNonCyclic", "BlockCyclic")
_DTYPES = ("float32", "float64", "float16", "bfloat16", "complex64", "complex128")  # simplest first
_REAL_EPILOGS = tuple(e for e in EPILOGS if e is not None)
_COMPLEX_REFUSED = ("relu", "gelu", "relu_bias", "gelu_bias")
_BLOCK_SIZES = (1, 2, 3, 4, 5, 8, 64)  # 64: larger than any drawn dimension
_MAX_DIM = 40
assert set(_DTYPES) == set(DTYPES)


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


# --------------------------------------------------------------------------- #
# cases
# --------------------------------------------------------------------------- #
@dataclasses.dataclass(frozen=True)
class Refusal:
    """An error a case may end in: its types and words its message must hold."""

    types: tuple[type[BaseException], ...]
    words: tuple[str, ...]
    why: str

    def matches(self, e: BaseException) -> bool:
        text = str(e)
        return isinstance(e, self.types) and all(re.search(w, text) for w in self.words)


#: how a jax.Array operand is placed on a user's mesh (:class:`OnMesh`), simplest first
PLACEMENTS = ("none", "rows", "cols", "grid")
#: how dm.matmul is called on such operands
CALLS = ("eager", "jit", "jit under set_mesh", "jit on constants")


@dataclasses.dataclass(frozen=True)
class OnMesh:
    """jax.Array operands placed on a mesh of the user's (one process), and how
    ``dm.matmul`` is called on them: eagerly, inside ``jax.jit``, or inside
    ``jax.jit`` under ``jax.set_mesh``, or inside ``jax.jit`` on closed-over
    operands (constants of the trace). The mesh has ``shape`` (axes "data",
    "model"), Explicit axes (``jax.make_mesh``'s default) or Auto ones
    (``mixed``: the first axis of one kind, the others of the other), its
    devices in id order or reversed; ``placements`` say how a, b and c are
    placed (:data:`PLACEMENTS`: unsplit, rows or columns over every axis, rows
    over the first and columns over the rest; unsplit where it would not
    split evenly). The result must come back on that mesh."""

    shape: tuple[int, ...]
    explicit: bool
    reversed: bool
    call: str
    placements: tuple[str, str, str]
    mixed: bool = False

    def describe(self) -> str:
        kind = "Explicit" if self.explicit else "Auto"
        if self.mixed:
            kind += f"-then-{'Auto' if self.explicit else 'Explicit'}"
        order = ", devices reversed" if self.reversed else ""
        mesh = "x".join(map(str, self.shape))
        return f"{self.call}: a, b, c on an {kind} {mesh} mesh{order}, placed {'/'.join(self.placements)}"

    def build(self, devices: Sequence[Any]) -> Any:
        """The mesh, on ``devices`` (JAX's, at least ``prod(shape)``)."""
        from jax.sharding import AxisType, Mesh

        devs = list(devices)[: math.prod(self.shape)]
        devs = devs[::-1] if self.reversed else devs
        first, other = (AxisType.Explicit, AxisType.Auto) if self.explicit else (AxisType.Auto, AxisType.Explicit)
        names = ("data", "model")[: len(self.shape)]
        types = (first,) + ((other if self.mixed else first),) * (len(names) - 1)
        return Mesh(np.array(devs, dtype=object).reshape(self.shape), names, axis_types=types)

    @staticmethod
    def put(x: Any, mesh: Any, placement: str) -> Any:
        """``x`` on ``mesh`` as ``placement`` says (unsplit where that would not split evenly)."""
        import jax
        from jax.sharding import NamedSharding, PartitionSpec

        names = tuple(mesh.axis_names)
        spec = {
            "none": (None, None), "rows": (names, None), "cols": (None, names),
            "grid": (names[0], names[1:] or None) if len(names) > 1 else (names, None),
        }[placement]
        for part, size in zip(spec, x.shape):
            axes = () if part is None else (part,) if isinstance(part, str) else part
            if size % math.prod(mesh.shape[a] for a in axes):
                spec = (None, None)
        return jax.device_put(x, NamedSharding(mesh, PartitionSpec(*spec)))


@dataclasses.dataclass(frozen=True)
class Case:
    """One product: ``epilog(alpha * op(A) @ op(B) + beta * C [+ bias])`` on
    ``nranks`` ranks with the stored operands distributed as ``distributions``
    says (a, b, result)."""

    nranks: int
    m: int
    n: int
    k: int
    dtype: str
    transpose_a: bool
    transpose_b: bool
    distributions: tuple[Distribution, Distribution, Distribution]
    alpha: complex = 1.0
    beta: complex = 0.0
    use_c: bool = False
    epilog: EpilogName | None = None
    algorithm: AlgorithmName = "auto"
    family: str = "numpy"
    precision: PrecisionName | None = None
    on_mesh: OnMesh | None = None  # jax operands on a user's mesh (ignored under mpiexec)
    specials: bool = False  # a few inf/NaN entries in a, b (and c where it is read)

    # -- shapes ------------------------------------------------------------------
    @property
    def a_shape(self) -> tuple[int, int]:
        return (self.k, self.m) if self.transpose_a else (self.m, self.k)

    @property
    def b_shape(self) -> tuple[int, int]:
        return (self.n, self.k) if self.transpose_b else (self.k, self.n)

    @property
    def has_bias(self) -> bool:
        return has_bias(self.epilog)

    @property
    def grids(self) -> list[ProcessGrid]:
        return [d.grid for d in self.distributions if d.grid is not None]

    # -- what is expected ----------------------------------------------------------
    @property
    def layout_family(self) -> str:
        """The row of the report this case counts in (one of LAYOUT_FAMILIES)."""
        grids = self.grids
        if any(g.size != self.nranks for g in grids):
            return "grid != ranks"
        if self.nranks == 1:
            return "one rank"
        if not grids:
            return "1-D"
        if len(set(grids)) > 1:
            return "different grids"
        return "2-D, one grid" if len(grids) == 3 else "mixed 1-D/2-D"

    def refusals(self) -> tuple[list[Refusal], list[Refusal]]:
        """``(required, allowed)``: errors the product must end in (any one of
        them), and errors it may end in instead of a result.

        * a relu/gelu epilog on complex operands: TypeError naming the epilog;
        * a grid whose size is not the number of ranks: ValueError (or
          DistributionError) naming the grid's shape, its size and the rank count;
        * a named algorithm may not fit the distributions: ValueError naming
          the algorithm and saying what it needs.
        """
        required: list[Refusal] = []
        if self.dtype.startswith("complex") and self.epilog in _COMPLEX_REFUSED:
            required.append(Refusal((TypeError,), (re.escape(repr(self.epilog)), "complex"),
                                    f"epilog={self.epilog!r} on {self.dtype}"))
        for g in dict.fromkeys(self.grids):
            if g.size != self.nranks:
                required.append(Refusal(
                    (ValueError,), (re.escape(str(g.shape)), rf"\b{g.size}\b", rf"\b{self.nranks}\b"),
                    f"grid {g.shape} of {g.size} ranks on {self.nranks}"))
        allowed: list[Refusal] = []
        if self.algorithm != "auto":
            allowed.append(Refusal((ValueError,), (re.escape(repr(self.algorithm)), "needs"),
                                   f"algorithm={self.algorithm!r} may not fit"))
        return required, allowed

    # -- reproduction --------------------------------------------------------------
    def describe(self, backend: str | None = None, *, mpi: bool = False) -> str:
        """A line of Python that makes this product (``rand`` is :func:`rand`)."""
        fam = "" if self.family == "numpy" else f", {self.family!r}"

        def operand(shape: tuple[int, ...], specials: bool = False) -> str:
            return f"rand({shape}, {self.dtype!r}{fam}{', specials=True' if specials else ''})"

        args = [operand(self.a_shape, self.specials), operand(self.b_shape, self.specials)]
        if self.use_c:
            c = operand((self.m, self.n), self.specials and self.beta != 0)
            args.append(c[:-1] + ", fill=float('nan'))" if self.beta == 0 else c)
        dists = ", ".join(_dm_repr(d) for d in self.distributions)
        kw = [f"distribution=({dists})"]
        for name, value, default in (
            ("alpha", self.alpha, 1.0), ("beta", self.beta, 0.0), ("transpose_a", self.transpose_a, False),
            ("transpose_b", self.transpose_b, False), ("epilog", self.epilog, None),
            ("algorithm", self.algorithm, "auto"), ("precision", self.precision, None),
        ):
            if value != default or (name == "beta" and self.use_c):
                kw.append(f"{name}={value!r}")
        if self.has_bias:
            kw.append(f"bias={operand((self.m,))}")
        if backend is not None:
            kw.append(f"backend={backend!r}")
        if not mpi:
            kw.append(f"devices={self.nranks}")
        line = f"dm.matmul({', '.join(args + kw)})"
        if mpi:
            line += f"  # mpiexec -n {self.nranks}: each rank passes its dm.split block of a, b, c"
        elif self.on_mesh is not None:
            line += f"  # {self.on_mesh.describe()} (no devices=)"
        return line


def _dm_repr(d: Distribution) -> str:
    return re.sub(r"\b(Slab|Replicated|BlockCyclic|BlockNonCyclic|ProcessGrid)\b", r"dm.\1", repr(d))


def rand(shape: tuple[int, ...], dtype: str = "float32", family: str = "numpy", *, fill: float | None = None,
         specials: bool = False, seed: int = 0) -> Any:
    """A random operand of ``shape`` (or one full of ``fill``; with
    ``specials``, a few entries inf or NaN), as the lines of
    :meth:`Case.describe` use it: ``from dmatmul._check import rand``."""
    rng = np.random.default_rng(seed)
    x = random_matrix(rng, shape, dtype)
    if fill is not None:
        x[...] = fill
    if specials:
        add_specials(rng, x)
    if family == "jax":
        import jax
        import jax.numpy as jnp

        with jax.enable_x64(dtype in ("float64", "complex128")):
            return jnp.asarray(x)
    return x


def _factorizations(p: int) -> list[tuple[int, int]]:
    return [(r, p // r) for r in range(1, p + 1) if p % r == 0]


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


def _fitting_algorithms(
    nranks: int, dists: tuple[Distribution, Distribution, Distribution], ta: bool, tb: bool
) -> list[str]:
    """The named algorithms whose kernel takes the operands in their given
    roles (Replicated fits wherever a Slab is needed; SUMMA: all on one grid,
    whatever its shape: a BlockNonCyclic on a (P, 1) grid has a 1-D role, and is
    on the grid all the same). Only a hint for drawing: a refusal of any named
    algorithm is accepted."""
    roles = [_plan.role_of(d, op, t, nranks) or "G" for d, op, t in zip(dists, _plan.OPERANDS, (ta, tb, False))]
    grids = {d.grid for d in dists}
    one_grid = len(grids) == 1 and None not in grids
    out = []
    for kernel in _plan.KERNELS:
        want = (kernel.a, kernel.b, kernel.d)
        if kernel.algorithm == "summa":
            if one_grid:
                out.append(kernel.algorithm)
        elif all(g == w or (g == "R" and w != "G") for g, w in zip(roles, want)):
            out.append(kernel.algorithm)
    return [name for name in ALGORITHMS if name in out]


def _draw_dim(draw: Chooser, zero_one_in: int) -> int:
    return 0 if _rarely(draw, zero_one_in) else draw.integer(1, _MAX_DIM)


def draw_case(draw: Chooser, nranks: int, *, families: Sequence[str] = ("numpy", "jax")) -> Case:
    """One random product on ``nranks`` ranks over the whole layout space.

    a, b and the result each get a distribution of any kind, drawn
    independently (one case in four, of the grid kinds only); grid
    distributions get row- or column-major grids of any
    2-D factorization of ``nranks``, an operand's grid being another's or its
    own; block sizes from 1 to larger than the matrix, any first process.
    Sizes 1..40 (uneven, prime, smaller than the rank count), K = 0 about once
    in 12 cases, M or N = 0 about once in 40; every dtype, transposes,
    alpha (0 and complex too), beta with or without C (C full of NaN where
    beta = 0: it must not be read), every epilog (relu/gelu on complex rarely:
    it must be refused), "auto" or (one case in four) a named algorithm,
    mostly one that fits the layouts, numpy or jax operands. One real case
    in eight (alpha != 0; no relu/gelu, whose NaN and -inf conventions differ
    between libraries) has a few inf/NaN entries in a, b and a C that is read:
    the result must hold the same non-finite values where numpy's does, and
    padding must never meet them (0 * inf = NaN).
    """
    dtype = draw.choice(_DTYPES)
    is_complex = dtype.startswith("complex")
    m, n, k = _draw_dim(draw, 40), _draw_dim(draw, 40), _draw_dim(draw, 12)
    ta, tb = draw.boolean(), draw.boolean()
    earlier: list[ProcessGrid] = []
    cyclic: list[BlockCyclic] = []
    # one case in four: every operand on a grid, as a ScaLAPACK code has them (else 2-D-only
    # products are rare among three independent draws)
    kinds = ("BlockNonCyclic", "BlockCyclic") if _rarely(draw, 4) else _KINDS
    da, db, dd = (_draw_distribution(draw, nranks, earlier, cyclic, kinds) for _ in range(3))  # a, b, result
    dists = (da, db, dd)
    alphas = (1.0, 0.5, -1.5, 0.0) + ((0.5 - 0.25j, 1j) if is_complex else (2.25,))
    betas = (0.0, 1.0, -0.5, 2.0) + ((0.5 + 1j,) if is_complex else ())
    alpha, beta = draw.choice(alphas), draw.choice(betas)
    use_c = draw.boolean()
    # complex inf arithmetic is the library's own (C99 Annex G or not); BLAS skips A @ B when alpha = 0
    specials = not is_complex and alpha != 0 and _rarely(draw, 8)
    if specials or (is_complex and not _rarely(draw, 8)):
        epilog = draw.choice((None, "bias"))
    else:
        epilog = draw.choice(EPILOGS)
    algorithm: AlgorithmName = "auto"
    if _rarely(draw, 4):  # a named algorithm: mostly one that fits the layouts (so that it runs), else any one
        fitting = _fitting_algorithms(nranks, dists, ta, tb)
        if fitting and not _rarely(draw, 3):
            algorithm = draw.choice(fitting)
        elif _rarely(draw, 2):
            algorithm = draw.choice(ALGORITHMS)
    family = draw.choice(tuple(families))
    precision = draw.choice(PRECISIONS)
    on_mesh = None
    if family == "jax" and nranks > 1 and _rarely(draw, 3):  # the user's own mesh, eager or traced
        shapes = [(nranks,)] + [s for s in _factorizations(nranks) if min(s) > 1]
        shape = draw.choice(shapes)
        on_mesh = OnMesh(
            shape=shape, explicit=not draw.boolean(), reversed=draw.boolean(),
            call=draw.choice(CALLS), placements=(draw.choice(PLACEMENTS), draw.choice(PLACEMENTS),
                                                 draw.choice(PLACEMENTS)),
            mixed=len(shape) > 1 and _rarely(draw, 3),
        )
    return Case(nranks=nranks, m=m, n=n, k=k, dtype=dtype, transpose_a=ta, transpose_b=tb,
                distributions=dists, alpha=alpha, beta=beta, use_c=use_c, epilog=epilog,
                algorithm=algorithm, family=family, precision=precision, on_mesh=on_mesh, specials=specials)


# --------------------------------------------------------------------------- #
# running a case
# --------------------------------------------------------------------------- #
_ORDER = {"passed": 0, "refused": 1, "failed": 2}


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What became of one case (on one rank, or combined over the ranks)."""

    case: Case
    status: str  # "passed", "refused" or "failed"
    ratio: float = 0.0  # max error / tolerance (<= 1 passes); NaN when no result was compared
    message: str = ""
    backend: str = "jax"
    mpi: bool = False
    label: str = ""  # e.g. the case's index, for the report

    @property
    def layout_family(self) -> str:
        return self.case.layout_family

    def describe(self) -> str:
        return self.case.describe(self.backend, mpi=self.mpi)


def _snapshot(x: Any) -> bytes | None:
    return None if x is None else np.asarray(x).tobytes()


def run_case(case: Case, *, backend: str = "jax", devices: Any = None, rng_seed: int = 0) -> Outcome:
    """Run ``case`` with ``dm.matmul`` and classify the result.

    In one process the operands are global matrices on ``devices`` (default:
    ``case.nranks``); under a multi-process run each rank passes its own
    blocks (``dm.split``) and checks its block of the result. The data comes
    from ``rng_seed`` (the same global matrices on every rank).
    """
    from . import matmul

    rt = _runtime.active()
    mpi = rt is not None and rt.size > 1
    outcome = functools.partial(Outcome, case=case, backend=backend, mpi=mpi)
    rng = np.random.default_rng(rng_seed)
    # the operands: numpy arrays, made jax arrays below for a jax case
    a: Any = random_matrix(rng, case.a_shape, case.dtype)
    b: Any = random_matrix(rng, case.b_shape, case.dtype)
    c: Any = None
    if case.use_c:
        c = random_matrix(rng, (case.m, case.n), case.dtype)
        if case.beta == 0:
            c[...] = np.nan  # must not be read
    bias = random_matrix(rng, (case.m,), case.dtype) if case.has_bias else None
    if case.specials:
        for x in (a, b) if c is None or case.beta == 0 else (a, b, c):
            add_specials(rng, x)
    ref = reference(a, b, c, alpha=case.alpha, beta=case.beta, transpose_a=case.transpose_a,
                    transpose_b=case.transpose_b, epilog=case.epilog, bias=bias)
    scale = finite_scale(ref)
    da, db, dd = case.distributions
    if mpi:
        assert rt is not None

        def local(x: np.ndarray, d: Distribution) -> np.ndarray:
            blocks = split(x, d, nranks=None if d.grid is not None else rt.size)
            return blocks[rt.rank % len(blocks)]  # a grid of another size is refused: any block will do

        a, b = local(a, da), local(b, db)
        c = None if c is None else local(c, dd)
        want_shape = dd.shape(rt.rank, (case.m, case.n), rt.size) if dd.grid is None or dd.grid.size == rt.size \
            else None
        kwargs: dict[str, Any] = {}
    else:
        want_shape = (case.m, case.n)
        kwargs = {"devices": case.nranks if devices is None else devices}
    x64: Any = contextlib.nullcontext()
    on = None if mpi else case.on_mesh
    mesh: Any = None
    if case.family == "jax":
        import jax
        import jax.numpy as jnp

        if case.dtype in ("float64", "complex128"):  # as a user of 64-bit jax arrays runs
            x64 = jax.enable_x64(True)
        with x64:
            a, b = jnp.asarray(a), jnp.asarray(b)
            c = None if c is None else jnp.asarray(c)
            if on is not None:  # placed on the user's mesh, whose devices are then the ranks
                mesh = on.build(jax.devices())
                a, b = on.put(a, mesh, on.placements[0]), on.put(b, mesh, on.placements[1])
                c = None if c is None else on.put(c, mesh, on.placements[2])
                kwargs = {}
    before = [_snapshot(x) for x in (a, b, c, bias)]
    required, allowed = case.refusals()

    def call(a: Any, b: Any, c: Any) -> Any:
        return matmul(a, b, c, distribution=case.distributions, alpha=case.alpha, beta=case.beta,
                      transpose_a=case.transpose_a, transpose_b=case.transpose_b, epilog=case.epilog, bias=bias,
                      backend=cast(BackendName, backend),  # a name of backends.NAMES, checked by matmul
                      algorithm=case.algorithm, precision=case.precision, **kwargs)

    try:
        with x64:
            if on is None or on.call == "eager":
                d = call(a, b, c)
            else:
                import jax

                with jax.set_mesh(mesh) if on.call == "jit under set_mesh" else contextlib.nullcontext():
                    d = jax.jit(lambda: call(a, b, c))() if on.call == "jit on constants" else jax.jit(call)(a, b, c)
    except Exception as e:  # noqa: BLE001 - every exception is classified
        if any(r.matches(e) for r in required + allowed):
            return outcome(status="refused", ratio=math.nan, message=f"{type(e).__name__}: {e}")
        why = f" (expected: {'; '.join(r.why for r in required)})" if required else ""
        return outcome(status="failed", ratio=math.nan, message=f"{type(e).__name__}: {e}{why}")
    problems = []
    if required:
        problems.append(f"no error, expected one: {'; '.join(r.why for r in required)}")
    changed = [name for name, x, x0 in zip(("a", "b", "c", "bias"), (a, b, c, bias), before) if _snapshot(x) != x0]
    if changed:
        problems.append(f"input(s) modified: {', '.join(changed)}")
    fam = family(d)
    if fam != case.family:
        shown = fam if fam != "other" else f"{type(d).__module__}.{type(d).__name__}"
        problems.append(f"result is {shown}, expected {case.family}")
        return outcome(status="failed", ratio=math.nan, message="; ".join(problems))
    if fam == "numpy" and not d.flags.writeable:
        problems.append("numpy result is read-only")
    if mesh is not None and getattr(d.sharding, "mesh", None) != mesh:
        problems.append(f"result not on the operands' mesh: {d.sharding}")
    if np.dtype(d.dtype).name != case.dtype:
        problems.append(f"result dtype {np.dtype(d.dtype).name}, expected {case.dtype}")
    ratio = math.nan
    if want_shape is not None and tuple(d.shape) != tuple(want_shape):
        problems.append(f"result shape {tuple(d.shape)}, expected {tuple(want_shape)}")
    elif want_shape is not None:
        want = split(ref, dd, nranks=rt.size)[rt.rank] if mpi and rt is not None else ref
        try:  # a jax.Array's computation may fail only when it is read
            host = np.asarray(d)
        except Exception as e:  # noqa: BLE001
            problems.append(f"reading the result raised {type(e).__name__}: {e}")
        else:
            ratio = error_ratio(host, want, case.dtype, scale) / _reduced_precision_slack(case, backend)
            if math.isnan(ratio):  # NaN in the result
                ratio = math.inf
            if not ratio <= 1.0:
                problems.append(f"max error {ratio:.3g} x the tolerance")
    if problems:
        return outcome(status="failed", ratio=ratio, message="; ".join(problems))
    return outcome(status="passed", ratio=ratio)


def _reduced_precision_slack(case: Case, backend: str) -> float:
    """How much more error a precision below "highest" may bring: TF32 or
    bf16 passes for float32 on GPUs and TPUs; nothing on CPUs, which compute
    float32 in float32 whatever is asked."""
    if case.precision == "highest" or case.dtype not in ("float32", "complex64"):
        return 1.0
    if backend == "nvmath":
        return 1.0 if case.precision is None or case.precision == "default" else 500.0  # "high": TF32
    jax = sys.modules.get("jax")
    on_cpu = jax is None or jax.default_backend() == "cpu"
    return 1.0 if on_cpu else 1000.0  # 2e-5 x 1000: bf16 passes (DEFAULT) on an accelerator


def combine(outcomes: Sequence[Outcome]) -> Outcome:
    """One outcome from every rank's: a failure on any rank is a failure, and
    ranks that disagree (one refused, another passed) fail."""
    statuses = {o.status for o in outcomes}
    ratios = [o.ratio for o in outcomes if not math.isnan(o.ratio)]
    ratio = max(ratios) if ratios else math.nan
    first = outcomes[0]
    if "failed" in statuses:
        bad = [r for r, o in enumerate(outcomes) if o.status == "failed"]
        msg = outcomes[bad[0]].message
        return dataclasses.replace(first, status="failed", ratio=ratio, message=f"on rank(s) {bad}: {msg}")
    if len(statuses) > 1:
        split_ = {s: [r for r, o in enumerate(outcomes) if o.status == s] for s in sorted(statuses)}
        msgs = "; ".join(o.message for o in outcomes if o.message)
        return dataclasses.replace(first, status="failed", ratio=ratio,
                                   message=f"ranks disagree: {split_}: {msgs}")
    return dataclasses.replace(first, ratio=ratio)


# --------------------------------------------------------------------------- #
# the report
# --------------------------------------------------------------------------- #
def _worst(ratios: list[float]) -> str:
    if not ratios:
        return "-"
    return f"{max(ratios):.2f}"


def report(outcomes: Sequence[Outcome], *, failures: int = 5) -> str:
    """A table by layout family (cases, passed, refused, failed, worst error
    relative to the tolerance) and the first ``failures`` failures."""
    head = f"{'layout family':18s} {'cases':>6s} {'passed':>7s} {'refused':>8s} {'failed':>7s} {'worst err/tol':>14s}"
    lines = [head, "-" * len(head)]
    rows = [f for f in LAYOUT_FAMILIES if any(o.layout_family == f for o in outcomes)]
    for fam in rows + ["total"]:
        mine = [o for o in outcomes if fam == "total" or o.layout_family == fam]
        count = {s: sum(o.status == s for o in mine) for s in _ORDER}
        ratios = [o.ratio for o in mine if o.status != "refused" and not math.isnan(o.ratio)]
        if fam == "total":
            lines.append("-" * len(head))
        lines.append(f"{fam:18s} {len(mine):6d} {count['passed']:7d} {count['refused']:8d} {count['failed']:7d} "
                     f"{_worst(ratios):>14s}")
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        lines.append("")
        lines.append(f"first {min(failures, len(failed))} of {len(failed)} failure(s):")
        for o in failed[:failures]:
            lines.append(f"  [{o.label or o.layout_family}] {o.message}")
            lines.append(f"    {o.describe()}")
    return "\n".join(lines)
