"""Run under ``mpiexec -n P`` (P >= 2): ``dmatmul.Matmul`` plans that ranks hold apart.

Every rank holds two or three plans; the last rank runs another one than the
others do (of another product, or a new plan of the same product), or makes
and runs a plan where the others call ``dm.matmul``, or frees a plan (or
leaves its ``with`` block by an exception) that the others keep. Every
rank must raise a ValueError naming what differs and the last rank, within
10 s, before either plan's collectives (none may be left waiting in a second
allgather the others never make); then the plans must still run right on
every rank, checked against numpy. ``argv[1]``: "jax" (the JAX backend) or
"fake" (the nvmath backend on tests/gpu/_fake_nvmath.py). Prints
``ok <scenario>`` per scenario on rank 0; exits 1 if any rank saw something
else.
"""

from __future__ import annotations

import _expect

backend, fake = _expect.backend_from_argv()

import numpy as np  # noqa: E402

import dmatmul as dm  # noqa: E402

rt = dm.init() if backend == "jax" else dm.init(start=())
P, me = rt.size, rt.rank
odd = me == P - 1
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


def expect(scenario, words, call, exc_type=ValueError):
    _expect.expect(rt, problems, scenario, exc_type, words, call)


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
# and the others went on to plan (nvmath's plan runs collectives) while the last waited in its execute's allgather
expect("Matmul-while-the-others-matmul", ["ranks disagree on the call", f"rank {P - 1} is in 'dmatmul.Matmul'"],
       lambda: plan(a).execute() if odd else dm.matmul(dm.split(a, X)[me], dm.split(b, Y)[me],
                                                      distribution=(X, Y, X), backend=backend))
check(mm, a, "after the errors")
check(mm9, a9, "after the errors")
check(fresh, a, "a new plan, after the errors")
check(fresh9, a9, "a new plan, after the errors")
for held in (mm, mm9, fresh, fresh9):
    held.free()

# a Matmul freed on one rank only (by hand, or by a with block an exception left there): on nvmath freeing a
# cached plan is collective, and its borrows now differ between the ranks. Before, the last rank freed an
# evicted plan alone (its collective met the others' next call), and later evictions freed on some ranks only
if fake is not None:
    type(dm.backends.get("nvmath")).cache_size = 2  # (evictions after two other products)


def others(n, start=0):
    for i in range(start, start + n):
        x = np.ones((3 + i, 5), np.float32)
        d = dm.matmul(dm.split(x, X)[me], dm.split(b, Y)[me], distribution=(X, Y, X), backend=backend)
        if not np.allclose(d, dm.split(x @ b, X)[me], atol=1e-4):
            problems.append(f"rank {me}: product {i} wrong")


held = plan(a)
check(held, a, "before eviction")
others(3)  # held's plan leaves the cache, borrowed
if odd:
    held.free()
expect("execute-freed-on-one-rank-after-eviction", ["freed plan"], held.execute, dm.PlanFreedError)
held.free()
others(3, 10)
held = plan(a)
check(held, a, "before a free on one rank")
if odd:
    held.free()
others(3, 20)  # held's plan leaves the cache, borrowed on some ranks only
held.free()
others(3, 30)
held = plan(a9)
others(3, 40)


def with_block_left_on_the_last_rank():
    try:
        with held:
            if odd:
                raise KeyError("the user's error, on the last rank")
            held.execute()
    except KeyError:
        others(1, 50)  # the last rank's next call, while the others are in held.execute()


expect("a-with-block-left-on-one-rank", ["ranks disagree on the call", f"rank {P - 1} is in 'dmatmul.matmul'",
                                         "'Matmul.execute'"], with_block_left_on_the_last_rank)
others(3, 60)
if fake is not None:  # every plan no rank borrows was freed, on every rank (none left over to free alone)
    from dmatmul._plans import PLANS

    left = PLANS.left("nvmath")
    if left:
        problems.append(f"rank {me}: {len(left)} evicted plans were not freed")
_expect.finish(rt, problems)
