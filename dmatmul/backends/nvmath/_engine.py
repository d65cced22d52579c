"""The execution layer: real nvmath-python objects built from a Translation.

Everything that touches nvmath-python, CuPy or MPI lives here, imported
lazily; all decisions were made by :mod:`._translate` (as data) and all array
work is done by :mod:`._pipeline`. This layer only:

* starts ``nvmath.distributed`` once per process (:func:`context`): the
  communicator is dmatmul's MPI runtime under ``mpiexec`` and ``COMM_SELF``
  in one process; the device is the local rank modulo the visible GPUs (one
  process per GPU: NCCL refuses two ranks on one GPU); the communication
  backend is ``nccl`` alone (nvmath's distributed Matmul runs on NCCL, and
  cuBLASMp 0.8+ no longer uses NVSHMEM), or those named in
  ``DMATMUL_NVMATH_BACKENDS`` (e.g. ``nvshmem,nccl`` for other nvmath
  libraries in the same process);
* builds ``BlockCyclic(ProcessGrid(...), block_sizes, first_process=...)``,
  the qualifiers array and ``MatmulOptions(inplace=False)``;
* creates, plans (with the fused epilog, falling back to dmatmul's epilogue
  if the installed nvmath refuses it), executes, resets and frees
  ``nvmath.distributed.linalg.advanced.Matmul`` -- or, for a local kernel on
  several ranks, ``nvmath.linalg.advanced.Matmul`` (cuBLASLt, no
  communication).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from ... import _runtime
from ._pipeline import Prepared
from ._translate import Memory, NvDistribution, Translation

__all__ = ["Context", "start", "context", "requested_backends", "preflight", "CublasMpEngine", "CublasLtEngine", "make_engine",
           "nvmath_version", "cublasmp_version", "memory", "compute_capability"]

BACKENDS_ENV = "DMATMUL_NVMATH_BACKENDS"
#: NCCL only: nvmath 1.0's distributed Matmul needs the NCCL backend (cuBLASMp dropped NVSHMEM at 0.8)
_DEFAULT_BACKENDS = ("nccl",)


@dataclasses.dataclass(frozen=True)
class Context:
    """This process's place in the nvmath.distributed runtime."""

    comm: Any
    rank: int
    size: int
    device_id: int
    backends: tuple[str, ...]


_context: Context | None = None


def nvmath_version() -> str:
    import nvmath

    return str(getattr(nvmath, "__version__", "unknown"))


def _context_size(ctx: Any) -> int | None:
    comm = getattr(ctx, "communicator", None)
    if comm is not None and hasattr(comm, "Get_size"):
        return int(comm.Get_size())
    group = getattr(ctx, "process_group", None)
    if group is not None and hasattr(group, "nranks"):
        return int(group.nranks)
    return None


def requested_backends(environ: Any = None) -> tuple[str, ...]:
    """The communication backends to start nvmath.distributed with: NCCL
    alone, or those named in ``DMATMUL_NVMATH_BACKENDS`` (comma-separated).

    >>> requested_backends({})
    ('nccl',)
    >>> requested_backends({"DMATMUL_NVMATH_BACKENDS": " nvshmem, nccl "})
    ('nvshmem', 'nccl')
    """
    environ = os.environ if environ is None else environ
    raw = environ.get(BACKENDS_ENV)
    if raw is None or not raw.strip():
        return _DEFAULT_BACKENDS
    backends = tuple(dict.fromkeys(b.strip().lower() for b in raw.split(",") if b.strip()))
    unknown = [b for b in backends if b not in ("nccl", "nvshmem")]
    if unknown:
        raise RuntimeError(f"{BACKENDS_ENV}={raw!r} names {unknown}: nvmath.distributed knows 'nccl' and 'nvshmem'")
    if "nccl" not in backends:
        raise RuntimeError(f"{BACKENDS_ENV}={raw!r} leaves out 'nccl', which nvmath's distributed Matmul needs "
                           f"(cuBLASMp communicates over NCCL): unset it or add nccl")
    return backends


def preflight() -> None:
    """The local checks before the collective start-up (run under
    ``_runtime.agree``, so one rank's failure is every rank's error)."""
    requested_backends()
    import cupy

    importlib.import_module("nvmath.distributed")  # a broken install fails here, on this rank

    if int(cupy.cuda.runtime.getDeviceCount()) < 1:
        raise RuntimeError("the nvmath backend needs a CUDA GPU and none is visible on this rank")


