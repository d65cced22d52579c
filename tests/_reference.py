"""The numpy reference every distributed result is checked against."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

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


def assert_close(d: Any, ref: np.ndarray, dtype: str) -> None:
    d = wide(d)
    assert d.shape == ref.shape, f"result shape {d.shape}, expected {ref.shape}"
    err = float(np.abs(d - ref).max()) if d.size else 0.0
    scale = max(1.0, float(np.abs(ref).max()) if ref.size else 1.0)
    assert err <= TOLERANCE[dtype] * scale, f"max error {err:.3g} > {TOLERANCE[dtype]} * {scale:.3g} ({dtype})"


def random_matrix(rng: np.random.Generator, shape: tuple[int, int], dtype: str) -> np.ndarray:
    x = rng.standard_normal(shape)
    if dtype.startswith("complex"):
        x = x + 1j * rng.standard_normal(shape)
    if dtype == "bfloat16":
        import ml_dtypes

        return x.astype(ml_dtypes.bfloat16)
    return x.astype(dtype)
