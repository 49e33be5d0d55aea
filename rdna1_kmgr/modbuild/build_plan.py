"""What `rdna1-kmgr build --dry-run` would do: the build's stages planned (module_build.plan), the one result
the command renders and `--json` serialises (core/output.py), with the keys `build --dry-run --json` has
always had. Follow prints the plan's lines inside its own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rdna1_kmgr.host.system_identity import SystemIdentity
from rdna1_kmgr.modbuild.signing import KeyPair
from rdna1_kmgr.source.target_kernel import Kernel


@dataclass(frozen=True)
class RenderPlan:
    """The series the plan rendered for the source, checked to apply (serialised by its fields)."""

    kernel_version: str  # the Linux version of the driver source
    patches: int
    patchset_sha256: str
    devices: tuple[str, ...]  # the device ids the quirks apply to, 0x731F style
    quirks_on: tuple[str, ...]  # on by default
    quirks_off: tuple[str, ...]  # compiled in, off until switched on
    applies: bool  # with patch -p1 on a copy of the files it changes
    files: tuple[str, ...]  # the files the series changes
    package: str  # the DKMS package it goes into, name/version


@dataclass(frozen=True)
class BuildPlan:
    system: SystemIdentity  # the system planned for (a --sysroot's)
    plan: tuple[str, ...]  # the steps as lines, what `--dry-run` prints
    keys: KeyPair  # what the module would be signed with
    key_exists: bool  # False: the key would be made
    kernel: Kernel
    # where the source comes from, in source/'s words ({"given": ...}, {"package", "version", ...}); empty when
    # it is not known yet (no headers installed, no --source)
    origin: Mapping[str, Any]
    tree: Path | None  # the unpacked driver source (None: not known yet)
    render: RenderPlan | None  # None: no source to render
    devices: tuple[str, ...]  # the devices the build applies its quirks to, 0x731F style

    def __post_init__(self) -> None:
        object.__setattr__(self, "origin", MappingProxyType(dict(self.origin)))

    def to_json(self) -> dict[str, Any]:
        kernel = self.kernel
        return {
            "dry_run": True,
            "system": self.system.to_json(),
            "plan": list(self.plan),
            "signing": {**self.keys.to_json(), "exists": self.key_exists},
            "kernel": {
                "release": kernel.release,
                "package_version": kernel.package_version,
                "upstream": kernel.upstream,
            },
            "source": {**self.origin, "tree": str(self.tree) if self.tree else None},
            "render": self.render,
            "devices": list(self.devices),
        }
