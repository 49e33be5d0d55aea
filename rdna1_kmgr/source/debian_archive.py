"""Packages fetched from the system's own archive, for any suite, through a private apt configuration.

The system's apt sources stay untouched: each suite gets its own sources.list, package lists, cache and an
empty dpkg status under cache_dir()/apt/<suite>, so fetching one package from sid never adds sid to the
system. The archive is the one the system's apt already uses (apt_sources: its URI, keyring and trust come
from the system's entry for that suite, or for the release it extends; proxies from its apt.conf).
Authenticity comes from apt itself: the lists are checked against that entry's keyring (or the system's
trusted keys), and `apt-get download` checks the .deb against the lists.
"""

import grp
import os
import pwd
import re
import time
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import cache_entry, progress, runner
from rdna1_kmgr.core.errors import HostError, SourceError, UsageError
from rdna1_kmgr.core.files import sha256_file
from rdna1_kmgr.core.paths import cache_dir
from rdna1_kmgr.host import system_identity
from rdna1_kmgr.source import apt_sources

LISTS_MAX_AGE = 24 * 3600  # seconds; the archive changes daily at most for what we fetch

# Index files we never read; switched off so an update of sid's lists stays a few MB on any host
# (a desktop's apt.conf.d typically enables AppStream and command-not-found indexes).
_UNUSED_INDEXES = ("DEP-11", "DEP-11-icons", "DEP-11-icons-small", "DEP-11-icons-hidpi", "CNF", "Contents-deb")

_SUITE = re.compile(r"^[a-z][a-z0-9]*(-[a-z]+)?$")
_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
_VERSION = re.compile(r"^[0-9][A-Za-z0-9.+~:-]*$")


@dataclass(frozen=True)
class PackageFile:
    """One version of a binary package as the archive's lists describe it."""

    package: str
    version: str
    suite: str
    filename: str  # the file's name in the pool, e.g. linux-source-6.1_6.1.192-2_all.deb
    size: int
    sha256: str


