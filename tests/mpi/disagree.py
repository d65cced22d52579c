"""Run under ``mpiexec -n 4``: ranks that disagree raise on every rank, promptly.

Every scenario changes one thing on rank 1 only. Each rank must raise the
expected error naming the field and rank 1, within 10 s; no rank may hang.
Then the ranks must still work together, and products that are right on
every rank (operands on two different grids, K = 0, ``dm.init`` twice) are
checked against numpy. Prints ``ok <scenario>`` per scenario on rank 0;
exits 1 if any rank saw something else.
"""

from __future__ import annotations

import contextlib

import _expect
import numpy as np

import dmatmul as dm

rt = dm.init()
P, me = rt.size, rt.rank
assert P == 4, "run with mpiexec -n 4"
X, Y = dm.Slab.X, dm.Slab.Y
M = N = K = 12
rng = np.random.default_rng(7)
a = rng.standard_normal((M, K)).astype(np.float32)
b = rng.standard_normal((K, N)).astype(np.float32)
c = rng.standard_normal((M, N)).astype(np.float32)
la, lb, lc = dm.split(a, X)[me], dm.split(b, Y)[me], dm.split(c, X)[me]
problems: list[str] = []
odd = me == 1


def expect(scenario, exc_type, words, call):
    _expect.expect(rt, problems, scenario, exc_type, words, call)


def call(**changes):
    kw = dict(distribution=(X, Y, X), alpha=1.0, beta=0.0, epilog=None, transpose_a=False)
    if odd:
        kw.update(changes)
    return lambda: dm.matmul(la, lb, lc, **kw)


expect("result-distribution", ValueError, ["distribution of the result", "rank 1"], call(distribution=(X, Y, Y)))
expect("alpha", ValueError, ["alpha", "rank 1 passes 2.0"], call(alpha=2.0))
expect("beta", ValueError, ["beta", "rank 1"], call(beta=0.5))
expect("epilog", ValueError, ["epilog", "rank 1 passes 'relu'"], call(epilog="relu"))
expect("precision", ValueError, ["precision", "rank 1 passes 'high'"], call(precision="high"))
expect("transpose-on-square", ValueError, ["transpose_a", "rank 1"], call(transpose_a=True))
expect(
    "grid-instead-of-slab", ValueError, ["distribution of a", "rank 1"],
    call(distribution=(dm.BlockNonCyclic(dm.ProcessGrid((4, 1))), Y, X)),
)
expect(
    "dtype", ValueError, ["dtype", "rank 1 passes 'float64'"],
    lambda: dm.matmul(la.astype(np.float64) if odd else la, lb.astype(np.float64) if odd else lb,
                      distribution=(X, Y, X)),
)
expect(
    "one-extra-row", dm.DistributionError, ["a:", "block of rank 1", "(4, 12)"],
    lambda: dm.matmul(np.vstack([la, la[:1]]) if odd else la, lb, distribution=(X, Y, X)),
)
expect(
    "c-one-row-short", dm.DistributionError, ["c:", "block of rank 1", "(2, 12)", "(3, 12)"],
    lambda: dm.matmul(la, lb, lc[:-1] if odd else lc, beta=1.0, distribution=(X, Y, X)),
)
expect(
    "init-on-another-comm", ValueError, ["another communicator", "dm.finalize()"],
    lambda: dm.init(rt.comm.Split(me % 2, me)),
)
R = dm.Replicated()
expect("redistribute-dst", ValueError, ["dst", "rank 1 passes Slab.Y"],
       lambda: dm.redistribute(la, X, Y if odd else R))
expect("redistribute-src", ValueError, ["src", "rank 1 passes Slab.Y"],
       lambda: dm.redistribute(la, Y if odd else X, X))
expect("redistribute-dtype", ValueError, ["dtype", "rank 1 passes 'float64'"],
       lambda: dm.redistribute(la.astype(np.float64) if odd else la, X, Y))
