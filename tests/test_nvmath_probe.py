"""What the nvmath backend finds installed (``dmatmul info``), from faked
wheel metadata and a faked driver: no nvmath, CuPy or CUDA needed.

Versions in the cases are those of real wheels (nvmath-python 1.0.0,
nvidia-cublasmp-cu13 0.9.1.3056, nvidia-nccl-cu13 2.32.3 / 2.28.9, nccl4py
0.3.1.post1, cupy-cuda13x 14.2.0); the rule checked is nvmath-python 1.0's
(cuBLASMp >= 0.8.0 and < 0.10) and cuBLASMp 0.8+'s (NCCL >= 2.29.2).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import dmatmul as dm
from dmatmul import backends
from dmatmul.backends.nvmath import _probe

ROOT = pathlib.Path(__file__).resolve().parents[1]
HINT = "pip install 'dmatmul[nvmath]' (CUDA 13) or 'dmatmul[nvmath-cu12]' (CUDA 12)"

CU13 = {"nvmath-python": "1.0.0", "nvidia-cublasmp-cu13": "0.9.1.3056", "nvidia-nccl-cu13": "2.32.3",
        "nccl4py": "0.3.1.post1", "cupy-cuda13x": "14.2.0", "mpi4py": "4.1.2"}
CU12 = {"nvmath-python": "1.0.0", "nvidia-cublasmp-cu12": "0.9.1.3056", "nvidia-nccl-cu12": "2.32.3",
        "nccl4py": "0.3.1.post1", "cupy-cuda12x": "14.2.0", "mpi4py": "4.1.2"}


def probe(dists, gpus=(1, "NVIDIA driver lists 1")):
    return _probe.installation(version_of=dists.get, gpus=lambda: gpus)


def test_a_complete_cuda13_install_is_usable():
    found = probe(CU13)
    assert found.reason is None and found.problems == () and found.notes == ()
    assert (found.nvmath, found.cublasmp, found.nccl, found.nccl4py, found.cupy, found.mpi4py) == (
        "1.0.0", "0.9.1.3056", "2.32.3", "0.3.1.post1", "14.2.0", "4.1.2")
    assert found.dists["cublasmp"] == "nvidia-cublasmp-cu13" and found.dists["nccl"] == "nvidia-nccl-cu13"
    text = "\n".join(found.lines())
    for words in ("nvmath-python 1.0.0", "cuBLASMp 0.9.1.3056 (nvidia-cublasmp-cu13)", "NCCL 2.32.3 (nvidia-nccl-cu13)",
                  "nccl4py 0.3.1.post1", "CuPy 14.2.0 (cupy-cuda13x)", "mpi4py 4.1.2", "CUDA GPUs visible: 1",
                  "usable as installed"):
        assert words in text, words


def test_a_complete_cuda12_install_is_usable():
    found = probe(CU12)
    assert found.reason is None
    assert found.dists == {"nvmath": "nvmath-python", "cublasmp": "nvidia-cublasmp-cu12", "nccl": "nvidia-nccl-cu12",
                           "nccl4py": "nccl4py", "cupy": "cupy-cuda12x", "mpi4py": "mpi4py"}


def test_nothing_installed():
    found = probe({}, gpus=(0, "no NVIDIA driver: /proc/driver/nvidia/gpus and /dev/nvidia* absent"))
    assert found.reason == f"nvmath-python not installed: {HINT}"
    assert "found: nvmath-python not installed, cuBLASMp not installed, NCCL not installed" in found.lines()[0]
    also = [line for line in found.lines() if line.startswith("also:")]
    assert any("no CUDA GPU visible (no NVIDIA driver" in line for line in also)
    assert not any(HINT in line for line in also)  # the fix is said once


def test_nccl_too_old_for_cublasmp():
    found = probe({**CU13, "nvidia-nccl-cu13": "2.28.9"})
    assert found.reason == ("NCCL 2.28.9 (nvidia-nccl-cu13) < 2.29.2 required by cuBLASMp 0.9.1.3056: "
                            "pip install -U 'nvidia-nccl-cu13>=2.29.2'")
    assert probe({**CU13, "nvidia-nccl-cu13": "2.29.2"}).reason is None  # the bound itself is fine


def test_the_extra_that_forgot_distributed():
    """What the old ``nvmath-python[cu13,distributed]`` installed: no cuBLASMp, NCCL or nccl4py."""
    dists = {k: v for k, v in CU13.items() if k not in ("nvidia-cublasmp-cu13", "nvidia-nccl-cu13", "nccl4py")}
    found = probe(dists)
    assert found.reason == f"cuBLASMp not installed (no nvidia-cublasmp-cu13 or -cu12 wheel): {HINT}"
    assert [p.split(" ")[0] for p in found.problems] == ["cuBLASMp", "NCCL", "nccl4py"]


@pytest.mark.parametrize("version,ok", [("0.7.0.125", False), ("0.8.0.2023", True), ("0.9.1.3056", True),
                                        ("0.10.0.3695", False)])
def test_cublasmp_range(version, ok):
    found = probe({**CU13, "nvidia-cublasmp-cu13": version})
    assert (found.reason is None) == ok
    if not ok:
        assert found.reason.startswith(f"cuBLASMp {version} (nvidia-cublasmp-cu13) found; nvmath-python 1.0 needs "
                                       "0.8.0 <= cuBLASMp < 0.10")


def test_nvmath_versions():
    assert "older than 1.0" in probe({**CU13, "nvmath-python": "0.9.0"}).reason
    newer = probe({**CU13, "nvmath-python": "1.1.0"})
    assert newer.reason is None and "newer than the 1.0 series" in newer.notes[0]


@pytest.mark.parametrize("missing,words", [("nccl4py", "nccl4py not installed"), ("cupy-cuda13x", "CuPy not installed"),
                                           ("mpi4py", "mpi4py not installed")])
def test_each_missing_package_is_named(missing, words):
    found = probe({k: v for k, v in CU13.items() if k != missing})
    assert found.reason.startswith(words) and found.reason.endswith(HINT)


def test_gpus():
    assert probe(CU13, gpus=(0, "CUDA_VISIBLE_DEVICES=-1 hides every GPU")).reason == (
        "no CUDA GPU visible (CUDA_VISIBLE_DEVICES=-1 hides every GPU); the nvmath backend needs an NVIDIA GPU")
    unknown = probe(CU13, gpus=(None, "cannot tell on win32 without loading CUDA"))
    assert unknown.reason is None and "checked when the backend starts" in unknown.notes[0]
    assert "CUDA GPUs visible: unknown" in unknown.lines()[1]


def test_several_flavours_are_noted():
    both = probe({**CU13, "nvidia-cublasmp-cu12": "0.9.1.3056"})
    assert both.reason is None and both.dists["cublasmp"] == "nvidia-cublasmp-cu13"
    assert any("several cuBLASMp wheels" in n for n in both.notes)
    mixed = probe({**{k: v for k, v in CU13.items() if k != "cupy-cuda13x"}, "cupy-cuda12x": "14.2.0"})
    assert any("different CUDA majors" in n for n in mixed.notes)
    # the NCCL of the cuBLASMp's CUDA major is the one judged
    pair = probe({**CU12, "nvidia-nccl-cu13": "2.28.9"})
    assert pair.dists["nccl"] == "nvidia-nccl-cu12" and pair.reason is None


# --------------------------------------------------------------------------- #
# GPUs from the driver's files
# --------------------------------------------------------------------------- #
@pytest.fixture
def driver(tmp_path):
    proc, dev = tmp_path / "proc", tmp_path / "dev"
    dev.mkdir()

    def make(ngpus, via="proc"):
        if via == "proc":
            proc.mkdir()
            for i in range(ngpus):
                (proc / f"0000:{i:02x}:00.0").mkdir()
        for i in range(ngpus):
            (dev / f"nvidia{i}").touch()
        (dev / "nvidiactl").touch()
        return str(proc), str(dev)

    return make


@pytest.mark.parametrize("cvd,want", [(None, 2), ("1", 1), ("0,1", 2), ("0,5,1", 1), ("-1", 0), ("", 0),
                                      ("GPU-8a1e", 1), ("1,0,1,0", 2)])
def test_visible_gpus_from_proc(driver, cvd, want):
    proc, dev = driver(2)
    env = {} if cvd is None else {"CUDA_VISIBLE_DEVICES": cvd}
    n, how = _probe.visible_gpus(env, proc=proc, dev=dev, platform="linux")
    assert n == want, how


def test_visible_gpus_from_device_nodes_and_none(driver, tmp_path):
    proc, dev = driver(3, via="dev")
    assert _probe.visible_gpus({}, proc=proc, dev=dev, platform="linux")[0] == 3
    empty = tmp_path / "empty"
    empty.mkdir()
    n, how = _probe.visible_gpus({}, proc=str(empty / "x"), dev=str(empty), platform="linux")
    assert n == 0 and how.startswith("no NVIDIA driver")
    assert _probe.visible_gpus({}, platform="darwin")[0] == 0
    assert _probe.visible_gpus({}, platform="win32")[0] is None


# --------------------------------------------------------------------------- #
# the real metadata, the import discipline, the command line
# --------------------------------------------------------------------------- #
def test_reads_this_environments_metadata():
    found = _probe.installation()
    for attr, dist in (("mpi4py", "mpi4py"), ("nvmath", "nvmath-python")):
        try:
            want = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            want = None
        assert getattr(found, attr) == want


def test_probe_imports_nothing_heavy_and_loads_no_cuda():
    code = (
        "import sys, dmatmul.backends.nvmath as nv\n"
        "found = nv.installation()\n"
        "heavy = [m for m in ('jax', 'nvmath', 'cupy', 'mpi4py', 'nccl', 'cuda') if m in sys.modules]\n"
        "maps = open('/proc/self/maps').read() if sys.platform.startswith('linux') else ''\n"
        "print(heavy, [lib for lib in ('libcuda', 'libcudart', 'libnccl', 'libcublasMp') if lib in maps])\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] []"


def test_cli_info_prints_the_installation(monkeypatch, capsys):
    from dmatmul import cli
    from dmatmul.backends import nvmath as nv

    monkeypatch.setattr(nv, "installation", lambda: probe({**CU13, "nvidia-nccl-cu13": "2.28.9"}))
    assert cli.main(["info", "-v"]) == 0
    out = capsys.readouterr().out
    assert "backend nvmath : " in out
    assert "  found: nvmath-python 1.0.0, cuBLASMp 0.9.1.3056 (nvidia-cublasmp-cu13), NCCL 2.28.9" in out
    assert "  CUDA GPUs visible: 1" in out
    assert "  not usable: NCCL 2.28.9 (nvidia-nccl-cu13) < 2.29.2 required by cuBLASMp 0.9.1.3056" in out
    # the libraries loaded and passed (seen on a GPU machine whose libnccl.so.2 was replaced by a newer one):
    # the metadata's complaint is told as such, not as "not usable" under "backend nvmath : available"
    monkeypatch.setattr(nv, "_passed", lambda: True)
    assert cli.main(["info", "-v"]) == 0
    out = capsys.readouterr().out
    assert "not usable" not in out
    said = [line for line in out.splitlines() if "metadata says" in line]
    assert len(said) == 1 and said[0].startswith(
        "  the wheels' metadata says: NCCL 2.28.9 (nvidia-nccl-cu13) < 2.29.2 required by cuBLASMp 0.9.1.3056")
    assert "but the libraries loaded here passed the start-up check" in said[0]


# --------------------------------------------------------------------------- #
# unavailable(): the runtime gate, against the fake nvmath
# --------------------------------------------------------------------------- #
# the fake_nvmath fixture comes from conftest.py


def test_unavailable_without_nccl4py(fake_nvmath):
    nv = importlib.import_module("dmatmul.backends.nvmath")
    if importlib.util.find_spec("nccl") is not None and "nccl" not in sys.modules:
        pytest.skip("a real nccl4py is installed here")
    del sys.modules["nccl"], sys.modules["nccl.core"]
    nv.unavailable.cache_clear()
    reason = nv.unavailable()
    assert reason is not None and reason.startswith("nccl4py not installed") and "dmatmul[nvmath]" in reason
    assert backends.resolve("auto").name == "jax"


def test_unavailable_says_what_the_wheels_say_when_cublasmp_does_not_load(fake_nvmath, monkeypatch):
    nv = importlib.import_module("dmatmul.backends.nvmath")

    def broken():
        raise OSError("libcublasMp.so.0: undefined symbol: ncclCommQueryProperties")

    monkeypatch.setattr(sys.modules["nvmath.bindings.cublasMp"], "get_version", broken)
    monkeypatch.setattr(_probe, "_metadata_version", {**CU13, "nvidia-nccl-cu13": "2.28.9"}.get)
    nv.unavailable.cache_clear()
    reason = nv.unavailable()
    assert reason.startswith("the cuBLASMp library could not be loaded (OSError: libcublasMp.so.0: undefined symbol")
    assert "NCCL 2.28.9 (nvidia-nccl-cu13) < 2.29.2 required by cuBLASMp 0.9.1.3056" in reason
    with pytest.raises(RuntimeError, match="NCCL 2.28.9"):
        dm.matmul(np.ones((2, 2)), np.ones((2, 2)), backend="nvmath")


def test_wheel_metadata_does_not_overrule_the_loaded_library(fake_nvmath, monkeypatch):
    """A replaced libnccl under an old wheel (as on the project's GPU machine):
    cuBLASMp loads, so the backend is available whatever the metadata says."""
    nv = importlib.import_module("dmatmul.backends.nvmath")
    monkeypatch.setattr(_probe, "_metadata_version", {**CU13, "nvidia-nccl-cu13": "2.28.9"}.get)
    nv.unavailable.cache_clear()
    assert nv.unavailable() is None
    assert nv.installation().reason.startswith("NCCL 2.28.9")


def test_doctests():
    import doctest

    result = doctest.testmod(_probe, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# --------------------------------------------------------------------------- #
# ranks that would share a GPU: backend="auto" passes nvmath over
# --------------------------------------------------------------------------- #
def _nodes(views_by_rank, per_node):
    """Runtime.nodes for ranks placed ``per_node`` to a node, rank r telling ``views_by_rank[r]``."""
    return tuple((r - r % per_node, r % per_node, (("nvmath", view),) if view is not None else ())
                 for r, view in enumerate(views_by_rank))


@pytest.mark.parametrize("views, per_node, rank, want", [
    ([(None, 1)] * 8, 8, 0, "8 ranks on this node share 1 GPU; "),
    ([(None, 4)] * 8, 8, 5, "8 ranks on this node share 4 GPUs; "),
    ([("2,3", 2)] * 4, 4, 0, "4 ranks on this node share 2 GPUs; "),
    ([(None, 4)] * 8, 4, 0, None),  # 4 ranks on each node of 4 GPUs
    ([(str(r % 4), 1) for r in range(8)], 4, 1, None),  # CUDA_VISIBLE_DEVICES: one GPU per rank
    ([(None, 2)] * 2 + [(None, 1)] * 2, 2, 0, "2 ranks on the node of rank 2 share 1 GPU; "),
    ([(None, 1), None], 2, 0, None),  # rank 1 sees no GPU: its own probe refuses nvmath
])
def test_shared_gpus(views, per_node, rank, want):
    from dmatmul.backends import nvmath as nv

    why = nv.shared_gpus(_nodes(views, per_node), rank)
    if want is None:
        assert why is None
    else:
        assert why.startswith(want) and "cuBLASMp needs one GPU per rank (NCCL refuses two ranks on one GPU)" in why
        gpus = int(want.split(" share ")[1].split()[0])
        assert f"launch at most {gpus} rank{'s' if gpus > 1 else ''} per node" in why


def test_auto_passes_nvmath_over_where_ranks_share_a_gpu(fake_nvmath, monkeypatch):
    """In process, a runtime of 2 ranks on a node of one GPU (as dm.init
    gathers it): probe() refuses nvmath, saying why; backend="auto" resolves
    to JAX; backend="nvmath" raises a RuntimeError; one GPU each: nvmath."""
    from dmatmul import _runtime, _world

    crowded = _runtime.Runtime(rank=1, size=2, comm=None, local_rank=1, nodes=_nodes([(None, 1)] * 2, 2))
    monkeypatch.setattr(_world, "_state", crowded)
    why = "2 ranks on this node share 1 GPU; cuBLASMp needs one GPU per rank"
    assert backends.passed_over("nvmath").startswith(why) and backends.probe("nvmath").startswith(why)
    assert backends.passed_over("jax") is None
    assert backends.resolve("auto").name == "jax"
    with pytest.raises(RuntimeError, match="backend='nvmath' is not available: " + why):
        backends.get("nvmath")
    apart = dataclasses.replace(crowded, nodes=_nodes([("0", 1), ("1", 1)], 2))
    monkeypatch.setattr(_world, "_state", apart)
    assert backends.probe("nvmath") is None and backends.resolve("auto").name == "nvmath"
