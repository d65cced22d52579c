"""The user's mesh in, the user's mesh out (contract section 3a).

jax.Array operands placed on a mesh of the user's (``jax.make_mesh``, whose
axes are Explicit by default, or an Auto mesh; also under ``jax.set_mesh``)
are accepted without a host round trip, and the result comes back on that
mesh with the NamedSharding its distribution implies. Every result is
checked against numpy.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import dmatmul as dm  # noqa: E402
from dmatmul.testing.reference import assert_close, reference  # noqa: E402

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
        # one block per process, its whole share: the same layout as BlockNonCyclic
        ((X, Y, dm.BlockCyclic(GRID_ROW, (8, 6))), P("data", "model")),
        ((Y, X, dm.BlockCyclic(GRID_COL, (4, 12))), P("model", "data")),
    ],
    ids=["XYX", "YXY", "XRR", "grid-row", "grid-col", "block-cyclic", "one-block-row", "one-block-col"],
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
        (P(("model", "data"), None), ["a:", "not in mesh order", "distribution=", "shard a over every mesh axis"]),
        # (b P(None, "model") is Megatron's: the mesh axis "data" is then independent, tests/test_megatron.py;
        # here "model" splits a's rows after "data", so no cut along it holds whole rows of a)
        (P("data", None), ["b:", "replicates over mesh axis 'model'", "shard b over", "Slab.Y (columns)"]),
    ],
)
def test_a_sharding_that_is_no_distribution_is_named(spec, words):
    mesh = mesh_of("explicit")
    if "b:" in words:
        a, b = put(A, mesh, P(AXES, None)), put(B, mesh, spec)
    else:
        a, b = put(A, mesh, spec), put(B, mesh, P(None, AXES))
    with pytest.raises(ValueError) as info:
        dm.matmul(a, b)
    for w in words:
        assert w in str(info.value), str(info.value)
    # with a distribution given, the same operands are simply re-laid
    assert_close(np.asarray(dm.matmul(a, b, distribution=(X, Y, X))), reference(A, B), "float32")


@pytest.mark.parametrize("call", ["eager", "jit"])
@pytest.mark.parametrize("c_spec", [P(None, AXES), P(AXES, None), P(), P("data", "model"), P("model", "data")],
                         ids=["Y", "X", "R", "grid-row", "grid-col"])
def test_c_says_the_result_distribution_where_none_is_given(c_spec, call):
    """``distribution=None``: c has the result distribution (the contract), so
    where c is read its sharding says it, as a's and b's say theirs; one that
    is none of dmatmul's is refused naming c; a c that is not read (beta = 0)
    says nothing. (c was re-laid to the model's pick for the result, and a c
    of no distribution was taken silently.)"""
    mesh = mesh_of("explicit")
    a, b, c = put(A, mesh, P(AXES, None)), put(B, mesh, P()), put(C, mesh, c_spec)
    run = (lambda f: f) if call == "eager" else jax.jit
    d = run(lambda a, b, c: dm.matmul(a, b, c, beta=0.5))(a, b, c)
    assert d.sharding.is_equivalent_to(NamedSharding(mesh, c_spec), 2), d.sharding
    assert_close(np.asarray(d), reference(A, B, C, beta=0.5), "float32")
    d = run(lambda a, b, c: dm.matmul(a, b, c, beta=0.0))(a, b, c)  # c not read: the model's pick, a's layout
    assert d.sharding.is_equivalent_to(NamedSharding(mesh, P(AXES, None)), 2), d.sharding
    assert_close(np.asarray(d), reference(A, B), "float32")
    with pytest.raises(ValueError, match=r"^c: its sharding P\('data', None\).*replicates over mesh axis 'model'"):
        run(lambda a, b, c: dm.matmul(a, b, c, beta=0.5))(a, b, put(C, mesh, P("data", None)))


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
    import re

    rng = np.random.default_rng(m)
    # K large enough that splitting the work pays for the result's gather: an a of 1001 rows is held replicated
    # (no sharding splits it evenly), and on a tiny product the model would rather every device computed it all
    a_np, b_np = rng.standard_normal((m, 1024)).astype(np.float32), rng.standard_normal((1024, 24)).astype(np.float32)
    a, b = jnp.asarray(a_np), jnp.asarray(b_np)
    algorithm = "local" if dist_d == X else "auto"  # a grid result: local needs a move, which only auto adds
    with dm.Matmul(a, b, distribution=(X, R, dist_d), algorithm=algorithm, devices=8) as mm:
        d = mm.execute()
        assert mm.algorithm == "local"
        text = mm.explain()
        assert f"returned replicated on every device: no jax.Array sharding expresses it ({why}" in text, text
        assert re.search(r"d: [MN] -> R by all-gather", text), text
        assert _collectives(mm, a, b) == {"all-reduce": 0, "all-gather": _collectives(mm, a, b)["all-gather"]}
        assert _collectives(mm, a, b)["all-gather"] >= 1
    assert d.sharding.is_fully_replicated
    assert_close(np.asarray(d), reference(a_np, b_np), "float32")


def test_a_replicated_result_on_another_grid_is_not_said_to_be_relaid():
    """A result on another grid than the product's that no sharding expresses
    comes back replicated: explain() says so, and lists no re-laying all-to-all
    onto its grid, which does not happen."""
    rng = np.random.default_rng(7)
    a_np, b_np = rng.standard_normal((16, 12)).astype(np.float32), rng.standard_normal((12, 10)).astype(np.float32)
    a, b = jnp.asarray(a_np), jnp.asarray(b_np)
    dists = (dm.BlockNonCyclic(GRID_ROW), dm.BlockNonCyclic(GRID_ROW), dm.BlockCyclic(dm.ProcessGrid((4, 2)), (1, 1)))
    with dm.Matmul(a, b, distribution=dists, devices=8) as mm:
        d = mm.execute()
        text = mm.explain()
        assert "returned replicated on every device" in text, text
        assert "all-to-all" not in text and "another grid" not in text, text
    assert d.sharding.is_fully_replicated
    assert_close(np.asarray(d), reference(a_np, b_np), "float32")


def test_an_even_result_stays_sharded_and_unexplained():
    a, b = jnp.asarray(A), jnp.asarray(B)
    with dm.Matmul(a, b, distribution=(X, R, X), algorithm="local", devices=8) as mm:
        d = mm.execute()
        assert "returned replicated" not in mm.explain()
        assert _collectives(mm, a, b) == {"all-reduce": 0, "all-gather": 0}
    assert d.sharding.spec[0] is not None and not d.sharding.is_fully_replicated
    assert_close(np.asarray(d), reference(A, B), "float32")



def _ops(text: str, *ops: str) -> dict[str, int]:
    """How often each HLO op is called in a compiled program's text (not as part of another's name)."""
    import re

    return {op: len(re.findall(rf"(?<![\w.-]){op}(-start)?\(", text)) for op in ops}


@pytest.mark.parametrize("dists, a_shape, b_shape, op", [
    ((X, dm.BlockCyclic(GRID_ROW, (1, 1)), X), (64, 48), (48, 40), "b"),
    ((dm.BlockCyclic(GRID_COL, (2, 3)), Y, Y), (256, 16), (16, 8), "a"),
    ((X, dm.BlockCyclic(GRID_COL, (8, 8)), dm.BlockCyclic(GRID_COL, (8, 8))), (16, 256), (256, 16), "b"),
], ids=["b-cyclic", "a-cyclic", "b-and-result-cyclic"])
def test_an_operand_no_sharding_expresses_is_taken_replicated(dists, a_shape, b_shape, op):
    """One process: a jax.Array that no sharding lays out as its distribution says
    (block-cyclic) is placed replicated, and the plan takes it as what it then is,
    Replicated(): the kernel slices it, with no exchange re-laying it on the grid
    and back (collective-permutes and scatters, before). explain() says so. The
    result is laid out as before, and equals numpy's; numpy operands, placed block
    by block, keep their layout."""
    rng = np.random.default_rng(a_shape[0])
    a_np, b_np = rng.standard_normal(a_shape).astype(np.float32), rng.standard_normal(b_shape).astype(np.float32)
    a, b = jnp.asarray(a_np), jnp.asarray(b_np)
    want = reference(a_np, b_np)
    with dm.Matmul(a, b, distribution=dists, devices=8) as mm:
        d = mm.execute()
        text = mm.explain()
    assert f"{op}       {dists['ab'.index(op)]!r} taken as Replicated(): no jax.Array sharding expresses it" in text
    assert f"{op}: G ->" not in text, text
    assert_close(np.asarray(d), want, "float32")
    result = dists[2]
    if isinstance(result, dm.BlockCyclic):
        assert d.sharding.is_fully_replicated
    else:
        shards = {s.device: s for s in d.addressable_shards}
        for r, dev in enumerate(jax.devices()[:8]):
            rows, cols = result.global_indices(r, want.shape, 8)
            assert shards[dev].data.shape == (len(rows), len(cols)), d.sharding
    f = jax.jit(lambda x, y: dm.matmul(x, y, distribution=dists, devices=8))
    assert _ops(f.lower(a, b).compile().as_text(), "collective-permute", "scatter") == {
        "collective-permute": 0, "scatter": 0}
    assert_close(np.asarray(f(a, b)), want, "float32")
    with dm.Matmul(a_np, b_np, distribution=dists, devices=8) as mm:
        assert "taken as Replicated()" not in mm.explain()
        assert_close(mm.execute(), want, "float32")


@pytest.mark.parametrize("spec, grid", [(P("data", "model"), GRID_ROW), (P("model", "data"), GRID_COL)],
                         ids=["row", "col"])
@pytest.mark.parametrize("shape", [(16, 12, 24), (256, 256, 256)])
def test_operands_on_a_2d_grid_leave_the_result_on_it_where_that_is_cheapest(spec, grid, shape):
    """``distribution=None`` on a and b laid out on a 2-D grid of the user's
    mesh: the result layout the model picks costs no more than the grid's
    own, which SUMMA delivers with no move. (The chooser offered only 1-D
    results, costed without SUMMA: it picked Slab.X, planned as SUMMA plus
    an all-to-all of the result, twice the grid's modelled time at 16x24.)"""
    from dmatmul._matmul import plan_of

    m, k, n = shape
    mesh = mesh_of("explicit")
    a_np, b_np = (RNG.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n)))
    a, b = put(a_np, mesh, spec), put(b_np, mesh, spec)
    on_grid = dm.BlockNonCyclic(grid)
    with dm.Matmul(a, b, distribution=(on_grid, on_grid, on_grid)) as named:
        grid_time = plan_of(named).cost.time
    with dm.Matmul(a, b) as mm:
        chosen = plan_of(mm)
        assert chosen.distributions[:2] == (on_grid, on_grid)
        assert chosen.cost.time <= grid_time * (1 + 1e-9), mm.explain()
        d = mm.execute()
    assert d.sharding == NamedSharding(mesh, spec), d.sharding
    assert_close(np.asarray(d), reference(a_np, b_np), "float32")


