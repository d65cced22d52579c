"""Whether the cuBLASMp path of a plan overlaps communication with
computation, and if not why: one ``explain()`` line, decided from the
Translation and what the execution layer reports at plan time (:class:`Memory`).

What it rests on (cuBLASMp 0.8+ as nvmath-python 1.0 runs it):

* cuBLASMp overlaps communication with the local GEMMs on its tensor-parallel
  paths only -- AllGather+GEMM, GEMM+ReduceScatter and GEMM+AllReduce (its
  "Tensor Parallelism" guide); its general 2-D block-cyclic (SUMMA-style)
  path is not documented as overlapping.
* Those paths overlap only when cuBLASMp's device workspace is in NCCL
  symmetric memory (allocated with its NCCL allocator, or registered with
  ``cublasMpBufferRegister``); otherwise cuBLASMp quietly runs them without
  overlap ("no_overlap"). nvmath-python allocates that workspace itself with
  cuBLASMp's allocator and registers it on every process grid of the
  product, so with cuBLASMp 0.8+ the condition holds without dmatmul doing
  anything; cuBLASMp before 0.8 used NVSHMEM instead.
* Where an operand lives changes how fast AllGather+GEMM gathers B, not
  whether it overlaps (nvmath: "may perform better with symmetric memory
  operands"). nvmath's helper for symmetric operands
  (``allocate_symmetric_memory``) allocates on the NVSHMEM heap, which
  nvmath's Matmul no longer uses and dmatmul does not start: B stays where
  the caller put it, or in an ordinary staging buffer; the line says which.
* Nothing overlaps where nothing is communicated: one rank, or cuBLASLt on
  every rank.

Whether the overlapped kernels really ran can only be seen on the GPU:
``CUBLASMP_LOG_LEVEL=5`` makes cuBLASMp log the algorithm it runs.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ._types import Translation

__all__ = ["Memory", "overlap", "OVERLAPPED"]

#: the cuBLASMp paths implemented with communication/computation overlap
OVERLAPPED = {"AG+GEMM": "AllGather+GEMM", "GEMM+RS": "GEMM+ReduceScatter", "GEMM+AR": "GEMM+AllReduce"}

Where = Literal["user", "ordinary", "host", "none"]


@dataclasses.dataclass(frozen=True)
class Memory:
    """Where the execution layer put things, as data (reported once at plan time).

    ``workspace``: ``"nccl"`` when cuBLASMp's workspace is in NCCL symmetric
    memory (nvmath allocates it with cuBLASMp's allocator: cuBLASMp 0.8+),
    ``"unknown"`` otherwise, with ``workspace_why``.
    ``b``: where nvmath's operand B lives -- ``"user"`` (the caller's array or
    a view of it, no copy: dmatmul leaves it as it is), ``"ordinary"`` (a
    staging buffer in ordinary device memory, ``b_why`` says why), ``"host"``
    (a host array: nvmath copies it to the GPU itself), ``"none"`` (no
    cuBLASMp operand B: the cuBLASLt engine).

    >>> Memory("nccl", "user").b
    'user'
    """

    workspace: Literal["nccl", "unknown"]
    b: Where
    b_why: str = ""
    workspace_why: str = ""


def _b_words(t: Translation, mem: Memory) -> str:
    who = f"B (the user's {'a' if t.swapped else 'b'})"
    if mem.b == "user":
        return f"{who} is the caller's array, handed over without a copy and left where it is"
    if mem.b == "host":
        return f"{who} is a host array: nvmath copies it to ordinary device memory"
    if mem.b == "ordinary":
        why = f": {mem.b_why}" if mem.b_why else ""
        return f"{who} is staged in ordinary device memory{why}"
    return f"{who}: not handed over"


def overlap(t: Translation, mem: Memory) -> str:
    """The ``overlap:`` line of ``explain()`` (without its label).

    >>> from dmatmul import Replicated, Slab
    >>> from dmatmul.backends.nvmath._translate import Problem, translate
    >>> t = translate(Problem.of(16, 8, 12, 4, False, False, (Replicated(), Slab.Y, Slab.X), ("C", "C", None)))
    >>> overlap(t, Memory("nccl", "user"))[:61]
    'yes: AllGather+GEMM is pipelined by cuBLASMp (its workspace i'
    >>> t1 = translate(Problem.of(16, 8, 12, 1, False, False, (Replicated(), Slab.Y, Slab.X), ("C", "C", None)))
    >>> overlap(t1, Memory("nccl", "user"))
    'no: one rank, nothing is communicated'
    """
    if t.engine == "cublaslt":
        return "no: cuBLASLt on each rank, nothing is communicated"
    if t.problem.nranks == 1 or t.path == "local GEMM":
        return "no: one rank, nothing is communicated"
    if t.path not in OVERLAPPED:
        what = "SUMMA" if t.path == "SUMMA" else "general"
        return (f"not documented: cuBLASMp documents communication/computation overlap for AllGather+GEMM, "
                f"GEMM+ReduceScatter and GEMM+AllReduce only, and this is its {what} path")
    name = OVERLAPPED[t.path]
    if mem.workspace != "nccl":
        why = f" ({mem.workspace_why})" if mem.workspace_why else ""
        return (f"not known: cuBLASMp runs {name} without overlap unless its workspace is in NCCL symmetric "
                f"memory, and where it is here is not known{why}")
    line = (f"yes: {name} is pipelined by cuBLASMp (its workspace is in NCCL symmetric memory: nvmath "
            f"allocates it with cuBLASMp's allocator)")
    if t.path == "AG+GEMM":
        line += f"; {_b_words(t, mem)}"
    return line
