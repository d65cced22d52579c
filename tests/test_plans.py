"""dmatmul._plans: one plan cache for dm.matmul and dm.Matmul on every
backend; each product planned once."""

from __future__ import annotations

import numpy as np
import pytest

import dmatmul as dm
from dmatmul import backends
from dmatmul._matmul import plan_of
from dmatmul._plans import PLANS, Plans


class _Plan(backends.BackendPlan):
    def __init__(self, spec, freed):
        self.spec, self._freed = spec, freed

    def free(self):
        self._freed.append(self.spec)


class _Toy(backends.Backend):
    """A backend whose plans count their frees."""

    name = "toy"
    cache_size = 2

    def __init__(self):
        self.made, self.freed = [], []

    def plan(self, spec, operands):
        self.made.append(spec)
        return _Plan(spec, self.freed)


class _Spec:
    spmd = False


def test_a_plan_is_made_once_borrowed_and_freed_when_it_left_and_no_borrow_is_left():
    plans, toy = Plans(), _Toy()
    one, two, three = _Spec(), _Spec(), _Spec()
    held = plans.borrow(toy, one, None)
    again = plans.borrow(toy, one, None)
    assert toy.made == [one] and held.backend_plan is again.backend_plan  # one plan, two borrows
    again.free()
    assert toy.freed == []  # a returned borrow frees nothing
    plans.borrow(toy, two, None).free()
    plans.borrow(toy, three, None).free()  # past the bound: `one`, unused longest, leaves, borrowed
    assert plans.held("toy") == [_held(plans, two), _held(plans, three)] and toy.freed == []
    assert plans.left("toy") == [held.backend_plan]
    held.free()  # its last borrow: freed now
    assert toy.freed == [one] and plans.left("toy") == []
    plans.borrow(toy, _Spec(), None).free()  # `two` leaves unborrowed: freed at once
    assert toy.freed == [one, two]
    plans.clear("toy")
    assert sorted(map(id, toy.freed)) == sorted(map(id, toy.made)) and plans.held("toy") == []


def _held(plans, spec):
    return next(p for p in plans.held("toy") if p.spec is spec)


def test_runners_leave_with_their_plan():
    plans, toy = Plans(), _Toy()
    first = plans.borrow(toy, _Spec(), None)
    plans.keep_runner("call", first, lambda ops: "ran")
    first.free()
    assert plans.runner("call")("ops") == "ran"
    for _ in range(2):  # the plan leaves the cache: its runner goes with it
        plans.borrow(toy, _Spec(), None).free()
    assert plans.runner("call") is None


@pytest.mark.parametrize("first", ["matmul", "Matmul"])
def test_matmul_and_Matmul_share_one_plan_made_once(monkeypatch, first):
    """The JAX backend's planner runs once for a product, whichever of dm.matmul
    and dm.Matmul asks first, and the memory check before it reads the same plan."""
    pytest.importorskip("jax")
    backend = dm.backends.get("jax")
    monkeypatch.setattr(PLANS, "_shelves", {})
    made = []
    plan = type(backend).plan
    monkeypatch.setattr(type(backend), "plan", lambda self, spec, ops: made.append(spec) or plan(self, spec, ops))
    a, b = np.ones((6, 4), np.float32), np.ones((4, 5), np.float32)
    kw = dict(distribution=dm.Slab.X, devices=2)

    def with_matmul():
        np.testing.assert_array_equal(dm.matmul(a, b, **kw), a @ b)

    def with_Matmul():
        with dm.Matmul(a, b, **kw) as mm:
            np.testing.assert_array_equal(mm.execute(), a @ b)
            return plan_of(mm)

    for run in ((with_matmul, with_Matmul) if first == "matmul" else (with_Matmul, with_matmul)) * 2:
        run()
    assert len(made) == 1
    assert PLANS.held("jax") == [with_Matmul()]
