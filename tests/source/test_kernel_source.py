"""rdna1_kmgr.source.kernel_source: kernel versions, the amd subset unpacked from tarballs and .debs, --source.

Fast tests build tiny kernel tarballs and a tiny linux-source .deb with the real tar and dpkg-deb (URLs:
test_tarball_fetch.py); the real ones unpack Debian's linux-source-6.1 (see conftest.py).
"""

import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version
from source_fixtures import (
    AMD,
    cache,  # noqa: F401  (the fixture its tests name)
    leftovers,
    make_deb,
    make_tarball,
    write_tree,
)

from rdna1_kmgr.core.errors import SourceError, UsageError
from rdna1_kmgr.source import debian_archive, kernel_source, verification

# --- tiny kernels --------------------------------------------------------------------------------------------


def truncate(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


# --- versions ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version, expected",
    [
        ("6.1.192", "6.1.192"),
        ("6.12.95", "6.12.95"),
        ("7.2-rc3", "7.2.0rc3"),
        ("7.2.0", "7.2.0"),
    ],
)
def test_kernel_version_reads_the_top_makefile(tmp_path, version, expected):
    assert kernel_source.kernel_version(write_tree(tmp_path, version)) == Version(expected)


def test_an_rc_is_a_pre_release_of_its_version(tmp_path):
    rc3 = kernel_source.kernel_version(write_tree(tmp_path, "7.2-rc3"))
    assert rc3.is_prerelease and rc3.pre == ("rc", 3)
    assert Version("7.1.20") < rc3 < Version("7.2") == Version("7.2.0")


def test_a_custom_extraversion_is_kept_as_a_local_label(tmp_path):
    (tmp_path / "Makefile").write_text("VERSION = 6\nPATCHLEVEL = 1\nSUBLEVEL = 5\nEXTRAVERSION = -custom1\n")
    assert kernel_source.kernel_version(tmp_path) == Version("6.1.5+custom1")


@pytest.mark.parametrize("text", ["", "VERSION = 6\nSUBLEVEL = 1\n", "VERSION = six\nPATCHLEVEL = 1\nSUBLEVEL = 0\n"])
def test_a_makefile_without_a_version_is_refused(tmp_path, text):
    (tmp_path / "Makefile").write_text(text)
    with pytest.raises(SourceError, match="does not declare a kernel version"):
        kernel_source.kernel_version(tmp_path)


def test_a_folder_without_a_makefile_is_refused(tmp_path):
    with pytest.raises(SourceError, match=r"cannot read .*Makefile"):
        kernel_source.kernel_version(tmp_path)


@pytest.mark.parametrize(
    "given, expected",
    [
        ("6.1.192-2", "6.1.192"),
        ("6.1.192", "6.1.192"),
        ("6.12.95-1~bpo12+1", "6.12.95"),
        ("1:6.12.95-1", "6.12.95"),
        ("7.2~rc3-1~exp1", "7.2rc3"),
        ("7.2-rc3", "7.2rc3"),
    ],
)
def test_upstream_version_of_debian_and_plain_versions(given, expected):
    assert kernel_source.upstream_version(given) == Version(expected)


def test_upstream_version_refuses_nonsense():
    with pytest.raises(UsageError, match="invalid kernel version"):
        kernel_source.upstream_version("latest")


def test_debian_kernel_version_from_dpkg():
    """The headers of the current 6.1 kernel are installed on the test machine (headers_61 makes sure)."""
    installed = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${Version}\\n", "linux-headers-6.1.0-*-amd64"],
        capture_output=True,
        text=True,
    ).stdout.split()
    if not installed:
        pytest.skip("no 6.1 headers installed")
    krel = installed[0].removeprefix("linux-headers-")
    assert kernel_source.debian_kernel_version(krel) == installed[1]


def test_debian_kernel_version_from_proc_version():
    running = (
        "Linux version 6.1.0-56-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14) 12.2.0) "
        "#1 SMP PREEMPT_DYNAMIC Debian 6.1.192-2 (2026-11-16)\n"
    )
    assert kernel_source.debian_kernel_version("6.1.0-999-amd64", proc_version=running) == "6.1.192-2"
    assert (
        kernel_source.debian_kernel_version("6.18.44-fc", proc_version="Linux version 6.18.44-fc (builder) #1 SMP\n")
        is None
    )


