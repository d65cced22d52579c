"""Test setup: JAX on 8 simulated CPU devices, configured before JAX starts.

Set DMATMUL_TEST_PLATFORM (e.g. "cuda") to run the JAX tests on another
platform; the default is the CPU, as in CI. Plans use the package's default
cost model (DMATMUL_COST_MODEL=default), whatever calibration the machine has.

Hypothesis profiles: "ci" (the default: a bounded, reproducible run, no
example database) and "long" (thousands of examples per property, new ones
each run), chosen by ``DMATMUL_LONG=1`` or ``--hypothesis-profile=long``.
"""

from __future__ import annotations

import gc
import importlib
import os
import pathlib
import sys

import pytest

os.environ.setdefault("JAX_PLATFORMS", os.environ.get("DMATMUL_TEST_PLATFORM", "cpu"))
# the package's default cost model, not a calibration this machine may hold (subprocesses inherit it)
os.environ["DMATMUL_COST_MODEL"] = "default"

try:
    import jax
except ImportError:  # the distribution and layout tests run without JAX
    jax = None
else:
    jax.config.update("jax_num_cpu_devices", 8)

try:
    from hypothesis import HealthCheck, settings
except ImportError:
    pass
else:
    settings.register_profile(
        "ci", max_examples=200, deadline=None, derandomize=True, database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile(
        "long", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow],
    )
    settings.load_profile("long" if os.environ.get("DMATMUL_LONG", "") not in ("", "0") else "ci")

GPU_DIR = pathlib.Path(__file__).resolve().parent / "gpu"


@pytest.fixture(scope="module", autouse=True)
def _caches_emptied_after_each_module():
    """Each test module leaves dmatmul's plan cache and JAX's compilation
    caches empty behind it. Kept, every module's compiled programs piled up (by
    the end of test_grid 1.2 million objects and 3.5 GB, where emptied 0.2
    million and 1.1 GB) and every later test ran slower: test_grid's generated
    products 14 s alone, 21 s after the modules before it, 92 s in the whole
    run, which took 41 min (CI: 40 min)."""
    yield
    from dmatmul._plans import PLANS

    PLANS.clear()
    if jax is not None:
        jax.clear_caches()
    gc.collect()


@pytest.fixture
def fake_nvmath():
    """nvmath-python and CuPy replaced by tests/gpu/_fake_nvmath.py (numpy on the CPU)."""
    sys.path.insert(0, str(GPU_DIR))
    import _fake_nvmath

    from dmatmul import backends
    from dmatmul.backends.nvmath import _engine

    nv = importlib.import_module("dmatmul.backends.nvmath")

    def reset():
        nv.BACKEND.clear()  # cached plans hold the previous fake's objects
        nv.unavailable.cache_clear()
        backends._loaded.pop("nvmath", None)
        _engine._context = None

    _fake_nvmath.install()
    reset()
    try:
        yield _fake_nvmath
    finally:
        reset()  # the plans are freed while the fake runtime still lives, as at exit
        _fake_nvmath.uninstall()
        sys.path.remove(str(GPU_DIR))
