"""dmatmul: distributed dense matrix multiplication.

``dmatmul.matmul(a, b, distribution=...)`` multiplies matrices laid out over
ranks (devices of one process, or the processes of an ``mpiexec`` launch) with
cuBLASMp through nvmath-python on NVIDIA GPUs and JAX ``shard_map`` ring
kernels everywhere else. This module only re-exports; importing it loads
neither JAX, nvmath-python, CuPy nor MPI.
"""

from . import layout
from ._distribution import (
    BlockCyclic,
    BlockNonCyclic,
    Distribution,
    Replicated,
    Slab,
    join,
    split,
)
from ._errors import DistributionError, PlanFreedError
from ._grid import ProcessGrid
from ._mesh import ProcessMesh
from ._sharded import Sharded
from ._epilogue import EPILOGS
from ._matmul import Matmul, matmul
from ._spec import ALGORITHMS, DTYPES
from ._redistribute import redistribute
from ._runtime import Runtime, finalize, init, runtime
from ._version import __version__

__all__ = [
    "ALGORITHMS",
    "BlockCyclic",
    "BlockNonCyclic",
    "DTYPES",
    "Distribution",
    "DistributionError",
    "EPILOGS",
    "Matmul",
    "PlanFreedError",
    "ProcessGrid",
    "ProcessMesh",
    "Replicated",
    "Runtime",
    "Sharded",
    "Slab",
    "__version__",
    "finalize",
    "init",
    "join",
    "layout",
    "matmul",
    "redistribute",
    "runtime",
    "split",
]
