"""The README's test command collects every test file in the tree.

pytest skips folders whose names it takes for output (`build`, `dist`, `*.egg`, ... : `norecursedirs`), so a
stage folder with such a name once hid 98 tests from CI without a word. This runs the README's command in
collect-only mode and compares the files it collected with the files on disk.
"""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _collected_files() -> tuple[set[str], str]:
    # The README's command is the venv's `pytest -ra` in the checkout; the venv is the one running this test.
    pytest = Path(sys.executable).with_name("pytest")
    result = subprocess.run(
        [str(pytest), "-ra", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    files = {line.split("::", 1)[0] for line in result.stdout.splitlines() if "::" in line}
    return files, result.stdout + result.stderr


def test_every_test_file_in_the_tree_is_collected_by_the_readme_command():
    on_disk = {str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")}
    assert len(on_disk) > 40, "the test tree was not found where this file expects it"
    collected, output = _collected_files()
    missing = sorted(on_disk - collected)
    assert not missing, f"never collected by `pytest -ra`: {missing}\n{output[-3000:]}"
    assert "error" not in output.splitlines()[-1].lower(), output[-3000:]


def test_no_folder_under_tests_or_the_package_has_a_name_pytest_or_linters_skip():
    # pytest's norecursedirs default and ruff's default excludes share these names.
    skipped_names = {"build", "dist", "venv", ".venv", "node_modules", "_build", "buck-out", "site-packages"}
    folders = [p for root in ("tests", "rdna1_kmgr") for p in (REPO / root).rglob("*") if p.is_dir()]
    offending = sorted(str(p.relative_to(REPO)) for p in folders if p.name in skipped_names)
    assert not offending, f"folders tools skip by default: {offending}"
