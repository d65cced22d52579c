"""The ``dmatmul bench`` command: its options and its entry points.

:func:`add_parser` registers ``bench`` (with ``--calibrate`` and ``--costs``)
on the ``dmatmul`` command line, :func:`finish_args` applies ``--quick`` and
checks the options, :func:`run` dispatches to calibration, the costs table,
or a timed run in one process (simulated devices) or under ``mpiexec``
(several processes) and reports it; :func:`main` is ``python -m
dmatmul.cli.bench``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from ... import _cost
from ..._spec import ALGORITHMS
from ..common import MAX_CPU_DEVICES, at_least, require_backend, require_cost_model, run_command
from .calibration import ensure_calibrated, run_calibrate, run_costs
from .devices import run_devices, start_jax
from .mpi import run_processes
from .peers import PEERS
from .problem import parse_layout
from .report import format_summary, run_meta, write_json, write_plot
from .timing import Result

DEFAULT_SIZES = (1024, 2048, 4096)
DEFAULT_DEVICES = (2, 4, 8)
DEFAULT_LAYOUTS = ("XYX", "YXY")
QUICK_SIZES = (512, 1024)
QUICK_DEVICES = (2, 8)
DESCRIPTION = "dmatmul bench: dmatmul side by side with its peers, in one run."


def _ints(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return out


def _device_counts(text: str) -> list[int]:
    out = _ints(text)
    if max(out) > MAX_CPU_DEVICES:
        raise argparse.ArgumentTypeError(f"expected device counts <= {MAX_CPU_DEVICES}, got {max(out)}")
    return out


def _names(text: str) -> list[str]:
    return [x for x in text.replace(" ", "").split(",") if x]


def _layouts(text: str) -> list[str]:
    names = _names(text)
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated layouts such as XYX,YXY; got {text!r}")
    for name in names:
        try:
            parse_layout(name)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return names


def _peers(text: str) -> list[str]:
    names = _names(text)
    unknown = [name for name in names if name not in PEERS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated peers from {', '.join(PEERS)} ('' for none); got {text!r}"
        )
    return names


def _algorithms(text: str) -> list[str]:
    names = _names(text)
    unknown = [a for a in names if a != "auto" and a not in ALGORITHMS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated algorithms from auto, {', '.join(ALGORITHMS)}; got {text!r}"
        )
    return names


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {value}")
    return value


def _output_path(text: str) -> str:
    """An output file whose directory exists ('' for none), checked before any timing."""
    folder = os.path.dirname(text)
    if text and folder and not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"directory {folder!r} of {text!r} does not exist")
    return text


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default only where it says something: not None, not a flag's False."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "bench",
        help="dmatmul against XLA's partitioned dot and numpy, side by side",
        description=DESCRIPTION,
        formatter_class=_HelpFormatter,
    )
    return _add_options(p)


def _add_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument(
        "--sizes", type=_ints, default=",".join(map(str, DEFAULT_SIZES)), help="square sizes n (M = N = K = n)"
    )
    p.add_argument(
        "--devices", type=_device_counts, default=",".join(map(str, DEFAULT_DEVICES)),
        help=f"simulated device counts (one process; at most {MAX_CPU_DEVICES}); ignored under mpiexec "
        "(one device per rank)",
    )
    p.add_argument(
        "--layouts", type=_layouts, default=",".join(DEFAULT_LAYOUTS),
        help="layouts of (a, b, result): letters X=Slab.X, Y=Slab.Y, R=Replicated(), "
        "G=BlockNonCyclic on the squarest 2-D grid",
    )
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "float64"),
                   help="element type of a, b and the result (numpy's peer runs float32 for the half precisions)")
    p.add_argument("--reps", type=at_least(1), default=5, help="timed repetitions of every implementation")
    p.add_argument("--warmup", type=at_least(0), default=1, help="untimed runs after the compiling first call")
    p.add_argument(
        "--algorithms", type=_algorithms, default=None,
        help="dmatmul algorithms to time (default: auto and every named one that fits)",
    )
    p.add_argument("--peers", type=_peers, default=",".join(PEERS), help="peers to time")
    p.add_argument("--json", type=_output_path, default="dmatmul-bench.json", metavar="PATH",
                   help="JSON output ('' for none)")
    p.add_argument("--plot", type=_output_path, default="dmatmul-bench.png", metavar="PATH",
                   help="PNG plot ('' for none)")
    p.add_argument(
        "--quick", action="store_true",
        help=f"a short run: sizes {','.join(map(str, QUICK_SIZES))}, devices "
        f"{','.join(map(str, QUICK_DEVICES))}, 3 repetitions (unless given)",
    )
    p.add_argument(
        "--wait-idle", type=_fraction, default=None, metavar="FRACTION",
        help="on a shared machine: before every timed call, wait (up to 60 s) until other processes keep "
        "less than FRACTION of the CPUs busy (e.g. 0.15; Linux /proc/stat)",
    )
    p.add_argument("--explain", action="store_true", help="print Matmul.explain() of every auto plan")
    only = p.add_mutually_exclusive_group()  # print the model, or measure it: not both
    only.add_argument(
        "--costs", action="store_true",
        help="print the cost model of every algorithm and layout (bytes, messages, flops, extra memory, "
        "predicted time, lower bounds) for the sizes and device counts, and exit without timing",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    only.add_argument(
        "--sweep", action="store_true",
        help="time every route the planner could take (each algorithm's kernels, moves first included) on a "
        "sweep of shapes, layouts and dtypes on max(--devices) devices, and report where auto lands against "
        "the fastest measured (--sizes, --layouts, --dtype and --peers do not apply)",
    )
    p.add_argument("--sweep-scale", type=float, default=1.0, metavar="S",
                   help="--sweep: every case's sizes times S (1: about 0.5-2 GFLOP a case)")
    p.add_argument("--sweep-routes", choices=("best", "all"), default="best",
                   help="--sweep: of each (algorithm, schedule) the route the model prices cheapest, or all")
    p.add_argument("--sweep-filter", default="", metavar="WORDS",
                   help="--sweep: only the cases whose name holds every word (e.g. 'tall bfloat16')")
    p.add_argument("--sweep-autotune", action="store_true",
                   help="--sweep: also run Matmul.autotune() on each case and report where its route lands")
    only.add_argument(
        "--calibrate", action="store_true",
        help="measure alpha/beta/gamma on this machine (per device count) and save them for algorithm='auto'",
    )
    p.add_argument(
        "--model-out", default=None, metavar="PATH",
        help=f"where --calibrate writes (default ${_cost.MODEL_ENV} or ~/.cache/dmatmul/cost_model.json)",
    )
    p.set_defaults(func=run, bench_parser=p)  # finish_args reports a usage error with this parser's usage
    return p


def _usage_error(args: argparse.Namespace, message: str) -> None:
    parser = getattr(args, "bench_parser", None)
    if parser is None:
        raise SystemExit(f"dmatmul bench: error: {message}")
    parser.error(message)  # exit status 2, with the usage line


def finish_args(args: argparse.Namespace) -> argparse.Namespace:
    """Check the options argparse cannot check one by one (before JAX starts)
    and apply --quick to the options left at their defaults."""
    if args.model_out is not None and not args.calibrate:
        _usage_error(args, "argument --model-out: only with --calibrate (where the calibration is saved)")
    if args.calibrate:  # where it is saved, checked before measuring
        target = args.model_out if args.model_out is not None else _cost.calibration_path()
        if target is None:
            _usage_error(args, f"argument --calibrate: {_cost.MODEL_ENV}={os.environ.get(_cost.MODEL_ENV)!r} names "
                         "no file to save the calibration to: give --model-out PATH, or unset it")
        elif not str(target) or os.path.isdir(os.path.expanduser(target)):
            via = "argument --model-out" if args.model_out is not None else f"argument --calibrate: {_cost.MODEL_ENV}"
            _usage_error(args, f"{via}: expected a file to save the calibration to, got {str(target)!r}")
    if not args.sweep and (args.sweep_scale != 1.0 or args.sweep_routes != "best" or args.sweep_filter
                           or args.sweep_autotune):
        _usage_error(args, "arguments --sweep-scale, --sweep-routes, --sweep-filter, --sweep-autotune: only with "
                     "--sweep")
    if args.sweep and args.sweep_scale <= 0:
        _usage_error(args, f"argument --sweep-scale: expected a positive factor, got {args.sweep_scale}")
    if args.sweep and args.json == "dmatmul-bench.json":  # its own file: a bench's JSON has other rows
        args.json = "dmatmul-sweep.json"
    if args.quick:
        if args.sizes == list(DEFAULT_SIZES):
            args.sizes = list(QUICK_SIZES)
        if args.devices == list(DEFAULT_DEVICES):
            args.devices = list(QUICK_DEVICES)
        if args.reps == 5:
            args.reps = 3
    if args.reps < 1 or args.warmup < 0:
        raise SystemExit("dmatmul bench: --reps must be >= 1 and --warmup >= 0")
    return args


def run(args: argparse.Namespace) -> int:
    """Run ``dmatmul bench`` with parsed arguments; returns the exit status
    (1 if any result disagreed with the float64 reference)."""
    from ..._runtime import launched_size

    args = finish_args(args)
    if not args.costs:  # the costs table is pure Python; calibrating and timing run on JAX
        require_backend("bench")
    if args.calibrate:  # (it replaces a file that cannot be read)
        return run_calibrate(args)
    if not args.costs and launched_size() <= 1:  # this machine's constants, measured once (under mpiexec:
        ensure_calibrated(args.devices)           # rank 0's file, broadcast when the runtime starts)
    require_cost_model("bench")
    if args.costs:
        return run_costs(args)
    if args.sweep:
        if launched_size() > 1:
            raise SystemExit("dmatmul bench --sweep: runs in one process (simulated devices), not under mpiexec")
        from .sweep import run_sweep

        return run_sweep(args)
    mode = "processes" if launched_size() > 1 else "devices"
    results: list[Result] = []
    is_root = True
    meta: dict[str, Any] = {}

    def flush() -> None:
        if is_root and args.json and results:
            write_json(args.json, results, meta)

    if mode == "processes":
        import dmatmul as dm

        is_root = dm.init().rank == 0
    else:
        start_jax(max(args.devices))
    meta.update(run_meta(args, mode))
    if is_root:
        where = (
            f"{launched_size()} processes" if mode == "processes" else f"{','.join(map(str, args.devices))} devices"
        )
        print(
            f"dmatmul bench: sizes {','.join(map(str, args.sizes))}, {where}, layouts {','.join(args.layouts)}, "
            f"{args.dtype}, {args.reps} interleaved repetitions after {args.warmup} warm-up; "
            f"'x P' = P's median time / this one's (> 1: faster than P)\n",
            flush=True,
        )
    if mode == "processes":
        run_processes(args, results, flush)
    else:
        run_devices(args, results, flush)
    if not is_root:
        import dmatmul as dm

        dm.finalize()
        return 0
    print(format_summary(results))
    flush()
    if args.json:
        print(f"wrote {args.json}")
    if args.plot:
        msg = write_plot(args.plot, results)
        print(msg or f"wrote {args.plot}")
    if mode == "processes":
        import dmatmul as dm

        dm.finalize()
    bad = [r for r in results if r.note and r.note.startswith("MISMATCH")]
    return 1 if bad else 0


def main(
    argv: Sequence[str] | None = None, *, prog: str = "dmatmul bench", description: str = DESCRIPTION,
    defaults: dict[str, str] | None = None,
) -> int:
    """``python -m dmatmul.cli.bench [options]``: the bench without the ``dmatmul`` CLI.

    A script that wraps it (``benchmarks/mpi_bench.py``) names itself with
    ``prog`` and ``description`` and sets its own ``defaults`` (option
    destinations to their text, as on the command line), which ``--help`` shows.
    """
    parser = _add_options(argparse.ArgumentParser(prog=prog, description=description, formatter_class=_HelpFormatter))
    if defaults:
        parser.set_defaults(**defaults)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return run_command(args, prog)
