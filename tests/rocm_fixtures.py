"""Debian's own ROCm packages, unpacked once into the persistent test cache, for doctor's real tests.

Fetched from sid through rdna1_kmgr's private apt state (the system's sources stay untouched), each .deb
unpacked with `dpkg-deb -x` into <test cache>/rocm/<deb name>/ (~4.6 GB for the four; rocBLAS alone is 4 GB
of Tensile code objects). A test gets a sysroot of its own whose files are hard links into those trees.
Nothing of ROCm is committed: the fixture is made at test time from what apt downloads.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import _using_test_cache

from rdna1_kmgr.core import cache_entry
from rdna1_kmgr.source import debian_archive

SUITE = "sid"
# Package names as Debian sid has them (apt-cache search rocblas|miopen|amdhip|hipblaslt); the soname
# suffixes move with new upstream releases, so each entry lists the names tried in order.
PACKAGES = {
    "rocblas": ("librocblas4", "librocblas5"),
    "miopen": ("libmiopen1", "libmiopen2"),
    "hip": ("libamdhip64-6", "libamdhip64-7"),
    "hipblaslt": ("libhipblaslt1", "libhipblaslt0"),
}


def unpacked(names: tuple[str, ...]) -> Path:
    """The unpacked tree of the first of `names` sid has (downloaded and unpacked on first use)."""
    with _using_test_cache() as cache:
        archive = debian_archive.PrivateArchive(SUITE)
        name = next((n for n in names if archive.candidate(n)), None)
        if name is None:
            pytest.fail(f"Debian {SUITE} has none of {names} any more; update tests/rocm_fixtures.py")
        deb = archive.download(name)
        parent = cache / "rocm"
        final = parent / deb.stem
        with cache_entry.exclusive(parent, deb.stem):
            if not final.is_dir():
                with cache_entry.staging(parent, name) as tmp:
                    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp / "tree")], check=True)
                    cache_entry.publish(tmp / "tree", final)
        return final


@pytest.fixture(scope="session")
def debian_rocm() -> dict[str, Path]:
    """family -> the unpacked tree of Debian sid's package of it (rocblas, miopen, hip, hipblaslt)."""
    return {family: unpacked(names) for family, names in PACKAGES.items()}


def link_tree(source: Path, root: Path) -> None:
    """Hard-link every file of `source` into `root` (same file system as the cache; instant, no space)."""

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:  # another file system: copy instead
            shutil.copy2(src, dst)

    shutil.copytree(source, root, symlinks=True, copy_function=link, dirs_exist_ok=True)
