"""``precision=`` on the nvmath backend: the compute type (contract section 3).

The expected table is written out here by hand from the contract ("high"
allows TF32 for float32, "highest" forbids it, None/"default" = nvmath's own
default) and checked against nvmath-python 1.0's rules, copied below from
``nvmath/distributed/linalg/advanced/matmulmod.py`` (``is_supported``) and
``nvmath/bindings/cublas.pyi`` (``ComputeType``): every name returned must be
a compute type nvmath 1.0 accepts for that dtype.
"""

from __future__ import annotations

import enum

import numpy as np
import pytest

from dmatmul.backends.nvmath import _precision as P

#: nvmath-python 1.0: members of nvmath.bindings.cublas.ComputeType
NVMATH_COMPUTE_TYPES = {
    "COMPUTE_16F", "COMPUTE_16F_PEDANTIC", "COMPUTE_32F", "COMPUTE_32F_EMULATED_16BFX9", "COMPUTE_32F_FAST_16BF",
    "COMPUTE_32F_FAST_16F", "COMPUTE_32F_FAST_TF32", "COMPUTE_32F_PEDANTIC", "COMPUTE_32I", "COMPUTE_32I_PEDANTIC",
    "COMPUTE_64F", "COMPUTE_64F_EMULATED_FIXEDPOINT", "COMPUTE_64F_PEDANTIC",
}
#: nvmath-python 1.0's is_supported(): the compute types it accepts per operand dtype (A = B)
NVMATH_SUPPORTED = {
    "float16": {"COMPUTE_16F", "COMPUTE_16F_PEDANTIC", "COMPUTE_32F", "COMPUTE_32F_PEDANTIC"},
    "bfloat16": {"COMPUTE_32F", "COMPUTE_32F_PEDANTIC"},
    "float32": {"COMPUTE_32F", "COMPUTE_32F_PEDANTIC", "COMPUTE_32F_FAST_16F", "COMPUTE_32F_FAST_16BF",
                "COMPUTE_32F_FAST_TF32", "COMPUTE_32F_EMULATED_16BFX9"},
    "complex64": {"COMPUTE_32F", "COMPUTE_32F_PEDANTIC", "COMPUTE_32F_FAST_16F", "COMPUTE_32F_FAST_16BF",
                  "COMPUTE_32F_FAST_TF32", "COMPUTE_32F_EMULATED_16BFX9"},
    "float64": {"COMPUTE_64F", "COMPUTE_64F_PEDANTIC", "COMPUTE_64F_EMULATED_FIXEDPOINT"},
    "complex128": {"COMPUTE_64F", "COMPUTE_64F_PEDANTIC", "COMPUTE_64F_EMULATED_FIXEDPOINT"},
}
#: nvmath 1.0's default (NAMES_TO_DEFAULT_COMPUTE_TYPE): what None means
NVMATH_DEFAULT = {"float16": "COMPUTE_32F", "bfloat16": "COMPUTE_32F", "float32": "COMPUTE_32F",
                  "complex64": "COMPUTE_32F", "float64": "COMPUTE_64F", "complex128": "COMPUTE_64F"}

EXPECTED = {  # dtype: (None, "default", "high", "highest")
    "float16": (None, None, "COMPUTE_32F", "COMPUTE_32F"),
    "bfloat16": (None, None, "COMPUTE_32F", "COMPUTE_32F"),
    "float32": (None, None, "COMPUTE_32F_FAST_TF32", "COMPUTE_32F"),
    "complex64": (None, None, "COMPUTE_32F_FAST_TF32", "COMPUTE_32F"),
    "float64": (None, None, "COMPUTE_64F", "COMPUTE_64F"),
    "complex128": (None, None, "COMPUTE_64F", "COMPUTE_64F"),
}
LEVELS = (None, "default", "high", "highest")


@pytest.mark.parametrize("dtype", sorted(EXPECTED))
def test_compute_type_table(dtype):
    got = tuple(P.compute_type(dtype, level) for level in LEVELS)
    assert got == EXPECTED[dtype]
    for name in got:
        effective = NVMATH_DEFAULT[dtype] if name is None else name
        assert effective in NVMATH_COMPUTE_TYPES and effective in NVMATH_SUPPORTED[dtype], (dtype, name)


