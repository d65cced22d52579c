"""dm.matmul on any dm.Sharded (contract 3a): layouts no 2-D distribution
expresses (replicated over some mesh axes, axes out of rank order, uneven
sizes, batch dimensions split), in one process on the 8 simulated devices,
checked against numpy. Under mpiexec: tests/mpi/sharded.py (test_mpi.py)."""

from __future__ import annotations

import numpy as np
import pytest

import dmatmul as dm
from dmatmul._matmul import plan_of

jax = pytest.importorskip("jax")
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

MESH = dm.ProcessMesh((2, 4), ("x", "y"))

# (a, b, result) specs on MESH, a's and b's shapes: 2-D products
PRODUCTS = [
    (("x", None), (None, "y"), (("y", "x"), None), (11, 7), (7, 9)),  # rows over x only: replicated over y
    ((None, None), ("y", "x"), (None, "x"), (6, 9), (9, 13)),  # a replicated, b's axes out of rank order
    ((None, ("y", "x")), ("x", None), ("y", None), (5, 17), (5, 8)),  # transpose_a (a stored (K, M))
    (("y", None), (None, None), (None, ("x", "y")), (16, 8), (8, 24)),  # even: every result NamedSharding
]


def _operands(a, b, family):
    """a and b as the family holds them (jax: float32, JAX's default), and the tolerance."""
    if family == "numpy":
        return a, b, 1e-12
    return jax.numpy.asarray(a, dtype=np.float32), jax.numpy.asarray(b, dtype=np.float32), 2e-5


def _sharded(spec):
    return dm.Sharded(MESH, spec)


def _check_layout(got, dist, shape):
    """A jax.Array result is laid out as its Sharded says where every split is
    even (each device, in its mesh's order, holds the global indices of that
    rank), else replicated, on 8 devices."""
    assert isinstance(got.sharding, NamedSharding) and len(got.sharding.device_set) == 8
    even = all(size % int(np.prod([MESH.shape[MESH.axis_names.index(n)] for n in dist.axes(i)] or [1])) == 0
               for i, size in enumerate(shape))
    if not even:
        assert got.sharding.is_fully_replicated
        return
    ranks = {dev: r for r, dev in enumerate(got.sharding.mesh.devices.flat)}
    for shard in got.addressable_shards:
        want = dist.global_indices(ranks[shard.device], shape)
        held = [np.arange(n)[sl] for sl, n in zip(shard.index, shape)]
        assert all(np.array_equal(h, w) for h, w in zip(held, want)), (shard.device, shard.index)


@pytest.mark.parametrize("family", ["numpy", "jax"])
@pytest.mark.parametrize("case", range(len(PRODUCTS)))
def test_any_sharded_2d_product_matches_numpy(case, family):
    sa, sb, sr, a_shape, b_shape = PRODUCTS[case]
    ta = case == 2
    rng = np.random.default_rng(case)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    want = (a.T if ta else a) @ b
    dists = tuple(map(_sharded, (sa, sb, sr)))
    xa, xb, tol = _operands(a, b, family)
    got = dm.matmul(xa, xb, distribution=dists, transpose_a=ta, devices=8, backend="jax")
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol)
    if family == "jax":
        _check_layout(got, dists[2], want.shape)
    else:
        assert isinstance(got, np.ndarray)


BATCHED = [
    (("x", None, "y"), ("x", None, None), ("x", "y", None), (4, 5, 6), (4, 6, 3)),
    ((("x", "y"), None, None),) * 3 + ((8, 3, 4), (8, 4, 2)),  # the batch split alike: independent products
    ((None, "y", None), (None, None, "x"), ("y", None, None), (3, 9, 5), (3, 5, 7)),
]


@pytest.mark.parametrize("family", ["numpy", "jax"])
@pytest.mark.parametrize("case", range(len(BATCHED)))
def test_batched_shardeds_match_numpy(case, family):
    sa, sb, sr, a_shape, b_shape = BATCHED[case]
    rng = np.random.default_rng(10 + case)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    dists = tuple(map(_sharded, (sa, sb, sr)))
    xa, xb, tol = _operands(a, b, family)
    got = dm.matmul(xa, xb, distribution=dists, devices=8, backend="jax")
    np.testing.assert_allclose(np.asarray(got), a @ b, rtol=tol, atol=tol)
    if family == "jax":
        _check_layout(got, dists[2], (a @ b).shape)


