"""The nvmath backend: cuBLASMp through ``nvmath.distributed.linalg.advanced``.

Layers (each importable without a GPU):

* :mod:`._translate` -- pure Python: a dmatmul product as the nvmath call, as
  plain data (distributions, transposed views, qualifiers, padding, fused
  epilog, the cuBLASMp path); fully tested on CPU.
* :mod:`._pipeline` -- the array work of one rank (views, padding copies,
  stripping, the epilogue dmatmul applies), generic over numpy and cupy.
* :mod:`._engine` -- the only code that imports nvmath-python, CuPy and MPI:
  runtime start-up and the nvmath objects built from the data.
* :mod:`._probe` -- what is installed (wheel metadata, the driver's GPUs),
  read without importing nvmath or loading CUDA: :func:`installation`, which
  ``dmatmul info`` prints.
* :mod:`._precision` -- ``precision=`` as nvmath's compute type.

Importing this package imports none of nvmath, CuPy or MPI;
:func:`unavailable` says why the backend cannot run here.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import threading
from typing import TYPE_CHECKING, Any

from .. import Backend

if TYPE_CHECKING:
    from ._probe import Installation

__all__ = ["BACKEND", "unavailable", "details", "installation", "node_view", "passed_over", "shared_gpus",
           "NvmathBackend"]

_EXTRA = "pip install 'dmatmul[nvmath]' (CUDA 13) or 'dmatmul[nvmath-cu12]' (CUDA 12)"
#: cuBLASMp versions nvmath-python 1.0's distributed Matmul runs on: its code
#: requires >= 0.8.0 ("cublasMp >= 0.8.0 required"), its extras pin < 0.10
_CUBLASMP_MIN, _CUBLASMP_BELOW = 800, 1000


def installation(**fakes: Any) -> Installation:
    """What is installed for this backend, read from wheel metadata and the
    driver's files, without importing nvmath or loading CUDA (see :mod:`._probe`)."""
    from ._probe import installation as _installation

    return _installation(**fakes)


def details() -> list[str]:
    """``dmatmul info``'s lines for this backend: what is installed (wheel metadata; no CUDA loaded),
    told against what loading the libraries found where :func:`unavailable` has already run."""
    return installation().lines(loaded=_passed())


