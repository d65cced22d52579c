"""A CPU stand-in for the parts of nvmath-python 1.0 (and CuPy, nccl4py) dmatmul uses.

It lets the nvmath backend's execution layer run without a GPU: the same
calls (``nvmath.distributed.initialize``, ``ProcessGrid``/``BlockCyclic``,
``linalg.advanced.Matmul(...).plan/execute/reset_operands/free``, the
qualifiers dtype, ``MatmulOptions(inplace=...)``, ``MatmulEpilog``) with the
checks nvmath makes before cuBLASMp runs (Fortran order, local shapes that fit
the block-cyclic distribution, one block size per dimension across operands,
TN for the AllReduce epilog, a local bias per result row, C never flagged
transposed), computed with numpy, the ranks talking over mpi4py.

It is a test double, not a model of performance: it proves that dmatmul calls
nvmath the way nvmath's documentation and code say, and that what dmatmul
does around the call (views, padding, stripping, epilogue, allgather) gives
the right numbers. ``install()`` puts the fake modules in ``sys.modules``;
``uninstall()`` removes them. ``CALLS`` records what was called, for asserts.

Where the real libraries are known to go wrong, the fake goes wrong the same
way (so that dmatmul's CPU tests see what only a GPU showed), each quirk with
its source:

* cuBLASMp refuses a bias epilog (BIAS, RELU_BIAS, GELU_BIAS) on complex
  types with NOT_SUPPORTED, at execute, after a plan() that accepted it
  (issue 13's H100 runs): :func:`_refuse_at_execute`.
* cuBLASLt's fused GELU is not float64-accurate (issue 13's H100 runs): the
  fake refuses it at execute rather than be wrong.
* cuBLASMp's quick return: with ``alpha == 0`` and ``beta == 1`` on a result
  of one row or one column, it returns without writing D; nvmath's D is a
  buffer of its own (``inplace=False``), so the result is whatever that
  buffer held (issue 34: nvmath-python 1.0, cuBLASMp 0.9.1, one H200; a
  35x1 result came back as garbage, while alpha = 0 with beta = 0.5, alpha
  = 1e-30 with beta = 1, and a 35x4 result were right). The fake returns a
  fresh buffer of NaN there: :func:`_quick_return`.
* nvmath refuses an empty local block ("extents must be strictly
  positive"), on every rank (nvmath's allreduced problem check).
* nvmath runs on one communicator: the one ``initialize`` was given (once
  per process; a second call raises). Its ``ProcessGrid`` must have as many
  elements as that communicator has ranks, and ``Matmul`` takes no
  communicator (nvmath 1.0: ``Matmul(a, b, c, *, distributions, alpha, beta,
  qualifiers, quantization_scales, options, stream)``; cuBLASMp grids are made
  on ``get_context().nccl_comm``). The fake is the same, which is why dmatmul
  refuses ``algorithm="summa25d"`` (a SUMMA per layer's sub-communicator) on
  nvmath: tests/mpi/layered.py.
"""

from __future__ import annotations

import atexit
import dataclasses
import enum
import importlib.machinery
import math
import os
import sys
import types
from typing import Any

import numpy as np

CALLS: list[tuple[str, dict[str, Any]]] = []
#: the fake GPU's compute capability (an H200's): nvmath's MXFP8 (``block_scaling=True``) needs 10.0
COMPUTE_CAPABILITY: tuple[int, int] = (9, 0)
#: what the fake GPU's cupy.cuda.runtime.memGetInfo() reports: [free, total] bytes (an 80 GB GPU, nearly empty)
GPU_MEMORY: list[int] = [79 * 10**9, 80 * 10**9]
#: ``True``: ``execute()`` does no work and returns a result buffer allocated once
#: (benchmarks/nvmath_overhead.py times what dmatmul does around the call)
NOOP = False
_NAMES = (
    "nvmath", "nvmath.bindings", "nvmath.bindings.cublasMp", "nvmath.distributed", "nvmath.distributed.distribution",
    "nvmath.distributed.linalg", "nvmath.distributed.linalg.advanced", "nvmath.linalg", "nvmath.linalg.advanced",
    "cupy", "cupy.cuda", "cupy.cuda.runtime", "nccl", "nccl.core",
)
_saved: dict[str, Any] = {}


