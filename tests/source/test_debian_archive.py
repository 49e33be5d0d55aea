"""rdna1_kmgr.source.debian_archive: a private apt configuration per Debian suite.

The real tests talk to the archive the system's apt uses (its mirror, its proxy): a fresh private archive in a
temporary cache fetches lists and a tiny
real package (linux-headers-amd64, ~1.5 kB) every run; the kernel ABI questions use the persistent test cache.
"""

import hashlib
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from apt_fixtures import apt_config

from rdna1_kmgr.core.errors import SourceError, UsageError
from rdna1_kmgr.source import debian_archive

pytestmark = pytest.mark.skipif(not Path("/usr/bin/apt-get").exists(), reason="needs apt")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("RDNA1_KMGR_CACHE", str(root))
    return root


def system_apt_snapshot() -> dict[str, int]:
    """Names and mtimes of the system's apt sources, preferences and lists."""
    snapshot = {}
    for folder in ("/etc/apt", "/var/lib/apt/lists"):
        for path in Path(folder).rglob("*"):
            if path.is_file() and path.name != "lock":
                snapshot[str(path)] = path.stat().st_mtime_ns
    return snapshot


# --- fast ----------------------------------------------------------------------------------------------------


def test_each_suite_has_its_own_private_config(cache, tmp_path, monkeypatch):
    apt_config(
        tmp_path,
        monkeypatch,
        "deb [signed-by=/k.gpg] http://m.invalid/debian bookworm main\n"
        "deb [signed-by=/k.gpg] http://m.invalid/debian-security bookworm-security main\n",
    )
    security = debian_archive.PrivateArchive("bookworm-security", "bookworm")
    assert security.root == cache / "apt" / "bookworm-security"
    assert security.sources_line() == "deb [signed-by=/k.gpg] http://m.invalid/debian-security bookworm-security main"
    assert (
        debian_archive.PrivateArchive("sid", "bookworm").sources_line()
        == "deb [signed-by=/k.gpg] http://m.invalid/debian sid main"
    )
    options = dict(o.split("=", 1) for o in security.apt_options()[1::2])
    assert options["Dir::Etc::sourceparts"] == "-"  # the system's sources.list.d is never read
    for key in (
        "Dir::Etc::sourcelist",
        "Dir::State::Lists",
        "Dir::State::status",
        "Dir::Cache",
        "Dir::Etc::preferencesparts",
    ):
        assert options[key].startswith(str(security.root))


@pytest.mark.parametrize("suite", ["../etc", "Sid", "sid main", "-o"])
def test_a_malformed_suite_is_refused(cache, suite):
    with pytest.raises(UsageError, match="invalid suite name"):
        debian_archive.PrivateArchive(suite)


@pytest.mark.parametrize("name", ["Linux", "-o", "pkg;rm", ""])
def test_bad_package_names_are_refused_before_apt_runs(cache, name):
    with pytest.raises(UsageError, match="invalid Debian package name"):
        debian_archive.PrivateArchive("sid").candidate(name)
    assert not (cache / "apt").exists()


def test_parse_record_joins_continuation_lines():
    text = "Package: a\nVersion: 1-1\nDescription: short\n long line\n .\nSize: 12\n\nPackage: b\n"
    assert debian_archive.parse_record(text) == {
        "Package": "a",
        "Version": "1-1",
        "Description": "short\nlong line\n.",
        "Size": "12",
    }


# --- real: the system's archive ------------------------------------------------------------------------------------


