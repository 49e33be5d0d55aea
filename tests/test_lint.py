"""ruff, as pyproject.toml configures it (lint, and the formatter at line length 120), over the whole checkout,
and mypy over rdna1_kmgr/ and bench/.
The README's test command runs it, so CI does: a change that is not formatted or not lint-clean fails here,
with ruff's own lines saying where."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUFF = Path(sys.executable).parent / "ruff"  # the venv's, pinned in pyproject's test extra


def ruff(*args: str) -> subprocess.CompletedProcess:
    assert RUFF.is_file(), f"{RUFF} is missing: install the test extra (`./install.sh --test`)"
    return subprocess.run([str(RUFF), *args, str(ROOT)], capture_output=True, text=True, cwd=ROOT)


def test_ruff_lint_is_clean():
    result = ruff("check", "--no-cache", "--output-format", "concise")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean():
    result = ruff("format", "--check", "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr


MYPY = Path(sys.executable).parent / "mypy"  # the venv's, pinned in pyproject's test extra beside ruff


def test_mypy_finds_no_type_error_in_the_package_or_the_benchmarks():
    # pyproject's [tool.mypy] names what it checks (rdna1_kmgr/, bench/) and the error kinds each listed module has
    assert MYPY.is_file(), f"{MYPY} is missing: install the test extra (`./install.sh --test`)"
    result = subprocess.run(
        [str(MYPY), "--no-incremental", "--config-file", str(ROOT / "pyproject.toml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
