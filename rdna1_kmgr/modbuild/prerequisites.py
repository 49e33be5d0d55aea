"""What a module build needs on the host (the kernel's headers, DKMS, compiler and tools), and installing
what is missing through the distribution's package manager, after the user agreed.

One small class per package manager. apt (Debian, Ubuntu) is complete and tested; dnf (Fedora) and pacman
(Arch) ask rpm -q / pacman -Q and install with dnf install / pacman -S: written, not run here.

Headers Debian ships only in bookworm-backports (a 6.12 kernel on bookworm, e.g. 6.12.95+deb12-amd64) are
installed from there: if the system's sources do not list backports yet, the plan first writes
/etc/apt/sources.list.d/rdna1-kmgr-backports.sources (the archive and keyring the system's own entry for
the release uses; backports is
NotAutomatic, so nothing else on the system moves to it), runs `apt-get update`, and installs the headers
alone as `linux-headers-KREL/bookworm-backports`. Not with `-t bookworm-backports`: that raises every
backports package to the candidate, and apt then upgrades the installed siblings built from the same source
along with the headers (measured: linux-headers-amd64, linux-libc-dev and linux-perf moved to 6.12). Their
own dependencies (common headers, kbuild, and the matching linux-image, which Debian's 6.12 headers depend
on) exist only in backports and come from there anyway.
"""

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rdna1_kmgr.core import progress, runner, user_input
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.core.files import write_atomic
from rdna1_kmgr.host import system_identity
from rdna1_kmgr.host.platform import Platform
from rdna1_kmgr.source import apt_sources
from rdna1_kmgr.source.debian_archive import PrivateArchive, run_apt

# Everything an out-of-tree kbuild run and DKMS's signing step use, besides the headers and dkms.
BUILD_TOOLS = (
    "build-essential",
    "gcc",
    "make",
    "bc",
    "bison",
    "flex",
    "libelf-dev",
    "libssl-dev",
    "kmod",
    "openssl",
    "xz-utils",
    "patch",
)
BACKPORTS_SOURCES = Path("/etc/apt/sources.list.d/rdna1-kmgr-backports.sources")
LOCK_WAIT = 600  # seconds apt waits for dpkg's lock


@dataclass
class InstallPlan:
    """What installing the missing prerequisites would do, step by step (printable before it happens)."""

    manager: str
    missing: list[str]
    files: dict[Path, str] = field(default_factory=dict)  # written before the commands run
    commands: list[list[str]] = field(default_factory=list)
    # What the commands install besides `missing` (their dependencies), as the package manager simulated it.
    pulled: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.missing

    def describe(self) -> list[str]:
        lines = [f"write {path}" for path in self.files]
        lines += [" ".join(command) for command in self.commands]
        if self.pulled:
            lines.append(f"{self.manager} also installs {' '.join(self.pulled)} (dependencies)")
        # Debian 13's headers (and bookworm-backports' 6.12 ones) depend on their kernel's image: on a machine
        # that does not run that kernel, the build installs a kernel, and its hooks run.
        for image in (name for name in self.pulled if name.startswith("linux-image-")):
            lines.append(f"{image} is a kernel: installing it runs /etc/kernel/postinst.d (initramfs, boot menu)")
        return lines

    def to_json(self) -> dict:
        return {
            "manager": self.manager,
            "missing": self.missing,
            "files": [str(path) for path in self.files],
            "commands": self.commands,
            "pulled": self.pulled,
        }


class PackageManager:
    """One package manager's way of naming, checking and installing the prerequisites, for a platform whose
    record names it (its release `codename`: this system's by default)."""

    name = "?"

    def __init__(self, platform: Platform | None = None, codename: str | None = None):
        if platform is None or codename is None:
            system = system_identity.read()
            platform = platform or system.platform
            codename = system.codename if codename is None else codename
        self.platform = platform
        self.codename = codename

    def required(self, krel: str) -> list[str]:
        raise NotImplementedError

    def missing(self, packages: list[str]) -> list[str]:
        raise self._not_here(packages)

    def plan(self, krel: str) -> InstallPlan:
        raise self._not_here(self.required(krel))

    def apply(self, plan: InstallPlan) -> None:
        raise self._not_here(plan.missing)

    def _not_here(self, packages: list[str]) -> HostError:
        return HostError(
            f"checking and installing prerequisites needs {self.name}, which this system lacks",
            f"install them yourself: {self.name} install {' '.join(packages)}",
        )


