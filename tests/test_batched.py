"""Batched products, (..., M, K) @ (..., K, N) broadcast as numpy.matmul does
(contract section 3a), on every backend that runs here, against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import dmatmul as dm
from dmatmul.testing import assert_close, reference
from dmatmul.testing.reference import random_matrix, reference_jvp, reference_vjp

from test_conformance import here  # noqa: F401  (the fixture: every backend that runs here)

RNG = np.random.default_rng(36)


def _rand(*shape, dtype="float32"):
    return random_matrix(RNG, shape, dtype)


# --------------------------------------------------------------------------- #
# the numpy reference
# --------------------------------------------------------------------------- #
def test_reference_is_numpy_matmul_per_item():
    a, b, c = _rand(2, 1, 3, 4, dtype="float64"), _rand(5, 4, 2, dtype="float64"), _rand(2, 5, 3, 2, dtype="float64")
    bias = _rand(2, 5, 1, 2, dtype="float64")
    want = np.maximum(1.5 * np.matmul(a, b) + 0.5 * c + bias, 0)
    got = reference(a, b, c, alpha=1.5, beta=0.5, epilog="relu_bias", bias=bias)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    rows = np.arange(3.0)  # (M,): one value per result row, every item's
    got = reference(np.swapaxes(a, -1, -2), b, transpose_a=True, epilog="bias", bias=rows)
    np.testing.assert_allclose(got, np.matmul(a, b) + rows[:, None], rtol=1e-12)


def test_reference_vjp_sums_over_what_was_broadcast():
    a, b, g = _rand(1, 3, 4, dtype="float64"), _rand(2, 4, 5, dtype="float64"), _rand(2, 3, 5, dtype="float64")
    bias = _rand(3, dtype="float64")
    grads = reference_vjp(a, b, None, g, epilog="bias", bias=bias)
    np.testing.assert_allclose(grads["a"], (g @ np.swapaxes(b, -1, -2)).sum(0, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(grads["b"], np.swapaxes(a, -1, -2) @ g, rtol=1e-12)
    np.testing.assert_allclose(grads["bias"], g.sum(axis=(0, 2)), rtol=1e-12)
    t = reference_jvp(a, b, None, {"b": np.ones_like(b)}, epilog="bias", bias=bias)
    np.testing.assert_allclose(t, a @ np.ones_like(b), rtol=1e-12)


# --------------------------------------------------------------------------- #
# the front end
# --------------------------------------------------------------------------- #
BAD = [
    (dict(a=(2, 4, 3), b=(3, 3, 5)), ValueError, ["a and b: batch dimensions (2,) and (3,) do not broadcast"]),
    (dict(a=(2, 4, 3), b=(2, 4, 5)), ValueError, ["inner dimensions differ"]),
    (dict(a=(2, 1, 4, 3), b=(3, 3, 5), c=(3, 4, 5), beta=1.0), ValueError,
     ["c must have the result's shape (..., M, N) = (2, 3, 4, 5)", "got (3, 4, 5)", "np.broadcast_to"]),
    (dict(a=(2, 4, 3), b=(3, 5), c=(2, 5, 4), beta=1.0), ValueError, ["c must have the result's shape", "(2, 5, 4)"]),
    (dict(a=(2, 4, 3), b=(3, 5), epilog="bias", bias=(3, 4, 1)), ValueError,
     ["bias of shape (3, 4, 1)", "(2, 4, 1)", "(2, 1, 5)"]),
    (dict(a=(2, 4, 3), b=(3, 5), epilog="bias", bias=(2, 4, 5)), ValueError, ["bias must be a vector", "(2, 4, 5)"]),
    (dict(a=(4,), b=(4, 5)), ValueError, ["a must be a 2-D matrix or a batch of matrices", "reshape(1, -1)"]),
    (dict(a=(2, 4, 3), b=(3,)), ValueError, ["b must be a 2-D matrix or a batch of matrices", "1-D"]),
]


@pytest.mark.parametrize("call, error, words", BAD, ids=[w[0][:40] for _, _, w in BAD])
def test_bad_batched_calls_raise_typed_errors_naming_the_operand(here, call, error, words):
    call = dict(call)
    ops = {name: _rand(*call.pop(name)) for name in ("a", "b", "c", "bias") if name in call}
    with pytest.raises(error) as info:
        dm.matmul(ops["a"], ops["b"], ops.get("c"), bias=ops.get("bias"), backend=here.name, **call)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


# --------------------------------------------------------------------------- #
# products against numpy
# --------------------------------------------------------------------------- #
SHAPES = [  # (a's batch, b's batch, c given): broadcast both ways, one side only, size 1 and 0
    ((3,), (3,), True),
    ((2, 1), (3,), True),
    ((), (2,), False),
    ((2,), (), True),
    ((1,), (1, 1), False),
    ((0,), (), True),
    ((2, 0), (1,), False),
]


@pytest.mark.parametrize("a_batch, b_batch, with_c", SHAPES)
@pytest.mark.parametrize("ta, tb", [(False, False), (True, True)])
def test_batched_products_match_numpy(here, a_batch, b_batch, with_c, ta, tb):
    m, k, n = 5, 3, 4
    a = _rand(*a_batch, *((k, m) if ta else (m, k)))
    b = _rand(*b_batch, *((n, k) if tb else (k, n)))
    batch = np.broadcast_shapes(a_batch, b_batch)
    c = _rand(*batch, m, n) if with_c else None
    kw = dict(alpha=0.75, beta=0.5 if with_c else 0.0, transpose_a=ta, transpose_b=tb)
    before = [x.copy() for x in (a, b) + ((c,) if with_c else ())]
    d = dm.matmul(a, b, c, backend=here.name, **kw)
    assert isinstance(d, np.ndarray) and d.dtype == np.float32
    assert_close(d, reference(a, b, c, **kw), "float32")
    for x, y in zip((a, b, c), before):
        np.testing.assert_array_equal(x, y)  # inputs are never modified


@pytest.mark.parametrize("epilog, bias_shape", [("relu_bias", (2, 1, 5, 1)), ("gelu_bias", (2, 3, 1, 4)),
                                                ("silu_bias", (5,)), ("bias", (1, 4)), ("gelu", None)])
def test_batched_epilogues_match_numpy(here, epilog, bias_shape):
    a, b = _rand(2, 1, 5, 3), _rand(3, 3, 4)
    bias = None if bias_shape is None else _rand(*bias_shape)
    if bias is not None and len(bias_shape) > 2:
        bias = np.broadcast_to(bias, (2, 3, *bias_shape[2:])).copy()
    d = dm.matmul(a, b, epilog=epilog, bias=bias, backend=here.name)
    assert_close(d, reference(a, b, epilog=epilog, bias=bias), "float32")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64", "complex64", "complex128"])
def test_batched_dtypes_match_numpy(here, dtype):
    a, b = _rand(2, 4, 3, dtype=dtype), _rand(1, 3, 5, dtype=dtype)
    d = dm.matmul(a, b, backend=here.name)
    assert str(d.dtype) == dtype
    assert_close(d, reference(a, b), dtype)


def test_batched_plan_runs_again_on_new_operands(here):
    a, b = _rand(3, 4, 3), _rand(3, 5)
    with dm.Matmul(a, b, backend=here.name) as mm:
        assert "batch" in mm.explain() and "(3,)" in mm.explain()
        assert_close(mm.execute(), reference(a, b), "float32")
        a2 = _rand(3, 4, 3)
        mm.reset_operands(a=a2)
        assert_close(mm.execute(), reference(a2, b), "float32")
        with pytest.raises(ValueError, match="reset_operands: a must match"):
            mm.reset_operands(a=_rand(2, 4, 3))


# --------------------------------------------------------------------------- #
# JAX: one compiled call, the batch split over the devices or the matrix plan under vmap
# --------------------------------------------------------------------------- #
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")


def _compiled_text(mm) -> str:
    from dmatmul._matmul import plan_of

    plan = plan_of(mm)
    ops = mm._operands
    s = plan.spec
    xs = [ops.a, ops.b, ops.c if s.use_c else None, ops.bias if s.has_bias else None]
    import jax.numpy as jnp

    return plan._fn.lower(*[None if x is None else jnp.asarray(x) for x in xs]).compile().as_text()


@pytest.mark.parametrize("batch, a_batched", [((16,), True), ((4, 4), True), ((8,), False)])
def test_a_batch_split_over_devices_communicates_nothing(batch, a_batched):
    jax = pytest.importorskip("jax")
    a = _rand(*(batch if a_batched else ()), 6, 5)
    b = _rand(*batch, 5, 7)
    bias = _rand(*batch, 1, 7)
    with dm.Matmul(a, b, epilog="gelu_bias", bias=bias, backend="jax", devices=8) as mm:
        assert mm.algorithm == "local"
        text = mm.explain()
        assert "split over the 8 devices" in text and "nothing is communicated" in text, text
        hlo = _compiled_text(mm)
        assert not [op for op in COLLECTIVES if op in hlo], [op for op in COLLECTIVES if op in hlo]
        assert_close(mm.execute(), reference(a, b, epilog="gelu_bias", bias=bias), "float32")
    # a batch of jax.Arrays: a jax.Array back, its batch split over the devices
    d = dm.matmul(jax.numpy.asarray(a), jax.numpy.asarray(b), epilog="gelu_bias", bias=bias, devices=8)
    assert isinstance(d, jax.Array) and len(d.sharding.device_set) == 8
    assert_close(np.asarray(d), reference(a, b, epilog="gelu_bias", bias=bias), "float32")


@pytest.mark.parametrize("algorithm", ["allgather", "reduce_scatter", "allreduce", "summa", "summa25d"])
def test_a_named_algorithm_runs_each_item_under_vmap(algorithm):
    pytest.importorskip("jax")
    a, b, c = _rand(3, 8, 8), _rand(1, 8, 8), _rand(3, 8, 8)
    with dm.Matmul(a, b, c, beta=1.0, algorithm=algorithm, backend="jax", devices=8) as mm:
        assert mm.algorithm == algorithm
        assert "under jax.vmap" in mm.explain()
        assert_close(mm.execute(), reference(a, b, c, beta=1.0), "float32")


def test_a_2d_distribution_applies_to_the_last_two_dimensions():
    pytest.importorskip("jax")
    a, b = _rand(2, 8, 6), _rand(2, 6, 4)
    dist = (dm.Slab.X, dm.Slab.X, dm.Slab.X)
    with dm.Matmul(a, b, distribution=dist, backend="jax", devices=4) as mm:
        assert "Slab.X" in mm.explain() and "under jax.vmap" in mm.explain()
        assert_close(mm.execute(), reference(a, b), "float32")


@pytest.mark.parametrize("jit", [False, True])
def test_gradients_through_a_batched_product(jit):
    jax = pytest.importorskip("jax")
    a, b = _rand(3, 4, 5, dtype="float64"), _rand(1, 5, 6, dtype="float64")
    bias, g = _rand(6, dtype="float64").reshape(1, 6), _rand(3, 4, 6, dtype="float64")

    def f(a, b, bias):
        return dm.matmul(a, b, alpha=0.5, transpose_a=False, epilog="silu_bias", bias=bias, devices=4)

    with jax.enable_x64(True):
        fn = jax.jit(f) if jit else f
        d, vjp = jax.vjp(fn, a, b, bias)
        grads = vjp(jax.numpy.asarray(g))
    want = reference_vjp(a, b, None, g, alpha=0.5, epilog="silu_bias", bias=bias)
    assert_close(np.asarray(d), reference(a, b, alpha=0.5, epilog="silu_bias", bias=bias), "float64")
    for name, got in zip(("a", "b", "bias"), grads):
        assert got.shape == want[name].shape, name
        assert_close(np.asarray(got), want[name], "float64")


# --------------------------------------------------------------------------- #
# found by the differential matrix's batched draws
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("batch", [(1,), (3,), (2, 3), (9,)])  # under vmap, and split over the devices
def test_a_batched_numpy_result_is_the_callers(here, batch):
    """A numpy result is the caller's to write into, as a matrix result is (the
    JAX backend's batched plans returned a read-only view of a jax.Array)."""
    a, b = _rand(*batch, 5, 3), _rand(3, 4)
    kw = {"devices": 8} if here.name == "jax" else {}
    for dist in (None, (dm.Replicated(), dm.Replicated(), dm.Slab.X)):
        d = dm.matmul(a, b, distribution=dist if here.name == "jax" else None, backend=here.name, **kw)
        assert d.flags.writeable, dist
        assert_close(d, reference(a, b), "float32")


