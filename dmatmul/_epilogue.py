"""The epilogue ``epilog(alpha * acc + beta * C + bias)``: one definition for
every backend and array family (numpy, CuPy, jax.numpy, traced or not).

GELU is the tanh approximation, as cuBLASLt's fused GELU and
``jax.nn.gelu(approximate=True)`` define it. ``bias`` holds one value per
result row (cuBLAS convention) and is added to every column.
"""

from __future__ import annotations

import enum
import math
from typing import Any, Literal

import numpy as np

__all__ = ["Epilog", "EpilogName", "EPILOGS", "has_bias", "activation", "work_dtype", "gelu", "apply"]

EpilogName = Literal["relu", "gelu", "bias", "relu_bias", "gelu_bias"]

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


class Epilog(str, enum.Enum):
    """An epilogue: an optional bias vector, then an optional activation.

    A ``str`` (it equals, hashes and prints as the contract's name), so
    ``epilog="relu"`` and ``Epilog.RELU`` are the same value; code asks
    ``.bias`` and ``.activation`` instead of parsing the name.

    >>> Epilog("gelu_bias").bias, Epilog("gelu_bias").activation, Epilog.RELU == "relu"
    (True, 'gelu', True)
    """

    RELU = "relu"
    GELU = "gelu"
    BIAS = "bias"
    RELU_BIAS = "relu_bias"
    GELU_BIAS = "gelu_bias"

    __hash__ = str.__hash__

    @property
    def bias(self) -> bool:
        """Whether it adds a bias vector (one value per result row)."""
        return self.value.endswith("bias")

    @property
    def activation(self) -> Literal["relu", "gelu"] | None:
        """The activation applied last, if any."""
        head = self.value.split("_")[0]
        return head if head in ("relu", "gelu") else None  # type: ignore[return-value]

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)

    @classmethod
    def of(cls, name: str | Epilog | None) -> Epilog | None:
        """None, or the Epilog of a name (ValueError for another name)."""
        return None if name is None else cls(name)


#: The ``epilog=`` values of the contract.
EPILOGS: tuple[str | None, ...] = (None, *(e.value for e in Epilog))


def has_bias(epilog: str | None) -> bool:
    """Whether ``epilog`` adds a bias vector."""
    e = Epilog.of(epilog)
    return e is not None and e.bias


def activation(epilog: str | None) -> Literal["relu", "gelu"] | None:
    """The activation of ``epilog``, or None."""
    e = Epilog.of(epilog)
    return None if e is None else e.activation


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
    act = activation(epilog)
    if act == "relu":
        z = xp.maximum(z, xp.zeros((), dtype=work))
    elif act == "gelu":
        z = gelu(xp, z)
    return z.astype(out_dtype)
