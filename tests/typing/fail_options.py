"""Type-checked by mypy (tests/test_types.py), never run: each line marked
``# E`` must be a type error (a misspelt Literal option, an unknown keyword);
the unmarked calls must type-check."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

import dmatmul as dm


def misspelt(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> None:
    dm.matmul(a, b, epilog="relux")  # E
    dm.matmul(a, b, algorithm="ring")  # E
    dm.matmul(a, b, backend="cuda")  # E
    dm.matmul(a, b, precision="fast")  # E
    dm.matmul(a, b, transpose=True)  # E
    dm.Matmul(a, b, epilog="relux")  # E
    dm.matmul(a, b, epilog="relu", algorithm="summa", backend="jax", precision="high")
    dm.Matmul(a, b, epilog="gelu_bias", bias=np.ones(3))
