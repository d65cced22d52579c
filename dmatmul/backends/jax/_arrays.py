"""What the neutral core asks of jax.Arrays, answered without importing JAX.

:data:`KIND` is the JAX backend's :class:`dmatmul._spec.ArrayKind`: the table
(:mod:`dmatmul.backends`) registers it when the package is imported, so it
must stay light: it reads ``jax`` from ``sys.modules`` only (a jax.Array or a
trace exists only once the user imported JAX), and never imports it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

from ..._spec import ArrayKind

if TYPE_CHECKING:
    from ..._problem import Spec

__all__ = ["KIND", "JaxArrays", "in_trace", "context_mesh", "in_program"]


def in_trace(*xs: Any) -> bool:
    """Whether a JAX transformation (``jit``, ``grad``...) is tracing now: one of
    ``xs`` is its value, or JAX says so (also where only closed-over constants
    are used; JAX says it only privately: without that answer, False)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    if xs:
        tracer = jax.core.Tracer
        for x in xs:
            if isinstance(x, tracer):
                return True
    clean = _private().trace_state_clean
    return clean is not None and not clean()


class _Private:
    """JAX's private answers dmatmul asks on every call, looked up once (an
    import statement at every call costs more than the answer); None where
    this JAX has none."""

    def __init__(self) -> None:
        self.trace_state_clean: Any = None
        self.get_concrete_mesh: Any = None
        self.enable_x64: Any = None
        try:
            from jax._src.core import trace_state_clean

            self.trace_state_clean = trace_state_clean
        except ImportError:  # pragma: no cover - a JAX without it
            pass
        try:
            from jax._src.mesh import get_concrete_mesh

            self.get_concrete_mesh = get_concrete_mesh
        except ImportError:  # pragma: no cover - a JAX without it: the abstract route
            pass
        try:
            from jax._src.config import enable_x64

            self.enable_x64 = enable_x64
        except ImportError:  # pragma: no cover
            pass


_PRIVATE: _Private | None = None


def _private() -> _Private:
    global _PRIVATE
    if _PRIVATE is None:
        _PRIVATE = _Private()
    return _PRIVATE


def context_mesh() -> Any:
    """The concrete mesh of ``jax.set_mesh``, also inside a trace (where the
    public ``jax.sharding.get_mesh`` refuses to say); None where there is none
    (or this JAX keeps it elsewhere, or JAX is not loaded)."""
    if "jax" not in sys.modules:
        return None
    get = _private().get_concrete_mesh
    if get is None:  # pragma: no cover
        return None
    try:
        mesh = get()
    except AttributeError:  # pragma: no cover - a JAX that keeps it elsewhere
        return None
    return None if mesh is None or getattr(mesh, "empty", True) else mesh


def in_program(spec: Spec) -> bool:
    """One process, and the product is a JAX program's: on ``jax.Array``
    operands (the result goes back on their devices), or inside a JAX trace
    (numpy constants there give one of its values). Read now: the trace
    state is not part of the spec."""
    return not spec.spmd and (spec.family == "jax" or in_trace())


def _ids(devices: Any) -> str:
    ids = sorted(getattr(d, "id", -1) for d in devices)
    return "ids " + ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")