@pytest.mark.realsource
def test_update_download_and_reuse_leave_the_system_apt_alone(cache, capsys):
    before = system_apt_snapshot()
    security = debian_archive.PrivateArchive("bookworm-security")
    wanted = security.package_file("linux-headers-amd64")
    assert list((cache / "apt/bookworm-security/lists").glob("*bookworm-security*Packages*"))
    deb = security.download("linux-headers-amd64")
    assert deb == cache / "debs" / wanted.filename
    assert hashlib.sha256(deb.read_bytes()).hexdigest() == wanted.sha256
    fields = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Package", "Version"], capture_output=True, text=True, check=True
    ).stdout
    assert fields == f"Package: linux-headers-amd64\nVersion: {wanted.version}\n"
    err = capsys.readouterr().err
    assert "downloading linux-headers-amd64" in err
    assert system_apt_snapshot() == before
    assert not list((cache / "debs").glob(".partial-*"))

    # Again: the lists are fresh and the file is whole, so nothing is fetched.
    stamp = (security.root / "updated").stat().st_mtime_ns
    again = debian_archive.PrivateArchive("bookworm-security")
    assert again.download("linux-headers-amd64") == deb
    assert (security.root / "updated").stat().st_mtime_ns == stamp
    assert "downloading" not in capsys.readouterr().err

    # A damaged copy in the cache is replaced.
    deb.write_bytes(deb.read_bytes()[:-1] + b"X")
    assert again.download("linux-headers-amd64") == deb
    assert hashlib.sha256(deb.read_bytes()).hexdigest() == wanted.sha256


@pytest.mark.realsource
def test_old_lists_are_refreshed(cache):
    security = debian_archive.PrivateArchive("bookworm-security")
    security.update()
    stamp = security.root / "updated"
    day_old = time.time() - debian_archive.LISTS_MAX_AGE - 60
    os.utime(stamp, (day_old, day_old))
    debian_archive.PrivateArchive("bookworm-security").update()
    assert time.time() - stamp.stat().st_mtime < 60


@pytest.mark.realsource
def test_a_version_the_suite_lacks_is_a_source_error(cache):
    with pytest.raises(SourceError) as err:
        debian_archive.PrivateArchive("bookworm-security").download("linux-source-6.1", "6.1.1-1")
    assert "bookworm-security has no linux-source-6.1 6.1.1-1" in err.value.line()
    assert "it has:" in err.value.line()
    assert not (cache / "debs").exists() or not list((cache / "debs").glob("*.deb"))


@pytest.mark.realsource
def test_versions_are_listed_highest_first(cache):
    security = debian_archive.PrivateArchive("bookworm-security")
    versions = security.versions("linux-source-6.1")
    assert versions and versions[0] == security.candidate("linux-source-6.1")
    newest_first = subprocess.run(["sort", "-V", "-r"], input="\n".join(versions), capture_output=True, text=True)
    assert newest_first.stdout.split() == versions
    assert security.candidate("rdna1-kmgr-no-such-package") is None


@pytest.mark.realsource
@pytest.mark.parametrize(
    "suite, pattern",
    [
        ("bookworm-security", r"6\.1\.0-\d+-amd64"),
        ("bookworm-backports", r"6\.12\.\d+\+deb12-amd64"),
    ],
)
def test_current_kernel_abi_follows_the_metapackage(persistent_cache, suite, pattern):
    krel = debian_archive.current_kernel_abi(suite)
    assert re.fullmatch(pattern, krel)
    suite_archive = debian_archive.PrivateArchive(suite)
    # The headers package of that release exists in the suite, and its linux-source is of the same upstream
    # release. The Debian revision may run ahead for the source: on 2026-11-28 bookworm-security had published
    # linux-source-6.1 6.1.192-3 beside the headers of 6.1.192-2.
    headers_version = suite_archive.candidate(f"linux-headers-{krel}")
    assert headers_version == suite_archive.candidate("linux-headers-amd64")
    series = ".".join(krel.split(".")[:2])
    source_version = suite_archive.candidate(f"linux-source-{series}")
    assert source_version is not None and headers_version is not None
    assert source_version.rsplit("-", 1)[0] == headers_version.rsplit("-", 1)[0]
    newer = subprocess.run(["dpkg", "--compare-versions", source_version, "ge", headers_version])
    assert newer.returncode == 0, (source_version, headers_version)
