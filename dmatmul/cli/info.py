"""``dmatmul info``: the backends, devices and MPI library found here."""

from __future__ import annotations

import argparse
import importlib.util
import platform

import numpy as np

from .. import _runtime, _version, backends
from .common import DEFAULT_DEVICES

__all__ = ["cmd_info"]


def cmd_info(args: argparse.Namespace) -> int:
    if _runtime.launched_size() > 1:  # (every rank runs this): what each rank's node has decides for all
        _runtime.active()
    print(f"dmatmul {_version.__version__}  (Python {platform.python_version()}, numpy {np.__version__})")
    reasons = {row.name: backends.probe(row.name) for row in backends.TABLE}
    auto = next((name for name, reason in reasons.items() if reason is None), None)
    hidden = 0
    for row in backends.TABLE:
        reason = reasons[row.name]
        skipped = backends.passed_over(row.name) if reason is not None else None
        status = ("available" if reason is None else
                  f"passed over: {skipped}" + (f" (backend='auto' runs {auto})" if auto else "")
                  if skipped is not None else "unavailable: " + reason)
        print(f"backend {row.name:7s}: {status}")
        # what is installed for it and each missing piece, as the backend reports it: a newcomer
        # without a GPU needs only the one line above, and -v tells the rest
        lines = backends.details(row.name)
        if args.verbose:
            for line in lines:
                print(f"  {line}")
        else:
            hidden += len(lines)
    if importlib.util.find_spec("jax") is not None:
        import jax

        devs = jax.devices()
        print(f"jax {jax.__version__}: {len(devs)} device(s): {', '.join(sorted({d.platform for d in devs}))}")
        # JAX starts with one CPU device, which is not what the demo runs on: say what it and check use
        if devs[0].platform == "cpu":
            print(f"demo/check: JAX on {DEFAULT_DEVICES} simulated CPU devices "
                  f"(--devices N: another count; mpiexec -n P: P processes)")
        else:
            print(f"demo: JAX on {DEFAULT_DEVICES} simulated CPU devices; check: on up to {DEFAULT_DEVICES} "
                  f"{devs[0].platform.upper()} devices (--devices N: another count; mpiexec -n P: P processes)")
    if importlib.util.find_spec("mpi4py") is not None:
        from mpi4py import MPI

        print(f"mpi4py: {MPI.Get_library_version().splitlines()[0].strip()}; world size {MPI.COMM_WORLD.Get_size()}")
    else:
        print("mpi4py: not installed (pip install 'dmatmul[mpi]')")
    if hidden:
        print("dmatmul info -v: what each backend found installed and what it lacks")
    return 0
