"""The backend conformance suite: one test body per behaviour, run for every
backend that can run here.

A backend is checked by adding it to :data:`HERE` (how this machine runs it:
which rank counts one process can use, which array families it takes, the
fixture that makes it available). Today: ``jax`` on 1 to 8 simulated CPU
devices, and ``nvmath`` through the simulated nvmath-python of
``tests/gpu/_fake_nvmath.py`` (numpy on the CPU, one rank per process; its
multi-process runs are tests/gpu/nvmath_products.py --fake under mpiexec).

What every backend must do: sit behind the table and the protocol of
:mod:`dmatmul.backends`; match numpy on the generated differential matrix;
raise the front end's typed errors; plan, explain, execute, reset and free
as :class:`dmatmul.Matmul` promises; never modify an input; return results
of the operands' array family that the caller owns.
"""

from __future__ import annotations

import ast
import importlib
import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import typing

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import dmatmul as dm
from dmatmul import testing as ck
from dmatmul import _plan, backends
from dmatmul._matmul import plan_of
from dmatmul._spec import BackendName
from dmatmul._spec import family as array_family
from dmatmul.testing import assert_close, reference

ROOT = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Here:
    """How this machine runs one backend."""

    name: str
    nranks: tuple[int, ...]  # the rank counts one process can span
    families: tuple[str, ...]  # the operand array families it is tested with
    fixture: str | None = None  # the pytest fixture that makes it available

    def devices(self, nranks: int) -> dict:
        """The keyword that asks for ``nranks`` ranks in one process."""
        return {"devices": nranks} if self.name == "jax" else {}


#: Every backend this suite checks: a new backend is one more row.
HERE = (
    Here("jax", ck.NRANKS, ("numpy", "jax")),
    Here("nvmath", (1,), ("numpy",), fixture="fake_nvmath"),
)


@pytest.fixture(params=HERE, ids=lambda h: h.name)
def here(request) -> Here:
    h: Here = request.param
    if h.name == "jax":
        pytest.importorskip("jax")
    if h.fixture is not None:
        request.getfixturevalue(h.fixture)
    return h


def test_every_backend_in_the_table_is_checked_here():
    assert {h.name for h in HERE} == {row.name for row in backends.TABLE}
    # the Literal type checkers see names the same backends
    assert set(typing.get_args(BackendName)) == set(backends.NAMES)


# --------------------------------------------------------------------------- #
# the table and the protocol
# --------------------------------------------------------------------------- #
def test_table_row_protocol_and_extra(here):
    row = backends.info(here.name)
    assert row.module == f"dmatmul.backends.{here.name}"
    extras = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1].split("\n[")[0]
    assert re.search(rf"^{re.escape(row.extra)}\s*=", extras, re.M), (
        f"pyproject.toml has no extra {row.extra!r} for backend {here.name!r}")
    assert backends.probe(here.name) is None
    backend = backends.get(here.name)
    assert backend.name == here.name and backends.resolve(here.name) is backend
    for method in ("plan", "ranks", "start", "stop"):
        assert callable(getattr(backend, method)), method
    if row.redistributes:
        assert callable(getattr(backend, "redistribute"))
    assert here.name in backends.NAMES


def test_probing_the_backends_searches_the_path_once(monkeypatch):
    """backend="auto" probes the table's rows before every product: a package not
    installed (nvmath, cupy on this machine) was looked for on the path each time,
    a stat of every sys.path entry per package and product. It is looked for once;
    a module in sys.modules (imported, a fake's, or None: blocked) is taken as it is."""
    import importlib.machinery
    import sys

    a = np.ones((8, 8), np.float32)
    np.testing.assert_array_equal(dm.matmul(a, a), a @ a)
    searched: list[str] = []
    find = importlib.machinery.PathFinder.find_spec
    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec",
                        classmethod(lambda cls, name, *args: searched.append(name) or find(name, *args)))
    for _ in range(3):
        np.testing.assert_array_equal(dm.matmul(a, 2 * a), 2 * a @ a)
        for row in backends.TABLE:
            backends.probe(row.name)
    assert searched == []
    monkeypatch.setitem(sys.modules, "jax", None)
    assert backends.probe("jax") == "jax not installed: pip install 'dmatmul[jax]'"