_SIZES = st.sampled_from([1, 2, 7, 8, 13, 64, 257, 1001, 1024])
_SPLITS = {"rows": P("x", None), "cols": P(None, "x"), "none": P()}


@given(m=_SIZES, n=_SIZES, k=_SIZES, sa=st.sampled_from(sorted(_SPLITS)), sb=st.sampled_from(sorted(_SPLITS)))
@settings(max_examples=40, deadline=None)
def test_the_result_layout_left_to_the_model_is_the_cheapest_as_run(m, n, k, sa, sb):
    """``distribution=None`` on laid-out jax.Arrays: the result layout the model
    picks costs, as it is then planned, no more than any other the user could
    have named. Costed as run: uneven splits padded (zeros travel and are
    multiplied), and a result no sharding expresses gathered to every device.
    The chooser once ignored both (N=1 over 8 devices ships 8x what it counted)."""
    from dmatmul._matmul import plan_of

    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    shapes = {"a": (m, k), "b": (k, n)}
    for name, split in (("a", sa), ("b", sb)):  # JAX lays out only even splits
        assume(split == "none" or shapes[name]["rows cols".split().index(split)] % 8 == 0)
    rng = np.random.default_rng(m * 7 + n * 5 + k)
    a_np = rng.standard_normal(shapes["a"]).astype(np.float32)
    b_np = rng.standard_normal(shapes["b"]).astype(np.float32)
    a, b = put(a_np, mesh, _SPLITS[sa]), put(b_np, mesh, _SPLITS[sb])
    with dm.Matmul(a, b) as mm:
        chosen = plan_of(mm)
        da, db, dd = chosen.distributions
        named = {}
        for d in (X, Y, R):
            with dm.Matmul(a, b, distribution=(da, db, d)) as other:
                named[d] = plan_of(other).cost.time
        assert chosen.cost.time <= min(named.values()) * (1 + 1e-9), (dd, chosen.cost.time, named, mm.explain())
        assert "returned replicated" not in mm.explain()  # a result the model picks is delivered as picked
        if m * n * k <= 2**21:
            assert_close(np.asarray(mm.execute()), reference(a_np, b_np), "float32")


# --------------------------------------------------------------------------- #
# inside the user's trace: jit, grad, jit(grad), on every kind of user mesh
# --------------------------------------------------------------------------- #
def _user_mesh(kind: str, order: str, shape=(2, 4)):
    """A user's mesh: Explicit or Auto axes, its devices in JAX's order or reversed
    (as topology-aware meshes of real clusters are not in id order)."""
    devices = jax.devices()[:8]
    devices = devices if order == "natural" else devices[::-1]
    E, A = AxisType.Explicit, AxisType.Auto
    types = {"explicit": (E, E), "auto": (A, A), "explicit-auto": (E, A), "auto-explicit": (A, E)}[kind]
    return jax.sharding.Mesh(np.array(devices).reshape(shape), AXES, axis_types=types)


_TRIPLES = [
    (X, Y, X), (Y, X, Y), (X, R, R), (R, Y, Y),
    (X, Y, dm.BlockNonCyclic(GRID_ROW)), (Y, X, dm.BlockNonCyclic(GRID_COL)),
    (dm.BlockNonCyclic(GRID_ROW), dm.BlockNonCyclic(GRID_ROW), dm.BlockNonCyclic(GRID_ROW)),
    (dm.BlockCyclic(GRID_ROW, (2, 3)), X, dm.BlockCyclic(GRID_COL, (3, 2))),
    (dm.BlockNonCyclic(GRID_COL), Y, X),
]
_SPECS = [P(AXES, None), P(None, AXES), P("data", "model"), P("model", "data"), P(), P("data", None)]


def _trace_cases():
    """Every (mesh kind, set_mesh, device order) with distributions, operand
    placements and sizes drawn independently (a fixed seed: the same cases in
    every run); sizes prime or uneven where the placement allows it."""
    rng = np.random.default_rng(1414)
    cases = []
    for kind in ("explicit", "auto", "explicit-auto", "auto-explicit"):
        for context in (False, True):
            for order in ("natural", "reversed"):
                for _ in range(3 if kind in ("explicit", "auto") else 1):
                    dists = _TRIPLES[int(rng.integers(len(_TRIPLES)))]
                    sa, sb = (_SPECS[int(i)] for i in rng.integers(len(_SPECS), size=2))
                    m, k, n = (int(rng.choice(choices)) for choices in ((8, 16, 24), (7, 12, 13), (8, 24, 40)))
                    cases.append(pytest.param(kind, context, order, dists, sa, sb, (m, k, n),
                                              id=f"{kind}-{'set_mesh' if context else 'plain'}-{order}-{len(cases)}"))
    return cases


