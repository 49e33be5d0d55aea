"""Reset readiness: can a board be reset when the VM lets go of it, or may it stay dead until a power cycle?

Navi10/12/14 (every RDNA1 board) and Vega10/20 have the "AMD reset bug": the resets the kernel has for them
(FLR, bus reset) do not bring the board back to a state its driver can start from, so after a VM used it the
board may not work again (in a second VM, or on the host's amdgpu) until the machine is powered off. The
out-of-tree vendor-reset module adds a device-specific reset that does work; on kernels >= 5.15 the method the
kernel will use is listed first in /sys/bus/pci/devices/<BDF>/reset_method, `device_specific` for vendor-reset.
Older kernels have no such file (and newer ones hide it for a device they cannot reset at all), so then
there is no way to confirm what will happen.
"""

from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.host import sysfs
from rdna1_kmgr.host.rdna1_boards import AMD_VENDOR, CHIPS

# amdgpu's pciidlist: Vega10 (RX Vega 56/64, Instinct MI25) and Vega20 (Radeon VII, MI50/MI60).
_VEGA = {
    "vega10": (
        0x6860,
        0x6861,
        0x6862,
        0x6863,
        0x6864,
        0x6867,
        0x6868,
        0x6869,
        0x686A,
        0x686B,
        0x686C,
        0x686D,
        0x686E,
        0x686F,
        0x687F,
    ),
    "vega20": (0x66A0, 0x66A1, 0x66A2, 0x66A3, 0x66A4, 0x66A7, 0x66AF),
}
RESET_BUG_CHIPS = {chip.name: chip.device_ids for chip in CHIPS} | _VEGA

VENDOR_RESET_METHOD = "device_specific"
VENDOR_RESET_URL = "https://github.com/gnif/vendor-reset"
HOW_TO_GET_VENDOR_RESET = (
    f"install vendor-reset ({VENDOR_RESET_URL}, builds with DKMS), `modprobe vendor-reset`, then "
    "`echo device_specific > /sys/bus/pci/devices/{bdf}/reset_method`; or pass --accept-reset-risk"
)


@dataclass(frozen=True)
class Readiness:
    bdf: str
    chip: str | None  # the chip with the reset bug, None for a board without it
    methods: tuple[str, ...] | None  # the kernel's reset_method, None when the kernel has no such file
    vendor_reset_loaded: bool
    ready: bool  # safe to hand to a VM as far as resets go
    detail: str  # one line: why it is ready or what the risk is

    @property
    def has_reset_bug(self) -> bool:
        return self.chip is not None

    def to_json(self) -> dict:
        return {
            "bdf": self.bdf,
            "reset_bug_chip": self.chip,
            "reset_method": None if self.methods is None else list(self.methods),
            "vendor_reset_loaded": self.vendor_reset_loaded,
            "ready": self.ready,
            "detail": self.detail,
        }


def reset_bug_chip(vendor: int, device: int) -> str | None:
    if vendor != AMD_VENDOR:
        return None
    return next((name for name, ids in RESET_BUG_CHIPS.items() if device in ids), None)


def assess(dev: sysfs.PciDevice, sysroot: Path = Path("/")) -> Readiness:
    chip = reset_bug_chip(dev.vendor, dev.device)
    loaded = (sysroot / "sys/module/vendor_reset").is_dir()
    methods = dev.reset_method
    ident = f"{dev.bdf} ({chip} {dev.vendor:04x}:{dev.device:04x})"
    if chip is None:
        shown = "none" if not methods else " ".join(methods)
        return Readiness(
            dev.bdf,
            None,
            methods,
            loaded,
            True,
            f"{dev.bdf} ({dev.vendor:04x}:{dev.device:04x}) has no known reset bug (reset methods: {shown})",
        )
    if methods is None:
        # Kernels < 5.15 have no reset_method file; newer ones hide it when they know no reset at all.
        detail = (
            f"{ident} has the AMD reset bug and no reset_method file (a kernel < 5.15, or no reset "
            "method at all), so nothing shows that vendor-reset will reset it"
        )
        return Readiness(dev.bdf, chip, None, loaded, False, detail)
    if methods and methods[0] == VENDOR_RESET_METHOD:
        detail = f"{ident} will be reset by {VENDOR_RESET_METHOD}" + (
            " (vendor-reset is loaded)" if loaded else " (vendor_reset is not in /sys/module: built in?)"
        )
        return Readiness(dev.bdf, chip, methods, loaded, True, detail)
    used = methods[0] if methods else "nothing"
    also = f" ({VENDOR_RESET_METHOD} is listed but not first)" if VENDOR_RESET_METHOD in methods else ""
    detail = (
        f"{ident} has the AMD reset bug and would be reset by {used!r}, not vendor-reset's "
        f"{VENDOR_RESET_METHOD}{also}"
    )
    return Readiness(dev.bdf, chip, methods, loaded, False, detail)


def require(devices: list[sysfs.PciDevice], accept_risk: bool, sysroot: Path = Path("/")) -> list[Readiness]:
    """Assess every device that will go to the VM; refuse in one line unless the user accepts the risk."""
    found = [assess(dev, sysroot) for dev in devices]
    risky = [r for r in found if not r.ready]
    if risky and not accept_risk:
        first = risky[0]
        raise HostError(
            f"{first.detail}: after the VM it may stay dead until the machine is powered off and on",
            HOW_TO_GET_VENDOR_RESET.format(bdf=first.bdf),
        )
    return found