class PrivateArchive:
    """apt configured for one suite of the system's archive only, with lists and cache of its own.

    `codename` is the release the system runs (default: its os-release's); a suite the system's sources do
    not list is asked of the archive that serves that release.
    """

    def __init__(self, suite: str, codename: str | None = None):
        if not _SUITE.fullmatch(suite):
            raise UsageError(f"invalid suite name {suite!r}", "a suite looks like bookworm or noble-updates")
        self.suite = suite
        self.codename = codename or system_identity.read().codename or suite.partition("-")[0]
        self.root = cache_dir() / "apt" / suite
        self._updated = False
        self._entry: apt_sources.SourceEntry | None = None

    # --- configuration -------------------------------------------------------------------------------------

    @property
    def entry(self) -> apt_sources.SourceEntry:
        """The system's archive for this suite (read once)."""
        if self._entry is None:
            self._entry = apt_sources.archive_for(self.suite, self.codename)
        return self._entry

    def sources_line(self) -> str:
        return apt_sources.sources_line(self.entry, keyring_file=self.root / "signed-by.asc")

    def apt_options(self) -> list[str]:
        options = {
            "Dir::Etc::sourcelist": self.root / "sources.list",
            "Dir::Etc::sourceparts": "-",
            "Dir::Etc::preferences": self.root / "preferences",  # never created: no pins
            "Dir::Etc::preferencesparts": self.root / "preferences.d",
            "Dir::State::Lists": self.root / "lists",
            "Dir::State::status": self.root / "status",  # empty: nothing counts as installed
            "Dir::Cache": self.root / "cache",
            # Named explicitly: a host may switch apt's binary caches off (Docker images do), and without them
            # every query re-reads the lists (a second or two for sid).
            "Dir::Cache::pkgcache": self.root / "cache" / "pkgcache.bin",
            "Dir::Cache::srcpkgcache": "",  # only an intermediate of pkgcache.bin: 50 MB for sid
            "Acquire::Languages": "none",
        }
        for target in _UNUSED_INDEXES:
            options[f"Acquire::IndexTargets::deb::{target}::DefaultEnabled"] = "false"
        return [arg for key, value in options.items() for arg in ("-o", f"{key}={value}")]

    def _write_config(self) -> bool:
        """Create the private tree; True when the sources changed (the lists are then stale)."""
        keyring = self.entry.signed_by
        if keyring and "\n" not in keyring and keyring.startswith("/") and not Path(keyring).is_file():
            raise HostError(
                f"the keyring {keyring} that the system's apt sources name is missing",
                f"reinstall the package that ships it (dpkg -S {keyring})",
            )
        for sub in ("lists/partial", "cache/archives/partial", "preferences.d"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "status").touch()
        embedded = apt_sources.embedded_key(self.entry)
        if embedded:
            (self.root / "signed-by.asc").write_text(embedded)
        sources = self.root / "sources.list"
        line = self.sources_line() + "\n"
        if sources.is_file() and sources.read_text() == line:
            return False
        sources.write_text(line)
        return True

    # --- lists ---------------------------------------------------------------------------------------------

    def update(self, max_age: float = LISTS_MAX_AGE) -> None:
        """Fetch the suite's package lists unless they are younger than `max_age` seconds."""
        if self._updated:
            return
        stamp = self.root / "updated"
        with cache_entry.exclusive(self.root.parent, self.suite):
            changed = self._write_config()
            fresh = stamp.is_file() and time.time() - stamp.stat().st_mtime < max_age
            if changed or not fresh:
                progress.say(f"updating package lists of {self.suite} from {self.entry.uri} (private, in {self.root})")
                self._apt_get(["-q", "--error-on=any", "update"], doing=f"updating the {self.suite} lists")
                stamp.touch()
        self._updated = True

    # --- queries -------------------------------------------------------------------------------------------

    def versions(self, package: str) -> list[str]:
        """Every version of `package` this suite has, highest first (apt's order)."""
        _check_package(package)
        self.update()
        out = self._apt_cache(["madison", package])
        return [line.split("|")[1].strip() for line in out.splitlines() if line.count("|") >= 2]

    def candidate(self, package: str) -> str | None:
        """The version apt would pick from this suite alone (its newest), or None when it has none."""
        _check_package(package)
        self.update()
        match = re.search(r"^\s*Candidate:\s*(\S+)", self._apt_cache(["policy", package]), re.M)
        return None if match is None or match.group(1) == "(none)" else match.group(1)

    def fields(self, package: str, version: str | None = None) -> dict[str, str]:
        """The archive's record of `package` (its candidate unless `version` is given)."""
        version = self._version_or_candidate(package, version)
        out = self._apt_cache(["show", f"{package}={version}"])
        return parse_record(out)

    def package_file(self, package: str, version: str | None = None) -> PackageFile:
        record = self.fields(package, version)
        try:
            return PackageFile(
                package=record["Package"],
                version=record["Version"],
                suite=self.suite,
                filename=Path(record["Filename"]).name,
                size=int(record["Size"]),
                sha256=record["SHA256"],
            )
        except (KeyError, ValueError) as err:
            raise HostError(f"apt's record of {package} in {self.suite} lacks {err}", "run again later") from None

    # --- download ------------------------------------------------------------------------------------------

    def download(self, package: str, version: str | None = None) -> Path:
        """The .deb of `package` (candidate or `version`) in cache_dir()/debs, fetched unless already there."""
        wanted = self.package_file(package, version)
        debs = cache_dir() / "debs"
        final = debs / wanted.filename
        with cache_entry.exclusive(debs, wanted.filename):
            if deb_matches(final, wanted):
                return final
            size = f"{wanted.size / 1e6:.1f} MB" if wanted.size >= 1e5 else f"{wanted.size / 1e3:.1f} kB"
            progress.say(f"downloading {wanted.package} {wanted.version} ({size}) from {self.suite}")
            with cache_entry.staging(debs, wanted.package) as tmp:
                _let_apt_sandbox_write(tmp)
                self._apt_get(
                    ["download", f"{wanted.package}={wanted.version}"],
                    cwd=tmp,
                    doing=f"downloading {wanted.package} {wanted.version}",
                    show_output=True,
                )
                got = list(tmp.glob("*.deb"))
                if len(got) != 1 or not deb_matches(got[0], wanted):
                    raise HostError(
                        f"apt-get download of {wanted.package} {wanted.version} gave no matching .deb",
                        "run again; the mirror may be mid-sync",
                    )
                return cache_entry.publish(got[0], final)

    # --- running apt ---------------------------------------------------------------------------------------

    def _version_or_candidate(self, package: str, version: str | None) -> str:
        if version is None:
            found = self.candidate(package)
            if found is None:
                raise SourceError(f"{self.suite} has no package {package}", "check the name and the suite")
            return found
        check_debian_version(version)
        if version not in self.versions(package):
            raise SourceError(
                f"{self.suite} has no {package} {version}",
                f"it has: {', '.join(self.versions(package)) or 'no version at all'}",
            )
        return version

    def _apt_cache(self, args: list[str]) -> str:
        proc = runner.run(["apt-cache", *self.apt_options(), *args], timeout=300, check=False)
        if proc.returncode != 0:
            raise HostError(
                f"apt-cache {args[0]} failed for {self.suite}: {runner.last_line(proc.stderr)}",
                f"remove {self.root} to start the private archive afresh",
            )
        return proc.stdout

    def _apt_get(self, args: list[str], doing: str, cwd: Path | None = None, show_output: bool = False) -> None:
        run_apt(["apt-get", *self.apt_options(), *args], doing, cwd=cwd, show_output=show_output)


