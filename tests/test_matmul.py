"""dm.matmul / dm.Matmul on the JAX backend, one process, simulated CPU devices.

Every result is checked against the float64 numpy reference of dmatmul.testing.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import dmatmul as dm  # noqa: E402
from dmatmul._plans import PLANS  # noqa: E402
from dmatmul.testing.reference import TOLERANCE, assert_close, random_matrix, reference  # noqa: E402

X, Y, R = dm.Slab.X, dm.Slab.Y, dm.Replicated()
ONE_D = (X, Y, R)
TRIPLES = list(itertools.product(ONE_D, ONE_D, ONE_D))
TRANSPOSES = [(False, False), (True, False), (False, True), (True, True)]


def operands(rng, m, n, k, ta, tb, dtype="float32", c=False):
    a = random_matrix(rng, (k, m) if ta else (m, k), dtype)
    b = random_matrix(rng, (n, k) if tb else (k, n), dtype)
    return a, b, (random_matrix(rng, (m, n), dtype) if c else None)


def check(a, b, c=None, dtype="float32", **kw):
    d = dm.matmul(a, b, c, backend="jax", **kw)
    assert isinstance(d, np.ndarray) and d.dtype == a.dtype
    kw = {k: v for k, v in kw.items() if k not in ("distribution", "algorithm", "devices")}
    assert_close(d, reference(a, b, c, **kw), dtype)
    return d


# --------------------------------------------------------------------------- #
# the differential matrix
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("ndev", [3, 8])
@pytest.mark.parametrize("ta, tb", TRANSPOSES, ids=lambda t: "T" if t else "N")
@pytest.mark.parametrize("dists", TRIPLES, ids=lambda d: repr(d).replace("Replicated()", "R"))
def test_every_layout_triple_and_transpose(dists, ta, tb, ndev):
    rng = np.random.default_rng(hash((repr(dists), ta, tb, ndev)) % 2**32)
    a, b, _ = operands(rng, 13, 11, 7, ta, tb)  # uneven over 3 and 8, primes
    check(a, b, distribution=dists, transpose_a=ta, transpose_b=tb, devices=ndev)


@pytest.mark.parametrize("ndev", [1, 3, 8])
@pytest.mark.parametrize("mnk", [(1, 1, 1), (1, 5, 1), (2, 1, 9), (8, 16, 24), (17, 19, 23), (64, 3, 2), (5, 40, 3)])
@pytest.mark.parametrize(
    "algorithm, dists",
    [
        ("allgather", (X, Y, X)),
        ("allgather", (X, Y, Y)),
        ("allgather", (X, X, X)),
        ("allgather", (Y, Y, Y)),
        ("reduce_scatter", (Y, X, Y)),
        ("reduce_scatter", (Y, X, X)),
        ("allreduce", (Y, X, R)),
        ("local", (X, R, X)),
        ("local", (R, Y, Y)),
    ],
)
def test_named_algorithms_over_sizes(algorithm, dists, mnk, ndev):
    rng = np.random.default_rng(sum(mnk) + ndev)
    m, n, k = mnk
    a, b, c = operands(rng, m, n, k, False, False, c=True)
    with dm.Matmul(a, b, c, distribution=dists, algorithm=algorithm, alpha=0.7, beta=-1.3,
                   devices=ndev, backend="jax") as mm:
        d = mm.execute()
        assert mm.algorithm == algorithm
    assert_close(d, reference(a, b, c, alpha=0.7, beta=-1.3), "float32")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize(
    "algorithm, dists, ta, tb",
    [
        ("allgather", (X, Y, X), False, True),
        ("allgather", (Y, Y, Y), True, False),
        ("reduce_scatter", (Y, X, Y), False, False),
        ("reduce_scatter", (X, Y, X), True, True),
        ("allreduce", (Y, X, R), False, False),
        ("local", (X, R, X), False, False),
    ],
)
def test_dtypes(dtype, algorithm, dists, ta, tb):
    rng = np.random.default_rng(7)
    a, b, c = operands(rng, 21, 10, 19, ta, tb, dtype, c=True)
    alpha, beta = (0.5 - 0.25j, 1.5j) if dtype.startswith("complex") else (0.5, 2.0)
    d = check(a, b, c, dtype, distribution=dists, algorithm=algorithm, alpha=alpha, beta=beta,
              transpose_a=ta, transpose_b=tb, devices=8)
    assert d.dtype == np.dtype(a.dtype)


def test_scalars_of_the_operands_dtype():
    """alpha and beta read off bfloat16 (or float16) data, as numpy scalars of
    the operands' dtype: ml_dtypes registers its bfloat16 as no ``numbers``
    type, and such a scalar was refused as "not a number"."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(5)
    for dtype in ("bfloat16", "float16"):
        a, b, c = operands(rng, 9, 7, 5, False, False, dtype, c=True)
        alpha, beta = a[0, 0], np.asarray(-0.75, dtype=a.dtype)[()]  # numpy scalars of the operands' dtype
        assert isinstance(beta, np.generic) and beta.dtype == a.dtype
        check(a, b, c, dtype, alpha=alpha, beta=beta, distribution=(Y, X, Y), devices=4)
    with pytest.raises(TypeError, match=r"alpha must be a number, got .*float8_e4m3b11fnuz"):  # no supported dtype
        dm.matmul(a, b, alpha=ml_dtypes.float8_e4m3b11fnuz(1), backend="jax", devices=4)


@pytest.mark.parametrize("epilog", ["relu", "gelu", "silu", "bias", "relu_bias", "gelu_bias", "silu_bias"])
@pytest.mark.parametrize("dists", [(X, Y, X), (Y, X, Y), (Y, X, R), (Y, Y, X)], ids=repr)
def test_epilogues(epilog, dists):
    rng = np.random.default_rng(3)
    a, b, c = operands(rng, 13, 9, 6, False, False, c=True)
    bias = rng.standard_normal(13).astype(np.float32) if epilog.endswith("bias") else None
    check(a, b, c, distribution=dists, epilog=epilog, bias=bias, alpha=1.5, beta=0.5, devices=8)


@pytest.mark.parametrize("epilog", ["bias", "relu_bias", "gelu_bias", "silu_bias"])
@pytest.mark.parametrize("dists", [(X, Y, X), (Y, X, Y), (Y, X, R), (Y, Y, X), (R, Y, Y)], ids=repr)
def test_a_bias_of_shape_1_n_holds_one_value_per_column(epilog, dists):
    """``x @ W + b``: a bias of shape (1, N) is added to every row, on results
    split by rows, by columns (the bias split along them) or replicated; N
    uneven over the 8 devices. A square product with a bias of shape (M,) still
    adds it per row."""
    rng = np.random.default_rng(4)
    a, b, c = operands(rng, 9, 13, 6, False, False, c=True)
    bias = rng.standard_normal((1, 13)).astype(np.float32)
    check(a, b, c, distribution=dists, epilog=epilog, bias=bias, alpha=1.5, beta=0.5, devices=8)
    a, b, _ = operands(rng, 11, 11, 5, False, False)
    for shape in ((11,), (11, 1), (1, 11)):
        check(a, b, distribution=dists, epilog=epilog, bias=rng.standard_normal(shape).astype(np.float32), devices=8)


@pytest.mark.parametrize("epilog, bias_shape", [("silu", None), *itertools.product(
    ("silu_bias", "relu_bias", "gelu_bias"), ("M", "1,N"))])
def test_gradients_of_the_epilogues_and_of_a_bias_per_row_or_column(epilog, bias_shape):
    """jax.vjp through dm.matmul: the gradients of a, b and bias against numpy's
    (reference_vjp); the bias's comes back in its own shape and dtype (a float64
    bias of float32 operands, x64 on)."""
    from dmatmul.testing.reference import reference_vjp

    rng = np.random.default_rng(6)
    m, n, k = 10, 7, 5
    a, b, _ = operands(rng, m, n, k, False, False)
    g = rng.standard_normal((m, n)).astype(np.float32)
    bias = None
    if bias_shape is not None:
        bias = rng.standard_normal((m,) if bias_shape == "M" else (1, n))
    with jax.enable_x64(True):
        args = tuple(jnp.asarray(x) for x in (a, b, bias) if x is not None)

        def f(*xs):
            return dm.matmul(xs[0], xs[1], epilog=epilog, bias=xs[2] if len(xs) > 2 else None,
                             distribution=(X, Y, Y), devices=8)

        out, pull = jax.vjp(f, *args)
        grads = pull(jnp.asarray(g))
    assert_close(np.asarray(out), reference(a, b, epilog=epilog, bias=bias), "float32")
    want = reference_vjp(a, b, None, g, epilog=epilog, bias=bias)
    for name, got, given in zip(("a", "b", "bias"), grads, args):
        assert (got.shape, got.dtype) == (given.shape, given.dtype), name
        assert_close(np.asarray(got), want[name], "float32")


