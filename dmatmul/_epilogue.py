"""The epilogue ``epilog(alpha * acc + beta * C + bias)``: one table of the
contract's epilogues (:data:`TABLE`) and one definition for every backend and
array family (numpy, CuPy, jax.numpy, traced or not).

GELU is the tanh approximation, as cuBLASLt's fused GELU and
``jax.nn.gelu(approximate=True)`` define it; SiLU is ``x * sigmoid(x)``
(``jax.nn.silu``). ``bias`` holds one value per result row (cuBLAS
convention: shape (M,) or (M, 1)), added to every column, or one value per
result column (shape (1, N), the ``x @ W + b`` of ML code), added to every row.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

__all__ = [
    "Epilog", "EpilogName", "EpilogInfo", "TABLE", "ACTIVATIONS", "EPILOGS", "has_bias", "activation", "work_dtype",
    "gelu", "silu", "apply",
]

EpilogName = Literal["relu", "gelu", "silu", "bias", "relu_bias", "gelu_bias", "silu_bias"]
Activation = Literal["relu", "gelu", "silu"]

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def relu(xp: Any, z: Any) -> Any:
    return xp.maximum(z, xp.zeros((), dtype=z.dtype))


def gelu(xp: Any, z: Any) -> Any:
    """GELU, tanh approximation."""
    return 0.5 * z * (1 + xp.tanh(_SQRT_2_OVER_PI * (z + 0.044715 * z * z * z)))


def silu(xp: Any, z: Any) -> Any:
    """SiLU ``z * sigmoid(z)``, with ``sigmoid(z) = (1 + tanh(z / 2)) / 2``: no
    overflow of ``exp(-z)`` for large negative ``z``, the same formula in every
    array family."""
    return 0.5 * z * (1 + xp.tanh(0.5 * z))


#: an activation's definition, ``f(xp, z)`` on the epilogue's work dtype
ACTIVATIONS: dict[str, Callable[[Any, Any], Any]] = {"relu": relu, "gelu": gelu, "silu": silu}


@dataclasses.dataclass(frozen=True)
class EpilogInfo:
    """What every part of dmatmul knows of one epilogue.

    ``nvmath``: the ``MatmulEpilog`` member cuBLASMp/cuBLASLt fuses (its bias is
    per row of nvmath's result), or None where cuBLASLt has none: nvmath then
    computes the product alone and dmatmul applies the epilogue to the local
    result block. ``complex``: defined on complex operands (the activations
    are real functions: relu and gelu and silu order or saturate real values).
    """

    bias: bool
    activation: Activation | None
    nvmath: str | None
    complex: bool


#: The contract's epilogues (``epilog=None`` is none of them).
TABLE: dict[str, EpilogInfo] = {
    "relu": EpilogInfo(bias=False, activation="relu", nvmath="RELU", complex=False),
    "gelu": EpilogInfo(bias=False, activation="gelu", nvmath="GELU", complex=False),
    "silu": EpilogInfo(bias=False, activation="silu", nvmath=None, complex=False),
    "bias": EpilogInfo(bias=True, activation=None, nvmath="BIAS", complex=True),
    "relu_bias": EpilogInfo(bias=True, activation="relu", nvmath="RELU_BIAS", complex=False),
    "gelu_bias": EpilogInfo(bias=True, activation="gelu", nvmath="GELU_BIAS", complex=False),
    "silu_bias": EpilogInfo(bias=True, activation="silu", nvmath=None, complex=False),
}


class Epilog(str, enum.Enum):
    """An epilogue: an optional bias vector, then an optional activation.

    A ``str`` (it equals, hashes and prints as the contract's name), so
    ``epilog="relu"`` and ``Epilog.RELU`` are the same value; code asks
    ``.bias``, ``.activation`` (and the rest of :data:`TABLE` through
    ``.info``) instead of parsing the name.

    >>> Epilog("gelu_bias").bias, Epilog("silu_bias").activation, Epilog.RELU == "relu"
    (True, 'silu', True)
    """

    RELU = "relu"
    GELU = "gelu"
    SILU = "silu"
    BIAS = "bias"
    RELU_BIAS = "relu_bias"
    GELU_BIAS = "gelu_bias"
    SILU_BIAS = "silu_bias"

    __hash__ = str.__hash__

    @property
    def info(self) -> EpilogInfo:
        return TABLE[self.value]

    @property
    def bias(self) -> bool:
        """Whether it adds a bias vector."""
        return self.info.bias

    @property
    def activation(self) -> Activation | None:
        """The activation applied last, if any."""
        return self.info.activation

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)

    @classmethod
    def of(cls, name: str | Epilog | None) -> Epilog | None:
        """None, or the Epilog of a name (ValueError for another name)."""
        return None if name is None else cls(name)


assert [e.value for e in Epilog] == list(TABLE), "Epilog's members are TABLE's names"

#: The ``epilog=`` values of the contract.
EPILOGS: tuple[str | None, ...] = (None, *TABLE)


def has_bias(epilog: str | None) -> bool:
    """Whether ``epilog`` adds a bias vector."""
    return epilog is not None and TABLE[str(epilog)].bias


def activation(epilog: str | None) -> Activation | None:
    """The activation of ``epilog``, or None."""
    return None if epilog is None else TABLE[str(epilog)].activation


def work_dtype(dtype: Any) -> np.dtype:
    """The dtype an epilogue computes in: float32 for the half precisions and FP8."""
    dt = np.dtype(dtype)
    half = (dt.kind == "f" and dt.itemsize == 2) or dt.name == "bfloat16" or dt.name.startswith("float8")
    return np.dtype(np.float32) if half else dt


def apply(
    xp: Any, acc: Any, *, alpha: complex = 1.0, beta: complex = 0.0, c: Any = None, bias: Any = None,
    epilog: str | None = None, out_dtype: Any, bias_columns: bool = False,
) -> Any:
    """``epilog(alpha * acc + beta * c + bias)`` cast to ``out_dtype``.

    ``acc`` is computed in its own dtype (the accumulator), or in float32 when
    it is a half precision; ``c`` is skipped when None, ``bias`` when None.
    ``bias`` is a vector: one value per row of ``acc``, or with
    ``bias_columns`` one per column.

    >>> apply(np, np.array([[-1.0, 2.0]]), alpha=2.0, bias=np.array([1.0]), epilog="relu_bias", out_dtype="float32")
    array([[0., 5.]], dtype=float32)
    >>> apply(np, np.zeros((2, 2)), bias=np.array([1.0, 2.0]), epilog="bias", out_dtype="float32", bias_columns=True)
    array([[1., 2.],
           [1., 2.]], dtype=float32)
    """
    work = work_dtype(acc.dtype)
    z = acc.astype(work) if np.dtype(acc.dtype) != work else acc
    if alpha != 1:
        z = z * xp.asarray(alpha, dtype=work)
    if c is not None:
        z = z + xp.asarray(beta, dtype=work) * c.astype(work)
    if bias is not None:
        bias = bias.reshape(-1).astype(work)
        z = z + (bias[None, :] if bias_columns else bias[:, None])
    act = activation(epilog)
    if act is not None:
        z = ACTIVATIONS[act](xp, z)
    return z.astype(out_dtype)