def _passed() -> bool:
    """Whether :func:`unavailable` ran in this process (it loads the libraries) and found nothing against."""
    return bool(unavailable.cache_info().currsize) and unavailable() is None


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why this backend cannot run here, or None when it can.

    Checks, cheapest first: nvmath-python, CuPy, mpi4py and nccl4py are
    installed; a CUDA device is visible; cuBLASMp's library loads (and is a
    version nvmath-python 1.0 supports). The libraries are loaded, not judged
    by their wheels' versions: a system cuBLASMp or NCCL counts, and a too-old
    NCCL shows as cuBLASMp failing to load (the message then adds what the
    wheel metadata says). The answer is cached for the process.

    >>> reason = unavailable()
    >>> reason is None or isinstance(reason, str)
    True
    """
    missing = [pkg for pkg in ("nvmath", "cupy") if importlib.util.find_spec(pkg) is None]
    if missing:
        return f"{' and '.join(missing)} not installed: {_EXTRA}"
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py not installed (nvmath.distributed bootstraps over MPI): pip install 'dmatmul[nvmath,mpi]'"
    if importlib.util.find_spec("nccl") is None:
        return f"nccl4py not installed (nvmath.distributed starts NCCL through it): {_EXTRA}"
    try:
        import cupy

        ndev = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:  # noqa: BLE001 - no driver, no runtime, ...
        return f"no CUDA device usable by CuPy ({type(e).__name__}: {e}); the nvmath backend needs an NVIDIA GPU"
    if ndev < 1:
        return "no CUDA device visible (CuPy sees 0 GPUs); the nvmath backend needs an NVIDIA GPU"
    try:
        from nvmath.bindings import cublasMp

        version = int(cublasMp.get_version())
    except Exception as e:  # noqa: BLE001 - library missing or not loadable
        # what the wheels say about it: no cuBLASMp wheel, or an NCCL older than cuBLASMp needs
        hints = [p for p in installation().problems if p.startswith(("cuBLASMp", "NCCL"))]
        return f"the cuBLASMp library could not be loaded ({type(e).__name__}: {e}); " + (
            "; ".join(hints) if hints else _EXTRA)
    if not _CUBLASMP_MIN <= version < _CUBLASMP_BELOW:
        return (
            f"cuBLASMp {version // 10000}.{version // 100 % 100}.{version % 100} found; nvmath-python 1.0 needs "
            f"0.8 <= cuBLASMp < 0.10: {_EXTRA}"
        )
    return None


def node_view() -> tuple[str | None, int] | None:
    """What this rank tells the others of its node when the runtime starts:
    its ``CUDA_VISIBLE_DEVICES`` and how many GPUs it sees (CuPy's count, by
    which the engine picks the rank's GPU: its rank on the node modulo the
    count); None where CuPy sees none (the rank's own probe then says why)."""
    try:
        import cupy

        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no driver, no runtime: unavailable() tells
        return None
    return (os.environ.get("CUDA_VISIBLE_DEVICES"), count) if count > 0 else None


def shared_gpus(nodes: Any, rank: int) -> str | None:
    """Why cuBLASMp cannot run on these ranks: two ranks of a node on one
    GPU (NCCL refuses them, in every rank's ``nvmath.distributed.initialize``),
    told from every rank's ``(node, rank on the node, views)``
    (``Runtime.nodes``, ``views`` holding :func:`node_view`'s ``("nvmath",
    ...)``) for rank ``rank``; None where every rank has a GPU of its own.

    >>> one_gpu = (("nvmath", (None, 1)),)
    >>> shared_gpus([(0, r, one_gpu) for r in range(8)], 3)[:42]
    '8 ranks on this node share 1 GPU; cuBLASMp'
    >>> shared_gpus([(0, r, (("nvmath", (str(r), 1)),)) for r in range(8)], 3) is None  # CUDA_VISIBLE_DEVICES=r
    True
    >>> shared_gpus([(0, 0, one_gpu), (0, 1, one_gpu), (2, 0, one_gpu), (2, 1, one_gpu)], 0)[:43]
    '2 ranks on this node share 1 GPU; cuBLASMp '
    >>> shared_gpus([(0, 0, one_gpu), (1, 0, one_gpu), (2, 0, one_gpu), (2, 1, one_gpu)], 0)[:49]
    '2 ranks on the node of rank 2 share 1 GPU; cuBLAS'
    """
    gpus: dict[int, list[str]] = {}  # node -> the GPU each of its ranks would drive
    for node, local_rank, views in nodes:
        view = dict(views).get("nvmath")
        if view is None:  # a rank without a GPU: its own probe refuses the backend
            continue
        visible, count = view
        index = local_rank % count  # the engine's choice (_engine.context)
        names = [] if visible is None else [e.strip() for e in visible.split(",")][:count]
        gpus.setdefault(node, []).append(names[index] if index < len(names) else f"#{index}")
    mine = nodes[rank][0]
    for node in sorted(gpus, key=lambda n: (n != mine, n)):  # this rank's node first
        ranks, distinct = len(gpus[node]), len(set(gpus[node]))
        if distinct < ranks:
            where = "this node" if node == mine else f"the node of rank {node}"
            return (f"{ranks} ranks on {where} share {distinct} GPU{'s' if distinct > 1 else ''}; cuBLASMp needs "
                    f"one GPU per rank (NCCL refuses two ranks on one GPU): launch at most {distinct} "
                    f"rank{'s' if distinct > 1 else ''} per node, or give each rank a GPU of its own "
                    "(CUDA_VISIBLE_DEVICES)")
    return None


_verdict: tuple[Any, str | None] = ((), None)  # (the runtime's nodes, shared_gpus of them)


def passed_over(runtime: Any) -> str | None:
    """:func:`shared_gpus` for this runtime's ranks: the same on every rank,
    reckoned once per runtime (``backend="auto"`` asks before every product)."""
    global _verdict
    nodes, why = _verdict
    if nodes is not runtime.nodes:
        why = shared_gpus(runtime.nodes, runtime.rank)
        _verdict = (runtime.nodes, why)
    return why


def _whose() -> str:
    """Whose account :meth:`_LazyBackend.preview` gives: this rank's (asked of the
    runtime as it is: starting it, after dm.finalize(), would be collective)."""
    from ... import _runtime

    rt = _runtime.runtime()
    return "this rank's" if rt is None else f"rank {rt.rank}'s"


class _LazyBackend(Backend):
    """``BACKEND``: the registry reads ``.name`` and calls ``.plan``; the
    backend module (and with it nvmath's) is imported on the first plan."""

    name = "nvmath"
    plans_collectively = True  # under mpiexec making a plan runs nvmath's collectives: see preview()
    cache_size = 16
    #: MXFP8's block scales come with FP8 a and b (the plan hands them to cuBLASMp, or dequantizes)
    takes_block_scales = True

    def __init__(self) -> None:
        self._impl: Any = None
        self._making = threading.Lock()  # threads' first plans at once make one backend (one start-up)

    def _backend(self) -> Any:
        if self._impl is None:
            with self._making:
                if self._impl is None:
                    from ._backend import NvmathBackend

                    self._impl = NvmathBackend()
        return self._impl

    def key(self, spec: Any, operands: Any) -> Any:
        """The spec, the local blocks' memory orders and where they live."""
        from ._backend import NvmathBackend

        return NvmathBackend.key(spec, operands)

    def agree_keys(self, keys: tuple[Any, ...], rank: int) -> None:
        """Every rank's operands live in the same memory, host or GPU (nvmath
        registers buffers for host operands collectively)."""
        from ._backend import _same_memory

        _same_memory(keys, rank)

    def plan(self, spec: Any, operands: Any) -> Any:
        return self._backend().plan(spec, operands)

    def ranks(self, spec: Any, operands: Any) -> int:
        """One GPU per process: the processes under mpiexec, else one."""
        return spec.nprocs if spec.spmd else 1

    def planner(self, spec: Any, operands: Any, nranks: int) -> tuple[Any, Any, Any]:
        """The spec's sizes, the GPU model and cuBLASMp's kernels (its SUMMA on a
        grid too), as the translation plans with them (pure data)."""
        from ._translate._types import GRID, KERNELS, MODEL

        return spec.sizes(nranks), MODEL, (*KERNELS, GRID)

    def fits(self, spec: Any, operands: Any) -> None:
        """The translation's refusal of ``spec``'s named algorithm, where it has
        one (pure data: no GPU, nothing started)."""
        from ._translate import Problem, translate

        translate(Problem.from_spec(spec, self.ranks(spec, operands), ("C", "C", "C" if spec.use_c else None)))

    def memory(self, spec: Any, operands: Any) -> tuple[list[Any], dict[str, Any]]:
        """What the product takes (:mod:`dmatmul._memory`): on this process's
        GPU its blocks of a, b and c not there yet and its result block
        (cuBLASMp's workspace, which nvmath sizes as it plans, is not
        counted), and on the host a numpy result's block; pure data but for
        the GPU's probe (CuPy's free memory), asked only when it is judged."""
        import math

        from ... import _memory, _runtime
        from ..._spec import family

        shape = (spec.m, spec.n)
        rt = _runtime.active() if spec.spmd else None
        if rt is not None and spec.distributions is not None:
            shape = spec.distributions[2].shape(rt.rank, shape, spec.nprocs)
        item, gpu = spec.dtype_info.itemsize, "this process's GPU"
        block = "block" if spec.spmd else "matrix"
        needs = []
        for name, x in (("a", operands.a), ("b", operands.b), ("c", operands.c if spec.use_c else None)):
            if x is not None and not _on_gpu(x, family(x)):
                needs.append(_memory.Need(gpu, name, f"{name}'s {block} copied there", math.prod(x.shape) * item))
        needs.append(_memory.Need(gpu, "d", f"the result's {block}", shape[0] * shape[1] * item))
        if spec.family == "numpy":
            needs.insert(0, _memory.Need(_memory.HOST, "d", f"the result's {block} as a numpy array",
                                         shape[0] * shape[1] * item))
        return needs, {gpu: _gpu_free}

    def preview(self, spec: Any, operands: Any) -> tuple[str, list[str]]:
        """The algorithm and ``explain()`` lines of the plan :meth:`plan` would
        make, told from this rank's blocks (pure data: no collective, no GPU,
        nothing started): ``Matmul.algorithm`` and ``explain()`` under several
        processes before the plan is made, which one rank may ask alone. The
        plan combines every rank's memory orders where this reads its own."""
        from ._translate import Problem, order_of, translate

        c = operands.c if spec.use_c else None
        orders = (order_of(operands.a), order_of(operands.b), None if c is None else order_of(c))
        t = translate(Problem.from_spec(spec, self.ranks(spec, operands), orders))
        lines = t.describe()
        lines.insert(1, "device:     not planned yet: every rank makes the plan together (mm.plan() or the first "
                        f"execute(): nvmath's collectives), which tells the device and the overlap; this is {_whose()} "
                        "account, from its own blocks")
        return t.algorithm, lines

    def start(self, runtime: Any) -> Any:
        """nvmath.distributed's NCCL communicator over the runtime's processes
        (checked on every rank first: one rank without a GPU fails them all)."""
        from . import _engine

        ctx = _engine.start(runtime.size > 1)
        return dataclasses.replace(runtime, device=f"cuda:{ctx.device_id}")

    def stop(self) -> None:
        """Free the cached plans (nvmath.distributed itself lives until exit)."""
        self.clear()

    def clear(self) -> None:
        """Free every cached plan of this backend."""
        from ..._plans import PLANS

        PLANS.clear(self.name)

    def __repr__(self) -> str:
        return "<dmatmul nvmath backend (cuBLASMp)>"


def _on_gpu(x: Any, fam: str) -> bool:
    """Whether array ``x`` (of family ``fam``) already lives on a GPU (nvmath takes it there as it is)."""
    if fam == "cupy":
        return True
    if fam != "jax":
        return False
    try:
        return bool(next(iter(x.devices())).platform == "gpu")
    except Exception:  # noqa: BLE001 - a tracer, or a deleted array: counted as a copy
        return False


def _gpu_free() -> int:
    """The free bytes of the current GPU, as CuPy reads them."""
    import cupy

    return int(cupy.cuda.runtime.memGetInfo()[0])


BACKEND = _LazyBackend()


def __getattr__(name: str) -> Any:
    if name == "NvmathBackend":
        from ._backend import NvmathBackend

        return NvmathBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
