"""What each distribution of host/platforms.toml gets on every strategy axis, as data: the table of docs/reference.md.

A platform record names one strategy per axis (its package manager, kernel source fetcher, ...). Each axis has a
registry in the stage that uses it (prerequisites.MANAGERS, distro_source.FETCHERS, boot_guard.BOOT_LOADERS,
hooks.KERNEL_HOOKS, ...). A name a record holds is either a strategy of that registry, with its standing (`Proven`:
a test runs it for real here, on the platforms it names; `Written`: the code is there, nothing here runs it for
real), or, for that platform, an explicit `Unsupported(reason)`.
`standing` raises for anything else, so a name added to platforms.toml without a strategy fails
tests/test_conformance.py before a user meets it; the same walk writes the distributions table.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from rdna1_kmgr.follow import hooks
from rdna1_kmgr.host import platform
from rdna1_kmgr.install import boot_guard, initramfs
from rdna1_kmgr.modbuild import prerequisites
from rdna1_kmgr.source import distro_source, target_kernel
from rdna1_kmgr.vm import guest_kernel


@dataclass(frozen=True)
class Proven:
    how: str  # what runs it for real
    on: tuple[str, ...] = ("debian",)  # the platforms it ran on; on the others the same code is only written


@dataclass(frozen=True)
class Written:
    what: str  # what the code does; nothing here runs it for real


@dataclass(frozen=True)
class Unsupported:
    reason: str  # what the user meets, and what to do instead


Standing = Proven | Written | Unsupported


@dataclass(frozen=True)
class Axis:
    field: str  # the record's field (platforms.toml)
    title: str  # the table's column
    registry: Callable[[], Collection[str]]  # the names the stage knows


AXES = (
    Axis("kernel_source", "source of the kernel", lambda: distro_source.FETCHERS),
    Axis("current_kernel", "current kernel", lambda: target_kernel.CURRENT_KERNEL_FINDERS),
    Axis("package_manager", "prerequisites", lambda: prerequisites.MANAGERS),
    Axis("key_pair", "signing key", lambda: [pair.name for pair in platform.key_pairs()]),
    Axis("initramfs_tool", "initramfs", lambda: initramfs.TOOLS),
    Axis("guest_image", "vm-test image", lambda: guest_kernel.IMAGE_FETCHERS),
    Axis("boot_loader", "boot loader (boot guard)", lambda: boot_guard.BOOT_LOADERS),
    Axis("kernel_hooks", "kernel hooks (follow)", lambda: hooks.KERNEL_HOOKS),
)

# Each strategy's standing, by (axis, the name a record holds).
STRATEGIES: dict[tuple[str, str], Proven | Written] = {
    ("kernel_source", "debian-archive"): Proven(
        "`linux-source-X.Y` of the kernel's version from the real archive (Debian 12 and 13)"
    ),
    ("kernel_source", "ubuntu-archive"): Written(
        "`linux-source-X.Y.0` (HWE: `linux-hwe-X.Y-source-X.Y.0`); run on a file:// repository laid out like "
        "Ubuntu's, never on Ubuntu's archive"
    ),
    ("current_kernel", "apt-metapackage"): Proven("the release `linux-image-<flavour>` depends on, from apt"),
    ("package_manager", "apt"): Proven("apt installs the headers, DKMS and the build tools (Debian 12 and 13)"),
    ("package_manager", "dnf"): Written("`rpm -q` / `dnf install`, unit-tested with the queries stood in"),
    ("package_manager", "pacman"): Written("`pacman -Q` / `pacman -S`, unit-tested with the queries stood in"),
    ("key_pair", "debian"): Proven("DKMS's `/var/lib/dkms/mok.key`, enrolled through MokManager in a Secure Boot VM"),
    ("key_pair", "ubuntu"): Written("shim-signed's MOK, enrolled with `update-secureboot-policy` (dry run only)"),
    ("key_pair", "fedora"): Written("akmods' key pair"),
    ("initramfs_tool", "update-initramfs"): Proven("initramfs-tools, then a boot loads the module from the image"),
    ("initramfs_tool", "dracut"): Proven("dracut in a debootstrapped root (chroot); not run on Fedora"),
    ("guest_image", "apt-download"): Proven("the kernel's image packages from the archive, booted under QEMU"),
    ("boot_loader", "grub"): Proven(
        "update-grub and grubenv: trial, confirmed and fallback boots of whole Debian 12 and 13 systems (BIOS, and "
        "UEFI with Secure Boot)"
    ),
    ("kernel_hooks", "debian-kernel-hooks"): Proven(
        "/etc/kernel/postinst.d, postrm.d and apt's DPkg::Post-Invoke, run by apt installing and purging a kernel "
        "(Debian 12, and a whole Debian 13 system)"
    ),
}

# What a platform lacks on an axis, by (axis, platform): what the stage says when a user needs it.
UNSUPPORTED: dict[tuple[str, str], Unsupported] = {
    ("kernel_source", "fedora"): Unsupported(
        "the SRPM unpacker (source/fedora_srpm.py) is not wired to a fetcher: give --source"
    ),
    ("kernel_source", "arch"): Unsupported("Arch's `linux` package source is not fetched: give --source"),
    ("current_kernel", "fedora"): Unsupported("the running kernel is used; give --kernel for another"),
    ("current_kernel", "arch"): Unsupported("the running kernel is used; give --kernel for another"),
    ("initramfs_tool", "arch"): Unsupported("mkinitcpio is refused: install stops before any change"),
    ("guest_image", "fedora"): Unsupported("no kernel image is fetched for vm-test: it needs the kernel installed"),
    ("guest_image", "arch"): Unsupported("no kernel image is fetched for vm-test: it needs the kernel installed"),
    ("boot_loader", "fedora"): Unsupported(
        "GRUB 2 with BLS entries (grub2-mkconfig, /boot/grub2/grubenv, grubby) is not driven: install goes on "
        "without the boot guard (the mask in modprobe.d); the experiment's kernel cells and their `apply` are refused"
    ),
    ("boot_loader", "arch"): Unsupported(
        "neither systemd-boot nor GRUB without update-grub (grub-mkconfig) is driven: install goes on without the "
        "boot guard (the mask in modprobe.d); the experiment's kernel cells and their `apply` are refused"
    ),
    ("kernel_hooks", "fedora"): Unsupported(
        "no kernel-install plugin is placed: `hooks install` refuses; run `rdna1-kmgr follow --kernel KREL` "
        "after installing a kernel"
    ),
    ("kernel_hooks", "arch"): Unsupported(
        "no pacman hook is placed: `hooks install` refuses; run `rdna1-kmgr follow --kernel KREL` after "
        "installing a kernel"
    ),
}


class NoStrategy(LookupError):
    """A platform record names something no stage knows, with no Unsupported entry saying so."""


def strategy_name(record: platform.Platform, axis: Axis) -> str | None:
    """The name the record holds for the axis (guest_image: whether it names image packages at all)."""
    if axis.field == "guest_image":
        return "apt-download" if record.guest_image else None
    if axis.field == "key_pair":
        return record.key_pair.name
    value = getattr(record, axis.field)
    return value if isinstance(value, str) else None


def standing(record: platform.Platform, axis: Axis) -> tuple[str | None, Standing]:
    """The strategy `record` gets on `axis` and its standing; NoStrategy when nothing accounts for it."""
    name = strategy_name(record, axis)
    unsupported = UNSUPPORTED.get((axis.field, record.name))
    if unsupported is not None:  # said first: a registered strategy may refuse (mkinitcpio's)
        return name, unsupported
    if name is not None and name in axis.registry():
        known = STRATEGIES.get((axis.field, name))
        if known is None:
            raise NoStrategy(f"{axis.field} {name!r} is in its registry but has no standing in conformance.py")
        return name, known
    named = f"names {axis.field} {name!r}, which no stage knows" if name else f"names no {axis.field}"
    raise NoStrategy(f"platforms.toml's {record.name} {named}, and conformance.py says nothing of it")


def _cell(platform_name: str, name: str | None, known: Standing) -> str:
    label = f"`{name}`: " if name and not isinstance(known, Unsupported) else ""
    match known:
        case Proven() if platform_name not in known.on:
            return f"written: {label}the code proven on {', '.join(known.on)} ({known.how})"
        case Proven():
            return f"**proven**: {label}{known.how}"
        case Written():
            return f"written: {label}{known.what}"
        case Unsupported():
            return f"missing: {known.reason}"


def markdown_table() -> list[str]:
    """The distributions table: a row per platform record, a column per axis."""
    lines = [
        "| distribution | " + " | ".join(axis.title for axis in AXES) + " |",
        "|---|" + "---|" * len(AXES),
    ]
    for record in platform.entries():
        cells = [_cell(record.name, *standing(record, axis)).replace("|", "\\|") for axis in AXES]
        lines.append(f"| {record.name} | " + " | ".join(cells) + " |")
    return lines
