"""The nvmath backend's plan: translate once, prepare/execute/finish per call."""

from __future__ import annotations

import atexit
import dataclasses
import numbers
import sys
import threading
from typing import Any

import numpy as np

from ... import _mxfp8, _runtime
from .. import BackendPlan
from ..._plans import PLANS
from ..._problem import Spec
from ..._spec import Operands, family, numpy_dtype
from . import _engine, _pipeline
from ._translate import Problem, Translation, as_dense, combine_orders, order_of, overlap, translate

__all__ = ["NvmathBackend", "NvmathPlan"]

#: nvmath 1.0's MXFP8 (``MatmulOptions(block_scaling=True)``) needs a GPU of compute capability 10.0 or higher
_MXFP8_CAPABILITY = (10, 0)
#: the cuBLASMp paths on which nvmath 1.0 checks MXFP8's local GEMM sizes (multiples of 128); on the others
#: it checks nothing, so dmatmul does not send block scales there
_MXFP8_PATHS = ("AG+GEMM", "GEMM+RS", "GEMM+AR", "local GEMM")


def _mxfp8_options(spec: Spec) -> tuple[tuple[str, Any], ...]:
    """nvmath's MatmulOptions of cuBLASMp's MXFP8 path: FP8 a and b, block scales, float32 accumulation."""
    return (("inplace", False), ("compute_type", "COMPUTE_32F"), ("result_type", spec.result_dtype),
            ("block_scaling", True))


def _check_devices(devices: Any) -> None:
    """One process drives one GPU: ``devices=`` may ask for at most one rank."""
    if devices is None:
        return
    count = devices if isinstance(devices, numbers.Integral) else len(devices)
    if count != 1:
        raise ValueError(
            f"devices={devices!r} asks for {count} ranks in one process, but the nvmath backend runs one rank "
            f"per process (one GPU each, as NCCL requires): launch with mpiexec -n {count}, or use backend='jax'"
        )


def _engine_array(x: Any) -> Any:
    """A numpy or cupy array for nvmath (jax arrays: zero-copy on a GPU, else via the host; a
    numpy subclass as the ndarray it views: np.matrix's ``*`` and ``**`` are matrix products)."""
    if x is None:
        return None
    fam = family(x)
    if fam == "numpy":
        return np.asarray(x)
    if fam == "cupy":
        return x
    if fam == "jax":
        try:
            if next(iter(x.devices())).platform == "gpu":
                import cupy

                return cupy.from_dlpack(x)
        except Exception:  # noqa: BLE001 - anything unusual: go through the host
            pass
        return np.asarray(x)
    return np.asarray(x)


def on_device(xp: Any) -> bool:
    """Whether operands of array module ``xp`` live on the GPU, where nvmath
    reads them in place (so the same buffers need no ``reset_operands``)."""
    return xp is not np


def _xp(arrays: list[Any]) -> Any:
    cupy = sys.modules.get("cupy")
    if cupy is not None and any(isinstance(x, cupy.ndarray) for x in arrays if x is not None):
        return cupy
    return np


def _to_family(d: Any, fam: str) -> Any:
    if fam == "jax":
        import jax.numpy as jnp

        cupy = sys.modules.get("cupy")
        if cupy is not None and isinstance(d, cupy.ndarray):
            import jax

            return jax.dlpack.from_dlpack(d)
        return jnp.asarray(d)
    if fam == "numpy":
        cupy = sys.modules.get("cupy")
        if cupy is not None and isinstance(d, cupy.ndarray):
            return cupy.asnumpy(d)
        return np.asarray(d)
    return d


