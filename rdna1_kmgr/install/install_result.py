"""What `rdna1-kmgr install` did, or would do: the one result the command renders and `--json` serialises.

Three shapes, with the keys `install --json` has always had: a plan (`--dry-run`), an install done (the plan's
keys and what was verified, the journal and the next boot's lines), and a module that was installed already (only
verified again).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Verified:
    """What the installed module was checked against: the file the module index resolves to, its sha256, and
    the initramfs with the amdgpu its own index gives (None: the image carries none)."""

    module: str
    sha256: str
    initramfs: str
    initramfs_module: str | None

    def to_json(self) -> dict[str, str | None]:
        return asdict(self)


@dataclass(frozen=True)
class InstallResult:
    kernel: str
    package: str  # the DKMS package name
    package_version: str
    dry_run: bool
    already_installed: bool = False  # this very module (and parameters) was in place: verified, nothing done
    verified: Verified | None = None  # None: a plan
    module_sha256: str = ""
    vm_check: Mapping[str, Any] = field(default_factory=dict)  # the gate's words on the VM verdict
    parameters: Mapping[str, str] = field(default_factory=dict)  # what modprobe.d or the boot guard gives amdgpu
    boot_guard: Mapping[str, Any] = field(default_factory=dict)  # its settings, or {"off": why there is none}
    plan: tuple[str, ...] = ()  # the lines `--dry-run` prints
    journal: str | None = None  # the journal of the install done
    next_boot: tuple[str, ...] = ()  # what the owner's next boot of the kernel does, and the way back

    def __post_init__(self) -> None:
        for name in ("vm_check", "parameters", "boot_guard"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def to_json(self) -> dict[str, Any]:
        named = {"kernel": self.kernel, "package": self.package, "package_version": self.package_version}
        if self.already_installed:
            assert self.verified is not None
            return {**named, "already_installed": True, "dry_run": self.dry_run, **self.verified.to_json()}
        out: dict[str, Any] = {
            **named,
            "module_sha256": self.module_sha256,
            "vm_check": dict(self.vm_check),
            "parameters": dict(self.parameters),
            "boot_guard": dict(self.boot_guard),
            "plan": list(self.plan),
            "dry_run": self.dry_run,
        }
        if not self.dry_run:
            assert self.verified is not None
            out |= {"verified": self.verified.to_json(), "journal": self.journal, "next_boot": list(self.next_boot)}
        return out
