"""Random products over the whole layout space, checked against numpy.

One generator, three drivers: ``dmatmul check`` (a numpy ``Generator`` makes
the choices), the hypothesis test of ``tests/test_conformance.py`` (hypothesis
makes them, on every backend, so it shrinks a failure to the simplest case), and ``mpiexec -n P
dmatmul check`` (every rank draws the same cases and passes its own blocks).

* :func:`draw_case` draws a :class:`Case` through a *chooser*: any object with
  ``choice(seq)``, ``integer(lo, hi)`` (both ends included) and ``boolean()``.
  Choices are ordered simplest first, so a shrinking chooser shrinks towards
  float32, Slab.X, small sizes, no transposes, "auto".
* :func:`run_case` builds the operands, calls :func:`dmatmul.matmul` (or a
  JAX transformation of it: :class:`Transform`) and
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
from ._epilogue import EPILOGS, TABLE, EpilogName, has_bias
from ._spec import (
    ALGORITHMS, DTYPES, PRECISIONS, AlgorithmName, BackendName, PrecisionName, family, normalize_precision,
)
from ._reference import (
    TOLERANCE, add_specials, error_ratio, finite_scale, random_matrix, reference, reference_jvp, reference_vjp,
)

__all__ = [
    "Chooser", "NumpyChooser", "Case", "Outcome", "Refusal", "Reset", "draw_case", "run_case", "combine", "report",
    "LAYOUT_FAMILIES", "NRANKS", "OnMesh", "PLACEMENTS", "CALLS", "LAYOUTS", "BIAS_KINDS", "lay_out", "rand",
    "Transform", "TRANSFORMS",
]

#: the rank counts the matrix covers in one process (each has its own grid shapes; 5 and 7 are prime)
NRANKS = (1, 2, 3, 4, 5, 6, 7, 8)
#: the table's rows, in order
LAYOUT_FAMILIES = ("one rank", "1-D", "mixed 1-D/2-D", "2-D, one grid", "different grids", "grid != ranks",
                   "distribution=None")
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


#: how a jax.Array operand is placed on a user's mesh (:class:`OnMesh`), simplest first; on a 2-D
#: mesh the last two are none of dmatmul's distributions (rows over one axis, replicated over the
#: other; rows over both axes, not in mesh order): distribution=None must refuse them
PLACEMENTS = ("none", "rows", "cols", "grid", "first axis", "reversed axes")
#: how dm.matmul is called on such operands
CALLS = ("eager", "jit", "jit under set_mesh", "jit on constants")
#: the ``jax.default_matmul_precision`` a case may run in: ``precision=None`` follows it on the JAX
#: backend (as ``jnp.dot``), an explicit ``precision=`` overrides it, nvmath's default ignores it
MATMUL_PRECISIONS = ("highest", "float32", "high", "tensorfloat32", "default", "bfloat16")


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
    over the first and columns over the rest, rows over the first axis only,
    rows over every axis in reverse order; unsplit where it would not
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

    def spec(self, placement: str, shape: Sequence[int]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The mesh axes that split the rows and the columns of a matrix of
        ``shape`` placed as ``placement`` says (none where it would not split evenly)."""
        names = ("data", "model")[: len(self.shape)]
        sizes = dict(zip(names, self.shape))
        spec = {
            "none": ((), ()), "rows": (names, ()), "cols": ((), names),
            "grid": (names[:1], names[1:]) if len(names) > 1 else (names, ()),
            "first axis": (names[:1], ()), "reversed axes": (names[::-1], ()),
        }[placement]
        if any(size % math.prod(sizes[a] for a in axes) for axes, size in zip(spec, shape)):
            return ((), ())
        return spec

    def is_dmatmuls(self, placement: str, shape: Sequence[int]) -> bool:
        """Whether the placement is one of dmatmul's distributions (docs/jax.md, "Your
        mesh in, your mesh out"): nothing split, or rows or columns over every
        mesh axis in mesh order, or rows over the leading axes and columns over
        the trailing ones (or the other way round)."""
        rows, cols = self.spec(placement, shape)
        names = ("data", "model")[: len(self.shape)]
        return not rows + cols or rows + cols == names or cols + rows == names

    def put(self, x: Any, mesh: Any, placement: str, batch_axis: int | None = None) -> Any:
        """``x`` on ``mesh`` (this mesh, built) as ``placement`` says (unsplit where that would not split evenly);
        a stack of matrices along ``batch_axis`` with each matrix so placed, the batch axis not split."""
        import jax
        from jax.sharding import NamedSharding, PartitionSpec

        shape = list(x.shape)
        if batch_axis is not None:
            del shape[batch_axis]
        spec: list[Any] = [axes or None for axes in self.spec(placement, shape)]
        if batch_axis is not None:
            spec.insert(batch_axis, None)
        return jax.device_put(x, NamedSharding(mesh, PartitionSpec(*spec)))


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
    have the algorithm it was told."""

    plan: bool = False
    operands: tuple[str, ...] = ()  # of "a", "b", "c", "bias"
    alpha: complex | None = None
    beta: complex | None = None
    told: int | None = None  # under mpiexec, the rank that alone reads mm.algorithm and mm.explain() first

    def call(self, new: Sequence[str]) -> str:
        """The ``reset_operands`` call, ``new`` the source of each new operand."""
        args = [f"{name}={src}" for name, src in zip(self.operands, new)]
        args += [f"{name}={v!r}" for name, v in (("alpha", self.alpha), ("beta", self.beta)) if v is not None]
        return f"mm.reset_operands({', '.join(args)})"


#: the JAX transformations drawn around dm.matmul (:class:`Transform`)
TRANSFORMS = ("vjp", "jvp", "vmap")


@dataclasses.dataclass(frozen=True)
class Transform:
    """A JAX transformation around ``dm.matmul`` (one process, jax.Array
    operands), over the case's jax operands (:attr:`Case.traced`):

    * ``"vjp"``: ``jax.vjp`` for a random cotangent of the result's shape and
      dtype (eagerly on a mesh with Explicit axes, laid out as the result, as
      a JAX user's is): the primal result and a gradient for each (checked
      against :func:`dmatmul._reference.reference_vjp`);
    * ``"jvp"``: ``jax.jvp`` for random tangents of each: the primal result
      and its tangent (:func:`dmatmul._reference.reference_jvp`);
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

    # -- shapes ------------------------------------------------------------------
    @property
    def a_shape(self) -> tuple[int, int]:
        return (self.k, self.m) if self.transpose_a else (self.m, self.k)

    @property
    def b_shape(self) -> tuple[int, int]:
        return (self.n, self.k) if self.transpose_b else (self.k, self.n)

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
        return [d.grid for d in self.distributions or () if d.grid is not None]

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
          algorithm and saying what it needs.
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
        on = self.on_mesh
        if on is not None and self.distributions is None:  # read off shardings that are none of dmatmul's
            traced_auto = on.call in ("jit", "jit under set_mesh") and (not on.explicit or on.mixed)
            read = (("a", self.a_shape), ("b", self.b_shape)) + ((("c", (self.m, self.n)),) if self.reads_c else ())
            for (name, shape), placement in zip(read, on.placements):
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
        # a named algorithm runs where it fits the layouts by roles, and with distribution=None on operands of
        # no mesh (the model picks among the layouts it takes)
        if self.algorithm != "auto" and not (
                (self.distributions is None and self.on_mesh is None)
                or (self.distributions is not None and self.algorithm in _fitting_algorithms(
                    self.nranks, self.distributions, self.transpose_a, self.transpose_b))):
            allowed.append(Refusal((ValueError,), (re.escape(repr(self.algorithm)), "needs"),
                                   f"algorithm={self.algorithm!r} may not fit"))
        return required, allowed

    # -- reproduction --------------------------------------------------------------
    def describe(self, backend: str | None = None, *, mpi: bool = False) -> str:
        """A line of Python that makes this product (``rand`` is :func:`rand`;
        ``dm``, ``np`` and ``jax`` the modules)."""

        def operand(name: str, shape: tuple[int, ...], specials: bool = False, seed: int = 0,
                    fill: bool = False) -> str:
            if name == "bias":
                dtype, fam, layout = self.bias_dtype or self.dtype, self.bias_kind, self.layouts[3]
            else:
                dtype, fam, layout = self.dtype, self.family_of(name), self.layouts["abc".index(name)]
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
            return operand("c", (self.m, self.n), self.specials and beta != 0, seed, fill=beta == 0)

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
                + ["mm.plan()"] * r.plan + ["d1 = mm.execute()", "d2 = mm.execute()", r.call(new), "d3 = mm.execute()"]
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
        shapes = {"a": self.a_shape, "b": self.b_shape, "c": (self.m, self.n), "bias": self.bias_shape}
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
            cot = f"rand({(self.m, self.n)!r}, {self.dtype!r}, 'jax', seed=2)"
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
    return re.sub(r"\b(Slab|Replicated|BlockCyclic|BlockNonCyclic|ProcessGrid)\b", r"dm.\1", repr(d))


