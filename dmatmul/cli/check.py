"""``dmatmul check``: random products over the whole layout space, checked
against numpy; exit status 1 on any failure."""

from __future__ import annotations

import argparse
import functools
import os

from .. import _runtime, backends
from .common import require_cost_model

__all__ = ["cmd_check", "check_backends"]


def check_backends(choice: str) -> list[str]:
    """The backends ``dmatmul check --backend choice`` runs (raises SystemExit if none)."""
    found = [row.name for row in backends.TABLE if backends.probe(row.name) is None]
    if choice == "all-found":
        names = found
    elif choice == "auto":  # the first row of the table that runs here, as backend="auto" takes
        names = found[:1] or [backends.TABLE[-1].name]  # (none: the last row's error names what to install)
    else:
        names = [choice]
    for name in names:
        reason = backends.probe(name)
        if reason is not None:
            raise SystemExit(f"dmatmul check: backend {name!r} cannot run here: {reason}")
    if not names:
        raise SystemExit("dmatmul check: no backend can run here: pip install 'dmatmul[jax]'")
    return names


def cmd_check(args: argparse.Namespace) -> int:
    """Random products over the whole layout space against numpy: in one
    process on this machine's devices (simulated CPU devices where JAX has
    no accelerator), or under ``mpiexec -n P`` with each rank's blocks."""
    spmd = _runtime.launched_size() > 1
    names = check_backends(args.backend)
    require_cost_model("check")
    if "nvmath" in names:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU to cuBLASMp too
    ndev = 1
    if "jax" in names and not spmd:
        import jax

        try:  # on CPU: simulated devices (a no-op for GPUs and TPUs)
            jax.config.update("jax_num_cpu_devices", args.devices)
        except RuntimeError:  # JAX already started by the caller: use what it has
            pass
        ndev = min(args.devices, len(jax.devices()))
    import dmatmul as dm
    from .. import testing

    rt = dm.init(start=("jax",) if "jax" in names else ()) if spmd else None
    rank = rt.rank if rt else 0
    say = functools.partial(print, flush=True) if rank == 0 else (lambda *a, **k: None)
    ncases = args.cases if args.cases is not None else (12 if args.quick else 50)
    indices = range(ncases) if args.case is None else [args.case]
    outcomes: list[testing.Outcome] = []
    for name in names:
        outcomes += testing.check(seed=args.seed, backend=name, devices=ndev, indices=indices, log=say,
                                  verbose=args.verbose).outcomes
    say(testing.report(outcomes))
    failed = sum(o.status == "failed" for o in outcomes)
    if failed:
        # the cases drawn depend on the seed, the case number, the backend and (in one process) the devices
        where = f"mpiexec -n {rt.size} " if rt else ""
        devices = "" if rt else f" --devices {args.devices}"
        say(f"reproduce one: {where}dmatmul check --seed {args.seed} --case <#> --backend <backend>{devices} -v")
    if rt:
        dm.finalize()
    return 1 if failed else 0
