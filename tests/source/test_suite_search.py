"""rdna1_kmgr.source.suite_search: the suites searched for a kernel's packages come from the machine's release.

Each machine is a fixture: a sysroot with its os-release and its apt sources (Debian 13's deb822
debian.sources, Debian 12's one-line sources.list), named to apt by APT_CONFIG. The searches run real apt
against local file:// repositories built at test time (apt_fixtures.build_repository); a suite missing from the
repository stands for one apt cannot update (on a Debian 13 root, sid's expired Release file).
"""

import shutil
from pathlib import Path

import pytest
from apt_fixtures import (
    DEBIAN_BOOKWORM_OS_RELEASE,
    DEBIAN_TRIXIE_OS_RELEASE,
    build_repository,
    debian_sysroot,
    trixie_sources,
)
from source_fixtures import make_deb

from rdna1_kmgr.core.errors import SourceError
from rdna1_kmgr.host import system_identity
from rdna1_kmgr.source import apt_sources, kernel_source, suite_search
from rdna1_kmgr.vm import guest_kernel

pytestmark = pytest.mark.skipif(not Path("/usr/bin/apt-get").exists(), reason="needs apt")

MIRROR = "http://mirror.example.invalid/debian/"
SECURITY = "http://security-mirror.example.invalid/debian-security/"
TRIXIE_KERNEL = "6.12.118+deb13-amd64"
# Debian 12's sources.list as its installer writes it (one-line format).
BOOKWORM_SOURCES = (
    f"deb {MIRROR} bookworm main non-free-firmware\n"
    f"deb-src {MIRROR} bookworm main non-free-firmware\n"
    f"deb {SECURITY} bookworm-security main non-free-firmware\n"
    f"deb {MIRROR} bookworm-updates main non-free-firmware\n"
)
# Every suite a Debian 13 machine searches, in order: its release's security suite (where a current trixie
# kernel is between point releases), the release, -updates, -backports; then Debian 12's; then sid.
TRIXIE_ORDER = (
    "trixie-security",
    "trixie",
    "trixie-updates",
    "trixie-backports",
    "bookworm-security",
    "bookworm",
    "bookworm-updates",
    "bookworm-backports",
    "sid",
)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("RDNA1_KMGR_CACHE", str(root))
    return root


# --- which suites ------------------------------------------------------------------------------------------


def test_debian_13_searches_its_own_release_first_each_from_the_archive_its_sources_name(tmp_path, monkeypatch):
    root = debian_sysroot(
        tmp_path / "trixie",
        DEBIAN_TRIXIE_OS_RELEASE,
        TRIXIE_KERNEL,
        parts={"debian.sources": trixie_sources(MIRROR, SECURITY)},
        monkeypatch=monkeypatch,
    )
    system = system_identity.read(root)
    assert system.codename == "trixie"
    assert suite_search.suites_for(system) == TRIXIE_ORDER
    # Backports is not in the installer's sources: asked of the mirror that serves trixie itself.
    for suite, uri in [
        ("trixie-security", SECURITY),
        ("trixie", MIRROR),
        ("trixie-updates", MIRROR),
        ("trixie-backports", MIRROR),
        ("bookworm-security", SECURITY),
        ("sid", MIRROR),
    ]:
        assert apt_sources.archive_for(suite, system.codename).uri == uri.rstrip("/")


def test_debian_12_keeps_bookworm_first(tmp_path, monkeypatch):
    root = debian_sysroot(
        tmp_path / "bookworm",
        DEBIAN_BOOKWORM_OS_RELEASE,
        "6.1.0-56-amd64",
        sources_list=BOOKWORM_SOURCES,
        monkeypatch=monkeypatch,
    )
    assert suite_search.suites_for(system_identity.read(root)) == (
        "bookworm-security",
        "bookworm",
        "bookworm-updates",
        "bookworm-backports",
        "trixie-security",
        "trixie",
        "trixie-updates",
        "trixie-backports",
        "sid",
    )


def test_the_search_result_names_what_it_searched_and_skipped():
    result = suite_search.SearchResult(
        None, ("trixie-security", "trixie"), (suite_search.Skipped("sid", "Release file expired"),)
    )
    assert result.describe() == "searched trixie-security, trixie; skipped sid (Release file expired)"


# --- real apt against a local repository --------------------------------------------------------------------


