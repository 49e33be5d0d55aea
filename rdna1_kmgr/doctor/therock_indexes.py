"""Where TheRock publishes its multi-arch Python packages, by channel and by the date a build was made.

Read from ROCm/TheRock at 89553ce3 (2026-08-22): build_tools/setup_venv.py (the index of each channel, lines
57-59), build_tools/github_actions/s3_buckets.py (the buckets and their URLs, lines 96 and 229-232),
RELEASES.md (the multi-arch index, line 107; `pip install --index-url ... "torch[device-gfx<N>]"`, lines
307 and 354-355) and docs/packaging/versioning.md (the version of each channel, lines 128 and 159).

- TheRock #7547 (4d76ea1a, 2026-08-22) moved publishing to one host per stream, `https://<stream>.repo.amd.com/
  rocm/whl-next/` (nightly, rc, dev, bkc; releases on `stable`). It deletes nothing and keeps the earlier
  multi-arch indexes as LEGACY_MULTI_ARCH_INDEX_URLS (publish_pytorch_to_release_bucket.py lines 45-51): a
  nightly built before the move stays where it was published, and nothing new is added there.
- The multi-arch indexes before it: the nightly one from #4912 (a497043ac), the release, prerelease and dev ones
  from #6550 (814a622d3, 2026-07-16).
- A nightly's version carries its date (`X.Y.ZaYYYYMMDD`, torch `2.11.0+rocm7.13.0a20260601`, a BKC build
  `...a20260811.bkc.20260813`), so its index is known exactly. A release, prerelease or dev version carries none:
  its line names the index of today first and the one before the move as an extra index, so that pip finds the
  build on either (#7547 left stable's promotion to its new index, #7351, for later); a line for a new install
  of those channels does the same.
- BKC builds got a stream of their own with the move; where they were published before it TheRock's docs do not
  say, so a line for one names today's BKC index.

docs/reference.md's table of indexes is made from TABLE (commands/reference.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date

THEROCK_COMMIT = "89553ce3"  # ROCm/TheRock, 2026-08-22: where TABLE was read
MOVE = date(2026, 8, 22)  # TheRock #7547


@dataclass(frozen=True)
class Index:
    """One pip index of one channel, for the builds published from `since` until the day before `until`."""

    channel: str  # release, prerelease, nightly, bkc, dev
    since: date
    until: date | None  # None: still published to
    url: str
    source: str  # where TheRock says so

    def holds(self, built: date) -> bool:
        return self.since <= built and (self.until is None or built < self.until)


TABLE = (
    Index(
        "nightly", date(2026, 4, 27), MOVE, "https://rocm.nightlies.amd.com/whl-multi-arch/", "RELEASES.md:107, #4912"
    ),
    Index("nightly", MOVE, None, "https://nightly.repo.amd.com/rocm/whl-next/", "build_tools/setup_venv.py:59, #7547"),
    Index("bkc", MOVE, None, "https://bkc.repo.amd.com/rocm/whl-next/", "s3_buckets.py:96,229-232, #7547"),
    Index("release", date(2026, 7, 16), MOVE, "https://repo.amd.com/rocm/whl-multi-arch/", "#6550 (814a622d3)"),
    Index("release", MOVE, None, "https://stable.repo.amd.com/rocm/whl-next/", "build_tools/setup_venv.py:57, #7547"),
    Index(
        "prerelease",
        date(2026, 7, 16),
        MOVE,
        "https://rocm.prereleases.amd.com/whl-multi-arch/",
        "#6550 (814a622d3)",
    ),
    Index("prerelease", MOVE, None, "https://rc.repo.amd.com/rocm/whl-next/", "build_tools/setup_venv.py:58, #7547"),
    Index("dev", date(2026, 7, 16), MOVE, "https://rocm.devreleases.amd.com/whl-multi-arch/", "#6550 (814a622d3)"),
    Index("dev", MOVE, None, "https://dev.repo.amd.com/rocm/whl-next/", "s3_buckets.py:96,229-232, #7547"),
)
CHANNELS = tuple(dict.fromkeys(i.channel for i in TABLE))
_DATES = re.compile(r"(?<![0-9])(20[0-9]{2})([01][0-9])([0-3][0-9])(?![0-9])")


def built_on(version: str | None) -> date | None:
    """The date a nightly or BKC version names (the last one: a BKC build's own), None for one without."""
    found = _DATES.findall(version or "")
    if not found:
        return None
    try:
        return date(*(int(part) for part in found[-1]))
    except ValueError:
        return None


def indexes(channel: str, version: str | None = None) -> tuple[str, ...]:
    """The index URLs a pip line for `channel` names, the first as --index-url and the rest as
    --extra-index-url: the one that held a dated build; for a new nightly, today's; for the channels whose
    versions carry no date (release, prerelease, dev), today's and then the one before the move, where a build
    may still be and where TheRock promoted to until then."""
    rows = [i for i in TABLE if i.channel == channel]
    built = built_on(version) if version else None
    if built is not None:
        held = [i.url for i in rows if i.holds(built)]
        if held:
            return tuple(held)
    current = [i.url for i in rows if i.until is None]
    dated = channel in ("nightly", "bkc")
    return tuple(current + ([] if dated else [i.url for i in rows if i.until is not None]))


def markdown_table() -> list[str]:
    """The table for docs/reference.md."""
    lines = ["| channel | builds published | index | TheRock says so in |", "|---|---|---|---|"]
    for i in TABLE:
        when = f"{i.since} to {i.until}" if i.until else f"since {i.since}"
        lines.append(f"| {i.channel} | {when} | `{i.url}` | {i.source} |")
    return lines
