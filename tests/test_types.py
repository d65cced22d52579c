"""The type check: mypy over the package (``[tool.mypy]`` in pyproject.toml),
and over the typing snippets of ``tests/typing/``: the overloads of
``dm.matmul`` (numpy in, numpy out; a jax.Array in, a jax.Array out) and its
Literal options (a misspelt ``epilog=`` is a type error).

mypy comes with the ``test`` extra, so CI runs this; without mypy it skips.
The three runs share one cache (the first, cold, takes most of the time).
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
from collections.abc import Callable

import pytest

pytest.importorskip("mypy", reason="mypy is not installed (pip install '.[test]')")

ROOT = pathlib.Path(__file__).resolve().parents[1]
Mypy = Callable[..., tuple[int, str]]


@pytest.fixture(scope="module")
def mypy(tmp_path_factory: pytest.TempPathFactory) -> Mypy:
    cache = tmp_path_factory.mktemp("mypy-cache")

    def run(*files: str) -> tuple[int, str]:
        # from the repository root: pyproject.toml's [tool.mypy] applies and `import dmatmul`
        # resolves to this checkout; no file names: the config's `files` (the package)
        out = subprocess.run(
            [sys.executable, "-m", "mypy", "--cache-dir", str(cache), "--no-pretty", *files],
            capture_output=True, text=True, timeout=300, cwd=ROOT,
        )
        return out.returncode, out.stdout + out.stderr

    return run


def test_package_type_checks(mypy: Mypy) -> None:
    rc, out = mypy()
    assert rc == 0, f"mypy found errors in dmatmul/:\n{out}"


def test_matmul_overloads_give_the_operands_family(mypy: Mypy) -> None:
    rc, out = mypy("tests/typing/check_overloads.py")
    assert rc == 0, f"mypy on tests/typing/check_overloads.py:\n{out}"


def test_misspelt_options_are_type_errors(mypy: Mypy) -> None:
    path = "tests/typing/fail_options.py"
    lines = (ROOT / path).read_text().splitlines()
    marked = {i for i, line in enumerate(lines, 1) if line.rstrip().endswith("# E")}
    assert len(marked) >= 6
    rc, out = mypy(path)
    assert rc == 1, f"mypy should report type errors (exit 1), exited {rc}:\n{out}"
    flagged = {int(n) for n in re.findall(rf"^{re.escape(path)}:(\d+): error:", out, re.M)}
    assert flagged == marked, (
        f"lines with a type error {sorted(flagged)}, lines marked '# E' {sorted(marked)}:\n{out}"
    )
