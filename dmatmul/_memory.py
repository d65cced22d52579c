"""Whether a product fits in memory, judged before anything of it is allocated.

The contract (section 6): a product whose result or working set cannot fit
the memory of the devices (or, for numpy results, of the host) raises
``MemoryError`` naming the operand, the bytes needed and the bytes available,
before anything is allocated; numpy and XLA would otherwise fill the memory
first and fail, or be killed, naming neither the call nor the operand.

What a product needs comes from its backend (the optional
``Backend.memory(spec, operands)``: a list of :class:`Need`, each in one
*place*, and how to ask each place other than the host what it has free); a
backend that says nothing is judged on its result, which comes back on the
host. What a place has is asked when needed: the host's ``MemAvailable`` (and
its cgroup's room), read at most once a second; a device's what the backend's
probe reports. A product judged to fit is not judged again for a second, so
repeated calls pay a dictionary lookup. Under several processes each rank
judges its own share, inside the agreement that precedes the plan, so a rank
that cannot fit raises on every rank.

``DMATMUL_MEMORY_CHECK=0`` skips the check (a host whose swap would hold
what ``MemAvailable`` does not count, say).

Plans whose memory is a choice (2.5-D SUMMA's number of layers) choose within
:func:`plan_budget`: ``DMATMUL_MEMORY_FRACTION`` (default 0.8) of each
device's memory, or of the host's share per device on CPU.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["Need", "HOST", "ENV", "FRACTION_ENV", "check", "check_product", "judge", "shortfall", "host_available",
           "host_total", "fraction", "plan_budget", "human"]

#: the place of host memory (numpy results, and simulated CPU devices, which use the host's memory)
HOST = "the host"
ENV = "DMATMUL_MEMORY_CHECK"
#: how long (s) a reading of the host's free memory, and a verdict that a product fits, are kept
TTL = 1.0

#: what a place other than the host has free (bytes), or None where it does not say
Probe = Callable[[], "int | None"]


@dataclasses.dataclass(frozen=True)
class Need:
    """Bytes a product takes in one place: ``place`` (:data:`HOST`, or a
    device place such as ``"each of the 8 gpu devices"``), for ``operand``
    ("a", "b", "c" or "d", the result), as ``what`` says (a few words:
    "the result as a numpy array")."""

    place: str
    operand: str
    what: str
    nbytes: int


def human(nbytes: float) -> str:
    """Bytes in decimal units, three figures.

    >>> human(40e9), human(1536), human(12)
    ('40.0 GB', '1.5 kB', '12 B')
    """
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{int(nbytes)} B"


def shortfall(needs: Sequence[Need], available: Mapping[str, int | None]) -> tuple[str, int, int] | None:
    """The first place whose needs exceed what it has: ``(place, needed,
    available)``; None where every place fits (or does not say what it has).

    >>> needs = [Need(HOST, "d", "the result", 10), Need("gpu", "a", "its block", 5)]
    >>> shortfall(needs, {HOST: 8, "gpu": 100}), shortfall(needs, {HOST: 10, "gpu": None})
    (('the host', 10, 8), None)
    """
    totals: dict[str, int] = {}
    for need in needs:
        totals[need.place] = totals.get(need.place, 0) + need.nbytes
    for place, total in totals.items():
        have = available.get(place)
        if have is not None and total > have:
            return place, total, have
    return None


def judge(needs: Sequence[Need], available: Mapping[str, int | None], *, shapes: Mapping[str, str],
          fixes: Mapping[str, str] | None = None) -> str | None:
    """The MemoryError's message where ``needs`` do not fit ``available``, else
    None (pure: the tests give both). ``shapes``: each operand's words
    (``{"d": "the result, 100000 x 100000 float32"}``); ``fixes``: the fix
    per operand ("d", "a", ...), or per operand in a place ("d on the host"),
    where the default does not say it best (:func:`fixes_for`)."""
    found = shortfall(needs, available)
    if found is None:
        return None
    place, total, have = found
    here = [n for n in needs if n.place == place]
    by_operand: dict[str, int] = {}
    for n in here:
        by_operand[n.operand] = by_operand.get(n.operand, 0) + n.nbytes
    culprit = max(by_operand, key=lambda op: by_operand[op])  # (the first of equals: dicts keep order)
    parts = ", ".join(f"{human(n.nbytes)} for {n.what}" for n in sorted(here, key=lambda n: -n.nbytes) if n.nbytes)
    name = f"{culprit} ({shapes[culprit]})" if culprit in shapes else culprit
    fixes = fixes or {}
    fix = fixes.get(f"{culprit} on {place}") or fixes.get(culprit) or (
        "to fit, multiply a smaller problem (in pieces: row blocks of a), on more memory (more or larger devices, "
        "or more ranks under mpiexec), or with a distribution that splits the result rather than replicates it"
    )
    return (f"{name} needs {human(total)} on {place} for this product, and {human(have)} is available there "
            f"({parts}): {fix} ({ENV}=0 skips this check)")


# --------------------------------------------------------------------------- #
# what the host has
# --------------------------------------------------------------------------- #
def _meminfo() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:  # (no /proc: macOS and others; free pages only, which undercounts the page cache)
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # ("max": no limit)


def _cgroup_room() -> int | None:
    """What this process's cgroup still lets it take (v2, else v1), or None where it sets no limit."""
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        cap = _read_int(limit)
        if cap is not None and cap < 1 << 60:  # (v1 writes "no limit" as a huge number)
            used = _read_int(usage) or 0
            return max(cap - used, 0)
    return None


