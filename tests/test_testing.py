"""dmatmul.testing as a user's own tests call it: the public check and the
numpy reference, catching a broken backend."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import dmatmul as dm
from dmatmul._plans import PLANS
import dmatmul.testing


@pytest.fixture
def jax_backend():
    pytest.importorskip("jax")
    return dm.backends.get("jax")


def test_a_users_check_passes_on_this_backend(jax_backend):
    result = dmatmul.testing.check(cases=20, seed=1)
    assert result.failures == 0, str(result)
    assert len(result.outcomes) == 20 and {o.status for o in result.outcomes} <= {"passed", "refused"}
    assert "layout family" in str(result) and "total" in str(result)


def test_a_users_check_catches_a_broken_kernel(jax_backend, monkeypatch):
    """Every local GEMM of every kernel returns twice the product: the same call fails, naming the error."""
    from dmatmul.backends.jax import _kernels

    mm = _kernels.LocalProblem.mm
    monkeypatch.setattr(_kernels.LocalProblem, "mm", lambda self, a, b: 2 * mm(self, a, b))
    monkeypatch.setattr(PLANS, "_shelves", {})  # no plan made before the break
    result = dmatmul.testing.check(cases=20, seed=1)
    assert result.failures > 0
    assert all("max error" in o.message for o in result.failed), str(result)
    assert "failure(s):" in str(result) and "dm.matmul(" in str(result)  # a line that reproduces each


def test_a_users_case_catches_a_broken_empty_product(jax_backend, monkeypatch):
    """A product of K = 0 (beta * C, read by no kernel): passes, then fails where EmptyPlan is wrong."""
    from dmatmul import _empty

    case = dmatmul.testing.Case(nranks=2, m=5, n=3, k=0, dtype="float64", transpose_a=False, transpose_b=False,
                                distributions=(dm.Slab.X, dm.Slab.X, dm.Slab.X), beta=0.5, use_c=True)
    assert dmatmul.testing.run_case(case).status == "passed"
    execute = _empty.EmptyPlan.execute
    monkeypatch.setattr(_empty.EmptyPlan, "execute", lambda self, ops: 2 * execute(self, ops))
    monkeypatch.setattr(PLANS, "_shelves", {})
    for c in (case, dataclasses.replace(case, family="jax")):
        out = dmatmul.testing.run_case(c)
        assert out.status == "failed" and "max error" in out.message, out


def test_cases_are_the_seeds_draws():
    """cases(seed, n) draws what dmatmul check --seed draws: case i by NumpyChooser([seed, i])."""
    mine = list(dmatmul.testing.cases(seed=3, n=5))
    again = list(dmatmul.testing.cases(seed=3, n=2, start=3))
    for i, case in enumerate(mine):
        ch = dmatmul.testing.NumpyChooser([3, i])
        assert case == dmatmul.testing.draw_case(ch, ch.choice(dmatmul.testing.NRANKS))
    assert again == mine[3:] and mine != list(dmatmul.testing.cases(seed=4, n=5))


def test_the_reference_in_a_users_test():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 4)), rng.standard_normal((5, 4))
    want = np.maximum(2.0 * a @ b.T, 0)
    got = dmatmul.testing.reference(a, b, alpha=2.0, transpose_b=True, epilog="relu")
    assert np.allclose(got, want, rtol=1e-14, atol=1e-14)
    dmatmul.testing.assert_close(want.astype(np.float32), got, "float32")
    with pytest.raises(AssertionError, match="max error"):
        dmatmul.testing.assert_close(want + 1e-3, got, "float32")
