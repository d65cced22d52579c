"""The ``dmatmul`` command: ``info``, ``demo``, ``check`` and ``bench``.

``dmatmul demo`` runs every algorithm on simulated CPU devices (JAX), checks
each result against numpy and exits non-zero on any mismatch. ``dmatmul
check`` does the same for random products over the whole layout space.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ._spec import AlgorithmName

__all__ = ["main"]


def _start_jax_cpu(ndevices: int) -> Any:
    """Import JAX with ``ndevices`` simulated CPU devices (before JAX starts)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", ndevices)
    except RuntimeError as e:  # JAX already started by the caller
        if len(jax.devices("cpu")) < ndevices:
            raise SystemExit(f"dmatmul: JAX started with fewer than {ndevices} CPU devices: {e}") from None
    return jax


def require_backend(command: str, name: str = "jax") -> None:
    """Exit (status 1) with one line when backend ``name`` cannot run here:
    ``dmatmul demo: backend 'jax' cannot run here: jax not installed: pip install 'dmatmul[jax]'``."""
    from . import backends

    reason = backends.probe(name)
    if reason is not None:
        raise SystemExit(f"dmatmul {command}: backend {name!r} cannot run here: {reason}")


def require_cost_model(command: str) -> None:
    """Exit (status 1) with one line when the cost model file that plans
    ``algorithm="auto"`` cannot be read (``$DMATMUL_COST_MODEL``, else the
    calibration file): its error names the file, the field and the fixes."""
    from . import _cost

    try:
        _cost.load_models()
    except ValueError as e:
        raise SystemExit(f"dmatmul {command}: {e}") from None


def cmd_info(args: argparse.Namespace) -> int:
    from . import __version__, _runtime, backends

    if _runtime.launched_size() > 1:  # (every rank runs this): what each rank's node has decides for all
        _runtime.active()
    print(f"dmatmul {__version__}  (Python {platform.python_version()}, numpy {np.__version__})")
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


