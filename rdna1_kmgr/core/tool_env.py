"""Every RDNA1_KMGR_* variable the tool reads: what it moves, and the check it passes first (issue 49).

Root's environment is the caller's (`su` keeps it whole, `sudo -E` nearly so), so none of these is trusted:

| variable | moves | check |
|---|---|---|
| RDNA1_KMGR_STATE, _CACHE, _LOG | the tool's roots (core/paths.py) | trust.check_root: root's, no link or g/o write |
| RDNA1_KMGR_DKMS_TREE, _DKMS_SOURCE_TREE | DKMS's trees (/var/lib/dkms, /usr/src) | the same check |
| RDNA1_KMGR_ROOT | the file system install, rollback and status act on (/) | the same check, and a folder |
| RDNA1_KMGR_TEST_ABORT_AFTER | nothing: a crash point for the killed-run tests | honoured in a test run only |
| RDNA1_KMGR_TEST_* | the tests' stand-in programs (a slow or failing update-initramfs) | passed on in a test run only |
| RDNA1_KMGR_CELL, RDNA1_KMGR_VFIO_RUN | set by the tool for its own children | never read from the caller |

A test run is one root set up: TEST_MARKER exists, a regular file of root's that nobody else can write, in a
folder of root's (tests/conftest.py makes it for the session and removes it after). Only then are the test
switches honoured and the programs the tool starts given TEST_PASSED and TEST_PREFIX's variables.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rdna1_kmgr.core.trust import check_root

TEST_MARKER = Path("/run/rdna1-kmgr-test-run")
STATE = "RDNA1_KMGR_STATE"
CACHE = "RDNA1_KMGR_CACHE"
LOG = "RDNA1_KMGR_LOG"
ABORT_AFTER = "RDNA1_KMGR_TEST_ABORT_AFTER"
DKMS_TREE = "RDNA1_KMGR_DKMS_TREE"
DKMS_SOURCE_TREE = "RDNA1_KMGR_DKMS_SOURCE_TREE"
ROOT = "RDNA1_KMGR_ROOT"
# What the programs the tool starts get in a test run only: the tests' apt configuration, their own TMPDIR (a
# user's TMPDIR would let them race root's temporary files), and their stand-ins' switches
TEST_PASSED = frozenset({"APT_CONFIG", "TMPDIR"})
TEST_PREFIX = "RDNA1_KMGR_TEST_"


def test_run() -> bool:
    """Whether root set up a test run: TEST_MARKER root's, a plain file, not a link, written by root alone."""
    try:
        marker = os.lstat(TEST_MARKER)
        folder = os.lstat(TEST_MARKER.parent)
    except OSError:
        return False
    return (
        stat.S_ISREG(marker.st_mode)
        and marker.st_uid == 0
        and not marker.st_mode & 0o022
        and folder.st_uid == 0
        and not folder.st_mode & 0o022
    )


def test_switch(name: str) -> str | None:
    """A test-only variable's value, in a test run; None anywhere else."""
    return os.environ.get(name) if test_run() else None


_checked: set[tuple[str, int]] = set()


def moved_root(name: str, default: str, check_default: bool = False) -> Path:
    """A folder the tool works under, moved by `name` when set: refused in one line unless it passes the check of
    the tool's own roots (core/trust.check_root), once a process and user; the default too with
    `check_default` (the tool's own roots: M4 of issue 40)."""
    value = os.environ.get(name)
    if not value and not check_default:
        return Path(default)
    path = Path(value or default)
    key = (str(path), os.geteuid())
    if key not in _checked:
        check_root(path, name)
        _checked.add(key)
    return path
