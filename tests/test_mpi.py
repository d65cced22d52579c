"""The mpirun mode, through real ``mpiexec`` launches (subprocesses with timeouts).

Each launch runs a script of tests/mpi/ or mpi_examples/ that checks its own
results against numpy on every rank and exits non-zero on any mismatch.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("mpi4py")
pytest.importorskip("jax")

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.mpi


def mpiexec() -> str:
    beside = pathlib.Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.fail("mpi4py is installed but no mpiexec was found: pip install mpich (the 'mpi' extra)")
    return found


def launch(n: int, script: str, *args: str, timeout: float = 300,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``mpiexec -n n python script args`` (``script`` "-m" runs a module), ``env`` added to the environment."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PMI_", "OMPI_", "DMATMUL_VERBOSE"))},
           "JAX_PLATFORMS": "cpu", **(env or {})}
    target = [script] if script == "-m" else [str(ROOT / script)]
    cmd = [mpiexec(), "-n", str(n), sys.executable, *target, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def output(proc: subprocess.CompletedProcess[str]) -> str:
    return "\n".join(line for line in (proc.stdout + proc.stderr).splitlines() if not line.startswith("[Gloo]"))


@pytest.mark.parametrize("n, mode", [(2, "one-gpu"), (4, "one-gpu"), (2, "a-gpu-each")])
def test_ranks_that_would_share_a_gpu_run_jax_and_say_why(n, mode):
    """tests/mpi/shared_gpu.py: nvmath-python installed (the fake), n ranks on a
    node of one GPU: backend="auto" runs JAX on every rank (before, each rank
    died in nvmath.distributed.initialize: NCCL refuses two ranks on one GPU),
    explain() and `dmatmul info` say why nvmath was passed over, and
    backend="nvmath" raises one RuntimeError saying why on every rank, within
    5 s. Ranks with a GPU each (CUDA_VISIBLE_DEVICES per rank) run nvmath."""
    proc = launch(n, "tests/mpi/shared_gpu.py", mode, timeout=180)
    assert proc.returncode == 0, output(proc)
    scenarios = (("init-starts-jax", "auto-runs-jax", "explain-says-why", "info-says-why",
                  "explicit-nvmath-raises-on-every-rank", "explicit-nvmath-Matmul-raises-on-every-rank",
                  "nvmath-never-started", "auto-still-runs-jax") if mode == "one-gpu"
                 else ("auto-runs-nvmath", "nothing-passed-over"))
    for scenario in (*scenarios, "still-in-step"):
        assert f"ok {scenario}" in proc.stdout, output(proc)
    assert "Traceback" not in proc.stderr, output(proc)


@pytest.mark.parametrize("n", [2, 4])
def test_gloo_connection_lines_stay_out_of_the_output(n):
    """JAX's CPU collectives between processes run on gloo, which prints "[Gloo]
    Rank r is connected to ..." for every communicator it connects (at its first
    collective: a grid's rows and columns too): none reaches stdout or stderr,
    and the user's lines come out whole and in order, a line written in two
    pieces around the products too. DMATMUL_VERBOSE=1 lets gloo's lines through."""
    proc = launch(n, "tests/mpi/quiet.py", timeout=180)
    both = proc.stdout + proc.stderr
    assert proc.returncode == 0, both
    assert f"quiet products on {n} ranks: matches numpy: True" in proc.stdout, both
    assert "[Gloo]" not in both, both
    assert proc.stdout.splitlines() == ["rank 0: before the first product", "rank 0: a line in two pieces",
                                        f"quiet products on {n} ranks: matches numpy: True"], both
    if n == 2:
        loud = launch(n, "tests/mpi/quiet.py", timeout=180, env={"DMATMUL_VERBOSE": "1"})
        assert loud.returncode == 0, loud.stdout + loud.stderr
        # (the two ranks' gloo lines come through mpiexec, which may interleave them mid-line: count their ends)
        assert loud.stdout.count("connected peer ranks is : 1") >= n, loud.stdout + loud.stderr


@pytest.mark.parametrize("n, mode", [(2, "full"), (4, "--quick")])
def test_products_match_numpy_on_every_rank(n, mode):
    proc = launch(n, "tests/mpi/products.py", mode, timeout=600)
    assert proc.returncode == 0, output(proc)
    assert f"on {n} processes" in proc.stdout and "MISMATCH" not in proc.stdout


@pytest.mark.parametrize("n", [2, 4])
def test_an_error_on_one_rank_raises_on_every_rank(n):
    proc = launch(n, "tests/mpi/errors.py", timeout=240)
    assert proc.returncode == 0, output(proc)
    for scenario in ("bad-shape-on-one-rank", "bad-dtype-on-one-rank", "missing-distribution",
                     "algorithm-does-not-fit", "redistribute-src-grid-does-not-fit", "result-too-large-for-every-rank",
                     "memory-short-on-one-rank", "beta-without-c", "beta-without-c-on-one-rank", "still-in-step"):
        assert f"ok {scenario}" in proc.stdout, output(proc)


