"""rdna1_kmgr.source.fedora_srpm on a small SRPM shaped like Fedora's kernel SRPM, built at test time with
Debian's rpm tools (rpmbuild -bs) from real kernel files of the Debian source the suite already fetched: the
upstream-style tarball (Source0, only a few real amd files and the top Makefile) and a git-style
patch-X.Y-redhat.patch (Patch1) that changes one amd file and one file outside the subset."""

import difflib
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from rdna1_kmgr.core.errors import SourceError
from rdna1_kmgr.source import fedora_srpm, kernel_source

pytestmark = pytest.mark.skipif(
    shutil.which("rpmbuild") is None or shutil.which("rpm2cpio") is None,
    reason="needs rpmbuild and rpm2cpio (apt install rpm rpm2cpio)",
)

AMD_FILES = (
    "drivers/gpu/drm/amd/amdgpu/gmc_v10_0.c",
    "drivers/gpu/drm/amd/amdgpu/amdgpu_drv.c",
    "drivers/gpu/drm/amd/amdkfd/kfd_crat.c",
)
FEDORA_LINE = "/* Fedora: a change of Fedora's own, carried by patch-X.Y-redhat.patch */"


def git_section(rel: str, before: str, after: str) -> str:
    diff = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{rel}", f"b/{rel}"
    )
    return f"diff --git a/{rel} b/{rel}\nindex 3b18e1f..9c2d7a4 100644\n" + "".join(diff)


def make_srpm(real_tree: Path, work: Path, name: str = "kernel", patch_fits: bool = True) -> tuple[Path, str]:
    version = str(kernel_source.kernel_version(real_tree))
    top = work / f"linux-{version}"
    for rel in ("Makefile", *AMD_FILES):
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(real_tree / rel, top / rel)
    sources = work / "rpm" / "SOURCES"
    sources.mkdir(parents=True)
    with tarfile.open(sources / f"linux-{version}.tar.xz", "w:xz", preset=1) as tar:
        tar.add(top, arcname=top.name)
    gmc = (top / AMD_FILES[0]).read_text()
    lines = gmc.splitlines(keepends=True)
    changed = "".join(lines[:3] + [FEDORA_LINE + "\n"] + lines[3:])
    if not patch_fits:
        gmc = gmc.replace(lines[1], "a line this tree does not have\n")
    series = ".".join(version.split(".")[:2])
    patch = git_section(AMD_FILES[0], gmc, changed) + git_section(
        "init/Kconfig", 'config FOO\n\tbool "foo"\n', 'config FOO\n\tbool "foo, Fedora\'s way"\n'
    )
    (sources / f"patch-{series}-redhat.patch").write_text(patch)
    spec = work / "rpm" / "kernel.spec"
    spec.write_text(f"""Name: {name}
Version: {version}
Release: 301.fc41
Summary: The Linux kernel (test SRPM shaped like Fedora's)
License: GPL-2.0-only
Source0: linux-{version}.tar.xz
Patch1: patch-{series}-redhat.patch

%description
Test fixture: real kernel files in the layout of Fedora's kernel SRPM.

%prep
%setup -q -n linux-{version}
%patch 1 -p1
""")
    subprocess.run(
        ["rpmbuild", "-bs", "--define", f"_topdir {work / 'rpm'}", str(spec)], check=True, capture_output=True
    )
    return next((work / "rpm" / "SRPMS").glob("*.src.rpm")), version


def test_fedora_srpm_unpacks_the_tarball_subset_with_fedoras_patch(real_source_61, tmp_path):
    srpm, version = make_srpm(real_source_61, tmp_path / "work")
    assert srpm.name == f"kernel-{version}-301.fc41.src.rpm"
    assert fedora_srpm.srpm_identity(srpm) == ("kernel", version, "301.fc41")
    tree = fedora_srpm.unpack_srpm(srpm, tmp_path / "src")
    assert tree == tmp_path / "src" / f"{version}-301.fc41"
    assert str(kernel_source.kernel_version(tree)) == version
    gmc = (tree / AMD_FILES[0]).read_text()
    assert FEDORA_LINE in gmc and gmc.replace(FEDORA_LINE + "\n", "") == (real_source_61 / AMD_FILES[0]).read_text()
    for rel in AMD_FILES[1:]:
        assert (tree / rel).read_bytes() == (real_source_61 / rel).read_bytes()
    assert not (tree / "init").exists()  # outside the subset: not unpacked, its part of the patch not applied
    origin = kernel_source.source_origin(tree)
    assert origin["patched_files"] == [AMD_FILES[0]] and origin["rpm_version"] == f"{version}-301.fc41"
    assert origin["tarball"] == f"linux-{version}.tar.xz" and origin["patch"].endswith("-redhat.patch")
    assert fedora_srpm.unpack_srpm(srpm, tmp_path / "src") == tree  # reused


def test_fedora_srpm_whose_patch_does_not_fit_is_refused_and_leaves_nothing(real_source_61, tmp_path):
    srpm, version = make_srpm(real_source_61, tmp_path / "work", patch_fits=False)
    with pytest.raises(SourceError, match="applying patch-.*-redhat.patch to the amd subset failed"):
        fedora_srpm.unpack_srpm(srpm, tmp_path / "src")
    assert [p.name for p in (tmp_path / "src").iterdir() if not p.name.startswith(".")] == []


def test_fedora_srpm_of_another_package_is_refused(real_source_61, tmp_path):
    srpm, _ = make_srpm(real_source_61, tmp_path / "work", name="kernel-tools")
    with pytest.raises(SourceError, match="is the source of kernel-tools, not of the kernel"):
        fedora_srpm.unpack_srpm(srpm, tmp_path / "src")


def test_fedora_kernel_release_names_its_srpm():
    kernel = fedora_srpm.fedora_kernel("6.11.4-301.fc41.x86_64")
    assert kernel.nvr == "kernel-6.11.4-301.fc41"
    assert kernel.download_command() == ["dnf", "download", "--source", "kernel-6.11.4-301.fc41"]
    assert fedora_srpm.fedora_kernel("6.1.0-56-amd64") is None


def _tiny_srpm(work: Path) -> Path:
    """A source RPM with nothing of the kernel in it: what `rpm -K` reads is the same."""
    spec = work / "tiny.spec"
    spec.write_text("Name: kernel\nVersion: 6.1.0\nRelease: 1\nSummary: t\nLicense: GPL\n%description\nt\n%files\n")
    subprocess.run(
        ["rpmbuild", "-bs", "--define", f"_topdir {work / 'rpm'}", str(spec)], check=True, capture_output=True
    )
    return next((work / "rpm/SRPMS").glob("*.src.rpm"))


def test_an_srpm_rpm_cannot_verify_is_refused_and_an_unsigned_one_said(tmp_path):
    """Issue 40, M2: Fedora's SRPM is checked with `rpm -K`; a flipped byte is refused before anything is
    unpacked, and one no key vouches for is said so."""
    srpm = _tiny_srpm(tmp_path)
    assert "is not signed" in fedora_srpm.check_signature(srpm)
    data = bytearray(srpm.read_bytes())
    data[-100] ^= 0xFF
    srpm.write_bytes(bytes(data))
    with pytest.raises(SourceError, match="does not verify"):
        fedora_srpm.check_signature(srpm)
    with pytest.raises(SourceError, match="does not verify"):
        fedora_srpm.unpack_srpm(srpm, tmp_path / "src")
    assert not (tmp_path / "src").exists() or not any((tmp_path / "src").iterdir())
