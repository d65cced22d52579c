"""The JAX backend's process group: ``jax.distributed`` over the MPI ranks.

One device per process: on CPU one CPU device, on GPU the local rank's GPU.
Started by :func:`dmatmul._runtime.ensure` before the first multi-process
JAX product (or by :func:`dmatmul.init`); stopped by :func:`dmatmul.finalize`
when dmatmul started it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import socket
from typing import Any

import jax

__all__ = ["start", "stop"]

_owns = False  # dmatmul started jax.distributed (and shuts it down)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _has_accelerator() -> bool:
    """Whether a GPU/TPU JAX backend is installed (checked without starting JAX)."""
    return any(importlib.util.find_spec(p) is not None for p in ("jax_cuda12_plugin", "jax_cuda13_plugin", "libtpu"))


def start(state: Any) -> Any:
    """``jax.distributed`` across ``state``'s processes, unless it already runs;
    ``state`` with this process's device."""
    global _owns
    if state.size > 1 and not jax.distributed.is_initialized():
        platforms = os.environ.get("JAX_PLATFORMS", "")
        on_cpu = platforms.startswith("cpu") or not _has_accelerator()
        if on_cpu:
            jax.config.update("jax_num_cpu_devices", 1)
        address = state.comm.bcast(f"{socket.gethostname()}:{_free_port()}" if state.rank == 0 else None, root=0)
        # JAX's preemption service catches SIGTERM (to checkpoint on preemption), so a hung job
        # would ignore `timeout`/`scancel`; dmatmul's own runs leave SIGTERM to end the process
        jax.config.update("jax_enable_preemption_service", False)
        jax.distributed.initialize(
            coordinator_address=address,
            num_processes=state.size,
            process_id=state.rank,
            local_device_ids=None if on_cpu else [state.local_rank],
        )
        _owns = True
    return dataclasses.replace(state, device=jax.local_devices()[0])


def stop() -> None:
    """Shut ``jax.distributed`` down if dmatmul started it."""
    global _owns
    if _owns:
        jax.distributed.shutdown()
        _owns = False
