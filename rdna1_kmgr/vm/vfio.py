"""Handing PCI devices to vfio-pci for a VM and giving them back: the host checks, the bind and the restore.

A device can only go to a VM with its whole IOMMU group: the IOMMU cannot tell its members apart. So the
plan takes the device and the other functions of its slot (a GPU's HDMI/DP audio), leaves bridges and idle
devices where they are (the kernel allows those in a group a VM owns) and refuses a group that holds
anything else in use on the host.

The bind uses driver_override, not new_id: it pins one device, not every device with that id, and writing
an empty line takes it back. Every function takes a sysroot for what it reads, so the checks run on fixture
trees; writes only make sense on a real kernel's sysfs.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import runner, user_input
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.host import sysfs
from rdna1_kmgr.vm.vfio_journal import Binding

VFIO_DRIVER = "vfio-pci"
# Drivers a group member may keep while the group belongs to a VM (they do no DMA of their own).
HARMLESS_DRIVERS = frozenset({VFIO_DRIVER, "pci-stub", "pcieport"})
# Base class 0x06 subclasses with a type 1/2 header: PCI-to-PCI, CardBus, semi-transparent PCI-to-PCI bridges.
BRIDGE_CLASSES = frozenset({0x0604, 0x0607, 0x0609})
BIND_WAIT = 10.0  # seconds for a driver to show up bound after a write
RETURN_WAIT = 60.0  # amdgpu takes seconds to initialise a board it gets back
IOMMU_HINT = (
    "enable VT-d / AMD-Vi (IOMMU, SVM) in the firmware and boot with intel_iommu=on (Intel) or "
    "amd_iommu=on (AMD) on the kernel command line"
)


@dataclass(frozen=True)
class GroupPlan:
    target: sysfs.PciDevice
    iommu_group: int
    passed: tuple[sysfs.PciDevice, ...]  # to vfio-pci and into the VM: the target and its slot's functions
    left: tuple[tuple[str, str], ...]  # (bdf, why it may stay) for the rest of the group

    def to_json(self) -> dict:
        return {
            "iommu_group": self.iommu_group,
            "passed": [dev.bdf for dev in self.passed],
            "left": [{"bdf": bdf, "why": why} for bdf, why in self.left],
        }


@dataclass(frozen=True)
class CameBack:
    """Whether a GPU given back to amdgpu works again (passthrough.came_back), and what was seen."""

    ok: bool
    detail: str


@dataclass(frozen=True)
class Returned:
    """A device given back after a run (or left on vfio-pci, and why)."""

    bdf: str
    wanted: str | None  # the driver it had before the run
    driver: str | None  # the driver it has now
    ok: bool
    detail: str
    came_back: CameBack | None = None  # a GPU back on amdgpu, checked; None: not a GPU back on amdgpu

    def to_json(self) -> dict:
        out: dict = {
            "bdf": self.bdf,
            "wanted": self.wanted,
            "driver": self.driver,
            "ok": self.ok,
            "detail": self.detail,
        }
        if self.came_back is not None:
            out["came_back"] = {"ok": self.came_back.ok, "detail": self.came_back.detail}
        return out


# --- checks (read only) -------------------------------------------------------------------------------------


def plan_group(bdf: str, sysroot: Path = Path("/")) -> GroupPlan:
    """Which devices go to the VM with `bdf`; refuses when the IOMMU is off or the group holds a stranger."""
    dev = sysfs.read_device(user_input.pci_address(bdf), sysroot)
    if dev.iommu_group is None:
        groups = sysroot / "sys/kernel/iommu_groups"
        if not groups.is_dir() or not any(groups.iterdir()):
            raise HostError(f"the IOMMU is off ({bdf} has no IOMMU group)", IOMMU_HINT)
        raise HostError(f"{bdf} is in no IOMMU group although the IOMMU is on", "it cannot be passed to a VM")
    passed, left, strangers = [dev], [], []
    for bdf_other in dev.group_members:
        other = sysfs.read_device(bdf_other, sysroot)
        if _slot(other.bdf) == _slot(dev.bdf):
            passed.append(other)
        elif other.pci_class >> 8 in BRIDGE_CLASSES:
            left.append((other.bdf, "PCI bridge"))
        elif other.driver is None or other.driver in HARMLESS_DRIVERS:
            left.append((other.bdf, f"not in use (driver {other.driver or 'none'})"))
        else:
            strangers.append(other)
    if strangers:
        s = strangers[0]
        raise HostError(
            f"IOMMU group {dev.iommu_group} of {bdf} also holds {s.bdf} ({s.vendor:04x}:{s.device:04x}, driver "
            f"{s.driver}), which is not part of the device: a VM would take it from the host too",
            "put the card in a slot with an IOMMU group of its own (list them under /sys/kernel/iommu_groups) "
            "or enable ACS in the firmware",
        )
    return GroupPlan(dev, dev.iommu_group, tuple(sorted(passed, key=lambda d: d.bdf)), tuple(left))


def display_use(dev: sysfs.PciDevice, sysroot: Path = Path("/")) -> list[str]:
    """Why `dev` looks like it drives this host's display: boot VGA, or its DRM nodes open in a process."""
    reasons = []
    if dev.boot_vga:
        reasons.append("it is the boot VGA device (boot_vga=1)")
    for node in sysfs.drm_nodes(dev.bdf, sysroot):
        for pid, name in holders(f"/dev/dri/{node}", sysroot):
            reasons.append(f"/dev/dri/{node} is open in {name} (pid {pid})")
    return reasons