def _numroc(n: int, nb: int, iproc: int, isrcproc: int, nprocs: int) -> int:
    mydist = (nprocs + iproc - isrcproc) % nprocs
    nblocks, rest = divmod(n, nb)
    count = (nblocks // nprocs) * nb
    extra = nblocks % nprocs
    if mydist < extra:
        count += nb
    elif mydist == extra:
        count += rest
    return count


def _ids(n: int, nb: int, iproc: int, isrcproc: int, nprocs: int) -> np.ndarray:
    mydist = (nprocs + iproc - isrcproc) % nprocs
    starts = np.arange(mydist * nb, n, nprocs * nb)
    ids = (starts[:, None] + np.arange(nb)[None, :]).ravel()
    return ids[ids < n]


class GridLayout(enum.IntEnum):
    ROW_MAJOR = 0
    COL_MAJOR = 1


class MatmulEpilogue(enum.IntEnum):
    DEFAULT = 0
    ALLREDUCE = 1
    RELU = 2
    BIAS = 4
    RELU_BIAS = 6
    GELU = 32
    GELU_BIAS = 36


@dataclasses.dataclass(frozen=True)
class DistributedContext:
    device_id: int
    communicator: Any
    nvshmem_available: bool
    nccl_comm: int | None


_ctx: DistributedContext | None = None


class MPIProcessGroup:
    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.nranks = comm.Get_size()
        self.rank = comm.Get_rank()


def initialize(device_id: int, process_group: Any, backends: Any) -> None:
    """As nvmath 1.0: ``backends`` is required; Matmul needs "nccl" among them."""
    global _ctx
    if _ctx is not None:
        raise RuntimeError("nvmath.distributed has already been initialized")
    if not isinstance(device_id, int):
        raise TypeError("device_id must be an int")
    backends = list(backends)
    for backend in backends:
        if backend not in ("nvshmem", "nccl"):
            raise ValueError(f"backend must be one of ('nvshmem', 'nccl'), got {backend}")
    if not backends:
        raise ValueError("Need to specify at least one of ('nvshmem', 'nccl') communication backends")
    comm = process_group.comm if isinstance(process_group, MPIProcessGroup) else process_group
    CALLS.append(("initialize", {"device_id": device_id, "backends": backends, "nranks": comm.Get_size()}))
    global _finalize_at_exit
    if not _finalize_at_exit:  # as nvmath: its finalize runs at exit, in atexit's last-registered-first order
        atexit.register(finalize)
        _finalize_at_exit = True
    _ctx = DistributedContext(device_id, comm, "nvshmem" in backends, 1 if "nccl" in backends else None)


_finalize_at_exit = False
_serial = 0


def get_context() -> DistributedContext | None:
    return _ctx


def finalize() -> None:
    global _ctx
    if _ctx is not None:
        CALLS.append(("finalize", {}))
    _ctx = None


def _comm() -> Any:
    if _ctx is None:
        raise RuntimeError("nvmath.distributed has not been initialized")
    return _ctx.communicator


class ProcessGrid:
    Layout = GridLayout

    def __init__(self, *, shape: Any = None, layout: Any = None, process_array: Any = None) -> None:
        nranks = _comm().Get_size()
        if process_array is not None:
            raise NotImplementedError
        self._shape = tuple(shape)
        if layout is None:
            if nranks not in self._shape:
                raise ValueError("layout must be provided when partitioning on multiple dimensions")
            layout = GridLayout.ROW_MAJOR
        if not isinstance(layout, GridLayout):
            raise TypeError(f"layout must be of type ProcessGrid.Layout, got {layout}")
        if math.prod(self._shape) != nranks:
            raise ValueError(f"Number of grid elements ({math.prod(self._shape)}) must equal the number of processes ({nranks})")
        self._layout = layout

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def layout(self) -> GridLayout:
        return self._layout

    def coords(self, rank: int) -> tuple[int, int]:
        nprow, npcol = self._shape
        if self._layout == GridLayout.COL_MAJOR:
            return rank % nprow, rank // nprow
        return rank // npcol, rank % npcol


class BlockCyclic:
    def __init__(self, process_grid: ProcessGrid, block_sizes: Any, *, first_process: Any = None) -> None:
        if not all(isinstance(x, int) for x in block_sizes):
            raise ValueError(f"Must provide a sequence of integer block sizes, got {block_sizes}")
        self.process_grid = process_grid
        self.block_sizes = tuple(block_sizes)
        self.first_process = (0, 0) if first_process is None else tuple(first_process)

    def indices(self, rank: int, global_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        pr, pc = self.process_grid.coords(rank)
        nprow, npcol = self.process_grid.shape
        return (_ids(global_shape[0], self.block_sizes[0], pr, self.first_process[0], nprow),
                _ids(global_shape[1], self.block_sizes[1], pc, self.first_process[1], npcol))

    def shape(self, rank: int, global_shape: tuple[int, int]) -> tuple[int, int]:
        pr, pc = self.process_grid.coords(rank)
        nprow, npcol = self.process_grid.shape
        return (_numroc(global_shape[0], self.block_sizes[0], pr, self.first_process[0], nprow),
                _numroc(global_shape[1], self.block_sizes[1], pc, self.first_process[1], npcol))

    def global_shape(self, local_shapes: list[tuple[int, int]]) -> tuple[int, int]:
        """As nvmath infers it: rows down grid column 0, columns along grid row 0."""
        rows = sum(s[0] for r, s in enumerate(local_shapes) if self.process_grid.coords(r)[1] == 0)
        cols = sum(s[1] for r, s in enumerate(local_shapes) if self.process_grid.coords(r)[0] == 0)
        return rows, cols


matrix_qualifiers_dtype = np.dtype([("structure", object), ("is_transpose", "<i1"), ("is_conjugate", "<i1")])


@dataclasses.dataclass
class MatmulOptions:
    inplace: bool = False
    compute_type: int | None = None
    result_type: Any = None
    block_scaling: bool = False
    logger: Any = None
    blocking: Any = "auto"


@dataclasses.dataclass
class HostMatmulOptions:
    inplace: bool = False
    result_type: Any = None
    device_id: int = 0
    blocking: Any = "auto"


def _is_f(x: np.ndarray) -> bool:
    """nvmath's Fortran test on element strides (not numpy's flags, which
    ignore a length-1 dimension's stride): ascending, the smallest 1, each the
    one before times its extent; then cuBLASMp's leading dimension
    (``strides[1]``) must cover the local rows. So a C-order ``(1, n)`` row
    fails the first test and a C-order ``(m, 1)`` column the second."""
    st = [s // x.itemsize for s in x.strides]
    if st != sorted(st):
        return False
    pairs = sorted(zip(st, x.shape))
    if pairs[0][0] != 1 or any(pairs[i][0] != pairs[i - 1][0] * pairs[i - 1][1] for i in range(1, len(pairs))):
        return False
    return st[1] >= max(1, x.shape[0])


def _check_numpy(x: Any, name: str) -> None:
    if not isinstance(x, np.ndarray) or x.ndim != 2:
        raise TypeError(f"operand {name} must be a 2-D numpy array, got {type(x).__name__}")


def _gelu(z: np.ndarray) -> np.ndarray:
    return 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))


class cuBLASMpError(RuntimeError):  # noqa: N801 - nvmath's name
    pass


_FP8 = ("float8_e4m3fn", "float8_e5m2")


def _np_dtype(x: Any) -> np.dtype:
    if isinstance(x, str) and x in ("bfloat16", *_FP8):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, x))
    return np.dtype(x)


