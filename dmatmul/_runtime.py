"""The multi-process runtime: MPI (mpi4py), and the backends' process groups.

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
* :func:`agree` runs a check on every rank and raises on every rank if it
  failed on any: no rank is left waiting in a collective.

This module knows no backend: what "starting" means is each backend's
``start`` (see :mod:`dmatmul.backends`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

__all__ = [
    "Runtime", "init", "finalize", "runtime", "active", "ensure", "world_size", "rank", "agree", "agree_and_share",
    "disagreement", "launched_size", "agreed_arguments", "finalizations",
]

T = TypeVar("T")
P = ParamSpec("P")

# launcher variables that give the number of processes (MPICH/Hydra, PMIx, Open MPI, Slurm, MVAPICH)
_SIZE_VARS = ("PMI_SIZE", "PMIX_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS")


@dataclasses.dataclass(frozen=True)
class Runtime:
    """The active multi-process run: this process's rank, the size, the communicator."""

    rank: int
    size: int
    comm: Any  # an mpi4py communicator
    local_rank: int
    device: Any = None  # this process's device, once a backend that has one started
    started: tuple[str, ...] = ()  # the backends whose process groups run on this runtime
    #: every rank's (node: the lowest rank on its node, rank on its node, what it told of its node for
    #: each backend: :func:`dmatmul.backends.node_view`), gathered once when the runtime starts
    nodes: tuple[tuple[int, int, tuple[tuple[str, Any], ...]], ...] = ()


_state: Runtime | None = None
_launched: int | None = None  # launched_size(), once read
_finalizations = 0  # how many times finalize() shut a runtime down in this process


def launched_size() -> int:
    """The process count a launcher announced in the environment (1 if none).

    Read at the first call and kept: a launcher sets it before the process
    starts, and every product asks (:func:`active`)."""
    global _launched
    if _launched is None:
        _launched = _read_launched_size()
    return _launched


def _read_launched_size() -> int:
    for var in _SIZE_VARS:
        value = os.environ.get(var)
        if value and value.isdigit():
            return int(value)
    return 1


def runtime() -> Runtime | None:
    """The active runtime, or None in a single-process run."""
    return _state


def active() -> Runtime | None:
    """The runtime, started implicitly (MPI only) when a launcher says P > 1; else None.

    A backend starts its process group when it first runs (:func:`ensure`),
    so an nvmath-only installation never imports JAX.
    """
    if _state is None and launched_size() > 1:
        return init(start=())
    return _state


def ensure(backend: str) -> Runtime:
    """The active runtime with ``backend``'s process group started (idempotent)."""
    global _state
    state = _state if _state is not None else init(start=())
    if backend not in state.started:
        from . import backends

        state = backends.get(backend).start(state)
        state = dataclasses.replace(state, started=state.started + (backend,))
        _state = state
    return state


def world_size() -> int | None:
    """Number of processes of the multi-process run, or None in one process.

    Before the runtime starts, the launcher's count is the answer (the size
    :func:`active` would start), so a distribution's shapes are the same
    before and after ``dm.init()`` or the first product.
    """
    if _state is not None:
        return _state.size
    launched = launched_size()
    return launched if launched > 1 else None


def rank() -> int:
    """This process's rank (0 in a single-process run)."""
    return 0 if _state is None else _state.rank


def _abort_on_uncaught(comm: Any) -> None:
    """An uncaught exception on one rank ends the whole job (as ``python -m mpi4py``)."""
    previous = sys.excepthook

    def hook(*exc: Any) -> None:
        previous(*exc)
        sys.stderr.flush()
        from . import _quiet

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
    global _state
    if _state is not None:
        if comm is not None and not _same_comm(comm, _state.comm):
            raise ValueError(
                f"dmatmul already runs on another communicator (size {_state.size}, this is rank {_state.rank}); "
                f"got comm of size {comm.Get_size()}: call dm.finalize() before dm.init(comm)"
            )
    else:
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise RuntimeError("dmatmul under mpiexec needs mpi4py: pip install 'dmatmul[mpi]'") from e
        from . import backends

        comm = MPI.COMM_WORLD if comm is None else comm
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        local_rank = local.Get_rank()
        node = local.allreduce(comm.Get_rank(), op=MPI.MIN)
        local.Free()
        # what each rank sees of its node (its GPUs), told to all now, while every rank is here: a
        # backend's verdict on the ranks' placement (nvmath: one GPU per rank) is then the same on
        # every rank, and asks no collective later, in a product one rank may leave early
        nodes = tuple(comm.allgather((node, local_rank, backends.node_view())))
        if comm.Get_size() > 1:
            _abort_on_uncaught(comm)
        _state = Runtime(rank=comm.Get_rank(), size=comm.Get_size(), comm=comm, local_rank=local_rank, nodes=nodes)
    for name in _default_start() if start is None else start:
        ensure(name)
    return _state


def _default_start() -> tuple[str, ...]:
    """The backend ``backend="auto"`` would run on, if any can run here."""
    from . import backends

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
    global _state, _finalizations
    if _state is not None:
        from . import backends

        for name in reversed(_state.started):
            backends.get(name).stop()
        _finalizations += 1
    _state = None


