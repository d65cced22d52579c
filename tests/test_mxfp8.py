"""Block-scaled FP8 (MXFP8, contract 3b / issue 38 item 3): UE8M0 block scales
of one value per 32 elements along K, in the operands' logical layout, applied
by dequantizing at the front on every backend; checked against numpy in
float64 on the dequantized operands."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import dmatmul as dm
from dmatmul import _mxfp8

E4M3, E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)
RNG = np.random.default_rng(383)


def fp8(shape: tuple[int, ...], dtype: np.dtype = E4M3) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def scales_of(shape: tuple[int, ...], k_axis: int) -> np.ndarray:
    """Random UE8M0 scales (2**-6 .. 2**6) for a stored operand of ``shape`` whose K is axis ``k_axis``."""
    return RNG.integers(121, 134, _mxfp8.scale_shape(shape, k_axis)).astype(np.uint8)


def dequantized(x: np.ndarray, s: np.ndarray, k_axis: int) -> np.ndarray:
    """float64 ``x`` with element ``i`` along K scaled by ``2**(s[i // 32] - 127)`` (written per element,
    independently of the library's repeat-and-slice)."""
    x64 = np.moveaxis(x.astype(np.float64), k_axis, -1)
    s64 = np.moveaxis(s.astype(np.float64), k_axis, -1)
    k = np.arange(x64.shape[-1])
    return np.moveaxis(x64 * np.exp2(s64[..., k // 32] - 127), -1, k_axis)


def close(d: np.ndarray, want: np.ndarray, dtype: str) -> None:
    """Within the result type's rounding (the dequantized product is exact in float32 but for its sums)."""
    eps = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24}[dtype]
    scale = np.abs(want).max() + 1e-30
    np.testing.assert_allclose(np.asarray(d, np.float64), want, rtol=0, atol=(4 * eps + 1e-6) * scale)


def problem(m: int, k: int, n: int, ta: bool, tb: bool, dtype: np.dtype = E4M3) -> tuple[np.ndarray, ...]:
    a, b = fp8((k, m) if ta else (m, k), dtype), fp8((n, k) if tb else (k, n), dtype)
    ka, kb = (-2 if ta else -1), (-1 if tb else -2)
    sa, sb = scales_of(a.shape, ka), scales_of(b.shape, kb)
    da, db = dequantized(a, sa, ka), dequantized(b, sb, kb)
    return a, b, sa, sb, (da.T if ta else da) @ (db.T if tb else db)


# -- the JAX backend: emulated ---------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm, ta, tb", [("local", False, False), ("allgather", False, True),
                                               ("reduce_scatter", True, False), ("summa", True, True)])
def test_jax_runs_the_dequantized_product_on_uneven_splits(algorithm: Any, ta: bool, tb: bool) -> None:
    """K = 70 (three blocks, the last of 6), M = 13 and N = 11 split unevenly over 4 devices."""
    a, b, sa, sb, want = problem(13, 70, 11, ta, tb)
    for result_type in ("float32", "bfloat16"):
        d = dm.matmul(a, b, backend="jax", devices=4, algorithm=algorithm, transpose_a=ta, transpose_b=tb,
                      quantization_scales={"a": sa, "b": sb}, result_type=result_type)
        assert d.dtype == (np.float32 if result_type == "float32" else ml_dtypes.bfloat16)
        close(d, want, result_type)


def test_jax_c_bias_alpha_and_explain() -> None:
    a, b, sa, sb, want = problem(32, 64, 16, False, False, E5M2)
    c = RNG.standard_normal((32, 16)).astype(np.float16)
    bias = RNG.standard_normal(32).astype(np.float32)
    with dm.Matmul(a, b, c, alpha=2.0, beta=0.5, epilog="relu_bias", bias=bias, backend="jax", devices=2,
                   quantization_scales={"a": sa, "b": sb}, result_type="float16") as mm:
        d = mm.execute()
        text = mm.explain()
        with pytest.raises(ValueError, match="reset_operands: a's block scales .* make a new Matmul"):
            mm.reset_operands(a=a)
    assert d.dtype == np.float16
    close(d, np.maximum(2.0 * want + 0.5 * c.astype(np.float64) + bias[:, None], 0), "float16")
    assert "mxfp8:      float8_e5m2 a and b with UE8M0 block scales" in text and "rounded to float16 once" in text


def test_jax_arrays_under_jit() -> None:
    jax = pytest.importorskip("jax")
    a, b, sa, sb, want = problem(16, 40, 8, False, False)
    f = jax.jit(lambda a, b, sa, sb: dm.matmul(a, b, devices=4, quantization_scales={"a": sa, "b": sb},
                                               result_type="float32"))
    d = f(*map(jax.numpy.asarray, (a, b, sa, sb)))
    close(np.asarray(d), want, "float32")


def test_jit_of_operands_on_a_users_mesh_closed_over() -> None:
    """Inside jax.jit, FP8 operands and scales closed over (constants) on a
    user's mesh: dequantized at once, they keep their placement, and the result
    comes back on that mesh (JAX raised "Length of device assignment 1 is not
    equal to the size of the mesh", or the result landed on one device; found by
    the differential matrix)."""
    jax = pytest.importorskip("jax")
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((4,), ("x",))
    a, b, sa, sb, want = problem(16, 40, 8, False, False)
    x = jax.device_put(a, NamedSharding(mesh, P("x", None)))
    y = jax.device_put(b, NamedSharding(mesh, P(None, "x")))
    d = jax.jit(lambda: dm.matmul(x, y, quantization_scales={"a": sa, "b": sb}, result_type="float32"))()
    close(np.asarray(d), want, "float32")
    assert d.sharding.mesh.shape == mesh.shape and set(d.sharding.device_set) == set(mesh.devices.flat)


def test_scale_255_is_nan_and_127_is_one() -> None:
    a, b = fp8((4, 64)), fp8((64, 4))
    sa, sb = np.full((4, 2), 127, np.uint8), np.full((2, 4), 127, np.uint8)
    sa[1, 1] = 255
    d = dm.matmul(a, b, backend="jax", devices=1, quantization_scales={"a": sa, "b": sb}, result_type="float32")
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.isnan(d[1]).all() and not np.isnan(d[[0, 2, 3]]).any()
    close(d[[0, 2, 3]], want[[0, 2, 3]], "float32")


# -- bad inputs: typed, naming the operand, expected and given -------------------------------------------------
@pytest.mark.parametrize("make, error, words", [
    (lambda sa, sb: {"a": sa[:, :1], "b": sb}, ValueError,
     "quantization_scales['a'] must have shape (16, 2), one scale per 32 elements of K along each of a's rows "
     "(a stored (16, 40), transpose_a=False), got (16, 1)"),
    (lambda sa, sb: {"a": sa, "b": sb.T.copy()}, ValueError,
     "quantization_scales['b'] must have shape (2, 8), one scale per 32 elements of K along each of b's columns"),
    (lambda sa, sb: {"a": sa, "b": sb.astype(np.float32)}, TypeError,
     "quantization_scales['b'] must be a uint8 array of UE8M0 block scales"),
    (lambda sa, sb: {"a": sa, "b": 2.0}, ValueError,
     "quantization_scales['b']: block scaling (MXFP8) takes block scales for both a and b, got 2.0"),
    (lambda sa, sb: {"a": sa}, ValueError, "got nothing for b"),
    (lambda sa, sb: {"a": sa, "b": sb, "c": sa}, ValueError, "no scale of c"),
    (lambda sa, sb: {"a": sa.ravel(), "b": sb}, ValueError, "quantization_scales['a'] must have shape (16, 2)"),
])
def test_bad_block_scales_name_the_operand(make: Callable[..., dict[str, Any]], error: type, words: str) -> None:
    a, b, sa, sb, _ = problem(16, 40, 8, False, False)
    with pytest.raises(error, match=re.escape(words)):
        dm.matmul(a, b, backend="jax", devices=1, quantization_scales=make(sa, sb))


@pytest.mark.parametrize("options, words", [
    (dict(epilog="bias", bias=np.ones(16, np.complex64)), r"bias is complex \(complex64\) but a and b are real "
                                                          r"\(float8_e5m2\)"),
    (dict(alpha=0.5j), r"alpha=0\.5j is complex but the operands are float8_e5m2"),
])
def test_complex_bias_or_scalar_on_block_scaled_operands_names_their_dtype(options: dict[str, Any],
                                                                         words: str) -> None:
    """The message names the dtype the caller passed (FP8), not the float32 the emulation dequantizes to
    (found by the differential matrix)."""
    a, b, sa, sb, _ = problem(16, 40, 8, False, False, E5M2)
    with pytest.raises(TypeError, match=words):
        dm.matmul(a, b, backend="jax", devices=1, quantization_scales={"a": sa, "b": sb}, **options)


def test_block_scales_need_fp8_operands() -> None:
    a, b = np.ones((4, 32), np.float32), np.ones((32, 4), np.float32)
    s = np.full((4, 1), 127, np.uint8)
    with pytest.raises(ValueError, match=r"block quantization_scales \(MXFP8\) are for FP8 operands.*float32"):
        dm.matmul(a, b, backend="jax", quantization_scales={"a": s, "b": s.T.copy()})


# -- the nvmath backend (the simulated nvmath 1.0 on an H200: tests/gpu/_fake_nvmath.py) ------------------------
@pytest.mark.parametrize("ta, tb", [(False, True), (True, False)])
def test_nvmath_runs_the_dequantized_product_in_float32(fake_nvmath, ta: bool, tb: bool) -> None:
    """nvmath is handed float32 a and b, c and the bias as float32, no block_scaling (the simulated
    nvmath refuses MXFP8 below compute capability 10.0, as nvmath 1.0 does); the result is rounded to
    the result type once."""
    a, b, sa, sb, want = problem(32, 96, 16, ta, tb)
    c = RNG.standard_normal((32, 16)).astype(ml_dtypes.bfloat16)
    with dm.Matmul(a, b, c, beta=0.5, transpose_a=ta, transpose_b=tb, backend="nvmath",
                   quantization_scales={"a": sa, "b": sb}) as mm:
        d = mm.execute()
        text = mm.explain()
    assert d.dtype == ml_dtypes.bfloat16
    close(d, want + 0.5 * c.astype(np.float64), "bfloat16")
    assert "cuBLASMp's MXFP8 path (nvmath block_scaling=True: compute capability 10.0+" in text, text
    made = [kw for name, kw in fake_nvmath.CALLS if name == "Matmul"]
    assert made and all(kw["dtypes"] == ("float32",) * 3 for kw in made), made  # a, b and c


def test_the_simulated_nvmath_refuses_mxfp8_below_blackwell(fake_nvmath) -> None:
    """The rule the nvmath backend plans around: nvmath 1.0's distributed Matmul raises for
    block_scaling=True on a device of compute capability below 10.0 (an H100/H200 is 9.0)."""
    from nvmath.distributed.linalg.advanced import Matmul, MatmulOptions

    from dmatmul.backends.nvmath import _engine

    _engine.start(False)
    a, b = np.asfortranarray(fp8((128, 128))), np.asfortranarray(fp8((128, 128)))
    scales = {"a": np.full(a.size // 32, 127, np.uint8), "b": np.full(b.size // 32, 127, np.uint8)}
    q = np.zeros((3,), dtype=fake_nvmath.matrix_qualifiers_dtype)
    q[0]["is_transpose"] = True
    grid = fake_nvmath.ProcessGrid(shape=(1, 1))
    dists = [fake_nvmath.BlockCyclic(grid, (128, 128))] * 3
    with pytest.raises(RuntimeError, match=r"MXFP8 requires a device with compute capability 10.0"):
        Matmul(a, b, distributions=dists, qualifiers=q, quantization_scales=scales,
               options=MatmulOptions(block_scaling=True, result_type="float32"))


# -- cuBLAS's tiled layout of block scales --------------------------------------------------------------------
def tiled_offset(r: int, c: int, blocks: int) -> int:
    """cuBLAS's "1D Block Scaling Factors Layout" for one scale, as its documentation writes it
    (https://docs.nvidia.com/cuda/cublas/index.html#d-block-scaling-factors-layout)."""
    return ((r // 128) * (blocks // 4) + c // 4) * 512 + (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4


@pytest.mark.parametrize("rows, blocks", [(128, 4), (256, 8), (384, 4), (128, 12)])
def test_tiled_scales_match_the_documented_offsets_and_round_trip(rows: int, blocks: int) -> None:
    s = RNG.integers(0, 255, (rows, blocks)).astype(np.uint8)
    t = _mxfp8.to_tiled(s)
    assert t.shape == (rows * blocks,) and t.dtype == np.uint8
    want = np.empty(rows * blocks, np.uint8)
    for r in range(rows):
        for c in range(blocks):
            want[tiled_offset(r, c, blocks)] = s[r, c]
    np.testing.assert_array_equal(t, want)
    np.testing.assert_array_equal(_mxfp8.from_tiled(t, rows, blocks), s)


def test_tiled_scales_need_whole_tiles() -> None:
    with pytest.raises(ValueError, match=r"multiples of \(128, 4\).*got \(96, 4\)"):
        _mxfp8.to_tiled(np.zeros((96, 4), np.uint8))
    with pytest.raises(ValueError, match=r"got \(128, 3\)"):
        _mxfp8.from_tiled(np.zeros(128 * 3, np.uint8), 128, 3)


# -- the nvmath backend on a Blackwell GPU (the simulated nvmath at compute capability 10.0) --------------------
@pytest.fixture
def blackwell(fake_nvmath, monkeypatch):
    monkeypatch.setattr(fake_nvmath, "COMPUTE_CAPABILITY", (10, 0))
    return fake_nvmath


@pytest.mark.parametrize("ta, tb, order", [(False, True, "C"), (True, False, "F")])
def test_nvmath_hands_fp8_and_tiled_scales_to_cublasmp_on_blackwell(blackwell, ta: bool, tb: bool,
                                                                    order: str) -> None:
    """Local M, N, K multiples of 128 in the TN layout (C-order a (M, K) and b (N, K), or Fortran-order a
    (K, M) and b (K, N)): nvmath gets FP8 a and b, block_scaling=True and each operand's scales in the tiled
    layout; the simulated nvmath reads them as cuBLAS does, so a wrong conversion is a wrong result. A
    second call on the cached plan with other scales uses those."""
    a, b, sa, sb, want = problem(256, 256, 128, ta, tb)
    a, b = (np.asfortranarray(x) if order == "F" else np.ascontiguousarray(x) for x in (a, b))
    c = RNG.standard_normal((256, 128)).astype(np.float32)
    with dm.Matmul(a, b, c, beta=0.5, transpose_a=ta, transpose_b=tb, backend="nvmath",
                   quantization_scales={"a": sa, "b": sb}, result_type="float32") as mm:
        d = mm.execute()
        text = mm.explain()
    close(d, want + 0.5 * c.astype(np.float64), "float32")
    made = [kw for name, kw in blackwell.CALLS if name == "Matmul"]
    assert len(made) == 1 and made[0]["block_scaling"], made
    assert made[0]["dtypes"] == ("float8_e4m3fn", "float8_e4m3fn", "float32"), made
    assert {k: v.shape for k, v in made[0]["scales"].items()} == {"a": (256 * 256 // 32,), "b": (128 * 256 // 32,)} \
        or {k: v.shape for k, v in made[0]["scales"].items()} == {"b": (256 * 256 // 32,), "a": (128 * 256 // 32,)}
    assert "mxfp8:      cuBLASMp's MXFP8 path: FP8 a and b with nvmath block_scaling=True" in text, text
    # the plan the cache keeps, with this call's scales
    sa2 = np.flip(sa, axis=0).copy()
    ka = -2 if ta else -1
    da2 = dequantized(a, sa2, ka)
    db = dequantized(b, sb, -1 if tb else -2)
    d2 = dm.matmul(a, b, transpose_a=ta, transpose_b=tb, backend="nvmath", quantization_scales={"a": sa2, "b": sb},
                   result_type="float32")
    close(d2, (da2.T if ta else da2) @ (db.T if tb else db), "float32")


@pytest.mark.parametrize("m, k, n, ta, tb, why", [
    (256, 96, 128, False, True, "local M, N and K must be multiples of 128"),
    (96, 256, 128, False, True, "local M, N and K must be multiples of 128"),
    (256, 256, 128, True, False, "its input layout is TN only"),
    (256, 256, 128, False, False, "its input layout is TN only"),
])
def test_nvmath_emulates_mxfp8_where_cublasmp_refuses(blackwell, m: int, k: int, n: int, ta: bool, tb: bool,
                                                      why: str) -> None:
    """Sizes that are no multiples of 128, or C-order blocks that give no TN frame: float32 operands."""
    a, b, sa, sb, want = problem(m, k, n, ta, tb)
    with dm.Matmul(a, b, transpose_a=ta, transpose_b=tb, backend="nvmath", quantization_scales={"a": sa, "b": sb},
                   result_type="bfloat16") as mm:
        d = mm.execute()
        text = mm.explain()
    close(d, want, "bfloat16")
    made = [kw for name, kw in blackwell.CALLS if name == "Matmul"]
    assert made and all(kw["dtypes"] == ("float32", "float32") and not kw["block_scaling"] for kw in made), made
    assert "mxfp8:      emulated: cuBLASMp's MXFP8 path" in text and why in text, text


def test_nvmath_emulates_mxfp8_below_compute_capability_10(fake_nvmath) -> None:
    a, b, sa, sb, want = problem(256, 256, 128, False, True)
    with dm.Matmul(a, b, transpose_b=True, backend="nvmath", quantization_scales={"a": sa, "b": sb},
                   result_type="float32") as mm:
        d = mm.execute()
        text = mm.explain()
    close(d, want, "float32")
    made = [kw for name, kw in fake_nvmath.CALLS if name == "Matmul"]
    assert made and all(kw["dtypes"] == ("float32", "float32") and not kw["block_scaling"] for kw in made), made
    assert "compute capability 9.0, below 10.0 (Blackwell)" in text, text