@pytest.mark.parametrize("batch", [(0,), (2, 0)])
def test_an_empty_batch_of_fp8_operands_has_the_result_type(here, batch):
    """No items: the result has the result type of FP8 a and b (bfloat16 by
    default, result_type= else), as a batch with items does, not float8."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.ones((*batch, 4, 3), ml_dtypes.float8_e4m3fn)
    b = np.ones((3, 5), ml_dtypes.float8_e4m3fn)
    for result_type, want in ((None, "bfloat16"), ("float32", "float32")):
        kw = {} if result_type is None else {"result_type": result_type}
        d = dm.matmul(a, b, backend=here.name, **kw)
        assert d.shape == (*batch, 4, 5) and str(d.dtype) == want, (d.shape, d.dtype)


def test_an_empty_batch_of_jax_arrays_lies_on_the_devices_in_use():
    """No items, jax operands: the (empty) result lies on the devices asked
    for, as every result does, not on JAX's default device."""
    jax = pytest.importorskip("jax")
    devices = [jax.devices()[i] for i in (3, 1, 6)]
    a, b = jax.numpy.ones((0, 2, 4, 3)), jax.numpy.ones((3, 5))
    for dist in (None, dm.Slab.X):
        d = dm.matmul(a, b, distribution=dist, devices=devices)
        assert isinstance(d, jax.Array) and d.shape == (0, 2, 4, 5)
        assert d.sharding.device_set == set(devices), (dist, d.sharding)


