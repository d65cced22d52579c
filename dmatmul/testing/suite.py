"""The differential check as a user calls it: :func:`cases` (seeded draws)
and :func:`check` (draw, run on a backend, report)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .. import _runtime
from .case import NRANKS, Case
from .draw import NumpyChooser, draw_case
from .table import report
from .run import Outcome, combine, run_case

__all__ = ["cases", "check", "Report"]


def cases(seed: int = 0, n: int = 50, *, nranks: Sequence[int] = NRANKS, families: Sequence[str] = ("numpy", "jax"),
          mpi: bool = False, ndevices: int = max(NRANKS), start: int = 0) -> Iterator[Case]:
    """The cases ``start`` to ``start + n - 1`` of ``seed`` (those ``dmatmul check --seed`` runs): case ``i`` is
    drawn by ``NumpyChooser([seed, i])`` on a rank count of ``nranks`` that it chooses first, so the same seed
    always gives the same cases.

    >>> from dmatmul.testing import cases
    >>> [c.nranks for c in cases(seed=1, n=3, nranks=(2, 4))] == [c.nranks for c in cases(seed=1, n=3, nranks=(2, 4))]
    True
    """
    for i in range(start, start + n):
        chooser = NumpyChooser([seed, i])
        yield draw_case(chooser, chooser.choice(tuple(nranks)), families=families, mpi=mpi, ndevices=ndevices)


_cases = cases  # (check's argument of that name is a count)


@dataclasses.dataclass(frozen=True)
class Report:
    """What :func:`check` found: every case's :class:`~dmatmul.testing.Outcome`;
    ``str(report)`` is the table by layout family with the first failures."""

    outcomes: tuple[Outcome, ...]
    seed: int = 0

    @property
    def failures(self) -> int:
        """How many cases failed (0: the backend passed)."""
        return sum(o.status == "failed" for o in self.outcomes)

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "failed"]

    def __str__(self) -> str:
        return report(self.outcomes)


def where(backend: str, devices: int | None = None) -> tuple[tuple[int, ...], int, str]:
    """The rank counts :func:`check` draws on ``backend`` here, the devices it
    uses in one process, and a phrase saying where: under ``mpiexec -n P``
    the P processes; a backend of one rank per process (nvmath) one device;
    else up to ``devices`` of JAX's (default: all, at most 8), every rank
    count up to that."""
    from .. import backends

    rt = _runtime.active()
    if rt is not None and rt.size > 1:
        return (rt.size,), 1, f"{rt.size} processes (mpiexec)"
    if backends.info(backend).one_rank_per_process:  # nvmath: one process, one GPU; several ranks need mpiexec
        return (1,), 1, "1 GPU (one process; mpiexec -n P for more)"
    import jax

    ndev = min(max(NRANKS) if devices is None else devices, len(jax.devices()))
    ranks = tuple(sorted({p for p in NRANKS if p <= ndev} | {ndev}))
    return ranks, ndev, f"{ndev} {jax.devices()[0].platform.upper()} device(s), {len(ranks)} rank counts {ranks}"


def check(cases: int = 50, seed: int = 0, backend: str = "jax", devices: int | None = None, *,
          indices: Sequence[int] | None = None, log: Callable[[str], Any] | None = None,
          verbose: bool = False) -> Report:
    """Run ``cases`` random products of ``seed`` (or only the case numbers in
    ``indices``) on ``backend`` and compare each with the numpy reference.

    In one process the products run on up to ``devices`` of JAX's devices
    (default: all, at most 8; on CPU, start JAX with
    ``jax.config.update("jax_num_cpu_devices", 8)`` for more than one);
    under ``mpiexec -n P`` (after ``dm.init()``) every rank draws the same
    cases and passes its own blocks, and the outcomes are combined over the
    ranks (call it on every rank). ``log`` (e.g. ``print``) gets a line
    saying what runs and, with ``verbose``, one per case. A case's data comes
    from ``seed`` and its number, so a failure is reproduced by its number::

        import dmatmul.testing

        def test_dmatmul_passes_its_check():
            result = dmatmul.testing.check(cases=20, seed=1)
            assert result.failures == 0, str(result)
    """
    rt = _runtime.active()
    spmd = rt is not None and rt.size > 1
    ranks, ndev, here = where(backend, devices)
    say = log if log is not None and (rt is None or rt.rank == 0) else (lambda line: None)
    numbers = list(range(cases)) if indices is None else list(indices)
    families = ("numpy", "jax") if backend == "jax" else ("numpy",)
    say(f"dmatmul check: {len(numbers)} random products, seed {seed}, backend {backend}, on {here}")
    outcomes = []
    for i in numbers:
        case = next(_cases(seed, 1, nranks=ranks, families=families, mpi=spmd, ndevices=ndev, start=i))
        try:
            out = run_case(case, backend=backend, rng_seed=seed * 100_003 + i)
        except Exception as e:  # noqa: BLE001 - a bug of the check itself still counts
            out = Outcome(case, "failed", float("nan"), f"the check itself failed: {type(e).__name__}: {e}",
                          backend=backend, mpi=spmd)
        if spmd:
            assert rt is not None
            parts = rt.comm.allgather((out.status, out.ratio, out.message))
            out = combine([dataclasses.replace(out, status=s, ratio=r, message=m) for s, r, m in parts])
        outcomes.append(dataclasses.replace(out, label=f"{backend} #{i}"))
        if verbose:
            say(f"  #{i:<4d} {out.status:8s} {case.layout_family:16s} {out.message}")
    return Report(tuple(outcomes), seed)
