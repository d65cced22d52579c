"""The JAX backend: ``shard_map`` ring kernels on CPU, GPU or TPU devices.

Importing this package does not import JAX: the table imports its light
``_arrays`` module with ``dmatmul`` (what the neutral core asks of
jax.Arrays), and the backend itself (``BACKEND``, which needs JAX) on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._backend import JaxBackend, JaxPlan

__all__ = ["BACKEND", "JaxBackend", "JaxPlan", "unavailable"]


def __getattr__(name: str) -> Any:
    if name in ("BACKEND", "JaxBackend", "JaxPlan"):
        from . import _backend

        globals().update(JaxBackend=_backend.JaxBackend, JaxPlan=_backend.JaxPlan)
        globals().setdefault("BACKEND", _backend.JaxBackend())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def unavailable() -> str | None:
    """Why this backend cannot run here, or None (JAX imports: it can)."""
    return None