def test_jax_operands_laid_out_as_their_shardeds_and_the_moves_explained():
    """jax.Arrays placed as their Shardeds say, no distribution read off them:
    explain() names each move and its bytes, and the plan's cost counts them."""
    mesh = jax.make_mesh((2, 4), ("x", "y"))
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((16, 8)), rng.standard_normal((8, 12))
    a, b = a.astype(np.float32), b.astype(np.float32)
    ja = jax.device_put(a, NamedSharding(mesh, PartitionSpec("x", None)))
    jb = jax.device_put(b, NamedSharding(mesh, PartitionSpec(None, "y")))
    dists = (_sharded(("x", None)), _sharded((None, "y")), _sharded((("y", "x"), None)))
    with dm.Matmul(ja, jb, distribution=dists, backend="jax") as mm:
        got = mm.execute()
        told = mm.explain()
        cost = plan_of(mm).cost
    np.testing.assert_allclose(np.asarray(got), a @ b, rtol=2e-5, atol=2e-5)
    assert "the plan takes a as Slab.X, b as " in told and "chosen by the cost model" in told, told
    # b: (None, "y") holds a quarter of the columns on each rank; Slab.Y (an eighth of them) or Replicated()
    # (all of them), whichever the model takes, needs columns a rank lacks: the elements it lacks move
    moved = [line for line in told.splitlines() if "B/rank at most (each rank gets only" in line]
    assert moved and any(line.strip().startswith("b ") for line in moved), told
    relays = [m for m in cost.moves if m.collective == "exchange (re-lay)"]
    assert relays and sum(m.nbytes for m in relays) > 0


# a's rows split over y only (replicated over x), b Slab.X (K split), the result Slab.Y: the rule's Slab.X for a
# (its rows split) leaves the 2-D plan to move a again (M split -> K split); taking a as Slab.Y costs a re-lay of
# the rows each rank lacks on its eighth of the columns, then a GEMM+ReduceScatter of the small result
CHOSEN = ((("y", None), dm.Slab.X, dm.Slab.Y), (128, 4096), (4096, 8))


@pytest.mark.parametrize("family", ["numpy", "jax"])
def test_the_relayed_layout_is_the_cost_models_choice(family):
    """An operand of no 2-D form is taken in the layout the model prices lowest
    with its re-lay and the 2-D plan after it (here Slab.Y, where the rule took
    Slab.X): explain() names it, its cost and the runner-up, and the product is
    numpy's."""
    (sa, db, dd), a_shape, b_shape = CHOSEN
    rng = np.random.default_rng(21)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    xa, xb, tol = _operands(a, b, family)
    with dm.Matmul(xa, xb, distribution=(_sharded(sa), db, dd), devices=8, backend="jax") as mm:
        got = mm.execute()
        told = mm.explain()
    np.testing.assert_allclose(np.asarray(got), a @ b, rtol=tol * 10, atol=tol * 10)
    assert "the plan takes a as Slab.Y " in told, told
    assert "chosen by the cost model, the cheapest of 3 candidates" in told, told
    # (the runner-up, Slab.X or Replicated(), is the model's: test_the_layout_chosen_is_the_cheapest_modelled)
    assert "runner-up a as Slab.X" in told or "runner-up a as Replicated()" in told, told
    assert mm.algorithm == "reduce_scatter"


def test_next_to_a_grid_the_choice_is_the_grid_or_replicated():
    """Next to an operand on a 2-D grid, an operand of no 2-D form is taken on
    that grid or replicated, whichever the model prices lower; numpy's product."""
    rng = np.random.default_rng(22)
    a, b = rng.standard_normal((8, 16)), rng.standard_normal((16, 8))
    grid = dm.BlockNonCyclic(dm.ProcessGrid((2, 4)))
    with dm.Matmul(a, b, distribution=(_sharded(("x", None)), grid, dm.Slab.X), devices=8, backend="jax") as mm:
        got = mm.execute()
        told = mm.explain()
    np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12)
    assert "the cheapest of 2 candidates" in told, told
    line = next(x for x in told.splitlines() if x.strip().startswith("a ") and "its re-lay" in x)
    assert "BlockNonCyclic(ProcessGrid((2, 4)" in line and "Replicated()" in line, told


