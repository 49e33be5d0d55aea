"""W=1 on the objects a rendered series touches, patched against stock: shared by the render tests (Debian 12's
kernels, on this machine) and the Debian 13 story (trixie's 7.x kernel, in its root: that tree's headers need
trixie's gcc-14). And the kernel's own scripts/checkpatch.pl, taken once from the linux-source .deb a real source
came from into the persistent test cache, with the lines it reports for a patch.

A helper module, not a test module."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import _using_test_cache, persistent_cache_root

from rdna1_kmgr.core import cache_entry
from rdna1_kmgr.source import kernel_source
from rdna1_kmgr.source.debian_archive import PrivateArchive

AMD = "drivers/gpu/drm/amd"


def touched_objects(out: Path) -> list[str]:
    """amdgpu.ko's objects the rendered series in `out` changes, as kbuild names them from the amdgpu folder
    (amdkfd's files are objects of amdgpu.ko too, the Makefile's ../amdkfd)."""
    return sorted(
        {
            ("" if folder == "amdgpu" else "../amdkfd/") + name
            for folder, name in re.findall(
                rf"^\+\+\+ b/{AMD}/(amdgpu|amdkfd)/(\w+)\.c$", "".join(p.read_text() for p in out.glob("*.patch")), re.M
            )
        }
    )


def derived_tree(source: Path, dest: Path, changes: dict) -> Path:
    """A hard-linked copy of a cached real source in which each file named in `changes` is replaced by a
    file of its own holding changes[rel](its bytes): a variation of a real tree, built at test time."""
    shutil.copytree(source, dest, copy_function=os.link)
    for rel, change in changes.items():
        path = dest / rel
        data = change(path.read_bytes())
        path.unlink()  # break the hard link before writing
        path.write_bytes(data)
    return dest


# Upstream 8fc2796dea6f ("drm/amdkfd: Export the cwsr_size and ctl_stack_size to userspace", Linux 6.19, stable
# 6.12.64 and 6.18.4) added these four lines to node_show() after num_cp_queues, read by hand in Debian's 6.12.
# Taking them out of Debian's 6.12 makes the kernel 6.12.0-6.12.63 were: KFD checks the control stack exactly and
# does not print it (issue 48).
EXPORT_LINES = (
    b'\tsysfs_show_32bit_prop(buffer, offs, "cwsr_size",\n'
    b"\t\t\t      dev->node_props.cwsr_size);\n"
    b'\tsysfs_show_32bit_prop(buffer, offs, "ctl_stack_size",\n'
    b"\t\t\t      dev->node_props.ctl_stack_size);\n"
)


def without_export(data: bytes) -> bytes:
    assert data.count(EXPORT_LINES) == 1, "kfd_topology.c does not carry 8fc2796dea6f's lines as written"
    return data.replace(EXPORT_LINES, b"")


WITHOUT_EXPORT = {f"{AMD}/amdkfd/kfd_topology.c": without_export}


def patched_copy(source: Path, out: Path, dest: Path) -> Path:
    """A hard-linked copy of `source` with the series in `out` applied (GNU patch writes each file it changes
    anew, so the source itself, a cache, is never modified)."""
    shutil.copytree(source, dest, copy_function=os.link)
    for name in (out / "series").read_text().split():
        done = subprocess.run(
            ["patch", "-p1", "--batch", "-d", str(dest), "-i", str(out / name)], capture_output=True, text=True
        )
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
        assert "fuzz" not in done.stdout and "FAILED" not in done.stdout, done.stdout  # the series applies exactly
    return dest


def w1_warnings(tree: Path, release: str, objects: list[str], chroot: Path | None = None) -> set[str]:
    """What W=1 says compiling `objects` of amdgpu, without line numbers (the series moves lines); in `chroot`
    (where `tree` lies) when given."""
    inside = Path("/") / tree.relative_to(chroot) if chroot else tree
    amd = inside / AMD
    done = subprocess.run(
        [
            *(["chroot", str(chroot)] if chroot else []),
            "make",
            "-C",
            f"/lib/modules/{release}/build",
            f"M={amd}/amdgpu",
            f"FULL_AMD_PATH={amd}",
            "W=1",
            "KCFLAGS=-g0",
            f"-j{(os.cpu_count() or 1) + 1}",
            *objects,
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return {
        re.sub(rf"^{re.escape(str(inside))}/|:\d+(:\d+)?:", "", line).strip()
        for line in (done.stdout + done.stderr).splitlines()
        if re.search(r"\bwarning\b|\berror\b", line)
    }


def w1_new_warnings(source: Path, out: Path, release: str, work: Path, chroot: Path | None = None) -> set[str]:
    """What W=1 says of the touched objects of the patched tree that it does not say of the stock one (with only
    the out-of-tree build fix). `work` and `source` lie inside `chroot` when the compile runs there."""
    objects = [f"{name}.o" for name in touched_objects(out)]
    patched = w1_warnings(patched_copy(source, out, work / "patched"), release, objects, chroot)
    stock = work / "stock"
    shutil.copytree(source, stock, copy_function=os.link)
    subprocess.run(
        ["patch", "-p1", "--batch", "--quiet", "-d", str(stock), "-i", str(out / "0001-out-of-tree.patch")], check=True
    )
    upstream = w1_warnings(stock, release, [o for o in objects if o != "amdgpu_rdna1.o"], chroot)
    return patched - upstream


CHECKPATCH_FILES = ("checkpatch.pl", "spelling.txt", "const_structs.checkpatch")


def checkpatch_of(source: Path) -> Path:
    """scripts/checkpatch.pl of the kernel `source` was unpacked from (extracted once per source package)."""
    archive = (kernel_source.source_origin(source) or {}).get("archive")
    if not archive:
        pytest.fail(f"{source} records no archive it came from")
    deb = persistent_cache_root() / "debs" / archive
    dest = persistent_cache_root() / "checkpatch" / archive.removesuffix(".deb")
    if (dest / "scripts/checkpatch.pl").is_file():
        return dest / "scripts/checkpatch.pl"
    with cache_entry.exclusive(dest.parent, dest.name), cache_entry.staging(dest.parent, dest.name) as staging:
        if not (dest / "scripts/checkpatch.pl").is_file():
            if not deb.is_file():  # the tool deletes a source .deb once it is unpacked (issue 27): fetch it again
                with _using_test_cache():
                    found = kernel_source.debian_source_for(kernel_source.source_origin(source)["debian_version"])
                    deb = PrivateArchive(found.suite).download(found.package, found.version)
            inner = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
            tarball = next(
                n
                for n in subprocess.run(["tar", "-t"], input=inner, capture_output=True, check=True)
                .stdout.decode()
                .split()
                if re.fullmatch(r"\./usr/src/linux-source-[\d.]+\.tar\.xz", n)
            )
            top = tarball.rsplit("/", 1)[1].removesuffix(".tar.xz")
            xz = subprocess.run(["tar", "-xO", tarball], input=inner, capture_output=True, check=True).stdout
            subprocess.run(
                [
                    "tar",
                    "-xJ",
                    "-C",
                    str(staging),
                    "--strip-components=1",
                    *[f"{top}/scripts/{name}" for name in CHECKPATCH_FILES],
                ],
                input=xz,
                check=True,
            )
            cache_entry.publish(staging, dest)
            deb.unlink(missing_ok=True)  # checkpatch is kept; the 140 MB .deb is not
    return dest / "scripts/checkpatch.pl"


def checkpatch(script: Path, patch: Path, *options: str) -> list[str]:
    """The ERROR/WARNING/CHECK lines checkpatch reports for one patch."""
    done = subprocess.run(
        ["perl", str(script), "--no-tree", "--terse", "--show-types", *options, str(patch)],
        capture_output=True,
        text=True,
    )
    return [line for line in done.stdout.splitlines() if re.search(r": (ERROR|WARNING|CHECK):", line)]
