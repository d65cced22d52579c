"""Bad input: typed errors that name the operand, what was expected and what was given."""

from __future__ import annotations

import decimal

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
    (dict(a=ones(4), b=ones(3, 5)), ValueError, ["a must be a 2-D matrix or a batch of matrices", "(4,)"]),
    (dict(a=ones(4, 3), b=ones(3)), ValueError, ["b must be a 2-D", "(3,)"]),
    (dict(a="matrix", b=ones(3, 5)), TypeError, ["a must be", "str"]),
    (dict(a=ones(4, 3), b=ones(3, 5), c=ones(5, 4), beta=1.0), ValueError, ["c must have", "(4, 5)", "(5, 4)"]),
    (
        dict(a=ones(4, 3), b=ones(3, 5), c=ones(4, 5, dtype=np.float64), beta=1.0),
        TypeError,
        ["c must have the dtype", "float32", "float64"],
    ),
    (dict(a=ones(4, 3), b=ones(3, 5), epilog="bias"), ValueError, ["epilog='bias' needs bias", "length M"]),
    (dict(a=ones(4, 3), b=ones(3, 5), epilog="bias", bias=ones(5)), ValueError,
     ["bias", "length M=4", "(5,)", "shape (1, N)", "bias.reshape(1, -1)"]),
    (dict(a=ones(4, 3), b=ones(3, 5), epilog="relu_bias", bias=ones(6)), ValueError,
     ["bias", "(4,)", "(1, 5)", "(6,)"]),
    (dict(a=ones(4, 3), b=ones(3, 5), bias=ones(4)), ValueError, ["bias is given", "epilog=None"]),
    (dict(a=ones(4, 3), b=ones(3, 5), epilog="swish"), ValueError, ["epilog", "'relu'", "'swish'"]),
    (dict(a=ones(4, 3), b=ones(3, 5), alpha=decimal.Decimal("sNaN")), ValueError, ["alpha=Decimal('sNaN')"]),
    (
        dict(a=ones(4, 3, dtype=np.complex64), b=ones(3, 5, dtype=np.complex64), epilog="relu"),
        TypeError,
        ["relu", "complex"],
    ),
    (dict(a=ones(4, 3), b=ones(3, 5), backend="cuda"), ValueError, ["backend", "'jax'", "'nvmath'", "'cuda'"]),
    (dict(a=ones(4, 3), b=ones(3, 5), algorithm="cannon"), ValueError, ["algorithm", "'summa'", "'cannon'"]),
    (dict(a=ones(4, 3), b=ones(3, 5), alpha="2"), TypeError, ["alpha", "'2'"]),
    # an array scale: refused saying what to pass, and how to scale by an array (or a traced value) instead
    (dict(a=ones(4, 3), b=ones(3, 5), alpha=np.array(2.0)), TypeError,
     ["alpha must be a number", "array(2.)", "float(alpha)", "dm.matmul(alpha * a, b, ...)"]),
    (dict(a=ones(4, 3), b=ones(3, 5), c=ones(4, 5), beta=np.ones(1)), TypeError,
     ["beta must be a number", "float(beta)", "dm.matmul(a, b, beta * c, beta=1.0, ...)"]),
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
    (dict(a=ones(4, 3), b=ones(3, 5), precision="fast"), ValueError, ["precision", "'highest'", "'fast'"]),
    (
        dict(a=ones(4, 3), b=ones(3, 5), epilog="bias", bias=np.array([5j, 0, 0, 0], np.complex64)),
        TypeError,
        ["bias is complex", "complex64", "float32", "imaginary part"],
    ),
    (dict(a=ones(4, 3), b=ones(3, 5), alpha=10**400), ValueError, ["alpha=1000", "does not fit a double"]),
    (dict(a=ones(4, 3), b=ones(3, 5), epilog="bias", bias=ones(1, 4)), ValueError, ["bias", "(M,) or (M, 1)", "(1, 4)"]),
    (dict(a=ones(4, 3), b=ones(3, 5), epilog="bias", bias=np.ones(4, np.longdouble)), TypeError,
     ["bias must have one of the dtypes", "float128"]),
    (dict(a=[[1.0, 2.0], [3.0]], b=ones(2, 5)), ValueError, ["a cannot be read as an array (list)"]),
    (dict(a=ones(4, 3), b=ones(3, 5), epilog="bias", bias=[[1.0], [2.0, 3.0]]), ValueError,
     ["bias cannot be read as an array (list)"]),
    # masked arrays: refused alike on one device and several (one path read the mask's data silently)
    (dict(a=np.ma.masked_array(ones(4, 3), mask=True), b=ones(3, 5), distribution=dm.Slab.X),
     TypeError, ["a is a numpy masked array", "a.filled("]),
    (dict(a=ones(4, 3), b=np.ma.masked_array(ones(3, 5)), devices=1), TypeError, ["b is a numpy masked array"]),
    (dict(a=ones(4, 3), b=ones(3, 5), c=np.ma.masked_array(ones(4, 5)), beta=1.0), TypeError,
     ["c is a numpy masked array"]),
    (dict(a=ones(4, 3), b=ones(3, 5), epilog="bias", bias=np.ma.masked_array(ones(4))), TypeError,
     ["bias is a numpy masked array"]),
    # a numpy array for a name: refused by name (its == is elementwise: numpy's "truth value of an array is
    # ambiguous" came out, naming nothing; found by tests/test_bad_inputs.py)
    (dict(a=ones(4, 3), b=ones(3, 5), epilog=np.array(["relu", "bias"])), ValueError, ["epilog", "array(['relu'"]),
    (dict(a=ones(4, 3), b=ones(3, 5), backend=np.array(["jax", "auto"])), ValueError, ["backend", "array(['jax'"]),
    (dict(a=ones(4, 3), b=ones(3, 5), algorithm=np.array(["local", "summa"])), ValueError,
     ["algorithm", "array(['local'"]),
    (dict(a=ones(4, 3), b=ones(3, 5), precision=np.array(["high", "default"])), ValueError,
     ["precision", "array(['high'"]),
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


