"""Which kernel a command is for: --kernel when given, else the running kernel, else the distribution's current one.

Resolved once, where the command starts (build, install, follow, vm-test), into a `Kernel` that every stage
below reads: the release, the distribution's version of it and the Linux version it says it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from rdna1_kmgr.core import progress, runner, user_input
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.host import system_identity
from rdna1_kmgr.host.system_identity import SystemIdentity
from rdna1_kmgr.source import distro_source


@dataclass(frozen=True)
class Kernel:
    release: str  # uname -r style: 6.1.0-56-amd64
    package_version: str | None  # the distro's version of that kernel: 6.1.192-2, Ubuntu's 6.8.0-48.48
    note: str | None = None  # said to the user when the release was chosen for them
    upstream: str | None = None  # the Linux version, when the kernel says it (Ubuntu's version_signature)


def distro_current_kernel() -> str | None:
    """The release the distro's kernel metapackage points to today (installed one first, else apt's candidate)."""
    if not runner.which("dpkg-query"):
        return None  # dnf and pacman hosts: their place is here, not written yet
    arch = runner.run(["dpkg", "--print-architecture"]).stdout.strip()
    metas = [f"linux-image-{arch}", f"linux-headers-{arch}", "linux-image-generic", "linux-headers-generic"]
    for meta in metas:
        proc = runner.run(["dpkg-query", "--show", "--showformat=${Depends}", meta], check=False)
        found = _release_in_depends(proc.stdout) if proc.returncode == 0 else None
        if found:
            return found
    for meta in metas:
        proc = runner.run(["apt-cache", "depends", meta], check=False)
        found = _release_in_depends(proc.stdout) if proc.returncode == 0 else None
        if found:
            return found
    return None


# By the name in the platform record (a lambda: tests patch distro_current_kernel).
CURRENT_KERNEL_FINDERS: dict[str, Callable[[], str | None]] = {"apt-metapackage": lambda: distro_current_kernel()}


def _current_kernel(system: SystemIdentity) -> str | None:
    """The distribution's current kernel, the way the system's platform record names (none: not known)."""
    finder = CURRENT_KERNEL_FINDERS.get(system.platform.current_kernel or "")
    return finder() if finder is not None and system.on_host else None


def _release_in_depends(text: str) -> str | None:
    m = re.search(r"\blinux-(?:image|headers)-(\d+\.\d+[^\s,()|]*)", text)
    return m.group(1) if m else None


def resolve_kernel(requested: str | None, doing: str = "building", system: SystemIdentity | None = None) -> Kernel:
    """--kernel when given; else the running kernel, or, when that is not the distro's, the distro's current one.
    `doing` is what the command does for it, for the note ("building", "planning an install", ...); `system`
    the one whose facts decide (default: this one)."""
    system = system or system_identity.read()
    if requested is not None:
        release = user_input.kernel_release(requested)
        version, upstream = distro_source.kernel_package(release, system)
        return Kernel(release, version, upstream=upstream)
    running = system.running_release
    version, upstream = distro_source.kernel_package(running, system)
    if version is not None:
        return Kernel(running, version, upstream=upstream)
    current = _current_kernel(system)
    name = system.distro_id or "distribution"
    if current is None:
        raise HostError(
            f"the running kernel {running} is not a {name} kernel " "and no distribution kernel is known",
            "give --kernel RELEASE",
        )
    return Kernel(
        current,
        distro_source.kernel_package(current, system)[0],
        note=f"the running kernel {running} is not a {name} kernel; "
        f"{doing} for the distribution's current kernel {current} (give --kernel to choose)",
    )


def kernel_to_install(requested: str | None, dry_run: bool) -> Kernel:
    """The kernel an install (or its plan) is for, resolved once where the command starts, its note said."""
    kernel = resolve_kernel(requested, "planning an install" if dry_run else "installing")
    if kernel.note:
        progress.say(f"rdna1-kmgr: {kernel.note}")
    return kernel
