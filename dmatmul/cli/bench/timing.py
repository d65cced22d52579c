"""Timing: the interleaved timing loop and what it records.

:func:`time_interleaved` runs every implementation once per repetition, in a
seeded random order the same on every rank (:func:`rep_order`), after a first
call and warm-up; :class:`IdleWaiter` keeps load bursts of other processes
out of the samples on a shared machine; :class:`Result` holds one
implementation's times on one problem with their statistics (median, GFLOP/s,
ratios to a peer); :class:`Progress` is the progress bar on stderr.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


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


def blocking(fn: Callable[..., Any], *args: Any) -> Runner:
    """A runner of ``fn(*args)`` that blocks until its result is ready (JAX
    dispatches asynchronously)."""
    import jax

    return lambda: jax.block_until_ready(fn(*args))


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
    check: Callable[[str, Any], None] | None = None,
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Time every runner ``reps`` times, interleaved, after a first call and ``warmup`` more.

    Repetition ``r`` runs the runners in the order :func:`rep_order` gives.
    A runner must block until its result is ready. ``before`` (e.g. waiting
    for an idle machine) and then ``barrier`` (several processes) run before
    every timed call. ``check(name, result)`` sees each runner's first result
    (off the clock). Returns the times and each runner's first-call time
    (compilation included: the first call is the first the runner ever makes).
    """
    names = list(runners)
    first: dict[str, float] = {}
    for name in names:
        if barrier:
            barrier()
        t0 = time.perf_counter()
        out = runners[name]()
        first[name] = time.perf_counter() - t0
        if check:
            check(name, out)
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
    peak_bytes: float | None = None  # per rank, XLA's memory analysis of the compiled program
    ideal_bytes: float | None = None  # per rank: blocks of a, b, result + one travelling buffer
    waited_s: float | None = None  # --wait-idle: time spent waiting for an idle machine
    note: str | None = None

    @property
    def flops(self) -> float:
        return 2.0 * self.n**3

    @property
    def median(self) -> float:
        return float(np.median(self.times))

    @property
    def memory_ratio(self) -> float | None:
        """Peak memory per rank over the ideal (None where either is unknown)."""
        if self.peak_bytes is None or not self.ideal_bytes:
            return None
        return self.peak_bytes / self.ideal_bytes

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
            memory_ratio=self.memory_ratio,
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


class Progress:
    """A one-line progress bar with an ETA, weighted by each step's work.

    ``enabled``: whether the bar is drawn (on a terminal); ``notes``: whether
    :meth:`note`'s messages are written (``--explain``'s accounts, groups
    skipped), with or without the bar."""

    def __init__(self, total: float, enabled: bool = True, stream: Any = None, *, notes: bool = True) -> None:
        self.total, self.done = max(total, 1e-12), 0.0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.notes = notes
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
        if not self.notes:
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
