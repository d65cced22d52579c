"""Overlap of communication with computation in the nvmath backend: the
``overlap:`` line of explain() as a pure function of the Translation and what
the execution layer reports (CPU only), and that line in a plan's explain()
(the simulated nvmath)."""

from __future__ import annotations

import numpy as np
import pytest

from dmatmul import Replicated, Slab
from dmatmul.backends.nvmath._translate import Memory, Problem, overlap, translate

N = 4


def _tr(dists, orders=("C", "C", None), nranks=N, epilog=None):
    return translate(Problem.of(16, 8, 12, nranks, False, False, dists, orders, epilog=epilog) if epilog
                     else Problem.of(16, 8, 12, nranks, False, False, dists, orders))


AG = (Replicated(), Slab.Y, Slab.X)  # AllGather+GEMM, not swapped: nvmath B is the user's b
AG_SWAPPED = (Slab.X, Replicated(), Slab.Y)  # AllGather+GEMM in the swapped frame: nvmath B is a
RS = (Slab.Y, Replicated(), Slab.X)  # GEMM+ReduceScatter
AR = (Slab.Y, Slab.X, Replicated())  # GEMM+AllReduce


def test_the_paths_are_what_the_cases_say():
    assert _tr(AG).path == "AG+GEMM" and not _tr(AG).swapped
    assert _tr(RS).path == "GEMM+RS" and _tr(AR).path == "GEMM+AR"


@pytest.mark.parametrize("where, words", [
    ("user", "B (the user's b) is the caller's array, handed over without a copy and left where it is"),
    ("ordinary", "B (the user's b) is staged in ordinary device memory: because"),
    ("host", "B (the user's b) is a host array: nvmath copies it to ordinary device memory"),
])
def test_allgather_gemm_overlaps_and_says_where_b_is(where, words):
    line = overlap(_tr(AG), Memory("nccl", where, b_why="because"))
    assert line.startswith("yes: AllGather+GEMM is pipelined by cuBLASMp (its workspace is in NCCL symmetric memory")
    assert line.endswith(words)


def test_swapped_frame_names_the_user_operand_in_b():
    t = _tr(AG_SWAPPED)
    assert t.path == "AG+GEMM" and t.swapped
    assert "B (the user's a)" in overlap(t, Memory("nccl", "user"))


@pytest.mark.parametrize("dists, name", [(RS, "GEMM+ReduceScatter"), (AR, "GEMM+AllReduce")])
def test_reduce_paths_overlap_without_a_word_on_b(dists, name):
    line = overlap(_tr(dists), Memory("nccl", "ordinary", b_why="x"))
    assert line.startswith(f"yes: {name} is pipelined by cuBLASMp") and "B (" not in line


def test_one_rank_and_cublaslt_do_not_communicate():
    assert overlap(_tr(AG, nranks=1), Memory("nccl", "user")) == "no: one rank, nothing is communicated"
    t = _tr((Replicated(), Replicated(), Slab.X))  # a local kernel on every rank
    assert t.engine == "cublaslt"
    assert overlap(t, Memory("nccl", "none")) == "no: cuBLASLt on each rank, nothing is communicated"


def test_summa_and_general_are_not_documented_as_overlapping():
    import dmatmul as dm

    d = dm.BlockCyclic(dm.ProcessGrid((2, 2), layout="col"), (2, 2))
    t = _tr((d, d, d), orders=("F", "F", None))
    assert t.path == "SUMMA"
    line = overlap(t, Memory("nccl", "user"))
    assert line.startswith("not documented: cuBLASMp documents communication/computation overlap for "
                           "AllGather+GEMM, GEMM+ReduceScatter and GEMM+AllReduce only")


def test_workspace_not_known_to_be_symmetric_is_not_claimed():
    line = overlap(_tr(AG), Memory("unknown", "user", workspace_why="cuBLASMp 0.7.0"))
    assert line.startswith("not known: cuBLASMp runs AllGather+GEMM without overlap unless its workspace is in "
                           "NCCL symmetric memory") and line.endswith("(cuBLASMp 0.7.0)")


# --------------------------------------------------------------------------- #
# what the execution layer reports, and the line in a plan's explain()
# --------------------------------------------------------------------------- #
UNEVEN = (16, 8, 10)  # n = 10 on 4 ranks as [3, 3, 2, 2]: rank 3 pads its B (the user's b), so stages it


def _ag(n):
    m, k, _ = UNEVEN
    t = translate(Problem.of(m, n, k, N, False, False, AG, ("F", "F", None)))
    assert t.path == "AG+GEMM" and not t.swapped and t.handover("b").slot == "B"
    return t


def _blocks(t, rank, rng):
    p = t.problem
    shapes = {"a": (p.m, p.k), "b": (p.k, p.n)}
    out = {}
    for i, name in enumerate("ab"):
        rows, cols = p.distributions[i].global_indices(rank, shapes[name], p.nranks)
        out[name] = np.asfortranarray(rng.standard_normal(shapes[name])[np.ix_(rows, cols)])
    return out["a"], out["b"]


@pytest.mark.parametrize("n, rank, want", [(12, 3, "user"), (10, 0, "user"), (10, 3, "ordinary")])
def test_program_says_whether_b_is_the_callers_array_or_a_staged_copy(n, rank, want):
    from dmatmul.backends.nvmath import _pipeline as PL

    t = _ag(n)
    a, b = _blocks(t, rank, np.random.default_rng(n))
    prog = PL.Program(t, rank, a, b, None, None, np)
    assert prog.placement("B") == want
    assert np.shares_memory(prog.prepare(a, b, None, None).B, b) == (want == "user")
    assert prog.placement("no such slot") is None


def test_memory_report():
    from dmatmul.backends.nvmath._engine import memory

    t = _tr(AG)
    assert memory(t, "user", True, 800) == Memory("nccl", "user")
    assert memory(t, "user", False, 901) == Memory("nccl", "host")
    ordinary = memory(t, "ordinary", True, 800)
    assert ordinary.b == "ordinary" and "nvmath's symmetric memory is NVSHMEM's" in ordinary.b_why
    assert memory(t, "user", True, 703).workspace_why == "cuBLASMp 0.7.3; nvmath 1.0 runs 0.8 and newer"
    assert memory(t, "user", True, None).workspace == "unknown"
    assert memory(_tr((Replicated(), Replicated(), Slab.X)), None, True, 800).b == "none"


def test_a_plans_explain_has_the_overlap_line(fake_nvmath):
    import dmatmul as dm

    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    with dm.Matmul(a, b, backend="nvmath") as mm:
        lines = mm.explain().splitlines()
        d = mm.execute()
    assert "  overlap:    no: one rank, nothing is communicated" in lines, lines
    np.testing.assert_allclose(d, a @ b, rtol=1e-12)