def rand(shape: tuple[int, ...], dtype: str = "float32", family: str = "numpy", *, fill: float | None = None,
         specials: bool = False, layout: str = "C", seed: int = 0) -> Any:
    """A random operand of ``shape`` (or one full of ``fill``; with
    ``specials``, a few entries inf or NaN), numpy laid out in memory as
    ``layout`` says (:func:`lay_out`), as the lines of :meth:`Case.describe`
    use it: ``from dmatmul._check import rand``."""
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
    return lay_out(x, layout)


def lay_out(x: np.ndarray, layout: str) -> np.ndarray:
    """``x``'s values in a numpy array laid out in memory as ``layout`` (one of
    :data:`LAYOUTS`) says: C order, a strided view (every other element of a
    larger array), negative strides, read-only, byte-swapped, Fortran order
    or the ``.T`` view of a C array (both column-major: for matrices)."""
    every = (slice(None, None, -1),) * x.ndim
    if layout == "C":
        return x
    if layout == "strided":
        big = np.zeros(tuple(2 * s + 1 for s in x.shape), x.dtype)
        view = big[(slice(1, None, 2),) * x.ndim]
        view[...] = x
        return view
    if layout == "negative strides":
        return x[every].copy()[every]
    if layout == "read-only":
        y = x.copy()
        y.flags.writeable = False
        return y
    if layout == "byte-swapped":
        return x.astype(x.dtype.newbyteorder("S"))
    if layout == "F":
        return np.asfortranarray(x)
    if layout == ".T view":
        return np.ascontiguousarray(x.T).T
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


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
    roles (Replicated fits wherever a Slab is needed for a or b, not for the
    result: that would be another algorithm; SUMMA: all on one grid, whatever
    its shape: a BlockNonCyclic on a (P, 1) grid has a 1-D role, and is on the
    grid all the same). These must run (docs/guide.md: a named algorithm that does
    not fit raises); a refusal of any other is accepted."""
    roles = [_plan.role_of(d, op, t, nranks) or "G" for d, op, t in zip(dists, _plan.OPERANDS, (ta, tb, False))]
    grids = {d.grid for d in dists}
    one_grid = len(grids) == 1 and None not in grids
    out = []
    for kernel in _plan.KERNELS:
        want = (kernel.a, kernel.b, kernel.d)
        if _plan.ALGORITHMS[kernel.algorithm].grid:
            if one_grid:
                out.append(kernel.algorithm)
        elif all(g == w or (g == "R" and w != "G" and op != "d") for g, w, op in zip(roles, want, "abd")):
            out.append(kernel.algorithm)
    return [name for name in ALGORITHMS if name in out]


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
    """
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
    case = Case(nranks=nranks, m=m, n=n, k=k, dtype=dtype, transpose_a=ta, transpose_b=tb,
                distributions=dists, alpha=alpha, beta=beta, use_c=use_c, epilog=epilog,
                algorithm=algorithm, family=family, precision=precision, specials=specials, single=single,
                families=fams, layouts=layouts, bias_column=bias_column, bias_dtype=bias_dtype, bias_kind=bias_kind)
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
    return dataclasses.replace(case, reset=reset, device_ids=device_ids, on_mesh=on_mesh, jit=jit,
                               transform=transform, matmul_precision=matmul_precision, alpha=alpha, beta=beta,
                               bias_per_column=per_column)


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


