"""dmatmul bench: dmatmul side by side with its peers, in one run.

For every size, device count and layout the bench times, interleaved
(repetition ``r`` runs every implementation once, in a seeded random
order), after warm-up:

* ``dmatmul auto`` and ``dmatmul <algorithm>`` for each named algorithm that
  fits the layout: a planned :class:`dmatmul.Matmul` on ``jax.Array``
  operands already laid out as its distributions say (``execute()`` +
  ``jax.block_until_ready``);
* ``xla``: XLA's own partitioning, ``jax.jit(jnp.dot)`` on the same input
  arrays with the result distribution as ``out_shardings`` (mesh axes
  ``AxisType.Auto``);
* ``xla-1dev``: ``jax.jit(jnp.dot)`` of the whole problem on one device (the
  ceiling of any JAX path on a host whose devices share its cores);
* ``numpy``: numpy's single-process GEMM of the whole problem (float32 when
  the bench runs bfloat16/float16, which numpy has no GEMM for).

and reports median/min/max, GFLOP/s of the median, the ratio of each
implementation to each peer (``x numpy`` = numpy's time / this time: above 1
is faster), and for dmatmul the cost model's prediction, modelled bytes per
rank and their ratio to the lower bound. Results go to a terminal table, a
JSON file and a PNG plot (matplotlib, optional).

Under ``mpiexec -n P`` the same command runs as P processes (one CPU device
each): operands are each rank's blocks, ``xla`` is JAX's multi-process
``jit(jnp.dot)`` on global arrays with the same shardings, ``numpy`` runs in
a helper process of rank 0 with the whole machine while the other ranks
sleep (MPICH ranks busy-poll inside MPI calls, so no rank times anything
while another waits in one). Launch with ``-bind-to core`` and
``OPENBLAS_NUM_THREADS=1``.

``dmatmul bench --calibrate`` measures alpha (s/message), beta (s/byte) and
gamma (s/flop per rank) on this machine for each device count and saves them
where :func:`dmatmul._cost.model_for` finds them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _cost

__all__ = ["add_parser", "run", "main", "parse_layout", "Result"]

DEFAULT_SIZES = (1024, 2048, 4096)
DEFAULT_DEVICES = (2, 4, 8)
DEFAULT_LAYOUTS = ("XYX", "YXY")
QUICK_SIZES = (512, 1024)
QUICK_DEVICES = (2, 8)
PEERS = ("xla", "xla-1dev", "numpy")
# targets of the benchmark issue (8 simulated CPU devices, n = 2048 and 4096, float32)
TARGETS = {"xla": (1.0, 1.1), "numpy": (0.75, 0.85)}


# --------------------------------------------------------------------------- #
# command line
# --------------------------------------------------------------------------- #
def _ints(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return out


def _names(text: str) -> list[str]:
    return [x for x in text.replace(" ", "").split(",") if x]


def grid_shape(p: int) -> tuple[int, int]:
    """The squarest ``(rows, cols)`` grid of ``p`` ranks, ``rows <= cols``.

    >>> grid_shape(8), grid_shape(4), grid_shape(6), grid_shape(7)
    ((2, 4), (2, 2), (2, 3), (1, 7))
    """
    rows = max(r for r in range(1, math.isqrt(p) + 1) if p % r == 0)
    return rows, p // rows


def parse_layout(name: str, nranks: int | None = None) -> tuple[Any, Any, Any]:
    """``"XYX"`` -> ``(Slab.X, Slab.Y, Slab.X)``; letters X (rows), Y (columns),
    R (replicated), G (``BlockNonCyclic`` on the squarest grid of ``nranks``)
    for a, b and the result.

    >>> parse_layout("YXR")
    (Slab.Y, Slab.X, Replicated())
    >>> parse_layout("GGG", 8)[0]
    BlockNonCyclic(ProcessGrid((2, 4), layout='row'))
    """
    from .._distribution import BlockNonCyclic, ProcessGrid, Replicated, Slab

    letters: dict[str, Any] = {"X": Slab.X, "Y": Slab.Y, "R": Replicated()}
    key = name.strip().upper()
    if len(key) != 3 or any(c not in "XYRG" for c in key):
        raise ValueError(
            f"layout {name!r}: expected three letters from X (Slab.X), Y (Slab.Y), R (Replicated()), "
            "G (BlockNonCyclic on a 2-D grid) for a, b and the result, e.g. XYX, YXY or GGG"
        )
    if "G" in key:
        letters["G"] = BlockNonCyclic(ProcessGrid(grid_shape(nranks or 4)))
    return tuple(letters[c] for c in key)  # type: ignore[return-value]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "bench",
        help="dmatmul against XLA's partitioned dot and numpy, side by side",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--sizes", type=_ints, default=",".join(map(str, DEFAULT_SIZES)), help="square sizes n (M = N = K = n)"
    )
    p.add_argument(
        "--devices", type=_ints, default=",".join(map(str, DEFAULT_DEVICES)),
        help="simulated device counts (one process); ignored under mpiexec (one device per rank)",
    )
    p.add_argument(
        "--layouts", type=_names, default=",".join(DEFAULT_LAYOUTS),
        help="layouts of (a, b, result): letters X=Slab.X, Y=Slab.Y, R=Replicated(), "
        "G=BlockNonCyclic on the squarest 2-D grid",
    )
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "float64"))
    p.add_argument("--reps", type=int, default=5, help="timed repetitions of every implementation")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs after the compiling first call")
    p.add_argument(
        "--algorithms", type=_names, default=None,
        help="dmatmul algorithms to time (default: auto and every named one that fits)",
    )
    p.add_argument("--peers", type=_names, default=",".join(PEERS), help="peers to time")
    p.add_argument("--json", default="dmatmul-bench.json", metavar="PATH", help="JSON output ('' for none)")
    p.add_argument("--plot", default="dmatmul-bench.png", metavar="PATH", help="PNG plot ('' for none)")
    p.add_argument(
        "--quick", action="store_true",
        help=f"a short run: sizes {','.join(map(str, QUICK_SIZES))}, devices "
        f"{','.join(map(str, QUICK_DEVICES))}, 3 repetitions (unless given)",
    )
    p.add_argument(
        "--wait-idle", type=float, default=None, metavar="FRACTION",
        help="on a shared machine: before every timed call, wait (up to 60 s) until other processes keep "
        "less than FRACTION of the CPUs busy (e.g. 0.15; Linux /proc/stat)",
    )
    p.add_argument("--explain", action="store_true", help="print Matmul.explain() of every auto plan")
    p.add_argument(
        "--costs", action="store_true",
        help="print the cost model of every algorithm and layout (bytes, messages, flops, extra memory, "
        "predicted time, lower bounds) for the sizes and device counts, and exit without timing",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument(
        "--calibrate", action="store_true",
        help="measure alpha/beta/gamma on this machine (per device count) and save them for algorithm='auto'",
    )
    p.add_argument(
        "--model-out", default=None, metavar="PATH",
        help=f"where --calibrate writes (default ${_cost.MODEL_ENV} or ~/.cache/dmatmul/cost_model.json)",
    )
    p.set_defaults(func=run)
    return p


def _finish_args(args: argparse.Namespace) -> argparse.Namespace:
    """Apply --quick to the options left at their defaults."""
    if args.quick:
        if args.sizes == list(DEFAULT_SIZES):
            args.sizes = list(QUICK_SIZES)
        if args.devices == list(DEFAULT_DEVICES):
            args.devices = list(QUICK_DEVICES)
        if args.reps == 5:
            args.reps = 3
    for peer in args.peers:
        if peer not in PEERS:
            raise SystemExit(f"dmatmul bench: unknown peer {peer!r}; choose from {', '.join(PEERS)}")
    for name in args.layouts:
        try:
            parse_layout(name)
        except ValueError as e:
            raise SystemExit(f"dmatmul bench: {e}") from None
    if args.reps < 1 or args.warmup < 0:
        raise SystemExit("dmatmul bench: --reps must be >= 1 and --warmup >= 0")
    return args


# --------------------------------------------------------------------------- #
# results
# --------------------------------------------------------------------------- #
@dataclasses.dataclass
class Result:
    """The timings of one implementation on one problem."""

    impl: str  # "dmatmul:auto", "dmatmul:allgather", "xla", "xla-1dev", "numpy"
    n: int
    ranks: int
    layout: str
    dtype: str
    mode: str  # "devices" (one process) or "processes" (mpiexec)
    times: list[float] = dataclasses.field(default_factory=list)
    first_call_s: float | None = None
    algorithm: str | None = None  # the algorithm dmatmul ran
    predicted_s: float | None = None
    modelled_bytes: float | None = None
    messages: float | None = None
    lower_bound_bytes: float | None = None
    regime: str | None = None
    max_rel_err: float | None = None
    waited_s: float | None = None  # --wait-idle: time spent waiting for an idle machine
    note: str | None = None

    @property
    def flops(self) -> float:
        return 2.0 * self.n**3

    @property
    def median(self) -> float:
        return float(np.median(self.times))

    @property
    def gflops(self) -> float:
        return self.flops / self.median / 1e9

    @property
    def group(self) -> tuple[int, int, str, str, str]:
        return (self.n, self.ranks, self.layout, self.dtype, self.mode)

    def label(self) -> str:
        if self.impl == "dmatmul:auto":
            return f"dmatmul auto ({self.algorithm})"
        if self.impl.startswith("dmatmul:"):
            return f"dmatmul {self.impl.split(':', 1)[1]}"
        return {
            "xla": "xla jit(jnp.dot) partitioned",
            "xla-1dev": "xla jit(jnp.dot) 1 device",
            "numpy": "numpy (1 process)",
        }.get(self.impl, self.impl)

    def to_json(self, peers: dict[str, Result]) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(
            label=self.label(),
            flops=self.flops,
            median_s=self.median,
            min_s=float(min(self.times)),
            max_s=float(max(self.times)),
            gflops=self.gflops,
            ratio_to={name: p.median / self.median for name, p in peers.items()},
            paired_ratio_to={name: self.paired_ratio(p) for name, p in peers.items()},
        )
        return d

    def paired_ratio(self, peer: Result) -> float:
        """Median over repetitions of ``peer``'s time / this time in the same
        repetition: neighbours in time share the machine's load, so on a busy
        machine this is steadier than the ratio of medians."""
        if len(peer.times) != len(self.times) or not self.times:
            return peer.median / self.median
        return float(np.median(np.asarray(peer.times) / np.asarray(self.times)))


def _peers_of(results: Sequence[Result]) -> dict[str, Result]:
    return {r.impl: r for r in results if r.impl in PEERS}


# --------------------------------------------------------------------------- #
# progress bar (stderr, no dependency)
# --------------------------------------------------------------------------- #
class Progress:
    """A one-line progress bar with an ETA, weighted by each step's work."""

    def __init__(self, total: float, enabled: bool = True, stream: Any = None) -> None:
        self.total, self.done = max(total, 1e-12), 0.0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.perf_counter()
        self._drawn = -1.0
        self._last_line = ""

    def step(self, weight: float, label: str) -> None:
        self.done += weight
        if not self.tty:
            return
        frac = min(1.0, self.done / self.total)
        now = time.perf_counter()
        if now - self._drawn < 0.1 and frac < 1.0:  # at most ten redraws a second
            return
        self._drawn = now
        elapsed = now - self.start
        eta = elapsed / frac * (1 - frac) if frac > 0 else 0.0
        width = 24
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        line = f"[{bar}] {frac * 100:3.0f}%  {_fmt_duration(elapsed)} elapsed, ~{_fmt_duration(eta)} left  {label}"
        self.stream.write("\r" + line[:110].ljust(len(self._last_line[:110])))
        self.stream.flush()
        self._last_line = line

    def note(self, text: str) -> None:
        """A message line (the bar is redrawn on the next step)."""
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r" + " " * min(110, len(self._last_line)) + "\r")
        self.stream.write(text + "\n")
        self.stream.flush()

    def clear(self) -> None:
        """Erase the bar (before printing on stdout; it is redrawn on the next step)."""
        if self.tty:
            self.stream.write("\r" + " " * min(110, len(self._last_line)) + "\r")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r" + " " * min(110, len(self._last_line)) + "\r")
            self.stream.flush()