class NvmathPlan(BackendPlan):
    """One product planned with nvmath: the Translation plus the nvmath object."""


    def __init__(self, spec: Spec, operands: Operands) -> None:
        self.spec = spec
        if not spec.spmd:
            _check_devices(spec.devices)
        self.ctx = _engine.start(spec.spmd)  # the same start-up as BACKEND.start (idempotent)
        self._upcast = False
        held = operands.block_scales is not None  # MXFP8 with FP8 a and b (dmatmul._mxfp8.hold)
        #: MXFP8: None (not block-scaled), "cublasmp" (its block-scaled GEMM), or why it is emulated
        self.mxfp8: str | None = None
        capability = _engine.compute_capability(self.ctx.device_id) if held else None
        arrays = self._arrays(operands)
        self._xp = _xp(arrays)
        a, b, c, _ = arrays
        local = (order_of(a), order_of(b), order_of(c) if spec.use_c else None)
        everyone = self.ctx.comm.allgather(local) if self.ctx.size > 1 else [local]
        orders = tuple(combine_orders([o[i] for o in everyone]) for i in range(3))
        self.orders = orders
        problem = Problem.from_spec(spec, self.ctx.size, (orders[0] or "C", orders[1] or "C", orders[2]))
        if capability is not None and capability >= _MXFP8_CAPABILITY:
            problem = dataclasses.replace(problem, mxfp8=True)
        self.translation: Translation = _runtime.agree(lambda: translate(problem), "dmatmul (nvmath plan)")
        # FP8 that cuBLASMp's FP8 path refuses runs as the float32 product it equals (translate says why)
        # (MXFP8: float32 a and b, dequantized at the front, with c, the bias and the result of result_type)
        self._upcast = self.translation.problem.dtype != spec.dtype or (spec.options.block_scaled is not None
                                                                         and not held)
        if self._upcast:
            arrays = self._arrays(operands)
        self.algorithm = self.translation.algorithm
        self._last_in: Any = None
        self._last_arrays: Any = None
        # one call at a time: threads that share this plan (the cache hands one plan to every Matmul of a
        # problem) would otherwise hand their operands to the one nvmath Matmul between each other's
        # reset_operands and execute, and get each other's products
        self._running = threading.Lock()
        prepared = self._prepare(arrays)
        block_scales = None
        if held:
            self.mxfp8 = self._mxfp8_refusal(capability, operands, prepared)  # (collective: every rank's verdict)
            if self.mxfp8 == "cublasmp":
                block_scales = self._block_scales(operands)
                self.translation = dataclasses.replace(self.translation, options=_mxfp8_options(spec))
            else:  # emulated: a and b dequantized to float32 (dmatmul._mxfp8.dequantize), as on JAX
                self._upcast = True
                arrays = self._arrays(operands)
                prepared = self._prepare(arrays)
        self._engine = _engine.make_engine(self.translation, prepared, self.ctx, block_scales)
        self._engine.resident = on_device(self._xp)
        self.refused = self._engine.refused  # (explain() tells it after free() too: dm.finalize() frees every plan)
        if self._engine.translation is not self.translation:  # unfused: nvmath refused the epilog
            self.translation = self._engine.translation
            prepared = self._prepare(arrays)
        self._engine.handed(prepared)
        self.memory = _engine.memory(self.translation, self._program.placement("B"), on_device(self._xp),
                                     _engine.cublasmp_version())

    # -- helpers ----------------------------------------------------------------
    def _arrays(self, operands: Operands) -> list[Any]:
        xs = [_engine_array(x) for x in (operands.a, operands.b, operands.c if self.spec.use_c else None,
                                          operands.bias if self.spec.has_bias else None)]
        xp = _xp(xs)
        if xp is not np:  # one family for nvmath: host operands follow the device ones
            xs = [None if x is None else xp.asarray(x) for x in xs]
        if self._upcast and operands.block_scales is not None:  # MXFP8 emulated: each block times its scale
            sa, sb, ka, kb = operands.block_scales
            xs[0], xs[1] = _mxfp8.dequantize(xs[0], xp.asarray(sa), ka), _mxfp8.dequantize(xs[1], xp.asarray(sb), kb)
        if self._upcast:  # (exact: every FP8 value, and c's and the bias's result-type values, are float32s)
            xs = [None if x is None else x.astype(np.float32) for x in xs]
        return xs

    def _mxfp8_refusal(self, capability: tuple[int, int] | None, operands: Operands, prepared: Any) -> str:
        """``"cublasmp"`` where cuBLASMp's MXFP8 path takes this product on this rank (nvmath 1.0's rules, see
        :func:`_mxfp8_options`), else why not, on the first rank that
        refuses it: every rank's verdict is gathered, so all take the same path."""
        tr = self.translation
        why = []
        if capability is None or capability < _MXFP8_CAPABILITY:
            shown = "unknown" if capability is None else f"{capability[0]}.{capability[1]}"
            why.append(f"GPU {self.ctx.device_id} has compute capability {shown}, below 10.0 (Blackwell)")
        elif tr.engine != "cublasmp" or tr.path not in _MXFP8_PATHS:
            why.append(f"the {tr.path} path on {tr.engine}, where nvmath does not check MXFP8's local sizes (it "
                       f"does on {', '.join(_MXFP8_PATHS)})")
        elif tr.qualifiers[:2] != (True, False):
            layout = "".join("T" if q else "N" for q in tr.qualifiers[:2])
            why.append(f"its input layout is TN only (nvmath's A transposed, B not) and no frame gives it here "
                       f"({layout}): with C-order blocks that is transpose_a=False, transpose_b=True")
        else:
            users = ("b", "a") if tr.swapped else ("a", "b")
            for slot, name, x in (("A", users[0], prepared.A), ("B", users[1], prepared.B)):
                given = tuple(int(d) for d in getattr(operands, name).shape)
                shape = tuple(int(d) for d in x.shape)
                if shape not in (given, given[::-1]):
                    why.append(f"nvmath's {slot} ({name}) is not this rank's block of {name} as given (padded or cut "
                               f"to {shape} from {given}), and its scales are not re-laid")
                elif any(d % 128 for d in shape):
                    why.append(f"this rank's block of {name} is {given}: local M, N and K must be multiples of 128")
        verdicts = self.ctx.comm.allgather("; ".join(why)) if self.ctx.size > 1 else ["; ".join(why)]
        refused = [(r, v) for r, v in enumerate(verdicts) if v]
        if not refused:
            return "cublasmp"
        rank, first = refused[0]
        return first if self.ctx.size == 1 else f"rank {rank}: {first}"

    def _block_scales(self, operands: Operands) -> dict[str, Any]:
        """This call's block scales as cuBLASMp reads them: each rank's local scales of nvmath's A and B
        (the user's b and a in a swapped frame) in cuBLAS's tiled 1-D layout (:func:`dmatmul._mxfp8.to_tiled`)."""
        sa, sb, ka, kb = operands.block_scales
        tiled = {name: self._xp.asarray(_mxfp8.to_tiled(_mxfp8.logical(_engine_array(s), k)))
                 for name, s, k in (("a", sa, ka), ("b", sb, kb))}
        return {"a": tiled["b"], "b": tiled["a"]} if self.translation.swapped else tiled

    def _orders_match(self, arrays: list[Any]) -> list[Any]:
        """Operands reset to another memory order are converted to the planned one."""
        out = list(arrays)
        for i, want in enumerate(self.orders):
            x = out[i]
            if x is None or want is None:
                continue
            got = order_of(x)
            if want in ("C", "CF") and got not in ("C", "CF"):
                out[i] = as_dense(self._xp, x, "C")[0]
            elif want == "F" and got not in ("F", "CF"):
                out[i] = as_dense(self._xp, x, "F")[0]
        return out

    def _prepare(self, arrays: list[Any]) -> _pipeline.Prepared:
        """Decide the hand-over program once (collectively agreed) and run it on the plan's operands."""
        a, b, c, bias = arrays
        rank = self.ctx.rank

        def build() -> _pipeline.Prepared:
            self._program = _pipeline.Program(self.translation, rank, a, b, c, bias, self._xp)
            return self._program.prepare(a, b, c, bias)

        return _runtime.agree(build, "dmatmul (nvmath operands)")

    def _current(self, operands: Operands) -> list[Any]:
        """This call's operands as nvmath arrays in the planned memory orders;
        the last call's conversion again when the very same objects come back
        (and the conversion made no copy that could be stale)."""
        key = (operands.a, operands.b, operands.c, operands.bias)
        last = self._last_in
        if last is not None and key[0] is last[0] and key[1] is last[1] and key[2] is last[2] and key[3] is last[3]:
            return self._last_arrays
        arrays = self._orders_match(self._arrays(operands))
        given = (key[0], key[1], key[2] if self.spec.use_c else None, key[3] if self.spec.has_bias else None)
        fresh = all(x is None or x is g or family(g) == "jax" for x, g in zip(arrays, given))  # jax: immutable
        self._last_in, self._last_arrays = (key, arrays) if fresh else (None, None)
        return arrays

    # -- protocol -----------------------------------------------------------------
    @property
    def cost(self) -> Any:
        """The planner's Plan of the translated call (bytes, messages, flops, time per rank; None on 2-D grids)."""
        return self.translation.cost

    def execute(self, operands: Operands) -> Any:
        """Hand this call's operands over, run nvmath, finish the local result.

        Every index and selection was decided at plan time
        (:class:`._pipeline.Program`): this is data movement only, with no
        collective except the allgather of a replicated result. Host
        operands are handed over again every call (``reset_operands``: nvmath
        copies them to the GPU then, so values changed since planning are
        seen, as with the JAX backend); device operands are not, when the
        same buffers come back (nvmath reads them where they are). Threads
        sharing the plan run one call at a time.
        """
        with self._running:
            return self._execute(operands)

    def _execute(self, operands: Operands) -> Any:
        arrays = self._current(operands)
        if self._engine.block_scales is not None:  # (a plan the cache shares between calls of other scales)
            self._engine.block_scales = self._block_scales(operands)
        _, _, c, bias = arrays
        d_nv = self._engine.run(self._program.prepare(*arrays))
        d = self._program.finish(d_nv, c, bias)
        if self.translation.gather:
            host = np.ascontiguousarray(d.get() if self._xp is not np else d)
            full = _pipeline.assemble(self.translation, self.ctx.comm.allgather(host))
            d = full if self._xp is np else self._xp.asarray(full)
        if self._upcast:  # rounded to the result type once, as cuBLASMp's FP8 path rounds its D
            d = d.astype(numpy_dtype(self.spec.result_dtype))
        if self.spec.family == "numpy" and type(d) is np.ndarray:
            return d
        return _to_family(d, self.spec.family)

    def explain(self) -> list[str]:
        lines = self.translation.describe()
        lines.insert(1, f"device:     GPU {self.ctx.device_id} on rank {self.ctx.rank} of {self.ctx.size}; "
                        f"nvmath-python {_engine.nvmath_version()}, backends {', '.join(self.ctx.backends) or '?'}")
        lines.insert(3, f"overlap:    {overlap(self.translation, self.memory)}")
        if self.refused:
            lines.append(f"note:       nvmath refused the fused epilog ({self.refused}); dmatmul applies it")
        if self.mxfp8 == "cublasmp":
            lines.append(f"mxfp8:      cuBLASMp's MXFP8 path: FP8 a and b with nvmath block_scaling=True, each rank's "
                         f"block scales converted to cuBLAS's tiled 1-D layout, COMPUTE_32F, result "
                         f"{self.spec.result_dtype}")
        elif self.mxfp8 is not None:
            lines.append(f"mxfp8:      emulated: cuBLASMp's MXFP8 path (nvmath block_scaling=True: compute capability "
                         f"10.0+, local M, N, K multiples of 128, TN) is not taken ({self.mxfp8}); a and b are "
                         f"dequantized to float32 (exact), multiplied in float32, the result rounded to "
                         f"{self.spec.result_dtype} once")
        return lines

    def free(self) -> None:
        with self._running:  # (not under a thread's execute: dm.finalize() or clear() from another thread)
            if self._engine is not None:
                self._engine.free()
                self._engine = None  # type: ignore[assignment]