def _global_operands(rng: np.random.Generator, case: Case, beta: complex) -> dict[str, np.ndarray | None]:
    """The global numpy a, b, c (full of NaN where ``beta`` = 0: it must not be
    read) and bias (in its own dtype and shape) of one product of ``case``."""
    ops: dict[str, np.ndarray | None] = {
        "a": random_matrix(rng, case.a_shape, case.dtype), "b": random_matrix(rng, case.b_shape, case.dtype),
        "c": None, "bias": None,
    }
    if case.use_c:
        ops["c"] = c = random_matrix(rng, (case.m, case.n), case.dtype)
        if beta == 0:
            c[...] = np.nan  # must not be read
    if case.has_bias:
        ops["bias"] = random_matrix(rng, (math.prod(case.bias_shape),), case.bias_dtype or case.dtype) \
            .reshape(case.bias_shape)
    if case.specials:
        for name in ("a", "b") if ops["c"] is None or beta == 0 else ("a", "b", "c"):
            add_specials(rng, cast(np.ndarray, ops[name]))
    return ops


def _in_order_blocks(dist: Distribution, shape: tuple[int, int], p: int) -> bool:
    """Whether ``dist`` deals every rank one even block, in rank order (rank r
    of a grid the block at ``grid.coords(r)``): what a NamedSharding of the
    distribution's grid expresses (JAX shards only in even blocks, in order)."""
    if isinstance(dist, Replicated) or (dist.grid is not None and dist.grid.size != p):
        return False
    grid = dist.grid if dist.grid is not None else ProcessGrid((p, 1) if dist == Slab.X else (1, p))
    pr, pc = grid.shape
    if shape[0] % pr or shape[1] % pc:
        return False
    br, bc = shape[0] // pr, shape[1] // pc
    for r in range(p):
        i, j = grid.coords(r)
        rows, cols = dist.global_indices(r, shape, p)
        if not (np.array_equal(rows, np.arange(i * br, (i + 1) * br))
                and np.array_equal(cols, np.arange(j * bc, (j + 1) * bc))):
            return False
    return True