def test_the_layout_chosen_is_the_cheapest_modelled():
    """The choice's ranking is the model's: each candidate's re-lay bytes are
    the busiest rank's (Route) and its total the re-lay plus the planner's
    cheapest 2-D plan on that triple."""
    from dmatmul import _cost, _layouts, _relay_choice, _route
    from dmatmul._problem import Spec

    (sa, db, dd), a_shape, b_shape = CHOSEN
    dists = (_sharded(sa), db, dd)
    spec = Spec.of(a_shape, b_shape, "float32", distribution=dists)
    problem, model = spec.sizes(8, pads=True), _cost.model_for("cpu", 8)
    choice = _relay_choice.choose(spec, 8, problem, model, None)
    layouts = [r[3][0] for r in choice.ranked]
    assert layouts[0] == dm.Slab.Y and sorted(map(repr, layouts)) == ["Replicated()", "Slab.X", "Slab.Y"], layouts
    assert [r[0] for r in choice.ranked] == sorted(r[0] for r in choice.ranked)  # cheapest first
    for total, relays, inner, triple in choice.ranked:
        route = _route.Route.of(dists[0], triple[0], a_shape, 8)
        nbytes = max(route.received(r) for r in range(8)) * 4
        assert relays == _relay_choice.move_time(model, _relay_choice.relay_move("a", nbytes))
        assert inner == _layouts.cheapest(problem, model, triple, transposes=(False, False)).time
        assert total == relays + inner
    assert choice.ranked[0][0] < choice.ranked[1][0] / 1.3  # clearly cheaper, not a tie broken


def test_numpy_operands_in_one_process_move_nothing_between_ranks():
    a, b = np.ones((8, 4)), np.ones((4, 8))
    with dm.Matmul(a, b, distribution=_sharded(("x", None)), devices=8, backend="jax") as mm:
        np.testing.assert_allclose(mm.execute(), a @ b)
        told = mm.explain()
    assert "the global arrays are placed on the devices as the plan takes them: 0 B/rank" in told


@pytest.mark.parametrize("dist, devices, pattern", [
    (dm.Sharded(MESH, ("x", None)), 4,
     r"distribution of a: Sharded\(ProcessMesh\(\(2, 4\).*spans 8 ranks \(its mesh \(2, 4\)\) but there are 4 "
     r"devices in use: use a ProcessMesh of 4 ranks"),
    (dm.Sharded(MESH, ("x", None, None, "y")), 8,
     r"distribution of a: Sharded\(.*\) has 4 spec entries but a has 3 dimensions \(stored shape \(2, 3, 4\)\)"),
    ((dm.Slab.X, dm.Sharded(MESH, ("x", None, None, None)), dm.Slab.X), 8,
     r"distribution of b: Sharded\(.*\) has 4 spec entries but b has 3 dimensions"),
])
def test_sharded_misfits_are_distribution_errors(dist, devices, pattern):
    with pytest.raises(dm.DistributionError, match=pattern):
        dm.matmul(np.ones((2, 3, 4)), np.ones((2, 4, 5)), distribution=dist, devices=devices, backend="jax")


def test_nvmath_takes_a_batched_sharded(fake_nvmath):
    """The nvmath backend (one process: one rank) through the same re-lay."""
    mesh = dm.ProcessMesh((1, 1), ("x", "y"))
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 5, 2))
    d = dm.Sharded(mesh, ("x", None, "y"))
    got = dm.matmul(a, b, distribution=d, backend="nvmath")
    np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("family", ["numpy", "jax"])
@pytest.mark.parametrize("shapes", [((3, 0), (0, 5)), ((0, 4), (4, 5)), ((3, 4), (4, 0))], ids=str)
def test_empty_products_on_a_sharded_with_no_2d_form(shapes, family):
    """An empty product (K, M or N = 0) on a Sharded with no 2-D form is BLAS's
    (zeros where K = 0) of the right shape, as for the 2-D distributions (it
    raised NotImplementedError: the empty product's stand-in had no rank count;
    found by the differential matrix)."""
    (m, k), (_, n) = shapes
    a, b = np.ones((m, k)), np.ones((k, n))
    x, y, _ = _operands(a, b, family)
    dists = (_sharded((None, ("y", "x"))), dm.Slab.X, _sharded(("x", None)))
    d = dm.matmul(x, y, distribution=dists, devices=8)
    np.testing.assert_array_equal(np.asarray(d), a @ b)


