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
             backend="jax", algorithm="allgather", precision="high", devices=1)


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
            field = "distributions" if name == "distribution" else name
            got = getattr(Options(**{name: OTHER[name]}), name)
            other = _matmul._product(dataclasses.replace(spec, **{field: got}), "jax")
        assert other != product, name
    assert dict(Options(distribution=(X, Y, X)).agreed())["the distribution of b"] == Y
