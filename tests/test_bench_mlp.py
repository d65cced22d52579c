"""benchmarks/mlp.py at a tiny size: the dmatmul block's output and gradients
equal the XLA-partitioned block's (numerics only; timings are not tested)."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")

SPEC = importlib.util.spec_from_file_location(
    "bench_mlp", pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "mlp.py"
)
mlp = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(mlp)


@pytest.mark.parametrize("shape", [(2, 4), (1, 8), (8, 1)])
def test_mlp_block_matches_xla(shape):
    mesh = mlp.make_mesh(shape)
    blocks = mlp.build(mesh, jax.lax.Precision.HIGHEST)
    host = mlp.operands(64, 16, 32, seed=sum(shape))
    args = [jax.device_put(a, s) for a, s in zip(host, blocks["shardings"])]
    out_d, out_x = (np.asarray(blocks[k][0](*args)) for k in ("dmatmul", "xla"))
    np.testing.assert_allclose(out_d, out_x, rtol=1e-5, atol=1e-5)
    (loss_d, g_d), (loss_x, g_x) = (blocks[k][1](*args) for k in ("dmatmul", "xla"))
    np.testing.assert_allclose(float(loss_d), float(loss_x), rtol=1e-5, atol=1e-4)
    for name, gd, gx, a in zip(("dx", "dw1", "dw2"), g_d, g_x, host):
        assert gd.shape == a.shape, name
        np.testing.assert_allclose(np.asarray(gd), np.asarray(gx), rtol=1e-4, atol=1e-4, err_msg=name)
    # and both against numpy (float64)
    x, w1, w2 = (a.astype(np.float64) for a in host)
    h = x @ w1
    gelu = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    np.testing.assert_allclose(out_d, gelu @ w2, rtol=1e-4, atol=1e-4)


def test_mlp_bench_reports_peak_memory():
    """Issue 14 item 4 for the JAX-native bench too: each compiled block's peak
    bytes per device (XLA's memory analysis), forward and forward+backward, at
    least what a device holds of x, w1, w2 and the output; the ring block holds
    no gathered copy of w1 or w2, so its forward peak is no more than XLA's."""
    mesh = mlp.make_mesh((2, 4))
    blocks = mlp.build(mesh)
    host = mlp.operands(64, 16, 32)
    args = [jax.device_put(a, s) for a, s in zip(host, blocks["shardings"])]
    peaks = mlp.peaks(blocks, args)
    assert set(peaks) == {(i, p) for i in ("dmatmul", "xla") for p in ("fwd", "fwd+bwd")}
    held = 4 * (64 * 16 // 8 + 16 * 32 // 4 + 32 * 16 // 4 + 64 * 16 // 8)  # x, w1, w2, out blocks (float32)
    for key, peak in peaks.items():
        assert held <= peak < 100 * held, (key, peak)
    assert peaks[("dmatmul", "fwd")] <= peaks[("xla", "fwd")], peaks
