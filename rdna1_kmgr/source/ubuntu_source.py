"""Ubuntu's kernel source, found the way Ubuntu publishes it: as a binary package through the system's apt.

An Ubuntu kernel `6.8.0-48-generic` is the package version `6.8.0-48.48` (dpkg's version of its image,
modules or headers package; for the running kernel also the first word of /proc/version_signature,
"Ubuntu 6.8.0-48.48-generic 6.8.12", whose last word is the Linux version it is built from). Its source is
the package the same upload built:

  - the GA kernel (source package `linux`): `linux-source-6.8.0`
  - a kernel built from another source package, as HWE kernels are (`linux-hwe-6.8`, version
    6.8.0-48.48~22.04.1): `linux-hwe-6.8-source-6.8.0`

holding /usr/src/<that name>/<that name>.tar.bz2. No deb-src lines are needed: it is fetched from the
system's own suites (noble, noble-updates, noble-security) through a private apt state, and its version must
be the kernel's own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import runner, user_input
from rdna1_kmgr.core.errors import HostError, SourceError
from rdna1_kmgr.core.paths import cache_dir
from rdna1_kmgr.host.system_identity import SystemIdentity
from rdna1_kmgr.source import apt_sources
from rdna1_kmgr.source.debian_archive import PrivateArchive
from rdna1_kmgr.source.kernel_source import (
    ORIGIN_FILE,
    UBUNTU_ABI_VERSION,
    require_version,
    source_origin,
    unpack_download,
)

# uname -r of an Ubuntu kernel: 6.8.0-48-generic, 6.8.0-1015-lowlatency-64k.
_RELEASE = re.compile(r"^(\d+\.\d+\.\d+)-(\d+)-([a-z][a-z0-9-]*)$")
# "Ubuntu 6.8.0-48.48-generic 6.8.12" (HWE: "Ubuntu 6.8.0-48.48~22.04.1-generic 6.8.12").
_SIGNATURE = re.compile(r"^Ubuntu (\d\S*?)-([a-z][a-z0-9-]*) (\d+\.\d+\.\d+\S*)$")


@dataclass(frozen=True)
class UbuntuKernel:
    release: str  # 6.8.0-48-generic
    version: str  # 6.8.0-48.48, the package version of its image, modules and headers
    upstream: str | None  # 6.8.12, from /proc/version_signature (known for the running kernel)
    source_name: str | None  # the source package that built it (linux, linux-hwe-6.8), when dpkg knows

    @property
    def source_packages(self) -> list[str]:
        """The binary packages that may hold its source, most likely first."""
        abi = UBUNTU_ABI_VERSION.fullmatch(self.version)
        if abi is None:  # ubuntu_kernel checked it; a version made elsewhere is a bug
            raise ValueError(f"not an Ubuntu kernel package version: {self.version!r}")
        base = abi.group(1)
        if self.source_name:
            return [f"linux-source-{base}" if self.source_name == "linux" else f"{self.source_name}-source-{base}"]
        names = [f"linux-source-{base}"]
        if "~" in self.version:  # a backport to an older release: HWE's own source package first
            names.insert(0, f"linux-hwe-{'.'.join(base.split('.')[:2])}-source-{base}")
        return names


@dataclass(frozen=True)
class SourcePackage:
    package: str
    version: str
    suite: str

    def to_json(self) -> dict:
        return {"package": self.package, "version": self.version, "suite": self.suite}


def parse_signature(text: str) -> tuple[str, str, str] | None:
    """(package version, flavour, Linux version) from /proc/version_signature, or None for another format."""
    match = _SIGNATURE.fullmatch(text.strip())
    return (match[1], match[2], match[3]) if match else None


def ubuntu_kernel(krel: str, system: SystemIdentity) -> UbuntuKernel | None:
    """What Ubuntu build kernel `krel` is, or None when nothing says (not installed, not running)."""
    release = _RELEASE.fullmatch(user_input.kernel_release(krel))
    if release is None:
        return None
    version, source_name = _dpkg_version(krel) if system.on_host else (None, None)
    upstream = None
    signature = parse_signature(system.version_signature or "") if krel == system.running_release else None
    if signature is not None and signature[1] == release.group(3):
        if version is None or version == signature[0]:
            version, upstream = signature[0], signature[2]
    if version is None:
        return None
    abi = UBUNTU_ABI_VERSION.fullmatch(version)
    if abi is None or (abi.group(1), abi.group(2)) != (release.group(1), release.group(2)):
        raise HostError(
            f"kernel {krel} says it is package version {version}, which is not its ABI",
            "is /proc/version_signature of this kernel?",
        )
    return UbuntuKernel(krel, version, upstream, source_name)


def find_source(kernel: UbuntuKernel, codename: str) -> SourcePackage:
    """The suite of the system's archive that has the kernel's source package at exactly its version."""
    suites = apt_sources.system_suites(codename)
    if not suites:
        raise HostError(
            f"the system's apt sources list no suite of Ubuntu {codename}",
            "add the distribution's sources (noble, noble-updates, noble-security)",
        )
    for suite in suites:
        archive = PrivateArchive(suite, codename)
        for package in kernel.source_packages:
            if kernel.version in archive.versions(package):
                return SourcePackage(package, kernel.version, suite)
    names = " or ".join(kernel.source_packages)
    raise SourceError(
        f"Ubuntu's archive has no {names} {kernel.version} (searched {', '.join(suites)})",
        "the archive may have dropped that upload: upgrade to the current kernel, or give --source",
    )


def fetch_source(kernel: UbuntuKernel, codename: str) -> tuple[Path, SourcePackage]:
    """The unpacked amd subset of the kernel's own source, checked against it, and the package it came from."""
    tree = cache_dir() / "src" / kernel.version
    origin = source_origin(tree) if (tree / ORIGIN_FILE).is_file() else None
    if origin and origin.get("debian_version") == kernel.version:
        found = SourcePackage(origin["package"], kernel.version, "(cached)")
    else:
        found = find_source(kernel, codename)
        tree = unpack_download(PrivateArchive(found.suite, codename).download(found.package, found.version))
    require_version(tree, kernel.upstream or kernel.version)
    return tree, found


def _dpkg_version(krel: str) -> tuple[str | None, str | None]:
    """dpkg's (version, source package) of the kernel's installed image, modules or headers package."""
    packages = [f"linux-image-{krel}", f"linux-image-unsigned-{krel}", f"linux-modules-{krel}", f"linux-headers-{krel}"]
    if runner.which("dpkg-query") is None:
        return None, None
    out = runner.run(
        ["dpkg-query", "--show", "--showformat=${db:Status-Abbrev}\t${Version}\t${source:Package}\n", *packages],
        check=False,
        timeout=30,
    ).stdout
    for line in out.splitlines():
        status, _, rest = line.partition("\t")
        version, _, source = rest.partition("\t")
        if status.startswith("ii") and version.strip():
            return version.strip(), source.strip() or None
    return None, None
