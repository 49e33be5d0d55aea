"""`follow`'s modes as subcommands (`follow pending`, `follow defer KREL`, `follow removed KREL`), the only
spellings: the flags of before (`--pending`, `--kernel KREL --defer`, `--kernel KREL --removed`) are gone
(CHANGELOG.md), and the hooks install.sh places use the subcommands (hooks/)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rdna1_kmgr.cli import main
from rdna1_kmgr.follow import kernel_follow
from rdna1_kmgr.follow.follow_record import FollowRecord

KREL = "6.1.0-56-amd64"


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))
    return tmp_path / "state"


def cli(*args: str):
    return CliRunner().invoke(main, ["follow", *args])


@pytest.mark.parametrize(
    "mode, old_spelling",
    [
        (["pending"], ["--pending"]),
        (["defer", KREL], ["--kernel", KREL, "--defer"]),
        (["removed", KREL], ["--kernel", KREL, "--removed"]),
    ],
)
def test_each_mode_plans_and_the_old_flags_are_refused(state, mode, old_spelling):
    new, old = cli(*mode, "--dry-run"), cli(*old_spelling, "--dry-run")
    assert new.exit_code == 0 and new.output.strip(), new.output
    assert old.exit_code == 2 and f"No such option '{old_spelling[-1]}'" in old.output, old.output
    assert not state.exists()  # a dry run writes nothing, a refused command neither


def test_the_hooks_call_the_subcommands():
    hooks = Path(__file__).resolve().parents[2] / "hooks"
    text = "".join(p.read_text() for p in hooks.iterdir() if p.is_file() and p.suffix != ".py")
    assert "follow pending --hook" in text and "follow defer " in text and "follow removed " in text
    assert not any(flag in text for flag in ("--pending", "--defer", "--removed"))


def test_defer_notes_the_kernel_as_pending(state, monkeypatch):
    # Opted in: some kernel has a finished install (the real journal's story is test_hooks.py's).
    monkeypatch.setattr(kernel_follow, "finished_installs", lambda: {"6.12.95+deb12-amd64": {}})
    for args, krel in ((["defer", KREL], KREL), (["defer", "6.1.0-55-amd64"], "6.1.0-55-amd64")):
        result = cli(*args)
        assert result.exit_code == 0 and f"rdna1-kmgr: {krel}: noted" in result.output, result.output
        assert (state / "follow" / "pending" / krel).exists()


def test_nothing_pending_says_so(state):
    result = cli("pending", "--dry-run")
    assert result.exit_code == 0 and result.output == "no kernel is pending: nothing to follow\n"


def test_misused_modes_are_one_line(state):
    result = cli("--hook", "pending")
    assert result.exit_code == 2 and "options before `follow pending` are not read" in result.stderr
    result = cli()
    assert result.exit_code == 2 and "`follow pending`, `follow defer KREL`, `follow removed KREL`" in result.stderr
    result = cli("defer", "../etc")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert not state.exists()


def test_pending_kernels_go_on_past_a_failure_and_exit_with_its_code(state, monkeypatch):
    """`follow pending` (apt's hook, the boot unit): one kernel's failure is its record's line, the next kernel
    still follows, and the run exits with the first failure's code (BUILD, 5 in docs/reference.md); under
    --hook, 0."""
    from rdna1_kmgr.core.errors import BuildError
    from rdna1_kmgr.follow import follow_record

    bad, good = "6.1.0-55-amd64", KREL
    for kernel in (bad, good):
        follow_record.write(FollowRecord(kernel, "pending"))

    def follow(kernel, source=None):
        if kernel == bad:
            follow_record.write(FollowRecord(kernel, "stock", reason="the build failed", stage="build", log="x.log"))
            raise kernel_follow.StageFailed("build", BuildError("the build failed", "see x.log"))
        return follow_record.write(
            FollowRecord(kernel, "patched", package="rdna1-amdgpu", package_version="1", verdict="pass")
        )

    monkeypatch.setattr(kernel_follow, "follow", follow)
    result = cli("pending")
    assert result.exit_code == 5, result.output
    assert result.output.splitlines() == [
        f"rdna1-kmgr: {bad}: keeps the stock amdgpu: the build failed (at build; log x.log)",
        f"rdna1-kmgr: {good}: " + follow_record.describe(follow_record.read(good)),
    ]
    for kernel in (bad, good):
        follow_record.write(FollowRecord(kernel, "pending"))
    assert cli("pending", "--hook").exit_code == 0
    for kernel in (bad, good):
        follow_record.write(FollowRecord(kernel, "pending"))
    result = cli("pending", "--json")
    # --json lists each kernel's record as its file has it
    assert json.loads(result.stdout)["kernels"] == [
        json.loads((state / "follow" / f"{kernel}.json").read_text()) for kernel in (bad, good)
    ]
