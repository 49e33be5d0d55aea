"""rdna1_kmgr.modbuild.prerequisites: build prerequisites through the distribution's package manager.

The flow (ask, --yes, --no-install) is tested with a recording manager; apt's side with the real dpkg-query,
apt-cache and apt-get of this Debian machine, and for real by the headers fixtures (conftest.py), which
install the 6.1 headers from bookworm-security and the 6.12 headers from bookworm-backports.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest
from apt_fixtures import apt_config

from rdna1_kmgr.core.errors import HostError, UsageError
from rdna1_kmgr.host import platform
from rdna1_kmgr.modbuild import prerequisites
from rdna1_kmgr.source import debian_archive

NO_SUCH_PACKAGE = "rdna1-kmgr-no-such-package"
needs_apt = pytest.mark.skipif(not Path("/usr/bin/dpkg-query").exists(), reason="needs dpkg and apt")


class RecordingManager(prerequisites.PackageManager):
    """Reports `missing_now` as missing until apply() runs (then `missing_after`), and records apply()."""

    name = "test"

    def __init__(self, missing_now, missing_after=()):
        self.missing_now = list(missing_now)
        self.missing_after = list(missing_after)
        self.applied = []

    def required(self, krel):
        return [f"headers-{krel}", "dkms"]

    def missing(self, names):
        current = self.missing_after if self.applied else self.missing_now
        return [name for name in names if name in current]

    def plan(self, krel):
        missing = self.missing(self.required(krel))
        return prerequisites.InstallPlan(self.name, missing, commands=[["install", *missing]] if missing else [])

    def apply(self, plan):
        self.applied.append(plan)


# --- the flow ------------------------------------------------------------------------------------------------


def test_nothing_missing_means_nothing_asked_or_done():
    manager = RecordingManager([])
    plan = prerequisites.ensure_prerequisites("6.1.0-56-amd64", confirm=pytest.fail, manager=manager)
    assert plan.empty and manager.applied == []


def test_no_install_names_the_missing_packages_and_changes_nothing():
    manager = RecordingManager(["headers-6.1.0-56-amd64", "dkms"])
    with pytest.raises(HostError) as err:
        prerequisites.ensure_prerequisites("6.1.0-56-amd64", no_install=True, yes=True, manager=manager)
    assert err.value.line().startswith("missing packages: headers-6.1.0-56-amd64 dkms")
    assert manager.applied == []


def test_the_user_is_asked_with_the_plan_and_may_decline():
    manager = RecordingManager(["dkms"])
    asked = []
    with pytest.raises(HostError, match="missing packages were not installed: dkms"):
        prerequisites.ensure_prerequisites(
            "6.1.0-56-amd64", confirm=lambda plan: asked.append(plan) or False, manager=manager
        )
    assert asked[0].describe() == ["install dkms"]
    assert manager.applied == []


def test_without_anyone_to_ask_nothing_is_installed():
    manager = RecordingManager(["dkms"])
    with pytest.raises(HostError) as err:
        prerequisites.ensure_prerequisites("6.1.0-56-amd64", manager=manager)
    assert "pass --yes" in err.value.line()
    assert manager.applied == []


@pytest.mark.parametrize("how", [{"yes": True}, {"confirm": lambda plan: True}])
def test_yes_or_consent_installs(how):
    manager = RecordingManager(["dkms"])
    plan = prerequisites.ensure_prerequisites("6.1.0-56-amd64", manager=manager, **how)
    assert manager.applied == [plan] and plan.missing == ["dkms"]


def test_packages_still_missing_after_the_install_are_an_error():
    manager = RecordingManager(["dkms"], missing_after=["dkms"])
    with pytest.raises(HostError, match="still missing after the install: dkms"):
        prerequisites.ensure_prerequisites("6.1.0-56-amd64", yes=True, manager=manager)


def test_a_bad_kernel_release_is_refused_first():
    manager = RecordingManager(["dkms"])
    with pytest.raises(UsageError):
        prerequisites.ensure_prerequisites("../../etc", yes=True, manager=manager)
    assert manager.applied == []


# --- which manager -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, kind",
    [
        ("debian", prerequisites.Apt),
        ("ubuntu", prerequisites.Apt),
        ("fedora", prerequisites.Dnf),
        ("arch", prerequisites.Pacman),
    ],
)
def test_each_platform_gets_its_package_manager(name, kind):
    manager = prerequisites.manager_for(platform.named(name), "somecodename")
    assert isinstance(manager, kind) and manager.platform.name == name and manager.codename == "somecodename"


def test_an_unknown_distribution_is_a_host_error():
    with pytest.raises(HostError, match="no package manager support for the distribution 'gentoo'"):
        prerequisites.manager_for(platform.for_identity("gentoo", ""))


@needs_apt
def test_this_hosts_manager_is_apt_for_this_hosts_release():
    manager = prerequisites.manager_for_host()
    os_release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
    assert isinstance(manager, prerequisites.Apt) and manager.codename == os_release["VERSION_CODENAME"].strip('"')


@pytest.mark.parametrize(
    "manager, headers",
    [(prerequisites.Dnf(), "kernel-devel-6.8.9-300.fc40.x86_64"), (prerequisites.Pacman(), "linux-headers")],
)
def test_dnf_and_pacman_on_a_system_without_them_say_what_to_install(manager, headers):
    with pytest.raises(HostError) as err:
        prerequisites.ensure_prerequisites("6.8.9-300.fc40.x86_64", yes=True, manager=manager)
    assert f"needs {manager.name}, which this system lacks" in err.value.line()
    assert f"{manager.name} install {headers}" in err.value.line() and "dkms" in err.value.line()


@pytest.mark.parametrize(
    "manager, command",
    [
        (prerequisites.Dnf(), ["dnf", "install", "-y", "kernel-devel-6.8.9-300.fc40.x86_64", "dkms"]),
        (prerequisites.Pacman(), ["pacman", "-S", "--needed", "--noconfirm", "linux-headers", "dkms"]),
    ],
)
def test_fedora_and_arch_plans_install_only_what_the_package_database_lacks(manager, command, monkeypatch):
    """Written, not proven: the query programs are stood in for (this machine has neither rpm's database of a
    Fedora system nor pacman)."""
    have = {"rpm", "dnf", "pacman"}
    monkeypatch.setattr(prerequisites.runner, "which", lambda name: f"/usr/bin/{name}" if name in have else None)
    installed = set(manager.required("6.8.9-300.fc40.x86_64")) - {command[-2], "dkms"}
    monkeypatch.setattr(
        prerequisites.runner,
        "run",
        lambda argv, **kw: type("R", (), {"returncode": 0 if argv[-1] in installed else 1})(),
    )
    plan = manager.plan("6.8.9-300.fc40.x86_64")
    assert plan.missing == command[-2:] and plan.commands == [command]


# --- apt, on this machine ------------------------------------------------------------------------------------


def test_apt_requires_headers_dkms_and_the_build_tools():
    required = prerequisites.Apt(platform.named("debian"), "bookworm").required("6.1.0-56-amd64")
    assert required[:2] == ["linux-headers-6.1.0-56-amd64", "dkms"]
    for tool in (
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
    ):
        assert tool in required


@needs_apt
def test_apt_missing_asks_dpkg():
    assert prerequisites.Apt(platform.named("debian"), "bookworm").missing(["dpkg", NO_SUCH_PACKAGE, "coreutils"]) == [
        NO_SUCH_PACKAGE
    ]


def test_the_backports_sources_entry_follows_the_systems_own_entry_for_the_release(tmp_path, monkeypatch):
    mirror = "http://mirror.example.invalid/debian"
    apt_config(tmp_path, monkeypatch, f"deb [signed-by=/k.gpg] {mirror} bookworm main contrib\n")
    text = prerequisites.backports_sources("bookworm-backports", "bookworm")
    fields = dict(line.split(": ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert fields == {
        "Types": "deb",
        "URIs": mirror,
        "Suites": "bookworm-backports",
        "Components": "main",
        "Signed-By": "/k.gpg",
    }
    assert prerequisites.BACKPORTS_SOURCES == Path("/etc/apt/sources.list.d/rdna1-kmgr-backports.sources")


@needs_apt
def test_headers_nobody_ships_are_a_host_error(persistent_cache):
    with pytest.raises(HostError) as err:
        prerequisites.Apt(platform.named("debian"), "bookworm").plan("6.18.44-fc")
    assert err.value.line().startswith("no package source has linux-headers-6.18.44-fc")


@needs_apt
def test_the_system_sources_offer_the_current_61_headers(persistent_cache):
    """Read-only: bookworm's own sources (bookworm-security) have the headers of the current 6.1 ABI."""
    krel = debian_archive.current_kernel_abi("bookworm-security")
    assert prerequisites.Apt(platform.named("debian"), "bookworm").system_suites_of(f"linux-headers-{krel}") == [
        "bookworm-security"
    ]
    assert prerequisites.Apt(platform.named("debian"), "bookworm").system_suites_of(NO_SUCH_PACKAGE) == []