@pytest.mark.parametrize("batch", [(0,), (2, 0)])
def test_an_empty_batch_is_refused_as_an_empty_matrix_product_is(here, batch):
    """No items: a grid of another rank count, or a named algorithm that does
    not fit, is refused as it is for a batch with items (it ran, returning an
    empty result)."""
    a, b = _rand(*batch, 4, 3), _rand(3, 5)
    kw = {"devices": 4} if here.name == "jax" else {}
    grid = dm.BlockNonCyclic(dm.ProcessGrid((1, 8)))
    with pytest.raises(dm.DistributionError, match=r"spans 8 ranks \(its grid \(1, 8\)\)"):
        dm.matmul(a, b, distribution=grid, backend=here.name, **kw)
    with pytest.raises(ValueError, match="algorithm='summa25d' needs"):
        dm.matmul(a, b, algorithm="summa25d", backend=here.name, **kw)
    assert dm.matmul(a, b, backend=here.name, **kw).shape == (*batch, 4, 5)


# --------------------------------------------------------------------------- #
# batched operands on a user's mesh (found by the differential matrix once it drew batches there)
# --------------------------------------------------------------------------- #
def _mesh(shape, types, reverse=False):
    jax = pytest.importorskip("jax")
    from jax.sharding import AxisType, Mesh

    devices = jax.devices()[: int(np.prod(shape))]
    kinds = {"Explicit": AxisType.Explicit, "Auto": AxisType.Auto}
    return Mesh(np.array(devices[::-1] if reverse else devices, dtype=object).reshape(shape),
                ("data", "model")[: len(shape)], axis_types=tuple(kinds[t] for t in types))


