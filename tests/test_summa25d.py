"""2.5-D SUMMA (``algorithm="summa25d"``): c layers of a q x q grid on P = q*q*c
devices, each layer's SUMMA on 1/c of K, then the layer reduce-scatter;
checked against numpy on 8 simulated CPU devices (2 x 2 x 2)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import dmatmul as dm  # noqa: E402
from dmatmul import _plan  # noqa: E402
from dmatmul.testing.reference import assert_close, random_matrix, reference, reference_vjp  # noqa: E402

X, Y, R = dm.Slab.X, dm.Slab.Y, dm.Replicated()
GRID = dm.ProcessGrid((2, 4))


def operands(seed, m, n, k, ta=False, tb=False, dtype="float32"):
    rng = np.random.default_rng(seed)
    return (random_matrix(rng, (k, m) if ta else (m, k), dtype), random_matrix(rng, (n, k) if tb else (k, n), dtype),
            random_matrix(rng, (m, n), dtype))


@pytest.mark.parametrize("schedule", ["ring", "one_shot"])
@pytest.mark.parametrize("m, n, k", [(64, 48, 40), (37, 23, 29), (13, 7, 5), (1, 1, 1), (5, 1, 3), (2, 17, 1)])
@pytest.mark.parametrize("ta, tb", list(itertools.product((False, True), repeat=2)))
def test_against_numpy_any_size_and_transposes(m, n, k, ta, tb, schedule):
    """Even, uneven, prime and size-1 products, every transpose, both schedules:
    numpy's answer, and the plan is the 2.5-D one on the (r, c, l) mesh."""
    a, b, _ = operands(m * 100 + n * 10 + k, m, n, k, ta, tb)
    with _plan.schedule(schedule), dm.Matmul(a, b, transpose_a=ta, transpose_b=tb, algorithm="summa25d",
                                             devices=8) as mm:
        got = mm.execute()
        assert mm.algorithm == "summa25d" and "mesh (r=2 x c=2 x l=2)" in mm.explain()
        assert mm._plan.cost.kernel.schedule == schedule
    assert_close(got, reference(a, b, transpose_a=ta, transpose_b=tb), "float32")


@pytest.mark.parametrize("dists", [
    (X, Y, X), (Y, X, Y), (R, R, X), (X, R, R),
    (dm.BlockNonCyclic(GRID),) * 3, (dm.BlockCyclic(dm.ProcessGrid((4, 2), layout="col"), (3, 2)),) * 3,
])
def test_any_distribution_is_re_laid_into_the_layers(dists):
    """Any input and result distribution: moved into the kernel's layouts and the
    result out of them (a 2-D grid's operands as Slab.X, on the layers' mesh)."""
    a, b, c = operands(3, 29, 31, 23)
    got = dm.matmul(a, b, c, beta=0.5, distribution=dists, algorithm="summa25d", devices=8)
    assert_close(got, reference(a, b, c, beta=0.5), "float32")


@pytest.mark.parametrize("epilog, bias_shape", [("relu", None), ("gelu_bias", (19,)), ("silu_bias", (1, 21))])
def test_c_beta_alpha_and_epilogues(epilog, bias_shape):
    a, b, c = operands(4, 19, 21, 17)
    bias = None if bias_shape is None else np.random.default_rng(5).standard_normal(bias_shape).astype(np.float32)
    got = dm.matmul(a, b, c, alpha=1.5, beta=-0.5, epilog=epilog, bias=bias, algorithm="summa25d", devices=8)
    assert_close(got, reference(a, b, c, alpha=1.5, beta=-0.5, epilog=epilog, bias=bias), "float32")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64", "complex64", "complex128"])
def test_dtypes(dtype):
    a, b, c = operands(6, 24, 20, 36, dtype=dtype)
    got = dm.matmul(a, b, c, beta=2.0, algorithm="summa25d", devices=8)
    assert got.dtype == a.dtype
    assert_close(got, reference(a, b, c, beta=2.0), dtype)


def test_empty_products_follow_blas():
    a, b, c = operands(7, 6, 5, 0)
    assert_close(dm.matmul(a, b, c, beta=3.0, algorithm="summa25d", devices=8), 3.0 * c.astype(np.float64),
                 "float32")
    assert dm.matmul(np.ones((0, 4), np.float32), np.ones((4, 3), np.float32), algorithm="summa25d",
                     devices=8).shape == (0, 3)


@pytest.mark.parametrize("schedule", ["ring", "one_shot"])
@pytest.mark.parametrize("ta, tb", [(False, False), (True, True)])
def test_gradients_against_numpy(schedule, ta, tb):
    """jax.grad through the 2.5-D kernel (its transpose: the reduce-scatter's
    all-gather, the layer's SUMMA transposed) and under jit; uneven sizes."""
    a, b, c = operands(8, 13, 11, 18, ta, tb)
    g = np.random.default_rng(9).standard_normal((13, 11)).astype(np.float32)

    def loss(x, y, z):
        d = dm.matmul(x, y, z, beta=0.5, epilog="gelu", transpose_a=ta, transpose_b=tb, algorithm="summa25d",
                      devices=8)
        return jnp.sum(d * g)

    want = reference_vjp(a, b, c, g, beta=0.5, epilog="gelu", transpose_a=ta, transpose_b=tb)
    with _plan.schedule(schedule):
        for f in (jax.grad(loss, argnums=(0, 1, 2)), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))):
            got = f(jnp.asarray(a), jnp.asarray(b), jnp.asarray(c))
            for name, x in zip("abc", got):
                assert_close(np.asarray(x), want[name], "float32")


def test_jax_arrays_in_and_out():
    """jax.Array operands (sharded as Slab.X) in, a jax.Array on the same devices out."""
    a, b, _ = operands(10, 32, 16, 24)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("x",))
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    ja, jb = jax.device_put(a, spec), jax.device_put(b, spec)
    got = dm.matmul(ja, jb, algorithm="summa25d")
    assert isinstance(got, jax.Array) and got.sharding.device_set == set(jax.devices()[:8])
    assert_close(np.asarray(got), reference(a, b), "float32")


@pytest.mark.parametrize("devices", [1, 2, 4, 6])
def test_a_rank_count_that_is_no_layered_grid_is_refused(devices):
    """P not q*q*c with q >= 2 and c >= 2: a ValueError naming what it needs."""
    a, b, _ = operands(11, 8, 8, 8)
    with pytest.raises(ValueError, match=rf"summa25d.*q\*q\*c.*8 = 2\*2\*2.*runs on {devices}"):
        dm.matmul(a, b, algorithm="summa25d", devices=devices)
