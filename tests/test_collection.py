"""The README's test command collects every test file in the tree.

pytest skips folders whose names it takes for output (`build`, `dist`, `*.egg`, ... : `norecursedirs`), so a
stage folder with such a name once hid 98 tests from CI without a word. This runs the README's command in
collect-only mode and compares the files it collected with the files on disk.
"""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _collect() -> subprocess.CompletedProcess:
    # The README's command is the venv's `pytest -ra` in the checkout; the venv is the one running this test.
    pytest = Path(sys.executable).with_name("pytest")
    return subprocess.run(
        [str(pytest), "-ra", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _collected_ids() -> list[str]:
    """The node ids in the order the session runs them."""
    return [line for line in _collect().stdout.splitlines() if "::" in line]


def _collected_files() -> tuple[set[str], str]:
    result = _collect()
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


def test_the_debian13_tests_run_after_every_other_test():
    # tests/cache_warmer.py fills their caches while the others run: the story's file and test_secure_boot's
    # Debian 13 run are the tail of the session's order, in their own order.
    collected = _collected_ids()
    debian13 = [
        i
        for i, node in enumerate(collected)
        if node.startswith("tests/install/test_debian13_story.py::") or node.endswith("[debian13]")
    ]
    assert len(debian13) >= 10, collected[-20:]
    assert debian13 == list(range(len(collected) - len(debian13), len(collected))), collected[-20:]
    story = [collected[i] for i in debian13 if "test_debian13_story" in collected[i]]
    assert story[0].endswith("test_trixie_612_builds_natively_with_cwsr_size_and_passes_vm_test"), story