def test_a_grid_layout_that_is_an_array_is_refused_by_name():
    """Found by tests/test_bad_inputs.py: numpy's "truth value ... is ambiguous", naming nothing."""
    with pytest.raises(ValueError, match=r"ProcessGrid layout must be 'row' .* got array\(\['row', 'col'\]"):
        dm.ProcessGrid((2, 2), layout=np.array(["row", "col"]))


def test_more_devices_than_exist():
    pytest.importorskip("jax")
    with pytest.raises(ValueError, match=r"devices=64 .* only 8 JAX device"):
        dm.matmul(ones(4, 3), ones(3, 5), distribution=dm.Slab.X, devices=64, backend="jax")


def test_grid_size_differs_from_device_count():
    pytest.importorskip("jax")
    d = dm.BlockCyclic(dm.ProcessGrid((2, 2)), (2, 2))
    with pytest.raises(dm.DistributionError, match=r"distribution of a.*4 ranks.*8 devices") as info:
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


@pytest.mark.parametrize("family", ["numpy", "jax"])
@pytest.mark.parametrize("m, n, k", [(4, 5, 0), (0, 5, 3), (4, 0, 3), (0, 0, 0)])
def test_degenerate_sizes_follow_blas(m, n, k, family):
    """K = 0 gives epilog(beta*C + bias) (zeros without C); M or N = 0 an empty result."""
    rng = np.random.default_rng(0)
    a, b, c = ones(m, k), ones(k, n), rng.standard_normal((m, n)).astype(f32)
    bias = rng.standard_normal(m).astype(f32)
    if family == "jax":
        jnp = pytest.importorskip("jax.numpy")
        a, b, c = jnp.asarray(a), jnp.asarray(b), jnp.asarray(c)
    zeros = dm.matmul(a, b, distribution=dm.Slab.X)
    assert zeros.shape == (m, n) and np.all(np.asarray(zeros) == 0) and zeros.dtype == np.float32
    d = dm.matmul(a, b, c, beta=-2.0, epilog="relu_bias", bias=bias, distribution=dm.Slab.Y)
    want = np.maximum(-2.0 * np.asarray(c) + bias[:, None], 0)
    np.testing.assert_allclose(np.asarray(d), want, rtol=1e-6)
    assert type(d) is type(c)