def _on_trace_mesh(dist: Distribution, p: int) -> bool:
    """Whether the mesh dmatmul types a jitted product on where the user gave
    none (its devices in rank order, one axis per prime factor of P, smallest
    first) says ``dist``'s even blocks: a grid whose leading side (its rows in
    row order, its columns in column order) is a product of P's smallest prime
    factors. (So every grid of 2**k ranks; not a 3x2 row grid of 6.)"""
    if dist.grid is None:
        return True
    factors, n, f = [], p, 2
    while n > 1:
        while n % f:
            f += 1
        factors.append(f)
        n //= f
    rows, cols = dist.grid.shape
    return (rows if dist.grid.layout == "row" else cols) in {int(np.prod(factors[:i])) for i in range(len(factors) + 1)}


def _sharding_problems(d: Any, case: Case, want: np.ndarray, ranks: Sequence[Any], close: Any,
                       batched: bool = False) -> list[str]:
    """One process, a jax result: it lies on the ranks' devices, and (where the
    result's distribution is known) each rank's device holds that rank's block
    (``dist.global_indices``), or every device the whole result where no
    NamedSharding says the distribution (contract section 1). Where the
    distribution deals even blocks in rank order and no mesh of the user's
    fixes the devices' places, the blocks are required (inside ``jax.jit``:
    where dmatmul's mesh of that trace says them, :func:`_on_trace_mesh`).
    Inside a trace on a mesh of both Explicit and Auto axes any sharding
    (a type names the Explicit ones only: ``jax.jit(lambda x: x * 2)`` turns
    P(("data", "model")) with "data" Auto into P("model"), in halves). A
    ``batched`` result (``jax.vmap``: a batch axis first) holds each matrix so, the batch axis not split: each device the
    whole batch of its blocks."""
    shards = {s.device: s for s in d.addressable_shards}
    if set(shards) != set(ranks):
        return [f"result on devices {sorted(x.id for x in shards)}, expected the ranks' {[x.id for x in ranks]}"]
    if case.distributions is None or not want.size:
        return []
    dd = case.distributions[2]
    p = len(ranks)
    shape = want.shape[1:] if batched else want.shape
    lead = (np.arange(want.shape[0]),) if batched else ()
    blocks = [dd.global_indices(r, shape, p) for r in range(p)]
    datas = [np.asarray(shards[dev].data) for dev in ranks]
    batch = want.shape[:1] if batched else ()
    if all(x.shape == batch + (len(rows), len(cols)) and close(x, want[np.ix_(*lead, rows, cols)])
           for x, (rows, cols) in zip(datas, blocks)):
        return []
    traced = case.jit or case.transform is not None or (case.on_mesh is not None and case.on_mesh.call != "eager")
    if traced and case.on_mesh is not None and case.on_mesh.mixed:
        return []  # a type names the Explicit axes only; the Auto ones are XLA's, as for any jitted function
    replicated = all(x.shape == want.shape and close(x, want) for x in datas)
    required = case.on_mesh is None and _in_order_blocks(dd, shape, p) and (not case.jit or _on_trace_mesh(dd, p))
    if replicated and not required:
        return []
    where = [f"rank {r}: {x.shape}" for r, x in enumerate(datas)][:4]
    wanted = "its block" if replicated else "its block, or all the whole result"
    return [f"result sharded as {d.sharding.spec if hasattr(d.sharding, 'spec') else d.sharding} "
            f"({', '.join(where)}), not as {_dm_repr(dd)} says: each rank's device must hold {wanted}"]


@dataclasses.dataclass(frozen=True)
class _Result:
    """One array a case returns and what it is checked against."""

    what: str  # how the report names it ("" for the only result)
    value: Any
    ref: np.ndarray  # the global reference
    shape: tuple[int, ...] | None = None  # None: the case's result (this rank's block under mpiexec)
    dtype: str | None = None  # None: the case's
    tolerance: str | None = None  # the dtype whose tolerance applies (None: ``dtype``)
    kind: str = "result"  # laid out as the result, "batched" (a batch axis first) or a "gradient" (not checked)


def _looser(*dtypes: str) -> str:
    """The dtype of the largest tolerance among ``dtypes``: a gradient is computed
    in the case's dtype and returned in its operand's."""
    return max(dtypes, key=lambda d: TOLERANCE[d])


