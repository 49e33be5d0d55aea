"""Reading, as root, files a user could have put there: the owner's shell files, venvs and the libraries in them
(doctor, and the experiment's discovery of the owner's PyTorch).

Such a file may be a link to a file only root may read (/etc/shadow, the MOK key), a FIFO that blocks the reader
for ever, or far bigger than any real one. So every such read goes through `open_within`:

- the file's real path must stay inside `within` (the owner's home, or the venv it belongs to): a link is
  followed only as far as that folder (a ~/.bashrc linked into ~/dotfiles is read, one linked to /etc is not);
- the real path is opened with O_NOFOLLOW, and the folder of the file descriptor got is checked again, so a link
  swapped in between the check and the open is not followed either;
- it must be a regular file (O_NONBLOCK: a FIFO is refused, not waited on);
- `read_text` refuses a file over its kind's cap whole; `read_head` reads no more than the cap.

A refusal is a `Refused` (an OSError: callers that already skip an unreadable file skip it, with its reason).
`within=None` is for root's own files (the system's /etc, /opt/rocm): the same checks, no folder to stay in.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

SHELL_FILE = 64 * 1024  # a ~/.bashrc, /etc/profile.d/*.sh, environment.d's .conf
PYTHON_FILE = 64 * 1024  # torch/version.py: a dozen lines
METADATA_HEAD = 64 * 1024  # a dist-info's METADATA: its headers come first; the long description is not read

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class Refused(OSError):
    """A file a user could have planted that is not read: it leads out of its folder, is no regular file or is
    too big. str() is the one line that says which and why."""


def open_within(path: str | Path, within: str | Path | None) -> int:
    """A read-only descriptor of the regular file `path`, whose real path is inside `within`; Refused or
    another OSError otherwise."""
    real = os.path.realpath(path)
    folder = os.path.realpath(within) if within is not None else None
    if folder is not None and not _inside(real, folder):
        raise Refused(f"{path} leads to {real}, out of {within}: not read")
    fd = os.open(real, _FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused(f"{path} is not a regular file: not read")
        opened = os.readlink(f"/proc/self/fd/{fd}")
        if folder is not None and not _inside(opened, folder):
            raise Refused(f"{path} was moved out of {within} while it was opened: not read")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_binary(path: str | Path, within: str | Path | None):
    """open_within as a binary file object (for mmap, seek and read)."""
    return os.fdopen(open_within(path, within), "rb")


def read_head(path: str | Path, within: str | Path | None, limit: int) -> bytes:
    """At most the first `limit` bytes of the file."""
    with open_binary(path, within) as handle:
        return handle.read(limit)


def read_text(path: str | Path, within: str | Path | None, limit: int) -> str:
    """The whole file as text (bad bytes replaced), or Refused when it is bigger than `limit` bytes."""
    data = read_head(path, within, limit + 1)
    if len(data) > limit:
        raise Refused(f"{path} is over {limit // 1024} KiB, more than such a file holds: not read")
    return data.decode(errors="replace")


def leads_inside(path: str | Path, folder: str | Path) -> bool:
    """Whether `path`, its links followed, is `folder` or inside it (its links followed too)."""
    return _inside(os.path.realpath(path), os.path.realpath(folder))


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")