def start(spmd: bool) -> Context:
    """The runtime, started once: the local checks on every rank first (one
    rank without a GPU fails them all), then :func:`context`. Used by the
    backend's ``start`` and by every plan."""
    if _context is None:
        _runtime.agree(preflight, "dmatmul (nvmath start-up)")
    return context(spmd)


def context(spmd: bool) -> Context:
    """Start (once) and return the nvmath.distributed runtime of this process."""
    global _context
    if spmd:
        rt = _runtime.active()
        if rt is None:  # pragma: no cover - the front end started it
            raise RuntimeError("dmatmul: several processes announced but no MPI runtime is active")
        comm, rank, size, local_rank = rt.comm, rt.rank, rt.size, rt.local_rank
    else:
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise RuntimeError("the nvmath backend needs mpi4py (nvmath.distributed bootstraps over MPI): "
                               "pip install 'dmatmul[mpi]'") from e
        comm, rank, size, local_rank = MPI.COMM_SELF, 0, 1, None
    if _context is not None:
        if _context.size != size:
            raise RuntimeError(
                f"nvmath.distributed was started on {_context.size} process(es) in this process's lifetime, "
                f"this product runs on {size}: use one launch mode per process"
            )
        return _context
    import cupy
    import nvmath.distributed as nd

    ndev = int(cupy.cuda.runtime.getDeviceCount())
    if ndev < 1:
        raise RuntimeError("the nvmath backend needs a CUDA GPU and none is visible")
    ctx = nd.get_context()
    if ctx is None:
        device_id = int(cupy.cuda.runtime.getDevice()) if local_rank is None else int(local_rank) % ndev
        backends = requested_backends()
        cupy.cuda.Device(device_id).use()
        group = nd.MPIProcessGroup(comm) if hasattr(nd, "MPIProcessGroup") else comm
        try:
            nd.initialize(device_id, group, backends=list(backends))
        except Exception as e:
            raise RuntimeError(
                f"nvmath.distributed.initialize(device_id={device_id}, backends={list(backends)}) failed on rank "
                f"{rank}: {e}. One process per GPU is required (NCCL refuses two ranks on one GPU); "
                f"{BACKENDS_ENV} (comma-separated, default {','.join(_DEFAULT_BACKENDS)}) chooses the backends"
            ) from e
    else:  # the user started nvmath.distributed: use it as it is
        device_id = int(ctx.device_id)
        backends = tuple(b for b, on in (("nvshmem", getattr(ctx, "nvshmem_available", False)),
                                          ("nccl", getattr(ctx, "nccl_comm", None) is not None)) if on)
        if "nccl" not in backends:
            raise RuntimeError("nvmath.distributed was initialized without the NCCL backend, which its distributed "
                               "Matmul needs: finalize it and initialize with backends=['nccl'] (or leave the "
                               "start-up to dmatmul)")
        got = _context_size(ctx)
        if got is not None and got != size:
            raise RuntimeError(
                f"nvmath.distributed was initialized on {got} process(es) but this product runs on {size}"
            )
        cupy.cuda.Device(device_id).use()
    _context = Context(comm, rank, size, device_id, backends)
    return _context


def compute_capability(device_id: int) -> tuple[int, int]:
    """The compute capability of GPU ``device_id`` as (major, minor) (CuPy reports "90" for 9.0, "100" for
    10.0): nvmath's MXFP8 (``block_scaling=True``) needs 10.0 or higher."""
    import cupy

    cc = str(cupy.cuda.Device(device_id).compute_capability)
    return int(cc[:-1]), int(cc[-1])


# --------------------------------------------------------------------------- #
# nvmath objects from data
# --------------------------------------------------------------------------- #
def nv_distribution(d: NvDistribution) -> Any:
    """``nvmath.distributed.distribution.BlockCyclic`` for the data ``d`` (needs the runtime)."""
    from nvmath.distributed.distribution import BlockCyclic, ProcessGrid

    layout = ProcessGrid.Layout.ROW_MAJOR if d.grid_layout == "ROW_MAJOR" else ProcessGrid.Layout.COL_MAJOR
    grid = ProcessGrid(shape=tuple(int(s) for s in d.grid_shape), layout=layout)
    return BlockCyclic(grid, tuple(int(b) for b in d.block_sizes), first_process=tuple(int(f) for f in d.first_process))


