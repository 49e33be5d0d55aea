"""PCI devices as sysfs shows them: identity, bound driver, IOMMU group, reset methods.

Every function takes a sysroot so tests (and a mounted system) can point it at a tree other than /.
Symlinks are read with readlink, never followed: under a sysroot an absolute link would point at the host.
"""

import os
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core.errors import HostError

DISPLAY_CLASS = 0x03  # PCI base class "display controller" (VGA 0x0300, 3D 0x0302, other 0x0380)


@dataclass(frozen=True)
class PciDevice:
    bdf: str  # 0000:03:00.0
    vendor: int
    device: int
    pci_class: int  # 24 bits: base class, subclass, programming interface (0x030000)
    driver: str | None  # name of the bound driver, None when unbound
    boot_vga: bool | None  # None when the kernel has no boot_vga file (only VGA-class devices get one)
    iommu_group: int | None  # None when the IOMMU is off
    group_members: tuple[str, ...]  # the *other* devices of the IOMMU group, sorted; they pass through together
    reset_method: tuple[str, ...] | None  # in the kernel's order; None on kernels (< 5.15) without the file

    @property
    def is_display(self) -> bool:
        return self.pci_class >> 16 == DISPLAY_CLASS

    def to_json(self) -> dict:
        return {
            "bdf": self.bdf,
            "vendor": f"0x{self.vendor:04X}",
            "device": f"0x{self.device:04X}",
            "class": f"0x{self.pci_class:06X}",
            "driver": self.driver,
            "boot_vga": self.boot_vga,
            "iommu_group": self.iommu_group,
            "group_members": list(self.group_members),
            "reset_method": None if self.reset_method is None else list(self.reset_method),
        }


def devices_dir(sysroot: Path = Path("/")) -> Path:
    return sysroot / "sys/bus/pci/devices"


def list_devices(sysroot: Path = Path("/")) -> tuple[PciDevice, ...]:
    """Every PCI device, sorted by address. No PCI bus (some containers) means none."""
    root = devices_dir(sysroot)
    if not root.is_dir():
        return ()
    return tuple(read_device(entry.name, sysroot) for entry in sorted(root.iterdir()))


def list_display_devices(sysroot: Path = Path("/")) -> tuple[PciDevice, ...]:
    return tuple(dev for dev in list_devices(sysroot) if dev.is_display)


def read_device(bdf: str, sysroot: Path = Path("/")) -> PciDevice:
    """One device by its address (give it through validate.pci_address first)."""
    path = devices_dir(sysroot) / bdf
    if not path.is_dir():
        raise HostError(f"no PCI device {bdf} in {devices_dir(sysroot)}", "list the devices with `lspci -D`")
    group = _link_name(path / "iommu_group")
    boot_vga = _read_text(path / "boot_vga")
    reset_method = _read_text(path / "reset_method")
    return PciDevice(
        bdf=bdf,
        vendor=_read_hex(path / "vendor"),
        device=_read_hex(path / "device"),
        pci_class=_read_hex(path / "class"),
        driver=_link_name(path / "driver"),
        boot_vga=None if boot_vga is None else boot_vga == "1",
        iommu_group=None if group is None else int(group),
        group_members=_group_members(sysroot, group, bdf),
        reset_method=None if reset_method is None else tuple(reset_method.split()),
    )


def driver_override(bdf: str, sysroot: Path = Path("/")) -> str | None:
    """The driver a device is pinned to by driver_override, None when unset ("(null)") or unsupported."""
    text = _read_text(devices_dir(sysroot) / bdf / "driver_override")
    return None if text in (None, "", "(null)") else text


def drm_nodes(bdf: str, sysroot: Path = Path("/")) -> tuple[str, ...]:
    """The DRM minors a bound GPU driver made for the device: card0, renderD128 (none when unbound)."""
    drm = devices_dir(sysroot) / bdf / "drm"
    if not drm.is_dir():
        return ()
    return tuple(sorted(e.name for e in drm.iterdir() if e.name.startswith(("card", "renderD"))))


def _group_members(sysroot: Path, group: str | None, bdf: str) -> tuple[str, ...]:
    if group is None:
        return ()
    members = sysroot / "sys/kernel/iommu_groups" / group / "devices"
    if not members.is_dir():
        return ()
    return tuple(sorted(entry.name for entry in members.iterdir() if entry.name != bdf))


def _link_name(link: Path) -> str | None:
    """The last component of a symlink's target: driver name, IOMMU group number."""
    try:
        return os.path.basename(os.readlink(link))
    except OSError:  # absent: no driver bound, or no IOMMU
        return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def _read_hex(path: Path) -> int:
    text = _read_text(path)
    if text is None:
        raise HostError(f"{path} is missing", "the sysfs tree is incomplete; is /sys mounted?")
    try:
        return int(text, 16)
    except ValueError:
        raise HostError(f"{path} holds {text!r}, not a hex number", "the sysfs tree is damaged") from None
