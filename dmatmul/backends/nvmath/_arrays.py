"""What the neutral core asks of CuPy arrays, answered without importing CuPy.

:data:`KIND` is the nvmath backend's :class:`dmatmul._spec.ArrayKind`: the
table (:mod:`dmatmul.backends`) registers it when the package is imported, so
it reads ``cupy`` from ``sys.modules`` only (a CuPy array exists only once the
user imported CuPy). A product on CuPy arrays is not claimed here: under
``backend="auto"`` the table's order already prefers nvmath where it runs.
"""

from __future__ import annotations

import sys
from typing import Any

from ..._spec import ArrayKind

__all__ = ["KIND", "CupyArrays"]


class CupyArrays(ArrayKind):
    family = "cupy"

    def owns(self, x: Any) -> bool:
        cupy = sys.modules.get("cupy")
        return cupy is not None and isinstance(x, cupy.ndarray)

    def array_module(self) -> Any:
        import cupy

        return cupy


KIND = CupyArrays()