def qualifiers(flags: tuple[bool, bool, bool], dtype: Any) -> np.ndarray:
    q = np.zeros((3,), dtype=dtype)
    for i, flag in enumerate(flags):
        q[i]["is_transpose"] = bool(flag)
    return q


def _options(cls: Any, **wanted: Any) -> tuple[Any, set[str]]:
    fields = {f.name for f in dataclasses.fields(cls)}
    if isinstance(wanted.get("compute_type"), str):  # the Translation names it; nvmath wants its enum
        wanted["compute_type"] = _compute_type(wanted["compute_type"])
    if isinstance(wanted.get("result_type"), str):
        wanted["result_type"] = _data_type(wanted["result_type"])
    return cls(**{k: v for k, v in wanted.items() if k in fields}), fields


def _compute_type(name: str) -> Any:
    try:
        from nvmath.bindings.cublas import ComputeType
    except ImportError:  # a stand-in nvmath (the tests' simulation) takes the name
        return name
    return ComputeType[name]


def _data_type(name: str) -> Any:
    """nvmath's CudaDataType member of a result dtype name (bfloat16, float16, float32)."""
    try:
        from nvmath import CudaDataType
    except ImportError:  # a stand-in nvmath (the tests' simulation) takes the name
        return name
    return {"bfloat16": CudaDataType.CUDA_R_16BF, "float16": CudaDataType.CUDA_R_16F,
            "float32": CudaDataType.CUDA_R_32F}[name]


def _scales(tr: Translation) -> dict[str, Any]:
    """``quantization_scales=`` for nvmath's Matmul: FP8's per-tensor scales of A and B (nvmath's slots, which
    hold the user's a and b, or b and a in a swapped frame)."""
    spec = tr.problem.spec
    if not spec.fp8:
        return {}
    sa, sb = spec.scales
    return {"quantization_scales": {"a": sb, "b": sa} if tr.swapped else {"a": sa, "b": sb}}


def _fallback_worthy(e: BaseException) -> bool:
    text = f"{type(e).__name__}: {e}".lower()
    return isinstance(e, (ValueError, NotImplementedError, TypeError)) or "not_supported" in text or "not supported" in text