def test_the_architecture_page_lists_every_part_of_the_protocol():
    """docs/architecture.md's "backend contract" names every method and attribute
    the Backend protocol's docstring does (what a new backend's author reads)."""
    doc = backends.Backend.__doc__ or ""
    named = set(re.findall(r"^\s*\* ``(\w+)``", doc, re.M)) | set(re.findall(r"``(\w+)\(", doc))
    assert {"plan", "ranks", "start", "stop", "place", "fits", "preview", "plans_collectively"} <= named, named
    page = (ROOT / "docs" / "architecture.md").read_text()
    contract = page.split("## The backend contract", 1)[1].split("\n## ", 1)[0]
    missing = sorted(name for name in named if f"`{name}" not in contract)
    assert not missing, f"docs/architecture.md's backend contract does not name {missing}"
    (row,) = re.findall(r"`(BackendInfo\(.*?\))`", page)  # "Adding a backend": its table row, as written
    row = eval(row, {"BackendInfo": backends.BackendInfo})
    assert (row.name, row.module, row.packages) == ("torch", "dmatmul.backends.torch", ("torch",))


def _imports(path: pathlib.Path) -> list[str]:
    """The absolute module names ``path`` imports (relative imports resolved)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append(mod)
            out += [f"{mod}.{a.name}" for a in node.names]
    return out


@pytest.mark.parametrize("name", [row.name for row in backends.TABLE])
def test_a_backend_imports_only_the_shared_vocabulary(name):
    """No backend imports the front end's implementation (dmatmul._matmul) or
    another backend's modules: the layers point one way."""
    others = [f"dmatmul.backends.{row.name}" for row in backends.TABLE if row.name != name]
    for path in sorted((ROOT / "dmatmul" / "backends" / name).rglob("*.py")):
        for mod in _imports(path):
            assert not mod.startswith("dmatmul._matmul"), f"{path.relative_to(ROOT)} imports {mod}"
            assert not any(mod == o or mod.startswith(o + ".") for o in others), (
                f"{path.relative_to(ROOT)} imports {mod}, another backend's module"
            )


def test_no_front_end_module_reaches_into_a_backend():
    """Outside dmatmul/backends/, only the public dmatmul.jax module (the
    building blocks, which *are* the JAX backend's kernels) imports a
    backend's modules; everything else goes through dmatmul.backends."""
    for path in sorted((ROOT / "dmatmul").rglob("*.py")):
        rel = path.relative_to(ROOT / "dmatmul")
        if rel.parts[0] == "backends" or rel.as_posix() == "jax.py":
            continue
        for mod in _imports(path):
            assert not mod.startswith("dmatmul.backends."), f"dmatmul/{rel} imports {mod}"


def test_the_front_end_never_asks_whether_a_backend_has_a_member():
    """Every member of the backend protocol has a default on its base class
    (:class:`dmatmul.backends.Backend`, :class:`~dmatmul.backends.BackendPlan`),
    and every backend derives from it: no module outside dmatmul/backends/
    looks one up with getattr or hasattr."""
    members = {name for cls in (backends.Backend, backends.BackendPlan) for name in vars(cls)
               if not name.startswith("__")}
    assert {"place", "fits", "memory", "preview", "plans_collectively", "repeat"} <= members
    for row in backends.TABLE:  # (each backend's package module is light: nvmath's imports no nvmath)
        assert isinstance(importlib.import_module(row.module).BACKEND, backends.Backend), row.name
    for path in sorted((ROOT / "dmatmul").rglob("*.py")):
        rel = path.relative_to(ROOT / "dmatmul")
        if rel.parts[0] == "backends":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2 \
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in members:
                raise AssertionError(f"dmatmul/{rel}:{node.lineno}: {ast.unparse(node)}")


_JAX_NAMES = {"jax", "jnp", "jaxlib"}
#: Modules of dmatmul/ outside the neutral core: the public JAX building blocks
#: (which *are* the JAX backend's kernels). dmatmul.testing, a package of its
#: own and not read here, makes jax.Arrays and JAX transformations of
#: dm.matmul on purpose (a test harness, as the CLI is).
_NOT_CORE = {"jax.py"}