def run_apt(
    command: list[str],
    doing: str,
    cwd: Path | None = None,
    show_output: bool = False,
    env: dict[str, str] | None = None,
    hint: str = "check network access to the archive your apt sources name and run again",
) -> None:
    """Run an apt program; its errors become a HostError. With show_output its progress lines (Get:,
    Fetched) go to stderr as they come."""

    def forward(line: str) -> None:
        if line.strip():
            progress.say(line)

    result = runner.run(command, cwd=cwd, env=env, timeout=3600, check=False, on_line=forward if show_output else None)
    if result.returncode != 0:
        raise HostError(f"{doing} failed: {runner.last_line(result.stderr)}", hint)


def current_kernel_abi(suite: str, flavour: str = "amd64") -> str:
    """The kernel release the suite's headers metapackage points to today, e.g. "6.1.0-56-amd64"."""
    meta = f"linux-headers-{flavour}"
    depends = PrivateArchive(suite).fields(meta).get("Depends", "")
    match = re.search(rf"\blinux-headers-([0-9][^\s,()|]*-{re.escape(flavour)})\b", depends)
    if match is None:
        raise SourceError(f"{meta} in {suite} names no kernel headers package", f"its Depends is {depends!r}")
    return match.group(1)


def deb_matches(path: Path, wanted: PackageFile) -> bool:
    """True when `path` is exactly the file the archive describes (size, then SHA-256)."""
    if not path.is_file() or path.stat().st_size != wanted.size:
        return False
    return sha256_file(path) == wanted.sha256


def parse_record(text: str) -> dict[str, str]:
    """The first stanza of deb822 text (apt-cache show): field -> value, continuation lines joined."""
    record: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if not line.strip():
            if record:
                break
            continue
        if line[0] in " \t" and key:
            record[key] += "\n" + line.strip()
        elif ":" in line:
            key, value = line.split(":", 1)
            record[key] = value.strip()
    return record


def _check_package(name: str) -> None:
    if not _PACKAGE.fullmatch(name):
        raise UsageError(f"invalid Debian package name {name!r}", "e.g. linux-source-6.1")


def check_debian_version(version: str) -> str:
    """A Debian version from the user, before it reaches a command line or a path (it never holds a /)."""
    if not _VERSION.fullmatch(version):
        raise UsageError(f"invalid Debian version {version!r}", "e.g. 6.1.192-2")
    return version


def _let_apt_sandbox_write(folder: Path) -> None:
    """apt downloads as the unprivileged _apt user when it can; let that user write the folder."""
    if os.geteuid() != 0:
        return
    try:
        os.chown(folder, pwd.getpwnam("_apt").pw_uid, grp.getgrnam("root").gr_gid)
    except KeyError:
        pass  # no _apt user: apt downloads as root and says so
