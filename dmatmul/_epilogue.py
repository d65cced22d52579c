"""The epilogue ``epilog(alpha * acc + beta * C + bias)``: one definition for
every backend and array family (numpy, CuPy, jax.numpy, traced or not).

GELU is the tanh approximation, as cuBLASLt's fused GELU and
``jax.nn.gelu(approximate=True)`` define it. ``bias`` holds one value per
result row (cuBLAS convention) and is added to every column.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["EPILOGS", "has_bias", "work_dtype", "gelu", "apply"]

EPILOGS: tuple[str | None, ...] = (None, "relu", "gelu", "bias", "relu_bias", "gelu_bias")

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def has_bias(epilog: str | None) -> bool:
    """Whether ``epilog`` adds a bias vector."""
    return epilog in ("bias", "relu_bias", "gelu_bias")


def work_dtype(dtype: Any) -> np.dtype:
    """The dtype an epilogue computes in: float32 for the half precisions."""
    dt = np.dtype(dtype)
    half = (dt.kind == "f" and dt.itemsize == 2) or dt.name == "bfloat16"
    return np.dtype(np.float32) if half else dt


def gelu(xp: Any, z: Any) -> Any:
    """GELU, tanh approximation."""
    return 0.5 * z * (1 + xp.tanh(_SQRT_2_OVER_PI * (z + 0.044715 * z * z * z)))


def apply(
    xp: Any, acc: Any, *, alpha: complex = 1.0, beta: complex = 0.0, c: Any = None, bias: Any = None,
    epilog: str | None = None, out_dtype: Any,
) -> Any:
    """``epilog(alpha * acc + beta * c + bias)`` cast to ``out_dtype``.

    ``acc`` is computed in its own dtype (the accumulator), or in float32 when
    it is a half precision; ``c`` is skipped when None, ``bias`` when None.

    >>> apply(np, np.array([[-1.0, 2.0]]), alpha=2.0, bias=np.array([1.0]), epilog="relu_bias", out_dtype="float32")
    array([[0., 5.]], dtype=float32)
    """
    work = work_dtype(acc.dtype)
    z = acc.astype(work) if np.dtype(acc.dtype) != work else acc
    if alpha != 1:
        z = z * xp.asarray(alpha, dtype=work)
    if c is not None:
        z = z + xp.asarray(beta, dtype=work) * c.astype(work)
    if bias is not None:
        z = z + bias.astype(work)[:, None]
    if epilog in ("relu", "relu_bias"):
        z = xp.maximum(z, xp.zeros((), dtype=work))
    elif epilog in ("gelu", "gelu_bias"):
        z = gelu(xp, z)
    return z.astype(out_dtype)
