"""The differential matrix: random products over the whole layout space.

The generator of :mod:`dmatmul.testing`: that it covers the space, and its
drivers. Hypothesis drives it on every backend in tests/test_conformance.py
(``test_random_products_match_numpy``: hypothesis shrinks a failure to its
simplest product); ``dmatmul check`` drives it with a numpy generator (the
MPI driver is in test_mpi.py). CI runs the "ci" hypothesis profile of
conftest.py; a long run is::

    DMATMUL_LONG=1 python -m pytest tests/test_conformance.py -k random_products
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import itertools
import math
import os
import pathlib
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

import dmatmul as dm
from dmatmul._plans import PLANS
from dmatmul._spec import FP8_DTYPES
from dmatmul import testing as ck
from dmatmul.testing import compare as ck_compare
from dmatmul.testing.case import TUNE

ROOT = pathlib.Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- #
# the generator covers the space
# --------------------------------------------------------------------------- #
def _kind(d):
    return "Sharded" if isinstance(d, dm.Sharded) else repr(d) if not d.grid else type(d).__name__


def _draws(seed, count, **kw):
    for i in range(count):
        chooser = ck.NumpyChooser([seed, i])
        yield ck.draw_case(chooser, chooser.choice(ck.NRANKS), **kw)


#: the dimensions drawn on top of the layout space, each with a predicate: drawn in this case
NEW_DIMENSIONS = {
    "distribution=None": lambda c: c.distributions is None,
    "one Distribution": lambda c: c.single,
    "dm.Matmul": lambda c: c.reset is not None,
    "numpy layouts": lambda c: c.layouts != ("C",) * 4,
    "bias (M, 1)": lambda c: c.has_bias and c.bias_column,
    "bias (1, N)": lambda c: c.has_bias and c.bias_per_column,
    "bias of another dtype": lambda c: c.has_bias and c.bias_dtype is not None,
    "bias not numpy": lambda c: c.has_bias and c.bias_kind != "numpy",
    "mixed families": lambda c: c.families is not None,
    "devices list": lambda c: c.device_ids is not None,
    "5 or 7 ranks": lambda c: c.nranks in (5, 7),
    "large": lambda c: max(c.m, c.n, c.k) > 40,
    "jit on plain operands": lambda c: c.jit,
    "jax.default_matmul_precision": lambda c: c.matmul_precision is not None,
    "batch dimensions": lambda c: bool(c.a_batch or c.b_batch),
    "Sharded on a ProcessMesh": lambda c: bool(c.shardeds),
}


def test_the_generator_covers_the_whole_layout_space():
    seen = collections.defaultdict(set)
    for case in _draws(12345, 5000):
        nranks = case.nranks
        for name, d in zip(("a", "b", "result"), case.distributions or ()):
            seen[f"kind of {name}"].add(_kind(d))
        for d, shape in zip(case.distributions or (), (case.a_shape, case.b_shape, (case.m, case.n))):
            if d.grid is not None and d.grid.size == nranks:
                seen[f"grids on {nranks}"].add((d.grid.shape, d.grid.layout))
                seen["first_process"].add(d.first_process != (0, 0))
            if isinstance(d, dm.BlockCyclic):
                seen["block size 1"].add(1 in d.block_sizes)
                seen["block larger than the matrix"].add(any(b > s for b, s in zip(d.block_sizes, shape)))
        grids = case.grids
        seen["same shape, other layout"].add(
            any(g.shape == h.shape and g.layout != h.layout for g in grids for h in grids))
        seen["family"].add(case.layout_family)
        seen["zero"].update(name for name, v in (("M", case.m), ("N", case.n), ("K", case.k)) if v == 0)
        seen["size 1"].update(name for name, v in (("M", case.m), ("N", case.n), ("K", case.k)) if v == 1)
        seen["dtype"].add(case.dtype)
        seen["epilog"].add((case.epilog, case.dtype.startswith("complex")))
        seen["transposes"].add((case.transpose_a, case.transpose_b))
        seen["alpha"].add("zero" if case.alpha == 0 else "complex" if isinstance(case.alpha, complex) else "real")
        seen["beta, c"].add((case.beta != 0, case.use_c))
        if case.alpha == 0:  # BLAS: A and B not read; its quick return (beta = 1) on one row or one column
            seen["alpha = 0"].add((case.specials, case.beta == 1 and case.use_c and 1 in (case.m, case.n)))
        seen["algorithm"].add(case.algorithm)
        seen["array family"].add(case.family)
        seen["precision"].add(case.precision)
        seen["jax.default_matmul_precision"].add(case.matmul_precision)
        if case.specials:
            seen["inf/NaN"].add((case.dtype, case.epilog, case.use_c and case.beta != 0, case.layout_family))
        on = case.on_mesh
        if on is not None:
            seen["on a user's mesh"].add((on.call, on.explicit, on.reversed, len(on.shape), on.mixed))
            seen["placements"].update(on.placements)
        required, allowed = case.refusals()
        seen["refusals"].update(r.why.split()[0] for r in required + allowed)
        # the dimensions drawn on top, each independently of the others
        seen["nranks"].add(nranks)
        seen["distribution="].add((case.distributions is None, case.single, case.family, on is not None))
        if case.reset is not None:
            r = case.reset
            seen["reset"].update(r.operands)
            seen["reset"].update(name for name, v in (("alpha", r.alpha), ("beta", r.beta)) if v is not None)
            seen["reset"].update({"plan()" if r.plan else "no plan()", case.family, "on a mesh" if on else "no mesh"})
        for name, layout in zip(("a", "b", "c", "bias"), case.layouts):
            seen[f"layout of {name}"].add(layout)
            if layout != "C" and name != "bias":
                assert case.family_of(name) == "numpy", case
        if case.has_bias:
            seen["bias"].add((case.bias_column, case.bias_per_column, case.bias_kind))
            seen["bias dtype"].add((case.bias_dtype, case.dtype.startswith("complex")))
        if case.families is not None:
            seen["families"].add(case.families)
            assert case.family == ("jax" if "jax" in case.families else "numpy")
        if case.device_ids is not None:
            ids = case.device_ids
            assert len(ids) == nranks and len(set(ids)) == nranks and on is None
            seen["devices list"].add((nranks, list(ids) == sorted(ids), ids == tuple(range(nranks))))
        for name, dim in (("M", case.m), ("N", case.n), ("K", case.k)):
            assert dim <= 180
            if dim > 40:
                seen["large"].add(name)
        if case.jit:
            assert case.family == "jax" and on is None and case.reset is None
            seen["jit"].add((case.device_ids is not None, case.distributions is None))
        t = case.transform
        if t is not None:
            assert t.kind in ck.TRANSFORMS and case.family == "jax" and case.reset is None and not case.specials
            assert set(case.traced) & {"a", "b"} and (t.kind != "vmap" or t.batched in case.traced)
            call = "eager (plain)" if on is None and not case.jit else "jit (plain)" if on is None else on.call
            for what, value in (("layout family", case.layout_family), ("call", call), ("epilog", case.epilog),
                                ("dtype", case.dtype), ("nranks", nranks), ("algorithm", case.algorithm != "auto"),
                                ("devices list", case.device_ids is not None), ("mixed families", case.families)):
                seen[f"{t.kind} with {what}"].add(value)
            seen[f"{t.kind} over"].update(case.traced)
            if case.has_bias:
                seen[f"{t.kind} with bias"].add((case.bias_column, case.bias_kind, case.bias_dtype is not None))
                seen[f"{t.kind} with bias of shape"].add(case.bias_per_column)
            if t.kind == "vmap":
                seen["vmap of"].add((t.batched, t.axis, t.size))
        for name, drawn in NEW_DIMENSIONS.items():
            if drawn(case):
                for what, value in (("dtype", case.dtype), ("layout family", case.layout_family),
                                    ("family", case.family), ("algorithm", case.algorithm != "auto"),
                                    ("epilog", case.epilog), ("c", case.use_c), ("nranks", nranks)):
                    seen[f"{name} with {what}"].add(value)
    kinds = {"Slab.X", "Slab.Y", "Replicated()", "BlockNonCyclic", "BlockCyclic", "Sharded"}
    for name in ("a", "b", "result"):
        assert seen[f"kind of {name}"] == kinds
    for p in ck.NRANKS:
        grids = (dm.ProcessGrid((r, p // r), layout) for r in range(1, p + 1) if p % r == 0 for layout in ("row", "col"))
        want = {(g.shape, g.layout) for g in grids}  # a (p, 1) grid is one grid in both orders
        assert seen[f"grids on {p}"] == want, p
    assert seen["first_process"] == {True, False}
    assert seen["block size 1"] == {True, False} and True in seen["block larger than the matrix"]
    assert True in seen["same shape, other layout"]
    assert seen["family"] == set(ck.LAYOUT_FAMILIES)
    assert seen["zero"] == {"M", "N", "K"} and seen["size 1"] == {"M", "N", "K"}
    assert seen["dtype"] == set(dm.DTYPES)
    assert seen["epilog"] == {(e, False) for e in dm.EPILOGS} | {(e, True) for e in dm.EPILOGS}
    assert len(seen["transposes"]) == 4
    assert seen["alpha"] == {"zero", "complex", "real"}
    assert seen["beta, c"] == {(False, False), (False, True), (True, False), (True, True)}
    assert seen["alpha = 0"] == {(False, False), (False, True), (True, False), (True, True)}
    assert seen["algorithm"] == {"auto", *dm.ALGORITHMS}
    assert seen["array family"] == {"numpy", "jax"}
    assert seen["precision"] == {None, "default", "high", "highest"}
    assert seen["jax.default_matmul_precision"] == {None, *ck.MATMUL_PRECISIONS}
    assert {w.split("=")[0] for w in seen["refusals"]} <= {
        "epilog", "grid", "algorithm", "bias", "a's", "b's", "c's", "alpha", "beta", "reset"}
    assert {w.split("=")[0] for w in seen["refusals"]} >= {
        "epilog", "grid", "algorithm", "bias", "a's", "b's", "alpha", "beta"}
    assert seen["on a user's mesh"] == {
        (call, explicit, rev, dims, mixed) for call in ck.CALLS for explicit in (True, False) for rev in (True, False)
        for dims in (1, 2) for mixed in ((False, True) if dims == 2 else (False,))
    }
    assert seen["placements"] == set(ck.PLACEMENTS)
    specials = seen["inf/NaN"]
    # (FP8 operands are drawn without inf/NaN: float8_e4m3fn has no inf)
    assert {d for d, *_ in specials} == {d for d in dm.DTYPES if not d.startswith(("complex", "float8"))}
    assert {e for _, e, *_ in specials} == {None, "bias"} and {c for *_, c, _ in specials} == {True, False}
    assert {f for *_, f in specials} == set(ck.LAYOUT_FAMILIES)
    # the dimensions drawn on top
    assert seen["nranks"] == set(ck.NRANKS) and {5, 7} <= set(ck.NRANKS)
    assert seen["distribution="] == {  # a triple, one Distribution, None; numpy and jax; on a mesh or not
        (none, single, fam, mesh) for none, single in ((False, False), (False, True), (True, False))
        for fam in ("numpy", "jax") for mesh in ((False, True) if fam == "jax" else (False,))}
    assert seen["reset"] == {"a", "b", "c", "bias", "alpha", "beta", "plan()", "no plan()", "numpy", "jax",
                             "on a mesh", "no mesh"}
    for name in ("a", "b", "c"):
        assert seen[f"layout of {name}"] == set(ck.LAYOUTS), name
    assert seen["layout of bias"] == set(ck.LAYOUTS) - {"F", ".T view"}
    shapes = ((False, False), (True, False), (False, True))  # (M,), (M, 1), (1, N)
    assert seen["bias"] == {(column, per_column, kind) for column, per_column in shapes for kind in ck.BIAS_KINDS}
    # (no FP8 bias: a bias has the result type, which FP8 is not)
    assert seen["bias dtype"] == {(d, cx) for d in (None, *dm.DTYPES) if not str(d).startswith("float8")
                                  for cx in (False, True)}
    assert len(seen["families"]) == 6  # a, b, c each numpy or jax, not all alike
    devs = seen["devices list"]
    assert {p for p, *_ in devs} == set(ck.NRANKS) and (8, False, False) in devs and (3, False, False) in devs
    assert seen["large"] == {"M", "N", "K"}
    assert seen["jit"] == {(lst, none) for lst in (False, True) for none in (False, True)}
    for kind in ck.TRANSFORMS:  # each transformation drawn across the space
        assert seen[f"{kind} with layout family"] == set(ck.LAYOUT_FAMILIES), kind
        assert seen[f"{kind} with call"] == {"eager (plain)", "jit (plain)", *ck.CALLS} - {"jit on constants"}, kind
        assert seen[f"{kind} with epilog"] == set(dm.EPILOGS), kind
        # complex and half precision too; not FP8, whose cotangent holds too little to compare
        assert seen[f"{kind} with dtype"] == {d for d in dm.DTYPES if not d.startswith("float8")}, kind
        assert seen[f"{kind} with nranks"] == set(ck.NRANKS), kind
        for what in ("algorithm", "devices list"):
            assert seen[f"{kind} with {what}"] == {False, True}, (kind, what)
        assert len(seen[f"{kind} with mixed families"]) >= 3, kind  # None and some with a numpy a or b
        assert seen[f"{kind} over"] == {"a", "b", "c", "bias"}, kind
        assert {(column, many) for column, _, many in seen[f"{kind} with bias"]} == {
            (column, many) for column in (False, True) for many in (False, True)}, kind
        assert seen[f"{kind} with bias of shape"] == {False, True}, kind  # (1, N) too: its gradient
    assert seen["vmap of"] == {(x, axis, size) for x in "ab" for axis in (0, 2) for size in (2, 3)}
    for name in NEW_DIMENSIONS:  # drawn with the rest of the space, not in one fixed combination
        assert seen[f"{name} with dtype"] == set(dm.DTYPES), name
        assert len(seen[f"{name} with layout family"]) >= (1 if name == "distribution=None" else 4), name
        assert len(seen[f"{name} with nranks"]) >= 2, name
        for what in ("algorithm", "c"):
            assert seen[f"{name} with {what}"] == {False, True}, (name, what)
        assert len(seen[f"{name} with epilog"]) >= 2, name
        if name not in ("jit on plain operands", "mixed families"):
            assert seen[f"{name} with family"] == {"numpy", "jax"}, name


def test_the_generator_draws_batches_and_meshes():
    """Batch dimensions (0 to 2 on a and on b, broadcast, of size 1 and 0) and
    Sharded distributions of a, b and the result (meshes of 1 to 3 axes of the
    rank count, specs that split, replicate, name tuples of axes, split unevenly,
    have no 2-D form or name the batch dimensions too), each with the rest of the space."""
    seen = collections.defaultdict(set)
    for case in _draws(4321, 4000):
        if case.a_batch or case.b_batch:
            seen["batch ndims"].add((len(case.a_batch), len(case.b_batch)))
            seen["broadcast"].update(x != case.batch_shape for x in (case.a_batch, case.b_batch))
            seen["batch sizes"].update(case.batch_shape)
            seen["size 1 under a larger one"].add(any(
                1 in x and len(x) == len(case.batch_shape) and x != case.batch_shape for x in (case.a_batch, case.b_batch)))
            seen["batched with"].update({case.family, case.layout_family, "reset" if case.reset else "call",
                                         "jit" if case.jit else "eager", "c" if case.use_c else "no c"})
            if case.transform is not None:
                seen["batched with"].add(case.transform.kind + (" on a mesh" if case.on_mesh is not None else ""))
            if case.on_mesh is not None:
                seen["batched with"].update({"on a mesh", f"on a mesh, {case.on_mesh.call}"})
        for name, d, shape in zip(("a", "b", "result"), case.distributions or (),
                                  (case.a_shape, case.b_shape, case.result_shape)):
            if not isinstance(d, dm.Sharded):
                continue
            assert d.mesh.size == case.nranks and d.ndim in (2, len(shape))
            seen[f"mesh axes of {name}"].add(len(d.mesh.shape))
            seen["entries"].update("tuple" if isinstance(e, tuple) else "axis" if e else "none" for e in d.spec)
            seen["replicated over an axis"].add(any(d.mesh.shape[d.mesh.axis_names.index(x)] > 1
                                                    for x in d.replicated_axes))
            seen["uneven"].add(any(size % math.prod(d.mesh.shape[d.mesh.axis_names.index(x)] for x in d.axes(i))
                                   for i, size in enumerate(shape[-d.ndim:])))
            seen["2-D form"].add(d.as_2d() is not None)
            seen["spec of the batch dimensions"].add(d.ndim > 2)
            seen["Sharded with"].update({case.family, "single" if case.single else "triple", case.dtype})
    assert seen["batch ndims"] == {(i, j) for i in range(3) for j in range(3)} - {(0, 0)}
    assert seen["broadcast"] == {True, False} and {0, 1, 2, 3} <= seen["batch sizes"]
    assert seen["size 1 under a larger one"] == {True, False}
    assert seen["batched with"] >= {"numpy", "jax", "reset", "call", "jit", "eager", "c", "no c", "N-D Sharded",
                                    "2-D, one grid", "1-D", "distribution=None", *ck.TRANSFORMS,
                                    *(f"{t} on a mesh" for t in ck.TRANSFORMS), "on a mesh",
                                    *(f"on a mesh, {call}" for call in ck.CALLS)}
    for name in ("a", "b", "result"):
        assert seen[f"mesh axes of {name}"] == {1, 2, 3}, name
    assert seen["entries"] == {"tuple", "axis", "none"}
    for what in ("replicated over an axis", "uneven", "2-D form", "spec of the batch dimensions"):
        assert seen[what] == {True, False}, what
    assert seen["Sharded with"] >= {"numpy", "jax", "single", "triple", *dm.DTYPES}


def test_the_generator_draws_mxfp8_across_the_space():
    """A fraction of the FP8 cases block-scaled (MXFP8): both FP8 dtypes, every transpose, c, bias, result
    type, scale family, K of one block, of several, a multiple of 32 or not, 0; batched, Sharded, the
    stateful form (a reset of a or b must be refused), in one process and under mpiexec."""
    seen = collections.defaultdict(set)
    count = collections.Counter()
    for mpi, draws in ((False, _draws(2468, 6000)),
                       (True, (ck.draw_case(ck.NumpyChooser([2468, i]), 4, mpi=True) for i in range(4000)))):
        for case in draws:
            if case.dtype not in FP8_DTYPES:
                assert case.block_scales is None
                continue
            count["fp8", mpi] += 1
            if case.block_scales is None:
                continue
            count["mxfp8", mpi] += 1
            assert case.scales is None and "quantization_scales" not in case.fp8_options
            (ka, kb), k = ((-2 if case.transpose_a else -1), (-1 if case.transpose_b else -2)), case.k
            assert case.scale_shapes == (case.a_shape[:ka] + (-(-k // 32),) + case.a_shape[ka:][1:],
                                         case.b_shape[:kb] + (-(-k // 32),) + case.b_shape[kb:][1:])
            seen["with", mpi].update({case.dtype, case.result_type, case.block_scales, case.layout_family,
                                      ("ta", case.transpose_a), ("tb", case.transpose_b), ("c", case.use_c),
                                      ("bias", case.has_bias), ("batched", bool(case.a_batch or case.b_batch)),
                                      ("Sharded", bool(case.shardeds)), ("reset", case.reset is not None)})
            seen["K", mpi].add("0" if k == 0 else "one block" if k <= 32 else "32n" if k % 32 == 0 else "ragged")
            if case.reset is not None:
                refused = {"a", "b"} & set(case.reset.operands)
                seen["reset refused", mpi].add(bool(refused))
                assert any(r.why.startswith("reset of a or b") for r in case.refusals()[0]) == bool(refused)
    for mpi in (False, True):
        assert 0.2 < count["mxfp8", mpi] / count["fp8", mpi] < 0.5, count
        assert seen["K", mpi] == {"0", "one block", "32n", "ragged"}, mpi
        assert seen["reset refused", mpi] == {False, True}, mpi
        assert seen["with", mpi] >= {*FP8_DTYPES, None, "bfloat16", "float16", "float32", "numpy",
                                     *((w, x) for w in ("ta", "tb", "c", "bias", "batched", "Sharded", "reset")
                                       for x in (False, True))}, mpi
    assert "operands" in seen["with", False] and "distribution=None" in seen["with", False]


def test_each_rank_passes_the_block_scales_of_its_block():
    """Under mpiexec a rank's scales are those of its block, counted from its first K element: where K
    splits on the 32-element blocks they are the global scales split along with the operand; where it
    does not (an offset no multiple of 32, a block-cyclic K), the global scales vary along the other
    dimension only, so that each rank's say the same values."""
    from dmatmul.testing import run as ck_run

    k, m = 70, 5
    case = _case(dtype="float8_e4m3fn", block_scales="numpy", k=k, m=m, nranks=2)
    rng = np.random.default_rng(0)
    s = ck.operands.random_scales(rng, (m, 3))
    even = dm.BlockCyclic(dm.ProcessGrid((1, 2)), (1, 64))  # rank 0: K 0..63, rank 1: 64..69
    odd = dm.BlockCyclic(dm.ProcessGrid((1, 2)), (1, 35))  # rank 1 starts at 35
    assert ck_run._splits_on_blocks(s, -1, (m, k), even, 2)
    assert not ck_run._splits_on_blocks(s, -1, (m, k), odd, 2)
    np.testing.assert_array_equal(ck_run._local_scales(s, -1, (m, k), even, 0, 2), s[:, :2])
    np.testing.assert_array_equal(ck_run._local_scales(s, -1, (m, k), even, 1, 2), s[:, 2:])
    np.testing.assert_array_equal(ck_run._local_scales(s, -1, (m, k), dm.Slab.X, 1, 2), s[3:])
    for d, varies in ((even, True), (odd, False)):
        dists = (d, dm.Slab.Y, dm.Slab.X)
        drawn = ck_run._global_scales(np.random.default_rng(1), dataclasses.replace(case, distributions=dists), 2)
        assert drawn is not None
        sa = drawn[0]
        assert sa.shape == (m, 3) and (len(np.unique(sa, axis=1).T) > 1) == varies
        for rank in range(2):  # each rank's dequantized block is the global dequantized operand's block
            x = np.ones((m, k))
            local = ck_run._local_scales(sa, -1, (m, k), d, rank, 2)
            block = ck_run._block(x, d, rank, 2)
            np.testing.assert_array_equal(block * np.exp2(ck_run._per_element(local, -1, block.shape[1]) - 127.0),
                                          ck_run._block(x * np.exp2(ck_run._per_element(sa, -1, k) - 127.0), d,
                                                        rank, 2))


