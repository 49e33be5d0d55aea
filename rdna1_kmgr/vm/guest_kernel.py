"""The kernel a test VM boots: its image and its modules, from the host or unpacked into the cache.

A kernel installed on the host (/boot/vmlinuz-KREL with /lib/modules/KREL/kernel) is used as it is.
Otherwise, with the user's consent, the distro's image package is downloaded and unpacked with
`dpkg-deb -x` into cache_dir()/kernels/KREL (the packages the platform's record names: Ubuntu's image and
modules packages together); it is never installed (installing an image package runs
boot-loader and initramfs hooks on the host).

How the modules reach the guest: virtme-ng finds a kernel's modules by walking up from the image path to
the first folder holding lib/modules (here cache_dir()/kernels/KREL) and has its init link
/lib/modules/KREL to that folder's host path; the cache is not visible in the guest by itself (/var/cache
is a tmpfs there), so vm/guest_view.py maps the tree read-only at that same path. `depmod -b` is run here
once, at unpack time, because the package ships no modules.dep (its postinst would make it).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import cache_entry, files, progress, runner, user_input
from rdna1_kmgr.core.errors import HostError, SourceError
from rdna1_kmgr.core.paths import cache_dir
from rdna1_kmgr.host import system_identity
from rdna1_kmgr.host.platform import Platform
from rdna1_kmgr.modbuild import module_elf
from rdna1_kmgr.source import apt_sources, suite_search

HOST_ROOT = Path("/")


@dataclass(frozen=True)
class GuestKernel:
    release: str
    root: Path  # the tree holding boot/ and lib/modules/KREL: / or the cache entry
    origin: str  # "host" or "cache"

    @property
    def image(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.release}"

    @property
    def modules(self) -> Path:
        return self.root / "lib" / "modules" / self.release

    def vermagic(self) -> str:
        """The vermagic this kernel's own modules carry: what a module built for it must carry too."""
        for name in ("drm.ko", "drm.ko.xz", "drm.ko.gz"):
            for found in sorted((self.modules / "kernel" / "drivers" / "gpu" / "drm").glob(name)):
                return module_elf.read(found).vermagic
        for found in sorted((self.modules / "kernel").rglob("*.ko*")):
            return module_elf.read(found).vermagic
        raise HostError(
            f"no module of kernel {self.release} found under {self.modules}",
            f"remove {self.root} and fetch the kernel again" if self.origin == "cache" else "",
        )


def cached_root(release: str) -> Path:
    return cache_dir() / "kernels" / user_input.kernel_release(release)


def locate(release: str, fetch: bool = False) -> GuestKernel:
    """The bootable kernel `release`, from the host, the cache, or (with `fetch`) the distro's archive."""
    user_input.kernel_release(release)
    host = GuestKernel(release, HOST_ROOT, "host")
    if _complete(host) and os.access(host.image, os.R_OK):
        return host
    cached = GuestKernel(release, cached_root(release), "cache")
    if _complete(cached):
        return cached
    if not fetch:
        packages = image_packages(release, system_identity.read().platform)
        raise HostError(
            f"kernel {release} is neither installed on this host nor in the cache ({cached.root})",
            f"run again with --yes to download {' '.join(packages)} into the cache (unpacked there, not installed)"
            if packages
            else "install it on this host",
        )
    return fetch_image(release)


# How fetch_image gets a guest kernel: `apt-get download` of the platform record's guest_image packages (a record
# that names none gets no image fetched).
IMAGE_FETCHERS = ("apt-download",)


