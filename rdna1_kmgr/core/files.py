"""Small file facts, and the one place files are written atomically: every record, system file and published
tree of the tool goes through write_atomic, move_into_place or publish_tree, and every JSON file through
write_json (tests/core/test_layout.py holds the rest of the package to it).

Atomic: a reader sees the old file or the new one, whole. Durable: once the call returns, a power cut keeps
the new one (file and directory fsynced) -- the journal's promise that a step starts only once its backup and
intent are on disk rests on it."""

import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import struct
from pathlib import Path

from rdna1_kmgr.core import paths


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
    """mkdir -p, with every directory it creates made durable in its parent. A folder inside a private root
    (state, logs: core.paths) is created 0700, root's alone; any other 0755."""
    private = [root for root in paths.private_roots() if path.is_relative_to(root)]
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        mode = 0o700 if any(folder.is_relative_to(root) for root in private) else 0o755
        folder.mkdir(mode=mode, exist_ok=True)
        os.chmod(folder, mode)  # the umask may have narrowed it
        fsync_dir(folder.parent)


# Creating a file never follows a link planted at its name, nor reuses a file someone made there first.
_CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def create_new(path: Path, mode: int = 0o600) -> int:
    """A new file at `path`, opened for writing with `mode` whatever the umask; FileExistsError when anything
    (a file, a link) is already there."""
    fd = os.open(path, _CREATE_NEW, mode)
    os.fchmod(fd, mode)
    return fd


def open_private_log(path: Path):
    """`path` opened for appending, 0600, never through a link (a log root's own files)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)  # an older file may be 0644
    return os.fdopen(fd, "a", buffering=1, encoding="utf-8")


# write_atomic's temporary file beside `path`: `.<name>.rdna1-kmgr-<16 hex digits>`
_TEMPORARY = ".{name}.rdna1-kmgr-{token}"
_TEMPORARY_TOKEN = re.compile(r"[0-9a-f]{16}")


# ext4's EXT4_IOC_CHECKPOINT, _IOW('f', 43, __u32) in include/uapi/linux/ext4.h (Linux 5.13 and later); flags 0
EXT4_IOC_CHECKPOINT = 0x4004662B


def checkpoint_journal(path: Path) -> bool:
    """Ask the file system holding `path` to write what its journal holds to where it belongs, and flush it
    there: a reader that does not replay the journal (GRUB reading grubenv and grub.cfg at power-on) then sees
    what the kernel sees. Without this, a power cut after a durable write can leave GRUB reading the old files.
    False where there is no such call (a file system other than ext4, a kernel before 5.13) or it is refused
    (not root): nothing more can be done there, and nothing was changed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.ioctl(fd, EXT4_IOC_CHECKPOINT, struct.pack("I", 0))
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def leftover_temporaries(path: Path) -> list[Path]:
    """write_atomic's temporary files beside `path` that a power cut left: created and fsynced, never renamed
    into place (a SIGKILL leaves them too). Regular files only, each name a full match of the pattern."""
    return regular_files_named(path.parent, f".{path.name}.rdna1-kmgr-", _TEMPORARY_TOKEN)


def regular_files_named(folder: Path, prefix: str, rest: re.Pattern[str]) -> list[Path]:
    """The regular files (no link, no folder) in `folder` whose name is `prefix` then a full match of `rest`,
    sorted; none when the folder is gone."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in sorted(names):
        if name.startswith(prefix) and rest.fullmatch(name[len(prefix) :]):
            candidate = folder / name
            if stat.S_ISREG(candidate.lstat().st_mode):
                found.append(candidate)
    return found


def write_atomic(path: Path, data: bytes, mode: int = 0o644, owner: tuple[int, int] | None = None) -> None:
    """Replace `path` with `data`, atomically and durably, with `mode` whatever the umask. The temporary file
    has an unguessable name and is created O_EXCL|O_NOFOLLOW: a link planted beside `path` is never written
    through, and a link at `path` is replaced, not followed. `owner` (uid, gid): the file is theirs (a file root
    writes for the user who ran sudo)."""
    for _ in range(8):
        tmp = path.with_name(_TEMPORARY.format(name=path.name, token=secrets.token_hex(8)))
        try:
            fd = create_new(tmp, mode)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary name", str(path.parent))
    try:
        with os.fdopen(fd, "wb") as out:
            if owner is not None:
                os.fchown(out.fileno(), *owner)
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def write_json(
    path: Path, value, indent: int | None = None, sort_keys: bool = False, owner: tuple[int, int] | None = None
) -> None:
    """Replace `path` with `value` as JSON and a closing newline, through write_atomic. indent and sort_keys are
    json.dumps's: each kind of record keeps the layout its files already have on disk."""
    write_atomic(path, (json.dumps(value, indent=indent, sort_keys=sort_keys) + "\n").encode(), owner=owner)


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
