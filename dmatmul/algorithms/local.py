"""``local``: each rank multiplies what it holds, with no communication (one
operand replicated, or both and the result)."""

from __future__ import annotations

from .base import Algorithm, Kernel


class Local(Algorithm):
    name = "local"
    summary = "a local GEMM on the blocks each rank holds, no communication"
    kernels = (
        Kernel("local", "M", "R", "M"),
        Kernel("local", "R", "N", "N"),
        Kernel("local", "R", "R", "R"),
    )


ALGORITHM = Local()