def fetch_image(release: str) -> GuestKernel:
    """Download the distro's image package(s) for `release` and unpack them into the cache (once)."""
    root = cached_root(release)
    kernels = root.parent
    kernels.mkdir(parents=True, exist_ok=True)
    with cache_entry.exclusive(kernels, release):
        cached = GuestKernel(release, root, "cache")
        if _complete(cached):
            return cached
        system = system_identity.read()
        packages = image_packages(release, system.platform)
        if not packages:
            raise HostError(
                f"fetching kernel {release}'s image is not supported on {system.platform.name}",
                "fetching a kernel image needs a Debian-based host; install the kernel on this host instead",
            )
        image, *modules = packages
        suites = _suites(system)
        deb = _download(image, suites, system.codename)
        found = (_download(package, suites, system.codename, required=False) for package in modules)
        debs = [each for each in (deb, *found) if each is not None]  # a module package a suite lacks: none
        with cache_entry.staging(kernels, release) as tmp:
            for each in debs:
                progress.say(f"unpacking {each.name} into {root} (not installing it)")
                _run(["dpkg-deb", "-x", str(each), str(tmp)], f"unpacking {each.name}")
            _merge_usr(tmp, release)
            _keep_what_a_guest_boots(tmp, release)
            progress.say(f"depmod for {release}")
            _run(["depmod", "-b", str(tmp), release], f"depmod for {release}")
            kept, dropped = keep_guest_modules(tmp, release)
            (tmp / KEPT_FOR).write_text(_kept_for())
            progress.say(f"kept the {kept} modules a guest loads, dropped {dropped} more")
            _run(["depmod", "-b", str(tmp), release], f"depmod for {release}")
            staged = GuestKernel(release, tmp, "cache")
            if not _complete(staged):
                raise SourceError(
                    f"{' '.join(d.name for d in debs)} hold no boot/vmlinuz-{release} with its modules",
                    "is it a kernel image package?",
                )
            # an entry trimmed for another list of modules (KEPT_FOR) is replaced, under this entry's lock
            files.publish_tree(tmp, root)
        for each in debs:
            each.unlink(missing_ok=True)  # unpacked: the .deb is only disk now (fetched again if ever needed)
        return cached


# What a guest loads from the kernel's own modules, by name or alias (issue 27: the rest, most of an image's
# 400 MB, is deleted at unpack time). amdgpu: the stock module stands for the patched one, which needs the same
# modules (the guest modprobes what `modinfo -F depends` of the module under test names); its own file goes
# too (STAND_INS), since the guest loads the module under test by path. vfio: a guest that
# passes a device on (the nested passthrough check). The rest: what virtme-ng puts into its initramfs to reach
# the host's files (virtme/virtmods.py's MODALIASES; tests/vm/test_engine.py checks this still covers it).
GUEST_MODULES = (
    "amdgpu",
    "vfio-pci",
    "vfio_iommu_type1",
    "fs-9p",
    "fs-virtiofs",
    "9pnet_virtio",
    "virtio_console",
    "virtio_pci",
    "virtio_mmio",
    "unix",
    "i8042",
    "atkbd",
    # virtme-ng's init mounts its writable overlays (/etc, /tmp, ...) after the initramfs: each mount without
    # the module waits for the kernel's modprobe to fail, 1.3 s apiece under TCG, 10 s a boot
    "overlay",
)
# Kept for their dependencies only: 19 MB of a 37 MB guest kernel on 6.1.
STAND_INS = ("amdgpu",)
# A cache entry's record of what it kept: an entry trimmed for another list is fetched again.
KEPT_FOR = ".rdna1-kmgr-guest-modules"


def _kept_for() -> str:
    return "".join(f"{name}\n" for name in GUEST_MODULES) + "".join(f"-{name}\n" for name in STAND_INS)


def load_order(tree: Path, release: str, name: str) -> list[Path]:
    """The module files that loading `name` (a module name or alias) loads, in order, the module itself last:
    modprobe's own answer from the modules.dep and aliases of the kernel under `tree` (/ for an installed
    kernel). Built-in ones have no file and are left out."""
    shown = runner.run(
        # --ignore-install: an `install` rule on this machine (rdna1-kmgr's own loader for amdgpu) would be
        # shown instead of the files
        ["modprobe", "--ignore-install", "--dirname", str(tree), "--set-version", release, "--show-depends", name],
        check=False,
        timeout=60,
    )
    # "insmod /tree/lib/modules/KREL/kernel/.../drm.ko " or "builtin x"
    return [Path(w[1]).resolve() for w in map(str.split, shown.stdout.splitlines()) if w[:1] == ["insmod"]]