def _put(x, mesh, *spec):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    return jax.device_put(jax.numpy.asarray(x), NamedSharding(mesh, PartitionSpec(*spec)))


@pytest.mark.parametrize("types", [("Explicit", "Explicit"), ("Explicit", "Auto"), ("Auto", "Auto")])
@pytest.mark.parametrize("dist", [None, dm.BlockNonCyclic(dm.ProcessGrid((2, 4)))])
def test_a_jit_of_closed_over_batched_operands_runs_on_their_mesh(types, dist):
    """Inside ``jax.jit`` on closed-over (concrete) batched operands on a user's mesh: each
    item's plan finds the mesh in its item, as a matrix product of them does (the items
    were sliced inside the trace, named only an abstract mesh, and the jit of constants,
    which has no devices of its own, raised 'cannot reshape array of size 1')."""
    jax = pytest.importorskip("jax")
    mesh = _mesh((4, 2), types)
    a, b = _rand(2, 14, 10), _rand(14, 33)
    ja = _put(a, mesh)
    d = jax.jit(lambda: dm.matmul(ja, b, distribution=dist, transpose_a=True, backend="jax"))()
    assert d.sharding.mesh == mesh, d.sharding
    assert_close(np.asarray(d), reference(a, b, transpose_a=True), "float32")


@pytest.mark.parametrize("types", [("Explicit",), ("Auto",)])
def test_a_batch_split_over_a_users_mesh_of_explicit_axes(types):
    """algorithm="local" with distribution=None splits the batch over the user's mesh:
    on Explicit axes the operands are typed as placed (the batch whole, b's rows split),
    which shard_map takes only as its in_specs say (it raised 'in_specs ... does not
    match'), and a padded batch is gathered before it is cut (its slice raised
    ShardingTypeError)."""
    mesh = _mesh((3,), types)
    a, b = _rand(2, 1, 13, 9), _rand(21, 13)
    ja, jb = _put(a, mesh), _put(b, mesh, "data", None)
    for algorithm in ("local", "auto"):
        d = dm.matmul(ja, jb, transpose_a=True, transpose_b=True, algorithm=algorithm, backend="jax")
        assert d.sharding.mesh == mesh, (algorithm, d.sharding)
        assert_close(np.asarray(d), reference(a, b, transpose_a=True, transpose_b=True), "float32")