def test_under_mpiexec_the_generator_draws_only_what_a_rank_can_pass():
    """No distribution=None (required there), no devices=, no jax.jit (refused
    under mpiexec); the rest of the new dimensions are drawn."""
    seen = collections.Counter()
    for i in range(1500):
        case = ck.draw_case(ck.NumpyChooser([321, i]), 4, mpi=True)
        assert case.distributions is not None and case.device_ids is None and not case.jit
        assert case.transform is None  # dm.matmul refuses a trace under mpiexec
        for name, drawn in NEW_DIMENSIONS.items():
            seen[name] += bool(drawn(case))
    assert {name for name, count in seen.items() if count} == set(NEW_DIMENSIONS) - {
        "distribution=None", "devices list", "5 or 7 ranks", "jit on plain operands"}


def test_every_family_is_common_enough():
    """No layout family is starved: each is at least 2% of the cases."""
    counts = collections.Counter(
        ck.draw_case(ch, ch.choice(ck.NRANKS)).layout_family
        for ch in (ck.NumpyChooser([7, i]) for i in range(2000))
    )
    assert min(counts[f] for f in ck.LAYOUT_FAMILIES) >= 40, counts


# --------------------------------------------------------------------------- #
# reproduction lines, expectations, the report
# --------------------------------------------------------------------------- #
def _layout_of(x):
    """How a numpy array lies in memory (one of ck.LAYOUTS), for arrays with every dimension >= 2."""
    if not x.flags.writeable:
        return "read-only"
    if not x.dtype.isnative:
        return "byte-swapped"
    if any(s < 0 for s in x.strides):
        return "negative strides"
    if x.flags.c_contiguous:
        return "C"
    if x.flags.f_contiguous:
        return "F" if x.base is None else ".T view"
    return "strided"


