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

from ... import _quiet

__all__ = ["start", "stop", "rank_devices", "start_problem"]

_owns = False  # dmatmul started jax.distributed (and shuts it down)
_stopped = False  # dmatmul shut it down: JAX cannot start it again in this process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _has_accelerator() -> bool:
    """Whether a GPU/TPU JAX backend is installed (checked without starting JAX)."""
    return any(importlib.util.find_spec(p) is not None for p in ("jax_cuda12_plugin", "jax_cuda13_plugin", "libtpu"))


def _jax_in_use() -> bool:
    """Whether JAX has started its backends in this process (after which
    ``jax.distributed`` can no longer be started); False where JAX does not say."""
    try:
        from jax._src.xla_bridge import backends_are_initialized
    except ImportError:  # pragma: no cover - a JAX without it: its own error says it later
        return False
    return bool(backends_are_initialized())


def start_problem(seen: list[tuple[bool, bool, int, int, bool]], size: int) -> str | None:
    """What stops dmatmul's ranks from running on ``jax.distributed``, from each
    rank's ``(running, used, process_index, process_count, stopped)``; None when
    nothing.

    >>> start_problem([(False, False, 0, 1, False), (False, True, 0, 1, False)], 2)[:58]
    'JAX was already in use on rank 1 before jax.distributed st'
    >>> start_problem([(True, False, 1, 2, False), (True, False, 0, 2, False)], 2) is None  # any process order
    True
    """
    stopped = [r for r, s in enumerate(seen) if s[4]]
    if stopped:
        return (f"dm.finalize() shut jax.distributed down on rank{'s' if len(stopped) > 1 else ''} "
                f"{', '.join(map(str, stopped))}, and JAX cannot start it again in the same process: call "
                "dm.finalize() once, at the end of the job")
    running = [r for r, s in enumerate(seen) if s[0]]
    if running and len(running) < size:
        idle = [r for r, s in enumerate(seen) if not s[0]]
        return (f"jax.distributed runs on rank(s) {running} but not on rank(s) {idle}: start it on every rank "
                "(jax.distributed.initialize(cluster_detection_method='mpi4py')), or on none and let dmatmul start it")
    if not running:
        used = [r for r, s in enumerate(seen) if s[1]]
        if used:
            return (f"JAX was already in use on rank{'s' if len(used) > 1 else ''} {', '.join(map(str, used))} before jax.distributed started; "
                    "under mpiexec it must start first: call dm.init() before any JAX operation (or start it "
                    "yourself first: jax.distributed.initialize(cluster_detection_method='mpi4py'))")
        return None
    counts = {s[3] for s in seen}
    indices = sorted(s[2] for s in seen)
    if counts != {size} or indices != list(range(size)):
        return (f"jax.distributed runs {sorted(counts)} process(es) but dmatmul's communicator has {size} ranks "
                f"(JAX process indices {[s[2] for s in seen]} by rank): dmatmul needs one JAX process per rank of "
                "its communicator; pass dm.init() the communicator JAX was started on")
    return None


#: The JAX process index of each rank of the runtime's communicator (a user's jax.distributed may number
#: its processes otherwise than the communicator its ranks).
_processes: tuple[int, ...] = ()


def start(state: Any) -> Any:
    """``jax.distributed`` across ``state``'s processes, unless it already runs
    there; ``state`` with this process's device. Every rank checks with the
    others first, so all start, or all raise the same error."""
    global _processes
    if state.size > 1:
        running = jax.distributed.is_initialized()
        mine = (running, not running and _jax_in_use(),
                jax.process_index() if running else 0, jax.process_count() if running else 0, _stopped)
        problem = start_problem(state.comm.allgather(mine), state.size)
        if problem is not None:
            raise RuntimeError(problem)
        if not running:
            _initialize(state)
        _processes = tuple(state.comm.allgather(jax.process_index()))
    device = jax.local_devices()[0]
    if state.size > 1 and device.platform == "cpu":
        # gloo, which runs JAX's collectives between CPU processes, prints a line for every communicator it
        # connects, at first use (dmatmul._quiet; DMATMUL_VERBOSE=1 keeps them)
        _quiet.start()
    return dataclasses.replace(state, device=device)


def rank_devices() -> tuple[jax.Device, ...]:
    """Every rank's device, in the order of the runtime communicator's ranks."""
    by_process = {d.process_index: d for d in jax.devices()}
    return tuple(by_process[p] for p in _processes if p in by_process)


def _initialize(state: Any) -> None:
    global _owns
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


def stop() -> None:
    """Shut ``jax.distributed`` down if dmatmul started it."""
    global _owns, _processes, _stopped
    _processes = ()
    if _owns:
        jax.distributed.shutdown()
        _owns, _stopped = False, True
