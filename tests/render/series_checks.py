"""Rendering a series and checking what it gave: the CLI in-process, the series applied with the real `patch`, a
function's body out of a source file, and a refusal that left nothing written.

A helper module, not a test module: test_patch_series and test_patch_series_cwsr_size import from it.
"""

import subprocess

from click.testing import CliRunner

from rdna1_kmgr.cli import main


def run_cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def apply_series(out, tree):
    for name in (out / "series").read_text().split():
        done = subprocess.run(
            ["patch", "-p1", "--batch", "-d", str(tree), "-i", str(out / name)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "fuzz" not in done.stdout, done.stdout


def function_body(text, name):
    start = text.index(f"{name}(")
    return text[start : text.index("\n}\n", start) + 3]


def assert_refused(result, out, *words):
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0]
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "staging left behind"
