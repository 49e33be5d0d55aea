"""The `begin` record of a kernel install's journal, typed: what was installed, from where, through which gate.

Written by module_install (`fields`), read back (`read`) by rollback (the package to remove), follow (the build
to carry to a new kernel), follow's kernel removal, modprobe_conf (the parameters of every install in place) and
install itself (is this very module in place?). A record of another journal (the profile's, the experiment's)
is not one: `read` gives None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rdna1_kmgr.modbuild import dkms_package as dkms


@dataclass(frozen=True)
class InstallBegin:
    kernel: str
    package: dkms.Package | None  # None: begun without one (no DKMS package for rollback to remove)
    module_sha256: str = ""
    parameters: dict[str, str] | None = None  # rdna1_quirks and the like, as modprobe.d has them (None: unsaid)
    boot_guard: dict[str, Any] | None = None  # the guard's settings (None: no guard; GRUB then owns the mask)
    trees: dkms.Trees | None = None  # None: a journal from before the trees were recorded (the defaults)
    time: str = ""  # when it began (journal.py's format)
    module: str = ""
    certificate: str = ""
    root: str = ""
    vm_check: dict[str, Any] = field(default_factory=dict)

    @property
    def dkms_trees(self) -> dkms.Trees:
        return self.trees or dkms.Trees()

    def fields(self) -> dict[str, Any]:
        """The record's fields as journal.begin("install", ...) writes them."""
        assert self.package is not None, "install begins with the package it installs"
        trees = self.dkms_trees
        return {
            "kernel": self.kernel,
            "package": self.package.name,
            "version": self.package.version,
            "module": self.module,
            "module_sha256": self.module_sha256,
            "vm_check": self.vm_check,
            "parameters": self.parameters,
            "certificate": self.certificate,
            "root": self.root,
            "boot_guard": self.boot_guard,
            "trees": trees.to_json(),
        }


def read(record: dict[str, Any] | None) -> InstallBegin | None:
    """The install a `begin` record describes (None: not an install's). Its values were checked against what
    install writes before anything acts on them (journal_checks)."""
    if not record or record.get("operation") != "install":
        return None
    named = record.get("package") and record.get("version")
    where = record.get("trees")
    trees = (
        dkms.Trees(source=Path(where.get("source", "/usr/src")), dkms=Path(where.get("dkms", "/var/lib/dkms")))
        if isinstance(where, dict)
        else None
    )
    return InstallBegin(
        kernel=record.get("kernel", ""),
        package=dkms.Package(record["package"], record["version"]) if named else None,
        module_sha256=record.get("module_sha256", ""),
        parameters=record.get("parameters"),
        boot_guard=record.get("boot_guard"),
        trees=trees,
        time=record.get("time", ""),
        module=record.get("module", ""),
        certificate=record.get("certificate", ""),
        root=record.get("root", ""),
        vm_check=record.get("vm_check") or {},
    )
