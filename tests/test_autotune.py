"""``Matmul.autotune()``: the cost model's cheapest routes timed, the fastest
kept (:mod:`dmatmul._autotune`). Which route is fastest is made so by delaying
routes (never read off this machine's speed); every result is checked against
numpy. 8 simulated CPU devices."""

from __future__ import annotations

import time

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import dmatmul as dm  # noqa: E402
from dmatmul import _autotune, _plan  # noqa: E402
from dmatmul._matmul import plan_of  # noqa: E402
from dmatmul.testing.reference import assert_close, reference  # noqa: E402

GRID = dm.BlockNonCyclic(dm.ProcessGrid((2, 4)))


@pytest.fixture(autouse=True)
def _forget_tuning():
    """What a test's autotune kept is planned for that product from then on (in this process): forgotten after
    each test, so that no other test's product runs it."""
    from dmatmul._plans import PLANS

    yield
    PLANS.clear("jax")


def _operands(m=96, n=80, k=64, seed=3):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


def _delaying(monkeypatch, slow):
    """Make ``tune`` see the routes for which ``slow(kernel)`` holds 20 ms slower; returns the kernels timed."""
    real, timed = _autotune.tune, []

    def tune(routes, run, iterations, what="Matmul.autotune"):
        timed.extend(kernel for kernel, _ in routes)

        def delayed(plan):
            out = run(plan)
            if slow(plan.cost.kernel):
                time.sleep(0.02)
            return out

        return real(routes, delayed, iterations, what)

    monkeypatch.setattr(_autotune, "tune", tune)
    return timed


@pytest.mark.parametrize("dists", [(GRID, GRID, GRID), (dm.Slab.X, dm.Slab.Y, dm.Slab.X),
                                   (dm.Slab.Y, dm.Slab.X, dm.Slab.Y)], ids=["grid", "XYX", "YXY"])
def test_autotune_keeps_the_fastest_route_and_says_so(monkeypatch, dists):
    """The model's pick made the slowest: another route is kept, runs every
    later execute() (and after reset_operands), and explain() lists the routes
    timed, the model's pick marked; the results match numpy."""
    a, b = _operands()
    with dm.Matmul(a, b, distribution=dists, devices=8) as mm:
        mm.plan()
        modelled = plan_of(mm).cost.kernel
        timed = _delaying(monkeypatch, lambda kernel: kernel == modelled)
        mm.autotune(iterations=2, candidates=3)
        kept = plan_of(mm).cost.kernel
        assert timed[0] == modelled and kept in timed[1:] and len(timed) == 3
        told = mm.explain()
        assert "autotuned:  3 routes timed, median of 2" in told
        assert f"{_autotune.label(modelled)}" in told and "the model's pick" in told
        assert told.index(_autotune.label(kept)) < told.index(_autotune.label(modelled))
        assert mm.algorithm == kept.algorithm
        assert_close(mm.execute(), reference(a, b), "float32")
        a2, b2 = _operands(seed=4)
        mm.reset_operands(a=a2, b=b2)
        assert plan_of(mm).cost.kernel == kept
        assert_close(mm.execute(), reference(a2, b2), "float32")


def test_autotune_times_the_cheapest_route_of_each_algorithm_and_schedule(monkeypatch):
    """The candidates: the model's pick first, then the cheapest route of each
    other (algorithm, schedule), cheapest first; with nothing delayed the
    kept route is one of them and its timing the least."""
    a, b = _operands()
    timed = _delaying(monkeypatch, lambda kernel: False)
    with dm.Matmul(a, b, distribution=(GRID, GRID, GRID), devices=8) as mm:
        mm.autotune(iterations=1, candidates=5)
        assert len(timed) == 5 and len({(k.algorithm, k.schedule) for k in timed}) == 5
        costs = []
        for kernel in timed[1:]:
            with _plan.schedule(kernel), dm.Matmul(a, b, distribution=(GRID, GRID, GRID), devices=8) as forced:
                costs.append(plan_of(forced).cost.time)
        assert costs == sorted(costs)
        assert plan_of(mm).cost.kernel in timed
        assert_close(mm.execute(), reference(a, b), "float32")