@pytest.mark.parametrize("types", [("Explicit", "Explicit"), ("Explicit", "Auto"), ("Auto", "Auto")])
def test_an_empty_batched_operand_on_a_users_mesh(types):
    """K = 0, a batched a on a user's mesh: its items (of no element) keep its placement
    (jax.numpy's a[0] makes an empty array anew on one device: it raised 'Length of device
    assignment 1' on Explicit axes), so the result comes back on the mesh, epilog(bias)."""
    mesh = _mesh((2, 2), types, reverse=True)
    a, b, bias = _rand(3, 0, 4), _rand(0, 18), _rand(4)
    ja, jb = _put(a, mesh, None, "data", None), _put(b, mesh, None, "model")
    want = reference(a, b, alpha=-1.5, transpose_a=True, epilog="relu_bias", bias=bias)
    d = dm.matmul(ja, jb, alpha=-1.5, transpose_a=True, epilog="relu_bias", bias=bias, backend="jax")
    assert d.sharding.mesh == mesh, d.sharding
    assert_close(np.asarray(d), want, "float32")
    with dm.Matmul(ja, jb, alpha=-1.5, transpose_a=True, epilog="relu_bias", bias=bias, backend="jax") as mm:
        assert_close(np.asarray(mm.execute()), want, "float32")


@pytest.mark.parametrize("a_shape", [(19, 0), (2, 19, 0), (3, 2, 19, 0)])
def test_a_batched_k0_product_judges_shardings_as_the_matrix_product_does(a_shape):
    """K = 0, b a jax.Array placed as none of dmatmul's distributions (P(None,
    'model') of a 2x4 mesh: replicated over 'data'): a batched a is refused
    naming b, as a 2-D a is (an item of the batch lost b's sharding, and the
    batched product ran). The same product with b's sharding one of dmatmul's
    runs: beta*C, as numpy."""
    jax = pytest.importorskip("jax")
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    a = jax.numpy.zeros(a_shape)
    c = _rand(*a_shape[:-1], 40)
    b = jax.device_put(jax.numpy.zeros((0, 40)), NamedSharding(mesh, PartitionSpec(None, "model")))
    with pytest.raises(ValueError, match=r"^b: its sharding P\(None, 'model'\) .* is not one of dmatmul's distributions"):
        dm.matmul(a, b, jax.numpy.asarray(c), beta=0.5, backend="jax")
    fine = jax.device_put(jax.numpy.zeros((0, 40)), NamedSharding(mesh, PartitionSpec(None, ("data", "model"))))
    d = dm.matmul(a, fine, jax.numpy.asarray(c), beta=0.5, backend="jax")
    np.testing.assert_allclose(np.asarray(d), 0.5 * c, rtol=1e-6)


@pytest.mark.parametrize("explicit", [True, False])
@pytest.mark.parametrize("m, n, k, batch, beta", [(1, 1, 1, 1, 0.0), (3, 4, 5, 2, 0.5), (3, 1, 5, 2, 1.0)])
def test_numpy_operands_beside_a_batched_jax_array_on_a_users_mesh(explicit, m, n, k, batch, beta):
    """numpy a and b, c a jax.Array on a 2-device mesh of the user's, a batch
    and a 1x2 grid named, no devices=: the items run under vmap on that mesh
    (the numpy operands placed there whole; on the default device they left
    the items on two places, and each item's plan counted all 8 devices:
    DistributionError, found by the differential matrix's long run)."""
    jax = pytest.importorskip("jax")
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

    kind = AxisType.Explicit if explicit else AxisType.Auto
    mesh = Mesh(np.array(jax.devices()[:2], dtype=object), ("data",), axis_types=(kind,))
    rng = np.random.default_rng(12)
    a, b = random_matrix(rng, (m, k), "float32"), random_matrix(rng, (batch, k, n), "float32")
    c, bias = random_matrix(rng, (batch, m, n), "float32"), random_matrix(rng, (m, 1), "float32")
    if beta == 0:
        c[...] = np.nan  # (beta == 0: c is not read)
    jc = jax.device_put(c, NamedSharding(mesh, PartitionSpec()))
    grid = dm.BlockNonCyclic(dm.ProcessGrid((1, 2)))
    with dm.Matmul(a, b, jc, distribution=(grid, grid, grid), beta=beta, epilog="bias", bias=bias,
                   backend="jax") as mm:
        for _ in range(2):
            want = reference(a, b, None if beta == 0 else c, beta=beta, epilog="bias", bias=bias)
            assert_close(mm.execute(), want, "float32")