def test_lay_out_makes_each_layout():
    x = np.arange(12.0).reshape(3, 4)
    for layout in ck.LAYOUTS:
        y = ck.lay_out(x, layout)
        assert _layout_of(y) == layout and np.array_equal(y, x) and np.shares_memory(x, y) == (layout == "C")
    assert _layout_of(ck.rand((3, 4), "float32", layout="F")) == "F"


def test_describe_is_the_python_call():
    """Each case's line rebuilds it: the call (dm.matmul, inside jax.jit, or
    with dm.Matmul and its reset), its options, and every operand's shape,
    dtype, family and memory layout."""
    jax = pytest.importorskip("jax")
    defaults = {"alpha": 1.0, "beta": 0.0, "transpose_a": False, "transpose_b": False, "epilog": None,
                "algorithm": "auto"}
    namespace = {"dm": dm, "np": np, "jax": jax, "rand": ck.rand, "rand_scales": ck.rand_scales}
    forms = collections.Counter()
    for case in _draws(99, 300):
        line = case.describe("jax")
        stmt = ast.parse(line).body[0]
        # with dm._plan.schedule('ring'), jax.default_matmul_precision('highest'): <the line>
        forced = [f"dm._plan.schedule({case.schedule!r})"] * (case.schedule is not None) + [
            f"jax.default_matmul_precision({case.matmul_precision!r})"] * (case.matmul_precision is not None)
        if forced:
            assert isinstance(stmt, ast.With), line
            assert [ast.unparse(item.context_expr) for item in stmt.items[:len(forced)]] == forced, line
            forms.update(("schedule", case.schedule) if "schedule" in f else ("matmul_precision", case.matmul_precision)
                         for f in forced)
            for f in forced:
                line = line.replace(f"with {f}: ", "").replace(f"with {f}, ", "with ").replace(f"{f}, ", "")
            stmt = ast.parse(line).body[0]
        call = [n for n in ast.walk(stmt) if isinstance(n, ast.Call) and ast.unparse(n.func) in ("dm.matmul", "dm.Matmul")]
        assert len(call) == 1, line
        call = call[0]
        kw = {k.arg: k.value for k in call.keywords}
        value = lambda node: eval(ast.unparse(node), namespace)  # noqa: E731
        if case.distributions is None:
            assert "distribution" not in kw, line
        elif case.single:
            assert isinstance(value(kw["distribution"]), dm.Distribution) and (value(kw["distribution"]),) * 3 == \
                case.distributions
        else:
            assert value(kw["distribution"]) == case.distributions
        if case.on_mesh is not None:
            assert "devices" not in kw and case.on_mesh.describe() in line
        elif case.device_ids is not None:
            assert value(kw["devices"]) == [jax.devices()[i] for i in case.device_ids]
        else:
            assert value(kw["devices"]) == case.nranks
        for name, default in defaults.items():
            assert (value(kw[name]) if name in kw else default) == getattr(case, name), (name, line)
        if case.block_scales is not None:  # MXFP8: uint8 scales of the shapes the case says, in its range
            scales = value(kw["quantization_scales"])
            for x, shape in zip((scales["a"], scales["b"]), case.scale_shapes):
                assert x.shape == shape and x.dtype == np.uint8, line
                assert x.size == 0 or case.scale_range[0] <= int(x.min()) <= int(x.max()) <= case.scale_range[1]
        if case.transform is not None:  # run (a few of each form: op by op, they take a while)
            forms["transform", case.transform.kind, case.jit] += 1
            if forms["transform", case.transform.kind, case.jit] <= 2:
                _check_transformed_line(case, line, namespace, jax)
            continue
        operands = [(arg, name) for arg, name in zip(call.args, "abc")]
        if case.jit:  # jax.jit(lambda <the jax ones>: dm.matmul(a, rand(...), ...))(rand(..., 'jax'), ...)
            assert isinstance(stmt, ast.Expr) and ast.unparse(stmt.value.func).startswith("jax.jit(lambda ")
            params = [p.arg for p in stmt.value.func.args[0].args.args]
            assert params == [n for n in "abc"[: len(call.args)] if case.family_of(n) == "jax"], line
            outer = dict(zip(params, stmt.value.args))
            operands = [(outer.get(ast.unparse(arg), arg), name) for arg, name in zip(call.args, "abc")]
        assert len(operands) == 2 + case.use_c and ("bias" in kw) == case.has_bias
        if case.has_bias:
            operands.append((kw["bias"], "bias"))
        if case.reset is not None:  # with dm.Matmul(...) as mm: [mm.plan(); ]d1 = mm.execute(); ...
            assert isinstance(stmt, ast.With) and ast.unparse(call.func) == "dm.Matmul"
            steps = [ast.unparse(s) for s in stmt.body]
            first = ["mm.plan()"] * case.reset.plan + [TUNE] * case.reset.tune
            assert steps[: 2 + len(first)] == first + ["d1 = mm.execute()", "d2 = mm.execute()"]
            assert steps[-1] == "d3 = mm.execute()" and steps[-2].startswith("mm.reset_operands(")
            reset = stmt.body[-2].value
            rkw = {k.arg: k.value for k in reset.keywords}
            assert [k for k in rkw if k not in ("alpha", "beta")] == list(case.reset.operands)
            for name in ("alpha", "beta"):
                assert (value(rkw[name]) if name in rkw else None) == getattr(case.reset, name)
            operands += [(rkw[name], name) for name in case.reset.operands]
        else:
            assert not case.jit or case.on_mesh is None
        forms[type(stmt).__name__, case.jit] += 1
        for arg, name in operands:
            x = value(arg)
            if name == "bias":
                shape, dtype, fam, layout = case.bias_shape, case.bias_dtype or case.dtype, case.bias_kind, \
                    case.layouts[3]
            else:
                shape = {"a": case.a_shape, "b": case.b_shape, "c": case.result_shape}[name]
                dtype = case.result_dtype if name == "c" else case.dtype  # (c has the result type: FP8's)
                fam, layout = case.family_of(name), case.layouts["abc".index(name)]
            if fam == "list":
                assert isinstance(x, list) and np.asarray(x).shape == shape, (name, line)
                assert not x or np.iscomplexobj(np.asarray(x)) == dtype.startswith("complex"), (name, line)
                continue
            assert x.shape == shape and x.dtype.name == dtype and dm._options.family(x) == fam, (name, line)
            if fam == "numpy" and min(shape) >= 2:
                assert _layout_of(x) == (layout if len(shape) >= 2 or layout not in ("F", ".T view") else "C"), \
                    (name, layout, line)
    assert set(forms) == {("Expr", False), ("Expr", True), ("With", False)} | {
        ("transform", kind, jit) for kind in ck.TRANSFORMS for jit in (False, True)} | {
        ("schedule", name) for name in ("ring", "one_shot", "bidirectional")} | {
        ("matmul_precision", name) for name in ck.MATMUL_PRECISIONS}, forms
    assert "mpiexec -n 4" in ck.draw_case(ck.NumpyChooser(0), 4).describe("jax", mpi=True)