class NothingInstalledApt(prerequisites.Apt):
    """apt on a bookworm machine that has nothing installed and no backports in its sources."""

    def missing(self, names):
        return list(names)

    def system_suites_of(self, package):
        return [] if package.startswith("linux-headers-") else ["bookworm"]

    def system_lists_backports(self, suite):
        return False


@needs_apt
def test_backports_headers_plan_adds_the_sources_entry_and_installs_from_backports(persistent_cache):
    krel = debian_archive.current_kernel_abi("bookworm-backports")  # e.g. 6.12.95+deb12-amd64
    plan = NothingInstalledApt(platform.named("debian"), "bookworm").plan(krel)
    assert plan.files == {prerequisites.BACKPORTS_SOURCES: prerequisites.backports_sources("bookworm-backports")}
    assert plan.describe() == [
        f"write {prerequisites.BACKPORTS_SOURCES}",
        "apt-get install -y -q --no-install-recommends dkms " + " ".join(prerequisites.BUILD_TOOLS),
        "apt-get update",
        f"apt-get install -y -q --no-install-recommends linux-headers-{krel}/bookworm-backports",
    ]


def test_only_a_platform_with_backports_headers_looks_there():
    """Ubuntu's record has no backports headers: the missing headers are an error at once, without asking any
    archive (a Debian record would ask bookworm-backports here)."""
    with pytest.raises(HostError) as err:
        NothingInstalledApt(platform.named("ubuntu"), "noble").plan("6.8.0-48-generic")
    assert err.value.line().startswith("no package source has linux-headers-6.8.0-48-generic")


