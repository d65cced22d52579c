"""Run under ``mpiexec -n P``: every 1-D layout triple x transposes, checked per rank.

Each rank builds the same global matrices (same seed), keeps its blocks
(``dm.split``), multiplies them, and compares its result block with its block
of the numpy reference. Exit status 1 on any mismatch, on every rank. In
turn one rank alone (or none) asks ``mm.algorithm`` and ``mm.explain()``
before the first ``execute()``, and must be told what the plan says after it.
"""

from __future__ import annotations

import itertools
import sys

import numpy as np

import dmatmul as dm

from dmatmul._spec import numpy_dtype
from dmatmul.testing.reference import TOLERANCE, reference, wide

rt = dm.init()
P = rt.size
X, Y, R = dm.Slab.X, dm.Slab.Y, dm.Replicated()
quick = "--quick" in sys.argv


def run_case(m, n, k, dists, ta, tb, *, alpha=1.0, beta=0.0, use_c=False, epilog=None, dtype="float32",
             algorithm="auto", family="numpy", reuse=1, asker=-1, bias_columns=False, nan_ab=False, alpha_after=None,
             fp8=None, scales=None):
    """``bias_columns``: a bias of shape (1, N); ``nan_ab``: a NaN and an inf in a and b; ``alpha_after``: a
    second plan, reset to this alpha; ``fp8``: a and b of this FP8 dtype with ``quantization_scales=scales``
    and ``dtype`` their result_type (c's dtype)."""
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    ab_dtype = numpy_dtype(fp8 or dtype)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(ab_dtype)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(ab_dtype)
    extra = {} if fp8 is None else {"quantization_scales": {"a": scales[0], "b": scales[1]}, "result_type": dtype}
    scaled = 1.0 if fp8 is None else scales[0] * scales[1]
    if nan_ab:
        a.flat[a.size // 2], b.flat[b.size - 1] = np.nan, np.inf
    c = rng.standard_normal((m, n)).astype(numpy_dtype(dtype)) if use_c else None
    bias = None
    if epilog and epilog.endswith("bias"):  # one value per result row, or per column: shape (1, N)
        bias = rng.standard_normal((1, n) if bias_columns else m).astype(numpy_dtype(dtype))
    da, db, dd = dists
    la, lb = dm.split(a, da)[rt.rank], dm.split(b, db)[rt.rank]
    lc = None if c is None else dm.split(c, dd)[rt.rank]
    if family == "jax":
        import jax.numpy as jnp

        la, lb = jnp.asarray(la), jnp.asarray(lb)
    ref = reference(a, b, c, alpha=alpha * scaled, beta=beta, transpose_a=ta, transpose_b=tb, epilog=epilog,
                    bias=bias)
    want = dm.split(ref, dd)[rt.rank]
    with dm.Matmul(la, lb, lc, distribution=dists, alpha=alpha, beta=beta, transpose_a=ta, transpose_b=tb,
                   epilog=epilog, bias=bias, algorithm=algorithm, **extra) as mm:
        # one rank alone asks what will run before the first execute (the others go on to it): the
        # agreement that execute() starts with must not depend on which ranks have planned
        told = (mm.algorithm, mm.explain()) if rt.rank == asker else None
        for _ in range(reuse):
            got = mm.execute()
        algo = mm.algorithm
        if told not in (None, (algo, mm.explain())):
            return False, algo
        if alpha_after is not None:  # the plan follows the scalars: alpha = 0 reads neither a nor b, and back
            mm.reset_operands(alpha=alpha_after)
            got, alpha = mm.execute(), alpha_after
            ref = reference(a, b, c, alpha=alpha, beta=beta, transpose_a=ta, transpose_b=tb, epilog=epilog, bias=bias)
            want = dm.split(ref, dd)[rt.rank]
    if family == "jax":
        import jax

        assert isinstance(got, jax.Array), type(got)
    else:
        assert isinstance(got, np.ndarray), type(got)
    got = wide(np.asarray(got))
    ok = got.shape == want.shape and (
        got.size == 0 or np.abs(got - want).max() <= TOLERANCE[dtype] * max(1.0, np.abs(ref).max())
    )
    return ok, algo


cases = [  # FP8 a and b (scales applied once, the result in result_type), in the quick set too
    dict(m=16, n=16, k=32, dists=(Y, Y, X), ta=True, tb=False, fp8="float8_e4m3fn", scales=(0.5, 4.0),
         algorithm="allgather", dtype="bfloat16", use_c=True, beta=1.0),
    dict(m=16, n=16, k=32, dists=(Y, X, R), ta=False, tb=False, fp8="float8_e5m2", scales=(2.0, 0.25),
         algorithm="allreduce", dtype="float32", epilog="relu_bias"),
]
sizes = [(13, 11, 7)] if quick else [(13, 11, 7), (5, 3, 9)]
for (m, n, k), dists, (ta, tb) in itertools.product(
    sizes, itertools.product((X, Y, R), repeat=3), itertools.product((False, True), repeat=2)
):
    cases.append(dict(m=m, n=n, k=k, dists=dists, ta=ta, tb=tb))
if not quick:
    cases += [
        dict(m=17, n=9, k=12, dists=(X, Y, X), ta=False, tb=False, alpha=0.5, beta=2.0, use_c=True, algorithm="allgather"),
        dict(m=17, n=9, k=12, dists=(Y, X, Y), ta=False, tb=False, alpha=0.5, beta=2.0, use_c=True,
             algorithm="reduce_scatter", epilog="relu_bias"),
        dict(m=17, n=9, k=12, dists=(Y, X, R), ta=False, tb=False, algorithm="allreduce", dtype="float64"),
        dict(m=16, n=8, k=12, dists=(X, Y, X), ta=False, tb=True, family="jax", reuse=3),
        dict(m=1, n=1, k=1, dists=(X, Y, X), ta=False, tb=False),
        dict(m=17, n=9, k=12, dists=(X, Y, Y), ta=False, tb=False, beta=0.5, use_c=True, epilog="silu_bias",
             bias_columns=True),
        dict(m=17, n=9, k=12, dists=(X, X, X), ta=True, tb=False, epilog="relu_bias", bias_columns=True,
             algorithm="reduce_scatter"),
        dict(m=9, n=9, k=5, dists=(X, R, Y), ta=False, tb=False, epilog="silu"),
    ]

# alpha = 0 follows BLAS: a and b not read (NaN and inf in them stay out of the result), here with beta = 1 on
# one-row and one-column results (cuBLASMp's quick return left such a D unwritten); a plan reset to alpha = 0
for (m, n), dists, family in itertools.product(((35, 1), (1, 35)), ((X, Y, X), (Y, X, R)), ("numpy", "jax")):
    cases.append(dict(m=m, n=n, k=7, dists=dists, ta=False, tb=False, alpha=0.0, beta=1.0, use_c=True, nan_ab=True,
                      family=family))
cases.append(dict(m=35, n=1, k=7, dists=(X, Y, X), ta=False, tb=False, alpha=2.0, beta=1.0, use_c=True,
                  nan_ab=True, alpha_after=0.0))
cases.append(dict(m=35, n=1, k=7, dists=(X, Y, X), ta=False, tb=False, alpha=0.0, beta=1.0, use_c=True,
                  alpha_after=-1.5))

failed = 0
for i, case in enumerate(cases):
    ok, algo = run_case(**case, asker=i % (P + 1) - 1)  # none, rank 0, 1, ... in turn
    oks = rt.comm.allgather(ok)
    if not all(oks):
        failed += 1
        if rt.rank == 0:
            print(f"MISMATCH on ranks {[r for r, o in enumerate(oks) if not o]}: {case} ({algo})", flush=True)
if rt.rank == 0:
    print(f"mpi products on {P} processes: {len(cases) - failed} of {len(cases)} cases match numpy", flush=True)
dm.finalize()
sys.exit(1 if failed else 0)