@given(
    m=st.integers(1, 20), n=st.integers(1, 20), k=st.integers(1, 20),
    ndev=st.sampled_from([1, 2, 3, 5, 8]),
    da=st.sampled_from(ONE_D), db=st.sampled_from(ONE_D), dd=st.sampled_from(ONE_D),
    ta=st.booleans(), tb=st.booleans(),
    alpha=st.floats(-2, 2), beta=st.sampled_from([0.0, 1.0, -0.5]),
    epilog=st.sampled_from([None, "relu", "bias", "gelu_bias", "silu_bias"]),
    per_column=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=40, deadline=None)
def test_generated_products(m, n, k, ndev, da, db, dd, ta, tb, alpha, beta, epilog, per_column, seed):
    rng = np.random.default_rng(seed)
    a, b, c = operands(rng, m, n, k, ta, tb, c=True)
    bias = None
    if epilog and epilog.endswith("bias"):
        bias = rng.standard_normal((1, n) if per_column else (m,)).astype(np.float32)
    check(a, b, c, distribution=(da, db, dd), transpose_a=ta, transpose_b=tb, alpha=alpha, beta=beta,
          epilog=epilog, bias=bias, devices=ndev)


def test_operands_by_keyword_as_the_contract_writes_them():
    """``matmul(a, b, c=None, *, ...)``: a, b and c may be named."""
    rng = np.random.default_rng(2)
    a, b, c = operands(rng, 9, 7, 5, False, False, c=True)
    assert_close(dm.matmul(a=a, b=b, c=c, beta=0.5, devices=4), reference(a, b, c, beta=0.5), "float32")
    with dm.Matmul(b=b, a=a, devices=4) as mm:
        assert_close(mm.execute(), reference(a, b), "float32")


def test_distribution_left_out_is_chosen_by_the_model():
    rng = np.random.default_rng(0)
    a, b, _ = operands(rng, 64, 48, 32, False, False)
    with dm.Matmul(a, b, backend="jax", devices=8) as mm:
        assert_close(mm.execute(), reference(a, b), "float32")
        assert "chosen by the cost model" in mm.explain()


@pytest.mark.parametrize("algorithm", ["allgather", "reduce_scatter", "allreduce", "local", "summa"])
@pytest.mark.parametrize("ndev", [1, 3, 8])
def test_a_named_algorithm_without_distributions_runs_on_layouts_it_takes(algorithm, ndev):
    """distribution=None with a named algorithm: the model picks among the
    layouts that algorithm takes (SUMMA: a BlockNonCyclic grid), for numpy and
    for jax.Arrays (whose results shard only evenly), transposes and uneven
    sizes too. Before, the model picked for "auto" and the algorithm was then
    refused naming layouts the user never gave (SUMMA always, allgather and
    reduce_scatter on uneven jax results)."""
    rng = np.random.default_rng(ndev)
    for (m, k, n), ta, family in itertools.product([(13, 7, 29), (16, 24, 8)], [False, True], ["numpy", "jax"]):
        a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        x, y = (a, b) if family == "numpy" else (jnp.asarray(a), jnp.asarray(b))
        with dm.Matmul(x, y, transpose_a=ta, algorithm=algorithm, devices=ndev) as mm:
            mm.plan()
            assert mm.algorithm == algorithm, (m, k, n, ta, family)
            assert "chosen by the cost model" in mm.explain()
            assert_close(np.asarray(mm.execute()), reference(a, b, transpose_a=ta), "float32")


