"""The differential matrix (``dmatmul check``) on the nvmath backend: run as a script.

    python tests/gpu/nvmath_check.py --cases 2000 --seed 0           # one GPU (about 30 s on an H200)
    python tests/gpu/nvmath_check.py --fake --cases 30               # no GPU: tests/gpu/_fake_nvmath.py

Exactly ``dmatmul check --backend nvmath --cases N --seed S``: seeded random
products over every layout, dtype and option (alpha = 0 with inf/NaN in a
and b, BLAS's quick return on one-row and one-column results...), each
checked against numpy; prints the table, exit status 1 on any failure.
``--fake`` replaces nvmath-python and CuPy by the CPU fake first, so the
same path runs in the CPU suite (tests/test_conformance.py). Under ``mpiexec
-n P`` each rank passes its own blocks (tests/test_mpi.py runs it on four
processes with ``--fake``); 2-D layouts cuBLASMp cannot take as given are
re-laid around the 2-D plan (:mod:`dmatmul._relay`).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent

parser = argparse.ArgumentParser()
parser.add_argument("--fake", action="store_true", help="replace nvmath-python and cupy by the CPU fake")
parser.add_argument("--cases", type=int, default=2000)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

if args.fake:
    sys.path.insert(0, str(HERE))
    import _fake_nvmath

    _fake_nvmath.install()

from dmatmul.cli import main  # noqa: E402

sys.exit(main(["check", "--backend", "nvmath", "--cases", str(args.cases), "--seed", str(args.seed)]))