def _same_memory(keys: tuple[Any, ...], rank: int) -> None:
    """Every rank's plan key (gathered: the same on every rank, so each raises
    alike): their operands must live in the same memory, host or GPU, on
    every rank. nvmath allocates and registers device buffers, collectively,
    for host operands and takes GPU ones as they are: ranks that differ would
    not meet in those collectives."""
    def memory(where: str) -> str:
        return where if where == "-" else "GPU" if where == "cupy" or where.endswith(":gpu") else "host"

    for i, name in ((4, "a"), (5, "b"), (6, "c")):
        message = _runtime.disagreement([memory(k[i]) for k in keys], f"where {name} lives")
        if message is not None:
            raise ValueError(
                f"dmatmul (nvmath): {message} (this is rank {rank}): pass {name} in the same memory on every rank "
                "(numpy arrays everywhere, or cupy / GPU jax arrays everywhere)"
            )


class NvmathBackend:
    """The cuBLASMp backend's plans. The front end's plan cache
    (:mod:`dmatmul._plans`) keeps them (bounded, least recently used out) per
    Spec, local memory orders and where the operands live (:meth:`key`), so
    repeated ``dm.matmul`` calls on one problem plan (and create nvmath's
    Matmul) once; under mpiexec the cache gathers every rank's key at each
    lookup (never per execute), so the ranks hit, miss and evict (free, a
    collective) alike."""

    #: MXFP8's block scales come to this backend with FP8 a and b (the front end does not dequantize them)
    takes_block_scales = True

    def __init__(self) -> None:
        self._started = False
        self._lock = threading.Lock()

    @staticmethod
    def key(spec: Spec, operands: Operands) -> Any:
        def where(x: Any) -> str:
            if x is None:
                return "-"
            if family(x) == "jax":
                try:
                    return "jax:" + next(iter(x.devices())).platform
                except Exception:  # noqa: BLE001
                    return "jax"
            return family(x)

        c = operands.c if spec.use_c else None
        return (spec, order_of(operands.a), order_of(operands.b), None if c is None else order_of(c),
                where(operands.a), where(operands.b), where(c))

    def plan(self, spec: Spec, operands: Operands) -> NvmathPlan:
        with self._lock:
            if not self._started:
                # nvmath.distributed registers its finalize (which destroys cuBLASMp's grids and the NCCL
                # communicator) at exit when it starts; atexit runs the last registered first, so the hook
                # that frees dmatmul's plans is registered after the start-up, to run before it
                if spec.spmd:
                    _runtime.ensure("nvmath")  # the runtime's backend: dm.finalize() frees the plans too
                else:
                    _engine.start(False)
                atexit.register(PLANS.clear, "nvmath")
                self._started = True
        return NvmathPlan(spec, operands)
