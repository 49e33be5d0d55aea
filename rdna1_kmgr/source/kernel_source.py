"""The exact amdgpu driver source for a kernel: found, verified against the kernel's version, unpacked once.

A source is a tree holding the kernel's top Makefile (it says the version) and drivers/gpu/drm/amd (acp,
amdgpu, amdkfd, amdxcp, display, include, pm, ras: everything an out-of-tree amdgpu build compiles). The
kernel's own include/ is not needed, the headers package provides it. Sources come from Debian's
linux-source-X.Y package, a kernel.org-style tarball (a path, or an http(s) URL checked against a SHA-256:
tarball_fetch.py), or an already unpacked tree used where it is. Unpacked subsets live in cache_dir()/src/<version>/.
"""

import bz2
import filecmp
import io
import json
import lzma
import os
import re
import shutil
import tarfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from packaging.version import InvalidVersion, Version

from rdna1_kmgr.core import cache_entry, runner, user_input
from rdna1_kmgr.core.errors import SourceError, UsageError
from rdna1_kmgr.core.files import link_in_place, sha256_file, write_json
from rdna1_kmgr.core.paths import cache_dir
from rdna1_kmgr.core.progress import ByteProgress
from rdna1_kmgr.host import system_identity
from rdna1_kmgr.host.system_identity import SystemIdentity
from rdna1_kmgr.source import suite_search
from rdna1_kmgr.source.debian_archive import PrivateArchive, check_debian_version
from rdna1_kmgr.source.tarball_fetch import check_sha256, fetch_tarball

# What of the kernel tree an out-of-tree amdgpu build and the patch renderer read.
AMD_SUBSET = ("Makefile", "drivers/gpu/drm/amd")
AMDGPU_DIR = "drivers/gpu/drm/amd/amdgpu"
# Written into every unpacked tree: where it came from (render's manifest can quote it).
ORIGIN_FILE = ".rdna1-kmgr-source.json"

_CHUNK = 1 << 20
_MAKEFILE_VARIABLE = re.compile(r"^(VERSION|PATCHLEVEL|SUBLEVEL|EXTRAVERSION)\s*=[ \t]*(\S*)[ \t]*$", re.M)
# Debian: ./usr/src/linux-source-6.1.tar.xz. Ubuntu: ./usr/src/linux-source-6.8.0/linux-source-6.8.0.tar.bz2, and
# for kernels built from another source package (HWE) ./usr/src/linux-hwe-6.8-source-6.8.0/<the same>.tar.bz2.
_DEB_TARBALL = re.compile(r"^\./usr/src/(linux-(?:[a-z0-9.-]+-)?source-[0-9][0-9.]*)(/\1)?\.tar\.(xz|gz|bz2)$")
# Ubuntu names a kernel package by its ABI base, not its Linux version: 6.8.0-48.48 (HWE: 6.8.0-48.48~22.04.1)
# is built from Linux 6.8.12. Only X.Y of the base is the tree's.
UBUNTU_ABI_VERSION = re.compile(r"^(\d+\.\d+\.\d+)-(\d+)\.(\d+)(~[0-9A-Za-z.+]+)?$")


# --- versions ------------------------------------------------------------------------------------------------


def kernel_version(src_root: Path) -> Version:
    """The version the tree's top Makefile declares; EXTRAVERSION -rcN becomes a pre-release (7.2.0rc3)."""
    makefile = Path(src_root) / "Makefile"
    try:
        head = makefile.read_text(errors="replace")[:8192]  # the four variables open the file
    except OSError as err:
        raise SourceError(f"cannot read {makefile}: {err.strerror}", "give the root of a kernel source tree") from None
    values: dict[str, str] = {}
    for name, value in _MAKEFILE_VARIABLE.findall(head):
        values.setdefault(name, value)
    numbers = [values.get(name, "") for name in ("VERSION", "PATCHLEVEL", "SUBLEVEL")]
    if not all(number.isdigit() for number in numbers[:2]) or not (numbers[2].isdigit() or numbers[2] == ""):
        raise SourceError(
            f"{makefile} does not declare a kernel version (VERSION/PATCHLEVEL/SUBLEVEL)",
            "give the root of a kernel source tree",
        )
    release = f"{numbers[0]}.{numbers[1]}.{numbers[2] or 0}"
    return Version(release + _extraversion_suffix(values.get("EXTRAVERSION", "")))


