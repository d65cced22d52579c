"""The nvmath backend's products, checked per rank: run as a script.

    mpiexec -n 1 python tests/gpu/nvmath_products.py            # one GPU
    mpiexec -n 4 python tests/gpu/nvmath_products.py            # four GPUs, one process each
    mpiexec -n 4 python tests/gpu/nvmath_products.py --fake     # no GPU: nvmath replaced by tests/gpu/_fake_nvmath.py

Every 1-D layout triple of (Slab.X, Slab.Y, Replicated()) x transposes, on an
uneven and an even size, x (alpha, beta, c) x epilogs x dtypes, plus plan
reuse (one dm.Matmul executed three times with reset operands) and, on four
ranks, 2-D block-cyclic grids (SUMMA and the general path), each result
block compared with its block of the numpy reference and (``--compare-jax``,
on every base case and a sample of the variants) with the JAX backend's, and
``c`` checked unmodified. Operands are numpy
arrays, and cupy arrays too when a GPU is there (``--families``).
``--quick`` runs a deterministic subset. Exit status 1 on any mismatch, on
every rank; ``--expect-path`` prints the cuBLASMp path of each case (check it
against ``CUBLASMP_LOG_LEVEL=5``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import pathlib
import sys
import traceback

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # JAX (the reference backend) must not take the GPUs

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

parser = argparse.ArgumentParser()
parser.add_argument("--fake", action="store_true", help="replace nvmath-python and cupy by the CPU fake")
parser.add_argument("--quick", action="store_true", help="a deterministic subset")
parser.add_argument("--compare-jax", action="store_true", help="also compare with the JAX backend")
parser.add_argument("--dtypes", default="float16,bfloat16,float32,float64,complex64,complex128")
parser.add_argument("--families", default="numpy,cupy")
parser.add_argument("--expect-path", action="store_true", help="print the cuBLASMp path of every case")
args = parser.parse_args()

if args.fake:
    import _fake_nvmath

    _fake_nvmath.install()

import numpy as np  # noqa: E402

import dmatmul as dm  # noqa: E402
from dmatmul.testing.reference import TOLERANCE, random_matrix, reference, wide  # noqa: E402

launched = dm._runtime.launched_size()
rt = dm.init(start=("jax",) if args.compare_jax else ()) if launched > 1 else None
P = 1 if rt is None else rt.size
RANK = 0 if rt is None else rt.rank
X, Y, R = dm.Slab.X, dm.Slab.Y, dm.Replicated()
EPILOGS = (None, "relu", "gelu", "silu", "bias", "relu_bias", "gelu_bias", "silu_bias")

families = [f for f in args.families.split(",") if f]
if "cupy" in families:
    try:
        import cupy

        if args.fake or cupy.cuda.runtime.getDeviceCount() < 1:
            raise ImportError
    except Exception:  # noqa: BLE001 - no cupy, no GPU, or the fake: numpy only
        families = [f for f in families if f != "cupy"]


def to_family(x, fam):
    if x is None or fam == "numpy":
        return x
    import cupy

    return cupy.asarray(x)


def host(x):
    if hasattr(x, "get") and not isinstance(x, np.ndarray):
        return x.get()
    return np.asarray(x)


def path_line(explained):
    """The ``path:`` line of an explain() (the cuBLASMp path and the algorithm's name); "path: none" where
    nvmath is not called (alpha = 0: a and b are not read)."""
    return next((line.strip() for line in explained.splitlines() if line.strip().startswith("path:")), "path: none")


def run_case(m, n, k, dists, ta, tb, *, alpha=1.0, beta=0.0, use_c=False, epilog=None, dtype="float32",
             family="numpy", reuse=1, jax=False, matrix=False, bias_columns=False, nan_ab=False):
    """``matrix``: the blocks are np.matrix, whose ``*`` and ``**`` are matrix products (numpy in all the same);
    ``bias_columns``: a bias of shape (1, N), one value per result column;
    ``nan_ab``: a NaN and an inf in a and b (with alpha = 0 they must not reach the result)."""
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a = random_matrix(rng, (k, m) if ta else (m, k), dtype)
    b = random_matrix(rng, (n, k) if tb else (k, n), dtype)
    if nan_ab:
        a.flat[a.size // 2], b.flat[b.size - 1] = np.nan, np.inf
    c = random_matrix(rng, (m, n), dtype) if use_c else None
    bias = None
    if epilog and epilog.endswith("bias"):
        bias = rng.standard_normal((1, n) if bias_columns else m).astype(np.float32)
    da, db, dd = dists
    if P == 1:
        la, lb, lc = a, b, c
    else:
        la, lb = dm.split(a, da)[RANK], dm.split(b, db)[RANK]
        lc = None if c is None else dm.split(c, dd)[RANK]
    la, lb, lc = to_family(la, family), to_family(lb, family), to_family(lc, family)
    if matrix:
        la, lb, lc = np.matrix(la), np.matrix(lb), None if lc is None else np.matrix(lc)
    c_before = None if lc is None else host(lc).copy()
    kw = dict(distribution=dists, alpha=alpha, beta=beta, transpose_a=ta, transpose_b=tb, epilog=epilog, bias=bias)
    with dm.Matmul(la, lb, lc, backend="nvmath", **kw) as mm:
        # rank 0 alone asks what will run before the plan is made (making it runs nvmath's collectives, which
        # the others are not in): it is told from its own blocks, and the plan made next must say the same
        told = (mm.algorithm, path_line(mm.explain())) if RANK == 0 else None
        got = mm.execute()
        algo = mm.algorithm
        translation = getattr(mm._plan, "translation", None)  # (none where nvmath is not called)
        path = "none" if translation is None else translation.path  # the cuBLASMp path dmatmul predicts
        told_ok = told in (None, (algo, path_line(mm.explain())))
        scale_a = 1.0
        for i in range(1, reuse):  # plan reuse: new operand values, same plan
            scale_a = 1.0 + i
            mm.reset_operands(a=to_family(host(la) * scale_a, family))
            got = mm.execute()
    a_used = a * scale_a if reuse > 1 else a
    ref = reference(a_used, b, c, alpha=alpha, beta=beta,
                    transpose_a=ta, transpose_b=tb, epilog=epilog, bias=bias)
    want = ref if P == 1 else dm.split(ref, dd)[RANK]
    fam_ok = type(got).__module__.split(".")[0] == ("numpy" if family == "numpy" else "cupy")
    got_h = wide(host(got))
    scale = max(1.0, float(np.abs(ref).max()))
    ok = told_ok and fam_ok and got_h.shape == want.shape and (
        got_h.size == 0 or float(np.abs(got_h - want).max()) <= TOLERANCE[dtype] * scale)
    if lc is not None and not np.array_equal(host(lc), c_before, equal_nan=True):
        ok = False  # c must never be modified
    if ok and jax and args.compare_jax and family == "numpy" and reuse == 1:
        jax_kw = dict(kw, backend="jax")
        if P == 1:
            jax_kw["devices"] = 1
        j = wide(np.asarray(dm.matmul(la, lb, lc, **jax_kw)))
        ok = j.shape == got_h.shape and float(np.abs(j - got_h).max()) <= 2 * TOLERANCE[dtype] * scale
    return ok, algo, path


def cases():
    sizes = [(13, 11, 7), (16, 8, 12)]
    dtypes = [d for d in args.dtypes.split(",") if d]
    base = list(itertools.product(sizes, itertools.product((X, Y, R), repeat=3),
                                  itertools.product((False, True), repeat=2)))
    variants = [
        dict(alpha=alpha, beta=beta, use_c=use_c, epilog=ep, dtype=dt)
        for (alpha, beta, use_c), ep, dt in itertools.product(
            ((1.0, 0.0, False), (0.5, 2.0, True)), EPILOGS, dtypes)
        if not (dt.startswith("complex") and ep not in (None, "bias"))
    ]
    out = []
    for i, ((m, n, k), dists, (ta, tb)) in enumerate(base):
        out.append(dict(m=m, n=n, k=k, dists=dists, ta=ta, tb=tb, dtype="float64", jax=True))
        chosen = variants if not args.quick else [variants[(i * 7) % len(variants)]]
        for j, v in enumerate(chosen):  # the JAX backend (slow to compile) checks a sample
            out.append(dict(m=m, n=n, k=k, dists=dists, ta=ta, tb=tb, jax=args.quick or j % 16 == i % 16, **v))
    # plan reuse and the families
    for fam in families:
        out.append(dict(m=17, n=9, k=12, dists=(X, Y, X), ta=False, tb=True, family=fam, reuse=3))
        out.append(dict(m=17, n=9, k=12, dists=(Y, X, R), ta=False, tb=False, family=fam, reuse=3, use_c=True,
                        beta=1.0, epilog="relu_bias"))
    out.append(dict(m=1, n=1, k=1, dists=(X, Y, X), ta=False, tb=False))
    # a bias per result column (shape (1, N)): fused in the swapped frame of the fast paths, else dmatmul's
    for dists, ep in itertools.product([(X, Y, X), (X, Y, Y), (Y, X, Y), (Y, X, X), (X, R, X), (R, Y, Y), (Y, X, R),
                                        (R, R, R)], ("bias", "relu_bias", "silu_bias")):
        out.append(dict(m=13, n=11, k=7, dists=dists, ta=False, tb=ep == "relu_bias", use_c=True, beta=0.5,
                        epilog=ep, bias_columns=True))
    # alpha = 0 follows BLAS (a and b not read: NaN and inf in them stay out of the result), here with beta = 1
    # on one-row and one-column results, where cuBLASMp's quick return leaves D unwritten (issue 34)
    for (m, n), dists, dtype, nan_ab in itertools.product(((35, 1), (1, 35), (35, 4)),
                                                          [(X, Y, X), (R, R, R), (Y, X, Y)],
                                                          ("float32", "complex128"), (False, True)):
        out.append(dict(m=m, n=n, k=7, dists=dists, ta=False, tb=True, alpha=0.0, beta=1.0, use_c=True,
                        nan_ab=nan_ab, dtype=dtype, jax=True))
    # fewer rows/columns than ranks: some ranks hold empty blocks (padded for cuBLASMp, skipped for cuBLASLt)
    for dists in [(X, R, X), (R, Y, Y), (X, R, R), (X, Y, X), (Y, X, Y), (Y, X, R)]:
        out.append(dict(m=3, n=2, k=5, dists=dists, ta=False, tb=False, use_c=True, beta=1.0, epilog="relu"))
    # np.matrix blocks: nvmath and dmatmul's own steps compute with ndarray operators (the GELU's z**3 was a matrix
    # power: wrong, or a LinAlgError where the block is not square)
    for (m, n, k), dists in itertools.product(((3, 3, 6), (4, 6, 8)), [(R, R, R), (X, R, X), (X, Y, X)]):
        out.append(dict(m=m, n=n, k=k, dists=dists, ta=False, tb=True, use_c=True, beta=0.5, epilog="gelu_bias",
                        matrix=True))
    # 2-D grids (four ranks): SUMMA on one shared grid and the general path across grids, row- and column-major
    # grids, cyclic blocks (one size per dimension, as cuBLASMp needs), first_process moved, transposes
    if P == 4:
        row, col = dm.ProcessGrid((2, 2)), dm.ProcessGrid((2, 2), layout="col")
        grid_dists = [(dm.BlockCyclic(g, (2, 2), first_process=fp),) * 3 for g in (row, col) for fp in ((0, 0), (1, 0))]
        grid_dists += [(dm.BlockCyclic(row, (3, 3)), dm.BlockCyclic(col, (3, 3), first_process=(0, 1)),
                        dm.BlockCyclic(row, (3, 3))),
                       (dm.BlockCyclic(col, (2, 2)), R, dm.BlockCyclic(row, (2, 2), first_process=(1, 1)))]
        for dists, (ta, tb) in itertools.product(grid_dists, itertools.product((False, True), repeat=2)):
            out.append(dict(m=13, n=11, k=7, dists=dists, ta=ta, tb=tb, dtype="float64"))
            out.append(dict(m=13, n=11, k=7, dists=dists, ta=ta, tb=tb, alpha=0.5, beta=2.0, use_c=True,
                            epilog="relu_bias"))
    return out


failed = 0
paths: dict[str, int] = {}
all_cases = cases()
for case in all_cases:
    try:
        ok, algo, path = run_case(**case)
    except Exception:  # noqa: BLE001 - report and count
        traceback.print_exc()
        ok, algo, path = False, "error", "error"
    paths[path] = paths.get(path, 0) + 1
    oks = [ok] if rt is None else rt.comm.allgather(ok)
    if not all(oks):
        failed += 1
        if RANK == 0:
            print(f"MISMATCH on ranks {[r for r, o in enumerate(oks) if not o]}: {case} ({algo}, {path})", flush=True)
    elif args.expect_path and RANK == 0:
        print(f"{path:10s} {algo:14s} {case}", flush=True)

def freed_on_one_rank_before_its_first_execute(call):
    """Rank 1 frees its plan before the first ``call`` (execute or plan), which
    makes the plan (nvmath's collectives): every rank raises naming rank 1 (none
    waits in them, none reads another call's data), and the ranks then still
    multiply together."""
    rng = np.random.default_rng(5)
    a, b = random_matrix(rng, (12, 8), "float32"), random_matrix(rng, (8, 6), "float32")
    dists = (X, Y, X)
    la, lb = dm.split(a, X)[RANK], dm.split(b, Y)[RANK]
    mm = dm.Matmul(la, lb, distribution=dists, backend="nvmath")
    if RANK == 1:
        mm.free()
    try:
        getattr(mm, call)()
        said = "no error"
    except (dm.PlanFreedError, RuntimeError, ValueError) as e:
        said = f"{type(e).__name__}: {e}"
    ok = "freed plan" in said and (RANK == 1 or "rank 1" in said)
    d = dm.matmul(la, lb, distribution=dists, backend="nvmath")
    ok = ok and float(np.abs(wide(d) - dm.split(reference(a, b), X)[RANK]).max()) <= TOLERANCE["float32"] * 10
    return ok, said


for call in ("execute", "plan") if rt is not None else ():
    ok, said = freed_on_one_rank_before_its_first_execute(call)
    oks = rt.comm.allgather(ok)
    if not all(oks):
        failed += 1
        print(f"MISMATCH: a plan freed on rank 1 before its first {call}, rank {RANK}: {said}", flush=True)
def memory_differs_on_rank_1():
    """Rank 1 passes a in GPU memory (a cupy array: stood in for by what the
    backend's family() says of it there), the others numpy on the host: nvmath
    would allocate and register device buffers, collectively, on some ranks
    only. Every rank raises naming rank 1, and the ranks then still multiply."""
    from dmatmul.backends.nvmath import _backend as B

    rng = np.random.default_rng(6)
    a, b = random_matrix(rng, (10, 8), "float32"), random_matrix(rng, (8, 6), "float32")
    la, lb = dm.split(a, X)[RANK], dm.split(b, Y)[RANK]
    real = B.family
    if RANK == 1:
        B.family = lambda x: "cupy" if x is la else real(x)
    try:
        dm.matmul(la, lb, distribution=(X, Y, X), backend="nvmath")
        said = "no error"
    except ValueError as e:
        said = f"{type(e).__name__}: {e}"
    finally:
        B.family = real
    ok = "where a lives" in said and "rank 1 passes 'GPU'" in said
    d = dm.matmul(la, lb, distribution=(X, Y, X), backend="nvmath")
    ok = ok and float(np.abs(wide(d) - dm.split(reference(a, b), X)[RANK]).max()) <= TOLERANCE["float32"] * 10
    return ok, said


if rt is not None:
    ok, said = memory_differs_on_rank_1()
    if not all(rt.comm.allgather(ok)):
        failed += 1
        print(f"MISMATCH: a in GPU memory on rank 1 only, rank {RANK}: {said}", flush=True)
if rt is not None:  # a plan held past dm.finalize(), whose account rank 0 alone reads after it (below)
    held = dm.Matmul(dm.split(np.ones((6, 4), "float32"), X)[RANK], dm.split(np.ones((4, 3), "float32"), Y)[RANK],
                     distribution=(X, Y, X), backend="nvmath")
    held.execute()
if RANK == 0:
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(paths.items()))
    print(f"nvmath products on {P} process(es){' (fake nvmath)' if args.fake else ''}: "
          f"{len(all_cases) - failed} of {len(all_cases)} cases match numpy; paths {summary}", flush=True)
if rt is not None:
    dm.finalize()
    # rank 0 alone reads the account after dm.finalize() (a report at the end of a job): nothing starts again
    # (asking the runtime started a new one there alone, collectively: the job hung), and the plan dm.finalize()
    # freed still tells what it was
    told = f"algorithm:  {held.algorithm}" in held.explain() if RANK == 0 else True
    if not all(rt.comm.allgather(told)):
        failed += 1
        print(f"MISMATCH: mm.explain() on rank 0 alone after dm.finalize(), rank {RANK}", flush=True)
sys.exit(1 if failed else 0)
