"""The cases of the differential check: what one random product is.

A :class:`Case` says everything about one product (sizes, dtype, the three
distributions, scalars, epilogue, the operands' array families and memory
layouts, the call: eager, jit, on a user's mesh, the stateful form, a JAX
transformation); :meth:`Case.refusals` says which errors it must or may end
in, :meth:`Case.describe` a line of Python that makes it. Needs numpy only.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from .. import _plan, _roles
from .._distribution import Distribution, ProcessGrid
from .._sharded import Sharded
from .._epilogue import TABLE, EpilogName, has_bias
from .._mxfp8 import scale_shape
from .._spec import ALGORITHMS, DTYPES, FP8_DTYPES, AlgorithmName, PrecisionName
from .placement import CALLS, PLACEMENTS, OnMesh

__all__ = [
    "Case", "OnMesh", "Refusal", "Reset", "Transform", "LAYOUT_FAMILIES", "NRANKS", "PLACEMENTS", "CALLS",
    "LAYOUTS", "BIAS_KINDS", "TRANSFORMS", "MATMUL_PRECISIONS",
]

#: the rank counts the matrix covers in one process (each has its own grid shapes; 5 and 7 are prime)
NRANKS = (1, 2, 3, 4, 5, 6, 7, 8)
#: the table's rows, in order
LAYOUT_FAMILIES = ("one rank", "1-D", "mixed 1-D/2-D", "2-D, one grid", "different grids", "grid != ranks",
                   "distribution=None", "N-D Sharded")
#: how a numpy operand is laid out in memory (:func:`lay_out`), simplest first; the last three are
#: only for matrices (a 1-D bias is both C and F), byte-swapped not for bfloat16 (ml_dtypes has no swapped form)
LAYOUTS = ("C", "strided", "negative strides", "read-only", "byte-swapped", "F", ".T view")
_VECTOR_LAYOUTS = LAYOUTS[:5]
#: what a bias is passed as: a numpy array, a jax.Array, or a Python list
BIAS_KINDS = ("numpy", "jax", "list")

_KINDS = ("Slab.X", "Slab.Y", "Replicated", "BlockNonCyclic", "BlockCyclic")
_DTYPES = ("float32", "float64", "float16", "bfloat16", "complex64", "complex128")  # simplest first
_COMPLEX_REFUSED = tuple(name for name, e in TABLE.items() if not e.complex)
_BLOCK_SIZES = (1, 2, 3, 4, 5, 8, 64)  # 64: larger than most drawn dimensions
_MAX_DIM = 40
_LARGE_DIM = 180  # now and then a dimension of 41.._LARGE_DIM (many blocks per rank), kept rare: ~1 s a case
#: FP8 a and b (drawn apart, last: a case of a result type made FP8, :func:`dmatmul.testing.draw.draw_case`)
_SCALES = (None, (0.5, 2.0), (0.25, 1.0), (3.0, 0.125))
#: MXFP8's UE8M0 block scales drawn (both ends included): 2**-7 .. 2**7, every dequantized value finite; for
#: a float16 result 2**-6 .. 2**3 (a product of two scales at most 2**6: float16's 65504 is not reached)
MX_SCALES = (120, 134)
MX_SCALES_FLOAT16 = (121, 130)
#: the array family of MXFP8's block scales: numpy, or each its operand's (a jax.Array for a jax operand)
SCALE_FAMILIES = ("numpy", "operands")
assert set(_DTYPES) | set(FP8_DTYPES) == set(DTYPES)


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


#: the ``jax.default_matmul_precision`` a case may run in: ``precision=None`` follows it on the JAX
#: backend (as ``jnp.dot``), an explicit ``precision=`` overrides it, nvmath's default ignores it
MATMUL_PRECISIONS = ("highest", "float32", "high", "tensorfloat32", "default", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Reset:
    """The stateful form of a case: ``with dm.Matmul(...) as mm``, ``mm.plan()``
    (or not: execute() plans), ``mm.execute()`` twice, then
    ``mm.reset_operands(...)`` with new values for ``operands`` (same shapes,
    dtypes, families, layouts and placements) and a new ``alpha``/``beta``
    where not None, and ``mm.execute()`` again; each result is checked, and
    the first again after the reset (a result the caller owns). Under
    mpiexec one rank (``told``) may read ``mm.algorithm`` and
    ``mm.explain()`` alone before anything else, and the plan made after must
    have the algorithm it was told. With ``tune``, ``mm.autotune(iterations=1,
    candidates=2)`` after the plan (where it refuses, only as it must: a
    product of no routes of the JAX backend's to time)."""

    plan: bool = False
    operands: tuple[str, ...] = ()  # of "a", "b", "c", "bias"
    alpha: complex | None = None
    beta: complex | None = None
    told: int | None = None  # under mpiexec, the rank that alone reads mm.algorithm and mm.explain() first
    tune: bool = False  # mm.autotune(iterations=1, candidates=2) after the plan (never with ``told``)

    def call(self, new: Sequence[str]) -> str:
        """The ``reset_operands`` call, ``new`` the source of each new operand."""
        args = [f"{name}={src}" for name, src in zip(self.operands, new)]
        args += [f"{name}={v!r}" for name, v in (("alpha", self.alpha), ("beta", self.beta)) if v is not None]
        return f"mm.reset_operands({', '.join(args)})"


#: how the stateful form is autotuned where :attr:`Reset.tune` says so
TUNE = "mm.autotune(iterations=1, candidates=2)"
#: why Matmul.autotune may refuse a product (the only refusals a drawn case accepts): it has no routes of the JAX
#: backend's to time
TUNE_REFUSALS = ("backend's plan of this product weighs no routes", "a batched, re-laid or empty product")

#: the JAX transformations drawn around dm.matmul (:class:`Transform`)
TRANSFORMS = ("vjp", "jvp", "vmap")


@dataclasses.dataclass(frozen=True)
class Transform:
    """A JAX transformation around ``dm.matmul`` (one process, jax.Array
    operands), over the case's jax operands (:attr:`Case.traced`):

    * ``"vjp"``: ``jax.vjp`` for a random cotangent of the result's shape and
      dtype (eagerly on a mesh with Explicit axes, laid out as the result, as
      a JAX user's is): the primal result and a gradient for each (checked
      against :func:`dmatmul.testing.reference_vjp`);
    * ``"jvp"``: ``jax.jvp`` for random tangents of each: the primal result
      and its tangent (:func:`dmatmul.testing.reference_jvp`);
    * ``"vmap"``: ``jax.vmap`` over ``batched`` (a or b), stacked ``size``
      times along its ``axis`` (0: leading, 2: trailing), the other operands
      unbatched; the result has the batch axis first, each of its matrices
      laid out as a result of the case is (checked against numpy, one product
      per batch element). On a user's mesh the batched operand is placed as
      its matrices would be, the batch axis not split.

    The case's call (eager, ``jit``, on a user's mesh...) wraps the
    transformation: ``jax.jit(lambda ...: jax.vjp(...))``."""

    kind: str  # one of TRANSFORMS
    batched: str = "a"  # vmap: the operand with a batch axis
    size: int = 2  # vmap: its length
    axis: int = 0  # vmap: its position in the batched operand

    def describe(self) -> str:
        if self.kind == "vmap":
            return f"jax.vmap over {self.batched}'s axis {self.axis} ({self.size})"
        return f"jax.{self.kind}"


@dataclasses.dataclass(frozen=True)
class Case:
    """One product: ``epilog(alpha * op(A) @ op(B) + beta * C [+ bias])`` on
    ``nranks`` ranks with the stored operands distributed as ``distributions``
    says (a, b, result; None: ``distribution=None``, dmatmul picks)."""

    nranks: int
    m: int
    n: int
    k: int
    dtype: str
    transpose_a: bool
    transpose_b: bool
    distributions: tuple[Distribution, Distribution, Distribution] | None
    alpha: complex = 1.0
    beta: complex = 0.0
    use_c: bool = False
    epilog: EpilogName | None = None
    algorithm: AlgorithmName = "auto"
    family: str = "numpy"  # the result's: jax where any of a, b, c is a jax.Array
    precision: PrecisionName | None = None
    on_mesh: OnMesh | None = None  # jax operands on a user's mesh (ignored under mpiexec)
    specials: bool = False  # a few inf/NaN entries in a, b (and c where it is read)
    single: bool = False  # distribution= one Distribution (the three of ``distributions`` are equal)
    families: tuple[str, str, str] | None = None  # a, b, c each its own family (None: all ``family``)
    layouts: tuple[str, str, str, str] = ("C", "C", "C", "C")  # numpy a, b, c, bias in memory (:data:`LAYOUTS`)
    bias_column: bool = False  # bias of shape (M, 1), not (M,)
    bias_per_column: bool = False  # bias of shape (1, N): one value per result column (``x @ W + b``)
    bias_dtype: str | None = None  # None: the operands'
    bias_kind: str = "numpy"  # one of BIAS_KINDS
    device_ids: tuple[int, ...] | None = None  # devices=[jax.devices()[i] for i in device_ids], not devices=nranks
    jit: bool = False  # dm.matmul inside jax.jit, jax operands its arguments (not on a mesh: it has its own calls)
    reset: Reset | None = None  # the stateful form (dm.Matmul), not dm.matmul
    transform: Transform | None = None  # a JAX transformation around dm.matmul (one process, jax operands)
    schedule: _plan.Schedule | None = None  # forced on the kernels that have it (_plan.schedule); None: the model's
    matmul_precision: str | None = None  # the call runs in jax.default_matmul_precision(it) (MATMUL_PRECISIONS)
    scales: tuple[float, float] | None = None  # FP8: quantization_scales={"a": sa, "b": sb} (None: not given)
    result_type: str | None = None  # FP8: result_type= (None: not given, bfloat16)
    #: MXFP8: uint8 block scales of a and b (one per 32 elements along K) in this family (SCALE_FAMILIES);
    #: None: per-tensor ``scales`` or none
    block_scales: str | None = None
    a_batch: tuple[int, ...] = ()  # a's leading batch dimensions (broadcast against b's as numpy.matmul does)
    b_batch: tuple[int, ...] = ()  # b's

    @property
    def result_dtype(self) -> str:
        """The dtype of c and of the result (``result_type`` for FP8 a and b)."""
        return (self.result_type or "bfloat16") if self.dtype in FP8_DTYPES else self.dtype

    @property
    def fp8_options(self) -> dict[str, Any]:
        """The FP8 keywords the case passes (none where it gives none)."""
        out: dict[str, Any] = {}
        if self.scales is not None:
            out["quantization_scales"] = {"a": self.scales[0], "b": self.scales[1]}
        if self.result_type is not None:
            out["result_type"] = self.result_type
        return out

    @property
    def scale_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """MXFP8: the shapes of a's and b's block scales (their stored shapes with K counted in blocks of 32)."""
        return (scale_shape(self.a_shape, -2 if self.transpose_a else -1),
                scale_shape(self.b_shape, -1 if self.transpose_b else -2))

    @property
    def scale_range(self) -> tuple[int, int]:
        """MXFP8: the range of the block scales drawn (:data:`MX_SCALES`), narrower for a float16 result."""
        return MX_SCALES_FLOAT16 if self.result_dtype == "float16" else MX_SCALES

    @property
    def scaled(self) -> float:
        """``sa * sb``: what the reference multiplies alpha by."""
        return 1.0 if self.scales is None else self.scales[0] * self.scales[1]

    # -- shapes ------------------------------------------------------------------
    @property
    def a_shape(self) -> tuple[int, ...]:
        return self.a_batch + ((self.k, self.m) if self.transpose_a else (self.m, self.k))

    @property
    def b_shape(self) -> tuple[int, ...]:
        return self.b_batch + ((self.n, self.k) if self.transpose_b else (self.k, self.n))

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """The result's batch dimensions: a's and b's broadcast (``numpy.matmul``)."""
        return _broadcast(self.a_batch, self.b_batch)

    @property
    def result_shape(self) -> tuple[int, ...]:
        """The shape of c and of the result: ``batch_shape + (m, n)``."""
        return self.batch_shape + (self.m, self.n)

    @property
    def bias_shape(self) -> tuple[int, ...]:
        if self.bias_per_column:
            return (1, self.n)
        return (self.m, 1) if self.bias_column else (self.m,)

    @property
    def has_bias(self) -> bool:
        return has_bias(self.epilog)

    @property
    def grids(self) -> list[ProcessGrid]:
        return [d.grid for d in self.matrix_distributions or () if d is not None and d.grid is not None]

    @property
    def matrix_distributions(self) -> tuple[Distribution | None, Distribution | None, Distribution | None] | None:
        """The distributions as ``dm.matmul`` reads them: a :class:`~dmatmul.Sharded` as its
        2-D form (:meth:`~dmatmul.Sharded.as_2d`), None where it has none."""
        if self.distributions is None:
            return None
        a, b, d = (x.as_2d() if isinstance(x, Sharded) else x for x in self.distributions)
        return a, b, d

    @property
    def shardeds(self) -> list[Sharded]:
        """The :class:`~dmatmul.Sharded` distributions of a, b and the result (each once)."""
        return list(dict.fromkeys(d for d in self.distributions or () if isinstance(d, Sharded)))

    @property
    def nd_sharded(self) -> bool:
        """Whether a distribution is a Sharded with no 2-D form (partial replication, axes out of
        rank order, batch dimensions named): ``dm.matmul`` may refuse it (:meth:`refusals`)."""
        return any(d.as_2d() is None for d in self.shardeds)

    @property
    def distribution(self) -> Distribution | tuple[Distribution, Distribution, Distribution] | None:
        """What ``distribution=`` is given."""
        if self.distributions is not None and self.single:
            return self.distributions[0]
        return self.distributions

    @property
    def reads_c(self) -> bool:
        """Whether c is read: given, with a beta that is not 0 (before or after a reset)."""
        return self.use_c and (self.beta != 0 or (self.reset is not None and self.reset.beta not in (None, 0)))

    def family_of(self, name: str) -> str:
        """The array family of operand ``name`` (a, b or c)."""
        return self.family if self.families is None else self.families["abc".index(name)]

    @property
    def traced(self) -> tuple[str, ...]:
        """The operands a :class:`Transform` is taken over: the jax.Arrays
        among a, b, c (where given) and bias (where it is one), in that order;
        the others are closed over."""
        names = [n for n in ("a", "b") + ("c",) * self.use_c if self.family_of(n) == "jax"]
        return tuple(names) + ("bias",) * (self.has_bias and self.bias_kind == "jax")

    # -- what is expected ----------------------------------------------------------
    @property
    def layout_family(self) -> str:
        """The row of the report this case counts in (one of LAYOUT_FAMILIES)."""
        grids = self.grids
        if any(g.size != self.nranks for g in grids):
            return "grid != ranks"
        if self.distributions is None:
            return "distribution=None"
        if self.nd_sharded:
            return "N-D Sharded"
        if self.nranks == 1:
            return "one rank"
        if not grids:
            return "1-D"
        if len(set(grids)) > 1:
            return "different grids"
        return "2-D, one grid" if len(grids) == 3 else "mixed 1-D/2-D"

    def refusals(self, backend: str | None = None) -> tuple[list[Refusal], list[Refusal]]:
        """``(required, allowed)``: errors the product must end in (any one of
        them), and errors it may end in instead of a result.

        * a relu/gelu epilog on complex operands: TypeError naming the epilog;
        * a complex bias on real operands: TypeError naming bias (its
          imaginary part would be lost); so is a complex alpha or beta,
          naming it;
        * a beta that is not 0 (given, or in a reset) without c: ValueError
          saying that beta needs c;
        * a grid whose size is not the number of ranks: ValueError (or
          DistributionError) naming the grid's shape, its size and the rank count;
        * with ``distribution=None``, a, b or (where it is read) c placed on a
          mesh as none of dmatmul's distributions: ValueError naming the operand and its
          sharding (allowed, not required, inside ``jax.jit`` on Auto axes,
          whose types say nothing);
        * a named algorithm that does not fit the distributions by roles
          (:func:`_fitting_algorithms`; with distribution=None, operands on a
          user's mesh whose layouts it does not take): ValueError naming the
          algorithm and saying what it needs; one that re-lays any layout
          (summa25d) on a rank count not its own, and on ``backend="nvmath"``
          always (:meth:`_relaid_refusals`).

        A :class:`~dmatmul.Sharded` with no 2-D form (:attr:`nd_sharded`) is
        no refusal: ``dm.matmul`` re-lays it, and its result is checked as any
        other.
        """
        required: list[Refusal] = []
        allowed: list[Refusal] = []
        if self.dtype.startswith("complex") and self.epilog in _COMPLEX_REFUSED:
            required.append(Refusal((TypeError,), (re.escape(repr(self.epilog)), "complex"),
                                    f"epilog={self.epilog!r} on {self.dtype}"))
        for name, value in (("alpha", self.alpha), ("beta", self.beta)):
            if isinstance(value, complex) and not self.dtype.startswith("complex"):
                required.append(Refusal((TypeError,), (rf"\b{name}=", "complex", re.escape(self.dtype)),
                                        f"{name}={value!r} on {self.dtype}"))
        for beta in (self.beta, None if self.reset is None else self.reset.beta):
            if not self.use_c and beta not in (None, 0):
                required.append(Refusal((ValueError,), (r"\bbeta=", r"needs c\b"), f"beta={beta!r} without c"))
                break
        if self.has_bias and (self.bias_dtype or self.dtype).startswith("complex") \
                and not self.dtype.startswith("complex") and not (self.bias_kind == "list" and 0 in self.bias_shape):
            # (an empty list has no dtype: no complex number in it to refuse)
            required.append(Refusal((TypeError,), (r"\bbias\b", "complex", re.escape(self.dtype)),
                                    f"bias={self.bias_dtype} on {self.dtype}"))
        if self.block_scales is not None and self.reset is not None and {"a", "b"} & set(self.reset.operands):
            # a and b are dequantized with their block scales when the plan is made: new ones need a new plan
            required.append(Refusal((ValueError,), (r"^reset_operands: [ab]'s block scales \(MXFP8\)",
                                                    "make a new Matmul"),
                                    "reset of a or b after MXFP8 block scales were applied"))
        on = self.on_mesh
        if on is not None and self.distributions is None:  # read off shardings that are none of dmatmul's
            traced_auto = on.call in ("jit", "jit under set_mesh") and (not on.explicit or on.mixed)
            read = (("a", self.a_shape[-2:]), ("b", self.b_shape[-2:])) + ((("c", (self.m, self.n)),) if self.reads_c else ())
            # shardings that leave a mesh axis independent are a product (C read says the result's: not split)
            # (a numpy operand, placed nowhere, is whole on the other's mesh)
            fa, fb = self.family_of("a"), self.family_of("b")
            split = (not self.reads_c and "jax" in (fa, fb)
                     and on.splits((on.placements[0] if fa == "jax" else "none", self.a_shape[-2:]),
                                   (on.placements[1] if fb == "jax" else "none", self.b_shape[-2:]),
                                   (self.transpose_a, self.transpose_b)))
            for (name, shape), placement in zip(read if not split else (), on.placements):
                if self.family_of(name) == "jax" and not on.is_dmatmuls(placement, shape):
                    # inside jit an Auto axis says nothing: dmatmul may then pick
                    (allowed if traced_auto else required).append(Refusal(
                        (ValueError,), (rf"^{name}: its sharding", "not one of dmatmul's distributions"),
                        f"{name}'s sharding ({placement}) is not one of dmatmul's distributions"))
        for g in dict.fromkeys(self.grids):
            if g.size != self.nranks:
                required.append(Refusal(
                    (ValueError,), (re.escape(str(g.shape)), rf"\b{g.size}\b", rf"\b{self.nranks}\b"),
                    f"grid {g.shape} of {g.size} ranks on {self.nranks}"))
        nd = self.nd_sharded  # (dm.matmul takes every Sharded: one with no 2-D form is re-laid, never refused)
        # a named algorithm runs where it fits the layouts by roles, and with distribution=None on operands of
        # no mesh (the model picks among the layouts it takes)
        dists = self.matrix_distributions
        if self.algorithm != "auto" and _plan.ALGORITHMS[self.algorithm].relays:
            required.extend(self._relaid_refusals(backend))
            if dists is None and self.on_mesh is not None:
                # shardings that leave mesh axes independent run it on each group of ranks: not its rank count
                allowed.append(Refusal((ValueError,), (re.escape(repr(self.algorithm)), "needs"),
                                       f"algorithm={self.algorithm!r} on a group of the mesh's ranks"))
        elif self.algorithm != "auto" and not (
                (dists is None and self.on_mesh is None)
                or (dists is not None and not nd and self.algorithm in _fitting_algorithms(
                    self.nranks, dists, self.transpose_a, self.transpose_b))):  # type: ignore[arg-type]
            allowed.append(Refusal((ValueError,), (re.escape(repr(self.algorithm)), "needs"),
                                   f"algorithm={self.algorithm!r} may not fit"))
        return required, allowed

    def _relaid_refusals(self, backend: str | None) -> list[Refusal]:
        """A named algorithm that re-lays any layout (2.5-D SUMMA) runs wherever
        the rank count is its own, on JAX; it must refuse any other count, and
        on nvmath always (nvmath 1.0 runs cuBLASMp on one communicator, none per
        layer: dmatmul.backends.nvmath._translate.refuse_layered)."""
        alg = _plan.ALGORITHMS[self.algorithm]
        if backend == "nvmath":
            return [Refusal((ValueError,), (re.escape(repr(self.algorithm)), "needs"),
                            f"algorithm={self.algorithm!r} has no nvmath path")]
        if not alg.runs_on(_plan.Problem1D(1, 1, 1, self.nranks, 4, 4)):
            return [Refusal((ValueError,), (re.escape(repr(self.algorithm)), "needs", rf"\b{self.nranks}\b"),
                            f"algorithm={self.algorithm!r} on {self.nranks} ranks")]
        return []

    # -- reproduction --------------------------------------------------------------
    def describe(self, backend: str | None = None, *, mpi: bool = False) -> str:
        """A line of Python that makes this product (``rand`` is :func:`rand`;
        ``dm``, ``np`` and ``jax`` the modules)."""

        def operand(name: str, shape: tuple[int, ...], specials: bool = False, seed: int = 0,
                    fill: bool = False) -> str:
            if name == "bias":
                dtype, fam, layout = self.bias_dtype or self.dtype, self.bias_kind, self.layouts[3]
            else:
                dtype, fam, layout = (self.result_dtype if name == "c" else self.dtype), self.family_of(name), \
                    self.layouts["abc".index(name)]
            opts = [repr(shape), repr(dtype)]
            if fam == "jax":
                opts.append("'jax'")
            if fill:
                opts.append("fill=float('nan')")
            if specials:
                opts.append("specials=True")
            if layout != "C" and fam != "jax":
                opts.append(f"layout={layout!r}")
            if seed:
                opts.append(f"seed={seed}")
            return f"rand({', '.join(opts)}){'.tolist()' if fam == 'list' else ''}"

        def c_operand(beta: complex, seed: int = 0) -> str:
            return operand("c", self.result_shape, self.specials and beta != 0, seed, fill=beta == 0)

        args = [operand("a", self.a_shape, self.specials), operand("b", self.b_shape, self.specials)]
        if self.use_c:
            args.append(c_operand(self.beta))
        kw = []
        if self.distributions is not None:
            dist = self.distribution
            shown = _dm_repr(dist) if isinstance(dist, Distribution) else \
                f"({', '.join(_dm_repr(d) for d in self.distributions)})"
            kw.append(f"distribution={shown}")
        for name, value, default in (
            ("alpha", self.alpha, 1.0), ("beta", self.beta, 0.0), ("transpose_a", self.transpose_a, False),
            ("transpose_b", self.transpose_b, False), ("epilog", self.epilog, None),
            ("algorithm", self.algorithm, "auto"), ("precision", self.precision, None),
        ):
            if value != default or (name == "beta" and self.use_c):
                kw.append(f"{name}={value!r}")
        kw.extend(f"{name}={value!r}" for name, value in self.fp8_options.items())
        if self.block_scales is not None:
            fams = [self.family_of(n) if self.block_scales == "operands" else "numpy" for n in "ab"]
            opts = [", 'jax'" if fam == "jax" else "" for fam in fams]
            within = f", within={self.scale_range!r}" if self.scale_range != MX_SCALES else ""
            made = [f"rand_scales({shape!r}{opt}{within})" for shape, opt in zip(self.scale_shapes, opts)]
            kw.append(f"quantization_scales={{'a': {made[0]}, 'b': {made[1]}}}")
        if self.has_bias:
            kw.append(f"bias={operand('bias', self.bias_shape)}")
        if backend is not None:
            kw.append(f"backend={backend!r}")
        if not mpi and self.on_mesh is None:
            kw.append(f"devices={self.nranks}" if self.device_ids is None else
                      f"devices=[jax.devices()[i] for i in {self.device_ids!r}]")
        if self.reset is not None:
            r = self.reset
            beta = self.beta if r.beta is None else r.beta
            new = [c_operand(beta, seed=1) if name == "c" else
                   operand(name, self.bias_shape if name == "bias" else getattr(self, f"{name}_shape"),
                           self.specials and name != "bias", seed=1)
                   for name in r.operands]
            steps = ([] if r.told is None else [f"if rank == {r.told}: print(mm.algorithm, mm.explain())"]) \
                + ["mm.plan()"] * r.plan + [TUNE] * r.tune + ["d1 = mm.execute()", "d2 = mm.execute()", r.call(new), "d3 = mm.execute()"]
            line = f"with dm.Matmul({', '.join(args + kw)}) as mm: {'; '.join(steps)}"
        elif self.transform is not None and not mpi:
            line = self._transformed_line(args, kw, operand)
        elif self.jit and not mpi and self.on_mesh is None:  # jax operands its arguments, numpy ones constants
            traced = [name for name in "abc"[: len(args)] if self.family_of(name) == "jax"]
            inside = [name if name in traced else arg for name, arg in zip("abc", args)]
            line = (f"jax.jit(lambda {', '.join(traced)}: dm.matmul({', '.join(inside + kw)}))"
                    f"({', '.join(arg for name, arg in zip('abc', args) if name in traced)})")
        else:
            line = f"dm.matmul({', '.join(args + kw)})"
        forced = ([f"dm._plan.schedule({self.schedule!r})"] * (self.schedule is not None)
                  + [f"jax.default_matmul_precision({self.matmul_precision!r})"] * (self.matmul_precision is not None))
        for item in reversed(forced):  # (one line: the stateful form's with gets them as its first items)
            line = f"with {item}, {line[5:]}" if line.startswith("with ") else f"with {item}: {line}"
        if mpi:
            line += f"  # mpiexec -n {self.nranks}: each rank passes its dm.split block of a, b, c"
            if self.block_scales is not None:
                line += " and the block scales of its blocks of a and b"
        elif self.on_mesh is not None:
            batched = " (the batch axis not split)" if self.transform and self.transform.kind == "vmap" else ""
            line += f"  # {self.on_mesh.describe()}{batched} (no devices=)"
        return line

    def _transformed_line(self, args: list[str], kw: list[str], operand: Any) -> str:
        """The line of a case with a :class:`Transform`: the transformation of a
        lambda of the traced operands (:attr:`traced`), jitted where the case is."""
        t = self.transform
        assert t is not None
        names = self.traced
        shapes = {"a": self.a_shape, "b": self.b_shape, "c": self.result_shape, "bias": self.bias_shape}
        inner = [name if name in names else arg for name, arg in zip("abc", args)]
        inner_kw = ["bias=bias" if k.startswith("bias=") and "bias" in names else k for k in kw]
        f = f"lambda {', '.join(names)}: dm.matmul({', '.join(inner + inner_kw)})"
        given = dict(zip("abc", args))
        if self.has_bias:
            given["bias"] = operand("bias", self.bias_shape)

        def tup(items: Sequence[str]) -> str:
            return f"({', '.join(items)}{',' if len(items) == 1 else ''})"

        ns = ", ".join(names)
        jit = self.jit and self.on_mesh is None
        if t.kind == "vjp":
            prims = ", ".join(given[n] for n in names)
            cot = f"rand({self.result_shape!r}, {self.dtype!r}, 'jax', seed=2)"
            if jit:
                return f"jax.jit(lambda {ns}, g: jax.vjp({f}, {ns})[1](g))({prims}, {cot})"
            if self.on_mesh is not None and self.on_mesh.call == "eager" and (self.on_mesh.explicit or self.on_mesh.mixed):
                return f"(lambda d, pull: pull(jax.device_put({cot}, d.sharding)))(*jax.vjp({f}, {prims}))"
            return f"jax.vjp({f}, {prims})[1]({cot})"
        if t.kind == "jvp":
            prims = tup([given[n] for n in names])
            tans = tup([operand(n, shapes[n], seed=2 + i) for i, n in enumerate(names)])
            if jit:
                return f"jax.jit(lambda p, t: jax.jvp({f}, p, t))({prims}, {tans})"
            return f"jax.jvp({f}, {prims}, {tans})"
        shape = list(shapes[t.batched])
        shape.insert(t.axis, t.size)
        prims = ", ".join(operand(n, tuple(shape)) if n == t.batched else given[n] for n in names)
        in_axes = tuple(t.axis if n == t.batched else None for n in names)
        core = f"jax.vmap({f}, in_axes={in_axes!r})"
        return f"{'jax.jit(' + core + ')' if jit else core}({prims})"


def _dm_repr(d: Distribution) -> str:
    return re.sub(r"\b(Slab|Replicated|BlockCyclic|BlockNonCyclic|ProcessGrid|Sharded|ProcessMesh)\b", r"dm.\1",
                  repr(d))


def _broadcast(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...]:
    """Batch shapes broadcast as numpy does (the ones drawn always broadcast)."""
    n = max(len(x), len(y))
    x, y = (1,) * (n - len(x)) + x, (1,) * (n - len(y)) + y
    return tuple(i if j == 1 else j for i, j in zip(x, y))


def _factorizations(p: int) -> list[tuple[int, int]]:
    return [(r, p // r) for r in range(1, p + 1) if p % r == 0]

def _fitting_algorithms(
    nranks: int, dists: tuple[Distribution, Distribution, Distribution], ta: bool, tb: bool
) -> list[str]:
    """The named algorithms whose kernel takes the operands in their given
    roles (Replicated fits wherever a Slab is needed for a or b, not for the
    result: that would be another algorithm; SUMMA: all on one grid, whatever
    its shape: a BlockNonCyclic on a (P, 1) grid has a 1-D role, and is on the
    grid all the same). These must run (docs/guide.md: a named algorithm that does
    not fit raises); a refusal of any other is accepted."""
    roles = [_roles.role_of(d, op, t, nranks) or "G" for d, op, t in zip(dists, _plan.OPERANDS, (ta, tb, False))]
    grids = {d.grid for d in dists}
    one_grid = len(grids) == 1 and None not in grids
    out = []
    for kernel in _plan.KERNELS:
        want = (kernel.a, kernel.b, kernel.d)
        if _plan.ALGORITHMS[kernel.algorithm].grid:
            if one_grid:
                out.append(kernel.algorithm)
        elif _plan.ALGORITHMS[kernel.algorithm].relays:  # any layout, re-laid: where the rank count is its own
            if _plan.ALGORITHMS[kernel.algorithm].runs_on(_plan.Problem1D(1, 1, 1, nranks, 4, 4)):
                out.append(kernel.algorithm)
        elif all(g == w or (g == "R" and w != "G" and op != "d") for g, w, op in zip(roles, want, "abd")):
            out.append(kernel.algorithm)
    return [name for name in ALGORITHMS if name in out]
