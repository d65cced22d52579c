"""The copies a kernel makes in a rank's memory besides its GEMMs are priced
as its compiled program makes them (:meth:`dmatmul.algorithms.base.Algorithm.copied`),
counted in the HLO of each one-shot kernel on operands already in its roles,
stored either way. 8 simulated CPU devices; every result is checked against numpy."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import dmatmul as dm  # noqa: E402
from dmatmul import _plan, _roles  # noqa: E402
from dmatmul._matmul import plan_of  # noqa: E402
from dmatmul.testing.reference import assert_close, reference  # noqa: E402
from _hlo import laid_out_bytes, transposed_dot_bytes  # noqa: E402

importlib.import_module("dmatmul.backends.jax")

P = 8
GRID = dm.BlockNonCyclic(dm.ProcessGrid((2, 4)))
STORED = [(False, False), (True, False), (False, True), (True, True)]
#: each one-shot kernel on operands stored either way; SUMMA where its layout is the grid's as given (a transposed
#: operand is re-laid onto SUMMA's grid of op(A) or op(B) first, whose copies the moves price)
CASES = [(k, t) for k in _plan.KERNELS if k.schedule == "one_shot" and k.algorithm in ("allgather", "reduce_scatter")
         for t in STORED] + [(k, (False, False)) for k in _plan.KERNELS if k.schedule == "one_shot" and k.algorithm == "summa"]


def _dist(operand: str, role: str, transposed: bool) -> dm.Distribution:
    if role == "G":
        return GRID
    return dm.Slab.X if _roles.stored_dims(operand, transposed).index(role) == 0 else dm.Slab.Y


@pytest.mark.parametrize("kernel, transposes", CASES,
                         ids=[f"{k.algorithm}-{k.a}{k.b}{k.d}-{'T' if ta else 'N'}{'T' if tb else 'N'}"
                              for k, (ta, tb) in CASES])
def test_one_shot_kernel_copies_are_priced_as_compiled(kernel, transposes):
    """``Plan.kernel_copied`` is what the compiled kernel lays out: an operand
    gathered along a stored axis that does not lead (op(A)'s K for A stored
    M x K, op(B)'s N for B stored K x N, SUMMA's panels likewise) is laid out
    whole once; a reduce-scatter onto the result's columns transposes its
    block back, and where a and b are stored as given its dot writes the whole
    partial product through a transposing copy (a dot contracting its lhs's
    leading and its rhs's trailing axis); every other one-shot kernel copies
    nothing."""
    ta, tb = transposes
    m, n, k = 256, 128, 192
    rng = np.random.default_rng(7)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    dists = tuple(_dist(op, kernel.role(op), t) for op, t in zip("abd", (ta, tb, False)))
    with _plan.schedule(kernel):
        mm = dm.Matmul(a, b, distribution=dists, transpose_a=ta, transpose_b=tb, backend="jax", devices=P)
        mm.plan()
    plan = plan_of(mm)
    assert plan.cost.kernel == kernel and not plan.cost.moves, plan.cost
    assert_close(np.asarray(mm.execute()), reference(a, b, transpose_a=ta, transpose_b=tb), "float32")
    fn = plan._function("padded")
    args = [jax.ShapeDtypeStruct(plan.given[op].shape, jnp.float32, sharding=plan.sharding(op)) for op in "ab"]
    with plan._own_context():
        hlo = fn.lower(*args, None, None).compile().as_text()
    copied = laid_out_bytes(hlo) + transposed_dot_bytes(hlo)
    assert plan.cost.kernel_copied == copied, (plan.cost.kernel_copied, laid_out_bytes(hlo), transposed_dot_bytes(hlo))
    mm.free()


def test_the_copies_are_in_the_modelled_time():
    """The copies are priced at the memory rate, in the plan's time and its terms."""
    from dmatmul import _cost

    model = _cost.model_for("cpu", P, calibrated=False)
    pr = _plan.Problem1D(1024, 1024, 1024, P, 4, 4)
    kern = _plan.Kernel("allgather", "K", "N", "N", moving="a", schedule="one_shot")
    plan = next(pl for pl in _plan.plans(pr, {"a": "K", "b": "N", "d": "N"}, model) if pl.kernel == kern)
    assert plan.kernel_copied == 1024 * 1024 * 4
    bare = _plan.costed_plan(pr, kern, plan.moves, plan.kernel_bytes, plan.kernel_messages, plan.kernel_collectives,
                             plan.flops, model)
    assert plan.time - bare.time == pytest.approx(model.mem_beta * plan.kernel_copied)
    assert sum(getattr(model, t) * v for t, v in zip(_plan.TERMS, plan.terms)) == pytest.approx(plan.time)
