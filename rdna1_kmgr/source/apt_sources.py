"""The archives the system's apt already uses, read from its own configuration.

Packages for a kernel come through the archive (mirror, proxy, keyring) the machine's apt is set up with,
extended with the suites that kernel needs: a private apt state (debian_archive.PrivateArchive) asks the
same base URI for another suite. Nothing here names an archive host: the URIs, their `signed-by` keyrings
and `trusted` flags come from the files `apt-config` points to (Dir::Etc::sourcelist, one-line format, and
Dir::Etc::sourceparts, *.list and deb822 *.sources). APT_CONFIG is honoured, since apt-config reads it.
Proxies and other Acquire settings need no copying: the private state overrides only Dir::* options, so
apt still reads the system's apt.conf and apt.conf.d.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from rdna1_kmgr.core import runner
from rdna1_kmgr.core.errors import HostError

_SUITE = re.compile(r"^[a-z][a-z0-9]*(-[a-z]+)?$")


@dataclass(frozen=True)
class SourceEntry:
    """One `deb URI SUITE COMPONENTS` of the system's sources (deb822 stanzas give one per URI and suite)."""

    uri: str
    suite: str
    components: tuple[str, ...]
    options: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    origin: str = ""  # the file it was read from

    @property
    def signed_by(self) -> str | None:
        return self.options.get("signed-by")

    @property
    def trusted(self) -> bool:
        return self.options.get("trusted", "").lower() == "yes"


def config_paths() -> tuple[Path, Path]:
    """(sources.list, sources.list.d) as the system's apt (and APT_CONFIG) resolves them."""
    out = runner.run(
        ["apt-config", "shell", "LIST", "Dir::Etc::sourcelist/f", "PARTS", "Dir::Etc::sourceparts/d"],
        timeout=30,
        hint="is apt installed?",
    ).stdout
    values = {}
    for line in out.splitlines():
        name, _, value = line.partition("=")
        words = shlex.split(value)
        values[name.strip()] = words[0] if words else ""
    return Path(values.get("LIST") or "/etc/apt/sources.list"), Path(values.get("PARTS") or "/etc/apt/sources.list.d")


def system_entries() -> list[SourceEntry]:
    """Every enabled binary (`deb`) entry of the system's apt sources, in apt's reading order."""
    sources_list, parts = config_paths()
    entries: list[SourceEntry] = []
    if sources_list.is_file():
        entries += parse_one_line(sources_list.read_text(errors="replace"), str(sources_list))
    if parts.is_dir():
        for path in sorted(parts.iterdir()):
            if path.suffix == ".list" and path.is_file():
                entries += parse_one_line(path.read_text(errors="replace"), str(path))
            elif path.suffix == ".sources" and path.is_file():
                entries += parse_deb822(path.read_text(errors="replace"), str(path))
    return entries


def parse_one_line(text: str, origin: str = "") -> list[SourceEntry]:
    """`deb [opt=value ...] URI SUITE COMPONENT...` lines; deb-src and comments are skipped."""
    entries = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("deb ") and not line.startswith("deb\t"):
            continue
        rest = line[3:].strip()
        options: dict[str, str] = {}
        if rest.startswith("["):
            inside, _, rest = rest[1:].partition("]")
            for word in inside.split():
                key, _, value = word.partition("=")
                options[key.lower()] = value
        words = rest.split()
        if len(words) >= 2:
            entries.append(SourceEntry(words[0].rstrip("/"), words[1], tuple(words[2:]), options, origin))
    return entries


