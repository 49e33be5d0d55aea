"""ruff, as pyproject.toml configures it (lint, and the formatter at line length 120), over the whole checkout.
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
