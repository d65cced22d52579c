"""The nvmath (cuBLASMp) backend on CPU: the translation as plain data, the
array pipeline against a simulated cuBLASMp, the execution layer against a
fake nvmath-python (in process and under mpiexec).

Expected values are computed here independently of the translation: nvmath
block-cyclic layouts through dmatmul's own numroc/BlockCyclic, Slab padding
from ``dm.Slab``'s own split, qualifiers and fast paths from nvmath 1.0's
rules (``Matmul._infer_algo``) re-derived below.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import itertools
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dmatmul as dm
from dmatmul import _plan, backends
from dmatmul._dimmap import DimMap
from dmatmul._distribution import numroc
from dmatmul.backends.nvmath import _pipeline as PL
from dmatmul.backends.nvmath import _translate as T

from dmatmul.testing.reference import assert_close, random_matrix, reference

ROOT = pathlib.Path(__file__).resolve().parents[1]
GPU_DIR = ROOT / "tests" / "gpu"
X, Y, R = dm.Slab.X, dm.Slab.Y, dm.Replicated()
TRIPLES = list(itertools.product((X, Y, R), repeat=3))
TRANSPOSES = list(itertools.product((False, True), repeat=2))


# --------------------------------------------------------------------------- #
# independent helpers
# --------------------------------------------------------------------------- #
def problem(m, n, k, P, dists, ta=False, tb=False, orders=("C", "C", None), **kw):
    return T.Problem.of(m, n, k, P, ta, tb, dists,
                        orders, **kw)


def stored(operand, ta, tb):
    """Logical dims of the stored matrix (rows, cols), by hand."""
    return {("a", False): ("M", "K"), ("a", True): ("K", "M"), ("b", False): ("K", "N"),
            ("b", True): ("N", "K"), ("c", False): ("M", "N"), ("c", True): ("M", "N")}[(operand, {"a": ta, "b": tb, "c": False}[operand])]


def role(dist, operand, ta, tb, P):
    if P == 1 or isinstance(dist, dm.Replicated):
        return "R"
    return stored(operand, ta, tb)[dist.dim]


def bc(nvd):
    """The nvmath BlockCyclic data as a dmatmul BlockCyclic, built from the fields."""
    layout = {"ROW_MAJOR": "row", "COL_MAJOR": "col"}[nvd.grid_layout]
    return dm.BlockCyclic(dm.ProcessGrid(nvd.grid_shape, layout=layout), nvd.block_sizes, nvd.first_process)


def padded_positions(size, P, padded):
    """Where Slab's uneven parts land when each is padded to ceil(size/P): by hand."""
    if padded == size:
        return np.arange(size)
    block = -(-size // P)
    assert padded == block * P
    pos = []
    for r in range(P):
        ids = dm.Slab.X.global_indices(r, (size, 1), P)[0]
        pos.extend(r * block + np.arange(len(ids)))
    return np.array(pos, dtype=int)


def infer_algo(tr):
    """nvmath 1.0 ``Matmul._infer_algo`` re-derived from the plain data:
    0 naive, 2 GEMM+RS, 3 AG+GEMM, 4 GEMM+AR, 5 local, -1 unknown (2-D)."""
    P = tr.problem.nranks
    if P == 1:
        return 5
    A, B, D = tr.slot("A"), tr.slot("B"), tr.result
    ds = [A.distribution, B.distribution, D]
    if any(P not in d.grid_shape for d in ds):
        return -1
    qa, qb = tr.qualifiers[:2]
    for d, shape in zip(ds, [A.global_shape, B.global_shape, tr.result_shape]):
        pdim = 0 if d.grid_shape == (P, 1) else 1
        if shape[pdim] % P or shape[pdim] // P != d.block_sizes[pdim]:
            return -1
    Ad, Bd, Cd = ("R" if d.grid_shape == (P, 1) else "C" for d in ds)
    if tr.fused_epilog == "ALLREDUCE":
        return 4
    if Cd == "R" and Ad == ("C" if qa else "R") and Bd == ("R" if qb else "C"):
        return 3
    if Cd == "C" and Ad == ("R" if qa else "C") and Bd == ("C" if qb else "R"):
        return 2
    return 0


PATH_CODE = {"AG+GEMM": 3, "GEMM+RS": 2, "GEMM+AR": 4, "local GEMM": 5, "general": 0}


def check_handover_data(tr):
    """Every handover's nvmath layout holds exactly what the rank hands over.

    For each rank: the nvmath BlockCyclic (from the data) over the nvmath
    global shape gives local shapes equal to numroc's, and its padded global
    ids, mapped back through the padding, are the target's global ids (the
    user's distribution, or the Slab a Replicated operand is cut to).
    """
    p = tr.problem
    P = p.nranks
    for h in tr.handovers:
        if h.distribution is None:
            continue
        shape = p.global_shape(h.operand)
        dims = h.dims
        pad = {d: tr.dim(d) for d in dims}
        want_padded = (pad[dims[0]].padded_size, pad[dims[1]].padded_size)
        nv_shape = want_padded[::-1] if h.transposed else want_padded
        assert h.global_shape == nv_shape, h
        nvd = h.distribution
        assert nvd.nranks == P
        for r in range(P):
            rows, cols = bc(nvd).global_indices(r, nv_shape)
            if h.transposed:
                rows, cols = cols, rows
            g = bc(nvd).grid.coords(r)
            assert (len(rows), len(cols))[:: -1 if h.transposed else 1] == (
                numroc(nv_shape[0], nvd.block_sizes[0], g[0], nvd.first_process[0], nvd.grid_shape[0]),
                numroc(nv_shape[1], nvd.block_sizes[1], g[1], nvd.first_process[1], nvd.grid_shape[1]),
            )
            want_r, want_c = h.target.global_indices(r, shape, P)
            for got, want, d in ((rows, want_r, dims[0]), (cols, want_c, dims[1])):
                pos = padded_positions(p.size(d), pad[d].nparts, pad[d].padded_size)
                real_at = np.full(pad[d].padded_size, -1)
                real_at[pos] = np.arange(p.size(d))
                real = real_at[got]
                assert np.array_equal(real[real >= 0], want), (h, r, d)


def check_nvmath_rules(tr):
    """What nvmath 1.0 checks before cuBLASMp runs."""
    A, B, D = tr.slot("A"), tr.slot("B"), tr.result
    qa, qb, qc = tr.qualifiers
    assert qc is False and dict(tr.options)["inplace"] is False
    assert (A.is_transpose, B.is_transpose) == (qa, qb)
    ab, bb, db = A.distribution.block_sizes, B.distribution.block_sizes, D.block_sizes
    assert (ab[1] if qa else ab[0]) == db[0], "m block of A and D"
    assert (bb[0] if qb else bb[1]) == db[1], "n block of B and D"
    assert (ab[0] if qa else ab[1]) == (bb[1] if qb else bb[0]), "k block of A and B"
    ga, gb = A.global_shape, B.global_shape
    m, k = (ga[1], ga[0]) if qa else ga
    k2, n = (gb[1], gb[0]) if qb else gb
    assert k == k2
    if tr.path == "GEMM+AR":
        assert (qa, qb) == (True, False) and not tr.passes_c
        assert tr.result_shape == (tr.problem.nranks * m, n)
    else:
        assert tr.result_shape == (m, n)
    # the swap: nvmath A is op(B).T when swapped
    p = tr.problem
    if tr.swapped:
        assert (A.operand, B.operand) == ("b", "a")
        assert qa == ((not p.transpose_b) ^ A.transposed) and qb == ((not p.transpose_a) ^ B.transposed)
        assert (m, n) == (tr.dim("N").padded_size, tr.dim("M").padded_size)
    else:
        assert (A.operand, B.operand) == ("a", "b")
        assert qa == (p.transpose_a ^ A.transposed) and qb == (p.transpose_b ^ B.transposed)
        assert (m, n) == (tr.dim("M").padded_size, tr.dim("N").padded_size)
    if tr.passes_c:
        assert tr.slot("C").transposed == tr.swapped  # c can only be handed in the frame's own orientation


# --------------------------------------------------------------------------- #
# package hygiene
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("module", [
    "dmatmul.backends.nvmath._translate", "dmatmul.backends.nvmath._translate._types",
    "dmatmul.backends.nvmath._translate._orient", "dmatmul.backends.nvmath._translate._epilog",
    "dmatmul.backends.nvmath._translate._one_d", "dmatmul.backends.nvmath._translate._two_d",
    "dmatmul.backends.nvmath._translate._overlap",
    "dmatmul.backends.nvmath._engine", "dmatmul.backends.nvmath",
])
def test_doctests(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_import_is_light_and_backend_object():
    code = (
        "import sys, dmatmul.backends.nvmath as nv, dmatmul.backends.nvmath._backend\n"
        "print([m for m in ('jax', 'nvmath', 'cupy', 'mpi4py') if m in sys.modules], nv.BACKEND.name)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "nvmath"]


def test_unavailable_names_what_is_missing_and_the_extra():
    import importlib.util

    if importlib.util.find_spec("nvmath") is not None:
        pytest.skip("nvmath-python is installed here")
    nv = importlib.import_module("dmatmul.backends.nvmath")
    nv.unavailable.cache_clear()
    reason = nv.unavailable()
    assert "nvmath" in reason and "pip install 'dmatmul[nvmath]'" in reason
    assert backends.probe("nvmath") is not None
    assert backends.resolve("auto").name == "jax"  # auto falls back silently
    with pytest.raises(RuntimeError, match=r"backend='nvmath' is not available: .*pip install 'dmatmul\[nvmath\]'"):
        dm.matmul(np.ones((4, 3)), np.ones((3, 5)), backend="nvmath")


# --------------------------------------------------------------------------- #
# memory orders and dimension plans
# --------------------------------------------------------------------------- #
def test_orders():
    assert T.order_of(np.zeros((3, 4))) == "C"
    assert T.order_of(np.zeros((3, 4), order="F")) == "F"
    assert T.order_of(np.zeros((1, 1))) == "CF" and T.order_of(np.zeros((0, 4))) == "CF"
    # vectors: the order they were made in (numpy's flags call both kinds of vector C and F)
    assert T.order_of(np.zeros((3, 1))) == "C" and T.order_of(np.zeros((3, 1), order="F")) == "F"
    assert T.order_of(np.zeros((1, 3))) == "C" and T.order_of(np.zeros((1, 3), order="F")) == "F"
    assert T.order_of(np.zeros((3, 4))[1:2]) == "C" and T.order_of(np.zeros((3, 4))[:, 1:2]) == "X"
    assert T.order_of(np.zeros((4, 6))[::2, ::2]) == "X"
    assert T.combine_orders(["C", "CF"]) == "C" and T.combine_orders(["F", "CF"]) == "F"
    assert T.combine_orders(["CF", "CF"]) == "CF" and T.combine_orders(["C", "F"]) == "X"
    assert T.combine_orders([None]) is None


def test_uneven_slab_padding_plan_10_over_4():
    # Slab: 3, 3, 2, 2 -- numroc with block 3 deals 3, 3, 3, 1: not expressible
    assert [len(X.global_indices(r, (10, 1), 4)[0]) for r in range(4)] == [3, 3, 2, 2]
    assert [numroc(10, 3, r, 0, 4) for r in range(4)] == [3, 3, 3, 1]
    d = T.DimPlan.of("M", DimMap.slab(10, 4))
    assert (d.nv_block, d.padded_size, d.nparts, d.padding) == (3, 12, 4, True)
    # padded to 12, numroc deals 3 per rank: uniform; rank r's real rows first, then zeros
    assert [numroc(12, 3, r, 0, 4) for r in range(4)] == [3, 3, 3, 3]
    assert d.positions.tolist() == padded_positions(10, 4, 12).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 9, 10]
    assert d.sources.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, -1, 8, 9, -1]
    assert "10->12" in d.describe() and "[3, 3, 2, 2]" in d.describe()


@pytest.mark.parametrize("size,parts", [(10, 4), (8, 4), (3, 4), (1, 3), (13, 3), (7, 2), (100, 7)])
def test_dim_plan_matches_slab(size, parts):
    d = T.DimPlan.of("K", DimMap.slab(size, parts))
    block = -(-size // parts)
    assert d.nv_block == block and d.padded_size == block * parts and d.padding == (size % parts != 0)
    assert d.positions.tolist() == padded_positions(size, parts, d.padded_size).tolist()
    back = d.sources
    assert np.array_equal(back[d.positions], np.arange(size)) and np.sum(back < 0) == d.padded_size - size
    whole = T.DimPlan.of("K", DimMap.whole(size))
    assert (whole.nv_block, whole.padded_size, whole.padding) == (size, size, False)


# --------------------------------------------------------------------------- #
# nvmath distributions as data
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("grid,layout,blocks,fp", [
    ((2, 3), "ROW_MAJOR", (2, 3), (0, 0)), ((2, 3), "COL_MAJOR", (3, 2), (1, 2)), ((4, 1), "ROW_MAJOR", (3, 5), (0, 0)),
    ((2, 2), "COL_MAJOR", (1, 4), (1, 0)),
])
def test_transposed_distribution_is_the_distribution_of_the_transpose(grid, layout, blocks, fp):
    d = T.NvDistribution(grid, layout, blocks, fp)
    t = d.transposed()
    shape = (11, 9)
    for r in range(d.nranks):
        rows, cols = bc(d).global_indices(r, shape)
        trows, tcols = bc(t).global_indices(r, shape[::-1])
        assert np.array_equal(rows, tcols) and np.array_equal(cols, trows)  # rank r holds X[rows, cols] = X.T[cols, rows]
    assert t.transposed() == d
    assert d.as_dmatmul() == bc(d)


def test_one_d_grids_keep_one_layout_value():
    assert T.NvDistribution((4, 1), "COL_MAJOR", (2, 2)).grid_layout == "ROW_MAJOR"
    assert T.NvDistribution((1, 4), "ROW_MAJOR", (2, 2)).transposed().grid_layout == "ROW_MAJOR"


# --------------------------------------------------------------------------- #
# every 1-D triple x transposes: the translation as data
# --------------------------------------------------------------------------- #
FAST = {"allgather": [("M", "N", "M"), ("M", "N", "N")], "reduce_scatter": [("K", "K", "N"), ("K", "K", "M")],
        "allreduce": [("K", "K", "R")], "local": [("M", "R", "M"), ("R", "N", "N"), ("R", "R", "R")]}


def fits(given, kernel, gather_ok):
    ga, gb, gd = given
    ka, kb, kd = kernel
    ab = all(g == k or g == "R" for g, k in ((ga, ka), (gb, kb)))
    return ab and (gd == kd or (gather_ok and gd == "R" and kd != "R"))


@pytest.mark.parametrize("P", [1, 2, 4])
@pytest.mark.parametrize("mnk", [(13, 11, 7), (16, 8, 12), (3, 2, 5)])
@pytest.mark.parametrize("orders", [("C", "C", "C"), ("F", "F", "F"), ("X", "C", "F"), ("CF", "F", "C")])
def test_every_1d_triple_and_transpose(P, mnk, orders):
    m, n, k = mnk
    for dists, (ta, tb) in itertools.product(TRIPLES, TRANSPOSES):
        for use_c in (False, True):
            tr = T.translate(problem(m, n, k, P, dists, ta, tb, orders if use_c else orders[:2] + (None,), use_c=use_c))
            given = tuple(role(d, op, ta, tb, P) for d, op in zip(dists, ("a", "b", "c")))
            assert tr.roles == given
            if P == 1:
                assert (tr.algorithm, tr.path, tr.engine) == ("local", "local GEMM", "cublasmp")
            elif tr.path == "general":
                # exactly the role pairs no fast path takes
                assert (given[0], given[1]) in (("M", "K"), ("K", "N"))
                assert not any(fits(given, kern, True) for ks in FAST.values() for kern in ks)
                assert tr.algorithm in ("allgather", "reduce_scatter", "allreduce")
            else:
                assert tr.kernel in FAST[tr.algorithm] and fits(given, tr.kernel, True)
                assert tr.gather == (given[2] == "R" and tr.kernel[2] != "R")
                if any(fits(given, kern, False) for kern in FAST["local"]):
                    assert tr.algorithm == "local"  # no communication beats any collective here
            if tr.engine == "cublasmp":
                assert infer_algo(tr) == PATH_CODE[tr.path], (dists, ta, tb, tr.path)
                check_nvmath_rules(tr)
                check_handover_data(tr)
                for d in tr.dims:  # padding exactly where a split is uneven
                    split = tr.kernel is not None and d.name in tr.kernel and P > 1
                    assert d.padding == (split and d.size % P != 0)
            else:
                assert tr.path == "local GEMM" and P > 1 and tr.result is None
                assert all(h.distribution is None and not h.transposed for h in tr.handovers)
            # copies: exactly when the table says
            for h in tr.handovers:
                order = dict(zip("abc", orders))[h.operand]
                padded = any(tr.dim(d).padding for d in h.dims)
                if h.copy is None:
                    assert not padded
                    if tr.engine == "cublasmp" and order in ("C", "F"):
                        assert h.transposed == (order == "C")  # the free orientation
                if order == "X" and h.source == h.target:
                    assert h.copy is not None


def test_allgather_exact_data():
    """(a=Slab.X, b=Slab.Y, result=Slab.X), NN, C-order, 10x8x6 on 4 ranks: by hand."""
    tr = T.translate(problem(10, 8, 6, 4, (X, Y, X), orders=("C", "C", None)))
    assert (tr.algorithm, tr.path, tr.swapped, tr.engine) == ("allgather", "AG+GEMM", False, "cublasmp")
    assert tr.qualifiers == (True, True, False)
    a, b = tr.handover("a"), tr.handover("b")
    # a (10, 6) C-order -> a.T (6, 12 padded) in Fortran order, split on its columns
    assert (a.slot, a.transposed, a.is_transpose) == ("A", True, True)
    assert a.distribution == T.NvDistribution((1, 4), "ROW_MAJOR", (6, 3))
    assert a.global_shape == (6, 12)
    assert a.copy == "padding M 10->12 (uneven split over 4 ranks)"
    # b (6, 8) C-order -> b.T (8, 6) split on rows, 8 = 4 x 2: a free view
    assert (b.slot, b.transposed, b.is_transpose, b.copy) == ("B", True, True, None)
    assert b.distribution == T.NvDistribution((4, 1), "ROW_MAJOR", (2, 6)) and b.global_shape == (8, 6)
    assert tr.result == T.NvDistribution((4, 1), "ROW_MAJOR", (3, 2)) and tr.result_shape == (12, 8)
    assert [d.padded_size for d in tr.dims] == [12, 6, 8]
    assert tr.computed == X and not tr.gather


def test_mirrored_allgather_runs_in_the_swapped_frame():
    tr = T.translate(problem(8, 12, 4, 4, (X, Y, Y), orders=("C", "C", "C"), use_c=True))
    assert (tr.path, tr.swapped) == ("AG+GEMM", True)
    A, B, C = tr.slot("A"), tr.slot("B"), tr.slot("C")
    assert (A.operand, B.operand, C.operand) == ("b", "a", "c")
    # nvmath A = op(B).T = b.T: the C-order b handed as its transposed view, not transposed again
    assert (A.transposed, A.is_transpose, A.copy) == (True, False, None)
    assert (B.transposed, B.is_transpose, B.copy) == (True, False, None)
    # c (8, 12) C-order is the Fortran-order c.T (12, 8): free in this frame. Its M block is 2,
    # not 8: a splits M in 4, and cuBLASMp needs one block size per dimension
    assert (C.transposed, C.copy) == (True, None) and C.distribution == T.NvDistribution((4, 1), "ROW_MAJOR", (3, 2))
    assert tr.result == T.NvDistribution((4, 1), "ROW_MAJOR", (3, 2)) and tr.result_shape == (12, 8)


def test_reduce_scatter_both_frames():
    nn = T.translate(problem(8, 12, 4, 4, (Y, X, Y), orders=("F", "F", None)))
    assert (nn.path, nn.algorithm, nn.swapped, nn.qualifiers) == ("GEMM+RS", "reduce_scatter", False, (False, False, False))
    assert not nn.copies
    mm = T.translate(problem(8, 12, 4, 4, (Y, X, X), orders=("C", "C", None)))
    assert (mm.path, mm.swapped) == ("GEMM+RS", True) and not mm.copies


def test_allreduce_needs_tn_and_copies_for_it():
    # NN with C-order blocks: nvmath must see TN; one of a, b is copied to the other order
    tr = T.translate(problem(8, 12, 4, 4, (Y, X, R), orders=("C", "C", "C"), use_c=True, epilog="relu"))
    assert (tr.path, tr.algorithm, tr.qualifiers[:2]) == ("GEMM+AR", "allreduce", (True, False))
    assert len(tr.copies) == 1 and "TN" in tr.handover(tr.copies[0]).copy
    assert tr.fused_epilog == "ALLREDUCE" and tr.post_epilog == "relu" and tr.post_beta_c
    assert not tr.passes_c  # beta*c after the reduction, else it would be summed P times
    # one b copy either way; the tie goes to the swapped frame (C-order result): D.T is (N, M) = (12, 8) on
    # every rank, described to nvmath as Slab.X of a (P*12, 8) matrix
    assert tr.swapped
    assert tr.result == T.NvDistribution((4, 1), "ROW_MAJOR", (12, 8)) and tr.result_shape == (48, 8)
    # NT with C-order blocks is already TN for nvmath: nothing copied
    tn = T.translate(problem(8, 12, 4, 4, (Y, Y, R), ta=False, tb=True, orders=("C", "C", None)))
    assert tn.path == "GEMM+AR" and not tn.copies and tn.qualifiers[:2] == (True, False)


def test_replicated_operands_are_cut_locally():
    tr = T.translate(problem(16, 8, 12, 4, (R, X, Y), orders=("C", "C", None)))
    assert tr.kernel == ("K", "K", "N") and tr.path == "GEMM+RS"
    a = tr.handover("a")
    assert a.source == R and a.target == Y  # a (M, K) cut to its K columns: not a contiguous range of C order
    assert a.copy is not None and "neither" in a.copy
    f = T.translate(problem(16, 8, 12, 4, (R, X, Y), orders=("F", "C", None)))
    assert f.handover("a").copy is None  # columns of a Fortran-order block: a view
    rows = T.translate(problem(16, 8, 12, 4, (R, Y, X), orders=("C", "C", None)))
    assert rows.kernel == ("M", "N", "M") and rows.handover("a").copy is None  # rows of a C-order block: a view


def test_local_kernel_on_several_ranks_uses_cublaslt():
    tr = T.translate(problem(13, 11, 7, 4, (X, R, X), orders=("C", "C", None), epilog="gelu_bias"))
    assert (tr.algorithm, tr.path, tr.engine) == ("local", "local GEMM", "cublaslt")
    assert tr.fused_epilog == "GELU_BIAS" and tr.post_epilog is None and not tr.copies
    assert "cuBLASLt" in "\n".join(tr.describe())


def test_replicated_result_is_allgathered_when_no_allreduce():
    tr = T.translate(problem(13, 11, 7, 4, (X, Y, R), orders=("C", "C", None)))
    assert tr.gather and tr.path == "AG+GEMM" and tr.computed in (X, Y)
    assert "allgathered by dmatmul" in "\n".join(tr.describe())
    with pytest.raises(ValueError, match="algorithm='allgather' does not fit"):
        T.translate(problem(13, 11, 7, 4, (X, Y, R), orders=("C", "C", None), algorithm="allgather"))


def test_general_path_is_named_honestly():
    tr = T.translate(problem(13, 11, 7, 4, (X, X, X), orders=("C", "C", None)))  # a on M, b on K
    assert tr.path == "general" and tr.algorithm == "allgather"
    text = "\n".join(tr.describe())
    assert "cuBLASMp general path" in text and "closest contract algorithm: allgather" in text
    assert tr.fused_epilog is None
    with pytest.raises(ValueError) as info:
        T.translate(problem(13, 11, 7, 4, (X, X, X), orders=("C", "C", None), algorithm="allgather"))
    msg = str(info.value)
    assert "(a=Slab.X, b=Slab.X, result=Slab.X)" in msg  # given
    assert "(a=Slab.X, b=Slab.Y, result=Slab.X)" in msg and "(a=Slab.X, b=Slab.Y, result=Slab.Y)" in msg  # needed


@pytest.mark.parametrize("algorithm", ["local", "allgather", "reduce_scatter", "allreduce"])
def test_named_algorithms_fit_exactly_their_triples(algorithm):
    P = 4
    for dists, (ta, tb) in itertools.product(TRIPLES, TRANSPOSES):
        given = tuple(role(d, op, ta, tb, P) for d, op in zip(dists, ("a", "b", "c")))
        p = problem(16, 8, 12, P, dists, ta, tb, algorithm=algorithm)
        if any(fits(given, kern, False) for kern in FAST[algorithm]):
            tr = T.translate(p)
            assert tr.algorithm == algorithm and not tr.gather
        else:
            with pytest.raises(ValueError, match=f"algorithm='{algorithm}' does not fit") as info:
                T.translate(p)
            for need in _plan.needs(algorithm, (ta, tb), T.KERNELS):
                assert need in str(info.value)


def test_named_summa_on_1d_and_one_rank():
    with pytest.raises(ValueError, match="needs a, b and the result on one shared 2-D ProcessGrid"):
        T.translate(problem(8, 8, 8, 4, (X, Y, X), algorithm="summa"))
    one = T.translate(problem(8, 8, 8, 1, (X, Y, X), algorithm="allgather"))
    assert one.algorithm == "local" and "on one rank cuBLASMp runs a local GEMM" in one.notes[0]


# --------------------------------------------------------------------------- #
# the copy decision table
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("oa,ob,oc,swapped,copies", [
    ("C", "C", "C", True, ()),          # all C: the swapped frame takes everything as views
    ("F", "F", "F", False, ()),         # all Fortran: the direct frame takes everything as it is
    ("C", "C", "F", False, ()),         # c decides the frame; a, b flip qualifiers for free
    ("F", "C", "C", True, ()),
    ("X", "C", "C", True, ("a",)),      # a not contiguous: one copy
    ("C", "C", "X", True, ("c",)),
])
def test_one_rank_frame_and_copies(oa, ob, oc, swapped, copies):
    tr = T.translate(problem(6, 5, 4, 1, (R, R, R), orders=(oa, ob, oc), use_c=True))
    assert tr.swapped == swapped and tr.copies == copies
    for h in tr.handovers:
        if h.copy is None and h.operand != "c":
            assert h.transposed == ({"a": oa, "b": ob}[h.operand] == "C")


def test_fast_path_frame_forces_a_c_copy_when_needed():
    # AG+GEMM (X, Y, X) runs only in the direct frame: a C-order c must be copied to Fortran order
    tr = T.translate(problem(16, 8, 12, 4, (X, Y, X), orders=("C", "C", "C"), use_c=True))
    assert not tr.swapped and tr.copies == ("c",)
    assert "Fortran order" in tr.handover("c").copy
    f = T.translate(problem(16, 8, 12, 4, (X, Y, X), orders=("C", "C", "F"), use_c=True))
    assert not f.copies


# --------------------------------------------------------------------------- #
# epilogs
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("dists,swapped,fused,post", [
    ((X, Y, X), False, "RELU_BIAS", None),   # AG+GEMM, direct frame: bias per row of nvmath's D
    ((X, Y, Y), True, None, "relu_bias"),    # swapped: a bias per row of D is per column of D.T
    ((Y, X, Y), False, "RELU_BIAS", None),   # GEMM+RS
    ((X, X, X), True, None, "relu_bias"),    # general path: not fused (nvmath 0.7/0.8 refused RELU there)
])
def test_epilog_fusion(dists, swapped, fused, post):
    tr = T.translate(problem(16, 8, 12, 4, dists, orders=("C", "C", None), epilog="relu_bias"))
    assert (tr.swapped, tr.fused_epilog, tr.post_epilog) == (swapped, fused, post)
    gelu = T.translate(problem(16, 8, 12, 4, dists, orders=("C", "C", None), epilog="gelu"))
    if tr.path != "general":
        assert gelu.fused_epilog == "GELU"  # elementwise: fine in either frame
    u = tr.unfused()
    assert u.fused_epilog is None and u.post_epilog == "relu_bias"


def test_one_rank_prefers_the_frame_that_fuses_a_bias():
    tr = T.translate(problem(6, 5, 4, 1, (R, R, R), orders=("C", "C", None), epilog="bias"))
    assert not tr.swapped and tr.fused_epilog == "BIAS"
    plain = T.translate(problem(6, 5, 4, 1, (R, R, R), orders=("C", "C", None)))
    assert plain.swapped  # without a bias the C-order result wins


def test_c_is_never_written():
    for dists in TRIPLES:
        tr = T.translate(problem(13, 11, 7, 4, dists, orders=("C", "C", "C"), use_c=True))
        assert dict(tr.options) == {"inplace": False}
        if tr.passes_c:
            assert "inplace=False" in "\n".join(tr.describe())


# --------------------------------------------------------------------------- #
# 2-D grids
# --------------------------------------------------------------------------- #
def test_summa_on_a_shared_block_cyclic_grid():
    g = dm.ProcessGrid((2, 3), layout="col")
    d = dm.BlockCyclic(g, (2, 2))
    tr = T.translate(problem(13, 11, 7, 6, (d, d, d), orders=("F", "F", None)))
    assert (tr.algorithm, tr.path, tr.swapped, tr.kernel) == ("summa", "SUMMA", False, None)
    assert tr.handover("a").distribution == T.NvDistribution((2, 3), "COL_MAJOR", (2, 2))
    assert [x.nv_block for x in tr.dims] == [2, 2, 2] and not tr.padded
    check_nvmath_rules(tr)
    check_handover_data(tr)
    c_order = T.translate(problem(13, 11, 7, 6, (d, d, d), orders=("C", "C", None)))
    assert c_order.swapped and not c_order.copies and c_order.path == "SUMMA"
    assert c_order.slot("A").distribution == T.NvDistribution((3, 2), "ROW_MAJOR", (2, 2))  # b.T: grid transposed
    check_nvmath_rules(c_order)
    check_handover_data(c_order)


def test_2d_translations_are_costed_as_summa_on_the_result_grid():
    """Modelled as the JAX backend models SUMMA: op(A)'s panels received along
    grid rows, op(B)'s along grid columns, once each; a replicated result adds
    dmatmul's host-staged allgather, an operand on another grid cuBLASMp's
    re-layout (the general path)."""
    m, n, k, itemsize = 13, 11, 7, 4
    g = dm.ProcessGrid((2, 3), layout="col")
    d = dm.BlockCyclic(g, (2, 2))
    rows, cols = 2, 3
    panels = ((cols - 1) / cols * (m / rows) * k + (rows - 1) / rows * k * (n / cols)) * itemsize
    tr = T.translate(problem(m, n, k, 6, (d, d, d), orders=("F", "F", None)))
    assert tr.path == "SUMMA" and tr.cost.kernel.algorithm == "summa" and tr.cost.moves == ()
    assert tr.cost.nbytes == pytest.approx(panels) and tr.cost.messages == rows + cols
    assert tr.cost.flops == pytest.approx(2 * m * n * k / 6) and tr.cost.time > 0

    gathered = T.translate(problem(m, n, k, 6, (d, d, R), orders=("F", "F", None)))
    (move,) = gathered.cost.moves
    assert move.collective == "all-gather (host-staged)"
    assert move.nbytes == pytest.approx(3 * 5 / 6 * m * n * itemsize)
    assert gathered.cost.time > tr.cost.time

    other = dm.BlockCyclic(dm.ProcessGrid((2, 3), layout="row"), (2, 2))
    general = T.translate(problem(m, n, k, 6, (other, d, d), orders=("F", "F", None)))
    assert general.path == "general"
    assert [mv.operand for mv in general.cost.moves] == ["a"] and general.cost.moves[0].collective == "all-to-all"
    assert general.cost.time > tr.cost.time


def test_block_non_cyclic_2d_and_first_process():
    g = dm.ProcessGrid((2, 2))
    d = dm.BlockNonCyclic(g)
    tr = T.translate(problem(8, 8, 8, 4, (d, d, d), orders=("F", "F", None)))
    assert tr.path == "general" and any("steers cuBLASMp away from SUMMA" in n for n in tr.notes)
    assert tr.handover("a").distribution.block_sizes == (4, 4)
    check_handover_data(tr)
    fp = dm.BlockCyclic(g, (3, 2), first_process=(1, 1))
    t2 = T.translate(problem(9, 7, 5, 4, (fp, dm.BlockCyclic(g, (2, 2), first_process=(1, 1)),
                                        dm.BlockCyclic(g, (3, 2), first_process=(1, 1))), orders=("F", "F", None)))
    assert t2.handover("a").distribution.first_process == (1, 1)
    assert any("first_process" in n for n in t2.notes)
    check_nvmath_rules(t2)
    check_handover_data(t2)


def test_2d_with_replicated_operands_and_result():
    g = dm.ProcessGrid((2, 2))
    d = dm.BlockCyclic(g, (2, 3))
    tr = T.translate(problem(9, 7, 6, 4, (d, R, R), orders=("C", "C", None)))
    assert tr.gather and tr.handover("b").source == R
    check_nvmath_rules(tr)
    check_handover_data(tr)


def test_2d_refusals_name_the_operand_and_the_fix():
    g = dm.ProcessGrid((2, 2))
    with pytest.raises(NotImplementedError, match=r"block sizes of K differ: a has 3, b has 2"):
        T.translate(problem(8, 8, 8, 4, (dm.BlockCyclic(g, (2, 3)), dm.BlockCyclic(g, (2, 2)), dm.BlockCyclic(g, (2, 2)))))
    with pytest.raises(NotImplementedError, match=r"distribution of a: .* unevenly.*or run it as given with "
                                                  r"backend='jax', which takes any layout$"):
        T.translate(problem(9, 8, 8, 4, (dm.BlockNonCyclic(g), dm.BlockNonCyclic(g), dm.BlockNonCyclic(g))))
    with pytest.raises(ValueError, match=r"algorithm='allgather' needs 1-D distributions"):
        T.translate(problem(8, 8, 8, 4, (dm.BlockCyclic(g, (2, 2)),) * 3, algorithm="allgather"))
    with pytest.raises(dm.DistributionError, match=r"distribution of a: .* 4 rank.*mpiexec -n 4"):
        T.translate(problem(8, 8, 8, 1, (dm.BlockCyclic(g, (2, 2)),) * 3))


@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("shape", [(1, 1), (4, 1), (1, 4), (2, 2), (3, 1), (1, 3)])
def test_named_summa_on_any_grid_shape(shape, layout):
    """``algorithm="summa"`` on a, b and the result on one grid of any shape,
    (P, 1) and (1, P) included (cuBLASMp takes any 2-D block-cyclic grid;
    BlockNonCyclic there splits as a Slab does and was refused as "Slab.X",
    BlockCyclic as no shared 2-D grid): handed over on that grid, run through
    the simulated cuBLASMp against numpy. On a 1-D grid nvmath steers cuBLASMp
    away from SUMMA (its use_alt_cache): the path says so. BlockNonCyclic alone
    takes uneven sizes (padded, as a Slab); next to BlockCyclic (one block size
    per dimension, as cuBLASMp needs) the sizes divide. One rank: a local GEMM."""
    grid = dm.ProcessGrid(shape, layout=layout)
    P, (rows, cols) = grid.size, shape
    bnc = dm.BlockNonCyclic(grid)
    uneven = [(13, 7, 1), (5, 13, 9), (13, 11, 7), (7, 9, 13)] if 1 in shape else [(8, 4, 6)] * 4  # 2-D: must divide
    cases = [((bnc, bnc, bnc), uneven[0]), ((bnc, bnc, bnc), uneven[1]), ((bnc, R, bnc), uneven[2]),
             ((R, bnc, R), uneven[3])]
    bc_ = [dm.BlockCyclic(grid, (2, 2)), dm.BlockCyclic(grid, (2, 2), first_process=(rows - 1, cols - 1))]
    cases += [((bc_[i % 2], bc_[(i + 1) % 2], bc_[i // 2]), (12, 12, 12)) for i in range(4)]
    same = dm.BlockCyclic(grid, (12 // rows, 12 // cols))  # BlockNonCyclic's blocks: they agree
    cases += [((x, y, z), (12, 12, 12)) for x, y, z in itertools.product([bnc, same], repeat=3)]
    for i, (dists, (m, n, k)) in enumerate(cases):
        ta, tb = TRANSPOSES[i % 4]
        tr = run_simulated(m, n, k, P, dists, ta, tb, use_c=True, beta=0.5, algorithm="summa")
        assert tr.algorithm == ("summa" if P > 1 else "local"), (dists, ta, tb)
        if P > 1 and 1 in shape:
            assert tr.path != "SUMMA" and any("1-D" in note and "away from SUMMA" in note for note in tr.notes), tr.notes
            assert tr.cost.kernel.algorithm == "summa"
    # a Slab is no ProcessGrid, though nvmath would see it as the 1-D one: SUMMA names the grid
    if P > 1 and 1 in shape:
        slab = X if cols == 1 else Y
        with pytest.raises(ValueError, match="algorithm='summa'") as info:
            T.translate(problem(8, 8, 8, P, (bnc, slab, bnc), algorithm="summa"))
        assert f"b={slab!r}" in str(info.value) and "BlockNonCyclic(ProcessGrid(" in str(info.value)


def test_block_non_cyclic_1d_grid_is_a_slab():
    col = dm.BlockNonCyclic(dm.ProcessGrid((4, 1)))
    a = T.translate(problem(10, 8, 6, 4, (col, Y, col), orders=("C", "C", None)))
    b = T.translate(problem(10, 8, 6, 4, (X, Y, X), orders=("C", "C", None)))
    assert a.path == b.path == "AG+GEMM" and a.dims == b.dims and a.result == b.result


# --------------------------------------------------------------------------- #
# the pipeline against a simulated cuBLASMp (one process, P simulated ranks)
# --------------------------------------------------------------------------- #
def _gelu(d):
    return 0.5 * d * (1 + np.tanh(math.sqrt(2 / math.pi) * (d + 0.044715 * d**3)))


def _epilog(d, name, bias):
    """cuBLASLt's epilogs (it has no SiLU): the bias one value per row of nvmath's result."""
    assert name in ("RELU", "GELU", "BIAS", "RELU_BIAS", "GELU_BIAS"), f"no such epilog in cuBLASLt: {name}"
    if name.endswith("BIAS"):
        d = d + bias[:, None]
    if name.startswith("RELU"):
        d = np.maximum(d, 0)
    elif name.startswith("GELU"):
        d = _gelu(d)
    return d


def simulate_cublasmp(tr, preps):
    """cuBLASMp's semantics on the handed-over blocks, with nvmath's checks."""
    p = tr.problem
    P = p.nranks
    A, B, C = tr.slot("A"), tr.slot("B"), tr.slot("C")
    for r, pr in enumerate(preps):
        for h, x in ((A, pr.A), (B, pr.B), (C, pr.C)):
            if h is not None:
                assert T.dense(x, "F"), f"{h.operand} is not Fortran-ordered as nvmath reads strides"
                assert x.shape == bc(h.distribution).shape(r, h.global_shape)
                assert 0 not in x.shape, f"{h.operand}: nvmath refuses an empty local block {x.shape} on rank {r}"

    # cuBLASMp takes one block size per dimension (M, N, K) in every matrix
    # (nvmath infers them jointly): a grid axis of one process included
    qa, qb, _ = tr.qualifiers
    per_dim = {x: set() for x in "MNK"}
    matrices = [(A, ("K", "M") if qa else ("M", "K")), (B, ("N", "K") if qb else ("K", "N")), (C, ("M", "N"))]
    if tr.path != "GEMM+AR":
        matrices.append((tr.result, ("M", "N")))
    for h, dims in matrices:
        if h is not None:
            for dim, block in zip(dims, getattr(h, "distribution", h).block_sizes):
                per_dim[dim].add(block)
    assert all(len(v) == 1 for v in per_dim.values()), per_dim

    def glob(blocks, h):
        return dm.join([b.astype(np.complex128) for b in blocks], bc(h.distribution), h.global_shape)

    ga, gb = glob([pr.A for pr in preps], A), glob([pr.B for pr in preps], B)
    d = p.alpha * ((ga.T if qa else ga) @ (gb.T if qb else gb))
    if C is not None:
        d = d + p.beta * glob([pr.C for pr in preps], C)
    if tr.fused_epilog not in (None, "ALLREDUCE"):
        bias = np.zeros(d.shape[0], dtype=complex)
        for r, pr in enumerate(preps):
            if pr.bias is not None:
                bias[bc(tr.result).global_indices(r, tr.result_shape)[0]] = pr.bias
        d = _epilog(d, tr.fused_epilog, bias)
    dtype = preps[0].A.dtype
    real = (lambda z: z.real) if np.dtype(dtype).kind != "c" else (lambda z: z)
    if tr.path == "GEMM+AR":
        return [np.asfortranarray(real(d).astype(dtype)) for _ in range(P)]
    return [np.asfortranarray(real(d[np.ix_(*bc(tr.result).global_indices(r, tr.result_shape))]).astype(dtype))
            for r in range(P)]


def simulate_cublaslt(tr, preps):
    out = []
    for pr in preps:
        a = pr.A.T if tr.qualifiers[0] else pr.A
        b = pr.B.T if tr.qualifiers[1] else pr.B
        d = tr.problem.alpha * (a.astype(np.complex128) @ b.astype(np.complex128))
        if pr.C is not None:
            d = d + tr.problem.beta * pr.C
        if tr.fused_epilog:
            d = _epilog(d, tr.fused_epilog, pr.bias)
        out.append((d if np.dtype(pr.A.dtype).kind == "c" else d.real).astype(pr.A.dtype))
    return out


def in_order(x, order):
    if order in ("C", "CF"):
        return np.ascontiguousarray(x)
    if order == "F":
        return np.asfortranarray(x)
    big = np.zeros((x.shape[0], 2 * x.shape[1] + 1), x.dtype)
    big[:, : 2 * x.shape[1] : 2] = x
    return big[:, : 2 * x.shape[1] : 2]


def run_simulated(m, n, k, P, dists, ta, tb, *, orders=("C", "C", "C"), alpha=1.0, beta=0.0, use_c=False,
                  epilog=None, dtype="float64", algorithm="auto", unfused=False, bias_columns=False):
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    a = random_matrix(rng, (k, m) if ta else (m, k), dtype)
    b = random_matrix(rng, (n, k) if tb else (k, n), dtype)
    c = random_matrix(rng, (m, n), dtype) if use_c else None
    bias = None
    if epilog and epilog.endswith("bias"):
        bias = rng.standard_normal((1, n) if bias_columns else m)
    da, db, dd = dists
    la = [in_order(x, orders[0]) for x in dm.split(a, da, P)]
    lb = [in_order(x, orders[1]) for x in dm.split(b, db, P)]
    lc = [in_order(x, orders[2]) for x in dm.split(c, dd, P)] if use_c else [None] * P
    before = [None if x is None else x.copy() for x in lc]
    agreed = (T.combine_orders([T.order_of(x) for x in la]), T.combine_orders([T.order_of(x) for x in lb]),
              T.combine_orders([T.order_of(x) for x in lc]) if use_c else None)
    tr = T.translate(problem(m, n, k, P, dists, ta, tb, agreed, use_c=use_c and beta != 0, epilog=epilog,
                             algorithm=algorithm, dtype=dtype, alpha=alpha, beta=beta, bias_columns=bias_columns))
    if unfused:
        tr = tr.unfused()
    preps = [PL.prepare(tr, r, la[r], lb[r], lc[r], bias, np) for r in range(P)]
    for h in tr.handovers:  # copies exactly as the translation says (some ranks may need no padding)
        arrays = {"a": la, "b": lb, "c": lc}[h.operand]
        copied = [preps[r].copied[h.operand] for r in range(P)]
        assert any(copied) == (h.copy is not None), (h, copied)
        if h.copy is None:
            for r in range(P):
                slot = getattr(preps[r], h.slot)
                assert slot.size == 0 or np.shares_memory(slot, arrays[r]), "a promised view is a copy"
    d_nv = (simulate_cublaslt if tr.engine == "cublaslt" else simulate_cublasmp)(tr, preps)
    blocks = [PL.finish(tr, r, d_nv[r], lc[r], bias, np) for r in range(P)]
    if tr.gather:
        blocks = [PL.assemble(tr, blocks)] * P
    ref = reference(a, b, c, alpha=alpha, beta=beta, transpose_a=ta, transpose_b=tb, epilog=epilog, bias=bias)
    for r, want in enumerate(dm.split(ref, dd, P)):
        assert blocks[r].dtype == np.dtype(a.dtype)
        assert_close(blocks[r], want, dtype)
    for x, y in zip(lc, before):
        assert x is None or np.array_equal(x, y)
    return tr


@pytest.mark.parametrize("P", [1, 3, 4])
@pytest.mark.parametrize("orders", [("C", "C", "C"), ("F", "F", "F"), ("X", "F", "C")])
def test_pipeline_every_1d_triple(P, orders):
    for dists, (ta, tb) in itertools.product(TRIPLES, TRANSPOSES):
        run_simulated(13, 11, 7, P, dists, ta, tb, orders=orders)
        run_simulated(16, 8, 12, P, dists, ta, tb, orders=orders, alpha=0.5, beta=2.0, use_c=True)


@pytest.mark.parametrize("epilog", ["relu", "gelu", "silu", "bias", "relu_bias", "gelu_bias", "silu_bias"])
@pytest.mark.parametrize("unfused", [False, True])
def test_pipeline_epilogs(epilog, unfused):
    for dists, (ta, tb) in itertools.product(TRIPLES, [(False, False), (True, True)]):
        run_simulated(13, 11, 7, 4, dists, ta, tb, alpha=0.5, beta=2.0, use_c=True, epilog=epilog, unfused=unfused)


@pytest.mark.parametrize("epilog", ["bias", "relu_bias", "silu_bias"])
@pytest.mark.parametrize("P", [1, 4])
def test_pipeline_bias_per_column(epilog, P):
    """A bias of shape (1, N): fused where nvmath's result is D.T (the swapped
    frame), else applied by dmatmul with the activation; M and N uneven, every
    memory order's frame."""
    fused = set()
    for dists, (ta, tb), orders in itertools.product(TRIPLES, [(False, False), (True, False)],
                                                     [("C", "C", "C"), ("F", "F", "F")]):
        tr = run_simulated(13, 11, 7, P, dists, ta, tb, orders=orders, alpha=0.5, beta=2.0, use_c=True,
                           epilog=epilog, bias_columns=True)
        if tr.fused_epilog not in (None, "ALLREDUCE"):
            assert tr.swapped and tr.engine == "cublasmp" and tr.post_epilog is None, tr.describe()
            fused.add(tr.path)
        else:
            assert tr.post_epilog == epilog
    if epilog != "silu_bias":
        assert fused, "a fast path fuses a bias per column in the swapped frame"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "complex64", "complex128"])
def test_pipeline_dtypes(dtype):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    epilogs = (None, "bias") if dtype.startswith("complex") else (None, "gelu_bias")
    for dists, epilog in itertools.product([(X, Y, X), (Y, X, R), (X, R, X), (X, X, Y), (R, R, R)], epilogs):
        run_simulated(13, 11, 7, 4, dists, False, True, use_c=True, alpha=0.5, beta=2.0, epilog=epilog, dtype=dtype)


def test_pipeline_2d():
    g = dm.ProcessGrid((2, 2), layout="col")
    d = dm.BlockCyclic(g, (2, 3))
    e = dm.BlockCyclic(g, (3, 3))
    f = dm.BlockCyclic(g, (2, 3), first_process=(1, 0))
    for dists in [(dm.BlockCyclic(g, (2, 3)), dm.BlockCyclic(g, (3, 3)), dm.BlockCyclic(g, (2, 3))), (d, R, d), (R, e, R),
                  (dm.BlockNonCyclic(dm.ProcessGrid((2, 2))),) * 3]:
        for orders in [("C", "C", "C"), ("F", "F", "F")]:
            run_simulated(8, 12, 6, 4, dists, False, False, orders=orders, use_c=True, beta=1.0, epilog="relu")
    run_simulated(9, 7, 6, 4, (f, dm.BlockCyclic(g, (3, 3), first_process=(1, 0)), f), False, False)


@st.composite
def grid_triples(draw):
    """a, b and the result drawn apart on 4 ranks: grids with an axis of one process
    ((4, 1), (1, 4)) next to 2x2, both orders, BlockNonCyclic or BlockCyclic, or Replicated."""
    def dist():
        kind = draw(st.sampled_from(["bnc", "bc", "bc", "rep"]))
        if kind == "rep":
            return R
        grid = dm.ProcessGrid(draw(st.sampled_from([(4, 1), (1, 4), (2, 2)])), layout=draw(st.sampled_from(["row", "col"])))
        fp = (draw(st.integers(0, grid.shape[0] - 1)), draw(st.integers(0, grid.shape[1] - 1)))
        if kind == "bnc":
            return dm.BlockNonCyclic(grid, fp)
        return dm.BlockCyclic(grid, (draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 4]))), fp)
    dists = (dist(), dist(), dist())
    if all(isinstance(d, dm.Replicated) for d in dists) or not any(
            isinstance(d, (dm.BlockCyclic, dm.BlockNonCyclic)) and 1 not in d.grid.shape for d in dists):
        dists = (dists[0], dists[1], dm.BlockCyclic(dm.ProcessGrid((2, 2)), (2, 2)))  # at least one 2-D grid
    return dists, draw(st.booleans()), draw(st.booleans())


def fixed_blocks(m, n, k, dists, ta, tb):
    """Per dimension, the block sizes that axes of several processes fix (by hand)."""
    out = {x: set() for x in "MNK"}
    for op, d in zip("abc", dists):
        if isinstance(d, dm.Replicated):
            continue
        dims = stored(op, ta, tb)
        extent = {"M": m, "N": n, "K": k}
        for axis, dim in enumerate(dims):
            parts = d.grid.shape[axis]
            if parts > 1:
                out[dim].add(d.block_sizes[axis] if isinstance(d, dm.BlockCyclic) else extent[dim] // parts)
    return out


@settings(max_examples=60, deadline=None)
@given(grid_triples())
def test_pipeline_2d_generated(case):
    # each of a, b and the result on its own grid: the translation either runs
    # (checked against numpy through the simulated cuBLASMp, which also
    # requires one block size per dimension) or refuses exactly where axes of
    # several processes fix two block sizes for one dimension
    # several processes fix two block sizes for one dimension, or where some
    # process would hold no part of an operand (nvmath refuses empty local blocks)
    dists, ta, tb = case
    m, n, k = 8, 16, 12
    clash = [dim for dim, v in fixed_blocks(m, n, k, dists, ta, tb).items() if len(v) > 1]
    if clash:
        with pytest.raises(NotImplementedError, match=f"block sizes of ({'|'.join(clash)}) differ"):
            T.translate(problem(m, n, k, 4, dists, ta, tb))
        return
    if empty_handovers(m, n, k, 4, dists, ta, tb):
        with pytest.raises(NotImplementedError, match=r"leaves process (row|column) \d+ of its .* cuBLASMp needs "
                                                      r"a part of every operand on every process"):
            T.translate(problem(m, n, k, 4, dists, ta, tb))
        return
    run_simulated(m, n, k, 4, dists, ta, tb, use_c=True, beta=0.5)


def empty_handovers(m, n, k, P, dists, ta, tb):
    """Whether the translation, were it not refused, would hand some rank an
    empty block (found by running the pipeline with the refusal switched off)."""
    from unittest import mock

    from dmatmul.backends.nvmath._translate import _two_d

    with mock.patch.object(_two_d, "_refuse_empty_blocks", lambda *args: None):
        tr = T.translate(problem(m, n, k, P, dists, ta, tb, use_c=True))
    rng = np.random.default_rng(0)
    parts = [dm.split(random_matrix(rng, shape, "float64"), d, P)
             for shape, d in zip(((k, m) if ta else (m, k), (n, k) if tb else (k, n), (m, n)), dists)]
    preps = [PL.prepare(tr, r, parts[0][r], parts[1][r], parts[2][r], None, np) for r in range(P)]
    return any(0 in x.shape for pr in preps for x in (pr.A, pr.B, pr.C) if x is not None)


def test_pipeline_extreme_sizes():
    for dists in TRIPLES:
        run_simulated(1, 1, 1, 4, dists, False, False)
        run_simulated(2, 3, 5, 4, dists, True, True, use_c=True, beta=1.0)


# --------------------------------------------------------------------------- #
# the execution layer against a fake nvmath-python
# --------------------------------------------------------------------------- #
# the fake_nvmath fixture (tests/conftest.py) puts tests/gpu/_fake_nvmath.py in place of nvmath-python


def test_fake_backend_one_process(fake_nvmath):
    assert backends.probe("nvmath") is None and backends.resolve("auto").name == "nvmath"
    rng = np.random.default_rng(0)
    a, b, c = rng.standard_normal((7, 5)), rng.standard_normal((5, 6)), rng.standard_normal((7, 6))
    bias = rng.standard_normal(7)
    c0 = c.copy()
    d = dm.matmul(a, b, c, beta=2.0, alpha=0.5, epilog="relu_bias", bias=bias, backend="nvmath")
    assert isinstance(d, np.ndarray)
    assert_close(d, reference(a, b, c, alpha=0.5, beta=2.0, epilog="relu_bias", bias=bias), "float64")
    assert np.array_equal(c, c0)
    calls = dict(fake_nvmath.CALLS)
    assert calls["initialize"] == {"device_id": 0, "backends": ["nccl"], "nranks": 1}  # NCCL only by default
    assert calls["Matmul"]["inplace"] is False and calls["Matmul"]["has_c"]


def test_auto_leaves_jax_arrays_and_traces_to_jax_where_nvmath_can_run(fake_nvmath):
    """Where nvmath runs (a GPU machine), backend="auto" in one process still
    gives JAX's world to JAX: jax.Arrays on a user's mesh come back on it,
    sharded as the result distribution says; inside ``jit`` (tracers: nvmath
    takes none) the product is a value of the trace. numpy operands go to
    nvmath, as before."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    rng = np.random.default_rng(1)
    a_np, b_np = rng.standard_normal((16, 6)).astype(np.float32), rng.standard_normal((6, 10)).astype(np.float32)
    ref = reference(a_np, b_np)
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    a = jax.device_put(a_np, NamedSharding(mesh, P(("data", "model"), None)))
    b = jax.device_put(b_np, NamedSharding(mesh, P()))
    with dm.Matmul(a, b) as mm:
        assert "backend:    jax" in mm.explain()
        d = mm.execute()
    assert d.sharding == NamedSharding(mesh, P(("data", "model"), None))
    assert_close(np.asarray(d), ref, "float32")
    d = jax.jit(lambda x, y: dm.matmul(x, y, distribution=(dm.Slab.X, dm.Replicated(), dm.Slab.X)))(a, b)
    assert d.sharding.spec == P(("data", "model"), None)
    assert_close(np.asarray(d), ref, "float32")
    d = jax.jit(lambda x: dm.matmul(x, b_np))(a_np)  # numpy constants inside a trace
    assert_close(np.asarray(d), ref, "float32")
    with dm.Matmul(a_np, b_np) as mm:
        assert "backend:    nvmath" in mm.explain()
        assert_close(mm.execute(), ref, "float32")
    for devices, name in ((1, "nvmath"), (2, "jax"), ([jax.devices()[3]], "jax")):  # a list names JAX devices
        with dm.Matmul(a_np, b_np, distribution=dm.Replicated(), devices=devices) as mm:
            assert f"backend:    {name}" in mm.explain(), devices
            assert_close(mm.execute(), ref, "float32")


def test_fake_backend_backends_from_the_environment(fake_nvmath, monkeypatch):
    monkeypatch.setenv("DMATMUL_NVMATH_BACKENDS", "nvshmem, nccl")
    with dm.Matmul(np.ones((4, 3)), np.ones((3, 5)), backend="nvmath") as mm:
        assert "backends nvshmem, nccl" in mm.explain()
        mm.execute()
    assert dict(fake_nvmath.CALLS)["initialize"]["backends"] == ["nvshmem", "nccl"]


@pytest.mark.parametrize("value,words", [
    ("nvshmem", "leaves out 'nccl'"),
    ("nccl,mpi", "names ['mpi']"),
])
def test_fake_backend_refuses_backends_without_nccl(fake_nvmath, monkeypatch, value, words):
    monkeypatch.setenv("DMATMUL_NVMATH_BACKENDS", value)
    with pytest.raises(RuntimeError, match=re.escape(words)):
        dm.matmul(np.ones((4, 3)), np.ones((3, 5)), backend="nvmath")
    assert "initialize" not in dict(fake_nvmath.CALLS)  # refused before the collective start-up


def test_fake_backend_refuses_a_user_runtime_without_nccl(fake_nvmath):
    MPI = pytest.importorskip("mpi4py.MPI")

    fake_nvmath.initialize(0, MPI.COMM_SELF, backends=["nvshmem"])
    with pytest.raises(RuntimeError, match="initialized without the NCCL backend"):
        dm.matmul(np.ones((4, 3)), np.ones((3, 5)), backend="nvmath")


def test_fake_backend_plan_reuse_and_explain(fake_nvmath):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((6, 4)), rng.standard_normal((6, 5))
    a0 = a.copy()
    with dm.Matmul(a, b, transpose_a=True, backend="nvmath") as mm:
        mm.plan()
        assert mm.algorithm == "local"
        text = mm.explain()
        for words in ("backend:    nvmath", "cuBLASMp via nvmath.distributed", "local GEMM", "qualifiers:",
                      "CUBLASMP_LOG_LEVEL=5", "nvmath-python 1.0.0+fake"):
            assert words in text
        d1 = mm.execute()
        a2 = 2 * a
        mm.reset_operands(a=a2)
        d2 = mm.execute()
        a2[:] = 0  # changed in place after planning: the next execute sees it
        d3 = mm.execute()
    assert_close(d1, reference(a0, b, transpose_a=True), "float64")
    assert np.allclose(d2, 2 * d1) and np.allclose(d3, 0)
    assert [name for name, _ in fake_nvmath.CALLS].count("Matmul") == 1  # planned once
    assert ("free", {}) not in fake_nvmath.CALLS  # the cache owns the plan: a Matmul only borrowed it
    importlib.import_module("dmatmul.backends.nvmath").BACKEND.clear()
    assert ("free", {}) in fake_nvmath.CALLS


def test_fake_backend_refused_epilog_falls_back(fake_nvmath, monkeypatch):
    original = fake_nvmath.Matmul.plan

    def refuse(self, *, epilog=None, **kw):
        if epilog is not None and epilog != fake_nvmath.MatmulEpilogue.ALLREDUCE:
            raise ValueError(f"{epilog.name} epilogue is not supported")
        return original(self, epilog=epilog, **kw)

    monkeypatch.setattr(fake_nvmath.Matmul, "plan", refuse)
    rng = np.random.default_rng(2)
    a, b, bias = (rng.standard_normal(s).astype(np.float32) for s in ((5, 4), (4, 3), (5,)))  # f64 GELU: never fused
    with dm.Matmul(a, b, epilog="gelu_bias", bias=bias, backend="nvmath") as mm:
        d = mm.execute()
        assert "nvmath refused the fused epilog" in mm.explain()
    assert_close(d, reference(a, b, epilog="gelu_bias", bias=bias), "float32")


def test_fake_backend_falls_back_on_a_new_matmul(fake_nvmath, monkeypatch):
    """nvmath can refuse a fused epilog after setting it in its descriptor
    (cuBLASMp's NOT_SUPPORTED from the workspace query); a ``plan()`` without
    epilog on that Matmul would keep it, and dmatmul's own epilogue would then
    apply a second time. The fallback plans a new Matmul."""
    original = fake_nvmath.Matmul.plan

    def refuse_late(self, *, epilog=None, **kw):
        original(self, epilog=epilog, **kw)
        if epilog is not None and epilog != fake_nvmath.MatmulEpilogue.ALLREDUCE:
            raise fake_nvmath.cuBLASMpError(f"NOT_SUPPORTED (CUBLASMP_STATUS_NOT_SUPPORTED): {epilog.name}")

    monkeypatch.setattr(fake_nvmath.Matmul, "plan", refuse_late)
    rng = np.random.default_rng(4)
    a, b, bias = (rng.standard_normal(s).astype(np.float32) for s in ((6, 4), (4, 3), (6,)))
    dist = (dm.BlockCyclic(dm.ProcessGrid((1, 1)), (2, 2)),) * 3  # one rank, but cuBLASMp's Matmul
    with dm.Matmul(a, b, distribution=dist, epilog="relu_bias", bias=bias, backend="nvmath") as mm:
        d = mm.execute()
        assert "nvmath refused the fused epilog" in mm.explain()
    assert_close(d, reference(a, b, epilog="relu_bias", bias=bias), "float32")
    assert [name for name, _ in fake_nvmath.CALLS].count("Matmul") == 2


@pytest.mark.parametrize("dtype,epilog,words", [
    ("complex64", "bias", "cuBLASMp refuses a bias epilog on complex64"),
    ("complex128", "bias", "cuBLASMp refuses a bias epilog on complex128"),
    ("float64", "gelu", "not float64-accurate"),
    ("float64", "gelu_bias", "not float64-accurate"),
])
@pytest.mark.parametrize("transpose_a", [False, True])
def test_fake_backend_plans_around_what_cublasmp_refuses(fake_nvmath, dtype, epilog, words, transpose_a):
    """Planned with dmatmul's own epilogue from the start: the fake nvmath
    refuses these at execute (as cuBLASMp does), so nothing here may reach it."""
    rng = np.random.default_rng(3)
    m, k, n = 6, 5, 4
    a = random_matrix(rng, (k, m) if transpose_a else (m, k), dtype)
    b, c = random_matrix(rng, (k, n), dtype), random_matrix(rng, (m, n), dtype)
    bias = random_matrix(rng, (m, 1), dtype).reshape(-1) if epilog.endswith("bias") else None
    with dm.Matmul(a, b, c, beta=0.5, transpose_a=transpose_a, epilog=epilog, bias=bias, backend="nvmath") as mm:
        text = mm.explain()
        d = mm.execute()
    assert words in text and f"epilog {epilog!r} not fused" in text
    assert "fused into cuBLASMp" not in text and "applied by dmatmul on the local result block" in text
    assert all(kw["epilog"] is None for name, kw in fake_nvmath.CALLS if name in ("plan", "host plan"))
    assert_close(d, reference(a, b, c, beta=0.5, transpose_a=transpose_a, epilog=epilog, bias=bias), dtype)


@pytest.mark.parametrize("epilog, bias_shape, fused", [
    ("silu", None, None),
    ("silu_bias", (6,), None),
    ("silu_bias", (1, 4), None),
    ("relu_bias", (1, 4), "RELU_BIAS"),
    ("bias", (1, 4), "BIAS"),
    ("relu_bias", (6,), "RELU_BIAS"),
])
def test_fake_backend_silu_and_a_bias_per_column(fake_nvmath, epilog, bias_shape, fused):
    """cuBLASLt has no SiLU epilog (nor the fake): nvmath computes the product
    alone and dmatmul applies the epilogue; a bias of shape (1, N) is fused in
    the frame whose nvmath result is D.T. explain() says which."""
    assert "SILU" not in fake_nvmath.MatmulEpilogue.__members__  # what real nvmath lacks, the fake lacks
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    bias = None if bias_shape is None else rng.standard_normal(bias_shape)
    with dm.Matmul(a, b, epilog=epilog, bias=bias, backend="nvmath") as mm:
        d = mm.execute()
        text = mm.explain()
    assert [kw["epilog"] for name, kw in fake_nvmath.CALLS if name in ("plan", "host plan")] == [fused]
    if fused is None:
        assert f"epilog {epilog!r} not fused: cuBLASLt has no silu epilog" in text
        assert f"applied by dmatmul on the local result block: {epilog}" in text
    elif bias_shape == (1, 4):
        assert "D.T = op(B).T" in text and "one value per result column (shape (1, N)): fused" in text
    assert_close(d, reference(a, b, epilog=epilog, bias=bias), "float64")


def test_fake_nvmath_refuses_a_bias_of_another_length_than_its_rows(fake_nvmath):
    """A bias per column handed as nvmath's bias of a frame whose rows are D's
    would be refused by nvmath: so by the fake."""
    fake_nvmath.initialize(0, __import__("mpi4py.MPI").MPI.COMM_SELF, backends=["nccl"])
    grid = fake_nvmath.ProcessGrid(shape=(1, 1), layout=fake_nvmath.GridLayout.ROW_MAJOR)
    a, b = np.asfortranarray(np.ones((6, 5))), np.asfortranarray(np.ones((5, 4)))
    mm = fake_nvmath.Matmul(a, b, distributions=[fake_nvmath.BlockCyclic(grid, (8, 8))] * 3)
    with pytest.raises(ValueError, match="bias"):
        mm.plan(epilog=fake_nvmath.MatmulEpilogue.BIAS, epilog_inputs={"bias": np.ones(4)})
    with pytest.raises(ValueError, match="bias"):  # cuBLASLt's too
        fake_nvmath.HostMatmul(a, b).plan(epilog=fake_nvmath.MatmulEpilogue.BIAS, epilog_inputs={"bias": np.ones(4)})


def test_fake_nvmath_refuses_at_execute_what_cublasmp_refuses(fake_nvmath):
    """The fake is faithful: sent fused, these fail at execute, after a plan() that accepted them."""
    fake_nvmath.initialize(0, __import__("mpi4py.MPI").MPI.COMM_SELF, backends=["nccl"])
    grid = fake_nvmath.ProcessGrid(shape=(1, 1), layout=fake_nvmath.GridLayout.ROW_MAJOR)
    dist = fake_nvmath.BlockCyclic(grid, (4, 4))
    for dtype, epilog in ((np.complex64, "BIAS"), (np.float64, "GELU")):
        a = np.asfortranarray(np.ones((4, 4), dtype=dtype))
        mm = fake_nvmath.Matmul(a, a, distributions=[dist] * 3)
        ep = fake_nvmath.MatmulEpilogue[epilog]
        mm.plan(epilog=ep, epilog_inputs={"bias": np.ones(4, dtype=dtype)} if epilog == "BIAS" else None)
        with pytest.raises(RuntimeError, match="NOT_SUPPORTED|not float64-accurate"):
            mm.execute()


def test_fake_nvmath_leaves_d_unwritten_where_cublasmp_returns_early(fake_nvmath):
    """The fake is faithful to cuBLASMp's quick return (issue 34): alpha = 0 and
    beta = 1 with C on a result of one column or one row leaves D unwritten
    (NaN in the fake's fresh buffer); a 35x4 result, or beta = 0.5, is right."""
    fake_nvmath.initialize(0, __import__("mpi4py.MPI").MPI.COMM_SELF, backends=["nccl"])
    grid = fake_nvmath.ProcessGrid(shape=(1, 1), layout=fake_nvmath.GridLayout.ROW_MAJOR)
    dist = fake_nvmath.BlockCyclic(grid, (8, 8))
    rng = np.random.default_rng(4)
    for (m, n), beta, unwritten in (((35, 1), 1.0, True), ((1, 35), 1.0, True), ((35, 4), 1.0, False),
                                    ((35, 1), 0.5, False)):
        a, b, c = (np.array(rng.standard_normal(s), order="F") for s in ((m, 7), (7, n), (m, n)))
        mm = fake_nvmath.Matmul(a, b, c, distributions=[dist] * 3, alpha=0.0, beta=beta)
        mm.plan()
        d = mm.execute()
        assert np.isnan(d).all() if unwritten else np.allclose(d, beta * c), (m, n, beta)


@pytest.mark.parametrize("shape", [(35, 1), (1, 35), (35, 4)])
@pytest.mark.parametrize("poisoned", [False, True])
def test_fake_backend_alpha_0_reads_neither_a_nor_b(fake_nvmath, shape, poisoned):
    """alpha = 0 follows BLAS on the nvmath backend: a and b are not read (NaN
    and inf in them stay out of the result) and nvmath is never given alpha = 0
    (cuBLASMp's quick return would leave a one-row or one-column D unwritten),
    in dm.matmul and in a Matmul reset to alpha = 0; explain() says so."""
    rng = np.random.default_rng(5)
    m, n = shape
    a, b, c = (random_matrix(rng, s, "float32") for s in ((m, 7), (7, n), (m, n)))
    if poisoned:
        a[m // 2, 3], b[2, n - 1] = np.nan, np.inf
    want = reference(a, b, c, alpha=0.0, beta=1.0)
    assert np.array_equal(want, c)  # (the reference reads neither)
    assert_close(dm.matmul(a, b, c, alpha=0.0, beta=1.0, backend="nvmath"), want, "float32")
    d = dm.matmul(a, b, c, alpha=0.0, beta=0.5, epilog="relu", backend="nvmath")
    assert_close(d, reference(a, b, c, alpha=0.0, beta=0.5, epilog="relu"), "float32")
    with dm.Matmul(a, b, c, alpha=1.0, beta=1.0, backend="nvmath") as mm:
        mm.reset_operands(alpha=0.0)
        assert_close(mm.execute(), want, "float32")
        assert "alpha = 0: A and B are not read" in mm.explain()
    assert all(kw["alpha"] != 0 for name, kw in fake_nvmath.CALLS if name == "Matmul")
    assert "quick return" not in dict(fake_nvmath.CALLS)


def test_fake_backend_one_process_asks_for_one_device(fake_nvmath):
    with pytest.raises(ValueError, match=r"devices=4 .* one rank per process .* mpiexec -n 4"):
        dm.matmul(np.ones((4, 3)), np.ones((3, 5)), devices=4, backend="nvmath")
    with pytest.raises(dm.DistributionError, match=r"distribution of a: .* mpiexec -n 4, or span one process's "
                                                   r"devices with backend='jax', devices=4$"):
        g = dm.BlockCyclic(dm.ProcessGrid((2, 2)), (2, 2))
        dm.matmul(np.ones((4, 4)), np.ones((4, 4)), distribution=g, backend="nvmath")


@pytest.mark.parametrize("ngpus,version,words", [
    (0, 800, "no CUDA device visible"),
    (1, 1000, "needs 0.8 <= cuBLASMp < 0.10"),
    (1, 500, "cuBLASMp 0.5.0 found"),
    (1, 701, "cuBLASMp 0.7.1 found"),  # nvmath 1.0's Matmul: "cublasMp >= 0.8.0 required"
])
def test_unavailable_reasons(fake_nvmath, ngpus, version, words):
    nv = importlib.import_module("dmatmul.backends.nvmath")
    fake_nvmath.uninstall()
    fake_nvmath.install(ngpus=ngpus, cublasmp_version=version)
    nv.unavailable.cache_clear()
    reason = nv.unavailable()
    assert reason is not None and words in reason
    with pytest.raises(RuntimeError, match="backend='nvmath' is not available"):
        dm.matmul(np.ones((2, 2)), np.ones((2, 2)), backend="nvmath")
    assert backends.resolve("auto").name == "jax"


def test_unavailable_when_cublasmp_does_not_load(fake_nvmath):
    nv = importlib.import_module("dmatmul.backends.nvmath")

    def broken():
        raise OSError("libcublasmp.so.0: cannot open shared object file")

    sys.modules["nvmath.bindings.cublasMp"].get_version = broken
    nv.unavailable.cache_clear()
    reason = nv.unavailable()
    assert "cuBLASMp library could not be loaded" in reason and "pip install 'dmatmul[nvmath]'" in reason


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 4])
def test_fake_backend_under_mpiexec(nprocs):
    """The whole backend (runtime start-up, agreement on memory orders, nvmath
    calls, MPI allgather of replicated results) on 2 and 4 real processes,
    nvmath replaced by the fake: every 1-D triple x transposes, a sample of the
    alpha/beta/c x epilog x dtype variants, plan reuse, and on 4 a sample of 2-D
    block-cyclic grids (SUMMA, the general path). (On 2, m = 3 splits
    into a row block of 1: a vector block, which nvmath reads by its strides.)"""
    mpiexec = shutil.which("mpiexec") or str(pathlib.Path(sys.executable).parent / "mpiexec")
    if not os.path.exists(mpiexec) or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpiexec / mpi4py not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    out = subprocess.run([mpiexec, "-n", str(nprocs), sys.executable, str(GPU_DIR / "nvmath_products.py"), "--fake",
                          "--quick"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "cases match numpy" in out.stdout and "MISMATCH" not in out.stdout
    for path in ("AG+GEMM", "GEMM+RS", "GEMM+AR", "general", "local GEMM") + (("SUMMA",) if nprocs == 4 else ()):
        assert path in out.stdout


@pytest.mark.parametrize("order", ["C", "F"])  # F: the bias is fused (a staged buffer); C: dmatmul adds it
@pytest.mark.parametrize("resident", [False, True])
def test_fake_backend_execute_hands_over_only_what_changed(fake_nvmath, monkeypatch, resident, order):
    """Device operands (numpy standing in, as on_device says): the same buffers
    again need no reset_operands, and in-place changes are still seen (nvmath
    reads them where they are; a staged bias is refilled). Host operands are
    handed over every call (nvmath copies them to the GPU then). No collective
    agreement after planning."""
    from dmatmul.backends.nvmath import _backend as B

    monkeypatch.setattr(B, "on_device", lambda xp: resident)
    rng = np.random.default_rng(4)
    a, b, c, bias = rng.standard_normal((6, 5)), rng.standard_normal((5, 4)), rng.standard_normal((6, 4)), \
        rng.standard_normal(6)
    a, b, c = (np.asarray(x, order=order) for x in (a, b, c))
    with dm.Matmul(a, b, c, beta=0.5, epilog="relu_bias", bias=bias, backend="nvmath") as mm:
        mm.plan()
        assert ("MatmulEpilog.RELU_BIAS" in mm.explain()) == (order == "F")
        monkeypatch.setattr(dm._runtime, "agree", lambda *a, **k: pytest.fail("a collective after planning"))
        resets = lambda: [n for n, _ in fake_nvmath.CALLS].count("reset_operands")  # noqa: E731
        d1 = mm.execute()
        d2 = mm.execute()
        assert resets() == (0 if resident else 2)
        a[:] *= 2  # changed in place
        bias[:] += 1
        d3 = mm.execute()
        assert resets() == (0 if resident else 3)
        a2 = np.asarray(rng.standard_normal((6, 5)), order=order)
        mm.reset_operands(a=a2)
        d4 = mm.execute()
        assert resets() == (1 if resident else 4)
    ref = lambda a, bias: reference(a, b, c, beta=0.5, epilog="relu_bias", bias=bias)  # noqa: E731
    assert_close(d1, ref(a / 2, bias - 1), "float64")
    assert np.array_equal(d1, d2)
    assert_close(d3, ref(a, bias), "float64")
    assert_close(d4, ref(a2, bias), "float64")


def test_fake_backend_plan_cache_borrows(fake_nvmath, monkeypatch):
    """dm.matmul reuses one plan per problem (keyed by spec and memory orders);
    a Matmul's free() returns its borrow and never frees a plan another holds;
    an evicted plan is freed when its last borrow returns; clear() (atexit)
    frees the rest."""
    nv = importlib.import_module("dmatmul.backends.nvmath")

    monkeypatch.setattr(type(nv.BACKEND), "cache_size", 2)
    names = lambda: [n for n, _ in fake_nvmath.CALLS]  # noqa: E731
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    for scale in (1.0, 2.0, 3.0):
        assert_close(dm.matmul(scale * a, b, backend="nvmath"), reference(scale * a, b), "float64")
    assert names().count("Matmul") == 1 and "free" not in names()
    dm.matmul(np.asfortranarray(a), b, backend="nvmath")  # another memory order: another plan
    assert names().count("Matmul") == 2
    held = dm.Matmul(a, b, backend="nvmath")
    held.plan()  # borrows the first plan
    with dm.Matmul(a, b, backend="nvmath") as other:
        assert_close(other.execute(), reference(a, b), "float64")
    assert "free" not in names()  # other's free() returned its borrow; held still uses the plan
    dm.matmul(np.asfortranarray(a), b, backend="nvmath")  # the F-order plan used last: the first is the oldest
    assert names().count("Matmul") == 2
    dm.matmul(a.astype(np.float32), b.astype(np.float32), backend="nvmath")  # a third plan evicts the first
    assert "free" not in names()  # evicted but borrowed: kept
    assert_close(held.execute(), reference(a, b), "float64")
    held.free()
    assert names().count("free") == 1  # the last borrow returned: freed
    nv.BACKEND.clear()
    assert names().count("free") == 3  # the two still cached


def test_fake_backend_threads_share_a_plan(fake_nvmath, monkeypatch):
    """Threads multiplying one problem at once share its cached plan, and so
    its one nvmath Matmul: each thread's operands are handed over and run
    before the next thread's (before, a thread's execute ran on the operands
    another thread had handed over just after: its product, silently)."""
    import concurrent.futures
    import threading

    a, b = np.ones((6, 5)), np.ones((5, 4))
    dm.matmul(a, b, backend="nvmath")  # the plan, made once
    barrier = threading.Barrier(2)
    for cls in (fake_nvmath.Matmul, fake_nvmath.HostMatmul):
        handed = cls.reset_operands

        def reset_operands(self, *args, _handed=handed, **kwargs):  # both threads hand over, then both run
            _handed(self, *args, **kwargs)
            try:
                barrier.wait(timeout=0.5)
            except threading.BrokenBarrierError:  # the other thread waits for this one's call to end
                pass

        monkeypatch.setattr(cls, "reset_operands", reset_operands)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda s: dm.matmul(s * a, b, backend="nvmath"), (2.0, 3.0)))
    np.testing.assert_array_equal(got[0], np.full((6, 4), 10.0))
    np.testing.assert_array_equal(got[1], np.full((6, 4), 15.0))


def test_fake_backend_clear_waits_for_an_execute_of_another_thread(fake_nvmath, monkeypatch):
    """``clear()`` (``dm.finalize()``, or at exit) from one thread while another
    runs a cached plan frees it after that call, not in the middle of it
    (before, the nvmath Matmul was freed under the running execute)."""
    import concurrent.futures
    import threading

    nv = importlib.import_module("dmatmul.backends.nvmath")
    a, b = np.ones((6, 5)), np.ones((5, 4))
    dm.matmul(a, b, backend="nvmath")  # the plan, made once
    running, freed = threading.Event(), threading.Event()
    for cls in (fake_nvmath.Matmul, fake_nvmath.HostMatmul):
        ran, free = cls.execute, cls.free

        def execute(self, *args, _ran=ran, **kwargs):  # the other thread clears meanwhile
            running.set()
            freed.wait(timeout=0.5)
            if self.freed:
                raise RuntimeError("fake nvmath: a freed Matmul executed")
            return _ran(self, *args, **kwargs)

        def free_(self, *args, _free=free, **kwargs):
            freed.set()
            return _free(self, *args, **kwargs)

        monkeypatch.setattr(cls, "execute", execute)
        monkeypatch.setattr(cls, "free", free_)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        product = pool.submit(dm.matmul, 2.0 * a, b, backend="nvmath")
        assert running.wait(timeout=5)
        nv.BACKEND.clear()
        np.testing.assert_array_equal(product.result(), np.full((6, 4), 10.0))
    assert freed.is_set()


def test_fake_backend_threads_start_one_backend(fake_nvmath, monkeypatch):
    """Threads whose first products run at once make one backend object (one
    plan cache, one start-up of nvmath.distributed): before, each could make
    its own, plan the problem again and initialize nvmath a second time."""
    import concurrent.futures
    import threading
    import time

    from dmatmul.backends.nvmath import _backend as B

    nv = importlib.import_module("dmatmul.backends.nvmath")
    made = B.NvmathBackend.__init__

    def slow_init(self):  # the other threads ask for the backend meanwhile
        time.sleep(0.05)
        made(self)

    monkeypatch.setattr(B.NvmathBackend, "__init__", slow_init)
    monkeypatch.setattr(nv.BACKEND, "_impl", None)
    fake_nvmath.CALLS.clear()
    a, b = np.ones((6, 5)), np.ones((5, 4))
    barrier = threading.Barrier(4)

    def first(_):
        barrier.wait()
        return dm.matmul(a, b, backend="nvmath")

    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for d in pool.map(first, range(4)):
                np.testing.assert_array_equal(d, np.full((6, 4), 5.0))
    finally:
        nv.BACKEND.clear()  # this test's backend goes before monkeypatch puts the fixture's back
    names = [n for n, _ in fake_nvmath.CALLS]
    assert names.count("initialize") == 1 and names.count("Matmul") + names.count("HostMatmul") == 1, names


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("shapes", [
    ((1, 6), (6, 5), None),   # a row: a C-order (1, k) is "F-contiguous" to numpy's flags, not to nvmath
    ((4, 6), (6, 1), (4, 1)),  # columns: a C-order (m, 1) has the leading dimension 1 < m
    ((4, 1), (1, 5), None),   # K = 1: an outer product of two vectors
    ((1, 1), (1, 3), (1, 3)),
])
@pytest.mark.parametrize("transpose_a", [False, True])
def test_fake_backend_vector_blocks(fake_nvmath, order, shapes, transpose_a):
    """Blocks one row or one column wide, in either memory order: nvmath reads
    element strides (ascending, dense) and takes ``strides[1]`` as the leading
    dimension, which must cover the rows; the fake checks both."""
    rng = np.random.default_rng(3)
    sa, sb, sc = shapes
    a = np.array(rng.standard_normal(sa[::-1] if transpose_a else sa), order=order)
    b = np.array(rng.standard_normal(sb), order=order)
    c = None if sc is None else np.array(rng.standard_normal(sc), order=order)
    d = dm.matmul(a, b, c, beta=0.0 if c is None else 1.5, transpose_a=transpose_a, backend="nvmath")
    assert_close(d, reference(a, b, c, beta=0.0 if c is None else 1.5, transpose_a=transpose_a), "float64")


_EXIT_SCRIPT = """
import atexit, os, sys
sys.path.insert(0, sys.argv[1])
import _fake_nvmath as F
atexit.register(lambda: os.write(1, f"at exit: {[n for n, _ in F.CALLS if n in ('free', 'finalize')]}\\n".encode()))
F.install()
import numpy as np, dmatmul as dm
d = dm.matmul(np.ones((4, 3)), np.ones((3, 6)), distribution=(dm.Slab.X, dm.Slab.Y, dm.Slab.X), backend="nvmath")
assert np.allclose(dm.join(dm.runtime().comm.allgather(d), dm.Slab.X, (8, 12)), 3.0)  # each rank: its blocks
if sys.argv[2] == "finalize":
    dm.finalize()
    os.write(1, f"after dm.finalize: {[n for n, _ in F.CALLS if n in ('free', 'finalize')]}\\n".encode())
"""


@pytest.mark.mpi
@pytest.mark.parametrize("end", ["exit", "finalize"])
def test_fake_backend_frees_its_plans_before_nvmath_finalizes_at_exit(end):
    """nvmath.distributed registers its finalize (which destroys cuBLASMp's
    grids) at exit when it starts; dmatmul's cached plans must be freed before
    it runs (a free after it is a use after free in cuBLASMp). ``dm.finalize()``
    frees them at once."""
    mpiexec = shutil.which("mpiexec") or str(pathlib.Path(sys.executable).parent / "mpiexec")
    if not os.path.exists(mpiexec) or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpiexec / mpi4py not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    out = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", _EXIT_SCRIPT, str(GPU_DIR), end],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    if end == "finalize":
        assert out.stdout.count("after dm.finalize: ['free']") == 2, out.stdout + out.stderr
    assert out.stdout.count("at exit: ['free', 'finalize']") == 2, out.stdout + out.stderr
    assert "after nvmath.distributed.finalize" not in out.stderr


_ORDERS_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
import _fake_nvmath as F
F.install()
import numpy as np, dmatmul as dm
rng = np.random.default_rng(dm.init().rank)
a, b = rng.standard_normal((4, 3)), rng.standard_normal((3, 6))
X, Y = dm.Slab.X, dm.Slab.Y
want = dm.join(dm.runtime().comm.allgather(a), X, (8, 3)) @ dm.join(dm.runtime().comm.allgather(b), Y, (3, 12))
# rank 1's a in Fortran order first, then every rank's in C order: each rank's own key changes differently
r = dm.runtime().rank
for order in ("F" if r == 1 else "C", "C", "C", "F" if r == 0 else "C"):
    d = dm.matmul(np.array(a, order=order), b, distribution=(X, Y, X), backend="nvmath")
    assert np.allclose(dm.join(dm.runtime().comm.allgather(d), X, (8, 12)), want)
print("ok", flush=True)
"""


@pytest.mark.mpi
def test_fake_backend_ranks_plan_and_free_alike_when_their_memory_orders_change():
    """The plan cache's key is every rank's: where one rank's operand changes
    memory order between calls and another's does not, no rank hits while
    another misses (a miss retires the old plan: freeing it is collective)."""
    mpiexec = shutil.which("mpiexec") or str(pathlib.Path(sys.executable).parent / "mpiexec")
    if not os.path.exists(mpiexec) or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpiexec / mpi4py not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    try:
        out = subprocess.run(["timeout", "-s", "KILL", "120", mpiexec, "-n", "2", sys.executable, "-c", _ORDERS_SCRIPT,
                              str(GPU_DIR)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=180)
    except subprocess.TimeoutExpired as e:  # pragma: no cover - a hang
        raise AssertionError(f"hung: {e}") from None
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert out.stdout.count("ok") == 2


_REFUSED_ON_ONE_RANK_SCRIPT = """
import os, sys
sys.path.insert(0, sys.argv[1])
import _fake_nvmath as F
F.install()
import numpy as np, dmatmul as dm
rank = dm.init().rank
original = F.Matmul.plan
def refuse_on_rank_1(self, *, epilog=None, **kw):
    if rank == 1 and epilog is not None and epilog != F.MatmulEpilogue.ALLREDUCE:
        raise F.cuBLASMpError("NOT_SUPPORTED (CUBLASMP_STATUS_NOT_SUPPORTED): " + epilog.name)
    return original(self, epilog=epilog, **kw)
F.Matmul.plan = refuse_on_rank_1
rng = np.random.default_rng(rank)
a, b = rng.standard_normal((4, 3)), rng.standard_normal((3, 6))
bias = np.arange(8.0)  # the whole vector on every rank
X, Y = dm.Slab.X, dm.Slab.Y
comm = dm.runtime().comm
with dm.Matmul(a, b, distribution=(X, Y, X), epilog="bias", bias=bias, backend="nvmath") as mm:
    d = mm.execute()
    os.write(1, f"{rank} {'refused' if 'nvmath refused the fused epilog' in mm.explain() else 'fused'}\\n".encode())
want = (dm.join(comm.allgather(a), X, (8, 3)) @ dm.join(comm.allgather(b), Y, (3, 12))
        + bias[:, None])
assert np.allclose(dm.join(comm.allgather(d), X, (8, 12)), want)
"""


@pytest.mark.mpi
def test_fake_backend_ranks_fall_back_together():
    """nvmath refuses the fused epilog on one rank only: every rank plans the
    unfused product (cuBLASMp's Matmul is collective: the ranks must run one
    plan)."""
    mpiexec = shutil.which("mpiexec") or str(pathlib.Path(sys.executable).parent / "mpiexec")
    if not os.path.exists(mpiexec) or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpiexec / mpi4py not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    out = subprocess.run(["timeout", "-s", "KILL", "120", mpiexec, "-n", "2", sys.executable, "-c",
                          _REFUSED_ON_ONE_RANK_SCRIPT, str(GPU_DIR)], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=180)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert sorted(out.stdout.split("\n")[:2]) == ["0 refused", "1 refused"], out.stdout


def test_ranks_must_pass_operands_in_the_same_memory():
    """Under mpiexec every rank's plan key is gathered: operands in GPU memory
    on some ranks and host memory on others raise (on every rank alike: the
    keys are the same everywhere), naming the operand and the ranks; numpy and
    CPU jax arrays are both host memory. (The whole path runs under mpiexec in
    tests/gpu/nvmath_products.py.)"""
    from dmatmul.backends.nvmath import _backend as B

    key = lambda a, b, c="-": (None, "C", "C", None, a, b, c)  # noqa: E731
    B._same_memory((key("numpy", "numpy"), key("jax:cpu", "numpy")), 0)  # host everywhere: fine
    B._same_memory((key("cupy", "jax:gpu", "cupy"), key("jax:gpu", "cupy", "cupy")), 1)  # GPU everywhere: fine
    with pytest.raises(ValueError, match=r"where b lives: rank 0 passes 'host', rank 1 passes 'GPU' \(this is rank 0\)"):
        B._same_memory((key("numpy", "numpy"), key("numpy", "cupy")), 0)
    with pytest.raises(ValueError, match=r"where c lives: rank 2 passes 'host'"):
        B._same_memory((key("cupy", "cupy", "cupy"),) * 2 + (key("cupy", "cupy", "numpy"),), 1)


@pytest.mark.parametrize("nranks,words", [
    (8, r"summa25d.*sub-communicator.*nvmath-python 1\.0.*one communicator.*backend='jax'"),
    (16, r"summa25d.*sub-communicator.*cublasMpGridCreate"),
    (4, r"summa25d.*q\*q\*c.*runs on 4"),  # no layers at all: the algorithm's own refusal, as on JAX
    (1, r"summa25d.*q\*q\*c.*runs on 1"),
])
def test_summa25d_has_no_nvmath_path(nranks, words):
    """2.5-D SUMMA needs a SUMMA per layer on the layer's sub-communicator, which
    nvmath 1.0's Matmul (one communicator, no per-call one) cannot run: refused
    whatever the layout, naming why and where it runs."""
    grid = dm.BlockCyclic(dm.ProcessGrid((2, nranks // 2)), (2, 2)) if nranks >= 2 else R
    for dists in ((X, Y, X), (grid,) * 3):
        with pytest.raises(ValueError, match=words):
            T.translate(T.Problem.of(16, 16, 16, nranks, False, False, dists, ("C", "C", None),
                                     algorithm="summa25d"))
