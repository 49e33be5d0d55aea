"""The plain-QEMU guest ("qemu" in guest_registry) of a plumbing-only run: the kernel, a tiny initramfs, the
passed devices, and what it saw.

The guest only has to list its PCI devices, so it is QEMU with `-kernel` and an initramfs holding a static
busybox and one script (qemu/passthrough/init), not a virtme-ng guest: measured in a nested TCG guest here,
virtme-ng's guest init (systemd-tmpfiles, udev coldplug and settle) alone ran for more than ten minutes,
while this boots and reports in about two. The script prints one line per device; the host parses them into
the run's result ({kernel, devices}). It runs its own init, never a command.
"""

from __future__ import annotations

import shutil
import stat
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rdna1_kmgr.core import runner
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.vm import qemu_args
from rdna1_kmgr.vm.guest import GuestRequest, GuestRun, Reporter

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

    def boot(self, request: GuestRequest, report: Reporter) -> GuestRun:
        """Boot the kernel with the initramfs (written into the run folder) and the devices; read the console."""
        if request.command is not None:
            raise ValueError("the plain-QEMU guest runs its own init, no command")
        initramfs = build_initramfs(request.run / "initramfs.cpio")
        argv = qemu_argv(self.qemu, request.kernel.image, initramfs, request.accel, list(request.devices))
        report(request.booting_line())
        outcome = runner.run_session(argv, request.console, request.timeout, cwd="/")
        return GuestRun(outcome, request.console, parse_console(request.console.read_text(errors="replace")))


def find() -> PlainQemuGuest:
    qemu = qemu_args.find_qemu()
    static_busybox()  # refuse now, not after the devices are bound
    return PlainQemuGuest(qemu)


def init_script() -> Path:
    return Path(str(resources.files("rdna1_kmgr.qemu") / "passthrough" / "init"))


def static_busybox() -> Path:
    """The host's busybox, if it is a static binary (a dynamic one would need its libraries in the guest)."""
    found = shutil.which("busybox")
    if found is None:
        raise HostError("busybox is not installed", "apt-get install busybox-static")
    path = Path(found).resolve()
    if _is_dynamic_elf(path):
        raise HostError(
            f"{path} is linked dynamically; the plumbing guest needs a static busybox", "apt-get install busybox-static"
        )
    return path


def build_initramfs(dest: Path) -> Path:
    """Write an uncompressed newc cpio archive with /init and /bin/busybox to `dest`."""
    entries = [
        ("bin", stat.S_IFDIR | 0o755, b""),
        ("bin/busybox", stat.S_IFREG | 0o755, static_busybox().read_bytes()),
        ("init", stat.S_IFREG | 0o755, init_script().read_bytes()),
    ]
    with open(dest, "wb") as out:
        for ino, (name, mode, data) in enumerate(entries, start=1):
            out.write(_cpio_entry(ino, name, mode, data))
        out.write(_cpio_entry(0, "TRAILER!!!", 0, b""))
    return dest


def qemu_argv(qemu: str, image: Path, initramfs: Path, accel: str, devices: list[str]) -> list[str]:
    """QEMU for the guest: q35 (PCIe, for the root port), one CPU, console on stdout, no reboot on panic, the
    devices (PCI addresses) behind the root port."""
    argv = qemu_args.bare_console(
        qemu,
        f"q35,accel={accel}",
        MEMORY_MB,
        image,
        "console=ttyS0 panic=-1 quiet loglevel=3 rdinit=/init",
        cpu=qemu_args.KVM_CPU if accel == "kvm" else None,
        initrd=initramfs,
    )
    return argv + qemu_args.vfio_devices(devices)


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


def _cpio_entry(ino: int, name: str, mode: int, data: bytes) -> bytes:
    encoded = name.encode() + b"\0"
    fields = [ino, mode, 0, 0, 1 if not stat.S_ISDIR(mode) else 2, 0, len(data), 0, 0, 0, 0, len(encoded), 0]
    header = b"070701" + b"".join(b"%08X" % f for f in fields)
    return _pad(header + encoded) + _pad(data)


def _pad(chunk: bytes) -> bytes:
    return chunk + b"\0" * (-len(chunk) % 4)


def _is_dynamic_elf(path: Path) -> bool:
    """Whether an ELF64 file has a PT_INTERP program header (it needs a dynamic loader)."""
    with open(path, "rb") as handle:
        head = handle.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            raise HostError(f"{path} is not a 64-bit ELF program", "apt-get install busybox-static")
        phoff = int.from_bytes(head[32:40], "little")
        phentsize = int.from_bytes(head[54:56], "little")
        phnum = int.from_bytes(head[56:58], "little")
        handle.seek(phoff)
        table = handle.read(phentsize * phnum)
    return any(int.from_bytes(table[i * phentsize : i * phentsize + 4], "little") == 3 for i in range(phnum))
