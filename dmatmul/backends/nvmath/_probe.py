"""What the nvmath backend would run on here, read without running it.

:func:`installation` reads the installed wheels' metadata (``importlib.metadata``:
nvmath-python, the cuBLASMp and NCCL wheels of CUDA 13 or 12, nccl4py, CuPy,
mpi4py) and whether the NVIDIA driver shows a GPU (``/proc/driver/nvidia``,
``/dev/nvidia*``, ``CUDA_VISIBLE_DEVICES``). It imports none of nvmath, CuPy,
MPI or JAX and loads no CUDA library, so ``dmatmul info`` can say what it found
and why the backend is or is not usable on a machine where loading CUDA would
fail. Both sources are parameters, so tests can fake them.

What metadata cannot see (a system cuBLASMp or NCCL on the library path, a
library file replaced in place) is checked when the backend starts:
:func:`dmatmul.backends.nvmath.unavailable` loads cuBLASMp and reads its version.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Callable, Mapping

__all__ = ["Installation", "installation", "visible_gpus", "NCCL_FOR_CUBLASMP", "CUBLASMP_RANGE", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'dmatmul[nvmath]' (CUDA 13) or 'dmatmul[nvmath-cu12]' (CUDA 12)"
#: cuBLASMp versions nvmath-python 1.0's distributed Matmul runs on (its code: ">= 0.8.0";
#: its extras: "< 0.10")
CUBLASMP_RANGE = ((0, 8, 0), (0, 10))
#: cuBLASMp 0.8+ needs NCCL 2.29.2 or newer
NCCL_FOR_CUBLASMP = (2, 29, 2)
NVMATH_RANGE = ((1, 0), (1, 1))

_CUDA = ("13", "12")
_CUPY = ("cupy-cuda13x", "cupy-cuda12x", "cupy")


def _vt(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: "0.3.1.post1" -> (0, 3, 1)."""
    parts = []
    for piece in re.split(r"[.+\-]", version):
        m = re.match(r"\d+", piece)
        if m is None:
            break
        parts.append(int(m.group()))
        if m.end() != len(piece):
            break
    return tuple(parts)