def test_every_kernels_gemm_calls_add_up_to_its_flops():
    from dmatmul import _plan

    for m, n, k, p in ((64, 48, 32, 8), (1001, 7, 13, 3), (5, 5, 5, 1)):
        for grid in (None, (2, p // 2) if p % 2 == 0 else (1, p)):
            pr = _plan.Problem1D(m, n, k, p, 4, 4, grid=grid)
            for kernel in _plan.KERNELS:
                if (kernel.algorithm == "summa" and grid is None) or not _plan.ALGORITHMS[kernel.algorithm].runs_on(pr):
                    continue  # (2.5-D SUMMA runs only on q*q*c ranks)
                calls = _plan.gemm_calls(pr, kernel)
                assert sum(c * f for c, f, _ in calls) == pytest.approx(_plan.kernel_cost(pr, kernel)[2]), kernel
                assert all(touched > 0 for _, _, touched in calls)


@pytest.mark.parametrize("m, k, n, slow", [(1024, 8, 1024, True), (2048, 2048, 2048, False)])
def test_a_thin_inner_dimension_is_costed_at_memory_speed(m, k, n, slow):
    """A ring that moves b's rows (b split along K) adds P GEMMs of inner
    dimension K/P into the whole local result: with K = 8 on 8 ranks each is
    a pass over memory for a few flops, and one all-gather of b then one GEMM
    is the cheaper plan (measured on 8 simulated CPU devices at 4096x32x4096:
    174 ms for the ring, 13 ms for the gather): the allgather kernel's one-shot
    schedule, or the local kernel after a gather of b, the same work. A square
    product keeps the ring."""
    from dmatmul import _plan

    rng = np.random.default_rng(3)
    a, b, _ = operands(rng, m, n, k, False, False)
    with _plan.schedule("ring"):
        ring = dm.Matmul(a, b, distribution=(X, X, X), devices=8, backend="jax", algorithm="allgather")
        ring.plan()
    with dm.Matmul(a, b, distribution=(X, X, X), devices=8, backend="jax") as auto, ring:
        auto.plan()
        assert ring.algorithm == "allgather" and ring._plan.cost.kernel.schedule == "ring"
        chosen = auto._plan.cost.kernel
        if slow:
            assert (chosen.algorithm, chosen.schedule) == ("allgather", "one_shot") or (
                chosen.algorithm == "local" and "b: K -> R by all-gather" in auto.explain())
            assert auto._plan.cost.time < ring._plan.cost.time / 3
            assert_close(auto.execute(), reference(a, b), "float32")
        else:  # (large enough for the ring: planned only)
            assert (chosen.algorithm, chosen.schedule) == ("allgather", "ring")


# --------------------------------------------------------------------------- #
# refusals of named algorithms
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize(
    "algorithm, dists, needed",
    [
        ("allgather", (Y, X, Y), "a=Slab.X, b=Slab.Y, result=Slab.X"),
        ("reduce_scatter", (X, Y, X), "a=Slab.Y, b=Slab.X, result=Slab.X"),
        ("allreduce", (X, Y, X), "a=Slab.Y, b=Slab.X, result=Replicated()"),
        ("local", (X, Y, X), "a=Slab.X, b=Replicated(), result=Slab.X"),
    ],
)
def test_named_algorithm_that_does_not_fit_names_what_it_needs(algorithm, dists, needed):
    a, b = np.ones((8, 8), np.float32), np.ones((8, 8), np.float32)
    with pytest.raises(ValueError, match=algorithm) as info:
        dm.matmul(a, b, distribution=dists, algorithm=algorithm, devices=4, backend="jax")
    assert needed in str(info.value)


def test_refusal_accounts_for_transposes():
    a, b = np.ones((8, 8), np.float32), np.ones((8, 8), np.float32)
    with pytest.raises(ValueError) as info:
        dm.matmul(a, b, distribution=(X, Y, Y), algorithm="reduce_scatter", transpose_a=True, devices=4)
    # with transpose_a, op(a) is split on K when the stored a is split on rows
    assert "a=Slab.X, b=Slab.X, result=Slab.Y" in str(info.value)


# --------------------------------------------------------------------------- #
# plans, inputs, array families
# --------------------------------------------------------------------------- #
def test_plan_reuse_and_reset_operands():
    rng = np.random.default_rng(1)
    a, b, c = operands(rng, 19, 12, 10, False, False, c=True)
    with dm.Matmul(a, b, c, distribution=(Y, X, Y), alpha=2.0, beta=1.0, devices=8) as mm:
        mm.plan()
        assert mm.algorithm == "reduce_scatter"
        assert_close(mm.execute(), reference(a, b, c, alpha=2.0, beta=1.0), "float32")
        for step in range(3):
            a2, b2, c2 = operands(rng, 19, 12, 10, False, False, c=True)
            mm.reset_operands(a=a2, b=b2, c=c2)
            assert_close(mm.execute(), reference(a2, b2, c2, alpha=2.0, beta=1.0), "float32")
        mm.reset_operands(alpha=-1.0, beta=0.0)
        assert_close(mm.execute(), reference(a2, b2, alpha=-1.0), "float32")
        with pytest.raises(ValueError, match=r"reset_operands: a must match .*\(19, 10\).*\(10, 19\)"):
            mm.reset_operands(a=a2.T.copy())
        with pytest.raises(ValueError, match="reset_operands: b .*float64"):
            mm.reset_operands(b=b2.astype(np.float64))
    with pytest.raises(dm.PlanFreedError, match="freed"):
        mm.execute()
    with pytest.raises(dm.PlanFreedError):
        mm.reset_operands(a=a)
    # as the contract's example reads them after the with block: what the plan was
    assert mm.algorithm == "reduce_scatter" and "algorithm:  reduce_scatter" in mm.explain()
    with dm.Matmul(a, b, distribution=(Y, X, Y), devices=8) as never_planned:
        pass
    for read in (lambda: never_planned.algorithm, never_planned.explain):
        with pytest.raises(dm.PlanFreedError, match="freed before it was made"):
            read()


def test_a_freed_plan_lets_go_of_its_operands():
    """free() (a with block left) releases the operands: a Matmul kept after it (in a list, as an
    attribute) held the caller's arrays, device buffers too, for as long as it lived, though it can
    never use them again. It still tells what its plan was."""
    import gc
    import weakref

    rng = np.random.default_rng(5)
    for wrap in (np.asarray, jnp.asarray):
        a, b, c = (wrap(x) for x in operands(rng, 16, 8, 4, False, False, c=True))
        bias = wrap(rng.standard_normal(16).astype(np.float32))
        held = [weakref.ref(x) for x in (a, b, c, bias)]
        with dm.Matmul(a, b, c, beta=1.0, epilog="bias", bias=bias, distribution=(X, Y, X), devices=8) as mm:
            mm.reset_operands(a=wrap(np.asarray(a)[::-1].copy()))  # the replaced a and its successor alike
            held.append(weakref.ref(mm._operands.a))
            assert_close(np.asarray(mm.execute()), reference(np.asarray(a)[::-1], np.asarray(b), np.asarray(c),
                                                             beta=1.0, epilog="bias", bias=np.asarray(bias)),
                         "float32")
            told = mm.algorithm
        del a, b, c, bias
        gc.collect()
        assert [ref() is None for ref in held] == [True] * 5, wrap
        assert mm.algorithm == told  # what it was


def test_a_plan_dropped_by_new_scalars_still_tells_what_it_was_after_free():
    """New scalars drop the plan (they are compiled in); freed before another is made, the Matmul still
    tells what its plan was, as after any free() (it said 'freed before it was made')."""
    a, b = np.ones((6, 4), np.float32), np.ones((4, 5), np.float32)
    with dm.Matmul(a, b, distribution=(X, Y, X), devices=2) as mm:
        mm.plan()
        told = (mm.algorithm, mm.explain())
        mm.reset_operands(alpha=2.0)
    assert (mm.algorithm, mm.explain()) == told
    with dm.Matmul(a, b, distribution=(Y, X, Y), devices=2) as mm:
        mm.plan()
        mm.reset_operands(alpha=2.0)
        np.testing.assert_allclose(mm.execute(), 2 * a @ b)  # planned again: that plan is the one told
        told = (mm.algorithm, mm.explain())
    assert (mm.algorithm, mm.explain()) == told and told[0] in ("reduce_scatter", "allreduce")  # K split, as given



@pytest.mark.filterwarnings("error::UserWarning")
def test_a_64_bit_jax_bias_inside_jit_is_padded_without_a_warning():
    """A float64 jax.Array bias of float32 operands (x64 off), the plan executed inside jit, M not a multiple
    of the ranks: the bias is padded in its own dtype (jnp.zeros(n, float64) warned that it truncates)."""
    a, b = np.ones((7, 4), np.float32), np.ones((4, 5), np.float32)
    with jax.enable_x64(True):
        bias = jnp.arange(7.0)
    with dm.Matmul(a, b, epilog="bias", bias=bias, distribution=X, devices=2) as mm:
        d = jax.jit(lambda: mm.execute())()
    assert d.dtype == np.float32
    np.testing.assert_allclose(np.asarray(d), np.broadcast_to(4 + np.arange(7.0)[:, None], (7, 5)))

def test_operands_changed_or_misplaced_are_refused_with_their_name():
    """What execute() reads must be what was given; what reset_operands takes
    is checked as the constructor checks it."""
    a, b = np.ones((6, 4), np.float32), np.ones((4, 5), np.float32)
    with dm.Matmul(a, b, distribution=(X, Y, X), devices=4) as mm:
        a.shape = (4, 6)  # in place: the planned product no longer fits
        with pytest.raises(ValueError, match=r"a now has \(shape, dtype\) \(\(4, 6\).* was given as \(\(6, 4\)"):
            mm.execute()
        a.shape = (6, 4)
        np.testing.assert_array_equal(mm.execute(), np.full((6, 5), 4.0))
        for bad, exc, words in (("hello", TypeError, "a must be a 2-D numpy, jax or cupy array, got str"),
                                ([[1.0, 2.0], [3.0]], ValueError, "a cannot be read as an array")):
            with pytest.raises(exc, match=words):
                mm.reset_operands(a=bad)
    jax = pytest.importorskip("jax")
    devs = jax.devices()
    on8 = jax.device_put(jax.numpy.ones((8, 4)), jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.array(devs), ("x",)), jax.sharding.PartitionSpec("x")))
    on4 = jax.device_put(jax.numpy.ones((8, 4)), jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.array(devs[4:]), ("x",)), jax.sharding.PartitionSpec("x")))
    with dm.Matmul(on8, jax.numpy.ones((4, 5)), distribution=(X, R, X)) as mm:
        with pytest.raises(ValueError, match=r"a is on 4 device\(s\) \(ids 4, 5, 6, 7\) but the plan's a was on 8"):
            mm.reset_operands(a=on4)
        np.testing.assert_array_equal(np.asarray(mm.execute()), np.full((8, 5), 4.0))


def test_execute_again_on_the_same_operands_skips_the_checks_and_nothing_else(monkeypatch):
    """``execute()`` on the operands it already ran on, in one process, calls
    the compiled product directly (the per-call checks cost about 2x a jitted
    call's dispatch, which is what a GEMM of n = 1024 takes on an H200); a
    deleted operand, a trace, new operands or free() still take the full path,
    and every result is where the full path puts it."""
    from dmatmul._matmul import plan_of
    from dmatmul.backends.jax._backend import JaxPlan

    full = []
    run = JaxPlan.execute
    monkeypatch.setattr(JaxPlan, "execute", lambda self, ops: full.append(1) or run(self, ops))
    rng = np.random.default_rng(11)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))
    user = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "model"), None))
    for dtype, place, dists in (("float32", None, (X, Y, X)), ("float64", None, (Y, X, Y)),
                                ("float32", user, None),
                                ("float32", None, (X, R, dm.BlockCyclic(dm.ProcessGrid((2, 4)), (2, 3)))),
                                ("float32", None, (X, Y, dm.BlockNonCyclic(dm.ProcessGrid((4, 2), layout="col"))))):
        a, b, _ = operands(rng, 16, 9, 7, False, False, dtype=dtype)
        if place is None:  # placed as the plan keeps them (on one device they would move at every call)
            with dm.Matmul(jnp.asarray(a), jnp.asarray(b), distribution=dists, devices=8, backend="jax") as probe:
                place = plan_of(probe).sharding("a"), plan_of(probe).sharding("b")
        else:
            place = place, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        with jax.enable_x64(dtype == "float64"):  # (a float64 array is float32 in JAX without x64)
            ja, jb = jax.device_put(a, place[0]), jax.device_put(b, place[1])
        with dm.Matmul(ja, jb, distribution=dists, devices=None if dists is None else 8, backend="jax") as mm:
            first = mm.execute()
            calls = len(full)
            again = [mm.execute() for _ in range(3)]
            assert len(full) == calls, (dtype, dists, "the full path ran again")
            for d in again:
                assert d.dtype == first.dtype and d.sharding == first.sharding, (dtype, dists)
                assert_close(np.asarray(d), reference(a, b), dtype)
            inside = jax.jit(lambda: mm.execute())()  # a trace: the full path, traced
            assert_close(np.asarray(inside), reference(a, b), dtype)
            a2, _, _ = operands(rng, 16, 9, 7, False, False, dtype=dtype)
            with jax.enable_x64(dtype == "float64"):
                ja2 = jax.device_put(a2, place[0])
            mm.reset_operands(a=ja2)
            calls = len(full)
            assert_close(np.asarray(mm.execute()), reference(a2, b), dtype)
            assert_close(np.asarray(mm.execute()), reference(a2, b), dtype)
            assert len(full) == calls + 1, (dtype, dists)
            ja2.delete()
            with pytest.raises(ValueError, match="a is a deleted jax.Array"):
                mm.execute()
        with pytest.raises(dm.PlanFreedError, match="freed"):
            mm.execute()
    a, b, _ = operands(rng, 16, 9, 7, False, False)
    with dm.Matmul(jnp.asarray(a), jnp.asarray(b), distribution=(X, Y, X), devices=8, backend="jax") as mm:
        calls = len(full)
        for _ in range(3):  # on one device, not the plan's 8: moved at every call, by the shortcut too
            d = mm.execute()
            assert_close(np.asarray(d), reference(a, b), "float32")
            assert len(d.sharding.device_set) == 8
        assert len(full) == calls + 1