def _jax_knowledge(tree: ast.AST, names: frozenset[str] | set[str] = _JAX_NAMES) -> list[tuple[int, str]]:
    """Where ``tree`` knows JAX: a name or attribute ``jax``/``jnp``/``jaxlib``, an
    import of jax or jaxlib, a string naming them passed to ``sys.modules.get``,
    ``import_module`` or ``__import__`` (or compared with ``in sys.modules``).
    Other strings (docstrings, error messages naming jax.Array) are wording;
    annotations and ``if TYPE_CHECKING:`` blocks are for type checkers (the
    public signatures say jax.Array) and never run."""
    def jaxy(name: str) -> bool:
        return name.split(".")[0] in names

    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
        annotations = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            annotations = [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs,
                                                  args.vararg, args.kwarg) if a is not None] + [node.returns]
        elif isinstance(node, ast.AnnAssign):
            annotations = [node.annotation]
        skip.update(id(n) for a in annotations if a is not None for n in ast.walk(a))
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        what = None
        if isinstance(node, ast.Name) and node.id in names:
            what = node.id
        elif isinstance(node, ast.Attribute) and node.attr in names:
            what = "." + node.attr
        elif isinstance(node, ast.Import) and any(jaxy(a.name) for a in node.names):
            what = "import " + ", ".join(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and jaxy(node.module or ""):
            what = f"from {node.module} import"
        elif isinstance(node, ast.Call):
            callee = ast.unparse(node.func)
            if callee.endswith(("sys.modules.get", "import_module", "__import__", "find_spec")) and any(
                    isinstance(a, ast.Constant) and isinstance(a.value, str) and jaxy(a.value) for a in node.args):
                what = f"{callee}(...jax...)"
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) \
                and isinstance(node.left.value, str) and jaxy(node.left.value) \
                and any(ast.unparse(c).endswith("sys.modules") for c in node.comparators):
            what = f"{node.left.value!r} in sys.modules"
        if what is not None:
            found.append((getattr(node, "lineno", 0), what))
    return sorted(found)


@pytest.mark.parametrize("library, names", [("JAX", _JAX_NAMES), ("CuPy", {"cupy"})])
def test_the_neutral_core_never_names_jax(library, names):
    """All JAX knowledge (jax.Array and tracers, meshes, x64, jax._src) lives in
    the JAX backend (dmatmul/backends/jax/, its light ``_arrays`` module for
    what the core asks: :class:`dmatmul._spec.ArrayKind`), and all CuPy
    knowledge in the nvmath backend's; the core and the backend table ask
    them through the table, by family and claim."""
    core = [p for p in sorted((ROOT / "dmatmul").glob("*.py")) if p.name not in _NOT_CORE]
    core.append(ROOT / "dmatmul" / "backends" / "__init__.py")
    assert len(core) > 15
    named = [f"{path.relative_to(ROOT)}:{line}: {what}" for path in core
             for line, what in _jax_knowledge(ast.parse(path.read_text()), names)]
    assert not named, f"the neutral core knows {library}:\n" + "\n".join(named)


def test_the_neutral_core_check_sees_jax_knowledge():
    """The check above sees each way of knowing JAX, and lets wording and typing be."""
    code = """
import sys
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    import jax
def f(x: jax.Array) -> jnp.ndarray:
    "a jax.Array"
    m = sys.modules.get("jax")
    t = x.jax
    if "jaxlib" in sys.modules:
        raise ValueError("not a jax.Array")
    from jax._src.core import trace_state_clean
    return importlib.import_module("jax.numpy"), jnp
"""
    assert [what for _, what in _jax_knowledge(ast.parse(code))] == [
        "sys.modules.get(...jax...)", ".jax", "'jaxlib' in sys.modules", "from jax._src.core import",
        "importlib.import_module(...jax...)", "jnp"]


# --------------------------------------------------------------------------- #
# the differential matrix, on every backend
# --------------------------------------------------------------------------- #
class HypothesisChooser:
    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def choice(self, seq):
        return self.data.draw(st.sampled_from(list(seq)))

    def integer(self, lo, hi):
        return self.data.draw(st.integers(lo, hi))

    def boolean(self):
        return self.data.draw(st.booleans())