def _vs(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def _metadata_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------------- #
# GPUs, as the driver shows them (no CUDA call)
# --------------------------------------------------------------------------- #
def _cuda_visible(value: str, ngpus: int | None) -> int:
    """How many devices ``CUDA_VISIBLE_DEVICES=value`` leaves: CUDA reads the
    list up to its first invalid entry."""
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if entry.startswith(("GPU-", "MIG-")):
            count += 1
            continue
        if not re.fullmatch(r"\d+", entry) or (ngpus is not None and int(entry) >= ngpus):
            break
        count += 1
    return count if ngpus is None else min(count, ngpus)


def visible_gpus(environ: Mapping[str, str] | None = None, proc: str = "/proc/driver/nvidia/gpus",
                 dev: str = "/dev", platform: str | None = None) -> tuple[int | None, str]:
    """(CUDA GPUs visible to this process, or None when it cannot tell; how it was found).

    >>> visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"})
    (0, 'CUDA_VISIBLE_DEVICES=-1 hides every GPU')
    """
    environ = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and _cuda_visible(cvd, None) == 0:
        return 0, f"CUDA_VISIBLE_DEVICES={cvd} hides every GPU"
    if platform.startswith("linux"):
        if os.path.isdir(proc):
            n: int | None = len(os.listdir(proc))
            how = f"NVIDIA driver lists {n} ({proc})"
        elif os.path.isdir(dev) and any(re.fullmatch(r"nvidia\d+", e) for e in os.listdir(dev)):
            n = sum(1 for e in os.listdir(dev) if re.fullmatch(r"nvidia\d+", e))
            how = f"{n} NVIDIA device node(s) in {dev}"
        else:
            return 0, f"no NVIDIA driver: {proc} and {dev}/nvidia* absent"
    elif platform == "darwin":
        return 0, "macOS has no CUDA"
    else:
        return None, f"cannot tell on {platform} without loading CUDA"
    if cvd is not None:
        n = _cuda_visible(cvd, n)
        how += f", CUDA_VISIBLE_DEVICES={cvd}"
    return n, how


# --------------------------------------------------------------------------- #
# the installation
# --------------------------------------------------------------------------- #
@dataclasses.dataclass(frozen=True)
class Installation:
    """What :func:`installation` found. Versions are strings (None: not
    installed); ``dists`` names the wheel each came from."""

    nvmath: str | None
    cublasmp: str | None
    nccl: str | None
    nccl4py: str | None
    cupy: str | None
    mpi4py: str | None
    gpus: int | None
    gpus_how: str
    dists: Mapping[str, str]
    problems: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def reason(self) -> str | None:
        """Why the nvmath backend cannot run here, as far as metadata tells; None: nothing found against it."""
        return self.problems[0] if self.problems else None

    def found(self) -> str:
        """One line: each package and its version."""
        parts = []
        for key, label in (("nvmath", "nvmath-python"), ("cublasmp", "cuBLASMp"), ("nccl", "NCCL"),
                           ("nccl4py", "nccl4py"), ("cupy", "CuPy"), ("mpi4py", "mpi4py")):
            version = getattr(self, key)
            dist = self.dists.get(key)
            shown = "not installed" if version is None else version
            if version is not None and dist is not None and dist.lower() != label.lower():
                shown += f" ({dist})"
            parts.append(f"{label} {shown}")
        return ", ".join(parts)

    def lines(self, loaded: bool = False) -> list[str]:
        """What ``dmatmul info`` prints; ``loaded``: the backend's libraries were
        loaded and passed (a problem the metadata shows is then not the last word)."""
        gpus = "unknown" if self.gpus is None else str(self.gpus)
        out = [f"found: {self.found()}", f"CUDA GPUs visible: {gpus} ({self.gpus_how})"]
        if self.problems and loaded:
            out.append(f"the wheels' metadata says: {self.problems[0]}; but the libraries loaded here passed the "
                       "start-up check (a library replaced in place, or another one on the library path)")
        elif self.problems:
            out.append(f"not usable: {self.problems[0]}")
            hint = f": {INSTALL_HINT}"
            out.extend(f"also: {p.removesuffix(hint) if self.problems[0].endswith(hint) else p}"
                       for p in self.problems[1:])
        else:
            out.append("usable as installed: nvmath-python 1.0, cuBLASMp with a new enough NCCL, nccl4py, CuPy, "
                       "mpi4py and a GPU (the libraries are loaded when the backend starts)")
        out.extend(f"note: {n}" for n in self.notes)
        return out


def installation(version_of: Callable[[str], str | None] | None = None,
                 gpus: Callable[[], tuple[int | None, str]] | None = None) -> Installation:
    """Read the nvmath backend's installation (no import of nvmath or CuPy, no CUDA).

    ``version_of(dist)`` gives a distribution's version or None (default:
    ``importlib.metadata``); ``gpus()`` gives ``(count or None, how)``
    (default: :func:`visible_gpus`).
    """
    version_of = _metadata_version if version_of is None else version_of
    gpus = visible_gpus if gpus is None else gpus
    dists: dict[str, str] = {}
    problems: list[str] = []
    notes: list[str] = []

    def first(key: str, label: str, candidates: tuple[str, ...]) -> str | None:
        """The version of the first of ``candidates`` installed (recorded in ``dists[key]``)."""
        found = [(d, v) for d in candidates if (v := version_of(d)) is not None]
        if not found:
            return None
        if len(found) > 1:
            notes.append(f"several {label} wheels installed: {', '.join(f'{d} {v}' for d, v in found)}; "
                         f"{found[0][0]} is reported")
        dists[key] = found[0][0]
        return found[0][1]

    nvmath = first("nvmath", "nvmath-python", ("nvmath-python",))
    cublasmp = first("cublasmp", "cuBLASMp", tuple(f"nvidia-cublasmp-cu{c}" for c in _CUDA))
    cuda = dists["cublasmp"][-2:] if "cublasmp" in dists else None
    # the NCCL of the cuBLASMp's CUDA major first
    nccl_cudas = (cuda, *(c for c in _CUDA if c != cuda)) if cuda else _CUDA
    nccl = first("nccl", "NCCL", tuple(f"nvidia-nccl-cu{c}" for c in nccl_cudas))
    nccl4py = first("nccl4py", "nccl4py", ("nccl4py",))
    cupy = first("cupy", "CuPy", _CUPY)
    mpi4py = first("mpi4py", "mpi4py", ("mpi4py",))
    ngpus, how = gpus()

    if nvmath is None:
        problems.append(f"nvmath-python not installed: {INSTALL_HINT}")
    elif not NVMATH_RANGE[0] <= _vt(nvmath)[:2] < NVMATH_RANGE[1]:
        if _vt(nvmath) < NVMATH_RANGE[0]:
            problems.append(f"nvmath-python {nvmath} is older than 1.0, which dmatmul needs "
                            f"(nvmath.distributed.linalg.advanced.Matmul): {INSTALL_HINT}")
        else:
            notes.append(f"nvmath-python {nvmath} is newer than the 1.0 series dmatmul is written against")
    if cublasmp is None:
        problems.append(f"cuBLASMp not installed (no nvidia-cublasmp-cu13 or -cu12 wheel): {INSTALL_HINT}")
    else:
        low, below = CUBLASMP_RANGE
        if not low <= _vt(cublasmp) < below:
            problems.append(f"cuBLASMp {cublasmp} ({dists['cublasmp']}) found; nvmath-python 1.0 needs "
                            f"{_vs(low)} <= cuBLASMp < {_vs(below)}: {INSTALL_HINT}")
    needs_nccl = cublasmp is not None and _vt(cublasmp) >= (0, 8)
    if nccl is None:
        problems.append(f"NCCL not installed (no nvidia-nccl-cu13 or -cu12 wheel): {INSTALL_HINT}")
    elif needs_nccl and _vt(nccl) < NCCL_FOR_CUBLASMP:
        problems.append(f"NCCL {nccl} ({dists['nccl']}) < {_vs(NCCL_FOR_CUBLASMP)} required by cuBLASMp "
                        f"{cublasmp}: pip install -U '{dists['nccl']}>={_vs(NCCL_FOR_CUBLASMP)}'")
    if nccl4py is None:
        problems.append(f"nccl4py not installed (nvmath.distributed starts NCCL through it): {INSTALL_HINT}")
    if cupy is None:
        problems.append(f"CuPy not installed: {INSTALL_HINT}")
    if mpi4py is None:
        problems.append(f"mpi4py not installed (nvmath.distributed bootstraps over MPI): {INSTALL_HINT}")
    if ngpus == 0:
        problems.append(f"no CUDA GPU visible ({how}); the nvmath backend needs an NVIDIA GPU")
    elif ngpus is None:
        notes.append(f"whether a CUDA GPU is visible is checked when the backend starts ({how})")
    flavours = {d: d.rsplit("-", 1)[-1] for d in (dists.get("cublasmp"), dists.get("nccl"), dists.get("cupy")) if d}
    majors = {re.sub(r"\D", "", f)[:2] for f in flavours.values() if re.search(r"\d", f)}
    if len(majors) > 1:
        notes.append(f"wheels for different CUDA majors: {', '.join(sorted(flavours))}; install one flavour "
                     f"({INSTALL_HINT})")
    return Installation(nvmath, cublasmp, nccl, nccl4py, cupy, mpi4py, ngpus, how, dists, tuple(problems),
                        tuple(notes))

