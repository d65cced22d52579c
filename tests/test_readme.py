"""The README as a newcomer uses it: every ```python block runs exactly as written,
in a fresh process (under ``mpiexec -n N`` where its first line says so), and
prints its check against numpy: ``True``."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, re.S | re.M)
#: the first line of a block that runs under MPI: ``# mpiexec -n 4 python example.py``
LAUNCH = re.compile(r"# mpiexec -n (\d+) python \S+\.py$")


def test_readme_is_short_and_has_one_example_per_way_in():
    words = len(README.split())
    assert words <= 1200, f"README.md has {words} words; move detail to docs/"
    assert len(BLOCKS) == 4, f"one example per way in (numpy, mpiexec, mesh, shard_map), found {len(BLOCKS)}"
    assert sum(bool(LAUNCH.match(b.splitlines()[0])) for b in BLOCKS) == 1, "one example runs under mpiexec"


def _id(block: str) -> str:
    first = block.splitlines()[0]
    return "mpiexec" if LAUNCH.match(first) else "shard_map" if "shard_map" in block else \
        "mesh" if "make_mesh" in block else "numpy"


@pytest.mark.parametrize("block", BLOCKS, ids=[_id(b) for b in BLOCKS])
def test_readme_example_runs_as_written_and_matches_numpy(block, tmp_path):
    pytest.importorskip("jax")
    script = tmp_path / "example.py"
    script.write_text(block)
    cmd = [sys.executable, str(script)]
    launch = LAUNCH.match(block.splitlines()[0])
    if launch:
        pytest.importorskip("mpi4py")
        beside = pathlib.Path(sys.executable).parent / "mpiexec"
        mpiexec = str(beside) if beside.exists() else shutil.which("mpiexec")
        if mpiexec is None:
            pytest.fail("mpi4py is installed but no mpiexec was found: pip install mpich (the 'mpi' extra)")
        cmd = [mpiexec, "-n", launch.group(1), *cmd]
    # a fresh process, as a reader's: none of this suite's JAX settings, on the CPU (the README says so)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "PMI_", "OMPI_"))}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    said = [line for line in proc.stdout.splitlines() if line.strip() and not line.startswith("[Gloo]")]
    shown = proc.stdout + proc.stderr[-3000:]
    assert proc.returncode == 0, shown
    assert said and said[-1].endswith("True"), shown
    assert not any(re.search(r"\bFalse\b", line) for line in said), shown