def test_the_gpu_suites_differential_matrix_runs_on_the_fake():
    """tests/gpu/test_nvmath_gpu.py runs ``dmatmul check --backend nvmath`` at
    scale (tests/gpu/nvmath_check.py, 2,000 seeded cases) wherever a GPU is
    lent; the same script, pointed at the fake nvmath, runs a few here, so that
    the path is known to work (and to fail: the fake has cuBLASMp's quirks)."""
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu" / "nvmath_check.py"), "--fake",
                           "--cases", "30", "--seed", "0"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "dmatmul check: 30 random products, seed 0, backend nvmath" in proc.stdout
    assert re.search(r"^total\s+30\s+\d+\s+\d+\s+0\s", proc.stdout, re.M), proc.stdout


@given(data=st.data())
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_random_products_match_numpy(here, data):
    """The generator of dmatmul.testing on this backend: every distribution kind,
    grid order, uneven and prime size, dtype, transpose, alpha/beta/C, epilogue,
    named algorithm and precision, each result checked against numpy."""
    nranks = data.draw(st.sampled_from(here.nranks), label="nranks")
    case = ck.draw_case(HypothesisChooser(data), nranks, families=here.families)
    outcome = ck.run_case(case, backend=here.name, rng_seed=0, **here.devices(nranks))
    assert outcome.status != "failed", f"{outcome.layout_family}: {outcome.message}\n  reproduce: {outcome.describe()}"


@given(data=st.data())
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_auto_where_nvmath_runs_matches_numpy_on_jax_operands(fake_nvmath, data):
    """backend="auto" on a machine where nvmath runs (the fake), in one process:
    the generator's jax cases (on a user's mesh, inside jit, under vjp, jvp and
    vmap...) on every rank count, one rank included, each result checked against
    numpy and for its sharding: they are JAX's to run."""
    nranks = data.draw(st.sampled_from(ck.NRANKS), label="nranks")
    case = ck.draw_case(HypothesisChooser(data), nranks, families=("jax",))
    outcome = ck.run_case(case, backend="auto", rng_seed=0)
    assert outcome.status != "failed", f"{outcome.layout_family}: {outcome.message}\n  reproduce: {outcome.describe()}"


