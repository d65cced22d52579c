"""Type-checked by mypy (tests/test_types.py), never run: what the overloads
of :func:`dmatmul.matmul` promise. numpy operands give a numpy array, a
jax.Array operand a jax.Array, anything else ``Any``; the keywords are those
of ``MatmulOptions``, their names Literal types."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
from typing_extensions import assert_type  # typing.assert_type is 3.11+; the check targets 3.10

import dmatmul as dm


def numpy_in_numpy_out(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32], c: npt.NDArray[np.float32]) -> None:
    assert_type(dm.matmul(a, b), np.ndarray)
    assert_type(dm.matmul(a, b, c), np.ndarray)
    assert_type(dm.matmul(np.ones((3, 2), np.float32), np.ones((2, 5), np.float32)), np.ndarray)
    assert_type(
        dm.matmul(
            a, b, c, distribution=(dm.Slab.X, dm.Slab.Y, dm.Slab.X), alpha=0.5, beta=2.0, transpose_a=True,
            transpose_b=False, epilog="gelu_bias", bias=np.ones(4), backend="jax", algorithm="allgather",
            precision="highest", devices=4,
        ),
        np.ndarray,
    )
    assert_type(dm.matmul(a, b, distribution=dm.Replicated(), epilog=None, precision=None), np.ndarray)


def jax_in_jax_out(x: jax.Array, y: jax.Array, a: npt.NDArray[np.float32]) -> None:
    assert_type(dm.matmul(x, y), jax.Array)
    assert_type(dm.matmul(x, a), jax.Array)
    assert_type(dm.matmul(a, y), jax.Array)
    assert_type(dm.matmul(jnp.ones((3, 2)), jnp.ones((2, 5))), jax.Array)
    assert_type(dm.matmul(x, y, x, beta=1.0, epilog="relu", algorithm="summa", backend="auto"), jax.Array)


def anything_else(u: Any, v: list[list[float]], bare: np.ndarray) -> None:
    assert_type(dm.matmul(u, u), Any)
    assert_type(dm.matmul(v, v), Any)
    # mypy: where an argument's type is made of Any (a bare np.ndarray is ndarray[Any, dtype[Any]])
    # and several overloads match with different results, the result is Any
    assert_type(dm.matmul(bare, bare), Any)