@pytest.mark.parametrize("mode", ["exit", "raise"])
def test_a_rank_that_dies_ends_the_job(mode):
    proc = launch(3, "tests/mpi/dies.py", mode, timeout=120)  # a hang fails by TimeoutExpired
    assert proc.returncode != 0
    assert "UNREACHABLE" not in proc.stdout


@pytest.mark.parametrize(
    "example", ["allgather_gemm.py", "gemm_reduce_scatter.py", "nvmath_example.py", "plan_reuse.py"]
)
def test_mpi_examples_check_themselves(example):
    proc = launch(4, f"mpi_examples/{example}", timeout=300)
    assert proc.returncode == 0, output(proc)
    assert "matches numpy: True" in proc.stdout


@pytest.mark.parametrize("n, flags", [(4, ()), (4, ("--bidirectional",)), (3, ("--bidirectional",))])
def test_jax_blocks_on_a_mesh_that_spans_processes(n, flags):
    """mpi_examples/jax_blocks.py: dmatmul.jax's rings in the user's shard_map on
    a mesh of every process's devices (jax.distributed, gloo), a 2x2 mesh of 4
    processes or a 1x3 one of 3, one way and both ways round: the MLP's forward
    pass and gradients against numpy on every process."""
    proc = launch(n, "mpi_examples/jax_blocks.py", *flags, timeout=300)
    assert proc.returncode == 0, output(proc)
    assert f"of {n} processes" in proc.stdout and "matches numpy: True" in proc.stdout, output(proc)


def test_jax_blocks_choose_alike_whatever_calibration_each_process_reads():
    """tests/mpi/jax_calibration.py: with bidirectional=None, a calibration that
    makes two rings pay on rank 1 only (then one rank 1 cannot read) must not
    change rank 1's rings: every process traces the same ones (before, gloo
    aborted on a collective mismatch)."""
    proc = launch(3, "tests/mpi/jax_calibration.py", timeout=240)
    assert proc.returncode == 0, output(proc)
    for label in ("rank 1 calibrated for two rings", "rank 1's calibration unreadable"):
        assert f"{label} on 3 processes: matches numpy: True" in proc.stdout, output(proc)


def test_demo_under_mpiexec():
    proc = launch(4, "-m", "dmatmul", "demo", "-m", "101", "-n", "67", "-k", "53", timeout=300)
    assert proc.returncode == 0, output(proc)
    assert "4 processes (mpiexec)" in proc.stdout
    assert "15 passed, 0 failed" in proc.stdout


@pytest.mark.parametrize("mode", ["implicit", "comm"])
def test_runtime_starts_implicitly_or_on_a_given_communicator(mode):
    proc = launch(2, "tests/mpi/implicit.py", mode, timeout=180)
    assert proc.returncode == 0, output(proc)
    assert f"{mode}: 2 ranks, matches numpy: True" in proc.stdout


def test_grid_products_and_redistribution_on_four_processes():
    proc = launch(4, "tests/mpi/grid.py", timeout=400)
    assert proc.returncode == 0, output(proc)
    assert "grid checks on 4 processes: 0 failures" in proc.stdout


def test_batched_products_on_two_processes():
    """tests/mpi/batched.py: each rank passes its blocks of every item (the batch
    whole on each rank), broadcast batches, c, a per-item bias, an empty batch;
    ranks whose batches differ raise on every rank."""
    proc = launch(2, "tests/mpi/batched.py", timeout=300)
    assert proc.returncode == 0, output(proc)
    assert "batched checks on 2 processes: 0 failures" in proc.stdout


@pytest.mark.parametrize("backend", ["jax", "fake"])
def test_batched_products_fold_into_one_on_two_processes(backend):
    """tests/mpi/folded.py: a batch that only a (or only b) holds, each rank
    passing its blocks of every item, runs as one matrix product where every
    rank's blocks fold (Slab.X a and result, Slab.Y b and result, a's rows
    whole; bias every item's or per item), item by item where they do not
    (uneven M), against numpy; the fake nvmath ran one GEMM for a folded batch."""
    proc = launch(2, "tests/mpi/folded.py", backend, timeout=300)
    assert proc.returncode == 0, output(proc)
    assert "folded checks on 2 processes: 0 failures" in proc.stdout


@pytest.mark.parametrize("backend", ["jax", "fake"])
def test_sharded_products_on_four_processes(backend):
    """tests/mpi/sharded.py: each rank passes its blocks of Shardeds that no 2-D
    distribution expresses (replicated over a mesh axis, axes out of rank order,
    the batch split); they are re-laid, or multiplied where they are (a batch
    split alike), and each rank's result block matches numpy."""
    proc = launch(4, "tests/mpi/sharded.py", backend, timeout=300)
    assert proc.returncode == 0, output(proc)
    assert "sharded checks on 4 processes: 0 failures" in proc.stdout