def refuse_display(plan: GroupPlan, force: bool, sysroot: Path = Path("/")) -> list[str]:
    """Refuse a group whose devices drive the display, unless forced; returns what --force went past."""
    for dev in plan.passed:
        reasons = display_use(dev, sysroot)
        if reasons and not force:
            raise HostError(
                f"{dev.bdf} drives this host's display: {reasons[0]}",
                "run the desktop on another GPU (or none: a headless host), or pass --force to take it anyway "
                "(the screen goes dark until the run ends)",
            )
        if reasons:
            return [f"{dev.bdf}: {r}" for r in reasons]
    return []


def ensure_vfio_pci(sysroot: Path = Path("/")) -> None:
    """vfio-pci must be registered; on the running host, `modprobe vfio-pci` when it is not yet."""
    if (sysroot / "sys/bus/pci/drivers" / VFIO_DRIVER).is_dir():
        return
    hint = "use a kernel built with CONFIG_VFIO_PCI (every distro kernel has it as a module)"
    if sysroot.resolve() != Path("/"):
        raise HostError(f"{VFIO_DRIVER} is not loaded in {sysroot}", hint)
    runner.run(["modprobe", VFIO_DRIVER], timeout=60, doing=f"{VFIO_DRIVER} is not available: modprobe", hint=hint)
    if not (sysroot / "sys/bus/pci/drivers" / VFIO_DRIVER).is_dir():
        raise HostError(f"{VFIO_DRIVER} is not available: modprobe {VFIO_DRIVER} registered no driver", hint)


def holders(device_path: str, sysroot: Path = Path("/")) -> list[tuple[int, str]]:
    """(pid, command name) of every process with `device_path` open, from the fd links under /proc."""
    found: list[tuple[int, str]] = []
    proc = sysroot / "proc"
    if not proc.is_dir():
        return found
    for entry in sorted(proc.iterdir(), key=lambda p: p.name):
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == device_path:
                    found.append((int(entry.name), _comm(entry)))
                    break
            except OSError:
                continue
    return found


# --- changes (a real kernel's sysfs) ----------------------------------------------------------------------


def bind(dev: sysfs.PciDevice, sysroot: Path = Path("/")) -> None:
    """Move `dev` from its driver to vfio-pci. Its Binding must already be journaled."""
    path = sysfs.devices_dir(sysroot) / dev.bdf
    _write(path / "driver_override", VFIO_DRIVER)
    if current_driver(dev.bdf, sysroot) is not None:
        _write(path / "driver" / "unbind", dev.bdf)
    _write(sysroot / "sys/bus/pci/drivers_probe", dev.bdf)
    now = _wait_for_driver(dev.bdf, VFIO_DRIVER, BIND_WAIT, sysroot)
    if now != VFIO_DRIVER:
        raise HostError(
            f"{dev.bdf} did not bind to {VFIO_DRIVER} (driver now: {now or 'none'})",
            "see the kernel log (dmesg) for vfio-pci's reason",
        )