def test_dm_matmul_again_on_arrays_like_the_last_skips_the_checks_and_nothing_else(monkeypatch):
    """dm.matmul on jax.Arrays of the shape, dtype and sharding (and options of
    the type and value) of a call that passed its checks runs that call's plan
    again without them (about 100 us a call, 4x a GEMM of n = 1024 on an H200),
    through the runner made for that call: an operand that must move onto the
    plan's devices moves once a call (twice before: the runner was made anew at
    each call, and made a copy of its own).
    What the checks would refuse is still refused: a deleted operand, an alpha
    equal in value but not in type (1+0j for a real product, True), a new
    shape; a trace, jax.set_mesh and new placements plan as a first call does."""
    from dmatmul import _matmul

    full = []
    validate = _matmul._validate
    monkeypatch.setattr(_matmul, "_validate", lambda *a, **k: full.append(1) or validate(*a, **k))
    rng = np.random.default_rng(23)
    sa = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()), ("x",)), jax.sharding.PartitionSpec("x"))

    def fresh(m=16, k=7, n=9):
        a, b, _ = operands(rng, m, n, k, False, False)
        return a, b, jax.device_put(a, sa), jnp.asarray(b)

    a, b, ja, jb = fresh()
    first = dm.matmul(ja, jb, alpha=1.0, backend="jax")
    assert len(full) == 1
    put, moves = jax.device_put, []
    for _ in range(3):  # new arrays like the first: no checks, right numbers, the same placement
        a, b, ja, jb = fresh()
        given = (ja, jb)
        monkeypatch.setattr(jax, "device_put", lambda x, *a, **k: moves.append(any(x is g for g in given))
                            or put(x, *a, **k))
        d = dm.matmul(ja, jb, alpha=1.0, backend="jax")
        monkeypatch.setattr(jax, "device_put", put)
        assert_close(np.asarray(d), reference(a, b), "float32")
        assert d.sharding == first.sharding
    assert len(full) == 1
    assert sum(moves) == 3  # jb (one device) onto the plan's 8, once a call (the runner decided so once)
    for alpha, words in ((1 + 0j, "alpha=.*complex but the operands are float32"), (True, "alpha must be a number")):
        with pytest.raises(TypeError, match=words):
            dm.matmul(ja, jb, alpha=alpha, backend="jax")
    ja.delete()
    with pytest.raises(ValueError, match="a is a deleted jax.Array"):
        dm.matmul(ja, jb, alpha=1.0, backend="jax")
    with pytest.raises(ValueError, match="inner dimensions"):
        dm.matmul(jax.device_put(np.ones((16, 8), np.float32), sa), jb, alpha=1.0, backend="jax")
    a, b, ja, jb = fresh()
    jitted = jax.jit(lambda x, y: dm.matmul(x, y, alpha=1.0, backend="jax"))(ja, jb)
    assert_close(np.asarray(jitted), reference(a, b), "float32")
    xa, xb = jnp.asarray(a), jnp.asarray(b)
    d = dm.matmul(xa, xb, alpha=1.0, backend="jax")  # on one device: kept too
    assert len(d.sharding.device_set) != 4
    user = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("u",))
    with jax.set_mesh(user):  # the same arrays, under the context's mesh: its 4 devices
        calls = len(full)
        d = dm.matmul(xa, xb, alpha=1.0, backend="jax")
        assert len(full) == calls + 1 and len(d.sharding.device_set) == 4
        assert_close(np.asarray(d), reference(a, b), "float32")


def test_threads_plan_at_once(monkeypatch):
    """Threads share the plan cache: planning many problems at once, past the
    cache's bound, neither fails (a KeyError or 'dictionary changed size' from
    two evictions of one plan before) nor lets the cache outgrow its bound."""
    import concurrent.futures
    import sys

    backend = dm.backends.get("jax")
    monkeypatch.setattr(type(backend), "cache_size", 3)
    monkeypatch.setattr(PLANS, "_shelves", {})
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: the race comes within a few hundred plans
    try:
        def plan(i):
            m, k, n = 1 + i % 13, 1 + i % 7, 1 + i % 5
            with dm.Matmul(np.full((m, k), 2, np.float32), np.ones((k, n), np.float32),
                           distribution=(X, Y, X), devices=2) as mm:
                mm.plan()
                size = len(PLANS.held("jax"))
                if i % 150 == 0:  # and the plans compute: a few, each compiles
                    assert np.array_equal(mm.execute(), np.full((m, n), 2 * k, np.float32))
                return size

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert max(pool.map(plan, range(600))) <= 3
    finally:
        sys.setswitchinterval(interval)


def test_a_plan_in_use_stays_cached_past_the_bound(monkeypatch):
    """Past its bound the plan cache lets the plan unused longest go: a training step's product
    run between ever new shapes (sequence lengths) was evicted as the oldest, and compiled again,
    after every cache_size new ones."""
    from dmatmul._matmul import plan_of

    backend = dm.backends.get("jax")
    monkeypatch.setattr(type(backend), "cache_size", 3)
    monkeypatch.setattr(PLANS, "_shelves", {})
    b = np.ones((8, 5), np.float32)

    def planned(rows: int):
        a = np.full((rows, 8), 2, np.float32)
        with dm.Matmul(a, b, distribution=X, devices=2) as mm:
            np.testing.assert_array_equal(mm.execute(), np.full((rows, 5), 16, np.float32))
            return plan_of(mm)

    hot = planned(16)
    for rows in range(17, 25):
        assert planned(16) is hot, rows
        planned(rows)
    assert len(PLANS.held("jax")) == 3


def test_inputs_are_never_modified():
    rng = np.random.default_rng(2)
    a, b, c = operands(rng, 13, 11, 7, False, False, c=True)
    bias = rng.standard_normal(13).astype(np.float32)
    copies = [x.copy() for x in (a, b, c, bias)]
    for dists in [(X, Y, X), (Y, X, Y), (Y, X, R)]:
        dm.matmul(a, b, c, distribution=dists, beta=1.0, epilog="relu_bias", bias=bias, devices=8)
    for x, x0 in zip((a, b, c, bias), copies):
        np.testing.assert_array_equal(x, x0)


def test_beta_zero_does_not_read_c():
    a, b = np.ones((4, 4), np.float32), np.ones((4, 4), np.float32)
    c = np.full((4, 4), np.nan, np.float32)
    d = dm.matmul(a, b, c, distribution=(X, Y, X), beta=0.0, devices=4)
    np.testing.assert_array_equal(d, np.full((4, 4), 4.0))


@pytest.mark.parametrize("dists", [(X, Y, X), (Y, X, Y), (Y, X, R), (X, X, Y)], ids=repr)
def test_nan_propagates_only_where_math_says(dists):
    rng = np.random.default_rng(4)
    a, b, _ = operands(rng, 11, 9, 7, False, False)
    a[3, 2] = np.nan  # poisons row 3 of the result, nothing else
    d = dm.matmul(a, b, distribution=dists, devices=8)
    assert np.all(np.isnan(d[3]))
    mask = np.ones(d.shape, bool)
    mask[3] = False
    assert np.all(np.isfinite(d[mask]))
    assert_close(d[mask].reshape(10, 9), reference(np.delete(a, 3, 0), b), "float32")