class _TransformData:
    """The inputs of a case's :class:`Transform` (a cotangent, tangents or
    the batched operand: drawn after the operands, as jax.Arrays passed as
    the operands are), the references of its outputs, and the run."""

    def __init__(self, case: Case, rng: np.random.Generator, ops: dict[str, np.ndarray | None], ref: np.ndarray,
                 passed: Any) -> None:
        t = case.transform
        assert t is not None
        self.case, self.names = case, case.traced
        shapes = {"a": case.a_shape, "b": case.b_shape, "c": (case.m, case.n), "bias": case.bias_shape}
        dtypes = {"a": case.dtype, "b": case.dtype, "c": case.dtype, "bias": case.bias_dtype or case.dtype}
        kw: dict[str, Any] = dict(alpha=case.alpha, beta=case.beta, transpose_a=case.transpose_a,
                                  transpose_b=case.transpose_b, epilog=case.epilog, bias=ops["bias"])
        self.inputs: dict[str, Any] = {}
        what = t.describe()
        if t.kind == "vmap":
            one = cast(np.ndarray, ops[t.batched])
            stack = np.stack([one] + [random_matrix(rng, one.shape, case.dtype) for _ in range(t.size - 1)])
            self.inputs[f"{t.batched}, batched"] = passed(np.moveaxis(stack, 0, t.axis), t.batched, t.axis)
            refs = [reference(o["a"], o["b"], o["c"], **kw) for o in ({**ops, t.batched: x} for x in stack)]
            self.alternatives = [[_Result(f"{what}: result", None, np.stack(refs), (t.size, case.m, case.n),
                                          kind="batched")]]
            return
        if t.kind == "vjp":
            g = random_matrix(rng, (case.m, case.n), case.dtype)
            self.inputs["cotangent"] = _as_jax(g)
        else:
            tangents = {n: random_matrix(rng, shapes[n], dtypes[n]) for n in self.names}
            self.inputs.update({f"tangent of {n}": passed(x, n) for n, x in tangents.items()})
        # where no traced operand reaches the result (an empty one; or K = 0 or alpha = 0, C not read or not
        # traced, bias not traced), JAX makes its tangent a zero of its own, on its default device: its placement is not checked
        reached = case.m * case.n > 0 and ((case.k > 0 and case.alpha != 0)
                                           or ("c" in self.names and case.beta != 0) or "bias" in self.names)
        # each alternative: the outputs, each with its reference. relu has no derivative at an exact 0 of its
        # input (half-precision data meets some, as C and bias cancel): dmatmul may take 0 (jax.nn.relu's),
        # 0.5 (jnp.maximum's) or 1 there, the same everywhere (the alternative that fits best is checked)
        relu = case.epilog in ("relu", "relu_bias")
        self.alternatives = []
        for at_zero in (0.0, 0.5, 1.0) if relu else (0.0,):
            said = f"{what} (relu'(0) = {at_zero})" if relu else what
            if t.kind == "vjp":
                grads = reference_vjp(ops["a"], ops["b"], ops["c"], g, **kw, relu_at_zero=at_zero)
                expected = [_Result(f"{said}: result", None, ref)] + [
                    _Result(f"{said}: gradient of {n}", None, grads[n], shapes[n], dtypes[n],
                            _looser(case.dtype, dtypes[n]), "gradient") for n in self.names]
            else:
                tangent = reference_jvp(ops["a"], ops["b"], ops["c"], tangents, **kw, relu_at_zero=at_zero)
                expected = [_Result(f"{said}: result", None, ref),
                            _Result(f"{said}: tangent", None, tangent,
                                    tolerance=_looser(case.dtype, *(dtypes[n] for n in self.names)),
                                    kind="result" if reached else "gradient")]
            if not any(all(np.array_equal(x.ref, y.ref, equal_nan=True) for x, y in zip(e, expected))
                       for e in self.alternatives):
                self.alternatives.append(expected)

    def run(self, call: Any, args: dict[str, Any], on: OnMesh | None, mesh: Any) -> list[_Result]:
        """The transformation of ``call`` over the traced operands (the others
        closed over), called as the case says (eagerly, inside ``jax.jit``,
        on a user's mesh...): its outputs, each with its reference."""
        import jax

        case, names, t = self.case, self.names, self.case.transform
        assert t is not None
        prims = tuple(self.inputs[f"{n}, batched"] if t.kind == "vmap" and n == t.batched else args[n]
                      for n in names)

        def f(*xs: Any) -> Any:
            ops = {**args, **dict(zip(names, xs))}
            return call(ops["a"], ops["b"], ops["c"], ops["bias"])

        extra: Any = None
        if t.kind == "vjp":
            extra = self.inputs["cotangent"]

            def apply(prims: tuple[Any, ...], extra: Any) -> Any:  # extra: the cotangent
                out, pull = jax.vjp(f, *prims)
                if not isinstance(out, jax.core.Tracer) and jax.typeof(out).sharding.mesh.explicit_axes:
                    # eagerly, a result typed on Explicit axes gets its cotangent laid out as it is, as a JAX
                    # user's (jnp.ones_like(out), or upstream values) is: one left on one device is what JAX
                    # cannot transpose a sum or a select onto (jax.vjp(lambda x: x - x.sum(), x) fails the same)
                    extra = jax.device_put(extra, out.sharding)
                return (out, *pull(extra))
        elif t.kind == "jvp":
            extra = tuple(self.inputs[f"tangent of {n}"] for n in names)

            def apply(prims: tuple[Any, ...], extra: Any) -> Any:  # extra: the tangents
                return jax.jvp(f, prims, extra)
        else:
            in_axes = tuple(t.axis if n == t.batched else None for n in names)

            def apply(prims: tuple[Any, ...], extra: Any) -> Any:  # extra: None
                return (jax.vmap(f, in_axes=in_axes)(*prims),)

        if (on is None and not case.jit) or (on is not None and on.call == "eager"):
            outs = apply(prims, extra)
        elif on is None or on.call != "jit on constants":
            with jax.set_mesh(mesh) if on is not None and on.call == "jit under set_mesh" else contextlib.nullcontext():
                outs = jax.jit(apply)(prims, extra)
        else:
            outs = jax.jit(lambda: apply(prims, extra))()
        return self._best([[dataclasses.replace(r, value=x) for r, x in zip(e, outs, strict=True)]
                           for e in self.alternatives])

    def _best(self, alternatives: list[list[_Result]]) -> list[_Result]:
        """The alternative whose worst error is the smallest (the first where that cannot be read)."""
        def worst(results: list[_Result]) -> float:
            try:
                ratios = [error_ratio(np.asarray(r.value), r.ref, r.tolerance or r.dtype or self.case.dtype,
                                      finite_scale(r.ref)) if np.shape(r.value) == r.ref.shape else math.inf
                          for r in results]
            except Exception:  # noqa: BLE001 - the check of the chosen one says what
                return math.inf
            return max(ratios, default=0.0)
        return alternatives[0] if len(alternatives) == 1 else min(alternatives, key=worst)


