"""QEMU facts every guest shares: the QEMU binary, the CPU asked for under KVM, the passed devices behind a PCIe
root port, and the command line of a bare guest: a kernel booted straight (no firmware menus, no disk), one CPU,
its serial console on stdout and nothing else, no reboot on panic. The KVM probe (engine.py) and the plumbing
guest (plumbing_guest.py) boot bare; virtme-ng builds its own command line and gets the devices from here."""

from __future__ import annotations

import shutil
from pathlib import Path

from rdna1_kmgr.core import user_input
from rdna1_kmgr.core.errors import HostError

KVM_CPU = "host,topoext=on"  # what vng asks for under KVM: the probe and the plumbing guest use the same
ROOT_PORT = "rdna1-kmgr-rp"  # QEMU id of the root port the passed devices sit behind
ROOT_PORT_IDS = ("0x1b36", "0x000c")  # QEMU's pcie-root-port as the guest sees it


def find_qemu() -> str:
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        raise HostError("qemu-system-x86_64 is not installed", "apt-get install qemu-system-x86")
    return qemu


def vfio_devices(addresses: tuple[str, ...] | list[str]) -> list[str]:
    """A PCIe root port with the devices on vfio-pci on it, one guest function per host function, in order, so
    the guest side can say exactly which of its devices came from the host."""
    args = ["-device", f"pcie-root-port,id={ROOT_PORT},bus=pcie.0,chassis=81,addr=0x1c"]
    for fn, bdf in enumerate(addresses):
        multi = ",multifunction=on" if fn == 0 and len(addresses) > 1 else ""
        args += ["-device", f"vfio-pci,host={user_input.pci_address(bdf)},bus={ROOT_PORT},addr=0x0.{fn}{multi}"]
    return args


def bare_console(
    qemu: str,
    machine: str,
    memory_mb: int,
    kernel: Path,
    append: str,
    cpu: str | None = None,
    initrd: Path | None = None,
) -> list[str]:
    argv = [qemu, "-machine", machine]
    if cpu:
        argv += ["-cpu", cpu]
    argv += ["-m", str(memory_mb), "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none"]
    argv += ["-monitor", "none", "-serial", "stdio", "-no-reboot", "-kernel", str(kernel)]
    if initrd:
        argv += ["-initrd", str(initrd)]
    return argv + ["-append", append]


def q35_initramfs_guest(
    qemu: str, accel: str, memory_mb: int, kernel: Path, append: str, initramfs: Path, tcg_cpu: str | None = None
) -> list[str]:
    """A bare q35 guest (PCIe, for 9p or a root port) that boots `kernel` into `initramfs`: KVM's CPU under
    KVM, `tcg_cpu` (QEMU's default when None) under TCG."""
    cpu = KVM_CPU if accel == "kvm" else tcg_cpu
    return bare_console(qemu, f"q35,accel={accel}", memory_mb, kernel, append, cpu=cpu, initrd=initramfs)