def _poisoned(rng, m, n, k):
    """a, b with a NaN and an inf (alpha = 0 must not read them), c finite."""
    a, b, c = operands(rng, m, n, k, False, False, c=True)
    a[m // 2, k // 2], b[k - 1, n - 1] = np.nan, np.inf
    return a, b, c


@pytest.mark.parametrize("family", ["numpy", "jax"])
@pytest.mark.parametrize("m, n", [(35, 1), (1, 35), (35, 4)])
@pytest.mark.parametrize("dists", [(X, Y, X), (Y, X, R), None], ids=repr)
def test_alpha_zero_reads_neither_a_nor_b(family, m, n, dists):
    """alpha = 0 follows BLAS: D = epilog(beta*C [+ bias]), NaN and inf in A
    and B do not reach it (they did on the JAX backend), numpy and jax.Array
    operands, dm.matmul and dm.Matmul; explain() says A and B are not read."""
    rng = np.random.default_rng(11)
    a, b, c = _poisoned(rng, m, n, 7)
    bias = rng.standard_normal(m).astype(np.float32)
    x, y, z = (jnp.asarray(v) for v in (a, b, c)) if family == "jax" else (a, b, c)
    for beta, epilog in ((1.0, None), (0.5, "relu_bias"), (0.0, "bias")):
        kw = dict(alpha=0.0, beta=beta, epilog=epilog, bias=bias if epilog else None)
        d = dm.matmul(x, y, z, distribution=dists, devices=8, **kw)
        assert type(d) is type(x)
        assert_close(np.asarray(d), reference(a, b, c, **kw), "float32")
    assert_close(np.asarray(dm.matmul(x, y, alpha=0.0, distribution=dists, devices=8)), np.zeros((m, n)), "float32")
    with dm.Matmul(x, y, z, alpha=0.0, beta=1.0, distribution=dists, devices=8) as mm:
        assert_close(np.asarray(mm.execute()), c.astype(np.float64), "float32")
        assert "alpha = 0: A and B are not read" in mm.explain()


def test_alpha_reset_to_zero_and_back():
    """A Matmul whose alpha is reset to 0 stops reading A and B, and reads them
    again when it is reset to another value (the plan follows the scalars)."""
    rng = np.random.default_rng(12)
    a, b, c = operands(rng, 35, 1, 7, False, False, c=True)
    a2 = a.copy()
    a2[3, 3] = np.nan
    with dm.Matmul(a, b, c, alpha=2.0, beta=1.0, distribution=(X, Y, X), devices=8) as mm:
        assert_close(mm.execute(), reference(a, b, c, alpha=2.0, beta=1.0), "float32")
        mm.reset_operands(a=a2, alpha=0.0)
        assert_close(mm.execute(), reference(a2, b, c, alpha=0.0, beta=1.0), "float32")
        assert mm.algorithm == "local" and "A and B are not read" in mm.explain()
        mm.reset_operands(a=a, alpha=-1.0)
        assert_close(mm.execute(), reference(a, b, c, alpha=-1.0, beta=1.0), "float32")
        assert "A and B are not read" not in mm.explain()


def test_alpha_zero_inside_jit_and_grad():
    """Inside jax.jit and jax.grad: the gradients with respect to a and b are
    zero (they are not read: NaN and inf in them do not reach them either),
    with respect to c beta times the cotangent."""
    rng = np.random.default_rng(13)
    a, b, c = _poisoned(rng, 35, 1, 7)
    g = rng.standard_normal((35, 1)).astype(np.float32)

    def loss(x, y, z):
        return jnp.sum(dm.matmul(x, y, z, alpha=0.0, beta=0.5, distribution=(X, Y, X), devices=8) * g)

    d = jax.jit(lambda x, y, z: dm.matmul(x, y, z, alpha=0.0, beta=1.0, distribution=(X, Y, X), devices=8))(a, b, c)
    assert_close(np.asarray(d), c.astype(np.float64), "float32")
    for f in (jax.grad(loss, argnums=(0, 1, 2)), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))):
        ga, gb, gc = f(jnp.asarray(a), jnp.asarray(b), jnp.asarray(c))
        assert ga.shape == a.shape and gb.shape == b.shape
        np.testing.assert_array_equal(np.asarray(ga), 0)
        np.testing.assert_array_equal(np.asarray(gb), 0)
        assert_close(np.asarray(gc), 0.5 * g.astype(np.float64), "float32")


def test_a_recent_call_of_another_alpha_is_not_taken_for_it():
    """dm.matmul's kept runners are keyed by alpha: a call with alpha = 0 after
    one with alpha = 1 on arrays alike (and back) gets its own result."""
    rng = np.random.default_rng(14)
    a, b, c = (jnp.asarray(v) for v in _poisoned(rng, 35, 1, 7))
    for alpha in (1.0, 0.0, 1.0, 0.0):
        d = dm.matmul(a, b, c, alpha=alpha, beta=1.0, distribution=(X, Y, X), devices=8)
        want = reference(np.asarray(a), np.asarray(b), np.asarray(c), alpha=alpha, beta=1.0)
        np.testing.assert_array_equal(np.isnan(np.asarray(d)), np.isnan(want))
        assert_close(np.asarray(d), want, "float32")


def test_a_recent_call_is_keyed_by_the_options_types_and_values():
    """The repeated-call shortcut keys options by type and value: a complex
    alpha equal to a real one that ran a moment ago still meets the real
    product's check, on every keyword order; a list of devices (keyed as a
    tuple) and reordered keywords run the same product."""
    a, b = jnp.asarray(np.arange(12.0, dtype=np.float32).reshape(4, 3)), jnp.ones((3, 5), jnp.float32)
    want = np.asarray(a, np.float64) @ np.ones((3, 5))
    for _ in range(2):  # the second round runs through the kept runners
        assert_close(np.asarray(dm.matmul(a, b, alpha=1.0, backend="jax")), want, "float32")
        assert_close(np.asarray(dm.matmul(a, b, backend="jax", alpha=2.0)), 2 * want, "float32")
        assert_close(np.asarray(dm.matmul(a, b, alpha=2.0, backend="jax")), 2 * want, "float32")
        assert_close(np.asarray(dm.matmul(a, b, devices=jax.devices()[:2], backend="jax")), want, "float32")
        for kw in ({"alpha": 1 + 0j, "backend": "jax"}, {"backend": "jax", "alpha": 1 + 0j}):
            with pytest.raises(TypeError, match=r"alpha=\(1\+0j\) is complex but the operands are float32"):
                dm.matmul(a, b, **kw)


def test_beta_without_c_names_c_and_the_fix():
    """beta != 0 needs c: a ValueError naming c and the fix (it returned a @ b),
    in dm.matmul, dm.Matmul and reset_operands; beta = 0 without c is fine."""
    a, b = np.ones((4, 3), np.float32), np.ones((3, 5), np.float32)
    for call in (lambda: dm.matmul(a, b, beta=1.0), lambda: dm.Matmul(a, b, beta=-0.5)):
        with pytest.raises(ValueError, match=r"^beta=(1\.0|-0\.5) needs c: .*pass c .*or leave beta=0"):
            call()
    np.testing.assert_array_equal(dm.matmul(a, b, beta=0.0), a @ b)
    with dm.Matmul(a, b) as mm:
        with pytest.raises(ValueError, match=r"^reset_operands: beta=2\.0 needs c: .*make a new Matmul with c"):
            mm.reset_operands(beta=2.0)
        np.testing.assert_array_equal(mm.execute(), a @ b)  # the plan is as it was


@pytest.mark.parametrize("dists", [(X, Y, X), (Y, X, Y), (X, Y, Y), (Y, X, R)], ids=repr)
def test_jax_in_jax_out_sharded_as_the_result_distribution(dists):
    from jax.sharding import NamedSharding

    rng = np.random.default_rng(5)
    a, b, _ = operands(rng, 16, 24, 32, False, False)
    ref = reference(a, b)
    mm = dm.Matmul(a, b, distribution=dists, devices=8)  # numpy plan, to read its mesh
    mm.plan()
    plan = mm._plan
    ja = jax.device_put(a, plan.sharding("a"))
    jb = jax.device_put(b, plan.sharding("b"))
    with jax.transfer_guard("disallow"):  # already laid out: no host round trip
        d = dm.matmul(ja, jb, distribution=dists, devices=8)
    assert isinstance(d, jax.Array)
    assert isinstance(d.sharding, NamedSharding)
    assert d.sharding.is_equivalent_to(plan.sharding("d"), 2)
    assert_close(np.asarray(d), ref, "float32")


