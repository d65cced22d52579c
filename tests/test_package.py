"""Package hygiene: light import, doctests, the command line, README vs CI."""

from __future__ import annotations

import ast
import doctest
import importlib
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_import_is_light():
    code = (
        "import sys, dmatmul\n"
        "heavy = [m for m in ('jax', 'jaxlib', 'nvmath', 'cupy', 'mpi4py', 'dmatmul.testing') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = run(sys.executable, "-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_public_names_resolve():
    import dmatmul

    for name in dmatmul.__all__:
        assert getattr(dmatmul, name) is not None
    assert dmatmul.Slab.X == dmatmul.Slab(0) and callable(dmatmul.matmul)


def _import_graph(root: pathlib.Path) -> dict[str, set[str]]:
    """Which of the package's modules each module of ``root/dmatmul`` imports:
    every ``import`` and ``from ... import`` (at module level, in functions, under
    ``TYPE_CHECKING``), relative ones resolved against the module's package.

    Importing ``dmatmul.a.b`` runs ``dmatmul.a``'s ``__init__`` too: an edge to each
    parent package of the target, except the importer's own parents, which have
    run before it (an explicit import of one, ``from .. import name``, is kept)."""
    import ast

    files = {}
    for path in sorted((root / "dmatmul").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        files[name] = (path, parts[-1] == "__init__")

    def parents(name: str) -> list[str]:
        parts = name.split(".")
        return [".".join(parts[:i]) for i in range(1, len(parts))]

    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in files.items():
        package = name if is_package else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                subs = {f"{base}.{alias.name}" for alias in node.names} & files.keys()
                # `from base import x`: the submodule base.x where there is one, else a name of base
                targets.update(subs if len(subs) == len(node.names) else subs | {base})
        own = set(parents(name))
        edges = set()
        for target in targets & files.keys():
            edges.add(target)
            edges.update(p for p in parents(target) if p not in own)
        graph[name] = edges - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules, the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        path.append(module)
        for target in sorted(graph[module]):
            found = visit(target)
            if found is not None:
                return found
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module)
        if found is not None:
            return found
    return None


def test_no_import_circle():
    """The package is layered: no module imports, however indirectly, one that
    imports it back (docs/architecture.md, the module map)."""
    circle = _cycle(_import_graph(ROOT))
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_import_graph_sees_a_circle():
    """The graph sees imports inside functions, relative ones and parent
    packages: a circle made that way is found."""
    graph = _import_graph(ROOT)
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert "dmatmul.backends" in graph["dmatmul._runtime"]  # parent of the package: `from . import backends`
    assert "dmatmul.cli" not in graph["dmatmul.cli.bench.command"]  # its own parent runs before it
    assert {"dmatmul.cli.common", "dmatmul._cost"} <= graph["dmatmul.cli.bench.command"]  # `from ..common`, `from ...`
    assert "dmatmul.backends" in graph["dmatmul.cli.check"]
    # inside a function (cmd_demo's `import dmatmul as dm`) and a parent package's __init__
    assert "dmatmul" in graph["dmatmul.cli.demo"]
    assert {"dmatmul.backends", "dmatmul.backends.jax"} <= graph["dmatmul.jax"]  # `from .backends.jax._kernels`


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100  # from the `def` line to the last line of the body
# Today's offenders, each with its size now. The list only shrinks: a module or
# function that is split below the bound must leave it (the test says so), and
# one that grows must not grow further than its entry.
TOO_LONG_MODULES: dict[str, int] = {}
TOO_LONG_FUNCTIONS: dict[str, int] = {}


def _sizes(root: pathlib.Path) -> tuple[dict[str, int], dict[str, int]]:
    """Lines per module and per function (``path::Class.method``, nested
    functions as ``outer.inner``) of the package under ``root``."""
    modules, functions = {}, {}
    for path in sorted((root / "dmatmul").rglob("*.py")):
        name = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        modules[name] = len(text.splitlines())

        def visit(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    qualname = prefix + child.name
                    if not isinstance(child, ast.ClassDef):
                        functions[f"{name}::{qualname}"] = (child.end_lineno or child.lineno) - child.lineno + 1
                    visit(child, qualname + ".")
                else:
                    visit(child, prefix)

        visit(ast.parse(text, filename=name), "")
    return modules, functions


def _over_bounds(sizes: dict[str, int], bound: int, allowed: dict[str, int], what: str) -> list[str]:
    problems = []
    for name, size in sorted(sizes.items()):
        if size > bound and name not in allowed:
            problems.append(f"{name}: {size} lines, over {bound}: split the {what}")
        elif name in allowed and size > allowed[name]:
            problems.append(f"{name}: {size} lines, more than its allowed {allowed[name]}: split the {what}")
    for name, size in sorted(allowed.items()):
        if name not in sizes or sizes[name] <= bound:
            now = f"{sizes[name]} lines" if name in sizes else "gone"
            problems.append(f"{name}: now {now}, within {bound}: take it off the allowlist")
    return problems


def test_modules_and_functions_are_short():
    """No module of the package over 600 lines, no function over 100, but for
    the allowlisted ones, which may not grow and leave the list once short."""
    modules, functions = _sizes(ROOT)
    problems = _over_bounds(modules, MAX_MODULE_LINES, TOO_LONG_MODULES, "module") + _over_bounds(
        functions, MAX_FUNCTION_LINES, TOO_LONG_FUNCTIONS, "function"
    )
    assert not problems, "\n".join(problems)


def test_size_check_sees_long_and_nested_functions_and_stale_entries(tmp_path):
    """The size check counts nested functions and methods, and blames an
    allowlist entry that is now within bounds."""
    package = tmp_path / "dmatmul"
    package.mkdir()
    body = "".join(f"        x{i} = {i}\n" for i in range(100))
    (package / "m.py").write_text(f"class C:\n    def f(self):\n        def g():\n            pass\n{body}")
    modules, functions = _sizes(tmp_path)
    assert modules == {"dmatmul/m.py": 104}
    assert functions == {"dmatmul/m.py::C.f": 103, "dmatmul/m.py::C.f.g": 2}
    assert _over_bounds(functions, 100, {}, "function") == [
        "dmatmul/m.py::C.f: 103 lines, over 100: split the function"
    ]
    assert _over_bounds(modules, 600, {"dmatmul/m.py": 104}, "module") == [
        "dmatmul/m.py: now 104 lines, within 600: take it off the allowlist"
    ]
    assert _over_bounds(functions, 100, {"dmatmul/m.py::C.f": 102}, "function") == [
        "dmatmul/m.py::C.f: 103 lines, more than its allowed 102: split the function"
    ]


def _modules() -> list[str]:
    import pkgutil

    import dmatmul

    found = pkgutil.walk_packages(dmatmul.__path__, "dmatmul.")
    return sorted(m.name for m in found if not m.name.endswith(".__main__"))


@pytest.mark.parametrize("module", _modules())
def test_doctests(module):
    """Every module's examples run as written (those of the JAX backend and
    dmatmul.jax where JAX is installed)."""
    if module.startswith(("dmatmul.backends.jax", "dmatmul.jax")):
        pytest.importorskip("jax")
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {module} failed"


def test_cli_demo_passes_and_prints_the_table():
    pytest.importorskip("jax")
    out = run(sys.executable, "-m", "dmatmul", "demo", "-m", "37", "-n", "29", "-k", "23")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "max rel err" in out.stdout
    assert re.search(r"^\d+ passed, 0 failed$", out.stdout, re.M)
    for name in ("allgather", "reduce_scatter", "allreduce", "local", "summa", "redistribute", "float64",
                 "complex64", "BC(2x4 col"):
        assert name in out.stdout
    assert "15 passed, 0 failed" in out.stdout


def test_cli_info():
    """One line per backend, the devices the demo and check use (not the one CPU device
    a fresh JAX has); what each backend found installed only with -v."""
    out = run(sys.executable, "-m", "dmatmul", "info")
    assert out.returncode == 0, out.stderr
    assert "backend jax" in out.stdout and "backend nvmath" in out.stdout
    if importlib.util.find_spec("jax") is not None:
        assert "JAX on 8 simulated CPU devices" in out.stdout, out.stdout
    assert "  found: " not in out.stdout and "dmatmul info -v" in out.stdout, out.stdout
    verbose = run(sys.executable, "-m", "dmatmul", "info", "-v")
    assert verbose.returncode == 0, verbose.stderr
    assert "  found: " in verbose.stdout and "dmatmul info -v" not in verbose.stdout, verbose.stdout


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:sh|bash|console)?\n(.*?)```", readme, re.S)
    commands = [line.strip() for block in blocks[:1] for line in block.splitlines() if line.strip()]
    assert len(commands) == 2, f"README must open with two commands, found {commands}"
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci, f"{commands[1]!r} not in .ci/run"


def test_declared_minimums_are_the_ones_that_work():
    """jax 0.7.0 lacks jax.set_mesh and 0.7.1-0.8.1 lack lax.pcast (the demo passes from
    0.8.2 on); every such jax needs Python >= 3.11. pyproject.toml and the README say so."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    packaging = pytest.importorskip("packaging.requirements")
    from packaging.specifiers import SpecifierSet

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    jax_reqs = [packaging.Requirement(r) for reqs in project["optional-dependencies"].values() for r in reqs
                if packaging.Requirement(r).name == "jax"]
    assert jax_reqs, "no extra requires jax"
    for req in jax_reqs:
        assert not req.specifier.contains("0.8.1") and req.specifier.contains("0.8.2"), f"{req}: jax >= 0.8.2"
    python = SpecifierSet(project["requires-python"])
    assert not python.contains("3.10.14") and python.contains("3.11.0"), project["requires-python"]
    for classifier in project.get("classifiers", []):
        assert "Python :: 3.10" not in classifier, classifier
    readme = (ROOT / "README.md").read_text()
    assert "Python (>= 3.10" not in readme and "Python (>= 3.11" in " ".join(readme.split())


def test_guide_short_tour_runs_in_a_fresh_process():
    """docs/guide.md: the tour's first block, then the 2-D grid snippet (which reuses its
    a and b), as a reader pastes them into a plain CPU process (one JAX device unless told)."""
    pytest.importorskip("jax")
    readme = (ROOT / "docs" / "guide.md").read_text()
    section = readme.split("## A short tour", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^( *)```python\n(.*?)^\1```", section, re.S | re.M)
    assert len(blocks) == 2, "the tour and its 2-D grid snippet"
    code = "\n".join("\n".join(line[len(indent):] for line in body.splitlines()) for indent, body in blocks)
    assert "devices=8" in code
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**env, "JAX_PLATFORMS": "cpu"}, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "reduce_scatter" in out.stdout


@pytest.mark.parametrize("command, status", [("info", 0), ("demo", 1), ("bench", 1), ("check", 1)])
def test_commands_without_jax_say_what_to_install(command, status):
    """A plain ``pip install .`` (no extras): no traceback; info prints its table,
    the others one line naming the extra, as check always did."""
    code = ("import sys; sys.modules['jax'] = None\n"  # import jax now fails, find_spec('jax') is None
            "from dmatmul import cli\n"
            f"sys.exit(cli.main([{command!r}]))\n")
    out = run(sys.executable, "-c", code, timeout=120)
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == status, out.stdout + out.stderr
    if command == "info":
        assert "backend jax    : unavailable: jax not installed: pip install 'dmatmul[jax]'" in out.stdout
    else:
        assert out.stderr.strip() == (f"dmatmul {command}: backend 'jax' cannot run here: "
                                      "jax not installed: pip install 'dmatmul[jax]'")


def test_dmatmul_jax_without_jax_names_the_extra():
    """``import dmatmul.jax`` where JAX is missing: an ImportError (a
    ModuleNotFoundError for "jax", as before) whose message says what to install."""
    code = ("import sys; sys.modules['jax'] = None\n"
            "try:\n"
            "    import dmatmul.jax\n"
            "except ModuleNotFoundError as e:\n"
            "    print(e.name, '|', e)\n")
    out = run(sys.executable, "-c", code, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "jax | dmatmul.jax needs JAX: pip install 'dmatmul[jax]'"


def test_guide_demo_table_is_the_demos_output():
    """Every line of docs/guide.md's demo block as ``dmatmul demo`` prints it now, but
    for the measured columns (max rel err, ms), which vary by machine."""
    pytest.importorskip("jax")
    readme = (ROOT / "docs" / "guide.md").read_text()
    section = readme.split("## The demo\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```\n(.*?)```", section, re.S)
    out = run(sys.executable, "-m", "dmatmul", "demo")
    assert out.returncode == 0, out.stdout + out.stderr

    def shape(text: str) -> list[str]:
        return [re.sub(r"\s+\S+\s+\S+$", "", line) if re.search(r"\d\.\d\de[-+]\d\d +\d+\.\d\d$", line)
                else line.rstrip() for line in text.strip().splitlines()]

    assert shape(block) == shape(out.stdout)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2])
def test_block_cyclic_example_names_its_rank_count(n):
    """The 2x2-grid example under another rank count: exit 1 on every rank, one
    line saying how to launch it, no traceback (and no MPI_Abort)."""
    pytest.importorskip("mpi4py")
    pytest.importorskip("jax")
    script = str(ROOT / "mpi_examples" / "block_cyclic.py")
    if n == 1:
        cmd = [sys.executable, script]
    else:
        beside = pathlib.Path(sys.executable).parent / "mpiexec"
        launcher = str(beside) if beside.exists() else shutil.which("mpiexec")
        if launcher is None:
            pytest.skip("no mpiexec")
        cmd = [launcher, "-n", str(n), sys.executable, script]
    out = run(*cmd, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "Abort" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if "run with mpiexec -n 4" in line]
    assert len(lines) == 1, out.stderr


def test_check_reads_the_backend_table(monkeypatch, capsys):
    """docs/architecture.md: a new backend is one table row, and ``dmatmul check``
    reads the table: ``--backend`` takes its name, ``auto`` is the first row that
    runs here (the choices and ``auto`` were written out as nvmath and jax)."""
    from dmatmul import backends, cli

    row = backends.BackendInfo("torch", "dmatmul.backends.torch", "torch", ("numpy",), "a backend to come")
    monkeypatch.setattr(backends, "TABLE", (row, *backends.TABLE))
    monkeypatch.setattr(backends, "NAMES", (*backends.NAMES, "torch"))
    monkeypatch.setitem(backends._BY_NAME, "torch", row)
    with pytest.raises(SystemExit) as info:
        cli.main(["check", "--backend", "torch"])
    assert info.value.code == "dmatmul check: backend 'torch' cannot run here: the torch backend is not part of " \
                              "this dmatmul version", (info.value.code, capsys.readouterr().err)
    monkeypatch.setattr(backends, "probe", lambda name: None)  # every row runs here
    assert cli.check.check_backends("auto") == ["torch"]
    assert cli.check.check_backends("all-found") == [r.name for r in backends.TABLE]


def test_cli_help_and_version(capsys):
    from dmatmul import __version__, cli

    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"dmatmul {__version__}"
    helps = {}
    for argv in (["--help"], ["demo", "--help"], ["bench", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        helps[argv[0]] = capsys.readouterr().out
    assert "``" not in helps["--help"] and "The dmatmul command: info, demo, check, bench and plan." in helps["--help"]
    assert "Every algorithm" in helps["demo"]  # a description, not just the usage
    bench = " ".join(helps["bench"].split())
    assert "(default: None)" not in bench and "(default: False)" not in bench
    assert "--dtype {float32,bfloat16,float16,float64} element type" in bench


@pytest.mark.parametrize("argv", [
    ["demo", "-m", "8", "-n", "8", "-k", "8", "--devices", "2"],
    ["check", "--cases", "1", "--devices", "2"],
    ["bench", "--costs", "--sizes", "64", "--devices", "2"],
])
def test_cli_says_in_one_line_that_the_cost_model_file_is_broken(argv, tmp_path, monkeypatch):
    """A cost model file that cannot be read stops the command before it runs,
    with the file's error on one line (a traceback before; ``check`` counted
    it as a failure of every case)."""
    from dmatmul import _cost, cli

    path = tmp_path / "model.json"
    path.write_text('{"version": 1, "models": {"cpu": {"alpha": -1, "beta": 0, "gamma": 0}}}')
    monkeypatch.setenv(_cost.MODEL_ENV, str(path))
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    message = str(info.value.code)
    assert message.startswith(f"dmatmul {argv[0]}: cost model file {path}") and ".alpha must be" in message


def test_cli_says_in_one_line_that_the_sizes_do_not_fit(monkeypatch, capsys):
    """``dmatmul demo -m 400000 -n 400000``: numpy's MemoryError, one line
    (a traceback before)."""
    from dmatmul import cli
    from dmatmul.cli import bench as _bench

    def too_big(args):
        raise MemoryError("Unable to allocate 1.16 TiB for an array with shape (400000, 400000)")

    monkeypatch.setattr(cli.demo, "cmd_demo", too_big)
    monkeypatch.setattr(_bench.command, "run", too_big)
    for main, argv, prog in ((cli.main, ["demo", "-m", "400000"], "dmatmul demo"),
                             (cli.main, ["bench", "--sizes", "400000"], "dmatmul bench"),
                             (_bench.main, ["--sizes", "400000"], "dmatmul bench")):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err == f"{prog}: out of memory: Unable to allocate 1.16 TiB for an array with shape (400000, 400000); " \
                      "use smaller sizes\n", err


def test_cli_stops_quietly_when_its_reader_goes_away():
    """``dmatmul info | head -1``: no BrokenPipeError traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    proc = subprocess.Popen([sys.executable, "-m", "dmatmul", "info"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    proc.stdout.close()  # the reader is gone before the first line
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode == 1


def test_license_is_an_spdx_expression_with_its_file():
    """PEP 639 (setuptools >= 77): ``license = "Apache-2.0"`` and the LICENSE file
    shipped in the wheel; the ``{ text = ... }`` table is deprecated."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    from packaging.requirements import Requirement

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    setuptools = next(Requirement(r) for r in pyproject["build-system"]["requires"]
                      if Requirement(r).name == "setuptools")
    assert not setuptools.specifier.contains("76.1") and setuptools.specifier.contains("77.0")
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"] and "END OF TERMS AND CONDITIONS" in text


# MANIFEST.in applied as ``sdist`` applies it, in a process of its own: setuptools replaces distutils when
# imported, which fails once anything in this process (the suite's other imports) has loaded the stdlib's
_SDIST_FILES = """
import json, sys
from setuptools.command.egg_info import FileList
manifest = FileList()
manifest.findall()
for line in open("MANIFEST.in").read().splitlines() if __import__("os").path.exists("MANIFEST.in") else []:
    if line.strip() and not line.lstrip().startswith("#"):
        manifest.process_template_line(line)
json.dump(manifest.files, sys.stdout)
"""


def test_sdist_carries_the_test_suite_and_what_it_reads():
    """An unpacked sdist runs its tests as a clone does. setuptools alone puts
    only tests/test*.py in the sdist (no conftest.py,
    tests/gpu, tests/mpi, tests/typing, nor mpi_examples and .ci/run, which
    tests read): MANIFEST.in, applied here as ``sdist`` applies it, adds them."""
    if importlib.util.find_spec("setuptools") is None:  # (not imported here: see _SDIST_FILES)
        pytest.skip("setuptools is not installed: nothing builds an sdist here")
    out = subprocess.run([sys.executable, "-c", _SDIST_FILES], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    shipped = {pathlib.Path(f).as_posix() for f in json.loads(out.stdout)}
    wanted = {".ci/run"} | {
        path.relative_to(ROOT).as_posix()
        for top in ("tests", "mpi_examples", "benchmarks", "docs") for path in (ROOT / top).rglob("*")
        if path.is_file() and not any(part.startswith((".", "__pycache__")) for part in path.relative_to(ROOT).parts)
        and path.suffix != ".pyc"
    }
    assert "tests/conftest.py" in wanted and "tests/gpu/_fake_nvmath.py" in wanted
    assert not wanted - shipped, f"MANIFEST.in does not carry {sorted(wanted - shipped)} into the sdist"
    junk = sorted(f for f in shipped if "__pycache__" in f or f.endswith(".pyc"))
    assert not junk, junk