class Apt(PackageManager):
    """Debian and Ubuntu."""

    name = "apt"

    def required(self, krel: str) -> list[str]:
        return [f"linux-headers-{krel}", "dkms", *BUILD_TOOLS]

    def missing(self, packages: list[str]) -> list[str]:
        """The packages dpkg does not have fully installed."""
        proc = runner.run(
            ["dpkg-query", "--show", "--showformat=${Package}\\t${db:Status-Abbrev}\\n", *packages], check=False
        )  # exits 1 when some package is unknown to dpkg
        installed = {
            name
            for name, _, status in (line.partition("\t") for line in proc.stdout.splitlines())
            if status.startswith("ii")
        }
        return [package for package in packages if package not in installed]

    def plan(self, krel: str) -> InstallPlan:
        missing = self.missing(self.required(krel))
        plan = InstallPlan(self.name, missing)
        headers = f"linux-headers-{krel}"
        others = [package for package in missing if package != headers]
        if others:
            plan.commands.append(_apt_install(others))
        if headers in missing:
            self._plan_headers(plan, headers, krel)
        if not plan.files:  # a sources entry the plan adds first is not in apt's lists yet: nothing to ask
            plan.pulled = self.pulled_by(plan.commands, missing)
        return plan

    def pulled_by(self, commands: list[list[str]], asked: list[str]) -> list[str]:
        """What the install commands would install besides `asked`, as `apt-get -s` says (none when apt cannot
        tell: the install itself then says why)."""
        args = [arg for command in commands if command[:2] == ["apt-get", "install"] for arg in command[2:]]
        if not args:
            return []
        proc = runner.run(["apt-get", "-s", "install", *dict.fromkeys(args)], check=False)  # each option once
        if proc.returncode != 0:
            return []
        return [name for name in simulated_installs(proc.stdout) if name not in asked]

    def _plan_headers(self, plan: InstallPlan, headers: str, krel: str) -> None:
        suites = self.system_suites_of(headers)
        if suites:
            only_backports = all(suite.endswith("-backports") for suite in suites)
            plan.commands.append(_apt_install([f"{headers}/{suites[0]}" if only_backports else headers]))
            return
        backports = f"{self.codename}-backports"
        if self.platform.headers_from_backports and PrivateArchive(backports, self.codename).candidate(headers):
            if not self.system_lists_backports(backports):
                plan.files[BACKPORTS_SOURCES] = backports_sources(backports, self.codename)
            plan.commands.append(["apt-get", "update"])
            plan.commands.append(_apt_install([f"{headers}/{backports}"]))
            return
        raise HostError(
            f"no package source has {headers}",
            f"kernel {krel} is not one your distribution ships headers for: install its headers the way "
            "the kernel was built, or boot a distribution kernel",
        )

    def system_suites_of(self, package: str) -> list[str]:
        """The suites of the system's own sources that offer `package`'s candidate version (none: unavailable)."""
        proc = runner.run(["apt-cache", "policy", package], check=False)
        candidate = re.search(r"^\s*Candidate:\s*(\S+)", proc.stdout, re.M)
        if proc.returncode != 0 or candidate is None or candidate.group(1) == "(none)":
            return []
        table = proc.stdout.split("Version table:", 1)[-1]
        block = re.search(
            rf"^\s*(?:\*\*\*)?\s*{re.escape(candidate.group(1))} -?\d+\n((?:\s+-?\d+ .*\n?)*)", table, re.M
        )
        lines = block.group(1).splitlines() if block else []
        # "     100 http://<mirror>/debian bookworm-backports/main amd64 Packages"
        return [
            parts[2].split("/")[0]
            for parts in (line.split() for line in lines)
            if len(parts) >= 3 and "://" in parts[1]
        ]

    def system_lists_backports(self, suite: str) -> bool:
        """True when the system's apt sources already include `suite` (whether or not it fetched it yet)."""
        proc = runner.run(["apt-get", "update", "--print-uris"], check=False)
        return f"/dists/{suite}/" in proc.stdout

    def apply(self, plan: InstallPlan) -> None:
        _require_root(plan)
        for path, text in plan.files.items():
            write_atomic(path, text.encode())  # a small system file, whole or not at all
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        for command in plan.commands:
            # Wait for another apt or dpkg (an unattended upgrade, a second session) instead of failing at once.
            waiting = [command[0], "-o", f"DPkg::Lock::Timeout={LOCK_WAIT}", *command[1:]]
            run_apt(
                waiting,
                f"`{' '.join(command)}`",
                show_output=True,
                env=env,
                hint="see apt's message; fix the package sources and run again",
            )


class _QueryAndInstall(PackageManager):
    """A package manager asked package by package whether it is installed, and told to install the rest in one
    command. Written from the tools' documented usage; not run on this Debian machine (docs/reference.md,
    "Distributions")."""

    query: tuple[str, ...] = ()
    install: tuple[str, ...] = ()

    def missing(self, packages: list[str]) -> list[str]:
        if runner.which(self.query[0]) is None or runner.which(self.install[0]) is None:
            raise self._not_here(packages)
        return [
            package
            for package in packages
            if runner.run([*self.query, package], check=False, timeout=60).returncode != 0
        ]

    def plan(self, krel: str) -> InstallPlan:
        missing = self.missing(self.required(krel))
        plan = InstallPlan(self.name, missing)
        if missing:
            plan.commands.append([*self.install, *missing])
        return plan

    def apply(self, plan: InstallPlan) -> None:
        _require_root(plan)
        for command in plan.commands:
            runner.run(
                command,
                timeout=3600,
                doing=f"`{' '.join(command)}`",
                on_line=progress.say,
                hint=f"see {self.name}'s message; fix its repositories and run again",
            )


