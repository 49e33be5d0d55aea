"""An install's `begin` record, typed (install/install_begin.py), against the record as today's release writes it
(module_install's journal.begin(InstallBegin(...)): the fields written out by hand here)."""

from pathlib import Path

import pytest

from rdna1_kmgr.install.install_begin import InstallBegin
from rdna1_kmgr.install.journal_json import NotARecord
from rdna1_kmgr.install.journal_records import Begin, Entry, ProfileBegin
from rdna1_kmgr.modbuild.dkms_package import Package, Trees

WRITTEN = {
    "seq": 1,
    "kind": "begin",
    "time": "2026-11-20T10:00:00+0000",
    "operation": "install",
    "pid": 4242,
    "tool_version": "0.1.0",
    "kernel": "6.12.95+deb12-amd64",
    "package": "rdna1-amdgpu",
    "version": "6.12.95+p0123abcd",
    "module": "/var/lib/dkms/rdna1-amdgpu/6.12.95+p0123abcd/6.12.95+deb12-amd64/x86_64/module/amdgpu.ko.xz",
    "module_sha256": "5" * 64,
    "vm_check": {"verdict": "pass", "mode": "emulated", "record": "/var/lib/rdna1-kmgr/verdicts/x.json"},
    "parameters": {"rdna1_quirks": "0x30"},
    "certificate": "/var/lib/dkms/mok.pub",
    "root": "/",
    "boot_guard": {"mask": "0x30", "confirm_after": 120},
    "trees": {"source": "/usr/src", "dkms": "/var/lib/dkms"},
}


def test_an_install_begin_reads_back_every_field_and_writes_the_same():
    entry = Entry.from_json(WRITTEN)
    assert isinstance(entry.record, Begin) and entry.record.pid == 4242 and entry.record.tool_version == "0.1.0"
    begun = entry.record.begun
    assert isinstance(begun, InstallBegin)
    assert begun.package == Package("rdna1-amdgpu", "6.12.95+p0123abcd")
    assert begun.trees == Trees(Path("/usr/src"), Path("/var/lib/dkms"))
    assert begun.parameters == {"rdna1_quirks": "0x30"} and begun.boot_guard == {"mask": "0x30", "confirm_after": 120}
    assert begun.verdict == "pass" and entry.time == "2026-11-20T10:00:00+0000"
    assert entry.to_json() == WRITTEN


def test_a_journal_from_before_the_trees_were_recorded_gets_dkms_defaults():
    written = {k: v for k, v in WRITTEN.items() if k != "trees"}
    entry = Entry.from_json(written)
    begun = entry.record.begun
    assert begun.trees is None
    assert begun.dkms_trees == Trees(Path("/usr/src"), Path("/var/lib/dkms"))
    assert entry.to_json() == written  # and written back without them


def test_other_journals_begins_are_no_install():
    written = {"seq": 1, "kind": "begin", "time": "2026-11-20T10:00:00+0000", "operation": "profile-install"}
    written |= {"pid": 4242, "tool_version": "0.1.0", "profile": "find-fast", "root": "/"}
    assert Entry.from_json(written).record.begun == ProfileBegin("find-fast", "/")


@pytest.mark.parametrize(
    "change, why",
    [
        ({"version": None}, "version None, which is no text"),
        ({"shell": "rm -rf /"}, "where rdna1-kmgr writes"),
        ({"parameters": {"rdna1_quirks": 48}}, "parameters 48, which is no text"),
        ({"trees": {"source": "/usr/src"}}, "has the fields ['source'], where rdna1-kmgr writes ['dkms', 'source']"),
        ({"operation": "uninstall"}, "begins 'uninstall', which rdna1-kmgr never begins"),
    ],
)
def test_an_install_begin_no_release_writes_is_refused_naming_the_field(change, why):
    with pytest.raises(NotARecord) as refused:
        Entry.from_json({**WRITTEN, **change})
    assert why in str(refused.value)


def test_a_package_without_its_version_is_refused():
    with pytest.raises(NotARecord, match="a package without its version"):
        Entry.from_json({k: v for k, v in WRITTEN.items() if k != "version"})