def test_autotune_on_two_processes_keeps_one_route_on_every_rank():
    """tests/mpi/autotune.py: ranks whose own timings disagree on the fastest
    route keep the same one (the slowest rank's time decides), which no rank
    delayed, and their results match numpy."""
    proc = launch(2, "tests/mpi/autotune.py", "jax", timeout=300)
    assert proc.returncode == 0, output(proc)
    assert "autotune checks on 2 processes: 0 failures" in proc.stdout


@pytest.mark.parametrize("backend", ["jax", "fake"])
def test_relaid_2d_products_on_four_processes(backend):
    """tests/mpi/relaid.py: 2-D layouts cuBLASMp cannot take as given (an uneven
    split next to a grid, block sizes that differ, a process row without a part,
    SUMMA named on an uneven grid, a batch) run on nvmath, re-laid around the
    2-D plan (explain() names the limit), and match numpy on every rank."""
    proc = launch(4, "tests/mpi/relaid.py", backend, timeout=300)
    assert proc.returncode == 0, output(proc)
    assert "relaid checks on 4 processes: 0 failures" in proc.stdout


def test_nvmath_check_under_mpiexec_runs_the_layouts_cublasmp_refuses():
    """``dmatmul check --backend nvmath`` on four processes (the fake nvmath:
    tests/gpu/nvmath_check.py --fake): seed 1's first 20 cases hold 2-D layouts
    cuBLASMp cannot take as given (uneven splits next to a grid); they are
    re-laid and pass, none fails."""
    proc = launch(4, "tests/gpu/nvmath_check.py", "--fake", "--cases", "20", "--seed", "1", timeout=300)
    assert "backend nvmath, on 4 processes (mpiexec)" in proc.stdout, output(proc)
    assert proc.returncode == 0, output(proc)
    assert re.search(r"^total\s+20\s+\d+\s+\d+\s+0\s", proc.stdout, re.M), proc.stdout


