"""The QEMU command line of a bare guest: a kernel booted straight (no firmware menus, no disk), one CPU, its
serial console on stdout and nothing else, no reboot on panic. The KVM probe (engine.py) and the plumbing guest
(plumbing_guest.py) boot this way; virtme-ng builds its own."""

from __future__ import annotations

from pathlib import Path


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