@given(data=st.data())
@settings(max_examples=500 if os.environ.get("DMATMUL_LONG", "") not in ("", "0") else 40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
def test_random_redistributions_move_every_bit(data):
    """``dm.redistribute`` between two distributions drawn as the differential
    matrix draws an operand's (every kind, both grid orders, first process,
    block sizes; uneven, prime, 0 and 1 sizes), of random bit patterns in
    float32, bfloat16, float16, float64, complex64 and float8_e4m3fn, numpy or
    jax, a third of them subnormal (or zero) and a third infinite or NaN
    (signaling ones among them): every bit arrives (moved as floats on CPU, a
    subnormal came back 0 and a NaN was quieted or lost its payload:
    ``_exchange.bits_of``), or a grid of another size is refused, typed. On
    the JAX backend, where ``dm.redistribute`` runs; ``DMATMUL_LONG=1``: 500
    cases."""
    pytest.importorskip("jax")
    import jax.numpy as jnp
    import ml_dtypes

    from dmatmul._spec import numpy_dtype
    from dmatmul.testing import draw as drawing

    chooser = HypothesisChooser(data)
    nranks = chooser.choice(ck.NRANKS)
    grids: list[dm.ProcessGrid] = []
    src, dst = (drawing._draw_distribution(chooser, nranks, grids, []) for _ in range(2))
    shape = (drawing._draw_dim(chooser, 8), drawing._draw_dim(chooser, 8))
    dtype = chooser.choice(("float32", "bfloat16", "float16", "float64", "complex64", "float8_e4m3fn"))
    family = "numpy" if dtype == "float64" else chooser.choice(("numpy", "jax"))  # (JAX without x64: float32)
    dt = np.dtype(numpy_dtype(dtype))
    part = np.dtype(np.float32) if dt.kind == "c" else dt  # a complex number's real and imaginary parts
    info = ml_dtypes.finfo(part)
    uint = np.dtype(f"uint{8 * part.itemsize}")
    exponent = uint.type(((1 << info.nexp) - 1) << info.nmant)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    parts = rng.integers(0, np.iinfo(uint).max, (*shape, dt.itemsize // part.itemsize), dtype=uint, endpoint=True)
    kind = rng.integers(0, 3, parts.shape)  # 0: as drawn, 1: its exponent cleared, 2: its exponent all ones
    parts[kind == 1] &= ~exponent
    parts[kind == 2] |= exponent
    x = parts.view(dt).reshape(shape)
    given_x = jnp.asarray(x) if family == "jax" else x
    if any(g.size != nranks for g in grids):
        with pytest.raises(dm.DistributionError):
            dm.redistribute(given_x, src, dst, devices=nranks)
        return
    got = np.asarray(dm.redistribute(given_x, src, dst, devices=nranks))
    assert got.dtype == x.dtype and got.shape == shape, (got.dtype, got.shape)
    assert np.array_equal(got.view(np.uint8), x.view(np.uint8)), (src, dst, dtype, family, shape)


# --------------------------------------------------------------------------- #
# errors: the front end's, whatever the backend
# --------------------------------------------------------------------------- #
def _ones(*shape, dtype=np.float32):
    return np.ones(shape, dtype)


BAD_CALLS = [
    (dict(a=_ones(4, 3), b=_ones(4, 5)), ValueError, ["inner dimensions", "(4, 3)", "(4, 5)"]),
    (dict(a=_ones(4, 3), b=_ones(3, 5, dtype=np.float64)), TypeError, ["same dtype", "float32", "float64"]),
    (dict(a=_ones(4, 3), b=_ones(3, 5), c=_ones(5, 4), beta=1.0), ValueError, ["c must have", "(4, 5)"]),
    (dict(a=_ones(4, 3), b=_ones(3, 5), epilog="relux"), ValueError, ["epilog must be one of", "relux"]),
    (dict(a=_ones(4, 3), b=_ones(3, 5), epilog="bias"), ValueError, ["bias=<vector of length M>"]),
    (dict(a=_ones(4, 3), b=_ones(3, 5), epilog="bias", bias=np.ones(5, np.float32)), ValueError,
     ["bias of shape (5,)", "length M=4", "one value per result column", "shape (1, N)", "bias.reshape(1, -1)"]),
    (dict(a=_ones(4, 3), b=_ones(3, 5), epilog="bias", bias=np.ones((1, 4), np.float32)), ValueError,
     ["bias must hold one value per result row", "(1, 5)", "(1, 4)"]),
    (dict(a=_ones(4, 3), b=_ones(3, 5), epilog="bias", bias=np.ones((5, 1), np.float32)), ValueError,
     ["(4,) or (4, 1)", "(1, 5)", "(5, 1)"]),
    (dict(a=_ones(4, 3), b=_ones(3, 5), epilog="silu_bias", bias=np.ones((2, 2), np.float32)), ValueError,
     ["bias must be a vector", "(2, 2)"]),
    (dict(a=_ones(4, 3, dtype=np.complex64), b=_ones(3, 5, dtype=np.complex64), epilog="silu"), TypeError,
     ["epilog='silu'", "complex64", "'bias'"]),
    (dict(a=_ones(4, 3), b=_ones(3, 5), algorithm="cannon"), ValueError, ["algorithm must be", "cannon"]),
    (dict(a=_ones(4, 3), b=_ones(3, 5), precision="fast"), ValueError, ["precision must be one of", "fast"]),
    (dict(a=_ones(4), b=_ones(3, 5)), ValueError, ["a must be a 2-D matrix or a batch of matrices", "1-D"]),
    (dict(a=_ones(2, 4, 3), b=_ones(3, 3, 5)), ValueError, ["a and b: batch dimensions", "(2,)", "(3,)"]),
    (dict(a=_ones(4, 3), b=_ones(3, 5), alpha="2"), TypeError, ["alpha must be a number"]),
    (dict(a=_ones(4, 3), b=_ones(3, 5), distribution=(dm.Slab.X, dm.Slab.Y)), ValueError, ["triple", "length 2"]),
    (dict(a=_ones(4, 3), b=_ones(3, 5), distribution=dm.BlockCyclic(dm.ProcessGrid((2, 3)), (2, 2))),
     dm.DistributionError, ["spans 6 ranks", "(2, 3)"]),
]


@pytest.mark.parametrize("call, error, words", BAD_CALLS, ids=[w[0] for _, _, w in BAD_CALLS])
def test_bad_calls_raise_the_same_typed_error(here, call, error, words):
    call = dict(call)
    a, b, c = call.pop("a"), call.pop("b"), call.pop("c", None)
    snapshot = [x.copy() for x in (a, b, c) if x is not None]
    with pytest.raises(error) as info:
        dm.matmul(a, b, c, backend=here.name, **call, **here.devices(max(here.nranks) // 2 or 1))
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert all(np.array_equal(x, y) for x, y in zip(snapshot, [x for x in (a, b, c) if x is not None]))


@pytest.mark.parametrize("most", [False, True], ids=["one rank", "most ranks"])
def test_a_named_algorithm_that_does_not_fit_says_what_it_needs(here, most):
    p = max(here.nranks) if most else 1
    a, b = _ones(8, 6), _ones(6, 4)
    # SUMMA needs a process grid, on one rank as on many
    with pytest.raises(ValueError, match="algorithm='summa'") as info:
        dm.matmul(a, b, backend=here.name, algorithm="summa", distribution=dm.Slab.X, **here.devices(p))
    assert "ProcessGrid" in str(info.value) or "BlockCyclic(grid" in str(info.value)
    assert "algorithm='auto'" in str(info.value)
    if p > 1:  # whatever the sizes: an empty product (never planned) is refused alike
        for m, k in ((8, 6), (8, 0), (0, 6)):
            for name in ("reduce_scatter", "summa"):
                with pytest.raises(ValueError, match=f"algorithm='{name}'") as info:
                    dm.matmul(_ones(m, k), _ones(k, 4), backend=here.name, algorithm=name,
                              distribution=(dm.Slab.X, dm.Slab.Y, dm.Slab.X), **here.devices(p))
                assert "algorithm='auto'" in str(info.value), (m, k, name)
                assert name == "summa" or "Slab.Y, b=Slab.X" in str(info.value), (m, k)
        d = dm.matmul(_ones(8, 0), _ones(0, 4), backend=here.name, algorithm="allgather",
                      distribution=(dm.Slab.X, dm.Slab.Y, dm.Slab.X), **here.devices(p))
        assert d.shape == (8, 4) and not np.asarray(d).any()
    # on a 1x1 grid SUMMA fits
    grid = dm.BlockCyclic(dm.ProcessGrid((1, 1)), (2, 2))
    if p == 1:
        d = dm.matmul(a, b, backend=here.name, algorithm="summa", distribution=grid, **here.devices(p))
        np.testing.assert_allclose(d, a @ b)


# --------------------------------------------------------------------------- #
# the plan's life
# --------------------------------------------------------------------------- #
def test_explain_measures_against_the_bound_only_where_it_applies(here):
    """The lower bound assumes every rank starts with a share of each matrix: a
    replicated a or b breaks that (the modelled bytes fell below the bound)."""
    p = max(here.nranks)
    a, b = _ones(16, 12), _ones(12, 8)
    for dists, words in (((dm.Slab.X, dm.Slab.Y, dm.Slab.X), "x the bound"),
                         ((dm.Replicated(), dm.Slab.Y, dm.Slab.Y), "the bound does not apply: a is replicated"),
                         ((dm.Slab.X, dm.Replicated(), dm.Slab.X), "the bound does not apply: b is replicated")):
        with dm.Matmul(a, b, distribution=dists, backend=here.name, **here.devices(p)) as mm:
            text = mm.explain()
            if p > 1:
                assert words in text, text
            else:  # one rank: nothing moves, nothing to measure
                assert "does not apply" not in text and "x the bound" not in text, text


def test_plan_explain_execute_reset_free(here):
    p = max(here.nranks)
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((13, 7), (7, 11), (13, 11)))
    bias = rng.standard_normal(13).astype(np.float32)
    before = [x.copy() for x in (a, b, c, bias)]
    kw = dict(beta=0.5, epilog="relu_bias", bias=bias, backend=here.name, **here.devices(p))
    with dm.Matmul(a, b, c, **kw) as mm:
        assert mm.algorithm in dm.ALGORITHMS
        plan = plan_of(mm)
        assert isinstance(plan, backends.BackendPlan)
        assert plan.cost is None or isinstance(plan.cost, _plan.Plan)
        if plan.cost is not None:
            assert plan.cost.nbytes >= 0 and plan.cost.flops > 0 and plan.cost.time > 0
        text = mm.explain()
        assert f"backend:    {here.name}" in text and f"algorithm:  {mm.algorithm}" in text
        d = mm.execute()
        want = reference(a, b, c, alpha=1.0, beta=0.5, epilog="relu_bias", bias=bias)
        assert_close(d, want, "float32")
        assert type(d) is np.ndarray and d.flags.writeable
        d[...] = 0  # the caller owns it: the next result is unaffected
        a2 = a * 2
        mm.reset_operands(a2, beta=1.5)
        assert_close(mm.execute(), reference(a2, b, c, beta=1.5, epilog="relu_bias", bias=bias), "float32")
        with pytest.raises(ValueError, match="reset_operands: a must match"):
            mm.reset_operands(_ones(3, 3))
    assert all(np.array_equal(x, y) for x, y in zip(before, (a, b, c, bias)))
    with pytest.raises(dm.PlanFreedError):
        mm.execute()
    with pytest.raises(dm.PlanFreedError, match="with statement on a freed Matmul"):
        with mm:  # it entered, and ran nothing
            pass
    mm.free()  # idempotent


def test_empty_products_follow_blas(here):
    p = max(here.nranks)
    c = np.arange(12, dtype=np.float32).reshape(4, 3)
    d = dm.matmul(_ones(4, 0), _ones(0, 3), c, beta=2.0, epilog="relu", backend=here.name,
                  distribution=dm.Slab.X if p > 1 else None, **here.devices(p))
    np.testing.assert_array_equal(d, np.maximum(2.0 * c, 0))
    d = dm.matmul(_ones(0, 5), _ones(5, 3), backend=here.name, **here.devices(p))
    assert d.shape == (0, 3) and d.dtype == np.float32


@pytest.mark.parametrize("bias_shape", [(4,), (4, 1), (1, 3)])
def test_an_empty_product_adds_the_bias_per_row_or_per_column(here, bias_shape):
    """K = 0: ``epilog(beta*c + bias)``, the bias indexed by the result block's
    rows, or its columns for a bias of shape (1, N), on a result split by rows
    and by columns."""
    p = max(here.nranks)
    rng = np.random.default_rng(9)
    c, bias = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(bias_shape).astype(np.float32)
    for dist in (dm.Slab.X, dm.Slab.Y) if p > 1 else (None,):
        d = dm.matmul(_ones(4, 0), _ones(0, 3), c, beta=2.0, epilog="silu_bias", bias=bias, backend=here.name,
                      distribution=dist, **here.devices(p))
        assert_close(d, reference(_ones(4, 0), _ones(0, 3), c, beta=2.0, epilog="silu_bias", bias=bias), "float32")


def test_the_result_is_of_the_operands_family(here):
    for family in here.families:
        a, b = ck.rand((9, 5), "float32", family), ck.rand((5, 6), "float32", family)
        d = dm.matmul(a, b, backend=here.name, **here.devices(max(here.nranks)))
        assert array_family(d) == family
        np.testing.assert_allclose(np.asarray(d), np.asarray(a) @ np.asarray(b), rtol=1e-5, atol=1e-5)


def test_array_likes_are_taken_as_numpy_takes_them(here):
    """Operands numpy reads as arrays (nested lists, memoryviews) are taken as
    np.asarray makes them, a, b, c and bias alike, also by reset_operands (a
    memoryview was refused for a, b and c as no array, yet taken for bias)."""
    rng = np.random.default_rng(5)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((6, 4), (4, 5), (6, 5)))
    bias = rng.standard_normal(6).astype(np.float32)
    kw = dict(beta=0.5, epilog="bias", backend=here.name, **here.devices(max(here.nranks)))
    want = reference(a, b, c, beta=0.5, epilog="bias", bias=bias)
    for like in (memoryview, lambda x: x.astype(np.float64).tolist()):
        args = [like(x) for x in (a, b, c)]
        dtype = np.asarray(args[0]).dtype.name
        assert_close(dm.matmul(*args, bias=like(bias), **kw), want, dtype)
        with dm.Matmul(a.astype(dtype), b.astype(dtype), c.astype(dtype), bias=bias.astype(dtype), **kw) as mm:
            mm.reset_operands(*args, bias=like(bias))
            assert_close(mm.execute(), want, dtype)


def test_a_list_read_as_another_dtype_is_refused_saying_so(here):
    """A nested list has no dtype of its own: numpy reads floats as float64.
    Where that is not the arrays' dtype the error says how the list was read
    and how to pass it (it advised b.astype(a.dtype), which a list has not)."""
    a, b, c = _ones(4, 3), _ones(3, 5), _ones(4, 5)
    kw = dict(backend=here.name, **here.devices(1))
    for args, words in (((a, b.tolist()), "b was given as a list, which numpy reads as float64: "
                                          "pass np.asarray(b, dtype=a.dtype)"),
                        ((a.tolist(), b), "a was given as a list, which numpy reads as float64: "
                                          "pass np.asarray(a, dtype=b.dtype)"),
                        ((a, b, c.tolist()), "c was given as a list, which numpy reads as float64: "
                                             "pass np.asarray(c, dtype=a.dtype)")):
        with pytest.raises(TypeError, match="must have the (same )?dtype") as info:
            dm.matmul(*args, beta=1.0, **kw)
        assert words in str(info.value), str(info.value)
    with dm.Matmul(a, b, **kw) as mm:
        with pytest.raises(ValueError, match="must match the planned") as info:
            mm.reset_operands(b=b.tolist())
        assert "b was given as a list, which numpy reads as float64: pass np.asarray(b, dtype='float32')" \
            in str(info.value), str(info.value)


def test_byte_swapped_operands_changed_in_place_are_read_anew(here):
    """A plan reads the caller's numpy arrays when it runs, byte-swapped ones
    too: their values changed in place since planning (or since
    reset_operands) are seen by the next execute. (The plan held a
    native-order copy made once, so execute() kept using the old values.)"""
    rng = np.random.default_rng(6)
    a, b, c = (rng.standard_normal(s).astype(">f8") for s in ((6, 4), (4, 5), (6, 5)))
    bias = rng.standard_normal(6).astype(">f8")
    given = (a.copy(), b.copy(), c.copy(), bias.copy())
    kw = dict(beta=0.5, epilog="bias", backend=here.name, **here.devices(max(here.nranks)))
    with dm.Matmul(a, b, c, bias=bias, **kw) as mm:
        mm.execute()
        for x in (a, b, c, bias):
            x *= 2
        assert_close(mm.execute(), reference(a, b, c, beta=0.5, epilog="bias", bias=bias), "float64")
        a2 = rng.standard_normal((6, 4)).astype(">f8")
        mm.reset_operands(a=a2)
        a2[0] = 1.0
        assert_close(mm.execute(), reference(a2, b, c, beta=0.5, epilog="bias", bias=bias), "float64")
        a[...] = given[0]
        mm.reset_operands(a=given[0].astype("<f8"))  # a native one again: read as it is
        assert_close(mm.execute(), reference(given[0], b, c, beta=0.5, epilog="bias", bias=bias), "float64")
        b.shape = (5, 4)  # in place: refused by name, as for a native array
        with pytest.raises(ValueError, match=r"b now has \(shape, dtype\) \(\(5, 4\), 'float64'\)"):
            mm.execute()
    assert all(x.dtype == np.dtype(">f8") for x in (a, b, c, bias)), "the caller's arrays keep their byte order"
