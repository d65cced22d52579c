"""The vocabulary the front end and every backend share.

The front end (:mod:`dmatmul._matmul`) builds a :class:`Spec` and an
:class:`Operands` from a call; a backend (:mod:`dmatmul.backends`) plans and
runs them. Both import this module; neither imports the other's
implementation. It holds:

* the names of the contract as values and as ``Literal`` types: dtypes,
  algorithms, backends, precisions (epilogues: :mod:`dmatmul._epilogue`);
* one dtype table (item size, the accumulator a GEMM sums in);
* the array family of an operand (numpy, jax, cupy) without importing any;
* :class:`Operands` and :class:`Spec`, and :func:`check_fit`, the one check
  that a distribution's grid spans the ranks in use.

Importing it loads numpy only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import numbers
from collections.abc import Hashable, Sequence
from typing import Any, Literal, cast, get_args

import numpy as np

from ._distribution import Distribution, to_numpy
from ._errors import DistributionError

__all__ = [
    "DTYPES", "FP8_DTYPES", "RESULT_TYPES", "ResultTypeName", "ALGORITHMS", "BACKENDS", "PRECISIONS", "PRECISION_ALIASES", "normalize_precision",
    "DtypeName", "AlgorithmName", "BackendName", "PrecisionName", "Family",
    "DtypeInfo", "DTYPE_INFO", "numpy_dtype", "array_module",
    "family", "dtype_name", "as_matrix", "native_order", "Operands", "check_distribution", "check_fit",
]

DtypeName = Literal[
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2",
]
#: ``result_type=`` of an FP8 product (nvmath-python's distributed matmul: cuBLASMp writes these)
ResultTypeName = Literal["bfloat16", "float16", "float32"]
#: The algorithm names of the contract, in order of preference on ties.
Algorithm = Literal["local", "allgather", "reduce_scatter", "allreduce", "summa", "summa25d"]
AlgorithmName = Literal["auto", "local", "allgather", "reduce_scatter", "allreduce", "summa", "summa25d"]
BackendName = Literal["auto", "jax", "nvmath"]
PrecisionName = Literal["default", "high", "highest"]
Family = Literal["numpy", "jax", "cupy", "other"]

DTYPES: tuple[str, ...] = get_args(DtypeName)
#: The 8-bit float dtypes (a and b only, with ``quantization_scales`` and ``result_type``: contract 3b)
FP8_DTYPES: tuple[str, ...] = ("float8_e4m3fn", "float8_e5m2")
RESULT_TYPES: tuple[str, ...] = get_args(ResultTypeName)
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)
#: The ``backend=`` values (:data:`dmatmul.backends.NAMES` is the table's, and tests hold them equal)
BACKENDS: tuple[str, ...] = get_args(BackendName)
#: ``precision=``: None follows the framework's default; the others mean what they mean for ``jnp.dot``
PRECISIONS: tuple[str | None, ...] = (None, *get_args(PrecisionName))
#: the other names ``jax.lax.Precision`` takes, each for one of :data:`PRECISIONS`
PRECISION_ALIASES = {
    "fastest": "default", "bfloat16": "default", "bfloat16_3x": "high", "tensorfloat32": "high",
    "float32": "highest",
}


def normalize_precision(precision: Any) -> PrecisionName | None:
    """``precision=`` as one of :data:`PRECISIONS`: from its name, one of JAX's
    other names for it (:data:`PRECISION_ALIASES`) or a ``jax.lax.Precision``
    (any enum member named DEFAULT, HIGH or HIGHEST), without importing JAX;
    what ``jnp.dot`` refuses ("HIGHEST", a pair) is a ValueError. Every rank
    then agrees on, and every backend reads, one spelling.

    >>> normalize_precision("highest"), normalize_precision("tensorfloat32"), normalize_precision(None)
    ('highest', 'high', None)
    """
    if precision is None:
        return None
    if isinstance(precision, enum.Enum) and isinstance(precision.name, str):
        key: Any = precision.name.lower()  # DEFAULT, HIGH, HIGHEST
    else:
        key = precision if isinstance(precision, str) else None
    key = PRECISION_ALIASES.get(key, key) if key is not None else None
    if key is None or key not in PRECISIONS:
        aliases = ", ".join(repr(a) for a in PRECISION_ALIASES)
        raise ValueError(
            f"precision must be one of None, 'default', 'high', 'highest' (or a jax.lax.Precision, or JAX's "
            f"other names for them: {aliases}), got {precision!r}"
        )
    return cast(PrecisionName, key)


@dataclasses.dataclass(frozen=True)
class DtypeInfo:
    """One supported dtype: its item size, and the dtype its GEMM accumulates in
    (float32 for the half precisions, as cuBLAS and XLA do)."""

    itemsize: int
    accumulator: str

    @property
    def acc_itemsize(self) -> int:
        return DTYPE_INFO[self.accumulator].itemsize


DTYPE_INFO: dict[str, DtypeInfo] = {
    "float16": DtypeInfo(2, "float32"),
    "bfloat16": DtypeInfo(2, "float32"),
    "float32": DtypeInfo(4, "float32"),
    "float64": DtypeInfo(8, "float64"),
    "complex64": DtypeInfo(8, "complex64"),
    "complex128": DtypeInfo(16, "complex128"),
    "float8_e4m3fn": DtypeInfo(1, "float32"),
    "float8_e5m2": DtypeInfo(1, "float32"),
}


def numpy_dtype(name: str) -> Any:
    """The numpy dtype of a dtype name (bfloat16 and the FP8 ones from ml_dtypes, imported on demand)."""
    if name == "bfloat16" or name in FP8_DTYPES:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def array_module(fam: str) -> Any:
    """numpy, or a kind's module (jax.numpy, cupy), for an array family."""
    held = kind(fam)
    return np if held is None else held.array_module()