def _as_jax(x: np.ndarray) -> Any:
    """``x`` as a jax.Array of its dtype (64-bit ones too)."""
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(x.dtype.name in ("float64", "complex128")):
        return jnp.asarray(x)


def run_case(case: Case, *, backend: str = "jax", devices: Any = None, rng_seed: int = 0) -> Outcome:
    """Run ``case`` with ``dm.matmul`` (or ``dm.Matmul``) and classify the result.

    In one process the operands are global matrices on ``devices`` (default:
    the case's: its device list, or ``case.nranks``); under a multi-process run each rank passes its own
    blocks (``dm.split``) and checks its block of the result. The data comes
    from ``rng_seed`` (the same global matrices on every rank). Every result
    (each of a stateful case's) is checked against numpy, and a jax one in one
    process for its sharding; every input must be left as it was.
    """
    from . import Matmul, matmul

    rt = _runtime.active()
    mpi = rt is not None and rt.size > 1
    outcome = functools.partial(Outcome, case=case, backend=backend, mpi=mpi)
    rng = np.random.default_rng(rng_seed)
    reset = case.reset
    final_beta = case.beta if reset is None or reset.beta is None else reset.beta
    ops = _global_operands(rng, case, case.beta)  # the global numpy operands, passed below as the case says
    new = _global_operands(rng, case, final_beta) if reset is not None else {}
    ta, tb = case.transpose_a, case.transpose_b

    def ref_of(o: dict[str, Any], alpha: complex, beta: complex) -> np.ndarray:
        return reference(o["a"], o["b"], o["c"], alpha=alpha, beta=beta, transpose_a=ta, transpose_b=tb,
                         epilog=case.epilog, bias=o["bias"])

    refs = [ref_of(ops, case.alpha, case.beta)]
    if reset is not None:
        after = {name: new[name] if name in reset.operands else ops[name] for name in ops}
        refs.append(ref_of(after, case.alpha if reset.alpha is None else reset.alpha, final_beta))
    dists = case.distributions
    dd = dists[2] if dists is not None else None
    kwargs: dict[str, Any] = {}
    want_shape: tuple[int, int] | None = (case.m, case.n)
    if mpi:
        assert rt is not None and dists is not None  # distribution=None is not drawn under mpiexec

        def local(x: np.ndarray, d: Distribution) -> np.ndarray:
            blocks = split(x, d, nranks=None if d.grid is not None else rt.size)
            return blocks[rt.rank % len(blocks)]  # a grid of another size is refused: any block will do

        assert dd is not None
        want_shape = dd.shape(rt.rank, (case.m, case.n), rt.size) if dd.grid is None or dd.grid.size == rt.size \
            else None
    on = None if mpi else case.on_mesh
    uses_jax = case.family == "jax" or (case.has_bias and case.bias_kind == "jax")
    x64: Any = contextlib.nullcontext()
    mesh: Any = None
    ranks: list[Any] = []  # one process, jax: the ranks' devices
    if uses_jax:
        import jax

        if case.dtype in ("float64", "complex128"):  # as a user of 64-bit jax arrays runs
            x64 = jax.enable_x64(True)
        if on is not None:  # placed on the user's mesh, whose devices are then the ranks
            mesh = on.build(jax.devices())
            ranks = list(mesh.devices.flat)
    if not mpi and on is None:
        if case.device_ids is not None:
            import jax

            kwargs["devices"] = ranks = [jax.devices()[i] for i in case.device_ids]
        else:
            kwargs["devices"] = case.nranks if devices is None else devices
            if uses_jax:
                import jax

                ranks = list(devices) if isinstance(devices, Sequence) else jax.devices()[: kwargs["devices"]]

    def passed(x: np.ndarray | None, name: str, batch_axis: int | None = None) -> Any:
        """Global ``x`` as operand ``name`` is passed: this rank's block, its family, its layout
        (a stack of them along ``batch_axis``: jax)."""
        if x is None:
            return None
        if mpi and name != "bias":
            assert dists is not None
            x = local(x, dists["abc".index(name)])
        fam = case.bias_kind if name == "bias" else case.family_of(name)
        layout = case.layouts[("a", "b", "c", "bias").index(name)]
        if fam == "list":
            return x.tolist()
        if fam == "numpy":
            return lay_out(x, layout)
        import jax
        import jax.numpy as jnp

        with jax.enable_x64(x.dtype.name in ("float64", "complex128")):
            y = jnp.asarray(x)
        if mesh is not None and name != "bias":
            assert on is not None
            y = on.put(y, mesh, on.placements["abc".index(name)], batch_axis)
        return y

    args = {name: passed(x, name) for name, x in ops.items()}
    news = {name: passed(new[name], name) for name in reset.operands} if reset is not None else {}
    inputs = list(args.items()) + [(f"new {name}", x) for name, x in news.items()]
    transformed = None
    if case.transform is not None:  # its own inputs (a cotangent, tangents, the batched operand)
        transformed = _TransformData(case, rng, ops, refs[0], passed)
        inputs += [(f"{case.transform.describe()}: {name}", x) for name, x in transformed.inputs.items()]
    before = [_snapshot(x) for _, x in inputs]
    required, allowed = case.refusals()
    options = dict(distribution=case.distribution, alpha=case.alpha, beta=case.beta, transpose_a=ta,
                   transpose_b=tb, epilog=case.epilog, bias=args["bias"],
                   backend=cast(BackendName, backend),  # a name of backends.NAMES, checked by matmul
                   algorithm=case.algorithm, precision=case.precision, **kwargs)

    def call(a: Any, b: Any, c: Any, bias: Any = args["bias"]) -> Any:
        return matmul(a, b, c, **{**options, "bias": bias})

    results: list[_Result] = []
    told: tuple[str, str] | None = None  # mm.algorithm, mm.explain() read by one rank alone first (reset.told)
    told_wrong: str | None = None
    try:
        with x64, _plan.schedule(case.schedule), _default_matmul_precision(case.matmul_precision):
            a, b, c = args["a"], args["b"], args["c"]
            if transformed is not None:
                results += transformed.run(call, args, on, mesh)
            elif reset is not None:
                with Matmul(a, b, c, **options) as mm:
                    if mpi and rt is not None and rt.rank == reset.told:  # this rank alone; the others go on
                        try:
                            told = (mm.algorithm, mm.explain())
                        except Exception as e:  # noqa: BLE001 - a plan that cannot be made: execute() raises it
                            told = (f"{type(e).__name__}: {e}", "")
                    if reset.plan:
                        mm.plan()
                    d1 = mm.execute()
                    if told is not None and (told[0] != mm.algorithm or "algorithm:" not in told[1]):
                        told_wrong = f"rank {reset.told} alone, before the plan: mm.algorithm {told[0]!r}, " \
                                     f"mm.explain() {told[1][:200]!r}; the plan made: {mm.algorithm!r}"
                    results += [_Result("execute()", d1, refs[0]), _Result("execute() again", mm.execute(), refs[0])]
                    mm.reset_operands(**news, alpha=reset.alpha, beta=reset.beta)
                    results.append(_Result(reset.call(list(news)) + "; execute()", mm.execute(), refs[1]))
                    results.append(_Result("the first execute() after the reset", d1, refs[0]))
            elif on is None and not case.jit:
                results.append(_Result("", call(a, b, c), refs[0]))
            elif on is None:
                import jax

                # the jax operands its arguments; numpy ones closed over (JAX would make them tracers)
                traced = {name: x for name, x in (("a", a), ("b", b), ("c", c)) if family(x) == "jax"}
                d = jax.jit(lambda ops: call(**{"a": a, "b": b, "c": c, **ops}))(traced)
                results.append(_Result("", d, refs[0]))
            elif on.call == "eager":
                results.append(_Result("", call(a, b, c), refs[0]))
            else:
                import jax

                # as off a mesh: the jax operands the jit's arguments, numpy ones closed over
                traced = {name: x for name, x in (("a", a), ("b", b), ("c", c)) if family(x) == "jax"}
                with jax.set_mesh(mesh) if on.call == "jit under set_mesh" else contextlib.nullcontext():
                    d = jax.jit(lambda: call(a, b, c))() if on.call == "jit on constants" else \
                        jax.jit(lambda ops: call(**{"a": a, "b": b, "c": c, **ops}))(traced)
                results.append(_Result("", d, refs[0]))
    except Exception as e:  # noqa: BLE001 - every exception is classified
        if any(r.matches(e) for r in required + allowed):
            return outcome(status="refused", ratio=math.nan, message=f"{type(e).__name__}: {e}")
        why = f" (expected: {'; '.join(r.why for r in required)})" if required else ""
        return outcome(status="failed", ratio=math.nan, message=f"{type(e).__name__}: {e}{why}")
    problems = [] if told_wrong is None else [told_wrong]
    if required:
        problems.append(f"no error, expected one: {'; '.join(r.why for r in required)}")
    changed = [name for (name, x), x0 in zip(inputs, before) if _snapshot(x) != x0]
    if changed:
        problems.append(f"input(s) modified: {', '.join(changed)}")
    slack = _reduced_precision_slack(case, backend)
    ratios = []
    for r in results:
        d = r.value
        said = f"{r.what}: " if r.what else ""
        dtype = r.dtype or case.dtype
        fam = family(d)
        if fam != case.family:
            shown = fam if fam != "other" else f"{type(d).__module__}.{type(d).__name__}"
            problems.append(f"{said}result is {shown}, expected {case.family}")
            continue
        if fam == "numpy" and not d.flags.writeable:
            problems.append(f"{said}numpy result is read-only")
        if mesh is not None and r.kind != "gradient" and getattr(d.sharding, "mesh", None) != mesh:
            problems.append(f"{said}result not on the operands' mesh: {d.sharding}")
        if np.dtype(d.dtype).name != dtype:
            problems.append(f"{said}result dtype {np.dtype(d.dtype).name}, expected {dtype}")
        shape = r.shape or want_shape
        if shape is None:
            continue
        if tuple(d.shape) != tuple(shape):
            problems.append(f"{said}result shape {tuple(d.shape)}, expected {tuple(shape)}")
            continue
        assert dd is not None or not mpi
        ref = r.ref
        want = split(ref, dd, nranks=rt.size)[rt.rank] if mpi and rt is not None and dd is not None else ref
        scale = finite_scale(ref)
        if r.kind == "gradient" and 0 in tuple(d.shape):
            # nothing to read: JAX's own zero-size cotangent of an operand split over a mesh holds the whole
            # shape on every device, and reading it fails (as jnp.zeros((32, 0), out_sharding=P(("x", "y"),
            # None)) does under jax.set_mesh); its shape and dtype are checked above
            continue
        try:  # a jax.Array's computation may fail only when it is read
            host = np.asarray(d)
        except Exception as e:  # noqa: BLE001
            problems.append(f"{said}reading the result raised {type(e).__name__}: {e}")
            continue
        tol = r.tolerance or dtype
        ratio = error_ratio(host, want, tol, scale) / slack
        ratios.append(math.inf if math.isnan(ratio) else ratio)  # NaN in the result
        if not ratios[-1] <= 1.0:
            problems.append(f"{said}max error {ratios[-1]:.3g} x the tolerance")
        elif fam == "jax" and not mpi and r.kind != "gradient":
            close = lambda x, y: error_ratio(x, y, tol, scale) <= slack  # noqa: E731
            problems += [said + p for p in _sharding_problems(d, case, ref, ranks, close, r.kind == "batched")]
    ratio = max(ratios) if ratios else math.nan
    if problems:
        return outcome(status="failed", ratio=ratio, message="; ".join(problems))
    return outcome(status="passed", ratio=ratio)


