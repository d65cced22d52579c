"""FP8 operands (contract 3b): the keywords' rules, the JAX backend's product
(scales applied once, FP8 bytes on the ring, result_type out), against numpy
in float64 on the dequantized operands."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import dmatmul as dm
from dmatmul import _plan
from dmatmul._problem import Options, Spec

E4M3, E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)
RNG = np.random.default_rng(38)


def fp8(shape: tuple[int, ...], dtype: np.dtype = E4M3) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def reference(a: np.ndarray, b: np.ndarray, sa: float, sb: float, *, ta: bool = False, tb: bool = False) -> np.ndarray:
    a64, b64 = (sa * a.astype(np.float64)), (sb * b.astype(np.float64))
    return (a64.T if ta else a64) @ (b64.T if tb else b64)


def close(d: np.ndarray, want: np.ndarray, dtype: str) -> None:
    eps = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24}[dtype]
    scale = np.abs(want).max() + 1e-30
    np.testing.assert_allclose(np.asarray(d, np.float64), want, rtol=0, atol=4 * eps * scale + 1e-6 * scale)


# -- the keywords ---------------------------------------------------------------------------------------------
def test_options_hold_scales_and_result_type_in_one_spelling() -> None:
    o = Options(quantization_scales={"a": np.float32(0.5), "b": np.array([3.0])}, result_type=np.float16)
    assert o.quantization_scales == (0.5, 3.0) and o.result_type == "float16"
    assert Options(quantization_scales={"b": 2}).quantization_scales == (1.0, 2.0)
    pairs = dict(o.agreed())  # ranks compare each scale and the result type
    assert pairs["the quantization scale of a"] == 0.5 and pairs["the quantization scale of b"] == 3.0
    assert pairs["result_type"] == "float16"
    assert hash(o) == hash(Options(quantization_scales={"a": 0.5, "b": 3.0}, result_type="float16"))


@pytest.mark.parametrize("scales, error, words", [
    ([0.5, 2.0], TypeError, "dict"),
    ({"a": "x"}, TypeError, "quantization_scales['a'] must be a real number"),
    ({"b": 1 + 2j}, TypeError, "quantization_scales['b']"),
    ({"a": float("inf")}, ValueError, "finite"),
    ({"b": 1e39}, ValueError, "quantization_scales['b'] must be finite as a float32"),
    ({"a": np.ones(4)}, ValueError, "block scales (MXFP8) are a uint8 array"),
    ({"d": 1.0}, ValueError, "takes no scale"),
])
def test_bad_scales_name_the_operand(scales: object, error: type, words: str) -> None:
    with pytest.raises(error, match=re.escape(words)):
        Options(quantization_scales=scales)


def test_result_type_is_one_of_three() -> None:
    with pytest.raises(ValueError, match="result_type must be None or one of"):
        Options(result_type="float8_e4m3fn")


def test_fp8_keywords_on_other_dtypes_are_refused() -> None:
    a, b = np.ones((4, 4), np.float32), np.ones((4, 4), np.float32)
    with pytest.raises(ValueError, match="quantization_scales are for FP8 operands.*float32.*alpha="):
        dm.matmul(a, b, quantization_scales={"a": 2.0}, backend="jax")
    with pytest.raises(ValueError, match="result_type='float16' is for FP8 operands"):
        dm.matmul(a, b, result_type="float16", backend="jax")


def test_c_has_the_result_type_and_bias_is_no_fp8() -> None:
    a, b = fp8((16, 16)), fp8((16, 16))
    with pytest.raises(TypeError, match=r"c must have the result's dtype, result_type='bfloat16'.*got float32"):
        dm.matmul(a, b, np.ones((16, 16), np.float32), beta=1.0, backend="jax")
    with pytest.raises(TypeError, match="bias must have one of the dtypes"):
        dm.matmul(a, b, epilog="bias", bias=np.ones(16, E4M3), backend="jax")
    with pytest.raises(TypeError, match="a and b must have the same dtype"):
        dm.matmul(a, fp8((16, 16), E5M2), backend="jax")


def test_spec_folds_the_scales_into_alpha() -> None:
    spec = Spec.of((16, 16), (16, 16), "float8_e5m2", alpha=3.0, quantization_scales={"a": 0.5, "b": 0.25})
    assert spec.scaled_alpha == 3.0 * 0.5 * 0.25 and spec.result_dtype == "bfloat16" and spec.fp8
    assert not Spec.of((16, 16), (16, 16), "float8_e5m2", quantization_scales={"a": 0.0}).reads_ab


# -- the JAX backend ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["local", "allgather", "reduce_scatter", "allreduce", "summa"])
def test_jax_every_algorithm(algorithm: str) -> None:
    ta, tb = algorithm in ("summa", "allreduce"), algorithm == "reduce_scatter"
    a, b = fp8((24, 32) if ta else (32, 24)), fp8((16, 24) if tb else (24, 16), E5M2 if algorithm == "summa" else E4M3)
    if algorithm == "summa":
        a = a.astype(E5M2)
    sa, sb = 0.5, 3.0
    for result_type in ("float32", "bfloat16"):
        d = dm.matmul(a, b, backend="jax", devices=4, algorithm=algorithm, transpose_a=ta, transpose_b=tb,
                      quantization_scales={"a": sa, "b": sb}, result_type=result_type)
        assert d.dtype == np.dtype(result_type if result_type == "float32" else ml_dtypes.bfloat16)
        close(d, reference(a, b, sa, sb, ta=ta, tb=tb), result_type)


def test_jax_c_epilog_bias_and_alpha() -> None:
    a, b = fp8((32, 16)), fp8((16, 24))
    c = RNG.standard_normal((32, 24)).astype(np.float16)
    bias = RNG.standard_normal(32).astype(np.float32)
    with dm.Matmul(a, b, c, alpha=2.0, beta=0.5, epilog="relu_bias", bias=bias, backend="jax", devices=4,
                   quantization_scales={"a": 0.25, "b": 4.0}, result_type="float16") as mm:
        d = mm.execute()
        assert "applied once as alpha*sa*sb = 2.0" in mm.explain()
    want = np.maximum(2.0 * reference(a, b, 0.25, 4.0) + 0.5 * c.astype(np.float64) + bias[:, None], 0)
    assert d.dtype == np.float16
    close(d, want, "float16")


def test_jax_ring_moves_fp8_bytes() -> None:
    jax = pytest.importorskip("jax")
    a, b = jax.numpy.asarray(fp8((32, 16))), jax.numpy.asarray(fp8((16, 16)))
    with _plan.schedule("ring"):
        text = jax.jit(lambda a, b: dm.matmul(a, b, devices=4, algorithm="allgather",
                                              quantization_scales={"a": 2.0})).lower(a, b).as_text()
    moved = [line for line in text.splitlines() if "collective_permute" in line]
    assert moved and all("f8E4M3FN" in line for line in moved), moved
    # the scale is applied once, to the float32 accumulator: one multiply by alpha*sa*sb, no FP8 multiply
    assert not re.search(r"stablehlo.multiply.*f8E4M3FN", text)


def test_jax_gradients_as_jax_gives_them() -> None:
    jax = pytest.importorskip("jax")
    a, b = jax.numpy.asarray(fp8((16, 16))), jax.numpy.asarray(fp8((16, 8)))
    f = lambda a, b: dm.matmul(a, b, devices=4, algorithm="allgather", quantization_scales={"a": 0.5, "b": 2.0},  # noqa: E731
                               result_type="float32").sum()
    ga, gb = jax.grad(f, argnums=(0, 1))(a, b)
    want_a = np.ones((16, 8)) @ np.asarray(b, np.float64).T  # d/dA sum(1.0 * A @ B) with sa*sb = 1
    assert ga.dtype == a.dtype and gb.dtype == b.dtype
    np.testing.assert_allclose(np.asarray(ga, np.float64), want_a, rtol=2.0**-3)


# -- the differential matrix ----------------------------------------------------------------------------------
def test_matrix_draws_fp8_and_checks_it_against_the_dequantized_reference() -> None:
    pytest.importorskip("jax")
    from dmatmul.testing import cases, check

    drawn = [(i, c) for i, c in enumerate(cases(seed=0, n=120)) if c.dtype.startswith("float8")]
    assert {c.dtype for _, c in drawn} == {"float8_e4m3fn", "float8_e5m2"}
    assert any(c.scales is not None for _, c in drawn) and any(c.result_type == "float32" for _, c in drawn)
    assert "quantization_scales=" in next(c for _, c in drawn if c.scales is not None).describe("jax")
    report = check(seed=0, indices=[i for i, _ in drawn][:8], backend="jax")
    assert not report.failed, report.failed
    assert sum(o.status == "passed" for o in report.outcomes) >= 5


# -- the nvmath backend (the simulated nvmath 1.0: tests/gpu/_fake_nvmath.py) ---------------------------------
def test_nvmath_passes_scales_and_result_type_on_cublasmps_fp8_path(fake_nvmath) -> None:
    a, b = fp8((16, 48)), fp8((32, 48))  # transpose_b: nvmath's "TN" with C-order blocks
    c = RNG.standard_normal((16, 32)).astype(np.float32)
    with dm.Matmul(a, b, c, beta=0.5, transpose_b=True, backend="nvmath", quantization_scales={"a": 0.5, "b": 4.0},
                   result_type="float32") as mm:
        d = mm.execute()
        text = mm.explain()
    assert d.dtype == np.float32
    close(d, reference(a, b, 0.5, 4.0, tb=True) + 0.5 * c, "float32")
    assert "fp8: cuBLASMp's FP8 path (TN layout)" in text and "result_type float32" in text


@pytest.mark.parametrize("kw, words", [
    (dict(transpose_b=False), "input layout is TN only"),
    (dict(transpose_b=True, shape=(15, 48, 32)), "multiples of 16"),
    (dict(transpose_b=True, dtype=E5M2), "no float8_e5m2 x float8_e5m2"),
])
def test_nvmath_runs_what_cublasmps_fp8_path_refuses_in_float32(fake_nvmath, kw: dict, words: str) -> None:
    """A product cuBLASMp's FP8 path refuses runs as the float32 product it
    equals (FP8 values are float32s exactly): nvmath is given float32 blocks and
    alpha*sa*sb, the result is rounded to the result type once, and explain()
    says why. The simulated nvmath refuses FP8 as cuBLASMp does, so a product
    passed to it as FP8 would fail here."""
    m, k, n = kw.pop("shape", (16, 48, 32))
    dtype = kw.pop("dtype", E4M3)
    a, b = fp8((m, k), dtype), fp8((n, k) if kw["transpose_b"] else (k, n), dtype)
    c = np.random.default_rng(1).standard_normal((m, n)).astype(ml_dtypes.bfloat16)
    with dm.Matmul(a, b, c, beta=0.5, quantization_scales={"a": 0.5, "b": 4.0}, backend="nvmath", **kw) as mm:
        d = mm.execute()
        text = mm.explain()
    assert d.dtype == ml_dtypes.bfloat16 and d.shape == (m, n)
    want = reference(a, b, 0.5, 4.0, tb=kw["transpose_b"]) + 0.5 * c.astype(np.float64)
    close(d, want, "bfloat16")
    assert words in text and "upcasts a and b to float32" in text and "bfloat16 once" in text, text


# -- the cost model -------------------------------------------------------------------------------------------
def test_cost_model_counts_fp8_bytes_and_the_fp8_peak() -> None:
    from dmatmul import _machines

    fp8_spec = Spec.of((4096, 4096), (4096, 4096), "float8_e4m3fn")
    bf16_spec = Spec.of((4096, 4096), (4096, 4096), "bfloat16")
    assert fp8_spec.sizes(8).itemsize * 2 == bf16_spec.sizes(8).itemsize  # half of bf16's bytes on the wire
    h100 = _machines.PROFILES["h100-nvl8"]
    assert h100.peak_for("float8_e5m2") == h100.peak_for("float8_e4m3fn") == h100.peak["float8"] > h100.peak_for("bfloat16")