bias = np.ones(M, np.float32)
expect("bias-matrix-instead-of-vector", ValueError, ["bias", "(2, 12)"],
       call(epilog="bias", bias=np.ones((2, M), np.float32)) if odd else call(epilog="bias", bias=bias))
expect("alpha-overflows", ValueError, ["alpha", "does not fit a double"], call(alpha=10**400))
if odd:  # rank 1's node has what nvmath needs (a GPU, nvmath-python): backend="auto" finds nvmath there
    probe = dm.backends.probe
    dm.backends.probe = lambda name: None if name == "nvmath" else probe(name)
expect("auto-finds-another-backend", ValueError, ["the backend that backend='auto' finds", "rank 1 finds 'nvmath'",
                                                   "ranks 0, 2, 3 find 'jax'", "backend='jax'"], call())
if odd:
    dm.backends.probe = probe


class Unconvertible:
    """An operand whose conversion raises an error of a type dmatmul does not expect."""

    def __array__(self, *args, **kwargs):
        raise KeyError("cannot convert")


expect("operand-conversion-raises-keyerror", Exception, ["cannot convert"],
       lambda: dm.matmul(Unconvertible() if odd else la, lb, distribution=(X, Y, X)))
expect("redistribute-conversion-raises-keyerror", Exception, ["cannot convert"],
       lambda: dm.redistribute(Unconvertible() if odd else la, X, Y))
import jax.numpy as jnp  # noqa: E402 - the JAX backend runs these products anyway

import jax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

spanning = jax.make_array_from_process_local_data(
    NamedSharding(jax.make_mesh((P,), ("ranks",), devices=jax.devices()), PartitionSpec("ranks")), la
)
expect("global-jax-array-instead-of-a-block", ValueError, ["a is a jax.Array that spans several processes"],
       lambda: dm.matmul(spanning, lb, distribution=(X, Y, X)))
# one of the shape of rank 1's block (3 x 12: its columns over the 4 processes), so no shape check stops it first
spanning_block = jax.make_array_from_process_local_data(
    NamedSharding(jax.make_mesh((P,), ("ranks",), devices=jax.devices()), PartitionSpec(None, "ranks")),
    la[:, 3 * me:3 * me + 3],
)
expect("redistribute-global-jax-array", ValueError, ["x is a jax.Array that spans several processes"],
       lambda: dm.redistribute(spanning_block if odd else la, X, Y))
dead = jnp.asarray(la)
if odd:
    dead.delete()
expect("deleted-jax-array", ValueError, ["a is a deleted jax.Array"],
       lambda: dm.matmul(dead, lb, distribution=(X, Y, X)))
with dm.Matmul(jnp.asarray(la), lb, distribution=(X, Y, X)) as mm:
    mm.execute()
    expect("reset-deleted-jax-array", ValueError, ["a is a deleted jax.Array"],
           lambda: mm.reset_operands(a=dead if odd else jnp.asarray(la)))
alive = jnp.asarray(la)
with dm.Matmul(alive, lb, distribution=(X, Y, X)) as mm:
    mm.execute()
    if odd:
        alive.delete()  # after the plan took it: the next execute reads it
    expect("execute-on-deleted-jax-array", ValueError, ["a is a deleted jax.Array"], mm.execute)
with dm.Matmul(la, lb, distribution=(X, Y, X)) as mm:
    mm.execute()
    if odd:
        mm.free()
    expect("execute-on-freed-plan", dm.PlanFreedError, ["freed plan"], mm.execute)
expect("bias-longdouble", TypeError, ["bias", "float128"],
       call(epilog="bias", bias=bias.astype(np.longdouble)) if odd else call(epilog="bias", bias=bias))
