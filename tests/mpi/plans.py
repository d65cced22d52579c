"""Run under ``mpiexec -n P`` (P >= 2): ``dmatmul.Matmul`` plans that ranks hold apart.

Every rank holds two or three plans; the last rank runs another one than the
others do (of another product, or a new plan of the same product), or makes
and runs a plan where the others call ``dm.matmul``. Every
rank must raise a ValueError naming what differs and the last rank, within
10 s, before either plan's collectives (none may be left waiting in a second
allgather the others never make); then the plans must still run right on
every rank, checked against numpy. ``argv[1]``: "jax" (the JAX backend) or
"fake" (the nvmath backend on tests/gpu/_fake_nvmath.py). Prints
``ok <scenario>`` per scenario on rank 0; exits 1 if any rank saw something
else.
"""

from __future__ import annotations

import pathlib
import sys
import time

BACKEND = sys.argv[1] if len(sys.argv) > 1 else "jax"
if BACKEND == "fake":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "gpu"))
    import _fake_nvmath

    _fake_nvmath.install()

import numpy as np  # noqa: E402

import dmatmul as dm  # noqa: E402

rt = dm.init() if BACKEND == "jax" else dm.init(start=())
P, me = rt.size, rt.rank
odd = me == P - 1
backend = "jax" if BACKEND == "jax" else "nvmath"
X, Y = dm.Slab.X, dm.Slab.Y
rng = np.random.default_rng(11)
a, a9 = rng.standard_normal((7, 5)).astype(np.float32), rng.standard_normal((9, 5)).astype(np.float32)
b = rng.standard_normal((5, 6)).astype(np.float32)
problems: list[str] = []


def plan(x):
    return dm.Matmul(dm.split(x, X)[me], dm.split(b, Y)[me], distribution=(X, Y, X), backend=backend)


def check(mm, x, what):
    try:
        d = mm.execute()
    except Exception as e:  # noqa: BLE001 - report it
        problems.append(f"rank {me} {what}: {type(e).__name__}: {e}")
        return
    if not np.allclose(d, dm.split(x @ b, X)[me], atol=1e-4):
        problems.append(f"rank {me} {what}: wrong result")


def expect(scenario, words, call):
    start = time.monotonic()
    try:
        call()
    except ValueError as e:
        missing = [w for w in words if w not in str(e)]
        if missing:
            problems.append(f"rank {me} {scenario}: {missing} not in {e}")
    except Exception as e:  # noqa: BLE001 - report what else came
        problems.append(f"rank {me} {scenario}: {type(e).__name__}: {e}")
    else:
        problems.append(f"rank {me} {scenario}: no error")
    if time.monotonic() - start > 10:
        problems.append(f"rank {me} {scenario}: took {time.monotonic() - start:.1f} s")
    ok = not any(rt.comm.allgather(problems))
    if me == 0:
        print(f"ok {scenario}" if ok else f"FAILED {scenario}", flush=True)


last = f"rank {P - 1} has (9, 5)"
mm, mm9 = plan(a), plan(a9)
check(mm, a, "first execute")
check(mm9, a9, "first execute")
# both planned: before, each rank ran its own plan's collectives (the JAX backend gave results, nvmath's failed)
expect("execute-another-planned-product", ["global shape of a", last, "the same plan"],
       lambda: (mm9 if odd else mm).execute())
# a plan made on every rank against one not yet planned: before, the last rank waited in a second allgather
fresh9 = plan(a9)
expect("execute-another-new-product", ["global shape of a", last],
       lambda: (fresh9 if odd else mm).execute())
expect("plan-another-new-product", ["global shape of a", last], lambda: (fresh9 if odd else mm).plan())
fresh = plan(a)
expect("execute-a-new-plan-of-the-same-product", [f"rank {P - 1} runs 'a new plan'", "the same Matmul"],
       lambda: (fresh if odd else mm).execute())
# dm.matmul on some ranks, dm.Matmul(...).execute() on the last: before, both made the same first allgather,
# and the ones went on to plan (nvmath's plan runs collectives) while the last waited in its execute's
expect("Matmul-while-the-others-matmul", ["ranks disagree on the call", f"rank {P - 1} is in 'dmatmul.Matmul'"],
       lambda: plan(a).execute() if odd else dm.matmul(dm.split(a, X)[me], dm.split(b, Y)[me],
                                                      distribution=(X, Y, X), backend=backend))
check(mm, a, "after the errors")
check(mm9, a9, "after the errors")
check(fresh, a, "a new plan, after the errors")
check(fresh9, a9, "a new plan, after the errors")
everyone = rt.comm.allgather(problems)
if me == 0:
    print("ok still-in-step" if not any(everyone) else "FAILED still-in-step", flush=True)
    for rank_problems in everyone:
        for line in rank_problems:
            print(line, flush=True)
dm.finalize()
sys.exit(1 if any(everyone) else 0)
