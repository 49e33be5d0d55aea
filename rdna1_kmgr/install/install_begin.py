"""What the `begin` record of a kernel install's journal says, typed: what was installed, from where, through
which gate. Its JSON is spelled here only (`to_json`, read back by the strict `from_json`); the record around it
(operation, pid, tool version) is journal_records.Begin's.

Written by module_install, read (journal.State.install) by rollback (the package to remove), follow (the build
to carry to a new kernel), follow's kernel removal, modprobe_conf (the parameters of every install in place),
status and install itself (is this very module in place?).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from rdna1_kmgr.install.journal_json import Json, JsonObject, NotARecord, fields, obj, or_none, text, text_map
from rdna1_kmgr.modbuild import dkms_package as dkms

_FIELDS = ("kernel", "module", "module_sha256", "vm_check", "parameters", "certificate", "root", "boot_guard")


@dataclass(frozen=True)
class InstallBegin:
    OPERATION: ClassVar[str] = "install"

    kernel: str
    root: str  # the target root the install wrote under (journal_checks: it must be this run's)
    package: dkms.Package | None = None  # None: begun without one (no DKMS package for rollback to remove)
    module: str = ""
    module_sha256: str = ""
    # the gate's words on the VM verdict (install_gate.Gate.vm_check), kept as written: shown, never acted on
    vm_check: Json = field(default_factory=dict)
    parameters: dict[str, str] | None = None  # rdna1_quirks and the like, as modprobe.d has them (None: unsaid)
    certificate: str = ""
    boot_guard: JsonObject | None = None  # the guard's settings (None: no guard; GRUB then owns the mask)
    trees: dkms.Trees | None = None  # None: a journal from before the trees were recorded (the defaults)

    @property
    def dkms_trees(self) -> dkms.Trees:
        return self.trees or dkms.Trees()

    @property
    def verdict(self) -> str | None:
        """The VM verdict the gate saw (None: installed without one)."""
        said = self.vm_check.get("verdict") if isinstance(self.vm_check, Mapping) else None
        return said if isinstance(said, str) else None

    def to_json(self) -> JsonObject:
        """The record's fields beside journal_records.Begin's, as install writes them."""
        named: JsonObject = {"package": self.package.name, "version": self.package.version} if self.package else {}
        where: JsonObject = {"trees": self.trees.to_json()} if self.trees else {}
        return {
            "kernel": self.kernel,
            **named,
            "module": self.module,
            "module_sha256": self.module_sha256,
            "vm_check": self.vm_check,
            "parameters": self.parameters,
            "certificate": self.certificate,
            "root": self.root,
            "boot_guard": self.boot_guard,
            **where,
        }

    @classmethod
    def from_json(cls, value: Json) -> InstallBegin:
        """What `to_json` writes, and nothing else (NotARecord naming the field that is not)."""
        record = fields(value, _FIELDS, ("package", "version", "trees"))
        if ("package" in record) != ("version" in record):
            raise NotARecord("names a package without its version, or a version without its package")
        package = None
        if "package" in record:
            package = dkms.Package(text(record["package"], "package"), text(record["version"], "version"))
        return cls(
            kernel=text(record["kernel"], "kernel"),
            root=text(record["root"], "root"),
            package=package,
            module=text(record["module"], "module"),
            module_sha256=text(record["module_sha256"], "module_sha256"),
            vm_check=record["vm_check"],
            parameters=or_none(record["parameters"], text_map, "parameters"),
            certificate=text(record["certificate"], "certificate"),
            boot_guard=or_none(record["boot_guard"], obj, "boot guard"),
            trees=_trees(record["trees"]) if "trees" in record else None,
        )


def _trees(value: Json) -> dkms.Trees:
    where = fields(value, ("source", "dkms"))
    return dkms.Trees(source=Path(text(where["source"], "source tree")), dkms=Path(text(where["dkms"], "DKMS tree")))