# the demo's cases: (algorithm, distributions of a, b, result, transpose_a, transpose_b, dtype)
def _demo_cases(dm: Any, nranks: int) -> list[tuple[AlgorithmName, tuple[Any, Any, Any], bool, bool, str]]:
    X, Y, R = dm.Slab.X, dm.Slab.Y, dm.Replicated()
    rows = max(r for r in range(1, int(nranks**0.5) + 1) if nranks % r == 0)
    col = dm.ProcessGrid((rows, nranks // rows), layout="col")
    row = dm.ProcessGrid((nranks // rows, rows))
    bc = dm.BlockCyclic(col, (64, 64))
    return [
        ("allgather", (X, Y, X), False, False, "float32"),
        ("allgather", (X, Y, Y), False, False, "float32"),
        ("allgather", (X, X, X), False, True, "float32"),
        ("reduce_scatter", (Y, X, Y), False, False, "float32"),
        ("reduce_scatter", (X, Y, Y), True, True, "float32"),
        ("allreduce", (Y, X, R), False, False, "float32"),
        ("local", (X, R, X), False, False, "float32"),
        ("auto", (Y, Y, X), False, False, "float32"),
        ("auto", (Y, Y, X), True, False, "float32"),
        ("summa", (bc, bc, bc), False, False, "float32"),  # 2-D block-cyclic on a column-major grid
        ("auto", (bc, X, Y), False, False, "float32"),  # mixed: a grid operand with slabs
        ("auto", (dm.BlockNonCyclic(row), bc, X), False, True, "float32"),  # operands on two grids
        ("auto", (X, Y, X), False, False, "float64"),
        ("auto", (Y, X, Y), True, False, "complex64"),
    ]


_DEMO_TOLERANCE = {"float32": 1e-5, "complex64": 1e-5, "float64": 1e-12}


def _short(d: Any) -> str:
    """A distribution in a table cell: ``BC(2x4 col, 64x64)`` (BlockCyclic), ``BNC(4x2)`` (BlockNonCyclic)."""
    grid = getattr(d, "grid", None)
    if grid is None:
        return repr(d)
    g = "x".join(map(str, grid.shape)) + (" col" if grid.layout == "col" else "")
    blocks = getattr(d, "block_sizes", None)
    return ("BC(" if blocks else "BNC(") + g + (f", {blocks[0]}x{blocks[1]})" if blocks else ")")


def cmd_demo(args: argparse.Namespace) -> int:
    """Every algorithm, 2-D grids, a redistribution, checked against numpy. In
    one process: global matrices on simulated CPU devices; under ``mpiexec -n
    P``: each rank its blocks."""
    from . import _runtime

    require_backend("demo")
    require_cost_model("demo")
    spmd = _runtime.launched_size() > 1
    if not spmd:
        _start_jax_cpu(args.devices)
    import dmatmul as dm

    rt = dm.init() if spmd else None
    rank, nranks = (rt.rank, rt.size) if rt else (0, args.devices)
    say = print if rank == 0 else (lambda *a, **k: None)
    rng = np.random.default_rng(0)  # the same global data on every rank
    m, n, k = args.m, args.n, args.k
    where = f"{nranks} processes (mpiexec)" if spmd else f"{nranks} simulated CPU devices"
    say(f"dmatmul demo: D = 0.5 * op(A) @ op(B) + 2 * C, M={m} N={n} K={k}, JAX backend on {where}")
    header = (f"{'algorithm':15s} {'ran':15s} {'a':18s} {'b':18s} {'result':18s} {'op':3s} {'dtype':9s} "
              f"{'max rel err':>11s} {'ms':>8s}")
    say(header)
    say("-" * len(header))
    failed = total = 0

    def report(algorithm: str, ran: str, dists: Any, op: str, dtype: str, err: float, ms: float) -> None:
        nonlocal failed, total
        if rt:
            err = max(rt.comm.allgather(err))
        ok = err < _DEMO_TOLERANCE[dtype]
        failed, total = failed + (not ok), total + 1
        cells = " ".join(f"{_short(d):18s}" for d in dists) + " " * 19 * (3 - len(dists))
        say(f"{algorithm:15s} {ran:15s} {cells} {op:3s} {dtype:9s} {err:11.2e} {ms:8.2f}{'' if ok else '  MISMATCH'}")

    def draw(shape: tuple[int, int], dtype: str) -> np.ndarray:
        x = rng.standard_normal(shape)
        if dtype.startswith("complex"):
            x = x + 1j * rng.standard_normal(shape)
        return x.astype(dtype)

    for algorithm, dists, ta, tb, dtype in _demo_cases(dm, nranks):
        a = draw((k, m) if ta else (m, k), dtype)
        b = draw((n, k) if tb else (k, n), dtype)
        c = draw((m, n), dtype)
        wide = np.complex128 if dtype.startswith("complex") else np.float64
        ref = 0.5 * (a.T if ta else a).astype(wide) @ (b.T if tb else b).astype(wide) + 2.0 * c
        if spmd:  # this rank's blocks in, this rank's block out
            a, b, c = (dm.split(x, d)[rank] for x, d in zip((a, b, c), dists))
            want = dm.split(ref, dists[2])[rank]
        else:
            want = ref
        with dm.Matmul(
            a, b, c, distribution=dists, alpha=0.5, beta=2.0, transpose_a=ta, transpose_b=tb,
            algorithm=algorithm, devices=None if spmd else args.devices, backend="jax",
        ) as mm:
            mm.execute()  # compile
            t0 = time.perf_counter()
            d = mm.execute()
            ms = (time.perf_counter() - t0) * 1e3
            ran = mm.algorithm
        err = float(np.abs(d - want).max() / np.abs(ref).max()) if d.size else 0.0
        report(algorithm, ran, dists, ("T" if ta else "N") + ("T" if tb else "N"), dtype, err, ms)

    # a redistribution: the last result's layout (block-cyclic) to Slab.Y, every element moved once
    src, dst = _demo_cases(dm, nranks)[9][1][0], dm.Slab.Y
    x = draw((m, n), "float32")
    given = dm.split(x, src)[rank] if spmd else x
    t0 = time.perf_counter()
    y = dm.redistribute(given, src, dst, **({} if spmd else {"devices": args.devices}))
    ms = (time.perf_counter() - t0) * 1e3
    want = dm.split(x, dst)[rank] if spmd else x
    err = float(np.abs(np.asarray(y) - want).max()) if want.size else 0.0
    report("redistribute", "exchange", (src, dst), "", "float32", err, ms)
    say(f"{total - failed} passed, {failed} failed")
    if rt:
        dm.finalize()
    return 1 if failed else 0


def _check_backends(choice: str) -> list[str]:
    """The backends ``dmatmul check --backend choice`` runs (raises SystemExit if none)."""
    from . import backends

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
    from . import _runtime

    spmd = _runtime.launched_size() > 1
    names = _check_backends(args.backend)
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
    from . import _check, backends
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


#: The most simulated CPU devices one process may ask for (``--devices``). JAX
#: starts 1024 in about a second and 300 MB; far more (100000) looked like a hang,
#: and a product over more devices than it has rows or columns is mostly empty blocks.
MAX_CPU_DEVICES = 1024
#: The simulated CPU devices of ``dmatmul demo`` and ``dmatmul check`` unless ``--devices`` says otherwise.
DEFAULT_DEVICES = 8


def at_least(least: int, most: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer no smaller than ``least`` (and no larger
    than ``most``; argparse then says which option and what was given, with the
    usage line)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {value}")
        if most is not None and value > most:
            raise argparse.ArgumentTypeError(f"expected an integer <= {most}, got {value}")
        return value

    parse.__name__ = f"integer >= {least}"  # argparse names the type in its message
    return parse


def main(argv: Sequence[str] | None = None) -> int:
    from ._version import __version__

    parser = argparse.ArgumentParser(prog="dmatmul", description=(__doc__ or "").splitlines()[0].replace("``", ""))
    parser.add_argument("--version", action="version", version=f"dmatmul {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="backends found, devices, MPI",
                          description="The backends, devices and MPI library found here.")
    info.add_argument("-v", "--verbose", action="store_true",
                      help="also what each backend found installed (versions) and each piece it lacks")
    info.set_defaults(func=cmd_info)
    demo = sub.add_parser(
        "demo", help="every algorithm on simulated CPU devices, checked against numpy",
        description="Every algorithm, 2-D block-cyclic grids, mixed layouts, float32/float64/complex64 and a "
        "redistribution on simulated CPU devices (under mpiexec -n P: P processes, each passing its own blocks), "
        "each result checked against numpy: a table, exit status 1 on any mismatch.",
    )
    demo.add_argument("--devices", type=at_least(1, MAX_CPU_DEVICES), default=DEFAULT_DEVICES,
                      help=f"simulated CPU devices (default {DEFAULT_DEVICES}, at most {MAX_CPU_DEVICES}); ignored under mpiexec "
                      "(one device per rank)")
    demo.add_argument("-m", type=at_least(0), default=1001, help="rows of the result (default 1001: uneven)")
    demo.add_argument("-n", type=at_least(0), default=768, help="columns of the result (default 768)")
    demo.add_argument("-k", type=at_least(0), default=517, help="inner dimension (default 517: prime-ish, uneven)")
    demo.set_defaults(func=cmd_demo)
    check = sub.add_parser(
        "check", help="random products over every layout, dtype and option, checked against numpy",
        description="Random products over the whole layout space (every distribution kind for a, b and the "
        "result, row- and column-major grids, operands on different grids, transposes, dtypes, alpha/beta/C, "
        "epilogs, named algorithms), checked against numpy: a table by layout family, exit status 1 on any "
        "failure. Under mpiexec -n P each rank passes its own blocks.",
    )
    check.add_argument("--cases", type=at_least(1), default=None, help="products per backend (default 50; --quick: 12)")
    check.add_argument("--seed", type=at_least(0), default=0, help="seed of the cases and data (default 0)")
    from . import backends

    check.add_argument("--backend", choices=(*backends.NAMES, "all-found"), default="auto",
                       help="auto: the first backend of the table that runs here (nvmath, else jax); all-found: "
                       "every backend that runs here")
    check.add_argument("--devices", type=at_least(1, MAX_CPU_DEVICES), default=DEFAULT_DEVICES,
                       help=f"devices in one process; on CPU, the simulated devices JAX makes "
                       f"(default {DEFAULT_DEVICES}, at most {MAX_CPU_DEVICES}); ignored under mpiexec (one device per rank)")
    check.add_argument("--quick", action="store_true", help="fewer cases")
    check.add_argument("--case", type=at_least(0), default=None, help="run only case number CASE of the seed")
    check.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    check.set_defaults(func=cmd_check)
    from . import _bench

    _bench.add_parser(sub)
    args = parser.parse_args(argv)
    return run_command(args, f"dmatmul {args.command}")


def run_command(args: argparse.Namespace, prog: str) -> int:
    """Run a parsed command; its exit status. The user's mistakes the options
    cannot catch end in one line on stderr, not a traceback."""
    try:
        return int(args.func(args))
    except BrokenPipeError:  # the reader went away (dmatmul info | head -3): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit must not raise again
        return 1
    except MemoryError as e:  # sizes this machine cannot hold (numpy says how much it asked for)
        print(f"{prog}: out of memory: {e}; use smaller sizes", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
