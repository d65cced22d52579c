"""The user's mesh in, the user's mesh out (contract section 3a).

jax.Array operands placed on a mesh of the user's (``jax.make_mesh``, whose
axes are Explicit by default, or an Auto mesh; also under ``jax.set_mesh``)
are accepted without a host round trip, and the result comes back on that
mesh with the NamedSharding its distribution implies. Every result is
checked against numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import dmatmul as dm  # noqa: E402
from _reference import assert_close, reference  # noqa: E402

X, Y, R = dm.Slab.X, dm.Slab.Y, dm.Replicated()
AXES = ("data", "model")


def mesh_of(kind: str, shape=(2, 4)):
    types = (AxisType.Explicit,) * 2 if kind == "explicit" else (AxisType.Auto,) * 2
    return jax.make_mesh(shape, AXES, axis_types=types)


def put(x, mesh, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))


RNG = np.random.default_rng(3)
A = RNG.standard_normal((16, 12)).astype(np.float32)
B = RNG.standard_normal((12, 24)).astype(np.float32)
C = RNG.standard_normal((16, 24)).astype(np.float32)
GRID_ROW, GRID_COL = dm.ProcessGrid((2, 4)), dm.ProcessGrid((4, 2), layout="col")


@pytest.mark.parametrize("kind", ["explicit", "auto"])
@pytest.mark.parametrize(
    "dists, want_spec",
    [
        ((X, Y, X), P(AXES, None)),
        ((Y, X, Y), P(None, AXES)),
        ((X, R, R), P()),
        ((X, Y, dm.BlockNonCyclic(GRID_ROW)), P("data", "model")),
        ((Y, X, dm.BlockNonCyclic(GRID_COL)), P("model", "data")),
        ((dm.BlockCyclic(GRID_ROW, (2, 3)), X, dm.BlockCyclic(GRID_COL, (4, 2))), P()),  # no NamedSharding says it
    ],
    ids=["XYX", "YXY", "XRR", "grid-row", "grid-col", "block-cyclic"],
)
def test_operands_on_the_users_mesh_come_back_on_it(kind, dists, want_spec):
    mesh = mesh_of(kind)
    a = put(A, mesh, P("data", None))  # any placement: dmatmul re-lays it device to device
    b = put(B, mesh, P(None, "model"))
    c = put(C, mesh, P())
    with jax.transfer_guard("disallow"):
        d = dm.matmul(a, b, c, beta=0.5, distribution=dists)
    assert isinstance(d, jax.Array)
    assert d.sharding == NamedSharding(mesh, want_spec), d.sharding
    assert_close(np.asarray(d), reference(A, B, C, beta=0.5), "float32")
    # the result feeds the user's own jitted code on that mesh
    total = jax.jit(lambda x: (2 * x).sum())(d)
    np.testing.assert_allclose(float(total), 2 * float(reference(A, B, C, beta=0.5).sum()), rtol=1e-4)


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_distribution_read_off_the_shardings(kind):
    mesh = mesh_of(kind)
    a, b = put(A, mesh, P(AXES, None)), put(B, mesh, P(None, AXES))
    with dm.Matmul(a, b) as mm:
        d = mm.execute()
        text = mm.explain()
    assert "a       Slab.X" in text and "b       Slab.Y" in text, text
    assert_close(np.asarray(d), reference(A, B), "float32")
    a = put(A, mesh, P("data", "model"))  # rows over data, columns over model: BlockNonCyclic on a 2x4 grid
    with dm.Matmul(a, b) as mm:
        assert "BlockNonCyclic(ProcessGrid((2, 4)" in mm.explain()
        assert_close(np.asarray(mm.execute()), reference(A, B), "float32")


@pytest.mark.parametrize(
    "spec, words",
    [
        (P("data", None), ["a:", "P('data', None)", "replicates over mesh axis 'model'", "distribution="]),
        (P(("model", "data"), None), ["a:", "not in mesh order", "distribution="]),
    ],
)
def test_a_sharding_that_is_no_distribution_is_named(spec, words):
    mesh = mesh_of("explicit")
    a, b = put(A, mesh, spec), put(B, mesh, P(None, AXES))
    with pytest.raises(ValueError) as info:
        dm.matmul(a, b)
    for w in words:
        assert w in str(info.value), str(info.value)
    # with a distribution given, the same operands are simply re-laid
    assert_close(np.asarray(dm.matmul(a, b, distribution=(X, Y, X))), reference(A, B), "float32")


@pytest.mark.parametrize("family", ["numpy", "jax"])
def test_under_set_mesh(family):
    mesh = mesh_of("explicit")
    with jax.set_mesh(mesh):
        a, b = (A, B) if family == "numpy" else (put(A, mesh, P(AXES, None)), put(B, mesh, P()))
        d = dm.matmul(a, b, distribution=(X, R, X))
        assert_close(np.asarray(d), reference(A, B), "float32")
        if family == "jax":
            assert d.sharding == NamedSharding(mesh, P(AXES, None))
            out = jax.jit(lambda x: x @ jnp.ones((24, 3), jnp.float32))(d)
            assert_close(np.asarray(out), reference(A, B) @ np.ones((24, 3)), "float32")


def test_gradients_through_the_users_mesh():
    mesh = mesh_of("auto")
    a, b = put(A, mesh, P(AXES, None)), put(B, mesh, P(None, AXES))
    g = RNG.standard_normal((16, 24)).astype(np.float32)

    def loss(x, y):
        return jnp.sum(dm.matmul(x, y, distribution=(X, Y, X)) * g)

    ga, gb = jax.grad(loss, argnums=(0, 1))(a, b)
    assert_close(np.asarray(ga), g.astype(np.float64) @ B.T.astype(np.float64), "float32")
    assert_close(np.asarray(gb), A.T.astype(np.float64) @ g.astype(np.float64), "float32")


def test_reset_operands_refuses_a_tracer():
    with dm.Matmul(jnp.asarray(A), jnp.asarray(B), distribution=X) as mm:
        def step(x):
            mm.reset_operands(a=x)
            return mm.execute()

        with pytest.raises(TypeError, match=r"reset_operands: a is a traced value.*dm.matmul"):
            jax.jit(step)(jnp.asarray(A))
        assert_close(np.asarray(mm.execute()), reference(A, B), "float32")  # the plan is still usable


def _collectives(mm, *args):
    """The collectives in the compiled program of a planned Matmul on jax.Arrays."""
    import re

    from dmatmul._matmul import plan_of

    text = plan_of(mm)._function("jax").lower(*args, None, None).compile().as_text()
    return {op: len(re.findall(rf"= [^ ]+ {op}(-start)?\(", text)) for op in ("all-reduce", "all-gather")}


@pytest.mark.parametrize(
    "m, dist_d, why",
    [
        (1001, X, "1001 rows do not split evenly over 8 devices"),
        (1001, dm.BlockNonCyclic(GRID_ROW), "1001x24 does not split evenly over the 2x4 grid"),
        (64, dm.BlockCyclic(GRID_COL, (4, 2)), "its 4x2 blocks are dealt cyclically over the 4x2 grid"),
        (64, dm.BlockNonCyclic(GRID_ROW, first_process=(1, 0)), "its first block is on grid process (1, 0)"),
    ],
    ids=["uneven-slab", "uneven-grid", "block-cyclic", "first-process"],
)
def test_a_result_no_sharding_expresses_is_gathered_and_explained(m, dist_d, why):
    """Uneven or cyclic results come back replicated, by a planned all-gather that
    explain() names with its reason: never by an all-reduce of a padded array."""
    rng = np.random.default_rng(m)
    a_np = rng.standard_normal((m, 12)).astype(np.float32)
    a, b = jnp.asarray(a_np), jnp.asarray(B)
    algorithm = "local" if dist_d == X else "auto"  # a grid result: local needs a move, which only auto adds
    with dm.Matmul(a, b, distribution=(X, R, dist_d), algorithm=algorithm, devices=8) as mm:
        d = mm.execute()
        assert mm.algorithm == "local"
        text = mm.explain()
        assert f"returned replicated on every device: no jax.Array sharding expresses it ({why}" in text, text
        assert "d: M -> R by all-gather" in text, text
        assert _collectives(mm, a, b) == {"all-reduce": 0, "all-gather": _collectives(mm, a, b)["all-gather"]}
        assert _collectives(mm, a, b)["all-gather"] >= 1
    assert d.sharding.is_fully_replicated
    assert_close(np.asarray(d), reference(a_np, B), "float32")


def test_an_even_result_stays_sharded_and_unexplained():
    a, b = jnp.asarray(A), jnp.asarray(B)
    with dm.Matmul(a, b, distribution=(X, R, X), algorithm="local", devices=8) as mm:
        d = mm.execute()
        assert "returned replicated" not in mm.explain()
        assert _collectives(mm, a, b) == {"all-reduce": 0, "all-gather": 0}
    assert d.sharding.spec[0] is not None and not d.sharding.is_fully_replicated
    assert_close(np.asarray(d), reference(A, B), "float32")
