"""dmatmul._options.Options: the keywords of dm.matmul and dm.Matmul as one
validated, hashable value, whose every field ranks compare."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import dmatmul as dm
from dmatmul import _matmul
from dmatmul._epilogue import Epilog
from dmatmul._options import Options

X, Y = dm.Slab.X, dm.Slab.Y

#: For every field of Options, a value other than its default (a new field needs one: see the tests)
OTHER = dict(distribution=Y, alpha=2.0, beta=1.0, transpose_a=True, transpose_b=True, epilog="relu",
             backend="jax", algorithm="allgather", precision="high", devices=1,
             quantization_scales={"a": 2.0}, result_type="float32", block_scaled="float8_e4m3fn")


def test_every_field_has_another_value_here():
    assert set(OTHER) == {f.name for f in dataclasses.fields(Options)}


def test_options_are_one_spelling_hashable_comparable_and_frozen():
    one = Options(distribution=X, epilog="relu", precision="tensorfloat32", transpose_a=np.bool_(True), devices=[0])
    same = Options(distribution=[X, X, X], epilog=Epilog("relu"),
                   precision="high", transpose_a=True, devices=(0,))
    assert one == same and hash(one) == hash(same) and len({one, same}) == 1
    assert one.distribution == (X, X, X) and one.precision == "high" and one.devices == (0,)
    assert type(one.transpose_a) is bool
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.alpha = 2.0  # type: ignore[misc]
    for name, value in OTHER.items():
        assert Options(**{name: value}) != Options(), name


BAD = [
    dict(transpose_a=1),
    dict(transpose_b="yes"),
    dict(epilog="tanh"),
    dict(backend="cuda"),
    dict(algorithm="cannon"),
    dict(precision="HIGHEST"),
    dict(devices=0),
    dict(devices="all"),
    dict(distribution=(X, Y)),
    dict(distribution="X"),
    dict(distribution=(X, Y, "X")),
    dict(alpha=np.ones(1, np.float32)),
    dict(beta=True),
    dict(quantization_scales={"a": None}),
    dict(quantization_scales={"c": 2.0}),
    dict(result_type="float64"),
]


@pytest.mark.parametrize("bad", BAD, ids=lambda kw: "-".join(f"{k}={v!r}" for k, v in kw.items()))
def test_options_refuse_as_matmul_does(bad):
    """Each keyword is checked by Options alone, with the error type and message
    dm.matmul raises for it."""
    with pytest.raises((TypeError, ValueError)) as made:
        Options(**bad)
    a, b = np.ones((4, 3), np.float32), np.ones((3, 2), np.float32)
    with pytest.raises(type(made.value)) as called:
        dm.matmul(a, b, np.ones((4, 2), np.float32), **bad)
    assert str(called.value) == str(made.value)


def test_ranks_compare_every_option_of_a_call_and_of_a_plan():
    """What ranks compare (the call's options; the product a plan runs) tells
    apart two calls that differ in any one option: no field is left out."""
    base = Options(distribution=X)
    for name, value in OTHER.items():
        assert dataclasses.replace(base, **{name: value}).agreed() != base.agreed(), name
    a, b, c = np.ones((8, 4), np.float32), np.ones((4, 6), np.float32), np.ones((8, 6), np.float32)
    with dm.Matmul(a, b, c, distribution=X, backend="jax") as mm:
        spec = mm._spec
    product = _matmul._product(spec, "jax")
    for name, value in OTHER.items():
        if name == "backend":
            other = _matmul._product(spec, "nvmath")
        else:
            got = getattr(Options(**{name: OTHER[name]}), name)
            other = _matmul._product(dataclasses.replace(spec, options=dataclasses.replace(
                spec.options, **{name: got})), "jax")
        assert other != product, name
    assert dict(Options(distribution=(X, Y, X)).agreed())["the distribution of b"] == Y


def test_one_value_describes_the_product_from_the_call_to_the_kernels():
    """The Spec the call makes is the one the planner sizes, the kernels read
    (their per-rank problem, their epilogue) and nvmath's translation takes:
    no copy of its fields on the way."""
    from dmatmul._spec import BACKENDS
    from dmatmul.backends import NAMES
    from dmatmul.backends.nvmath._translate import Problem

    assert BACKENDS == NAMES  # the backend= names Options checks are the table's
    a, b, c = np.ones((8, 4), np.float32), np.ones((4, 6), np.float32), np.ones((8, 6), np.float32)
    with dm.Matmul(a, b, c, beta=0.5, epilog="relu", precision="highest", backend="jax", devices=2,
                   distribution=dm.Slab.X) as mm:
        spec, plan = mm._spec, _matmul.plan_of(mm)
        assert plan.local.spec is spec and plan.epilogue.spec is spec
        assert (spec.m, spec.n, spec.k, spec.beta, spec.use_c) == (8, 6, 4, 0.5, True)
        assert (plan.problem.m, plan.problem.n, plan.problem.k) == (spec.m, spec.n, spec.k)
        problem = Problem.from_spec(spec, 2, ("C", "C", "C"))
        assert problem.spec is spec and problem.distributions == spec.distributions
    # the batch dims of a stored shape are the leading ones, broadcast as numpy.matmul does
    batched = dataclasses.replace(spec, a_shape=(3, 1, 8, 4), b_shape=(5, 4, 6))
    assert (batched.batch_shape, batched.result_shape, batched.m, batched.k, batched.n) == \
        ((3, 5), (3, 5, 8, 6), 8, 4, 6)
