"""The install extras for the nvmath backend (contract section 7).

``dmatmul[nvmath]`` (CUDA 13) and ``dmatmul[nvmath-cu12]`` (CUDA 12) must bring
everything cuBLASMp needs: nvmath-python with its *distributed* extra (which
pins cuBLASMp, NCCL and nccl4py), CuPy for that CUDA, mpi4py.

Two layers:

* a fast metadata test: each extra names an nvmath-python extra that exists
  (table below, copied from nvmath-python 1.0.0's wheel METADATA) and the
  CuPy of the same CUDA major;
* a resolver test (marked ``network``): ``pip install --dry-run --report`` of
  ``.[nvmath]`` / ``.[nvmath-cu12]`` against the package index; the report
  must contain cuBLASMp, an NCCL new enough for it and nccl4py. It downloads
  only metadata (no CUDA wheels), about 20-30 s for both extras, run side by
  side. It is skipped only when the index cannot be reached; any other pip
  failure fails the test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

packaging = pytest.importorskip("packaging")
from packaging.requirements import Requirement  # noqa: E402
from packaging.version import Version  # noqa: E402

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: nvmath-python 1.0.0's extras. Source: the ``Provides-Extra`` lines of
#: nvmath_python-1.0.0-cp311-cp311-manylinux_2_28_x86_64.whl's METADATA
#: (``pip download --no-deps nvmath-python==1.0.0``). There is no plain
#: ``distributed`` extra: cuBLASMp, NCCL and nccl4py come with ``cu13-distributed``
#: / ``cu12-distributed`` (or ``sysctk1x-distributed`` over a system CUDA toolkit).
#: The resolver test below checks this table against the index's metadata.
NVMATH_1_0_EXTRAS = frozenset({
    "cpu", "numba",
    "cu12", "cu12-dx", "cu12-distributed", "sysctk12", "sysctk12-dx", "sysctk12-distributed",
    "cu13", "cu13-dx", "cu13-distributed", "sysctk13", "sysctk13-dx", "sysctk13-distributed",
})
#: What nvmath-python 1.0.0 pins in those extras (same METADATA):
#:   cu13-distributed: nvidia-cublasmp-cu13<0.10,>=0.8.1; via sysctk13-distributed:
#:                     nvidia-nccl-cu13>=2.29.2, nccl4py<0.4,>=0.3.1 (all: platform_system == "Linux")
#:   cu12-distributed: the same with -cu12.
#: cuBLASMp 0.8+ needs NCCL >= 2.29.2.
NCCL_FOR_CUBLASMP = Version("2.29.2")

#: dmatmul extra -> (CUDA major, the nvmath-python extra it must use, the CuPy wheel)
EXTRAS = {
    "nvmath": ("13", "cu13-distributed", "cupy-cuda13x"),
    "nvmath-cu12": ("12", "cu12-distributed", "cupy-cuda12x"),
}


def optional_dependencies() -> dict[str, list[Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {name: [Requirement(r) for r in reqs] for name, reqs in project["optional-dependencies"].items()}


# --------------------------------------------------------------------------- #
# metadata only (fast, offline)
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_extra_names_nvmaths_distributed_extra_cupy_and_mpi4py(extra):
    cuda, nvmath_extra, cupy = EXTRAS[extra]
    deps = optional_dependencies()
    assert extra in deps, f"pyproject.toml has no [{extra}] extra (contract section 7)"
    by_name = {r.name.lower(): r for r in deps[extra]}
    nvmath = by_name.get("nvmath-python")
    assert nvmath is not None, f"[{extra}] does not require nvmath-python"
    unknown = set(nvmath.extras) - NVMATH_1_0_EXTRAS
    assert not unknown, (f"[{extra}] asks for nvmath-python extras {sorted(unknown)}, which nvmath-python 1.0 does not "
                         f"have (pip ignores them silently); known: {sorted(NVMATH_1_0_EXTRAS)}")
    assert nvmath_extra in nvmath.extras, \
        f"[{extra}] must ask for nvmath-python[{nvmath_extra}] (cuBLASMp, NCCL, nccl4py)"
    other = {"13": "12", "12": "13"}[cuda]
    assert not any(other in e for e in nvmath.extras), f"[{extra}] mixes CUDA {cuda} and CUDA {other} extras"
    assert nvmath.specifier.contains("1.0.0") and not nvmath.specifier.contains("1.1.0"), \
        f"[{extra}] must pin nvmath-python 1.0.x (the API dmatmul is written against), got {nvmath.specifier}"
    assert cupy in by_name, f"[{extra}] must bring {cupy} (CuPy for CUDA {cuda})"
    assert not any(n.startswith("cupy") and n != cupy for n in by_name), f"[{extra}] names another CuPy"
    assert "mpi4py" in by_name, f"[{extra}] must bring mpi4py (nvmath.distributed bootstraps over MPI)"
    assert by_name["mpi4py"].specifier.contains("4.0.0")


def test_nvmath_extras_are_the_two_documented_ones():
    deps = optional_dependencies()
    assert {name for name in deps if name.startswith("nvmath")} == set(EXTRAS)


# --------------------------------------------------------------------------- #
# the resolver (package index needed)
# --------------------------------------------------------------------------- #
def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]


def _index_unreachable() -> str | None:
    """Why the package index cannot be used from here, or None when it can."""
    try:
        out = subprocess.run(_pip("index", "versions", "nvmath-python", "--retries", "1", "--timeout", "20"),
                             capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "pip index versions nvmath-python timed out after 120 s"
    if out.returncode == 0 and "nvmath-python (" in out.stdout:
        return None
    tail = " ".join((out.stdout + out.stderr).split())[-300:]
    return f"pip index versions nvmath-python failed (exit {out.returncode}): {tail}"


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory):
    """Both extras resolved side by side: {extra: (returncode, stderr, report or None)}."""
    if importlib.util.find_spec("pip") is None:
        pytest.skip("pip is not installed in this environment (the resolver test runs pip --dry-run)")
    reason = _index_unreachable()
    if reason is not None:
        pytest.skip(f"package index unreachable, extras not resolved: {reason}")
    base = tmp_path_factory.mktemp("resolve")
    procs = {}
    for extra in EXTRAS:
        # a copy of the project per run: pip writes egg-info next to pyproject.toml
        src = base / extra / "src"
        src.mkdir(parents=True)
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            if (ROOT / name).exists():
                shutil.copy(ROOT / name, src / name)
        shutil.copytree(ROOT / "dmatmul", src / "dmatmul", ignore=shutil.ignore_patterns("__pycache__"))
        report = base / extra / "report.json"
        cmd = _pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
                   f"{src}[{extra}]")
        env = {k: v for k, v in os.environ.items() if k not in ("PIP_NO_INDEX", "PIP_REQUIRE_VIRTUALENV")}
        procs[extra] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env),
                        report)
    out = {}
    for extra, (proc, report) in procs.items():
        try:
            _, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            err = "timed out after 600 s\n" + err
        data = json.loads(report.read_text()) if proc.returncode == 0 and report.exists() else None
        out[extra] = (proc.returncode, err, data)
    return out


@pytest.mark.network
@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_extra_resolves_to_cublasmp_nccl_and_nccl4py(resolutions, extra):
    cuda, nvmath_extra, cupy = EXTRAS[extra]
    rc, err, report = resolutions[extra]
    errors = "\n".join(line for line in err.splitlines() if "WARNING: Location" not in line)
    assert rc == 0 and report is not None, f"pip could not resolve .[{extra}] (exit {rc}):\n{errors[-4000:]}"
    got = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"] for item in report["install"]}
    versions = {name: Version(meta["version"]) for name, meta in got.items()}

    nvmath = got.get("nvmath-python")
    assert nvmath is not None and Version(nvmath["version"]).release[:2] == (1, 0), sorted(got)
    # the table of the metadata test is nvmath-python's own list of extras
    assert set(nvmath.get("provides_extra", [])) == NVMATH_1_0_EXTRAS

    missing = [n for n in (f"nvidia-cublasmp-cu{cuda}", f"nvidia-nccl-cu{cuda}", "nccl4py", cupy, "mpi4py")
               if n not in got]
    assert not missing, f".[{extra}] resolves without {missing}: {sorted(got)}"
    cublasmp = versions[f"nvidia-cublasmp-cu{cuda}"]
    assert Version("0.8.1") <= cublasmp < Version("0.10"), f"cuBLASMp {cublasmp}: nvmath-python 1.0 pins >=0.8.1,<0.10"
    nccl = versions[f"nvidia-nccl-cu{cuda}"]
    assert nccl >= NCCL_FOR_CUBLASMP, f"NCCL {nccl} < {NCCL_FOR_CUBLASMP}, which cuBLASMp {cublasmp} needs"
    assert Version("0.3.1") <= versions["nccl4py"] < Version("0.4"), versions["nccl4py"]
    other = {"13": "12", "12": "13"}[cuda]
    wrong = sorted(n for n in got if n.endswith(f"-cu{other}") or n == f"cupy-cuda{other}x")
    assert not wrong, f".[{extra}] (CUDA {cuda}) pulls CUDA {other} packages: {wrong}"


def test_readme_says_how_to_install_every_extra():
    """README.md names each extra as a pip target (``".[nvmath]"``), and only
    extras that pyproject.toml has: pip ignores an unknown one silently."""
    readme = (ROOT / "README.md").read_text()
    named = {extra for group in re.findall(r'"\.\[([a-z0-9,-]+)\]"', readme) for extra in group.split(",")}
    declared = set(optional_dependencies())
    assert declared <= named, f"README.md never says how to install {sorted(declared - named)}"
    assert named <= declared, f"README.md names extras pyproject.toml lacks: {sorted(named - declared)}"
