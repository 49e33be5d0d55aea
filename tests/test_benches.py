"""Every benchmark in bench/ still starts: it imports what it measures and parses its arguments. mypy (tests/
test_lint.py) checks its calls into the package; a full run of each is the bench's own job (bench/RESULTS.md)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("bench_*.py")))
def test_the_bench_starts_and_says_how_to_use_it(script):
    done = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.lower().startswith("usage:"), done.stdout