@pytest.mark.parametrize("kwargs, says", [({"iterations": 0}, "iterations must be an int >= 1, got 0"),
                                          ({"candidates": True}, "candidates must be an int >= 1, got True"),
                                          ({"iterations": 2.0}, "iterations must be an int >= 1, got 2.0")])
def test_autotune_refuses_bad_counts(kwargs, says):
    a, b = _operands()
    with dm.Matmul(a, b, distribution=dm.Slab.X, devices=8) as mm:
        with pytest.raises(ValueError, match=says):
            mm.autotune(**kwargs)
        assert_close(mm.execute(), reference(a, b), "float32")  # (nothing changed)


def test_autotune_of_a_batched_product_is_refused():
    """A batch runs the matrix plan item by item or folded: no route of its own to time."""
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 16, 8)).astype(np.float32), rng.standard_normal((3, 8, 4)).astype(np.float32)
    with dm.Matmul(a, b, devices=8) as mm:
        with pytest.raises(ValueError, match="Matmul.autotune: a batched, re-laid or empty product is not tuned"):
            mm.autotune()
        assert_close(mm.execute(), np.matmul(a.astype(np.float64), b.astype(np.float64)), "float32")


def test_autotune_inside_a_jax_trace_is_refused():
    a, b = _operands()

    def f(x, y):
        with dm.Matmul(x, y, devices=8, algorithm="auto") as mm:
            mm.autotune()
            return mm.execute()

    with pytest.raises(ValueError, match="Matmul.autotune: inside a JAX trace"):
        jax.jit(f)(a, b)


def test_later_plans_of_the_product_take_the_route_autotune_kept(monkeypatch):
    """After one Matmul's autotune on jax.Arrays, another Matmul of the same
    product (same shapes, layouts, options, array family) and dm.matmul run
    the route it kept (a dm.matmul runner kept from before is dropped), and
    explain() says it was autotuned; a product that differs (numpy operands,
    whose plan places them; another alpha) plans as the model picks; clearing the plan cache (as
    dm.finalize() does) forgets it."""
    from dmatmul._plans import PLANS

    a, b = _operands(seed=8)
    ja, jb = jax.numpy.asarray(a), jax.numpy.asarray(b)
    dists = (dm.Slab.X, dm.Slab.Y, dm.Slab.X)
    assert_close(dm.matmul(ja, jb, distribution=dists, devices=8), reference(a, b), "float32")  # a runner kept
    with dm.Matmul(ja, jb, distribution=dists, devices=8) as mm:
        mm.plan()
        modelled = plan_of(mm).cost.kernel
        _delaying(monkeypatch, lambda kernel: kernel == modelled)
        mm.autotune(iterations=2, candidates=3)
        kept = plan_of(mm).cost.kernel
    assert kept != modelled
    with dm.Matmul(a, b, distribution=dists, devices=8) as numpy_operands:  # (another product: numpy's)
        assert "autotuned" not in numpy_operands.explain()
    with dm.Matmul(ja, jb, distribution=dists, devices=8) as again:
        assert plan_of(again).cost.kernel == kept and "autotuned:  3 routes timed" in again.explain()
        assert_close(again.execute(), reference(a, b), "float32")
        cls = type(plan_of(again))
    ran = []
    real = cls.execute
    monkeypatch.setattr(cls, "execute", lambda self, ops: ran.append(self.cost.kernel) or real(self, ops))
    jnp_out = dm.matmul(ja, jb, distribution=dists, devices=8)
    assert ran == [kept]  # (not the runner of the model's plan kept by the first call)
    assert_close(jnp_out, reference(a, b), "float32")
    with dm.Matmul(ja, jb, distribution=dists, devices=8, alpha=2.0) as other:
        assert plan_of(other).cost.kernel == modelled and "autotuned" not in other.explain()
    PLANS.clear("jax")
    with dm.Matmul(ja, jb, distribution=dists, devices=8) as cleared:
        assert plan_of(cleared).cost.kernel == modelled