def _extraversion_suffix(extra: str) -> str:
    rc = re.fullmatch(r"-rc(\d+)", extra)
    if rc:
        return f"rc{rc.group(1)}"
    label = re.sub(r"[^A-Za-z0-9]+", ".", extra).strip(".")
    return f"+{label}" if label else ""  # a custom EXTRAVERSION is kept, as a local version label


def upstream_version(version: str) -> Version:
    """The Linux version in a Debian package version or a plain one: 6.1.192-2 and 6.1.192 -> 6.1.192,
    1:6.12.95-1~bpo12+1 -> 6.12.95, 7.2~rc3-1~exp1 and 7.2-rc3 -> 7.2rc3."""
    text = version.split(":", 1)[1] if re.match(r"^\d+:", version) else version
    if "-" in text and not re.search(r"-rc\d+$", text):
        text = text.rsplit("-", 1)[0]  # the Debian revision
    try:
        return Version(text.replace("~", "").replace("-rc", "rc"))
    except InvalidVersion:
        raise UsageError(f"invalid kernel version {version!r}", "e.g. 6.1.192 or Debian's 6.1.192-2") from None


def require_version(src_root: Path, expected: Version | str) -> Version:
    """The tree's version, when it is `expected` (a Version, or a plain or Debian version string)."""
    wanted = expected if isinstance(expected, Version) else upstream_version(expected)
    actual = kernel_version(src_root)
    if not matches_package(actual, expected):
        raise SourceError(
            f"the source in {src_root} is Linux {actual}, the kernel is Linux {wanted}",
            "give the source of exactly the kernel you build for",
        )
    return actual


def matches_package(tree: Version, expected: Version | str) -> bool:
    """Whether a tree of Linux `tree` is the kernel `expected` names (a Version, a plain or package version)."""
    if isinstance(expected, str) and UBUNTU_ABI_VERSION.fullmatch(expected):
        return tree.release[:2] == upstream_version(expected).release[:2]
    return tree == (expected if isinstance(expected, Version) else upstream_version(expected))


# --- Debian's source packages --------------------------------------------------------------------------------


@dataclass(frozen=True)
class DebianSource:
    """Where Debian's archive has the source of one kernel package version."""

    package: str  # linux-source-6.1
    version: str  # 6.1.192-2, the same as the kernel image's
    suite: str  # bookworm-security


def debian_source_for(debian_version: str, system: SystemIdentity | None = None) -> DebianSource:
    """The linux-source package of a Debian kernel version (e.g. 6.1.192-2) and the suite that has it, searched
    in the suites of `system`'s release first (default: this machine; see suite_search)."""
    package = _source_package_of(check_debian_version(debian_version))
    upstream = upstream_version(debian_version)
    system = system or system_identity.read()
    found = suite_search.search(
        suite_search.suites_for(system), system.codename, lambda archive: debian_version in archive.versions(package)
    )
    if found.archive is not None:
        return DebianSource(package, debian_version, found.archive.suite)
    tarball = f"https://cdn.kernel.org/pub/linux/kernel/v{upstream.major}.x/linux-{upstream}.tar.xz"
    raise SourceError(
        f"Debian's archive no longer has {package} {debian_version} ({found.describe()})",
        f"give --source with an unpacked tree, or the upstream tarball {tarball} (without Debian's patches)",
    )


def debian_kernel_version(krel: str, proc_version: str | None = None) -> str | None:
    """The Debian package version of kernel `krel` (6.1.0-56-amd64 -> 6.1.192-2): dpkg's version of its image
    or headers package, else, for the running kernel, what /proc/version says ("... Debian 6.1.192-2 (...)").
    None for a kernel Debian did not build."""
    krel = user_input.kernel_release(krel)
    packages = [f"linux-image-{krel}", f"linux-image-{krel}-unsigned", f"linux-headers-{krel}"]
    proc = runner.run(["dpkg-query", "--show", "--showformat=${db:Status-Abbrev} ${Version}\n", *packages], check=False)
    for line in proc.stdout.splitlines():
        status, _, version = line.partition(" ")
        if status.startswith("ii") and version.strip():
            return version.strip()
    if proc_version is None and krel == os.uname().release:
        proc_version = Path("/proc/version").read_text(errors="replace")
    return debian_kernel_version_in(proc_version)


def debian_kernel_version_in(proc_version: str | None) -> str | None:
    """The Debian package version /proc/version names ("... Debian 6.1.192-2 (...)"), or None."""
    found = re.search(r" Debian (\d[\w.+~:-]*) \(", proc_version or "")
    return found.group(1) if found else None


