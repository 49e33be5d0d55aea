"""Small file facts, and the one place files are written atomically: every record, system file and published
tree of the tool goes through write_atomic, move_into_place or publish_tree, and every JSON file through
write_json (tests/core/test_layout.py holds the rest of the package to it).

Atomic: a reader sees the old file or the new one, whole. Durable: once the call returns, a power cut keeps
the new one (file and directory fsynced) -- the journal's promise that a step starts only once its backup and
intent are on disk rests on it."""

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks (an unstripped amdgpu.ko is ~350 MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a file created or renamed in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path) -> None:
    """mkdir -p, with every directory it creates made durable in its parent."""
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True)
        fsync_dir(folder.parent)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data`, atomically and durably, with `mode` whatever the umask."""
    tmp = path.with_name(f".{path.name}.rdna1-kmgr-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)  # the umask may have narrowed it
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def write_json(path: Path, value, indent: int | None = None, sort_keys: bool = False) -> None:
    """Replace `path` with `value` as JSON and a closing newline, through write_atomic. indent and sort_keys are
    json.dumps's: each kind of record keeps the layout its files already have on disk."""
    write_atomic(path, (json.dumps(value, indent=indent, sort_keys=sort_keys) + "\n").encode())


def move_into_place(made: Path, path: Path) -> None:
    """Rename a finished file (one another program wrote, or a restored backup) over `path`, durably; both in
    one file system."""
    os.replace(made, path)
    fsync_dir(path.parent)


def link_in_place(original: Path, path: Path) -> None:
    """Make `path` a hard link to `original` (same file system) in one rename. For a tree still being staged:
    no fsync here, its publish_tree makes it durable."""
    temporary = path.with_name(f".{path.name}.link")
    os.link(original, temporary)
    os.replace(temporary, path)


def publish_tree(staged: Path, final: Path, keep_existing: bool = False) -> Path:
    """Rename a finished tree into place. keep_existing: a tree another process published first wins (the
    cache's entries are the same whoever made them); otherwise the old tree is removed first."""
    if keep_existing:
        try:
            os.rename(staged, final)
        except OSError as err:
            if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    else:
        if final.exists():
            shutil.rmtree(final)
        os.rename(staged, final)
    fsync_dir(final.parent)
    return final