def group_node(group: int, sysroot: Path = Path("/"), wait: float = BIND_WAIT) -> Path | None:
    """/dev/vfio/<group>, once it exists (devtmpfs makes it shortly after the bind), else None."""
    node = sysroot / "dev/vfio" / str(group)
    deadline = time.monotonic() + wait
    while not node.exists():
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)
    return node


def give_back(binding: Binding, sysroot: Path = Path("/"), wait: float = RETURN_WAIT) -> Returned:
    """Put a journaled device back exactly as it was: off vfio-pci, its own override, its own driver.

    Safe to repeat: every step looks at the device first, so a restore that was itself interrupted, or a
    device already back, just ends where it should.
    """
    bdf, wanted = binding.bdf, binding.driver
    path = sysfs.devices_dir(sysroot) / bdf
    if not path.is_dir():
        return Returned(bdf, wanted, None, False, f"{bdf} is no longer on the PCI bus")
    problems = []
    now = current_driver(bdf, sysroot)
    if now == VFIO_DRIVER and wanted != VFIO_DRIVER:
        problems += _try_write(path / "driver" / "unbind", bdf)
    if sysfs.driver_override(bdf, sysroot) != binding.driver_override:
        # An empty line clears it; the kernel rejects writing nothing at all.
        problems += _try_write(path / "driver_override", binding.driver_override or "\n")
    if wanted is not None and current_driver(bdf, sysroot) is None:
        bind_file = sysroot / "sys/bus/pci/drivers" / wanted / "bind"
        # Bind to exactly the driver it had; drivers_probe (the kernel's own choice) if that is not loaded.
        failed = _try_write(bind_file, bdf) if bind_file.exists() else ["not loaded"]
        if failed and current_driver(bdf, sysroot) is None:
            problems += [f"bind to {wanted}: {failed[0]}"]
            problems += _try_write(sysroot / "sys/bus/pci/drivers_probe", bdf)
    now = _wait_for_driver(bdf, wanted, wait, sysroot) if wanted else current_driver(bdf, sysroot)
    override = sysfs.driver_override(bdf, sysroot)
    ok = now == wanted and override == binding.driver_override
    if ok:
        detail = f"{bdf} is back on {wanted}" if wanted else f"{bdf} is back to no driver"
    else:
        detail = f"{bdf} has driver {now or 'none'} (wanted {wanted or 'none'})"
        if override != binding.driver_override:
            detail += f", driver_override {override!r} (wanted {binding.driver_override!r})"
    if problems:
        detail += "; " + "; ".join(problems)
    return Returned(bdf, wanted, now, ok, detail)


def current_driver(bdf: str, sysroot: Path = Path("/")) -> str | None:
    try:
        return os.path.basename(os.readlink(sysfs.devices_dir(sysroot) / bdf / "driver"))
    except OSError:
        return None


# --- helpers ---------------------------------------------------------------------------------------------------


def _slot(bdf: str) -> str:
    return bdf.rsplit(".", 1)[0]  # domain:bus:device, without the function


def _comm(proc_entry: Path) -> str:
    try:
        return (proc_entry / "comm").read_text().strip()
    except OSError:
        return "?"


def _wait_for_driver(bdf: str, wanted: str | None, wait: float, sysroot: Path) -> str | None:
    deadline = time.monotonic() + wait
    while True:
        now = current_driver(bdf, sysroot)
        if now == wanted or time.monotonic() >= deadline:
            return now
        time.sleep(0.1)


def _write(path: Path, text: str) -> None:
    """One write(2) of `text` to a sysfs attribute, as `echo` would do; errors become one HostError line."""
    problems = _try_write(path, text)
    if problems:
        raise HostError(
            f"writing {text.strip() or 'an empty line'} to {path} failed: {problems[0]}",
            "are you root? see the kernel log (dmesg)",
        )


def _try_write(path: Path, text: str) -> list[str]:
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return [f"{path} missing"]
    except OSError as err:
        return [f"{path}: {err.strerror}"]
    try:
        os.write(fd, text.encode())
    except OSError as err:
        # ENODEV from bind when the driver does not want the device, EBUSY when it is bound already.
        return [f"{path}: {os.strerror(err.errno or errno.EIO)}"]
    finally:
        os.close(fd)
    return []
