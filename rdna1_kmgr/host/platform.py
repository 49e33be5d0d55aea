"""Which supported distribution a system is, and the names of its ways: one record, from platforms.toml.

The later stages never test a distribution's name: each picks its strategy by a name the record holds
(prerequisites its package manager, signing its key pair, distro_source its kernel source fetcher,
guest_kernel its image packages, boot_guard its boot loader, follow's hooks its kernel hooks). The record of
a system comes from its os-release (SystemIdentity reads it: ID and ID_LIKE); the first entry of platforms.toml
naming any of those ids wins. A distribution that matches none still gets a record, holding its own ID as name
and no strategies: the stage that needs one says so (see `supported`).
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core.errors import UsageError

DATA = Path(__file__).with_name("platforms.toml")


@dataclass(frozen=True)
class KeyPairConvention:
    """Where a distribution's DKMS keeps the module-signing key pair when told nothing."""

    name: str  # the convention: debian (DKMS's own default), ubuntu, fedora
    key: Path
    cert: Path
    enroll: str  # the program that queues the certificate: mokutil, or the distribution's wrapper of it


@dataclass(frozen=True)
class Platform:
    name: str  # ubuntu, debian, fedora, arch; or an unsupported distribution's own os-release ID
    ids: tuple[str, ...]  # the os-release ids (ID or ID_LIKE) that make a system this platform
    key_pair: KeyPairConvention
    package_manager: str | None = None  # apt, dnf, pacman
    initramfs_tool: str | None = None  # the default: update-initramfs, dracut, mkinitcpio
    kernel_source: str | None = None  # debian-archive, ubuntu-archive, fedora-srpm, arch-pkgbuild
    current_kernel: str | None = None  # how to find the release the kernel metapackage points to
    boot_loader: str | None = None  # the distribution's default: grub, grub2-bls, systemd-boot
    kernel_hooks: str | None = None  # where its package manager runs a command on a kernel's install and removal
    guest_image: tuple[str, ...] = ()  # package name patterns, {release} for uname -r
    headers_from_backports: bool = False
    release_suites: tuple[str, ...] = ()  # suite name patterns, {codename} for a release's
    other_releases: tuple[str, ...] = ()
    other_suites: tuple[str, ...] = ()

    @property
    def supported(self) -> bool:
        return bool(self.ids)

    def guest_image_packages(self, release: str) -> list[str]:
        """The packages holding kernel `release`'s image and modules, the image's first (none: not fetched)."""
        return [pattern.format(release=release) for pattern in self.guest_image]

    def archive_suites(self, codename: str) -> list[str]:
        """The suites to search for a kernel's packages on release `codename`, most likely first: the release's
        own (release_suites), then those of the other releases, then the other suites."""
        releases = [codename] if codename else []
        releases += [release for release in self.other_releases if release != codename]
        names = [pattern.format(codename=release) for release in releases for pattern in self.release_suites]
        return list(dict.fromkeys(names + list(self.other_suites)))


@functools.cache
def _data() -> dict:
    with DATA.open("rb") as handle:
        return tomllib.load(handle)


def _key_pair(name: str) -> KeyPairConvention:
    entry = _data()["key_pairs"][name]
    return KeyPairConvention(name, Path(entry["key"]), Path(entry["cert"]), entry["enroll"])


@functools.cache
def key_pairs() -> list[KeyPairConvention]:
    """Every distribution's key pair convention (what the host-root guest hides)."""
    return [_key_pair(name) for name in _data()["key_pairs"]]


def entries() -> tuple[Platform, ...]:
    """Every supported platform, in the order they are matched."""
    return tuple(
        Platform(
            name=name,
            ids=tuple(entry["ids"]),
            key_pair=_key_pair(entry["key_pair"]),
            package_manager=entry.get("package_manager"),
            initramfs_tool=entry.get("initramfs_tool"),
            kernel_source=entry.get("kernel_source"),
            current_kernel=entry.get("current_kernel"),
            boot_loader=entry.get("boot_loader"),
            kernel_hooks=entry.get("kernel_hooks"),
            guest_image=tuple(entry.get("guest_image", ())),
            headers_from_backports=entry.get("headers_from_backports", False),
            release_suites=tuple(entry.get("release_suites", ())),
            other_releases=tuple(entry.get("other_releases", ())),
            other_suites=tuple(entry.get("other_suites", ())),
        )
        for name, entry in _data()["platforms"].items()
    )


def for_identity(distro_id: str, like: tuple[str, ...] | list[str] | str = ()) -> Platform:
    """The platform of a system whose os-release says ID=`distro_id` and ID_LIKE=`like` (ids, or one string)."""
    ids = {distro_id, *(like.split() if isinstance(like, str) else like)}
    for platform in entries():
        if ids & set(platform.ids):
            return platform
    return Platform(name=distro_id, ids=(), key_pair=_key_pair(_data()["unsupported"]["key_pair"]))


def named(name: str) -> Platform:
    """The supported platform `name` (ubuntu, debian, fedora, arch)."""
    for platform in entries():
        if platform.name == name:
            return platform
    known = ", ".join(platform.name for platform in entries())
    raise UsageError(f"unknown platform {name!r}", f"one of {known}")
