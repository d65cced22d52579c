"""The process world: the active multi-process run, this process's rank and the size.

The bottom of the runtime: it knows no backend and starts nothing.
:mod:`dmatmul._runtime` (above :mod:`dmatmul.backends`) starts MPI and the
backends' process groups and records the run here (:func:`begin`,
:func:`end`); a distribution reads the size for its
``nranks=None`` default (:func:`world_size`), and every layer runs its
checks on all ranks through :func:`agree`.

* :func:`agree` runs a check on every rank and raises on every rank if it
  failed on any: no rank is left waiting in a collective.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from . import _errors

__all__ = [
    "Runtime", "runtime", "world_size", "rank", "launched_size", "finalizations", "begin", "end",
    "agree", "agree_and_share", "require_same_call", "disagreement",
]

T = TypeVar("T")

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
    #: rank 0's calibration of the cost model (:func:`dmatmul._cost.share_calibration`), broadcast when the
    #: runtime starts, so that every rank plans with the same constants; a str: why rank 0 could not read it
    cost_models: Any = None


_state: Runtime | None = None
_launched: int | None = None  # launched_size(), once read
_finalizations = 0  # how many times end() closed a run in this process


def launched_size() -> int:
    """The process count a launcher announced in the environment (1 if none).

    Read at the first call and kept: a launcher sets it before the process
    starts, and every product asks (:func:`dmatmul._runtime.active`)."""
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


def world_size() -> int | None:
    """Number of processes of the multi-process run, or None in one process.

    Before the runtime starts, the launcher's count is the answer (the size
    :func:`dmatmul._runtime.active` would start), so a distribution's shapes are the same
    before and after ``dm.init()`` or the first product.
    """
    if _state is not None:
        return _state.size
    launched = launched_size()
    return launched if launched > 1 else None


def rank() -> int:
    """This process's rank (0 in a single-process run)."""
    return 0 if _state is None else _state.rank


def begin(state: Runtime) -> Runtime:
    """Record the run :func:`dmatmul._runtime.init` started."""
    global _state
    _state = state
    return state


def end() -> None:
    """Forget the active run (:func:`dmatmul._runtime.finalize` shut its process groups down)."""
    global _state, _finalizations
    if _state is not None:
        _finalizations += 1
    _state = None


def finalizations() -> int:
    """How many times :func:`dmatmul.finalize` shut a runtime down in this process: a
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
    ours = getattr(_errors, name, None)  # dmatmul's own errors (DistributionError, PlanFreedError) keep their type
    exc_type: type[Exception] = (
        ours if isinstance(ours, type) and issubclass(ours, Exception)
        else next((t for t in _AGREED_ERRORS if t.__name__ == name), RuntimeError)
    )
    others = [r for r, _ in bad[1:]]
    also = f" (and on rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))})" if others else ""
    raise exc_type(f"{what} failed on rank {first_rank}{also} (this is rank {state.rank}): {message}")


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