class Dnf(_QueryAndInstall):
    """Fedora, RHEL and relatives: kernel-devel of exactly the kernel (akmods users have it already)."""

    name = "dnf"
    query = ("rpm", "-q", "--quiet")
    install = ("dnf", "install", "-y")

    def required(self, krel: str) -> list[str]:
        return [
            f"kernel-devel-{krel}",
            "dkms",
            "gcc",
            "make",
            "bc",
            "bison",
            "flex",
            "elfutils-libelf-devel",
            "openssl-devel",
            "kmod",
            "openssl",
            "xz",
            "patch",
        ]


class Pacman(_QueryAndInstall):
    """Arch Linux and relatives: linux-headers is the running `linux` package's (Arch keeps one kernel)."""

    name = "pacman"
    query = ("pacman", "-Q")
    install = ("pacman", "-S", "--needed", "--noconfirm")

    def required(self, krel: str) -> list[str]:
        return ["linux-headers", "dkms", "base-devel", "bc", "libelf", "openssl", "kmod", "xz", "patch"]


# By the name a platform's record gives its package manager.
MANAGERS: dict[str, type[PackageManager]] = {"apt": Apt, "dnf": Dnf, "pacman": Pacman}


def manager_for_host() -> PackageManager:
    """The package manager of this system's distribution."""
    system = system_identity.read()
    return manager_for(system.platform, system.codename)


def manager_for(platform: Platform, codename: str = "") -> PackageManager:
    """The package manager of `platform` (a system running its release `codename`)."""
    manager = MANAGERS.get(platform.package_manager or "")
    if manager is not None:
        return manager(platform, codename)
    raise HostError(
        f"no package manager support for the distribution {platform.name!r}",
        "install the kernel's headers, dkms, gcc, make, bc, bison, flex, libelf and openssl headers, "
        "kmod, xz and patch yourself",
    )


def ensure_prerequisites(
    krel: str,
    *,
    yes: bool = False,
    no_install: bool = False,
    confirm: Callable[[InstallPlan], bool] | None = None,
    manager: PackageManager | None = None,
) -> InstallPlan:
    """Make sure the headers for `krel`, DKMS and the build tools are installed.

    Missing packages are installed when `yes` is set or `confirm(plan)` says yes; with `no_install` (or
    nobody to ask) a HostError names them instead. Returns the plan that was carried out (empty: nothing was
    missing).
    """
    krel = user_input.kernel_release(krel)
    manager = manager or manager_for_host()
    plan = manager.plan(krel)
    if plan.empty:
        return plan
    names = " ".join(plan.missing)
    if no_install:
        raise HostError(
            f"missing packages: {names}", f"install them ({'; '.join(plan.describe())}), " "or run without --no-install"
        )
    if not yes and (confirm is None or not confirm(plan)):
        raise HostError(
            f"missing packages were not installed: {names}",
            "agree to the install, pass --yes, or install them yourself",
        )
    manager.apply(plan)
    still = manager.missing(plan.missing)
    if still:
        raise HostError(f"packages still missing after the install: {' '.join(still)}", "see apt's messages above")
    return plan


def backports_sources(suite: str, codename: str | None = None) -> str:
    """A deb822 sources entry for `suite` (a backports suite) from the archive, keyring and trust of the
    system's own entry for the release."""
    entry = apt_sources.archive_for(suite, codename or system_identity.read().codename)
    lines = [
        f"# Added by rdna1-kmgr to install kernel headers Debian ships only in {suite}.",
        "Types: deb",
        f"URIs: {entry.uri}",
        f"Suites: {suite}",
        "Components: main",
    ]
    if entry.signed_by:
        key = entry.signed_by.replace("\n\n", "\n.\n").replace("\n", "\n ")  # deb822 continuation lines
        lines.append(f"Signed-By: {key}")
    if entry.trusted:
        lines.append("Trusted: yes")
    return "\n".join(lines) + "\n"


def simulated_installs(text: str) -> list[str]:
    """The packages `apt-get -s install` would install or upgrade, in its order (its `Inst <name> (...)` lines)."""
    return [m.group(1) for m in re.finditer(r"^Inst (\S+)", text, re.MULTILINE)]


def _apt_install(packages: list[str]) -> list[str]:
    # Without recommends: dkms recommends the distribution's *current* headers metapackage, which is not the
    # kernel asked for and would pull a second headers tree.
    return ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]


def _require_root(plan: InstallPlan) -> None:
    if os.geteuid() != 0:
        raise HostError(
            "installing packages needs root", f"run as root, or do it yourself: {'; '.join(plan.describe())}"
        )