def test_a_sharded_result_inside_jit():
    """Inside jax.jit a result asked as a Sharded of no 2-D form is the product
    (XLA places it: a traced value has no sharding to re-lay; it raised
    AttributeError; found by the differential matrix)."""
    a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    x, y, tol = _operands(a, b, "jax")
    dists = (dm.Slab.X, dm.Slab.X, _sharded((None, ("y", "x"))))
    d = jax.jit(lambda p, q: dm.matmul(p, q, distribution=dists, devices=8))(x, y)
    np.testing.assert_allclose(np.asarray(d), a @ b, rtol=tol)
    batched = dm.Sharded(dm.ProcessMesh((1,), ("x",)), (None, None, None))
    d = jax.jit(lambda p, q: dm.matmul(p, q, distribution=(dm.Slab.X, dm.Slab.X, batched), devices=1))(
        x, jax.numpy.stack([y, 2 * y]))
    np.testing.assert_allclose(np.asarray(d), np.stack([a @ b, 2 * a @ b]), rtol=tol)


@pytest.mark.parametrize("user_shape", [(2, 4), (8,)], ids=str)
def test_a_sharded_result_comes_back_on_the_operands_mesh(user_shape):
    """Operands on a user's mesh get the result back on that mesh: the Sharded's
    spec there where the mesh has its shape (axes taken in order), else
    replicated there (it came back on a mesh of the Sharded's own names;
    found by the differential matrix)."""
    user = jax.make_mesh(user_shape, ("p", "q")[:len(user_shape)])
    a, b = np.arange(8.0 * 6).reshape(8, 6), np.arange(6.0 * 16).reshape(6, 16)
    x = jax.device_put(jax.numpy.asarray(a, np.float32), NamedSharding(user, PartitionSpec()))
    y = jax.device_put(jax.numpy.asarray(b, np.float32), NamedSharding(user, PartitionSpec()))
    result = _sharded((None, ("y", "x")))
    d = dm.matmul(x, y, distribution=(dm.Replicated(), dm.Replicated(), result))
    np.testing.assert_allclose(np.asarray(d), a @ b, rtol=2e-5)
    assert d.sharding.mesh == user
    if user_shape == MESH.shape:  # the same ranks on the same devices: the Sharded's own blocks
        assert d.sharding.spec == PartitionSpec(None, ("q", "p"))
        for shard in d.addressable_shards:
            rank = list(user.devices.flat).index(shard.device)
            rows, cols = result.global_indices(rank, (8, 16))
            np.testing.assert_allclose(np.asarray(shard.data), (a @ b)[np.ix_(rows, cols)], rtol=2e-5)
    else:
        assert d.sharding.is_fully_replicated


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_gradients_through_shardeds_with_no_2d_form(jit):
    """jax.grad through dm.matmul on Shardeds of no 2-D form (a matrix product,
    and a batch split over a mesh axis): numpy's gradients."""
    rng = np.random.default_rng(11)
    cases = [
        ((6, 5), (5, 7), (("x", None), (None, ("y", "x")), (None, "y"))),
        ((4, 3, 5), (4, 5, 2), (("x", None, None), ("x", None, None), ("x", None, None))),
    ]
    for a_shape, b_shape, specs in cases:
        a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
        g = rng.standard_normal(np.matmul(a, b).shape)
        dists = tuple(_sharded(s) for s in specs)

        def loss(x, y):
            return jax.numpy.sum(dm.matmul(x, y, distribution=dists, devices=8) * g)

        grad = jax.grad(loss, argnums=(0, 1))
        ga, gb = (jax.jit(grad) if jit else grad)(*_operands(a, b, "jax")[:2])
        np.testing.assert_allclose(np.asarray(ga), g @ np.swapaxes(b, -1, -2), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.asarray(gb), np.swapaxes(a, -1, -2) @ g, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["jax", "nvmath"])
def test_an_empty_batch_on_a_sharded_with_no_2d_form(backend, request):
    """A batch of no items, the result asked as a Sharded of no 2-D form: an
    empty result of the batch's shape (the batched stand-in asked its first item
    for the rank count and raised IndexError; found by the long run of the
    differential matrix)."""
    if backend == "nvmath":
        request.getfixturevalue("fake_nvmath")
    a, b = np.ones((1, 1), np.float32), np.ones((0, 1, 1), np.float32)
    result = dm.Sharded(dm.ProcessMesh((1,), ("x",)), ("x", None, None))
    d = dm.matmul(a, b, distribution=(dm.Slab.X, dm.Slab.X, result), backend=backend, devices=1)
    assert np.asarray(d).shape == (0, 1, 1)
    np.testing.assert_array_equal(np.asarray(d), np.matmul(a, b))


SLAB_ON_4 = dm.Sharded(dm.ProcessMesh(4, "x"), ("x", None))  # its 2-D form: Slab.X, which carries no rank count
SPANS_4 = r"spans 4 ranks \(its mesh \(4,\)\) but there are 8 devices in use: use a ProcessMesh of 8 ranks"


