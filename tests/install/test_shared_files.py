"""A removed kernel's install and the files every kernel's install shares: `follow removed` hands its backups to
the later install that wrote them again, or undoes what no later install relies on; then rollback leaves what
was there before every install."""

import json

import pytest
from install_checks import install_writing, journal_root  # noqa: F401 (fixtures)

from rdna1_kmgr.core.errors import KmgrError
from rdna1_kmgr.follow import kernel_removal
from rdna1_kmgr.install import journal as jr
from rdna1_kmgr.install import rollback, stock_loader
from rdna1_kmgr.install.journal_records import HandedOver, WasAbsent

OLDER, REMOVED, LATER = "6.12.117+deb13-amd64", "6.12.118+deb13-amd64", "7.3.4+deb13-amd64"
DISTRIBUTION_RULE = "# the distribution's own file at this path\n"


@pytest.mark.parametrize("before", [None, DISTRIBUTION_RULE])
def test_a_removed_kernels_backup_goes_to_the_later_install_and_rollback_returns_to_before_both(
    journal_root, monkeypatch, install_writing, before
):
    # the Debian 13 story: install for 6.12, follow installs 7.x, then apt purges 6.12
    rule = journal_root / stock_loader.RULE
    if before is not None:
        rule.parent.mkdir(parents=True, exist_ok=True)
        rule.write_text(before)
        rule.chmod(0o640)
    install_writing(REMOVED, "2026-11-26T20:00:00+0000", rule, "the 6.12 install's rule\n")
    install_writing(LATER, "2026-11-26T21:30:00+0000", rule, "follow's rule\n")
    plan = kernel_removal.plan(REMOVED)
    assert f"  hand the backup of {rule} to {LATER}'s later install, which wrote it again" in plan
    said = kernel_removal.forget(REMOVED)
    # what `follow removed` says it did, in the order it did it
    conf = journal_root / "etc/modprobe.d/rdna1-kmgr.conf"
    assert said[:2] == [
        f"handed the backup of {rule} to {LATER}'s later install",
        f"rewrote {conf} for the kernels still installed",
    ]
    assert len(said) == 3 and said[2].startswith(f"journal of {REMOVED} moved to ") and "/history/" in said[2]
    assert rule.read_text() == "follow's rule\n"  # the 7.x install relies on it: untouched
    assert jr.Journal.kernels() == [LATER]
    rollback.run(None)
    if before is None:
        assert not rule.exists()
    else:
        assert rule.read_text() == before and rule.stat().st_mode & 0o777 == 0o640
    assert jr.Journal.kernels() == []


def test_with_no_later_install_the_removed_kernels_change_to_a_shared_file_is_undone(
    journal_root, monkeypatch, install_writing
):
    rule = journal_root / stock_loader.RULE
    rule.parent.mkdir(parents=True, exist_ok=True)
    rule.write_text(DISTRIBUTION_RULE)
    install_writing(REMOVED, "2026-11-26T20:00:00+0000", rule, "the 6.12 install's rule\n")
    assert "  undo stock-loader: no later install wrote its files again" in kernel_removal.plan(REMOVED)
    kernel_removal.forget(REMOVED)
    assert rule.read_text() == DISTRIBUTION_RULE
    assert rollback.run(None).nothing_installed


def test_an_earlier_install_gets_its_own_version_back_when_a_later_kernel_is_removed(
    journal_root, monkeypatch, install_writing
):
    rule = journal_root / stock_loader.RULE
    install_writing(OLDER, "2026-11-26T19:00:00+0000", rule, "the older install's rule\n")
    install_writing(REMOVED, "2026-11-26T20:00:00+0000", rule, "the 6.12.118 install's rule\n")
    kernel_removal.forget(REMOVED)
    assert rule.read_text() == "the older install's rule\n"
    rollback.run(None)
    assert not rule.exists()


def test_a_handed_over_record_naming_a_file_its_step_never_backed_up_is_refused(
    journal_root, monkeypatch, install_writing
):
    rule = journal_root / stock_loader.RULE
    install_writing(REMOVED, "2026-11-26T20:00:00+0000", rule, "the 6.12 install's rule\n")
    install_writing(LATER, "2026-11-26T21:30:00+0000", rule, "follow's rule\n")
    later = jr.Journal(LATER)
    (step,) = later.state().steps
    later.append(HandedOver(step.seq, WasAbsent("/etc/shadow")))
    with pytest.raises(KmgrError) as refused:
        rollback.run(LATER)
    assert "hands over a backup of a file step" in refused.value.what
    assert rule.read_text() == "follow's rule\n"  # nothing undone
    records = [json.loads(line) for line in later.path.read_text().splitlines()]
    assert records[-1]["kind"] == "handed-over"  # the journal kept as it was


def test_a_handed_over_record_naming_a_step_after_it_is_refused(journal_root, monkeypatch, install_writing):
    # a hand-over is written when a later install's step is already on disk: one naming a step that comes after it
    # was not written by follow removed
    rule = journal_root / stock_loader.RULE
    install_writing(LATER, "2026-11-26T21:30:00+0000", rule, "follow's rule\n")
    later = jr.Journal(LATER)
    seq = len(later.records()) + 1
    later.append(HandedOver(seq + 1, WasAbsent(str(rule))))
    later.record_intent("stock-loader", None, [rule], [])
    with pytest.raises(KmgrError) as refused:
        rollback.run(LATER)
    assert f"record {seq} (handed-over) does not name an earlier step of this journal" in refused.value.what
    assert rule.read_text() == "follow's rule\n"


def test_with_two_later_installs_the_removed_kernels_backup_goes_to_the_next_one(
    journal_root, monkeypatch, install_writing
):
    # each install backs up what the one before it wrote: the removed one's backup (what was there before any) must
    # replace the backup the next install took of the removed one's file, not the newest install's
    rule = journal_root / stock_loader.RULE
    rule.parent.mkdir(parents=True, exist_ok=True)
    rule.write_text(DISTRIBUTION_RULE)
    install_writing(REMOVED, "2026-11-26T20:00:00+0000", rule, "the 6.12.118 install's rule\n")
    install_writing(LATER, "2026-11-26T21:30:00+0000", rule, "follow's 7.3 rule\n")
    newest = "7.4.1+deb13-amd64"
    install_writing(newest, "2026-11-27T09:00:00+0000", rule, "follow's 7.4 rule\n")
    assert f"  hand the backup of {rule} to {LATER}'s later install, which wrote it again" in kernel_removal.plan(
        REMOVED
    )
    kernel_removal.forget(REMOVED)
    assert rule.read_text() == "follow's 7.4 rule\n"
    rollback.run(newest)
    assert rule.read_text() == "follow's 7.3 rule\n"  # the 7.4 install's undo: as the 7.3 install left it
    rollback.run(LATER)
    assert rule.read_text() == DISTRIBUTION_RULE  # as before every install