def _check_transformed_line(case, line, namespace, jax):
    """A transformation's line runs as written, on a stand-in for dm.matmul
    (jnp, no devices): the stand-in gets the case's operands (each of its
    matrices, under vmap) and the line gives the transformation's outputs:
    a gradient per traced operand (vjp), the result and its tangent (jvp), a
    batch of results (vmap)."""
    import jax.numpy as jnp

    got = []

    def matmul(a, b, c=None, *, transpose_a=False, transpose_b=False, bias=None, **kw):
        got.append({"a": a, "b": b, "c": c, "bias": bias})
        opa, opb = (a.T if transpose_a else a), (b.T if transpose_b else b)
        d = jnp.asarray(opa) @ jnp.asarray(opb)
        for x in (c, bias):  # in the graph (a gradient for each), adding nothing
            if x is not None:
                d = d + 0 * jnp.sum(jnp.asarray(x, d.dtype))
        return d.astype(case.dtype)

    with jax.enable_x64(True):
        stand_in = types.SimpleNamespace(**{**vars(dm), "matmul": matmul})
        out = eval(line.split("  # ")[0], {**namespace, "dm": stand_in})
    shapes = {"a": case.a_shape, "b": case.b_shape, "c": (case.m, case.n), "bias": case.bias_shape}
    assert len(got) == 1, line
    for name in ("a", "b") + ("c",) * case.use_c + ("bias",) * case.has_bias:
        x = got[0][name]
        assert np.shape(x) == shapes[name], (name, line)
        t = case.transform
        if name in case.traced:  # (eager vmap passes the unbatched ones through)
            assert isinstance(x, jax.core.Tracer if t.kind != "vmap" or name == t.batched else jax.Array), name
        else:  # closed over
            assert not isinstance(x, jax.core.Tracer), (name, line)
    if t.kind == "vjp":
        assert [g.shape for g in out] == [shapes[n] for n in case.traced], line
    elif t.kind == "jvp":
        assert [x.shape for x in out] == [(case.m, case.n)] * 2, line
    else:
        assert out.shape == (t.size, case.m, case.n), line


def test_rand_makes_the_operands_of_a_line():
    x = ck.rand((3, 2), "float16")
    assert x.shape == (3, 2) and x.dtype == np.float16


def _case(**kw):
    base = dict(nranks=4, m=6, n=5, k=3, dtype="float32", transpose_a=False, transpose_b=False,
                distributions=(dm.Slab.X, dm.Slab.Y, dm.Slab.X))
    return ck.Case(**{**base, **kw})


def test_expected_refusals_of_summa25d():
    """2.5-D SUMMA re-lays any layout: on JAX it must run where P = q*q*c (no
    refusal allowed) and refuse any other P; on nvmath it must refuse (no
    sub-communicator per layer in nvmath 1.0), naming itself."""
    for dists in ((dm.Slab.X, dm.Slab.Y, dm.Slab.X), (dm.BlockCyclic(dm.ProcessGrid((2, 4)), (2, 2)),) * 3):
        assert _case(nranks=8, distributions=dists, algorithm="summa25d").refusals("jax") == ([], [])
    required, allowed = _case(nranks=8, algorithm="summa25d").refusals("nvmath")
    assert len(required) == 1 and not allowed
    assert required[0].matches(ValueError("algorithm='summa25d' needs one cuBLASMp SUMMA per layer ..."))
    assert not required[0].matches(ValueError("algorithm='summa' needs ..."))
    required, allowed = _case(nranks=4, algorithm="summa25d").refusals("jax")
    assert len(required) == 1 and not allowed
    assert required[0].matches(ValueError("algorithm='summa25d' needs P = q*q*c ranks ..., but this runs on 4"))
    assert not required[0].matches(ValueError("algorithm='summa25d' needs P = q*q*c ranks ..., but this runs on 6"))
    # operands on a user's mesh, distribution=None: shardings that leave mesh axes independent run it on each
    # group of ranks, whose count may not be its own (a refusal allowed, not required)
    on = ck.OnMesh(shape=(2, 4), explicit=True, reversed=False, call="jit",
                   placements=("reversed axes", "none", "none"))
    required, allowed = _case(nranks=8, distributions=None, family="jax", on_mesh=on,
                              algorithm="summa25d").refusals("jax")
    assert not required and any(r.matches(ValueError("algorithm='summa25d' needs P = q*q*c ranks ..., but this "
                                                     "runs on 1")) for r in allowed), allowed


