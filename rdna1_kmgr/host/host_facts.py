"""Facts about the host that later steps decide on: kernel, distro, GPUs, headers, DKMS, Secure Boot, IOMMU, KVM.

Pure reads. With a sysroot other than / everything comes from files under it (a fixture tree or a mounted
system), and nothing is asked of the running kernel or of programs on the host.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

import distro

from rdna1_kmgr.core import runner, user_input
from rdna1_kmgr.core.errors import HostError, KmgrError, UsageError
from rdna1_kmgr.host import sysfs
from rdna1_kmgr.host.rdna1_boards import (
    AMD_VENDOR,
    DEFAULT_TARGET,
    RDNA1_IDS,
    chip_of,
    family_ids,
    format_id,
    is_rdna1,
)

EFI_GLOBAL_GUID = "8be4df61-93ca-11d2-aa0d-00e098032b8c"
SECURE_BOOT_VAR = f"sys/firmware/efi/efivars/SecureBoot-{EFI_GLOBAL_GUID}"


@dataclass(frozen=True)
class HostFacts:
    sysroot: Path
    kernel_release: str
    distro_id: str
    distro_version: str
    distro_name: str
    display_devices: tuple[sysfs.PciDevice, ...]
    target_id: int
    headers_path: str  # as seen from inside the sysroot: /lib/modules/KREL/build
    headers_present: bool
    dkms_version: str | None  # None: not installed, or not asked (sysroot other than /)
    secure_boot_enabled: bool
    secure_boot_state: str  # enabled, disabled, or why it cannot be (BIOS boot, no variable)
    iommu_enabled: bool
    kvm_present: bool

    @property
    def rdna1_devices(self) -> tuple[sysfs.PciDevice, ...]:
        return tuple(dev for dev in self.display_devices if is_rdna1(dev.vendor, dev.device))

    @property
    def target(self) -> sysfs.PciDevice | None:
        """The first display device that is the target board, in address order."""
        return next((dev for dev in self.display_devices if _is_target(dev, self.target_id)), None)

    def to_json(self) -> dict:
        target = self.target
        return {
            "sysroot": str(self.sysroot),
            "kernel_release": self.kernel_release,
            "distro": {"id": self.distro_id, "version": self.distro_version, "name": self.distro_name},
            "display_devices": [
                {
                    **dev.to_json(),
                    "rdna1": is_rdna1(dev.vendor, dev.device),
                    "chip": chip_of(dev.device) if dev.vendor == AMD_VENDOR else None,
                    "target": target is not None and dev.bdf == target.bdf,
                }
                for dev in self.display_devices
            ],
            "rdna1_gpus": [dev.bdf for dev in self.rdna1_devices],
            "target": {
                "device_id": format_id(self.target_id),
                "chip": chip_of(self.target_id),
                "bdf": target.bdf if target else None,
            },
            "headers": {"path": self.headers_path, "present": self.headers_present},
            "dkms_version": self.dkms_version,
            "secure_boot": {"enabled": self.secure_boot_enabled, "state": self.secure_boot_state},
            "iommu_enabled": self.iommu_enabled,
            "kvm_present": self.kvm_present,
        }


def detect(sysroot: Path = Path("/"), target: int = DEFAULT_TARGET) -> HostFacts:
    check_target(target)
    on_host = sysroot.resolve() == Path("/")
    krel = _kernel_release(sysroot, on_host)
    distro_id, distro_version, distro_name = _distro(sysroot, on_host)
    headers = f"/lib/modules/{krel}/build"
    secure_boot_enabled, secure_boot_state = _secure_boot(sysroot)
    return HostFacts(
        sysroot=sysroot,
        kernel_release=krel,
        distro_id=distro_id,
        distro_version=distro_version,
        distro_name=distro_name,
        display_devices=sysfs.list_display_devices(sysroot),
        target_id=target,
        headers_path=headers,
        headers_present=_exists_within(sysroot, headers),
        dkms_version=_dkms_version() if on_host else None,
        secure_boot_enabled=secure_boot_enabled,
        secure_boot_state=secure_boot_state,
        iommu_enabled=_has_entries(sysroot / "sys/class/iommu") or _has_entries(sysroot / "sys/kernel/iommu_groups"),
        kvm_present=(sysroot / "dev/kvm").exists(),
    )


@dataclass(frozen=True)
class BoardDevices:
    """The device ids a build applies its quirks to when none is given, and the boards they come from."""

    ids: tuple[int, ...]
    found: tuple[sysfs.PciDevice, ...]  # the RDNA1 boards of this machine; none: a build host

    def describe(self) -> str:
        ids = " ".join(format_id(i) for i in self.ids)
        if not self.found:
            return f"devices {ids} (no RDNA1 board found here: the RX 5600 XT's; --device names others)"
        boards = ", ".join(f"{chip_of(d.device)} {format_id(d.device)} at {d.bdf}" for d in self.found)
        return f"devices {ids} (every id of the RDNA1 chips found here: {boards})"


def board_devices(sysroot: Path = Path("/")) -> BoardDevices:
    """Every id of the chip families of the RDNA1 boards under sysroot's sysfs; the RX 5600 XT's id when there
    is none (a machine that builds for another)."""
    found = tuple(d for d in sysfs.list_display_devices(sysroot) if is_rdna1(d.vendor, d.device))
    return BoardDevices(family_ids([d.device for d in found]) if found else (DEFAULT_TARGET,), found)


def check_target(device_id: int) -> int:
    """A target board must be one of the RDNA1 ids: the patches only know those."""
    if chip_of(device_id) is None:
        raise UsageError(
            f"{format_id(device_id)} is not an RDNA1 device id",
            "give one of " + " ".join(format_id(i) for i in RDNA1_IDS),
        )
    return device_id


def _is_target(dev: sysfs.PciDevice, target_id: int) -> bool:
    return dev.vendor == AMD_VENDOR and dev.device == target_id


def _kernel_release(sysroot: Path, on_host: bool) -> str:
    if on_host:
        return os.uname().release
    path = sysroot / "proc/sys/kernel/osrelease"
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        raise HostError(f"cannot read the kernel release: {path} is missing", "is it a system's root?") from None
    return user_input.kernel_release(text)


def _distro(sysroot: Path, on_host: bool) -> tuple[str, str, str]:
    # With root_dir, distro reads only files under it (os-release, *-release) and runs no lsb_release/uname.
    info = distro if on_host else distro.LinuxDistribution(root_dir=str(sysroot))
    return info.id(), info.version(), info.name(pretty=True)


def _secure_boot(sysroot: Path) -> tuple[bool, str]:
    if not (sysroot / "sys/firmware/efi").is_dir():
        return False, "unsupported (BIOS boot)"
    try:
        data = (sysroot / SECURE_BOOT_VAR).read_bytes()
    except FileNotFoundError:
        return False, "unsupported (no SecureBoot variable)"
    # efivarfs files start with 4 bytes of variable attributes; the value is the byte after them.
    if len(data) < 5:
        return False, "unknown (SecureBoot variable too short)"
    return (True, "enabled") if data[4] == 1 else (False, "disabled")


def _exists_within(sysroot: Path, path: str) -> bool:
    """Whether path exists inside sysroot, following one absolute symlink inside it, not on the host.

    Debian's /lib/modules/KREL/build is an absolute link to /usr/src/linux-headers-KREL.
    """
    full = sysroot / path.lstrip("/")
    if full.is_symlink():
        link = os.readlink(full)
        if os.path.isabs(link):
            full = sysroot / link.lstrip("/")
    return full.exists()


def _has_entries(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def _dkms_version() -> str | None:
    if runner.which("dkms") is None:
        return None
    try:
        out = runner.run(["dkms", "--version"], timeout=10).stdout
    except KmgrError:
        return None
    # "dkms-3.0.10" (Debian 12), "dkms: 2.8.7" (older)
    match = re.search(r"\d+(\.\d+)+", str(out))
    return match.group(0) if match else None