class JaxArrays(ArrayKind):
    """jax.Arrays (and JAX's tracers, which are jax.Arrays to ``isinstance``)."""

    family = "jax"

    def owns(self, x: Any) -> bool:
        jax = sys.modules.get("jax")
        return jax is not None and isinstance(x, jax.Array)

    def claims(self, spec: Spec) -> bool:
        """A one-process product runs where only JAX's devices can: asked to span
        several (``devices=N``, N > 1, or a list of JAX devices), on jax.Array
        operands (the result goes back on their devices, a user's mesh too), or
        inside a JAX trace (the operands are tracers, the result a value of the
        trace)."""
        return not spec.spmd and (spec.devices not in (None, 1) or in_program(spec))

    def in_trace(self, xs: Sequence[Any]) -> bool:
        return in_trace(*xs)

    def refuse_unusable(self, x: Any, name: str) -> None:
        jax = sys.modules.get("jax")  # (a jax.Array comes only from a loaded jax; a tracer has no buffers)
        if jax is not None and isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) and x.is_deleted():
            raise ValueError(f"{name} is a deleted jax.Array (its buffers were freed or donated): pass a live array")

    def refuse_spanning(self, x: Any, name: str, distribution: str) -> None:
        if self.owns(x) and not getattr(x, "is_fully_addressable", True):
            raise ValueError(
                f"{name} is a jax.Array that spans several processes; under mpiexec each rank passes its "
                f"local block of {name}: its part of dm.split(global_{name}, {distribution}), e.g. "
                f"{name}.addressable_shards[0].data for a Slab"
            )

    def array_module(self) -> Any:
        import jax.numpy as jnp

        return jnp

    def eager(self) -> contextlib.AbstractContextManager[Any]:
        jax = sys.modules.get("jax")
        return contextlib.nullcontext() if jax is None else jax.ensure_compile_time_eval()

    def item(self, x: Any, idx: tuple[int, ...]) -> Any:
        # lax's indexing, not x[idx]: jax.numpy makes the item of an empty array anew on one device (it raised
        # on a mesh of Explicit axes, and dropped the placement on an Auto one)
        jax = sys.modules["jax"]
        for i in idx:
            x = jax.lax.index_in_dim(x, i, 0, keepdims=False)
        sharding = getattr(x, "sharding", None)
        if x.size == 0 and isinstance(sharding, jax.sharding.NamedSharding) and not x.is_fully_replicated:
            # no values: unsplit on its mesh (JAX reads a zero-size array split over devices as whole on each, and a
            # jit that holds it as a constant raised 'could not broadcast input array from shape (26,0) into (13,0)')
            import numpy as np

            x = jax.device_put(np.zeros(x.shape, x.dtype), jax.sharding.NamedSharding(sharding.mesh,
                                                                                      jax.sharding.PartitionSpec()))
        return x

    def precise(self, dtype: str) -> contextlib.AbstractContextManager[Any]:
        jax = sys.modules.get("jax")
        if jax is not None and dtype in ("float64", "complex128"):
            # 64-bit results stay 64-bit where JAX makes or places them (jax operands; any inside a trace)
            return jax.enable_x64(True)
        return contextlib.nullcontext()

    def recent_key(self, xs: Sequence[Any]) -> Hashable | None:
        """Concrete jax.Arrays (or None) outside any trace: what the checks read of
        them (shape, dtype, weak type, sharding, committedness), ``jax.set_mesh``'s
        mesh and the x64 flag. (Asked at every ``dm.matmul``: written for speed.)"""
        jax = sys.modules.get("jax")
        if jax is None:
            return None
        array, tracer = jax.Array, jax.core.Tracer
        arrays: list[Any] = []
        for x in xs:
            if x is None:
                arrays.append(None)
            elif isinstance(x, array) and not isinstance(x, tracer):
                arrays.append((x.shape, x.dtype, x.weak_type, x.sharding, x.committed))
            else:
                return None
        private = _private()
        clean = private.trace_state_clean
        if clean is not None and not clean():
            return None
        x64 = private.enable_x64
        return (tuple(arrays), context_mesh(), bool(jax.config.jax_enable_x64 if x64 is None else x64.value))

    def refuse_held(self, x: Any, name: str) -> None:
        jax = sys.modules.get("jax")
        if jax is not None and isinstance(x, jax.core.Tracer):
            raise TypeError(
                f"reset_operands: {name} is a traced value (inside jax.jit, grad or vmap); a Matmul plan "
                "keeps its operands between calls, so a tracer would outlive its trace: call dm.matmul "
                "inside the traced function instead"
            )

    def refuse_moved(self, value: Any, old: Any, name: str) -> None:
        jax = sys.modules.get("jax")
        if jax is None or not (self.owns(value) and self.owns(old)) \
                or any(isinstance(v, jax.core.Tracer) for v in (value, old)):
            return
        devices, planned = value.sharding.device_set, old.sharding.device_set
        if devices != planned:  # the result would come back on the planned devices
            raise ValueError(
                f"reset_operands: {name} is on {len(devices)} device(s) ({_ids(devices)}) but the plan's "
                f"{name} was on {len(planned)} ({_ids(planned)}): put it there "
                f"(jax.device_put({name}, <the planned {name}>.sharding)) or make a new Matmul"
            )


KIND = JaxArrays()