with dm.Matmul(la, lb, distribution=(X, Y, X)) as mm:
    mm.execute()
    expect("reset-one-row-short", ValueError, ["reset_operands", "a must match", "(2, 12)"],
           lambda: mm.reset_operands(a=la[:-1] if odd else la))
    expect("reset-alpha", ValueError, ["alpha", "rank 1 passes 2.0"],
           lambda: mm.reset_operands(alpha=2.0 if odd else 1.0))
    if not np.allclose(mm.execute(), dm.split(a @ b, X)[me], atol=1e-4):  # the plan is untouched
        problems.append(f"rank {me}: the plan changed after refused resets")

# arguments Python refuses before any check of dmatmul's: a misspelt keyword, one argument too many
expect("misspelt-keyword", TypeError, ["unexpected keyword argument 'transpose'"], call(transpose=True))
expect("extra-positional", TypeError, ["too many positional arguments"],
       lambda: dm.matmul(la, lb, lc, *([2.0] if odd else []), distribution=(X, Y, X)))
expect("matmul-plan-misspelt-keyword", TypeError, ["unexpected keyword argument 'algoritm'"],
       lambda: dm.Matmul(la, lb, distribution=(X, Y, X), **({"algoritm": "auto"} if odd else {})))
expect("redistribute-misspelt-keyword", TypeError, ["unexpected keyword argument 'device'"],
       lambda: dm.redistribute(la, X, Y, **({"device": None} if odd else {})))
expect("redistribute-extra-positional", TypeError, ["too many positional arguments"],
       lambda: dm.redistribute(la, X, Y, *([R] if odd else [])))
with dm.Matmul(la, lb, distribution=(X, Y, X)) as mm:
    mm.execute()
    expect("execute-with-an-argument", TypeError, ["too many positional arguments"],
           lambda: mm.execute(*([1] if odd else [])))
    expect("reset-misspelt-keyword", TypeError, ["unexpected keyword argument 'aa'"],
           lambda: mm.reset_operands(**({"aa": la} if odd else {"a": la})))
# ranks in different calls (rank 1 runs ahead, or skips one): each call's first allgather names the call, so
# every rank raises naming them, rather than reading another call's data
with dm.Matmul(la, lb, distribution=(X, Y, X)) as mm:
    mm.execute()
    expect("execute-while-rank-1-resets", ValueError,
           ["ranks disagree on the call", "rank 1 is in 'Matmul.reset_operands'", "'Matmul.execute'"],
           lambda: mm.reset_operands(a=la) if odd else mm.execute())
    expect("matmul-while-rank-1-executes", ValueError, ["ranks disagree on the call", "rank 1 is in 'Matmul.execute'"],
           lambda: mm.execute() if odd else dm.matmul(la, lb, distribution=(X, Y, X)))
expect("matmul-while-rank-1-redistributes", ValueError,
       ["ranks disagree on the call", "rank 1 is in 'dm.redistribute'"],
       lambda: dm.redistribute(la, X, Y) if odd else dm.matmul(la, lb, distribution=(X, Y, X)))
# inside a JAX trace on one rank: refused there before the ranks compare their calls
expect("inside-jit-on-one-rank", TypeError, ["jax.jit"],
       lambda: (jax.jit(lambda: dm.matmul(la, lb, distribution=(X, Y, X))) if odd
                else lambda: dm.matmul(la, lb, distribution=(X, Y, X)))())
# every rank plans with rank 0's calibration, broadcast when the runtime started (_cost.share_calibration): a
# calibration file that would choose otherwise on one rank, or that one rank cannot read, changes nothing
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402

