"""Bad input: typed errors that name the operand, what was expected and what was given."""

from __future__ import annotations

import numpy as np
import pytest

import dmatmul as dm

f32 = np.float32


def ones(*shape, dtype=f32):
    return np.ones(shape, dtype)


CASES = [
    # (call kwargs, exception, words the message must contain)
    (dict(a=ones(4, 3), b=ones(4, 5)), ValueError, ["a and b", "inner dimensions", "(4, 3)", "(4, 5)"]),
    (
        dict(a=ones(4, 3), b=ones(5, 3), transpose_a=True, transpose_b=True),
        ValueError,
        ["op(a) is (3, 4)", "transpose_a=True", "op(b) is (3, 5)", "transpose_b=True"],
    ),
    (dict(a=ones(4, 3), b=ones(3, 5, dtype=np.float64)), TypeError, ["a and b", "float32", "float64"]),
    (dict(a=ones(4, 3, dtype=np.int32), b=ones(3, 5, dtype=np.int32)), TypeError, ["a has dtype int32", "float32"]),
    (dict(a=ones(4, 3, dtype=bool), b=ones(3, 5)), TypeError, ["a has dtype bool"]),
    (dict(a=ones(4, 3, 2), b=ones(3, 5)), ValueError, ["a must be a 2-D", "(4, 3, 2)"]),
    (dict(a=ones(4, 3), b=ones(3)), ValueError, ["b must be a 2-D", "(3,)"]),
    (dict(a="matrix", b=ones(3, 5)), TypeError, ["a must be", "str"]),
    (dict(a=ones(4, 3), b=ones(3, 5), c=ones(5, 4), beta=1.0), ValueError, ["c must have", "(4, 5)", "(5, 4)"]),
    (
        dict(a=ones(4, 3), b=ones(3, 5), c=ones(4, 5, dtype=np.float64), beta=1.0),
        TypeError,
        ["c must have the dtype", "float32", "float64"],
    ),
    (dict(a=ones(4, 3), b=ones(3, 5), epilog="bias"), ValueError, ["epilog='bias' needs bias", "length M"]),
    (dict(a=ones(4, 3), b=ones(3, 5), epilog="bias", bias=ones(5)), ValueError, ["bias", "length M=4", "(5,)"]),
    (dict(a=ones(4, 3), b=ones(3, 5), bias=ones(4)), ValueError, ["bias is given", "epilog=None"]),
    (dict(a=ones(4, 3), b=ones(3, 5), epilog="swish"), ValueError, ["epilog", "'relu'", "'swish'"]),
    (
        dict(a=ones(4, 3, dtype=np.complex64), b=ones(3, 5, dtype=np.complex64), epilog="relu"),
        TypeError,
        ["relu", "complex"],
    ),
    (dict(a=ones(4, 3), b=ones(3, 5), backend="cuda"), ValueError, ["backend", "'jax'", "'nvmath'", "'cuda'"]),
    (dict(a=ones(4, 3), b=ones(3, 5), algorithm="cannon"), ValueError, ["algorithm", "'summa'", "'cannon'"]),
    (dict(a=ones(4, 3), b=ones(3, 5), alpha="2"), TypeError, ["alpha", "'2'"]),
    (dict(a=ones(4, 3), b=ones(3, 5), beta=1j), TypeError, ["beta", "complex", "float32"]),
    (dict(a=ones(4, 3), b=ones(3, 5), transpose_a="yes"), TypeError, ["transpose_a", "bool"]),
    (
        dict(a=ones(4, 3), b=ones(3, 5), distribution=(dm.Slab.X, dm.Slab.Y)),
        ValueError,
        ["distribution", "triple", "length 2"],
    ),
    (
        dict(a=ones(4, 3), b=ones(3, 5), distribution=(dm.Slab.X, "Slab.Y", dm.Slab.X)),
        TypeError,
        ["distribution of b", "'Slab.Y'"],
    ),
    (dict(a=ones(4, 3), b=ones(3, 5), distribution="row"), TypeError, ["distribution", "str"]),
    (dict(a=ones(4, 3), b=ones(3, 5), devices=0), ValueError, ["devices", ">= 1", "0"]),
    (dict(a=ones(0, 3), b=ones(3, 5)), ValueError, ["positive", "M=0"]),
]


@pytest.mark.parametrize("kwargs, exc, words", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_bad_input(kwargs, exc, words):
    kwargs = dict(kwargs)
    a, b = kwargs.pop("a"), kwargs.pop("b")
    c = kwargs.pop("c", None)
    with pytest.raises(exc) as info:
        dm.matmul(a, b, c, **kwargs)
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"


def test_more_devices_than_exist():
    pytest.importorskip("jax")
    with pytest.raises(ValueError, match=r"devices=64 .* only 8 JAX device"):
        dm.matmul(ones(4, 3), ones(3, 5), distribution=dm.Slab.X, devices=64, backend="jax")


def test_grid_size_differs_from_device_count():
    pytest.importorskip("jax")
    d = dm.BlockCyclic(dm.ProcessGrid((2, 2)), (2, 2))
    with pytest.raises(dm.DistributionError, match=r"distribution of a.*4 ranks.*nranks=8") as info:
        dm.matmul(ones(8, 8), ones(8, 8), distribution=d, devices=8, backend="jax")
    assert "8 devices" in str(info.value)


def test_nvmath_backend_missing_says_which_extra():
    import importlib.util

    if importlib.util.find_spec("nvmath") is not None:
        pytest.skip("nvmath-python is installed here; the message is for machines without it")
    with pytest.raises(RuntimeError, match=r"backend='nvmath' is not available: .*pip install 'dmatmul\[nvmath\]'"):
        dm.matmul(ones(4, 3), ones(3, 5), backend="nvmath")


def test_errors_leave_inputs_untouched():
    a, b, c = ones(4, 3), ones(3, 5), ones(5, 4)
    with pytest.raises(ValueError):
        dm.matmul(a, b, c, beta=1.0)
    assert a.shape == (4, 3) and b.shape == (3, 5) and c.shape == (5, 4)
    assert np.all(a == 1) and np.all(b == 1) and np.all(c == 1)
