"""The JAX backend: ``shard_map`` ring kernels on CPU, GPU or TPU devices."""

from __future__ import annotations

from ._backend import JaxBackend, JaxPlan

__all__ = ["BACKEND", "JaxBackend", "JaxPlan", "unavailable"]

BACKEND = JaxBackend()


def unavailable() -> str | None:
    """Why this backend cannot run here, or None (JAX imports: it can)."""
    return None