GRID = dm.BlockNonCyclic(dm.ProcessGrid((2, 2)))
ga, gb = rng.standard_normal((64, 80)).astype(np.float32), rng.standard_normal((80, 48)).astype(np.float32)
cheap = {"alpha": 1e-12, "beta": 1e-15, "gamma": 1e-6}  # communication free: SUMMA on the grid as given
dear = {"alpha": 1.0, "beta": 1.0, "gamma": 1e-15}  # communication dear: a 1-D ring after moving a
with tempfile.TemporaryDirectory() as tmp:
    model = os.path.join(tmp, "model.json")
    with open(model, "w") as f:
        f.write(json.dumps({"version": 1, "models": {"cpu/4": dear if odd else cheap}}))
    os.environ["DMATMUL_COST_MODEL"] = model
    d = dm.matmul(dm.split(ga, GRID)[me], dm.split(gb, Y)[me], distribution=(GRID, Y, X))
    if not np.allclose(d, dm.split(ga @ gb, X)[me], atol=1e-4):
        problems.append(f"rank {me}: a calibration file of its own on rank 1: wrong result")
    if odd:
        with open(model, "w") as f:
            f.write("not json")
    d = dm.matmul(dm.split(ga, GRID)[me], dm.split(gb[:, :40], Y)[me], distribution=(GRID, Y, X))  # a new plan
    if not np.allclose(d, dm.split(ga @ gb[:, :40], X)[me], atol=1e-4):
        problems.append(f"rank {me}: a calibration file rank 1 cannot read: wrong result")
    del os.environ["DMATMUL_COST_MODEL"]

# still in step, and products that are right on every rank
with jax.set_mesh(jax.make_mesh((P,), ("users",), devices=jax.devices())) if odd else contextlib.nullcontext():
    d = dm.matmul(la, lb, distribution=(X, Y, X))  # the user's set_mesh on one rank does not reach dmatmul's mesh
if not np.allclose(d, dm.split(a @ b, X)[me], atol=1e-4):
    problems.append(f"rank {me}: wrong result under jax.set_mesh on rank 1")
za, zb = la.astype(np.complex64), lb.astype(np.complex64)
d = dm.matmul(za, zb, alpha=(1 + 0j) if odd else 1.0, distribution=(X, Y, X))  # the same number, as complex
if not np.allclose(d, dm.split(a @ b, X)[me], atol=1e-4):
    problems.append(f"rank {me}: alpha=1+0j on rank 1, 1.0 elsewhere: wrong result")
d = dm.matmul(la, lb, distribution=(X, Y, X))
if not np.allclose(d, dm.split(a @ b, X)[me], atol=1e-4):
    problems.append(f"rank {me}: wrong result after the errors")
d = dm.matmul(la, lb, precision=jax.lax.Precision.HIGH if odd else "tensorfloat32", distribution=(X, Y, X))
if not np.allclose(d, dm.split(a @ b, X)[me], atol=1e-4):  # one precision, spelt two ways: no disagreement
    problems.append(f"rank {me}: precision=lax.Precision.HIGH on rank 1, 'tensorfloat32' elsewhere: wrong result")
row, col = dm.ProcessGrid((2, 2)), dm.ProcessGrid((2, 2), layout="col")
dists = (dm.BlockCyclic(row, (2, 3)), dm.BlockNonCyclic(col), dm.BlockCyclic(col, (5, 2)))
d = dm.matmul(dm.split(a, dists[0])[me], dm.split(b, dists[1])[me], distribution=dists)
if not isinstance(d, np.ndarray) or not np.allclose(d, dm.split(a @ b, dists[2])[me], atol=1e-4):
    problems.append(f"rank {me}: operands on two grids: wrong result")
cd = dm.split(c, dists[2])[me]
d = dm.matmul(np.zeros((dists[0].shape(me, (M, 0))), np.float32), np.zeros(dists[1].shape(me, (0, N)), np.float32),
              cd, beta=2.0, distribution=dists)
if d.shape != cd.shape or not np.allclose(d, 2 * cd) or not d.flags.writeable:
    problems.append(f"rank {me}: K = 0: got {d!r}, want 2*c")
d = dm.matmul(la, lb, lc, beta=float("nan"), distribution=(X, Y, X))  # every rank passes NaN: no disagreement
if d.shape != lc.shape or not np.isnan(d).all():
    problems.append(f"rank {me}: beta=nan on every rank: got {d!r}")
if dm.init(rt.comm) is not rt and dm.init(rt.comm) != rt:
    problems.append(f"rank {me}: dm.init(the same comm) did not return the runtime")
_expect.finish(rt, problems)