def test_debian_13_kernel_version_from_proc_version():
    """Debian 13's kernels are named X.Y.Z+deb13-FLAVOUR; /proc/version names the package version after its
    compiler's own "(Debian 14.2.0-19)" (the format of trixie's 6.12 kernels' boot line)."""
    running = (
        "Linux version 6.12.118+deb13-amd64 (debian-kernel@lists.debian.org) (x86_64-linux-gnu-gcc-14 "
        "(Debian 14.2.0-19) 14.2.0, GNU ld (GNU Binutils for Debian) 2.44) #1 SMP PREEMPT_DYNAMIC "
        "Debian 6.12.118-1 (2026-11-02)\n"
    )
    version = kernel_source.debian_kernel_version("6.12.118+deb13-amd64", proc_version=running)
    assert version == "6.12.118-1"
    assert kernel_source.upstream_version(version) == Version("6.12.118")
    # trixie-backports' kernels: 7.3.4+bpo-amd64, package version 7.3.4-1~bpo13+1
    assert kernel_source.upstream_version("7.3.4-1~bpo13+1") == Version("7.3.4")


@pytest.mark.parametrize("bad", ["../../etc", "6.1.192-2/..", "-o", ""])
def test_a_malformed_debian_version_never_reaches_a_path(cache, bad):
    with pytest.raises(UsageError):
        kernel_source.fetch_debian_source(bad)
    assert not cache.exists()


def test_require_version_names_both_versions(tmp_path):
    tree = write_tree(tmp_path, "6.1.190")
    assert kernel_source.require_version(tree, "6.1.190-1") == Version("6.1.190")
    with pytest.raises(SourceError) as err:
        kernel_source.require_version(tree, "6.1.192-2")
    assert "6.1.190" in err.value.line() and "6.1.192" in err.value.line()


# --- unpacking -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["-J", "-z", "-j"])
def test_unpack_takes_only_the_makefile_and_the_amd_folder(tmp_path, cache, compression, capsys):
    tarball = make_tarball(tmp_path, "6.1.999", compression)
    tree = kernel_source.unpack_amd_subset(tarball)
    assert tree.parent == cache / "src"
    assert tree.name.startswith("6.1.999+sha256.")
    assert kernel_source.kernel_version(tree) == Version("6.1.999")
    assert (tree / AMD / "amdgpu/gmc_v10_0.c").is_file()
    assert (tree / AMD / "include/amd_shared.h").is_file()
    assert not (tree / "include").exists() and not (tree / "drivers/gpu/drm/radeon").exists()
    assert kernel_source.source_origin(tree)["sha256"] == hashlib.sha256(tarball.read_bytes()).hexdigest()
    assert f"unpacking drivers/gpu/drm/amd from {tarball.name}" in capsys.readouterr().err
    assert leftovers(cache / "src") == [tree.name]


def test_a_second_unpack_reuses_the_tree(tmp_path, cache, capsys):
    tarball = make_tarball(tmp_path)
    first = kernel_source.unpack_amd_subset(tarball)
    stamp = (first / "Makefile").stat().st_mtime_ns
    capsys.readouterr()
    assert kernel_source.unpack_amd_subset(tarball) == first
    assert (first / "Makefile").stat().st_mtime_ns == stamp
    assert "unpacking" not in capsys.readouterr().err