def test_expected_refusals():
    required, allowed = _case(dtype="complex64", epilog="gelu").refusals()
    assert len(required) == 1 and not allowed
    assert required[0].matches(TypeError("epilog='gelu' is not defined for complex operands (complex64)"))
    assert not required[0].matches(ValueError("epilog='gelu' is not defined for complex operands"))
    g = dm.ProcessGrid((2, 3), layout="col")
    required, _ = _case(distributions=(dm.Slab.X, dm.BlockCyclic(g, (2, 2)), dm.Slab.X)).refusals()
    assert len(required) == 1
    assert required[0].matches(dm.DistributionError("BlockCyclic on ProcessGrid((2, 3)) spans 6 ranks, not 4"))
    assert not required[0].matches(IndexError("ProcessGrid((2, 3)) 6 4"))
    assert not required[0].matches(ValueError("ProcessGrid((2, 3)) does not fit"))  # no sizes named
    required, allowed = _case(algorithm="summa").refusals()
    assert not required and allowed[0].matches(ValueError("algorithm='summa' does not fit ...; it needs one of: ..."))
    assert not allowed[0].matches(NotImplementedError("algorithm='summa' needs"))
    # a named algorithm that fits the layouts by roles must run (a replicated operand fits where a slab is
    # needed; a replicated result is another algorithm's)
    assert _case(algorithm="allgather").refusals() == ([], [])
    assert _case(algorithm="allgather", distributions=(dm.Slab.X, dm.Replicated(), dm.Slab.X)).refusals() == ([], [])
    _, allowed = _case(algorithm="allgather", distributions=(dm.Slab.X, dm.Slab.Y, dm.Replicated())).refusals()
    assert len(allowed) == 1
    assert _case().refusals() == ([], [])
    required, _ = _case(epilog="bias", bias_dtype="complex64").refusals()  # a complex bias on real operands
    assert len(required) == 1 and required[0].matches(TypeError(
        "bias is complex (complex64) but a and b are real (float32): its imaginary part would be lost"))
    assert not required[0].matches(ValueError("bias is complex (complex64) but a and b are real (float32)"))
    assert _case(epilog="bias", bias_dtype="float64").refusals() == ([], [])
    assert _case(epilog="bias", bias_dtype="float32", dtype="complex128").refusals() == ([], [])
    for name in ("alpha", "beta"):  # a complex scalar on real operands
        required, _ = _case(**{name: 0.5 + 1j}, use_c=True).refusals()
        assert len(required) == 1 and required[0].matches(TypeError(
            f"{name}=(0.5+1j) is complex but the operands are float32: use a real {name}"))
        assert not required[0].matches(ValueError(f"{name}=(0.5+1j) is complex but the operands are float32"))
        assert _case(**{name: 0.5 + 1j}, dtype="complex64", use_c=True).refusals() == ([], [])
        # drawn, and refused as the front end refuses it
        case = next(c for c in _draws(41, 3000)  # (refused for that alone: not for a complex bias first)
                    if isinstance(getattr(c, name), complex) and not c.dtype.startswith("complex")
                    and len(c.refusals()[0]) == 1)
        out = ck.run_case(case)
        assert out.status == "refused" and f"{name}=" in out.message, (out.message, case.describe())


def test_alpha_0_is_drawn_often_and_reads_neither_a_nor_b():
    """One case in ten or so is BLAS's quick return (alpha = 0, beta = 1, c)
    on a result of one row or one column, half of the real ones with inf/NaN
    in a and b: the reference reads neither, and the JAX backend passes."""
    draws = list(_draws(47, 400))
    quick = [c for c in draws if c.alpha == 0 and c.beta == 1 and c.use_c and 1 in (c.m, c.n)]
    assert len(quick) >= 400 // 15, len(quick)
    assert sum(c.specials for c in quick) >= len(quick) // 4
    case = _case(m=35, n=1, k=7, alpha=0.0, beta=1.0, use_c=True, specials=True)
    out = ck.run_case(case, rng_seed=3)
    assert out.status == "passed", out.message
    rng = np.random.default_rng(0)
    a, b, c = rng.standard_normal((35, 7)), rng.standard_normal((7, 1)), rng.standard_normal((35, 1))
    a[0, 0], b[1, 0] = np.nan, np.inf
    np.testing.assert_array_equal(ck.reference(a, b, c, alpha=0.0, beta=1.0), c)


def test_beta_without_c_is_expected_refused():
    """beta != 0 without c (given, or in a reset) must raise a ValueError saying
    that beta needs c; drawn, and refused as the front end refuses it."""
    for case in (_case(beta=1.0), _case(reset=ck.Reset(plan=False, operands=(), beta=2.0))):
        required, _ = case.refusals()
        assert len(required) == 1 and required[0].matches(ValueError("beta=1.0 needs c: ..."))
        assert not required[0].matches(TypeError("beta=1.0 needs c: ..."))
    assert _case(beta=1.0, use_c=True).refusals() == ([], [])
    assert _case(beta=0.0, reset=ck.Reset(plan=False, operands=(), alpha=2.0)).refusals() == ([], [])
    draws = list(_draws(43, 3000))
    for drawn in (lambda c: c.reset is None and c.beta != 0, lambda c: c.reset is not None and c.reset.beta):
        case = next(c for c in draws if not c.use_c and drawn(c) and not c.refusals()[1]
                    and len(c.refusals()[0]) == 1)
        out = ck.run_case(case)
        assert out.status == "refused" and "needs c" in out.message, (out.message, case.describe())


def test_an_expected_refusal_counts_as_refused_and_a_missing_one_fails(monkeypatch):
    out = ck.run_case(_case(dtype="complex64", epilog="relu"), rng_seed=1)
    assert out.status == "refused" and "TypeError" in out.message
    with monkeypatch.context() as mp:  # a named algorithm that fits, refused: a failure
        mp.setattr(dm, "matmul", lambda *a, **k: _raise(ValueError("algorithm='allgather' ... it needs one of: ...")))
        assert ck.run_case(_case(algorithm="allgather"), rng_seed=1).status == "failed"
        assert ck.run_case(_case(algorithm="summa"), rng_seed=1).status == "failed"  # (its own name is not in it)
        mp.setattr(dm, "matmul", lambda *a, **k: _raise(ValueError("algorithm='summa' ... it needs one of: ...")))
        assert ck.run_case(_case(algorithm="summa"), rng_seed=1).status == "refused"
    monkeypatch.setattr(dm, "matmul", lambda *a, **k: np.zeros((6, 5), np.complex64))
    out = ck.run_case(_case(dtype="complex64", epilog="relu"), rng_seed=1)
    assert out.status == "failed" and "expected one" in out.message


@pytest.mark.parametrize(
    "result, words",
    [
        (lambda a, b: np.zeros((6, 5), np.float32), "max error"),
        (lambda a, b: (a @ b).astype(np.float64), "result dtype float64"),
        (lambda a, b: (a @ b)[:, :4], "result shape (6, 4)"),
        (lambda a, b: np.asarray(a @ b).tolist(), "result is builtins.list"),
        (lambda a, b: _read_only(a @ b), "read-only"),
        (lambda a, b: _modify(a, a @ b), "input(s) modified: a"),
        (lambda a, b: np.full((6, 5), np.nan, np.float32), "max error inf"),
        (lambda a, b: _raise(IndexError("tuple index out of range")), "IndexError"),
        (lambda a, b: _raise(NotImplementedError("another grid")), "NotImplementedError"),
        (lambda a, b: _raise(ValueError("it needs Slab.X")), "ValueError"),  # "auto" is never refused
    ],
)
def test_wrong_results_fail(monkeypatch, result, words):
    monkeypatch.setattr(dm, "matmul", lambda a, b, c=None, **kw: result(a, b))
    out = ck.run_case(_case(), rng_seed=2)
    assert out.status == "failed" and words in out.message, out.message


def _poisoned(a, b, how):
    with np.errstate(invalid="ignore"):
        d = (a.astype(np.float64) @ b).astype(np.float32)
    if how == "nan as zero":
        d[np.isnan(d)] = 0
    elif how == "inf as nan":
        d[np.isinf(d)] = np.nan
    elif how == "padding met an inf":
        d[-1, -1] = np.nan
    return d