def keep_guest_modules(tree: Path, release: str, wanted: tuple[str, ...] = GUEST_MODULES) -> tuple[int, int]:
    """Delete every module of the unpacked kernel but `wanted` and what they need (load_order), and the
    stand-ins' own files; (kept, deleted). Run depmod again afterwards."""
    keep: set[Path] = set()
    stand_ins: set[Path] = set()
    for name in wanted:
        loads = load_order(tree, release, name)
        if name in STAND_INS and loads:
            stand_ins.add(loads.pop())
        keep.update(loads)
    modules = tree / "lib" / "modules" / release
    everything = [p for p in modules.rglob("*.ko*") if p.is_file()]
    if not (keep | stand_ins) & {p.resolve() for p in everything}:
        raise SourceError(
            f"modprobe found none of {', '.join(wanted)} in the kernel {release} just unpacked",
            f"is {modules} a kernel's module tree?",
        )
    dropped = [p for p in everything if p.resolve() not in keep]
    for module in dropped:
        module.unlink()
    # The folders they leave: 880 of them in Debian's 6.1 image, a block each (3.4 MB against 5 MB of modules).
    for folder, _, _ in sorted(os.walk(modules / "kernel"), key=lambda entry: -len(entry[0])):
        if not os.listdir(folder):
            os.rmdir(folder)
    return len(everything) - len(dropped), len(dropped)


def _complete(kernel: GuestKernel) -> bool:
    # A host with only the headers has /lib/modules/KREL/build and nothing else: not bootable.
    bootable = (
        kernel.image.is_file() and (kernel.modules / "kernel").is_dir() and (kernel.modules / "modules.dep").is_file()
    )
    if kernel.origin != "cache":
        return bootable
    kept_for = kernel.root / KEPT_FOR
    return bootable and kept_for.is_file() and kept_for.read_text() == _kept_for()


def _keep_what_a_guest_boots(tree: Path, release: str) -> None:
    """A guest boots the image and loads modules: the packages' config, System.map, changelog, copyright and
    bug-report scripts go (virtme-ng reads a kernel's config only from a build tree)."""
    for path in (tree / "boot").iterdir() if (tree / "boot").is_dir() else ():
        if path.name != f"vmlinuz-{release}":
            path.unlink()
    shutil.rmtree(tree / "usr" / "share", ignore_errors=True)


def _merge_usr(tree: Path, release: str) -> None:
    """Newer image packages ship usr/lib/modules only; give depmod and virtme-ng their lib/modules path."""
    if not (tree / "lib").exists() and (tree / "usr" / "lib" / "modules" / release).is_dir():
        (tree / "lib").symlink_to("usr/lib")


def image_packages(release: str, platform: Platform) -> list[str]:
    """The distro's packages that together hold kernel `release`'s image and modules, the image's first, as
    the platform's record names them (Debian: one package, linux-image-KREL; Ubuntu splits it); none where
    images are not fetched."""
    return platform.guest_image_packages(release)


def _suites(system: system_identity.SystemIdentity) -> tuple[str, ...]:
    """The suites to search, most likely first: the release's own suites its apt sources list where the
    distribution's archive is one of its releases (Ubuntu's), else those its platform record names (Debian's:
    suite_search)."""
    if system.platform.kernel_source in _RELEASE_ARCHIVES:
        return tuple(apt_sources.system_suites(system.codename))
    return suite_search.suites_for(system)


# Kernel source kinds whose images come from the suites of the system's own release.
_RELEASE_ARCHIVES = {"ubuntu-archive"}


def _download(package: str, suites: tuple[str, ...], codename: str, required: bool = True) -> Path | None:
    if shutil.which("dpkg-deb") is None:
        raise HostError("dpkg-deb is not installed", "fetching a kernel image needs a Debian-based host")
    found = suite_search.search(suites, codename, lambda archive: archive.candidate(package) is not None)
    if found.archive is not None:
        return found.archive.download(package)
    if not required:
        return None
    raise SourceError(
        f"no suite has {package} ({found.describe()})",
        "check the kernel release; the archive drops old ABIs (see `apt-cache depends linux-image-amd64`)",
    )


def _run(argv: list[str], doing: str) -> None:
    runner.run(argv, timeout=900, doing=doing, hint=f"command: {' '.join(argv)}")
