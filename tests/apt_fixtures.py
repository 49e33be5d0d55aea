"""apt set-ups made at test time: a private APT_CONFIG naming sources files, and local file:// repositories
built with Debian's archive tools (dpkg-deb, apt-ftparchive from apt-utils).

APT_CONFIG is apt's own way to point every apt program (and apt-config) at another configuration; the
system's /etc/apt stays as it is.
"""

import shutil
import subprocess
from pathlib import Path

import pytest


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