def test_readme_several_processes_block(tmp_path):
    """docs/mpi.md "Several processes": its block as written, then a check of each
    rank's rows of D against numpy (the blocks of A and B joined from every rank)."""
    import re

    readme = (ROOT / "docs" / "mpi.md").read_text()
    section = readme.split("## Several processes (`mpiexec`)", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    body, end = code.rstrip().rsplit("\n", 1)
    assert end == "dm.finalize()", end
    check = (
        "a = dm.join(rt.comm.allgather(a_local), dists[0], (1000, 800))\n"
        "b = dm.join(rt.comm.allgather(b_local), dists[1], (800, 600))\n"
        "ok = all(rt.comm.allgather(np.allclose(d_local, dm.split(a @ b, dists[2])[rt.rank])))\n"
        "if rt.rank == 0:\n    print(f'README block on {rt.size} ranks: matches numpy: {ok}')\n"
    )
    script = tmp_path / "mpi_md_block.py"
    script.write_text(f"{body}\n{check}dm.finalize()\nraise SystemExit(0 if ok else 1)\n")
    proc = launch(4, str(script), timeout=300)
    assert proc.returncode == 0, output(proc)
    assert "README block on 4 ranks: matches numpy: True" in proc.stdout, output(proc)


def test_block_cyclic_example():
    proc = launch(4, "mpi_examples/block_cyclic.py", timeout=300)
    assert proc.returncode == 0, output(proc)
    assert "block-cyclic summa on a 2x2 grid" in proc.stdout and "matches numpy: True" in proc.stdout


def test_ranks_that_disagree_raise_on_every_rank_promptly():
    proc = launch(4, "tests/mpi/disagree.py", timeout=300)
    assert proc.returncode == 0, output(proc)
    for scenario in ("result-distribution", "alpha", "beta", "epilog", "transpose-on-square",
                     "grid-instead-of-slab", "dtype", "one-extra-row", "c-one-row-short", "init-on-another-comm",
                     "redistribute-dst", "redistribute-src", "redistribute-dtype", "redistribute-global-jax-array", "reset-one-row-short",
                     "reset-alpha", "execute-on-freed-plan", "misspelt-keyword", "extra-positional",
                     "matmul-plan-misspelt-keyword", "redistribute-misspelt-keyword", "redistribute-extra-positional",
                     "execute-with-an-argument", "reset-misspelt-keyword", "execute-while-rank-1-resets",
                     "matmul-while-rank-1-executes", "matmul-while-rank-1-redistributes",
                     "inside-jit-on-one-rank", "still-in-step", "auto-finds-another-backend"):
        assert f"ok {scenario}" in proc.stdout, output(proc)
    assert "FAILED" not in proc.stdout, output(proc)


@pytest.mark.parametrize("backend", ["jax", "fake"])
def test_ranks_that_run_different_plans_raise_on_every_rank(backend):
    """tests/mpi/plans.py on 3 processes: the last rank executes (or plans)
    another Matmul than the others, of another product or a new one of the
    same, or makes one where the others call dm.matmul: every rank raises,
    naming what differs, rather than running each its own plan's collectives
    or waiting in an allgather the others never make; on the JAX backend and
    on nvmath's (the fake). A plan freed on the last rank only (by hand, or
    by a with block an exception left) is freed by nvmath (collectively) on
    every rank at once, once no rank holds it."""
    proc = launch(3, "tests/mpi/plans.py", backend, timeout=120)
    assert proc.returncode == 0, output(proc)
    for scenario in ("execute-another-planned-product", "execute-another-new-product", "plan-another-new-product",
                     "execute-a-new-plan-of-the-same-product", "Matmul-while-the-others-matmul",
                     "execute-freed-on-one-rank-after-eviction", "a-with-block-left-on-one-rank", "still-in-step"):
        assert f"ok {scenario}" in proc.stdout, output(proc)


def test_summa25d_on_nvmath_refused_on_every_rank():
    """tests/mpi/layered.py on 8 processes, the fake nvmath: 2.5-D SUMMA has no
    nvmath path (nvmath-python 1.0's Matmul runs on its one communicator only),
    so every rank raises the same ValueError naming why, planned or called,
    promptly; a SUMMA product still runs right after."""
    proc = launch(8, "tests/mpi/layered.py", timeout=120)
    assert proc.returncode == 0, output(proc)
    for scenario in ("summa25d-given", "summa25d-planned", "still-in-step"):
        assert f"ok {scenario}" in proc.stdout, output(proc)


def test_a_generated_bad_argument_on_one_rank_raises_on_every_rank():
    """tests/mpi/bad_input.py: the bad-input matrix of tests/test_bad_inputs.py with
    one rank's argument corrupted (a different rank each time): every rank raises a
    TypeError/ValueError promptly, and the valid product still runs after."""
    proc = launch(4, "tests/mpi/bad_input.py", "40" if os.environ.get("DMATMUL_LONG", "") not in ("", "0") else "4",
                  timeout=400)
    assert proc.returncode == 0, output(proc)
    assert "ok bad-input: " in proc.stdout, output(proc)


@pytest.mark.parametrize("mode", ["user-reversed", "used-first", "used-on-one-rank", "after-finalize"])
def test_the_process_group_starts_on_every_rank_or_raises_on_every_rank(mode):
    """A jax.distributed the user started, numbering its processes otherwise than
    dmatmul's communicator its ranks, gives right results; JAX used before the
    start (on every rank, or on one), or after dm.finalize(), raises on every
    rank, saying what to do."""
    proc = launch(4, "tests/mpi/start.py", mode, timeout=240)
    assert proc.returncode == 0, output(proc)
    assert f"ok {mode} on 4 ranks" in proc.stdout, output(proc)


def test_sigterm_ends_a_job_hung_in_a_collective():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PMI_", "OMPI_"))}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.Popen(
        [mpiexec(), "-n", "2", sys.executable, str(ROOT / "tests/mpi/hangs.py")], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT, start_new_session=True,
    )
    try:
        seen = []
        for line in proc.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if "waits in a collective" in line:
                break
        else:
            pytest.fail("the job ended before it hung:\n" + "".join(seen))
        time.sleep(2)  # rank 0 is inside the collective
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)  # a job that ignores SIGTERM fails here (TimeoutExpired)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0


def test_check_under_mpiexec():
    """The differential matrix of tests/test_check.py as four processes: every
    rank draws the same cases, passes its own blocks and checks its block."""
    proc = launch(4, "-m", "dmatmul", "check", "--cases", "30", "--seed", "3", timeout=600)
    assert "dmatmul check: 30 random products, seed 3, backend jax, on 4 processes (mpiexec)" in proc.stdout, \
        output(proc)
    assert "layout family" in proc.stdout
    assert proc.returncode == 0, output(proc)


def test_mxfp8_block_scales_split_with_their_operands():
    """tests/mpi/mxfp8.py: block-scaled FP8 on 3 ranks (uneven M and N, K split or not), each rank's scales
    those of its blocks, on JAX and the simulated nvmath; a bad scale shape on one rank raises on every rank."""
    proc = launch(3, "tests/mpi/mxfp8.py", timeout=300)
    assert proc.returncode == 0, output(proc)
    assert "MISMATCH" not in proc.stdout and proc.stdout.count("done on 3 processes") == 3, output(proc)
    assert "quantization_scales['a'] must have shape" in proc.stdout