def test_a_point_release_source_shares_its_unchanged_files_with_the_one_unpacked_before(tmp_path, cache):
    """Issue 27: the same file in two releases' trees is one file on disk (a hard link), a changed one is not."""
    older = kernel_source.unpack_amd_subset(make_tarball(tmp_path, "6.1.998"))
    stage = tmp_path / "stage-newer"
    write_tree(stage / "linux-6.1.999", "6.1.999")
    changed = stage / "linux-6.1.999" / AMD / "amdgpu/gmc_v10_0.c"
    changed.write_text(changed.read_text() + "/* changed in the point release */\n")
    tarball = tmp_path / "linux-6.1.999.tar.xz"
    subprocess.run(["tar", "-c", "-J", "-f", str(tarball), "-C", str(stage), "linux-6.1.999"], check=True)
    newer = kernel_source.unpack_amd_subset(tarball)
    same = AMD + "/include/amd_shared.h"
    assert (newer / same).stat().st_ino == (older / same).stat().st_ino
    assert (newer / same).read_bytes() == (older / same).read_bytes()
    edited = AMD + "/amdgpu/gmc_v10_0.c"
    assert (newer / edited).stat().st_ino != (older / edited).stat().st_ino
    assert (newer / edited).read_text().endswith("/* changed in the point release */\n")
    assert kernel_source.kernel_version(newer) == Version("6.1.999")  # the Makefiles differ: not shared
    assert (newer / "Makefile").stat().st_ino != (older / "Makefile").stat().st_ino
    content = (older / same).read_bytes()
    shutil.rmtree(older)  # the older kernel's source goes: the newer's files stay whole
    assert (newer / same).read_bytes() == content


def test_an_rc_tarball_unpacks_under_its_pre_release_version(tmp_path, cache):
    tree = kernel_source.unpack_amd_subset(make_tarball(tmp_path, "7.2-rc3"))
    assert tree.name.startswith("7.2.0rc3+sha256.")
    assert kernel_source.kernel_version(tree).is_prerelease


def test_unpack_into_a_given_folder(tmp_path, cache):
    tree = kernel_source.unpack_amd_subset(make_tarball(tmp_path), tmp_path / "elsewhere")
    assert tree.parent == tmp_path / "elsewhere"
    assert not (cache / "src").exists()


def test_a_linux_source_deb_unpacks_under_its_debian_version(tmp_path, cache):
    deb = make_deb(tmp_path, "6.1", "6.1.999-2")
    tree = kernel_source.unpack_amd_subset(deb)
    assert tree == cache / "src" / "6.1.999-2"
    assert kernel_source.kernel_version(tree) == Version("6.1.999")
    assert (tree / AMD / "amdkfd/kfd_crat.c").is_file()
    assert not (tree / "include").exists()
    origin = kernel_source.source_origin(tree)
    assert (origin["package"], origin["debian_version"]) == ("linux-source-6.1", "6.1.999-2")
    assert kernel_source.fetch_debian_source("6.1.999-2") == tree  # found in the cache, no archive asked


def test_a_deb_whose_makefile_disagrees_with_its_version_is_refused(tmp_path, cache):
    deb = make_deb(tmp_path, "6.1", "6.1.999-1", tree_version="6.1.5")
    with pytest.raises(SourceError, match="Makefile says Linux 6.1.5"):
        kernel_source.unpack_amd_subset(deb)
    assert leftovers(cache / "src") == []


@pytest.mark.parametrize("kind", ["tarball", "deb"])
def test_a_truncated_archive_leaves_nothing_and_names_the_file(tmp_path, cache, kind):
    archive = truncate(make_tarball(tmp_path) if kind == "tarball" else make_deb(tmp_path))
    with pytest.raises(SourceError) as err:
        kernel_source.unpack_amd_subset(archive)
    assert str(archive) in err.value.line()
    assert leftovers(cache / "src") == []


def test_a_corrupt_tarball_leaves_nothing(tmp_path, cache):
    tarball = make_tarball(tmp_path)
    data = bytearray(tarball.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    tarball.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=str(tarball)):
        kernel_source.unpack_amd_subset(tarball)
    assert leftovers(cache / "src") == []


def test_a_file_that_is_no_archive_is_refused(tmp_path, cache):
    junk = tmp_path / "notes.txt"
    junk.write_text("hello\n" * 200)
    with pytest.raises(SourceError, match="neither a .deb nor a tar archive"):
        kernel_source.unpack_amd_subset(junk)


def test_a_tarball_without_the_amd_driver_is_refused(tmp_path, cache):
    (tmp_path / "t/linux-6.1.1").mkdir(parents=True)
    (tmp_path / "t/linux-6.1.1/Makefile").write_text("VERSION = 6\nPATCHLEVEL = 1\nSUBLEVEL = 1\n")
    tarball = tmp_path / "linux-6.1.1.tar.xz"
    subprocess.run(["tar", "-cJf", str(tarball), "-C", str(tmp_path / "t"), "linux-6.1.1"], check=True)
    with pytest.raises(SourceError, match=f"{tarball} has no linux-6.1.1/drivers/gpu/drm/amd"):
        kernel_source.unpack_amd_subset(tarball)
    assert leftovers(cache / "src") == []