def test_a_traced_scale_is_refused_saying_to_scale_the_operand():
    """alpha and beta are compiled into the plan: a traced one (a jax.jit or
    jax.grad argument) is refused naming the way that works, which does."""
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 5)).astype(np.float32)
    with pytest.raises(TypeError, match=r"^alpha must be a number, got .*Tracer.*: alpha is compiled into the plan"
                                        r".*dm\.matmul\(alpha \* a, b, \.\.\.\)"):  # (JAX appends its traceback note)
        jax.jit(lambda s: dm.matmul(a, b, alpha=s, distribution=dm.Slab.X, devices=2))(2.0)
    d = jax.jit(lambda s: dm.matmul(s * a, b, distribution=dm.Slab.X, devices=2))(2.0)
    np.testing.assert_allclose(np.asarray(d), 2 * (a @ b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float64", "complex128"])
@pytest.mark.parametrize("m, n, k", [(4, 5, 0), (0, 5, 3), (4, 0, 3), (4, 5, 3)])
def test_64_bit_products_stay_64_bit_inside_jit(m, n, k, dtype):
    """numpy operands inside the user's jax.jit (x64 off, JAX's default): an
    empty product is as precise as one with elements (it came back 32-bit)."""
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(s).astype(dtype) for s in ((m, k), (k, n)))
    c = (rng.standard_normal((m, n)) * (1 + 1e-12)).astype(dtype)
    with dm.Matmul(a, b, c, beta=1.0, distribution=dm.Slab.X, devices=4) as mm:
        for d in (mm.execute(), jax.jit(mm.execute)(), jax.jit(lambda: dm.matmul(a, b, c, beta=1.0, devices=4))()):
            assert d.dtype == np.dtype(dtype) and d.shape == (m, n)
            np.testing.assert_allclose(np.asarray(d), a @ b + c, rtol=1e-13, atol=1e-13)


def test_numpy_results_are_writable_arrays_the_caller_owns():
    pytest.importorskip("jax")
    for dist in (dm.Slab.X, dm.BlockCyclic(dm.ProcessGrid((2, 4)), (2, 2)), dm.Replicated()):
        d = dm.matmul(ones(8, 3), ones(3, 8), distribution=dist)
        assert d.flags.writeable
        d[0, 0] = 7  # no error


def test_big_endian_operands_are_accepted_and_left_as_they_are():
    pytest.importorskip("jax")
    a = np.arange(12, dtype=">f4").reshape(3, 4)
    b = np.arange(8, dtype=">f4").reshape(4, 2)
    d = dm.matmul(a, b, distribution=dm.Slab.X, devices=2)
    np.testing.assert_allclose(d, a.astype(np.float32) @ b.astype(np.float32))
    assert a.dtype == np.dtype(">f4") and a[2, 3] == 11
    with dm.Matmul(a.astype(np.float32), b, distribution=dm.Slab.X, devices=2) as mm:  # and in reset_operands
        mm.reset_operands(a=a[::-1].copy())
        np.testing.assert_allclose(mm.execute(), a[::-1].astype(np.float32) @ b.astype(np.float32))


def test_devices_may_be_a_numpy_integer():
    pytest.importorskip("jax")
    a, b = ones(4, 3), ones(3, 5)
    np.testing.assert_allclose(dm.matmul(a, b, distribution=dm.Slab.X, devices=np.int64(2)), a @ b)
    np.testing.assert_array_equal(dm.redistribute(a, dm.Slab.X, dm.Slab.Y, devices=np.int32(2)), a)


def test_join_of_replicated_blocks_checks_they_agree():
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(dm.join([x, x.copy(), x.copy()], dm.Replicated(), (2, 3)), x)
    with pytest.raises(ValueError, match="rank 2's differs from rank 0's"):
        dm.join([x, x, x + 1], dm.Replicated(), (2, 3))


@pytest.mark.parametrize("precision", [None, "default", "high", "highest"])
def test_precision_is_accepted(precision):
    pytest.importorskip("jax")
    a, b = np.random.default_rng(1).standard_normal((2, 9, 6)).astype(f32)
    d = dm.matmul(a, b.T, distribution=dm.Slab.X, precision=precision)
    np.testing.assert_allclose(d, a @ b.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spelling, level", [
    ("tensorfloat32", "high"), ("float32", "highest"), ("bfloat16", "default"), ("fastest", "default"),
    ("bfloat16_3x", "high"), ("lax.Precision.HIGH", "high"), ("lax.Precision.HIGHEST", "highest"),
])
def test_precision_as_jax_spells_it(spelling, level):
    """JAX's other names for a precision, and jax.lax.Precision itself, are read
    as the level they stand for, as jnp.dot reads them: one spelling then
    reaches the backend (and the other ranks), and explain() names it."""
    lax = pytest.importorskip("jax.lax")
    precision = getattr(lax.Precision, spelling.rsplit(".", 1)[1]) if spelling.startswith("lax.") else spelling
    a, b = np.random.default_rng(1).standard_normal((2, 9, 6)).astype(f32)
    with dm.Matmul(a, b.T, distribution=dm.Slab.X, precision=precision) as mm:
        np.testing.assert_allclose(mm.execute(), a @ b.T, rtol=1e-5, atol=1e-5)
        assert f"precision={level!r}" in mm.explain().splitlines()[0], mm.explain()


