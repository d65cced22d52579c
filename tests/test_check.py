"""The differential matrix: random products over the whole layout space.

The generator of :mod:`dmatmul._check`: that it covers the space, and its
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
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dmatmul as dm
from dmatmul import _check as ck

ROOT = pathlib.Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- #
# the generator covers the space
# --------------------------------------------------------------------------- #
def _kind(d):
    return repr(d) if not d.grid else type(d).__name__


def test_the_generator_covers_the_whole_layout_space():
    seen = collections.defaultdict(set)
    for i in range(3000):
        chooser = ck.NumpyChooser([12345, i])
        nranks = chooser.choice(ck.NRANKS)
        case = ck.draw_case(chooser, nranks)
        for name, d in zip(("a", "b", "result"), case.distributions):
            seen[f"kind of {name}"].add(_kind(d))
        for d, shape in zip(case.distributions, (case.a_shape, case.b_shape, (case.m, case.n))):
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
        seen["algorithm"].add(case.algorithm)
        seen["array family"].add(case.family)
        seen["precision"].add(case.precision)
        if case.specials:
            seen["inf/NaN"].add((case.dtype, case.epilog, case.use_c and case.beta != 0, case.layout_family))
        on = case.on_mesh
        if on is not None:
            seen["on a user's mesh"].add((on.call, on.explicit, on.reversed, len(on.shape), on.mixed))
            seen["placements"].update(on.placements)
        required, allowed = case.refusals()
        seen["refusals"].update(r.why.split()[0] for r in required + allowed)
    kinds = {"Slab.X", "Slab.Y", "Replicated()", "BlockNonCyclic", "BlockCyclic"}
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
    assert seen["algorithm"] == {"auto", *dm.ALGORITHMS}
    assert seen["array family"] == {"numpy", "jax"}
    assert seen["precision"] == {None, "default", "high", "highest"}
    assert {w.split("=")[0] for w in seen["refusals"]} == {"epilog", "grid", "algorithm"}
    assert seen["on a user's mesh"] == {
        (call, explicit, rev, dims, mixed) for call in ck.CALLS for explicit in (True, False) for rev in (True, False)
        for dims in (1, 2) for mixed in ((False, True) if dims == 2 else (False,))
    }
    assert seen["placements"] == set(ck.PLACEMENTS)
    specials = seen["inf/NaN"]
    assert {d for d, *_ in specials} == {d for d in dm.DTYPES if not d.startswith("complex")}
    assert {e for _, e, *_ in specials} == {None, "bias"} and {c for *_, c, _ in specials} == {True, False}
    assert {f for *_, f in specials} == set(ck.LAYOUT_FAMILIES)


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
def test_describe_is_the_python_call():
    for i in range(200):
        chooser = ck.NumpyChooser([99, i])
        case = ck.draw_case(chooser, chooser.choice(ck.NRANKS))
        line = case.describe("jax")
        call = ast.parse(line).body[0].value
        assert isinstance(call, ast.Call) and ast.unparse(call.func) == "dm.matmul"
        kw = {k.arg: k.value for k in call.keywords}
        namespace = {"dm": dm, "np": np}
        assert eval(ast.unparse(kw["distribution"]), namespace) == case.distributions
        assert eval(ast.unparse(kw["devices"])) == case.nranks
        for name in ("alpha", "beta", "transpose_a", "transpose_b", "epilog", "algorithm"):
            default = {"alpha": 1.0, "beta": 0.0, "transpose_a": False, "transpose_b": False, "epilog": None,
                       "algorithm": "auto"}[name]
            got = eval(ast.unparse(kw[name])) if name in kw else default
            assert got == getattr(case, name), (name, line)
        assert len(call.args) == 2 + case.use_c and ("bias" in kw) == case.has_bias
        namespace["rand"] = ck.rand
        shapes = [case.a_shape, case.b_shape, (case.m, case.n)]
        for arg, shape in zip(call.args + ([kw["bias"]] if case.has_bias else []),
                              shapes[: len(call.args)] + [(case.m,)]):
            x = eval(ast.unparse(arg), namespace)
            assert x.shape == shape and x.dtype.name == case.dtype and dm._matmul.family(x) == case.family
    assert "mpiexec -n 4" in ck.draw_case(ck.NumpyChooser(0), 4).describe("jax", mpi=True)


def test_rand_makes_the_operands_of_a_line():
    x = ck.rand((3, 2), "float16")
    assert x.shape == (3, 2) and x.dtype == np.float16


def _case(**kw):
    base = dict(nranks=4, m=6, n=5, k=3, dtype="float32", transpose_a=False, transpose_b=False,
                distributions=(dm.Slab.X, dm.Slab.Y, dm.Slab.X))
    return ck.Case(**{**base, **kw})


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
    assert _case().refusals() == ([], [])


def test_an_expected_refusal_counts_as_refused_and_a_missing_one_fails(monkeypatch):
    out = ck.run_case(_case(dtype="complex64", epilog="relu"), rng_seed=1)
    assert out.status == "refused" and "TypeError" in out.message
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


def test_the_check_module_needs_only_numpy():
    code = ("import sys, dmatmul._check; "
            "print(sorted(m for m in ('jax', 'hypothesis', 'nvmath', 'cupy', 'mpi4py') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


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
    and pass again when they are."""
    pytest.importorskip("jax")
    from dmatmul.backends.jax import _backend

    cases = []
    for i in range(3000):
        ch = ck.NumpyChooser([4242, i])
        case = ck.draw_case(ch, ch.choice(ck.NRANKS))
        on = case.on_mesh
        if on is not None and on.explicit and on.call == "jit" and min(case.m, case.n, case.k) > 0 \
                and case.algorithm == "auto" and not any(case.refusals()):
            cases.append(case)
        if len(cases) == 3:
            break
    monkeypatch.setattr(_backend, "_auto_typed", lambda x: x)
    monkeypatch.setattr(dm.backends.get("jax"), "_plans", {})
    assert [ck.run_case(c).status for c in cases] == ["failed"] * 3
    monkeypatch.undo()
    monkeypatch.setattr(dm.backends.get("jax"), "_plans", {})
    assert [ck.run_case(c).status for c in cases] == ["passed"] * 3