@pytest.mark.parametrize("how", ["nan as zero", "inf as nan", "padding met an inf"])
def test_non_finite_entries_must_match_numpys(monkeypatch, how):
    """A case with inf/NaN operands passes only when the result holds numpy's
    non-finite values where numpy's does (and finite ones elsewhere)."""
    case = _case(specials=True)
    monkeypatch.setattr(dm, "matmul", lambda a, b, c=None, **kw: _poisoned(a, b, None))
    right = ck.run_case(case, rng_seed=2)
    assert right.status == "passed", right.message
    monkeypatch.setattr(dm, "matmul", lambda a, b, c=None, **kw: _poisoned(a, b, how))
    out = ck.run_case(case, rng_seed=2)
    assert out.status == "failed" and "max error inf" in out.message, out.message


def test_specials_are_planted():
    a = ck.rand((6, 4), "bfloat16", specials=True)
    assert not np.isfinite(a.astype(np.float32)).all() and np.isfinite(a.astype(np.float32)).sum() >= 21
    case = _case(specials=True)
    assert ", specials=True)" in case.describe("jax")


def _read_only(x):
    x.flags.writeable = False
    return x


def _modify(a, d):
    a[0, 0] += 1
    return d


def _raise(e):
    raise e


def test_combine_and_report():
    case = _case()
    ok = ck.Outcome(case, "passed", 0.5)
    refused = ck.Outcome(case, "refused", float("nan"), "ValueError: needs")
    bad = ck.Outcome(case, "failed", 3.0, "max error 3 x the tolerance")
    assert ck.combine([ok, ok]).status == "passed"
    assert ck.combine([refused, refused]).status == "refused"
    both = ck.combine([ok, bad, ok])
    assert both.status == "failed" and "rank(s) [1]" in both.message and both.ratio == 3.0
    assert ck.combine([ok, refused]).status == "failed"
    text = ck.report([ok, refused, bad, ck.Outcome(_case(nranks=1), "passed", 0.1)])
    lines = text.splitlines()
    assert lines[0].split() == ["layout", "family", "cases", "passed", "refused", "failed", "worst", "err/tol"]
    assert any(line.split() == ["1-D", "3", "1", "1", "1", "3.00"] for line in lines)
    assert any(line.split() == ["one", "rank", "1", "1", "0", "0", "0.10"] for line in lines)
    assert any(line.split() == ["total", "4", "2", "1", "1", "3.00"] for line in lines)
    assert "first 1 of 1 failure(s)" in text and case.describe("jax") in text
    assert "transformation" not in text
    vjp = _case(family="jax", transform=ck.Transform("vjp"))
    vmap = _case(family="jax", transform=ck.Transform("vmap", batched="b", size=3, axis=2))
    text = ck.report([ok, ck.Outcome(vjp, "passed", 0.5), ck.Outcome(vmap, "failed", 2.0, "max error 2"),
                      ck.Outcome(vmap, "refused", float("nan"))])
    assert "of which inside a JAX transformation: 3 (vjp 1, jvp 0, vmap 2): 1 passed, 1 refused, 1 failed" in text
    assert "jax.vmap(lambda a, b: dm.matmul(a, b, " in text and "in_axes=(None, 2))" in text
    assert "FP8" not in text
    fp8 = _case(dtype="float8_e4m3fn", scales=(0.5, 2.0))
    mx = _case(dtype="float8_e5m2", block_scales="numpy", k=40)
    text = ck.report([ok, ck.Outcome(fp8, "passed", 0.5), ck.Outcome(_case(dtype="float8_e4m3fn"), "passed", 0.5),
                      ck.Outcome(mx, "failed", 2.0, "max error 2"),
                      ck.Outcome(dataclasses.replace(mx, k=64), "passed", 0.5)])
    assert "of which FP8: 4 (per-tensor scales 1, none 1, MXFP8 block scales 2): 3 passed, 0 refused, 1 failed" in text
    assert "of which MXFP8 (UE8M0 scales per 32 along K): 2 (K not a multiple of 32 1): 1 passed, 0 refused, " \
        "1 failed" in text
    assert "quantization_scales={'a': rand_scales((6, 2)), 'b': rand_scales((2, 5))}" in text, text


def test_a_case_runs_in_its_default_matmul_precision(monkeypatch):
    """precision=None follows jax.default_matmul_precision on the JAX backend
    (as jnp.dot): a case drawn with one calls dm.matmul inside it, and is
    checked at the accuracy it stands for: float32's under "highest" on any
    platform, not the slack an accelerator's bf16 default passes take."""
    jax = pytest.importorskip("jax")
    case = next(c for c in _draws(32, 4000) if _passes(c) and c.matmul_precision == "highest"
                and c.precision is None and c.dtype == "float32" and c.reset is None and c.transform is None)
    assert "with jax.default_matmul_precision('highest'): " in case.describe("jax")
    seen = []
    matmul = dm.matmul

    def spy(*args, **kwargs):
        seen.append(jax.config.jax_default_matmul_precision)
        return matmul(*args, **kwargs)

    monkeypatch.setattr(dm, "matmul", spy)
    assert ck.run_case(case).status == "passed" and seen == ["highest"]
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    slack = lambda **kw: ck_compare._reduced_precision_slack(dataclasses.replace(case, **kw), "jax")  # noqa: E731
    assert slack() == 1.0 and slack(matmul_precision="float32") == 1.0
    assert slack(matmul_precision="bfloat16") == slack(matmul_precision=None) == 1000.0
    assert slack(precision="highest", matmul_precision="bfloat16") == 1.0  # an explicit precision= wins
    assert ck_compare._reduced_precision_slack(dataclasses.replace(case, matmul_precision="tensorfloat32"), "nvmath") == 1.0