def test_tf32_only_for_high_on_float32_parts():
    for dtype in EXPECTED:
        for level in LEVELS:
            name = P.compute_type(dtype, level)
            tf32 = name is not None and "TF32" in name
            assert tf32 == (level == "high" and dtype in ("float32", "complex64")), (dtype, level, name)
            assert name is None or not name.endswith(("_16F", "_16BF")) or dtype == "float16"


def test_highest_is_never_below_nvmath_default():
    for dtype in EXPECTED:
        assert P.compute_type(dtype, "highest") == NVMATH_DEFAULT[dtype]


def test_dtype_spellings():
    assert P.compute_type(np.float32, "high") == "COMPUTE_32F_FAST_TF32"
    assert P.compute_type(np.dtype("complex128"), "highest") == "COMPUTE_64F"
    assert P.compute_type("float16", "highest") == "COMPUTE_32F"
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert P.compute_type(np.dtype(ml_dtypes.bfloat16), "high") == "COMPUTE_32F"


def test_precision_spellings():
    class Precision(enum.Enum):  # as jax.lax.Precision: members named DEFAULT, HIGH, HIGHEST
        DEFAULT = 0
        HIGH = 1
        HIGHEST = 2

    assert P.compute_type("float32", P.normalize_precision(Precision.HIGH)) == "COMPUTE_32F_FAST_TF32"
    assert P.compute_type("float32", P.normalize_precision(Precision.DEFAULT)) is None
    assert P.compute_type("float32", "highest") == "COMPUTE_32F"
    for alias, level in (("tensorfloat32", "high"), ("float32", "highest"), ("bfloat16", "default"),
                         ("fastest", "default"), ("bfloat16_3x", "high")):
        assert P.normalize_precision(alias) == level


def test_jax_precision_enum():
    lax = pytest.importorskip("jax.lax")
    assert [P.normalize_precision(p) for p in (lax.Precision.DEFAULT, lax.Precision.HIGH, lax.Precision.HIGHEST)] \
        == ["default", "high", "highest"]


@pytest.mark.parametrize("bad", ["medium", "", 3, ("high", "high"), "HIGHEST", " high"])
def test_bad_precision_names_the_keyword_and_the_choices(bad):
    with pytest.raises(ValueError, match=r"precision must be one of None, 'default', 'high', 'highest' .*got"):
        P.normalize_precision(bad)


@pytest.mark.parametrize("bad", ["int32", np.int8, "uint8"])
def test_unsupported_dtype(bad):
    with pytest.raises(ValueError, match="no nvmath compute type"):
        P.compute_type(bad, "high")


def test_fp8_accumulates_in_float32_at_every_precision():
    assert {P.compute_type("float8_e4m3fn", p) for p in ("high", "highest")} == {"COMPUTE_32F"}


def test_doctests():
    import doctest

    result = doctest.testmod(P, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("precision, want", [(None, None), ("default", None), ("high", "COMPUTE_32F_FAST_TF32"),
                                             ("highest", "COMPUTE_32F")])
def test_precision_reaches_the_translation_options(precision, want):
    """dm.matmul(precision=...) -> Spec -> Problem -> Translation.options -> MatmulOptions(compute_type=...)."""
    import dmatmul as dm
    from dmatmul._matmul import Operands, _validate
    from dmatmul.backends.nvmath._translate import Problem, translate

    ops = Operands(np.ones((8, 4), np.float32), np.ones((4, 6), np.float32))
    spec, _ = _validate(ops, distribution=dm.Slab.X, alpha=1.0, beta=0.0, transpose_a=False, transpose_b=False,
                     epilog=None, backend="nvmath", algorithm="auto", precision=precision, devices=None)
    tr = translate(Problem.from_spec(spec, 2, ("C", "C", None)))
    assert dict(tr.options).get("compute_type") == want
    assert dict(tr.options)["inplace"] is False
