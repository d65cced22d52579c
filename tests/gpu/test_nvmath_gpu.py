"""The nvmath (cuBLASMp) backend on real GPUs: skipped where it cannot run.

Run on an NVIDIA GPU machine with nvmath-python 1.0 (``pip install
'.[nvmath,mpi,jax,test]'``)::

    python -m pytest -m gpu tests/gpu -v

In process (one rank, a local GEMM in cuBLASMp) and as ``mpiexec -n 1``
(and ``-n <GPUs>`` where there are several) subprocesses driving
``tests/gpu/nvmath_products.py``: every 1-D layout triple x transposes x
(alpha, beta, c) x epilogs x dtypes, plan reuse, numpy and cupy operands,
checked against numpy and against the JAX backend. And the differential
matrix at scale (``tests/gpu/nvmath_check.py``: ``dmatmul check --backend
nvmath``, 2,000 seeded cases, about 30 s on an H200), which found what the
fake could not (cuBLASMp's quick return, issue 34); tests/test_conformance.py
runs the same script on the fake.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import dmatmul as dm
from dmatmul import backends

pytestmark = pytest.mark.gpu

_REASON = backends.probe("nvmath")
if _REASON is not None:
    pytest.skip(f"the nvmath backend cannot run here: {_REASON}", allow_module_level=True)

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
from dmatmul.testing.reference import assert_close, random_matrix, reference  # noqa: E402

X, Y, R = dm.Slab.X, dm.Slab.Y, dm.Replicated()


def _ngpus() -> int:
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


def _mpiexec() -> str:
    found = shutil.which("mpiexec") or str(pathlib.Path(sys.executable).parent / "mpiexec")
    if not os.path.exists(found) or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpiexec / mpi4py not installed: pip install 'dmatmul[mpi]'")
    return found


def _run_products(nprocs: int, *extra: str, timeout: int = 3600) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    cmd = [_mpiexec(), "-n", str(nprocs), sys.executable, str(HERE / "nvmath_products.py"), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-6000:]
    assert "cases match numpy" in out.stdout and "MISMATCH" not in out.stdout
    return out.stdout


# --------------------------------------------------------------------------- #
# in process: one rank
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "complex64", "complex128"])
def test_one_rank_matches_numpy_and_jax(ta, tb, dtype):
    rng = np.random.default_rng(0)
    m, n, k = 33, 17, 20
    a = random_matrix(rng, (k, m) if ta else (m, k), dtype)
    b = random_matrix(rng, (n, k) if tb else (k, n), dtype)
    c = random_matrix(rng, (m, n), dtype)
    c0 = c.copy()
    d = dm.matmul(a, b, c, alpha=0.5, beta=2.0, transpose_a=ta, transpose_b=tb, backend="nvmath")
    ref = reference(a, b, c, alpha=0.5, beta=2.0, transpose_a=ta, transpose_b=tb)
    assert isinstance(d, np.ndarray) and d.dtype == a.dtype
    assert_close(d, ref, dtype)
    assert np.array_equal(c, c0)  # c is never written
    if importlib.util.find_spec("jax") is not None:
        j = dm.matmul(a, b, c, alpha=0.5, beta=2.0, transpose_a=ta, transpose_b=tb, backend="jax", devices=1)
        assert_close(d, np.asarray(j).astype(np.complex128 if dtype.startswith("complex") else np.float64), dtype)


@pytest.mark.parametrize("epilog", ["relu", "gelu", "silu", "bias", "relu_bias", "gelu_bias", "silu_bias"])
@pytest.mark.parametrize("bias_shape", [(40,), (1, 16)])
def test_one_rank_epilogs(epilog, bias_shape):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((40, 24)).astype(np.float32), rng.standard_normal((24, 16)).astype(np.float32)
    bias = rng.standard_normal(bias_shape).astype(np.float32)
    kw = dict(bias=bias) if epilog.endswith("bias") else {}
    d = dm.matmul(a, b, epilog=epilog, backend="nvmath", **kw)
    assert_close(d, reference(a, b, epilog=epilog, bias=bias if kw else None), "float32")


def test_one_rank_cupy_in_cupy_out_and_plan_reuse():
    import cupy

    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((32, 24)), rng.standard_normal((24, 16))
    ga, gb = cupy.asarray(a), cupy.asarray(b)
    with dm.Matmul(ga, gb, backend="nvmath") as mm:
        mm.plan()
        assert mm.algorithm == "local"
        text = mm.explain()
        assert "local GEMM" in text and "nvmath-python" in text
        d1 = mm.execute()
        assert isinstance(d1, cupy.ndarray)
        mm.reset_operands(a=2 * ga)
        d2 = mm.execute()
    assert_close(cupy.asnumpy(d1), a @ b, "float64")
    assert_close(cupy.asnumpy(d2), 2 * a @ b, "float64")


def test_auto_picks_nvmath_here():
    assert backends.resolve("auto").name == "nvmath"
    with dm.Matmul(np.ones((4, 3)), np.ones((3, 5))) as mm:
        assert "backend:    nvmath" in mm.explain()


#: the differential matrix's size on a GPU: at least 2,000 seeded cases (about 30 s on an H200)
CHECK_CASES = 2000


def test_differential_matrix_at_scale():
    """``dmatmul check --backend nvmath`` on 2,000 seeded random products (every
    layout, dtype and option; alpha = 0 with inf/NaN in a and b, BLAS's quick
    return on one-row and one-column results): 0 failures. The table is printed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(HERE / "nvmath_check.py"), "--cases", str(CHECK_CASES), "--seed", "0"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800)
    print(out.stdout)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-6000:]
    assert re.search(rf"^total\s+{CHECK_CASES}\s+\d+\s+\d+\s+0\s", out.stdout, re.M), out.stdout[-6000:]


# --------------------------------------------------------------------------- #
# mpiexec: the full product table
# --------------------------------------------------------------------------- #
@pytest.mark.mpi
@pytest.mark.parametrize("dtypes", ["float32,float64", "float16,bfloat16", "complex64,complex128"])
def test_products_one_process(dtypes):
    _run_products(1, "--compare-jax", "--dtypes", dtypes)


@pytest.mark.mpi
def test_products_every_gpu():
    ngpus = _ngpus()
    if ngpus < 2:
        pytest.skip("one GPU: the multi-rank table needs at least two (one process per GPU)")
    nprocs = min(ngpus, 4)
    out = _run_products(nprocs, "--compare-jax", "--dtypes", "float32,float64,complex64")
    for path in ("AG+GEMM", "GEMM+RS", "GEMM+AR", "general", "local GEMM"):
        assert path in out
    _run_products(nprocs, "--quick")
