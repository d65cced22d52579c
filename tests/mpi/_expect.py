"""The scenario check the scripts of tests/mpi share (imported beside them:
``python tests/mpi/<script>.py`` puts this directory first on the path)."""

from __future__ import annotations

import pathlib
import sys
import time
from typing import Any, Callable, Sequence


def backend_from_argv() -> tuple[str, Any]:
    """The backend a script runs on, from its first argument: ``fake`` installs the
    simulated nvmath (tests/gpu/_fake_nvmath.py) and gives ``("nvmath", the fake's
    module)``; none or ``jax`` gives ``("jax", None)``. Called before dmatmul runs."""
    if (sys.argv[1] if len(sys.argv) > 1 else "jax") != "fake":
        return "jax", None
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "gpu"))
    import _fake_nvmath

    _fake_nvmath.install()
    return "nvmath", _fake_nvmath


def expect(rt: Any, problems: list[str], scenario: str, exc_type: Any, words: Sequence[str],
           call: Callable[[], Any], *, within: float = 10.0) -> bool:
    """``call()`` must raise ``exc_type`` whose message holds every one of
    ``words``, within ``within`` seconds; anything else is added to
    ``problems``. Then every rank learns whether any rank saw a problem so far
    (one allgather: every rank runs every scenario) and rank 0 prints ``ok
    <scenario>`` or ``FAILED <scenario>``; returns whether it was ok."""
    me = rt.rank
    start = time.monotonic()
    try:
        call()
    except exc_type as e:
        missing = [w for w in words if w not in str(e)]
        if missing:
            problems.append(f"rank {me} {scenario}: {missing} not in {type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - report what else came
        problems.append(f"rank {me} {scenario}: {type(e).__name__}: {e}")
    else:
        problems.append(f"rank {me} {scenario}: no error")
    took = time.monotonic() - start
    if took > within:
        problems.append(f"rank {me} {scenario}: took {took:.1f} s")
    ok = not any(rt.comm.allgather(problems))
    if me == 0:
        print(f"ok {scenario}" if ok else f"FAILED {scenario}", flush=True)
    return ok


def finish(rt: Any, problems: list[str]) -> None:
    """The end of a script: rank 0 prints ``ok still-in-step`` (or ``FAILED``)
    and every rank's problems; then ``dm.finalize()`` and exit 1 if any rank
    had one."""
    import dmatmul as dm

    everyone = rt.comm.allgather(problems)
    if rt.rank == 0:
        print("ok still-in-step" if not any(everyone) else "FAILED still-in-step", flush=True)
        for rank_problems in everyone:
            for line in rank_problems:
                print(line, flush=True)
    dm.finalize()
    sys.exit(1 if any(everyone) else 0)


def tally(rt: Any, failures: list[str], what: str) -> None:
    """The end of a checking script: rank 0 prints every rank's failures and
    ``<what> checks on P processes: N failures``; then ``dm.finalize()`` and
    exit 1 if any rank failed."""
    import dmatmul as dm

    everyone = rt.comm.allgather(failures)
    if rt.rank == 0:
        for f in (f for fs in everyone for f in fs):
            print("FAILED", f, flush=True)
        print(f"{what} checks on {rt.size} processes: {sum(map(len, everyone))} failures", flush=True)
    dm.finalize()
    sys.exit(1 if any(everyone) else 0)
