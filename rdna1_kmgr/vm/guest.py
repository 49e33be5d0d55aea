"""The seam between what a VM run wants and the program that boots it.

A run asks for a `GuestRequest`: a kernel, the host folder the guest reports into (and what else the guest
must see), the PCI devices it gets over VFIO, the acceleration, a hard time limit and the command the guest
runs. A `Guest` boots it and gives back a `GuestRun`. The guests are named in guest_registry.py: plain QEMU
with a busybox initramfs over the host's root, read-only, and no init system (hostroot_guest.py; the emulated
module test), virtme-ng, the host's own operating system with udev (virtme_guest.py; runs with a device passed
and the matrix), and plain QEMU with a busybox initramfs that only lists the guest's PCI devices
(plumbing_guest.py; the plumbing-only run). How each turns the request into a command line is its own
business: no caller names a guest program's options.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rdna1_kmgr.core import progress, runner
from rdna1_kmgr.vm import guest_kernel, guest_view, kernel_image


def say(line: str) -> None:
    """One line of a VM run's progress (core/progress: whoever keeps the story, follow's log, gets it too)."""
    progress.say(f"vm-test: {line}")


@dataclass(frozen=True)
class GuestRequest:
    kernel: guest_kernel.GuestKernel
    run: Path  # the host's run folder: the guest's own files, and what it writes back (result.json)
    console: Path  # where the guest's console goes
    accel: str  # kvm or tcg (engine.choose_accel decides)
    timeout: float  # hard limit in seconds; the guest is killed with its whole session after it
    devices: tuple[str, ...] = ()  # PCI addresses, on vfio-pci already, handed to the guest behind a root port
    command: str | None = None  # the shell line the guest runs; None: the guest's own init
    view: guest_view.GuestView | None = None  # the host folders the guest sees (virtme-ng)

    def image_to_boot(self) -> Path:
        """The kernel image QEMU boots directly: under TCG the bzImage's own decompressor costs seconds (tens of
        them in a nested guest), so its vmlinux, unpacked into the run folder, where it can; under KVM it costs
        nothing."""
        if self.accel == "tcg":
            return kernel_image.fastest(self.kernel.image, self.run)
        return self.kernel.image

    def booting_line(self) -> str:
        passed = f" with {' '.join(self.devices)}" if self.devices else ""
        return (
            f"booting {self.kernel.release}{passed} ({self.accel}, hard limit {self.timeout:.0f} s), "
            f"console log {self.console}"
        )


@dataclass(frozen=True)
class GuestRun:
    """What came back from one boot: how QEMU ended, its console, what the guest reported (None: nothing),
    and the boot stages seen on the console with the seconds since the start."""

    outcome: runner.Outcome
    console: Path
    result: dict | None
    stages: tuple[tuple[float, str], ...] = ()

    def problem(self, timeout: float) -> str | None:
        """Why the run did not end well, with the end of the console, or None."""
        if self.outcome.timed_out:
            return f"timed out after {timeout:.0f} s and was killed; console tail: {self.console_tail()}"
        if self.result is None:
            return (
                f"the VM ended (exit {self.outcome.returncode}) without a result; console tail: {self.console_tail()}"
            )
        if not self.result.get("finished"):
            return f"the guest stopped before finishing; console tail: {self.console_tail()}"
        return None

    def console_tail(self, lines: int = 6) -> str:
        try:
            return tail(self.console.read_text(errors="replace"), lines) or "(empty)"
        except OSError:
            return "(no console log)"


class Guest(Protocol):
    @property
    def name(self) -> str: ...  # as guest_registry knows it

    @property
    def qemu(self) -> str: ...  # the QEMU it runs (the KVM probe boots the same one)

    def boot(self, request: GuestRequest) -> GuestRun: ...


# Console lines that mark boot stages: (pattern, stage name), or no name to take the pattern's first group.
Stages = tuple[tuple[re.Pattern, str | None], ...]
KERNEL_STARTED: Stages = ((re.compile(r"Linux version \S+"), "kernel started"),)
COMMAND_STEPS: Stages = (
    (re.compile(r"rdna1-kmgr: stage (.+)"), None),  # collect.py's own steps
    (re.compile(r"reboot: Power down"), "guest powered off"),
)


def console_stages(*init_stages: tuple[re.Pattern, str | None]) -> Stages:
    """The stages of a guest that runs collect.py: those every such guest's console shows (the kernel's first
    line, collect.py's steps, the kernel's last line), with the guest's own init's after the first."""
    return (*KERNEL_STARTED, *init_stages, *COMMAND_STEPS)


class StageWatcher:
    """Follows the console as it grows; reports each boot stage once, with the time since the start."""

    def __init__(self, stages: Stages, clock=time.monotonic):
        self.patterns = stages
        self.clock = clock
        self.started = clock()
        self.stages: list[tuple[float, str]] = []
        self._partial = ""

    def feed(self, chunk: str) -> bool:
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line)
        return False  # never stops the run

    def _line(self, line: str) -> None:
        for pattern, name in self.patterns:
            match = pattern.search(line)
            if match:
                stage = name or match.group(1).strip()
                if all(stage != seen for _, seen in self.stages):
                    elapsed = self.clock() - self.started
                    self.stages.append((round(elapsed, 1), stage))
                    say(f"{elapsed:5.1f} s  {stage}")
                return


def read_result(run: Path) -> dict | None:
    """The result.json the guest side wrote into the run folder, or None."""
    try:
        return json.loads((run / "result.json").read_text())
    except (OSError, ValueError):
        return None


def tail(text: str, lines: int) -> str:
    kept = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return " | ".join(kept[-lines:])
