"""Tiny kernels for the source tests: kernel trees, tarballs and linux-source .debs made with the real tar and
dpkg-deb, what a failed unpack left behind, and the `cache` fixture (a scratch RDNA1_KMGR_CACHE).

A helper module, not a test module: test_kernel_source, test_tarball_fetch and test_suite_search import from it.
"""

import subprocess
from pathlib import Path

import pytest

AMD = "drivers/gpu/drm/amd"


def write_tree(root: Path, version: str = "6.1.999") -> Path:
    """A kernel tree with a top Makefile for `version` (7.2-rc3 style for release candidates), a few amd files,
    and files outside the amd subset that must not be unpacked."""
    base, _, rc = version.partition("-")
    major, minor, *sub = base.split(".")
    files = {
        "Makefile": f"# SPDX-License-Identifier: GPL-2.0\nVERSION = {major}\nPATCHLEVEL = {minor}\n"
        f"SUBLEVEL = {sub[0] if sub else 0}\nEXTRAVERSION ={' -' + rc if rc else ''}\nNAME = Test\n",
        f"{AMD}/amdgpu/gmc_v10_0.c": "static void gmc_v10_0_get_vm_pte(void) {}\n",
        f"{AMD}/amdkfd/kfd_crat.c": "int kfd_create_vcrat_image_gpu(void) { return 0; }\n",
        f"{AMD}/include/amd_shared.h": "#define AMD 1\n",
        "include/linux/kernel.h": "/* the headers package provides include/ */\n",
        "drivers/gpu/drm/radeon/r100.c": "/* not amd */\n",
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def make_tarball(folder: Path, version: str = "6.1.999", compression: str = "-J", top: str | None = None) -> Path:
    """linux-<version>.tar.xz (or .gz/.bz2) with everything under one top folder, made by GNU tar."""
    top = top or f"linux-{version}"
    stage = folder / f"stage-{version}-{compression}"
    write_tree(stage / top, version)
    suffix = {"-J": "xz", "-z": "gz", "-j": "bz2"}[compression]
    tarball = folder / f"{top}.tar.{suffix}"
    subprocess.run(["tar", "-c", compression, "-f", str(tarball), "-C", str(stage), top], check=True)
    return tarball


def make_deb(
    folder: Path, series: str = "6.1", debian_version: str = "6.1.999-1", tree_version: str | None = None
) -> Path:
    """A linux-source-<series> .deb shaped like Debian's (usr/src/linux-source-<series>.tar.xz inside)."""
    package = f"linux-source-{series}"
    root = folder / f"deb-{debian_version}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: {debian_version}\nArchitecture: all\nMaintainer: Test <t@example.org>\n"
        "Description: test kernel source\n"
    )
    (root / "usr/src").mkdir(parents=True)
    stage = folder / f"tree-{debian_version}"
    write_tree(stage / package, tree_version or debian_version.rsplit("-", 1)[0])
    subprocess.run(["tar", "-cJf", str(root / f"usr/src/{package}.tar.xz"), "-C", str(stage), package], check=True)
    deb = folder / f"{package}_{debian_version}_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(root), str(deb)], check=True, capture_output=True)
    return deb


def leftovers(folder: Path) -> list[str]:
    """What a failed unpack or download left in a cache folder (the lock folder aside)."""
    return sorted(p.name for p in folder.iterdir() if p.name != ".locks") if folder.exists() else []


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("RDNA1_KMGR_CACHE", str(root))
    return root
