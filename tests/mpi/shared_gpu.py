"""Run under ``mpiexec -n P`` (P >= 2): nvmath-python installed (the fake of
tests/gpu/_fake_nvmath.py), on a node whose ranks share the GPUs or not.

Usage: shared_gpu.py one-gpu|a-gpu-each

* ``one-gpu``: the node has one GPU for P ranks. cuBLASMp cannot run (NCCL
  refuses two ranks on one GPU): ``dm.init()`` and ``backend="auto"`` run
  JAX on every rank, ``mm.explain()`` and ``dmatmul info`` say why nvmath
  was passed over, and ``backend="nvmath"`` raises a RuntimeError saying
  why on every rank within a few seconds, with nvmath.distributed never
  started.
* ``a-gpu-each``: one GPU per rank (``CUDA_VISIBLE_DEVICES`` = the rank,
  each seeing one GPU, as a scheduler's GPU binding sets it):
  ``backend="auto"`` runs nvmath, and nothing is passed over.

Each product is checked against numpy; rank 0 prints ``ok <scenario>`` per
scenario, then ``ok still-in-step``; exit 1 if any rank saw a problem.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import sys

mode = sys.argv[1]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "gpu"))
import _fake_nvmath  # noqa: E402

if mode == "a-gpu-each":
    os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["PMI_RANK"]
_fake_nvmath.install(ngpus=1)

import _expect  # noqa: E402
import numpy as np  # noqa: E402

import dmatmul as dm  # noqa: E402
from dmatmul import cli  # noqa: E402

rt = dm.init()
P, me = rt.size, rt.rank
X, Y = dm.Slab.X, dm.Slab.Y
rng = np.random.default_rng(3)
a, b = rng.standard_normal((10, 6)), rng.standard_normal((6, 7))
la, lb = dm.split(a, X)[me], dm.split(b, Y)[me]
problems: list[str] = []
why = f"{P} ranks on this node share 1 GPU; cuBLASMp needs one GPU per rank (NCCL refuses two ranks on one GPU)"


def report(scenario: str, ok: bool, detail: str) -> None:
    if not ok:
        problems.append(f"rank {me} {scenario}: {detail}")
    if not any(rt.comm.allgather(problems)) and me == 0:
        print(f"ok {scenario}", flush=True)
    elif me == 0:
        print(f"FAILED {scenario}", flush=True)


with dm.Matmul(la, lb, distribution=(X, Y, X)) as mm:
    d = mm.execute()
    told = mm.explain()
right = bool(np.allclose(d, dm.split(a @ b, X)[me]))
out = io.StringIO()
with contextlib.redirect_stdout(out):
    cli.main(["info"])
info = out.getvalue()
nvmath_started = any(name == "initialize" for name, _ in _fake_nvmath.CALLS)

if mode == "one-gpu":
    report("init-starts-jax", rt.started == ("jax",) and not nvmath_started,
           f"started {rt.started}, nvmath.distributed.initialize called: {nvmath_started}")
    report("auto-runs-jax", right and "backend:    jax" in told, f"right: {right}; explain():\n{told}")
    report("explain-says-why", f"nvmath:     passed over: {why}" in told, f"explain():\n{told}")
    report("info-says-why", f"backend nvmath : passed over: {why}" in info and "(backend='auto' runs jax)" in info,
           f"dmatmul info:\n{info}")
    _expect.expect(rt, problems, "explicit-nvmath-raises-on-every-rank", RuntimeError,
                   ["backend='nvmath' is not available", why, "launch at most 1 rank per node"],
                   lambda: dm.matmul(la, lb, distribution=(X, Y, X), backend="nvmath"), within=5.0)
    _expect.expect(rt, problems, "explicit-nvmath-Matmul-raises-on-every-rank", RuntimeError,
                   ["backend='nvmath' is not available", why],
                   lambda: dm.Matmul(la, lb, distribution=(X, Y, X), backend="nvmath"), within=5.0)
    report("nvmath-never-started", not any(name == "initialize" for name, _ in _fake_nvmath.CALLS),
           "nvmath.distributed.initialize was called")
    d = dm.matmul(la, lb, distribution=(X, Y, X))  # still in step: the next product runs
    report("auto-still-runs-jax", bool(np.allclose(d, dm.split(a @ b, X)[me])), "wrong result")
else:
    report("auto-runs-nvmath", right and "backend:    nvmath" in told and nvmath_started,
           f"right: {right}; nvmath started: {nvmath_started}; explain():\n{told}")
    report("nothing-passed-over", "passed over" not in told + info and "backend nvmath : available" in info,
           f"explain():\n{told}\ndmatmul info:\n{info}")
_expect.finish(rt, problems)