def _fmt_duration(s: float) -> str:
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f}s"
    return f"{int(s // 60)}m{int(s % 60):02d}s"


# --------------------------------------------------------------------------- #
# timing
# --------------------------------------------------------------------------- #
def busy_fraction(window: float = 0.3) -> float | None:
    """Fraction of the machine's CPU time spent busy over ``window`` seconds
    (``/proc/stat``; None where there is none). Called while this process
    idles, it measures everyone else."""
    def read() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle

    first = read()
    if first is None:
        return None
    time.sleep(window)
    second = read()
    if second is None:
        return None
    total, idle = second[0] - first[0], second[1] - first[1]
    return None if total <= 0 else max(0.0, 1.0 - idle / total)


class IdleWaiter:
    """Before each timed call, wait (up to ``timeout`` s) until other processes
    keep less than ``max_busy`` of the machine busy: on a shared machine this
    keeps load bursts out of the samples. Records the total time waited."""

    def __init__(self, max_busy: float, timeout: float = 60.0) -> None:
        self.max_busy, self.timeout = max_busy, timeout
        self.waited = 0.0
        self.gave_up = 0

    def __call__(self) -> None:
        t0 = time.perf_counter()
        while True:
            busy = busy_fraction()
            if busy is None or busy <= self.max_busy:
                break
            if time.perf_counter() - t0 > self.timeout:
                self.gave_up += 1
                break
        self.waited += time.perf_counter() - t0


