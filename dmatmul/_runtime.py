"""Starting the multi-process runtime: MPI (mpi4py), and the backends' process groups.

One rank = one process = one device. A single-process run never touches MPI:
:func:`active` looks at the launcher's environment first and imports mpi4py
only when a launcher says there are several processes.

* :func:`init` starts the runtime explicitly (optionally on a communicator the
  caller owns) with the process group of the backend products will use
  (``jax.distributed`` for JAX); :func:`finalize` shuts those down again.
* Otherwise the first distributed call under ``mpiexec -n P`` (P > 1) starts
  MPI implicitly on ``MPI.COMM_WORLD``, and each backend starts its own
  process group before its first product (:func:`ensure`), when the first
  ``Matmul`` on it is made (every rank is there: not in a plan, which one
  rank may make alone to answer ``mm.explain()``).

This module sits above :mod:`dmatmul.backends`: what "starting" means is each
backend's ``start``. The run it starts is recorded in :mod:`dmatmul._world`
(which knows no backend, and which distributions read); the names of that
module (:func:`rank`, :func:`world_size`, :func:`agree`...) are re-exported here.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from . import _cost, _quiet, _world, backends
from ._world import (
    Runtime,
    agree,
    agree_and_share,
    disagreement,
    finalizations,
    launched_size,
    rank,
    require_same_call,
    runtime,
    world_size,
)

__all__ = [
    "Runtime", "init", "finalize", "runtime", "active", "ensure", "world_size", "rank", "agree", "agree_and_share",
    "disagreement", "launched_size", "agreed_arguments", "finalizations", "require_same_call",
]

T = TypeVar("T")
P = ParamSpec("P")


def active() -> Runtime | None:
    """The runtime, started implicitly (MPI only) when a launcher says P > 1; else None.

    A backend starts its process group when it first runs (:func:`ensure`),
    so an nvmath-only installation never imports JAX.
    """
    state = _world.runtime()
    if state is None and launched_size() > 1:
        return init(start=())
    return state


def ensure(backend: str) -> Runtime:
    """The active runtime with ``backend``'s process group started (idempotent)."""
    state = _world.runtime()
    if state is None:
        state = init(start=())
    if backend not in state.started:
        state = backends.get(backend).start(state)
        state = _world.begin(dataclasses.replace(state, started=state.started + (backend,)))
    return state


def _abort_on_uncaught(comm: Any) -> None:
    """An uncaught exception on one rank ends the whole job (as ``python -m mpi4py``)."""
    previous = sys.excepthook

    def hook(*exc: Any) -> None:
        previous(*exc)
        sys.stderr.flush()
        _quiet.stop()  # what this rank wrote to stdout reaches it before the job ends
        comm.Abort(1)

    sys.excepthook = hook


def init(comm: Any = None, *, start: Sequence[str] | None = None) -> Runtime:
    """Start the multi-process runtime on ``comm`` (default ``MPI.COMM_WORLD``).

    ``start``: the backends whose process groups to start now; None (the
    default) starts the one ``backend="auto"`` runs on here, when one can run
    (on CPU: ``jax.distributed`` with one CPU device per process; with
    nvmath-python and a GPU: nvmath's NCCL communicator); ``()`` starts MPI
    only (a backend then starts when it first runs). Idempotent. Returns
    the :class:`Runtime`.
    """
    state = _world.runtime()
    if state is not None:
        if comm is not None and not _same_comm(comm, state.comm):
            raise ValueError(
                f"dmatmul already runs on another communicator (size {state.size}, this is rank {state.rank}); "
                f"got comm of size {comm.Get_size()}: call dm.finalize() before dm.init(comm)"
            )
    else:
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise RuntimeError("dmatmul under mpiexec needs mpi4py: pip install 'dmatmul[mpi]'") from e
        comm = MPI.COMM_WORLD if comm is None else comm
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        local_rank = local.Get_rank()
        node = local.allreduce(comm.Get_rank(), op=MPI.MIN)
        local.Free()
        # what each rank sees of its node (its GPUs), told to all now, while every rank is here: a
        # backend's verdict on the ranks' placement (nvmath: one GPU per rank) is then the same on
        # every rank, and asks no collective later, in a product one rank may leave early
        nodes = tuple(comm.allgather((node, local_rank, backends.node_view())))
        models = _cost.share_calibration(comm)  # rank 0's constants: every rank plans alike
        if comm.Get_size() > 1:
            _abort_on_uncaught(comm)
        state = _world.begin(Runtime(rank=comm.Get_rank(), size=comm.Get_size(), comm=comm,
                                     local_rank=local_rank, nodes=nodes, cost_models=models))
    for name in _default_start() if start is None else start:
        state = ensure(name)
    return state


def _default_start() -> tuple[str, ...]:
    """The backend ``backend="auto"`` would run on, if any can run here."""
    try:
        return (backends.resolve("auto").name,)
    except RuntimeError:  # no backend installed: MPI only
        return ()


def _same_comm(a: Any, b: Any) -> bool:
    """Whether two mpi4py communicators are the same group of processes in the same order."""
    if a is b:
        return True
    from mpi4py import MPI

    return bool(MPI.Comm.Compare(a, b) in (MPI.IDENT, MPI.CONGRUENT))


def finalize() -> None:
    """Shut down the process groups :func:`init` (or a first product) started; MPI stays up."""
    state = _world.runtime()
    if state is not None:
        for name in reversed(state.started):
            backends.get(name).stop()
    _world.end()


def agreed_arguments(what: str) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Decorate a call every rank makes together: arguments that do not bind on
    one rank (a misspelt keyword, one positional too many) raise their
    TypeError on every rank, where Python would raise it before the call's own
    checks, on that rank alone, and leave the others waiting in the product.

    The failing rank joins the first collective the others make in the call:
    the :func:`agree` that checks its arguments (``_matmul._validate``,
    ``Matmul.execute``, ``Matmul.reset_operands``).
    """

    def decorate(f: Callable[P, T]) -> Callable[P, T]:
        signature: inspect.Signature | None = None
        # whether a call binds depends only on how many arguments come by position and which keywords
        # are named, never on the values: the shapes of call that bound once are not bound again
        bound: set[tuple[int, frozenset[str]]] = set()

        @functools.wraps(f)
        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            nonlocal signature
            shape = (len(args), frozenset(kwargs))
            if shape in bound:
                return f(*args, **kwargs)
            if signature is None:  # read at the first call: a __signature__ set after decoration is the one bound
                signature = inspect.signature(call)
            try:
                signature.bind(*args, **kwargs)
                bound.add(shape)
            except TypeError as e:
                failure = TypeError(f"{what}: {e}")
                state = active()
                if state is not None and state.size > 1:

                    def fail() -> None:
                        raise failure

                    agree(fail, what)
                raise failure from None
            return f(*args, **kwargs)

        return call

    return decorate