def parse_deb822(text: str, origin: str = "") -> list[SourceEntry]:
    """deb822 stanzas (Types, URIs, Suites, Components, Signed-By, Trusted, Enabled)."""
    entries = []
    for stanza in _stanzas(text):
        if stanza.get("enabled", "yes").lower() == "no" or "deb" not in stanza.get("types", "").split():
            continue
        options = {}
        if "signed-by" in stanza:
            options["signed-by"] = stanza["signed-by"]
        if "trusted" in stanza:
            options["trusted"] = stanza["trusted"]
        components = tuple(stanza.get("components", "").split())
        for uri in stanza.get("uris", "").split():
            for suite in stanza.get("suites", "").split():
                entries.append(SourceEntry(uri.rstrip("/"), suite, components, options, origin))
    return entries


def _stanzas(text: str) -> list[dict[str, str]]:
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    key = None
    for line in text.splitlines() + [""]:
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                stanzas.append(current)
            current, key = {}, None
        elif line[0] in " \t" and key:
            # A continuation: an embedded key block keeps its lines (" ." is an empty one).
            current[key] += "\n" + ("" if line.strip() == "." else line.strip())
        elif ":" in line:
            key, value = line.split(":", 1)
            key = key.strip().lower()
            current[key] = value.strip()
    return stanzas


def archive_for(suite: str, codename: str, entries: list[SourceEntry] | None = None) -> SourceEntry:
    """The system's entry to ask for `suite`: one that lists it, else the one of the same pocket kind.

    A security suite (bookworm-security, noble-security) comes from the URI the system fetches
    `<codename>-security` from; every other suite (another release, -updates, -backports) from the URI of the
    release itself (`<codename>`), which is where the distribution keeps them.
    """
    if not _SUITE.fullmatch(suite):
        raise HostError(f"invalid suite name {suite!r}", "a suite looks like bookworm or noble-updates")
    entries = system_entries() if entries is None else entries
    wanted = [suite, f"{codename}-security"] if suite.endswith("-security") else [suite, codename]
    for name in wanted:
        listing = [e for e in entries if e.suite == name]
        # A third-party repository may name its suite after the release too; the distribution's has `main`.
        found = next((e for e in listing if "main" in e.components), listing[0] if listing else None)
        if found is not None:
            return SourceEntry(
                found.uri,
                suite,
                ("main",) if "main" in found.components or not found.components else found.components[:1],
                found.options,
                found.origin,
            )
    raise HostError(
        f"the system's apt sources list no archive for {wanted[-1]} (needed to reach {suite})",
        f"add the distribution's {wanted[-1]} suite to the apt sources (see `apt-cache policy`)",
    )


def system_suites(codename: str, entries: list[SourceEntry] | None = None) -> list[str]:
    """The system's own suites of release `codename` (noble, noble-updates, noble-security, ...), security
    first, then updates, then the release: newest uploads first."""
    entries = system_entries() if entries is None else entries
    names = []
    for entry in entries:
        if (entry.suite == codename or entry.suite.startswith(f"{codename}-")) and entry.suite not in names:
            names.append(entry.suite)
    order = {"security": 0, "updates": 1, "": 2}
    return sorted(names, key=lambda s: order.get(s.partition("-")[2], 3))


def sources_line(entry: SourceEntry, keyring_file: Path | None = None) -> str:
    """The one-line sources entry of the private state: the system entry's URI, key and trust, one suite."""
    options = []
    signed_by = entry.signed_by
    if signed_by and "\n" in signed_by:  # a key embedded in a deb822 stanza: apt reads it from a file
        if keyring_file is None:
            raise HostError(f"{entry.origin} embeds its key", "give the key as a file in Signed-By")
        options.append(f"signed-by={keyring_file}")
    elif signed_by:
        options.append(f"signed-by={signed_by}")
    if entry.trusted:
        options.append("trusted=yes")
    opts = f"[{' '.join(options)}] " if options else ""
    return f"deb {opts}{entry.uri} {entry.suite} {' '.join(entry.components)}"


def embedded_key(entry: SourceEntry) -> str | None:
    """The armoured key a deb822 stanza embeds in Signed-By, or None."""
    signed_by = entry.signed_by
    return signed_by + "\n" if signed_by and "\n" in signed_by else None
