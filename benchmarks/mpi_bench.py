"""``dmatmul bench`` under mpiexec, with the defaults of the mpirun measurement.

dmatmul's AllGather+GEMM (layout (Slab.X, Slab.Y, Slab.X)) and
GEMM+ReduceScatter (layout (Slab.Y, Slab.X, Slab.Y)) against JAX's own
multi-process ``jit(jnp.dot)`` with the same shardings, and numpy's
single-process GEMM (run by rank 0 in a helper process with every core while
the other ranks sleep), n = 2048 and 4096, float32::

    OPENBLAS_NUM_THREADS=1 mpiexec -n 4 -bind-to core python benchmarks/mpi_bench.py

Any ``dmatmul bench`` option may follow (``--sizes 1024``, ``--reps 7``,
``--json PATH``, ...); they override these defaults. The same run is
``mpiexec -n 4 -bind-to core dmatmul bench --sizes 2048,4096 ...``.

Why the launch flags: XLA sizes its CPU thread pool by the process's CPU
affinity, so ``-bind-to core`` gives each rank one core's worth of threads
instead of oversubscribing the machine P times over; one BLAS thread per rank
for the same reason. MPICH ranks busy-poll inside blocking MPI calls, so the
bench times nothing while a rank waits in one (its barriers sleep).
"""

from __future__ import annotations

import os
import sys

DEFAULTS = {
    "sizes": "2048,4096",
    "layouts": "XYX,YXY",
    "reps": 5,
    "json": "mpi-bench.json",
    "plot": "mpi-bench.png",
}
DESCRIPTION = (
    "dmatmul bench under mpiexec: AllGather+GEMM (XYX) and GEMM+ReduceScatter (YXY) against JAX's multi-process "
    "jit(jnp.dot) and numpy, n = 2048 and 4096. Launch: OPENBLAS_NUM_THREADS=1 mpiexec -n 4 -bind-to core "
    "python benchmarks/mpi_bench.py [options]"
)


def main() -> int:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        from dmatmul.cli import bench as _bench
    except ImportError:  # run from a checkout without installing
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        from dmatmul.cli import bench as _bench

    return _bench.main(sys.argv[1:], prog="mpi_bench.py", description=DESCRIPTION, defaults=DEFAULTS)


if __name__ == "__main__":
    sys.exit(main())
