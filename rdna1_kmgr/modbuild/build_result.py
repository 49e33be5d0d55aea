"""What `rdna1-kmgr build` made: the module, its package, its checks, and what the build cost; and what
`build --dry-run` would do (BuildPlan: the build's stages planned, module_build.plan; follow prints its lines
inside its own).

modbuild makes it (module_build.run); follow and the build command read its fields. The JSON shape
(`build --json`, which scripts and the tests' build fixture read back) is formatted only at the edges,
by to_json, and read back by from_json.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.host.system_identity import SystemIdentity
from rdna1_kmgr.modbuild.signing import KeyPair
from rdna1_kmgr.source.target_kernel import Kernel


@dataclass(frozen=True)
class BuildResult:
    kernel: str  # the release built for (uname -r style)
    kernel_version: str  # the Linux version of the driver source rendered
    kernel_package_version: str | None  # the distribution's version of that kernel
    note: str | None  # said when the kernel was chosen for the owner
    source: str  # the unpacked driver source tree
    # where the source came from, in source/'s words ({"given": ...}, {"package", "version", "distro", ...})
    source_package: Mapping[str, str | None]
    package: str  # the DKMS package name
    package_version: str
    package_source: str  # /usr/src/<package>-<version>
    module: str  # the built amdgpu.ko
    sha256: str
    vermagic: str
    signer: str
    certificate: str
    certificate_sha1: str
    signing_key: str
    parameters: tuple[str, ...]  # the rdna1_* parameters the module has
    quirks: tuple[str, ...]  # the quirk ids rendered in
    devices: tuple[str, ...]  # 0x731F style
    patchset_sha256: str
    reused: bool
    compiled_objects: int
    log: str | None
    removed_versions: tuple[str, ...]  # older builds removed for this kernel
    kept_installed_versions: tuple[str, ...]  # older builds left because they are installed
    seconds: float
    quirks_on: tuple[str, ...] = ()  # the rdna1_quirks bits on by default for this kernel
    quirks_off: tuple[str, ...] = ()  # the bits compiled in, off until rdna1_quirks switches them on

    def __post_init__(self) -> None:
        object.__setattr__(self, "source_package", MappingProxyType(dict(self.source_package)))

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["source_package"] = dict(self.source_package)
        for name in _LISTS:
            out[name] = list(out[name])
        return out

    @classmethod
    def from_json(cls, data: Mapping) -> BuildResult:
        """A result printed by `build --json`; a wrong shape is one clear line."""
        names = {f.name for f in fields(cls)}
        optional = {f.name for f in fields(cls) if f.default is not MISSING}
        missing = sorted(names - optional - set(data)) if isinstance(data, Mapping) else []
        if not isinstance(data, Mapping) or missing:
            raise UsageError(
                f"not a build result (missing {', '.join(missing) or 'everything'})",
                "give the output of `rdna1-kmgr build --json`",
            )
        values = {name: data[name] for name in names if name in data}
        for name in _LISTS:
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)


_LISTS = (
    "parameters",
    "quirks",
    "devices",
    "removed_versions",
    "kept_installed_versions",
    "quirks_on",
    "quirks_off",
)


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