def fetch_debian_source(debian_version: str, suite: str | None = None, system: SystemIdentity | None = None) -> Path:
    """The unpacked amd subset of Debian's source for a kernel version, downloaded and unpacked once: from
    `suite`, else from the first suite of `system`'s search that has it (debian_source_for)."""
    tree = cache_dir() / "src" / check_debian_version(debian_version)
    if (tree / ORIGIN_FILE).is_file():
        # A .deb an earlier rdna1-kmgr kept after unpacking it: only disk.
        for kept in (cache_dir() / "debs").glob(f"linux-source-*_{debian_version}_all.deb"):
            kept.unlink(missing_ok=True)
        return tree
    found = (
        DebianSource(_source_package_of(debian_version), debian_version, suite)
        if suite
        else debian_source_for(debian_version, system)
    )
    codename = system.codename if system is not None else None
    return unpack_download(PrivateArchive(found.suite, codename or None).download(found.package, found.version))


def unpack_download(download: Path) -> Path:
    """Unpack the amd subset of a file the tool downloaded into its cache, then delete the file: the unpacked
    tree is all later work reads (a linux-source .deb is 140 MB)."""
    tree = unpack_amd_subset(download)
    download.unlink(missing_ok=True)
    return tree


def fetch_kernel_source(krel: str) -> Path:
    """The amd subset of exactly the Debian kernel `krel` (see debian_kernel_version), verified against it."""
    version = debian_kernel_version(krel)
    if version is None:
        raise SourceError(
            f"kernel {krel} is not a Debian kernel: no package of it, no Debian version in /proc/version",
            "give its source with --source PATH or --source URL",
        )
    tree = fetch_debian_source(version)
    require_version(tree, version)
    return tree


def _source_package_of(debian_version: str) -> str:
    upstream = upstream_version(debian_version)
    return f"linux-source-{upstream.major}.{upstream.minor}"


# --- unpacking -----------------------------------------------------------------------------------------------


def unpack_amd_subset(archive: Path, dest_root: Path | None = None) -> Path:
    """Unpack the top Makefile and drivers/gpu/drm/amd of a kernel tarball or linux-source .deb.

    The tree lands in dest_root (default cache_dir()/src) as <Debian version> for a .deb, or as
    <kernel version>+sha256.<first 16 hex digits of the tarball's hash> for a tarball; an earlier unpack of
    the same archive is reused. The tree appears complete or not at all.
    """
    archive = Path(archive)
    if not archive.is_file():
        raise SourceError(f"{archive}: no such file", "give a kernel tarball or a linux-source .deb")
    dest_root = Path(dest_root) if dest_root is not None else cache_dir() / "src"
    dest_root.mkdir(parents=True, exist_ok=True)
    deb = _deb_identity(archive) if _is_deb(archive) else None
    key = deb[1] if deb else f"sha256.{sha256_file(archive)[:16]}"
    with cache_entry.exclusive(dest_root, key):
        done = _unpacked(dest_root, key, is_deb=deb is not None)
        if done:
            return done
        with cache_entry.staging(dest_root, key) as tmp:
            tree = tmp / "tree"
            tree.mkdir(mode=0o700)  # root's alone: what is checked here is what is compiled and signed
            with _compressed_tarball(archive, deb) as (chunks, size):
                _extract_subset(chunks, size, tree, archive)
            version = kernel_version(tree)
            origin = {"archive": archive.name, "kernel_version": str(version), "subset": list(AMD_SUBSET)}
            if deb:
                if not matches_package(version, deb[1]):
                    raise SourceError(
                        f"{archive} is {deb[0]} {deb[1]} but its Makefile says Linux {version}",
                        "the package is not what its name says; fetch it again",
                    )
                origin.update(package=deb[0], debian_version=deb[1])
                name = deb[1]
            else:
                origin["sha256"] = sha256_file(archive)
                name = f"{version}+{key}"
            share_unchanged_files(tree, dest_root)
            write_json(tree / ORIGIN_FILE, origin, indent=2, sort_keys=True)
            return cache_entry.publish(tree, dest_root / name)