# --------------------------------------------------------------------------- #
# operands
# --------------------------------------------------------------------------- #
_DTYPE_NAMES: dict[np.dtype[Any], tuple[np.dtype[Any], str]] = {}


def dtype_name(dtype: Any) -> str:
    """``np.dtype(dtype).name``, remembered per dtype object (numpy makes a name
    anew, in Python, at every read: a few microseconds each call).

    >>> dtype_name(np.float32), dtype_name(np.dtype("complex64")), dtype_name(np.dtype(">f8"))
    ('float32', 'complex64', 'float64')
    """
    if not isinstance(dtype, np.dtype):
        return np.dtype(dtype).name
    held = _DTYPE_NAMES.get(dtype)
    if held is not None and held[0] is dtype:  # this very object (an equal dtype may name itself otherwise)
        return held[1]
    name = dtype.name
    if len(_DTYPE_NAMES) < 64:
        _DTYPE_NAMES.setdefault(dtype, (dtype, name))
    return name


class ArrayKind:
    """What the neutral core asks a backend of its own array type (JAX's:
    ``dmatmul/backends/jax/_arrays.py``), through :data:`KINDS`, which the
    backend table fills (:mod:`dmatmul.backends`). A kind is light to import:
    it never imports its array library (an array of it exists only once the
    user did). Every answer has a default: "not mine"."""

    #: the :data:`Family` of the arrays it owns
    family: str = "other"

    def owns(self, x: Any) -> bool:
        """Whether ``x`` is one of its arrays."""
        return False

    def claims(self, spec: Any) -> bool:
        """Whether a product of ``spec`` (a :class:`dmatmul._problem.Spec`) is its backend's to run, whatever
        ``backend="auto"`` would prefer (JAX: a trace's, or one on jax.Arrays)."""
        return False

    def in_trace(self, xs: Sequence[Any]) -> bool:
        """Whether its library traces a program now (``xs``: values that may be the trace's)."""
        return False

    def refuse_unusable(self, x: Any, name: str) -> None:
        """Raise where ``x`` is one of its arrays that no path may read (a deleted one)."""

    def refuse_spanning(self, x: Any, name: str, distribution: str) -> None:
        """Raise where ``x`` is one of its arrays that is no single rank's block."""

    def array_module(self) -> Any:
        """The numpy-like module of its arrays."""
        raise NotImplementedError(f"no array module for the {self.family} family")

    def precise(self, dtype: str) -> contextlib.AbstractContextManager[Any]:
        """A context in which its library makes results of ``dtype`` as they are (JAX: x64)."""
        return contextlib.nullcontext()

    def eager(self) -> contextlib.AbstractContextManager[Any]:
        """A context in which its library computes on concrete arrays at once, also
        inside a trace (JAX: ``ensure_compile_time_eval``; a jit's closed-over
        operands then keep their placement)."""
        return contextlib.nullcontext()

    def item(self, x: Any, idx: tuple[int, ...]) -> Any:
        """``x[idx]``: the array at integer ``idx`` of its leading dimensions, placed as ``x`` is."""
        return x[idx]

    def recent_key(self, xs: Sequence[Any]) -> Hashable | None:
        """What the front end's checks read of ``xs`` (operands or None), as a key
        for ``dm.matmul``'s repeated-call shortcut; None where they are not all its
        arrays, or the call may not skip the checks (inside a trace)."""
        return None

    def refuse_held(self, x: Any, name: str) -> None:
        """Raise where ``x`` may not be kept by a plan between calls (a tracer)."""

    def refuse_moved(self, value: Any, old: Any, name: str) -> None:
        """Raise where ``value``, replacing the planned ``old``, lies elsewhere (other devices)."""