def _fp8_rules(a: np.ndarray, b: np.ndarray, c: Any, scales: Any, options: Any, transposes: tuple[bool, bool],
               mnk: tuple[int, int, int] | None) -> tuple[float, Any]:
    """nvmath 1.0's narrow-precision rules, as its distributed Matmul applies them: scales only for FP8
    operands, per-tensor scalars; A and B FP8 of the combinations cuBLASLt has (e4m3 x e4m3, e4m3 x e5m2,
    e5m2 x e4m3: not e5m2 x e5m2); the "TN" input layout only (A transposed, B not: column-major operands);
    M, N and K multiples of 16; D of ``result_type``, else of C's dtype, else of A's (an FP8 D, which
    dmatmul never asks for). Returns (sa * sb, D's dtype)."""
    names = (a.dtype.name, b.dtype.name)
    fp8 = [n in _FP8 for n in names]
    result = getattr(options, "result_type", None)
    if getattr(options, "block_scaling", False):
        _mxfp8_rules(a, b, scales, fp8, transposes, mnk)
        return 1.0, result if result is not None else (c.dtype if c is not None else "float32")
    if not any(fp8):
        if scales is not None:
            raise ValueError("Scales can only be set for narrow-precision (FP8 and lower) matrices.")
        return 1.0, result if result is not None else (c.dtype if c is not None else a.dtype)
    if not all(fp8) or names == ("float8_e5m2", "float8_e5m2"):
        raise ValueError(f"Unsupported combination of dtypes for operands A {names[0]} and B {names[1]}.")
    layout = ("T" if transposes[0] else "N") + ("T" if transposes[1] else "N")
    if layout != "TN":
        raise ValueError(f"FP8 matrix multiplications support only TN input layout. Got {layout}")
    if mnk is not None and any(x % 16 for x in mnk):
        m, n, k = mnk
        raise ValueError(f"M={m} N={n} K={k} must be divisible by 16 for FP8 operations")
    sa = float((scales or {}).get("a", 1.0))
    sb = float((scales or {}).get("b", 1.0))
    if result is None:
        result = c.dtype if c is not None else a.dtype
    return sa * sb, result