def _fits(spec, shape, mesh):
    """Whether JAX can hold ``shape`` placed by ``spec`` (Explicit shardings must split evenly)."""
    for part, size in zip(tuple(spec) + (None, None), shape):
        names = () if part is None else (part,) if isinstance(part, str) else part
        if size % int(np.prod([mesh.shape[n] for n in names] or [1])):
            return False
    return True


@pytest.mark.parametrize("kind, context, order, dists, sa, sb, mkn", _trace_cases())
def test_inside_the_users_jit_and_grad(kind, context, order, dists, sa, sb, mkn):
    """dm.matmul inside the user's jit and grad on the user's mesh: Explicit or
    Auto axes, with and without jax.set_mesh, devices in any order. The values
    match numpy, and a jitted result is typed on (and lives on) the user's mesh."""
    m, k, n = mkn
    mesh = _user_mesh(kind, order)
    rng = np.random.default_rng(m * 100 + k)
    a_np = rng.standard_normal((m, k)).astype(np.float32)
    b_np = rng.standard_normal((k, n)).astype(np.float32)
    g_np = rng.standard_normal((m, n)).astype(np.float32)
    a = put(a_np, mesh, sa if _fits(sa, a_np.shape, mesh) else P())
    b = put(b_np, mesh, sb if _fits(sb, b_np.shape, mesh) else P())
    g = put(g_np, mesh, P())

    def product(x, y):
        return dm.matmul(x, y, distribution=dists)

    def loss(x, y, w):
        return jnp.sum(product(x, y) * w)

    with jax.set_mesh(mesh) if context else contextlib.nullcontext():
        d = jax.jit(product)(a, b)
        assert isinstance(d.sharding, NamedSharding) and d.sharding.mesh == mesh, d.sharding
        assert_close(np.asarray(d), reference(a_np, b_np), "float32")
        if "explicit" in kind and not context:
            return  # JAX itself refuses grad of a sum on an Explicit mesh outside jax.set_mesh
        for grad in (jax.grad(loss, argnums=(0, 1)), jax.jit(jax.grad(loss, argnums=(0, 1)))):
            ga, gb = grad(a, b, g)
            assert_close(np.asarray(ga), g_np.astype(np.float64) @ b_np.T.astype(np.float64), "float32")
            assert_close(np.asarray(gb), a_np.T.astype(np.float64) @ g_np.astype(np.float64), "float32")


@pytest.mark.parametrize("kind", ["explicit", "auto"])
@pytest.mark.parametrize("order", ["natural", "reversed"])
def test_inside_jit_a_laid_out_operand_does_not_move(kind, order):
    """Traced operands already laid out as their distributions say (same blocks on
    the same devices, in the user's device order) cross into dmatmul's kernel with
    no collective at all; with distribution=None the layouts are read off the
    Explicit types (an Auto type says nothing: the cost model picks)."""
    mesh = _user_mesh(kind, order)
    a, b = put(A, mesh, P(AXES, None)), put(B, mesh, P())
    explained = []

    def product(x, y):
        with dm.Matmul(x, y, distribution=None if kind == "explicit" else (X, R, X), algorithm="local") as mm:
            explained.append(mm.explain())
            return mm.execute()

    text = jax.jit(product).lower(a, b).compile().as_text()
    moves = [op for op in ("all-gather", "all-to-all", "collective-permute", "all-reduce", "reduce-scatter")
             if f" {op}(" in text or f" {op}-start(" in text]
    assert moves == [], moves
    assert "a       Slab.X" in explained[0] and "b       Replicated()" in explained[0], explained[0]
    d = jax.jit(product)(a, b)
    assert d.sharding.mesh == mesh and d.sharding.spec == P(AXES, None), d.sharding
    assert_close(np.asarray(d), reference(A, B), "float32")


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_a_result_the_users_mesh_cannot_lay_out_is_gathered_in_the_plan(kind):
    """BlockNonCyclic on a 4x2 row-major grid is a sharding of dmatmul's own mesh
    but of no (2, 4) mesh: the result comes back replicated on the user's mesh,
    gathered by a move of the plan that explain() names, not after it."""
    mesh = mesh_of(kind)
    a, b = put(A, mesh, P(AXES, None)), put(B, mesh, P(None, AXES))
    dist_d = dm.BlockNonCyclic(dm.ProcessGrid((4, 2)))
    with dm.Matmul(a, b, distribution=(X, Y, dist_d)) as mm:
        d = mm.execute()
        text = mm.explain()
    assert "returned replicated on every device" in text and "no sharding of the operands' mesh" in text, text
    assert " -> R by all-gather" in text, text
    assert d.sharding == NamedSharding(mesh, P()), d.sharding
    assert_close(np.asarray(d), reference(A, B), "float32")
    d = jax.jit(lambda x, y: dm.matmul(x, y, distribution=(X, Y, dist_d)))(a, b)
    assert d.sharding.mesh == mesh and d.sharding.is_fully_replicated, d.sharding
    assert_close(np.asarray(d), reference(A, B), "float32")