@pytest.fixture
def trixie_machine(tmp_path, monkeypatch, cache):
    """A Debian 13 sysroot whose deb822 sources name local repositories: trixie-security has linux-source-6.12
    6.12.118-1; trixie and trixie-backports exist, empty; trixie-updates is listed but missing (its update
    fails), as are bookworm's suites and sid."""
    if shutil.which("apt-ftparchive") is None:
        pytest.skip("apt-ftparchive (apt-utils) is not installed: ./install.sh --test installs it")
    debs = tmp_path / "debs"
    debs.mkdir()
    deb = make_deb(debs, "6.12", "6.12.118-1")
    mirror, security = tmp_path / "mirror", tmp_path / "security"
    build_repository(security, "trixie-security", [deb], origin="Debian")
    for suite in ("trixie", "trixie-backports"):
        build_repository(mirror, suite, [], origin="Debian")
    root = debian_sysroot(
        tmp_path / "sysroot",
        DEBIAN_TRIXIE_OS_RELEASE,
        TRIXIE_KERNEL,
        parts={"debian.sources": trixie_sources(f"file://{mirror}", f"file://{security}", trust="Trusted: yes")},
        monkeypatch=monkeypatch,
        # The repositories live in pytest's root-only folder: let apt read them as root, not as _apt.
        extra='APT::Sandbox::User "root";\n',
    )
    return {"system": system_identity.read(root), "mirror": mirror, "deb": deb}


def updated(stderr: str) -> list[str]:
    """The suites whose lists the private archive updated, in order, from its progress lines."""
    return [line.split()[4] for line in stderr.splitlines() if line.startswith("updating package lists of ")]


def test_debian_13s_kernel_source_is_found_in_trixie_security_and_unpacked(trixie_machine, cache, capsys):
    system = trixie_machine["system"]
    tree = kernel_source.fetch_debian_source("6.12.118-1", system=system)
    origin = kernel_source.source_origin(tree)
    assert (origin["package"], origin["debian_version"], origin["kernel_version"]) == (
        "linux-source-6.12",
        "6.12.118-1",
        "6.12.118",
    )
    assert updated(capsys.readouterr().err) == ["trixie-security"]  # the first suite has it: nothing else asked


def test_a_suite_whose_lists_fail_to_update_is_skipped_with_one_warning_and_the_next_is_tried(trixie_machine, capsys):
    """The version is only in trixie-backports; trixie-updates, before it, cannot be updated."""
    mirror = trixie_machine["mirror"]
    bpo = make_deb(mirror.parent / "debs", "7.3", "7.3.4-1~bpo13+1")
    build_repository(mirror, "trixie-backports", [bpo], origin="Debian")
    found = kernel_source.debian_source_for("7.3.4-1~bpo13+1", trixie_machine["system"])
    assert (found.package, found.suite) == ("linux-source-7.3", "trixie-backports")
    err = capsys.readouterr().err
    assert updated(err) == ["trixie-security", "trixie", "trixie-updates", "trixie-backports"]
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [warnings[0]]  # one line, saying which suite and apt's error
    assert warnings[0].startswith("warning: skipping trixie-updates: updating the trixie-updates lists failed: E: ")


def test_the_error_when_no_suite_has_the_version_names_every_suite(trixie_machine, capsys):
    with pytest.raises(SourceError) as raised:
        kernel_source.debian_source_for("6.12.57-1", trixie_machine["system"])
    line = raised.value.line()
    assert line.startswith("Debian's archive no longer has linux-source-6.12 6.12.57-1 (searched ")
    assert "(searched trixie-security, trixie, trixie-backports; skipped trixie-updates (" in line
    for suite in TRIXIE_ORDER:
        assert suite in line
    for suite in ("bookworm-security", "bookworm", "bookworm-updates", "bookworm-backports", "sid"):
        assert f"{suite} (updating the {suite} lists failed: " in line
    assert "https://cdn.kernel.org/pub/linux/kernel/v6.x/linux-6.12.57.tar.xz" in line
    assert capsys.readouterr().err.count("warning: skipping ") == 6


def test_the_guest_kernel_fetch_uses_the_same_search(trixie_machine, cache, capsys):
    system = trixie_machine["system"]
    assert guest_kernel._suites(system) == TRIXIE_ORDER
    with pytest.raises(SourceError) as raised:
        guest_kernel._download(f"linux-image-{TRIXIE_KERNEL}", guest_kernel._suites(system), system.codename)
    assert f"no suite has linux-image-{TRIXIE_KERNEL} (searched trixie-security, trixie, trixie-backports;" in (
        raised.value.line()
    )
    assert "skipped trixie-updates (" in raised.value.line() and "sid (" in raised.value.line()
    deb = guest_kernel._download("linux-source-6.12", guest_kernel._suites(system), system.codename)
    assert deb.read_bytes() == trixie_machine["deb"].read_bytes()
