"""The one value that describes a product: :class:`Options` (every keyword of
:func:`dmatmul.matmul` and :class:`dmatmul.Matmul` but the operands, as
nvmath-python's ``_configuration``: a frozen dataclass that normalizes and
validates itself) and :class:`Spec` (the options with the operands' global
shapes, dtype and family, from the call to the kernels; the plan-cache key).

An :class:`Options` holds each keyword in one spelling (a Distribution as a
triple, an epilog as an :class:`Epilog`, a precision by its name...), so that
it is hashable and ranks compare it field by field. What needs the operands
(the scalars against their dtype, shapes, the bias) is checked by
:func:`dmatmul._options.validate`, which makes the Spec.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import numbers
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar, overload

import numpy as np

from . import algorithms as _algorithms
from ._distribution import Distribution, one_of
from ._sharded import matrix_distribution
from ._epilogue import EPILOGS, Epilog, has_bias
from ._spec import (
    ALGORITHMS,
    BACKENDS,
    DTYPE_INFO,
    DTYPES,
    FP8_DTYPES,
    RESULT_TYPES,
    DtypeInfo,
    Operands,
    check_devices,
    check_distribution,
    dtype_name,
    family,
    kind,
    normalize_precision,
)
from .algorithms.base import Problem1D

__all__ = ["Options", "Spec", "Triple", "Via"]

T = TypeVar("T")


class Via(Generic[T]):
    """An attribute of the same name read off another attribute (``via``) of
    the object: the values built on a :class:`Spec` (and the Spec on its
    :class:`Options`) read its fields rather than copy them, one line each.

    >>> class Placed:
    ...     m = Via[int]("spec")
    ...     def __init__(self, spec): self.spec = spec
    >>> Placed(Spec.of((3, 4), (4, 5))).m
    3
    """

    def __init__(self, via: str) -> None:
        self.via = via
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Via[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Via[T] | T:
        if obj is None:
            return self
        return getattr(getattr(obj, self.via), self.name)


Triple = tuple[Distribution, Distribution, Distribution]

#: What ranks compare of a field, where that is not the field by its own name: one name per item
_NAMES = "agreed as"


@dataclasses.dataclass(frozen=True)
class Options:
    """Every keyword of :func:`dmatmul.matmul` and :class:`dmatmul.Matmul` but
    the operands (their meaning: ``help(dmatmul.matmul)``), normalized and
    validated when made: a TypeError or ValueError naming the keyword, what
    it takes and what was given. ``alpha`` and ``beta`` are checked to be
    numbers here and against the operands' dtype by :func:`validate`, which
    puts their values for that dtype in their place."""

    distribution: Triple | None = dataclasses.field(default=None, metadata={_NAMES: (
        "the distribution of a", "the distribution of b", "the distribution of the result")})
    alpha: complex = 1.0
    beta: complex = 0.0
    transpose_a: bool = False
    transpose_b: bool = False
    epilog: Epilog | None = None
    backend: str = "auto"
    algorithm: str = "auto"
    precision: str | None = None
    devices: int | tuple[Any, ...] | None = None
    #: FP8 only: ``(sa, sb)``, the per-tensor scales of a and b as float32 values (``{"a": sa, "b": sb}`` given)
    quantization_scales: tuple[float, float] | None = dataclasses.field(default=None, metadata={_NAMES: (
        "the quantization scale of a", "the quantization scale of b")})
    result_type: str | None = None  # FP8 only: the result's dtype name (None: bfloat16)
    #: MXFP8 only: the FP8 dtype of a and b whose block scales were applied at the front (dmatmul._mxfp8);
    #: the operands the backends see are then float32
    block_scaled: str | None = None

    def __post_init__(self) -> None:
        for name in ("transpose_a", "transpose_b"):
            self._set(name, _require_bool(getattr(self, name), name))
        self._set("epilog", _epilog_by_name(self.epilog))
        for name in ("alpha", "beta"):
            self._set(name, _require_number(getattr(self, name), name))
        self._set("distribution", _distribution_as_triple(self.distribution))
        self._set("backend", _require_backend_name(self.backend))
        self._set("algorithm", _require_algorithm_name(self.algorithm))
        self._set("precision", normalize_precision(self.precision))
        self._set("devices", check_devices(self.devices, spmd=False))
        self._set("quantization_scales", _scales_pair(self.quantization_scales))
        self._set("result_type", _result_type_name(self.result_type))
        if self.block_scaled is not None and self.block_scaled not in FP8_DTYPES:
            raise ValueError(f"block_scaled must be None or one of {FP8_DTYPES}, got {self.block_scaled!r}")

    def _set(self, name: str, value: Any) -> None:
        if value is not getattr(self, name):
            object.__setattr__(self, name, value)  # (frozen: only __post_init__ writes, to normalize)

    def _scaled_for(self, alpha: complex, beta: complex) -> Options:
        """These options with ``alpha`` and ``beta`` as the operands' dtype computes
        with them (checked by :func:`_scalar`: nothing to check again, as
        ``dataclasses.replace`` would, on every call)."""
        new = copy.copy(self)
        object.__setattr__(new, "alpha", alpha)
        object.__setattr__(new, "beta", beta)
        return new

    def agreed(self, backend: str | None = None) -> tuple[tuple[str, Any], ...]:
        """Every field as ``(name, value)`` pairs, named as the user wrote them:
        what ranks compare (:func:`dmatmul._runtime.require_same_call`);
        ``backend``, where given, in place of the one asked for (a plan's:
        the backend that plans it)."""
        return _agreed(lambda name: backend if name == "backend" and backend is not None else getattr(self, name))


def _agreed(value_of: Callable[[str], Any]) -> tuple[tuple[str, Any], ...]:
    pairs: list[tuple[str, Any]] = []
    for field in dataclasses.fields(Options):
        value = value_of(field.name)
        names = field.metadata.get(_NAMES)
        if names is None:
            pairs.append((field.name, value))
        else:  # one pair per item (the distribution of a, of b, of the result)
            pairs.extend(zip(names, value if value is not None else (None,) * len(names)))
    return tuple(pairs)


def _require_bool(flag: Any, name: str) -> bool:
    if not isinstance(flag, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {flag!r}")
    return bool(flag)


def _epilog_by_name(epilog: Any) -> Epilog | None:
    if not one_of(epilog, EPILOGS):
        raise ValueError(f"epilog must be one of {EPILOGS}, got {epilog!r}")
    return Epilog.of(epilog)


def _require_backend_name(backend: Any) -> str:
    if not one_of(backend, BACKENDS):
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return str(backend)


def _require_algorithm_name(algorithm: Any) -> str:
    # the contract's names, and any algorithm registered beside them (dmatmul.algorithms.register)
    names = (*ALGORITHMS, *(name for name in _algorithms.ALGORITHMS if name not in ALGORITHMS))
    if not one_of(algorithm, ("auto", *names)):
        raise ValueError(f"algorithm must be 'auto' or one of {names}, got {algorithm!r}")
    return str(algorithm)


def _require_number(x: Any, name: str) -> Any:
    """``x`` if it is a Python or numpy number (a bfloat16 scalar as its Python
    float), else a TypeError; its dtype is checked by :func:`_scalar`."""
    plain = type(x) is float or type(x) is int  # (a real number, not a bool: the checks below, without the ABCs)
    if plain:
        return x
    if isinstance(x, np.generic) and not isinstance(x, numbers.Number) \
            and dtype_name(x.dtype) in DTYPES:  # a bfloat16 scalar: ml_dtypes registers it as no numbers type
        x = x.item()  # (its value, as a Python float)
    if isinstance(x, bool) or not isinstance(x, numbers.Number):
        fix = ""
        if hasattr(x, "shape") and hasattr(x, "dtype"):  # an array (numpy, jax), or a traced value
            scaled = "dm.matmul(alpha * a, b, ...)" if name == "alpha" else "dm.matmul(a, b, beta * c, beta=1.0, ...)"
            fix = (f": {name} is compiled into the plan, so it is a Python or numpy number (float({name}) of a "
                   f"concrete 0-d array); to scale by an array or a traced value, scale the operand: {scaled}")
        raise TypeError(f"{name} must be a number, got {x!r} ({type(x).__name__}){fix}")
    return x


def _scales_pair(scales: Any) -> tuple[float, float] | None:
    """``quantization_scales={"a": sa, "b": sb}`` as ``(sa, sb)``, each a finite
    real number (a Python or numpy scalar, or an array of one element) rounded
    to float32, as cuBLASMp reads it; a missing key is 1. Else a TypeError or
    ValueError naming the operand."""
    if scales is None or (isinstance(scales, tuple) and len(scales) == 2
                          and all(type(x) is float for x in scales)):  # (already normalized: a copy's)
        return scales
    if not isinstance(scales, dict):
        raise TypeError(
            'quantization_scales must be None or a dict {"a": sa, "b": sb} of per-tensor float32 scalars, '
            f"got {type(scales).__name__}"
        )
    extra = [key for key in scales if key not in ("a", "b")]
    if extra:
        fix = (": the result is bfloat16, float16 or float32 (result_type=), so it takes no scale"
               if any(key in ("c", "d") for key in extra) else "")
        raise ValueError(f'quantization_scales takes the keys "a" and "b" (per-tensor scales), got {extra!r}{fix}')
    return _scale(scales.get("a", 1.0), "a"), _scale(scales.get("b", 1.0), "b")


def _scale(x: Any, name: str) -> float:
    if hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, np.generic):
        if int(np.prod(x.shape)) != 1:
            raise ValueError(f"quantization_scales[{name!r}] must be a per-tensor scalar (one value), got an array "
                             f"of shape {tuple(x.shape)}: block scales (MXFP8) are a uint8 array of the operand's "
                             "shape with K counted in blocks of 32")
        try:
            x = np.asarray(x).reshape(()).item()
        except Exception:  # a traced value has no concrete value
            raise TypeError(f"quantization_scales[{name!r}] must be a concrete number (it is compiled into the "
                            f"plan), got {type(x).__name__}") from None
    if isinstance(x, np.generic) and not isinstance(x, numbers.Number):
        x = x.item()  # (a bfloat16 scalar)
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"quantization_scales[{name!r}] must be a real number (a float32 scale of {name}), "
                        f"got {x!r} ({type(x).__name__})")
    with np.errstate(over="ignore"):  # (too large for a float32: refused below)
        value = float(np.float32(x))
    if not np.isfinite(value):
        raise ValueError(f"quantization_scales[{name!r}] must be finite as a float32, got {x!r}")
    return value


def _result_type_name(result_type: Any) -> str | None:
    if result_type is None:
        return None
    try:
        name = result_type if isinstance(result_type, str) else dtype_name(result_type)
    except TypeError:
        name = repr(result_type)
    if name not in RESULT_TYPES:
        raise ValueError(f"result_type must be None or one of {RESULT_TYPES} (the result of FP8 operands), "
                         f"got {result_type!r}")
    return name


def _distribution_as_triple(distribution: Any) -> Triple | None:
    if distribution is None:
        return None
    if isinstance(distribution, Distribution):  # (a Sharded as its 2-D form: the same value)
        return (matrix_distribution(distribution, "distribution"),) * 3
    if isinstance(distribution, (tuple, list)):
        if len(distribution) != 3:
            raise ValueError(
                "distribution must be one Distribution or a triple (dist_a, dist_b, dist_result), "
                f"got a sequence of length {len(distribution)}"
            )
        for name, d in zip(("a", "b", "result"), distribution):
            check_distribution(d, f"distribution of {name}")
        a, b, r = (matrix_distribution(d, f"distribution of {n}") for n, d in zip(("a", "b", "result"), distribution))
        return (a, b, r)
    raise TypeError(
        "distribution must be None, a dmatmul Distribution or a triple (dist_a, dist_b, dist_result), "
        f"got {type(distribution).__name__}"
    )



@dataclasses.dataclass(frozen=True)
class Spec:
    """The one value that describes a product, from the call to the kernels;
    hashable (the plan-cache key).

    Shapes are *stored* (``a_shape`` is ``(..., K, M)`` when ``transpose_a``):
    this rank's blocks while :func:`dmatmul._options.validate` checks them
    alone, the global shapes once the ranks agreed. Leading dimensions are
    batch dimensions, broadcast as ``numpy.matmul`` does (:attr:`batch_shape`).
    ``options`` holds every keyword of the call (:class:`Options`:
    distributions, scalars as the dtype computes with them, epilog, algorithm,
    precision, devices), read through the properties below.
    """

    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]
    dtype: str
    options: Options
    family: str = "numpy"
    nprocs: int = 1  # > 1: several processes, operands are local blocks
    c_shape: tuple[int, ...] | None = None  # None: no c given
    bias_shape: tuple[int, ...] | None = None  # None: no bias given

    @classmethod
    def of(cls, a_shape: Sequence[int], b_shape: Sequence[int], dtype: str = "float32", *, c: bool = False,
           bias_shape: tuple[int, ...] | None = None, nprocs: int = 1, family: str = "numpy",
           **options: Any) -> Spec:
        """A Spec from global shapes and :func:`dmatmul.matmul`'s keywords (for
        tools and tests that plan without operands); ``c``: a c of the result's
        shape is given."""
        spec = cls(tuple(a_shape), tuple(b_shape), dtype, Options(**options), family, nprocs, None, bias_shape)
        return dataclasses.replace(spec, c_shape=spec.result_shape) if c else spec

    # -- the call's options -------------------------------------------------------------------------------------
    transpose_a = Via[bool]("options")
    transpose_b = Via[bool]("options")
    alpha = Via[complex]("options")
    beta = Via[complex]("options")
    epilog = Via[Epilog | None]("options")
    algorithm = Via[str]("options")
    precision = Via[str | None]("options")
    devices = Via[Any]("options")

    @property
    def distributions(self) -> tuple[Distribution, Distribution, Distribution] | None:
        """``(dist_a, dist_b, dist_result)``, or None (one process: the planner picks)."""
        return self.options.distribution

    @property
    def fp8(self) -> bool:
        """Whether a and b are FP8 (contract 3b)."""
        return self.dtype in FP8_DTYPES

    @property
    def result_dtype(self) -> str:
        """The dtype of c and of the result: ``result_type`` for FP8 operands
        (bfloat16 unless given), else the operands' dtype."""
        if self.fp8 or self.options.block_scaled is not None:
            return self.options.result_type or "bfloat16"
        return self.dtype

    @property
    def scales(self) -> tuple[float, float]:
        """The per-tensor scales of a and b (1 where not given)."""
        return self.options.quantization_scales or (1.0, 1.0)

    @property
    def scaled_alpha(self) -> complex:
        """``alpha * sa * sb``: the product is ``alpha * (sa*A) @ (sb*B)``, so the
        scales are applied once, to the accumulator, with alpha."""
        sa, sb = self.scales
        return self.alpha * sa * sb if (sa, sb) != (1.0, 1.0) else self.alpha

    # -- what the shapes tell -----------------------------------------------------------------------------------
    @property
    def spmd(self) -> bool:
        return self.nprocs > 1

    @property
    def m(self) -> int:
        return self.a_shape[-1] if self.transpose_a else self.a_shape[-2]

    @property
    def k(self) -> int:
        return self.a_shape[-2] if self.transpose_a else self.a_shape[-1]

    @property
    def n(self) -> int:
        return self.b_shape[-2] if self.transpose_b else self.b_shape[-1]

    @functools.cached_property
    def batch_shape(self) -> tuple[int, ...]:
        """The broadcast batch dimensions of a and b (``()`` for matrices); worked out
        once per Spec (a batched plan asks it at every call)."""
        return tuple(np.broadcast_shapes(self.a_shape[:-2], self.b_shape[:-2]))

    @property
    def result_shape(self) -> tuple[int, ...]:
        return (*self.batch_shape, self.m, self.n)

    @property
    def use_c(self) -> bool:
        """Whether c is read (given, and ``beta != 0``)."""
        return self.c_shape is not None and self.beta != 0

    @property
    def has_bias(self) -> bool:
        return has_bias(self.epilog)

    @property
    def bias_columns(self) -> bool:
        """Whether the bias holds one value per result column (shape (1, N), or
        (..., 1, N) with the batch dimensions), not per row."""
        b = self.bias_shape
        b = b[-2:] if b is not None and len(b) > 2 else b
        return b is not None and b not in ((self.m,), (self.m, 1)) and b == (1, self.n)

    @functools.cached_property
    def batch_size(self) -> int:
        """How many matrix products a batched product holds (1 for matrices)."""
        return int(np.prod(self.batch_shape, dtype=np.int64))

    def item(self) -> Spec:
        """One item of a batched product: the matrix product the 2-D kernels take
        (c's and the bias's batch dimensions taken away)."""
        bias = self.bias_shape
        return dataclasses.replace(
            self, a_shape=self.a_shape[-2:], b_shape=self.b_shape[-2:],
            c_shape=None if self.c_shape is None else self.c_shape[-2:],
            bias_shape=bias[-2:] if bias is not None and len(bias) > 2 else bias)

    @property
    def degenerate(self) -> bool:
        """An empty product (K = 0: the result is ``beta*C``; M or N = 0: empty)."""
        return 0 in (self.m, self.n, self.k)

    @property
    def reads_ab(self) -> bool:
        """Whether A and B are read: not where the product is empty, nor where
        ``alpha == 0`` (BLAS: the result is then ``epilog(beta*C [+ bias])``,
        NaN or Inf in A and B do not reach it)."""
        return not self.degenerate and self.scaled_alpha != 0

    @property
    def shapes(self) -> dict[str, tuple[int, int]]:
        """The stored matrix shapes (the last two dimensions: a batch apart) of "a",
        "b" and the result "d", as the 2-D kernels take them."""
        return {"a": (self.a_shape[-2], self.a_shape[-1]), "b": (self.b_shape[-2], self.b_shape[-1]),
                "d": (self.m, self.n)}

    def item_operands(self, operands: Operands, idx: tuple[int, ...]) -> Operands:
        """The operands of batch item ``idx`` (of :attr:`batch_shape`): each operand's
        matrix at that item (a view, or a slice of a jax.Array), the batch
        dimensions aligned from the right, those of size 1 broadcast; a bias of
        one or two dimensions is every item's."""
        def at(x: Any, lead: int) -> tuple[int, ...]:
            shape = tuple(x.shape[:lead])
            skip = len(idx) - len(shape)
            return tuple(0 if n == 1 else idx[skip + j] for j, n in enumerate(shape))

        a, b, c, bias = operands.a, operands.b, operands.c, operands.bias
        held = kind(operands.family)
        # concrete operands give concrete items, also inside a trace: a jit's closed-over operands on a user's
        # mesh keep their placement, which the item's plan reads (a slice staged into the jit names only an
        # abstract mesh, and a jit of constants has no devices of its own to stand for the ranks)
        def item(x: Any, at: tuple[int, ...]) -> Any:
            own = kind(family(x))
            return x[at] if own is None else own.item(x, at)

        with contextlib.nullcontext() if held is None else held.eager():
            return Operands(item(a, at(a, a.ndim - 2)), item(b, at(b, b.ndim - 2)), None if c is None else item(c, idx),
                            bias if bias is None or bias.ndim <= 2 else item(bias, idx))

    @property
    def transposes(self) -> dict[str, bool]:
        return {"a": self.transpose_a, "b": self.transpose_b, "d": False}

    @property
    def dtype_info(self) -> DtypeInfo:
        return DTYPE_INFO[self.dtype]

    def sizes(self, nranks: int, *, itemsize: int | None = None, pads: bool = False) -> Problem1D:
        """The product's sizes on ``nranks`` ranks, as the cost model takes them
        (``itemsize``: the bytes an element moves as, where the backend moves it
        wider than its dtype)."""
        info = self.dtype_info
        return Problem1D(self.m, self.n, self.k, nranks, itemsize or info.itemsize, info.acc_itemsize, pads=pads)

    def call(self) -> tuple[tuple[str, Any], ...]:
        """The fields every rank's call must agree on (all but the local blocks), named
        as the user wrote them."""
        return (("dtype", self.dtype), *self.options.agreed(),
                ("whether c is given", self.c_shape is not None), ("the shape of bias", self.bias_shape))