class _Engine:
    """What both engines share: plan nvmath's Matmul with the fused epilog
    (falling back to dmatmul's epilogue when the installed nvmath refuses it),
    hand operands over and execute, free. A subclass creates ``_mm`` and says
    how the prepared blocks are handed over (:meth:`_operands`).

    Handing over is skipped when the very same prepared arrays come back and
    live on the device (``resident``): nvmath reads them where they are, and
    the plan's views and staging buffers are reused objects. Host operands are
    always handed over (nvmath copies them to the GPU then)."""

    resident = False
    _held: tuple[Any, Any, Any, Any] | None = None
    _mm: Any = None
    #: MXFP8 on cuBLASMp: ``{"a": ..., "b": ...}``, the tiled 1-D block scales of nvmath's A and B (this
    #: call's: handed over with every call's operands), None otherwise
    block_scales: dict[str, Any] | None = None

    def __init__(self, tr: Translation, ctx: Context) -> None:
        self.ctx = ctx
        self.translation = tr
        self.refused: str | None = None

    def _operands(self, prepared: Prepared) -> tuple[Any, Any, Any]:
        """The (a, b, c) nvmath's Matmul takes."""
        raise NotImplementedError

    #: whether creating, planning and freeing ``_mm`` are collective (cuBLASMp): the ranks then agree
    #: on the fused epilog's fate
    collective = False

    #: makes a fresh nvmath Matmul on the operands the engine was made with (set by the subclass)
    _new: Callable[[], Any]

    def _start(self, prepared: Prepared, epilog_enum: Any) -> None:
        """Plan ``_mm``; when nvmath refuses the fused epilog, plan the unfused
        translation instead, on a new Matmul: a failed ``plan(epilog=...)``
        may leave the epilog set in nvmath's descriptor, and dmatmul then
        applies its own. With several ranks they all fall back, or all raise,
        when nvmath refused on any one of them."""
        self._epilog_enum = epilog_enum
        tr = self.translation
        error: Exception | None = None
        try:
            self._plan(tr, prepared)
        except Exception as e:  # noqa: BLE001 - judged below, with the other ranks' verdicts
            error = e
        mine = None if error is None else (_fallback_worthy(error), f"{type(error).__name__}: {error}")
        verdicts = self.ctx.comm.allgather(mine) if self.collective and self.ctx.size > 1 else [mine]
        failed = {rank: v for rank, v in enumerate(verdicts) if v is not None}
        if not failed:
            return
        if tr.fused_epilog in (None, "ALLREDUCE") or not all(worthy for worthy, _ in failed.values()):
            if error is not None:
                raise error
            raise RuntimeError("nvmath's Matmul.plan failed on rank(s) "
                               + ", ".join(f"{r} ({text})" for r, (_, text) in failed.items()))
        self.refused = mine[1] if mine is not None else next(iter(failed.values()))[1]
        self._mm.free()
        self._mm = self._new()
        self.translation = tr.unfused()
        self._plan(self.translation, prepared)

    @staticmethod
    def _epilog_inputs(tr: Translation, prepared: Prepared) -> dict[str, Any] | None:
        fused = tr.fused_epilog
        if fused is not None and fused.endswith("BIAS") and prepared.bias is not None:
            return {"bias": prepared.bias}
        return None

    def _plan(self, tr: Translation, prepared: Prepared) -> None:
        if tr.fused_epilog is None:
            self._mm.plan()
            return
        self._mm.plan(epilog=self._epilog_enum[tr.fused_epilog], epilog_inputs=self._epilog_inputs(tr, prepared))

    def _same(self, prepared: Prepared) -> bool:
        held = self._held
        return (self.resident and held is not None and prepared.A is held[0] and prepared.B is held[1]
                and prepared.C is held[2] and prepared.bias is held[3])

    def run(self, prepared: Prepared) -> Any:
        """Hand ``prepared`` over (``reset_operands``) and execute."""
        if self.block_scales is None and self._same(prepared):
            return self._mm.execute()
        a, b, c = self._operands(prepared)
        kwargs: dict[str, Any] = {"a": a, "b": b}
        if self.block_scales is not None:  # (a plan shared by calls of other scales: this call's)
            kwargs["quantization_scales"] = self.block_scales
        if c is not None:
            kwargs["c"] = c
        inputs = self._epilog_inputs(self.translation, prepared)
        if inputs is not None:
            kwargs["epilog_inputs"] = inputs
        self._mm.reset_operands(**kwargs)
        self.handed(prepared)
        return self._mm.execute()

    def handed(self, prepared: Prepared) -> None:
        """``prepared`` is what nvmath now holds."""
        self._held = (prepared.A, prepared.B, prepared.C, prepared.bias)

    def free(self) -> None:
        if self._mm is not None:
            self._mm.free()
            self._mm = None


class CublasMpEngine(_Engine):
    """``nvmath.distributed.linalg.advanced.Matmul`` for one Translation."""

    collective = True

    def __init__(self, tr: Translation, prepared: Prepared, ctx: Context,
                 block_scales: dict[str, Any] | None = None) -> None:
        from nvmath.distributed.linalg.advanced import Matmul, MatmulEpilog, MatmulOptions, matrix_qualifiers_dtype

        super().__init__(tr, ctx)
        self.block_scales = block_scales
        scales = _scales(tr) if block_scales is None else {"quantization_scales": block_scales}
        p = tr.problem
        options, fields = _options(MatmulOptions, **dict(tr.options))
        self._copy_c = "inplace" not in fields  # an nvmath without the option: never let it write the user's c
        A, B, C = self._operands(prepared)
        slot_a, slot_b = tr.slot("A"), tr.slot("B")
        assert slot_a is not None and slot_b is not None and tr.result is not None
        distributions = [nv_distribution(slot_a.distribution), nv_distribution(slot_b.distribution),  # type: ignore[arg-type]
                         nv_distribution(tr.result)]
        self._new = lambda: Matmul(
            A, B, C, distributions=distributions, alpha=p.alpha, beta=p.beta if C is not None else None,
            qualifiers=qualifiers(tr.qualifiers, matrix_qualifiers_dtype), options=options, **scales,
        )
        self._mm = self._new()
        self._start(prepared, MatmulEpilog)

    def _copied_c(self, prepared: Prepared) -> bool:
        """Whether c is copied for nvmath (an nvmath that could write it in place)."""
        return prepared.C is not None and self._copy_c and not prepared.copied.get("c", False)

    def _operands(self, prepared: Prepared) -> tuple[Any, Any, Any]:
        C = prepared.C.copy(order="F") if self._copied_c(prepared) else prepared.C
        return prepared.A, prepared.B, C

    def handed(self, prepared: Prepared) -> None:
        """``prepared`` is what nvmath now holds (a C copied for nvmath never counts as held)."""
        self._held = None if self._copied_c(prepared) else (prepared.A, prepared.B, prepared.C, prepared.bias)


