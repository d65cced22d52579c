"""The ``dmatmul`` command: ``info``, ``demo``, ``check``, ``bench`` and ``plan``.

``dmatmul demo`` runs every algorithm on simulated CPU devices (JAX), checks
each result against numpy and exits non-zero on any mismatch. ``dmatmul
check`` does the same for random products over the whole layout space.

One module per command (:mod:`.info`, :mod:`.demo`, :mod:`.check`, :mod:`.plan`,
and the package :mod:`.bench`), what they share in :mod:`.common`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .. import _version, backends
from . import bench, check, demo, info, plan
from .common import DEFAULT_DEVICES, MAX_CPU_DEVICES, at_least, run_command

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dmatmul", description=(__doc__ or "").splitlines()[0].replace("``", ""))
    parser.add_argument("--version", action="version", version=f"dmatmul {_version.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    info_cmd = sub.add_parser("info", help="backends found, devices, MPI",
                              description="The backends, devices and MPI library found here.")
    info_cmd.add_argument("-v", "--verbose", action="store_true",
                          help="also what each backend found installed (versions) and each piece it lacks")
    info_cmd.set_defaults(func=info.cmd_info)
    demo_cmd = sub.add_parser(
        "demo", help="every algorithm on simulated CPU devices, checked against numpy",
        description="Every algorithm, 2-D block-cyclic grids, mixed layouts, float32/float64/complex64 and a "
        "redistribution on simulated CPU devices (under mpiexec -n P: P processes, each passing its own blocks), "
        "each result checked against numpy: a table, exit status 1 on any mismatch.",
    )
    demo_cmd.add_argument("--devices", type=at_least(1, MAX_CPU_DEVICES), default=DEFAULT_DEVICES,
                          help=f"simulated CPU devices (default {DEFAULT_DEVICES}, at most {MAX_CPU_DEVICES}); "
                          "ignored under mpiexec (one device per rank)")
    demo_cmd.add_argument("-m", type=at_least(0), default=1001, help="rows of the result (default 1001: uneven)")
    demo_cmd.add_argument("-n", type=at_least(0), default=768, help="columns of the result (default 768)")
    demo_cmd.add_argument("-k", type=at_least(0), default=517, help="inner dimension (default 517: prime-ish, uneven)")
    demo_cmd.set_defaults(func=demo.cmd_demo)
    check_cmd = sub.add_parser(
        "check", help="random products over every layout, dtype and option, checked against numpy",
        description="Random products over the whole layout space (every distribution kind for a, b and the "
        "result, row- and column-major grids, operands on different grids, transposes, dtypes, alpha/beta/C, "
        "epilogs, named algorithms), checked against numpy: a table by layout family, exit status 1 on any "
        "failure. Under mpiexec -n P each rank passes its own blocks.",
    )
    check_cmd.add_argument("--cases", type=at_least(1), default=None,
                           help="products per backend (default 50; --quick: 12)")
    check_cmd.add_argument("--seed", type=at_least(0), default=0, help="seed of the cases and data (default 0)")
    check_cmd.add_argument("--backend", choices=(*backends.NAMES, "all-found"), default="auto",
                           help="auto: the first backend of the table that runs here (nvmath, else jax); all-found: "
                           "every backend that runs here")
    check_cmd.add_argument("--devices", type=at_least(1, MAX_CPU_DEVICES), default=DEFAULT_DEVICES,
                           help=f"devices in one process; on CPU, the simulated devices JAX makes "
                           f"(default {DEFAULT_DEVICES}, at most {MAX_CPU_DEVICES}); ignored under mpiexec "
                           "(one device per rank)")
    check_cmd.add_argument("--quick", action="store_true", help="fewer cases")
    check_cmd.add_argument("--case", type=at_least(0), default=None, help="run only case number CASE of the seed")
    check_cmd.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    check_cmd.set_defaults(func=check.cmd_check)
    bench.add_parser(sub)
    plan.add_parser(sub)
    args = parser.parse_args(argv)
    return run_command(args, f"dmatmul {args.command}")
