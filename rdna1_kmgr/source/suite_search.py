"""Which suites of the system's archive to search for a kernel's packages, and the search itself.

The suites come from the machine's own release: the platform record (host/platforms.toml) names the suites
of a release where the distribution keeps kernels (Debian: <codename>-security, <codename>, -updates,
-backports), searched first for the release the system's os-release names, then for the other releases the
record knows, then its other suites (sid). Each is asked through a private apt state (debian_archive), from
the archive the system's apt sources give for it (apt_sources.archive_for).

A suite whose lists cannot be fetched (a Release file past its validity, as sid's can be; a mirror without
that suite) is skipped with one warning line and the next one is asked: one unreachable suite must not hide
the kernel another one has. The search says which suites it asked and which it skipped, and why, so that the
error of a caller that found nothing names them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rdna1_kmgr.core import progress
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.host.system_identity import SystemIdentity
from rdna1_kmgr.source.debian_archive import PrivateArchive


@dataclass(frozen=True)
class Skipped:
    suite: str
    reason: str  # the apt error, one line


@dataclass(frozen=True)
class SearchResult:
    """Where a search found what it looked for (None: nowhere), and what it asked on the way."""

    archive: PrivateArchive | None
    searched: tuple[str, ...]  # the suites whose lists were read, in order
    skipped: tuple[Skipped, ...]

    def describe(self) -> str:
        """ "searched a, b; skipped c (why)" for an error line."""
        text = f"searched {', '.join(self.searched) or 'no suite'}"
        if self.skipped:
            text += "; skipped " + ", ".join(f"{s.suite} ({s.reason})" for s in self.skipped)
        return text


def suites_for(system: SystemIdentity) -> tuple[str, ...]:
    """The suites to search on `system`, most likely first (see the module's docstring)."""
    return tuple(system.platform.archive_suites(system.codename))


def search(suites: tuple[str, ...], codename: str | None, has: Callable[[PrivateArchive], bool]) -> SearchResult:
    """The first of `suites` (of release `codename`'s archive) for which `has` is true. A suite whose lists
    apt cannot update, or whose archive the system's sources do not give, is skipped with a warning."""
    searched: list[str] = []
    skipped: list[Skipped] = []
    for suite in suites:
        archive = PrivateArchive(suite, codename or None)
        try:
            archive.update()
        except HostError as err:
            skipped.append(Skipped(suite, err.what))
            progress.say(f"warning: skipping {suite}: {err.what}")
            continue
        searched.append(suite)
        if has(archive):
            return SearchResult(archive, tuple(searched), tuple(skipped))
    return SearchResult(None, tuple(searched), tuple(skipped))