def test_a_deb_of_another_package_is_refused(tmp_path, cache):
    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN/control").write_text(
        "Package: hello\nVersion: 1.0-1\nArchitecture: all\n" "Maintainer: T <t@example.org>\nDescription: x\n"
    )
    deb = tmp_path / "hello_1.0-1_all.deb"
    subprocess.run(["dpkg-deb", "-b", str(root), str(deb)], check=True, capture_output=True)
    with pytest.raises(SourceError, match="is hello, not a linux-source package"):
        kernel_source.unpack_amd_subset(deb)


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a file away: root only")
@pytest.mark.parametrize("attack", ["a file given to another user", "a folder others can write"])
def test_an_unpacked_tree_another_user_could_change_is_refused_before_a_signed_build(tmp_path, cache, attack):
    """Issue 40, M4: the tree is unpacked root-only (0700) and checked again right before the build that
    is signed; a file another user owns, or a folder others can write, could have been swapped since."""
    tree = kernel_source.unpack_amd_subset(make_tarball(tmp_path))
    assert stat.S_IMODE(tree.stat().st_mode) == 0o700
    verification.check_root_only(tree / AMD)  # as unpacked: root's alone
    victim = tree / AMD / "amdgpu/gmc_v10_0.c"
    if attack == "a file given to another user":
        os.chown(victim, 65534, 65534)
        why = f"{victim} is owned by uid 65534"
    else:
        victim.parent.chmod(0o777)
        why = f"{victim.parent} is writable by others"
    with pytest.raises(SourceError) as err:
        verification.check_root_only(tree / AMD)
    assert why in err.value.line() and "refusing to build and sign" in err.value.line()
    assert "\n" not in err.value.line()


# --- the --source option -------------------------------------------------------------------------------------


def test_an_unpacked_tree_is_used_where_it_is(tmp_path, cache):
    tree = write_tree(tmp_path / "linux")
    assert kernel_source.resolve_source_option(str(tree)) == tree.resolve()
    assert not cache.exists()


def test_a_tarball_path_is_unpacked_into_the_cache(tmp_path, cache):
    tarball = make_tarball(tmp_path, "6.12.999")
    tree = kernel_source.resolve_source_option(str(tarball))
    assert tree.parent == cache / "src" and kernel_source.kernel_version(tree) == Version("6.12.999")


def test_a_tarball_path_with_a_wrong_sha256_is_refused(tmp_path, cache):
    with pytest.raises(SourceError, match="expected " + "cd" * 32):
        kernel_source.resolve_source_option(str(make_tarball(tmp_path)), sha256="CD" * 32)
    assert leftovers(cache / "src") == []


def test_a_missing_path_is_a_usage_error(tmp_path, cache):
    with pytest.raises(UsageError, match="no such file or folder"):
        kernel_source.resolve_source_option(str(tmp_path / "nope"))


def test_a_folder_without_amdgpu_is_refused(tmp_path, cache):
    (tmp_path / "Makefile").write_text("VERSION = 6\nPATCHLEVEL = 1\nSUBLEVEL = 1\nEXTRAVERSION =\n")
    with pytest.raises(SourceError, match="has no drivers/gpu/drm/amd/amdgpu"):
        kernel_source.resolve_source_option(str(tmp_path))


# --- Debian's real source ------------------------------------------------------------------------------------


