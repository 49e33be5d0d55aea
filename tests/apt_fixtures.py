"""apt set-ups made at test time: a private APT_CONFIG naming sources files, and local file:// repositories
built with Debian's archive tools (dpkg-deb, apt-ftparchive from apt-utils).

APT_CONFIG is apt's own way to point every apt program (and apt-config) at another configuration; the
system's /etc/apt stays as it is.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

from rdna1_kmgr.core import program_env


def apt_config(
    tmp_path: Path, monkeypatch=None, sources_list: str = "", parts: dict[str, str] | None = None, extra: str = ""
) -> Path:
    """APT_CONFIG pointing at tmp_path/etc-apt: sources.list with `sources_list`, sources.list.d with `parts`
    (set in the environment through monkeypatch when given; the path is returned either way)."""
    etc = tmp_path / "etc-apt"
    (etc / "sources.list.d").mkdir(parents=True, exist_ok=True)
    (etc / "sources.list").write_text(sources_list)
    for name, text in (parts or {}).items():
        (etc / "sources.list.d" / name).write_text(text)
    conf = etc / "apt.conf"
    conf.write_text(
        f'Dir::Etc::sourcelist "{etc}/sources.list";\nDir::Etc::sourceparts "{etc}/sources.list.d";\n' + extra
    )
    if monkeypatch is not None:
        monkeypatch.setenv("APT_CONFIG", str(conf))
        # root's programs get APT_CONFIG from no caller's environment (core/program_env.py): this in-process
        # test's apt reads the fixture's sources as though they were the system's
        monkeypatch.setattr(program_env, "KEPT", program_env.KEPT | {"APT_CONFIG"})
    return conf


def build_repository(root: Path, suite: str, debs: list[Path], component: str = "main", origin: str = "Ubuntu") -> Path:
    """An apt repository at `root` serving exactly `debs` as `suite`/`component` (amd64 and all); each suite
    has a pool of its own, so suites built into one root do not list each other's packages."""
    if shutil.which("apt-ftparchive") is None:
        pytest.skip("apt-ftparchive (apt-utils) is not installed: ./install.sh --test installs it")
    pool = root / "pool" / suite / component
    pool.mkdir(parents=True, exist_ok=True)
    for deb in debs:
        target = pool / deb.name
        if not target.exists():
            target.hardlink_to(deb) if deb.stat().st_dev == pool.stat().st_dev else shutil.copy2(deb, target)
    binary = root / "dists" / suite / component / "binary-amd64"
    binary.mkdir(parents=True, exist_ok=True)
    packages = subprocess.run(
        ["apt-ftparchive", "packages", f"pool/{suite}/{component}"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    (binary / "Packages").write_text(packages)
    release = subprocess.run(
        [
            "apt-ftparchive",
            "-o",
            f"APT::FTPArchive::Release::Origin={origin}",
            "-o",
            f"APT::FTPArchive::Release::Suite={suite}",
            "-o",
            f"APT::FTPArchive::Release::Codename={suite}",
            "-o",
            "APT::FTPArchive::Release::Architectures=amd64 all",
            "-o",
            f"APT::FTPArchive::Release::Components={component}",
            "release",
            f"dists/{suite}",
        ],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    (root / "dists" / suite / "Release").write_text(release)
    return root


def build_deb(staging: Path, out: Path, control: dict[str, str], compress: bool = True) -> Path:
    """dpkg-deb --build of `staging` (its files) with a DEBIAN/control made of `control` (data.tar left
    uncompressed with compress=False, for contents that are compressed already)."""
    (staging / "DEBIAN").mkdir(parents=True, exist_ok=True)
    (staging / "DEBIAN" / "control").write_text("".join(f"{k}: {v}\n" for k, v in control.items()))
    compression = ["-Zxz", "-z1"] if compress else ["-Znone"]
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", *compression, "--build", str(staging), str(out)],
        check=True,
        capture_output=True,
    )
    return out


# Debian 13's /etc/os-release (base-files 13.x; DEBIAN_VERSION_FULL is new in trixie).
DEBIAN_TRIXIE_OS_RELEASE = """PRETTY_NAME="Debian GNU/Linux 13 (trixie)"
NAME="Debian GNU/Linux"
VERSION_ID="13"
VERSION="13 (trixie)"
VERSION_CODENAME=trixie
DEBIAN_VERSION_FULL=13.2
ID=debian
HOME_URL="https://www.debian.org/"
SUPPORT_URL="https://www.debian.org/support"
BUG_REPORT_URL="https://bugs.debian.org/"
"""

# Debian 12's /etc/os-release.
DEBIAN_BOOKWORM_OS_RELEASE = """PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION="12 (bookworm)"
VERSION_CODENAME=bookworm
ID=debian
HOME_URL="https://www.debian.org/"
SUPPORT_URL="https://www.debian.org/support"
BUG_REPORT_URL="https://bugs.debian.org/"
"""


def trixie_sources(
    mirror: str, security: str, trust: str = "Signed-By: /usr/share/keyrings/debian-archive-keyring.pgp"
) -> str:
    """/etc/apt/sources.list.d/debian.sources as Debian 13's installer writes it (deb822: the release and
    -updates from the mirror, -security from the security archive, no backports), for the given URIs; `trust`
    is each stanza's key field (a local test repository: "Trusted: yes")."""
    return (
        f"Types: deb deb-src\nURIs: {mirror}\nSuites: trixie trixie-updates\nComponents: main non-free-firmware\n"
        f"{trust}\n\n"
        f"Types: deb deb-src\nURIs: {security}\nSuites: trixie-security\nComponents: main non-free-firmware\n"
        f"{trust}\n"
    )


def debian_sysroot(
    root: Path,
    os_release: str,
    release: str,
    sources_list: str = "",
    parts: dict[str, str] | None = None,
    monkeypatch=None,
    extra: str = "",
) -> Path:
    """A Debian system as rdna1-kmgr reads one: etc/os-release, its running kernel `release`, and its apt
    sources (etc/apt/sources.list, etc/apt/sources.list.d/`parts`). With monkeypatch, APT_CONFIG makes apt
    (and so apt_sources) read the sysroot's sources; `extra` is added to that apt.conf."""
    (root / "etc/apt/sources.list.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/os-release").write_text(os_release)
    (root / "etc/apt/sources.list").write_text(sources_list)
    for name, text in (parts or {}).items():
        (root / "etc/apt/sources.list.d" / name).write_text(text)
    (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/osrelease").write_text(release + "\n")
    conf = root / "apt.conf"
    conf.write_text(
        f'Dir::Etc::sourcelist "{root}/etc/apt/sources.list";\n'
        f'Dir::Etc::sourceparts "{root}/etc/apt/sources.list.d";\n' + extra
    )
    if monkeypatch is not None:
        monkeypatch.setenv("APT_CONFIG", str(conf))
    return root
