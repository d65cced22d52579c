"""The problem the bench poses: square operands of a dtype on a layout.

Layout names (``"XYX"``: a letter per operand, X/Y/R/G) and the squarest
process grid for ``G``; the deterministic float32 operands (the same on every
rank), their conversion to the bench's dtype, and the correctness check every
timed implementation passes once, against a float64 reference, before it is
timed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def grid_shape(p: int) -> tuple[int, int]:
    """The squarest ``(rows, cols)`` grid of ``p`` ranks, ``rows <= cols``.

    >>> grid_shape(8), grid_shape(4), grid_shape(6), grid_shape(7)
    ((2, 4), (2, 2), (2, 3), (1, 7))
    """
    rows = max(r for r in range(1, math.isqrt(p) + 1) if p % r == 0)
    return rows, p // rows


def parse_layout(name: str, nranks: int | None = None) -> tuple[Any, Any, Any]:
    """``"XYX"`` -> ``(Slab.X, Slab.Y, Slab.X)``; letters X (rows), Y (columns),
    R (replicated), G (``BlockNonCyclic`` on the squarest grid of ``nranks``)
    for a, b and the result.

    >>> parse_layout("YXR")
    (Slab.Y, Slab.X, Replicated())
    >>> parse_layout("GGG", 8)[0]
    BlockNonCyclic(ProcessGrid((2, 4), layout='row'))
    """
    from ..._distribution import BlockNonCyclic, ProcessGrid, Replicated, Slab

    letters: dict[str, Any] = {"X": Slab.X, "Y": Slab.Y, "R": Replicated()}
    key = name.strip().upper()
    if len(key) != 3 or any(c not in "XYRG" for c in key):
        raise ValueError(
            f"layout {name!r}: expected three letters from X (Slab.X), Y (Slab.Y), R (Replicated()), "
            "G (BlockNonCyclic on a 2-D grid) for a, b and the result, e.g. XYX, YXY or GGG"
        )
    if "G" in key:
        letters["G"] = BlockNonCyclic(ProcessGrid(grid_shape(nranks or 4)))
    return tuple(letters[c] for c in key)


def operands(n: int, dtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic float32 operands (the same on every rank)."""
    rng = np.random.default_rng(seed + n)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    return a, b


def as_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return x
    if dtype == "bfloat16":
        import ml_dtypes

        return x.astype(ml_dtypes.bfloat16)
    return x.astype(dtype)


def numpy_dtype(dtype: str) -> str:
    """The element type of numpy's peer for the bench's ``dtype``: float32 for
    the half precisions, which numpy has no GEMM for; else ``dtype`` itself."""
    return dtype if dtype in ("float32", "float64") else "float32"


def numpy_note(dtype: str) -> str | None:
    """The note on numpy's row where it runs another element type than the bench."""
    return None if numpy_dtype(dtype) == dtype else f"float32 GEMM (numpy has none in {dtype})"


#: The largest n whose whole product the bench checks (a float64 GEMM of it); larger ones, a sample of rows.
FULL_CHECK_MAX = 4096


def check_rows(n: int) -> np.ndarray:
    """The rows of an ``n x n`` result the bench checks against its float64
    reference: all of them up to :data:`FULL_CHECK_MAX`, else 64 spread over
    every block of rows (a wrong kernel is still caught; it went unchecked).

    >>> len(check_rows(4096)), check_rows(8192)[[0, -1]].tolist()
    (4096, [0, 8191])
    """
    if n <= FULL_CHECK_MAX:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, 64).round().astype(np.int64))


def rel_err(got: Any, ref: np.ndarray) -> float:
    g = np.asarray(got, dtype=np.float64)
    return float(np.abs(g - ref).max() / max(np.abs(ref).max(), 1e-30))


TOL = {"float32": 1e-4, "float64": 1e-10, "bfloat16": 3e-2, "float16": 1e-2}