@pytest.mark.parametrize("bad", ["HIGHEST", " high", ("high", "high"), 2])
def test_precision_jnp_dot_refuses_is_refused(bad):
    with pytest.raises(ValueError, match=r"precision must be one of None, 'default', 'high', 'highest' .*got"):
        dm.matmul(np.ones((2, 3)), np.ones((3, 2)), precision=bad)


def test_an_empty_product_still_checks_the_grid_against_the_devices():
    """Found by the differential matrix: K = 0 skipped the grid check (no error for a 2x2 grid on 1 device)."""
    pytest.importorskip("jax")
    grid = dm.BlockCyclic(dm.ProcessGrid((2, 2)), (2, 2))
    with pytest.raises(dm.DistributionError, match=r"distribution of a: .*4 ranks.*1 device in use"):
        dm.matmul(ones(4, 0), ones(0, 3), distribution=grid, devices=1)
    assert dm.matmul(ones(4, 0), ones(0, 3), distribution=grid, devices=4).shape == (4, 3)


def test_a_deleted_jax_array_is_refused_before_any_work():
    """Its first read would fail on one rank only, inside a collective: it is
    refused where operands are checked (matmul, reset_operands, redistribute)."""
    jnp = pytest.importorskip("jax.numpy")
    a, b = jnp.ones((4, 3)), jnp.ones((3, 5))
    with dm.Matmul(a, b, distribution=dm.Slab.X, devices=2) as mm:
        mm.execute()
        dead = jnp.ones((4, 3))
        dead.delete()
        for call in (lambda: dm.matmul(dead, b), lambda: mm.reset_operands(a=dead),
                     lambda: dm.redistribute(dead, dm.Slab.X, dm.Slab.Y, devices=2)):
            with pytest.raises(ValueError, match="is a deleted jax.Array"):
                call()
        assert np.array_equal(np.asarray(mm.execute()), np.full((4, 5), 3.0))  # the plan is untouched
        a.delete()  # after the plan took it
        with pytest.raises(ValueError, match="a is a deleted jax.Array"):
            mm.execute()