def test_the_check_module_needs_only_numpy():
    code = ("import sys, dmatmul.testing; "
            "print(sorted(m for m in ('jax', 'hypothesis', 'nvmath', 'cupy', 'mpi4py') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


# --------------------------------------------------------------------------- #
# the transforms' oracle (numpy) against JAX's own derivatives of a plain jnp product
# --------------------------------------------------------------------------- #
def _plain_jnp(jnp, jax, *, alpha, beta, transpose_a, transpose_b, epilog, relu):
    """``epilog(alpha op(a) op(b) + beta c + bias)`` in plain jax.numpy (relu: ``jax.nn.relu`` or ``jnp.maximum``)."""
    def f(a, b, c, bias):
        z = alpha * ((a.T if transpose_a else a) @ (b.T if transpose_b else b))
        if c is not None and beta != 0:
            z = z + beta * c
        if epilog and epilog.endswith("bias"):
            z = z + bias.reshape(-1)[:, None].astype(z.dtype)
        if epilog in ("relu", "relu_bias"):
            z = jax.nn.relu(z) if relu == "jax.nn.relu" else jnp.maximum(z, 0)
        elif epilog in ("gelu", "gelu_bias"):
            z = jax.nn.gelu(z, approximate=True)
        return z
    return f


@pytest.mark.parametrize("dtype, epilog, ta, tb, beta, bias_shape, bias_dtype", [
    ("float64", None, False, False, 0.0, None, None),
    ("float64", "relu", True, False, 1.5, None, None),
    ("float64", "gelu", False, True, -0.5, None, None),
    ("float64", "relu_bias", True, True, 0.0, (5,), "float64"),
    ("float64", "gelu_bias", False, False, 2.0, (5, 1), "float32"),
    ("complex128", "bias", True, False, 0.5 + 1j, (5,), "complex128"),
    ("complex128", "bias", False, True, 1.0, (5, 1), "float64"),  # a real bias of complex operands: Re of its sum
    ("complex128", None, True, True, 0.0, None, None),
])
def test_the_transform_oracle_is_jaxs_derivative(dtype, epilog, ta, tb, beta, bias_shape, bias_dtype):
    """reference_vjp and reference_jvp (numpy) give what jax.vjp and jax.jvp
    give for the same product written in plain jax.numpy, in 64 bits."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from dmatmul.testing import random_matrix, reference, reference_jvp, reference_vjp

    rng = np.random.default_rng(11)
    m, n, k = 5, 4, 3
    alpha = 0.5 - 0.25j if dtype.startswith("complex") else -1.5
    a = random_matrix(rng, (k, m) if ta else (m, k), dtype)
    b = random_matrix(rng, (n, k) if tb else (k, n), dtype)
    c = random_matrix(rng, (m, n), dtype)
    bias = random_matrix(rng, bias_shape, bias_dtype) if bias_shape else None
    kw = dict(alpha=alpha, beta=beta, transpose_a=ta, transpose_b=tb, epilog=epilog)
    g = random_matrix(rng, (m, n), dtype)
    names = ("a", "b", "c") + (("bias",) if bias is not None else ())
    primals = {"a": a, "b": b, "c": c, "bias": bias}
    tangents = {name: random_matrix(rng, primals[name].shape, primals[name].dtype.name) for name in names}
    with jax.enable_x64(True):
        f = _plain_jnp(jnp, jax, relu="jax.nn.relu", **kw)
        fn = lambda *xs: f(**{**{"bias": None}, **dict(zip(names, xs))})  # noqa: E731

        @jax.jit  # one compilation, not one per operation
        def derivatives(args, g, ts):
            out, pull = jax.vjp(fn, *args)
            return out, pull(g), jax.jvp(fn, args, ts)[1]

        out, grads, tangent = derivatives(tuple(jnp.asarray(primals[name]) for name in names), jnp.asarray(g),
                                          tuple(jnp.asarray(tangents[n]) for n in names))
    want = reference_vjp(a, b, c, g, bias=bias, **kw)
    assert set(want) == set(names)
    np.testing.assert_allclose(np.asarray(out), reference(a, b, c, bias=bias, **kw), rtol=1e-12, atol=1e-12)
    for name, got in zip(names, grads):
        assert got.shape == want[name].shape and got.dtype == primals[name].dtype, name
        np.testing.assert_allclose(np.asarray(got), want[name], rtol=1e-6 if name == "bias" else 1e-12,
                                   atol=1e-6 if bias_dtype == "float32" else 1e-12, err_msg=name)
    np.testing.assert_allclose(np.asarray(tangent), reference_jvp(a, b, c, tangents, bias=bias, **kw),
                               rtol=1e-6 if bias_dtype == "float32" else 1e-12, atol=1e-12)


@pytest.mark.parametrize("relu, at_zero", [("jax.nn.relu", 0.0), ("jnp.maximum", 0.5)])
def test_the_transform_oracle_at_relus_kink(relu, at_zero):
    """Where Z is exactly 0, relu's derivative is a convention: relu_at_zero
    gives each library's (C and bias cancel in some entries here)."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from dmatmul.testing import reference_jvp, reference_vjp

    a, b = np.zeros((3, 2)), np.ones((2, 4))
    c = np.array([[1.0, -1.0, 2.0, 0.5]] * 3)
    bias = np.array([-1.0, 1.0, 0.5])  # Z = c + bias: zeros in rows 0 and 1
    kw = dict(alpha=1.0, beta=1.0, epilog="relu_bias")
    f = _plain_jnp(jnp, jax, relu=relu, transpose_a=False, transpose_b=False, **kw)
    g = np.arange(12.0).reshape(3, 4) + 1
    with jax.enable_x64(True):
        @jax.jit
        def derivatives(c, bias, g):
            fn = lambda c, bias: f(a, b, c, bias)  # noqa: E731
            return jax.vjp(fn, c, bias)[1](g), jax.jvp(fn, (c, bias), (g, jnp.ones(3)))[1]

        (dc, dbias), t = derivatives(jnp.asarray(c), jnp.asarray(bias), jnp.asarray(g))
    want = reference_vjp(a, b, c, g, bias=bias, relu_at_zero=at_zero, **kw)
    np.testing.assert_allclose(np.asarray(dc), want["c"])
    np.testing.assert_allclose(np.asarray(dbias), want["bias"])
    np.testing.assert_allclose(np.asarray(t), reference_jvp(a, b, c, {"c": g, "bias": np.ones(3)}, bias=bias,
                                                            relu_at_zero=at_zero, **kw))
    other = reference_vjp(a, b, c, g, bias=bias, relu_at_zero=1.0 if at_zero == 0 else 0.0, **kw)
    assert not np.allclose(other["c"], want["c"])  # the data meets the kink


# --------------------------------------------------------------------------- #
# dmatmul check
# --------------------------------------------------------------------------- #
def _check_cli(*args: str, patch: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PMI_", "OMPI_"))}
    env["JAX_PLATFORMS"] = "cpu"
    code = textwrap.dedent(f"""
        import sys
        {patch}
        from dmatmul.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    return subprocess.run([sys.executable, "-c", code, "check", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def test_dmatmul_check_passes_and_prints_the_table():
    proc = subprocess.run([sys.executable, "-m", "dmatmul", "check", "--cases", "20", "--seed", "1"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert "dmatmul check: 20 random products, seed 1, backend jax, on 8 CPU device(s)" in proc.stdout
    assert "layout family" in proc.stdout and "worst err/tol" in proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]


def test_dmatmul_check_fails_on_a_broken_kernel():
    # every local GEMM of every kernel returns twice the product
    patch = ("from dmatmul.backends.jax import _kernels as K; _mm = K.LocalProblem.mm; "
             "K.LocalProblem.mm = lambda self, a, b: 2 * _mm(self, a, b)")
    proc = _check_cli("--cases", "20", "--seed", "1", patch=patch)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "max error" in proc.stdout and "reproduce one: dmatmul check --seed 1" in proc.stdout


@pytest.mark.parametrize("argv, words", [
    (["demo", "--devices", "0"], ["argument --devices", ">= 1", "got 0"]),
    (["demo", "-m", "-3"], ["argument -m", ">= 0", "got -3"]),
    (["demo", "-k", "x"], ["argument -k", "expected an integer", "'x'"]),
    (["check", "--cases", "-1"], ["argument --cases", ">= 1", "got -1"]),
    (["check", "--case", "-5"], ["argument --case", ">= 0", "got -5"]),
    (["check", "--seed", "-1"], ["argument --seed", ">= 0"]),
    (["check", "--devices", "0"], ["argument --devices", ">= 1"]),
    (["demo", "--devices", "100000"], ["argument --devices", "<= 1024", "got 100000"]),
    (["check", "--devices", "1025"], ["argument --devices", "<= 1024", "got 1025"]),
    (["bench", "--devices", "2,100000"], ["argument --devices", "<= 1024", "got 100000"]),
    (["bench", "--reps", "0"], ["argument --reps", ">= 1"]),
    (["bench", "--wait-idle", "-1"], ["argument --wait-idle", "(0, 1]", "-1"]),
    (["bench", "--wait-idle", "lots"], ["argument --wait-idle", "'lots'"]),
    (["bench", "--algorithms", "foo", "--costs"], ["argument --algorithms", "allgather", "'foo'"]),
    (["bench", "--costs", "--calibrate"], ["argument --calibrate", "not allowed with argument --costs"]),
    (["bench", "--calibrate", "--costs"], ["argument --costs", "not allowed with argument --calibrate"]),
    (["bench", "--model-out", "m.json"], ["argument --model-out", "only with --calibrate"]),
    (["bench", "--json", "/nonexistent-dir/out.json"], ["argument --json", "'/nonexistent-dir'", "does not exist"]),
    (["bench", "--plot", "/nonexistent-dir/out.png"], ["argument --plot", "'/nonexistent-dir'", "does not exist"]),
])
def test_commands_refuse_bad_counts_with_a_usage_error(argv, words, capsys):
    """Before any work (and before JAX starts): argparse's exit status 2, naming the option."""
    from dmatmul import cli

    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err, err


def test_a_broken_traced_path_fails_the_check(monkeypatch):
    """The cases on a user's Explicit mesh called inside jax.jit fail when the
    operands' Explicit types are not retyped (the bug the generator now covers),
    and pass again when they are. Not every one: an operand typed replicated that
    the plan also takes replicated (one no sharding lays out, a block-cyclic one)
    meets no sharding of dmatmul's mesh, and passes even so."""
    pytest.importorskip("jax")
    from dmatmul.backends.jax import _mesh

    cases = []
    for i in range(3000):
        ch = ck.NumpyChooser([4251, i])
        case = ck.draw_case(ch, ch.choice(ck.NRANKS))
        on = case.on_mesh
        if on is not None and on.explicit and on.call == "jit" and min(case.m, case.n, case.k) > 0 \
                and case.algorithm == "auto" and not any(case.refusals()) and case.distributions is not None \
                and case.alpha != 0 \
                and case.families is None:
            cases.append(case)
        if len(cases) == 10:
            break
    monkeypatch.setattr(_mesh, "_auto_typed", lambda x: x)
    monkeypatch.setattr(PLANS, "_shelves", {})
    assert [ck.run_case(c).status for c in cases].count("failed") >= 3
    monkeypatch.undo()
    monkeypatch.setattr(PLANS, "_shelves", {})
    assert [ck.run_case(c).status for c in cases] == ["passed"] * 10


# --------------------------------------------------------------------------- #
# the dimensions drawn on top catch what they cover
# --------------------------------------------------------------------------- #
def _simple(case):
    """A case of "auto", no inf/NaN, sizes 2..40."""
    return (case.algorithm == "auto" and not case.specials
            and 2 <= min(case.m, case.n, case.k) and max(case.m, case.n, case.k) <= 40)


def _passes(case):
    """A case that must pass (no error expected or allowed)."""
    return _simple(case) and not any(case.refusals())


def _read_as_c_order(as_matrix):
    """as_matrix, broken: a column-major numpy operand read as if its memory were row-major."""
    def broken(x, name, **kw):
        x = as_matrix(x, name, **kw)
        if isinstance(x, np.ndarray) and x.ndim == 2 and x.flags.f_contiguous and not x.flags.c_contiguous:
            x = np.lib.stride_tricks.as_strided(x, x.shape, (x.shape[1] * x.itemsize, x.itemsize))
        return x
    return broken


def _reset_ignores_a(reset):
    def broken(self, a, *args):
        return reset(self, None, *args)
    return broken


def _in_order(case):
    dd = case.distributions[2]
    return case.nranks > 1 and ck_compare._in_order_blocks(dd, (case.m, case.n), case.nranks)


#: (what is broken, the cases that must catch it, how it is broken, what the failure says)
BROKEN = {
    "distributions read off the shardings as Replicated()": (  # then none is refused
        lambda c: c.distributions is None and c.on_mesh is not None and c.on_mesh.call == "eager"
        and [r.why.split()[0] for r in c.refusals()[0]] in (["a's"], ["b's"]),
        lambda mp, J: mp.setattr(J._shardings, "_infer_distribution", lambda *a, **k: dm.Replicated()),
        "no error, expected one: "),
    "results replicated where a NamedSharding says the distribution": (
        lambda c: _passes(c) and c.family == "jax" and c.on_mesh is None and not c.jit
        and c.distributions is not None and _in_order(c),
        lambda mp, J: mp.setattr(J._layout, "expressible", lambda placement: False), "result sharded as"),
    "devices=[...] taken as the first len(devices) devices": (
        lambda c: _passes(c) and c.family == "jax" and c.device_ids is not None and c.nranks > 1
        and 0 not in c.device_ids,
        lambda mp, J: mp.setattr(dm._problem, "check_devices",
                                 lambda d, spmd: len(d) if isinstance(d, list) else d), "result on devices"),
    "column-major numpy operands read as row-major": (
        lambda c: _passes(c) and c.layouts[0] in ("F", ".T view") and c.m < c.k,
        lambda mp, J: mp.setattr(dm._options, "as_matrix", _read_as_c_order(dm._options.as_matrix)), "max error"),
    "Matmul.reset_operands(a=...) ignored": (
        lambda c: _passes(c) and c.reset is not None and "a" in c.reset.operands and c.alpha != 0
        and c.reset.alpha != 0,
        lambda mp, J: mp.setattr(dm.Matmul, "_reset", _reset_ignores_a(dm.Matmul._reset)), "reset_operands("),
}


def _run_broken(monkeypatch, breaks, cases, backend_module):
    """Run ``cases`` with the JAX backend broken by ``breaks`` (plans made
    with the code broken are dropped first and stay behind)."""
    monkeypatch.setattr(PLANS, "_shelves", {})
    with monkeypatch.context() as mp:
        breaks(mp, backend_module)
        return [ck.run_case(c, rng_seed=3) for c in cases]


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_drawn_dimension_catches_what_it_covers(monkeypatch, broken):
    """Break what one dimension drawn on top covers: the check fails its
    cases, saying why (the same cases pass in the random matrix, unbroken)."""
    pytest.importorskip("jax")
    from dmatmul.backends import jax as J

    drawn, breaks, words = BROKEN[broken]
    cases = list(itertools.islice((c for c in _draws(777, 30000) if _simple(c) and drawn(c)), 2))
    assert len(cases) == 2, broken
    outs = _run_broken(monkeypatch, breaks, cases, J)
    assert [o.status for o in outs] == ["failed"] * 2 and all(words in o.message for o in outs), \
        [(o.message, o.describe()) for o in outs]


@pytest.mark.parametrize("call", ["jit", "jit under set_mesh"])
def test_numpy_operands_of_a_jit_on_a_mesh_are_closed_over(call):
    """Found by dmatmul check --seed 5 (case 167): inside jax.jit on a user's
    mesh, as off one, only the jax operands are the jit's arguments; a numpy
    one (byte-swapped here, which JAX refuses as an argument) is a constant."""
    pytest.importorskip("jax")
    on = ck.OnMesh(shape=(6,), explicit=True, reversed=False, call=call, placements=("grid", "cols", "none"))
    case = _case(nranks=6, m=35, n=40, k=27, transpose_a=True, distributions=None, alpha=-1.5, family="jax",
                 families=("numpy", "jax", "numpy"), layouts=("byte-swapped", "C", "C", "C"), on_mesh=on)
    out = ck.run_case(case, rng_seed=1)
    assert out.status == "passed", (out.message, out.describe())


def _doubled_derivative(contract):
    """_kernels.contract, broken: its derivative twice what it is (its value right)."""
    import functools

    import jax

    @functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4, 5))
    def broken(a, b, ka, kb, precision, dtype):
        return contract(a, b, ka, kb, precision, dtype)

    @broken.defjvp
    def broken_jvp(ka, kb, precision, dtype, primals, tangents):
        out, tangent = jax.jvp(lambda a, b: contract(a, b, ka, kb, precision, dtype), primals, tangents)
        return out, 2 * tangent

    return broken


def _bias_derivative_dropped(finish):
    """_kernels.finish, broken: the bias's derivative dropped (its value right)."""
    import jax
    import jax.numpy as jnp

    def broken(ep, acc, c, bias):
        if bias is None:
            return finish(ep, acc, c, bias)

        @jax.custom_jvp
        def f(acc, c, bias):
            return finish(ep, acc, c, bias)

        @f.defjvp
        def f_jvp(primals, tangents):
            dacc, dc, dbias = tangents
            return jax.jvp(lambda *x: finish(ep, *x), primals, (dacc, dc, jnp.zeros_like(dbias)))

        return f(acc, c, bias)

    return broken


def _splits_the_batch(case):
    """Eager vmap where the batched operand's distribution is a NamedSharding
    that, given to the stacked operand as it is, splits its batch axis unevenly."""
    t = case.transform
    if t is None or t.kind != "vmap" or t.axis != 0 or case.on_mesh is not None or case.jit or case.batch_shape:
        return False
    d = case.distributions[0 if t.batched == "a" else 1] if case.distributions else None
    rows = (case.a_shape if t.batched == "a" else case.b_shape)[0]
    return d == dm.Slab.X and rows % case.nranks == 0 and case.nranks > t.size


#: (what is broken in a transformation's path, the cases that must catch it, how, what the failure says)
BROKEN_TRANSFORMS = {
    "the local products' derivative doubled": (
        lambda c: _passes(c) and c.transform is not None and c.transform.kind in ("vjp", "jvp") and c.alpha != 0,
        lambda mp, J: mp.setattr(J._kernels.common, "contract", _doubled_derivative(J._kernels.common.contract)),
        "max error"),
    "the bias's derivative dropped": (
        lambda c: _passes(c) and c.transform is not None and c.transform.kind in ("vjp", "jvp")
        and "bias" in c.traced,
        lambda mp, J: mp.setattr(J._kernels.common, "finish", _bias_derivative_dropped(J._kernels.common.finish)),
        "max error"),
    "vmap's batch axis split by a matrix's sharding (device_put under vmap)": (
        lambda c: _passes(c) and _splits_the_batch(c),
        lambda mp, J: mp.setattr(J._mesh, "_in_vmap", lambda: False), "IndivisibleError"),
}


@pytest.mark.parametrize("broken", list(BROKEN_TRANSFORMS))
def test_a_drawn_transformation_catches_what_it_covers(monkeypatch, broken):
    """Break dm.matmul's derivatives (its values right) or its path under
    vmap: the check fails the drawn cases of that transformation, saying
    which output is wrong; the same cases pass unbroken."""
    pytest.importorskip("jax")
    from dmatmul.backends import jax as J

    drawn, breaks, words = BROKEN_TRANSFORMS[broken]
    kinds = {}  # one case of each transformation that must catch it (vjp and jvp; vmap twice)
    for i, c in enumerate(c for c in _draws(782, 20000) if _simple(c) and drawn(c)):
        kinds.setdefault(c.transform.kind if c.transform.kind != "vmap" else i, c)
        if len(kinds) == 2:
            break
    cases = list(kinds.values())
    assert len(cases) == 2, broken
    outs = _run_broken(monkeypatch, breaks, cases, J)
    assert [o.status for o in outs] == ["failed"] * 2 and all(words in o.message for o in outs), \
        [(o.message, o.describe()) for o in outs]
    assert all(c.transform.describe() in o.message for c, o in zip(cases, outs) if words == "max error")
    monkeypatch.setattr(PLANS, "_shelves", {})
    assert [ck.run_case(c, rng_seed=3).status for c in cases] == ["passed"] * 2
