"""Gloo's connection lines kept out of the user's output.

JAX runs the collectives of several CPU processes on gloo, whose TCP
transport writes ``[Gloo] Rank r is connected to n peer ranks. Expected
number of connected peer ranks is : n`` to ``std::cout`` each time it
connects a communicator: at the first collective of each group of processes
(XLA makes one per replica group, lazily), so anywhere in a run, from a
thread of XLA's, between the user's own lines. It is a plain ``std::cout``,
not gloo's logging: no setting turns it off, and no Python call brackets it.

So while dmatmul's JAX process group runs on CPU (:func:`start`, called
when it starts), this process's stdout (fd 1) is a pipe, read by a thread
that passes everything on to the original stdout at once, except those
lines. ``DMATMUL_VERBOSE=1`` (any value but empty or ``0``) leaves stdout
alone. :func:`stop` (at exit, and before an uncaught exception aborts the
job) puts the original stdout back after passing on what was written.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading
from collections.abc import Mapping

__all__ = ["VERBOSE_ENV", "verbose", "start", "stop", "active", "drop_gloo_lines"]

VERBOSE_ENV = "DMATMUL_VERBOSE"
_LINE = re.compile(rb"\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. "
                   rb"Expected number of connected peer ranks is : \d+\r?\n")
_PREFIX = b"[Gloo] Rank "

_lock = threading.Lock()
_running: tuple[int, threading.Thread] | None = None  # (the original stdout, the thread passing the pipe on to it)
_registered = False


def verbose(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the user asked for the libraries' own output (``DMATMUL_VERBOSE``).

    >>> verbose({}), verbose({"DMATMUL_VERBOSE": "0"}), verbose({"DMATMUL_VERBOSE": "1"})
    (False, False, True)
    """
    value = (os.environ if environ is None else environ).get(VERBOSE_ENV, "")
    return value.strip() not in ("", "0")


def drop_gloo_lines(data: bytes) -> tuple[bytes, bytes]:
    """``data`` read from the pipe: (what to pass on now, what to hold until
    more comes). Gloo's lines go, wherever they start (its write can land in
    the middle of a line another thread has not ended yet); the unended tail
    is held only from where a gloo line may be starting.

    >>> drop_gloo_lines(b"a\\n[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected "
    ...                 b"peer ranks is : 1\\nb\\n")
    (b'a\\nb\\n', b'')
    >>> drop_gloo_lines(b"progress 10%"), drop_gloo_lines(b"x\\n[Gloo] Ra"), drop_gloo_lines(b"y [")
    ((b'progress 10%', b''), (b'x\\n', b'[Gloo] Ra'), (b'y ', b'['))
    """
    data = _LINE.sub(b"", data)
    start = data.rfind(b"\n") + 1  # the unended last line
    tail = data[start:]
    at = tail.find(_PREFIX)
    if at < 0:  # a tail ending in the beginning of the prefix
        at = next((p for p in range(max(0, len(tail) - len(_PREFIX) + 1), len(tail))
                   if _PREFIX.startswith(tail[p:])), -1)
    if at < 0:
        return data, b""
    return data[:start + at], data[start + at:]


def _write_all(fd: int, data: bytes) -> bool:
    while data:
        try:
            n = os.write(fd, data)
        except InterruptedError:
            continue
        except OSError:  # the original stdout is gone (closed, a broken pipe): nothing to pass on to
            return False
        data = data[n:]
    return True


def _pass_on(pipe: int, out: int) -> None:
    held = b""
    writable = True
    while True:
        try:
            chunk = os.read(pipe, 1 << 16)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        now, held = drop_gloo_lines(held + chunk)
        if now and writable:
            writable = _write_all(out, now)
    if held and writable:
        _write_all(out, held)
    os.close(pipe)


def active() -> bool:
    """Whether stdout runs through the filter now."""
    return _running is not None


def start() -> None:
    """Filter this process's stdout from now on (idempotent; nothing where
    ``DMATMUL_VERBOSE`` is set, or off POSIX)."""
    global _running, _registered
    if _running is not None or verbose() or os.name != "posix":
        return
    with _lock:
        if _running is not None:
            return
        for stream in (sys.stdout, sys.__stdout__):
            if stream is not None:
                stream.flush()
        original = os.dup(1)
        pipe, end = os.pipe()
        os.set_inheritable(original, False)
        os.dup2(end, 1)  # (fd 1 stays inheritable: a child process writes through the filter too)
        os.close(end)
        thread = threading.Thread(target=_pass_on, args=(pipe, original), name="dmatmul-stdout", daemon=True)
        thread.start()
        _running = (original, thread)
        if not _registered:
            atexit.register(stop)
            _registered = True


def stop(wait: float = 2.0) -> None:
    """The original stdout back as fd 1, once what was written before has been
    passed on (waiting at most ``wait`` seconds: a child process that still
    holds the pipe keeps it open)."""
    global _running
    with _lock:
        if _running is None:
            return
        original, thread = _running
        _running = None
        for stream in (sys.stdout, sys.__stdout__):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):  # closed by the user
                pass
        os.dup2(original, 1)  # the pipe's last write end closes: the thread reads to its end and stops
        thread.join(wait)
        if not thread.is_alive():
            os.close(original)