Runner = Callable[[], Any]


def rep_order(names: Sequence[str], r: int) -> list[str]:
    """The order of repetition ``r``: a permutation drawn from a fixed seed
    (the same on every rank), so no implementation always follows the same
    one. (A rotation keeps the cyclic order: the runner after numpy would
    always inherit the BLAS threads' spin-down.)

    >>> sorted(rep_order(["a", "b", "c"], 3))
    ['a', 'b', 'c']
    """
    import random

    out = list(names)
    random.Random(7919 * (r + 1)).shuffle(out)
    return out


def time_interleaved(
    runners: dict[str, Runner],
    reps: int,
    warmup: int,
    *,
    barrier: Callable[[], None] | None = None,
    before: Callable[[], None] | None = None,
    on_step: Callable[[str], None] | None = None,
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Time every runner ``reps`` times, interleaved, after a first call and ``warmup`` more.

    Repetition ``r`` runs the runners in the order :func:`rep_order` gives.
    A runner must block until its result is ready. ``before`` (e.g. waiting
    for an idle machine) and then ``barrier`` (several processes) run before
    every timed call. Returns the times and each runner's first-call time
    (compilation included).
    """
    names = list(runners)
    first: dict[str, float] = {}
    for name in names:
        if barrier:
            barrier()
        t0 = time.perf_counter()
        runners[name]()
        first[name] = time.perf_counter() - t0
        if on_step:
            on_step(name)
    for _ in range(warmup):
        for name in names:
            if barrier:
                barrier()
            runners[name]()
            if on_step:
                on_step(name)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(reps):
        for name in rep_order(names, r):
            if before:
                before()
            if barrier:
                barrier()
            t0 = time.perf_counter()
            runners[name]()
            times[name].append(time.perf_counter() - t0)
            if on_step:
                on_step(name)
    return times, first


# --------------------------------------------------------------------------- #
# JAX helpers
# --------------------------------------------------------------------------- #
def _start_jax(ndevices: int) -> Any:
    """Import JAX with at least ``ndevices`` CPU devices (simulated when on CPU)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    current = jax.config.jax_num_cpu_devices
    if current is None or current < ndevices:  # never lower what the caller configured
        try:
            jax.config.update("jax_num_cpu_devices", ndevices)
        except RuntimeError:  # JAX already started by the caller
            pass
    if len(jax.devices()) < ndevices:
        raise SystemExit(
            f"dmatmul bench: {ndevices} devices requested but JAX has {len(jax.devices())} "
            f"({jax.devices()[0].platform}); start JAX with jax_num_cpu_devices={ndevices} or use fewer --devices"
        )
    return jax


def _jnp_dtype(dtype: str) -> Any:
    import jax.numpy as jnp

    return jnp.dtype(dtype)


def _spec(dist: Any, two_d: bool = False) -> Any:
    """PartitionSpec of a distribution on the 1-D mesh ("x",) or the 2-D mesh ("r", "c")."""
    from jax.sharding import PartitionSpec

    from .._distribution import BlockNonCyclic, Replicated

    if isinstance(dist, Replicated):
        return PartitionSpec()
    if isinstance(dist, BlockNonCyclic):
        return PartitionSpec("r", "c")
    axis: Any = ("r", "c") if two_d else "x"
    return PartitionSpec(axis, None) if dist.dim == 0 else PartitionSpec(None, axis)


def _mesh(devices: Sequence[Any], grid: tuple[int, int] | None = None) -> Any:
    from jax.sharding import AxisType, Mesh

    if grid is not None:
        arr = np.array(list(devices), dtype=object).reshape(grid)
        return Mesh(arr, ("r", "c"), axis_types=(AxisType.Auto, AxisType.Auto))
    return Mesh(np.array(list(devices), dtype=object), ("x",), axis_types=(AxisType.Auto,))


def _shardings(dists: Sequence[Any], devices: Sequence[Any], mm: Any = None) -> dict[str, Any]:
    """The NamedSharding of "a", "b" and "d": the plan's own where the backend
    exposes it (``mm``: a planned Matmul), else built from the distributions
    (1-D mesh "x", or a 2-D mesh ("r", "c") when one is on a grid)."""
    if mm is not None:
        from .._matmul import plan_of

        plan = plan_of(mm)
        if hasattr(plan, "sharding"):  # the JAX backend's plans say where each operand lives
            return {op: plan.sharding(op) for op in "abd"}
    import jax

    grids = [d.grid.shape for d in dists if getattr(d, "grid", None) is not None and d.grid.ndim == 2]
    mesh = _mesh(devices, grids[0] if grids else None)
    return {op: jax.sharding.NamedSharding(mesh, _spec(d, bool(grids))) for op, d in zip("abd", dists)}


def _precision(dtype: str) -> Any:
    import jax

    return jax.lax.Precision.HIGHEST if dtype in ("float32", "float64") else None


def _xla_dot(dtype: str) -> Callable[[Any, Any], Any]:
    """``jnp.dot`` with dmatmul's semantics: full precision, half precisions
    accumulated in float32 and rounded once."""
    import jax.numpy as jnp

    prec = _precision(dtype)
    if dtype in ("bfloat16", "float16"):
        return lambda x, y: jnp.dot(x, y, precision=prec, preferred_element_type=jnp.float32).astype(x.dtype)
    return lambda x, y: jnp.dot(x, y, precision=prec)


def _operands(n: int, dtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic float32 operands (the same on every rank)."""
    rng = np.random.default_rng(seed + n)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    return a, b


def _as_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return x
    if dtype == "bfloat16":
        import ml_dtypes

        return x.astype(ml_dtypes.bfloat16)
    return x.astype(dtype)


def _rel_err(got: Any, ref: np.ndarray) -> float:
    g = np.asarray(got, dtype=np.float64)
    return float(np.abs(g - ref).max() / max(np.abs(ref).max(), 1e-30))


_TOL = {"float32": 1e-4, "float64": 1e-10, "bfloat16": 3e-2, "float16": 1e-2}


def _plan_facts(mm: Any, n: int, p: int, itemsize: int, platform_name: str) -> dict[str, Any]:
    """Prediction and modelled traffic of a planned Matmul, from its plan's
    ``cost`` (the backend protocol: a :class:`dmatmul._plan.Plan`, or None
    where the backend models none)."""
    from .._matmul import plan_of

    facts: dict[str, Any] = {"algorithm": mm.algorithm}
    cost = plan_of(mm).cost
    lb = _cost.lower_bounds(n, n, n, p, itemsize)
    facts["lower_bound_bytes"] = lb["memory_independent"]
    facts["regime"] = lb["regime"]
    if cost is not None:
        model = _cost.model_for(platform_name, p)
        facts["predicted_s"] = model.time(messages=cost.messages, nbytes=cost.nbytes, flops=cost.flops)
        facts["modelled_bytes"] = float(cost.nbytes)
        facts["messages"] = float(cost.messages)
    return facts


def _named_algorithms(args: argparse.Namespace) -> list[str]:
    from .._plan import ALGORITHMS

    if args.algorithms is not None:
        for a in args.algorithms:
            if a != "auto" and a not in ALGORITHMS:
                raise SystemExit(f"dmatmul bench: unknown algorithm {a!r}; choose from auto, {', '.join(ALGORITHMS)}")
        return list(args.algorithms)
    return ["auto", *ALGORITHMS]


# --------------------------------------------------------------------------- #
# one process: simulated devices
# --------------------------------------------------------------------------- #
def _bench_group_devices(
    n: int, p: int, layout: str, args: argparse.Namespace, host: tuple[np.ndarray, np.ndarray],
    ref: np.ndarray | None, progress: Progress,
) -> list[Result]:
    import jax

    import dmatmul as dm

    dists = parse_layout(layout, p)
    dtype = args.dtype
    a32, b32 = host
    a, b = _as_dtype(a32, dtype), _as_dtype(b32, dtype)
    devices = jax.devices()[:p]
    platform_name = devices[0].platform
    # the plan's own shardings where the backend exposes them (the same layout)
    probe = None
    try:
        probe = dm.Matmul(a, b, distribution=dists, devices=p, backend="jax")
        probe.plan()
    except (ValueError, NotImplementedError):
        probe = None
    shard = _shardings(dists, devices, probe)
    if probe is not None:
        probe.free()
    ja = jax.device_put(a, shard["a"])
    jb = jax.device_put(b, shard["b"])
    jax.block_until_ready((ja, jb))

    runners: dict[str, Runner] = {}
    results: dict[str, Result] = {}
    itemsize = np.dtype(a.dtype).itemsize

    def new(impl: str, **kw: Any) -> Result:
        r = Result(impl=impl, n=n, ranks=p, layout=layout, dtype=dtype, mode="devices", **kw)
        results[impl] = r
        return r

    plans: dict[str, Any] = {}
    for algorithm in _named_algorithms(args):
        try:
            mm = dm.Matmul(ja, jb, distribution=dists, devices=p, backend="jax", algorithm=algorithm)
            mm.plan()
        except (ValueError, NotImplementedError):
            continue  # does not fit this layout
        plans[algorithm] = mm
        res = new(f"dmatmul:{algorithm}", **_plan_facts(mm, n, p, itemsize, platform_name))
        if algorithm == "auto" and args.explain:
            progress.note(mm.explain())
        runners[res.impl] = (lambda mm=mm: jax.block_until_ready(mm.execute()))

    if "xla" in args.peers:
        f = jax.jit(_xla_dot(dtype), in_shardings=(shard["a"], shard["b"]), out_shardings=shard["d"])
        new("xla")
        runners["xla"] = lambda: jax.block_until_ready(f(ja, jb))
    if "xla-1dev" in args.peers:
        d0 = devices[0]
        a1, b1 = jax.device_put(a, d0), jax.device_put(b, d0)
        f1 = jax.jit(_xla_dot(dtype))
        new("xla-1dev")
        runners["xla-1dev"] = lambda: jax.block_until_ready(f1(a1, b1))
    if "numpy" in args.peers:
        new("numpy", note=None if dtype in ("float32", "float64") else "float32 GEMM (numpy has none in " + dtype + ")")
        an, bn = (a32, b32) if dtype != "float64" else (a, b)
        runners["numpy"] = lambda: an @ bn

    # correctness, once (outside the timing)
    if ref is not None:
        tol = _TOL.get(dtype, 1e-2)
        for impl, fn in runners.items():
            if impl == "numpy":
                continue
            err = _rel_err(fn(), ref)
            results[impl].max_rel_err = err
            if err > tol:
                results[impl].note = f"MISMATCH: max rel err {err:.2e} > {tol:.0e}"
    weight = float(n) ** 3
    label = f"n={n} P={p} {layout}"
    waiter = IdleWaiter(args.wait_idle) if args.wait_idle is not None else None
    times, first = time_interleaved(
        runners, args.reps, args.warmup, before=waiter,
        on_step=lambda impl: progress.step(weight, f"{label} {impl}"),
    )
    if waiter is not None:
        for r in results.values():
            r.waited_s = waiter.waited
            if waiter.gave_up:
                r.note = (r.note + "; " if r.note else "") + f"machine busy: {waiter.gave_up} samples taken anyway"
    for impl, ts in times.items():
        results[impl].times = ts
        results[impl].first_call_s = first[impl]
    for mm in plans.values():
        mm.free()
    return list(results.values())


def _run_devices(args: argparse.Namespace, out: list[Result], flush: Callable[[], None]) -> None:
    jax = _start_jax(max(args.devices))
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    calls_per_group = (len(_named_algorithms(args)) + len(args.peers)) * (1 + args.warmup + args.reps)
    total = sum(float(n) ** 3 * calls_per_group for n in args.sizes) * len(args.devices) * len(args.layouts)
    progress = Progress(total, enabled=not args.no_progress)
    try:
        for n in args.sizes:
            host = _operands(n, args.dtype)
            ref = None
            if n <= 4096:  # reference in float64 (only the check; never timed)
                ref = _as_dtype(host[0], args.dtype).astype(np.float64) @ _as_dtype(host[1], args.dtype).astype(
                    np.float64
                )
            for p in args.devices:
                for layout in args.layouts:
                    if n % p:
                        progress.note(f"skipping n={n} on {p} devices (not a multiple)")
                        continue
                    group = _bench_group_devices(n, p, layout, args, host, ref, progress)
                    out.extend(group)
                    progress.clear()
                    print(format_group(group), flush=True)
                    flush()
    finally:
        progress.close()


# --------------------------------------------------------------------------- #
# several processes: mpiexec
# --------------------------------------------------------------------------- #
_NUMPY_HELPER = r"""
import os, sys, time
try:
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
except (AttributeError, OSError):
    pass
import numpy as np
cache = {}
for line in sys.stdin:
    n = int(line)
    if n not in cache:
        cache.clear()
        rng = np.random.default_rng(n)
        cache[n] = (rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32))
    a, b = cache[n]
    t0 = time.perf_counter()
    a @ b
    print(time.perf_counter() - t0, flush=True)
"""


class NumpyHelper:
    """A process of its own for numpy's GEMM, with the whole machine: every
    CPU in its affinity mask and numpy's default thread count."""

    def __init__(self) -> None:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
            and not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_"))
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _NUMPY_HELPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )

    def gemm(self, n: int) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _quiet_barrier(comm: Any) -> None:
    """A barrier that sleeps while it waits (MPICH's blocking calls busy-poll,
    stealing the cores of the ranks still computing)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(5e-4)


def _bench_group_processes(
    n: int, layout: str, args: argparse.Namespace, rt: Any, helper: NumpyHelper | None, progress: Progress
) -> list[Result]:
    import jax

    import dmatmul as dm

    p, rank, comm = rt.size, rt.rank, rt.comm
    dtype = args.dtype
    dists = parse_layout(layout, p)
    a32, b32 = _operands(n, dtype)
    a, b = _as_dtype(a32, dtype), _as_dtype(b32, dtype)
    me = rt.device if rt.device is not None else jax.local_devices()[0]
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    blocks = {
        op: np.ascontiguousarray(dm.split(x, d, p)[rank]) for op, x, d in (("a", a, dists[0]), ("b", b, dists[1]))
    }
    la, lb = jax.device_put(blocks["a"], me), jax.device_put(blocks["b"], me)
    itemsize = np.dtype(a.dtype).itemsize
    results: dict[str, Result] = {}
    runners: dict[str, Runner] = {}

    def new(impl: str, **kw: Any) -> Result:
        r = Result(impl=impl, n=n, ranks=p, layout=layout, dtype=dtype, mode="processes", **kw)
        results[impl] = r
        return r

    plans = {}
    for algorithm in _named_algorithms(args):
        try:
            mm = dm.Matmul(la, lb, distribution=dists, backend="jax", algorithm=algorithm)
            mm.plan()
        except (ValueError, NotImplementedError):
            continue
        plans[algorithm] = mm
        res = new(f"dmatmul:{algorithm}", **_plan_facts(mm, n, p, itemsize, me.platform))
        if algorithm == "auto" and args.explain and rank == 0:
            progress.note(mm.explain())
        runners[res.impl] = (lambda mm=mm: jax.block_until_ready(mm.execute()))
    if "xla" in args.peers:
        shard = _shardings(dists, devices, plans.get("auto"))
        ga = jax.make_array_from_single_device_arrays((n, n), shard["a"], [la])
        gb = jax.make_array_from_single_device_arrays((n, n), shard["b"], [lb])
        f = jax.jit(_xla_dot(dtype), in_shardings=(shard["a"], shard["b"]), out_shardings=shard["d"])
        new("xla", note="multi-process jit")
        runners["xla"] = lambda: jax.block_until_ready(f(ga, gb))
    if "numpy" in args.peers:
        new("numpy", note="1 process, all cores, other ranks asleep")
        numpy_times: list[float] = []

        def numpy_run() -> None:
            if helper is not None:
                numpy_times.append(helper.gemm(n))

        runners["numpy"] = numpy_run

    # correctness of this rank's block, once
    rows, cols = dists[2].global_indices(rank, (n, n), p)
    ref = a.astype(np.float64)[rows] @ b.astype(np.float64)[:, cols]
    tol = _TOL.get(dtype, 1e-2)
    for impl, fn in runners.items():
        if impl == "numpy":
            continue
        got = fn()
        if impl == "xla":
            got = got.addressable_shards[0].data
        err = _rel_err(got, ref)
        errs = comm.allgather(err)
        results[impl].max_rel_err = max(errs)
        if max(errs) > tol:
            results[impl].note = f"MISMATCH: max rel err {max(errs):.2e} > {tol:.0e}"
    weight = float(n) ** 3
    # rank 0 waits for an idle machine while the others sleep in the barrier
    waiter = IdleWaiter(args.wait_idle) if args.wait_idle is not None and rank == 0 else None
    times, first = time_interleaved(
        runners, args.reps, args.warmup, barrier=lambda: _quiet_barrier(comm), before=waiter,
        on_step=lambda impl: progress.step(weight, f"n={n} P={p} {layout} {impl}"),
    )
    if waiter is not None:
        for r in results.values():
            r.waited_s = waiter.waited
    _quiet_barrier(comm)
    # a collective's time is its slowest rank's
    all_times = comm.allgather(times)
    all_first = comm.allgather(first)
    for impl in runners:
        if impl == "numpy":
            results[impl].times = numpy_times[-args.reps :] if numpy_times else [float("nan")]
            results[impl].times = comm.bcast(results[impl].times, root=0)
            continue
        results[impl].times = [max(t[impl][i] for t in all_times) for i in range(args.reps)]
        results[impl].first_call_s = max(f[impl] for f in all_first)
    for mm in plans.values():
        mm.free()
    return list(results.values())


def _run_processes(args: argparse.Namespace, out: list[Result], flush: Callable[[], None]) -> None:
    import dmatmul as dm

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    rt = dm.init()
    if args.dtype == "float64":
        import jax

        jax.config.update("jax_enable_x64", True)
    helper = NumpyHelper() if rt.rank == 0 and "numpy" in args.peers else None
    if "xla-1dev" in args.peers:
        args.peers = [x for x in args.peers if x != "xla-1dev"]  # one core per rank: not the machine's ceiling
    calls = (len(_named_algorithms(args)) + len(args.peers)) * (1 + args.warmup + args.reps)
    total = sum(float(n) ** 3 * calls for n in args.sizes) * len(args.layouts)
    progress = Progress(total, enabled=rt.rank == 0 and not args.no_progress)
    try:
        for n in args.sizes:
            if n % rt.size:
                progress.note(f"note: n={n} is not a multiple of {rt.size}: uneven blocks")
            for layout in args.layouts:
                group = _bench_group_processes(n, layout, args, rt, helper, progress)
                if rt.rank == 0:
                    out.extend(group)
                    progress.clear()
                    print(format_group(group), flush=True)
                    flush()
    finally:
        progress.close()
        if helper is not None:
            helper.close()


# --------------------------------------------------------------------------- #
# calibration
# --------------------------------------------------------------------------- #
def calibration_samples(
    p: int,
    *,
    quick: bool = False,
    reps: int = 5,
    message_bytes: Sequence[int] | None = None,
    gemm_sizes: Sequence[int] | None = None,
    before: Callable[[], None] | None = None,
) -> list[tuple[float, float, float, float]]:
    """Measured ``(messages, nbytes, flops, seconds)`` per rank on ``p`` devices.

    * messages: a ring shift (``ppermute``) of ``B`` bytes per rank, timed as
      the difference between 2 and 10 chained shifts in one jitted call (the
      dispatch cost cancels), for several ``B``;
    * flops: every rank runs the GEMMs of a ring (``p`` products of
      ``(n/p x n) @ (n x n/p)``) at once, no communication, for several n.
    """
    jax = _start_jax(p)
    import jax.numpy as jnp
    from jax import lax

    devices = jax.devices()[:p]
    mesh = _mesh(devices)
    P = jax.sharding.PartitionSpec
    samples: list[tuple[float, float, float, float]] = []

    def med(fn: Runner) -> float:
        fn()
        fn()
        ts = []
        for _ in range(reps):
            if before:
                before()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    perm = [(i, (i - 1) % p) for i in range(p)]
    if message_bytes is None:
        message_bytes = (1 << 16, 1 << 20, 1 << 22) if quick else (1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24)
    if gemm_sizes is None:
        gemm_sizes = (512, 1024) if quick else (1024, 2048)
    for nbytes in message_bytes:
        words = nbytes // 4
        x = jax.device_put(np.ones((p, words), np.float32), jax.sharding.NamedSharding(mesh, P("x", None)))
        timed = {}
        for steps in (2, 10):

            def shifts(blk: Any, steps: int = steps) -> Any:
                for _ in range(steps):
                    blk = lax.ppermute(blk, "x", perm)
                return blk

            f = jax.jit(jax.shard_map(shifts, mesh=mesh, in_specs=P("x", None), out_specs=P("x", None)))
            timed[steps] = med(lambda f=f: jax.block_until_ready(f(x)))
        per = (timed[10] - timed[2]) / 8
        if per > 0:
            samples.append((1.0, float(nbytes), 0.0, per))
    prec = jax.lax.Precision.HIGHEST
    for n in gemm_sizes:
        n = max(p, n - n % p)
        blk = n // p
        a = jax.device_put(np.ones((n, n), np.float32), jax.sharding.NamedSharding(mesh, P("x", None)))
        b = jax.device_put(np.ones((n, n), np.float32), jax.sharding.NamedSharding(mesh, P()))

        def gemms(a: Any, b: Any, blk: int = blk) -> Any:
            return jnp.concatenate(
                [jnp.dot(a, b[:, j * blk : (j + 1) * blk], precision=prec) for j in range(p)], axis=1
            )

        f = jax.jit(jax.shard_map(gemms, mesh=mesh, in_specs=(P("x", None), P()), out_specs=P("x", None)))
        samples.append((0.0, 0.0, 2.0 * n**3 / p, med(lambda f=f: jax.block_until_ready(f(a, b)))))
    return samples


def _run_calibrate(args: argparse.Namespace) -> int:
    from .._runtime import launched_size

    if launched_size() > 1:
        print("dmatmul bench --calibrate: run it in one process (it calibrates simulated devices)", file=sys.stderr)
        return 2
    jax = _start_jax(max(args.devices))
    platform_name = jax.devices()[0].platform
    models: dict[str, _cost.MachineModel] = {}
    print(f"calibrating the alpha-beta-gamma model on {platform_name} ({os.cpu_count()} cores)")
    print(
        f"{'ranks':>5s} {'alpha (us)':>11s} {'1/beta (GB/s)':>14s} {'1/gamma (GFLOP/s/rank)':>23s} "
        f"{'rms rel res':>12s}"
    )
    for p in args.devices:
        waiter = IdleWaiter(args.wait_idle) if args.wait_idle is not None else None
        samples = calibration_samples(p, quick=args.quick, before=waiter)
        model, res = _cost.fit(samples)
        model = dataclasses.replace(model, source="calibrated")
        models[f"{platform_name}/{p}"] = model
        bw = 1 / model.beta / 1e9 if model.beta else float("inf")
        speed = 1 / model.gamma / 1e9 if model.gamma else float("inf")
        print(f"{p:5d} {model.alpha * 1e6:11.2f} {bw:14.2f} {speed:23.2f} {res:12.3f}")
    models[platform_name] = models[f"{platform_name}/{max(args.devices)}"]
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "jax": jax.__version__,
    }
    path = _cost.save_models(models, args.model_out, meta=meta)
    print(f"saved to {path}; algorithm='auto' plans with it (set {_cost.MODEL_ENV}=default to ignore it)")
    return 0


# --------------------------------------------------------------------------- #
# the cost model, per algorithm and layout
# --------------------------------------------------------------------------- #
def format_costs(n: int, p: int, dtype: str = "float32", platform_name: str = "cpu") -> str:
    """Every 1-D algorithm on its own layout for an ``n``-cube on ``p`` ranks:
    bytes each rank sends and receives, messages, flops and extra memory per
    rank, the predicted time, and the lower bounds."""
    from .. import _plan

    itemsize = 2 if dtype in ("bfloat16", "float16") else np.dtype(dtype).itemsize
    acc = 4 if itemsize == 2 else itemsize
    model = _cost.model_for(platform_name, p)
    problem = _plan.Problem1D(n, n, n, p, itemsize, acc)
    lb = _cost.lower_bounds(n, n, n, p, itemsize)
    mib = 2.0**20
    head = (
        f"{'algorithm':15s} {'a':12s} {'b':12s} {'result':12s} {'recv MiB':>9s} {'sent MiB':>9s} {'msgs':>5s} "
        f"{'GFLOP':>7s} {'extra MiB':>9s} {'pred ms':>8s} {'/bound':>7s}"
    )
    lines = [
        f"n={n} {dtype} on {p} ranks; model: {model.describe()}",
        f"lower bounds per rank: memory-independent {lb['memory_independent'] / mib:.2f} MiB ({lb['regime']} regime); "
        f"ring (P-1)/P*V of one operand: {lb['ring_a'] / mib:.2f} MiB",
        head,
        "-" * len(head),
    ]
    for kernel in _plan.KERNELS:
        roles = {"a": kernel.a, "b": kernel.b, "d": kernel.d}
        if "G" in roles.values():
            continue  # 2-D grid kernels: see Matmul.explain() on a grid layout
        try:
            plan = next(pl for pl in _plan.plans(problem, roles, model) if pl.kernel == kernel)
        except StopIteration:
            continue
        names = [_plan.dist_for_role(op, roles[op], False) for op in ("a", "b", "d")]  # type: ignore[arg-type]
        extra = _cost.extra_memory_bytes(kernel.algorithm, n, n, n, p, itemsize, acc, moving=kernel.moving)
        bound = f"{plan.nbytes / lb['memory_independent']:.2f}" if lb["memory_independent"] > 0 else "-"
        # every rank of a ring (or a psum) sends what it receives
        lines.append(
            f"{kernel.algorithm:15s} {names[0]:12s} {names[1]:12s} {names[2]:12s} {plan.nbytes / mib:9.2f} "
            f"{plan.nbytes / mib:9.2f} {plan.messages:5.0f} {plan.flops / 1e9:7.3f} {extra / mib:9.2f} "
            f"{plan.time * 1e3:8.2f} {bound:>7s}"
        )
    return "\n".join(lines) + "\n"


def _run_costs(args: argparse.Namespace) -> int:
    platform_name = "cpu"
    try:
        jax = _start_jax(max(args.devices))
        platform_name = jax.devices()[0].platform
    except (ImportError, SystemExit):
        pass
    for n in args.sizes:
        for p in args.devices:
            print(format_costs(n, p, args.dtype, platform_name))
    return 0


# --------------------------------------------------------------------------- #
# output
# --------------------------------------------------------------------------- #
def _ms(s: float | None) -> str:
    return "-" if s is None or not math.isfinite(s) else f"{s * 1e3:.1f}"


def format_group(results: Sequence[Result]) -> str:
    """The table of one problem: every implementation with its ratios to each peer."""
    if not results:
        return ""
    r0 = results[0]
    peers = _peers_of(results)
    where = f"{r0.ranks} devices" if r0.mode == "devices" else f"{r0.ranks} processes"
    head = f"n={r0.n} {r0.dtype}, {where}, layout (a, b, result) = {_layout_name(r0.layout)}"
    if "G" in r0.layout.upper():
        head += f", grid {grid_shape(r0.ranks)[0]}x{grid_shape(r0.ranks)[1]}"
    cols = f"{'implementation':34s} {'median ms':>9s} {'min':>8s} {'max':>8s} {'GFLOP/s':>8s}"
    for name in peers:
        cols += f" {'x ' + name:>9s}"
    cols += f" {'pred ms':>8s} {'MiB/rank':>9s} {'/bound':>6s}"
    lines = [head, cols, "-" * len(cols)]
    for r in results:
        if not r.times:
            continue
        line = f"{r.label():34s} {_ms(r.median):>9s} {_ms(min(r.times)):>8s} {_ms(max(r.times)):>8s} {r.gflops:8.1f}"
        for p in peers.values():
            line += f" {p.median / r.median:8.2f}x"
        mb = "-" if r.modelled_bytes is None else f"{r.modelled_bytes / 2**20:.1f}"
        bound = (
            f"{r.modelled_bytes / r.lower_bound_bytes:.2f}"
            if r.modelled_bytes is not None and r.lower_bound_bytes
            else "-"
        )
        line += f" {_ms(r.predicted_s):>8s} {mb:>9s} {bound:>6s}"
        if r.note:
            line += f"  [{r.note}]"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _layout_name(layout: str) -> str:
    names = {"X": "Slab.X", "Y": "Slab.Y", "R": "Replicated()", "G": "BlockNonCyclic(grid)"}
    return "(" + ", ".join(names[c] for c in layout.upper()) + ")"


def format_summary(results: Sequence[Result]) -> str:
    """dmatmul auto against each peer, per problem, with the issue's targets
    (8 devices, n = 2048 and 4096, float32)."""
    groups: dict[tuple[Any, ...], list[Result]] = {}
    for r in results:
        groups.setdefault(r.group, []).append(r)
    lines = []
    head = (
        f"{'n':>5s} {'ranks':>5s} {'layout':8s} {'auto ran':15s} {'x xla':>7s} {'paired':>7s} "
        f"{'x numpy':>8s} {'paired':>7s} {'pred/meas':>9s}  target"
    )
    lines += [
        "dmatmul auto against its peers (ratio of medians, and median of the per-repetition ratios; "
        "> 1: dmatmul faster)",
        head,
        "-" * len(head),
    ]
    for key, rs in groups.items():
        auto = next((r for r in rs if r.impl == "dmatmul:auto" and r.times), None)
        if auto is None:
            continue
        peers = _peers_of(rs)
        vs = {name: p.median / auto.median for name, p in peers.items()}
        paired = {name: auto.paired_ratio(p) for name, p in peers.items()}
        target = ""
        if auto.mode == "devices" and auto.ranks == 8 and auto.n in (2048, 4096) and auto.dtype == "float32":
            checks = []
            for name, (need, aim) in TARGETS.items():
                if name in vs:
                    mark = "aim met" if vs[name] >= aim else ("met" if vs[name] >= need else "MISSED")
                    checks.append(f"{name} >= {need}: {mark}")
            target = "; ".join(checks)
        pm = f"{auto.predicted_s / auto.median:.2f}" if auto.predicted_s else "-"
        fx, px = (f"{vs['xla']:.2f}x", f"{paired['xla']:.2f}x") if "xla" in vs else ("-", "-")
        fn, pn = (f"{vs['numpy']:.2f}x", f"{paired['numpy']:.2f}x") if "numpy" in vs else ("-", "-")
        lines.append(
            f"{auto.n:5d} {auto.ranks:5d} {auto.layout:8s} {auto.algorithm or '-':15s} {fx:>7s} {px:>7s} "
            f"{fn:>8s} {pn:>7s} {pm:>9s}  {target}"
        )
    return "\n".join(lines) + "\n"


def _meta(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    import jax

    from .. import __version__

    models = {}
    platform_name = jax.devices()[0].platform
    counts = sorted({r for r in (args.devices if mode == "devices" else [jax.process_count()])})
    for p in counts:
        model = _cost.model_for(platform_name, p)
        models[str(p)] = {**model.to_dict(), "source": model.source}
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "mode": mode,
        "host": socket.gethostname(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "jax": jax.__version__,
        "dmatmul": __version__,
        "reps": args.reps,
        "warmup": args.warmup,
        "dtype": args.dtype,
        "models": models,
        "timing": "interleaved repetitions (a seeded random order per repetition); medians; "
        "ratio x P = P's median / this median; paired = median of the per-repetition ratios",
    }


def write_json(path: str, results: Sequence[Result], meta: dict[str, Any]) -> None:
    groups: dict[tuple[Any, ...], list[Result]] = {}
    for r in results:
        groups.setdefault(r.group, []).append(r)
    rows = []
    for rs in groups.values():
        peers = _peers_of(rs)
        rows += [r.to_json(peers) for r in rs if r.times]
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=1, default=float)
        f.write("\n")
    os.replace(tmp, path)


def write_plot(path: str, results: Sequence[Result]) -> str | None:
    """GFLOP/s (median, min-max bars) against n per implementation; one panel
    per (layout, ranks). Returns a message when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (pip install 'dmatmul[bench]'): no plot"
    layouts = sorted({r.layout for r in results}, key=lambda x: (x != "XYX", x))
    ranks = sorted({r.ranks for r in results})
    fig, axes = plt.subplots(
        len(layouts), len(ranks), figsize=(4.2 * len(ranks), 3.4 * len(layouts)), squeeze=False, sharey=True
    )
    style: dict[str, dict[str, Any]] = {
        "dmatmul:auto": dict(color="C0", lw=2.5, marker="o"),
        "xla": dict(color="C3", lw=1.8, marker="s"),
        "xla-1dev": dict(color="C1", lw=1.2, ls=":", marker="^"),
        "numpy": dict(color="k", lw=1.2, ls="--", marker="x"),
    }
    others = sorted({r.impl for r in results if r.impl not in style})
    for k, impl in enumerate(others):
        style[impl] = dict(color=("C2", "C4", "C5", "C6", "C8", "C9")[k % 6], lw=1.2, ls="-.", marker=".")
    order = {impl: i for i, impl in enumerate(["dmatmul:auto", *others, "xla", "xla-1dev", "numpy"])}
    top = max((r.flops / min(r.times) / 1e9 for r in results if r.times), default=1.0)
    legend: dict[str, Any] = {}
    for i, layout in enumerate(layouts):
        for j, p in enumerate(ranks):
            ax = axes[i][j]
            impls: dict[str, list[Result]] = {}
            for r in results:
                if r.layout == layout and r.ranks == p and r.times:
                    impls.setdefault(r.impl, []).append(r)
            for impl, rs in sorted(impls.items(), key=lambda kv: order.get(kv[0], 99)):
                rs.sort(key=lambda r: r.n)
                xs = [r.n for r in rs]
                ys = [r.gflops for r in rs]
                lo = [r.gflops - r.flops / max(r.times) / 1e9 for r in rs]
                hi = [r.flops / min(r.times) / 1e9 - r.gflops for r in rs]
                label = "dmatmul auto" if impl == "dmatmul:auto" else rs[0].label()
                h = ax.errorbar(xs, ys, yerr=[lo, hi], label=label, capsize=2, **style[impl])
                legend.setdefault(impl, (h, label))
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r.n for r in results}))
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.get_xaxis().set_minor_locator(matplotlib.ticker.NullLocator())
            mode = results[0].mode
            ax.set_title(f"{_layout_name(layout)}, {p} {'devices' if mode == 'devices' else 'processes'}", fontsize=9)
            if i == len(layouts) - 1:
                ax.set_xlabel("n (M = N = K)")
            if j == 0:
                ax.set_ylabel(f"GFLOP/s ({results[0].dtype})")
            ax.grid(alpha=0.3)
            ax.set_ylim(0, top * 1.05)
    items = sorted(legend.items(), key=lambda kv: order.get(kv[0], 99))
    handles, labels = [h for _, (h, _) in items], [lab for _, (_, lab) in items]
    ncol = min(len(labels), 3 if len(ranks) < 3 else 4)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8)
    fig.suptitle(f"dmatmul bench on {socket.gethostname()} ({os.cpu_count()} cores): median, min-max bars", fontsize=10)
    rows = -(-len(labels) // ncol)
    fig.tight_layout(rect=(0, (0.25 * rows + 0.15) / (3.4 * len(layouts)), 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# --------------------------------------------------------------------------- #
# entry points
# --------------------------------------------------------------------------- #
def run(args: argparse.Namespace) -> int:
    """Run ``dmatmul bench`` with parsed arguments; returns the exit status
    (1 if any result disagreed with the float64 reference)."""
    from .._runtime import launched_size

    args = _finish_args(args)
    if args.calibrate:
        return _run_calibrate(args)
    if args.costs:
        return _run_costs(args)
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
        _start_jax(max(args.devices))
    meta.update(_meta(args, mode))
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
        _run_processes(args, results, flush)
    else:
        _run_devices(args, results, flush)
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


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dmatmul._bench [options]``: the bench without the ``dmatmul`` CLI."""
    parser = argparse.ArgumentParser(prog="dmatmul")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))
