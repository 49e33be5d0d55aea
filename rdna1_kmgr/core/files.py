"""Small file facts and durable writes shared by the cache, the journals and the module checks."""

import hashlib
import os
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
