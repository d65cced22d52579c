"""Run under ``mpiexec -n P``: the generated bad-input matrix with ONE rank's argument corrupted.

Every rank draws the same valid product and the same corruptions from the
generator of tests/test_bad_inputs.py (hypothesis, derandomized, generation
only: no shrinking, which would run other examples on the rank that fails),
and passes its own blocks. The product is checked first on every rank
against numpy; then, corruption by corruption, one rank (a different one each
time) makes the corrupted call and the others the valid one. Every rank must
raise a TypeError or ValueError within 10 s (none may be left waiting), the
corrupted rank's naming the argument; afterwards the valid call must still be
right on every rank. Prints ``ok bad-input: <cases> products, <n> corruptions``
on rank 0 and exits 1 if any rank saw something else.

Usage: ``mpiexec -n 4 python tests/mpi/bad_input.py [examples]``.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
import time

import numpy as np

import dmatmul as dm

rt = dm.init()
P, me = rt.size, rt.rank
EXAMPLES = int(sys.argv[1]) if len(sys.argv) > 1 else 6
dm.matmul(np.ones((1, 2), np.float32), np.ones((2, 2), np.float32),  # JAX starts here
          distribution=(dm.Slab.X, dm.Replicated(), dm.Slab.X))

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests/: the generator
import test_bad_inputs as T  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings, strategies as st  # noqa: E402

problems: list[str] = []
counts = {"products": 0, "corruptions": 0}


def local(v: T.Valid) -> T.Valid:
    """``v`` with this rank's blocks of a, b and c (bias is whole on every rank)."""
    dist = v.kw["distribution"]
    dists = dist if isinstance(dist, tuple) else (dist,) * 3
    passed = {}
    for name, d in zip("abc", dists):
        x = v.passed[name]
        block = None if x is None else dm.split(np.asarray(x), d, nranks=P)[me]
        passed[name] = None if block is None else T._like(x, block)
    return dataclasses.replace(v, passed=passed)


def check(v: T.Valid, d, what: str) -> None:
    dist = v.kw["distribution"]
    dd = dist[2] if isinstance(dist, tuple) else dist
    want = dm.split(v.reference(), dd, nranks=P)[me]
    try:
        T.assert_close(np.asarray(d), want, v.dtype)
    except AssertionError as e:
        problems.append(f"rank {me} {what}: {e}")


def refused(v: T.Valid, mm, bad: T.Bad, odd: int, what: str) -> None:
    """The call with ``bad`` on rank ``odd`` (the valid one elsewhere) raises on every rank."""
    start = time.monotonic()
    try:
        if mm is not None:
            mm.reset_operands(**({bad.arg: bad.value} if me == odd else {}))
        else:
            v.call(**({bad.arg: bad.value} if me == odd else {}))
    except (TypeError, ValueError) as e:
        # (the corrupted rank's message names the argument; the words one process shows, e.g. a shape
        # against the global one, differ where each rank holds blocks)
        if me == odd and not T.re.search(T._name(bad.arg), str(e)):
            problems.append(f"rank {me} {what}: {bad.arg!r} not in {type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - the point: any other type
        problems.append(f"rank {me} {what}: {type(e).__name__} (not TypeError/ValueError): {e}")
    else:
        if mm is None or me == odd:  # (a reset that only the odd rank gets wrong: the others raise too)
            problems.append(f"rank {me} {what}: no error")
        else:
            problems.append(f"rank {me} {what}: no error here, though rank {odd} was refused")
    took = time.monotonic() - start
    if took > 10:
        problems.append(f"rank {me} {what}: took {took:.1f} s")


@given(v=T.valid_products(mpi=P), data=st.data())
@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, phases=(Phase.generate,),
          suppress_health_check=list(HealthCheck))
def run(v, data):
    n = counts["products"]
    counts["products"] += 1
    v = local(v)
    try:  # (every rank draws the same: it is valid on all, or refused on all)
        check(v, v.call(), f"product {n}")
    except (TypeError, ValueError) as e:
        if v.kw["algorithm"] == "auto" or "does not fit" not in str(e):
            problems.append(f"rank {me} product {n}: the valid call raised {type(e).__name__}: {e}")
            return
        v.kw["algorithm"] = "auto"
        check(v, v.call(), f"product {n}")
    bads = T._reset_corruptions(v, data) if v.api == "reset" else T._corruptions(v, data)
    picked = data.draw(st.lists(st.sampled_from(range(len(bads))), min_size=3, max_size=8, unique=True))
    with v.x64(), (dm.Matmul(v.passed["a"], v.passed["b"], v.passed["c"], **v.kw) if v.api == "reset"
                   else _NoPlan()) as mm:
        for j, i in enumerate(picked):
            bad, odd = bads[i], (n + j) % P
            counts["corruptions"] += 1
            refused(v, mm, bad, odd, f"product {n}, {bad.what} on rank {odd}")
            check(v, mm.execute() if mm is not None else v.call(), f"product {n} after {bad.what}")


class _NoPlan:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


run()
everyone = rt.comm.allgather(problems)
if me == 0:
    if not any(everyone):
        print(f"ok bad-input: {counts['products']} products, {counts['corruptions']} corruptions on {P} ranks",
              flush=True)
    for rank_problems in everyone:
        for line in rank_problems[:20]:
            print(line, flush=True)
dm.finalize()
sys.exit(1 if any(everyone) else 0)
