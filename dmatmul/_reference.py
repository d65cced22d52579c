"""The numpy reference every distributed result is checked against.

Used by ``dmatmul check`` (:mod:`dmatmul._check`) and by the tests (through
``tests/_reference.py``). numpy only; ``ml_dtypes`` is imported for bfloat16.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "TOLERANCE", "wide", "gelu_tanh", "reference", "error_ratio", "finite_scale", "assert_close", "random_matrix",
    "add_specials",
]

#: max |d - ref| allowed, relative to max(1, max |ref|) (accumulation in >= f32)
TOLERANCE = {
    "float16": 2e-3,
    "bfloat16": 1.6e-2,
    "float32": 2e-5,
    "complex64": 2e-5,
    "float64": 1e-12,
    "complex128": 1e-12,
}


def wide(x: Any) -> np.ndarray:
    x = np.asarray(x)
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def reference(
    a: Any, b: Any, c: Any = None, *, alpha: complex = 1.0, beta: complex = 0.0,
    transpose_a: bool = False, transpose_b: bool = False, epilog: str | None = None, bias: Any = None,
) -> np.ndarray:
    """``epilog(alpha * op(a) @ op(b) + beta * c + bias)`` in float64/complex128."""
    a, b = wide(a), wide(b)
    with np.errstate(invalid="ignore"):  # inf - inf, 0 * inf in operands with inf/NaN: NaN, as it should
        d = alpha * ((a.T if transpose_a else a) @ (b.T if transpose_b else b))
        if c is not None and beta != 0:
            d = d + beta * wide(c)
        if epilog and epilog.endswith("bias"):
            d = d + wide(bias).reshape(-1, 1)
        if epilog in ("relu", "relu_bias"):
            d = np.maximum(d, 0)
        elif epilog in ("gelu", "gelu_bias"):
            d = gelu_tanh(d)
    return d


def finite_scale(want: np.ndarray) -> float:
    """max |want| over its finite entries (1 where it has none): what the
    tolerance scales with."""
    finite = np.abs(want[np.isfinite(want)]) if want.size else want
    return float(finite.max()) if finite.size else 1.0


def error_ratio(d: Any, want: np.ndarray, dtype: str, scale: float | None = None) -> float:
    """max |d - want| over the tolerance of ``dtype`` times ``max(1, scale)``
    (``scale`` defaults to max |want| over its finite entries): at most 1
    passes. Where ``want`` is not finite, ``d`` must hold the same value there
    (NaN where NaN, the same infinity where one), else the ratio is infinite;
    NaN where ``d`` has NaN and ``want`` has none.

    >>> error_ratio(np.array([np.inf, np.nan, 1.0]), np.array([np.inf, np.nan, 1.0]), "float64")
    0.0
    >>> error_ratio(np.array([np.nan, 1.0]), np.array([np.inf, 1.0]), "float64")
    inf
    """
    d = wide(d)
    if scale is None:
        scale = finite_scale(want)
    finite = np.isfinite(want)
    if not finite.all():
        same = np.where(np.isnan(want), np.isnan(d), d == want)
        if not same[~finite].all():
            return math.inf
        d, want = d[finite], want[finite]
    err = float(np.abs(d - want).max()) if d.size else 0.0
    return err / (TOLERANCE[dtype] * max(1.0, scale))


def assert_close(d: Any, ref: np.ndarray, dtype: str) -> None:
    d = wide(d)
    assert d.shape == ref.shape, f"result shape {d.shape}, expected {ref.shape}"
    ratio = error_ratio(d, ref, dtype)
    assert ratio <= 1.0, f"max error {ratio:.3g} x the tolerance {TOLERANCE[dtype]} x max(1, max|ref|) ({dtype})"


def random_matrix(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    x = rng.standard_normal(shape)
    if dtype.startswith("complex"):
        x = x + 1j * rng.standard_normal(shape)
    if dtype == "bfloat16":
        import ml_dtypes

        return x.astype(ml_dtypes.bfloat16)
    return x.astype(dtype)


#: the values :func:`add_specials` plants
SPECIALS = (math.inf, -math.inf, math.nan)


def add_specials(rng: np.random.Generator, x: np.ndarray, most: int = 3) -> np.ndarray:
    """``x`` (real, modified in place and returned) with 1 to ``most`` entries
    at random positions set to +inf, -inf or NaN: each poisons one row or
    column of a product, and a zero of padding that meets one poisons a result
    entry that should stay finite (0 * inf = NaN)."""
    if x.size:
        for _ in range(int(rng.integers(1, most + 1))):
            x.flat[int(rng.integers(x.size))] = SPECIALS[int(rng.integers(len(SPECIALS)))]
    return x