def _default_matmul_precision(name: str | None) -> contextlib.AbstractContextManager[Any]:
    """``jax.default_matmul_precision(name)``; nothing where ``name`` is None."""
    if name is None:
        return contextlib.nullcontext()
    import jax

    return jax.default_matmul_precision(name)


def _reduced_precision_slack(case: Case, backend: str) -> float:
    """How much more error a precision below "highest" may bring: TF32 or
    bf16 passes for float32 on GPUs and TPUs; nothing on CPUs, which compute
    float32 in float32 whatever is asked. ``precision=None`` on the JAX
    backend is the case's ``jax.default_matmul_precision``."""
    precision = case.precision
    if precision is None and backend != "nvmath" and case.matmul_precision is not None:
        precision = normalize_precision(case.matmul_precision)
    if precision == "highest" or case.dtype not in ("float32", "complex64"):
        return 1.0
    if backend == "nvmath":
        return 1.0 if precision is None or precision == "default" else 500.0  # "high": TF32
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
    relative to the tolerance), a line for the cases inside a JAX
    transformation (by kind and status), and the first ``failures`` failures."""
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
    transformed = [o for o in outcomes if o.case.transform is not None]
    if transformed:
        kinds = ", ".join(f"{k} {sum(cast(Transform, o.case.transform).kind == k for o in transformed)}"
                          for k in TRANSFORMS)
        count = {s: sum(o.status == s for o in transformed) for s in _ORDER}
        lines.append(f"of which inside a JAX transformation: {len(transformed)} ({kinds}): {count['passed']} "
                     f"passed, {count['refused']} refused, {count['failed']} failed")
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        lines.append("")
        lines.append(f"first {min(failures, len(failed))} of {len(failed)} failure(s):")
        for o in failed[:failures]:
            lines.append(f"  [{o.label or o.layout_family}] {o.message}")
            lines.append(f"    {o.describe()}")
    return "\n".join(lines)
