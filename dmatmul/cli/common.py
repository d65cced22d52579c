"""What the ``dmatmul`` commands share: the option types, the checks that end a
command in one line, the simulated CPU devices, and running a parsed command."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from .. import _cost, backends

__all__ = ["MAX_CPU_DEVICES", "DEFAULT_DEVICES", "at_least", "require_backend", "require_cost_model", "run_command",
           "start_jax_cpu"]

#: The most simulated CPU devices one process may ask for (``--devices``). JAX
#: starts 1024 in about a second and 300 MB; far more (100000) looked like a hang,
#: and a product over more devices than it has rows or columns is mostly empty blocks.
MAX_CPU_DEVICES = 1024
#: The simulated CPU devices of ``dmatmul demo`` and ``dmatmul check`` unless ``--devices`` says otherwise.
DEFAULT_DEVICES = 8



def start_jax_cpu(ndevices: int) -> Any:
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
    reason = backends.probe(name)
    if reason is not None:
        raise SystemExit(f"dmatmul {command}: backend {name!r} cannot run here: {reason}")


def require_cost_model(command: str) -> None:
    """Exit (status 1) with one line when the cost model file that plans
    ``algorithm="auto"`` cannot be read (``$DMATMUL_COST_MODEL``, else the
    calibration file): its error names the file, the field and the fixes."""
    try:
        _cost.load_models()
    except ValueError as e:
        raise SystemExit(f"dmatmul {command}: {e}") from None


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