def test_jax_inputs_uneven_and_on_one_device():
    rng = np.random.default_rng(6)
    a, b, _ = operands(rng, 13, 11, 7, False, False)
    ja, jb = jax.device_put(a, jax.devices()[0]), jnp.asarray(b)
    d = dm.matmul(ja, jb, distribution=(X, Y, X), devices=8)
    assert isinstance(d, jax.Array) and d.shape == (13, 11)
    assert_close(np.asarray(d), reference(a, b), "float32")


def test_distribution_inferred_from_jax_shardings():
    rng = np.random.default_rng(8)
    a, b, _ = operands(rng, 16, 16, 16, False, False)
    mm = dm.Matmul(a, b, distribution=(X, Y, X), devices=8)
    mm.plan()
    ja = jax.device_put(a, mm._plan.sharding("a"))
    jb = jax.device_put(b, mm._plan.sharding("b"))
    with dm.Matmul(ja, jb, devices=8) as inferred:
        assert inferred._plan is None and inferred.algorithm in ("allgather", "local")
        assert "a       Slab.X" in inferred.explain() and "b       Slab.Y" in inferred.explain()
        assert_close(np.asarray(inferred.execute()), reference(a, b), "float32")


# --------------------------------------------------------------------------- #
# autodiff: the transpose of a ring is the dual ring
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("schedule", ["ring", "one_shot", "bidirectional"])
@pytest.mark.parametrize(
    "dists, algorithm", [((X, Y, X), "allgather"), ((Y, X, Y), "reduce_scatter"), ((Y, X, R), "allreduce")]
)
def test_gradients_against_numpy(dists, algorithm, schedule):
    from dmatmul import _plan

    rng = np.random.default_rng(9)
    a, b, _ = operands(rng, 16, 16, 24, False, False)  # blocks of 2 rows or columns: halves of 1 both ways
    g = rng.standard_normal((16, 16)).astype(np.float32)

    def loss(x, y):
        return jnp.sum(dm.matmul(x, y, distribution=dists, algorithm=algorithm, devices=8) * g)

    with _plan.schedule(schedule):
        ga, gb = jax.grad(loss, argnums=(0, 1))(jnp.asarray(a), jnp.asarray(b))
        jaxpr = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(a), jnp.asarray(b)))
    assert_close(np.asarray(ga), g.astype(np.float64) @ b.T.astype(np.float64), "float32")
    assert_close(np.asarray(gb), a.T.astype(np.float64) @ g.astype(np.float64), "float32")
    if algorithm != "allreduce" and schedule != "one_shot":
        # forward ring + its transpose: collective permutes, no all-gather (both ways: twice as many)
        assert jaxpr.count("ppermute") >= (4 if schedule == "bidirectional" else 2) and "all_gather" not in jaxpr
    elif algorithm != "allreduce":  # one whole collective and its transpose (all-gather <-> reduce-scatter)
        assert "ppermute" not in jaxpr and "all_gather" in jaxpr and "reduce_scatter" in jaxpr


def test_gradient_with_transposes_and_uneven_sizes():
    rng = np.random.default_rng(10)
    a, b, _ = operands(rng, 13, 7, 11, True, True)

    def loss(x, y):
        d = dm.matmul(x, y, distribution=(Y, Y, X), transpose_a=True, transpose_b=True, devices=8)
        return jnp.sum(d**2)

    ga, gb = jax.grad(loss, argnums=(0, 1))(jnp.asarray(a), jnp.asarray(b))
    d = a.T.astype(np.float64) @ b.T.astype(np.float64)
    assert_close(np.asarray(ga), (2 * d @ b.astype(np.float64)).T, "float32")
    assert_close(np.asarray(gb), (2 * a.T.astype(np.float64).T @ d).T, "float32")


G22, G41 = dm.ProcessGrid((2, 2)), dm.ProcessGrid((4, 1))


@pytest.mark.parametrize("dists, batched", [
    ((X, Y, X), "a"),  # a's sharding, rows over the 4 devices, given to the stack of 3 a's as it is
    ((Y, X, Y), "b"),
    ((dm.BlockNonCyclic(G22),) * 2 + (dm.BlockNonCyclic(G41),), "a"),  # the result re-laid onto its own grid
])
def test_eager_vmap_around_matmul(dists, batched):
    """Found by the differential matrix: eager jax.vmap around dm.matmul (and
    per-example gradients, vmap of grad) raised IndivisibleError where the
    operand's distribution is a NamedSharding: JAX's device_put under vmap
    applies the matrix's sharding to the stacked operand, splitting its batch
    axis. Each matrix of the batch now comes back laid out as the result's
    distribution says, the batch axis not split."""
    rng = np.random.default_rng(12)
    a, b, _ = operands(rng, 8, 8, 4, False, False)
    stack = np.stack([a, 2 * a, -a]) if batched == "a" else np.stack([b, 2 * b, -b])
    f = lambda x, y: dm.matmul(x, y, distribution=dists, devices=4)  # noqa: E731
    args = (jnp.asarray(stack), jnp.asarray(b)) if batched == "a" else (jnp.asarray(a), jnp.asarray(stack))
    in_axes = (0, None) if batched == "a" else (None, 0)
    d = jax.vmap(f, in_axes=in_axes)(*args)
    want = [reference(x, b) if batched == "a" else reference(a, x) for x in stack]
    assert d.shape == (3, 8, 8)
    for x, y in zip(np.asarray(d), want):
        assert_close(x, y, "float32")
    one = f(jnp.asarray(a), jnp.asarray(b))
    shards = {s.device: s.index for s in d.addressable_shards}
    assert {dev: (slice(None),) + index for dev, index in ((s.device, s.index) for s in one.addressable_shards)} \
        == shards  # each matrix's blocks where the unbatched result has them
    g = rng.standard_normal((8, 8)).astype(np.float32)
    grads = jax.vmap(jax.grad(lambda x, y: jnp.sum(f(x, y) * g), argnums=0 if batched == "a" else 1),
                     in_axes=in_axes)(*args)
    want = g.astype(np.float64) @ b.T.astype(np.float64) if batched == "a" else \
        a.T.astype(np.float64) @ g.astype(np.float64)  # the same for every matrix of the batch
    for grad in np.asarray(grads):
        assert_close(grad, want, "float32")


def test_tolerances_are_meaningful():
    # guard against a tolerance table that would accept anything
    assert all(t < 0.05 for t in TOLERANCE.values())


@pytest.mark.parametrize(
    "dists, tb, algorithm, ndev",
    [((R, Y, Y), True, "auto", 3), ((Y, Y, X), True, "reduce_scatter", 6)],
)
def test_bfloat16_jax_operands(dists, tb, algorithm, ndev):
    """Found by the differential matrix: XLA's CPU dot thunk refused BF16 x BF16 = F32 at run time."""
    rng = np.random.default_rng(5)
    a, b, _ = operands(rng, 8, 8, 8, False, tb, dtype="bfloat16")
    d = dm.matmul(jnp.asarray(a), jnp.asarray(b), distribution=dists, transpose_b=tb, algorithm=algorithm,
                  devices=ndev, backend="jax")
    assert_close(np.asarray(d), reference(a, b, transpose_b=tb), "bfloat16")


def test_half_precision_widens_on_the_devices_it_runs_on(monkeypatch):
    """CPU devices of a machine whose default JAX backend is a GPU: the CPU
    dot thunk's refusal of BF16 x BF16 = F32 is a property of the devices the
    product runs on, not of ``jax.default_backend()``."""
    rng = np.random.default_rng(5)
    a, b, _ = operands(rng, 8, 8, 8, False, True, dtype="bfloat16")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    d = dm.matmul(jnp.asarray(a), jnp.asarray(b), distribution=(R, Y, Y), transpose_b=True, devices=3,
                  backend="jax")
    assert_close(np.asarray(d), reference(a, b, transpose_b=True), "bfloat16")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("dists", [(dm.BlockNonCyclic(dm.ProcessGrid((2, 4))),) * 3, (Y, X, Y), (X, Y, X), (Y, Y, X)],
                         ids=["GGG", "YXY", "XYX", "YYX"])
