"""``dmatmul check``: random products over the whole layout space, checked
against numpy; exit status 1 on any failure."""

from __future__ import annotations

import argparse
import dataclasses
import os

from .. import _check, _runtime, backends
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

    rt = dm.init(start=("jax",) if "jax" in names else ()) if spmd else None
    rank = rt.rank if rt else 0
    say = print if rank == 0 else (lambda *a, **k: None)
    ncases = args.cases if args.cases is not None else (12 if args.quick else 50)
    indices = range(ncases) if args.case is None else [args.case]
    outcomes = []
    for name in names:
        if rt:
            ranks: tuple[int, ...] = (rt.size,)
            where = f"{rt.size} processes (mpiexec)"
        elif backends.info(name).one_rank_per_process:  # nvmath: one process, one GPU; several ranks need mpiexec
            ranks, where = (1,), "1 GPU (one process; mpiexec -n P for more)"
        else:
            import jax

            ranks = tuple(sorted({p for p in _check.NRANKS if p <= ndev} | {ndev}))
            where = f"{ndev} {jax.devices()[0].platform.upper()} device(s), {len(ranks)} rank counts {ranks}"
        families = ("numpy", "jax") if name == "jax" else ("numpy",)
        say(f"dmatmul check: {len(indices)} random products, seed {args.seed}, backend {name}, on {where}",
            flush=True)
        for i in indices:
            chooser = _check.NumpyChooser([args.seed, i])
            case = _check.draw_case(chooser, chooser.choice(ranks), families=families, mpi=rt is not None,
                                    ndevices=ndev)
            try:
                out = _check.run_case(case, backend=name, rng_seed=args.seed * 100_003 + i)
            except Exception as e:  # noqa: BLE001 - a bug of the check itself still counts
                out = _check.Outcome(case, "failed", float("nan"), f"the check itself failed: {type(e).__name__}: {e}",
                                     backend=name, mpi=rt is not None)
            if rt:
                parts = rt.comm.allgather((out.status, out.ratio, out.message))
                out = _check.combine([dataclasses.replace(out, status=s, ratio=r, message=m) for s, r, m in parts])
            outcomes.append(dataclasses.replace(out, label=f"{name} #{i}"))
            if args.verbose:
                say(f"  #{i:<4d} {out.status:8s} {case.layout_family:16s} {out.message}", flush=True)
    say(_check.report(outcomes))
    failed = sum(o.status == "failed" for o in outcomes)
    if failed:
        # the cases drawn depend on the seed, the case number, the backend and (in one process) the devices
        where = f"mpiexec -n {rt.size} " if rt else ""
        devices = "" if rt else f" --devices {args.devices}"
        say(f"reproduce one: {where}dmatmul check --seed {args.seed} --case <#> --backend <backend>{devices} -v")
    if rt:
        dm.finalize()
    return 1 if failed else 0