@pytest.mark.parametrize("family", ["numpy", "jax"])
@pytest.mark.parametrize("name", ["a", "b", "result"])
def test_a_sharded_whose_2d_form_is_a_slab_spans_the_devices_in_use(name, family):
    """A Sharded whose 2-D form is a Slab (or Replicated()) keeps its mesh: on a
    mesh of 4 ranks with 8 devices in use it is refused as any other Sharded is,
    naming the operand (it ran as Slab.X over 8), also on a repeated
    dm.matmul of jax.Arrays (its shortcut keys on the mesh, not on the Slab)."""
    i = ("a", "b", "result").index(name)
    dists: list[dm.Distribution] = [dm.Slab.X, dm.Slab.Y, dm.Slab.X]
    on_8 = list(dists)
    dists[i], on_8[i] = SLAB_ON_4, dm.Sharded(dm.ProcessMesh(8, "x"), ("x", None))
    x, y, _ = _operands(np.ones((8, 4)), np.ones((4, 8)), family)
    ok = dm.matmul(x, y, distribution=tuple(on_8), devices=8, backend="jax")  # (the same Slab, on 8: taken)
    np.testing.assert_allclose(np.asarray(ok), np.full((8, 8), 4.0))
    with pytest.raises(dm.DistributionError, match=rf"distribution of {name}: Sharded\(.*\) {SPANS_4}"):
        dm.matmul(x, y, distribution=tuple(dists), devices=8, backend="jax")
    with pytest.raises(dm.DistributionError, match=rf"distribution of {name}: Sharded\(.*\) {SPANS_4}"):
        dm.Matmul(x, y, distribution=tuple(dists), devices=8, backend="jax")


def test_one_sharded_whose_2d_form_is_replicated_spans_the_devices_in_use():
    d = dm.Sharded(dm.ProcessMesh((2, 2), ("x", "y")), (None, None))
    with pytest.raises(dm.DistributionError, match=r"distribution of a: Sharded\(.*spans 4 ranks.* 8 devices in use"):
        dm.matmul(np.ones((8, 4)), np.ones((4, 8)), distribution=d, devices=8, backend="jax")


@pytest.mark.parametrize("dists, sizes, limit", [
    # an uneven split (M = 33 over 2 process rows) next to a 2-D grid
    ((dm.BlockNonCyclic(dm.ProcessGrid((2, 2))),) * 3, ((33, 8), (8, 12)), "has no block-cyclic form"),
    # block sizes of K differ (a's 2, b's 3)
    ((dm.BlockCyclic(dm.ProcessGrid((2, 2)), (2, 2)), dm.BlockCyclic(dm.ProcessGrid((2, 2)), (3, 2)),
      dm.BlockCyclic(dm.ProcessGrid((2, 2)), (2, 2))), ((8, 12), (12, 8)), "block sizes of K differ"),
    # a process row without a part of M = 4 (blocks of 4 over 2 rows)
    ((dm.BlockCyclic(dm.ProcessGrid((2, 2)), (4, 4)),) * 3, ((4, 8), (8, 8)), "a part of every operand"),
])
def test_layouts_cublasmp_refuses_are_relaid_into_layouts_it_takes(dists, sizes, limit):
    """2-D layouts the nvmath backend cannot take as given on 4 ranks (pure data,
    the same on every rank): Backend.refuses names cuBLASMp's limit, and the
    re-lay's choice is a triple it takes (the cost model's cheapest of those),
    saying why; the JAX backend takes them as given."""
    from dmatmul import _relay_choice
    from dmatmul._problem import Spec
    from dmatmul.backends.jax import BACKEND as jax_backend
    from dmatmul.backends.nvmath import BACKEND as nvmath

    spec = Spec.of(*sizes, "float64", distribution=dists)
    why = nvmath.refuses(spec, 4)
    assert why is not None and limit in why and "cuBLASMp" in why, why
    assert jax_backend.refuses(spec, 4) is None
    problem, model, kernels = nvmath.planner(spec, None, 4)
    choice = _relay_choice.choose(spec, 4, problem, model, tuple(kernels), nvmath)
    assert choice.refused == why
    assert choice.triple != dists and nvmath.refuses(_relay_choice._on(spec, choice.triple), 4) is None
    assert all(nvmath.refuses(_relay_choice._on(spec, r[3]), 4) is None for r in choice.ranked)
    assert [r[0] for r in choice.ranked] == sorted(r[0] for r in choice.ranked)
