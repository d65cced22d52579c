"""Test setup: JAX on 8 simulated CPU devices, configured before JAX starts.

Set DMATMUL_TEST_PLATFORM (e.g. "cuda") to run the JAX tests on another
platform; the default is the CPU, as in CI. Plans use the package's default
cost model (DMATMUL_COST_MODEL=default), whatever calibration the machine has.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", os.environ.get("DMATMUL_TEST_PLATFORM", "cpu"))
# the package's default cost model, not a calibration this machine may hold (subprocesses inherit it)
os.environ["DMATMUL_COST_MODEL"] = "default"

try:
    import jax
except ImportError:  # the distribution and layout tests run without JAX
    jax = None
else:
    jax.config.update("jax_num_cpu_devices", 8)
