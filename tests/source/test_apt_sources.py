"""rdna1_kmgr.source.apt_sources: the archives come from the system's own apt configuration."""

import re
import subprocess
from pathlib import Path

import pytest
from apt_fixtures import apt_config

from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.source import apt_sources, debian_archive

pytestmark = pytest.mark.skipif(not Path("/usr/bin/apt-config").exists(), reason="needs apt")

MIRROR = "http://mirror.example.invalid/debian"
SECURITY = "http://security-mirror.example.invalid/debian-security"
DEB822 = f"""# a comment
Types: deb deb-src
URIs: {MIRROR}/
Suites: bookworm bookworm-updates
Components: main contrib
Signed-By: /usr/share/keyrings/some-keyring.gpg

Types: deb
URIs: {SECURITY}
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/some-keyring.gpg

Enabled: no
Types: deb
URIs: http://disabled.example.invalid/debian
Suites: trixie
Components: main
"""


def test_one_line_entries_keep_options_and_skip_deb_src():
    text = (
        "# comment\ndeb-src http://x.invalid/d bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://x.invalid/d/ bookworm main contrib # trailing\n"
        "deb [trusted=yes] file:///srv/repo noble-updates main\n"
    )
    entries = apt_sources.parse_one_line(text)
    assert [(e.uri, e.suite, e.components, e.signed_by, e.trusted) for e in entries] == [
        ("http://x.invalid/d", "bookworm", ("main", "contrib"), "/k.gpg", False),
        ("file:///srv/repo", "noble-updates", ("main",), None, True),
    ]


def test_deb822_stanzas_give_one_entry_per_uri_and_suite_and_skip_disabled_ones():
    entries = apt_sources.parse_deb822(DEB822)
    assert [(e.uri, e.suite) for e in entries] == [
        (MIRROR, "bookworm"),
        (MIRROR, "bookworm-updates"),
        (SECURITY, "bookworm-security"),
    ]
    assert entries[0].signed_by == "/usr/share/keyrings/some-keyring.gpg"


def test_a_suite_comes_from_the_archive_of_its_own_kind():
    entries = apt_sources.parse_deb822(DEB822)
    for suite, uri in [
        ("sid", MIRROR),
        ("trixie", MIRROR),
        ("bookworm-backports", MIRROR),
        ("bookworm-security", SECURITY),
        ("trixie-security", SECURITY),
    ]:
        entry = apt_sources.archive_for(suite, "bookworm", entries)
        assert (entry.uri, entry.suite, entry.components) == (uri, suite, ("main",))
        assert entry.signed_by == "/usr/share/keyrings/some-keyring.gpg"


def test_a_third_party_repository_named_after_the_release_is_not_the_archive():
    entries = apt_sources.parse_one_line(
        "deb http://thirdparty.invalid/linux bookworm stable\n"
    ) + apt_sources.parse_deb822(DEB822)
    assert apt_sources.archive_for("sid", "bookworm", entries).uri == MIRROR


def test_no_archive_for_the_release_is_a_host_error():
    with pytest.raises(HostError, match="no archive for noble"):
        apt_sources.archive_for("noble-updates", "noble", apt_sources.parse_deb822(DEB822))


def test_system_suites_of_a_release_newest_uploads_first():
    entries = apt_sources.parse_one_line(
        "deb http://u.invalid/ubuntu noble main\ndeb http://u.invalid/ubuntu noble-updates main\n"
        "deb http://s.invalid/ubuntu noble-security main\ndeb http://o.invalid/x nodistro main\n"
    )
    assert apt_sources.system_suites("noble", entries) == ["noble-security", "noble-updates", "noble"]


def test_the_private_archive_reads_the_configuration_apt_config_names(tmp_path, monkeypatch):
    """Through APT_CONFIG, as apt itself would: sources.list.d's deb822 file, and a one-line sources.list."""
    monkeypatch.setenv("RDNA1_KMGR_CACHE", str(tmp_path / "cache"))
    apt_config(
        tmp_path,
        monkeypatch,
        "deb [trusted=yes] file:///srv/ubuntu noble main restricted\n",
        {"debian.sources": DEB822, "ignored.list.disabled": "deb http://no.invalid/x bookworm main\n"},
    )
    assert apt_sources.config_paths()[0] == tmp_path / "etc-apt" / "sources.list"
    assert (
        debian_archive.PrivateArchive("sid", "bookworm").sources_line()
        == f"deb [signed-by=/usr/share/keyrings/some-keyring.gpg] {MIRROR} sid main"
    )
    assert (
        debian_archive.PrivateArchive("bookworm-security", "bookworm").sources_line()
        == f"deb [signed-by=/usr/share/keyrings/some-keyring.gpg] {SECURITY} bookworm-security main"
    )
    assert (
        debian_archive.PrivateArchive("noble-updates", "noble").sources_line()
        == "deb [trusted=yes] file:///srv/ubuntu noble-updates main"
    )


def test_the_systems_real_sources_give_the_uri_apt_itself_uses():
    """On this machine: the private archive for the system's security suite asks the URI apt's own lists
    come from (whatever mirror or proxy host that is)."""
    policy = subprocess.run(["apt-cache", "policy"], capture_output=True, text=True).stdout
    found = re.search(r"^\s*\d+ (\S+) (\S+)-security/main amd64 Packages", policy, re.M)
    if found is None:
        pytest.skip("the system's apt lists have no -security suite")
    uri, codename = found.group(1), found.group(2)
    archive = debian_archive.PrivateArchive(f"{codename}-security", codename)
    assert archive.entry.uri == uri.rstrip("/")
