"""Run under ``mpiexec -n 2`` (``fake``: the nvmath backend on
tests/gpu/_fake_nvmath.py, else JAX): batched products where only a (or only
b) holds a batch, each rank passing its blocks of every item, run as ONE
matrix product where every rank's blocks fold (Slab.X a and result, Slab.Y b
and result, M or N uneven too: each rank's part of an item padded to the
longest; a's rows whole) and item by item where they do not (a's rows split,
the result's whole);
checked against numpy, explain() and (fake) the nvmath calls made. Prints
``folded checks on P processes: N failures`` on rank 0; exits 1 on a failure.
"""

from __future__ import annotations


import _expect

backend, fake = _expect.backend_from_argv()

import numpy as np  # noqa: E402

import dmatmul as dm  # noqa: E402
from dmatmul.testing.reference import assert_close, reference  # noqa: E402

rt = dm.init()
me = rt.rank
failures: list[str] = []
X, Y, R = dm.Slab.X, dm.Slab.Y, dm.Replicated()


def block(x, d):
    """This rank's block of every item of ``x`` (batch dims first), stacked."""
    if x.ndim == 2:
        return dm.split(x, d)[me]
    items = [dm.split(x[idx], d)[me] for idx in np.ndindex(*x.shape[:-2])]
    return np.stack(items).reshape(*x.shape[:-2], *items[0].shape)


def product(a_batch, b_batch, dists, m, n, *, folds, ta=False, tb=False, epilog=None, bias_shape=None):
    k = 6
    rng = np.random.default_rng(m + 10 * n + len(a_batch))
    a = rng.standard_normal((*a_batch, *((k, m) if ta else (m, k))))
    b = rng.standard_normal((*b_batch, *((n, k) if tb else (k, n))))
    batch = np.broadcast_shapes(a_batch, b_batch)
    c = rng.standard_normal((*batch, m, n))
    bias = None if bias_shape is None else rng.standard_normal(bias_shape)
    kw = dict(beta=0.5, transpose_a=ta, transpose_b=tb, epilog=epilog, bias=bias)
    name = f"{a_batch} @ {b_batch} {dists} m={m} n={n} ta={ta} tb={tb} {epilog}"
    try:
        with dm.Matmul(block(a, dists[0]), block(b, dists[1]), block(c, dists[2]), distribution=dists,
                       backend=backend, **kw) as mm:
            text = mm.explain()
            if fake is not None:
                fake.CALLS.clear()
            got = mm.execute()
        said = "folded into one" in text, "run on each item in turn" in text
        if said != (folds, not folds):
            failures.append(f"rank {me}: {name}: explain() does not say {'folded' if folds else 'looped'}:\n{text}")
        if fake is not None:
            runs = sum(n in ("execute", "host execute") for n, _ in fake.CALLS)
            if runs != (1 if folds else int(np.prod(batch))):
                failures.append(f"rank {me}: {name}: {runs} nvmath executes")
        assert_close(got, block(reference(a, b, c, **kw), dists[2]), "float64")
    except Exception as e:  # noqa: BLE001 - reported, with every rank's, on rank 0
        failures.append(f"rank {me}: {name}: {type(e).__name__}: {e}")


product((3,), (), (X, Y, X), 8, 5, folds=True, epilog="relu_bias", bias_shape=(8,))  # folded rows permuted
product((2, 2), (1,), (X, R, X), 8, 5, folds=True, epilog="bias", bias_shape=(2, 2, 8, 1))
product((3,), (), (Y, R, X), 8, 5, folds=True, ta=True, epilog="bias", bias_shape=(1, 5))  # a stored (K, M)
product((3,), (), (Y, X, Y), 7, 4, folds=True)  # a's rows whole on every rank
# uneven M (4 + 3 rows fold to 12 + 9, not the folded Slab.X's 11 + 10): each rank's rows of an item padded to 4
product((3,), (), (X, Y, X), 7, 5, folds=True, epilog="bias", bias_shape=(7,))
product((2,), (), (Y, R, X), 5, 4, folds=True, ta=True, epilog="relu_bias", bias_shape=(2, 5, 1))
product((), (3,), (X, Y, Y), 6, 5, folds=True, epilog="bias", bias_shape=(1, 5))  # uneven N, padded
product((3,), (), (X, Y, Y), 7, 6, folds=False)  # uneven M, the result's rows whole: item by item
product((), (3,), (X, Y, Y), 7, 6, folds=True, epilog="bias", bias_shape=(3, 1, 6))  # N folded
product((), (2,), (X, X, Y), 7, 6, folds=True, tb=True)
product((3,), (3,), (X, Y, X), 8, 5, folds=False)  # both hold a batch

_expect.tally(rt, failures, "folded")
