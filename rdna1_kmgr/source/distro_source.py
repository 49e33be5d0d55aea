"""The distribution's own source of one of its kernels: which build a kernel release is, and that build's tree.

One fetcher per kernel source kind a platform's record names (host/platforms.toml):
debian-archive: the kernel's package version (6.1.192-2) names linux-source-6.1 of that version (kernel_source).
ubuntu-archive: the package version (6.8.0-48.48) names linux-source-6.8.0 or an HWE source package of that
version (ubuntu_source). Fedora's SRPM and Arch's package source (fedora-srpm, arch-pkgbuild) are unpacked by
fedora_srpm for a given file; they are not looked up here (see docs/reference.md, "Distributions").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core.errors import SourceError
from rdna1_kmgr.host.system_identity import SystemIdentity
from rdna1_kmgr.source import kernel_source, ubuntu_source


@dataclass(frozen=True)
class Fetcher:
    # (package version, Linux version when the kernel says it) of a release, or (None, None)
    package: Callable[[str, SystemIdentity], tuple[str | None, str | None]]
    # the unpacked, verified amd subset of that package version's source, and which package it came from
    fetch: Callable[[str, str, SystemIdentity], tuple[Path, dict]]


def _debian_package(release: str, system: SystemIdentity) -> tuple[str | None, str | None]:
    proc_version = system.proc_version if release == system.running_release else None
    if system.on_host:
        return kernel_source.debian_kernel_version(release, proc_version), None
    return kernel_source.debian_kernel_version_in(proc_version), None


def _debian_fetch(release: str, version: str, system: SystemIdentity) -> tuple[Path, dict]:
    tree = kernel_source.fetch_debian_source(version, system=system)
    kernel_source.require_version(tree, version)
    origin = kernel_source.source_origin(tree) or {}
    return tree, {"package": origin.get("package"), "version": version, "distro": "debian"}


def _ubuntu_package(release: str, system: SystemIdentity) -> tuple[str | None, str | None]:
    kernel = ubuntu_source.ubuntu_kernel(release, system)
    return (kernel.version, kernel.upstream) if kernel else (None, None)


def _ubuntu_fetch(release: str, version: str, system: SystemIdentity) -> tuple[Path, dict]:
    kernel = ubuntu_source.ubuntu_kernel(release, system)
    assert kernel is not None, "fetch comes here only for a release _ubuntu_package found the build of"
    tree, package = ubuntu_source.fetch_source(kernel, system.codename)
    return tree, {**package.to_json(), "distro": "ubuntu"}


# By the kernel source kind a platform's record names.
FETCHERS = {
    "debian-archive": Fetcher(_debian_package, _debian_fetch),
    "ubuntu-archive": Fetcher(_ubuntu_package, _ubuntu_fetch),
}


def kernel_package(release: str, system: SystemIdentity) -> tuple[str | None, str | None]:
    """(package version, Linux version when the kernel says it) of `release` as the distribution built it;
    (None, None) for a kernel it did not build, or one nothing on the system describes."""
    fetcher = FETCHERS.get(system.platform.kernel_source or "")
    return fetcher.package(release, system) if fetcher else (None, None)


def fetch(release: str, system: SystemIdentity) -> tuple[Path, dict]:
    """The unpacked, verified amd subset of the kernel's own source, and which package it came from."""
    version, _ = kernel_package(release, system)
    if version is None:
        raise SourceError(
            f"kernel {release} is not a Debian or Ubuntu kernel: no package of it, and its "
            "/proc/version says no distribution build",
            "give its source with --source PATH or --source URL",
        )
    return FETCHERS[system.platform.kernel_source or ""].fetch(release, version, system)  # found by it: there