_host: tuple[float, int | None] = (-math.inf, None)


def host_available() -> int | None:
    """The bytes the host can still give this process (``MemAvailable``, or its
    cgroup's room where smaller), read at most once every :data:`TTL` seconds."""
    global _host
    now = time.monotonic()
    if now - _host[0] > TTL:
        found = [x for x in (_meminfo(), _cgroup_room()) if x is not None]
        _host = (now, min(found) if found else None)
    return _host[1]


#: the fraction of a rank's memory a plan may count on (the rest: a margin for what else lives there)
FRACTION_ENV = "DMATMUL_MEMORY_FRACTION"
DEFAULT_FRACTION = 0.8


def fraction() -> float:
    """:data:`FRACTION_ENV` as a number in (0, 1] (default :data:`DEFAULT_FRACTION`).

    >>> os.environ[FRACTION_ENV] = "0.25"; fraction()
    0.25
    >>> os.environ[FRACTION_ENV] = "2"; fraction()
    Traceback (most recent call last):
    ...
    ValueError: DMATMUL_MEMORY_FRACTION='2': expected a fraction in (0, 1] of each device's memory that a plan may count on (default 0.8); set it to one, or unset it
    >>> del os.environ[FRACTION_ENV]; fraction()
    0.8
    """
    raw = os.environ.get(FRACTION_ENV, "").strip()
    if not raw:
        return DEFAULT_FRACTION
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise ValueError(f"{FRACTION_ENV}={raw!r}: expected a fraction in (0, 1] of each device's memory that a "
                         f"plan may count on (default {DEFAULT_FRACTION}); set it to one, or unset it")
    return value


