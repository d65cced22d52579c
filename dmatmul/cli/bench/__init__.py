"""dmatmul bench: dmatmul side by side with its peers, in one run.

For every size, device count and layout the bench times, interleaved
(repetition ``r`` runs every implementation once, in a seeded random
order), after warm-up:

* ``dmatmul auto`` and ``dmatmul <algorithm>`` for each named algorithm that
  fits the layout: a planned :class:`dmatmul.Matmul` on ``jax.Array``
  operands already laid out as its distributions say (``execute()`` +
  ``jax.block_until_ready``);
* ``xla``: XLA's own partitioning, ``jax.jit(jnp.dot)`` on the same input
  arrays with the result distribution as ``out_shardings`` (mesh axes
  ``AxisType.Auto``);
* ``xla-1dev``: ``jax.jit(jnp.dot)`` of the whole problem on one device (the
  ceiling of any JAX path on a host whose devices share its cores);
* ``numpy``: numpy's single-process GEMM of the whole problem (float32 when
  the bench runs bfloat16/float16, which numpy has no GEMM for).

and reports median/min/max, GFLOP/s of the median, the ratio of each
implementation to each peer (``x numpy`` = numpy's time / this time: above 1
is faster), and for dmatmul the cost model's prediction, modelled bytes per
rank and their ratio to the lower bound. Results go to a terminal table, a
JSON file and a PNG plot (matplotlib, optional).

Under ``mpiexec -n P`` the same command runs as P processes (one CPU device
each): operands are each rank's blocks, ``xla`` is JAX's multi-process
``jit(jnp.dot)`` on global arrays with the same shardings, ``numpy`` runs in
a helper process of rank 0 with the whole machine while the other ranks
sleep (MPICH ranks busy-poll inside MPI calls, so no rank times anything
while another waits in one). Launch with ``-bind-to core`` and
``OPENBLAS_NUM_THREADS=1``.

``dmatmul bench --calibrate`` measures alpha (s/message), beta (s/byte) and
gamma (s/flop per rank) on this machine for each device count and saves them
where :func:`dmatmul._cost.model_for` finds them.

The package, by job: :mod:`.command` (options and entry points),
:mod:`.problem` (layouts, operands, the correctness check), :mod:`.peers`
(what is timed: dmatmul's plans, XLA, numpy), :mod:`.timing` (the
interleaved timing loop, results and their statistics, the progress bar),
:mod:`.devices` (one process, simulated devices), :mod:`.mpi` (``mpiexec``
runs and their numpy worker), :mod:`.report` (tables, JSON, plot) and
:mod:`.calibration` (fitting the cost model, the costs table).
"""

from __future__ import annotations

from .calibration import calibration_samples, format_costs
from .command import QUICK_DEVICES, QUICK_SIZES, add_parser, finish_args, main, run
from .peers import PEERS
from .problem import grid_shape, parse_layout
from .report import format_group, format_summary, write_json, write_plot
from .timing import IdleWaiter, Progress, Result, busy_fraction, rep_order, time_interleaved

__all__ = [
    "add_parser", "run", "main", "finish_args", "parse_layout", "grid_shape", "Result", "PEERS", "QUICK_SIZES",
    "QUICK_DEVICES", "time_interleaved", "rep_order", "busy_fraction", "IdleWaiter", "Progress", "format_group",
    "format_summary", "write_json", "write_plot", "format_costs", "calibration_samples",
]