def finalizations() -> int:
    """How many times :func:`finalize` shut a runtime down in this process: a
    plan made under an earlier count ran on process groups that are gone."""
    return _finalizations


_AGREED_ERRORS = (TypeError, ValueError, RuntimeError, NotImplementedError, MemoryError)


def agree(check: Callable[[], T], what: str = "dmatmul") -> T:
    """Run ``check()`` on every rank; if it raised on any rank, raise on all.

    The failing rank re-raises its own error (of any type); the others raise
    the same type (dmatmul's own errors and those of :data:`_AGREED_ERRORS`; RuntimeError for others)
    with a message naming the failing rank and its error. In one process this
    is just ``check()``.
    """
    return agree_and_share(check, lambda _: None, what)[0]


def agree_and_share(
    check: Callable[[], T], share: Callable[[T], Any], what: str = "dmatmul"
) -> tuple[T, list[Any]]:
    """:func:`agree`, and in the same single allgather each rank's ``share(result)``.

    Returns ``(result, shared)`` with ``shared[r]`` what rank ``r`` shared
    (``[share(result)]`` in one process). One exchange carries both the
    verdicts and the data, so checking costs no extra collective. Ranks in
    different calls (``what``: one in ``Matmul.execute``, another in
    ``Matmul.reset_operands``) raise a ValueError on every rank naming them.
    """
    state = _state
    if state is None or state.size == 1:
        result = check()
        return result, [share(result)]
    failure: Exception | None = None
    try:
        result = check()  # unbound only when this rank failed, and then never read
    except Exception as e:  # noqa: BLE001 - any error: a rank that left before the allgather would hang the rest
        failure = e
    report = None if failure is None else (type(failure).__name__, str(failure))
    payload = None if failure is not None else share(result)
    gathered = state.comm.allgather((what, report, payload))
    bad = [(r, rep) for r, (_, rep, _) in enumerate(gathered) if rep is not None]
    if not bad:
        calls = disagreement([w for w, _, _ in gathered], "the call", verbs=("is in", "are in"))
        if calls is not None:  # (their payloads are of other calls: none is read)
            raise ValueError(f"{calls} (this is rank {state.rank}): every rank must make the same dmatmul calls, "
                             "in the same order")
        return result, [p for _, _, p in gathered]
    if failure is not None:
        raise failure
    first_rank, (name, message) = bad[0]
    from . import _errors

    ours = getattr(_errors, name, None)  # dmatmul's own errors (DistributionError, PlanFreedError) keep their type
    exc_type: type[Exception] = (
        ours if isinstance(ours, type) and issubclass(ours, Exception)
        else next((t for t in _AGREED_ERRORS if t.__name__ == name), RuntimeError)
    )
    others = [r for r, _ in bad[1:]]
    also = f" (and on rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))})" if others else ""
    raise exc_type(f"{what} failed on rank {first_rank}{also} (this is rank {state.rank}): {message}")


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


def require_same_call(calls: Sequence[Sequence[tuple[str, Any]]], what: str,
                      hint: str = "every rank must make the same call, only the local blocks differ",
                      verbs: tuple[str, str] = ("passes", "pass")) -> None:
    """Every rank's ``(field, value)`` pairs of one call (``calls[r]``, gathered):
    raise a ValueError, on every rank alike, naming the first field on which
    ranks differ and the ranks (``verbs``: see :func:`disagreement`), then ``hint``."""
    state = _state
    for i, (field, _) in enumerate(calls[0]):
        message = disagreement([call[i][1] for call in calls], field, verbs)
        if message is not None:
            here = f" (this is rank {state.rank})" if state is not None else ""
            raise ValueError(f"{what}: {message}{here}; {hint}")


def disagreement(values: list[Any], field: str, verbs: tuple[str, str] = ("passes", "pass")) -> str | None:
    """A message naming the ranks that differ on ``field``, or None if all agree
    (``verbs``: what one rank, and several, do with their value).

    >>> disagreement([1, 1, 2, 1], "alpha")
    'ranks disagree on alpha: rank 2 passes 2, ranks 0, 1, 3 pass 1'
    """
    groups: list[tuple[Any, list[int]]] = []
    for r, v in enumerate(values):
        for value, ranks in groups:
            if _same(value, v):
                ranks.append(r)
                break
        else:
            groups.append((v, [r]))
    if len(groups) == 1:
        return None
    groups.sort(key=lambda g: (len(g[1]), g[1][0]))  # the odd ones out first
    parts = [
        f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} {verbs[len(ranks) > 1]} {value!r}"
        for value, ranks in groups
    ]
    return f"ranks disagree on {field}: " + ", ".join(parts)


def _same(x: Any, y: Any) -> bool:
    """Equal values of one type; a NaN (alpha, beta) is the same as itself.

    >>> _same(float("nan"), float("nan")), _same(1.0, 1), _same(complex(1, float("nan")), complex(1, 0))
    (True, False, False)
    """
    if type(x) is not type(y):
        return False
    try:
        if bool(x == y):
            return True
    except Exception:  # noqa: BLE001 - incomparable values differ
        return False
    return isinstance(x, (float, complex)) and repr(x) == repr(y)  # NaN != NaN, yet both ranks pass it