def remove_sources_of(versions: set[str], src_root: Path | None = None) -> list[Path]:
    """Remove the unpacked trees of the cache whose Linux version is one of `versions` (every Debian revision of
    it), each under its cache entry's lock (a build unpacking it waits, or finds it gone and unpacks it again);
    the trees removed."""
    src_root = src_root if src_root is not None else cache_dir() / "src"
    removed = []
    for tree in sorted(src_root.glob("*")) if src_root.is_dir() else []:
        origin = source_origin(tree)
        if not origin or origin.get("kernel_version") not in versions:
            continue
        # the key unpack_amd_subset locks the entry by
        key = origin.get("debian_version") or f"sha256.{origin.get('sha256', '')[:16]}"
        with cache_entry.exclusive(src_root, key):
            if tree.is_dir():
                shutil.rmtree(tree)
                removed.append(tree)
    return removed


def share_unchanged_files(tree: Path, dest_root: Path) -> int:
    """Hard-link each file of a freshly unpacked tree to the same file (same path, same bytes) of a tree unpacked
    before: two point releases' amd subsets are the same 400 MB but for a few files (6.1.0-55 and -56 are both
    Linux 6.1.192), and are kept once. Safe because the cache's trees are only ever read: a DKMS package and a
    kbuild tree link or copy from them, nothing writes into them. Returns the bytes now shared."""
    siblings = sorted((p for p in dest_root.iterdir() if (p / ORIGIN_FILE).is_file()), reverse=True)
    shared = 0
    for path in tree.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        relative, size = path.relative_to(tree), path.stat().st_size
        for sibling in siblings:
            twin = sibling / relative
            if twin.is_file() and not twin.is_symlink() and twin.stat().st_size == size:
                if filecmp.cmp(path, twin, shallow=False):
                    link_in_place(twin, path)
                    shared += size
                    break
    return shared


def source_origin(tree: Path) -> dict | None:
    """What unpack_amd_subset recorded about a tree it made (None for a tree it did not make)."""
    try:
        return json.loads((Path(tree) / ORIGIN_FILE).read_text())
    except (OSError, ValueError):
        return None


def _unpacked(dest_root: Path, key: str, is_deb: bool) -> Path | None:
    names = [dest_root / key] if is_deb else sorted(dest_root.glob(f"*+{key}"))
    return next((tree for tree in names if (tree / ORIGIN_FILE).is_file()), None)


