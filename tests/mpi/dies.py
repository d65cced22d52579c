"""Run under ``mpiexec -n P``: rank 1 dies (or raises) while the others enter a product.

The job must end, not hang: ``mpiexec`` returns non-zero within seconds.
Usage: dies.py exit|raise
"""

from __future__ import annotations

import os
import sys

import numpy as np

import dmatmul as dm

rt = dm.init()
la = np.ones((4, 4 * rt.size), np.float32)  # this rank's rows of A (Slab.X)
lb = np.ones((4 * rt.size, 4), np.float32)  # this rank's columns of B (Slab.Y)
if rt.rank == 1:
    if sys.argv[1] == "exit":
        os._exit(3)
    raise RuntimeError("rank 1 fails outside dmatmul")
for _ in range(1000):  # the others wait for rank 1 in the product's collectives
    dm.matmul(la, lb, distribution=(dm.Slab.X, dm.Slab.Y, dm.Slab.X))
print("UNREACHABLE: the job did not end", flush=True)