def host_total() -> int | None:
    """The host's memory (``MemTotal``, or its cgroup's limit where smaller), or None where neither says."""
    found = [_read_int(path) for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")]
    limits = [x for x in found if x is not None and x < 1 << 60]
    try:
        with open("/proc/meminfo", "rb") as f:
            limits += [int(line.split()[1]) * 1024 for line in f if line.startswith(b"MemTotal:")]
    except (OSError, ValueError, IndexError):
        pass
    return min(limits) if limits else None


def plan_budget(devices: Sequence[Any]) -> float | None:
    """The bytes each of ``devices`` (JAX devices, or objects with their
    ``memory_stats()``) may hold for a product: :func:`fraction` of the least
    memory any of them has (its allocator's limit; CPU devices, which report
    none, share the host's memory evenly), None where nothing says. The
    memory a device *has*, not what is free now, so that every rank of a run
    on like devices plans alike."""
    limits = []
    for device in devices:
        try:  # (another process's device does not say: its like is asked here)
            stats = device.memory_stats() or {}
        except Exception:  # noqa: BLE001 - jax raises for devices this process does not address
            stats = {}
        if "bytes_limit" in stats:
            limits.append(int(stats["bytes_limit"]))
    if limits:
        return fraction() * min(limits)
    total = host_total()
    return None if total is None or not devices else fraction() * total / len(devices)


# --------------------------------------------------------------------------- #
# the check
# --------------------------------------------------------------------------- #
_fits: dict[tuple[Need, ...], float] = {}
_lock = threading.Lock()


def check(needs: Sequence[Need], probes: Mapping[str, Probe] | None = None, *, shapes: Mapping[str, str],
          fixes: Mapping[str, str] | None = None) -> None:
    """Raise MemoryError (:func:`judge`'s message) where ``needs`` do not fit
    what their places have now: the host's as :func:`host_available` reads it,
    another place's as its probe in ``probes`` reports (None: it does not
    say). Needs that fit are not judged again for :data:`TTL` seconds."""
    if not needs or os.environ.get(ENV, "1").strip().lower() in ("0", "off", "no", "false"):
        return
    key = tuple(needs)
    now = time.monotonic()
    if now - _fits.get(key, -math.inf) <= TTL:
        return
    available: dict[str, int | None] = {}
    for place in {n.place for n in needs}:
        probe = (probes or {}).get(place)
        available[place] = host_available() if place == HOST else None if probe is None else _asked(probe)
    message = judge(needs, available, shapes=shapes, fixes=fixes)
    if message is not None:
        raise MemoryError(message)
    with _lock:
        if len(_fits) > 256:
            _fits.clear()
        _fits[key] = now


def fixes_for(spec: Any) -> dict[str, str]:
    """The fix a message gives, per operand that does not fit."""
    if spec.family == "numpy" and not spec.spmd:
        d = ("a numpy result is one array on the host: pass jax.Arrays (the result then stays split over the "
             "devices, each holding its block), run under mpiexec with a distribution that splits the result "
             "over the ranks, or multiply in pieces (row blocks of a)")
    else:
        d = ("use more devices or ranks, or ones with more memory, a distribution that splits the result rather "
             "than replicates it, or a smaller problem (in pieces: row blocks of a)")
    out = {"d": d, "c": d}
    if spec.family != "numpy" and not spec.spmd:
        out[f"d on {HOST}"] = (
            "CPU devices use the host's memory, so more of them do not help: run on devices of their own (GPUs), "
            "under mpiexec over several hosts with a distribution that splits the result, or multiply a smaller "
            "problem (in pieces: row blocks of a)")
    for op in ("a", "b"):
        out[op] = (f"give {op} a distribution that splits it, with an algorithm that keeps it split or moves "
                   f"its blocks around a ring rather than gathering it whole, more devices or ranks, or a "
                   f"smaller problem")
    return out


def check_product(backend: Any, spec: Any, operands: Any) -> None:
    """:func:`check` on what ``backend`` says the product of ``spec`` takes
    (its ``memory(spec, operands)``: needs and the probes of their places)."""
    needs, probes = backend.memory(spec, operands)
    if needs:
        check(needs, probes, shapes=operand_words(spec), fixes=fixes_for(spec))


def _asked(probe: Probe) -> int | None:
    try:
        return probe()
    except Exception:  # noqa: BLE001 - a device that cannot say what it has is not judged
        return None


def operand_words(spec: Any) -> dict[str, str]:
    """Each operand's words in a message: ``{"d": "the result, 100000 x 100000 float32", ...}``."""
    words = {"d": f"the result, {spec.m} x {spec.n} {spec.result_dtype}"}
    for op, shape in (("a", spec.a_shape), ("b", spec.b_shape)):
        words[op] = f"{shape[0]} x {shape[1]} {spec.dtype}"
    words["c"] = f"{spec.m} x {spec.n} {spec.result_dtype}"
    return words


def result_on_host(spec: Any, rank: int | None) -> list[Need]:
    """The needs of a backend that says nothing of its own: the result (this
    rank's block of it) comes back on the host."""
    shape = (spec.m, spec.n)
    if spec.spmd and spec.distributions is not None and rank is not None:
        shape = spec.distributions[2].shape(rank, shape, spec.nprocs)
    what = "the result's block as a numpy array" if spec.spmd else "the result"
    return [Need(HOST, "d", what, shape[0] * shape[1] * _result_itemsize(spec))]


def _result_itemsize(spec: Any) -> int:
    from ._spec import DTYPE_INFO  # (light: _spec imports numpy only)

    return DTYPE_INFO[spec.result_dtype].itemsize
