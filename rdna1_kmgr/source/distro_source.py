"""The distribution's own source of one of its kernels: which build a kernel release is, and that build's tree.

Debian: the kernel's package version (6.1.192-2) names linux-source-6.1 of that version (kernel_source).
Ubuntu: the package version (6.8.0-48.48) names linux-source-6.8.0 or an HWE source package of that version
(ubuntu_source). Fedora's SRPM and Arch's package source are unpacked by fedora_srpm for a given file; they
are not looked up here (see the README's support table).
"""

from __future__ import annotations

from pathlib import Path

from rdna1_kmgr.core.errors import SourceError
from rdna1_kmgr.host.system_identity import SystemIdentity
from rdna1_kmgr.source import kernel_source, ubuntu_source


def kernel_package(release: str, system: SystemIdentity) -> tuple[str | None, str | None]:
    """(package version, Linux version when the kernel says it) of `release` as the distribution built it;
    (None, None) for a kernel it did not build, or one nothing on the system describes."""
    if system.family == "ubuntu":
        kernel = ubuntu_source.ubuntu_kernel(release, system)
        return (kernel.version, kernel.upstream) if kernel else (None, None)
    if system.family == "debian":
        proc_version = system.proc_version if release == system.running_release else None
        if system.on_host:
            return kernel_source.debian_kernel_version(release, proc_version), None
        return kernel_source.debian_kernel_version_in(proc_version), None
    return None, None


def fetch(release: str, system: SystemIdentity) -> tuple[Path, dict]:
    """The unpacked, verified amd subset of the kernel's own source, and which package it came from."""
    version, _ = kernel_package(release, system)
    if version is None:
        raise SourceError(
            f"kernel {release} is not a Debian or Ubuntu kernel: no package of it, and its "
            "/proc/version says no distribution build",
            "give its source with --source PATH or --source URL",
        )
    if system.family == "ubuntu":
        tree, package = ubuntu_source.fetch_source(ubuntu_source.ubuntu_kernel(release, system), system.codename)
        return tree, {**package.to_json(), "distro": "ubuntu"}
    tree = kernel_source.fetch_debian_source(version)
    kernel_source.require_version(tree, version)
    origin = kernel_source.source_origin(tree) or {}
    return tree, {"package": origin.get("package"), "version": version, "distro": "debian"}
