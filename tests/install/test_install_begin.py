"""An install's `begin` record, typed (install/install_begin.py), against the record as today's release writes it
(module_install's journal.begin("install", ...): the fields written out by hand here)."""

from pathlib import Path

from rdna1_kmgr.install import install_begin
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
    begun = install_begin.read(WRITTEN)
    assert begun is not None
    assert begun.package == Package("rdna1-amdgpu", "6.12.95+p0123abcd")
    assert begun.trees == Trees(Path("/usr/src"), Path("/var/lib/dkms"))
    assert begun.parameters == {"rdna1_quirks": "0x30"} and begun.boot_guard == {"mask": "0x30", "confirm_after": 120}
    assert begun.vm_check["verdict"] == "pass" and begun.time == "2026-11-20T10:00:00+0000"
    journal_keys = ("seq", "kind", "time", "operation", "pid", "tool_version")
    assert begun.fields() == {k: v for k, v in WRITTEN.items() if k not in journal_keys}


def test_a_journal_from_before_the_trees_were_recorded_gets_dkms_defaults():
    begun = install_begin.read({k: v for k, v in WRITTEN.items() if k != "trees"})
    assert begun is not None and begun.trees is None
    assert begun.dkms_trees == Trees(Path("/usr/src"), Path("/var/lib/dkms"))


def test_other_journals_begins_are_no_install():
    assert install_begin.read({"kind": "begin", "operation": "profile-install", "profile": "find-fast"}) is None
    assert install_begin.read(None) is None