def test_half_precision_operands_move_as_float32_on_cpu(dtype, dists):
    """On CPU devices half-precision operands are widened to float32 before
    anything moves (XLA's CPU copies and collectives carry a 2-byte float
    through float32 element by element, 1.5-3.5x a float32 move:
    ``benchmarks/half_moves.py``): every collective the program calls and
    every one it compiles carries float32, the plan counts 4 bytes an
    element, and the result is numpy's product, in the operands' dtype."""
    from dmatmul._matmul import plan_of

    rng = np.random.default_rng(23)
    a, b, _ = operands(rng, 48, 40, 56, False, False, dtype=dtype)
    mm = dm.Matmul(a, b, distribution=dists, backend="jax", devices=8)
    plan = plan_of(mm)
    assert plan.widened and plan.problem.itemsize == 4
    args = [jax.ShapeDtypeStruct(plan.given[op].shape, jnp.dtype(dtype), sharding=plan.sharding(op)) for op in "ab"]
    with plan._own_context():
        lowered = plan._function("padded").lower(*args, None, None)
    # the collectives the program calls (XLA's CPU compiler then runs bfloat16 ones through float32 converts) and
    # those it compiles (XLA adds those of sharding constraints)
    short = {"bfloat16": "bf16", "float16": "f16"}[dtype]
    called = [line for line in lowered.as_text().splitlines() if re.search(
        r"stablehlo\.(collective_permute|all_gather|all_to_all|reduce_scatter|all_reduce)", line)]
    assert not [line for line in called if f"x{short}>" in line], called
    hlo = lowered.compile().as_text()
    kinds = re.findall(r"= (\w+)\[[\d,]*\][^ ]* (?:collective-permute|all-gather|all-to-all|reduce-scatter|all-reduce)"
                       r"(?:-start)?\(", hlo)
    assert kinds and set(kinds) == {"f32"}, kinds
    d = mm.execute()
    assert str(d.dtype) == dtype
    assert_close(np.asarray(d), reference(a, b), dtype)
    mm.free()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("ta, tb", TRANSPOSES, ids=lambda t: "T" if t else "N")
def test_a_plain_half_precision_gemm_on_an_accelerator_writes_its_dtype(monkeypatch, dtype, ta, tb):
    """On a GPU or TPU a plain half-precision product is one GEMM that writes
    the result's dtype (the library accumulates in float32 and rounds once), as
    jnp.dot's is: a float32 result cast after cost 5-8% at n = 8192 on an H200.
    With an epilogue, or on CPU, the GEMM writes float32 and the epilogue rounds."""
    from dmatmul.backends.jax._kernels import common as kernels_common  # where contract() looks it up

    rng = np.random.default_rng(17)
    a, b, _ = operands(rng, 11, 5, 3, ta, tb, dtype=dtype)  # sizes no other test plans (a fresh trace)
    ja, jb = jnp.asarray(a), jnp.asarray(b)

    def lowered(**kw):
        f = jax.jit(lambda x, y: dm.matmul(x, y, transpose_a=ta, transpose_b=tb, devices=1, backend="jax", **kw))
        return f, f.lower(ja, jb).as_text()

    short = {"bfloat16": "bf16", "float16": "f16"}[dtype]
    monkeypatch.setattr(kernels_common, "traced_platform", lambda: "gpu")
    f, text = lowered()
    dots = [line for line in text.splitlines() if "dot_general" in line]
    assert dots and all(f"x{short}>" in line.split("->")[-1] for line in dots), dots
    d = f(ja, jb)  # XLA's CPU runs a half-precision dot of a half-precision result, as jnp.dot's
    assert d.dtype == jnp.dtype(dtype)
    assert_close(np.asarray(d), reference(a, b, transpose_a=ta, transpose_b=tb), dtype)
    _, text = lowered(alpha=2.0)  # an epilogue: float32 out of the GEMM, rounded after it
    assert any("xf32>" in line.split("->")[-1] for line in text.splitlines() if "dot_general" in line)
    monkeypatch.undo()
    _, text = lowered(alpha=0.5)  # on CPU: widened to float32 before the GEMM
    assert any("xf32>" in line.split("->")[-1] for line in text.splitlines() if "dot_general" in line)


# --------------------------------------------------------------------------- #
# one-shot schedules (one whole collective instead of a P - 1 step ring)
# --------------------------------------------------------------------------- #
def _vjp_and_jit(f, a, b, g):
    """``f(a, b)``, its vjp at ``g`` (da, db) and its jit, as jax arrays."""
    d, vjp = jax.vjp(f, jnp.asarray(a), jnp.asarray(b))
    return (d, *vjp(jnp.asarray(g)), jax.jit(f)(jnp.asarray(a), jnp.asarray(b)))


def _assert_product_and_gradients(got, a, b, g, ta, tb):
    """:func:`_vjp_and_jit`'s product, gradients and jitted product against numpy."""
    d, da, db, jitted = got
    opa, opb = (a.T if ta else a), (b.T if tb else b)
    assert_close(np.asarray(d), opa @ opb, "float32")
    assert_close(np.asarray(jitted), opa @ opb, "float32")
    want_a, want_b = g @ opb.T, opa.T @ g
    assert_close(np.asarray(da), want_a.T if ta else want_a, "float32")
    assert_close(np.asarray(db), want_b.T if tb else want_b, "float32")


# every kernel that has a one-shot and a bidirectional schedule, as the (a, b, result) layout that runs it
# (no transposes)
_ONE_SHOT_LAYOUTS = [(X, Y, X), (X, X, X), (X, Y, Y), (Y, Y, Y), (Y, X, X), (Y, X, Y)]


@pytest.mark.parametrize("schedule, said", [("one_shot", "one-shot"), ("bidirectional", "both ways")])
@pytest.mark.parametrize("dists", _ONE_SHOT_LAYOUTS, ids=lambda d: "".join(repr(x)[-1] for x in d))
def test_one_shot_and_bidirectional_schedules_match_numpy_with_gradients_and_jit(
    dists, schedule, said, tmp_path, monkeypatch
):
    """Each one-shot kernel and each ring run both ways (the schedule forced,
    the algorithm named, the operands laid out so the kernel takes them as
    given: the stored layouts giving the kernel's roles under each transpose),
    on uneven sizes over 3 ranks (padding; a bidirectional ring's odd blocks
    split 2 + 1, a block of 1 travels one way), every transpose: the product,
    its vjp and its jit against numpy, and explain() says what ran. (Left to
    auto, some transposed layouts rightly run otherwise at these sizes: a and
    b both stored row-split gather in two all-gathers to a local GEMM.)"""
    from dmatmul import _cost, _plan, _roles

    if schedule == "bidirectional":
        monkeypatch.setenv(_cost.MODEL_ENV, str(tmp_path / "model.json"))
        _cost.save_models({"cpu": _cost.MachineModel(1e-6, 1 / 4e9, 1 / 20e9, collective_alpha=1.0)})

    rng = np.random.default_rng(1)
    m, n, k = 7, 5, 4
    roles = _roles.roles_of(dists, (False, False), 3)
    kern = next(kern for kern in _plan.KERNELS
                if kern.schedule == schedule and (kern.a, kern.b, kern.d) == (roles["a"], roles["b"], roles["d"]))
    for ta, tb in itertools.product((False, True), repeat=2):
        a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
        g = rng.standard_normal((m, n)).astype(np.float32)
        opa, opb = (a.T if ta else a), (b.T if tb else b)
        stored = tuple(_roles.role_dist(op, roles[op], t) for op, t in zip(_plan.OPERANDS, (ta, tb, False)))
        kw = dict(distribution=stored, transpose_a=ta, transpose_b=tb, devices=3, precision="highest",
                  algorithm=kern.algorithm)
        with _plan.schedule(schedule):
            with dm.Matmul(a, b, **kw) as mm:
                mm.plan()
                assert mm._plan.cost.kernel == kern and said in mm.explain(), mm.explain()
                assert_close(mm.execute(), opa @ opb, "float32")

            got = _vjp_and_jit(lambda x, y: dm.matmul(x, y, **kw), a, b, g)
        _assert_product_and_gradients(got, a, b, g, ta, tb)