def _is_deb(path: Path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(8) == b"!<arch>\n"


def _deb_identity(deb: Path) -> tuple[str, str]:
    """(package, version) from the .deb's control file."""
    proc = runner.run(["dpkg-deb", "--showformat=${Package}\\n${Version}\\n", "--show", str(deb)], check=False)
    lines = proc.stdout.split()
    if proc.returncode != 0 or len(lines) != 2:
        raise SourceError(f"{deb} is not a readable .deb: {_first_line(proc.stderr)}", "fetch it again")
    if not re.match(r"^linux-([a-z0-9.-]+-)?source-[0-9]", lines[0]):
        raise SourceError(f"{deb} is {lines[0]}, not a linux-source package", "give a linux-source-X.Y .deb")
    return lines[0], lines[1]


@contextmanager
def _compressed_tarball(archive: Path, deb: tuple[str, str] | None) -> Iterator[tuple[Iterator[bytes], int]]:
    """The kernel tarball's bytes as chunks, and their count: the file itself, or the one inside a .deb."""
    if deb is None:
        with open(archive, "rb") as handle:
            yield iter(lambda: handle.read(_CHUNK), b""), archive.stat().st_size
        return
    # linux-source-X.Y_*.deb holds ./usr/src/linux-source-X.Y.tar.xz; stream it out without a temporary copy.
    with runner.pipe_from(
        ["dpkg-deb", "--fsys-tarfile", str(archive)],
        error=SourceError,
        doing=f"reading {archive}",
        hint="the file is truncated or damaged; fetch it again",
    ) as stream:
        try:
            with tarfile.open(fileobj=stream, mode="r|") as outer:
                member = next((m for m in outer if m.isfile() and _DEB_TARBALL.match(m.name)), None)
                if member is None:
                    raise SourceError(
                        f"{archive} holds no kernel tarball under /usr/src (linux-source-X.Y.tar.*)",
                        "give a linux-source-X.Y .deb",
                    )
                tarball = outer.extractfile(member)
                assert tarball is not None  # a regular file's member
                yield iter(lambda: tarball.read(_CHUNK), b""), member.size
        except (tarfile.TarError, EOFError, OSError) as err:
            raise SourceError(
                f"cannot read {archive}: {err}", "the file is truncated or damaged; fetch it again"
            ) from err


def _extract_subset(chunks: Iterator[bytes], size: int, tree: Path, archive: Path) -> None:
    """Feed a compressed kernel tarball to GNU tar, which extracts only AMD_SUBSET (its top folder stripped)."""
    first = next(chunks, b"")
    compression, decompressor = _compression_of(first, archive)
    top = _top_folder(decompressor, first, archive)
    members = [f"{top}/{part}" for part in AMD_SUBSET]
    command = [
        "tar",
        "-x",
        *compression,
        "-f",
        "-",
        "-C",
        str(tree),
        f"--strip-components={top.count('/') + 1}",
        "--no-same-owner",
        *members,
    ]
    progress = ByteProgress(f"unpacking drivers/gpu/drm/amd from {archive.name}", size)
    with runner.pipe_into(command, check=False) as tar:
        for chunk in chain([first], chunks):
            tar.write(chunk)  # once tar gives up, writes are dropped: its exit code and message say why
            progress.advance(len(chunk))
    result = tar.result
    assert result is not None  # pipe_into sets it when its block ends
    message = result.stderr
    if result.returncode != 0:
        progress.finish("failed")
        missing = re.search(r"tar: (\S+): Not found in archive", message)
        if missing:
            raise SourceError(f"{archive} has no {missing.group(1)}", "give the source of a whole kernel")
        raise SourceError(
            f"cannot unpack {archive}: {_first_line(message)}", "the file is truncated or damaged; fetch it again"
        )
    progress.finish()


def _compression_of(head: bytes, archive: Path):
    """tar's option for the archive's compression, and a decompressor for peeking at its start."""
    if head.startswith(b"\xfd7zXZ\x00"):
        return ["-J"], lzma.LZMADecompressor()
    if head.startswith(b"\x1f\x8b"):
        return ["-z"], zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
    if head.startswith(b"BZh"):
        return ["-j"], bz2.BZ2Decompressor()
    if head[257:262] == b"ustar":
        return [], None
    raise SourceError(
        f"{archive} is neither a .deb nor a tar archive (plain, xz, gzip or bzip2)",
        "give a kernel tarball or a linux-source .deb",
    )


def _top_folder(decompressor, head: bytes, archive: Path) -> str:
    """The folder a kernel tarball keeps everything in (linux-6.1.192, linux-source-6.1), from its first entry."""
    try:
        data = decompressor.decompress(head, 1 << 16) if decompressor else head
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as peek:
            first = peek.next()
    except (tarfile.TarError, EOFError, OSError, lzma.LZMAError, zlib.error):
        first = None
    if first is None:
        raise SourceError(
            f"cannot unpack {archive}: not a readable tar archive", "the file is truncated or damaged; fetch it again"
        )
    parts = first.name.split("/")
    top = "/".join(parts[:2]) if parts[0] == "." and len(parts) > 1 else parts[0]
    if top in (".", "") or (not first.isdir() and top == first.name):
        raise SourceError(
            f"{archive} does not keep the kernel in one top folder (like linux-6.1.192/)",
            "give a kernel.org-style tarball",
        )
    return top


# --- the --source option -------------------------------------------------------------------------------------


def resolve_source_option(value: str, sha256: str | None = None, keyring: Path | None = None) -> Path:
    """The tree `--source VALUE` names: an unpacked kernel tree (used in place), a tarball or linux-source .deb
    (unpacked into the cache), or an http(s) URL of a tarball (downloaded, verified, unpacked)."""
    if "://" in value:
        return unpack_amd_subset(fetch_tarball(value, sha256, keyring))
    path = Path(value)
    if path.is_dir():
        return checked_tree(path)
    if path.is_file():
        if sha256 and sha256_file(path) != check_sha256(sha256):
            raise SourceError(
                f"{path} has SHA-256 {sha256_file(path)}, expected {sha256.lower()}", "check the file and the hash"
            )
        return unpack_amd_subset(path)
    raise UsageError(
        f"--source {value!r}: no such file or folder",
        "give an unpacked kernel tree, a kernel tarball or linux-source .deb, or an https:// URL",
    )


def checked_tree(path: Path) -> Path:
    """An unpacked tree, when it has a versioned top Makefile and the amdgpu driver."""
    path = Path(path).resolve()
    kernel_version(path)
    if not (path / AMDGPU_DIR).is_dir():
        raise SourceError(f"{path} has no {AMDGPU_DIR}", "give the root of a kernel source tree")
    return path


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
