"""The plain-QEMU guest ("qemu" in guest_registry) of a plumbing-only run: the kernel, a tiny initramfs, the
passed devices, and what it saw.

The guest only has to list its PCI devices, so it is QEMU with `-kernel` and an initramfs holding a static
busybox and one script (qemu/passthrough/init), not a virtme-ng guest: measured in a nested TCG guest here,
virtme-ng's guest init (systemd-tmpfiles, udev coldplug and settle) alone ran for more than ten minutes,
while this boots and reports in about two. The script prints one line per device; the host parses them into
the run's result ({kernel, devices}). It runs its own init, never a command.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rdna1_kmgr.core import runner
from rdna1_kmgr.vm import busybox_initramfs, qemu_args
from rdna1_kmgr.vm.guest import GuestRequest, GuestRun, say

NAME = "qemu"
MEMORY_MB = 256
LINE = "rdna1-kmgr-guest "


@dataclass(frozen=True)
class GuestPci:
    bdf: str
    vendor: str  # as sysfs prints it: 0x1234
    device: str
    pci_class: str
    parent: str  # the parent in the device tree: a bridge's address, or pci0000:00 for the root bus


@dataclass(frozen=True)
class PlainQemuGuest:
    qemu: str
    name: str = NAME

    def boot(self, request: GuestRequest) -> GuestRun:
        """Boot the kernel with the initramfs (written into the run folder) and the devices; read the console."""
        if request.command is not None:
            raise ValueError("the plain-QEMU guest runs its own init, no command")
        initramfs = build_initramfs(request.run / "initramfs.cpio")
        argv = qemu_argv(self.qemu, request.image_to_boot(), initramfs, request.accel, list(request.devices))
        say(request.booting_line())
        outcome = runner.run_session(argv, request.console, request.timeout, cwd="/")
        return GuestRun(outcome, request.console, parse_console(request.console.read_text(errors="replace")))


def find() -> PlainQemuGuest:
    qemu = qemu_args.find_qemu()
    busybox_initramfs.static_busybox()  # refuse now, not after the devices are bound
    return PlainQemuGuest(qemu)


def init_script() -> Path:
    return Path(str(resources.files("rdna1_kmgr.qemu") / "passthrough" / "init"))


def build_initramfs(dest: Path) -> Path:
    """Write an uncompressed newc cpio archive with /init and /bin/busybox to `dest`."""
    return busybox_initramfs.write(dest, init_script().read_bytes())


def qemu_argv(qemu: str, image: Path, initramfs: Path, accel: str, devices: list[str]) -> list[str]:
    """QEMU for the guest: q35 (PCIe, for the root port), one CPU, console on stdout, no reboot on panic, the
    devices (PCI addresses) behind the root port."""
    append = "console=ttyS0 panic=-1 quiet loglevel=3 rdinit=/init"
    guest = qemu_args.q35_initramfs_guest(qemu, accel, MEMORY_MB, image, append, initramfs)
    return guest + qemu_args.vfio_devices(devices)


def parse_console(text: str) -> dict | None:
    """{kernel, devices: [GuestPci...]} from the guest's lines, or None when it never said it was done."""
    kernel, devices, done = None, [], False
    for raw in text.replace("\r", "\n").splitlines():
        at = raw.find(LINE)
        if at < 0:
            continue
        words = raw[at + len(LINE) :].split()
        if words[:1] == ["kernel"] and len(words) == 2:
            kernel = words[1]
        elif words[:1] == ["pci"] and len(words) == 6:
            devices.append(GuestPci(*words[1:]))
        elif words == ["done"]:
            done = True
    if not done:
        return None
    return {"kernel": kernel, "devices": devices}
