"""Issue 40, H2 and M4 on the journal: a backup of root's 0600 file is no one else's to read, keeps its
original's mode and owner through rollback, and nothing the journal creates follows a planted link.

The state root here sits in a world-traversable folder under /var/tmp (sticky, root's), so that what keeps
the second user out is the journal's own modes, not pytest's 0700 temporary folder."""

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.install import journal as jr
from rdna1_kmgr.install.install_begin import InstallBegin

NOBODY = 65534
KREL = "6.1.0-56-amd64"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="gives files away and reads as another user: root only")


@pytest.fixture
def open_base(monkeypatch):
    base = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="rdna1-kmgr-test-"))
    base.chmod(0o755)  # anyone may walk in: only the tool's modes keep them out of its state
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(base / "state"))
    yield base
    shutil.rmtree(base)


def _read_as_nobody(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["cat", str(path)], user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True)


def test_a_backed_up_0600_file_is_not_readable_by_another_user_and_comes_back_as_it_was(open_base):
    system = open_base / "boot"
    system.mkdir(mode=0o755)
    initrd = system / f"initrd.img-{KREL}"
    initrd.write_bytes(b"an initramfs with a LUKS keyfile inside")
    initrd.chmod(0o600)
    theirs = system / "config"
    theirs.write_bytes(b"a file of another owner")
    os.chown(theirs, 1234, 1234)
    theirs.chmod(0o640)

    journal = jr.Journal(KREL)
    journal.begin(InstallBegin(kernel=KREL, root="/"))
    intent = journal.record_intent("initramfs", None, [initrd, theirs], [])
    backups = {Path(e.path).name: journal.backups / e.backup for e in intent.backups}

    # the attack: another local user reads the backup (it was 0644 in 0755 folders)
    backup = backups[initrd.name]
    assert backup.read_bytes() == b"an initramfs with a LUKS keyfile inside"
    refused = _read_as_nobody(backup)
    assert refused.returncode != 0 and b"Permission denied" in refused.stderr
    # each folder from the state root down is root's alone, every file of the journal 0600
    for folder in (open_base / "state", open_base / "state/journal", journal.dir, journal.backups):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE(journal.path.stat().st_mode) == 0o600
    # a backup keeps its original's owner and mode
    assert (backup.stat().st_uid, stat.S_IMODE(backup.stat().st_mode)) == (0, 0o600)
    other = backups[theirs.name].stat()
    assert (other.st_uid, other.st_gid, stat.S_IMODE(other.st_mode)) == (1234, 1234, 0o640)

    # the step rewrites both as 0644 root's; the rollback puts bytes, mode and owner back
    for path in (initrd, theirs):
        path.unlink()
        path.write_bytes(b"new")
        path.chmod(0o644)
    for entry in intent.backups:
        journal.restore(entry)
    assert initrd.read_bytes() == b"an initramfs with a LUKS keyfile inside"
    assert (initrd.stat().st_uid, stat.S_IMODE(initrd.stat().st_mode)) == (0, 0o600)
    assert _read_as_nobody(initrd).returncode != 0
    back = theirs.stat()
    assert (back.st_uid, back.st_gid, stat.S_IMODE(back.st_mode)) == (1234, 1234, 0o640)


def test_a_link_planted_at_the_lock_or_the_journal_is_not_written_through(open_base):
    victim = open_base / "shadow"
    victim.write_bytes(b"root's secret")
    victim.chmod(0o600)
    state = open_base / "state"
    state.mkdir(mode=0o700)
    (state / "lock").symlink_to(victim)
    with pytest.raises(HostError, match="cannot keep the journal"):
        with jr.locked("install"):
            pass
    (state / "lock").unlink()
    journal = jr.Journal(KREL)
    journal.dir.mkdir(parents=True)
    journal.path.symlink_to(victim)
    with pytest.raises(jr.JournalError, match="cannot read the journal .*symbolic links"):
        journal.begin(InstallBegin(kernel=KREL, root="/"))
    assert victim.read_bytes() == b"root's secret" and stat.S_IMODE(victim.stat().st_mode) == 0o600


def test_a_link_planted_at_a_backup_name_is_replaced_not_followed(open_base):
    victim = open_base / "shadow"
    victim.write_bytes(b"root's secret")
    victim.chmod(0o600)
    original = open_base / "modules.dep"
    original.write_bytes(b"kernel/drivers/gpu/drm/amd/amdgpu/amdgpu.ko:\n")
    journal = jr.Journal(KREL)
    journal.begin(InstallBegin(kernel=KREL, root="/"))
    journal.backups.mkdir(parents=True)
    (journal.backups / "002-0").symlink_to(victim)  # the name the next intent's first backup gets
    journal.record_intent("depmod", None, [original], [])
    assert victim.read_bytes() == b"root's secret" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert not (journal.backups / "002-0").is_symlink()