class CublasLtEngine(_Engine):
    """A local kernel on several ranks: ``nvmath.linalg.advanced.Matmul`` (cuBLASLt) per rank."""

    def __init__(self, tr: Translation, prepared: Prepared, ctx: Context) -> None:
        from nvmath.linalg.advanced import Matmul, MatmulEpilog, MatmulOptions

        super().__init__(tr, ctx)
        p = tr.problem
        options, _ = _options(MatmulOptions, **dict(tr.options), device_id=ctx.device_id)
        a, b, c = self._operands(prepared)
        self._empty: tuple[int, int] | None = None
        if 0 in (a.shape[0], b.shape[1]):  # this rank holds no rows/columns of the result: nothing to run
            self._empty = (a.shape[0], b.shape[1])
            return
        self._new = lambda: Matmul(
            a, b, c=c, alpha=p.alpha, beta=p.beta if c is not None else None, options=options, **_scales(tr))
        self._mm = self._new()
        self._start(prepared, MatmulEpilog)

    def _operands(self, prepared: Prepared) -> tuple[Any, Any, Any]:
        q = self.translation.qualifiers
        a = prepared.A.T if q[0] else prepared.A
        b = prepared.B.T if q[1] else prepared.B
        return a, b, prepared.C

    def run(self, prepared: Prepared) -> Any:
        if self._empty is not None:
            return _array_module(prepared.A).zeros(self._empty, dtype=prepared.A.dtype)
        return super().run(prepared)


def _array_module(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return np
    import cupy

    return cupy


def make_engine(tr: Translation, prepared: Prepared, ctx: Context,
                block_scales: dict[str, Any] | None = None) -> CublasMpEngine | CublasLtEngine:
    """Create and plan the nvmath object for ``tr`` (collective for cuBLASMp); ``block_scales``: MXFP8's
    tiled scales of nvmath's A and B (cuBLASMp only)."""
    if tr.engine == "cublaslt":
        assert block_scales is None
        return CublasLtEngine(tr, prepared, ctx)
    return CublasMpEngine(tr, prepared, ctx, block_scales)


def cublasmp_version() -> int | None:
    """cuBLASMp's version as an integer (800 for 0.8.0), None when unreadable."""
    try:
        from nvmath.bindings import cublasMp  # type: ignore[import-not-found,unused-ignore]

        return int(cublasMp.get_version())
    except Exception:  # noqa: BLE001 - not readable: explain() says so
        return None


def memory(tr: Translation, placement: str | None, on_device: bool, version: int | None) -> Memory:
    """Where things live, as data for :func:`._translate.overlap`: cuBLASMp's
    workspace (nvmath allocates it with cuBLASMp's NCCL allocator and
    registers it on every grid: NCCL symmetric memory from cuBLASMp 0.8 on)
    and nvmath's operand B (``placement``: :meth:`._pipeline.Program.placement`).
    B is never put in symmetric memory by dmatmul: nvmath's helper for that
    allocates on the NVSHMEM heap, which dmatmul does not start (nvmath's
    Matmul notices NVSHMEM-resident operands and then allocates its result
    there, but cuBLASMp's overlap needs NCCL's symmetric memory)."""
    workspace: Literal["nccl", "unknown"]
    if version is not None and version >= 800:
        workspace, ws_why = "nccl", ""
    else:
        shown = "unreadable" if version is None else f"{version // 10000}.{version // 100 % 100}.{version % 100}"
        workspace, ws_why = "unknown", f"cuBLASMp {shown}; nvmath 1.0 runs 0.8 and newer"
    if tr.engine != "cublasmp" or placement is None:
        return Memory(workspace, "none", workspace_why=ws_why)
    if not on_device:
        return Memory(workspace, "host", workspace_why=ws_why)
    if placement == "user":
        return Memory(workspace, "user", workspace_why=ws_why)
    why = "a copy (padding, a cut or another layout) in ordinary memory: nvmath's symmetric memory is NVSHMEM's"
    return Memory(workspace, "ordinary", b_why=why, workspace_why=ws_why)