def _mxfp8_rules(a: np.ndarray, b: np.ndarray, scales: Any, fp8: list[bool], transposes: tuple[bool, bool],
                 mnk: tuple[int, int, int] | None) -> None:
    """nvmath 1.0's MXFP8 rules (``block_scaling=True``, distributed Matmul): compute capability 10.0 or
    higher (a RuntimeError, at construction); FP8 operands only; both scales uint8 1-D tensors of the local
    operand's size / 32 (cuBLAS's tiled VEC32_UE8M0 layout), never scalars; the TN layout (as all FP8); the
    local GEMM's M, N and K multiples of 128 (nvmath checks its local GEMM on the 1-D paths; the fake checks
    every local extent of A and B, which on those paths is the same rule)."""
    if COMPUTE_CAPABILITY < (10, 0):
        raise RuntimeError("MXFP8 requires a device with compute capability 10.0 or higher (Blackwell or newer "
                           f"architecture). The compute capability of process 0's device is {COMPUTE_CAPABILITY}")
    if not all(fp8):
        raise ValueError("block_scaling == True is not supported for non-FP8 types.")
    for name, x in (("a", a), ("b", b)):
        s = (scales or {}).get(name)
        if s is None or not hasattr(s, "shape"):
            raise ValueError(f"A scalar tensor-wide scale factor is not allowed for {name.upper()} when "
                             "block_scaling=True.")
        if s.dtype != np.uint8 or tuple(s.shape) != (x.size // 32,):
            raise ValueError(f"Scales for {name.upper()} should have shape {(x.size // 32,)}. Got {s.shape}.")
    layout = ("T" if transposes[0] else "N") + ("T" if transposes[1] else "N")
    if layout != "TN":
        raise ValueError(f"FP8 matrix multiplications support only TN input layout. Got {layout}")
    if any(d % 128 for d in (*a.shape, *b.shape)):
        raise ValueError("Matrix sizes for local GEMM must be divisible by 128 when block_scaling=True.")


def _tiled_offset(r: np.ndarray, c: np.ndarray, blocks: int) -> np.ndarray:
    """Where cuBLAS reads the scale of row ``r`` (the operand's M or N) and K block ``c`` in the 1-D tiled
    layout of an operand of ``blocks`` K blocks ("1D Block Scaling Factors Layout",
    https://docs.nvidia.com/cuda/cublas/index.html#d-block-scaling-factors-layout): 128x4 tiles of 512
    bytes, a band of 128 rows tile after tile along K, inside a tile row r at 16 * (r % 32) + 4 * (r % 128
    // 32), block c at c % 4. Written per element, independently of dmatmul's conversion."""
    tile = (r // 128) * (blocks // 4) + c // 4
    return tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def _block_dequantized(x: np.ndarray, tiled: np.ndarray, k_axis: int) -> np.ndarray:
    """float64 ``x`` (a local block of nvmath's A or B, K along ``k_axis``) with each element times the
    scale cuBLAS reads for it from the tiled 1-D ``tiled``."""
    k = np.arange(x.shape[k_axis])[:, None] if k_axis == 0 else np.arange(x.shape[1])[None, :]
    r = np.arange(x.shape[1])[None, :] if k_axis == 0 else np.arange(x.shape[0])[:, None]
    e = tiled[_tiled_offset(r, k // 32, x.shape[k_axis] // 32)].astype(np.float64)
    scale = np.where(e == 255, np.nan, np.exp2(e - 127))
    return x.astype(np.float64) * scale


def _refuse_at_execute(epilog: Any, dtype: np.dtype, lib: str) -> None:
    """What the real libraries do wrong only at execute (issue 13's H100 runs):
    cuBLASMp raises NOT_SUPPORTED for a bias epilog on complex types; cuBLASLt's
    fused GELU is not float64-accurate (the fake refuses it rather than be wrong)."""
    if epilog is None:
        return
    if lib == "cublasmp" and dtype.kind == "c" and epilog.name.endswith("BIAS"):
        raise cuBLASMpError(f"NOT_SUPPORTED (CUBLASMP_STATUS_NOT_SUPPORTED): epilog {epilog.name} on {dtype}")
    if dtype == np.float64 and epilog.name.startswith("GELU"):
        raise RuntimeError(f"fake nvmath: cuBLASLt's fused {epilog.name} is not float64-accurate; "
                           "dmatmul must not send it")


def _quick_return(alpha: Any, beta: Any, c: Any, d_global: tuple[int, int]) -> bool:
    """Whether cuBLASMp returns without writing D (see the module's quirks):
    alpha == 0 and beta == 1 with C, on a result of one row or one column."""
    return c is not None and alpha == 0 and beta == 1 and 1 in d_global


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)


class Matmul:
    """``nvmath.distributed.linalg.advanced.Matmul`` on numpy, ranks over MPI."""

    def __init__(self, a: Any, b: Any, c: Any = None, *, distributions: Any, alpha: Any = None, beta: Any = None,
                 qualifiers: Any = None, quantization_scales: Any = None, options: Any = None,
                 stream: Any = None) -> None:
        comm = _comm()
        if _ctx is None or _ctx.nccl_comm is None:
            raise RuntimeError("nvmath.distributed wasn't initialized with NCCL backend")
        self.comm, self.rank, self.nranks = comm, comm.Get_rank(), comm.Get_size()
        for x, n in ((a, "A"), (b, "B"), (c, "C")):
            if x is not None:
                _check_numpy(x, n)
        # nvmath checks every rank's local extents in its allreduced problem check: every rank raises
        for shapes in comm.allgather([(n, list(x.shape)) for x, n in ((a, "A"), (b, "B"), (c, "C")) if x is not None]):
            for n, shape in shapes:
                if 0 in shape:
                    raise ValueError(f"The specified extents {shape} for operand {n} are not valid. "
                                     "The extents must be strictly positive.")
        ops = [a, b] + ([c] if c is not None else [])
        if c is not None and beta is None:
            raise ValueError("A value for beta must be provided if operand C is provided.")
        if len(distributions) != 3 or not all(isinstance(d, BlockCyclic) for d in distributions):
            raise ValueError("Must provide distributions for A, B and C/D")
        self.qualifiers = np.zeros((3,), dtype=matrix_qualifiers_dtype) if qualifiers is None else qualifiers
        if self.qualifiers.dtype != matrix_qualifiers_dtype:
            raise ValueError("The qualifiers must be a numpy array of matrix_qualifiers_dtype")
        if self.qualifiers[2]["is_transpose"]:
            raise ValueError("The transpose flag is currently not supported for operand C.")
        flags = self.comm.allgather([_is_f(x) for x in ops])
        for i, n in enumerate("ABC"[: len(ops)]):
            if not all(f[i] for f in flags):
                raise ValueError(f"Operand {n} doesn't have column-major (Fortran) memory layout")
        self.options = options if options is not None else MatmulOptions()
        self.distributions = list(distributions)
        shapes = self.comm.allgather([tuple(x.shape) for x in ops])
        self.global_shapes = [self.distributions[i].global_shape([s[i] for s in shapes]) for i in range(len(ops))]
        for i in range(len(ops)):
            want = self.distributions[i].shape(self.rank, self.global_shapes[i])
            if tuple(ops[i].shape) != want:
                raise ValueError(f"local shape {ops[i].shape} of operand {'ABC'[i]} does not fit its distribution "
                                 f"(expected {want} for global {self.global_shapes[i]})")
        self.ta, self.tb = bool(self.qualifiers[0]["is_transpose"]), bool(self.qualifiers[1]["is_transpose"])
        ga, gb = self.global_shapes[0], self.global_shapes[1]
        m, k = (ga[1], ga[0]) if self.ta else ga
        k2, n = (gb[1], gb[0]) if self.tb else gb
        if k != k2:
            raise ValueError(f"The 'K' extent must match: {k} != {k2}")
        self.m, self.n, self.k = m, n, k
        self.scaled, self.d_dtype = _fp8_rules(a, b, c, quantization_scales, self.options, (self.ta, self.tb),
                                               (m, n, k))
        self.a, self.b, self.c = a, b, c
        self.block_scaling = bool(getattr(self.options, "block_scaling", False))
        self.scales = quantization_scales if self.block_scaling else None
        self.alpha, self.beta = (1.0 if alpha is None else alpha), (0.0 if beta is None or c is None else beta)
        self.strides = [x.strides for x in ops]
        global _serial
        _serial += 1
        self.serial = _serial  # the ranks create their Matmuls in one order: the n-th is the same on every rank
        self.epilog: MatmulEpilogue | None = None
        self.bias: Any = None
        self.planned = False
        self.freed = False
        CALLS.append(("Matmul", {"qualifiers": (self.ta, self.tb), "inplace": getattr(self.options, "inplace", None),
                                 "has_c": c is not None, "alpha": alpha, "beta": beta,
                                 "grids": [(d.process_grid.shape, d.process_grid.layout.name, d.block_sizes,
                                            d.first_process) for d in self.distributions],
                                 "global_shapes": list(self.global_shapes),
                                 "dtypes": tuple(x.dtype.name for x in ops), "block_scaling": self.block_scaling,
                                 "scales": None if self.scales is None else
                                 {k: np.array(v, copy=True) for k, v in self.scales.items()},
                                 "local_shapes": [tuple(x.shape) for x in ops]}))

    def plan(self, *, preferences: Any = None, epilog: Any = None, epilog_inputs: Any = None, stream: Any = None) -> None:
        if self.freed:
            raise RuntimeError("The Matmul object cannot be used after resources are free'd")
        dA, dB, dD = self.distributions
        m_a = dA.block_sizes[1] if self.ta else dA.block_sizes[0]
        n_b = dB.block_sizes[0] if self.tb else dB.block_sizes[1]
        k_a = dA.block_sizes[0] if self.ta else dA.block_sizes[1]
        k_b = dB.block_sizes[1] if self.tb else dB.block_sizes[0]
        if m_a != dD.block_sizes[0]:
            raise ValueError("Block size of m dimension must be the same for A and C/D")
        if n_b != dD.block_sizes[1]:
            raise ValueError("Block size of n dimension must be the same for B and C/D")
        if k_a != k_b:
            raise ValueError("Block size of k dimension must be the same for A and B")
        self.d_global = (self.m, self.n)
        if epilog == MatmulEpilogue.ALLREDUCE:
            if (self.ta, self.tb) != (True, False):
                raise ValueError("GEMM+AllReduce supports only TN")
            self.d_global = (dD.process_grid.shape[0] * self.m, dD.process_grid.shape[1] * self.n)
        if self.c is not None and tuple(self.global_shapes[2]) != self.d_global:
            raise ValueError(f"global shape of C {self.global_shapes[2]} != {self.d_global}")
        needs_bias = epilog is not None and epilog.name.endswith("BIAS")
        if needs_bias:
            bias = (epilog_inputs or {}).get("bias")
            if bias is None:
                raise ValueError("The epilog BIAS requires the epilog input 'bias'")
            rows = dD.shape(self.rank, self.d_global)[0]
            if bias.shape not in ((rows,), (rows, 1)):
                raise ValueError(f"The M dimension of the bias vector ({bias.shape[0]}) must match the local M dimension")
            self.bias = bias
        if epilog is not None:  # as nvmath: plan(epilog=None) leaves an epilog an earlier plan set in the descriptor
            self.epilog = epilog
        self.planned = True
        CALLS.append(("plan", {"epilog": None if epilog is None else epilog.name}))

    def reset_operands(self, *, a: Any = None, b: Any = None, c: Any = None, alpha: Any = None, beta: Any = None,
                       quantization_scales: Any = None, epilog_inputs: Any = None, stream: Any = None) -> None:
        if quantization_scales is not None:  # (nvmath 0.9+: new scales of the same kind and shape)
            if not self.block_scaling:
                raise ValueError("fake nvmath: block scales reset on a Matmul without block_scaling")
            for name in ("a", "b"):
                new = quantization_scales.get(name)
                if new is not None and (new.shape != self.scales[name].shape or new.dtype != np.uint8):
                    raise ValueError(f"reset scales of {name.upper()}: shape/dtype differ from the original")
            self.scales = {**self.scales, **{k: v for k, v in quantization_scales.items() if v is not None}}
        for i, (x, name) in enumerate(((a, "a"), (b, "b"), (c, "c"))):
            if x is None:
                continue
            old = (self.a, self.b, self.c)[i]
            if old is None:
                raise ValueError("operand C was not given at creation")
            if x.shape != old.shape or x.strides != old.strides or x.dtype != old.dtype:
                raise ValueError(f"reset operand {name}: shape/strides/dtype differ from the original")
            setattr(self, name, x)
        if epilog_inputs is not None:
            self.bias = epilog_inputs["bias"]
        CALLS.append(("reset_operands", {"a": a is not None, "b": b is not None, "c": c is not None}))

    def execute(self, *, algo: Any = None, release_workspace: bool = False, stream: Any = None) -> np.ndarray:
        if self.freed:
            raise RuntimeError("The Matmul object cannot be used after resources are free'd")
        if not self.planned:
            raise RuntimeError("Execution cannot be performed before plan() has been called.")
        dA, dB, dD = self.distributions
        dtype = self.a.dtype if not self.block_scaling else np.dtype(np.float32)
        _refuse_at_execute(self.epilog, dtype, "cublasmp")
        local_a, local_b = self.a, self.b
        if self.block_scaling:  # each local block times its scales, read as cuBLAS reads the tiled layout
            local_a = _block_dequantized(self.a, np.asarray(self.scales["a"]), 0 if self.ta else 1)
            local_b = _block_dequantized(self.b, np.asarray(self.scales["b"]), 1 if self.tb else 0)
        if NOOP:
            if getattr(self, "_noop", None) is None:
                self._noop = np.zeros(dD.shape(self.rank, self.d_global), dtype=dtype, order="F")
            return self._noop
        CALLS.append(("execute", {"d_global": self.d_global}))
        if _quick_return(self.alpha, self.beta, self.c, self.d_global):
            CALLS.append(("quick return", {"d_global": self.d_global}))
            if getattr(self.options, "inplace", False):
                return self.c  # D is C: left as it was, which is beta * C
            return np.full(dD.shape(self.rank, self.d_global), np.nan, dtype=dtype, order="F")  # D never written
        if self.epilog == MatmulEpilogue.ALLREDUCE:  # literally: the sum over ranks of the local products
            oa = local_a.T if self.ta else local_a
            ob = local_b.T if self.tb else local_b
            d = sum(self.comm.allgather(self.alpha * self.scaled * (_wide(oa) @ _wide(ob))))
            local = d
        else:
            everything = self.comm.allgather((local_a, local_b, self.c, self.bias))
            ga = np.zeros(self.global_shapes[0], dtype=np.complex128 if dtype.kind == "c" else np.float64)
            gb = np.zeros(self.global_shapes[1], dtype=ga.dtype)
            for r, (a, b, _, _) in enumerate(everything):
                ga[np.ix_(*dA.indices(r, self.global_shapes[0]))] = a
                gb[np.ix_(*dB.indices(r, self.global_shapes[1]))] = b
            with np.errstate(invalid="ignore"):  # inf/NaN operands: NaN where cuBLASMp makes one
                d = self.alpha * self.scaled * ((ga.T if self.ta else ga) @ (gb.T if self.tb else gb))
            if self.c is not None:
                gc = np.zeros(self.global_shapes[2], dtype=ga.dtype)
                for r, (_, _, c, _) in enumerate(everything):
                    gc[np.ix_(*dD.indices(r, self.global_shapes[2]))] = c
                d = d + self.beta * gc
            if self.epilog is not None and self.epilog.name.endswith("BIAS"):
                bias = np.zeros(self.m, dtype=d.dtype)
                for r, (_, _, _, bb) in enumerate(everything):
                    bias[dD.indices(r, self.d_global)[0]] = np.asarray(bb).reshape(-1)
                d = d + bias[:, None]
            if self.epilog in (MatmulEpilogue.RELU, MatmulEpilogue.RELU_BIAS):
                d = np.maximum(d, 0)
            elif self.epilog in (MatmulEpilogue.GELU, MatmulEpilogue.GELU_BIAS):
                d = _gelu(d)
            local = d[np.ix_(*dD.indices(self.rank, self.d_global))]
        out = np.asfortranarray(local.astype(_np_dtype(self.d_dtype)))
        if self.c is not None and getattr(self.options, "inplace", False):
            self.c[...] = out  # nvmath's in-place mode: the result *is* c
            return self.c
        return out

    def free(self) -> None:
        if _ctx is None and not self.freed:  # cuBLASMp frees its workspace on grids finalize destroyed
            sys.stderr.write("fake nvmath: Matmul.free() after nvmath.distributed.finalize() "
                             "(a use after free in cuBLASMp)\n")
            raise RuntimeError("Matmul.free() after nvmath.distributed.finalize()")
        if not self.freed:  # a collective call, as nvmath documents it: every rank frees the same Matmul
            serials = self.comm.allgather(self.serial)
            if len(set(serials)) > 1:
                raise RuntimeError(f"fake nvmath: Matmul.free() is collective; the ranks freed Matmuls {serials}")
        self.freed = True
        CALLS.append(("free", {}))


class HostMatmul:
    """``nvmath.linalg.advanced.Matmul`` (cuBLASLt, one GPU) on numpy."""

    def __init__(self, a: Any, b: Any, c: Any = None, *, alpha: Any = None, beta: Any = None, qualifiers: Any = None,
                 quantization_scales: Any = None, options: Any = None, stream: Any = None) -> None:
        for x, n in ((a, "A"), (b, "B"), (c, "C")):
            if x is not None:
                _check_numpy(x, n)
                if 0 in x.shape:
                    raise ValueError(f"operand {n} is empty {x.shape}: cuBLASLt needs positive extents")
        if a.shape[1] != b.shape[0]:
            raise ValueError("K extents differ")
        self.a, self.b, self.c = a, b, c
        self.alpha, self.beta = (1.0 if alpha is None else alpha), (0.0 if beta is None else beta)
        self.options = options if options is not None else HostMatmulOptions()
        # (nvmath.linalg lays row-major operands out for cuBLASLt's "TN" itself)
        self.scaled, self.d_dtype = _fp8_rules(a, b, c, quantization_scales, self.options, (True, False), None)
        self.epilog: Any = None
        self.bias: Any = None
        self.freed = False
        CALLS.append(("HostMatmul", {"inplace": getattr(self.options, "inplace", None), "has_c": c is not None}))

    def plan(self, *, preferences: Any = None, epilog: Any = None, epilog_inputs: Any = None, algorithms: Any = None,
             stream: Any = None) -> None:
        if epilog is not None and epilog.name.endswith("BIAS"):
            bias = (epilog_inputs or {}).get("bias")
            if bias is None or bias.shape[0] != self.a.shape[0]:
                raise ValueError("bias must have one value per row of the result")
            self.bias = bias
        self.epilog = epilog
        CALLS.append(("host plan", {"epilog": None if epilog is None else epilog.name}))

    def reset_operands(self, *, a: Any = None, b: Any = None, c: Any = None, alpha: Any = None, beta: Any = None,
                       epilog_inputs: Any = None, stream: Any = None) -> None:
        self.a = self.a if a is None else a
        self.b = self.b if b is None else b
        self.c = self.c if c is None else c
        if epilog_inputs is not None:
            self.bias = epilog_inputs["bias"]

    def execute(self, **kwargs: Any) -> np.ndarray:
        _refuse_at_execute(self.epilog, self.a.dtype, "cublaslt")
        if NOOP:
            if getattr(self, "_noop", None) is None:
                self._noop = np.zeros((self.a.shape[0], self.b.shape[1]), dtype=self.a.dtype)
            return self._noop
        CALLS.append(("host execute", {}))
        d = self.alpha * self.scaled * (_wide(self.a) @ _wide(self.b))
        if self.c is not None:
            d = d + self.beta * _wide(self.c)
        if self.epilog is not None and self.epilog.name.endswith("BIAS"):
            d = d + _wide(np.asarray(self.bias)).reshape(-1, 1)
        if self.epilog in (MatmulEpilogue.RELU, MatmulEpilogue.RELU_BIAS):
            d = np.maximum(d, 0)
        elif self.epilog in (MatmulEpilogue.GELU, MatmulEpilogue.GELU_BIAS):
            d = _gelu(d)
        return d.astype(_np_dtype(self.d_dtype))

    def free(self) -> None:
        self.freed = True


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
    mod.__path__ = []  # a package, so submodule imports resolve through sys.modules
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


class _FakeCupyArray:  # never instantiated: operands stay numpy in the fake
    pass


class _Device:
    def __init__(self, device_id: int) -> None:
        self.id = device_id

    @property
    def compute_capability(self) -> str:
        """As CuPy: "90" for 9.0 (:data:`COMPUTE_CAPABILITY`, which a test may set to (10, 0))."""
        return f"{COMPUTE_CAPABILITY[0]}{COMPUTE_CAPABILITY[1]}"

    def use(self) -> None:
        CALLS.append(("cupy.Device.use", {"device_id": self.id}))


def install(*, ngpus: int | None = None, cublasmp_version: int = 800) -> None:
    """Put the fake nvmath and cupy modules in ``sys.modules``: a node of
    ``ngpus`` GPUs (default: one per process the launcher announced, as many
    as dmatmul's one-GPU-per-rank check wants)."""
    global _ctx
    if ngpus is None:
        ngpus = max([1, *(int(os.environ[v]) for v in ("PMI_SIZE", "PMIX_SIZE", "OMPI_COMM_WORLD_SIZE")
                          if os.environ.get(v, "").isdigit())])
    _ctx = None
    CALLS.clear()
    GPU_MEMORY[:] = [79 * 10**9, 80 * 10**9]
    for name in _NAMES:
        if name in sys.modules:
            _saved[name] = sys.modules[name]
    cublasmp = _module("nvmath.bindings.cublasMp", get_version=lambda: cublasmp_version, GridLayout=GridLayout,
                       MatmulEpilogue=MatmulEpilogue)
    dist_mod = _module("nvmath.distributed.distribution", ProcessGrid=ProcessGrid, BlockCyclic=BlockCyclic)
    adv = _module("nvmath.distributed.linalg.advanced", Matmul=Matmul, MatmulOptions=MatmulOptions,
                  MatmulEpilog=MatmulEpilogue, matrix_qualifiers_dtype=matrix_qualifiers_dtype)
    host_adv = _module("nvmath.linalg.advanced", Matmul=HostMatmul, MatmulOptions=HostMatmulOptions,
                       MatmulEpilog=MatmulEpilogue)
    distributed = _module("nvmath.distributed", initialize=initialize, get_context=get_context, finalize=finalize,
                          MPIProcessGroup=MPIProcessGroup, distribution=dist_mod,
                          linalg=_module("nvmath.distributed.linalg", advanced=adv))
    nvmath = _module("nvmath", __version__="1.0.0+fake", distributed=distributed,
                     bindings=_module("nvmath.bindings", cublasMp=cublasmp),
                     linalg=_module("nvmath.linalg", advanced=host_adv))
    runtime = _module("cupy.cuda.runtime", getDeviceCount=lambda: ngpus, getDevice=lambda: 0,
                      memGetInfo=lambda: tuple(GPU_MEMORY))
    cuda = _module("cupy.cuda", runtime=runtime, Device=_Device)
    cupy = _module("cupy", ndarray=_FakeCupyArray, cuda=cuda, asnumpy=np.asarray)
    nccl_core = _module("nccl.core")  # nccl4py: nvmath.distributed starts NCCL through it
    nccl = _module("nccl", core=nccl_core)
    mods = {
        "nccl": nccl, "nccl.core": nccl_core,
        "nvmath": nvmath, "nvmath.bindings": nvmath.bindings, "nvmath.bindings.cublasMp": cublasmp,
        "nvmath.distributed": distributed, "nvmath.distributed.distribution": dist_mod,
        "nvmath.distributed.linalg": distributed.linalg, "nvmath.distributed.linalg.advanced": adv,
        "nvmath.linalg": nvmath.linalg, "nvmath.linalg.advanced": host_adv,
        "cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.runtime": runtime,
    }
    sys.modules.update(mods)


def uninstall() -> None:
    """Remove the fakes (and restore anything they shadowed)."""
    global _ctx
    _ctx = None
    for name in _NAMES:
        sys.modules.pop(name, None)
    sys.modules.update(_saved)
    _saved.clear()
