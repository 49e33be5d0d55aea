"""Whether a path root runs or loads could be changed by someone it does not trust.

A file is only as safe as every folder above it: whoever can write to a folder can rename the file away and put
their own in its place. So the file and each folder up to / must be owned by a trusted user and writable by no
group and no other. One exception: a folder root owns with the sticky bit (/tmp, /var/tmp) lets only an entry's
owner rename or remove that entry, so its being writable by all gives nobody a hold on what a trusted user keeps
there. Symbolic links on the way are checked where they are (their owner) and where they lead (the real path).
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path


def untrusted(path: str | Path, uids: frozenset[int]) -> str | None:
    """Why someone outside `uids` could change `path` (a file or a folder), in a few words naming the culprit
    folder; None when nobody can."""
    seen: set[Path] = set()
    for start in (Path(os.path.abspath(path)), Path(os.path.realpath(path))):
        for current in (start, *start.parents):
            if current in seen:
                continue
            seen.add(current)
            try:
                info = os.lstat(current)
            except OSError as err:
                return f"{current}: {err.strerror}"
            if info.st_uid not in uids:
                return f"{current} is owned by {user_name(info.st_uid)}"
            if stat.S_ISLNK(info.st_mode):
                continue  # a link's own mode means nothing; where it leads is the real path's check
            sticky = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX and info.st_uid == 0
            if info.st_mode & 0o022 and not sticky:
                who = "all users" if info.st_mode & 0o002 else "its group"
                return f"{current} is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
