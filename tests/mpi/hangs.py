"""Run under ``mpiexec -n 2``: rank 0 waits in a JAX collective that rank 1 never joins.

The test sends SIGTERM to ``mpiexec`` once rank 0 says it is waiting; the
job must end (JAX's preemption service would otherwise catch SIGTERM and the
hung rank would live on).
"""

from __future__ import annotations

import time

import numpy as np

import dmatmul as dm

rt = dm.init()
import jax  # noqa: E402  (started by dm.init)
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

devices = sorted(jax.devices(), key=lambda d: d.process_index)
mesh = Mesh(np.array(devices), ("x",))
sharding = NamedSharding(mesh, PartitionSpec("x"))
x = jax.make_array_from_single_device_arrays((2,), sharding, [jax.device_put(np.ones(1, np.float32), jax.local_devices()[0])])
rt.comm.Barrier()
if rt.rank == 1:
    print("rank 1 stays away", flush=True)
    time.sleep(600)
print("rank 0 waits in a collective", flush=True)
total = jax.jit(lambda v: v.sum(), out_shardings=NamedSharding(mesh, PartitionSpec()))(x)
print("UNREACHABLE", float(total), flush=True)
