"""core/files.py: the records the tool writes keep their bytes."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rdna1_kmgr.core import files
from rdna1_kmgr.core.files import write_json


def test_write_json_lays_a_record_out_as_its_readers_expect(tmp_path):
    path = tmp_path / "record.json"
    write_json(path, {"state": "done", "kernel": "6.1.0-13-amd64", "cells": [1]}, indent=2, sort_keys=True)
    assert path.read_bytes() == b'{\n  "cells": [\n    1\n  ],\n  "kernel": "6.1.0-13-amd64",\n  "state": "done"\n}\n'
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]  # no temporary left beside it


def test_write_json_without_layout_is_one_line_in_the_callers_key_order(tmp_path):
    path = tmp_path / "current.json"
    write_json(path, {"folder": "/var/lib/x", "a": None})
    assert path.read_text() == '{"folder": "/var/lib/x", "a": null}\n'


def test_a_link_planted_at_the_old_predictable_temporary_name_is_not_written_through(tmp_path):
    """M4 of issue 40: write_atomic wrote `.<name>.rdna1-kmgr-<pid>` with O_TRUNC, following a link there: a
    planted link made root overwrite a 0600 file and make it 0644."""
    import os
    import stat

    from rdna1_kmgr.core.files import create_new, write_atomic

    victim = tmp_path / "shadow"
    victim.write_bytes(b"root's secret")
    victim.chmod(0o600)
    target = tmp_path / "record.json"
    planted = tmp_path / f".{target.name}.rdna1-kmgr-{os.getpid()}"
    planted.symlink_to(victim)
    write_atomic(target, b"{}\n")
    assert target.read_bytes() == b"{}\n" and not target.is_symlink()
    assert victim.read_bytes() == b"root's secret" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    # a new file is never made through a link, even a dangling one
    (tmp_path / "dangling").symlink_to(tmp_path / "made-by-root")
    try:
        create_new(tmp_path / "dangling")
        raise AssertionError("create_new followed a link")
    except FileExistsError:
        pass
    assert not (tmp_path / "made-by-root").exists()


def test_the_command_log_is_0600_and_not_written_through_a_link(tmp_path, monkeypatch):
    import logging
    import stat

    from rdna1_kmgr.core import command_log

    logs = tmp_path / "log"
    logs.mkdir(mode=0o700)
    victim = tmp_path / "shadow"
    victim.write_bytes(b"root's secret")
    (logs / "commands.log").symlink_to(victim)
    monkeypatch.setenv("RDNA1_KMGR_LOG", str(logs))
    logger = logging.getLogger("rdna1_kmgr")
    monkeypatch.setattr(logger, "handlers", [])
    command_log.start()
    assert logger.handlers == [] and victim.read_bytes() == b"root's secret"
    (logs / "commands.log").unlink()
    command_log.start()
    logger.info("a line")
    assert stat.S_IMODE((logs / "commands.log").stat().st_mode) == 0o600
    assert "a line" in (logs / "commands.log").read_text()
    for handler in logger.handlers:
        handler.stream.close()


def test_leftover_temporaries_are_write_atomics_own_names_only(tmp_path):
    """A write cut short between the temporary file's fsync and its rename leaves `.<name>.rdna1-kmgr-<16 hex>`
    (the name write_atomic documents); nothing else beside the file is taken for one."""
    target = tmp_path / "rdna1-kmgr.conf"
    left = tmp_path / ".rdna1-kmgr.conf.rdna1-kmgr-0123456789abcdef"
    left.write_text("options amdgpu rdna1_quirks=0x0\n")
    decoys = [
        tmp_path / ".rdna1-kmgr.conf.rdna1-kmgr-0123456789ABCDEF",  # not lowercase hex
        tmp_path / ".rdna1-kmgr.conf.rdna1-kmgr-0123",  # too short
        tmp_path / ".other.conf.rdna1-kmgr-0123456789abcdef",  # another file's
    ]
    for decoy in decoys:
        decoy.write_text("")
    (tmp_path / ".rdna1-kmgr.conf.rdna1-kmgr-fedcba9876543210").symlink_to("/etc/passwd")  # a link: not a file
    assert files.leftover_temporaries(target) == [left]
    files.write_atomic(target, b"new\n")
    assert files.leftover_temporaries(target) == [left], "a finished write leaves no temporary of its own"
    assert files.leftover_temporaries(tmp_path / "missing-folder" / "x.conf") == []


def test_checkpoint_journal_is_ext4s_checkpoint_call_and_false_where_there_is_none(tmp_path):
    # _IOW('f', 43, __u32) by asm-generic/ioctl.h's layout: direction write (1) at bit 30, the argument's size (4)
    # at bit 16, the type 'f' at bit 8, the number 43
    assert files.EXT4_IOC_CHECKPOINT == (1 << 30) | (4 << 16) | (ord("f") << 8) | 43
    target = tmp_path / "grubenv"
    target.write_bytes(b"# GRUB Environment Block\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert files.checkpoint_journal(link) is False  # never through a link
    assert files.checkpoint_journal(tmp_path / "missing") is False
    if Path("/dev/shm").is_dir():
        assert files.checkpoint_journal(Path("/dev/shm")) is False  # tmpfs has no journal to write out


@pytest.mark.system
def test_checkpoint_journal_puts_a_renamed_file_where_a_reader_without_the_journal_finds_it(tmp_path):
    """GRUB's view, as debugfs gives it: it reads the disk image as it is, replaying nothing. A file replaced by a
    rename (grub-editenv's and update-grub's way) and fsynced is in ext4's journal; debugfs still finds the old
    one until the checkpoint writes the journal out."""
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4") or not shutil.which("debugfs"):
        pytest.skip("needs root (a loop mount), mkfs.ext4 and debugfs")
    image, mount = tmp_path / "boot.img", tmp_path / "boot"
    subprocess.run(["truncate", "-s", "64M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    mount.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    try:
        env = mount / "grubenv"
        files.write_atomic(env, b"old\n")
        assert files.checkpoint_journal(mount) is True
        assert _as_grub_reads(image, "grubenv") == "old\n"
        files.write_atomic(env, b"new\n")  # fsynced, renamed, its folder fsynced: durable for the kernel
        assert _as_grub_reads(image, "grubenv") == "old\n", "the rename is in the journal only"
        assert files.checkpoint_journal(env) is True
        assert _as_grub_reads(image, "grubenv") == "new\n"
    finally:
        subprocess.run(["umount", str(mount)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    try:
        assert files.checkpoint_journal(mount) is False  # no journal: nothing to write out (ENODEV)
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def _as_grub_reads(image: Path, name: str) -> str:
    return subprocess.run(["debugfs", "-R", f"cat /{name}", str(image)], capture_output=True, text=True).stdout