def test_real_debian_61_source(real_source_61, persistent_cache, monkeypatch):
    """Downloaded from bookworm-security and unpacked through rdna1_kmgr (conftest's real_source_61)."""
    origin = kernel_source.source_origin(real_source_61)
    assert origin["package"] == "linux-source-6.1"
    assert kernel_source.kernel_version(real_source_61) == kernel_source.upstream_version(origin["debian_version"])
    assert (real_source_61 / AMD / "amdgpu/gmc_v10_0.c").is_file()
    assert (real_source_61 / AMD / "amdkfd/kfd_crat.c").is_file()
    assert not (real_source_61 / "include").exists()
    # A second request costs nothing: the unpacked tree is found without the archive or the .deb.
    monkeypatch.setattr(
        debian_archive.PrivateArchive,
        "download",
        lambda *args, **kwargs: pytest.fail("the cached source was downloaded again"),
    )
    assert kernel_source.fetch_debian_source(origin["debian_version"]) == real_source_61
    # Issue 27: once unpacked, the downloaded .deb is gone (only the unpacked amd subset stays on disk).
    assert not list((persistent_cache / "debs").glob(f"linux-source-6.1_{origin['debian_version']}_*.deb"))


def test_fetch_kernel_source_of_an_installed_debian_kernel(real_source_61, persistent_cache):
    version = kernel_source.source_origin(real_source_61)["debian_version"]
    krel = debian_archive.current_kernel_abi("bookworm-security")
    if kernel_source.debian_kernel_version(krel) != version:
        pytest.skip(f"linux-headers-{krel} is not installed here (the headers_61 fixture installs it)")
    assert kernel_source.fetch_kernel_source(krel) == real_source_61


def test_a_kernel_debian_did_not_build_needs_source(cache):
    with pytest.raises(SourceError) as err:
        kernel_source.fetch_kernel_source("6.18.44-nodebian")
    assert "kernel 6.18.44-nodebian is not a Debian kernel" in err.value.line() and "--source" in err.value.line()


def test_debian_source_for_finds_the_suite(real_source_61, persistent_cache):
    version = kernel_source.source_origin(real_source_61)["debian_version"]
    found = kernel_source.debian_source_for(version)
    assert (found.package, found.version, found.suite) == ("linux-source-6.1", version, "bookworm-security")


def test_a_version_debian_no_longer_has_points_to_kernel_org(persistent_cache):
    with pytest.raises(SourceError) as err:
        kernel_source.debian_source_for("6.1.1-1")
    assert "linux-source-6.1 6.1.1-1" in err.value.line()
    assert "https://cdn.kernel.org/pub/linux/kernel/v6.x/linux-6.1.1.tar.xz" in err.value.line()


def test_real_612_and_72_sources(real_source_612, real_source_72):
    assert kernel_source.kernel_version(real_source_612).release[:2] == (6, 12)
    assert kernel_source.kernel_version(real_source_72).release[:2] == (7, 2)
    for tree in (real_source_612, real_source_72):
        assert (tree / AMD / "amdgpu/gmc_v10_0.c").is_file()
        assert (tree / AMD / "amdxcp").is_dir()  # newer kernels' extra amd folder comes along


def test_removing_a_linux_versions_sources_keeps_the_others_and_their_shared_files(tmp_path):
    """Every Debian revision of the Linux version goes; a tree of another version keeps the files unpacking
    shared with them (hard links), and a folder unpacking did not make is not touched."""
    src = tmp_path / "src"
    trees = {}
    for name, linux in (("6.1.192-1", "6.1.192"), ("6.1.192-2", "6.1.192"), ("6.12.95-1~bpo12+1", "6.12.95")):
        tree = trees[name] = src / name
        (tree / "drivers").mkdir(parents=True)
        (tree / kernel_source.ORIGIN_FILE).write_text(f'{{"kernel_version": "{linux}", "debian_version": "{name}"}}')
    (trees["6.12.95-1~bpo12+1"] / "drivers" / "regs.h").write_text("#define REG 1\n")
    (trees["6.1.192-2"] / "drivers" / "regs.h").hardlink_to(trees["6.12.95-1~bpo12+1"] / "drivers" / "regs.h")
    (src / "not-ours").mkdir()

    removed = kernel_source.remove_sources_of({"6.1.192"}, src)

    assert removed == [trees["6.1.192-1"], trees["6.1.192-2"]]
    assert sorted(p.name for p in src.iterdir() if not p.name.startswith(".")) == ["6.12.95-1~bpo12+1", "not-ours"]
    assert (trees["6.12.95-1~bpo12+1"] / "drivers" / "regs.h").read_text() == "#define REG 1\n"
    assert kernel_source.remove_sources_of(set(), src) == []
