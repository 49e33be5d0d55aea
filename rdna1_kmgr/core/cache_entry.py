"""Cache entries (a downloaded file, an unpacked tree) that exist complete or not at all.

An entry is built in a temporary sibling directory (same file system, so the final rename is atomic) and
renamed into place only when it is whole. Whatever goes wrong, an interrupt included, the sibling is removed.
A lock per entry makes a second process wait for the first instead of doing the same long work twice;
several test sessions and commands share one cache. The lock is the cache's, not the source stage's: the guest
kernels (vm/guest_kernel) and the kbuild trees a build fills (modbuild/module_build) are entries too.
"""

import fcntl
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rdna1_kmgr.core.files import move_into_place, publish_tree

STAGING_PREFIX = ".partial-"


@contextmanager
def exclusive(parent: Path, key: str) -> Iterator[None]:
    """Hold the lock named `key` in `parent` (waits for another holder)."""
    locks = parent / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{key}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def staging(parent: Path, tag: str) -> Iterator[Path]:
    """An empty temporary directory in `parent`, removed on exit with whatever was not published from it."""
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{tag}-", dir=parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(staged: Path, final: Path) -> Path:
    """Rename a finished file or tree into place; if a tree got there first (another process), keep that one."""
    if staged.is_dir():
        return publish_tree(staged, final, keep_existing=True)
    move_into_place(staged, final)
    return final