@pytest.mark.parametrize("shape", [(1, 8), (8, 1), (2, 1, 4)])
def test_a_mesh_axis_of_size_1_is_named_as_jax_names_it(shape):
    """On an Explicit mesh with an axis of size 1 (a (1, 8) "data x model" mesh on
    one host, say) a result is typed as JAX types the same product of arrays laid
    out so: over every mesh axis. Before, the size-1 axis was dropped (P("model")
    for P(("data", "model"))), and the user's own ``d + e`` of arrays laid out as
    docs/jax.md says (PartitionSpec(mesh.axis_names, None) is Slab.X) raised
    ShardingTypeError, as did grad of a loss against such an array."""
    names = ("data", "model") if len(shape) == 2 else ("data", "pipe", "model")
    mesh = jax.make_mesh(shape, names)
    rows = dm.ProcessGrid((shape[0], 8 // shape[0]))  # rows over "data", columns over the rest
    cases = [  # distributions, and how a and b are laid out for plain JAX's x @ y to lay out the same result
        ((X, R, X), P(names, None), P()),
        ((R, Y, Y), P(), P(None, names)),
        ((X, Y, dm.BlockNonCyclic(rows)), P(names[0], None), P(None, names[1:])),
    ]
    rng = np.random.default_rng(len(shape))
    a_np, b_np, e_np, g_np = (rng.standard_normal(s).astype(np.float32) for s in ((16, 12), (12, 24), (16, 24), (16, 24)))
    with jax.set_mesh(mesh):
        for dists, sa, sb in cases:
            a, b = put(a_np, mesh, sa), put(b_np, mesh, sb)
            e = jax.jit(lambda x, y: x @ y)(a, b) * 0 + put(e_np, mesh, P())  # e: typed as JAX types a @ b
            f = lambda x, y, z: dm.matmul(x, y, distribution=dists) + z  # noqa: E731
            for d in (f(a, b, e), jax.jit(f)(a, b, e)):
                assert jax.typeof(d).sharding.spec == jax.typeof(e).sharding.spec, (dists, jax.typeof(d), jax.typeof(e))
                assert d.sharding == e.sharding, (dists, d.sharding, e.sharding)
                assert_close(np.asarray(d), reference(a_np, b_np) + e_np, "float32")
            g = put(g_np, mesh, P()) + 0 * e
            loss = lambda x, y: jnp.sum(dm.matmul(x, y, distribution=dists) * g)  # noqa: E731
            ga = jax.jit(jax.grad(loss))(a, b)
            assert jax.typeof(ga).sharding.spec == jax.typeof(a).sharding.spec, (jax.typeof(ga), jax.typeof(a))
            assert_close(np.asarray(ga), g_np.astype(np.float64) @ b_np.T.astype(np.float64), "float32")


@pytest.mark.parametrize("shape, types", [((8, 1), "AE"), ((1, 8), "EA")])
def test_a_scan_on_a_mesh_whose_only_explicit_axis_has_size_1(shape, types):
    """A mesh of Auto axes and one Explicit axis of size 1: JAX types an array laid
    out over every axis along that Explicit axis (float32[16@model, 12]), and so
    must a product's result be, or a jax.lax.scan over layers refuses its carry
    ("carry input and carry output must have equal types"; the result was typed
    unsplit, on dmatmul's own mesh). Values and gradients (jit of grad) against numpy."""
    kinds = {"A": AxisType.Auto, "E": AxisType.Explicit}
    mesh = jax.make_mesh(shape, AXES, axis_types=tuple(kinds[t] for t in types))
    rng = np.random.default_rng(8)
    x_np, w_np = rng.standard_normal((16, 12)).astype(np.float32), rng.standard_normal((2, 12, 12)).astype(np.float32)
    x, ws = put(x_np, mesh, P(AXES, None)), put(w_np / 4, mesh, P())

    def layers(c, ws):
        def layer(c, w):
            d = dm.matmul(c, w, distribution=(X, R, X))
            assert jax.typeof(d).sharding.spec == jax.typeof(c @ w).sharding.spec, (jax.typeof(d), jax.typeof(c @ w))
            return jnp.tanh(d), None

        return jax.lax.scan(layer, c, ws)[0]

    want = x_np.astype(np.float64)
    for w in w_np / 4:
        want = np.tanh(want @ w)
    with jax.set_mesh(mesh):
        assert_close(np.asarray(jax.jit(layers)(x, ws)), want, "float32")
        g = jax.jit(jax.grad(lambda c: jnp.sum(layers(c, ws))))(x)
    h1 = np.tanh(x_np.astype(np.float64) @ (w_np[0] / 4))
    g1 = ((1 - want**2) @ (w_np[1] / 4).T) * (1 - h1**2)  # d sum(tanh(tanh(x W0) W1)) / dx
    assert_close(np.asarray(g), g1 @ (w_np[0] / 4).T, "float32")


@pytest.mark.parametrize("dist_d, spec", [(X, P(AXES, None)), (dm.BlockNonCyclic(GRID_ROW), P("data", "model")), (None, None)])
def test_inside_explicit_axes_and_auto_axes(dist_d, spec):
    """dm.matmul inside jax.sharding.explicit_axes on an Auto mesh (and auto_axes
    on an Explicit one), under jax.jit and jax.set_mesh: the product is typed on
    the axis types of that scope, as jnp's is there. Before, inside explicit_axes
    dmatmul took the Auto axes of the set_mesh mesh and constrained its result
    with with_sharding_constraint, which JAX refuses on Explicit axes ("acts as
    an assert")."""
    dists = None if dist_d is None else (X, R, dist_d)
    want = 2 * reference(A, B)
    seen = []

    for kind, scope in (("auto", jax.sharding.explicit_axes), ("explicit", jax.sharding.auto_axes)):
        def f(u, v):
            d = dm.matmul(u, v, distribution=dists)
            seen.append(jax.typeof(d).sharding.spec)
            # on Explicit axes x + y needs equal types (jnp's u @ v is P(AXES, None)), as for any value
            return (jax.sharding.reshard(d, P(AXES, None)) if kind == "auto" else d) + u @ v

        mesh = mesh_of(kind)
        with jax.set_mesh(mesh):
            a, b = put(A, mesh, P(AXES, None)), put(B, mesh, P())
            if scope is jax.sharding.explicit_axes:
                g = scope(f, in_sharding=(P(AXES, None), P()))
            else:
                g = scope(f, out_sharding=P("data", None))
            d = jax.jit(g)(a, b)
        assert d.sharding.mesh == mesh, d.sharding
        assert_close(np.asarray(d), want, "float32")
        if scope is jax.sharding.explicit_axes and spec is not None:
            assert seen[-1] == spec, (seen[-1], spec)


@pytest.mark.parametrize("kind", ["explicit", "auto"])
@pytest.mark.parametrize("m, k", [(16, 0), (0, 12)])
def test_an_empty_product_comes_back_on_the_users_mesh(kind, m, k):
    """K = 0 (beta*C) or M = 0: no product runs, yet the result lands where one
    would: on the user's mesh with the sharding its distribution implies."""
    mesh = mesh_of(kind)
    a = put(np.ones((m, k), np.float32), mesh, P(AXES, None) if m else P())
    b = put(np.ones((k, 24), np.float32), mesh, P(None, AXES) if k else P())
    c = put(C[:m], mesh, P(AXES, None) if m else P())
    want = NamedSharding(mesh, P(AXES, None) if m else P())  # no rows: nothing to split
    for call in (dm.matmul, jax.jit(dm.matmul, static_argnames=("beta", "distribution"))):
        d = call(a, b, c, beta=2.0, distribution=(X, Y, X))
        assert d.shape == (m, 24) and d.sharding.mesh == mesh and d.sharding.is_equivalent_to(want, 2), d.sharding
        np.testing.assert_allclose(np.asarray(d), 2 * C[:m], rtol=1e-6)
    d = dm.matmul(jnp.ones((m, k), np.float32), jnp.ones((k, 24), np.float32), distribution=(X, Y, X), devices=8)
    assert d.sharding.device_set == set(jax.devices()[:8]), d.sharding
    assert d.sharding.spec == (P("x", None) if m else P()), d.sharding


@pytest.mark.parametrize("kind", ["explicit", "auto"])
@pytest.mark.parametrize("spec", [P(AXES, None), P(None, AXES), P()])
def test_an_empty_product_with_no_distribution_is_laid_out_as_c(kind, spec):
    """K = 0 and distribution=None: c is read, so its sharding says the
    result's layout, as for a product with elements (before, the empty one
    came back replicated whatever c's sharding)."""
    mesh = mesh_of(kind)
    c = put(C, mesh, spec)
    for k in (12, 0):
        a, b = put(A[:, :k], mesh, P(AXES, None)), put(B[:k], mesh, P())
        d = dm.matmul(a, b, c, beta=2.0)
        assert d.sharding.is_equivalent_to(NamedSharding(mesh, spec), 2), (k, d.sharding)
        assert_close(np.asarray(d), reference(A[:, :k], B[:k], C, beta=2.0), "float32")


# --------------------------------------------------------------------------- #
# constants inside the user's trace, and eager transformations
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("kind", ["explicit", "auto", "explicit-auto"])
@pytest.mark.parametrize("order", ["natural", "reversed"])
@pytest.mark.parametrize("context", [False, True])
def test_constants_inside_the_users_jit(kind, order, context):
    """dm.matmul (and a Matmul planned outside) called inside jax.jit on
    closed-over operands: the trace's constants. The product is staged into the
    trace (jax.set_mesh, which dmatmul uses outside a trace, is refused there),
    and the result comes back on the operands' mesh; numpy constants give a
    value of the trace, as jnp.dot's do."""
    mesh = _user_mesh(kind, order)
    dists = (X, R, dm.BlockNonCyclic(GRID_ROW))
    a, b = put(A, mesh, P(AXES, None)), put(B, mesh, P())
    want = reference(A, B)
    with jax.set_mesh(mesh) if context else contextlib.nullcontext():
        d = jax.jit(lambda: dm.matmul(a, b, distribution=dists))()
        assert isinstance(d.sharding, NamedSharding) and d.sharding.mesh == mesh, d.sharding
        assert_close(np.asarray(d), want, "float32")
        with dm.Matmul(a, b, distribution=dists) as mm:
            eager = mm.execute()
            inside = jax.jit(mm.execute)()
            assert inside.sharding.mesh == mesh and eager.sharding == inside.sharding, (eager.sharding, inside.sharding)
            assert_close(np.asarray(inside), want, "float32")
        d = jax.jit(lambda s: s * dm.matmul(A, B, distribution=(X, Y, X)))(jnp.float32(2))
        assert_close(np.asarray(d), 2 * want, "float32")


@pytest.mark.parametrize("kind", ["explicit-auto", "auto-explicit"])
@pytest.mark.parametrize("dist_d, spec", [(X, P(AXES, None)), (Y, P(None, AXES)),
                                          (dm.BlockNonCyclic(GRID_ROW), P("data", "model"))])
def test_inside_jit_on_a_mesh_of_both_kinds_the_result_is_laid_out_as_jax_lays_out_its_type(kind, dist_d, spec):
    """On a mesh of both Explicit and Auto axes a jitted result's type names
    the Explicit axes only, and JAX lays it out so: dm.matmul's result lies as
    ``jax.jit(lambda x: x * 2)`` leaves an input laid out as its distribution
    (split over "model" alone, in halves, where "data" is Auto and first)."""
    mesh = _user_mesh(kind, "reversed")
    a, b = put(A, mesh, P(AXES, None)), put(B, mesh, P())
    d = jax.jit(lambda x, y: dm.matmul(x, y, distribution=(X, R, dist_d)))(a, b)
    same = jax.jit(lambda x: x * 2)(put(reference(A, B).astype(np.float32), mesh, spec))
    assert d.sharding.is_equivalent_to(same.sharding, 2), (d.sharding, same.sharding)
    assert_close(np.asarray(d), reference(A, B), "float32")


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_derivatives_inside_jit_of_closed_over_operands(kind):
    """Found by the differential matrix: jax.vjp and jax.jvp around dm.matmul
    inside the user's jit, of operands the jit closes over (constants of the
    trace, on the user's mesh). Their tangents hide the arrays, and the trace
    names no devices: dmatmul took the mesh from their types (abstract), and
    XLA compiled the product for one device ("No registered implementation
    for untyped custom call to xla.sdy.GlobalToLocalShape for Host"; on
    Explicit axes JAX's "Please enter your jit into a mesh context"). The
    concrete arrays behind the tangents now name the mesh."""
    mesh = mesh_of(kind)
    a, b = put(A, mesh, P(AXES, None)), put(B, mesh, P())
    dists = (X, R, dm.BlockNonCyclic(GRID_ROW))
    f = lambda x, y: dm.matmul(x, y, distribution=dists)  # noqa: E731
    g = RNG.standard_normal((16, 24)).astype(np.float32)
    gd = put(g, mesh, P("data", "model"))  # as the result is (a user's cotangent comes from its consumer)
    d, (ga, gb) = jax.jit(lambda: (lambda out, pull: (out, pull(gd)))(*jax.vjp(f, a, b)))()
    assert d.sharding.mesh == mesh and ga.sharding.mesh == mesh, (d.sharding, ga.sharding)
    assert_close(np.asarray(d), reference(A, B), "float32")
    assert_close(np.asarray(ga), g.astype(np.float64) @ B.T.astype(np.float64), "float32")
    assert_close(np.asarray(gb), A.T.astype(np.float64) @ g.astype(np.float64), "float32")
    ta, tb = put(2 * A, mesh, P(AXES, None)), put(-B, mesh, P())
    d, t = jax.jit(lambda: jax.jvp(f, (a, b), (ta, tb)))()
    assert_close(np.asarray(t), reference(2 * A, B) + reference(A, -B), "float32")


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_eager_jvp_of_an_empty_product_on_the_users_mesh(kind):
    """K = 0: the result (zeros) depends on a and b all the same, so that its
    tangent is a zero dmatmul places on the user's mesh, not one JAX makes
    from a type alone (which it cannot on Explicit axes outside set_mesh)."""
    mesh = mesh_of(kind)
    a, b = put(np.ones((16, 0), np.float32), mesh, P()), put(np.ones((0, 24), np.float32), mesh, P())
    d, t = jax.jvp(lambda x, y: dm.matmul(x, y, distribution=(R, R, dm.BlockNonCyclic(GRID_ROW))), (a, b), (a, b))
    for x in (d, t):
        assert x.sharding == NamedSharding(mesh, P("data", "model")) and not np.asarray(x).any(), x.sharding


@pytest.mark.parametrize("kind", ["explicit", "auto"])
@pytest.mark.parametrize("k", [12, 0])
def test_eager_vjp_of_a_c_that_beta_0_leaves_unread(kind, k):
    """C given with beta = 0 is not read (NaN there stays out of the result),
    yet under eager vjp its cotangent is a zero of its own placement, as for
    jnp's ``0 * c``: not one JAX makes from a type alone, which it cannot on
    Explicit axes outside set_mesh (it raised about lowering platforms)."""
    mesh = mesh_of(kind)
    a_np, b_np = A[:, :k], B[:k]
    a, b = put(a_np, mesh, P(AXES, None)), put(b_np, mesh, P())
    c = put(np.full((16, 24), np.nan, np.float32), mesh, P(None, AXES))
    d, pull = jax.vjp(lambda x, y, z: dm.matmul(x, y, z, alpha=2.0, beta=0.0), a, b, c)
    g_np = RNG.standard_normal((16, 24)).astype(np.float32)
    ga, gb, gc = pull(jax.device_put(g_np, d.sharding))  # a cotangent laid out as the result
    assert_close(np.asarray(d), 2 * reference(a_np, b_np), "float32")
    if k:
        assert_close(np.asarray(ga), 2 * reference(g_np, b_np.T), "float32")
        assert_close(np.asarray(gb), 2 * reference(a_np.T, g_np), "float32")
    else:  # (JAX lays zero-size sharded arrays out with whole-shape shards, which it then cannot read)
        assert (ga.shape, gb.shape) == (a.shape, b.shape)
    assert gc.shape == c.shape and not np.asarray(gc).any()


def test_eager_transformations_of_operands_committed_to_one_device():
    """Eager jax.grad around dm.matmul: operands committed to one device (the
    traced value's and the constant's) move onto the plan's devices; gradients
    of constants-only products too."""
    dev = jax.devices()[3]
    a, b = jax.device_put(A, dev), jax.device_put(B, dev)
    g = jax.grad(lambda x: jnp.sum(dm.matmul(x, b, distribution=(X, Y, X)) ** 2))(a)
    assert_close(np.asarray(g), 2 * reference(A, B) @ B.T.astype(np.float64), "float32")
    g = jax.grad(lambda s: jnp.sum(s * dm.matmul(A, B)))(1.0)
    assert_close(np.asarray(g), reference(A, B).sum(), "float32")


@pytest.mark.parametrize("kind", ["explicit", "auto"])
@pytest.mark.parametrize("axis_names", [None, {"model"}])
def test_inside_shard_map_points_to_the_building_blocks(kind, axis_names):
    """Inside jax.shard_map the operands are blocks, not global matrices:
    dm.matmul says so and names dmatmul.jax's building blocks (JAX's own
    AssertionError escaped before)."""
    mesh = mesh_of(kind)
    rows = P(AXES, None) if axis_names is None else P("model", None)
    a, b = put(A, mesh, rows), put(B, mesh, P())
    kw = {} if axis_names is None else {"axis_names": axis_names}
    f = jax.shard_map(lambda x, y: dm.matmul(x, y), mesh=mesh, in_specs=(rows, P()), out_specs=rows, **kw)
    with jax.set_mesh(mesh), pytest.raises(ValueError, match=r"inside jax.shard_map .*dmatmul.jax.allgather_matmul"):
        jax.jit(f)(a, b)


# --------------------------------------------------------------------------- #
# no mesh of the user's: the result is sharded as its distribution says
# --------------------------------------------------------------------------- #
_G22, _G22C, _G41 = dm.ProcessGrid((2, 2)), dm.ProcessGrid((2, 2), layout="col"), dm.ProcessGrid((4, 1))


@pytest.mark.parametrize("dists, mnk, tb", [
    ((X, Y, X), (8, 61, 9), False),  # N uneven and split by b: the result's unsplit N was padded
    ((X, Y, Y), (61, 8, 9), False),
    ((X, X, X), (16, 5, 8), True),
    ((dm.BlockNonCyclic(_G22), dm.BlockNonCyclic(_G22), dm.BlockNonCyclic(_G41)), (8, 8, 8), False),  # another grid
    ((dm.BlockNonCyclic(_G22), dm.BlockNonCyclic(_G22), dm.BlockNonCyclic(_G22C)), (8, 12, 6), False),
    # a and b on a grid of another shape (split as slabs): inside jit the result kept their layout
    ((dm.BlockNonCyclic(_G41), dm.BlockNonCyclic(_G41), dm.BlockNonCyclic(_G22C)), (8, 12, 6), False),
    ((X, Y, X), (8, 12, 0), False),  # K = 0: the empty product's placement
])
@pytest.mark.parametrize("jit", [False, True])
def test_results_are_sharded_as_their_distribution_says(dists, mnk, tb, jit):
    """devices=4, jax.Arrays not on a mesh: every rank's device holds exactly its
    block of the result (dist.global_indices, against numpy), eagerly and
    inside jit; before, these came back replicated, and inside jit a result on
    a grid of another order or shape than a's and b's kept their layout."""
    m, n, k = mnk
    rng = np.random.default_rng(m + n + k)
    a_np = rng.standard_normal((m, k)).astype(np.float32)
    b_np = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    f = lambda x, y: dm.matmul(x, y, distribution=dists, transpose_b=tb, devices=4)  # noqa: E731
    d = (jax.jit(f) if jit else f)(jnp.asarray(a_np), jnp.asarray(b_np))
    want = reference(a_np, b_np, transpose_b=tb)
    assert_close(np.asarray(d), want, "float32")
    devices = jax.devices()[:4]
    shards = {s.device: s for s in d.addressable_shards}
    assert set(shards) == set(devices), d.sharding
    for r, dev in enumerate(devices):
        rows, cols = dists[2].global_indices(r, (m, n), 4)
        assert shards[dev].data.shape == (len(rows), len(cols)), (r, d.sharding)
        assert_close(np.asarray(shards[dev].data), want[np.ix_(rows, cols)], "float32")


def _grids(p: int) -> list[dm.ProcessGrid]:
    return [dm.ProcessGrid((r, p // r), layout=o) for r in range(1, p + 1) if p % r == 0 for o in ("row", "col")]


def _dists(p: int) -> list:
    """Every kind of distribution over ``p`` ranks: slabs, replicated, a
    BlockNonCyclic on every grid of either order, block-cyclic on the 2-D ones."""
    out = [X, Y, R] + [dm.BlockNonCyclic(g) for g in _grids(p)]
    return out + [dm.BlockCyclic(g, (2, 3)) for g in _grids(p) if 1 not in g.shape]


def _on_trace_mesh(dist, shape, p: int) -> bool:
    """Whether inside a jit with no mesh of the user's a result laid out as
    ``dist`` keeps its blocks (docs/jax.md): even blocks in rank order, and a grid
    whose leading side (its rows in row order, its columns in column order) is
    a product of P's smallest prime factors. Else it comes back replicated."""
    if isinstance(dist, dm.Replicated):
        return True
    grid = dist.grid if dist.grid is not None else dm.ProcessGrid((p, 1) if dist == X else (1, p))
    rows, cols = grid.shape
    if shape[0] % rows or shape[1] % cols:
        return False
    for r in range(p):  # block-cyclic: one block per process, its whole share
        i, j = grid.coords(r)
        got = dist.global_indices(r, shape, p)
        want = (np.arange(i * shape[0] // rows, (i + 1) * shape[0] // rows),
                np.arange(j * shape[1] // cols, (j + 1) * shape[1] // cols))
        if not all(np.array_equal(g, w) for g, w in zip(got, want)):
            return False
    factors, n = [], p
    for f in range(2, p + 1):
        while n % f == 0:
            factors.append(f)
            n //= f
    lead = rows if grid.layout == "row" else cols
    return lead in {int(np.prod(factors[:i])) for i in range(len(factors) + 1)}


def _chains(p: int, count: int, seed: int):
    rng = np.random.default_rng(seed)
    dists = _dists(p)
    sizes = [p, 2 * p, 7, 13, 3 * p + 1]
    for _ in range(count):
        m, k, n, n2 = (int(rng.choice(sizes)) for _ in range(4))
        first = tuple(dists[i] for i in rng.integers(len(dists), size=3))
        second = tuple(dists[i] for i in rng.integers(len(dists), size=3))
        yield (m, k, n, n2), first, second


CHAINS = 300 if os.environ.get("DMATMUL_LONG", "") not in ("", "0") else 8


@pytest.mark.parametrize("p", [4, 6, 8])
def test_products_chained_in_one_jit(p):
    """Two products inside one jax.jit on arrays of no mesh (a, b and each
    result drawn apart from every distribution over P ranks; even, uneven and
    prime sizes). Before, 17 of the 49 pairs of 4-rank layouts failed: products
    on grids of two orders listed their devices in two orders ("incompatible
    devices"), and an output on a grid was named by the first product's 1-D
    mesh (IndivisibleError). Both results are checked against numpy, and each
    device holds its block of each where the trace's mesh says it, else the
    whole result."""
    devices = jax.devices()[:p]
    rng = np.random.default_rng(p)
    for (m, k, n, n2), first, second in _chains(p, CHAINS, seed=p):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        z = rng.standard_normal((n, n2)).astype(np.float32)

        def f(x, y, w):
            t = dm.matmul(x, y, distribution=first, devices=p)
            return t, dm.matmul(t, w, distribution=second, devices=p)

        got = jax.jit(f)(jnp.asarray(a), jnp.asarray(b), jnp.asarray(z))
        t_want = reference(a, b)
        for d, want, dist in zip(got, (t_want, reference(np.asarray(got[0]), z)), (first[2], second[2])):
            assert_close(np.asarray(d), want, "float32")
            shards = {s.device: np.asarray(s.data) for s in d.addressable_shards}
            assert set(shards) == set(devices), (first, second, d.sharding)
            kept = _on_trace_mesh(dist, want.shape, p)
            for r, dev in enumerate(devices):
                rows, cols = dist.global_indices(r, want.shape, p) if kept else (range(want.shape[0]), range(want.shape[1]))
                assert shards[dev].shape == (len(rows), len(cols)), (first, second, dist, d.sharding)


@pytest.mark.parametrize("context", ["none", "set_mesh"])
def test_a_matmul_of_numpy_operands_run_first_inside_jit_then_eagerly(context):
    """A Matmul planned inside jax.jit (on constants: numpy operands) and then
    executed outside it returns numpy, as numpy in gives numpy out (under
    jax.set_mesh it returned a jax.Array before; without a mesh too, once
    products inside jit were typed on dmatmul's trace mesh)."""
    mesh = jax.make_mesh((4,), ("a",), axis_types=(AxisType.Auto,), devices=jax.devices()[:4])
    with jax.set_mesh(mesh) if context == "set_mesh" else contextlib.nullcontext():
        with dm.Matmul(A, B, devices=None if context == "set_mesh" else 4) as mm:
            inside = jax.jit(lambda: mm.execute())()
            outside = mm.execute()
    assert isinstance(inside, jax.Array) and type(outside) is np.ndarray
    for d in (inside, outside):
        assert_close(np.asarray(d), reference(A, B), "float32")


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_devices_given_under_set_mesh_inside_transformations(kind):
    """devices= naming the jax.set_mesh mesh's devices (in mesh order) inside
    jit, jvp, grad and vmap runs on that mesh, as without devices= (JAX's
    'acts as an assert' or 'context mesh should match' errors before); other
    devices raise a ValueError naming devices= and the context mesh."""
    types = (AxisType.Explicit,) if kind == "explicit" else (AxisType.Auto,)
    mesh = jax.make_mesh((4,), ("a",), axis_types=types, devices=jax.devices()[:4])
    a, b = A[:, :6], B[:6, :8]
    f = lambda x: dm.matmul(x, jnp.asarray(b), distribution=(X, R, X), devices=4)  # noqa: E731
    with jax.set_mesh(mesh):
        x = jnp.asarray(a)
        assert_close(np.asarray(jax.jit(f)(x)), reference(a, b), "float32")
        assert_close(np.asarray(jax.jvp(f, (x,), (x,))[1]), reference(a, b), "float32")
        assert_close(np.asarray(jax.vmap(f)(jnp.stack([x, 2 * x]))[1]), reference(2 * a, b), "float32")
        want = np.ones((16, 8)) @ b.T.astype(np.float64)
        for grad in (jax.grad(lambda x: f(x).sum()), jax.jit(jax.grad(lambda x: f(x).sum()))):
            assert_close(np.asarray(grad(x)), want, "float32")
        with pytest.raises(ValueError, match=r"devices=8 .* under jax.set_mesh, whose mesh \{'a': 4\}"):
            jax.jit(lambda x: dm.matmul(x, jnp.asarray(b), devices=8))(x)


@pytest.mark.parametrize("k", [0, 6])
def test_a_sharding_that_leaves_an_axis_independent_is_a_product_empty_or_not(k):
    """distribution=None reads the layouts off the operands' shardings: a's K
    over "data", b replicated leaves "model" independent (each of its groups
    computes the same product), also where K = 0 (an empty product, never
    planned on the backend): the result as jnp.matmul shards it, replicated."""
    mesh6 = jax.make_mesh((3, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=jax.devices()[:6])
    a_np, b_np = RNG.standard_normal((k, 21)).astype(np.float32), RNG.standard_normal((25, k)).astype(np.float32)
    a = jax.device_put(a_np, NamedSharding(mesh6, P("data", None)))
    b = jax.device_put(b_np, NamedSharding(mesh6, P()))
    d = dm.matmul(a, b, transpose_a=True, transpose_b=True)
    assert_close(np.asarray(d), a_np.T @ b_np.T, "float32")
    assert d.sharding.is_equivalent_to(NamedSharding(mesh6, P()), 2), d.sharding


def _holds_blocks(d, dist, devices, shape):
    """Each rank's device holds exactly its block of ``d`` (``dist.global_indices``)."""
    shards = {s.device: s for s in d.addressable_shards}
    assert set(shards) == set(devices), d.sharding
    for r, dev in enumerate(devices):
        rows, cols = dist.global_indices(r, shape, len(devices))
        got = (np.arange(shape[0])[shards[dev].index[0]], np.arange(shape[1])[shards[dev].index[1]])
        assert np.array_equal(got[0], rows) and np.array_equal(got[1], cols), (r, dist, d.sharding)


@pytest.mark.parametrize("where", ["no mesh", "explicit", "auto"])
def test_redistribute_inside_jit_between_products(where):
    """dm.redistribute inside jax.jit, between two dm.matmul calls, and under
    jax.grad: before, it read ``x.sharding`` of the tracer (AttributeError).
    Inside jit it lays the matrix out on the mesh the products run on (the
    user's, devices in any order, or dmatmul's one mesh of the trace), and an
    array on a user's mesh also comes back on that mesh eagerly (before: on
    dmatmul's own mesh over all 8 devices, which a jit with the user's other
    arrays refuses). Values against numpy, blocks against global_indices."""
    g22 = dm.BlockNonCyclic(dm.ProcessGrid((2, 2)))
    rng = np.random.default_rng(11)
    a_np, b_np, w_np = (rng.standard_normal(s).astype(np.float32) for s in ((8, 6), (6, 4), (4, 5)))
    if where == "no mesh":
        devices, kw, mesh = jax.devices()[:4], {"devices": 4}, None
        a, b, w = jnp.asarray(a_np), jnp.asarray(b_np), jnp.asarray(w_np)
    else:
        devices = [jax.devices()[i] for i in (5, 2, 7, 0)]
        types = (AxisType.Explicit if where == "explicit" else AxisType.Auto,) * 2
        mesh = jax.make_mesh((2, 2), AXES, axis_types=types, devices=devices)
        devices, kw = list(mesh.devices.flat), {}
        a, b, w = put(a_np, mesh, P(AXES, None)), put(b_np, mesh, P()), put(w_np, mesh, P())

    def f(x, y, z):
        t = dm.matmul(x, y, distribution=(X, R, X), **kw)
        u = dm.redistribute(t, X, g22, **kw)
        return u, dm.matmul(u, z, distribution=(g22, R, Y), **kw)

    u, d = jax.jit(f)(a, b, w)
    t_want = reference(a_np, b_np)
    assert_close(np.asarray(u), t_want, "float32")
    assert_close(np.asarray(d), reference(t_want.astype(np.float32), w_np), "float32")
    _holds_blocks(u, g22, devices, (8, 4))
    if mesh is not None:
        assert u.sharding.mesh == mesh, u.sharding
        eager = dm.redistribute(a, X, g22)
        assert eager.sharding.mesh == mesh, eager.sharding
        _holds_blocks(eager, g22, devices, (8, 6))
        assert_close(np.asarray(eager), a_np, "float32")
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        ga = jax.jit(jax.grad(lambda x: jnp.sum(f(x, b, w)[1])))(a)
    assert_close(np.asarray(ga), np.ones((8, 5)) @ w_np.T.astype(np.float64) @ b_np.T.astype(np.float64), "float32")


@pytest.mark.parametrize("dists", [(X, X, Y), (dm.BlockCyclic(dm.ProcessGrid((2, 2)), (1, 2)), Y,
                                             dm.BlockNonCyclic(dm.ProcessGrid((2, 2), layout="col")))])
def test_jit_of_the_pullback_of_an_eager_vjp(dists):
    """jax.jit(pull) of an eager jax.vjp on uncommitted arrays (jnp.asarray's):
    before, the pullback put each cotangent back on the operand's one device
    (the transpose of dmatmul's device_put), and jit of it met the product's
    four devices and that one: 'Received incompatible devices for jitted
    computation'. Gradients against numpy, eagerly and jitted."""
    rng = np.random.default_rng(5)
    a_np, b_np, c_np, g = (rng.standard_normal(s).astype(np.float32) for s in ((8, 6), (6, 4), (8, 4), (8, 4)))
    out, pull = jax.vjp(lambda x, y, z: dm.matmul(x, y, z, beta=0.5, distribution=dists, devices=4),
                        jnp.asarray(a_np), jnp.asarray(b_np), jnp.asarray(c_np))
    assert_close(np.asarray(out), reference(a_np, b_np, c_np, beta=0.5), "float32")
    g64 = g.astype(np.float64)
    for grads in (pull(jnp.asarray(g)), jax.jit(pull)(jnp.asarray(g))):
        ga, gb, gc = (np.asarray(x) for x in grads)
        assert_close(ga, g64 @ b_np.T.astype(np.float64), "float32")
        assert_close(gb, a_np.T.astype(np.float64) @ g64, "float32")
        assert_close(gc, 0.5 * g64, "float32")


def test_readme_your_mesh_sections_run():
    """docs/jax.md "Your mesh in, your mesh out": its first block (on the tour's a and b)
    gives the sharding its comment names; the jitted ``layer`` reads Slab.X and
    Replicated() off the types, with or without ``jax.set_mesh``. Against numpy."""
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "jax.md").read_text()
    section = readme.split("## Your mesh in, your mesh out", 1)[1].split("\n## ", 1)[0]
    first, layer_block = re.findall(r"```python\n(.*?)```", section, re.S)
    rng = np.random.default_rng(0)
    a_np, b_np = rng.standard_normal((64, 24)).astype(np.float32), rng.standard_normal((24, 32)).astype(np.float32)
    ns = {"jax": jax, "dm": dm, "NamedSharding": NamedSharding, "P": P, "a": a_np, "b": b_np}
    exec(compile(first, "docs/jax.md", "exec"), ns)
    (said,) = re.findall(r"^d\.sharding +# (.*)$", first, re.M)
    assert ns["d"].sharding == eval(said, ns)
    assert_close(np.asarray(ns["d"]), reference(a_np, b_np), "float32")
    exec(compile(layer_block, "docs/jax.md", "exec"), ns)
    mesh = ns["mesh"]
    x, w = put(a_np, mesh, P(AXES, None)), put(b_np, mesh, P())
    for context in (contextlib.nullcontext(), jax.set_mesh(mesh)):
        with context:
            out = ns["layer"](x, w)
        assert out.sharding.spec == P(AXES, None)
        assert_close(np.asarray(out), np.maximum(reference(a_np, b_np), 0), "float32")


@pytest.mark.parametrize("kind", ["explicit", "auto"])
@pytest.mark.parametrize("context", [False, True])
def test_a_mesh_of_one_device_is_the_users_mesh_too(kind, context):
    """Operands on a mesh of one device (not device 0), or under jax.set_mesh of
    it: the product runs there and the result comes back there, eagerly,
    inside jit and under grad. Before,
    a one-device mesh was taken for no mesh: eagerly the result was spread
    over all 8 devices (which the user's jit with that mesh's arrays refused),
    and inside jit JAX raised 'incompatible devices'."""
    dev = jax.devices()[5]
    types = (AxisType.Explicit,) if kind == "explicit" else (AxisType.Auto,)
    mesh = jax.make_mesh((1,), ("x",), axis_types=types, devices=[dev])
    a, b, e = put(A, mesh, P()), put(B, mesh, P("x", None)), put(C, mesh, P())
    f = lambda x, y: dm.matmul(x, y, distribution=(X, R, X))  # noqa: E731
    with jax.set_mesh(mesh) if context else contextlib.nullcontext():
        for d in (f(a, b), jax.jit(f)(a, b), dm.matmul(a, b)):
            assert d.sharding.device_set == {dev}, d.sharding
            assert_close(np.asarray(d), reference(A, B), "float32")
        assert_close(np.asarray(jax.jit(lambda x, z: x + z)(f(a, b), e)), reference(A, B) + C, "float32")
        if context:  # numpy operands inside jit under the mesh: on its device (JAX refused 8 devices there)
            d = jax.jit(f)(A, B)
            assert d.sharding.device_set == {dev}, d.sharding
            assert_close(np.asarray(d), reference(A, B), "float32")
        ga = jax.jit(jax.grad(lambda x: jnp.sum(f(x, b) * e)))(a)
    assert ga.sharding.device_set == {dev}, ga.sharding
    assert_close(np.asarray(ga), C.astype(np.float64) @ B.T.astype(np.float64), "float32")


@pytest.mark.parametrize("call", ["eager", "jit"])
def test_vmap_over_a_batch_split_over_an_explicit_axis_is_refused_naming_the_operand(call):
    """jax.vmap over a batch axis split over an Explicit mesh axis: JAX takes that
    axis out of the body's mesh, where dmatmul lays each matrix of the batch
    over the whole mesh. Refused naming the operand, the axis and the fix (JAX's
    KeyError: 'data' escaped before); the fix, the batch axis unsplit, runs."""
    mesh = mesh_of("explicit")
    batch = np.stack([A, 2 * A])
    run = (lambda f: f) if call == "eager" else jax.jit
    with jax.set_mesh(mesh):
        a, b = put(batch, mesh, P("data", None, None)), put(B, mesh, P())
        f = jax.vmap(lambda x: dm.matmul(x, b, distribution=(X, R, X)))
        with pytest.raises(ValueError, match=r"^a: dm.matmul was called inside jax.vmap over a batch axis split "
                                             r"over Explicit mesh axis 'data'.*jax.sharding.reshard"):
            run(f)(a)
        with pytest.raises(ValueError, match=r"^a: dm.matmul was called inside jax.vmap"):  # a's primal, under grad
            run(jax.vmap(jax.grad(lambda x: jnp.sum(dm.matmul(x, b, distribution=(X, R, X))))))(a)
        d = run(f)(jax.sharding.reshard(a, P(None, None, None)))
    for i in range(2):
        assert_close(np.asarray(d[i]), reference((i + 1) * A, B), "float32")


@pytest.mark.parametrize("kind", ["explicit", "auto"])
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_an_empty_result_from_a_split_c_comes_back_on_the_mesh(kind, alpha):
    """N = 0 (or alpha = 0: A and B not read) with c split over the mesh: the empty
    result is placed on the mesh. (Moving the zero-size epilog(beta*C), split as C is,
    made JAX read it as whole on each device: on Explicit axes 'could not broadcast
    input array from shape (26,0) into shape (13,0)'; found by the differential
    matrix, batched.)"""
    mesh = jax.make_mesh((2,), ("data",), axis_types=(AxisType.Explicit if kind == "explicit" else AxisType.Auto,))
    a32, b0, c0 = np.ones((26, 10), np.float32), np.ones((0, 10), np.float32), np.ones((26, 0), np.float32)
    a, b, c = put(a32, mesh, P("data", None)), put(b0, mesh, P()), put(c0, mesh, P("data", None))
    a3, c3 = np.stack([a32, a32]), np.stack([c0, c0])  # and batched: each item's C split as C is
    batched = put(a3, mesh, P(None, "data", None)), put(c3, mesh, P(None, "data", None))
    for (x, z), (gx, gz) in (((a, c), (a32, c0)), (batched, (a3, c3))):
        for call in (lambda f: f(), lambda f: jax.jit(f)()):  # eager; a jit of closed-over operands (constants)
            d = call(lambda: dm.matmul(x, b, z, alpha=alpha, beta=2.0, transpose_b=True))
            assert d.shape == gz.shape and d.sharding.mesh == mesh, d.sharding
            assert_close(np.asarray(d), reference(gx, b0, gz, alpha=alpha, beta=2.0, transpose_b=True), "float32")


@pytest.mark.parametrize("algorithm", ["local", "allgather", "summa25d"])
def test_a_named_algorithm_on_an_empty_product_is_judged_as_with_elements(algorithm):
    """distribution=None, a's sharding leaving the mesh axes independent, a named
    algorithm: an empty product (M = 0) runs, or is refused, as the product with
    elements is, on one group of ranks (it refused a's sharding as none of dmatmul's
    distributions; found by the differential matrix)."""
    mesh = mesh_of("explicit")
    b = np.ones((13, 23), np.float32)
    outcomes = []
    for m in (16, 0):
        a = put(np.ones((m, 13), np.float32), mesh, P(("model", "data"), None))
        try:
            d = dm.matmul(a, b, algorithm=algorithm)
        except ValueError as e:
            outcomes.append(str(e).split(":")[0])
        else:
            assert d.sharding.mesh == mesh
            assert_close(np.asarray(d), reference(np.ones((m, 13), np.float32), b), "float32")
            outcomes.append("ran")
    assert outcomes[0] == outcomes[1], outcomes