@needs_apt
def test_a_failing_apt_install_is_one_host_error(monkeypatch):
    apt = prerequisites.Apt(platform.named("debian"), "bookworm")
    monkeypatch.setattr(apt, "required", lambda krel: ["dpkg", NO_SUCH_PACKAGE])
    with pytest.raises(HostError) as err:
        prerequisites.ensure_prerequisites("6.1.0-56-amd64", yes=True, manager=apt)
    if os.geteuid() == 0:
        assert f"`apt-get install -y -q --no-install-recommends {NO_SUCH_PACKAGE}` failed" in err.value.line()
        assert "Unable to locate package" in err.value.line()
    else:
        assert "installing packages needs root" in err.value.line()


# --- real installs (the fixtures do them) --------------------------------------------------------------------


def assert_headers_installed(krel: str) -> None:
    status = subprocess.run(
        ["dpkg-query", "-W", "-f=${db:Status-Abbrev}", f"linux-headers-{krel}"], capture_output=True, text=True
    ).stdout
    assert status.startswith("ii")
    assert (Path("/lib/modules") / krel / "build" / "Makefile").is_file()
    assert prerequisites.Apt().plan(krel).empty


def test_headers_61_are_installed(headers_61):
    assert re.fullmatch(r"6\.1\.0-\d+-amd64", headers_61)
    assert_headers_installed(headers_61)


@pytest.mark.system  # installs backports' headers with apt when missing
def test_headers_612_come_from_backports(headers_612):
    assert re.fullmatch(r"6\.12\.\d+\+deb12-amd64", headers_612)
    assert_headers_installed(headers_612)
    assert prerequisites.Apt().system_lists_backports("bookworm-backports")
    assert prerequisites.Apt().system_suites_of(f"linux-headers-{headers_612}") == ["bookworm-backports"]


# --- Debian 13: the headers depend on their kernel's image ----------------------------------------------------

DATA = Path(__file__).parent / "data"
TRIXIE_SIMULATION = DATA / "apt-get-s-install-linux-headers-6.12.117+deb13-amd64.out"


def test_simulated_installs_are_apts_inst_lines_in_its_order():
    """What Debian 13's apt printed (tests/modbuild/data): the headers pull their common part, the kernel's image
    and its kbuild."""
    assert prerequisites.simulated_installs(TRIXIE_SIMULATION.read_text()) == [
        "linux-image-6.12.117+deb13-amd64",
        "linux-headers-6.12.117+deb13-common",
        "linux-kbuild-6.12.117+deb13",
        "linux-headers-6.12.117+deb13-amd64",
    ]


class TrixieApt(prerequisites.Apt):
    """apt on a Debian 13 machine that has all but the headers, which its own sources offer."""

    def missing(self, names):
        return [name for name in names if name.startswith("linux-headers-")]

    def system_suites_of(self, package):
        return ["trixie-security", "trixie"]


def test_the_plan_says_the_headers_bring_a_kernel_image_whose_hooks_run(monkeypatch):
    asked = []

    def fake_run(argv, **kwargs):
        asked.append(argv)
        return prerequisites.runner.Result(argv, 0, TRIXIE_SIMULATION.read_text(), "")

    monkeypatch.setattr(prerequisites.runner, "run", fake_run)
    plan = TrixieApt(platform.named("debian"), "trixie").plan("6.12.117+deb13-amd64")
    assert asked == [
        ["apt-get", "-s", "install", "-y", "-q", "--no-install-recommends", "linux-headers-6.12.117+deb13-amd64"]
    ]
    assert plan.pulled == [
        "linux-image-6.12.117+deb13-amd64",
        "linux-headers-6.12.117+deb13-common",
        "linux-kbuild-6.12.117+deb13",
    ]
    assert plan.describe() == [
        "apt-get install -y -q --no-install-recommends linux-headers-6.12.117+deb13-amd64",
        "apt also installs linux-image-6.12.117+deb13-amd64 linux-headers-6.12.117+deb13-common "
        "linux-kbuild-6.12.117+deb13 (dependencies)",
        "linux-image-6.12.117+deb13-amd64 is a kernel: installing it runs /etc/kernel/postinst.d (initramfs, boot menu)",
    ]
    assert plan.to_json()["pulled"] == plan.pulled


def test_a_simulation_apt_refuses_adds_nothing_to_the_plan(monkeypatch):
    monkeypatch.setattr(
        prerequisites.runner, "run", lambda argv, **kw: prerequisites.runner.Result(argv, 100, "", "E:")
    )
    plan = TrixieApt(platform.named("debian"), "trixie").plan("6.12.117+deb13-amd64")
    assert plan.pulled == [] and len(plan.describe()) == 1
