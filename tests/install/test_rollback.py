"""rollback over several journals: the order in which installs are undone."""

import pytest
from install_checks import install_writing, journal_root  # noqa: F401 (fixtures)

from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.install import journal as jr
from rdna1_kmgr.install import rollback, stock_loader
from rdna1_kmgr.install.install_begin import InstallBegin
from rdna1_kmgr.install.journal_records import Commit, Done
from rdna1_kmgr.install.undo import RewriteModprobeConf


@pytest.mark.parametrize(
    "first, second", [("6.12.118+deb13-amd64", "7.3.4+deb13-amd64"), ("7.3.4-amd64", "6.12.9-amd64")]
)
def test_rollback_all_undoes_the_newest_install_first_and_leaves_what_was_there_before_both(
    journal_root, monkeypatch, install_writing, first, second
):
    # the Debian 13 story: install for trixie's 6.12, then follow installs 7.x; both journal the shared files
    # (the boot guard's, the stock loader's), the second backing up the first's. Undone oldest first, the
    # second's backup would put the first's file back after the first's undo had removed it.
    guard = journal_root / stock_loader.RULE
    install_writing(first, "2026-11-26T20:00:00+0000", guard, "guard as the first install wrote it\n")
    install_writing(second, "2026-11-26T21:30:00+0000", guard, "guard as follow rewrote it\n")
    monkeypatch.setattr(jr, "_now", lambda: "2026-11-26T22:00:00+0000")
    result = rollback.run(None)
    assert result.kernels == [second, first]
    assert not guard.exists()  # as before the first install
    assert jr.Journal.kernels() == []


def test_rollback_of_the_earlier_kernel_alone_is_refused_while_a_later_install_relies_on_its_files(
    journal_root, monkeypatch, install_writing
):
    guard = journal_root / stock_loader.RULE
    install_writing("6.12.118+deb13-amd64", "2026-11-26T20:00:00+0000", guard, "the first install's rule\n")
    install_writing("7.3.4+deb13-amd64", "2026-11-26T21:30:00+0000", guard, "follow's rule\n")
    with pytest.raises(UsageError) as refused:
        rollback.run("6.12.118+deb13-amd64")
    assert refused.value.what.startswith("7.3.4+deb13-amd64's later install rewrote ")
    assert "rollback --kernel 7.3.4+deb13-amd64" in refused.value.hint and "--all" in refused.value.hint
    assert guard.read_text() == "follow's rule\n"  # nothing changed
    assert sorted(jr.Journal.kernels()) == ["6.12.118+deb13-amd64", "7.3.4+deb13-amd64"]
    # the later one alone is fine, and then the earlier one
    rollback.run("7.3.4+deb13-amd64")
    assert guard.read_text() == "the first install's rule\n"
    rollback.run("6.12.118+deb13-amd64")
    assert not guard.exists()


def test_rollback_of_the_earlier_kernel_alone_goes_on_when_they_share_only_the_modprobe_file(
    journal_root, monkeypatch, install_writing
):
    # /etc/modprobe.d/rdna1-kmgr.conf serves every kernel too, but rollback rewrites it for the kernels left
    conf = journal_root / "etc/modprobe.d/rdna1-kmgr.conf"
    for kernel, at in (
        ("6.12.118+deb13-amd64", "2026-11-26T20:00:00+0000"),
        ("7.3.4+deb13-amd64", "2026-11-26T21:30:00+0000"),
    ):
        monkeypatch.setattr(jr, "_now", lambda at=at: at)
        journal = jr.Journal(kernel)
        journal.begin(InstallBegin(kernel=kernel, root=str(journal_root)))
        journal.record_intent("modprobe-conf", None, [conf], [], undo=RewriteModprobeConf(conf, kernel))
        conf.write_text(f"# {kernel}\n")
        journal.append(Done("modprobe-conf"))
        journal.append(Commit())
    rollback.run("6.12.118+deb13-amd64")
    assert jr.Journal.kernels() == ["7.3.4+deb13-amd64"]


def test_rollback_removes_the_temporaries_a_cut_short_depmod_or_write_left_beside_an_index(tmp_path):
    # kmod's depmod writes modules.alias.bin as modules.alias.bin.PID.USEC.SEC and renames it: the power-cut
    # test found this empty one in /lib/modules/KREL after a cut during depmod
    index = tmp_path / "modules.alias.bin"
    index.write_bytes(b"index")
    left = [
        tmp_path / "modules.alias.bin.671.4857.1795930668",
        tmp_path / ".modules.alias.bin.rdna1-kmgr-0123456789abcdef",
    ]
    kept = [
        tmp_path / "modules.alias.bin.671.4857",  # two numbers: not depmod's name
        tmp_path / "modules.alias.bin.671.x.1795930668",
        tmp_path / "modules.alias.bin.bak",
        tmp_path / "rdna1-kmgr.conf.671.4857.1795930668",  # beside a file depmod does not write
    ]
    for path in left + kept:
        path.write_bytes(b"")
    (tmp_path / "modules.alias.bin.1.2.3").symlink_to("/etc/passwd")  # a link is never taken for one
    assert sorted(rollback.remove_leftovers(index)) == sorted(left)
    assert rollback.remove_leftovers(tmp_path / "rdna1-kmgr.conf") == []
    assert index.read_bytes() == b"index" and all(p.exists() for p in kept) and not any(p.exists() for p in left)
    assert (tmp_path / "modules.alias.bin.1.2.3").is_symlink()