#: The backends' array kinds, in the table's order (filled by :mod:`dmatmul.backends`).
KINDS: list[ArrayKind] = []


def kind(fam: str) -> ArrayKind | None:
    """The registered kind of family ``fam``, or None."""
    return next((k for k in KINDS if k.family == fam), None)


def family(x: Any) -> Family:
    """The array family of ``x``: "numpy", a backend's kind's ("jax", "cupy": without importing any), else "other"."""
    if isinstance(x, np.ndarray):
        return "numpy"
    for k in KINDS:
        if k.owns(x):
            return cast(Family, k.family)
    return "other"


def refuse_unusable(x: Any, name: str) -> None:
    """Arrays no path may read, refused on this rank before the ranks compare
    their calls: a numpy masked array (as JAX refuses it, whatever a path would
    read of it) and whatever a kind refuses (a deleted jax.Array, whose first
    read would fail on this rank alone, inside a collective)."""
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(
            f"{name} is a numpy masked array, which a product cannot honour: pass {name}.filled(<value>), "
            f"or np.asarray({name}) to use the stored values"
        )
    if not isinstance(x, np.ndarray):
        for k in KINDS:
            k.refuse_unusable(x, name)


def refuse_spanning(x: Any, name: str, distribution: str = "distribution") -> None:
    """Under several processes: an array that spans several processes is no
    rank's block (reading it fails on that rank alone, inside a collective)."""
    for k in KINDS:
        k.refuse_spanning(x, name, distribution)


def in_trace(*xs: Any) -> bool:
    """Whether a backend's library traces a program now (``jax.jit``, ``grad``...):
    one of ``xs`` is its value, or it says so."""
    return any(k.in_trace(xs) for k in KINDS)


def precise(dtype: str) -> contextlib.AbstractContextManager[Any]:
    """A context in which every kind's library makes results of ``dtype`` as they are."""
    if not KINDS:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    for k in KINDS:
        stack.enter_context(k.precise(dtype))
    return stack


def refuse_trace_under_mpi(*xs: Any) -> None:
    """Under mpiexec a product takes each rank's blocks as concrete arrays:
    inside a JAX trace it is refused (on this rank, before the ranks compare
    their calls, so that every rank raises)."""
    if in_trace(*xs):
        raise TypeError(
            "under mpiexec dm.matmul and Matmul.execute take each rank's blocks as concrete arrays, not inside "
            "jax.jit, grad or another transformation: call them outside it, or, inside a JAX program over a "
            "multi-process mesh, use dmatmul.jax.allgather_matmul / matmul_reduce_scatter in jax.shard_map"
        )


