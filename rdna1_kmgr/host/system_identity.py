"""Which system this is: its distribution, release, running kernel and the build that kernel says it is.

The facts the source and build stages choose a distribution's way by. Read from / (the running system) or
from a sysroot (a mounted system, or a test's fixture tree): etc/os-release, proc/sys/kernel/osrelease,
proc/version and, on Ubuntu, proc/version_signature ("Ubuntu 6.8.0-48.48-generic 6.8.12": the package
version and flavour of the running kernel, and the Linux version it is based on).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import distro

from rdna1_kmgr.core import user_input
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.host import platform as platforms
from rdna1_kmgr.host.platform import Platform


@dataclass(frozen=True)
class SystemIdentity:
    sysroot: Path
    running_release: str  # uname -r of the running kernel (of the sysroot's, when it has proc/)
    distro_id: str
    like: tuple[str, ...]
    codename: str  # VERSION_CODENAME (UBUNTU_CODENAME), e.g. bookworm, noble
    version_signature: str | None  # /proc/version_signature (Ubuntu kernels), stripped
    proc_version: str | None  # /proc/version
    platform: Platform  # which supported distribution it is (from distro_id and like), and its ways

    @property
    def on_host(self) -> bool:
        return self.sysroot.resolve() == Path("/")

    def path(self, absolute: str | Path) -> Path:
        """An absolute path of the system, as seen from here (under the sysroot)."""
        return self.sysroot / str(absolute).lstrip("/")

    def to_json(self) -> dict:
        return {
            "sysroot": str(self.sysroot),
            "distro": self.distro_id,
            "family": self.platform.name,
            "codename": self.codename,
            "running_release": self.running_release,
            "version_signature": self.version_signature,
        }


def read(sysroot: Path | str = Path("/")) -> SystemIdentity:
    sysroot = Path(sysroot)
    on_host = sysroot.resolve() == Path("/")
    info = distro if on_host else distro.LinuxDistribution(root_dir=str(sysroot))
    codename = (
        info.os_release_attr("version_codename") or info.os_release_attr("ubuntu_codename") or info.codename() or ""
    )
    distro_id, like = info.id(), tuple(info.like().split())
    return SystemIdentity(
        sysroot=sysroot,
        running_release=os.uname().release if on_host else _sysroot_release(sysroot),
        distro_id=distro_id,
        like=like,
        codename=codename.lower(),
        version_signature=_read(sysroot / "proc/version_signature"),
        proc_version=_read(sysroot / "proc/version"),
        platform=platforms.for_identity(distro_id, like),
    )


def _sysroot_release(sysroot: Path) -> str:
    path = sysroot / "proc/sys/kernel/osrelease"
    try:
        return user_input.kernel_release(path.read_text().strip())
    except FileNotFoundError:
        raise HostError(f"cannot read the kernel release: {path} is missing", "is it a system's root?") from None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip() or None
    except OSError:
        return None