@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("blocks", [None, (2, 3)], ids=["noncyclic", "cyclic"])
def test_one_shot_summa_matches_numpy_with_gradients_and_jit(layout, blocks):
    """SUMMA as two all-gathers (op(A)'s row panel, op(B)'s column panel) and
    one GEMM, what the model runs for small products on a grid: on a 2x3 grid
    in both orders, BlockNonCyclic and BlockCyclic with uneven sizes (the
    panels' K positions of a and b laid out alike), each transpose: the
    product, its vjp and its jit against numpy, explain() says so, and the
    jaxpr gathers the panels."""
    from dmatmul import _plan

    grid = dm.ProcessGrid((2, 3), layout=layout)
    dist = dm.BlockNonCyclic(grid) if blocks is None else dm.BlockCyclic(grid, blocks)
    rng = np.random.default_rng(2)
    m, n, k = 13, 11, 7
    # every transpose over the two grid orders (each compiles three programs)
    for ta, tb in ((False, False), (True, True)) if layout == "row" else ((False, True), (True, False)):
        a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
        g = rng.standard_normal((m, n)).astype(np.float32)
        opa, opb = (a.T if ta else a), (b.T if tb else b)
        kw = dict(distribution=dist, transpose_a=ta, transpose_b=tb, devices=6, precision="highest",
                  algorithm="summa")
        with _plan.schedule("one_shot"):
            with dm.Matmul(a, b, **kw) as mm:
                assert "one-shot SUMMA on the 2x3 grid" in mm.explain(), mm.explain()
                assert_close(mm.execute(), opa @ opb, "float32")

            def f(x, y):
                return dm.matmul(x, y, **kw)

            got = _vjp_and_jit(f, a, b, g)
            jaxpr = str(jax.make_jaxpr(f)(a, b))
        assert jaxpr.count("all_gather[") >= 2, jaxpr  # (the uneven result is gathered whole by a ring after)
        _assert_product_and_gradients(got, a, b, g, ta, tb)


def test_the_model_runs_summa_one_shot_for_small_products_on_a_grid():
    """On a grid, small products run SUMMA as two whole collectives and one GEMM
    (0 messages, 2 collectives), large ones as the ring (each byte received
    the same either way); auto on GGG at n = 64 on 8 CPU devices says so."""
    from dmatmul import _cost, _plan

    model = _cost.model_for("cpu", 8)
    summa = [kern for kern in _plan.KERNELS if kern.algorithm == "summa"]
    ggg = {"a": "G", "b": "G", "d": "G"}

    def best(n):
        pr = _plan.Problem1D(n, n, n, 8, 4, 4, grid=(2, 4))
        found = _plan.plans(pr, ggg, model, kernels=summa, grid_ops=frozenset("abd"), native=frozenset("abd"))
        ring = next(pl for pl in found if pl.kernel.schedule == "ring")
        shot = next(pl for pl in found if pl.kernel.schedule == "one_shot")
        assert shot.nbytes == ring.nbytes and (shot.messages, shot.collectives) == (0, 2), (n, shot)
        return found[0].kernel.schedule

    assert best(64) == "one_shot" and best(4096) == "ring"
    dist = dm.BlockNonCyclic(dm.ProcessGrid((2, 4)))
    a, b = np.ones((64, 64), np.float32), np.ones((64, 64), np.float32)
    with dm.Matmul(a, b, distribution=dist, devices=8) as mm:
        assert "one-shot SUMMA on the 2x4 grid" in mm.explain() and "in 2 collectives" in mm.explain(), mm.explain()
        assert_close(mm.execute(), reference(a, b), "float32")


def test_the_model_costs_a_collective_as_one_call_and_picks_the_schedule_by_size():
    """A one-shot schedule and a psum are one collective; a 1-D move is one
    all-gather or all-to-all call; auto picks the one-shot schedule for small
    products and the ring for large ones on the 8-device CPU model (its
    prediction, not a threshold: both are costed)."""
    from dmatmul import _cost, _moves, _plan

    model = _cost.model_for("cpu", 8)
    xyx = {"a": "M", "b": "N", "d": "M"}
    small, large = _plan.Problem1D(64, 64, 64, 8, 4, 4), _plan.Problem1D(4096, 4096, 4096, 8, 4, 4)
    best = _plan.plans(small, xyx, model)[0]
    assert (best.kernel.algorithm, best.kernel.schedule, best.messages, best.collectives) == (
        "allgather", "one_shot", 0, 1)
    ring = next(pl for pl in _plan.plans(small, xyx, model) if pl.kernel.schedule == "ring" and
                pl.algorithm == "allgather")
    assert ring.messages == 7 and ring.collectives == 0 and ring.time > best.time
    assert _plan.plans(large, xyx, model)[0].kernel.schedule == "ring"
    psum = next(pl for pl in _plan.plans(small, {"a": "K", "b": "K", "d": "R"}, model) if pl.algorithm == "allreduce")
    assert (psum.messages, psum.collectives) == (0, 1)
    gather = _moves.move(small, "d", "M", "R")
    assert (gather.messages, gather.collectives) == (0, 1)
    with _plan.schedule("ring"):
        assert _plan.plans(small, xyx, model)[0].kernel.schedule == "ring"
    mm = dm.Matmul(np.ones((64, 64), np.float32), np.ones((64, 64), np.float32), distribution=(X, Y, X), devices=8)
    text = mm.explain()
    assert "one-shot AllGather+GEMM" in text and "in 1 collective" in text


def test_rings_run_both_ways_where_the_model_says_two_rings_pay(tmp_path, monkeypatch):
    """dm.matmul's rings, as dmatmul.jax's blocks: both ways (two rings, half of
    each block each way) where the platform's model says a link carries both
    directions at once and a block's bytes outweigh a second message per step:
    the GPU and TPU models, large products on 3 or more ranks; never on CPU or
    on two ranks, and not for small products (one collective wins there). Both
    ways a rank receives the same bytes in twice the messages. Under a
    calibration file that calls the CPU's links duplex (its collectives slow,
    its GEMMs bound by flops), auto runs both ways:
    explain() says so, the jaxpr sends left and right, the product matches numpy."""
    import dataclasses
    import re

    from dmatmul import _cost, _plan

    for platform, p, roles in itertools.product(("gpu", "tpu", "cpu"), (2, 3, 8), ("MNM", "KKM", "MKM", "KNN")):
        model, given = _cost.DEFAULT_MODELS[platform], dict(zip("abd", roles))
        # (among the kernels that take these layouts as they are: summa25d, which re-lays any layout, may win
        # at these sizes on 8 ranks)
        kernels = [k for k in _plan.KERNELS if not _plan.ALGORITHMS[k.algorithm].relays]
        large = _plan.plans(_plan.Problem1D(16384, 16384, 16384, p, 4, 4), given, model, kernels=kernels)
        ring, both = (next(pl for pl in large if pl.kernel == dataclasses.replace(large[0].kernel, schedule=s))
                      for s in ("ring", "bidirectional"))
        assert both.nbytes == ring.nbytes and both.messages == 2 * ring.messages, (platform, p, roles)
        assert (large[0].kernel.schedule == "bidirectional") == (platform != "cpu" and p > 2), (platform, p, roles)
        small = _plan.plans(_plan.Problem1D(256, 256, 256, p, 4, 4), given, model, kernels=kernels)[0]
        assert small.kernel.schedule != "bidirectional", (platform, p, roles)

    monkeypatch.setenv(_cost.MODEL_ENV, str(tmp_path / "model.json"))
    # (whole collectives made slow, GEMMs bound by flops: one-shot schedules would win at these sizes, and
    # each half-block GEMM reads the other operand whole)
    _cost.save_models({"cpu": _cost.MachineModel(1e-12, 1 / 4e9, 1 / 20e9, mem=1e-15, collective_alpha=1.0,
                                                 duplex=True)})
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((61, 47)).astype(np.float32), rng.standard_normal((47, 39)).astype(np.float32)
    # (each ring kernel named: at these sizes auto may rightly take another kernel after a cheap exchange,
    # e.g. Y, Y, Y as reduce_scatter with b re-laid; the schedule, both ways or not, stays the model's choice)
    for dists, algorithm in (((X, Y, X), "allgather"), ((Y, X, Y), "reduce_scatter"), ((Y, Y, Y), "allgather")):
        with dm.Matmul(a, b, distribution=dists, devices=8, algorithm=algorithm) as mm:
            assert "both ways" in mm.explain() and mm.algorithm == algorithm, mm.explain()
            assert_close(mm.execute(), reference(a, b), "float32")
        # (traced, the global operands could be multiplied whole on every device: the algorithm named)
        jaxpr = str(jax.make_jaxpr(lambda x, y: dm.matmul(x, y, distribution=dists, devices=8,
                                                          algorithm=algorithm))(a, b))
        firsts = set(re.findall(r"perm=\(\(0, (\d+)\)", jaxpr))
        assert firsts == {"1", "7"}, (dists, firsts)  # rank 0 sends to its right and its left neighbour