def as_matrix(x: Any, name: str, *, batched: bool = False) -> Any:
    """``x`` as a 2-D array (``batched``: or one with leading batch dimensions)
    of a supported dtype, in native byte order; else a TypeError/ValueError
    naming ``name``. What numpy reads as an array (an ``__array__``, a nested
    list, a memoryview's buffer) is taken as ``np.asarray`` makes it, as
    ``bias`` is."""
    refuse_unusable(x, name)
    if family(x) == "other":
        if not hasattr(x, "__array__") and not isinstance(x, (list, tuple, memoryview)):
            raise TypeError(
                f"{name} must be a 2-D numpy, jax or cupy array, got {type(x).__name__}"
            )
        x = to_numpy(x, name)
    if batched and x.ndim < 2:
        raise ValueError(
            f"{name} must be a 2-D matrix or a batch of matrices (..., rows, columns), got a {x.ndim}-D array of "
            f"shape {tuple(x.shape)}" + (f": pass {name}.reshape(1, -1) (a row) or {name}.reshape(-1, 1) (a column)"
                                         if x.ndim == 1 else "")
        )
    if not batched and x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix, got {x.ndim}-D array of shape {tuple(x.shape)}")
    dt = dtype_name(x.dtype)
    if dt not in DTYPES:
        raise TypeError(f"{name} has dtype {dt}; supported dtypes: {', '.join(DTYPES)}")
    return native_order(x)


def check_devices(devices: Any, *, spmd: bool) -> Any:
    """``devices=`` of one process: None, an int >= 1 or a non-empty list
    (returned as a tuple); else a TypeError/ValueError. Under mpiexec it must
    be None."""
    if devices is None:
        return None
    if spmd:
        raise ValueError("devices= is for one process; under mpiexec each rank uses its own device")
    if isinstance(devices, bool) or not isinstance(devices, (numbers.Integral, Sequence)) or isinstance(devices, str):
        raise TypeError(f"devices must be None, an int or a list of devices, got {devices!r}")
    if isinstance(devices, numbers.Integral):
        if devices < 1:
            raise ValueError(f"devices must be >= 1, got {devices}")
        return devices
    if not devices:
        raise ValueError("devices must not be an empty list")
    return tuple(devices)


def native_order(x: Any) -> Any:
    """A numpy array in native byte order (a copy when it was not: the input is left as it is)."""
    if isinstance(x, np.ndarray) and not x.dtype.isnative:
        return x.astype(x.dtype.newbyteorder("="))
    return x


@dataclasses.dataclass
class Operands:
    """The arrays of one product (mutable: :meth:`dmatmul.Matmul.reset_operands`)."""

    a: Any
    b: Any
    c: Any = None
    bias: Any = None
    #: MXFP8 only: ``(sa, sb, k axis of a, k axis of b)``, the block scales of FP8 a and b not yet applied
    #: (dmatmul._mxfp8.hold; a backend that does not take them gets a and b dequantized: _mxfp8.release)
    block_scales: Any = None

    @property
    def family(self) -> Family:
        """The family of the result: the first kind's (in the backend table's order:
        cupy, then jax) of which an operand is, else numpy."""
        fams: set[str] = {family(x) for x in (self.a, self.b, self.c) if x is not None}
        return cast(Family, next((k.family for k in KINDS if k.family in fams), "numpy"))


def check_distribution(d: Any, what: str) -> Distribution:
    """``d`` if it is a dmatmul Distribution, else a TypeError naming ``what``."""
    if not isinstance(d, Distribution):
        raise TypeError(
            f"{what} must be a dmatmul Distribution (Slab.X, Slab.Y, Replicated(), "
            f"BlockNonCyclic(grid), BlockCyclic(grid, blocks)), got {d!r}"
        )
    return d


def check_fit(
    dists: tuple[Distribution, ...], nranks: int, *, spmd: bool, available: int | None = None,
    names: tuple[str, ...] = ("distribution of a", "distribution of b", "distribution of result"),
) -> None:
    """Every grid distribution spans exactly the ``nranks`` ranks in use, else a
    DistributionError naming the operand (``names``, one per distribution), the
    grid, its size and the rank count (``available``: the devices one process
    could use, for the hint)."""
    where = f"{nranks} processes" if spmd else f"{nranks} device{'s' if nranks > 1 else ''} in use"
    for name, dist in zip(names, dists):
        if dist.grid is not None and dist.grid.size != nranks:
            fix = "" if spmd or available is None or dist.grid.size > available else f", or devices={dist.grid.size}"
            raise DistributionError(
                f"{name}: {dist!r} spans {dist.grid.size} ranks (its grid "
                f"{dist.grid.shape}) but there are {where}: use a ProcessGrid of {nranks} ranks{fix}"
            )
